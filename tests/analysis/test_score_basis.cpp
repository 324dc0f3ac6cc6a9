// The score-metric KLT (latentq/analysis/score_basis.h, transform `sklt`): the components are uncorrelated on the
// fit split in descending order, the score error is the squared error of the transformed coordinates
// (AᵀA = the floored metric), A⁻¹ inverts A, M = I gives the KLT, the floor caps the condition number, and the
// metric of the fit split's query rows with its refusals.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "latentq/analysis/fit_transform.h"
#include "latentq/analysis/rate_distortion.h"
#include "latentq/analysis/score_basis.h"
#include "latentq/analysis/svd_probe.h"

using namespace latentq;
using namespace latentq::probes;

namespace {

// Rows [T, D] with per-channel scales 2^(−j/4) and a random mixing, seeded: a correlated latent-like matrix.
std::vector<float> latents(int64_t T, int64_t D, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n;
  Eigen::MatrixXd Mix(D, D);
  for (int64_t i = 0; i < D * D; ++i) Mix.data()[i] = n(rng);
  std::vector<float> X(static_cast<size_t>(T * D));
  Eigen::VectorXd z(D);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < D; ++j) z(j) = n(rng) * std::pow(2.0, -static_cast<double>(j) / 4);
    const Eigen::VectorXd x = Mix * z;
    for (int64_t j = 0; j < D; ++j) X[t * D + j] = static_cast<float>(x(j));
  }
  return X;
}

// A symmetric positive definite metric with eigenvalues 10^(−5·i/(D−1)) (the last below the floor).
Eigen::MatrixXd metric(int64_t D, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n;
  Eigen::MatrixXd G(D, D);
  for (int64_t i = 0; i < D * D; ++i) G.data()[i] = n(rng);
  const Eigen::HouseholderQR<Eigen::MatrixXd> qr(G);
  const Eigen::MatrixXd V = qr.householderQ();
  Eigen::VectorXd w(D);
  for (int64_t i = 0; i < D; ++i) w(i) = std::pow(10.0, -5.0 * static_cast<double>(i) / static_cast<double>(D - 1));
  return V * w.asDiagonal() * V.transpose();
}

Eigen::MatrixXd as_matrix(const std::vector<float>& v, int64_t D) {
  Eigen::MatrixXd M(D, D);
  for (int64_t i = 0; i < D; ++i)
    for (int64_t j = 0; j < D; ++j) M(i, j) = v[static_cast<size_t>(i * D + j)];
  return M;
}

}  // namespace

TEST(ScoreBasis, DecorrelatesTheFitSplitAndWeighsByTheMetric) {
  for (const uint64_t seed : {1u, 2u, 3u}) {
    const int64_t T = 600, D = 12;
    const std::vector<float> X = latents(T, D, seed);
    const std::vector<int64_t> so = {0, 300, 600};  // fit split: the first sequence
    const Eigen::MatrixXd M = metric(D, seed + 100);
    const Rotation r = fit_score_rotation(X.data(), T, D, so, M);
    ASSERT_FALSE(r.orthogonal());
    const Eigen::MatrixXd A = as_matrix(r.matrix(), D), Ai = as_matrix(r.inverse_matrix(), D);
    EXPECT_LT((A * Ai - Eigen::MatrixXd::Identity(D, D)).cwiseAbs().maxCoeff(), 1e-4) << "seed " << seed;
    // AᵀA = M with its eigenvalues floored at kScoreMetricFloor·max (here 1e-4: the last four of 10^(-5i/11))
    const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> em(M);
    const Eigen::VectorXd wf = em.eigenvalues().cwiseMax(kScoreMetricFloor * em.eigenvalues().maxCoeff());
    const Eigen::MatrixXd Mf = em.eigenvectors() * wf.asDiagonal() * em.eigenvectors().transpose();
    EXPECT_LT((A.transpose() * A - Mf).cwiseAbs().maxCoeff(), 1e-5 * Mf.cwiseAbs().maxCoeff()) << "seed " << seed;
    // the fit split's transformed second moment is diagonal, descending
    Eigen::MatrixXd Y(300, D);
    for (int64_t t = 0; t < 300; ++t)
      for (int64_t j = 0; j < D; ++j) Y(t, j) = X[t * D + j];
    const Eigen::MatrixXd S = (Y * A.transpose()).transpose() * (Y * A.transpose()) / 300.0;
    for (int64_t i = 0; i < D; ++i) {
      if (i + 1 < D) EXPECT_GE(S(i, i), S(i + 1, i + 1)) << "seed " << seed << ", component " << i;
      for (int64_t j = 0; j < D; ++j)
        if (i != j) EXPECT_LT(std::fabs(S(i, j)), 1e-5 * S(0, 0)) << "seed " << seed << " (" << i << ", " << j << ")";
    }
  }
}

