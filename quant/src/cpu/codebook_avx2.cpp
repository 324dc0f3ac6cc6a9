// quant/src/cpu/codebook_avx2.cpp — CpuKernel::Avx2's rows of the codebook families: the Lloyd-Max codes
// (lloyd_max.h), TurboQuant's norm, rotation and codes (turboquant.h) and transform coding's uniform codes
// (transform_coding.h), eight elements at a time. Every value is the scalar element math's: a code is the
// count of midpoints m ≤ x (vcmpps GE, the scalar `y >= mid[j]`; TurboQuant's sorted midpoints by a binary search
// of the same compares), packed LSB-first as codebook.h packs it;
// decoded values are table reads; the float operations are the scalar ones lane by lane (IEEE +, −, ×, /,
// sqrt rounded once each, no FMA), in the scalar order: a row's Σx² is one sequential chain per row, so eight
// rows run in the eight lanes (an 8×8 transpose) rather than eight partial sums of one row; tc-lm's codes, whose
// codebook changes with each component's width, also take eight rows in the lanes, so that a component's width,
// scale and offset are one broadcast and its components run grouped by width, each code the count of the
// component's thresholds ≤ x − offset (the least floats d with d / scale ≥ m_j: the scalar code without its
// division, tc_lm_thresholds). The reference
// loops stay the base case (Reference, Baseline); tests/quant/test_fitted.cpp compares the two byte for byte.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "dispatch.h"
#include "latentq/codebook.h"
#include "latentq/transform_coding.h"

#if LQ_HAVE_AVX2_KERNEL

namespace latentq::cpu {
namespace {

// Lane i shifted by i·bits: the bit position of code i within its group of eight (bits ≤ 4: 32 bits hold 8).
LQ_AVX2_AI __m256i code_shifts(int bits) {
  return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bits));
}

// The OR of the eight lanes (disjoint bit fields: the packed word of eight codes).
LQ_AVX2_AI uint32_t or_lanes(__m256i v) {
  __m128i x = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_or_si128(x, _mm_shuffle_epi32(x, 0x4E));
  x = _mm_or_si128(x, _mm_shuffle_epi32(x, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(x));
}

// A prefetch of the line `bytes` past p (a software prefetch ahead of a one-pass read of X: without it the
// encoders waited on each load, lm3-tensor's encode 1.19 ns per element at T = 65,536 against 0.42 in cache).
// The address is formed as an integer: past the end of X it is only a hint, never dereferenced.
LQ_AI void prefetch_ahead(const float* p, uintptr_t bytes) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + bytes), 0, 3);
}
inline constexpr uintptr_t kPrefetchBytes = 4096;

// The count of midpoints ≤ x of element d: mid[j·stride + d], j < nmid (stride 0: one codebook).
LQ_AI uint32_t count_scalar(float x, const float* mid, int64_t stride, int nmid, int64_t d) {
  uint32_t k = 0;
  const float* m = stride != 0 ? mid + d : mid;
  const int64_t step = stride != 0 ? stride : 1;
  for (int j = 0; j < nmid; ++j) k += (x >= m[j * step]) ? 1u : 0u;
  return k;
}

// 8×8 transpose: lane r of out[k] = lane k of in[r].
LQ_AVX2_AI void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

}  // namespace

namespace {

// The rows of codebook_encode_rows_avx2 at BITS bits (constant: the compares unroll, the stores have a fixed size).
template <int BITS>
__attribute__((LQ_AVX2_TARGET)) bool encode_rows(const float* X, int64_t T, int64_t D, const float* mid,
                                                 int64_t mid_stride, uint8_t* codes) {
  constexpr int kMid = (1 << BITS) - 1;
  const int64_t rb = (D * BITS + 7) / 8, full = D / 8;
  const __m256i shifts = code_shifts(BITS), expo = _mm256_set1_epi32(0x7f800000);
  __m256i bad = _mm256_setzero_si256();  // lanes that saw an exponent of all ones (NaN/Inf)
  uint32_t bad_tail = 0;
  __m256 shared[kMid];
  for (int j = 0; j < kMid; ++j) shared[j] = _mm256_set1_ps(mid_stride == 0 ? mid[j] : 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    const float* x = X + t * D;
    uint8_t* out = codes + t * rb;
    for (int64_t g = 0; g < full; ++g) {
      if (g % 2 == 0) prefetch_ahead(x + 8 * g, kPrefetchBytes);
      const __m256 v = _mm256_loadu_ps(x + 8 * g);
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), expo), expo));
      __m256i cnt = _mm256_setzero_si256();
      for (int j = 0; j < kMid; ++j) {
        const __m256 m = mid_stride == 0 ? shared[j] : _mm256_loadu_ps(mid + j * mid_stride + 8 * g);
        cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(_mm256_cmp_ps(v, m, _CMP_GE_OQ)));
      }
      const uint32_t word = or_lanes(_mm256_sllv_epi32(cnt, shifts));
      std::memcpy(out + g * BITS, &word, BITS);
    }
    uint32_t acc = 0;  // the last D mod 8 codes (≤ 28 bits), trailing bits zero
    for (int64_t d = 8 * full; d < D; ++d) {
      acc |= count_scalar(x[d], mid, mid_stride, kMid, d) << ((d - 8 * full) * BITS);
      bad_tail |= !q::is_finite(x[d]);
    }
    std::memcpy(out + full * BITS, &acc, static_cast<size_t>(rb - full * BITS));
  }
  return bad_tail != 0 || !_mm256_testz_si256(bad, bad);
}

// Lane i of c[idx_i] for 2^BITS vectors c (a codebook per lane): a tree of blends on the index bits from bit
// 0 up (vblendvps reads a lane's sign bit: bit k of the index shifted to bit 31). No gather: vgatherdps made
// lm3-channel's decode 3.1 ns per element against 0.42 for the blends (docs/performance.md).
template <int BITS>
LQ_AVX2_AI __m256 select_lanes(const __m256* c, __m256i idx) {
  __m256 v[1 << BITS];
  for (int j = 0; j < (1 << BITS); ++j) v[j] = c[j];
  for (int k = 0, n = 1 << BITS; k < BITS; ++k, n /= 2) {
    const __m256 m = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 31 - k));
    for (int j = 0; j < n / 2; ++j) v[j] = _mm256_blendv_ps(v[2 * j], v[2 * j + 1], m);
  }
  return v[0];
}

