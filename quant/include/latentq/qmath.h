// latentq/qmath.h — the one source of truth for element-level quantization math.
//
// Every function here is `__host__ __device__` (LQ_HD) and is used unchanged by the CPU reference
// (quant/src/quantize.cpp, quant/src/cpu/) and by the CUDA kernels (kernels/). Byte identity between the two
// follows from three rules:
//   1. Only IEEE-754 single-precision +, -, *, / with round-to-nearest-even, each rounded on its
//      own: the device side uses __fadd_rn/__fsub_rn/__fmul_rn/__fdiv_rn (never contracted into an
//      FMA), the host side is compiled with -ffp-contract=off and without fast-math.
//   2. Integer rounding is round-half-to-even, computed as (v + 1.5·2^23) − 1.5·2^23 after v has
//      been clamped to the code range (|v| ≤ 2^22), which is exact IEEE RNE and vectorizes.
//   3. Storage-dtype conversions (fp16, bf16, fp8 e4m3) are done with integer bit manipulation,
//      round-to-nearest-even, no hardware intrinsics.
//
// Conventions (see also quant/include/latentq/spec.h):
//   Symmetric  (bits b): qmax = 2^(b-1) − 1, scale = absmax / qmax, q = clamp(rne(x / scale), −qmax, qmax),
//              x̂ = scale·q. The code stored is u = q + 2^(b-1) ∈ [1, 2^b − 1] (offset binary).
//   Asymmetric (bits b): scale = (max − min) / (2^b − 1), offset = min, q = clamp(rne((x − offset) / scale),
//              0, 2^b − 1), x̂ = offset + scale·q (KIVI). The code stored is u = q.
//   scale and offset are computed in float32 from the group's true statistics and rounded to
//   their storage dtype (fp16 or fp32) BEFORE encoding, so decode uses exactly what is stored.
//   A stored scale of 0 (zero-range group, or a range below the scale dtype's resolution) encodes
//   every element as q = 0 (u = 2^(b-1) for sym) with no division: x̂ = offset (asym) or 0 (sym).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LQ_HD __host__ __device__ __forceinline__
#else
#define LQ_HD inline
#endif

namespace latentq::qmath {

// ---- bit casts -----------------------------------------------------------------------------
LQ_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
LQ_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// ---- IEEE single-precision arithmetic, never contracted ------------------------------------
LQ_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LQ_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
LQ_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LQ_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
/// IEEE square root, correctly rounded (host sqrtf: SSE sqrtss; device: __fsqrt_rn).
LQ_HD float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return __builtin_sqrtf(a);
#endif
}
/// min/max written out so the host compiler vectorizes them. A NaN in the SECOND operand b is ignored
/// (the result is a); a NaN in a is returned as is, so accumulate as m = min_num(m, x[i]).
/// NaN inputs are rejected before quantization anyway (see count_nonfinite).
LQ_HD float min_num(float a, float b) { return (b < a) ? b : a; }
LQ_HD float max_num(float a, float b) { return (b > a) ? b : a; }
LQ_HD float abs_f(float a) { return f32_from_bits(f32_bits(a) & 0x7fffffffu); }
LQ_HD bool is_finite(float a) { return (f32_bits(a) & 0x7f800000u) != 0x7f800000u; }

/// Round half to even for |v| ≤ 2^22: (v + 1.5·2^23) − 1.5·2^23 is exact IEEE RNE in that range.
LQ_HD float rne_small(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 · 2^23
  return sub_rn(add_rn(v, kMagic), kMagic);
}
/// clamp(rne(v), lo, hi) for integer-valued lo ≤ hi with |lo|, |hi| ≤ 2^22. Clamping first is
/// equivalent because rne is monotonic and lo, hi are integers; a NaN v maps to lo (v is max_num's
/// second operand, whose NaN is ignored).
LQ_HD float rne_clamp(float v, float lo, float hi) { return rne_small(min_num(max_num(lo, v), hi)); }

