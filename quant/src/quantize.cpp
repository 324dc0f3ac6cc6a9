// The CPU reference quantizer. Plain loops over the element math of latentq/qmath.h; written so
// the compiler vectorizes the inner loops (no FMA contraction, see CMakeLists.txt).
#include "latentq/quantize.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <cassert>
#include <cstring>
#include <atomic>
#include <bit>
#include <exception>
#include <string>
#include <thread>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LQ_X86_KERNELS 1
// CpuKernel::Avx2 is AVX2 + F16C (the fp16 scale conversions; every AVX2 CPU has F16C, cpu_has_avx2 checks both).
#define LQ_AVX2_TARGET target("avx2,f16c")
#define LQ_AVX2_AI __attribute__((LQ_AVX2_TARGET, always_inline)) inline
#else
#define LQ_X86_KERNELS 0
#endif

namespace latentq {
namespace q = qmath;
namespace {

// v = n zero bytes. A buffer of at least 32 MiB that has to grow is allocated anew and advised for transparent
// huge pages (madvise MADV_HUGEPAGE on its page-aligned interior, as numpy does for its arrays) before the
// zero fill first touches it: glibc maps every block above its largest mmap threshold (32 MiB) fresh, and each
// 4 KiB page fault is costly on a VM (faulting in and filling 134 MB took 66 ms with 4 KiB pages, 14 ms
// advised, on the 2-vCPU Zen 4 KVM machine); smaller blocks come back from the heap already faulted in. Where
// transparent huge pages are off ("never") or elsewhere than Linux it is a plain assign. The bytes are the same.
void assign_zeroed(std::vector<uint8_t>& v, size_t n) {
#if defined(__linux__)
  if (n >= (size_t{32} << 20) && v.capacity() < n) {
    std::vector<uint8_t> w;
    w.reserve(n);
    const uintptr_t a = (reinterpret_cast<uintptr_t>(w.data()) + 4095) & ~uintptr_t{4095};
    const uintptr_t e = (reinterpret_cast<uintptr_t>(w.data()) + n) & ~uintptr_t{4095};
    if (e > a) (void)madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
    v.swap(w);
  }
#endif
  v.assign(n, 0);
}

void put_scale(std::vector<uint8_t>& buf, int64_t i, float v, ScaleDtype d) {
  q::store_dtype(buf.data() + q::scale_dtype_bytes(d) * i, v, d);
}

float get_scale(const std::vector<uint8_t>& buf, int64_t i, ScaleDtype d) {
  return q::load_dtype(buf.data() + q::scale_dtype_bytes(d) * i, d);
}

// Stored (scale, offset) of a group from its statistics; checks the storage dtype did not overflow.
q::ScaleOffset group_params(const QuantizedTensor& qt, float mn, float mx, int64_t gi) {
  const QuantSpec& spec = qt.spec;
  auto params = [&](ScaleDtype d) {
    return spec.scheme == Scheme::Sym ? q::sym_params(q::max_num(q::abs_f(mn), q::abs_f(mx)), spec.bits, d)
                                      : q::asym_params(mn, mx, spec.bits, d);
  };
  const q::ScaleOffset p = params(spec.scale_dtype);
  if (!q::is_finite(p.scale) || !q::is_finite(p.offset)) {
    const q::ScaleOffset raw = params(ScaleDtype::F32);  // unrounded, for the message
    if (!q::is_finite(p.scale)) throw std::invalid_argument(overflow_message(spec, "scale", raw.scale, group_name(qt, gi)));
    throw std::invalid_argument(overflow_message(spec, "offset", raw.offset, group_name(qt, gi)));
  }
  return p;
}

// The per-tensor group of an integer spec: its (scale, offset) from the matrix's min/max, stored as
// the only entry of qt.scales (and of qt.offsets when asymmetric). Throws as group_params().
q::ScaleOffset store_tensor_params(QuantizedTensor& qt, float mn, float mx) {
  const QuantSpec& spec = qt.spec;
  const q::ScaleOffset p = group_params(qt, mn, mx, 0);
  const size_t sb = static_cast<size_t>(q::scale_dtype_bytes(spec.scale_dtype));
  qt.scales.assign(sb, 0);
  put_scale(qt.scales, 0, p.scale, spec.scale_dtype);
  if (spec.scheme == Scheme::Asym) {
    qt.offsets.assign(sb, 0);
    put_scale(qt.offsets, 0, p.offset, spec.scale_dtype);
  }
  return p;
}

// Encode n elements of x with per-element (scale, offset) pointers advanced by `Step` (0: one
// group for the whole span, 1: one per element) into byte codes u[n]. Step is a template argument
// so both loops vectorize (Step 0: the compiler hoists the scale > 0 test out of the loop).
template <bool Sym, int Step>
void encode_span(const float* x, int64_t n, const float* scale, const float* offset, int bits, uint8_t* u) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = scale[i * Step];
    if constexpr (Sym) u[i] = static_cast<uint8_t>(q::encode_sym(x[i], s, bits));
    else u[i] = static_cast<uint8_t>(q::encode_asym(x[i], s, offset[i * Step], bits));
  }
}

// Always inlined (LQ_AI): the reference loops and the fused kernels below share these two, whose
// loops then vectorize in the caller's ISA (integer operations only: the bytes are the same in any ISA).
#define LQ_AI [[gnu::always_inline]] inline

// Pack D byte codes u[D] at `bits` per code into out[packed_row_bytes(D, bits)], order per qmath.h.
LQ_AI void pack_row(const uint8_t* __restrict u, int64_t D, int bits, uint8_t* __restrict out) {
  const int64_t nb = q::packed_row_bytes(D, bits);
  if (bits == 8) {
    std::memcpy(out, u, static_cast<size_t>(D));
    return;
  }
  const int per = 8 / bits;
  const int64_t full = D / per;
  if (bits == 4) {
    for (int64_t k = 0; k < full; ++k) out[k] = static_cast<uint8_t>(u[2 * k] | (u[2 * k + 1] << 4));
  } else {
    for (int64_t k = 0; k < full; ++k)
      out[k] = static_cast<uint8_t>(u[4 * k] | (u[4 * k + 1] << 2) | (u[4 * k + 2] << 4) | (u[4 * k + 3] << 6));
  }
  if (full < nb) {  // partial last byte: remaining codes, zero padding bits
    uint8_t b = 0;
    for (int64_t j = 0; full * per + j < D; ++j) b = static_cast<uint8_t>(b | (u[full * per + j] << (bits * j)));
    out[full] = b;
  }
}

LQ_AI void unpack_row(const uint8_t* __restrict in, int64_t D, int bits, uint8_t* __restrict u) {
  if (bits == 8) {
    std::memcpy(u, in, static_cast<size_t>(D));
    return;
  }
  const int per = 8 / bits;
  const int64_t full = D / per;
  if (bits == 4) {  // whole bytes first (vectorizes), then the partial last byte
    for (int64_t k = 0; k < full; ++k) {
      u[2 * k] = static_cast<uint8_t>(in[k] & 0xf);
      u[2 * k + 1] = static_cast<uint8_t>(in[k] >> 4);
    }
  } else {
    for (int64_t k = 0; k < full; ++k) {
      u[4 * k] = static_cast<uint8_t>(in[k] & 3);
      u[4 * k + 1] = static_cast<uint8_t>((in[k] >> 2) & 3);
      u[4 * k + 2] = static_cast<uint8_t>((in[k] >> 4) & 3);
      u[4 * k + 3] = static_cast<uint8_t>(in[k] >> 6);
    }
  }
  const uint8_t mask = static_cast<uint8_t>((1 << bits) - 1);
  for (int64_t i = full * per; i < D; ++i) u[i] = static_cast<uint8_t>((in[i / per] >> (bits * (i % per))) & mask);
}


// ---- the fused integer kernels (CpuKernel::Baseline / Avx2) --------------------------------------
// One source, compiled twice: int_quantize_body / int_dequantize_body and everything they call are
// always_inline, so the Avx2 wrappers (target("avx2")) vectorize all of it with 32-byte vectors and
// the Baseline wrappers with the baseline ISA. They compute exactly the reference's values:
//   * min/max: a fold m = min_num(m, x) over finite floats has the same value in any order; only the
//     sign of a zero extremum depends on the order (min_num keeps the first of two equal values), and
//     the reference's left-to-right fold gives the FIRST zero of the span in that case (every element
//     before it is > 0 for a min, < 0 for a max), which first_zero() restores;
//   * encoding and decoding call qmath.h's encode_*/decode_* per element, as the reference does;
//   * NaN/Inf: each pass ORs a per-element exponent-all-ones flag; quantize() then throws the reference's
//     message (with the whole-matrix count) before any other error the same input would give.

// An output (decoded floats, packed codes) of at least this many bytes is written with non-temporal
// stores: it does not fit the caches, and a normal store first reads each line it writes
// (read-for-ownership), a third more memory traffic for dequantize. Smaller outputs stay in cache for
// whoever reads them next.
// Default 4 MiB (kStreamMinBytes); set_cpu_stream_min_bytes changes it (tests: 0 runs the streamed paths on
// small inputs).
constexpr int64_t kStreamMinBytes = int64_t{4} << 20;
std::atomic<int64_t> g_stream_min{kStreamMinBytes};