template <int BITS>
__attribute__((LQ_AVX2_TARGET)) void decode_rows(const uint8_t* codes, int64_t T, int64_t D, const float* cent,
                                                 bool per_channel, float* out) {
  constexpr int kLevels = 1 << BITS;
  const int64_t rb = (D * BITS + 7) / 8, full = D / 8;
  const __m256i shifts = code_shifts(BITS), mask = _mm256_set1_epi32(kLevels - 1);
  float tab[16] = {};
  if (!per_channel) std::copy(cent, cent + kLevels, tab);
  const __m256 lo = _mm256_loadu_ps(tab), hi = _mm256_loadu_ps(tab + 8);
  const __m256i seven = _mm256_set1_epi32(7);
  for (int64_t t = 0; t < T; ++t) {
    const uint8_t* row = codes + t * rb;
    float* o = out + t * D;
    for (int64_t g = 0; g < full; ++g) {
      uint32_t word = 0;  // a 4-byte load where the row has the bytes (the bits above the group's are masked off)
      if (g * BITS + 4 <= rb)
        std::memcpy(&word, row + g * BITS, 4);
      else
        std::memcpy(&word, row + g * BITS, BITS);
      const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts), mask);
      __m256 v;
      if (!per_channel) {
        v = _mm256_permutevar8x32_ps(lo, idx);
        if constexpr (kLevels > 8)
          v = _mm256_blendv_ps(v, _mm256_permutevar8x32_ps(hi, idx),
                               _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, seven)));
      } else {
        __m256 c[kLevels];
        for (int j = 0; j < kLevels; ++j) c[j] = _mm256_loadu_ps(cent + j * D + 8 * g);
        v = select_lanes<BITS>(c, idx);
      }
      _mm256_storeu_ps(o + 8 * g, v);
    }
    for (int64_t d = 8 * full; d < D; ++d) {
      const uint32_t c = q::lsb_get_code(row, static_cast<int>(d), BITS);
      o[d] = per_channel ? cent[c * D + d] : cent[c];
    }
  }
}

}  // namespace

__attribute__((LQ_AVX2_TARGET)) bool codebook_encode_rows_avx2(const float* X, int64_t T, int64_t D, const float* mid,
                                                               int64_t mid_stride, int bits, uint8_t* codes) {
  switch (bits) {
    case 1:
      return encode_rows<1>(X, T, D, mid, mid_stride, codes);
    case 2:
      return encode_rows<2>(X, T, D, mid, mid_stride, codes);
    case 3:
      return encode_rows<3>(X, T, D, mid, mid_stride, codes);
    default:
      return encode_rows<4>(X, T, D, mid, mid_stride, codes);
  }
}

__attribute__((LQ_AVX2_TARGET)) void codebook_decode_rows_avx2(const uint8_t* codes, int64_t T, int64_t D, int bits,
                                                               const float* cent, bool per_channel, float* out) {
  switch (bits) {
    case 1:
      return decode_rows<1>(codes, T, D, cent, per_channel, out);
    case 2:
      return decode_rows<2>(codes, T, D, cent, per_channel, out);
    case 3:
      return decode_rows<3>(codes, T, D, cent, per_channel, out);
    default:
      return decode_rows<4>(codes, T, D, cent, per_channel, out);
  }
}

__attribute__((LQ_AVX2_TARGET)) void sum_squares_rows8_avx2(const float* X, int64_t D, float* s, const float* next) {
  __m256 acc = _mm256_setzero_ps();
  const int64_t full = D / 8;
  for (int64_t g = 0; g < full; ++g) {
    __m256 r[8];
    if (next != nullptr)
      for (int k = 0; k < 8; ++k) _mm_prefetch(reinterpret_cast<const char*>(next + k * D + 8 * g), _MM_HINT_T0);
    for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(X + k * D + 8 * g);
    transpose8(r);  // r[k]: element 8g + k of the eight rows
    for (int k = 0; k < 8; ++k) acc = _mm256_add_ps(acc, _mm256_mul_ps(r[k], r[k]));
  }
  _mm256_storeu_ps(s, acc);
  for (int k = 0; k < 8; ++k)
    for (int64_t i = 8 * full; i < D; ++i) s[k] = q::add_rn(s[k], q::mul_rn(X[k * D + i], X[k * D + i]));
}

namespace {

// Elements 8g .. 8g + 7 of the eight rows x_k = X + k·D as columns: r[j] lane k = x_k[8g + j]. The halves come in
// by vinsertf128 from memory (rows k and k + 4 in one register), so that the transpose is the 4×4 shuffles of each
// half: 16 shuffles rather than transpose8's 24.
LQ_AVX2_AI void load_columns8(const float* X, int64_t D, int64_t g, __m256 r[8]) {
  for (int k = 0; k < 4; ++k)
    for (int h = 0; h < 2; ++h)
      r[4 * h + k] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(X + k * D + 8 * g + 4 * h)),
                                          _mm_loadu_ps(X + (k + 4) * D + 8 * g + 4 * h), 1);
  for (int h = 0; h < 2; ++h) {
    __m256* t = r + 4 * h;
    const __m256 a = _mm256_unpacklo_ps(t[0], t[1]), b = _mm256_unpackhi_ps(t[0], t[1]);
    const __m256 c = _mm256_unpacklo_ps(t[2], t[3]), d = _mm256_unpackhi_ps(t[2], t[3]);
    t[0] = _mm256_shuffle_ps(a, c, _MM_SHUFFLE(1, 0, 1, 0));
    t[1] = _mm256_shuffle_ps(a, c, _MM_SHUFFLE(3, 2, 3, 2));
    t[2] = _mm256_shuffle_ps(b, d, _MM_SHUFFLE(1, 0, 1, 0));
    t[3] = _mm256_shuffle_ps(b, d, _MM_SHUFFLE(3, 2, 3, 2));
  }
}

}  // namespace

