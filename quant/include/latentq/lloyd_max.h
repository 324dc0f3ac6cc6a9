// latentq/lloyd_max.h — Lloyd-Max scalar codebooks fitted on the latent itself (spec `lm<b>-tensor`,
// `lm<b>-channel[-g<N>]`): the non-uniform codebook family of KVQuant (Hooper et al., arXiv 2401.18079, §3.3:
// per-layer non-uniform datatypes, here fitted by plain Lloyd iterations rather than Fisher-weighted
// k-means). The element math is `__host__ __device__` (codebook.h's index and packing), shared by the CPU
// quantizer (quant/src/lloyd_max.cpp) and the CUDA kernels (kernels/quant/lloyd_max.cu); the fit runs on the
// host for both, so the stored bytes are identical.
//
// For a [T, D] matrix (c_kv or k_pe of one layer), codebook g covers channels [g·W, min(D, (g+1)·W)) with
// W = D (tensor), 1 (channel) or N (channel-gN). Its 2^b centroids are fitted on the values of those channels
// over the FIT tokens of latentq/split.h (the first half of the sequences; one sequence: its first half), or
// over all tokens when the split is empty (T = 1):
//   start: c_i = the (i + ½)/2^b empirical quantile of the sorted values (float64);
//   iterate (at most kLloydMaxIterations): cells [m_{i−1}, m_i) between the midpoints m_i = (c_i + c_{i+1})/2,
//   c_i = the mean of the cell's values (an empty cell keeps its centroid), until no centroid moves by more
//   than 1e-12·(1 + max|c|) (Lloyd 1982, "Least squares quantization in PCM", method I).
// Stored per matrix: the centroids rounded to fp16, [codebooks, 2^b] little-endian (QuantizedTensor::global),
// counted in the accounting as per-matrix bytes. Encode: index = codebook_index of x among the float32
// midpoints (fp16 c_i + fp16 c_{i+1}) / 2 of the stored centroids; decode: the stored centroid.
// Codes: [T, ceil(D·b/8)], codebook.h's LSB-first packing; no per-token metadata.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "latentq/codebook.h"
#include "latentq/qmath.h"

namespace latentq {

inline constexpr int kLloydMaxIterations = 100;

/// The float32 tables the encoder and decoder read, from the stored fp16 centroids: centroid [codebooks, L],
/// midpoint [codebooks, L − 1] (L = 2^bits).
struct LloydMaxTables {
  int bits = 0, levels = 0;
  int64_t codebooks = 0, width = 0;  ///< codebooks per matrix, channels per codebook
  std::vector<float> centroid;       ///< [codebooks, levels], ascending per codebook
  std::vector<float> midpoint;       ///< [codebooks, levels − 1]
  /// The same tables per channel, for the vectorized encoder and decoder (quant/src/cpu/codebook_avx2.cpp):
  /// midpoint j of channel d's codebook at j·D + d ([levels − 1, D]) and its centroid c at c·D + d
  /// ([levels, D]): eight channels per load.
  std::vector<float> midpoint_by_channel;
  std::vector<float> centroid_by_channel;
};

/// Fits the fp16 centroids of every codebook of X [T, D] (row-major float32, finite) with sequence boundaries
/// seq_offsets [S+1] as above, `width` channels per codebook. Returns the stored bytes [codebooks, 2^bits]
/// fp16. Throws std::invalid_argument naming the codebook when a centroid overflows fp16.
std::vector<uint8_t> fit_lloyd_max(const float* X, int64_t T, int64_t D, std::span<const int64_t> seq_offsets, int bits,
                                   int64_t width);

/// The tables of stored centroids `stored` (fit_lloyd_max's bytes).
LloydMaxTables lloyd_max_tables(std::span<const uint8_t> stored, int bits, int64_t width, int64_t D);

}  // namespace latentq

namespace latentq::qmath {

/// The index of element i of a row x with codebooks of `width` channels (midpoints [codebooks, L − 1]).
struct LmCodeOf {
  const float* x;
  const float* midpoint;
  int levels;
  int64_t width;
  LQ_HD uint32_t operator()(int i) const { return codebook_index(midpoint + (i / width) * (levels - 1), levels, x[i]); }
};

/// Code byte k of row x[0, D) (codebook.h's LSB-first packing).
LQ_HD uint8_t lm_encode_byte(const float* x, int D, int bits, const float* midpoint, int64_t width, int k) {
  return lsb_encode_byte(D, bits, k, LmCodeOf{x, midpoint, 1 << bits, width});
}

/// Decoded element i of a stored row: its codebook's centroid of its index.
LQ_HD float lm_decode_element(const uint8_t* row, int i, int bits, const float* centroid, int64_t width) {
  return centroid[(i / width) * (1 << bits) + lsb_get_code(row, i, bits)];
}

}  // namespace latentq::qmath
