// latentq/quantize.h — the CPU reference quantizer: the truth the CUDA kernels reproduce byte for
// byte (ggml's *_ref role). Element math lives in latentq/qmath.h; specs in latentq/spec.h.
//
// Storage layout of a QuantizedTensor for an input X of shape [T, D] (row-major float32, T tokens
// of all sequences concatenated, D = kv_lora_rank or qk_rope_head_dim); latentq::layout() in spec.h
// gives the sizes:
//   codes   : uint8 [T, row_code_bytes]; integer packing in qmath.h (INT4: element 2k in the low
//             nibble of byte k; INT2: element 4k+j at bits 2j..2j+1; symmetric codes are offset
//             binary u = q + 2^(b-1)); bf16: 2 bytes per element, little-endian; e4m3 / q8_0: 1 byte
//             per element; e2m1 (mxfp4, nvfp4): element 2k in the low nibble of byte k; ggml q4_0 /
//             q4_1: within each block of 32, byte j holds element j (low) and j + 16 (high).
//   scales  : little-endian values of the scale dtype (fp16: 2 bytes, fp32: 4, ue8m0 / e4m3: 1):
//               int tensor  -> [1]
//               int channel -> [G, D]   G token groups (never across sequences), see channel_groups()
//               int token, every block format -> [T, blocks_per_row]
//               bf16, fp8-e4m3-tensor -> []
//   offsets : int asymmetric and q4_1 only, same layout and dtype as scales (the group min, as stored).
//   global  : fp8-e4m3-tensor and nvfp4: the fp32 per-tensor scale [1] (4 bytes); lm<b>: the fitted fp16
//             centroids [codebooks, 2^b] (lloyd_max.h).
//   TurboQuant (tq<b>): codes [T, ceil(D·b/8)] LSB-first indices, scales [T] fp16 row norms (turboquant.h).
//   Transform coding (tc<R>[-lm]): codes [T, floor(R·D/8)] of per-component widths; global: the per-matrix
//             record of widths, fp32 scales and offsets (+ the fp16 unit codebooks for -lm), transform_coding.h.
// Dequantization reads only codes, scales, offsets and global.
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
  std::vector<uint8_t> global;        ///< fp32 per-tensor scale [4 bytes] (fp8-e4m3-tensor, nvfp4); lm: fp16 codebooks

  Layout layout() const { return latentq::layout(spec, cols); }  ///< the stored layout (spec.h)
  int64_t row_bytes() const;                                     ///< bytes of one packed code row
  int64_t row_group() const;       ///< per-row scale groups (token groups, blocks): width along D; else 0
  int64_t scales_per_row() const;  ///< per-row scale groups per row, ceil(D / row_group()); else 0
  /// Bytes actually stored: codes + scales + offsets + global.
  int64_t storage_bytes() const {
    return static_cast<int64_t>(codes.size() + scales.size() + offsets.size() + global.size());
  }
  /// The stored per-tensor scale (fp8-e4m3-tensor, nvfp4), exact; 0 if none.
  float global_scale() const;
  /// Decoded value of stored scale i / offset i (float32, exact).
  float scale_at(int64_t i) const;
  float offset_at(int64_t i) const;
};

/// Checks seq_offsets [S+1] (int64): 0 = o_0 ≤ o_1 ≤ ... ≤ o_S = T with S ≥ 1 (empty sequences
/// allowed). Throws std::invalid_argument naming the first offending entry otherwise.
void validate_seq_offsets(std::span<const int64_t> seq_offsets, int64_t T);

/// Token-group boundaries for per-channel grouping: for each non-empty sequence [s0, s1) of
/// seq_offsets, boundaries s0, s0+g, ..., s1 (g = group_size, 0 = whole sequence; a g at or beyond
/// the sequence length gives one group; overflow-safe for any g up to 2^63 − 1). Returns [G+1]
/// int64. Throws std::invalid_argument as validate_seq_offsets, or for a negative group_size.
std::vector<int64_t> channel_groups(std::span<const int64_t> seq_offsets, int64_t T, int64_t group_size);

/// Where stored group gi of qt lies, for messages: "tokens [t0, t1), dimension d" (channel),
/// "token t, dimensions [d0, d1)" (token groups and blocks), "the whole tensor" (tensor).
std::string group_name(const QuantizedTensor& qt, int64_t gi);

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
/// Message of the std::invalid_argument when a stored value overflows its storage dtype: the scale
/// (what = "scale"), the offset ("offset") or an element ("value") of `where` (group_name()), in the
/// stored spec `spec`; raw = the float32 value before rounding to that dtype. One wording for every
/// storage conversion (fp16/fp32 scales and offsets, bf16 values) of the CPU reference and the kernels.
std::string overflow_message(const QuantSpec& spec, const char* what, float raw, const std::string& where);

