// latentq/turboquant.h — the element math of TurboQuant's MSE stage (Zandieh et al., "TurboQuant:
// Online Vector Quantization with Near-optimal Distortion Rate", arXiv 2504.19874, ICLR 2026) as vLLM
// stores it for MLA's latent (spec `tq<b>[-nc]`, presets vllm-turboquant-*): one `__host__ __device__`
// function per step, used unchanged by the CPU quantizer (quant/src/cpu/turboquant.cpp) and the CUDA
// kernels (kernels/quant/turboquant.cu), so the two are byte-identical by construction.
//
// Source read (vLLM, github.com/vllm-project/vllm):
//   rotation   vllm/v1/attention/backends/turboquant_attn.py _build_hadamard (commit 0135d081): the
//              normalized Sylvester Hadamard H[i,j] = (−1)^popcount(i&j)/√d, no random signs, one for
//              every layer (signs and seeds were removed by vLLM PR 40194)
//   codebook   vllm/model_executor/layers/quantization/turboquant/centroids.py solve_lloyd_max
//              (commit 06d0369d): Lloyd iterations on N(0, 1/d), see tq_solve_lloyd_max below
//   store      vllm/v1/attention/ops/triton_turboquant_store.py _mla_fused_store_mse and the Triton
//              kernel _tq_mla_fused_store_mse_kernel (commit b40f4cc9, the MLA backend of vLLM PR 41803):
//              n = ‖x‖₂ (fp32), x̂ = x / (n + 1e-8), y = x̂·H, index = the number of fp32 midpoints ≤ y
//              (a tie goes to the upper centroid), indices packed LSB-first, n stored as fp16
//   decode     vllm/v1/attention/ops/triton_turboquant_mla_decode.py _tq_mla_dequant_mse (commit
//              b40f4cc9): ĉ = bf16 centroid of the index; with norm correction (the `_nc` presets)
//              ĉ ← ĉ · 1/sqrt(Σ ĉ² + 1e-8); kv_c = (ĉ · n)·H
//
// Row layout of a [T, D] matrix (D = kv_lora_rank, or any D whose Hadamard block (transform.h
// hadamard_block, automatic) is ≥ 16; vLLM requires a power of two, where the block is D itself):
//   codes  [T, ceil(D·b/8)]: element i's index at bits [i·b, i·b + b) of the row, LSB-first across
//          bytes (4-bit: element 2k in the low nibble of byte k; 3-bit: 8 indices per 24-bit
//          little-endian word), trailing bits zero;
//   scales [T, 1]: fp16 n, little-endian.
// Deviations, documented: vLLM rotates with a float32 GEMM (x̂ @ H) whose summation order torch does
// not specify; latentq uses the fast Walsh–Hadamard of transform.h (fwht_rows, exact butterflies, one
// final multiply by float(1/√block)). The two give the same y up to float32 rounding, so an index can
// differ only where y lies within a few ulp of a midpoint. vLLM's decode rounds ĉ·n to bf16 and
// multiplies by a bf16 H; latentq decodes in float32 throughout (H of fwht_rows).
#pragma once

#include <cstdint>

#include "latentq/codebook.h"
#include "latentq/qmath.h"

