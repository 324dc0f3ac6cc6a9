// Internal helpers of latentq_analysis and latentq_attention (not a public API).
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "latentq/analysis/gemm.h"
#include "latentq/quantize.h"

namespace latentq::probes::detail {

using Ranges = std::span<const std::pair<int64_t, int64_t>>;

inline int64_t count_rows(Ranges rows) {
  int64_t n = 0;
  for (const auto& [b, e] : rows) n += e - b;
  return n;
}

/// Rows of X [T, D] (row-major float32) inside `rows`, as a float64 [n, D] matrix.
inline Eigen::MatrixXd gather_rows(const float* X, int64_t T, int64_t D, Ranges rows) {
  Eigen::MatrixXd out(count_rows(rows), D);
  int64_t i = 0;
  for (const auto& [b, e] : rows) {
    if (b < 0 || e > T || b > e)
      throw std::invalid_argument("row range [" + std::to_string(b) + ", " + std::to_string(e) + ") outside the " +
                                  std::to_string(T) + " tokens");
    for (int64_t t = b; t < e; ++t, ++i) out.row(i) = Eigen::Map<const Eigen::RowVectorXf>(X + t * D, D).cast<double>();
  }
  return out;
}

/// Throws std::invalid_argument naming `what` if x [n] has NaN/Inf.
inline void require_finite(const float* x, int64_t n, const std::string& what) {
  const int64_t bad = latentq::count_nonfinite(x, n);
  if (bad > 0) throw std::invalid_argument(what + ": " + std::to_string(bad) + " NaN/Inf value(s)");
}

/// Squared column norms of (X − μ)·V: energy of X − μ along each basis direction, [D].
inline Eigen::VectorXd projected_energy(const Eigen::MatrixXd& X, const Eigen::VectorXd& mean,
                                        const Eigen::MatrixXd& V) {
  const Eigen::MatrixXd Z = X.rowwise() - mean.transpose();
  Eigen::MatrixXd Y(X.rows(), V.cols());
  gemm<double>(Op::N, Op::N, 1, Z, V, 0, Y);
  return Y.colwise().squaredNorm().transpose();
}

}  // namespace latentq::probes::detail
