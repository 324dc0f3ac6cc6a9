// latentq/blockfmt.h — the element math of the block formats: FP8 e4m3 tiles (FlashMLA, vLLM
// fp8_ds_mla), per-tensor FP8 (vLLM kv_cache_dtype=fp8), OCP MX (MXFP8, MXFP4), NVFP4 and ggml's
// q8_0 / q4_0 / q4_1. One `__host__ __device__` function quantizes one block of one token row and
// one decodes it; the CPU quantizer (quant/src/cpu/dispatch.cpp) loops over blocks calling them; the
// CUDA kernels (kernels/quant/blocks.cu) call their halves — block_params (statistics, stored scale)
// from one thread per block, encode_block_bytes / dequantize_elements from one thread per few
// code bytes / elements — so the two are byte-identical by construction (qmath.h's rules: IEEE ops each rounded on its
// own, integer bit manipulation for every dtype conversion).
//
// A block is n ≤ BlockDesc::block consecutive elements of one token row (D = kv_lora_rank or
// qk_rope_head_dim); a row has ceil(D / block) blocks, the last one possibly partial (its own
// statistics). Codes of block j start at byte j·block·code_bits/8 of the row; scales are stored
// [T, blocks_per_row] (token, then block), one value of BlockDesc::sd each.
//
// Sources of each rule (the formula is restated at each case below):
//   fp8 tile pow2  FlashMLA tests/quant.py quantize_k_cache (V32_FP8Sparse; MODEL1 / V4.1 store the
//                  same power of two as one UE8M0 byte)
//   fp8 tile fp32  vLLM csrc/cache_kernels.cu concat_and_cache_ds_mla_kernel
//   fp8 tile pow2 amax floor  vLLM csrc/cache_kernels.cu indexer_k_quant_and_cache_kernel (the DSA indexer key
//                  cache, scale_fmt ue8m0; local-inference-lab/vllm 28be48fa): s = 2^ceil(log2(max(amax, 1e-4) / 448))
//                  stored as fp32 (exact math, as for FlashMLA's pow2), code = e4m3(x / s)
//   fp8 tensor     vLLM kv_cache_dtype=fp8 (one scale per layer; calibrated amax/448, or 1.0)
//   MX             OCP Microscaling Formats (MX) v1.0 §6.3 (shared exponent floor(log2 amax) − emax),
//                  as torchao prototype/mx_formats to_mx, ScaleCalculationMode.FLOOR
//   MX ceil        SGLang python/sglang/srt/layers/attention/dsv4/fp4_indexer.py (commit 301bcf08)
//                  _quantize_fp4_indexer_kernel, _ceil_ue8m0_exp, _fp4_e2m1_code (its DSA indexer key cache in
//                  MXFP4): s = 2^ceil(log2(max(amax/6, 1e-4))) as one UE8M0 byte clamped to [1, 254]; the e2m1
//                  code by thresholds on min(|x/s|, 6) (a tie goes toward zero) with no −0
//   NVFP4          torchao prototype/mx_formats nvfp4_tensor.py nvfp4_quantize (two-level scaling)
//   fp4 tile       FlashMLA tests/quant.py (V41_FP4Sparse): s = e4m3(clamp(amax/6, 2^-9, 448)), code = e2m1(x/s)
//   fp4 tile rcp   FlashInfer include/flashinfer/attention/sparse_mla_sm120/common/nvfp4_quantization.cuh
//                  quantize_fp32_group16_to_nvfp4_regs (commit 3fe65b06, FlashInfer PR 4955, the DeepSeek-V4
//                  NVFP4 MLA cache): s = e4m3(amax/6) (RNE, saturating, no floor), code = e2m1(x · (1/s)),
//                  1/s := 0 when s = 0 (every code 0); also vLLM's nvfp4_utils.cuh cvt_warp_fp16_to_fp4 at global
//                  scale 1.0 (the nvfp4_ds_mla record of local-inference-lab/vllm PR 82), whose e4m3(amax · fl(1/6))
//                  is e4m3(amax/6) for every bf16 and fp16 amax
//   MX round       SGLang python/sglang/srt/layers/attention/dsv4/mxfp4_k_cache.py (_quantize_mxfp4_k_cache_into_kernel,
//                  the DeepSeek-V4 MXFP4 KV cache of PRs 32741 / 37136-37138): byte = clamp(round(log2(max(amax, 1e-40)) −
//                  log2 6) + 127, 0, 255), round half up; codes e2m1 RNE of x / 2^(byte − 127) (by midpoint comparisons
//                  on x, which for a power-of-two scale is RNE of the exact quotient), the sign bit of x kept (−0: 0x8).
//                  Exact math here: the tie amax = 3·√2·2^k is irrational, so the byte is floor(log2 amax) − 3, plus 1
//                  when amax's significand is ≥ 3·√2/4 (kMxRoundSignificand)
//   int4 e4m3      SGLang python/sglang/srt/mem_cache/kvbit_dsv4_codec.py encode_dsv4_int4_reference (and the Triton
//                  _dsv4_int4_pack_scatter_kernel; PR 38301, --kv-cache-dtype int4): s = e4m3(min(amax / 7, 448)) (RNE),
//                  code = clamp(rne(x / s), −7, 7) as a 4-bit two's complement nibble, every code 0 when s = 0
//   ggml           ggml/src/ggml-quants.c quantize_row_q8_0_ref / q4_0_ref / q4_1_ref, and the
//                  dequantize_row_* routines
#pragma once

