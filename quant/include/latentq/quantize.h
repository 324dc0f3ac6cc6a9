// latentq/quantize.h — the CPU reference quantizer: the truth the CUDA kernels reproduce byte for
// byte (ggml's *_ref role). Element math lives in latentq/qmath.h; specs in latentq/spec.h.
//
// Storage layout of a QuantizedTensor for an input X of shape [T, D] (row-major float32, T tokens
// of all sequences concatenated, D = kv_lora_rank or qk_rope_head_dim):
//   codes   : uint8 [T, row_bytes], row_bytes = ceil(D·bits/8); packing order in qmath.h
//             (INT4: element 2k in the low nibble of byte k; INT2: element 4k+j at bits 2j..2j+1;
//             symmetric codes are offset binary u = q + 2^(b-1)); bf16: 2 bytes per element,
//             little-endian; fp8: 1 byte per element.
//   scales  : little-endian values of the scale dtype (fp16: 2 bytes, fp32: 4 bytes):
//               tensor  -> [1]
//               channel -> [G, D]   G token groups (never across sequences), see channel_groups()
//               token   -> [T, ceil(D/g)]   (g = D when group_size is 0)
//               fp8 tile-> [T, ceil(D/tile)] fp32
//               bf16    -> []
//   offsets : asymmetric only, same layout and dtype as scales (the group min, as stored).
// Dequantization reads only codes, scales and offsets.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "latentq/spec.h"

namespace latentq {

/// A quantized [rows, cols] matrix in real storage. Invariant: sizes match the layout above.
struct QuantizedTensor {
  QuantSpec spec;                     ///< the format as stored (QuantSpec::stored_for applied)
  int64_t rows = 0;                   ///< T, tokens
  int64_t cols = 0;                   ///< D, latent dimensions
  std::vector<int64_t> group_bounds;  ///< channel granularity: token-group boundaries [G+1]; else empty
  std::vector<uint8_t> codes;         ///< packed codes, [rows, row_bytes()]
  std::vector<uint8_t> scales;        ///< raw scale values, see layout
  std::vector<uint8_t> offsets;       ///< raw offsets (asymmetric only), same layout as scales

  int64_t row_bytes() const;          ///< bytes of one packed code row
  int64_t row_group() const;          ///< token/fp8: width of a scale group along D (min(group, D)); else 0
  int64_t scales_per_row() const;     ///< token/fp8: scale groups per row, ceil(D / row_group()); else 0
  /// Bytes actually stored: codes + scales + offsets.
  int64_t storage_bytes() const { return static_cast<int64_t>(codes.size() + scales.size() + offsets.size()); }
  /// Decoded value of stored scale i / offset i (float32, exact).
  float scale_at(int64_t i) const;
  float offset_at(int64_t i) const;
};

/// Token-group boundaries for per-channel grouping: for each sequence [s0, s1) of seq_offsets,
/// boundaries s0, s0+g, ..., s1 (g = group_size, 0 = whole sequence). Returns [G+1] int64.
/// Throws std::invalid_argument if seq_offsets is not 0 = o_0 ≤ ... ≤ o_S = T with S ≥ 1.
std::vector<int64_t> channel_groups(std::span<const int64_t> seq_offsets, int64_t T, int64_t group_size);

/// Number of NaN/Inf values in x [n].
int64_t count_nonfinite(const float* x, int64_t n);

// Input errors, one wording for the CPU reference and the CUDA kernels (kernels/), which must throw
// exactly what quantize() throws.
/// Throws std::invalid_argument for spec fields QuantSpec::parse never produces: integer bits outside
/// {2, 4, 8}, a negative group size, an fp8 tile width <= 0 (a hand-built spec would otherwise make
/// the packing write out of bounds or divide by zero).
void validate_spec_fields(const QuantSpec& spec);
/// Message of the std::invalid_argument for `count` NaN/Inf values in a [T, D] input.
std::string nonfinite_message(int64_t count, int64_t T, int64_t D);
/// Message of the std::invalid_argument when the scale (offset = false) or the offset of scale group
/// `group` overflows the storage dtype of `spec` (the stored spec); raw = the float32 value before
/// rounding to that dtype.
std::string overflow_message(const QuantSpec& spec, bool offset, float raw, int64_t group);

/// Quantize X [T, D] (row-major float32) with `spec` as stored for `target`.
/// seq_offsets [S+1] (int64) gives the sequence boundaries; only per-channel grouping uses it
/// (pass {0, T} for a single sequence).
/// Throws std::invalid_argument for T == 0 or D == 0, NaN/Inf in X (with the count), bad
/// seq_offsets, a scale/offset that overflows its storage dtype (naming the float32 value), or a
/// hand-built spec with fields parse() never produces (Int bits not 2/4/8, negative group size,
/// fp8 tile width ≤ 0). fp8 tile scales are float32 whatever spec.scale_dtype says; the returned
/// qt.spec records F32.
QuantizedTensor quantize(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                         std::span<const int64_t> seq_offsets);

/// Decode into out [T, D] row-major float32. Reads only q's codes, scales and offsets.
void dequantize(const QuantizedTensor& q, float* out);

/// quantize then dequantize into out [T, D]; returns the storage (for accounting).
QuantizedTensor quantize_dequantize(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                                    std::span<const int64_t> seq_offsets, float* out);

/// Honest storage accounting of a quantized matrix, metadata included.
struct Accounting {
  double bits_per_element;  ///< 8·storage_bytes / (T·D)
  double bytes_per_token;   ///< storage_bytes / T (one layer, one target)
};
Accounting account(const QuantizedTensor& q);

}  // namespace latentq