// ---- fp16 (IEEE binary16), round to nearest even --------------------------------------------
/// float32 → fp16 bits, RNE, overflow → ±inf, NaN → quiet NaN 0x7e00. (F. Giesen's rtne method.)
LQ_HD uint16_t f32_to_f16_bits(float f) {
  uint32_t u = f32_bits(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t o;
  if (u >= (143u << 23)) {  // |f| ≥ 65536: inf, or NaN
    o = (u > 0x7f800000u) ? 0x7e00 : 0x7c00;
  } else if (u < (113u << 23)) {                           // |f| < 2^-14: fp16 subnormal or zero
    const float denorm_magic = f32_from_bits(126u << 23);  // 0.5: aligns 10 mantissa bits at the bottom
    o = static_cast<uint16_t>(f32_bits(add_rn(f32_from_bits(u), denorm_magic)) - (126u << 23));
  } else {
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mant_odd;
    o = static_cast<uint16_t>(u >> 13);  // a carry into the exponent gives 0x7c00 (inf)
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}
/// fp16 bits → float32, exact.
LQ_HD float f16_bits_to_f32(uint16_t h) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = shifted_exp & o;
  o += static_cast<uint32_t>(127 - 15) << 23;
  if (exp == shifted_exp) {
    o += static_cast<uint32_t>(128 - 16) << 23;  // inf / NaN
  } else if (exp == 0) {
    o += 1u << 23;  // zero / subnormal: renormalize
    o = f32_bits(sub_rn(f32_from_bits(o), f32_from_bits(113u << 23)));
  }
  return f32_from_bits(o | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

// ---- bf16, round to nearest even ------------------------------------------------------------
LQ_HD uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
LQ_HD float bf16_bits_to_f32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

// ---- fp8 e4m3 (OCP "e4m3fn": bias 7, max 448, no inf, NaN = 0x7f / 0xff) ----------------------
constexpr float kE4M3Max = 448.0f;
/// float32 → bits of a small float with M mantissa bits, exponent bias B and largest finite code
/// MAXC (magnitude bits; the sign goes to bit SIGN), RNE, saturating to the largest finite value:
/// the subnormals (|f| < 2^(1−B)) are m·2^(1−B−M) by rne_small, the normals by integer rounding of
/// the float32 mantissa (a carry into the exponent is the RNE result; beyond MAXC saturates).
/// NaN → MAXC (callers reject NaN before encoding).
template <int M, int B, uint32_t MAXC, int SIGN>
LQ_HD uint8_t f32_to_minifloat_bits(float f, float max_value) {
  uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 31) << SIGN);
  u &= 0x7fffffffu;
  const float a = f32_from_bits(u);
  uint8_t o;
  if (!(a < max_value)) {
    o = static_cast<uint8_t>(MAXC);  // saturate; NaN lands here too
  } else if (u < (static_cast<uint32_t>(128 - B)
                  << 23)) {  // subnormal: m·2^(1−B−M); m = 2^M is the smallest normal, same bits
    o = static_cast<uint8_t>(rne_small(mul_rn(a, f32_from_bits(static_cast<uint32_t>(127 + B - 1 + M) << 23))));
  } else {
    constexpr int S = 23 - M;
    const uint32_t mant_odd = (u >> S) & 1u;
    u += (static_cast<uint32_t>(B - 127) << 23) + ((1u << (S - 1)) - 1u) + mant_odd;
    const uint32_t c = u >> S;
    o = static_cast<uint8_t>(c > MAXC ? MAXC : c);
  }
  return static_cast<uint8_t>(o | sign);
}
/// float32 → e4m3 bits, RNE, saturating to ±448 (as torch's float8_e4m3fn cast after FlashMLA's
/// clamp); NaN → 0x7f.
LQ_HD uint8_t f32_to_e4m3_bits(float f) {
  if ((f32_bits(f) & 0x7fffffffu) > 0x7f800000u) return 0x7f;
  return f32_to_minifloat_bits<3, 7, 0x7eu, 7>(f, kE4M3Max);
}
/// e4m3 bits → float32, exact.
LQ_HD float e4m3_bits_to_f32(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xfu, m = c & 7u;
  if (e == 0xfu && m == 7u) return f32_from_bits(sign | 0x7fc00000u);
  if (e == 0) return f32_from_bits(f32_bits(mul_rn(static_cast<float>(m), 0.001953125f)) | sign);  // m·2^-9
  return f32_from_bits(sign | ((e + 120u) << 23) | (m << 20));
}

// ---- fp4 e2m1 (OCP MX v1.0 §5.3.3: bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6; no inf, no NaN) ----
constexpr float kE2M1Max = 6.0f;
/// float32 → e2m1 code (4 bits: sign in bit 3), RNE, saturating to ±6 (as torchao's
/// f32_to_f4_unpacked after its clamp, and ml_dtypes.float4_e2m1fn); NaN → +6 (callers reject NaN).
LQ_HD uint8_t f32_to_e2m1_bits(float f) { return f32_to_minifloat_bits<1, 1, 0x7u, 3>(f, kE2M1Max); }
/// e2m1 code (low 4 bits) → float32, exact.
LQ_HD float e2m1_bits_to_f32(uint8_t c) {
  const uint32_t e = (c >> 1) & 3u, m = c & 1u;
  const float mag = e == 0 ? mul_rn(static_cast<float>(m), 0.5f) : f32_from_bits(((e + 126u) << 23) | (m << 22));
  return (c & 0x8u) ? -mag : mag;
}

// ---- E8M0 / UE8M0 scale bytes (OCP MX v1.0 §5.4.1: value 2^(b − 127), b = 255 is NaN) ---------
/// 2^e as float32 for −127 ≤ e ≤ 127 (2^−127 is a float32 subnormal), exact.
LQ_HD float exp2_int(int e) {
  return e >= -126 ? f32_from_bits(static_cast<uint32_t>(e + 127) << 23) : f32_from_bits(0x00400000u);
}
LQ_HD float e8m0_bits_to_f32(uint8_t b) {
  return b == 0xff ? f32_from_bits(0x7fc00000u) : exp2_int(static_cast<int>(b) - 127);
}
/// floor(log2(v)) from the float32 exponent field (v ≥ 0 finite): exact for normal v; a subnormal
/// or zero v gives −127 (torchao's FLOOR mode reads the exponent bits the same way).
LQ_HD int floor_log2_bits(float v) { return static_cast<int>((f32_bits(v) >> 23) & 0xffu) - 127; }
/// ceil(log2(v)) for a normal positive float32 v, exact: the exponent, plus one if any mantissa bit is set.
LQ_HD int ceil_log2_normal(float v) {
  const uint32_t u = f32_bits(v);
  return static_cast<int>((u >> 23) & 0xffu) - 127 + ((u & 0x7fffffu) != 0u ? 1 : 0);
}

// ---- round half away from zero (C roundf), as ggml's reference quantizers use -----------------
/// roundf(v) for |v| < 2^31, exact: trunc(|v|) + (frac ≥ 0.5), sign restored.
LQ_HD float round_half_away(float v) {
  const float a = abs_f(v);
  const float t = static_cast<float>(static_cast<int32_t>(a));  // trunc, exact for a < 2^31
  const float r = add_rn(t, sub_rn(a, t) >= 0.5f ? 1.0f : 0.0f);
  return f32_from_bits(f32_bits(r) | (f32_bits(v) & 0x80000000u));
}

// ---- scale / offset storage dtype ------------------------------------------------------------
/// Storage dtype of a scale or offset. Values are kept as float32 in registers after being rounded.
///   F16   IEEE binary16 (2 bytes)     F32   float32 (4 bytes)
///   UE8M0 one exponent byte, 2^(b−127) (power-of-two scales: FlashMLA MODEL1 / V4.1, OCP MX E8M0)
///   E4M3  one fp8 e4m3fn byte (NVFP4 block scales)
enum class ScaleDtype : uint8_t { F16 = 0, F32 = 1, UE8M0 = 2, E4M3 = 3 };
/// Bytes of one stored scale/offset of dtype d.
LQ_HD int scale_dtype_bytes(ScaleDtype d) { return d == ScaleDtype::F16 ? 2 : d == ScaleDtype::F32 ? 4 : 1; }
/// v rounded to dtype d (F16: RNE, may overflow to ±inf; F32: v; UE8M0: v must already be a power
/// of two in range (the scale rules produce only those); E4M3: RNE saturating).
LQ_HD float round_to_dtype(float v, ScaleDtype d) {
  switch (d) {
    case ScaleDtype::F16:
      return f16_bits_to_f32(f32_to_f16_bits(v));
    case ScaleDtype::E4M3:
      return e4m3_bits_to_f32(f32_to_e4m3_bits(v));
    default:
      return v;
  }
}
/// Raw little-endian bytes of v (already representable in d) into dst[scale_dtype_bytes(d)].
LQ_HD void store_dtype(uint8_t* dst, float v, ScaleDtype d) {
  switch (d) {
    case ScaleDtype::F16: {
      const uint16_t h = f32_to_f16_bits(v);
      dst[0] = static_cast<uint8_t>(h);
      dst[1] = static_cast<uint8_t>(h >> 8);
      return;
    }
    case ScaleDtype::F32: {
      const uint32_t w = f32_bits(v);
      for (int k = 0; k < 4; ++k) dst[k] = static_cast<uint8_t>(w >> (8 * k));
      return;
    }
    case ScaleDtype::UE8M0:
      dst[0] = static_cast<uint8_t>(floor_log2_bits(v) + 127);
      return;
    case ScaleDtype::E4M3:
      dst[0] = f32_to_e4m3_bits(v);
      return;
  }
}
/// Decoded value of the stored bytes src[scale_dtype_bytes(d)], exact.
LQ_HD float load_dtype(const uint8_t* src, ScaleDtype d) {
  switch (d) {
    case ScaleDtype::F16:
      return f16_bits_to_f32(static_cast<uint16_t>(src[0] | (src[1] << 8)));
    case ScaleDtype::F32:
      return f32_from_bits(static_cast<uint32_t>(src[0]) | (static_cast<uint32_t>(src[1]) << 8) |
                           (static_cast<uint32_t>(src[2]) << 16) | (static_cast<uint32_t>(src[3]) << 24));
    case ScaleDtype::UE8M0:
      return e8m0_bits_to_f32(src[0]);
    case ScaleDtype::E4M3:
      return e4m3_bits_to_f32(src[0]);
  }
  return 0.0f;
}

// ---- integer codes ----------------------------------------------------------------------------
/// Largest symmetric code magnitude, 2^(b-1) − 1: 127, 7, 1 for b = 8, 4, 2.
LQ_HD int sym_qmax(int bits) { return (1 << (bits - 1)) - 1; }
/// Largest asymmetric code, 2^b − 1: 255, 15, 3.
LQ_HD int asym_qmax(int bits) { return (1 << bits) - 1; }

/// (scale, offset) as stored: already rounded to the storage dtype.
struct ScaleOffset {
  float scale;   ///< step between codes; ≥ 0, finite unless the dtype overflowed (caller checks)
  float offset;  ///< value of code 0 (asym: the group min); 0 for symmetric
};

/// Symmetric parameters from the group's absmax: scale = absmax / qmax (float32), then rounded.
LQ_HD ScaleOffset sym_params(float absmax, int bits, ScaleDtype d) {
  return {round_to_dtype(div_rn(absmax, static_cast<float>(sym_qmax(bits))), d), 0.0f};
}
/// Asymmetric parameters from the group's min and max: scale = (max − min) / (2^b − 1), offset = min,
/// each computed in float32 then rounded to the storage dtype. max == min gives scale 0.
LQ_HD ScaleOffset asym_params(float mn, float mx, int bits, ScaleDtype d) {
  return {round_to_dtype(div_rn(sub_rn(mx, mn), static_cast<float>(asym_qmax(bits))), d), round_to_dtype(mn, d)};
}

/// Symmetric encode → offset-binary code u = q + 2^(b-1) ∈ [1, 2^b − 1]; scale 0 → q = 0.
LQ_HD uint32_t encode_sym(float x, float scale, int bits) {
  const float qmax = static_cast<float>(sym_qmax(bits));
  const float q = scale > 0.0f ? rne_clamp(div_rn(x, scale), -qmax, qmax) : 0.0f;
  return static_cast<uint32_t>(static_cast<int>(q) + (1 << (bits - 1)));
}
LQ_HD float decode_sym(uint32_t u, float scale, int bits) {
  return mul_rn(scale, static_cast<float>(static_cast<int>(u) - (1 << (bits - 1))));
}
/// Asymmetric encode → code u = q ∈ [0, 2^b − 1]; scale 0 → q = 0.
LQ_HD uint32_t encode_asym(float x, float scale, float offset, int bits) {
  const float q =
      scale > 0.0f ? rne_clamp(div_rn(sub_rn(x, offset), scale), 0.0f, static_cast<float>(asym_qmax(bits))) : 0.0f;
  return static_cast<uint32_t>(q);
}
LQ_HD float decode_asym(uint32_t u, float scale, float offset) {
  return add_rn(offset, mul_rn(scale, static_cast<float>(u)));
}

// ---- bit packing ------------------------------------------------------------------------------
// Codes of one token row are packed little-end first: INT4 element 2k in bits 0–3 of byte k and
// 2k+1 in bits 4–7; INT2 element 4k+j in bits 2j..2j+1 of byte k; INT8 one byte each. A row is
// padded to whole bytes with zero bits (deterministic padding).
/// Bytes of one packed row of `cols` codes at `bits` per code.
LQ_HD int64_t packed_row_bytes(int64_t cols, int bits) { return (cols * bits + 7) / 8; }

}  // namespace latentq::qmath