#include <cstdint>

#include "latentq/qmath.h"

namespace latentq::qmath {

/// Which element/scale rule a block format uses.
enum class BlockKind : uint8_t {
  Fp8Pow2 = 0,    ///< e4m3, s = 2^ceil(log2(max(amax/448, 1e-4))) (FlashMLA)
  Fp8Fp32 = 1,    ///< e4m3, s = max(amax/448, FLT_MIN) (vLLM fp8_ds_mla)
  Fp8Tensor = 2,  ///< e4m3, one per-tensor scale (global), no per-block scale
  MxFp8 = 3,      ///< e4m3 elements, E8M0 shared scale per 32
  MxFp4 = 4,      ///< e2m1 elements, E8M0 shared scale per 32
  NvFp4 = 5,      ///< e2m1 elements, e4m3 scale per 16, fp32 per-tensor scale (global)
  Q8_0 = 6,       ///< ggml: int8 codes, fp16 d = amax/127, per 32
  Q4_0 = 7,       ///< ggml: 4-bit codes, fp16 d = max/−8 (max: the signed value of largest |x|), per 32
  Q4_1 = 8,       ///< ggml: 4-bit codes, fp16 d = (max−min)/15 and fp16 m = min, per 32
  Fp4Tile = 9,    ///< e2m1, e4m3 scale e4m3(clamp(amax/6, 2^-9, 448)) per tile, no per-tensor scale (FlashMLA V4.1 FP4)
  Fp4TileRcp = 10,  ///< e2m1, e4m3 scale e4m3(amax/6) per tile, elements times 1/scale (FlashInfer NVFP4 MLA)
  MxFp4Ceil = 11,   ///< e2m1 by thresholds, UE8M0 scale 2^ceil(log2(max(amax/6, 1e-4))) per 32 (SGLang FP4 indexer)
  Fp8Pow2AmaxFloor = 12,  ///< e4m3, s = 2^ceil(log2(max(amax, 1e-4) / 448)) as fp32 (vLLM's DSA indexer cache)
  MxFp4Round = 13,        ///< e2m1 RNE, UE8M0 scale 2^round(log2(amax / 6)) per 32 (SGLang's DeepSeek-V4 MXFP4 KV cache)
  Int4E4m3 = 14,          ///< signed INT4 in [−7, 7], e4m3 scale e4m3(min(amax / 7, 448)) per 32 (SGLang's V4 INT4 KV cache)
};

/// Runtime description of a block format, as the kernels receive it (POD).
struct BlockDesc {
  BlockKind kind;
  int block;        ///< elements per block along the row (a tile width for fp8 tiles, D for Fp8Tensor)
  int code_bits;    ///< 8 or 4
  ScaleDtype sd;    ///< dtype of the per-block scale (and q4_1's offset)
  bool has_scale;   ///< a scale is stored per block (false: Fp8Tensor)
  bool has_offset;  ///< an offset is stored per block (q4_1's m)
};

constexpr float kFlashMlaScaleFloor = 1e-4f;  ///< FlashMLA: max(amax / 448, 1e-4)
constexpr float kFltMin = 1.17549435e-38f;    ///< FLT_MIN, vLLM's floor
constexpr float kE4M3Tiny = 0.015625f;        ///< 2^-6, torch.finfo(float8_e4m3fn).tiny: NVFP4's scale floor
/// MxFp4Round: the smallest 23-bit significand field m with 1 + m·2^-23 ≥ 3·√2/4 = 1.06066017177982…, i.e. the
/// first float32 significand at which log2(amax / 6) rounds up (508854.40… · 2^-23 lies below the tie).
constexpr uint32_t kMxRoundSignificand = 508855u;
constexpr float kInt4Max = 7.0f;  ///< Int4E4m3: the largest code magnitude (the scale is amax / 7)

/// What quantize_block reports: whether a stored value overflowed its dtype (then raw holds the
/// float32 value before rounding, offset tells which), and how many elements saturated (the saturating cast
/// changed them: |x/s| > 464 for e4m3, whose tie at 464 rounds to 448 anyway; |x/s| ≥ 7 for e2m1).
struct BlockStatus {
  bool overflow = false;
  bool overflow_offset = false;
  float raw = 0.0f;
  int saturated = 0;
};

/// Bytes of the codes of n elements at code_bits (n even for 4-bit blocks except a row's tail).
LQ_HD int block_code_bytes(int n, int code_bits) { return (n * code_bits + 7) / 8; }

/// The per-tensor ("global") scale of a tensor-scaled format from the tensor's amax = max|x|:
///   Fp8Tensor calibrated: amax / 448 (1.0 for an all-zero tensor); NvFp4: amax / (448 · 6)
///   (torchao per_tensor_amax_to_scale; 0 for an all-zero tensor, whose codes are then all zero).
/// unit = true: Fp8Tensor's uncalibrated default scale 1.0 (vLLM without calibration).
LQ_HD float global_scale(BlockKind k, float amax, bool unit) {
  if (k == BlockKind::NvFp4) return div_rn(amax, mul_rn(kE4M3Max, kE2M1Max));
  if (unit || amax == 0.0f) return 1.0f;
  return div_rn(amax, kE4M3Max);
}

namespace detail {
/// ggml's id = d ? 1/d : 0, with an infinite 1/d (|d| below 2^-128, where ggml's float → int8 cast
/// is undefined) also mapped to 0: the stored fp16 d is 0 there, so every decoded value is 0 (q8_0,
/// q4_0) or m (q4_1) whatever the codes.
LQ_HD float ggml_inverse(float d) {
  const float id = d != 0.0f ? div_rn(1.0f, d) : 0.0f;
  return is_finite(id) ? id : 0.0f;
}
/// Stores d as ggml's fp16 scale/offset; an fp16 overflow marks the block (raw d, offset or not).
LQ_HD void store_f16_checked(uint8_t* dst, float d, bool offset, BlockStatus& st) {
  store_dtype(dst, d, ScaleDtype::F16);
  if (!st.overflow && !is_finite(round_to_dtype(d, ScaleDtype::F16))) {
    st.overflow = true;
    st.overflow_offset = offset;
    st.raw = d;
  }
}
LQ_HD uint32_t get_code(const uint8_t* codes, int i, int code_bits, bool ggml_order, int n) {
  if (code_bits == 8) return codes[i];
  if (ggml_order) {
    const int h = n / 2;
    return i < h ? (codes[i] & 0x0fu) : (codes[i - h] >> 4);
  }
  return (codes[i >> 1] >> ((i & 1) * 4)) & 0x0fu;
}
/// Saturation thresholds of the element formats: the largest finite value plus half its last step
/// (|v| at or beyond it rounds past the largest code, which then clamps).
constexpr float kE4M3Saturation = 464.0f;  // 448 + 32/2
constexpr float kE2M1Saturation = 7.0f;    // 6 + 2/2
constexpr float kInt4Saturation = 7.5f;    // Int4E4m3: rne(|v|) > 7 from 7.5 (a tie that goes to 8), clamped to 7
/// Whether the saturating cast changes v: |v| rounds (RNE) past the format's max. e4m3: |v| > 464, since 464, the
/// midpoint of 448 and the next step 480, is a tie that goes to 448 (even mantissa 110) with or without the clamp;
/// e2m1: |v| ≥ 7, since 7, the midpoint of 6 and 8, goes to 8 (even mantissa) and only the clamp brings it to 6.
LQ_HD bool e4m3_saturates(float v) { return abs_f(v) > kE4M3Saturation; }
LQ_HD bool e2m1_saturates(float v) { return abs_f(v) >= kE2M1Saturation; }
/// e4m3 code of v with the saturation count (e4m3_saturates).
LQ_HD uint8_t e4m3_sat(float v, int& saturated) {
  saturated += e4m3_saturates(v) ? 1 : 0;
  return f32_to_e4m3_bits(v);
}
LQ_HD uint8_t e2m1_sat(float v, int& saturated) {
  saturated += e2m1_saturates(v) ? 1 : 0;
  return f32_to_e2m1_bits(v);
}
/// SGLang _fp4_e2m1_code: a = min(|v|, 6); the magnitude code is the number of the thresholds 0.25, 0.75, 1.25,
/// 1.75, 2.5, 3.5, 5 that a exceeds (so a tie goes to the smaller magnitude, where RNE goes to the even code); the
/// sign bit only on a non-zero magnitude (no −0). |v| > 6 counts as saturated (the min() changes it).
LQ_HD uint8_t e2m1_threshold(float v, int& saturated) {
  const float a = min_num(abs_f(v), 6.0f);
  saturated += abs_f(v) > 6.0f ? 1 : 0;
  const uint8_t m = static_cast<uint8_t>((a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) + (a > 2.5f) +
                                         (a > 3.5f) + (a > 5.0f));
  return static_cast<uint8_t>(m | (v < 0.0f && m != 0 ? 0x8u : 0u));
}
}  // namespace detail

/// What a block's statistics fix for its elements (block_params → encode_block_bytes): the
/// divisor or multiplier of every element, q4_1's min, NVFP4's all-zero tensor, and max|x| of the
/// block (the caller's per-tensor amax).
struct BlockParams {
  float s = 0.0f;     ///< fp8 tile / MX / fp4 tile / fp8 tensor: the divisor; NVFP4: the multiplier; ggml: id
  float inv = 0.0f;   ///< Fp8Pow2, MX: 1/s, exact (s = 2^E, 1/s = 2^−E is a float32 for every E they reach)
  float mn = 0.0f;    ///< q4_1: min
  float amax = 0.0f;  ///< max|x| of the block
  int zero = 0;       ///< NVFP4 of an all-zero tensor: every code is 0
};

/// block_params with the block's max|x| given (amax = max_num over abs_f(x[i]), which for finite x is the same
/// value in any order: the CPU's AVX2 e4m3 path computes it eight at a time). The ggml kinds still read x.
LQ_HD BlockParams block_params_amax(const BlockDesc& f, float amax, const float* x, int n, float global, uint8_t* scale,
                                    uint8_t* offset, BlockStatus& st) {
  BlockParams p;
  p.amax = amax;
  switch (f.kind) {
    case BlockKind::Fp8Pow2: {
      // FlashMLA: scale = 2^ceil(log2(max(amax / 448, 1e-4))); code = e4m3(x / scale)
      const int e = ceil_log2_normal(max_num(div_rn(amax, kE4M3Max), kFlashMlaScaleFloor));  // −13 … 120
      p.s = exp2_int(e);
      p.inv = exp2_int(-e);
      store_dtype(scale, p.s, f.sd);
      return p;
    }
    case BlockKind::Fp8Pow2AmaxFloor: {
      // vLLM indexer_k_quant_and_cache_kernel: scale = 2^ceil(log2(fmaxf(amax, 1e-4) / 448)); code = e4m3(x / scale)
      const int e = ceil_log2_normal(div_rn(max_num(amax, kFlashMlaScaleFloor), kE4M3Max));  // −22 … 121
      p.s = exp2_int(e);
      p.inv = exp2_int(-e);
      store_dtype(scale, p.s, f.sd);
      return p;
    }
    case BlockKind::Fp8Fp32: {
      // vLLM fp8_ds_mla: scale = max(amax / 448, FLT_MIN); code = e4m3(x / scale)
      p.s = max_num(div_rn(amax, kE4M3Max), kFltMin);
      store_dtype(scale, p.s, ScaleDtype::F32);
      return p;
    }
    case BlockKind::Fp8Tensor:  // code = e4m3(x / global)
      p.s = global;
      return p;
    case BlockKind::MxFp8:
    case BlockKind::MxFp4: {
      // OCP MX v1.0 §6.3: X = 2^(floor(log2(amax)) − emax_elem), clamped to the E8M0 range; P_i = x_i / X
      // cast with saturation (emax: 8 for e4m3, 2 for e2m1)
      int e = floor_log2_bits(amax) - (f.kind == BlockKind::MxFp8 ? 8 : 2);
      e = e < -127 ? -127 : (e > 127 ? 127 : e);
      p.s = exp2_int(e);
      p.inv = exp2_int(-e);  // 2^-127 … 2^127 (2^-127 subnormal, exact)
      scale[0] = static_cast<uint8_t>(e + 127);
      return p;
    }
    case BlockKind::MxFp4Ceil: {
      // SGLang _ceil_ue8m0_exp: sf = max(amax / 6, 1e-4); byte = the biased exponent of sf, plus 1 if any mantissa
      // bit is set, clamped to [1, 254]; scale = 2^(byte − 127)
      int b = ceil_log2_normal(max_num(div_rn(amax, kE2M1Max), kFlashMlaScaleFloor)) + 127;
      b = b < 1 ? 1 : (b > 254 ? 254 : b);
      p.s = exp2_int(b - 127);
      p.inv = exp2_int(127 - b);
      scale[0] = static_cast<uint8_t>(b);
      return p;
    }
    case BlockKind::MxFp4Round: {
      // SGLang mxfp4_k_cache.py: byte = clamp(floor(log2(max(amax, 1e-40)) - log2(6) + 0.5) + 127, 0, 255). Exactly:
      // floor(log2 amax) - 3 (log2 6 is in (2, 3)), plus 1 from the significand 3·√2/4 up; a zero, subnormal or
      // amax below 6·2^-127.5 gives a byte ≤ 0, clamped to 0 (scale 2^-127)
      const uint32_t u = f32_bits(amax);
      int b = floor_log2_bits(amax) - 3 + ((u & 0x7fffffu) >= kMxRoundSignificand ? 1 : 0) + 127;
      b = b < 0 ? 0 : (b > 255 ? 255 : b);
      p.s = exp2_int(b - 127);
      p.inv = exp2_int(127 - b);  // 2^-128 … 2^127: exact (b ≤ 252 for a finite amax)
      scale[0] = static_cast<uint8_t>(b);
      return p;
    }
    case BlockKind::Int4E4m3: {
      // SGLang encode_dsv4_int4_reference: stored_step = e4m3(min(amax / 7, 448)); code = clamp(round(x / step), -7, 7)
      const uint8_t sbits = f32_to_e4m3_bits(min_num(div_rn(amax, kInt4Max), kE4M3Max));
      scale[0] = sbits;
      p.s = e4m3_bits_to_f32(sbits);
      return p;
    }
    case BlockKind::NvFp4: {
      // torchao nvfp4_quantize, two-level: s_b = e4m3(clamp(amax/6 / global, 2^-6, 448));
      // code = e2m1(clamp(x · ((1/global) / s_b), −6, 6)); decode x̂ = code · (global · s_b)
      if (global == 0.0f) {  // an all-zero tensor: scale byte 0, codes 0
        scale[0] = 0;
        p.zero = 1;
        return p;
      }
      float sb = div_rn(div_rn(amax, kE2M1Max), global);
      sb = min_num(max_num(sb, kE4M3Tiny), kE4M3Max);
      const uint8_t sbits = f32_to_e4m3_bits(sb);
      scale[0] = sbits;
      p.s = div_rn(div_rn(1.0f, global), e4m3_bits_to_f32(sbits));  // torchao: x · ((1/g) / s_b)
      return p;
    }
    case BlockKind::Fp4TileRcp: {
      // FlashInfer NVFP4 MLA: s = e4m3(amax / 6); inv = s == 0 ? 0 : 1/s; code = e2m1(x · inv)
      const uint8_t sbits = f32_to_e4m3_bits(div_rn(amax, kE2M1Max));
      scale[0] = sbits;
      p.s = e4m3_bits_to_f32(sbits);
      p.inv = p.s == 0.0f ? 0.0f : div_rn(1.0f, p.s);
      return p;
    }
    case BlockKind::Fp4Tile: {
      // FlashMLA V4.1 FP4: s = e4m3(clamp(amax / 6, 2^-9, 448)); code = e2m1(x / s) (true division)
      const uint8_t sbits = f32_to_e4m3_bits(min_num(max_num(div_rn(amax, kE2M1Max), 0.001953125f), kE4M3Max));
      scale[0] = sbits;
      p.s = e4m3_bits_to_f32(sbits);
      return p;
    }
    case BlockKind::Q8_0: {
      // ggml quantize_row_q8_0_ref: d = amax / 127; id = d ? 1/d : 0; q = roundf(x · id); store fp16(d)
      const float d = div_rn(amax, 127.0f);
      p.s = detail::ggml_inverse(d);
      detail::store_f16_checked(scale, d, false, st);
      return p;
    }
    case BlockKind::Q4_0: {
      // ggml quantize_row_q4_0_ref: max = the x of largest |x| (first on ties); d = max / −8;
      // id = d ? 1/d : 0; q = min(15, (int8_t)(x · id + 8.5f)); store fp16(d)
      float am = 0.0f, mx = 0.0f;
      for (int i = 0; i < n; ++i)
        if (am < abs_f(x[i])) {
          am = abs_f(x[i]);
          mx = x[i];
        }
      const float d = div_rn(mx, -8.0f);
      p.s = detail::ggml_inverse(d);
      detail::store_f16_checked(scale, d, false, st);
      return p;
    }
    case BlockKind::Q4_1: {
      // ggml quantize_row_q4_1_ref: d = (max − min) / 15; id = d ? 1/d : 0;
      // q = min(15, (int8_t)((x − min) · id + 0.5f)); store fp16(d), fp16(min)
      float mn = x[0], mx = x[0];
      for (int i = 1; i < n; ++i) {
        mn = min_num(mn, x[i]);
        mx = max_num(mx, x[i]);
      }
      const float d = div_rn(sub_rn(mx, mn), 15.0f);
      p.s = detail::ggml_inverse(d);
      p.mn = mn;
      detail::store_f16_checked(scale, d, false, st);
      detail::store_f16_checked(offset, mn, true, st);
      return p;
    }
  }
  return p;
}

/// The statistics half of quantize_block: from x[0, n) (n ≤ f.block, finite) computes the block's
/// parameters (block_params_amax of its max|x|, folded in element order) and stores its
/// scale[scale_dtype_bytes(f.sd)] and offset[...] (q4_1); an overflow of a stored value is reported in st
/// (the stored value is written anyway).
LQ_HD BlockParams block_params(const BlockDesc& f, const float* x, int n, float global, uint8_t* scale, uint8_t* offset,
                               BlockStatus& st) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = max_num(amax, abs_f(x[i]));
  return block_params_amax(f, amax, x, n, global, scale, offset, st);
}

