// probes::symmetric_eigen (latentq/analysis/lapack.h), the probes' one eigensolver seam (LAPACK dsyevd):
// a hand-computed 2×2, the definition A·v = λ·v and orthonormality on random symmetric matrices (fixed
// seeds), eigenvalues against Eigen's own solver (independent code), values only, the lower triangle
// alone is read, and the errors.
#include <gtest/gtest.h>

#include <Eigen/Eigenvalues>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>

#include "latentq/analysis/lapack.h"

using namespace latentq::probes;

namespace {

Eigen::MatrixXd random_symmetric(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  Eigen::MatrixXd X(3 * n + 1, n);
  for (int64_t i = 0; i < X.size(); ++i) X.data()[i] = nd(rng);
  return X.transpose() * X;  // a Gram matrix, as the probes decompose
}

std::string what(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

TEST(SymmetricEigen, HandComputed2x2) {
  // [[2, 1], [1, 2]]: λ = 1 with (1, −1)/√2 and λ = 3 with (1, 1)/√2, ascending.
  Eigen::MatrixXd A(2, 2);
  A << 2, 1, 1, 2;
  const SymmetricEigen e = symmetric_eigen(A, true);
  ASSERT_EQ(e.values.size(), 2);
  EXPECT_NEAR(e.values[0], 1.0, 1e-15);
  EXPECT_NEAR(e.values[1], 3.0, 1e-15);
  ASSERT_EQ(e.vectors.rows(), 2);
  ASSERT_EQ(e.vectors.cols(), 2);
  const double h = std::sqrt(0.5);
  EXPECT_NEAR(std::abs(e.vectors(0, 0)), h, 1e-15);
  EXPECT_NEAR(e.vectors(0, 0), -e.vectors(1, 0), 1e-15);
  EXPECT_NEAR(std::abs(e.vectors(0, 1)), h, 1e-15);
  EXPECT_NEAR(e.vectors(0, 1), e.vectors(1, 1), 1e-15);
}

TEST(SymmetricEigen, DefinitionOrthonormalityAndEigenValuesAgree) {
  for (int64_t n : {1, 7, 64, 200}) {
    for (uint64_t seed : {1u, 2u}) {
      SCOPED_TRACE("n = " + std::to_string(n) + ", seed = " + std::to_string(seed));
      const Eigen::MatrixXd A = random_symmetric(n, seed);
      const SymmetricEigen e = symmetric_eigen(A, true);
      ASSERT_EQ(e.values.size(), n);
      for (int64_t j = 1; j < n; ++j) EXPECT_LE(e.values[j - 1], e.values[j]) << "not ascending at " << j;
      const double scale = e.values.cwiseAbs().maxCoeff();
      // A·V = V·diag(λ) and VᵀV = I.
      EXPECT_LE((A * e.vectors - e.vectors * e.values.asDiagonal()).cwiseAbs().maxCoeff(), 1e-12 * scale);
      EXPECT_LE((e.vectors.transpose() * e.vectors - Eigen::MatrixXd::Identity(n, n)).cwiseAbs().maxCoeff(), 1e-12);
      // Eigen's own solver (Householder tridiagonalization + implicit QR, code we did not write).
      const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> ref(A, Eigen::EigenvaluesOnly);
      EXPECT_LE((e.values - ref.eigenvalues()).cwiseAbs().maxCoeff(), 1e-12 * scale);
      // Values only: the same values, no vectors.
      const SymmetricEigen v = symmetric_eigen(A, false);
      EXPECT_EQ(v.vectors.size(), 0);
      EXPECT_LE((v.values - e.values).cwiseAbs().maxCoeff(), 1e-12 * scale);
    }
  }
}

TEST(SymmetricEigen, ReadsTheLowerTriangleOnly) {
  Eigen::MatrixXd A = random_symmetric(16, 3);
  const SymmetricEigen full = symmetric_eigen(A, true);
  for (int64_t j = 1; j < 16; ++j)
    for (int64_t i = 0; i < j; ++i) A(i, j) = std::numeric_limits<double>::quiet_NaN();  // strict upper triangle
  const SymmetricEigen lower = symmetric_eigen(A, true);
  EXPECT_EQ(lower.values, full.values);
  EXPECT_EQ(lower.vectors, full.vectors);
}

TEST(SymmetricEigen, EmptyAndErrors) {
  EXPECT_EQ(symmetric_eigen(Eigen::MatrixXd(0, 0), true).values.size(), 0);
  EXPECT_NE(what([] { symmetric_eigen(Eigen::MatrixXd::Zero(2, 3), true); }).find("[2, 3], not square"),
            std::string::npos);
  Eigen::MatrixXd A = Eigen::MatrixXd::Identity(3, 3);
  A(2, 1) = std::numeric_limits<double>::infinity();
  EXPECT_NE(what([&] { symmetric_eigen(A, false); }).find("NaN/Inf in the lower triangle of the [3, 3] matrix"),
            std::string::npos);
}