// dst[0, n) = src[0, n) with non-temporal 16-byte stores from dst's first 16-byte boundary (x86-64: SSE2,
// in both kernels); the caller issues the store fence. Elsewhere a plain copy.
LQ_AI void copy_stream(uint8_t* __restrict dst, const uint8_t* __restrict src, int64_t n) {
#if defined(__SSE2__)
  int64_t i = std::min<int64_t>(n, static_cast<int64_t>((16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15));
  std::memcpy(dst, src, static_cast<size_t>(i));
  for (; i + 16 <= n; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  std::memcpy(dst + i, src + i, static_cast<size_t>(n - i));
#else
  std::memcpy(dst, src, static_cast<size_t>(n));
#endif
}

LQ_AI void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

LQ_AI uint32_t nonfinite_bit(float x) { return (q::f32_bits(x) & 0x7f800000u) == 0x7f800000u ? 1u : 0u; }

LQ_AI float first_zero(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (x[i] == 0.0f) return x[i];
  return 0.0f;  // unreachable when called with a zero extremum
}

// min and max of x[0, n) as the reference fold from m = x[0] gives them; returns 1 if any is NaN/Inf.
// Eight lanes in GCC/Clang vector types (the compiler does not vectorize a float min/max reduction
// with min_num's select semantics by itself): lane k folds x[k], x[k+8], ...; the lanes are then
// folded in order, and a zero extremum takes the sign of the span's first zero (see above).
typedef float LqF8 __attribute__((vector_size(32)));
typedef int32_t LqI8 __attribute__((vector_size(32)));
LQ_AI uint32_t minmax_span(const float* __restrict x, int64_t n, float& mn_out, float& mx_out) {
  float mn = x[0], mx = x[0];
  uint32_t bad = 0;
  int64_t i = 0;
  if (n >= 16) {
    LqF8 a, b;
    std::memcpy(&a, x, sizeof a);
    b = a;
    LqI8 f = {0, 0, 0, 0, 0, 0, 0, 0};
    const LqI8 expo = {0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000};
    for (; i + 8 <= n; i += 8) {
      LqF8 v;
      LqI8 bits;
      std::memcpy(&v, x + i, sizeof v);
      std::memcpy(&bits, x + i, sizeof bits);
      a = v < a ? v : a;  // min_num(a, v) lane-wise
      b = v > b ? v : b;  // max_num(b, v)
      f |= (bits & expo) == expo;
    }
    for (int k = 0; k < 8; ++k) {
      mn = q::min_num(mn, a[k]);
      mx = q::max_num(mx, b[k]);
      bad |= f[k] != 0 ? 1u : 0u;
    }
  }
  for (; i < n; ++i) {
    mn = q::min_num(mn, x[i]);
    mx = q::max_num(mx, x[i]);
    bad |= nonfinite_bit(x[i]);
  }
  if (mn == 0.0f) mn = first_zero(x, n);
  if (mx == 0.0f) mx = first_zero(x, n);
  mn_out = mn;
  mx_out = mx;
  return bad;
}

// Per-column min/max over rows [t0, t1) of X [*, D] (the per-channel group statistics): the same
// left-to-right fold per column as the reference; returns 1 if any element is NaN/Inf.
LQ_AI uint32_t minmax_cols(const float* __restrict X, int64_t t0, int64_t t1, int64_t D, float* __restrict mn,
                           float* __restrict mx) {
  uint32_t bad = 0;
  const float* x0 = X + t0 * D;
  for (int64_t d = 0; d < D; ++d) {
    mn[d] = mx[d] = x0[d];
    bad |= nonfinite_bit(x0[d]);
  }
  for (int64_t t = t0 + 1; t < t1; ++t) {
    const float* __restrict x = X + t * D;
    for (int64_t d = 0; d < D; ++d) {
      mn[d] = q::min_num(mn[d], x[d]);
      mx[d] = q::max_num(mx[d], x[d]);
      bad |= nonfinite_bit(x[d]);
    }
  }
  return bad;
}

LQ_AI void enc_uniform(const float* __restrict x, int64_t n, float s, float o, bool sym, int bits, uint8_t* __restrict u) {
  if (sym)
    for (int64_t i = 0; i < n; ++i) u[i] = static_cast<uint8_t>(q::encode_sym(x[i], s, bits));
  else
    for (int64_t i = 0; i < n; ++i) u[i] = static_cast<uint8_t>(q::encode_asym(x[i], s, o, bits));
}

LQ_AI void enc_columns(const float* __restrict x, int64_t n, const float* __restrict s, const float* __restrict o, bool sym,
                       int bits, uint8_t* __restrict u) {
  if (sym)
    for (int64_t i = 0; i < n; ++i) u[i] = static_cast<uint8_t>(q::encode_sym(x[i], s[i], bits));
  else
    for (int64_t i = 0; i < n; ++i) u[i] = static_cast<uint8_t>(q::encode_asym(x[i], s[i], o[i], bits));
}

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
#if LQ_X86_KERNELS
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

// Out-of-line AVX2 entry points (a target("avx2") function is not inlined into the target-less template
// body; one call per row, the per-token groups of a row in one call).
__attribute__((LQ_AVX2_TARGET, noinline)) void enc_row_avx2(const float* x, int64_t n, const float* s, const float* o,
                                                            float s0, float o0, bool sym, bool cols, int bits, uint8_t* u) {
  if (sym) cols ? enc_avx2<true, true>(x, n, s, o, s0, o0, bits, u) : enc_avx2<true, false>(x, n, s, o, s0, o0, bits, u);
  else cols ? enc_avx2<false, true>(x, n, s, o, s0, o0, bits, u) : enc_avx2<false, false>(x, n, s, o, s0, o0, bits, u);
}
// Row x[D] in nt groups of g columns (the last one up to D), group j with (sc[j], of[j]).
__attribute__((LQ_AVX2_TARGET, noinline)) void enc_groups_avx2(const float* x, int64_t D, int64_t nt, int64_t g,
                                                               const float* sc, const float* of, bool sym, int bits,
                                                               uint8_t* u) {
  for (int64_t j = 0; j < nt; ++j) {
    const int64_t d0 = j * g, n = std::min(D, d0 + g) - d0;
    if (sym) enc_avx2<true, false>(x + d0, n, nullptr, nullptr, sc[j], of[j], bits, u + d0);
    else enc_avx2<false, false>(x + d0, n, nullptr, nullptr, sc[j], of[j], bits, u + d0);
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
LQ_AVX2_AI __m256 minmax8_avx2(__m256 p, __m256 q) { return Min ? _mm256_min_ps(p, q) : _mm256_max_ps(p, q); }
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
#endif

LQ_AI void dec_uniform(const uint8_t* __restrict u, int64_t n, float s, float o, bool sym, int bits, float* __restrict out) {
  if (sym)
    for (int64_t i = 0; i < n; ++i) out[i] = q::decode_sym(u[i], s, bits);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = q::decode_asym(u[i], s, o);
}

LQ_AI void dec_columns(const uint8_t* __restrict u, int64_t n, const float* __restrict s, const float* __restrict o, bool sym,
                       int bits, float* __restrict out) {
  if (sym)
    for (int64_t i = 0; i < n; ++i) out[i] = q::decode_sym(u[i], s[i], bits);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = q::decode_asym(u[i], s[i], o[i]);
}

}  // namespace

// What one call of the fused integer kernel does: rows (tensor, token) or token groups (channel)
// [begin, end) of an already laid-out QuantizedTensor.
struct IntJob {
  QuantizedTensor* qt;
  const float* X;
  int64_t begin, end;
  float tensor_scale, tensor_offset;  // per-tensor: the stored parameters
  bool stream;                        // write the codes with non-temporal stores (kStreamMinBytes)
};

namespace {

// Stored (scale, offset) of n groups from their statistics, as group_params computes them one by one
// (sym_params / asym_params of qmath.h, element by element in a vectorizable loop), written into
// qt.scales / qt.offsets at [g0, g0 + n). If any stored value is not finite, group_params is called
// group by group instead: it throws the reference's message for the first such group.
template <bool Avx2>
LQ_AI void put_groups(QuantizedTensor& qt, const float* __restrict mn, const float* __restrict mx, int64_t n, int64_t g0,
                      float* __restrict sc, float* __restrict of) {
  const QuantSpec& spec = qt.spec;
  const bool sym = spec.scheme == Scheme::Sym;
  if (sym) {
    const float qs = static_cast<float>(q::sym_qmax(spec.bits));
    for (int64_t i = 0; i < n; ++i) {
      sc[i] = q::div_rn(q::max_num(q::abs_f(mn[i]), q::abs_f(mx[i])), qs);
      of[i] = 0.0f;
    }
  } else {
    const float qs = static_cast<float>(q::asym_qmax(spec.bits));
    for (int64_t i = 0; i < n; ++i) {
      sc[i] = q::div_rn(q::sub_rn(mx[i], mn[i]), qs);
      of[i] = mn[i];
    }
  }
  // fp16 storage: each value converted once (f32_to_f16_bits, stored as is) and read back exactly
  // (f16_bits_to_f32): round_to_dtype's value, one conversion instead of three per stored value. A value
  // stored here before the finiteness check is harmless: the caller throws and the tensor is dropped.
  static_assert(std::endian::native == std::endian::little, "store_dtype writes little-endian bytes");
#if LQ_X86_KERNELS
  if (Avx2 && spec.scale_dtype == ScaleDtype::F16) {  // the same bits in vcvtps2ph (f16_round_store_avx2)
    f16_round_store_avx2(sc, n, qt.scales.data() + 2 * g0);
    if (!sym) f16_round_store_avx2(of, n, qt.offsets.data() + 2 * g0);
  } else
#endif
  if (spec.scale_dtype == ScaleDtype::F16) {
    uint8_t* ds = qt.scales.data() + 2 * g0;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = q::f32_to_f16_bits(sc[i]);
      std::memcpy(ds + 2 * i, &h, 2);
      sc[i] = q::f16_bits_to_f32(h);
    }
    if (!sym) {
      uint8_t* dof = qt.offsets.data() + 2 * g0;
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = q::f32_to_f16_bits(of[i]);
        std::memcpy(dof + 2 * i, &h, 2);
        of[i] = q::f16_bits_to_f32(h);
      }
    }
  }
  uint32_t nf = 0;
  for (int64_t i = 0; i < n; ++i) nf |= nonfinite_bit(sc[i]) | nonfinite_bit(of[i]);
  if (nf) {
    for (int64_t i = 0; i < n; ++i) (void)group_params(qt, mn[i], mx[i], g0 + i);  // throws for the first bad group
    assert(false && "put_groups: group_params accepted a non-finite parameter");
  }
  if (spec.scale_dtype != ScaleDtype::F16) {
    std::memcpy(qt.scales.data() + 4 * g0, sc, static_cast<size_t>(4 * n));
    if (!sym) std::memcpy(qt.offsets.data() + 4 * g0, of, static_cast<size_t>(4 * n));
  }
}

// Quantize the job's range; returns 1 if a NaN/Inf was seen (the caller throws).
template <bool Avx2>
LQ_AI uint32_t int_quantize_body(const IntJob& job) {
  QuantizedTensor& qt = *job.qt;
  const QuantSpec& spec = qt.spec;
  const bool sym = spec.scheme == Scheme::Sym;
  const int bits = spec.bits;
  const int64_t D = qt.cols, rb = qt.row_bytes();
  const float* X = job.X;
  uint8_t* codes = qt.codes.data();
  uint32_t bad = 0;
  std::vector<uint8_t> u(static_cast<size_t>(D)), packed(static_cast<size_t>(job.stream ? rb : 0));
  auto put_row = [&](int64_t t) {  // the row's codes u[D] packed into codes row t
    if (!job.stream) return pack_row(u.data(), D, bits, codes + t * rb);
    pack_row(u.data(), D, bits, packed.data());
    copy_stream(codes + t * rb, packed.data(), rb);
  };
  switch (spec.granularity) {
    case Granularity::Tensor:
      for (int64_t t = job.begin; t < job.end; ++t) {
#if LQ_X86_KERNELS
        if constexpr (Avx2) enc_row_avx2(X + t * D, D, nullptr, nullptr, job.tensor_scale, job.tensor_offset, sym, false, bits, u.data());
        else
#endif
          enc_uniform(X + t * D, D, job.tensor_scale, job.tensor_offset, sym, bits, u.data());
        put_row(t);
      }
      break;
    case Granularity::Channel: {
      std::vector<float> mn(static_cast<size_t>(D)), mx(static_cast<size_t>(D)), sc(static_cast<size_t>(D)),
          of(static_cast<size_t>(D), 0.0f);
      for (int64_t g = job.begin; g < job.end; ++g) {
        const int64_t t0 = qt.group_bounds[static_cast<size_t>(g)], t1 = qt.group_bounds[static_cast<size_t>(g) + 1];
        bad |= minmax_cols(X, t0, t1, D, mn.data(), mx.data());
        if (bad) return bad;
        put_groups<Avx2>(qt, mn.data(), mx.data(), D, g * D, sc.data(), of.data());
        for (int64_t t = t0; t < t1; ++t) {
#if LQ_X86_KERNELS
          if constexpr (Avx2) enc_row_avx2(X + t * D, D, sc.data(), of.data(), 0.0f, 0.0f, sym, true, bits, u.data());
          else
#endif
            enc_columns(X + t * D, D, sc.data(), of.data(), sym, bits, u.data());
          put_row(t);
        }
      }
      break;
    }
    case Granularity::Token: {
      const int64_t nt = qt.scales_per_row(), g = qt.row_group();
      std::vector<float> mn(static_cast<size_t>(nt)), mx(static_cast<size_t>(nt)), sc(static_cast<size_t>(nt)),
          of(static_cast<size_t>(nt));
      for (int64_t t = job.begin; t < job.end; ++t) {
        const float* x = X + t * D;
#if LQ_X86_KERNELS
        if constexpr (Avx2) bad |= group_minmax_avx2(x, D, nt, g, mn.data(), mx.data());
        else
#endif
          for (int64_t j = 0; j < nt; ++j) {
            const int64_t d0 = j * g, d1 = std::min(D, d0 + g);
            bad |= minmax_span(x + d0, d1 - d0, mn[static_cast<size_t>(j)], mx[static_cast<size_t>(j)]);
          }
        if (bad) return bad;
        put_groups<Avx2>(qt, mn.data(), mx.data(), nt, t * nt, sc.data(), of.data());
#if LQ_X86_KERNELS
        if constexpr (Avx2) enc_groups_avx2(x, D, nt, g, sc.data(), of.data(), sym, bits, u.data());
        else
#endif
          for (int64_t j = 0; j < nt; ++j) {
            const int64_t d0 = j * g, d1 = std::min(D, d0 + g);
            enc_uniform(x + d0, d1 - d0, sc[static_cast<size_t>(j)], of[static_cast<size_t>(j)], sym, bits, u.data() + d0);
          }
        put_row(t);
      }
      break;
    }
  }
  if (job.stream) stream_fence();
  return bad;
}

struct DecJob {
  const QuantizedTensor* qt;
  float* out;
  int64_t begin, end;  // rows (tensor, token) or token groups (channel)
};

LQ_AI void int_dequantize_body(const DecJob& job) {
  const QuantizedTensor& qt = *job.qt;
  const bool sym = qt.spec.scheme == Scheme::Sym;
  const int bits = qt.spec.bits;
  const int64_t D = qt.cols, rb = qt.row_bytes();
  std::vector<uint8_t> u(static_cast<size_t>(D));
  switch (qt.spec.granularity) {
    case Granularity::Tensor: {
      const float s = qt.scale_at(0), o = sym ? 0.0f : qt.offset_at(0);
      for (int64_t t = job.begin; t < job.end; ++t) {
        unpack_row(qt.codes.data() + t * rb, D, bits, u.data());
        dec_uniform(u.data(), D, s, o, sym, bits, job.out + t * D);
      }
      return;
    }
    case Granularity::Channel: {
      std::vector<float> sc(static_cast<size_t>(D)), of(static_cast<size_t>(D), 0.0f);
      for (int64_t g = job.begin; g < job.end; ++g) {
        for (int64_t d = 0; d < D; ++d) {
          sc[static_cast<size_t>(d)] = qt.scale_at(g * D + d);
          if (!sym) of[static_cast<size_t>(d)] = qt.offset_at(g * D + d);
        }
        for (int64_t t = qt.group_bounds[static_cast<size_t>(g)]; t < qt.group_bounds[static_cast<size_t>(g) + 1]; ++t) {
          unpack_row(qt.codes.data() + t * rb, D, bits, u.data());
          dec_columns(u.data(), D, sc.data(), of.data(), sym, bits, job.out + t * D);
        }
      }
      return;
    }
    case Granularity::Token: {
      const int64_t nt = qt.scales_per_row(), g = qt.row_group();
      for (int64_t t = job.begin; t < job.end; ++t) {
        unpack_row(qt.codes.data() + t * rb, D, bits, u.data());
        for (int64_t j = 0; j < nt; ++j) {
          const int64_t d0 = j * g, d1 = std::min(D, d0 + g);
          dec_uniform(u.data() + d0, d1 - d0, qt.scale_at(t * nt + j), sym ? 0.0f : qt.offset_at(t * nt + j), sym, bits,
                      job.out + t * D + d0);
        }
      }
      return;
    }
  }
}

uint32_t int_quantize_baseline(const IntJob& job) { return int_quantize_body<false>(job); }
void int_dequantize_baseline(const DecJob& job) { int_dequantize_body(job); }
uint32_t minmax_span_baseline(const float* x, int64_t n, float& mn, float& mx) { return minmax_span(x, n, mn, mx); }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LQ_HAVE_AVX2_KERNEL 1
__attribute__((LQ_AVX2_TARGET)) uint32_t int_quantize_avx2(const IntJob& job) { return int_quantize_body<true>(job); }
__attribute__((LQ_AVX2_TARGET)) void int_dequantize_avx2(const DecJob& job);
__attribute__((LQ_AVX2_TARGET)) uint32_t minmax_span_avx2(const float* x, int64_t n, float& mn, float& mx) {
  return minmax_span(x, n, mn, mx);
}
#else
#define LQ_HAVE_AVX2_KERNEL 0
#endif

#if LQ_HAVE_AVX2_KERNEL
// ---- the AVX2 dequantize (CpuKernel::Avx2) ---------------------------------------------------------
// Codes go straight from the packed row to eight int32 lanes (INT8: vpmovzxbd; INT4/INT2: the row's 32
// or 16 bits at code i broadcast and shifted per lane by vpsrlvd), then qmath.h's decode in vector
// form: decode_sym = mul_rn(scale, float(u − 2^(b−1))), decode_asym = add_rn(offset, mul_rn(scale,
// float(u))): vcvtdq2ps is exact for these integers, vmulps / vaddps round once each (no FMA: the
// target is "avx2" without "fma", and -ffp-contract=off), so every float is the reference's.

// 64 bits of a packed row of nb bytes from byte k, little-endian; bytes past the row read as 0.
LQ_AI uint64_t load_le64(const uint8_t* row, int64_t k, int64_t nb) {
  uint64_t w = 0;
  if (k + 8 <= nb) std::memcpy(&w, row + k, 8);
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
    const __m256i sh = Bits == 4 ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28) : _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), sh), _mm256_set1_epi32((1 << Bits) - 1));
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
    if constexpr (Sym) r = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_sub_epi32(c, bias)));
    else r = _mm256_add_ps(Cols ? _mm256_loadu_ps(of + i) : vo, _mm256_mul_ps(s, _mm256_cvtepi32_ps(c)));
    if constexpr (NT) _mm256_stream_ps(o + i, r);
    else _mm256_storeu_ps(o + i, r);
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
    if constexpr (Sym) _mm256_storeu_ps(o + i, _mm256_mul_ps(vs, _mm256_cvtepi32_ps(_mm256_sub_epi32(c, bias))));
    else _mm256_storeu_ps(o + i, _mm256_add_ps(vo, _mm256_mul_ps(vs, _mm256_cvtepi32_ps(c))));
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
      case ScaleDtype::F32: return (void)std::memcpy(dst, src.data() + 4 * i0, static_cast<size_t>(4 * n));
      case ScaleDtype::F16: return f16_load_avx2(src.data() + 2 * i0, n, dst);
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
      std::vector<float> buf(static_cast<size_t>(NT ? D : 0)), rs(static_cast<size_t>(nt)), ro(static_cast<size_t>(nt), 0.0f);
      for (int64_t t = job.begin; t < job.end; ++t) {
        float* o = NT ? buf.data() : job.out + t * D;
        load_params(qt.scales, t * nt, nt, rs.data());
        if (!Sym) load_params(qt.offsets, t * nt, nt, ro.data());
        for (int64_t j = 0; j < nt; ++j) {
          const int64_t d0 = j * g, d1 = std::min(D, d0 + g);
          dec_span_avx2<Bits, Sym>(codes + t * rb, d0, d1, rb, rs[static_cast<size_t>(j)], ro[static_cast<size_t>(j)], o);
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
  if (nt) int_dequantize_avx2_t<Bits, Sym, true>(job);
  else int_dequantize_avx2_t<Bits, Sym, false>(job);
}

__attribute__((LQ_AVX2_TARGET)) void int_dequantize_avx2(const DecJob& job) {
  const QuantizedTensor& qt = *job.qt;
  const bool nt = qt.rows * qt.cols * 4 >= g_stream_min.load() && (reinterpret_cast<uintptr_t>(job.out) & 3) == 0;
  const bool sym = qt.spec.scheme == Scheme::Sym;
  switch (qt.spec.bits) {
    case 8: return sym ? int_dequantize_avx2_nt<8, true>(job, nt) : int_dequantize_avx2_nt<8, false>(job, nt);
    case 4: return sym ? int_dequantize_avx2_nt<4, true>(job, nt) : int_dequantize_avx2_nt<4, false>(job, nt);
    default: return sym ? int_dequantize_avx2_nt<2, true>(job, nt) : int_dequantize_avx2_nt<2, false>(job, nt);
  }
}
#endif

#if LQ_HAVE_AVX2_KERNEL
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
      _mm256_add_epi32(u, _mm256_set1_epi32(static_cast<int>((static_cast<uint32_t>(B - 127) << 23) + ((1u << (S - 1)) - 1u)))),
      odd);
  const __m256i c_norm = _mm256_min_epu32(_mm256_srli_epi32(biased, S), _mm256_set1_epi32(static_cast<int>(MAXC)));
  __m256i c = _mm256_blendv_epi8(c_norm, c_sub, sub);
  c = _mm256_blendv_epi8(c, _mm256_set1_epi32(static_cast<int>(MAXC)), _mm256_castps_si256(sat));
  return _mm256_or_si256(c, _mm256_srli_epi32(_mm256_and_si256(ui, _mm256_set1_epi32(static_cast<int>(0x80000000u))), 31 - SIGN));
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
    const __m256i b =
        _mm256_packus_epi16(_mm256_packus_epi32(e4m3_scaled_avx2<Mul>(x + i, vk), e4m3_scaled_avx2<Mul>(x + i + 8, vk)),
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

__attribute__((LQ_AVX2_TARGET, noinline)) void encode_e4m3_avx2(const float* x, int64_t n, bool mul, float k,
                                                                uint8_t* codes) {
  if (mul) encode_e4m3_avx2_t<true>(x, n, k, codes);
  else encode_e4m3_avx2_t<false>(x, n, k, codes);
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

__attribute__((LQ_AVX2_TARGET, noinline)) void encode_e2m1_avx2(const q::BlockDesc& f, const q::BlockParams& p,
                                                                const float* x, int n, uint8_t* codes) {
  if (f.kind == q::BlockKind::NvFp4 && p.zero) {  // an all-zero NVFP4 tensor: every code is 0 (scaled_element)
    std::memset(codes, 0, static_cast<size_t>(q::block_code_bytes(n, 4)));
    return;
  }
  // scaled_element: MXFP4 v · inv (scales_by_inverse), NVFP4 v · s, Fp4Tile v / s
  if (f.kind == q::BlockKind::NvFp4) encode_e2m1_avx2_t<true>(f, p, x, n, p.s, codes);
  else if (q::scales_by_inverse(f.kind)) encode_e2m1_avx2_t<true>(f, p, x, n, p.inv, codes);
  else encode_e2m1_avx2_t<false>(f, p, x, n, p.s, codes);
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
    const __m256 up = _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5f), _CMP_GE_OQ), _mm256_set1_ps(1.0f));
    __m256 r = _mm256_or_ps(_mm256_add_ps(t, up), sign);
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvttps_epi32(r);
  } else {
    const __m256 y = K == q::BlockKind::Q4_0 ? _mm256_add_ps(_mm256_mul_ps(v, id), _mm256_set1_ps(8.5f))
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
    const __m256i b0 = _mm256_or_si256(c0, _mm256_slli_epi32(c2, 4)), b1 = _mm256_or_si256(c1, _mm256_slli_epi32(c3, 4));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), _mm_packus_epi16(narrow16_avx2(b0), narrow16_avx2(b1)));
  }
}

