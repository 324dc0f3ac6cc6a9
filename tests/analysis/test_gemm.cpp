// probes::gemm (latentq/analysis/gemm.h), the probes' one BLAS seam: against the definition
// C[i, j] = alpha·Σ_l op(A)[i, l]·op(B)[l, j] + beta·C[i, j] summed in float64, for every op
// combination, strided views (blocks of larger matrices), beta = 0 over NaN, k = 0, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <cstring>
#include <thread>
#include <vector>

#include "latentq/analysis/gemm.h"

using namespace latentq::probes;

namespace {

template <typename Scalar, typename Mat = RowMat<Scalar>>
Mat random_mat(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  std::normal_distribution<double> nd;
  Mat m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = static_cast<Scalar>(nd(rng));
  return m;
}

// The definition, in float64, on the views' elements.
Eigen::MatrixXd definition(Op oa, Op ob, double alpha, const Eigen::MatrixXd& a, const Eigen::MatrixXd& b, double beta,
                           const Eigen::MatrixXd& C0) {
  const Eigen::MatrixXd opa = oa == Op::T ? Eigen::MatrixXd(a.transpose()) : a;
  const Eigen::MatrixXd opb = ob == Op::T ? Eigen::MatrixXd(b.transpose()) : b;
  Eigen::MatrixXd c = Eigen::MatrixXd::Zero(opa.rows(), opb.cols());
  for (int64_t i = 0; i < c.rows(); ++i)
    for (int64_t j = 0; j < c.cols(); ++j) {
      double s = 0;
      for (int64_t l = 0; l < opa.cols(); ++l) s += opa(i, l) * opb(l, j);
      c(i, j) = alpha * s + (beta != 0 ? beta * C0(i, j) : 0.0);
    }
  return c;
}

// Mat: RowMat<Scalar> or ColMat<Scalar> (the two overloads).
template <typename Scalar, typename Mat>
void check_all_ops(double tol) {
  const uint64_t seed = 20261201;
  std::mt19937_64 rng(seed);
  for (const auto& [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 5, 3}, {33, 65, 130}, {128, 300, 576}}) {
    for (const Op oa : {Op::N, Op::T})
      for (const Op ob : {Op::N, Op::T})
        for (const double beta : {0.0, 1.0, -0.5}) {
          // Views: each operand a block (rows 1.., columns 2..) of a wider matrix, so the row stride
          // exceeds the row length; C too.
          const int64_t ar = oa == Op::T ? k : m, ac = oa == Op::T ? m : k;
          const int64_t br = ob == Op::T ? n : k, bc = ob == Op::T ? k : n;
          const Mat Abig = random_mat<Scalar, Mat>(ar + 1, ac + 3, rng),
                    Bbig = random_mat<Scalar, Mat>(br + 2, bc + 1, rng);
          Mat Cbig = random_mat<Scalar, Mat>(m + 1, n + 4, rng);
          const auto A = Abig.block(1, 2, ar, ac);
          const auto B = Bbig.block(2, 0, br, bc);
          auto C = Cbig.block(1, 3, m, n);
          const Eigen::MatrixXd C0 = C.template cast<double>();
          if (beta == 0) C.setConstant(std::numeric_limits<Scalar>::quiet_NaN());  // must not be read
          const Mat Cbefore = Cbig;
          gemm<Scalar>(oa, ob, Scalar(0.75), A, B, static_cast<Scalar>(beta), C);
          const Eigen::MatrixXd want =
              definition(oa, ob, 0.75, A.template cast<double>(), B.template cast<double>(), beta, C0);
          const std::string at = std::string(Mat::IsRowMajor ? "row-major" : "column-major") + ", seed " +
                                 std::to_string(seed) + ", m " + std::to_string(m) + " n " + std::to_string(n) + " k " +
                                 std::to_string(k) + ", op(A) " + (oa == Op::T ? "T" : "N") + ", op(B) " +
                                 (ob == Op::T ? "T" : "N") + ", beta " + std::to_string(beta);
          // Each element against the float64 sum, relative to the sum of |terms| (the rounding bound's scale).
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              const double scale_ij = 0.75 * static_cast<double>(k) * 4.0 + std::abs(beta * C0(i, j)) + 1.0;
              ASSERT_NEAR(static_cast<double>(C(i, j)), want(i, j), tol * scale_ij)
                  << at << " at (" << i << ", " << j << ")";
            }
          // Nothing outside the view of C is written.
          for (int64_t i = 0; i < Cbig.rows(); ++i)
            for (int64_t j = 0; j < Cbig.cols(); ++j)
              if (i < 1 || j < 3 || j >= 3 + n)
                ASSERT_EQ(Cbig(i, j), Cbefore(i, j)) << at << " outside the view at (" << i << ", " << j << ")";
        }
  }
}

}  // namespace

