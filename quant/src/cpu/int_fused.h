// quant/src/cpu/int_fused.h — private: the body of the fused integer kernels (CpuKernel::Baseline / Avx2),
// included by int_baseline.cpp and int_avx2.cpp, which instantiate it for their ISA.
#pragma once

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstring>
#include <vector>

#include "dispatch.h"
#include "kernels.h"

namespace latentq::cpu {

// ---- the fused integer kernels (CpuKernel::Baseline / Avx2) --------------------------------------
// One source, compiled twice (int_baseline.cpp, int_avx2.cpp): int_quantize_body / int_dequantize_body
// and everything they call are always_inline, so the Avx2 wrappers (target("avx2")) vectorize all of it
// with 32-byte vectors and the Baseline wrappers with the baseline ISA. They compute exactly the
// reference's values:
//   * min/max: a fold m = min_num(m, x) over finite floats has the same value in any order; only the
//     sign of a zero extremum depends on the order (min_num keeps the first of two equal values), and
//     the reference's left-to-right fold gives the FIRST zero of the span in that case (every element
//     before it is > 0 for a min, < 0 for a max), which first_zero() restores;
//   * encoding and decoding call qmath.h's encode_*/decode_* per element, as the reference does;
//   * NaN/Inf: each pass ORs a per-element exponent-all-ones flag; quantize() then throws the reference's
//     message (with the whole-matrix count) before any other error the same input would give.

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

LQ_AI void enc_uniform(const float* __restrict x, int64_t n, float s, float o, bool sym, int bits,
                       uint8_t* __restrict u) {
  if (sym)
    for (int64_t i = 0; i < n; ++i) u[i] = static_cast<uint8_t>(q::encode_sym(x[i], s, bits));
  else
    for (int64_t i = 0; i < n; ++i) u[i] = static_cast<uint8_t>(q::encode_asym(x[i], s, o, bits));
}

LQ_AI void enc_columns(const float* __restrict x, int64_t n, const float* __restrict s, const float* __restrict o,
                       bool sym, int bits, uint8_t* __restrict u) {
  if (sym)
    for (int64_t i = 0; i < n; ++i) u[i] = static_cast<uint8_t>(q::encode_sym(x[i], s[i], bits));
  else
    for (int64_t i = 0; i < n; ++i) u[i] = static_cast<uint8_t>(q::encode_asym(x[i], s[i], o[i], bits));
}

LQ_AI void dec_uniform(const uint8_t* __restrict u, int64_t n, float s, float o, bool sym, int bits,
                       float* __restrict out) {
  if (sym)
    for (int64_t i = 0; i < n; ++i) out[i] = q::decode_sym(u[i], s, bits);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = q::decode_asym(u[i], s, o);
}

LQ_AI void dec_columns(const uint8_t* __restrict u, int64_t n, const float* __restrict s, const float* __restrict o,
                       bool sym, int bits, float* __restrict out) {
  if (sym)
    for (int64_t i = 0; i < n; ++i) out[i] = q::decode_sym(u[i], s[i], bits);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = q::decode_asym(u[i], s[i], o[i]);
}

#if LQ_X86_KERNELS
// The AVX2 pieces of the body (int_avx2.cpp), out of line: a target("avx2") function is not inlined into the
// target-less template body; one call per row, the per-token groups of a row in one call.
/// The codes u[n] of x[n]: per-column scale/offset s, o (cols) or one (s0, o0).
__attribute__((LQ_AVX2_TARGET)) void enc_row_avx2(const float* x, int64_t n, const float* s, const float* o, float s0,
                                                  float o0, bool sym, bool cols, int bits, uint8_t* u);
/// The codes u[D] of row x[D] in nt groups of g columns (the last one up to D), group j with (sc[j], of[j]).
__attribute__((LQ_AVX2_TARGET)) void enc_groups_avx2(const float* x, int64_t D, int64_t nt, int64_t g, const float* sc,
                                                     const float* of, bool sym, int bits, uint8_t* u);
/// dst[2n bytes] = fp16 bits of v[0, n) (little-endian), v[i] = the stored value (f32_to_f16_bits's bits).
__attribute__((LQ_AVX2_TARGET)) void f16_round_store_avx2(float* v, int64_t n, uint8_t* dst);
/// The per-token group statistics of row x[D] in nt groups of g columns: mn[j], mx[j] as minmax_span gives
/// them; returns 1 if any element is NaN/Inf.
__attribute__((LQ_AVX2_TARGET)) uint32_t group_minmax_avx2(const float* x, int64_t D, int64_t nt, int64_t g, float* mn,
                                                           float* mx);
#endif

// Stored (scale, offset) of n groups from their statistics, as group_params computes them one by one
// (sym_params / asym_params of qmath.h, element by element in a vectorizable loop), written into
// qt.scales / qt.offsets at [g0, g0 + n). If any stored value is not finite, group_params is called
// group by group instead: it throws the reference's message for the first such group.
template <bool Avx2>
LQ_AI void put_groups(QuantizedTensor& qt, const float* __restrict mn, const float* __restrict mx, int64_t n,
                      int64_t g0, float* __restrict sc, float* __restrict of) {
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
        if constexpr (Avx2)
          enc_row_avx2(X + t * D, D, nullptr, nullptr, job.tensor_scale, job.tensor_offset, sym, false, bits, u.data());
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
          if constexpr (Avx2)
            enc_row_avx2(X + t * D, D, sc.data(), of.data(), 0.0f, 0.0f, sym, true, bits, u.data());
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
        if constexpr (Avx2)
          bad |= group_minmax_avx2(x, D, nt, g, mn.data(), mx.data());
        else
#endif
          for (int64_t j = 0; j < nt; ++j) {
            const int64_t d0 = j * g, d1 = std::min(D, d0 + g);
            bad |= minmax_span(x + d0, d1 - d0, mn[static_cast<size_t>(j)], mx[static_cast<size_t>(j)]);
          }
        if (bad) return bad;
        put_groups<Avx2>(qt, mn.data(), mx.data(), nt, t * nt, sc.data(), of.data());
#if LQ_X86_KERNELS
        if constexpr (Avx2)
          enc_groups_avx2(x, D, nt, g, sc.data(), of.data(), sym, bits, u.data());
        else
#endif
          for (int64_t j = 0; j < nt; ++j) {
            const int64_t d0 = j * g, d1 = std::min(D, d0 + g);
            enc_uniform(x + d0, d1 - d0, sc[static_cast<size_t>(j)], of[static_cast<size_t>(j)], sym, bits,
                        u.data() + d0);
          }
        put_row(t);
      }
      break;
    }
  }
  if (job.stream) stream_fence();
  return bad;
}

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
        for (int64_t t = qt.group_bounds[static_cast<size_t>(g)]; t < qt.group_bounds[static_cast<size_t>(g) + 1];
             ++t) {
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

}  // namespace latentq::cpu