// encode_block_bytes of a ggml block: whole blocks of 32 in vectors, anything else by the scalar code.
__attribute__((LQ_AVX2_TARGET, noinline)) void encode_ggml_avx2(const q::BlockDesc& f, const q::BlockParams& p,
                                                                const float* x, int n, uint8_t* codes) {
  if (n != 32) {
    q::encode_block_bytes(f, p, x, n, 0, q::block_code_bytes(n, f.code_bits), codes);
    return;
  }
  switch (f.kind) {
    case q::BlockKind::Q8_0: return encode_ggml32_avx2_t<q::BlockKind::Q8_0>(p, x, codes);
    case q::BlockKind::Q4_0: return encode_ggml32_avx2_t<q::BlockKind::Q4_0>(p, x, codes);
    default: return encode_ggml32_avx2_t<q::BlockKind::Q4_1>(p, x, codes);
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
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_max_epu32(_mm256_max_epu32(a0, a1), _mm256_max_epu32(a2, a3)));
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
#endif

// The blocks of rows [t0, t1) of a block format in storage order: fn(t, d0, n, gi) for block j of row t, which
// covers columns [d0, d0 + n) and is scale group gi = t · blocks_per_row + j (quantize and dequantize).
template <class Fn>
void for_each_block(const Layout& L, int64_t D, int64_t t0, int64_t t1, Fn&& fn) {
  const int64_t nb = L.blocks_per_row > 0 ? L.blocks_per_row : 1, blk = L.desc.block;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t d0 = j * blk;
      fn(t, d0, std::min(D, d0 + blk) - d0, t * nb + j);
    }
}

