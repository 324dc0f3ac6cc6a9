// quant/src/cpu/kernels.h — private: the building blocks of the CPU integer code, shared by the
// reference loops (reference.cpp), the fused kernels (int_fused.h, compiled for Baseline and Avx2) and
// diagnose() (quantize.cpp): scale storage, a group's stored parameters, code packing and the group
// statistics. Also the ISA macros of every file under cpu/.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "latentq/quantize.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LQ_X86_KERNELS 1
// CpuKernel::Avx2 is AVX2 + F16C (the fp16 scale conversions; every AVX2 CPU has F16C, cpu_has_avx2 checks both).
#define LQ_AVX2_TARGET target("avx2,f16c")
#define LQ_AVX2_AI __attribute__((LQ_AVX2_TARGET, always_inline)) inline
#else
#define LQ_X86_KERNELS 0
#endif
// The CpuKernel::Avx2 entry points exist (dispatch.h; int_avx2.cpp, block_avx2.cpp): the same condition.
#define LQ_HAVE_AVX2_KERNEL LQ_X86_KERNELS

// Always inlined (LQ_AI): the reference loops and the fused kernels share pack_row / unpack_row (and the
// fused kernels the statistics below), whose loops then vectorize in the caller's ISA (integer operations
// only: the bytes are the same in any ISA).
#define LQ_AI [[gnu::always_inline]] inline

namespace latentq::cpu {
namespace q = qmath;

/// v = n zero bytes; a large buffer that has to grow is advised for transparent huge pages first
/// (reference.cpp). The bytes are the same either way.
void assign_zeroed(std::vector<uint8_t>& v, size_t n);

inline void put_scale(std::vector<uint8_t>& buf, int64_t i, float v, ScaleDtype d) {
  q::store_dtype(buf.data() + q::scale_dtype_bytes(d) * i, v, d);
}

inline float get_scale(const std::vector<uint8_t>& buf, int64_t i, ScaleDtype d) {
  return q::load_dtype(buf.data() + q::scale_dtype_bytes(d) * i, d);
}

// Stored (scale, offset) of a group from its statistics; checks the storage dtype did not overflow.
q::ScaleOffset group_params(const QuantizedTensor& qt, float mn, float mx, int64_t gi);

// The per-tensor group of an integer spec: its (scale, offset) from the matrix's min/max, stored as
// the only entry of qt.scales (and of qt.offsets when asymmetric). Throws as group_params().
q::ScaleOffset store_tensor_params(QuantizedTensor& qt, float mn, float mx);

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

LQ_AI uint32_t nonfinite_bit(float x) { return (q::f32_bits(x) & 0x7f800000u) == 0x7f800000u ? 1u : 0u; }

LQ_AI float first_zero(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (x[i] == 0.0f) return x[i];
  return 0.0f;  // unreachable when called with a zero extremum
}

// min and max of x[0, n) as the reference fold from m = x[0] gives them; returns 1 if any is NaN/Inf.
// Eight lanes in GCC/Clang vector types (the compiler does not vectorize a float min/max reduction
// with min_num's select semantics by itself): lane k folds x[k], x[k+8], ...; the lanes are then
// folded in order, and a zero extremum takes the sign of the span's first zero (int_fused.h says why).
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

}  // namespace latentq::cpu