/// Quantize X [T, D] (row-major float32) with `spec` as stored for `target`.
/// seq_offsets [S+1] (int64) gives the sequence boundaries; only per-channel grouping uses it
/// (pass {0, T} for a single sequence).
/// seq_offsets are validated for every spec (validate_seq_offsets).
/// Throws std::invalid_argument for T == 0 or D == 0, NaN/Inf in X (with the count), bad
/// seq_offsets, a stored value that overflows its storage dtype (a scale or offset beyond fp16, a
/// value beyond bf16's range, a ggml fp16 d or m: naming the float32 value and the group), a row
/// length a format cannot store (ggml: D % 32 != 0), or a hand-built spec with fields parse() never
/// produces (Int bits not 2/4/8, negative group size, fp8 tile width ≤ 0).
QuantizedTensor quantize(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                         std::span<const int64_t> seq_offsets);

/// quantize() into an existing tensor: afterwards qt holds exactly what quantize(spec, target, X, T, D,
/// seq_offsets) returns (same bytes, same errors). The integer formats on the fused kernels (CpuKernel
/// Baseline / Avx2) reuse qt's codes, scales and offsets buffers when they already have the sizes this
/// call needs (a loop over matrices of one spec and shape): no allocation, no zero fill, no page
/// faults; every other case assigns a new tensor. On an exception qt is left empty (QuantizedTensor{}).
void quantize_into(QuantizedTensor& qt, const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                   std::span<const int64_t> seq_offsets);

/// Decode into out [T, D] row-major float32. Reads only q's codes, scales and offsets.
void dequantize(const QuantizedTensor& q, float* out);

/// quantize then dequantize into out [T, D]; returns the storage (for accounting).
QuantizedTensor quantize_dequantize(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                                    std::span<const int64_t> seq_offsets, float* out);

/// Which CPU code runs the integer formats (int{8,4,2}-{sym,asym}-{tensor,channel,token}) in quantize()
/// and dequantize(). All three give the same bytes (tests/quant/test_cpu_kernels.cpp checks it byte for
/// byte). The block formats run blockfmt.h's block functions on every kernel: Baseline and Avx2 split the
/// rows across set_cpu_threads' threads, and Avx2 also encodes and decodes the e4m3 kinds (fp8 tiles,
/// per-tensor fp8, MXFP8), the e2m1 kinds (MXFP4, NVFP4, fp4 tiles) and the ggml kinds' codes eight elements
/// at a time and takes the NaN/Inf check and max|x| in one pass (the same bytes again). bf16 runs the reference loop
/// (after that one pass under Avx2).
///   Reference  the plain loops: one pass for NaN/Inf, one for the statistics, one to encode.
///   Baseline   the fused loops (statistics, NaN/Inf flag and encoding of a group while it is in cache;
///              eight-lane min/max reductions), compiled for the baseline ISA (x86-64: SSE2).
///   Avx2       the same source compiled with __attribute__((target("avx2,f16c"))) (x86-64 only;
///              F16C converts the fp16 scales and offsets, with f32_to_f16_bits's bits).
/// Auto (the default) picks Avx2 when the CPU has AVX2 and F16C (__builtin_cpu_supports), else Baseline.
/// Element math is qmath.h's in all of them: IEEE float32 +, −, ×, / rounded one by one (vector
/// division is IEEE division; -ffp-contract=off, no FMA), RNE by the 1.5·2^23 trick (Avx2: vcvtps2dq,
/// which rounds to nearest even in MXCSR's default mode, as the trick's additions do).
enum class CpuKernel : uint8_t { Auto = 0, Reference = 1, Baseline = 2, Avx2 = 3 };
/// Select the kernel for this process (tests and benchmarks). Throws std::invalid_argument for Avx2
/// on a CPU (or a build) without it.
void set_cpu_kernel(CpuKernel k);
/// The kernel integer quantize()/dequantize() run now (Auto resolved).
CpuKernel active_cpu_kernel();
/// The kernels set_cpu_kernel accepts on this CPU and build, in order: Reference, Baseline, and Avx2
/// where the CPU has it (tests and benchmarks run each).
std::vector<CpuKernel> available_cpu_kernels();
/// set_cpu_kernel(k) for the object's lifetime, then the selection it replaced (Auto included).
/// Throws as set_cpu_kernel.
class ScopedCpuKernel {
 public:
  explicit ScopedCpuKernel(CpuKernel k);
  ~ScopedCpuKernel();
  ScopedCpuKernel(const ScopedCpuKernel&) = delete;
  ScopedCpuKernel& operator=(const ScopedCpuKernel&) = delete;

