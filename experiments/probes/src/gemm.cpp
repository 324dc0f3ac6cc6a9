#include "latentq/probes/gemm.h"

#include <cblas.h>

#include <climits>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

namespace latentq::probes {

namespace {

struct Blas {
  bool serialize = false;
  std::string name;
  std::mutex mu;
  Blas() {
    openblas_set_num_threads(1);
    serialize = openblas_get_parallel() == 0;
    name = std::string(openblas_get_config()) + ", kernel " + openblas_get_corename();
    if (serialize) name += " (sequential build: calls serialized)";
  }
};

Blas& blas() {
  static Blas b;  // thread-safe initialization (C++11 magic statics)
  return b;
}

std::string shape(int64_t rows, int64_t cols, Op op) {
  return std::string(op == Op::T ? "transposed " : "") + "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

int blas_int(int64_t n, const char* what) {
  if (n < 0 || n > INT_MAX)
    throw std::invalid_argument(std::string("gemm: ") + what + " " + std::to_string(n) + " exceeds the BLAS integer (2^31 - 1)");
  return static_cast<int>(n);
}

void call(int m, int n, int k, float alpha, const float* A, int lda, bool ta, const float* B, int ldb, bool tb,
          float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda,
              B, ldb, beta, C, ldc);
}
void call(int m, int n, int k, double alpha, const double* A, int lda, bool ta, const double* B, int ldb, bool tb,
          double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda,
              B, ldb, beta, C, ldc);
}

}  // namespace

template <typename Scalar>
void gemm(Op op_a, Op op_b, Scalar alpha, const ConstRowRef<Scalar>& A, const ConstRowRef<Scalar>& B, Scalar beta,
          RowRef<Scalar> C) {
  const bool ta = op_a == Op::T, tb = op_b == Op::T;
  const int64_t m = ta ? A.cols() : A.rows(), k = ta ? A.rows() : A.cols();
  const int64_t kb = tb ? B.cols() : B.rows(), n = tb ? B.rows() : B.cols();
  if (k != kb || C.rows() != m || C.cols() != n)
    throw std::invalid_argument("gemm: shapes do not agree: A " + shape(A.rows(), A.cols(), op_a) + ", B " +
                                shape(B.rows(), B.cols(), op_b) + ", C [" + std::to_string(C.rows()) + ", " +
                                std::to_string(C.cols()) + "]");
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS would scale C by beta; do the same without calling it with k = 0
    if (beta == Scalar(0)) C.setZero();
    else C *= beta;
    return;
  }
  // Row-major leading dimensions: the row stride, at least the row length (BLAS requires lda >= cols).
  const auto ld = [](int64_t stride, int64_t cols) { return stride > cols ? stride : (cols > 0 ? cols : 1); };
  const int im = blas_int(m, "m"), in = blas_int(n, "n"), ik = blas_int(k, "k");
  const int lda = blas_int(ld(A.outerStride(), A.cols()), "A's row stride");
  const int ldb = blas_int(ld(B.outerStride(), B.cols()), "B's row stride");
  const int ldc = blas_int(ld(C.outerStride(), C.cols()), "C's row stride");
  Blas& b = blas();
  if (b.serialize) {
    const std::lock_guard<std::mutex> lock(b.mu);
    call(im, in, ik, alpha, A.data(), lda, ta, B.data(), ldb, tb, beta, C.data(), ldc);
  } else {
    call(im, in, ik, alpha, A.data(), lda, ta, B.data(), ldb, tb, beta, C.data(), ldc);
  }
}

template void gemm<float>(Op, Op, float, const ConstRowRef<float>&, const ConstRowRef<float>&, float, RowRef<float>);
template void gemm<double>(Op, Op, double, const ConstRowRef<double>&, const ConstRowRef<double>&, double,
                           RowRef<double>);

std::string blas_backend() { return blas().name; }

}  // namespace latentq::probes
