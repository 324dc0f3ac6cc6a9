// quant/src/cpu/int_avx2.cpp — CpuKernel::Avx2 for the integer formats: the fused kernels (int_fused.h)
// compiled with __attribute__((target("avx2,f16c"))), the AVX2 / F16C pieces their body calls (encode,
// per-token statistics, fp16 scales), and the AVX2 dequantize. x86-64 with GCC or Clang only.
#include <algorithm>
#include <cstring>
#include <vector>

#include "int_fused.h"

#if LQ_X86_KERNELS
namespace latentq::cpu {
namespace {

// The AVX2 encoders (int_quantize_body<true>). GCC vectorizes enc_uniform / enc_columns only with
// -fno-trapping-math (the library's flag; without it enc_columns' asymmetric loop stays scalar:
// vsubss / vcvttss2si / a byte store per element) and then narrows float → byte through several packs;
// written with intrinsics, eight elements per step, int4-asym-channel-g32 and -token-g32 quantize_into
// took 10–20% less CPU time in paired runs on the loaded machine. The same math as qmath.h's
// encode_sym / encode_asym:
//   v = x / scale (sym) or (x − offset) / scale (asym): vsubps, vdivps (IEEE, rounded once each);
//   max_num(lo, v) = (v > lo) ? v : lo = vmaxps(v, lo) (a NaN v gives lo, as max_num);
//   min_num(c, hi) = (hi < c) ? hi : c = vminps(hi, c);
//   rne_small of the clamped v (|v| ≤ 255): vcvtps2dq, which rounds to nearest even in MXCSR's default
//   mode, as rne_small's vaddps / vsubps of 1.5·2^23 do (both follow MXCSR's rounding mode);
//   scale > 0 ? q : 0 by a vcmpps mask (per-column scales) or, for one scale, one test before the loop;
//   sym adds 2^(b−1). Codes are stored as bytes u[i] for pack_row.
template <bool Sym, bool Cols>
LQ_AVX2_AI __m256i enc8_avx2(const float* __restrict x, const float* __restrict s, const float* __restrict o, int64_t i,
                             __m256 vs0, __m256 vo0, __m256 lo, __m256 hi, __m256i bias) {
  const __m256 sc = Cols ? _mm256_loadu_ps(s + i) : vs0;
  __m256 v = _mm256_loadu_ps(x + i);
  if constexpr (!Sym) v = _mm256_sub_ps(v, Cols ? _mm256_loadu_ps(o + i) : vo0);
  v = _mm256_div_ps(v, sc);
  v = _mm256_min_ps(hi, _mm256_max_ps(v, lo));
  __m256i c = _mm256_cvtps_epi32(v);  // rne_small's integer (see above)
  if constexpr (Cols) c = _mm256_and_si256(c, _mm256_castps_si256(_mm256_cmp_ps(sc, _mm256_setzero_ps(), _CMP_GT_OQ)));
  return Sym ? _mm256_add_epi32(c, bias) : c;
}

template <bool Sym, bool Cols>
LQ_AVX2_AI void enc_avx2(const float* __restrict x, int64_t n, const float* __restrict s, const float* __restrict o,
                         float s0, float o0, int bits, uint8_t* __restrict u) {
  const float qmax = static_cast<float>(Sym ? q::sym_qmax(bits) : q::asym_qmax(bits));
  const __m256i bias = _mm256_set1_epi32(Sym ? (1 << (bits - 1)) : 0);
  if (!Cols && !(s0 > 0.0f)) {  // scale 0: every code is q = 0 (encode_sym / encode_asym)
    std::memset(u, Sym ? 1 << (bits - 1) : 0, static_cast<size_t>(n));
    return;
  }
  const __m256 lo = _mm256_set1_ps(Sym ? -qmax : 0.0f), hi = _mm256_set1_ps(qmax), vs0 = _mm256_set1_ps(s0),
               vo0 = _mm256_set1_ps(o0);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {  // 32 codes narrowed to bytes by two packs and one dword permutation
    const __m256i c0 = enc8_avx2<Sym, Cols>(x, s, o, i, vs0, vo0, lo, hi, bias),
                  c1 = enc8_avx2<Sym, Cols>(x, s, o, i + 8, vs0, vo0, lo, hi, bias),
                  c2 = enc8_avx2<Sym, Cols>(x, s, o, i + 16, vs0, vo0, lo, hi, bias),
                  c3 = enc8_avx2<Sym, Cols>(x, s, o, i + 24, vs0, vo0, lo, hi, bias);
    const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + i), _mm256_permutevar8x32_epi32(b, order));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256i c = enc8_avx2<Sym, Cols>(x, s, o, i, vs0, vo0, lo, hi, bias);
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(u + i), _mm_packus_epi16(w, w));
  }
  for (; i < n; ++i) {
    const float si = Cols ? s[i] : s0;
    u[i] = static_cast<uint8_t>(Sym ? q::encode_sym(x[i], si, bits) : q::encode_asym(x[i], si, Cols ? o[i] : o0, bits));
  }
}

}  // namespace