/// How scaled_element scales the elements of the float8/float4 kinds with a per-block or per-tensor divisor:
/// true: v · p.inv (the power-of-two scales: Fp8Pow2, MxFp8, MxFp4; and Fp4TileRcp, whose source multiplies by
/// its rounded reciprocal), false: v / p.s (Fp8Fp32, Fp8Tensor,
/// Fp4Tile). The CPU's AVX2 e4m3 encoder takes its operation from here too.
LQ_HD bool scales_by_inverse(BlockKind k) {
  return k == BlockKind::Fp8Pow2 || k == BlockKind::MxFp8 || k == BlockKind::MxFp4 || k == BlockKind::Fp4TileRcp ||
         k == BlockKind::MxFp4Ceil || k == BlockKind::Fp8Pow2AmaxFloor || k == BlockKind::MxFp4Round;
}

/// The float8/float4 kinds: element v scaled by the block's parameters, the value its code rounds.
/// Power-of-two scales (Fp8Pow2, MX): v / s is computed as v · (1/s), which is the same real value
/// (1/s = 2^−E is exact), rounded once by either IEEE operation: bit-identical to the division
/// the sources write, and one multiply instead of a division per element. NVFP4 of an all-zero
/// tensor: 0. The ggml kinds: v (they scale inside encode_element).
LQ_HD float scaled_element(const BlockDesc& f, const BlockParams& p, float v) {
  switch (f.kind) {
    case BlockKind::Fp8Pow2:
    case BlockKind::Fp8Pow2AmaxFloor:
    case BlockKind::MxFp8:
    case BlockKind::MxFp4:
    case BlockKind::MxFp4Ceil:
    case BlockKind::MxFp4Round:
    case BlockKind::Fp8Fp32:
    case BlockKind::Fp8Tensor:
    case BlockKind::Fp4Tile:
    case BlockKind::Fp4TileRcp:
    case BlockKind::Int4E4m3:  // x / step (the source's true division)
      return scales_by_inverse(f.kind) ? mul_rn(v, p.inv) : div_rn(v, p.s);
    case BlockKind::NvFp4:
      return p.zero ? 0.0f : mul_rn(v, p.s);
    default:
      return v;
  }
}