__attribute__((LQ_AVX2_TARGET)) void sum_squares_rows16_avx2(const float* X, int64_t D, float* s, const float* next) {
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  const int64_t full = D / 8;
  for (int64_t g = 0; g < full; ++g) {
    __m256 r[2][8];
    if (next != nullptr && g % 2 == 0)
      for (int k = 0; k < 16; ++k) _mm_prefetch(reinterpret_cast<const char*>(next + k * D + 8 * g), _MM_HINT_T0);
    for (int h = 0; h < 2; ++h) load_columns8(X + 8 * h * D, D, g, r[h]);
    for (int k = 0; k < 8; ++k)  // two independent chains (rows 0..7 and 8..15) interleaved: half the latency
      for (int h = 0; h < 2; ++h) acc[h] = _mm256_add_ps(acc[h], _mm256_mul_ps(r[h][k], r[h][k]));
  }
  _mm256_storeu_ps(s, acc[0]);
  _mm256_storeu_ps(s + 8, acc[1]);
  for (int k = 0; k < 16; ++k)
    for (int64_t i = 8 * full; i < D; ++i) s[k] = q::add_rn(s[k], q::mul_rn(X[k * D + i], X[k * D + i]));
}

namespace {

// The butterflies of stages h = 1, 2, 4 inside one vector: lane i takes a + c (bit h of i clear: a = its value,
// c = the partner's) or a − c (set: a = the partner's, c = its value); the same exact a ± c as fwht_rows.
LQ_AVX2_AI __m256 fwht8(__m256 v) {
  __m256 p = _mm256_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1));
  v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xAA);
  p = _mm256_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2));
  v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xCC);
  p = _mm256_permute2f128_ps(v, v, 0x01);
  return _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xF0);
}

// Every stage h < 8·NB of a sub-block of 8·NB elements held in NB registers.
template <int NB>
LQ_AVX2_AI void fwht_regs(__m256* v) {
  for (int i = 0; i < NB; ++i) v[i] = fwht8(v[i]);
  for (int h = 1; h < NB; h <<= 1)
    for (int j0 = 0; j0 < NB; j0 += 2 * h)
      for (int k = 0; k < h; ++k) {
        const __m256 a = v[j0 + k], c = v[j0 + h + k];
        v[j0 + k] = _mm256_add_ps(a, c);
        v[j0 + h + k] = _mm256_sub_ps(a, c);
      }
}

// The stages h = from, 2·from, ... < block of each block of x [D] in memory (contiguous runs of 8).
LQ_AVX2_AI void fwht_memory_stages(float* x, int64_t D, int64_t block, int64_t from) {
  for (int64_t b0 = 0; b0 < D; b0 += block)
    for (int64_t h = from; h < block; h <<= 1)
      for (int64_t j0 = b0; j0 < b0 + block; j0 += 2 * h)
        for (int64_t k = 0; k < h; k += 8) {
          const __m256 a = _mm256_loadu_ps(x + j0 + k), c = _mm256_loadu_ps(x + j0 + h + k);
          _mm256_storeu_ps(x + j0 + k, _mm256_add_ps(a, c));
          _mm256_storeu_ps(x + j0 + h + k, _mm256_sub_ps(a, c));
        }
}

// v / p1 (div), else v · p1, then · p2 when npre = 2.
LQ_AVX2_AI __m256 pre_scale(__m256 v, __m256 p1, __m256 p2, int npre, bool div) {
  if (div) return _mm256_div_ps(v, p1);
  v = _mm256_mul_ps(v, p1);
  return npre == 2 ? _mm256_mul_ps(v, p2) : v;
}

// The count of the 2^BITS − 1 midpoints m ≤ y in each lane (codebook_index), compared one by one (vcmpps GE).
template <int BITS>
LQ_AVX2_AI __m256i count_mid(__m256 y, const __m256* mid) {
  __m256i cnt = _mm256_setzero_si256();
  for (int j = 0; j < (1 << BITS) - 1; ++j)
    cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(_mm256_cmp_ps(y, mid[j], _CMP_GE_OQ)));
  return cnt;
}

// The same count by a binary search, BITS compares, for midpoints in non-decreasing order (then the midpoints ≤ y
// are a prefix, and its length is the code, MSB first: c += 2^s where y ≥ m[c + 2^s − 1]); a NaN y fails every
// compare and gets 0, as it does counted. step[s] holds m[k·2^(s+1) + 2^s − 1] in lane k (vpermps on the code's
// bits above s).
template <int BITS>
LQ_AVX2_AI __m256i search_mid(__m256 y, const __m256* step) {
  __m256i c = _mm256_castps_si256(_mm256_cmp_ps(y, step[BITS - 1], _CMP_GE_OQ));  // −1 where the top bit is set
  c = _mm256_sub_epi32(_mm256_setzero_si256(), c);
  for (int s = BITS - 2; s >= 0; --s) {
    const __m256 m = _mm256_permutevar8x32_ps(step[s], c);
    c = _mm256_sub_epi32(_mm256_add_epi32(c, c), _mm256_castps_si256(_mm256_cmp_ps(y, m, _CMP_GE_OQ)));
  }
  return c;
}