// Out-of-line AVX2 entry points (a target("avx2") function is not inlined into the target-less template
// body; one call per row, the per-token groups of a row in one call).
__attribute__((LQ_AVX2_TARGET, noinline)) void enc_row_avx2(const float* x, int64_t n, const float* s, const float* o,
                                                            float s0, float o0, bool sym, bool cols, int bits,
                                                            uint8_t* u) {
  if (sym)
    cols ? enc_avx2<true, true>(x, n, s, o, s0, o0, bits, u) : enc_avx2<true, false>(x, n, s, o, s0, o0, bits, u);
  else
    cols ? enc_avx2<false, true>(x, n, s, o, s0, o0, bits, u) : enc_avx2<false, false>(x, n, s, o, s0, o0, bits, u);
}
// Row x[D] in nt groups of g columns (the last one up to D), group j with (sc[j], of[j]).
__attribute__((LQ_AVX2_TARGET, noinline)) void enc_groups_avx2(const float* x, int64_t D, int64_t nt, int64_t g,
                                                               const float* sc, const float* of, bool sym, int bits,
                                                               uint8_t* u) {
  for (int64_t j = 0; j < nt; ++j) {
    const int64_t d0 = j * g, n = std::min(D, d0 + g) - d0;
    if (sym)
      enc_avx2<true, false>(x + d0, n, nullptr, nullptr, sc[j], of[j], bits, u + d0);
    else
      enc_avx2<false, false>(x + d0, n, nullptr, nullptr, sc[j], of[j], bits, u + d0);
  }
}

// fp16 storage in the Avx2 kernel. vcvtps2ph with round to nearest even (imm 0) gives q::f32_to_f16_bits's
// bits for every float that is not NaN: ties to even, overflow to ±inf from 65520 on, fp16 subnormals
// rounded once (float32 subnormal inputs are read as they are: MXCSR's default, DAZ off). vcvtph2ps is
// exact, as f16_bits_to_f32. The two differ on NaN only (the hardware keeps the payload, f32_to_f16_bits
// stores 0x7e00), and put_groups converts no NaN: its scales and offsets come from finite minima and
// maxima (a difference may overflow to inf, never NaN).
// f16_round_store_avx2: dst[2n bytes] = fp16 bits of v[0, n) (little-endian), v[i] = the stored value.
__attribute__((LQ_AVX2_TARGET, noinline)) void f16_round_store_avx2(float* v, int64_t n, uint8_t* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
    _mm256_storeu_ps(v + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) {
    const uint16_t h = q::f32_to_f16_bits(v[i]);
    std::memcpy(dst + 2 * i, &h, 2);
    v[i] = q::f16_bits_to_f32(h);
  }
}

namespace {

// dst[0, n) = the fp16 values stored at src[2n bytes] (little-endian), as f16_bits_to_f32 gives them; an
// fp16 signaling NaN (not written by quantize(); possible in a tensor read from elsewhere) comes back
// quieted, and the decode's multiply quiets it in the reference too, so the decoded floats are the same.
__attribute__((LQ_AVX2_TARGET, noinline)) void f16_load_avx2(const uint8_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = q::f16_bits_to_f32(h);
  }
}

