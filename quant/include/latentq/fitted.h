// latentq/fitted.h — fit once, encode fast: quantize() of the fitted families (Lloyd-Max codebooks `lm<b>-…`,
// lloyd_max.h; transform coding `tc<R>[-lm]`, transform_coding.h) split into its two steps, so that a caller
// that codes the same matrix more than once, or measures the two apart, pays for the fit once:
//   fit_quantizer(spec, target, X, T, D, seqs)  the tables fitted on X's fit split (latentq/split.h): lm the fp16
//                                               centroids and their float32 tables, tc the per-matrix record
//                                               (widths, scales, offsets) and its tables; every other family
//                                               fits nothing (TurboQuant's codebook depends on D alone and is
//                                               cached by tq_codebook), its fit is the spec;
//   encode(fit, X, T, seqs)                     the QuantizedTensor of X [T, D] coded with the fit's tables;
//   decode(fit, qt, out)                        dequantize() reading the fit's tables instead of rebuilding
//                                               them from qt.global.
// encode(fit_quantizer(spec, target, X, T, D, seqs), X, T, seqs) is quantize(spec, target, X, T, D, seqs) byte
// for byte, with the same errors, on every CpuKernel (tests/quant/test_fitted.cpp). A fit encodes any matrix of
// the same D, but only the matrix it was fitted on gives quantize()'s bytes: reuse a fit only while the data it
// read are unchanged.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "latentq/lloyd_max.h"
#include "latentq/quantize.h"
#include "latentq/transform_coding.h"

namespace latentq {

/// The data-dependent part of a quantizer of [*, D] matrices (see above).
struct QuantFit {
  QuantSpec requested;          ///< the spec as given (an engine preset stays a preset)
  Target target = Target::CKV;  ///< the tensor it quantizes
  QuantSpec spec;               ///< the spec as stored, requested.stored_for(target)
  int64_t D = 0;                ///< columns
  std::vector<uint8_t> global;  ///< lm: fp16 centroids [codebooks, 2^b]; tc: the record; else empty
  LloydMaxTables lm;            ///< lm: the float32 tables of `global`
  TcHostTables tc;              ///< tc: the tables of `global`
  /// Whether the spec fits tables to the data (lm, tc); the others' encode is quantize().
  bool fitted() const { return spec.format == Format::LloydMax || spec.format == Format::TransformCoding; }
};

/// The fit of `spec` for `target` on X [T, D] (row-major float32) with sequence boundaries seq_offsets [S+1]:
/// quantize()'s fit, with quantize()'s errors for the input (empty matrix, NaN/Inf with the count, bad
/// seq_offsets, hand-built spec fields, a row length the format cannot store) and the fit's own (a centroid or
/// scale beyond its storage dtype).
QuantFit fit_quantizer(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                       std::span<const int64_t> seq_offsets);

/// The fit stored in a quantized tensor (its spec, D and global bytes), for decode(). Throws
/// std::invalid_argument as lloyd_max_tables / tc_tables for global bytes of the wrong size.
QuantFit fit_of(const QuantizedTensor& qt);

/// X [T, fit.D] coded with `fit` into qt; afterwards qt holds exactly what encode() returns. For lm and tc a code
/// buffer that already has the size this call needs is reused (no allocation, no zero fill: every code byte is
/// written); the other families assign quantize()'s tensor. On an exception qt is left empty. Throws
/// std::invalid_argument for T ≤ 0, NaN/Inf in X (with the count) and bad seq_offsets, as quantize(); the other errors
/// of quantize() for the families without a fit.
void encode_into(QuantizedTensor& qt, const QuantFit& fit, const float* X, int64_t T,
                 std::span<const int64_t> seq_offsets);
QuantizedTensor encode(const QuantFit& fit, const float* X, int64_t T, std::span<const int64_t> seq_offsets);

/// dequantize(qt, out) [qt.rows, qt.cols] with the fit's tables. Throws std::invalid_argument when qt was not
/// coded with this fit (its stored spec, D or global bytes differ).
void decode(const QuantFit& fit, const QuantizedTensor& qt, float* out);

}  // namespace latentq