// The 64 codes c[8] (int32 lanes, < 16) of eight groups packed LSB-first, BITS 2..4, into out[8·BITS]: the codes
// as bytes (vpackssdw, vpackuswb, vpermd), then neighbours merged by multiply-adds (pmaddubsw, pmaddwd: the fields
// are disjoint, so the sums are the ORs) — rather than a horizontal OR of each group's eight lanes.
template <int BITS>
LQ_AVX2_AI void pack_codes64(const __m256i* c, uint8_t* out) {
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256i e[2];  // codes 0..31, 32..63, a byte each
  for (int h = 0; h < 2; ++h)
    e[h] = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(_mm256_packs_epi32(c[4 * h], c[4 * h + 1]),
                                                           _mm256_packs_epi32(c[4 * h + 2], c[4 * h + 3])),
                                       order);
  if constexpr (BITS == 4) {  // byte pairs: lo + 16·hi
    const __m256i f = _mm256_set1_epi16(0x1001);
    const __m256i b = _mm256_packus_epi16(_mm256_maddubs_epi16(e[0], f), _mm256_maddubs_epi16(e[1], f));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute4x64_epi64(b, 0xD8));
  } else if constexpr (BITS == 2) {  // four codes a byte: (c0 + 4·c1) + 16·(c2 + 4·c3)
    __m256i w[2];
    for (int h = 0; h < 2; ++h)
      w[h] = _mm256_madd_epi16(_mm256_maddubs_epi16(e[h], _mm256_set1_epi16(0x0401)), _mm256_set1_epi32(0x00100001));
    const __m256i p = _mm256_packus_epi16(_mm256_packs_epi32(w[0], w[1]), _mm256_setzero_si256());
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                     _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0))));
  } else {  // eight codes, 24 bits, in the low bytes of each 64-bit lane; two lanes merged into 48 bits
    __m128i q[2];
    for (int h = 0; h < 2; ++h) {
      // c0 + 8·c1, then four codes (12 bits), then a group's eight (24 bits), then two groups (48 bits)
      __m256i w = _mm256_maddubs_epi16(e[h], _mm256_set1_epi16(0x0801));
      w = _mm256_madd_epi16(w, _mm256_set1_epi32(0x00400001));
      w = _mm256_and_si256(_mm256_or_si256(w, _mm256_srli_epi64(w, 20)), _mm256_set1_epi64x(0xFFFFFF));
      w = _mm256_or_si256(w, _mm256_slli_epi64(_mm256_bsrli_epi128(w, 8), 24));
      w = _mm256_permute4x64_epi64(w, 0x08);  // groups 4h .. 4h + 3 in the low 128 bits
      q[h] = _mm_shuffle_epi8(_mm256_castsi256_si128(w),
                              _mm_setr_epi8(0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, -1, -1, -1, -1));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), q[0]);  // bytes 12..15 are rewritten below
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 12), q[1]);
    const uint32_t tail = static_cast<uint32_t>(_mm_extract_epi32(q[1], 2));
    std::memcpy(out + 20, &tail, 4);
  }
}

// The outputs of rotate_row: the codes of group g (CodeOut), or the rotated floats (StoreOut); block8 takes the
// eight groups of a 64-element block at once.
template <int BITS>
struct CodeOut {
  const __m256* mid;
  const __m256* step;  // search_mid's tables, or null: the midpoints are not sorted (count them)
  __m256i shifts;
  uint8_t* row;
  const float* next;  // a row of the next rows, to prefetch a block's four lines of (into L2), or null
  LQ_AVX2_AI __m256i code(__m256 y) const {
    if constexpr (BITS >= 3)
      if (step != nullptr) return search_mid<BITS>(y, step);
    return count_mid<BITS>(y, mid);
  }
  LQ_AVX2_AI void operator()(int64_t g, __m256 y) const {
    const uint32_t word = or_lanes(_mm256_sllv_epi32(code(y), shifts));
    std::memcpy(row + g * BITS, &word, BITS);
  }
  LQ_AVX2_AI void block8(int64_t g0, const __m256* y) const {
    if (next != nullptr)
      for (int k = 0; k < 4; ++k) _mm_prefetch(reinterpret_cast<const char*>(next + 8 * g0 + 16 * k), _MM_HINT_T1);
    if constexpr (BITS == 1) {
      for (int k = 0; k < 8; ++k) (*this)(g0 + k, y[k]);
    } else {
      __m256i c[8];
      for (int k = 0; k < 8; ++k) c[k] = code(y[k]);
      pack_codes64<BITS>(c, row + g0 * BITS);
    }
  }
};
struct StoreOut {
  float* x;
  LQ_AVX2_AI void operator()(int64_t g, __m256 y) const { _mm256_storeu_ps(x + 8 * g, y); }
  LQ_AVX2_AI void block8(int64_t g0, const __m256* y) const {
    for (int k = 0; k < 8; ++k) (*this)(g0 + k, y[k]);
  }
};

// y = H·(x · pre1 · pre2) per block (pre2 = 1: one multiply) — x / a when div — the sub-blocks of ≤ 64 elements
// in registers, then out(g, v) for each group g of eight outputs.
template <int NB, class Out>
LQ_AVX2_AI void rotate_row(const float* x, int64_t D, int64_t block, float* scratch, __m256 pre1, __m256 pre2, int npre,
                           bool div, const Out& out) {
  const __m256 norm = _mm256_set1_ps(static_cast<float>(1.0 / std::sqrt(static_cast<double>(block))));
  if (block == 8 * NB) {  // whole blocks in registers
    for (int64_t b0 = 0; b0 < D; b0 += block) {
      __m256 v[NB];
      for (int k = 0; k < NB; ++k) v[k] = pre_scale(_mm256_loadu_ps(x + b0 + 8 * k), pre1, pre2, npre, div);
      fwht_regs<NB>(v);
      for (int k = 0; k < NB; ++k) v[k] = _mm256_mul_ps(v[k], norm);
      if constexpr (NB == 8)
        out.block8(b0 / 8, v);
      else
        for (int k = 0; k < NB; ++k) out(b0 / 8 + k, v[k]);
    }
    return;
  }
  for (int64_t s0 = 0; s0 < D; s0 += 8 * NB) {  // blocks above 8·NB: the stages below 8·NB per sub-block, then memory
    __m256 v[NB];
    for (int k = 0; k < NB; ++k) v[k] = pre_scale(_mm256_loadu_ps(x + s0 + 8 * k), pre1, pre2, npre, div);
    fwht_regs<NB>(v);
    for (int k = 0; k < NB; ++k) _mm256_storeu_ps(scratch + s0 + 8 * k, v[k]);
  }
  fwht_memory_stages(scratch, D, block, 8 * NB);
  for (int64_t g = 0; g < D / 8; ++g) out(g, _mm256_mul_ps(_mm256_loadu_ps(scratch + 8 * g), norm));
}