LQ_AVX2_AI float hmin8(__m256 a) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_min_ss(m, _mm_movehdup_ps(m)));
}
LQ_AVX2_AI float hmax8(__m256 a) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

template <bool Min>
LQ_AVX2_AI __m256 minmax8_avx2(__m256 p, __m256 q) {
  return Min ? _mm256_min_ps(p, q) : _mm256_max_ps(p, q);
}
// r[k] = the min (Min) or max of the eight lanes of v[k], k = 0..7
template <bool Min>
LQ_AVX2_AI __m256 fold8_avx2(const __m256* v) {
  __m256 t[4];
  for (int k = 0; k < 4; ++k)
    t[k] = minmax8_avx2<Min>(_mm256_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm256_unpackhi_ps(v[2 * k], v[2 * k + 1]));
  const __m256 u0 = minmax8_avx2<Min>(_mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                      _mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 u1 = minmax8_avx2<Min>(_mm256_shuffle_ps(t[2], t[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                      _mm256_shuffle_ps(t[2], t[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return minmax8_avx2<Min>(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Lane-wise min a and max b of xs[0, n), n >= 8, in 8-lane vectors, the last one overlapping the one before
// when n is not a multiple of 8 (min and max are idempotent); e takes the largest exponent field seen.
LQ_AVX2_AI void lanes_minmax_avx2(const float* xs, int64_t n, __m256& a, __m256& b, __m256i& e) {
  const __m256i expo = _mm256_set1_epi32(0x7f800000);
  a = b = _mm256_loadu_ps(xs);
  e = _mm256_max_epu32(e, _mm256_and_si256(_mm256_castps_si256(a), expo));
  for (int64_t i = 8; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(xs + std::min(i, n - 8));
    a = _mm256_min_ps(a, v);
    b = _mm256_max_ps(b, v);
    e = _mm256_max_epu32(e, _mm256_and_si256(_mm256_castps_si256(v), expo));
  }
}

}  // namespace

// The per-token group statistics of one row x[D] in nt groups of g columns (the last one up to D):
// mn[j], mx[j] as minmax_span gives them, and 1 if any element is NaN/Inf (the values are then not used).
// A group of at least 8 elements is read by lanes_minmax_avx2: over finite floats any fold order gives
// the reference's value, and a zero extremum then takes the sign of the group's first zero (first_zero, as
// in minmax_span). NaN/Inf: the largest exponent field seen (vpmaxud) is all ones. A row's full groups of
// g = 8·k columns go eight at a time: their lane-wise vectors are folded across lanes together, by unpacks,
// shuffles and one 128-bit permutation (a transpose, fold8_avx2), into one vector of the eight groups'
// minima (maxima), and one compare with zero finds the groups whose extremum needs first_zero; the others
// are folded one by one (vminps / vmaxps trees, hmin8 / hmax8).
__attribute__((LQ_AVX2_TARGET, noinline)) uint32_t group_minmax_avx2(const float* x, int64_t D, int64_t nt, int64_t g,
                                                                     float* mn, float* mx) {
  const __m256i expo = _mm256_set1_epi32(0x7f800000);
  __m256i e = _mm256_setzero_si256();
  uint32_t bad = 0;
  int64_t j = 0;
  if (g % 8 == 0)
    for (; j + 8 <= nt && (j + 8) * g <= D; j += 8) {
      __m256 a[8], b[8];
      for (int k = 0; k < 8; ++k) lanes_minmax_avx2(x + (j + k) * g, g, a[k], b[k], e);
      const __m256 lo = fold8_avx2<true>(a), hi = fold8_avx2<false>(b);
      _mm256_storeu_ps(mn + j, lo);
      _mm256_storeu_ps(mx + j, hi);
      const __m256 z = _mm256_setzero_ps();
      if (_mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(lo, z, _CMP_EQ_OQ), _mm256_cmp_ps(hi, z, _CMP_EQ_OQ))))
        for (int64_t k = j; k < j + 8; ++k) {
          if (mn[k] == 0.0f) mn[k] = first_zero(x + k * g, g);
          if (mx[k] == 0.0f) mx[k] = first_zero(x + k * g, g);
        }
    }
  for (; j < nt; ++j) {
    const int64_t d0 = j * g, n = std::min(D, d0 + g) - d0;
    const float* xs = x + d0;
    if (n < 8) {
      bad |= minmax_span(xs, n, mn[j], mx[j]);
      continue;
    }
    __m256 a, b;
    lanes_minmax_avx2(xs, n, a, b, e);
    float lo = hmin8(a), hi = hmax8(b);
    if (lo == 0.0f) lo = first_zero(xs, n);
    if (hi == 0.0f) hi = first_zero(xs, n);
    mn[j] = lo;
    mx[j] = hi;
  }
  return bad | (_mm256_movemask_epi8(_mm256_cmpeq_epi32(e, expo)) != 0 ? 1u : 0u);
}

// ---- the fused body in AVX2 (int_fused.h) ----------------------------------------------------------
__attribute__((LQ_AVX2_TARGET)) uint32_t int_quantize_avx2(const IntJob& job) { return int_quantize_body<true>(job); }
__attribute__((LQ_AVX2_TARGET)) uint32_t minmax_span_avx2(const float* x, int64_t n, float& mn, float& mx) {
  return minmax_span(x, n, mn, mx);
}

// ---- the AVX2 dequantize (CpuKernel::Avx2) ---------------------------------------------------------
// Codes go straight from the packed row to eight int32 lanes (INT8: vpmovzxbd; INT4/INT2: the row's 32
// or 16 bits at code i broadcast and shifted per lane by vpsrlvd), then qmath.h's decode in vector
// form: decode_sym = mul_rn(scale, float(u − 2^(b−1))), decode_asym = add_rn(offset, mul_rn(scale,
// float(u))): vcvtdq2ps is exact for these integers, vmulps / vaddps round once each (no FMA: the
// target is "avx2" without "fma", and -ffp-contract=off), so every float is the reference's.

namespace {

// 64 bits of a packed row of nb bytes from byte k, little-endian; bytes past the row read as 0.
LQ_AI uint64_t load_le64(const uint8_t* row, int64_t k, int64_t nb) {
  uint64_t w = 0;
  if (k + 8 <= nb)
    std::memcpy(&w, row + k, 8);
  else
    for (int64_t j = 0; k + j < nb; ++j) w |= static_cast<uint64_t>(row[k + j]) << (8 * j);
  return w;
}

// Code i of a packed row (qmath.h order: code i at bits [i·bits, (i+1)·bits) of the row, little-endian).
LQ_AI uint32_t code_at(const uint8_t* row, int64_t i, int bits) {
  const int64_t b = i * bits;
  return (static_cast<uint32_t>(row[b >> 3]) >> (b & 7)) & ((1u << bits) - 1u);
}

// Codes i .. i+7 of a packed row of nb bytes as int32 lanes.
template <int Bits>
LQ_AVX2_AI __m256i codes8(const uint8_t* row, int64_t i, int64_t nb) {
  if constexpr (Bits == 8) {
    return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(load_le64(row, i, nb))));
  } else {
    const int64_t b = i * Bits;
    const uint32_t w = static_cast<uint32_t>(load_le64(row, b >> 3, nb) >> (b & 7));
    const __m256i sh =
        Bits == 4 ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28) : _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), sh),
                            _mm256_set1_epi32((1 << Bits) - 1));
  }
}

