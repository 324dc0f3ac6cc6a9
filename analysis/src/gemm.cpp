// The probes' BLAS/LAPACK seams: gemm() (latentq/analysis/gemm.h) and symmetric_eigen() (latentq/analysis/lapack.h),
// both on OpenBLAS, with one thread per call and the same serialization rule.
#include "latentq/analysis/gemm.h"
#include "latentq/analysis/lapack.h"

#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <climits>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

// LAPACK's Fortran entry point in OpenBLAS (reference LAPACK 3.x, dsyevd.f), with gfortran's hidden
// lengths of the two CHARACTER arguments at the end (LAPACK_FORTRAN_STRLEN_END).
extern "C" void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
                        double* work, const int* lwork, int* iwork, const int* liwork, int* info, size_t jobz_len,
                        size_t uplo_len);

namespace latentq::probes {

namespace {

struct Blas {
  bool serialize = false;
  std::string name;
  std::mutex mu;
  Blas() {
    openblas_set_num_threads(1);
    // 1: the pthread build, thread-safe and now one thread per call. 0: a sequential build, possibly
    // without locking; 2: the OpenMP build, whose thread count is per calling thread: serialize both.
    const int parallel = openblas_get_parallel();
    serialize = parallel != 1;
    name = std::string(openblas_get_config()) + ", kernel " + openblas_get_corename();
    if (serialize)
      name += parallel == 0 ? " (sequential build: calls serialized)" : " (OpenMP build: calls serialized)";
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
    throw std::invalid_argument(std::string("gemm: ") + what + " " + std::to_string(n) +
                                " exceeds the BLAS integer (2^31 - 1)");
  return static_cast<int>(n);
}

void call(CBLAS_ORDER order, int m, int n, int k, float alpha, const float* A, int lda, bool ta, const float* B,
          int ldb, bool tb, float beta, float* C, int ldc) {
  cblas_sgemm(order, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda, B, ldb,
              beta, C, ldc);
}
void call(CBLAS_ORDER order, int m, int n, int k, double alpha, const double* A, int lda, bool ta, const double* B,
          int ldb, bool tb, double beta, double* C, int ldc) {
  cblas_dgemm(order, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda, B, ldb,
              beta, C, ldc);
}

// The product on Eigen views of one storage order (RowMajor: leading dimension = the row stride,
// at least the row length; ColMajor: the column stride, at least the column length).
template <CBLAS_ORDER Order, typename Scalar, typename ConstView, typename View>
void gemm_on(Op op_a, Op op_b, Scalar alpha, const ConstView& A, const ConstView& B, Scalar beta, View& C) {
  const bool ta = op_a == Op::T, tb = op_b == Op::T;
  const int64_t m = ta ? A.cols() : A.rows(), k = ta ? A.rows() : A.cols();
  const int64_t kb = tb ? B.cols() : B.rows(), n = tb ? B.rows() : B.cols();
  if (k != kb || C.rows() != m || C.cols() != n)
    throw std::invalid_argument("gemm: shapes do not agree: A " + shape(A.rows(), A.cols(), op_a) + ", B " +
                                shape(B.rows(), B.cols(), op_b) + ", C [" + std::to_string(C.rows()) + ", " +
                                std::to_string(C.cols()) + "]");
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS would scale C by beta; do the same without calling it with k = 0
    if (beta == Scalar(0))
      C.setZero();
    else
      C *= beta;
    return;
  }
  // The leading dimension: the view's outer stride, which must cover a whole row (row-major) or column
  // (column-major) unless there is only one; a single one may have any stride (BLAS wants ≥ its length).
  const auto ld = [](const auto& X, const char* what) -> int {
    const int64_t len = Order == CblasRowMajor ? X.cols() : X.rows();
    const int64_t count = Order == CblasRowMajor ? X.rows() : X.cols();
    const int64_t stride = X.outerStride();
    if (count > 1 && stride < len)
      throw std::invalid_argument(std::string("gemm: ") + what + "'s outer stride " + std::to_string(stride) +
                                  " is below its " + (Order == CblasRowMajor ? "row" : "column") + " length " +
                                  std::to_string(len) + " (overlapping views)");
    return blas_int(count > 1 ? stride : std::max<int64_t>(len, 1), what);
  };
  const int im = blas_int(m, "m"), in = blas_int(n, "n"), ik = blas_int(k, "k");
  const int lda = ld(A, "A"), ldb = ld(B, "B"), ldc = ld(C, "C");
  Blas& b = blas();
  if (b.serialize) {
    const std::lock_guard<std::mutex> lock(b.mu);
    call(Order, im, in, ik, alpha, A.data(), lda, ta, B.data(), ldb, tb, beta, C.data(), ldc);
  } else {
    call(Order, im, in, ik, alpha, A.data(), lda, ta, B.data(), ldb, tb, beta, C.data(), ldc);
  }
}

}  // namespace

template <typename Scalar>
void gemm(Op op_a, Op op_b, Scalar alpha, const ConstRowRef<Scalar>& A, const ConstRowRef<Scalar>& B, Scalar beta,
          RowRef<Scalar> C) {
  gemm_on<CblasRowMajor>(op_a, op_b, alpha, A, B, beta, C);
}

template <typename Scalar>
void gemm(Op op_a, Op op_b, Scalar alpha, const ConstColRef<Scalar>& A, const ConstColRef<Scalar>& B, Scalar beta,
          ColRef<Scalar> C) {
  gemm_on<CblasColMajor>(op_a, op_b, alpha, A, B, beta, C);
}

template void gemm<float>(Op, Op, float, const ConstRowRef<float>&, const ConstRowRef<float>&, float, RowRef<float>);
template void gemm<double>(Op, Op, double, const ConstRowRef<double>&, const ConstRowRef<double>&, double,
                           RowRef<double>);
template void gemm<float>(Op, Op, float, const ConstColRef<float>&, const ConstColRef<float>&, float, ColRef<float>);
template void gemm<double>(Op, Op, double, const ConstColRef<double>&, const ConstColRef<double>&, double,
                           ColRef<double>);

std::string blas_backend() { return blas().name; }

SymmetricEigen symmetric_eigen(const Eigen::MatrixXd& A, bool vectors) {
  if (A.rows() != A.cols())
    throw std::invalid_argument("symmetric_eigen: the matrix is [" + std::to_string(A.rows()) + ", " +
                                std::to_string(A.cols()) + "], not square");
  const int n = blas_int(A.rows(), "symmetric_eigen: n");
  SymmetricEigen out;
  out.values.resize(n);
  if (n == 0) return out;
  if (!A.triangularView<Eigen::Lower>().toDenseMatrix().allFinite())
    throw std::invalid_argument("symmetric_eigen: NaN/Inf in the lower triangle of the [" + std::to_string(n) + ", " +
                                std::to_string(n) + "] matrix");
  Eigen::MatrixXd a = A;  // DSYEVD overwrites A with the eigenvectors
  const char jobz = vectors ? 'V' : 'N', uplo = 'L';
  int info = 0, lwork = -1, liwork = -1, iwork_query = 0;
  double work_query = 0;
  Blas& b = blas();
  auto run = [&] {
    // Workspace query (LWORK = LIWORK = -1), then the decomposition.
    dsyevd_(&jobz, &uplo, &n, a.data(), &n, out.values.data(), &work_query, &lwork, &iwork_query, &liwork, &info, 1, 1);
    if (info != 0) return;
    lwork = static_cast<int>(work_query);
    liwork = iwork_query;
    std::vector<double> work(static_cast<size_t>(std::max(lwork, 1)));
    std::vector<int> iwork(static_cast<size_t>(std::max(liwork, 1)));
    dsyevd_(&jobz, &uplo, &n, a.data(), &n, out.values.data(), work.data(), &lwork, iwork.data(), &liwork, &info, 1, 1);
  };
  if (b.serialize) {
    const std::lock_guard<std::mutex> lock(b.mu);
    run();
  } else {
    run();
  }
  assert(info >= 0 && "dsyevd: an argument was illegal");  // an internal error: the arguments are ours
  if (info != 0)
    throw std::runtime_error("symmetric_eigen: LAPACK dsyevd did not converge on the [" + std::to_string(n) + ", " +
                             std::to_string(n) + "] matrix (INFO = " + std::to_string(info) + ")");
  if (vectors)
    out.vectors = std::move(a);
  else
    out.vectors.resize(0, 0);
  return out;
}

}  // namespace latentq::probes
