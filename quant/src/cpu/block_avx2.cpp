// quant/src/cpu/block_avx2.cpp — CpuKernel::Avx2 for the block formats: the e4m3 kinds (fp8 tiles,
// per-tensor fp8, MXFP8), the e2m1 kinds (MXFP4, NVFP4, fp4 tiles) and the ggml kinds (q8_0, q4_0, q4_1),
// encoded and decoded eight elements at a time with the bytes of blockfmt.h's scalar code, and the one-pass
// NaN/Inf check and max|x| (abs_bits_max_avx2). x86-64 with GCC or Clang only; dispatch.cpp picks them.
#include <algorithm>
#include <array>
#include <cstring>

#include "dispatch.h"

#if LQ_HAVE_AVX2_KERNEL
namespace latentq::cpu {
namespace {

// ---- the fp8 e4m3 block elements in AVX2 (CpuKernel::Avx2) ---------------------------------------
// qmath.h's f32_to_minifloat_bits<M, B, MAXC, SIGN> on eight floats at once, every branch computed and
// blended: !(|y| < max_value) (NaN too) → MAXC; |y| < 2^(1−B) (the subnormals) → rne_small(|y| · 2^(B−1+M)),
// which vcvtps2dq gives in MXCSR's default mode (the value is in [0, 2^M]; 2^M is the smallest normal's bits,
// as in the scalar code); the normals by the same integer rounding of the float32 mantissa (add
// 2^(22−M) − 1 + the odd bit, shift by 23 − M, clamp to MAXC). The sign goes to bit SIGN.
template <int M, int B, uint32_t MAXC, int SIGN>
LQ_AVX2_AI __m256i minifloat_codes_avx2(__m256 y, float max_value) {
  constexpr int S = 23 - M;
  const __m256i ui = _mm256_castps_si256(y);
  const __m256i u = _mm256_and_si256(ui, _mm256_set1_epi32(0x7fffffff));
  const __m256 a = _mm256_castsi256_ps(u);
  const __m256 sat = _mm256_cmp_ps(a, _mm256_set1_ps(max_value), _CMP_NLT_UQ);
  const __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32((128 - B) << 23), u);
  const __m256i c_sub = _mm256_cvtps_epi32(_mm256_mul_ps(a, _mm256_set1_ps(static_cast<float>(1 << (B - 1 + M)))));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, S), _mm256_set1_epi32(1));
  const __m256i biased = _mm256_add_epi32(
      _mm256_add_epi32(
          u, _mm256_set1_epi32(static_cast<int>((static_cast<uint32_t>(B - 127) << 23) + ((1u << (S - 1)) - 1u)))),
      odd);
  const __m256i c_norm = _mm256_min_epu32(_mm256_srli_epi32(biased, S), _mm256_set1_epi32(static_cast<int>(MAXC)));
  __m256i c = _mm256_blendv_epi8(c_norm, c_sub, sub);
  c = _mm256_blendv_epi8(c, _mm256_set1_epi32(static_cast<int>(MAXC)), _mm256_castps_si256(sat));
  return _mm256_or_si256(
      c, _mm256_srli_epi32(_mm256_and_si256(ui, _mm256_set1_epi32(static_cast<int>(0x80000000u))), 31 - SIGN));
}

// f32_to_e4m3_bits: the minifloat code of e4m3 (bias 7, max 448), and NaN → 0x7f (no sign).
LQ_AVX2_AI __m256i e4m3_codes_avx2(__m256 y) {
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(y), _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(minifloat_codes_avx2<3, 7, 0x7eu, 7>(y, q::kE4M3Max), _mm256_set1_epi32(0x7f), nan);
}

// codes[i] = e4m3(x[i] · k) (mul) or e4m3(x[i] / k), i < n: the 8-bit e4m3 kinds' encode_block_bytes
// (scaled_element's one IEEE multiply or division, then f32_to_e4m3_bits), the same bytes.
// (a lambda would not inherit the target attribute: helpers are always_inline functions)
template <bool Mul>
LQ_AVX2_AI __m256i e4m3_scaled_avx2(const float* x, __m256 vk) {
  const __m256 v = _mm256_loadu_ps(x);
  return e4m3_codes_avx2(Mul ? _mm256_mul_ps(v, vk) : _mm256_div_ps(v, vk));
}