/// The code (low bits) of one element v of a block with parameters p; counts a saturation
/// (detail::e4m3_saturates or e2m1_saturates of scaled_element; the ggml kinds never saturate).
LQ_HD uint32_t encode_element(const BlockDesc& f, const BlockParams& p, float v, int& saturated) {
  switch (f.kind) {
    case BlockKind::Fp8Pow2:
    case BlockKind::Fp8Pow2AmaxFloor:
    case BlockKind::MxFp8:
    case BlockKind::Fp8Fp32:
    case BlockKind::Fp8Tensor:
      return detail::e4m3_sat(scaled_element(f, p, v), saturated);
    case BlockKind::MxFp4:
    case BlockKind::MxFp4Round:
    case BlockKind::Fp4Tile:
    case BlockKind::Fp4TileRcp:
    case BlockKind::NvFp4:  // an all-zero NVFP4 tensor scales every element to 0: code 0, no saturation
      return detail::e2m1_sat(scaled_element(f, p, v), saturated);
    case BlockKind::Int4E4m3: {  // a zero step: every code 0 (the source's has_step)
      if (p.s == 0.0f) return 0u;
      const float v_s = scaled_element(f, p, v);
      saturated += abs_f(v_s) >= detail::kInt4Saturation ? 1 : 0;
      const int q = static_cast<int>(rne_clamp(v_s, -kInt4Max, kInt4Max));
      return static_cast<uint32_t>(q) & 0x0fu;
    }
    case BlockKind::MxFp4Ceil:
      return detail::e2m1_threshold(scaled_element(f, p, v), saturated);
    case BlockKind::Q8_0: {
      float q = round_half_away(mul_rn(v, p.s));
      q = min_num(max_num(q, -127.0f), 127.0f);  // never binds for finite input: |x · id| ≤ 127 (1 + 2^-23)
      return static_cast<uint8_t>(static_cast<int8_t>(q));
    }
    case BlockKind::Q4_0: {
      const int q = static_cast<int>(add_rn(mul_rn(v, p.s), 8.5f));  // C's (int8_t) truncation
      return static_cast<uint32_t>(q < 15 ? (q < 0 ? 0 : q) : 15);
    }
    case BlockKind::Q4_1: {
      const int q = static_cast<int>(add_rn(mul_rn(sub_rn(v, p.mn), p.s), 0.5f));
      return static_cast<uint32_t>(q < 15 ? (q < 0 ? 0 : q) : 15);
    }
  }
  return 0;
}