namespace latentq::qmath {

inline constexpr int kTqMaxBits = 4;
inline constexpr int kTqMaxLevels = 1 << kTqMaxBits;
inline constexpr float kTqNormEps = 1e-8f;  ///< vLLM: x / (‖x‖ + 1e-8) and 1/sqrt(Σĉ² + 1e-8)

/// TurboQuant's scalar codebook for coordinates of a rotated unit vector in R^D (POD, passed to the
/// kernels by value).
struct TqCodebook {
  int bits = 0;                            ///< index bits b (2, 3 or 4)
  int levels = 0;                          ///< 2^b
  float centroid[kTqMaxLevels] = {};       ///< float32 centroids, ascending (vLLM's torch.float32)
  float centroid_bf16[kTqMaxLevels] = {};  ///< the same rounded to bf16 (what vLLM's decode reads)
  float midpoint[kTqMaxLevels - 1] = {};   ///< float32 (c[i] + c[i+1]) / 2 (what vLLM's store reads)
};

/// n = sqrt(Σ x_i²) over x[0, n) in element order, float32, each operation rounded (no FMA).
LQ_HD float tq_row_norm(const float* x, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s = add_rn(s, mul_rn(x[i], x[i]));
  return sqrt_rn(s);
}

/// x̂ = x / (n + 1e-8), the unit vector the codebook is for (vLLM: kv_c_f / (norms + 1e-8)).
LQ_HD float tq_unit(float x, float norm) { return div_rn(x, add_rn(norm, kTqNormEps)); }

/// The index of rotated coordinate y (codebook_index: vLLM's Triton binary search, which sends a tie to the
/// upper centroid; y = 0 gives 2^(b−1)).
LQ_HD uint32_t tq_index(const TqCodebook& cb, float y) { return codebook_index(cb.midpoint, cb.levels, y); }

/// The index of each rotated coordinate y[i] of a row (the code_of of lsb_encode_byte).
struct TqCodeOf {
  const TqCodebook& cb;
  const float* y;
  LQ_HD uint32_t operator()(int i) const { return tq_index(cb, y[i]); }
};

/// Code byte k of a row of D rotated coordinates y[0, D) (codebook.h's LSB-first packing).
LQ_HD uint8_t tq_encode_byte(const TqCodebook& cb, const float* y, int D, int k) {
  return lsb_encode_byte(D, cb.bits, k, TqCodeOf{cb, y});
}

/// The norm-correction factor of a stored row (the `_nc` decode): 1 / sqrt(Σ ĉ_i² + 1e-8) over the bf16
/// centroids of its D codes, in element order.
LQ_HD float tq_nc_inverse(const TqCodebook& cb, const uint8_t* row, int D) {
  float s = 0.0f;
  for (int i = 0; i < D; ++i) {
    const float c = cb.centroid_bf16[lsb_get_code(row, i, cb.bits)];
    s = add_rn(s, mul_rn(c, c));
  }
  return div_rn(1.0f, sqrt_rn(add_rn(s, kTqNormEps)));
}

/// Decoded rotated coordinate i of a stored row with norm n: (ĉ · inv) · n with norm correction (inv =
/// tq_nc_inverse), else ĉ · n (vLLM's y_hat · inv_norm, then · vec_norm).
LQ_HD float tq_decode_element(const TqCodebook& cb, const uint8_t* row, int i, float norm, bool nc, float inv) {
  const float c = cb.centroid_bf16[lsb_get_code(row, i, cb.bits)];
  return nc ? mul_rn(mul_rn(c, inv), norm) : mul_rn(c, norm);
}

}  // namespace latentq::qmath

namespace latentq {

/// The codebook of `tq<bits>` for rows of D elements: vLLM's solve_lloyd_max(D, bits) — Lloyd iterations
/// on the Gaussian N(0, σ² = 1/D) in float64: start at c_i = −3.5σ + 7σ·(i + ½)/2^b; each iteration
/// takes the boundaries (c_i + c_{i+1})/2 with outer edges ±10.5σ and sets c_i = ∫x·p / ∫p over its cell
/// (trapezoid rule, 200 panels; a cell with ∫p ≤ 1e-15 keeps its centroid); at most 200 iterations, stopping
/// before the update once no centroid moves by 1e-10 or more. The centroids are then rounded to float32
/// (and to bf16), the midpoints computed in float32. Cached per (D, bits); thread-safe. Throws
/// std::invalid_argument for D ≤ 0 or bits outside 1..4.
const qmath::TqCodebook& tq_codebook(int64_t D, int bits);

}  // namespace latentq