// Which AVX2 element path a block format takes under `kernel` (none outside Avx2 and for the ggml kinds).
struct BlockPath {
  bool e4m3 = false, e2m1 = false, ggml = false;
};
BlockPath block_path([[maybe_unused]] CpuKernel kernel, [[maybe_unused]] const q::BlockDesc& f) {
  BlockPath b;
#if LQ_HAVE_AVX2_KERNEL
  b.e4m3 = kernel == CpuKernel::Avx2 && e4m3_elements(f);
  b.e2m1 = kernel == CpuKernel::Avx2 && e2m1_elements(f);
  b.ggml = kernel == CpuKernel::Avx2 && ggml_elements(f);
#endif
  return b;
}

std::atomic<int> g_kernel{static_cast<int>(CpuKernel::Auto)};
std::atomic<int> g_threads{1};

bool cpu_has_avx2() {
#if LQ_HAVE_AVX2_KERNEL
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

// Runs fn(begin, end) over [0, n) split into `threads` contiguous ranges (the calling thread takes the
// first); rethrows the exception of the lowest range that threw (the first error in row order).
template <class Fn>
void split_ranges(int64_t n, int threads, Fn&& fn) {
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  if (threads == 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::exception_ptr> err(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  auto run = [&](int i) {
    try {
      fn(n * i / threads, n * (i + 1) / threads);
    } catch (...) {
      err[static_cast<size_t>(i)] = std::current_exception();
    }
  };
  for (int i = 1; i < threads; ++i) pool.emplace_back(run, i);
  run(0);
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : err)
    if (e) std::rethrow_exception(e);
}

constexpr int64_t kThreadMinElems = int64_t{1} << 20;

// The fused integer quantize (CpuKernel Baseline / Avx2).
// Into qt (quantize(): a new tensor; quantize_into(): a reused one). The kernels write every byte of
// codes, scales and offsets, so a buffer that already has the needed size is neither reallocated nor
// zero-filled (no page faults, no extra pass over memory).
void quantize_int_fast(QuantizedTensor& qt, const QuantSpec& spec_in, Target target, const float* X, int64_t T, int64_t D,
                       std::span<const int64_t> seq_offsets, CpuKernel kernel) {
  auto sized = [](std::vector<uint8_t>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) != n) assign_zeroed(v, static_cast<size_t>(n));
  };
  uint32_t bad = 0;
  try {
    validate_spec_fields(spec_in);
    validate_seq_offsets(seq_offsets, T);
    qt.spec = spec_in.stored_for(target);
    const QuantSpec& spec = qt.spec;
    (void)latentq::layout(spec, D);
    qt.rows = T;
    qt.cols = D;
    qt.group_bounds.clear();
    qt.global.clear();
    if (spec.scheme == Scheme::Sym) qt.offsets.clear();
    sized(qt.codes, T * qt.row_bytes());
    const bool asym = spec.scheme == Scheme::Asym;
    const int64_t sb = q::scale_dtype_bytes(spec.scale_dtype);
    IntJob job{&qt, X, 0, 0, 0.0f, 0.0f, T * qt.row_bytes() >= g_stream_min.load()};
    int64_t n = T;
    const int threads = T * D >= kThreadMinElems ? g_threads.load() : 1;
    switch (spec.granularity) {
      case Granularity::Tensor: {
        std::vector<float> mns(static_cast<size_t>(threads)), mxs(static_cast<size_t>(threads));
        std::vector<uint32_t> bads(static_cast<size_t>(threads), 0);
        std::vector<int64_t> starts(static_cast<size_t>(threads));
        // statistics of contiguous element ranges, then the reference's fold over the range results in order
        split_ranges(threads, threads, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t e0 = T * D * i / threads, e1 = T * D * (i + 1) / threads;
            starts[static_cast<size_t>(i)] = e0;
            float* mn_i = &mns[static_cast<size_t>(i)];
            float* mx_i = &mxs[static_cast<size_t>(i)];
#if LQ_HAVE_AVX2_KERNEL
            if (kernel == CpuKernel::Avx2) {
              bads[static_cast<size_t>(i)] = e1 > e0 ? minmax_span_avx2(X + e0, e1 - e0, *mn_i, *mx_i) : 0;
              continue;
            }
#endif
            bads[static_cast<size_t>(i)] = e1 > e0 ? minmax_span_baseline(X + e0, e1 - e0, *mn_i, *mx_i) : 0;
            if (e1 == e0) mns[static_cast<size_t>(i)] = mxs[static_cast<size_t>(i)] = X[0];
          }
        });
        float mn = X[0], mx = X[0];
        for (int i = 0; i < threads; ++i) {
          bad |= bads[static_cast<size_t>(i)];
          mn = q::min_num(mn, mns[static_cast<size_t>(i)]);  // the first zero wins ties, as in one fold
          mx = q::max_num(mx, mxs[static_cast<size_t>(i)]);
        }
        if (bad) break;
        const q::ScaleOffset p = store_tensor_params(qt, mn, mx);
        job.tensor_scale = p.scale;
        job.tensor_offset = p.offset;
        break;
      }
      case Granularity::Channel: {
        qt.group_bounds = channel_groups(seq_offsets, T, spec.group_size);
        n = static_cast<int64_t>(qt.group_bounds.size()) - 1;
        sized(qt.scales, n * D * sb);
        if (asym) sized(qt.offsets, n * D * sb);
        break;
      }
      case Granularity::Token: {
        const int64_t nt = qt.scales_per_row();
        sized(qt.scales, T * nt * sb);
        if (asym) sized(qt.offsets, T * nt * sb);
        break;
      }
    }
    if (!bad) {
      std::atomic<uint32_t> any_bad{0};
      split_ranges(n, threads, [&](int64_t b, int64_t e) {
        IntJob j = job;
        j.begin = b;
        j.end = e;
#if LQ_HAVE_AVX2_KERNEL
        const uint32_t r = kernel == CpuKernel::Avx2 ? int_quantize_avx2(j) : int_quantize_baseline(j);
#else
        const uint32_t r = int_quantize_baseline(j);
#endif
        any_bad.fetch_or(r);
      });
      bad |= any_bad.load();
    }
  } catch (...) {
    // the reference checks NaN/Inf before anything else: the same input gives the same error
    if (const int64_t c = count_nonfinite(X, T * D)) throw std::invalid_argument(nonfinite_message(c, T, D));
    throw;
  }
  if (bad) throw std::invalid_argument(nonfinite_message(count_nonfinite(X, T * D), T, D));
}

}  // namespace

