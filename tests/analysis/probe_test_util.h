// Helpers shared by the probe tests: seeded random matrices.
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <random>
#include <vector>

namespace probe_test {

using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// [rows, cols] iid N(0, sd²), float64.
inline Eigen::MatrixXd gaussian(std::mt19937_64& rng, int64_t rows, int64_t cols, double sd = 1.0) {
  std::normal_distribution<double> nd(0.0, sd);
  Eigen::MatrixXd m(rows, cols);
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i) m(i, j) = nd(rng);
  return m;
}

/// [n] iid N(0, sd²) as float32.
inline std::vector<float> gaussian_vec(std::mt19937_64& rng, int64_t n, double sd = 1.0) {
  std::normal_distribution<double> nd(0.0, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(nd(rng));
  return v;
}

/// [n, k] with orthonormal columns (k ≤ n), from the QR of a Gaussian matrix.
inline Eigen::MatrixXd orthonormal(std::mt19937_64& rng, int64_t n, int64_t k) {
  const Eigen::HouseholderQR<Eigen::MatrixXd> qr(gaussian(rng, n, k));
  return qr.householderQ() * Eigen::MatrixXd::Identity(n, k);
}

/// Row-major float32 copy of a float64 matrix.
inline std::vector<float> to_row_major_f32(const Eigen::MatrixXd& m) {
  std::vector<float> v(static_cast<size_t>(m.size()));
  Eigen::Map<RowMatF>(v.data(), m.rows(), m.cols()) = m.cast<float>();
  return v;
}

}  // namespace probe_test