// Decode one packed row [D] into o[D]: per-column scale/offset sc[D], of[D] (Cols) or one (s0, o0) for the
// row. NT: non-temporal stores, the first elements scalar up to o's first 32-byte boundary (o 4-aligned).
template <int Bits, bool Sym, bool Cols, bool NT>
LQ_AVX2_AI void dec_row_avx2(const uint8_t* __restrict row, int64_t D, int64_t nb, const float* __restrict sc,
                             const float* __restrict of, float s0, float o0, float* __restrict o) {
  auto one = [&](int64_t j) {
    const uint32_t u = code_at(row, j, Bits);
    const float s = Cols ? sc[j] : s0;
    o[j] = Sym ? q::decode_sym(u, s, Bits) : q::decode_asym(u, s, Cols ? of[j] : o0);
  };
  int64_t i = 0;
  if constexpr (NT) {
    const int64_t peel = static_cast<int64_t>((32 - (reinterpret_cast<uintptr_t>(o) & 31)) & 31) / 4;
    for (; i < std::min(D, peel); ++i) one(i);
  }
  const __m256 vs = _mm256_set1_ps(s0), vo = _mm256_set1_ps(o0);
  const __m256i bias = _mm256_set1_epi32(1 << (Bits - 1));
  for (; i + 8 <= D; i += 8) {
    const __m256i c = codes8<Bits>(row, i, nb);
    const __m256 s = Cols ? _mm256_loadu_ps(sc + i) : vs;
    __m256 r;
    if constexpr (Sym)
      r = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_sub_epi32(c, bias)));
    else
      r = _mm256_add_ps(Cols ? _mm256_loadu_ps(of + i) : vo, _mm256_mul_ps(s, _mm256_cvtepi32_ps(c)));
    if constexpr (NT)
      _mm256_stream_ps(o + i, r);
    else
      _mm256_storeu_ps(o + i, r);
  }
  for (; i < D; ++i) one(i);
}