template <bool Mul>
LQ_AVX2_AI void encode_e4m3_avx2_t(const float* x, int64_t n, float k, uint8_t* codes) {
  const __m256 vk = _mm256_set1_ps(k);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i b = _mm256_packus_epi16(
        _mm256_packus_epi32(e4m3_scaled_avx2<Mul>(x + i, vk), e4m3_scaled_avx2<Mul>(x + i + 8, vk)),
        _mm256_packus_epi32(e4m3_scaled_avx2<Mul>(x + i + 16, vk), e4m3_scaled_avx2<Mul>(x + i + 24, vk)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), _mm256_permutevar8x32_epi32(b, order));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256i c = e4m3_scaled_avx2<Mul>(x + i, vk);
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm_packus_epi16(w, w));
  }
  for (; i < n; ++i) codes[i] = q::f32_to_e4m3_bits(Mul ? q::mul_rn(x[i], k) : q::div_rn(x[i], k));
}

}  // namespace

__attribute__((LQ_AVX2_TARGET, noinline)) void encode_e4m3_avx2(const float* x, int64_t n, bool mul, float k,
                                                                uint8_t* codes) {
  if (mul)
    encode_e4m3_avx2_t<true>(x, n, k, codes);
  else
    encode_e4m3_avx2_t<false>(x, n, k, codes);
}

// out[i] = e4m3_bits_to_f32(codes[i]) · s, i < n (dequantize_elements of the 8-bit e4m3 kinds): the 256 exact
// values from a table (e4m3_bits_to_f32 of every byte), gathered eight at a time, one IEEE multiply.
__attribute__((LQ_AVX2_TARGET, noinline)) void decode_e4m3_avx2(const uint8_t* codes, int64_t n, float s, float* out) {
  static const std::array<float, 256> lut = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = q::e4m3_bits_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_i32gather_ps(lut.data(), idx, 4), vs));
  }
  for (; i < n; ++i) out[i] = q::mul_rn(lut[codes[i]], s);
}

namespace {

// ---- the fp4 e2m1 block elements in AVX2 (MXFP4, NVFP4, FlashMLA's fp4 tiles) ------------------------
// f32_to_e2m1_bits: the minifloat code of e2m1 (bias 1, max 6; NaN → 7 with its sign, as the scalar code).
LQ_AVX2_AI __m256i e2m1_codes_avx2(__m256 y) { return minifloat_codes_avx2<1, 1, 0x7u, 3>(y, q::kE2M1Max); }

// Code bytes [0, n/2) of a non-ggml 4-bit block: byte k = code(x[2k]) | code(x[2k+1]) << 4, code = e2m1 of
// x · k (mul) or x / k, eight elements (four bytes) at a time; the bytes past the last whole eight by
// encode_block_bytes itself. The nibble pairs: c | (c >> 28 in 64-bit lanes) puts the odd element's code
// above the even one's in each pair's low dword; a dword permutation and two packs narrow them to bytes.
template <bool Mul>
LQ_AVX2_AI void encode_e2m1_avx2_t(const q::BlockDesc& f, const q::BlockParams& p, const float* x, int n, float k,
                                   uint8_t* codes) {
  const __m256 vk = _mm256_set1_ps(k);
  const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256i c = e2m1_codes_avx2(Mul ? _mm256_mul_ps(v, vk) : _mm256_div_ps(v, vk));
    const __m256i pairs = _mm256_permutevar8x32_epi32(_mm256_or_si256(c, _mm256_srli_epi64(c, 28)), even);
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(pairs), _mm256_castsi256_si128(pairs));
    const int b = _mm_cvtsi128_si32(_mm_packus_epi16(w, w));
    std::memcpy(codes + i / 2, &b, 4);
  }
  if (i < n) q::encode_block_bytes(f, p, x, n, i / 2, q::block_code_bytes(n, 4), codes + i / 2);
}

}  // namespace

__attribute__((LQ_AVX2_TARGET, noinline)) void encode_e2m1_avx2(const q::BlockDesc& f, const q::BlockParams& p,
                                                                const float* x, int n, uint8_t* codes) {
  if (f.kind == q::BlockKind::NvFp4 && p.zero) {  // an all-zero NVFP4 tensor: every code is 0 (scaled_element)
    std::memset(codes, 0, static_cast<size_t>(q::block_code_bytes(n, 4)));
    return;
  }
  // scaled_element: MXFP4 v · inv (scales_by_inverse), NVFP4 v · s, Fp4Tile v / s
  if (f.kind == q::BlockKind::NvFp4)
    encode_e2m1_avx2_t<true>(f, p, x, n, p.s, codes);
  else if (q::scales_by_inverse(f.kind))
    encode_e2m1_avx2_t<true>(f, p, x, n, p.inv, codes);
  else
    encode_e2m1_avx2_t<false>(f, p, x, n, p.s, codes);
}