template <int BITS>
__attribute__((LQ_AVX2_TARGET)) void tq_encode_rows(const float* X, int64_t T, int64_t D, int64_t block,
                                                    const float* denom, const float* mid, uint8_t* codes,
                                                    float* scratch, const float* next) {
  constexpr int kMid = (1 << BITS) - 1;
  const int64_t rb = (D * BITS + 7) / 8;
  const __m256i shifts = code_shifts(BITS);
  __m256 m[kMid], step[BITS];
  for (int j = 0; j < kMid; ++j) m[j] = _mm256_set1_ps(mid[j]);
  for (int s = 0; s < BITS; ++s) {  // search_mid's tables: lane k of step[s] = mid[k·2^(s+1) + 2^s − 1]
    float lanes[8] = {};
    for (int k = 0; k < 8 && k * (2 << s) + (1 << s) - 1 < kMid; ++k) lanes[k] = mid[k * (2 << s) + (1 << s) - 1];
    step[s] = _mm256_loadu_ps(lanes);
  }
  step[BITS - 1] = _mm256_set1_ps(mid[(1 << (BITS - 1)) - 1]);  // the first compare: every lane
  const bool sorted = std::is_sorted(mid, mid + kMid);
  for (int64_t t = 0; t < T; ++t) {
    const CodeOut<BITS> out{m, sorted ? step : nullptr, shifts, codes + t * rb, next ? next + t * D : nullptr};
    const __m256 a = _mm256_set1_ps(denom[t]);
    if (block >= 64)
      rotate_row<8>(X + t * D, D, block, scratch, a, a, 1, true, out);
    else if (block == 32)
      rotate_row<4>(X + t * D, D, block, scratch, a, a, 1, true, out);
    else if (block == 16)
      rotate_row<2>(X + t * D, D, block, scratch, a, a, 1, true, out);
    else
      rotate_row<1>(X + t * D, D, block, scratch, a, a, 1, true, out);
  }
}

}  // namespace

__attribute__((LQ_AVX2_TARGET)) void tq_encode_rows_avx2(const float* X, int64_t T, int64_t D, int64_t block,
                                                         const float* denom, const float* mid, int bits, uint8_t* codes,
                                                         float* scratch, const float* next) {
  switch (bits) {
    case 1:
      return tq_encode_rows<1>(X, T, D, block, denom, mid, codes, scratch, next);
    case 2:
      return tq_encode_rows<2>(X, T, D, block, denom, mid, codes, scratch, next);
    case 3:
      return tq_encode_rows<3>(X, T, D, block, denom, mid, codes, scratch, next);
    default:
      return tq_encode_rows<4>(X, T, D, block, denom, mid, codes, scratch, next);
  }
}

__attribute__((LQ_AVX2_TARGET)) void tq_rotate_back_row_avx2(float* x, int64_t D, int64_t block, float a, float b,
                                                             bool two, float* scratch) {
  const StoreOut out{x};
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  const int npre = two ? 2 : 1;
  if (block >= 64)
    rotate_row<8>(x, D, block, scratch, va, vb, npre, false, out);
  else if (block == 32)
    rotate_row<4>(x, D, block, scratch, va, vb, npre, false, out);
  else if (block == 16)
    rotate_row<2>(x, D, block, scratch, va, vb, npre, false, out);
  else
    rotate_row<1>(x, D, block, scratch, va, vb, npre, false, out);
}

__attribute__((LQ_AVX2_TARGET)) bool tc_uniform_codes_avx2(const float* x, int64_t D, const TcRowTables& r,
                                                           uint8_t* code) {
  const __m256 zero = _mm256_setzero_ps(), magic = _mm256_set1_ps(12582912.0f);
  const __m256i expo = _mm256_set1_epi32(0x7f800000);
  __m256i bad = _mm256_setzero_si256();
  uint32_t bad_tail = 0;
  int64_t i = 0;
  for (; i + 8 <= D; i += 8) {
    if (i % 16 == 0) prefetch_ahead(x + i, kPrefetchBytes);
    const __m256 s = _mm256_loadu_ps(r.scale + i);
    const __m256 xv = _mm256_loadu_ps(x + i);
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(xv), expo), expo));
    const __m256 v = _mm256_div_ps(_mm256_sub_ps(xv, _mm256_loadu_ps(r.offset + i)), s);
    // rne_clamp: min_num(max_num(0, v), qmax) (a NaN v, from a zero scale, gives 0), then the 1.5·2^23 rounding
    __m256 c = _mm256_min_ps(_mm256_loadu_ps(r.qmax + i), _mm256_max_ps(v, zero));
    c = _mm256_sub_ps(_mm256_add_ps(c, magic), magic);
    c = _mm256_and_ps(c, _mm256_cmp_ps(s, zero, _CMP_GT_OQ));  // scale ≤ 0: code 0 (encode_asym)
    const __m256i ci = _mm256_cvttps_epi32(c);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(ci), _mm256_extracti128_si256(ci, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(code + i), _mm_packus_epi16(w, w));
  }
  for (; i < D; ++i) {
    bad_tail |= !q::is_finite(x[i]);
    code[i] = static_cast<uint8_t>(q::encode_asym(x[i], r.scale[i], r.offset[i], r.width[i]));
  }
  return bad_tail != 0 || !_mm256_testz_si256(bad, bad);
}

__attribute__((LQ_AVX2_TARGET)) void tc_uniform_decode_avx2(const uint8_t* code, int64_t D, const TcRowTables& r,
                                                            float* out) {
  int64_t i = 0;
  for (; i + 8 <= D; i += 8) {
    const __m256 off = _mm256_loadu_ps(r.offset + i);
    const __m128i c8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(code + i));
    const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c8));
    const __m256 v = _mm256_add_ps(off, _mm256_mul_ps(_mm256_loadu_ps(r.scale + i), c));
    // width 0 decodes to the offset itself (offset + 0 would turn −0 into +0)
    const __m256 coded = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.coded + i)));
    _mm256_storeu_ps(out + i, _mm256_blendv_ps(off, v, coded));
  }
  for (; i < D; ++i) out[i] = r.coded[i] ? q::decode_asym(code[i], r.scale[i], r.offset[i]) : r.offset[i];
}

