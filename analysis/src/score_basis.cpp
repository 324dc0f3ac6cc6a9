// The score-metric KLT (latentq/analysis/score_basis.h).
#include "latentq/analysis/score_basis.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "latentq/analysis/gemm.h"
#include "latentq/analysis/lapack.h"
#include "latentq/analysis/rate_distortion.h"
#include "latentq/split.h"

namespace latentq::probes {

Eigen::MatrixXd fit_score_metric(std::span<const float> q, std::span<const float> w, std::span<const int32_t> q_rows,
                                 int64_t H, int64_t dq, int64_t d, std::span<const int64_t> seq_offsets, int64_t T) {
  const int64_t Tq = static_cast<int64_t>(q_rows.size());
  if (H < 1 || dq < 1 || static_cast<int64_t>(q.size()) != Tq * H * dq)
    throw std::invalid_argument(fmt::format("fit_score_metric: q has {} values for {} query rows, expected Tq·H·dq = "
                                            "{}·{}·{}",
                                            q.size(), Tq, Tq, H, dq));
  const TokenSplit split = fit_heldout_split(seq_offsets, T);
  std::vector<float> fit;
  int64_t n = 0;
  for (int64_t i = 0; i < Tq; ++i) {
    const int64_t t = q_rows[static_cast<size_t>(i)];
    if (t < 0 || t >= T)
      throw std::invalid_argument(fmt::format("fit_score_metric: query row {} has token index {}, outside [0, {})", i, t, T));
    if (std::none_of(split.fit.begin(), split.fit.end(), [t](const auto& r) { return t >= r.first && t < r.second; }))
      continue;
    const auto row = q.subspan(static_cast<size_t>(i * H * dq), static_cast<size_t>(H * dq));
    fit.insert(fit.end(), row.begin(), row.end());
    ++n;
  }
  if (n == 0)
    throw std::invalid_argument(fmt::format(
        "fit_score_metric: none of the {} query rows lies in the fit split ({} of {} tokens): the score metric of "
        "sklt is fitted on the fit split's queries",
        Tq, split.fit_tokens(), T));
  return score_metric(fit, w, n, H, dq, d);
}

Rotation fit_score_rotation(const float* X, int64_t T, int64_t d, std::span<const int64_t> seq_offsets,
                            const Eigen::MatrixXd& metric) {
  if (d < 1) throw std::invalid_argument(fmt::format("fit_score_rotation: dimension {} (expected >= 1)", d));
  if (metric.rows() != d || metric.cols() != d)
    throw std::invalid_argument(
        fmt::format("fit_score_rotation: the metric is [{}, {}], expected [{}, {}]", metric.rows(), metric.cols(), d, d));
  if (!metric.allFinite()) throw std::invalid_argument("fit_score_rotation: NaN/Inf in the score metric");
  const TokenSplit split = fit_heldout_split(seq_offsets, T);
  Eigen::MatrixXd Xf(split.fit_tokens(), d);  // the fit split's rows, float64 (exact)
  int64_t r = 0;
  for (const auto& [b, e] : split.fit)
    for (int64_t t = b; t < e; ++t, ++r)
      for (int64_t j = 0; j < d; ++j) {
        const float v = X[t * d + j];
        if (!std::isfinite(v))
          throw std::invalid_argument(fmt::format("fit_score_rotation: NaN/Inf at token {}, element {}", t, j));
        Xf(r, j) = static_cast<double>(v);
      }
  Eigen::MatrixXd S(d, d);
  gemm<double>(Op::T, Op::N, 1.0 / static_cast<double>(Xf.rows()), Xf, Xf, 0, S);  // Σ, uncentered
  const SymmetricEigen em = symmetric_eigen(0.5 * (metric + metric.transpose()), true);
  const double top = em.values.maxCoeff();
  if (!(top > 0)) throw std::invalid_argument("fit_score_rotation: the score metric has no positive eigenvalue");
  const Eigen::VectorXd wf = em.values.cwiseMax(kScoreMetricFloor * top);
  const Eigen::MatrixXd Mh = em.vectors * wf.cwiseSqrt().asDiagonal() * em.vectors.transpose();
  const Eigen::MatrixXd Mih = em.vectors * wf.cwiseSqrt().cwiseInverse().asDiagonal() * em.vectors.transpose();
  Eigen::MatrixXd SM(d, d), B(d, d);
  gemm<double>(Op::N, Op::N, 1, S, Mh, 0, SM);
  gemm<double>(Op::N, Op::N, 1, Mh, SM, 0, B);  // M^{1/2} Σ M^{1/2}
  const SymmetricEigen eb = symmetric_eigen(0.5 * (B + B.transpose()), true);
  std::vector<int64_t> order(static_cast<size_t>(d));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return eb.values(a) > eb.values(b); });
  Eigen::MatrixXd U(d, d);
  for (int64_t k = 0; k < d; ++k) U.col(k) = eb.vectors.col(order[static_cast<size_t>(k)]);
  Eigen::MatrixXd A(d, d), Ai(d, d);
  gemm<double>(Op::T, Op::N, 1, U, Mh, 0, A);   // A = Uᵀ M^{1/2}
  gemm<double>(Op::N, Op::N, 1, Mih, U, 0, Ai);  // A⁻¹ = M^{-1/2} U
  std::vector<float> a(static_cast<size_t>(d * d)), ai(static_cast<size_t>(d * d));
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) {
      a[static_cast<size_t>(i * d + j)] = static_cast<float>(A(i, j));
      ai[static_cast<size_t>(i * d + j)] = static_cast<float>(Ai(i, j));
    }
  return Rotation::dense_invertible(d, std::move(a), std::move(ai));
}

}  // namespace latentq::probes