TEST(ScoreBasis, IdentityMetricGivesTheKlt) {
  const int64_t T = 400, D = 10;
  const std::vector<float> X = latents(T, D, 7);
  const std::vector<int64_t> so = {0, 200, 400};
  const Eigen::MatrixXd A = as_matrix(fit_score_rotation(X.data(), T, D, so, Eigen::MatrixXd::Identity(D, D)).matrix(), D);
  const Eigen::MatrixXd K = as_matrix(fit_rotation(Transform::parse("klt"), X.data(), T, D, so).matrix(), D);
  for (int64_t i = 0; i < D; ++i)  // each row the same principal direction, up to its sign
    EXPECT_NEAR(std::fabs(A.row(i).dot(K.row(i))), 1.0, 1e-5) << "row " << i;
}

TEST(ScoreBasis, FitScoreMetricReadsTheFitSplitsQueryRows) {
  // H = 1, dq = d = 2, no W (k_pe's form): rows at tokens 1 and 5; the fit split is tokens [0, 4)
  const std::vector<float> q = {1, 2, 10, 20};
  const std::vector<int32_t> rows = {1, 5};
  const std::vector<int64_t> so = {0, 4, 8};
  const Eigen::MatrixXd M = fit_score_metric(q, {}, rows, 1, 2, 2, so, 8);
  EXPECT_DOUBLE_EQ(M(0, 0), 1.0);  // only the row at token 1: q qᵀ = [[1, 2], [2, 4]]
  EXPECT_DOUBLE_EQ(M(0, 1), 2.0);
  EXPECT_DOUBLE_EQ(M(1, 1), 4.0);
  const std::vector<int32_t> late = {5, 6};
  try {
    fit_score_metric(q, {}, late, 1, 2, 2, so, 8);
    FAIL() << "no query row in the fit split must throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("none of the 2 query rows lies in the fit split (4 of 8 tokens)"),
              std::string::npos)
        << e.what();
  }
  const std::vector<int32_t> bad = {1, 8};
  EXPECT_THROW(fit_score_metric(q, {}, bad, 1, 2, 2, so, 8), std::invalid_argument);
  EXPECT_THROW(fit_score_metric(q, {}, rows, 1, 3, 3, so, 8), std::invalid_argument);  // 4 values, not 2·1·3
}

TEST(ScoreBasis, Refusals) {
  const std::vector<float> X = latents(40, 4, 3);
  const std::vector<int64_t> so = {0, 20, 40};
  EXPECT_THROW(fit_score_rotation(X.data(), 40, 4, so, Eigen::MatrixXd::Zero(4, 4)), std::invalid_argument);
  EXPECT_THROW(fit_score_rotation(X.data(), 40, 4, so, Eigen::MatrixXd::Identity(3, 3)), std::invalid_argument);
  try {
    fit_rotation(Transform::parse("sklt"), X.data(), 40, 4, so);
    FAIL() << "sklt without a metric must throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("sklt needs the score metric"), std::string::npos) << e.what();
  }
  std::vector<float> nan = X;
  nan[3] = std::nanf("");
  EXPECT_THROW(fit_score_rotation(nan.data(), 40, 4, so, Eigen::MatrixXd::Identity(4, 4)), std::invalid_argument);
}