namespace {

// The count of the n midpoints m[j] ≤ u in each lane (codebook_index: vcmpps GE, m broadcast), N = n unrolled.
template <int N>
LQ_AVX2_AI __m256i count_ge(__m256 u, const float* m) {
  __m256i cnt = _mm256_setzero_si256();
  for (int j = 0; j < N; ++j)
    cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(_mm256_cmp_ps(u, _mm256_set1_ps(m[j]), _CMP_GE_OQ)));
  return cnt;
}
LQ_AVX2_AI __m256i count_ge_n(__m256 u, const float* m, int n) {
  __m256i cnt = _mm256_setzero_si256();
  for (int j = 0; j < n; ++j)
    cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(_mm256_cmp_ps(u, _mm256_set1_ps(m[j]), _CMP_GE_OQ)));
  return cnt;
}

// Lane l of tab[idx_l] for a table of 2^W entries (W 1..8; idx < 2^W): vpermps on each run of eight entries, then
// a blend tree on the index bits 3 .. W − 1 (no vgatherdps, see select_lanes). Reads tab[0, max(8, 2^W)).
template <int W>
LQ_AVX2_AI __m256 lookup(const float* tab, __m256i idx) {
  constexpr int kRuns = W <= 3 ? 1 : 1 << (W - 3);
  __m256 v[kRuns];
  for (int j = 0; j < kRuns; ++j) v[j] = _mm256_permutevar8x32_ps(_mm256_loadu_ps(tab + 8 * j), idx);
  for (int k = 3, n = kRuns; n > 1; ++k, n /= 2) {
    const __m256 m = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 31 - k));
    for (int j = 0; j < n / 2; ++j) v[j] = _mm256_blendv_ps(v[2 * j], v[2 * j + 1], m);
  }
  return v[0];
}

// tc_decode_code of the codes idx of a component of width W ≥ 1 (tc_decode_code: offset + scale · centroid).
template <int W>
LQ_AVX2_AI __m256 tc_lm_value(const float* centroid, float scale, __m256 off, __m256i idx) {
  const __m256 c = lookup<W>(centroid + qmath::tc_centroid_base(W), idx);
  return _mm256_add_ps(off, _mm256_mul_ps(_mm256_set1_ps(scale), c));
}

// Eight int32 lanes (values ≤ 255) as eight bytes at out.
LQ_AVX2_AI void store_bytes8(uint8_t* out, __m256i c) {
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(w, w));
}

}  // namespace

namespace {

// The codes of the n components comp[p] of width W, each column col [8] (a component's value in eight rows) coded
// in place (tc_code: u = (x − offset) / scale, 0 where scale ≤ 0 or NaN; the count of W's midpoints ≤ u), or, where
// u.tau_at gives them, the count of the component's thresholds ≤ x − offset (no division: tc_lm_thresholds).
template <int W>
__attribute__((LQ_AVX2_TARGET)) void tc_lm_code_run(float* col, const int32_t* comp, int64_t n,
                                                    const qmath::TcTables& v, const TcUnpack& u) {
  const float* m = v.midpoint + qmath::tc_midpoint_base(W);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t i = comp[p];
    float* c = col + 8 * i;
    __m256i cnt = _mm256_setzero_si256();
    if constexpr (W > 0 && W <= 4) {
      const int32_t at = u.tau_at[i];
      if (at >= 0) {
        cnt = count_ge<(1 << W) - 1>(_mm256_sub_ps(_mm256_loadu_ps(c), _mm256_set1_ps(v.offset[i])), u.tau.data() + at);
        _mm256_storeu_ps(c, _mm256_castsi256_ps(cnt));
        continue;
      }
    }
    if constexpr (W > 0) {
      const float s = v.scale[i];
      const __m256 x =
          s > 0.0f ? _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(c), _mm256_set1_ps(v.offset[i])), _mm256_set1_ps(s))
                   : _mm256_setzero_ps();
      if constexpr (W <= 4)
        cnt = count_ge<(1 << W) - 1>(x, m);
      else
        cnt = count_ge_n(x, m, (1 << W) - 1);
    }
    _mm256_storeu_ps(c, _mm256_castsi256_ps(cnt));
  }
}

// The values of the n components comp[p] of width W, each column col [8] of codes decoded in place.
template <int W>
__attribute__((LQ_AVX2_TARGET)) void tc_lm_decode_run(float* col, const int32_t* comp, int64_t n,
                                                      const qmath::TcTables& v, const TcUnpack&) {
  for (int64_t p = 0; p < n; ++p) {
    const int64_t i = comp[p];
    float* c = col + 8 * i;
    const __m256 off = _mm256_set1_ps(v.offset[i]);
    if constexpr (W == 0)
      _mm256_storeu_ps(c, off);  // the offset itself
    else
      _mm256_storeu_ps(c, tc_lm_value<W>(v.centroid, v.scale[i], off,
                                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c))));
  }
}

template <int W>
struct CodeRun {
  LQ_AVX2_AI static void run(float* col, const int32_t* comp, int64_t n, const qmath::TcTables& v,
                             const TcUnpack& u) {
    tc_lm_code_run<W>(col, comp, n, v, u);
  }
};
template <int W>
struct DecodeRun {
  LQ_AVX2_AI static void run(float* col, const int32_t* comp, int64_t n, const qmath::TcTables& v,
                             const TcUnpack& u) {
    tc_lm_decode_run<W>(col, comp, n, v, u);
  }
};

// The lines of the rows next [8, D], prefetched into L2 a few at a time (done(k) after k of n steps: all of them by
// the last step), so that their misses overlap the work rather than queue up in one burst; next null: none.
struct SpreadPrefetch {
  const float* next;
  int64_t D, lines_per_row, issued = 0, row = 0, line = 0;  // line `line` of row `row` is the next to prefetch
  SpreadPrefetch(const float* n, int64_t d) : next(n), D(d), lines_per_row((d + 15) / 16) {}
  LQ_AI void done(int64_t k, int64_t n) {
    if (next == nullptr || n <= 0) return;
    for (const int64_t due = 8 * lines_per_row * k / n; issued < due; ++issued) {
      _mm_prefetch(reinterpret_cast<const char*>(next + row * D + 16 * line), _MM_HINT_T1);
      if (++line == lines_per_row) line = 0, ++row;
    }
  }
};