/// The element half of quantize_block: writes the code bytes [b0, b1) of a block of n elements
/// x[0, n) with parameters p, each byte whole (8-bit: element b; 4-bit: elements 2b (low nibble)
/// and 2b + 1, or ggml's b and b + n/2; a nibble without an element is 0). Returns the number of
/// saturated elements. Bytes are independent, so any split of [0, block_code_bytes(n)) among
/// callers gives the same codes.
LQ_HD int encode_block_bytes(const BlockDesc& f, const BlockParams& p, const float* x, int n, int b0, int b1,
                             uint8_t* codes /*[b1 - b0]*/) {
  int sat = 0;
  const bool ggml = f.kind == BlockKind::Q4_0 || f.kind == BlockKind::Q4_1;
  for (int b = b0; b < b1; ++b) {
    uint32_t c;
    if (f.code_bits == 8) {
      c = encode_element(f, p, x[b], sat);
    } else if (ggml) {  // ggml q4: byte j holds element j (low) and j + n/2 (high)
      const int h = n / 2;
      c = (b < h ? encode_element(f, p, x[b], sat) : 0u) | (b + h < n ? encode_element(f, p, x[b + h], sat) << 4 : 0u);
    } else {  // element 2k in the low nibble of byte k
      c = encode_element(f, p, x[2 * b], sat) | (2 * b + 1 < n ? encode_element(f, p, x[2 * b + 1], sat) << 4 : 0u);
    }
    codes[b - b0] = static_cast<uint8_t>(c);
  }
  return sat;
}