void set_cpu_kernel(CpuKernel k) {
  if (k == CpuKernel::Avx2 && !cpu_has_avx2())
    throw std::invalid_argument("set_cpu_kernel: this CPU or build has no AVX2 kernel");
  g_kernel.store(static_cast<int>(k));
}
CpuKernel active_cpu_kernel() {
  const auto k = static_cast<CpuKernel>(g_kernel.load());
  if (k != CpuKernel::Auto) return k;
  return cpu_has_avx2() ? CpuKernel::Avx2 : CpuKernel::Baseline;
}
std::vector<CpuKernel> available_cpu_kernels() {
  std::vector<CpuKernel> k{CpuKernel::Reference, CpuKernel::Baseline};
  if (cpu_has_avx2()) k.push_back(CpuKernel::Avx2);
  return k;
}
ScopedCpuKernel::ScopedCpuKernel(CpuKernel k) : previous_(g_kernel.load()) { set_cpu_kernel(k); }
ScopedCpuKernel::~ScopedCpuKernel() { g_kernel.store(previous_); }
void set_cpu_threads(int n) { g_threads.store(std::max(1, n)); }
void set_cpu_stream_min_bytes(int64_t n) { g_stream_min.store(n < 0 ? kStreamMinBytes : n); }
int cpu_threads() { return g_threads.load(); }

int64_t QuantizedTensor::row_bytes() const {
  return spec.format == Format::BF16 ? 2 * cols : layout().row_code_bytes;
}
int64_t QuantizedTensor::row_group() const { return layout().block; }
int64_t QuantizedTensor::scales_per_row() const { return layout().blocks_per_row; }

float QuantizedTensor::scale_at(int64_t i) const { return get_scale(scales, i, spec.scale_dtype); }
float QuantizedTensor::offset_at(int64_t i) const { return get_scale(offsets, i, spec.scale_dtype); }
float QuantizedTensor::global_scale() const { return global.size() == 4 ? q::load_dtype(global.data(), ScaleDtype::F32) : 0.0f; }

void validate_seq_offsets(std::span<const int64_t> seq_offsets, int64_t T) {
  if (seq_offsets.size() < 2 || seq_offsets.front() != 0 || seq_offsets.back() != T)
    throw std::invalid_argument("seq_offsets must run from 0 to T = " + std::to_string(T) + " with at least one sequence, got " +
                                std::to_string(seq_offsets.size()) + " entries" +
                                (seq_offsets.empty() ? std::string()
                                                     : " from " + std::to_string(seq_offsets.front()) + " to " +
                                                           std::to_string(seq_offsets.back())));
  for (size_t s = 0; s + 1 < seq_offsets.size(); ++s)
    if (seq_offsets[s + 1] < seq_offsets[s])
      throw std::invalid_argument("seq_offsets must be non-decreasing (sequence " + std::to_string(s) + ": " +
                                  std::to_string(seq_offsets[s]) + " > " + std::to_string(seq_offsets[s + 1]) + ")");
}

