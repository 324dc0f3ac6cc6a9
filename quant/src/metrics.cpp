#include "latentq/metrics.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include "latentq/quantize.h"

namespace latentq {

namespace {

// The per-row sums of error_metrics in eight lanes: element d of a row goes to lane d mod 8 (each lane's
// sum in index order), and a row's eight lanes are combined as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) +
// (l6 + l7)). Written with vector types of four doubles, no FMA (-ffp-contract=off): the baseline build
// (two SSE2 lanes per vector) and the AVX2 build round every product and sum alike, so both give the
// same bits, and eight independent chains per sum replace one (the float64 adds were latency-bound).
using V4d = double __attribute__((vector_size(32)));
using V4f = float __attribute__((vector_size(16)));
using V4l = long long __attribute__((vector_size(32)));

struct RowSums {
  double dot, na, nb, e2, m;
  bool equal;
};

[[gnu::always_inline]] inline double lanes_sum(const V4d& lo, const V4d& hi) {
  return ((lo[0] + lo[1]) + (lo[2] + lo[3])) + ((hi[0] + hi[1]) + (hi[2] + hi[3]));
}

[[gnu::always_inline]] inline RowSums row_sums_body(const float* a, const float* b, int64_t D) {
  V4d dot[2] = {}, na[2] = {}, nb[2] = {}, e2[2] = {}, m[2] = {};
  V4l eq[2] = {~V4l{}, ~V4l{}};
  const int64_t D8 = D / 8 * 8;
  for (int64_t d = 0; d < D8; d += 8)
    for (int h = 0; h < 2; ++h) {
      V4f fa, fb;
      std::memcpy(&fa, a + d + 4 * h, sizeof fa);
      std::memcpy(&fb, b + d + 4 * h, sizeof fb);
      const V4d xa = __builtin_convertvector(fa, V4d), xb = __builtin_convertvector(fb, V4d), e = xb - xa;
      dot[h] += xa * xb;
      na[h] += xa * xa;
      nb[h] += xb * xb;
      e2[h] += e * e;
      const V4d ae = e < 0 ? -e : e;
      m[h] = m[h] < ae ? ae : m[h];  // std::max(m, |e|): a NaN |e| leaves m
      eq[h] &= (xa == xb);
    }
  // The tail: element d into lane d mod 8, as the vector loop would.
  for (int64_t d = D8; d < D; ++d) {
    const int64_t l = d - D8, h = l / 4, k = l % 4;
    const double xa = a[d], xb = b[d], e = xb - xa;
    dot[h][k] += xa * xb;
    na[h][k] += xa * xa;
    nb[h][k] += xb * xb;
    e2[h][k] += e * e;
    m[h][k] = std::max(m[h][k], std::abs(e));
    if (!(a[d] == b[d])) eq[h][k] = 0;
  }
  RowSums r;
  r.dot = lanes_sum(dot[0], dot[1]);
  r.na = lanes_sum(na[0], na[1]);
  r.nb = lanes_sum(nb[0], nb[1]);
  r.e2 = lanes_sum(e2[0], e2[1]);
  r.m = 0;
  r.equal = true;
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k) {
      r.m = std::max(r.m, m[h][k]);
      r.equal = r.equal && eq[h][k] != 0;
    }
  return r;
}

[[gnu::always_inline]] inline ErrorMetrics error_metrics_body(const float* x, const float* x_hat, int64_t T,
                                                              int64_t D) {
  double err2 = 0, ref2 = 0, maxabs = 0, cos_sum = 0;
  for (int64_t t = 0; t < T; ++t) {
    const RowSums s = row_sums_body(x + t * D, x_hat + t * D, D);
    err2 += s.e2;
    ref2 += s.na;
    maxabs = std::max(maxabs, s.m);
    cos_sum += (s.na > 0 && s.nb > 0) ? s.dot / (std::sqrt(s.na) * std::sqrt(s.nb)) : (s.equal ? 1.0 : 0.0);
  }
  const double inf = std::numeric_limits<double>::infinity();
  ErrorMetrics r;
  r.rel_fro = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? inf : 0.0);
  r.mse = err2 / (static_cast<double>(T) * static_cast<double>(D));
  r.sqnr_db = err2 > 0 ? (ref2 > 0 ? 10.0 * std::log10(ref2 / err2) : -inf) : inf;
  r.max_abs_err = maxabs;
  r.cos_mean = cos_sum / static_cast<double>(T);
  return r;
}

ErrorMetrics error_metrics_baseline(const float* x, const float* x_hat, int64_t T, int64_t D) {
  return error_metrics_body(x, x_hat, T, D);
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) ErrorMetrics error_metrics_avx2(const float* x, const float* x_hat, int64_t T,
                                                                int64_t D) {
  return error_metrics_body(x, x_hat, T, D);
}
#endif

}  // namespace

ErrorMetrics error_metrics(const float* x, const float* x_hat, int64_t T, int64_t D) {
  assert(T > 0 && D > 0);
#if defined(__x86_64__) && defined(__GNUC__)
  if (active_cpu_kernel() == CpuKernel::Avx2) return error_metrics_avx2(x, x_hat, T, D);
#endif
  return error_metrics_baseline(x, x_hat, T, D);
}

}  // namespace latentq