TEST(Gemm, FloatMatchesTheDefinitionForEveryOpAndStride) {
  check_all_ops<float, RowMat<float>>(1e-6);
  check_all_ops<float, ColMat<float>>(1e-6);
}
TEST(Gemm, DoubleMatchesTheDefinitionForEveryOpAndStride) {
  check_all_ops<double, RowMat<double>>(1e-14);
  check_all_ops<double, ColMat<double>>(1e-14);
}

TEST(Gemm, HandComputed2x2) {
  RowMat<float> A(2, 3), B(3, 2), C(2, 2);
  A << 1, 2, 3, 4, 5, 6;
  B << 7, 8, 9, 10, 11, 12;
  C << 1, 1, 1, 1;
  gemm<float>(Op::N, Op::N, 1, A, B, 2, C);  // A·B = [[58, 64], [139, 154]], + 2·1
  EXPECT_EQ(C(0, 0), 60);
  EXPECT_EQ(C(0, 1), 66);
  EXPECT_EQ(C(1, 0), 141);
  EXPECT_EQ(C(1, 1), 156);
  gemm<float>(Op::T, Op::T, 1, B, A, 0, C);  // Bᵀ·Aᵀ = (A·B)ᵀ
  EXPECT_EQ(C(0, 0), 58);
  EXPECT_EQ(C(0, 1), 139);
  EXPECT_EQ(C(1, 0), 64);
  EXPECT_EQ(C(1, 1), 154);
}

TEST(Gemm, OverlappingRowsAreAnError) {
  std::vector<float> buf(64, 1.0f);
  // 3 rows of 4 floats, 2 apart: rows overlap; BLAS would read other elements than the view's.
  const Eigen::Map<const RowMat<float>, 0, Eigen::OuterStride<>> A(buf.data(), 3, 4, Eigen::OuterStride<>(2));
  RowMat<float> B = RowMat<float>::Ones(4, 2), C(3, 2);
  try {
    gemm<float>(Op::N, Op::N, 1, A, B, 0, C);
    FAIL() << "no error for an overlapping view";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("A's outer stride 2 is below its row length 4"), std::string::npos)
        << e.what();
  }
  // One row may have any stride.
  const Eigen::Map<const RowMat<float>, 0, Eigen::OuterStride<>> row(buf.data(), 1, 4, Eigen::OuterStride<>(1));
  RowMat<float> c1(1, 2);
  gemm<float>(Op::N, Op::N, 1, row, B, 0, c1);
  EXPECT_EQ(c1(0, 0), 4.0f);
}

TEST(Gemm, EmptyInnerDimensionScalesC) {
  RowMat<double> A(2, 0), B(0, 3), C = RowMat<double>::Constant(2, 3, 4.0);
  gemm<double>(Op::N, Op::N, 1, A, B, 0.5, C);
  EXPECT_TRUE((C.array() == 2.0).all());
  C.setConstant(std::numeric_limits<double>::quiet_NaN());
  gemm<double>(Op::N, Op::N, 1, A, B, 0, C);
  EXPECT_TRUE((C.array() == 0.0).all());
}

TEST(Gemm, ShapeMismatchIsAnErrorNamingTheShapes) {
  RowMat<float> A(2, 3), B(4, 2), C(2, 2);
  try {
    gemm<float>(Op::N, Op::N, 1, A, B, 0, C);
    FAIL() << "no error for [2, 3]·[4, 2]";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("A [2, 3], B [4, 2], C [2, 2]"), std::string::npos) << e.what();
  }
  RowMat<float> C3(3, 2);
  EXPECT_THROW(gemm<float>(Op::N, Op::T, 1, A, RowMat<float>(2, 3), 0, C3), std::invalid_argument);
}

TEST(Gemm, BackendNamesOpenBlas) {
  const std::string b = blas_backend();
  EXPECT_NE(b.find("OpenBLAS"), std::string::npos) << b;
}

// The study calls gemm from its cell threads at once: each thread's result must be the bytes of the
// same product computed alone (the library is thread-safe and runs one thread per call, fixed blocking).
TEST(Gemm, ConcurrentCallsGiveTheBytesOfASingleCall) {
  std::mt19937_64 rng(77);
  const RowMat<float> A = random_mat<float>(128, 576, rng), B = random_mat<float>(700, 576, rng);
  RowMat<float> alone(128, 700);
  gemm<float>(Op::N, Op::T, 1, A, B, 0, alone);
  constexpr int kThreads = 4, kRepeats = 20;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      RowMat<float> C(128, 700);
      for (int r = 0; r < kRepeats; ++r) {
        gemm<float>(Op::N, Op::T, 1, A, B, 0, C);
        mismatches[t] += std::memcmp(C.data(), alone.data(), sizeof(float) * C.size()) != 0;
      }
    });
  for (auto& th : ts) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t << " of " << kThreads << ", seed 77";
}