std::vector<int64_t> channel_groups(std::span<const int64_t> seq_offsets, int64_t T, int64_t group_size) {
  validate_seq_offsets(seq_offsets, T);
  if (group_size < 0) throw std::invalid_argument("the group size must be >= 0, got " + std::to_string(group_size));
  std::vector<int64_t> b{0};
  for (size_t s = 0; s + 1 < seq_offsets.size(); ++s) {
    const int64_t s0 = seq_offsets[s], s1 = seq_offsets[s + 1];
    if (s1 == s0) continue;  // empty sequence: no group
    const int64_t g = group_size > 0 ? group_size : (s1 - s0);
    // t + g is formed only while s1 − t > g, so it stays below s1: no overflow for any g.
    for (int64_t t = s0; s1 - t > g;) {
      t += g;
      b.push_back(t);
    }
    b.push_back(s1);
  }
  return b;
}

std::string group_name(const QuantizedTensor& qt, int64_t gi) {
  const Layout L = qt.layout();
  if (L.channel && !qt.group_bounds.empty()) {
    const int64_t g = gi / qt.cols, d = gi % qt.cols;
    return "tokens [" + std::to_string(qt.group_bounds[static_cast<size_t>(g)]) + ", " +
           std::to_string(qt.group_bounds[static_cast<size_t>(g) + 1]) + "), dimension " + std::to_string(d);
  }
  if (L.blocks_per_row > 0) {
    const int64_t t = gi / L.blocks_per_row, d0 = (gi % L.blocks_per_row) * L.block;
    return "token " + std::to_string(t) + ", dimensions [" + std::to_string(d0) + ", " +
           std::to_string(std::min(qt.cols, d0 + L.block)) + ")";
  }
  return "the whole tensor";
}

int64_t count_nonfinite(const float* x, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += !q::is_finite(x[i]);
  return c;
}

void validate_spec_fields(const QuantSpec& spec) {
  const std::string what = "invalid quantizer spec fields (format " + std::to_string(static_cast<int>(spec.format)) +
                           ", bits " + std::to_string(spec.bits) + ", group_size " + std::to_string(spec.group_size) +
                           "): ";
  switch (spec.format) {
    case Format::Int:
      if (spec.bits != 2 && spec.bits != 4 && spec.bits != 8)
        throw std::invalid_argument(what + "integer specs need bits 2, 4 or 8; build specs with QuantSpec::parse");
      if (spec.group_size < 0) throw std::invalid_argument(what + "the group size must be >= 0");
      if (spec.scale_dtype != ScaleDtype::F16 && spec.scale_dtype != ScaleDtype::F32)
        throw std::invalid_argument(what + "integer scales are fp16 or fp32");
      return;
    case Format::Fp8Tile:
      if (spec.group_size <= 0) throw std::invalid_argument(what + "the fp8 tile width must be > 0");
      break;
    case Format::Preset:
      if (spec.preset >= std::size(kPresets)) throw std::invalid_argument(what + "unknown preset");
      break;
    default:
      if (static_cast<int>(spec.format) >= static_cast<int>(std::size(kFormats)))
        throw std::invalid_argument(what + "unknown format");
      break;
  }
  // every other family has no free fields: the spec must be exactly what parse() gives for its name
  if (QuantSpec::parse(spec.to_string()) != spec)
    throw std::invalid_argument(what + "fields that QuantSpec::parse never produces for '" + spec.to_string() + "'");
}

std::string nonfinite_message(int64_t count, int64_t T, int64_t D) {
  return std::to_string(count) + " NaN/Inf values in the [" + std::to_string(T) + ", " + std::to_string(D) + "] input";
}

std::string overflow_message(const QuantSpec& spec, const char* what, float raw, const std::string& where) {
  const bool value = std::string_view(what) == "value";
  const char* dtype = value ? (spec.format == Format::BF16 ? "bf16" : "decoded float32")
                            : spec.format == Format::Int ? to_string(spec.scale_dtype) : "fp16";
  const bool fixable = spec.format == Format::Int && spec.scale_dtype == ScaleDtype::F16;
  return std::string(what) + " " + std::to_string(raw) + " of " + where + " overflows the " + dtype + " storage of '" +
         spec.to_string() + "'" +
         (fixable ? "; use the -fp32 variant" : value && spec.format == Format::BF16 ? " (bf16 holds at most 3.3895e38)" : value ? "" : " (the input range exceeds what the format can store)");
}

