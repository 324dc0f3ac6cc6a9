// The AVX2 kernels of the absorbed attention and its metrics, with glibc's vector math library (libmvec):
// the softmax's row max and exponentials (softmax_row, internal.h), top_m's skip test and kl_row's terms
// (metrics.cpp). Each is used only under the Avx2 CPU kernel (latentq/quantize.h active_cpu_kernel).
#include "internal.h"

#ifdef LQ_VEC_MATH

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "latentq/attention/metrics.h"

namespace latentq::probes::attention_detail {

// glibc libmvec: the AVX2 variants of expf and log (x86_64 vector ABI); declared for the avx2 target,
// which clang requires of a declaration that passes __m256 in registers.
extern "C" __attribute__((target("avx2"))) __m256 _ZGVdN8v_expf(__m256);
extern "C" __attribute__((target("avx2"))) __m256d _ZGVdN4v_log(__m256d);

// x[j] = exp(x[j] − m) for j in [0, n), eight at a time with libmvec's expf, the tail with std::exp.
__attribute__((target("avx2"))) void exp_shifted_avx2(float* x, int64_t n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, _ZGVdN8v_expf(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm)));
  for (; j < n; ++j) x[j] = std::exp(x[j] - m);
}

// max of x[0, n), n >= 1, sixteen at a time: the same value as the scalar fold for finite x (max is exact;
// a zero's sign cannot change exp(x − m)); a NaN row fails require_finite_result on either path.
__attribute__((target("avx2"))) float max_avx2(const float* x, int64_t n) {
  int64_t j = 0;
  float m = x[0];
  if (n >= 16) {
    __m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8);
    for (j = 16; j + 16 <= n; j += 16) {
      a = _mm256_max_ps(a, _mm256_loadu_ps(x + j));
      b = _mm256_max_ps(b, _mm256_loadu_ps(x + j + 8));
    }
    alignas(32) float lane[8];
    _mm256_store_ps(lane, _mm256_max_ps(a, b));
    m = lane[0];
    for (int k = 1; k < 8; ++k) m = std::max(m, lane[k]);
  }
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// Whether some x[j] > thr for j in [0, 16): the skip test of top_m, sixteen values in one compare each
// half (ordered: a NaN never exceeds thr, as in the scalar test).
__attribute__((target("avx2"))) bool any_greater16_avx2(const float* x, float thr) {
  const __m256 t = _mm256_set1_ps(thr);
  const __m256 g = _mm256_or_ps(_mm256_cmp_ps(_mm256_loadu_ps(x), t, _CMP_GT_OQ),
                                _mm256_cmp_ps(_mm256_loadu_ps(x + 8), t, _CMP_GT_OQ));
  return _mm256_movemask_ps(g) != 0;
}

// The same terms four at a time (float → double exactly, IEEE division, libmvec log, mul, masked add
// to four partial sums), the tail and the final sum of the lanes in index order.
__attribute__((target("avx2"))) double kl_avx2(const float* p, const float* ph, int64_t n) {
  const __m256d floor = _mm256_set1_pd(kKlProbFloor), zero = _mm256_setzero_pd();
  __m256d acc = zero;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const __m256d pj = _mm256_cvtps_pd(_mm_loadu_ps(p + j));
    const __m256d qj = _mm256_max_pd(_mm256_cvtps_pd(_mm_loadu_ps(ph + j)), floor);
    const __m256d t = _mm256_mul_pd(pj, _ZGVdN4v_log(_mm256_div_pd(pj, qj)));
    acc = _mm256_add_pd(acc, _mm256_and_pd(t, _mm256_cmp_pd(pj, zero, _CMP_GT_OQ)));
  }
  alignas(32) double lane[4];
  _mm256_store_pd(lane, acc);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + kl_scalar(p + j, ph + j, n - j);
}

}  // namespace latentq::probes::attention_detail

#endif  // LQ_VEC_MATH