/// The saturation threshold of a block format's elements (kE4M3Saturation, kE2M1Saturation), +inf for
/// the ggml kinds (their codes clamp by definition: never counted).
LQ_HD float saturation_threshold(const BlockDesc& f) {
  switch (f.kind) {
    case BlockKind::Fp8Pow2:
    case BlockKind::Fp8Pow2AmaxFloor:
    case BlockKind::MxFp8:
    case BlockKind::Fp8Fp32:
    case BlockKind::Fp8Tensor:
      return detail::kE4M3Saturation;
    case BlockKind::MxFp4:
    case BlockKind::MxFp4Round:
    case BlockKind::Fp4Tile:
    case BlockKind::Fp4TileRcp:
    case BlockKind::NvFp4:
      return detail::kE2M1Saturation;
    case BlockKind::Int4E4m3:
      return detail::kInt4Saturation;
    case BlockKind::MxFp4Ceil:
      return 6.0f;  // e2m1_threshold clamps anything above 6
    default:
      return f32_from_bits(0x7f800000u);
  }
}

/// Whether the saturating cast of a block format's element changes the scaled value v (detail::e4m3_saturates,
/// detail::e2m1_saturates); false for the ggml kinds (their codes clamp by definition).
LQ_HD bool element_saturates(const BlockDesc& f, float v) {
  const float t = saturation_threshold(f);  // the element format, by its threshold; +inf for the ggml kinds
  if (f.kind == BlockKind::MxFp4Ceil) return abs_f(v) > t;
  if (f.kind == BlockKind::Int4E4m3) return abs_f(v) >= t;
  if (t == detail::kE4M3Saturation) return detail::e4m3_saturates(v);
  return t == detail::kE2M1Saturation && detail::e2m1_saturates(v);
}