QuantizedTensor quantize(const QuantSpec& spec_in, Target target, const float* X, int64_t T, int64_t D,
                         std::span<const int64_t> seq_offsets) {
  if (T <= 0 || D <= 0)
    throw std::invalid_argument("cannot quantize an empty matrix [" + std::to_string(T) + ", " + std::to_string(D) + "]");
  if (spec_in.format == Format::Int)
    if (const CpuKernel k = active_cpu_kernel(); k != CpuKernel::Reference) {
      QuantizedTensor qt;
      quantize_int_fast(qt, spec_in, target, X, T, D, seq_offsets, k);
      return qt;
    }
  // The Avx2 kernel checks NaN/Inf and takes max|x| in one pass (abs_bits_max_avx2); the count for the message
  // is made only when there is one.
  float amax_x = -1.0f;  // max|x| when that pass ran
#if LQ_HAVE_AVX2_KERNEL
  if (active_cpu_kernel() == CpuKernel::Avx2 && T * D > 0) {
    const uint32_t m = abs_bits_max_avx2(X, T * D);
    if (m >= 0x7f800000u) throw std::invalid_argument(nonfinite_message(count_nonfinite(X, T * D), T, D));
    amax_x = q::f32_from_bits(m);
  } else
#endif
  if (const int64_t bad = count_nonfinite(X, T * D)) throw std::invalid_argument(nonfinite_message(bad, T, D));
  validate_spec_fields(spec_in);
  validate_seq_offsets(seq_offsets, T);
  QuantizedTensor qt;
  qt.spec = spec_in.stored_for(target);
  const QuantSpec& spec = qt.spec;
  const Layout L = latentq::layout(spec, D);  // throws for rows a format cannot store
  qt.rows = T;
  qt.cols = D;
  const int64_t rb = qt.row_bytes();
  assign_zeroed(qt.codes, static_cast<size_t>(T * rb));

  if (spec.format == Format::BF16) {
    for (int64_t i = 0; i < T * D; ++i) {
      const uint16_t b = q::f32_to_bf16_bits(X[i]);
      if ((b & 0x7fffu) == 0x7f80u)  // a finite float32 beyond bf16's range rounds to ±inf
        throw std::invalid_argument(overflow_message(spec, "value", X[i],
                                                     "token " + std::to_string(i / D) + ", dimension " + std::to_string(i % D)));
      std::memcpy(qt.codes.data() + 2 * i, &b, 2);
    }
    return qt;
  }
  if (L.block_format) {
    // The fast kernels run the same block math on several threads (rows split; split_ranges rethrows the
    // first error in row order), the Avx2 kernel the 8-bit e4m3 elements and max|x| eight at a time.
    const CpuKernel kernel = active_cpu_kernel();
    // max|x| of the matrix: the per-tensor scale, and whether the decode must be checked for overflow
    float amax = 0.0f;
    if (amax_x >= 0.0f) amax = amax_x;
    else
      for (int64_t i = 0; i < T * D; ++i) amax = q::max_num(amax, q::abs_f(X[i]));
    float global = 0.0f;
    if (L.tensor_bytes > 0) {
      global = q::global_scale(L.desc.kind, amax, spec.rule == ScaleRule::Unit);
      qt.global.assign(4, 0);
      q::store_dtype(qt.global.data(), global, ScaleDtype::F32);
    }
    const int sb = L.scale_bytes;
    qt.scales.assign(static_cast<size_t>(L.blocks_per_row > 0 ? T * L.blocks_per_row * sb : 0), 0);
    if (L.offsets) qt.offsets.assign(qt.scales.size(), 0);
    const BlockPath path = block_path(kernel, L.desc);
    const auto rows = [&](int64_t t0, int64_t t1) {
      for_each_block(L, D, t0, t1, [&](int64_t t, int64_t d0, int64_t n, int64_t gi) {
        const float* x = X + t * D + d0;
        uint8_t* codes = qt.codes.data() + t * rb + d0 * L.code_bits / 8;
        uint8_t* sc = sb ? qt.scales.data() + gi * sb : nullptr;
        uint8_t* of = L.offsets ? qt.offsets.data() + gi * sb : nullptr;
        q::BlockStatus st;
#if LQ_HAVE_AVX2_KERNEL
        if (path.ggml) {  // quantize_block = block_params (its own statistics, in element order), then the codes
          const q::BlockParams p = q::block_params(L.desc, x, static_cast<int>(n), global, sc, of, st);
          encode_ggml_avx2(L.desc, p, x, static_cast<int>(n), codes);
        } else if (path.e2m1) {  // quantize_block = block_params, then encode_block_bytes (scaled_element, e2m1)
          const q::BlockParams p = q::block_params_amax(L.desc, q::f32_from_bits(abs_bits_max_avx2(x, n)), x,
                                                        static_cast<int>(n), global, sc, of, st);
          encode_e2m1_avx2(L.desc, p, x, static_cast<int>(n), codes);
        } else if (path.e4m3) {  // quantize_block = block_params, then encode_block_bytes (scaled_element, e4m3)
          // Fp8Tensor's parameters are the per-tensor scale alone (p.s = global), and p.amax is not read here:
          // its rows skip the block's max|x|.
          const float block_amax =
              L.desc.kind == q::BlockKind::Fp8Tensor ? 0.0f : q::f32_from_bits(abs_bits_max_avx2(x, n));
          const q::BlockParams p =
              q::block_params_amax(L.desc, block_amax, x, static_cast<int>(n), global, sc, of, st);
          const bool inv = q::scales_by_inverse(L.desc.kind);
          encode_e4m3_avx2(x, n, inv, inv ? p.inv : p.s, codes);
        } else
#endif
          st = q::quantize_block(L.desc, x, static_cast<int>(n), global, codes, sc, of);
        if (st.overflow)
          throw std::invalid_argument(overflow_message(spec, st.overflow_offset ? "offset" : "scale", st.raw, group_name(qt, gi)));
      });
    };
    split_ranges(T, kernel != CpuKernel::Reference && T * D >= kThreadMinElems ? g_threads.load() : 1, rows);
    if (amax >= kDecodeCheckAmax) check_decodable(qt, X);
    return qt;
  }

  // ---- integer formats ----
  const bool sym = spec.scheme == Scheme::Sym;
  const bool asym = !sym;
  const int bits = spec.bits;
  const int64_t sb = q::scale_dtype_bytes(spec.scale_dtype);
  std::vector<uint8_t> u(static_cast<size_t>(D));
  // codes of x[0, n) into u[0, n): one (scale, offset) for the span (step 0) or one per element (step 1)
  auto encode = [&](const float* x, int64_t n, const float* sc, const float* of, int step, uint8_t* uo) {
    if (step == 0) {
      if (sym) encode_span<true, 0>(x, n, sc, of, bits, uo);
      else encode_span<false, 0>(x, n, sc, of, bits, uo);
    } else {
      if (sym) encode_span<true, 1>(x, n, sc, of, bits, uo);
      else encode_span<false, 1>(x, n, sc, of, bits, uo);
    }
  };
  auto encode_row = [&](const float* x, const float* sc, const float* of, int step, uint8_t* out) {
    encode(x, D, sc, of, step, u.data());
    pack_row(u.data(), D, bits, out);
  };

  switch (spec.granularity) {
    case Granularity::Tensor: {
      float mn = X[0], mx = X[0];
      for (int64_t i = 0; i < T * D; ++i) {
        mn = q::min_num(mn, X[i]);
        mx = q::max_num(mx, X[i]);
      }
      const q::ScaleOffset p = store_tensor_params(qt, mn, mx);
      for (int64_t t = 0; t < T; ++t) encode_row(X + t * D, &p.scale, &p.offset, 0, qt.codes.data() + t * rb);
      return qt;
    }
    case Granularity::Channel: {
      qt.group_bounds = channel_groups(seq_offsets, T, spec.group_size);
      const int64_t G = static_cast<int64_t>(qt.group_bounds.size()) - 1;
      qt.scales.assign(static_cast<size_t>(G * D * sb), 0);
      if (asym) qt.offsets.assign(static_cast<size_t>(G * D * sb), 0);
      std::vector<float> mn(static_cast<size_t>(D)), mx(static_cast<size_t>(D)), sc(static_cast<size_t>(D)),
          of(static_cast<size_t>(D));
      for (int64_t g = 0; g < G; ++g) {
        const int64_t t0 = qt.group_bounds[g], t1 = qt.group_bounds[g + 1];
        std::copy(X + t0 * D, X + t0 * D + D, mn.begin());
        std::copy(X + t0 * D, X + t0 * D + D, mx.begin());
        for (int64_t t = t0 + 1; t < t1; ++t) {
          const float* x = X + t * D;
          for (int64_t d = 0; d < D; ++d) {
            mn[d] = q::min_num(mn[d], x[d]);
            mx[d] = q::max_num(mx[d], x[d]);
          }
        }
        for (int64_t d = 0; d < D; ++d) {
          const q::ScaleOffset p = group_params(qt, mn[d], mx[d], g * D + d);
          sc[d] = p.scale;
          of[d] = p.offset;
          put_scale(qt.scales, g * D + d, p.scale, spec.scale_dtype);
          if (asym) put_scale(qt.offsets, g * D + d, p.offset, spec.scale_dtype);
        }
        for (int64_t t = t0; t < t1; ++t) encode_row(X + t * D, sc.data(), of.data(), 1, qt.codes.data() + t * rb);
      }
      return qt;
    }
    case Granularity::Token: {
      const int64_t nt = qt.scales_per_row(), g = qt.row_group();
      qt.scales.assign(static_cast<size_t>(T * nt * sb), 0);
      if (asym) qt.offsets.assign(static_cast<size_t>(T * nt * sb), 0);
      for (int64_t t = 0; t < T; ++t) {
        const float* x = X + t * D;
        for (int64_t j = 0; j < nt; ++j) {
          const int64_t d0 = j * g, d1 = std::min(D, d0 + g);
          float mn = x[d0], mx = x[d0];
          for (int64_t d = d0; d < d1; ++d) {
            mn = q::min_num(mn, x[d]);
            mx = q::max_num(mx, x[d]);
          }
          const q::ScaleOffset p = group_params(qt, mn, mx, t * nt + j);
          put_scale(qt.scales, t * nt + j, p.scale, spec.scale_dtype);
          if (asym) put_scale(qt.offsets, t * nt + j, p.offset, spec.scale_dtype);
          encode(x + d0, d1 - d0, &p.scale, &p.offset, 0, u.data() + d0);  // the group's codes
        }
        pack_row(u.data(), D, bits, qt.codes.data() + t * rb);
      }
      return qt;
    }
  }
  assert(false && "unreachable granularity");
  return qt;
}

void quantize_into(QuantizedTensor& qt, const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                   std::span<const int64_t> seq_offsets) {
  try {
    const CpuKernel k = active_cpu_kernel();
    if (spec.format != Format::Int || k == CpuKernel::Reference || T <= 0 || D <= 0) {
      qt = quantize(spec, target, X, T, D, seq_offsets);
      return;
    }
    quantize_int_fast(qt, spec, target, X, T, D, seq_offsets, k);
  } catch (...) {
    qt = QuantizedTensor{};
    throw;
  }
}

void dequantize(const QuantizedTensor& qt, float* out) {
  const QuantSpec& spec = qt.spec;
  const int64_t T = qt.rows, D = qt.cols, rb = qt.row_bytes();
  assert(static_cast<int64_t>(qt.codes.size()) == T * rb);
  if (spec.format == Format::BF16) {
    for (int64_t i = 0; i < T * D; ++i) {
      uint16_t b;
      std::memcpy(&b, qt.codes.data() + 2 * i, 2);
      out[i] = q::bf16_bits_to_f32(b);
    }
    return;
  }
  const Layout L = qt.layout();
  if (L.block_format) {
    const int sb = L.scale_bytes;
    const float global = qt.global_scale();
    const CpuKernel kernel = active_cpu_kernel();
    const BlockPath path = block_path(kernel, L.desc);
    const auto rows = [&](int64_t t0, int64_t t1) {
      for_each_block(L, D, t0, t1, [&](int64_t t, int64_t d0, int64_t n, int64_t gi) {
        const uint8_t* codes = qt.codes.data() + t * rb + d0 * L.code_bits / 8;
        const uint8_t* sc = sb ? qt.scales.data() + gi * sb : nullptr;
#if LQ_HAVE_AVX2_KERNEL
        if (path.e4m3) {
          decode_e4m3_avx2(codes, n, q::minifloat_block_multiplier(L.desc, sc, global), out + t * D + d0);
          return;
        }
        if (path.e2m1) {
          decode_e2m1_avx2(codes, static_cast<int>(n), q::minifloat_block_multiplier(L.desc, sc, global),
                           out + t * D + d0);
          return;
        }
#endif
        q::dequantize_block(L.desc, codes, sc, L.offsets ? qt.offsets.data() + gi * sb : nullptr, global,
                            static_cast<int>(n), out + t * D + d0);
      });
    };
    split_ranges(T, kernel != CpuKernel::Reference && T * D >= kThreadMinElems ? g_threads.load() : 1, rows);
    return;
  }
  if (const CpuKernel k = active_cpu_kernel(); k != CpuKernel::Reference) {
    const int64_t n = spec.granularity == Granularity::Channel ? static_cast<int64_t>(qt.group_bounds.size()) - 1 : T;
    const int threads = T * D >= kThreadMinElems ? g_threads.load() : 1;
    split_ranges(n, threads, [&](int64_t b, int64_t e) {
      const DecJob job{&qt, out, b, e};
#if LQ_HAVE_AVX2_KERNEL
      if (k == CpuKernel::Avx2) return int_dequantize_avx2(job);
#endif
      int_dequantize_baseline(job);
    });
    return;
  }
  const bool sym = spec.scheme == Scheme::Sym;
  const int bits = spec.bits;
  std::vector<uint8_t> u(static_cast<size_t>(D));
  std::vector<float> sc(static_cast<size_t>(D)), of(static_cast<size_t>(D), 0.0f);
  auto decode_row = [&](int64_t t) {
    unpack_row(qt.codes.data() + t * rb, D, bits, u.data());
    float* o = out + t * D;
    if (sym)
      for (int64_t d = 0; d < D; ++d) o[d] = q::decode_sym(u[d], sc[d], bits);
    else
      for (int64_t d = 0; d < D; ++d) o[d] = q::decode_asym(u[d], sc[d], of[d]);
  };
  switch (spec.granularity) {
    case Granularity::Tensor:
      std::fill(sc.begin(), sc.end(), qt.scale_at(0));
      if (!sym) std::fill(of.begin(), of.end(), qt.offset_at(0));
      for (int64_t t = 0; t < T; ++t) decode_row(t);
      return;
    case Granularity::Channel: {
      const int64_t G = static_cast<int64_t>(qt.group_bounds.size()) - 1;
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t d = 0; d < D; ++d) {
          sc[d] = qt.scale_at(g * D + d);
          if (!sym) of[d] = qt.offset_at(g * D + d);
        }
        for (int64_t t = qt.group_bounds[g]; t < qt.group_bounds[g + 1]; ++t) decode_row(t);
      }
      return;
    }
    case Granularity::Token: {
      const int64_t nt = qt.scales_per_row(), g = qt.row_group();
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < nt; ++j) {  // each group's stored (scale, offset) over its columns
          const int64_t d0 = j * g, d1 = std::min(D, d0 + g);
          std::fill(sc.begin() + d0, sc.begin() + d1, qt.scale_at(t * nt + j));
          if (!sym) std::fill(of.begin() + d0, of.begin() + d1, qt.offset_at(t * nt + j));
        }
        decode_row(t);
      }
      return;
    }
  }
}

