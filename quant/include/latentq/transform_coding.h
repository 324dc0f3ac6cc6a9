// latentq/transform_coding.h — transform coding of a latent matrix (spec `tc<R>[-lm]`, used after a basis:
// `klt,tc3`): a decorrelating basis, then bits spent per component by reverse water-filling, stored as a
// fixed row of component codes of different widths that a decode kernel reads with one table per matrix
// (Huang & Schultheiss 1963, "Block quantization of correlated Gaussian random variables"; the integer
// allocation is the greedy marginal-return rule, Gersho & Gray 1992, "Vector Quantization and Signal
// Compression", §8.4). The basis is the transform prefix's (transform.h: `klt,` is the fit split's KLT,
// folded into W_UK and W_UV); without a prefix the components are the channels. The element math is
// `__host__ __device__` (below), shared by the CPU quantizer (quant/src/transform_coding.cpp) and the CUDA
// kernels (kernels/quant/transform_coding.cu); the record is fitted on the host for both, so the stored
// bytes are identical.
//
// For a [T, D] matrix X (the rotated c_kv or k_pe of one layer), R = rate_milli / 1000 bits per element:
//   budget   B = 8·floor(R·D/8) code bits per token (layout(): row_code_bytes = floor(R·D/8), the rate is
//            never exceeded). R counts the codes only: the per-matrix record below is counted in the
//            accounting (storage_bytes, bits_per_element) as per-matrix bytes, amortized over T, as the
//            Lloyd-Max codebooks and the per-channel integer scales are; it cannot come out of a per-token
//            budget that does not know T.
//   stats    per component i, over the FIT tokens of latentq/split.h (every token when the split is empty,
//            T = 1), float64: mean μ_i, variance v_i = (1/n)·Σ (x − μ_i)², σ_i = sqrt(v_i).
//   widths   w_i ∈ 0..8 with Σ w_i ≤ B: start at 0; repeatedly give one bit to the component of largest
//            v_i·4^(−w_i) (the high-rate distortion drop of one more bit, ∝ σ²·2^(−2w)) among those with
//            w_i < 8 and v_i > 0, ties to the lower index, until B bits are spent or no component can take
//            one. This is reverse water-filling in integers: w_i ≈ max(0, ½·log2(v_i/θ)) for a water level θ
//            (Cover & Thomas Thm 10.3.3; latentq/analysis/rate_distortion.h solves the continuous θ).
//            A component at 0 bits stores nothing per token and decodes to μ_i.
//   uniform  (tc<R>) a midrise uniform quantizer of 2^w levels centred on μ_i with the step Δ_i = m_i·σ_i·g(w),
//            g(w) the MSE-optimal uniform step of N(0, 1) at 2^w levels (Max 1960, Table II: g(1) = 1.596,
//            g(2) = 0.9957, g(3) = 0.5860, g(4) = 0.3352; computed here by golden-section search on the exact
//            Gaussian distortion): stored as scale = fp32(Δ_i), offset = fp32(μ_i − scale·(2^w − 1)/2), the
//            lowest level, and coded with qmath's asymmetric integer rule (encode_asym / decode_asym:
//            q = clamp(rne((x − offset)/scale), 0, 2^w − 1), x̂ = offset + q·scale). This clips at ±2^(w−1)·Δ
//            around μ_i, below min/max's range: lower MSE (at 2 bits on a Gaussian the min/max step of ±3.5σ is
//            2.33σ with MSE 0.469σ², the optimal step 1.0σ has MSE 0.119σ²).
//   -lm      (tc<R>-lm) the unit-variance Gaussian Lloyd-Max codebook of 2^w levels (tc_unit_codebook: Lloyd
//            iterations on N(0, 1) with exact cell means) rounded to fp16, scaled: scale = fp32(m_i·σ_i),
//            offset = fp32(μ_i); u = (x − offset)/scale (0 when scale = 0), index = codebook_index of u among
//            the float32 midpoints of the fp16 centroids, x̂ = offset + scale·c_index.
//   m_i      the clip, fitted: among m = 2^(j/8), j = kTcScaleSearchFirst..kTcScaleSearchLast (0.5 to 5.66;
//            m = 1 is the Gaussian rule), the one whose stored (scale, offset) give the least squared error
//            over the component's fit values, coded with the element functions below (ties to the smaller
//            m). Latent components are heavier-tailed than a Gaussian (the Gaussian clip cuts their tails):
//            on tiny-mla's default study the search lowers klt,tc3's c_kv rel_fro from 0.031 to 0.022.
//   w = 0    offset = fp32(μ_i) and scale = 0 in both rules; x̂ = offset.
// Stored per matrix (QuantizedTensor::global, one record of 9·D bytes, plus 1020 with -lm):
//   [D] uint8 widths | [D] fp32 scale | [D] fp32 offset | -lm: the fp16 unit codebooks of widths 1..8, ascending
//   per width, widths in order: (2 + 4 + ... + 256)·2 = 1020 bytes (constants, stored so the decoder needs
//   nothing else). All little-endian.
// Codes: [T, row_code_bytes]: component i's code at bits [o_i, o_i + w_i) of the row, o_i = Σ_{j<i} w_j,
// LSB-first across bytes (codebook.h's packing with per-component widths), trailing bits zero.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "latentq/codebook.h"
#include "latentq/qmath.h"