/// The saturation count of encode_block_bytes over a whole block x[0, n) with parameters p, without
/// encoding (what diagnose() reports): the elements whose scaled_element the saturating cast changes
/// (detail::e4m3_saturates, detail::e2m1_saturates); 0 for the ggml kinds and an all-zero NVFP4 tensor.
LQ_HD int count_saturated(const BlockDesc& f, const BlockParams& p, const float* x, int n) {
  if (f.kind == BlockKind::Int4E4m3 && p.s == 0.0f) return 0;  // a zero step: every code 0 (encode_element)
  int sat = 0;
  for (int i = 0; i < n; ++i) sat += element_saturates(f, scaled_element(f, p, x[i])) ? 1 : 0;
  return sat;
}

/// Quantize x[0, n) (n ≤ f.block, finite) into codes[block_code_bytes(n)], scale[scale_dtype_bytes(f.sd)]
/// and offset[...] (q4_1). global: the per-tensor scale (Fp8Tensor, NvFp4; ignored otherwise). The
/// stored values are written even when they overflow; the caller refuses the result
/// (BlockStatus::overflow). = block_params, then encode_block_bytes over every code byte (the CUDA
/// kernel calls the two halves from different threads).
LQ_HD BlockStatus quantize_block(const BlockDesc& f, const float* x, int n, float global, uint8_t* codes,
                                 uint8_t* scale, uint8_t* offset) {
  BlockStatus st;
  const BlockParams p = block_params(f, x, n, global, scale, offset, st);
  st.saturated = encode_block_bytes(f, p, x, n, 0, block_code_bytes(n, f.code_bits), codes);
  return st;
}