// Run<W>::run on each run of equal width W of the components u.by_width (sorted by width: nine runs at most, so one
// switch per run rather than a data-dependent branch per component, which mispredicted on tc2-lm's 576 widths), 16
// components at a time with pf.done between.
template <template <int> class Run>
__attribute__((LQ_AVX2_TARGET)) void width_runs(float* col, const TcUnpack& u, const int32_t* width,
                                                const qmath::TcTables& v, SpreadPrefetch pf) {
  const std::vector<int32_t>& by_width = u.by_width;
  const int64_t n = static_cast<int64_t>(by_width.size());
  for (int64_t p = 0, e = 0; p < n; p = e) {
    const int w = width[by_width[p]];
    e = p + 1;
    while (e < n && e - p < 16 && width[by_width[e]] == w) ++e;
    const int32_t* c = by_width.data() + p;
    switch (w) {
      case 0:
        Run<0>::run(col, c, e - p, v, u);
        break;
      case 1:
        Run<1>::run(col, c, e - p, v, u);
        break;
      case 2:
        Run<2>::run(col, c, e - p, v, u);
        break;
      case 3:
        Run<3>::run(col, c, e - p, v, u);
        break;
      case 4:
        Run<4>::run(col, c, e - p, v, u);
        break;
      case 5:
        Run<5>::run(col, c, e - p, v, u);
        break;
      case 6:
        Run<6>::run(col, c, e - p, v, u);
        break;
      case 7:
        Run<7>::run(col, c, e - p, v, u);
        break;
      default:
        Run<8>::run(col, c, e - p, v, u);
    }
    pf.done(e, n);
  }
}

}  // namespace

__attribute__((LQ_AVX2_TARGET)) bool tc_lm_codes_rows8_avx2(const float* X, int64_t D, const qmath::TcTables& v,
                                                            const int32_t* width, const TcUnpack& u, const float* next,
                                                            float* col, uint8_t* code) {
  const int64_t full = D / 8;
  const __m256i expo = _mm256_set1_epi32(0x7f800000);
  __m256i bad = _mm256_setzero_si256();
  uint32_t bad_tail = 0;
  for (int64_t g = 0; g < full; ++g) {  // the eight rows as columns: col[8i + k] = x_k[i]
    __m256 r[8];
    load_columns8(X, D, g, r);
    for (int k = 0; k < 8; ++k) {
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(r[k]), expo), expo));
      _mm256_storeu_ps(col + 64 * g + 8 * k, r[k]);
    }
  }
  width_runs<CodeRun>(col, u, width, v, SpreadPrefetch(next, D));
  // back to rows: the codes (< 256) of eight components as bytes first (component-major 4×4 blocks of bytes in
  // each half), those transposed by a byte shuffle, then row k's eight bytes assembled by 32-bit unpacks
  const __m256i t4 = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13,
                                      2, 6, 10, 14, 3, 7, 11, 15);
  for (int64_t g = 0; g < full; ++g) {
    const __m256i* c = reinterpret_cast<const __m256i*>(col + 64 * g);
    __m256i b[2];  // components 4h .. 4h + 3: rows 0..3 in the low half, 4..7 in the high half
    for (int h = 0; h < 2; ++h)
      b[h] = _mm256_shuffle_epi8(
          _mm256_packus_epi16(_mm256_packs_epi32(_mm256_loadu_si256(c + 4 * h), _mm256_loadu_si256(c + 4 * h + 1)),
                              _mm256_packs_epi32(_mm256_loadu_si256(c + 4 * h + 2), _mm256_loadu_si256(c + 4 * h + 3))),
          t4);
    const __m256i lo = _mm256_unpacklo_epi32(b[0], b[1]), hi = _mm256_unpackhi_epi32(b[0], b[1]);
    const __m128i rows[4] = {_mm256_castsi256_si128(lo), _mm256_castsi256_si128(hi), _mm256_extracti128_si256(lo, 1),
                             _mm256_extracti128_si256(hi, 1)};  // rows 0 1, 2 3, 4 5, 6 7
    for (int k = 0; k < 4; ++k) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(code + 2 * k * D + 8 * g), rows[k]);
      _mm_storeh_pd(reinterpret_cast<double*>(code + (2 * k + 1) * D + 8 * g), _mm_castsi128_pd(rows[k]));
    }
  }
  for (int k = 0; k < 8; ++k)
    for (int64_t i = 8 * full; i < D; ++i) {
      const float x = X[k * D + i];
      bad_tail |= !q::is_finite(x);
      code[k * D + i] = width[i] ? static_cast<uint8_t>(q::tc_code(v, static_cast<int>(i), width[i], x)) : 0;
    }
  return bad_tail != 0 || !_mm256_testz_si256(bad, bad);
}

__attribute__((LQ_AVX2_TARGET)) void tc_lm_decode_rows8_avx2(const uint8_t* code, int64_t D, const qmath::TcTables& v,
                                                             const int32_t* width, const TcUnpack& u, float* col,
                                                             float* rows, bool stream, float* out) {
  const int64_t full = D / 8;
  for (int64_t g = 0; g < full; ++g) {  // the eight rows' codes as columns
    __m256 r[8];
    for (int k = 0; k < 8; ++k)
      r[k] = _mm256_castsi256_ps(
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(code + k * D + 8 * g))));
    transpose8(r);
    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(col + 64 * g + 8 * k, r[k]);
  }
  width_runs<DecodeRun>(col, u, width, v, SpreadPrefetch(nullptr, D));
  for (int64_t g = 0; g < full; ++g) {  // back to rows in rows [8, D], then each row copied out whole
    __m256 r[8];
    for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(col + 64 * g + 8 * k);
    transpose8(r);
    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(rows + k * D + 8 * g, r[k]);
  }
  for (int k = 0; k < 8; ++k)
    for (int64_t i = 8 * full; i < D; ++i)
      rows[k * D + i] =
          width[i] ? q::tc_decode_code(v, static_cast<int>(i), width[i], code[k * D + i]) : v.offset[i];
  // the eight rows are one contiguous run of out: one copy (non-temporal stores past stream_min_bytes; the caller
  // fences)
  if (!stream) {
    std::memcpy(out, rows, static_cast<size_t>(8 * D) * 4);
    return;
  }
  stream_copy_avx2(rows, 8 * D, out);
}

