// The metrics of one attention result against another (attention_error, attention_error_rows, the prepared
// AttentionReference, kl_row) and the sums they share with the device seam (finish_error).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "internal.h"
#include "latentq/attention/metrics.h"
#include "latentq/quantize.h"

namespace latentq::probes {

namespace attention_detail {

// AttentionError from the sums over `pairs` (row, head) pairs (error_over_rows and device_error).
AttentionError finish_error(double err2, double ref2, double cos_sum, double kl_sum, double top1, double top8,
                            double pairs) {
  AttentionError e;
  e.out_rel_fro = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  e.cos_mean = cos_sum / pairs;
  e.kl_mean = kl_sum / pairs;
  e.top1_agree = top1 / pairs;
  e.top8_agree = top8 / pairs;
  return e;
}

}  // namespace attention_detail

using namespace attention_detail;

namespace {

/// The m ≤ 8 largest values of p (ties → lower index first): idx[0..m) in descending order of value.
/// Allocation-free insertion into a sorted list, scanning j upward: an equal value never displaces an
/// earlier key, only a strictly larger one. Once m keys are held, blocks of 16 values none of which
/// exceeds the m-th largest so far are skipped with one test (AVX2 compares under the Avx2 CPU kernel;
/// most of a long row).
template <typename Scalar>
void top_m(std::span<const Scalar> p, int64_t m, int64_t* idx) {
  int64_t count = 0;
  const int64_t n = static_cast<int64_t>(p.size());
  const auto insert = [&](int64_t j) {
    int64_t pos = count < m ? count++ : m - 1;
    while (pos > 0 && p[j] > p[idx[pos - 1]]) {
      idx[pos] = idx[pos - 1];
      --pos;
    }
    idx[pos] = j;
  };
  int64_t j = 0;
  for (; j < n && count < m; ++j) insert(j);
  if (m < 1) return;
  Scalar thr = p[idx[m - 1]];  // the m-th largest so far: only a value > thr enters
  constexpr int64_t kBlock = 16;
  bool vec = false;
#ifdef LQ_VEC_MATH
  if constexpr (std::is_same_v<Scalar, float>) vec = active_cpu_kernel() == CpuKernel::Avx2;
#endif
  while (j < n) {
    if (j + kBlock <= n) {
      bool any = false;
#ifdef LQ_VEC_MATH
      if constexpr (std::is_same_v<Scalar, float>)
        if (vec) any = any_greater16_avx2(p.data() + j, thr);
#endif
      if (!vec)
        for (int64_t k = 0; k < kBlock; ++k) any |= p[j + k] > thr;
      if (!any) {
        j += kBlock;
        continue;
      }
    }
    const int64_t e = std::min(n, j + kBlock);
    for (; j < e; ++j)
      if (p[j] > thr) {
        insert(j);
        thr = p[idx[m - 1]];
      }
  }
}

// The checks of error_over_rows on its inputs, before the finiteness of either result: the same shape and key
// counts, both with their probabilities, Tq >= 1, and rows non-empty and inside [0, Tq).
template <typename Scalar>
void check_error_inputs(const AttentionResult<Scalar>& ref, const AttentionResult<Scalar>& test,
                        std::span<const int64_t> rows, const char* what) {
  if (ref.num_queries != test.num_queries || ref.num_heads != test.num_heads || ref.v_head_dim != test.v_head_dim ||
      ref.out.size() != test.out.size() || ref.nkeys != test.nkeys)
    throw std::invalid_argument(std::string(what) + ": the two results differ in shape (Tq " + sz(ref.num_queries) +
                                " vs " + sz(test.num_queries) + ", H " + sz(ref.num_heads) + " vs " +
                                sz(test.num_heads) + ", v " + sz(ref.v_head_dim) + " vs " + sz(test.v_head_dim) +
                                ") or in their key counts");
  if (ref.probs.size() != static_cast<size_t>(ref.prob_offsets.back()) ||
      test.probs.size() != static_cast<size_t>(test.prob_offsets.back()))
    throw std::invalid_argument(std::string(what) +
                                ": both results need their probabilities (run with keep_probs = true)");
  const int64_t Tq = ref.num_queries;
  if (Tq < 1) throw std::invalid_argument(std::string(what) + ": no query rows");
  if (rows.empty()) throw std::invalid_argument(std::string(what) + ": no query rows selected");
  for (const int64_t i : rows)
    if (i < 0 || i >= Tq)
      throw std::invalid_argument(std::string(what) + ": query row " + sz(i) + " outside [0, Tq = " + sz(Tq) + ")");
}

}  // namespace

template <typename Scalar>
double kl_row(std::span<const Scalar> p, std::span<const Scalar> p_hat) {
  if (p.size() != p_hat.size())
    throw std::invalid_argument("kl_row: p has " + sz(static_cast<int64_t>(p.size())) + " keys, p_hat " +
                                sz(static_cast<int64_t>(p_hat.size())));
  const int64_t n = static_cast<int64_t>(p.size());
#ifdef LQ_VEC_MATH
  if constexpr (std::is_same_v<Scalar, float>)
    if (active_cpu_kernel() == CpuKernel::Avx2) return kl_avx2(p.data(), p_hat.data(), n);
#endif
  return kl_scalar(p.data(), p_hat.data(), n);
}

template double kl_row<float>(std::span<const float>, std::span<const float>);
template double kl_row<double>(std::span<const double>, std::span<const double>);

namespace attention_detail {

template <typename Scalar>
AttentionError error_over_rows(const AttentionResult<Scalar>& ref, const AttentionResult<Scalar>& test,
                               std::span<const int64_t> rows, const char* what, const int64_t* prepared,
                               bool test_checked) {
  check_error_inputs(ref, test, rows, what);
  const int64_t H = ref.num_heads, v = ref.v_head_dim;
  if (!prepared) require_finite_result(ref, (std::string(what) + ": the reference").c_str());
  if (!test_checked) require_finite_result(test, (std::string(what) + ": the test").c_str());
  double err2 = 0, ref2 = 0, cos_sum = 0, kl_sum = 0, top1 = 0, top8 = 0;
  for (const int64_t i : rows) {
    for (int64_t h = 0; h < H; ++h) {
      const Scalar* a = ref.out.data() + (i * H + h) * v;
      const Scalar* b = test.out.data() + (i * H + h) * v;
      double dot = 0, na = 0, nb = 0;
      bool equal = true;
      for (int64_t j = 0; j < v; ++j) {
        const double xa = a[j], xb = b[j];
        dot += xa * xb;
        na += xa * xa;
        nb += xb * xb;
        err2 += (xb - xa) * (xb - xa);
        equal = equal && a[j] == b[j];
      }
      ref2 += na;
      cos_sum += pair_cos(dot, na, nb, equal);

      const auto p = ref.prob(i, h), ph = test.prob(i, h);
      const int64_t n = ref.nkeys[i];
      kl_sum += kl_row<Scalar>(p.first(n), ph.first(n));
      const int64_t m = std::min<int64_t>(8, n);
      int64_t own[8], tph[8];
      const int64_t* tp = prepared ? prepared + (i * H + h) * 8 : own;
      if (!prepared) top_m(p, m, own);
      top_m(ph, m, tph);
      top1 += tp[0] == tph[0] ? 1.0 : 0.0;
      int64_t common = 0;
      for (int64_t a2 = 0; a2 < m; ++a2)
        for (int64_t b2 = 0; b2 < m; ++b2) common += tp[a2] == tph[b2] ? 1 : 0;
      top8 += static_cast<double>(common) / static_cast<double>(m);
    }
  }
  return finish_error(err2, ref2, cos_sum, kl_sum, top1, top8,
                      static_cast<double>(static_cast<int64_t>(rows.size()) * H));
}

// decode_order.cpp scores float results; the double ones are attention_error's here.
template AttentionError error_over_rows<float>(const AttentionResult<float>&, const AttentionResult<float>&,
                                               std::span<const int64_t>, const char*, const int64_t*, bool);

}  // namespace attention_detail

template <typename Scalar>
AttentionError attention_error(const AttentionResult<Scalar>& ref, const AttentionResult<Scalar>& test) {
  std::vector<int64_t> rows(static_cast<size_t>(std::max<int64_t>(ref.num_queries, 0)));
  std::iota(rows.begin(), rows.end(), int64_t{0});
  if (rows.empty()) rows.push_back(0);  // error_over_rows reports "no query rows" (or the shape mismatch) first
  return error_over_rows(ref, test, rows, "attention_error");
}

template <typename Scalar>
AttentionError attention_error_rows(const AttentionResult<Scalar>& ref, const AttentionResult<Scalar>& test,
                                    std::span<const int64_t> rows) {
  return error_over_rows(ref, test, rows, "attention_error_rows");
}

template <typename Scalar>
AttentionReference<Scalar>::AttentionReference(const AttentionResult<Scalar>& ref) : ref_(&ref) {
  const int64_t Tq = ref.num_queries, H = ref.num_heads;
  if (Tq < 0 || H < 0 || static_cast<int64_t>(ref.nkeys.size()) != Tq ||
      static_cast<int64_t>(ref.prob_offsets.size()) != Tq + 1)
    throw std::invalid_argument("attention reference: " + sz(static_cast<int64_t>(ref.nkeys.size())) +
                                " key counts and " + sz(static_cast<int64_t>(ref.prob_offsets.size())) +
                                " probability offsets for Tq = " + sz(Tq) + " query rows (expected Tq and Tq + 1)");
  if (ref.probs.size() != static_cast<size_t>(ref.prob_offsets.back()))
    throw std::invalid_argument("attention reference: the result needs its probabilities (run with keep_probs = true)");
  for (int64_t i = 0; i < Tq; ++i)
    if (ref.nkeys[i] < 0 || ref.prob_offsets[i + 1] - ref.prob_offsets[i] != H * ref.nkeys[i])
      throw std::invalid_argument("attention reference: query row " + sz(i) + " has " +
                                  sz(ref.prob_offsets[i + 1] - ref.prob_offsets[i]) +
                                  " probabilities, expected H · nkeys = " + sz(H) + " · " + sz(ref.nkeys[i]));
  require_finite_result(ref, "attention reference");
  top_.assign(static_cast<size_t>(std::max<int64_t>(Tq, 0) * H * 8), -1);
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t h = 0; h < H; ++h)
      top_m(ref.prob(i, h), std::min<int64_t>(8, ref.nkeys[i]), top_.data() + (i * H + h) * 8);
}