/// The decode multiplier of a block of a float8/float4 kind (out = element value · multiplier): its stored
/// scale (Fp8Pow2 in its scale dtype, Fp8Fp32 in fp32), the per-tensor global (Fp8Tensor), the E8M0 scale
/// (MxFp8, MxFp4), the e4m3 scale (Fp4Tile) or global · e4m3 scale (NvFp4). 0 for the ggml kinds.
/// dequantize_elements and the CPU's AVX2 decode both use it.
LQ_HD float minifloat_block_multiplier(const BlockDesc& f, const uint8_t* scale, float global) {
  switch (f.kind) {
    case BlockKind::Fp8Pow2:
    case BlockKind::Fp8Pow2AmaxFloor:
    case BlockKind::Fp8Fp32:
      return load_dtype(scale, f.sd);
    case BlockKind::Fp8Tensor:
      return global;
    case BlockKind::MxFp8:
    case BlockKind::MxFp4:
    case BlockKind::MxFp4Ceil:
    case BlockKind::MxFp4Round:
      return e8m0_bits_to_f32(scale[0]);
    case BlockKind::Fp4Tile:
    case BlockKind::Fp4TileRcp:
    case BlockKind::Int4E4m3:
      return e4m3_bits_to_f32(scale[0]);
    case BlockKind::NvFp4:
      return mul_rn(global, e4m3_bits_to_f32(scale[0]));
    default:
      return 0.0f;
  }
}

/// Decode elements [i0, i1) of a block of n elements into out[i1 − i0]: reads only the stored
/// codes, scale, offset and the stored global scale. Elements are independent (any split gives the
/// same values).
LQ_HD void dequantize_elements(const BlockDesc& f, const uint8_t* codes, const uint8_t* scale, const uint8_t* offset,
                               float global, int n, int i0, int i1, float* out) {
  switch (f.kind) {
    case BlockKind::Fp8Pow2:
    case BlockKind::Fp8Pow2AmaxFloor:
    case BlockKind::Fp8Fp32:
    case BlockKind::Fp8Tensor:
    case BlockKind::MxFp8: {
      const float s = minifloat_block_multiplier(f, scale, global);
      for (int i = i0; i < i1; ++i) out[i - i0] = mul_rn(e4m3_bits_to_f32(codes[i]), s);
      return;
    }
    case BlockKind::MxFp4:
    case BlockKind::MxFp4Ceil:
    case BlockKind::MxFp4Round:
    case BlockKind::NvFp4:
    case BlockKind::Fp4Tile:
    case BlockKind::Fp4TileRcp: {
      const float s = minifloat_block_multiplier(f, scale, global);
      for (int i = i0; i < i1; ++i)
        out[i - i0] = mul_rn(e2m1_bits_to_f32(static_cast<uint8_t>(detail::get_code(codes, i, 4, false, n))), s);
      return;
    }
    case BlockKind::Int4E4m3: {  // SGLang decode_dsv4_int4_reference: signed nibble (≥ 8: − 16) times the step
      const float s = e4m3_bits_to_f32(scale[0]);
      for (int i = i0; i < i1; ++i) {
        const int c = static_cast<int>(detail::get_code(codes, i, 4, false, n));
        out[i - i0] = mul_rn(static_cast<float>(c >= 8 ? c - 16 : c), s);
      }
      return;
    }
    case BlockKind::Q8_0: {  // ggml dequantize_row_q8_0: x = q · d
      const float d = load_dtype(scale, ScaleDtype::F16);
      for (int i = i0; i < i1; ++i) out[i - i0] = mul_rn(static_cast<float>(static_cast<int8_t>(codes[i])), d);
      return;
    }
    case BlockKind::Q4_0: {  // dequantize_row_q4_0: x = (q − 8) · d
      const float d = load_dtype(scale, ScaleDtype::F16);
      for (int i = i0; i < i1; ++i)
        out[i - i0] = mul_rn(static_cast<float>(static_cast<int>(detail::get_code(codes, i, 4, true, n)) - 8), d);
      return;
    }
    case BlockKind::Q4_1: {  // dequantize_row_q4_1: x = q · d + m (two roundings: no FMA)
      const float d = load_dtype(scale, ScaleDtype::F16), m = load_dtype(offset, ScaleDtype::F16);
      for (int i = i0; i < i1; ++i)
        out[i - i0] = add_rn(mul_rn(static_cast<float>(detail::get_code(codes, i, 4, true, n)), d), m);
      return;
    }
  }
}

/// Decode n elements of one block into out[n] (dequantize_elements over [0, n)).
LQ_HD void dequantize_block(const BlockDesc& f, const uint8_t* codes, const uint8_t* scale, const uint8_t* offset,
                            float global, int n, float* out) {
  dequantize_elements(f, codes, scale, offset, global, n, 0, n, out);
}

}  // namespace latentq::qmath