QuantizedTensor quantize_dequantize(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                                    std::span<const int64_t> seq_offsets, float* out) {
  QuantizedTensor qt = quantize(spec, target, X, T, D, seq_offsets);
  dequantize(qt, out);
  return qt;
}

QuantDiagnostics diagnose(const QuantizedTensor& qt, const float* X) {
  QuantDiagnostics r;
  const QuantSpec& spec = qt.spec;
  const int64_t T = qt.rows, D = qt.cols;
  if (spec.format == Format::BF16) return r;
  const Layout L = qt.layout();
  if (L.block_format) {  // saturation: the block quantizer's own count (its parameters, then count_saturated)
    if (!q::is_finite(q::saturation_threshold(L.desc))) return r;  // ggml blocks never saturate
    const int64_t nb = L.blocks_per_row > 0 ? L.blocks_per_row : 1, blk = L.desc.block;
    const float global = qt.global_scale();
    uint8_t sc[4], of[4];
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < nb; ++j) {
        const int64_t d0 = j * blk, n = std::min(D, d0 + blk) - d0;
        const float* x = X + t * D + d0;
        q::BlockStatus st;
        const q::BlockParams p = q::block_params(L.desc, x, static_cast<int>(n), global, sc, of, st);
        r.saturated += q::count_saturated(L.desc, p, x, static_cast<int>(n));
      }
    return r;
  }
  // integer groups: the true statistics against the stored (scale, offset)
  const bool asym = spec.scheme == Scheme::Asym;
  const float tiny = spec.scale_dtype == ScaleDtype::F16 ? 6.103515625e-05f : q::kFltMin;  // smallest normal
  auto check = [&](float mn, float mx, int64_t gi) {
    const float range = asym ? q::sub_rn(mx, mn) : q::max_num(q::abs_f(mn), q::abs_f(mx));
    const float sc = qt.scale_at(gi);
    if (range > 0.0f && sc < tiny) ++r.scale_underflow;
    if (asym && std::abs(static_cast<double>(qt.offset_at(gi)) - static_cast<double>(mn)) > 0.5 * static_cast<double>(sc))
      ++r.offset_rounding;
  };
  auto fold = [&](int64_t t0, int64_t t1, int64_t d0, int64_t d1, int64_t gi) {
    float mn = X[t0 * D + d0], mx = mn;
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t d = d0; d < d1; ++d) {
        mn = q::min_num(mn, X[t * D + d]);
        mx = q::max_num(mx, X[t * D + d]);
      }
    check(mn, mx, gi);
  };
  switch (spec.granularity) {
    case Granularity::Tensor: fold(0, T, 0, D, 0); break;
    case Granularity::Channel: {
      // Each group's per-column min/max in one row-major pass over its tokens (the same values as a
      // fold down each column: min/max of finite values do not depend on the order, and check() gives
      // the same counts for either zero sign).
      std::vector<float> mn(static_cast<size_t>(D)), mx(static_cast<size_t>(D));
      for (size_t g = 0; g + 1 < qt.group_bounds.size(); ++g) {
        const int64_t t0 = qt.group_bounds[g], t1 = qt.group_bounds[g + 1];
        if (t1 <= t0) continue;
        (void)minmax_cols(X, t0, t1, D, mn.data(), mx.data());  // X is finite: it was quantized
        for (int64_t d = 0; d < D; ++d) check(mn[d], mx[d], static_cast<int64_t>(g) * D + d);
      }
      break;
    }
    case Granularity::Token:
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < L.blocks_per_row; ++j)
          fold(t, t + 1, j * L.block, std::min(D, (j + 1) * L.block), t * L.blocks_per_row + j);
      break;
  }
  return r;
}

void check_decodable(const QuantizedTensor& qt, const float* X) {
  std::vector<float> out(static_cast<size_t>(qt.rows * qt.cols));
  dequantize(qt, out.data());
  for (int64_t i = 0; i < qt.rows * qt.cols; ++i)
    if (!q::is_finite(out[i]))
      throw std::invalid_argument(overflow_message(qt.spec, "value", X[i],
                                                   "token " + std::to_string(i / qt.cols) + ", dimension " +
                                                       std::to_string(i % qt.cols)) +
                                  ": its decoded value is beyond float32");
}

std::vector<uint8_t> pack_record(const QuantSpec& preset, const QuantizedTensor& ckv, const QuantizedTensor& kpe) {
  if (preset.format != Format::Preset)
    throw std::invalid_argument("pack_record: '" + preset.to_string() + "' is not an engine preset");
  const PresetTraits& P = kPresets[preset.preset];
  if (ckv.spec != preset.stored_for(Target::CKV) || kpe.spec != preset.stored_for(Target::KPE))
    throw std::invalid_argument(std::string("pack_record: ") + P.name + " stores c_kv as '" + P.ckv + "' and k_pe as '" +
                                P.kpe + "', got '" + ckv.spec.to_string() + "' and '" + kpe.spec.to_string() + "'");
  if (ckv.rows != kpe.rows)
    throw std::invalid_argument("pack_record: c_kv has " + std::to_string(ckv.rows) + " tokens, k_pe " + std::to_string(kpe.rows));
  if ((P.native_ckv && ckv.cols != P.native_ckv) || (P.native_kpe && kpe.cols != P.native_kpe))
    throw std::invalid_argument(std::string("pack_record: the ") + P.name + " record holds c_kv of " +
                                std::to_string(P.native_ckv) + " and k_pe of " + std::to_string(P.native_kpe) +
                                " dims, got " + std::to_string(ckv.cols) + " + " + std::to_string(kpe.cols) +
                                " (its bytes per token at other widths: record_bytes())");
  const int64_t T = ckv.rows, R = record_bytes(preset, ckv.cols, kpe.cols);
  const int64_t cb = ckv.row_bytes(), kb = kpe.row_bytes();
  const int64_t cs = static_cast<int64_t>(ckv.scales.size()) / T, ks = static_cast<int64_t>(kpe.scales.size()) / T;
  std::vector<uint8_t> out(static_cast<size_t>(T * R), 0);
  for (int64_t t = 0; t < T; ++t) {
    uint8_t* o = out.data() + t * R;
    auto put = [&](const std::vector<uint8_t>& v, int64_t n) {
      std::memcpy(o, v.data() + t * n, static_cast<size_t>(n));
      o += n;
    };
    switch (P.order) {
      case RecordOrder::CodesScalesRope: put(ckv.codes, cb); put(ckv.scales, cs); put(kpe.codes, kb); put(kpe.scales, ks); break;
      case RecordOrder::CodesRopeScalesPad8:  // k_pe is bf16 there (no scales); the pad stays zero
      case RecordOrder::CodesCodesScalesScales: put(ckv.codes, cb); put(kpe.codes, kb); put(ckv.scales, cs); put(kpe.scales, ks); break;
    }
    assert(o <= out.data() + (t + 1) * R);
  }
  return out;
}

Accounting account(const QuantizedTensor& qt) {
  const double bytes = static_cast<double>(qt.storage_bytes());
  return {8.0 * bytes / (static_cast<double>(qt.rows) * static_cast<double>(qt.cols)),
          bytes / static_cast<double>(qt.rows)};
}

}  // namespace latentq