namespace latentq::qmath {

inline constexpr int kTcMaxWidth = 8;
/// Offsets of width w's table in the concatenated unit codebooks of widths 1..8: centroids at 2^w − 2,
/// midpoints at 2^w − w − 1 (Σ over the narrower widths).
LQ_HD int tc_centroid_base(int w) { return (1 << w) - 2; }
LQ_HD int tc_midpoint_base(int w) { return (1 << w) - w - 1; }
inline constexpr int kTcCentroids = (1 << (kTcMaxWidth + 1)) - 2;                ///< 510
inline constexpr int kTcMidpoints = (1 << (kTcMaxWidth + 1)) - kTcMaxWidth - 2;  ///< 502

/// The tables one matrix's encoder and decoder read (host or device pointers; POD, passed by value).
struct TcTables {
  int D = 0;
  const int32_t* bit_offset = nullptr;  ///< [D + 1]: o_i, o_D = Σ w_i; w_i = o_{i+1} − o_i
  const float* scale = nullptr;         ///< [D]
  const float* offset = nullptr;        ///< [D]
  const float* centroid = nullptr;      ///< -lm: [kTcCentroids] float32 of the fp16 unit centroids; else null
  const float* midpoint = nullptr;      ///< -lm: [kTcMidpoints] float32 midpoints of those; else null
};

/// The code of element x of component i (width w ≥ 1).
LQ_HD uint32_t tc_code(const TcTables& t, int i, int w, float x) {
  if (t.centroid == nullptr) return encode_asym(x, t.scale[i], t.offset[i], w);
  const float s = t.scale[i];
  const float u = s > 0.0f ? div_rn(sub_rn(x, t.offset[i]), s) : 0.0f;
  return codebook_index(t.midpoint + tc_midpoint_base(w), 1 << w, u);
}

/// Code byte k of the row x[0, D): the codes of the components whose bits meet [8k, 8k + 8).
LQ_HD uint8_t tc_encode_byte(const TcTables& t, const float* x, int k) {
  const int lo = 8 * k;
  int a = 0, b = t.D;  // the first component ending after lo: o_{i+1} > lo
  while (a < b) {
    const int m = (a + b) / 2;
    if (t.bit_offset[m + 1] > lo)
      b = m;
    else
      a = m + 1;
  }
  uint32_t out = 0;
  for (int i = a; i < t.D && t.bit_offset[i] < lo + 8; ++i) {
    const int w = t.bit_offset[i + 1] - t.bit_offset[i];
    if (w == 0) continue;
    const int shift = t.bit_offset[i] - lo;  // negative: the code started in the byte before
    const uint32_t c = tc_code(t, i, w, x[i]);
    out |= shift >= 0 ? (c << shift) : (c >> -shift);
  }
  return static_cast<uint8_t>(out & 0xffu);
}

/// The decoded value of code c of component i (width w ≥ 1).
LQ_HD float tc_decode_code(const TcTables& t, int i, int w, uint32_t c) {
  if (t.centroid == nullptr) return decode_asym(c, t.scale[i], t.offset[i]);
  return add_rn(t.offset[i], mul_rn(t.scale[i], t.centroid[tc_centroid_base(w) + static_cast<int>(c)]));
}

/// Decoded element i of a stored row.
LQ_HD float tc_decode_element(const TcTables& t, const uint8_t* row, int i) {
  const int o = t.bit_offset[i], w = t.bit_offset[i + 1] - o;
  if (w == 0) return t.offset[i];
  return tc_decode_code(t, i, w, lsb_get_bits(row, o, w));
}

}  // namespace latentq::qmath