// out[i] = e2m1_bits_to_f32(code i) · s, i < n (n even; dequantize_elements of the non-ggml 4-bit kinds): the
// two nibbles of each byte interleaved into eight int32 lanes, the magnitude from an eight-entry table
// (vpermps), the sign bit xor'ed in (e2m1_bits_to_f32's −mag, −0 included), one IEEE multiply.
__attribute__((LQ_AVX2_TARGET, noinline)) void decode_e2m1_avx2(const uint8_t* codes, int n, float s, float* out) {
  alignas(32) float mag[8];
  for (int c = 0; c < 8; ++c) mag[c] = q::e2m1_bits_to_f32(static_cast<uint8_t>(c));
  const __m256 lut = _mm256_load_ps(mag), vs = _mm256_set1_ps(s);
  const __m128i lo4 = _mm_set1_epi8(0x0f);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    int b;
    std::memcpy(&b, codes + i / 2, 4);
    const __m128i bytes = _mm_cvtsi32_si128(b);
    const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(bytes, lo4), _mm_and_si128(_mm_srli_epi16(bytes, 4), lo4));
    const __m256i idx = _mm256_cvtepu8_epi32(nib);
    const __m256 m = _mm256_permutevar8x32_ps(lut, idx);  // uses idx & 7
    const __m256 sgn = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(idx, _mm256_set1_epi32(8)), 28));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_xor_ps(m, sgn), vs));
  }
  for (; i < n; ++i) {
    const uint8_t c = static_cast<uint8_t>((codes[i >> 1] >> ((i & 1) * 4)) & 0x0fu);
    out[i] = q::mul_rn(q::e2m1_bits_to_f32(c), s);
  }
}

namespace {

// ---- the ggml kinds in AVX2 (q8_0, q4_0, q4_1; blocks of 32, ggml-quants.c's reference rounding) ---------
// Eight int32 codes of encode_element: q8_0 round_half_away(v · id) clamped to ±127 (truncate |y|, add 1
// where |y| − trunc ≥ 0.5, the sign back: the scalar steps, each exact); q4_0 (int)(v · id + 8.5) and q4_1
// (int)((v − min) · id + 0.5), C's truncation (vcvttps2dq), clamped to [0, 15].
template <q::BlockKind K>
LQ_AVX2_AI __m256i ggml_codes_avx2(const float* x, __m256 id, __m256 mn) {
  const __m256 v = _mm256_loadu_ps(x);
  if constexpr (K == q::BlockKind::Q8_0) {
    const __m256 y = _mm256_mul_ps(v, id);
    const __m256 sign = _mm256_and_ps(y, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u))));
    const __m256 a = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u))), y);
    const __m256 t = _mm256_cvtepi32_ps(_mm256_cvttps_epi32(a));
    const __m256 up =
        _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5f), _CMP_GE_OQ), _mm256_set1_ps(1.0f));
    __m256 r = _mm256_or_ps(_mm256_add_ps(t, up), sign);
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvttps_epi32(r);
  } else {
    const __m256 y = K == q::BlockKind::Q4_0
                         ? _mm256_add_ps(_mm256_mul_ps(v, id), _mm256_set1_ps(8.5f))
                         : _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v, mn), id), _mm256_set1_ps(0.5f));
    const __m256i c = _mm256_cvttps_epi32(y);
    return _mm256_min_epi32(_mm256_max_epi32(c, _mm256_setzero_si256()), _mm256_set1_epi32(15));
  }
}

// eight int32 → eight int16 (signed saturation; the codes fit)
LQ_AVX2_AI __m128i narrow16_avx2(__m256i a) {
  return _mm_packs_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
}

