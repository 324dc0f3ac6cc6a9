// attention/src/internal.h — what the sources of latentq_attention share (private; not installed): the input
// checks, the result's finiteness check, the softmax of one row (with the AVX2 kernels of simd_avx2.cpp), the
// float32 → Scalar view, key-range clipping and the metrics' sums (metrics.cpp).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Dense>

#include "latentq/analysis/detail.h"
#include "latentq/analysis/narrow.h"
#include "latentq/attention/attention.h"
#include "latentq/quantize.h"

#ifdef _OPENMP
#define LQ_OMP_FOR_DYNAMIC _Pragma("omp parallel for schedule(dynamic)")
#else
#define LQ_OMP_FOR_DYNAMIC
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define LQ_VEC_MATH 1  // the AVX2 kernels of simd_avx2.cpp (glibc's libmvec) exist
#endif

namespace latentq::probes::attention_detail {

using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct RowInfo {
  std::vector<int64_t> t, s0, nkeys;  // per query row
  KeySelection selection;             // sparse MLA (AttentionQueries::selected_*); empty for dense MLA
};

inline std::string sz(int64_t n) { return std::to_string(n); }

inline void check_size(size_t got, int64_t want, const char* what, const char* shape) {
  if (static_cast<int64_t>(got) != want)
    throw std::invalid_argument(std::string("attention: ") + what + " has " + std::to_string(got) +
                                " elements, expected " + sz(want) + " = " + shape);
}

/// Checks q (AbsorbedAttention's constructor documents the errors) and returns each query row's token, its
/// sequence's first token and its key count.
RowInfo validate_queries(const AttentionQueries& q);

/// The softmax scale in the working precision, checked after the conversion (1e300 is inf and 1e-50 is 0
/// in float32: a NaN or a uniform attention, silently).
template <typename Scalar>
Scalar working_scale(double softmax_scale) {
  if (const std::string p = narrowing_problem<Scalar>(softmax_scale); !p.empty())
    throw std::invalid_argument("attention: softmax_scale " + format_g8(softmax_scale) + " " + p +
                                ", the precision the attention runs in");
  return static_cast<Scalar>(softmax_scale);
}

template <typename Scalar>
int64_t count_nonfinite_of(const std::vector<Scalar>& v) {
  // NaN/Inf ⇔ all exponent bits set: an integer test the compiler vectorizes (std::isfinite it does not).
  using Bits = std::conditional_t<sizeof(Scalar) == 4, uint32_t, uint64_t>;
  constexpr Bits kExp = static_cast<Bits>(sizeof(Scalar) == 4 ? 0x7f800000ull : 0x7ff0000000000000ull);
  int64_t n = 0;
  for (const Scalar x : v) n += (std::bit_cast<Bits>(x) & kExp) == kExp ? 1 : 0;
  return n;
}

// cos(a, b) of one (row, head) pair from its sums; a pair where either norm is 0 counts 1 if equal, else 0.
inline double pair_cos(double dot, double na, double nb, bool equal) {
  return (na > 0 && nb > 0) ? dot / (std::sqrt(na) * std::sqrt(nb)) : (equal ? 1.0 : 0.0);
}

/// AttentionError from the sums over `pairs` (row, head) pairs (error_over_rows and device_error).
AttentionError finish_error(double err2, double ref2, double cos_sum, double kl_sum, double top1, double top8,
                            double pairs);

/// A result must be finite: the scores, the softmax or the output can overflow the working precision
/// even on finite inputs, and no metric may be computed from a NaN/Inf reference or test.
template <typename Scalar>
void require_finite_counts(const char* what, int64_t bad_out, int64_t n_out, int64_t bad_p, int64_t n_p) {
  if (bad_out + bad_p > 0)
    throw std::invalid_argument(std::string(what) + ": " + sz(bad_out) + " of " + sz(n_out) + " outputs and " +
                                sz(bad_p) + " of " + sz(n_p) + " kept probabilities are NaN/Inf in " +
                                precision_name<Scalar>() +
                                " (the scores or the output overflow the working precision); no metric is computed "
                                "from a non-finite attention");
}

template <typename Scalar>
void require_finite_result(const AttentionResult<Scalar>& r, const char* what) {
  require_finite_counts<Scalar>(what, count_nonfinite_of(r.out), static_cast<int64_t>(r.out.size()),
                                count_nonfinite_of(r.probs), static_cast<int64_t>(r.probs.size()));
}

/// Checks c_kv [T, kv_lora_rank] and k_pe [T, qk_rope_head_dim]: sizes, and NaN/Inf (with the count).
void check_latents(const MlaDims& d, int64_t T, std::span<const float> c_kv, std::span<const float> k_pe);

#ifdef LQ_VEC_MATH
// simd_avx2.cpp (the declarations carry the definitions' target attribute: GCC would take a declaration
// without it for another version of the function).
__attribute__((target("avx2"))) void exp_shifted_avx2(float* x, int64_t n, float m);
__attribute__((target("avx2"))) float max_avx2(const float* x, int64_t n);
__attribute__((target("avx2"))) bool any_greater16_avx2(const float* x, float thr);
__attribute__((target("avx2"))) double kl_avx2(const float* p, const float* ph, int64_t n);
#endif

/// In-place softmax of x[0, n) in Scalar precision (max-subtracted); x[n, n_total) set to 0. The sum is
/// taken in index order. Float rows under the AVX2 CPU kernel (quantize.h) take their exponentials
/// from libmvec's expf (within 4 ulp of expf; the probabilities then differ from the scalar path's in
/// their last bits, test); otherwise std::exp.
template <typename Scalar>
void softmax_row(Scalar* x, int64_t n, int64_t n_total) {
  Scalar m = x[0];
  bool done = false;
#ifdef LQ_VEC_MATH
  if constexpr (std::is_same_v<Scalar, float>)
    if (active_cpu_kernel() == CpuKernel::Avx2) m = max_avx2(x, n), exp_shifted_avx2(x, n, m), done = true;
#endif
  if (!done) {
    for (int64_t j = 1; j < n; ++j) m = std::max(m, x[j]);
    for (int64_t j = 0; j < n; ++j) x[j] = std::exp(x[j] - m);
  }
  Scalar sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  for (int64_t j = 0; j < n; ++j) x[j] /= sum;
  for (int64_t j = n; j < n_total; ++j) x[j] = 0;
}

template <typename Scalar>
AttentionResult<Scalar> make_result(const MlaDims& d, const std::vector<int64_t>& nkeys, bool keep_probs) {
  AttentionResult<Scalar> res;
  const int64_t Tq = static_cast<int64_t>(nkeys.size());
  res.num_queries = Tq;
  res.num_heads = d.num_heads;
  res.v_head_dim = d.v_head_dim;
  res.out.assign(static_cast<size_t>(Tq * d.num_heads * d.v_head_dim), Scalar(0));
  res.nkeys = nkeys;
  res.prob_offsets.assign(Tq + 1, 0);
  for (int64_t i = 0; i < Tq; ++i) res.prob_offsets[i + 1] = res.prob_offsets[i] + d.num_heads * nkeys[i];
  if (keep_probs) res.probs.assign(static_cast<size_t>(res.prob_offsets[Tq]), Scalar(0));
  return res;
}

/// A float32 buffer viewed as Scalar: the data itself for float, a float64 copy for double.
template <typename Scalar>
struct ScalarView {
  std::vector<Scalar> copy;
  const Scalar* ptr = nullptr;
  explicit ScalarView(std::span<const float> x) {
    if constexpr (std::is_same_v<Scalar, float>) {
      ptr = x.data();
    } else {
      copy.assign(x.begin(), x.end());
      ptr = copy.data();
    }
  }
};

/// The part of range r inside [0, n).
inline KeyRange clip_range(const KeyRange& r, int64_t n) {
  const int64_t b = std::clamp<int64_t>(r.begin, 0, n), e = std::clamp<int64_t>(r.end, 0, n);
  return {b, std::max(b, e)};
}

// p·(ln p − ln max(p̂, floor)) summed in index order, one log per term: the ratio stays finite (p ≤ 1,
// floor 1e-30).
template <typename Scalar>
double kl_scalar(const Scalar* p, const Scalar* ph, int64_t n) {
  double kl = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double pj = p[j];
    if (pj > 0) kl += pj * std::log(pj / std::max(static_cast<double>(ph[j]), kKlProbFloor));
  }
  return kl;
}

// The errors of test against ref over `rows` (metrics.cpp: attention_error, attention_error_rows and the
// decode-order buckets). `prepared`: the reference's top-m indices ([Tq, H, 8], AttentionReference), its
// finiteness already checked; null: both computed here. `test_checked`: the test is known finite (a result of
// run() or run_mixed(), which check it; decode_order_attention scores one test over many row buckets).
template <typename Scalar>
AttentionError error_over_rows(const AttentionResult<Scalar>& ref, const AttentionResult<Scalar>& test,
                               std::span<const int64_t> rows, const char* what, const int64_t* prepared = nullptr,
                               bool test_checked = false);

}  // namespace latentq::probes::attention_detail