template <typename Scalar>
AttentionError attention_error(const AttentionReference<Scalar>& ref, const AttentionResult<Scalar>& test) {
  std::vector<int64_t> rows(static_cast<size_t>(std::max<int64_t>(ref.result().num_queries, 0)));
  std::iota(rows.begin(), rows.end(), int64_t{0});
  if (rows.empty()) rows.push_back(0);
  return error_over_rows(ref.result(), test, rows, "attention_error", ref.top_indices());
}

template <typename Scalar>
AttentionError attention_error_rows(const AttentionReference<Scalar>& ref, const AttentionResult<Scalar>& test,
                                    std::span<const int64_t> rows) {
  return error_over_rows(ref.result(), test, rows, "attention_error_rows", ref.top_indices());
}

template class AttentionReference<float>;
template class AttentionReference<double>;
template AttentionError attention_error<float>(const AttentionReference<float>&, const AttentionResult<float>&);
template AttentionError attention_error<double>(const AttentionReference<double>&, const AttentionResult<double>&);
template AttentionError attention_error_rows<float>(const AttentionReference<float>&, const AttentionResult<float>&,
                                                    std::span<const int64_t>);
template AttentionError attention_error_rows<double>(const AttentionReference<double>&, const AttentionResult<double>&,
                                                     std::span<const int64_t>);
template AttentionError attention_error<float>(const AttentionResult<float>&, const AttentionResult<float>&);
template AttentionError attention_error<double>(const AttentionResult<double>&, const AttentionResult<double>&);
template AttentionError attention_error_rows<float>(const AttentionResult<float>&, const AttentionResult<float>&,
                                                    std::span<const int64_t>);
template AttentionError attention_error_rows<double>(const AttentionResult<double>&, const AttentionResult<double>&,
                                                     std::span<const int64_t>);

}  // namespace latentq::probes