 private:
  int previous_;
};
/// Worker threads of integer quantize()/dequantize() on matrices of at least 2^20 elements (default 1:
/// the study runs cells in parallel already). Rows (tensor, token) or token groups (channel) are split
/// into contiguous ranges; the bytes do not depend on it, and an error is the one the first failing
/// group in row order raises. n < 1 is taken as 1.
void set_cpu_threads(int n);
int cpu_threads();
/// Outputs of at least n bytes (integer quantize: the packed codes; dequantize: the floats) are written
/// with non-temporal stores by the fused kernels: they bypass the caches, which such outputs do not fit,
/// and skip the read-for-ownership of every written line. n < 0 restores the default, 4 MiB; 0 streams
/// every output (tests: the streamed paths on small inputs). The bytes written are the same either way.
void set_cpu_stream_min_bytes(int64_t n);

/// Block formats whose scale can exceed float32's range when multiplied by a code (FlashMLA's
/// power-of-two ceiling, MX's shared exponent) are checked when the matrix's max|x| reaches this:
/// a decoded value of ±inf is refused (overflow_message "value"), never stored.
inline constexpr float kDecodeCheckAmax = 1e36f;
/// Throws std::invalid_argument (overflow_message, what = "value") if a decoded element of qt is not
/// finite; used by the CPU reference and the kernels' host code when max|x| ≥ kDecodeCheckAmax.
void check_decodable(const QuantizedTensor& qt, const float* X);

/// Precision lost silently by a quantized matrix under the documented conventions (the principle: "the
/// conventions stay, the results record it"). Counts, over the stored groups of qt:
struct QuantDiagnostics {
  int64_t scale_underflow = 0;  ///< groups with a non-zero range whose stored scale is 0 or subnormal in its dtype
  int64_t offset_rounding = 0;  ///< asymmetric groups whose stored offset is off the true min by more than half a step
  int64_t saturated = 0;        ///< elements clamped at the element format's max (fp8/fp4 codes at ±max + half a step)
  bool any() const { return scale_underflow || offset_rounding || saturated; }
};
/// Diagnostics of qt, quantized from X [qt.rows, qt.cols] (row-major float32), recomputed from the
/// stored bytes and X (the same for the CPU reference and the kernels).
QuantDiagnostics diagnose(const QuantizedTensor& qt, const float* X);

/// The engine's per-token record of `preset` (spec.h kPresets) from the stored c_kv [T, D_ckv] and
/// k_pe [T, D_kpe] of that preset (each quantized with the preset for its target): uint8
/// [T, record_bytes(preset, D_ckv, D_kpe)], row-major, parts in the preset's RecordOrder, pad bytes
/// zero. Throws std::invalid_argument if preset is not a preset, a tensor's spec is not the preset's
/// for its target, the token counts differ, or the widths are not the engine's own (MODEL1 and
/// V4.1 hold 448 + 64 dims; their bytes per token at other widths are record_bytes(), not a record).
std::vector<uint8_t> pack_record(const QuantSpec& preset, const QuantizedTensor& ckv, const QuantizedTensor& kpe);

/// Honest storage accounting of a quantized matrix, metadata included.
struct Accounting {
  double bits_per_element;  ///< 8·storage_bytes / (T·D)
  double bytes_per_token;   ///< storage_bytes / T (one layer, one target)
};
Accounting account(const QuantizedTensor& q);
/// `a`, the account() of `target`'s tensor quantized with `requested` (a spec, or an engine preset whose
/// stored_for(target) gave the tensor), in a layer of c_kv D_ckv and k_pe D_kpe wide, with a preset record's zero
/// pad added to its c_kv (record_pad_bytes: vLLM's nvfp4_ds_mla 16 B, FlashMLA MODEL1's pad to 8 bytes), so that
/// a preset's c_kv and k_pe add up to record_bytes(preset, D_ckv, D_kpe) per token: every byte the engine stores.
/// Unchanged for k_pe and for a spec that is no preset.
Accounting with_record_pad(Accounting a, const QuantSpec& requested, Target target, int64_t D_ckv, int64_t D_kpe);
/// The zero pad with_record_pad adds, in bytes per token: record_bytes(requested, D_ckv, D_kpe) less its parts'
/// bytes per token for a preset's c_kv; 0 for k_pe and for a spec that is no preset. Throws as layout().
int64_t record_pad_per_token(const QuantSpec& requested, Target target, int64_t D_ckv, int64_t D_kpe);

/// The bytes quantize() stores for a [T, D] matrix of `target` under `spec` (a preset's spec for that
/// target, QuantSpec::stored_for), for the sequences seq_offsets [S+1] (T = seq_offsets.back()), computed
/// from the layout alone (spec.h Layout): T · Layout::bytes_per_token() + the per-channel token groups'
/// scales and offsets (channel_groups: D per group) + the per-matrix bytes. 0 when T = 0 (nothing is stored,
/// no per-tensor scale either). Equal to quantize(...).storage_bytes() for every format (tested); the
/// decode-order cache bytes (decode_order.h) count through it. Throws std::invalid_argument as layout() and
/// validate_seq_offsets().
int64_t storage_bytes(const QuantSpec& spec, Target target, int64_t D, std::span<const int64_t> seq_offsets);

}  // namespace latentq