__attribute__((LQ_AVX2_TARGET)) void stream_copy_avx2(const float* src, int64_t n, float* out) {
  int64_t i = std::min<int64_t>(n, static_cast<int64_t>((32 - (reinterpret_cast<uintptr_t>(out) & 31)) & 31) / 4);
  std::memcpy(out, src, static_cast<size_t>(i) * 4);
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(out + i, _mm256_loadu_ps(src + i));
  std::memcpy(out + i, src + i, static_cast<size_t>(n - i) * 4);
}

void tc_unpack_tables(const int32_t* bit_offset, int64_t D, TcUnpack& u) {
  const int64_t groups = D / 8;
  u.base.assign(static_cast<size_t>(groups), 0);
  u.ctrl.assign(static_cast<size_t>(groups * 32), 0);
  u.shift.assign(static_cast<size_t>(groups * 8), 0);
  u.mask.assign(static_cast<size_t>(groups * 8), 0);
  u.rel.assign(static_cast<size_t>(groups * 8), 0);
  u.group_bits.assign(static_cast<size_t>(groups), 0);
  u.by_width.resize(static_cast<size_t>(8 * groups));
  for (int32_t i = 0; i < 8 * groups; ++i) u.by_width[i] = i;
  std::stable_sort(u.by_width.begin(), u.by_width.end(), [&](int32_t a, int32_t b) {
    return bit_offset[a + 1] - bit_offset[a] < bit_offset[b + 1] - bit_offset[b];
  });
  for (int64_t g = 0; g < groups; ++g) {
    u.base[g] = bit_offset[8 * g] >> 3;
    u.group_bits[g] = bit_offset[8 * g + 8] - bit_offset[8 * g];
    for (int i = 0; i < 8; ++i) u.rel[g * 8 + i] = bit_offset[8 * g + i] - bit_offset[8 * g];
    for (int i = 0; i < 8; ++i) {
      const int32_t o = bit_offset[8 * g + i], w = bit_offset[8 * g + i + 1] - o;
      const int b = (o >> 3) - u.base[g];  // ≤ 7: eight codes of ≤ 8 bits start within 8 bytes
      for (int k = 0; k < 4; ++k) u.ctrl[g * 32 + 4 * i + k] = static_cast<int8_t>(b + k);
      u.shift[g * 8 + i] = o & 7;
      u.mask[g * 8 + i] = static_cast<int32_t>((1u << w) - 1u);
    }
  }
}

__attribute__((LQ_AVX2_TARGET)) void tc_unpack_avx2(const uint8_t* padded, const TcUnpack& u, const int32_t* bit_offset,
                                                    int64_t D, uint8_t* code) {
  const int64_t groups = D / 8;
  for (int64_t g = 0; g < groups; ++g) {
    // the 16 bytes from the group's first code byte in both halves; lane i takes the 4 bytes of code i's window
    const __m256i src =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(padded + u.base[g])));
    const __m256i ctrl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.ctrl.data() + g * 32));
    __m256i v = _mm256_shuffle_epi8(src, ctrl);
    v = _mm256_srlv_epi32(v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.shift.data() + g * 8)));
    v = _mm256_and_si256(v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.mask.data() + g * 8)));
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(code + 8 * g), _mm_packus_epi16(w, w));
  }
  for (int64_t i = 8 * groups; i < D; ++i) {
    uint32_t v;
    std::memcpy(&v, padded + (bit_offset[i] >> 3), 4);
    code[i] = static_cast<uint8_t>((v >> (bit_offset[i] & 7)) & ((1u << (bit_offset[i + 1] - bit_offset[i])) - 1u));
  }
}

__attribute__((LQ_AVX2_TARGET)) void tc_pack_avx2(const uint8_t* code, const TcUnpack& u, const int32_t* bit_offset,
                                                  int64_t D, int64_t rb, uint8_t* out) {
  const int64_t groups = D / 8;
  unsigned __int128 acc = 0;  // the bits not yet written, LSB first
  int nb = 0;
  uint8_t* o = out;
  auto flush = [&] {
    if (nb >= 64) {
      const uint64_t lo = static_cast<uint64_t>(acc);
      std::memcpy(o, &lo, 8);
      o += 8;
      acc >>= 64;
      nb -= 64;
    }
  };
  for (int64_t g = 0; g < groups; ++g) {
    // the group's ≤ 64 bits: code i shifted to o_i − o_(8g), in four 64-bit lanes, then OR-ed
    const __m128i c8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(code + 8 * g));
    const __m256i lo = _mm256_sllv_epi64(_mm256_cvtepu8_epi64(c8),
                                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.rel.data() + 8 * g)));
    const __m256i hi =
        _mm256_sllv_epi64(_mm256_cvtepu8_epi64(_mm_srli_si128(c8, 4)),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.rel.data() + 8 * g + 4)));
    const __m256i v = _mm256_or_si256(lo, hi);
    __m128i x = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_or_si128(x, _mm_unpackhi_epi64(x, x));
    acc |= static_cast<unsigned __int128>(static_cast<uint64_t>(_mm_cvtsi128_si64(x))) << nb;
    nb += u.group_bits[g];
    flush();
  }
  for (int64_t i = 8 * groups; i < D; ++i) {
    acc |= static_cast<unsigned __int128>(code[i]) << nb;
    nb += bit_offset[i + 1] - bit_offset[i];
    flush();
  }
  for (; nb > 0; nb -= 8, acc >>= 8) *o++ = static_cast<uint8_t>(acc);
  std::fill(o, out + rb, uint8_t{0});
}

}  // namespace latentq::cpu

#endif  // LQ_HAVE_AVX2_KERNEL