// The code bytes of one whole ggml block of 32 (encode_block_bytes's layout: q8_0 one signed byte per element;
// q4_0 / q4_1 byte j = code(x[j]) | code(x[j + 16]) << 4).
template <q::BlockKind K>
LQ_AVX2_AI void encode_ggml32_avx2_t(const q::BlockParams& p, const float* x, uint8_t* codes) {
  const __m256 id = _mm256_set1_ps(p.s), mn = _mm256_set1_ps(p.mn);
  const __m256i c0 = ggml_codes_avx2<K>(x, id, mn), c1 = ggml_codes_avx2<K>(x + 8, id, mn),
                c2 = ggml_codes_avx2<K>(x + 16, id, mn), c3 = ggml_codes_avx2<K>(x + 24, id, mn);
  if constexpr (K == q::BlockKind::Q8_0) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), _mm_packs_epi16(narrow16_avx2(c0), narrow16_avx2(c1)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 16), _mm_packs_epi16(narrow16_avx2(c2), narrow16_avx2(c3)));
  } else {
    const __m256i b0 = _mm256_or_si256(c0, _mm256_slli_epi32(c2, 4)),
                  b1 = _mm256_or_si256(c1, _mm256_slli_epi32(c3, 4));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), _mm_packus_epi16(narrow16_avx2(b0), narrow16_avx2(b1)));
  }
}

}  // namespace

// encode_block_bytes of a ggml block: whole blocks of 32 in vectors, anything else by the scalar code.
__attribute__((LQ_AVX2_TARGET, noinline)) void encode_ggml_avx2(const q::BlockDesc& f, const q::BlockParams& p,
                                                                const float* x, int n, uint8_t* codes) {
  if (n != 32) {
    q::encode_block_bytes(f, p, x, n, 0, q::block_code_bytes(n, f.code_bits), codes);
    return;
  }
  switch (f.kind) {
    case q::BlockKind::Q8_0:
      return encode_ggml32_avx2_t<q::BlockKind::Q8_0>(p, x, codes);
    case q::BlockKind::Q4_0:
      return encode_ggml32_avx2_t<q::BlockKind::Q4_0>(p, x, codes);
    default:
      return encode_ggml32_avx2_t<q::BlockKind::Q4_1>(p, x, codes);
  }
}

bool ggml_elements(const q::BlockDesc& f) {
  return f.kind == q::BlockKind::Q8_0 || f.kind == q::BlockKind::Q4_0 || f.kind == q::BlockKind::Q4_1;
}

// The non-ggml 4-bit kinds (e2m1 elements): MXFP4, NVFP4, FlashMLA's fp4 tiles.
bool e2m1_elements(const q::BlockDesc& f) {
  return f.code_bits == 4 &&
         (f.kind == q::BlockKind::MxFp4 || f.kind == q::BlockKind::NvFp4 || f.kind == q::BlockKind::Fp4Tile);
}

// max over i < n of the bits of |x[i]| (sign cleared), as uint32: for finite x it is max|x| (non-negative
// floats order as their bits; −0 is +0), which max_num's fold gives in any order; a value ≥ 0x7f800000 means
// a NaN/Inf is present. One pass for the block path's NaN/Inf check and its per-tensor amax.
__attribute__((LQ_AVX2_TARGET, noinline)) uint32_t abs_bits_max_avx2(const float* x, int64_t n) {
  const __m256i m = _mm256_set1_epi32(0x7fffffff);
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_max_epu32(a0, _mm256_and_si256(m, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))));
    a1 = _mm256_max_epu32(a1, _mm256_and_si256(m, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8))));
    a2 = _mm256_max_epu32(a2, _mm256_and_si256(m, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 16))));
    a3 = _mm256_max_epu32(a3, _mm256_and_si256(m, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 24))));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_max_epu32(_mm256_max_epu32(a0, a1), _mm256_max_epu32(a2, a3)));
  uint32_t r = 0;
  for (const uint32_t v : lanes) r = std::max(r, v);
  for (; i < n; ++i) r = std::max(r, q::f32_bits(x[i]) & 0x7fffffffu);
  return r;
}

// The 8-bit e4m3 block kinds (FlashMLA pow2 and vLLM fp32 tiles, per-tensor fp8, MXFP8): the ones the AVX2
// element kernels above cover.
bool e4m3_elements(const q::BlockDesc& f) {
  return f.code_bits == 8 && (f.kind == q::BlockKind::Fp8Pow2 || f.kind == q::BlockKind::Fp8Fp32 ||
                              f.kind == q::BlockKind::Fp8Tensor || f.kind == q::BlockKind::MxFp8);
}

}  // namespace latentq::cpu
#endif