// Decode codes [i0, i1) of a packed row with one (s, o) into o[i0, i1) (normal stores).
template <int Bits, bool Sym>
LQ_AVX2_AI void dec_span_avx2(const uint8_t* __restrict row, int64_t i0, int64_t i1, int64_t nb, float s, float off,
                              float* __restrict o) {
  const __m256 vs = _mm256_set1_ps(s), vo = _mm256_set1_ps(off);
  const __m256i bias = _mm256_set1_epi32(1 << (Bits - 1));
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) {
    const __m256i c = codes8<Bits>(row, i, nb);
    if constexpr (Sym)
      _mm256_storeu_ps(o + i, _mm256_mul_ps(vs, _mm256_cvtepi32_ps(_mm256_sub_epi32(c, bias))));
    else
      _mm256_storeu_ps(o + i, _mm256_add_ps(vo, _mm256_mul_ps(vs, _mm256_cvtepi32_ps(c))));
  }
  for (; i < i1; ++i) {
    const uint32_t u = code_at(row, i, Bits);
    o[i] = Sym ? q::decode_sym(u, s, Bits) : q::decode_asym(u, s, off);
  }
}

// dst[0, n) = src[0, n) with non-temporal stores from dst's first 32-byte boundary (dst 4-aligned).
LQ_AVX2_AI void copy_stream_f32(float* __restrict dst, const float* __restrict src, int64_t n) {
  int64_t i = std::min<int64_t>(n, static_cast<int64_t>((32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31) / 4);
  std::memcpy(dst, src, static_cast<size_t>(4 * i));
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
  std::memcpy(dst + i, src + i, static_cast<size_t>(4 * (n - i)));
}

template <int Bits, bool Sym, bool NT>
__attribute__((LQ_AVX2_TARGET)) void int_dequantize_avx2_t(const DecJob& job) {
  const QuantizedTensor& qt = *job.qt;
  // dst[0, n) = stored scales or offsets [i0, i0 + n) of src as floats (scale_at's values)
  auto load_params = [&qt](const std::vector<uint8_t>& src, int64_t i0, int64_t n, float* dst) {
    switch (qt.spec.scale_dtype) {
      case ScaleDtype::F32:
        return (void)std::memcpy(dst, src.data() + 4 * i0, static_cast<size_t>(4 * n));
      case ScaleDtype::F16:
        return f16_load_avx2(src.data() + 2 * i0, n, dst);
      default:
        for (int64_t i = 0; i < n; ++i) dst[i] = get_scale(src, i0 + i, qt.spec.scale_dtype);
    }
  };
  const int64_t D = qt.cols, rb = qt.row_bytes();
  const uint8_t* codes = qt.codes.data();
  switch (qt.spec.granularity) {
    case Granularity::Tensor: {
      const float s = qt.scale_at(0), o = Sym ? 0.0f : qt.offset_at(0);
      for (int64_t t = job.begin; t < job.end; ++t)
        dec_row_avx2<Bits, Sym, false, NT>(codes + t * rb, D, rb, nullptr, nullptr, s, o, job.out + t * D);
      break;
    }
    case Granularity::Channel: {  // the group's scale/offset vectors (D floats each) stay in L1 over its rows
      std::vector<float> sc(static_cast<size_t>(D)), of(static_cast<size_t>(D), 0.0f);
      for (int64_t g = job.begin; g < job.end; ++g) {
        load_params(qt.scales, g * D, D, sc.data());
        if (!Sym) load_params(qt.offsets, g * D, D, of.data());
        for (int64_t t = qt.group_bounds[static_cast<size_t>(g)]; t < qt.group_bounds[static_cast<size_t>(g) + 1]; ++t)
          dec_row_avx2<Bits, Sym, true, NT>(codes + t * rb, D, rb, sc.data(), of.data(), 0.0f, 0.0f, job.out + t * D);
      }
      break;
    }
    case Granularity::Token: {
      const int64_t nt = qt.scales_per_row(), g = qt.row_group();
      if (nt == 1) {
        for (int64_t t = job.begin; t < job.end; ++t)
          dec_row_avx2<Bits, Sym, false, NT>(codes + t * rb, D, rb, nullptr, nullptr, qt.scale_at(t),
                                             Sym ? 0.0f : qt.offset_at(t), job.out + t * D);
        break;
      }
      // groups within the row: each group's span decoded with its (scale, offset); streamed output goes
      // through a row buffer in L1 (the groups do not start on the output's 32-byte boundaries)
      // (the row's nt scales and offsets are converted in one loop first, not one scale_at() per group)
      std::vector<float> buf(static_cast<size_t>(NT ? D : 0)), rs(static_cast<size_t>(nt)),
          ro(static_cast<size_t>(nt), 0.0f);
      for (int64_t t = job.begin; t < job.end; ++t) {
        float* o = NT ? buf.data() : job.out + t * D;
        load_params(qt.scales, t * nt, nt, rs.data());
        if (!Sym) load_params(qt.offsets, t * nt, nt, ro.data());
        for (int64_t j = 0; j < nt; ++j) {
          const int64_t d0 = j * g, d1 = std::min(D, d0 + g);
          dec_span_avx2<Bits, Sym>(codes + t * rb, d0, d1, rb, rs[static_cast<size_t>(j)], ro[static_cast<size_t>(j)],
                                   o);
        }
        if constexpr (NT) copy_stream_f32(job.out + t * D, buf.data(), D);
      }
      break;
    }
  }
  if constexpr (NT) _mm_sfence();  // the streamed lines are visible before the caller (or a joining thread) reads
}

template <int Bits, bool Sym>
__attribute__((LQ_AVX2_TARGET)) void int_dequantize_avx2_nt(const DecJob& job, bool nt) {
  if (nt)
    int_dequantize_avx2_t<Bits, Sym, true>(job);
  else
    int_dequantize_avx2_t<Bits, Sym, false>(job);
}

}  // namespace

__attribute__((LQ_AVX2_TARGET)) void int_dequantize_avx2(const DecJob& job) {
  const QuantizedTensor& qt = *job.qt;
  const bool nt = qt.rows * qt.cols * 4 >= stream_min_bytes() && (reinterpret_cast<uintptr_t>(job.out) & 3) == 0;
  const bool sym = qt.spec.scheme == Scheme::Sym;
  switch (qt.spec.bits) {
    case 8:
      return sym ? int_dequantize_avx2_nt<8, true>(job, nt) : int_dequantize_avx2_nt<8, false>(job, nt);
    case 4:
      return sym ? int_dequantize_avx2_nt<4, true>(job, nt) : int_dequantize_avx2_nt<4, false>(job, nt);
    default:
      return sym ? int_dequantize_avx2_nt<2, true>(job, nt) : int_dequantize_avx2_nt<2, false>(job, nt);
  }
}

}  // namespace latentq::cpu
#endif