namespace latentq {

struct QuantSpec;

/// The scale search of the record: multipliers m = 2^(j/8) of the Gaussian rule's scale, j in [first, last]
/// (m from 0.5 to 5.66, j = 0: the Gaussian rule itself).
inline constexpr int kTcScaleSearchFirst = -8;
inline constexpr int kTcScaleSearchLast = 20;

/// The greedy integer widths above for component variances v [D] (float64; ≤ 0 or NaN take no bits) and a
/// budget of `budget_bits` bits: [D] widths in 0..8 with Σ ≤ budget_bits. Throws std::invalid_argument for
/// a negative budget.
std::vector<int> tc_allocate_widths(std::span<const double> variances, int64_t budget_bits);

/// g(w): the MSE-optimal step of a midrise uniform quantizer of 2^w levels for N(0, 1) (float64; golden-section
/// search on the closed-form distortion, 200 steps in [0.001, 3]), w in 1..8; cached. Throws
/// std::invalid_argument for w outside 1..8.
double tc_uniform_step(int w);
/// Mean squared error of that quantizer with step `step` on N(0, 1) (float64, closed form).
double tc_uniform_mse(int w, double step);

/// The unit-variance Gaussian Lloyd-Max codebook of 2^w levels, ascending, float64 (before the fp16
/// rounding): Lloyd iterations with the exact cell means (φ(a) − φ(b))/(Φ(b) − Φ(a)) from the optimal uniform
/// quantizer's levels, symmetric by construction, at most 20000 iterations, stopping when no centroid moves
/// by more than 1e-13. w in 1..8; cached. Throws std::invalid_argument for w outside 1..8.
const std::vector<double>& tc_unit_codebook(int w);

/// The record of X [T, D] (row-major float32, finite) under a tc spec with sequence boundaries seq_offsets
/// [S+1] (fit split as above): the 9·D (+1020) bytes described above. Throws std::invalid_argument naming
/// the component when a stored scale or offset overflows float32.
std::vector<uint8_t> fit_transform_coding(const QuantSpec& spec, const float* X, int64_t T, int64_t D,
                                          std::span<const int64_t> seq_offsets);

/// The host tables of a record (fit_transform_coding's bytes) and a TcTables view of them.
struct TcHostTables {
  std::vector<int32_t> bit_offset;        ///< [D + 1]
  std::vector<float> scale, offset;       ///< [D]
  std::vector<float> centroid, midpoint;  ///< -lm: [kTcCentroids], [kTcMidpoints]; else empty
  /// Per component [D], for the vectorized rows (quant/src/cpu/codebook_avx2.cpp): w_i, 2^w_i − 1 as float32,
  /// and −1 where w_i ≥ 1, else 0.
  std::vector<int32_t> width;
  std::vector<float> qmax;
  std::vector<int32_t> coded;
  qmath::TcTables view() const;
  std::vector<int> widths() const;  ///< [D]
};
/// Throws std::invalid_argument when the record's size is not the layout's, a width exceeds 8, or the
/// widths exceed the code budget of the layout.
TcHostTables tc_tables(const QuantSpec& spec, std::span<const uint8_t> record, int64_t D);

}  // namespace latentq
