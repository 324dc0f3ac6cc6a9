// latentq/analysis/gemm.h — the probes' one matrix-product seam: C = alpha·op(A)·op(B) + beta·C.
//
// Every large GEMM of the probes (the absorbed attention's scores and outputs, its q_lat and W_UV
// products, the unabsorbed check; the SVD basis's Gram matrix ZᵀZ and its projections, which the KLT
// rotation, the SVD and shared-basis probes use; linear CKA's cross products) goes through gemm()
// below, which calls BLAS level 3:
// cblas_sgemm / cblas_dgemm (reference BLAS, "xGEMM"; here OpenBLAS from Debian's
// libopenblas-pthread-dev, built DYNAMIC_ARCH: it picks its kernel for the CPU at run time, so a
// portable binary still runs AVX2/FMA or AVX-512 kernels where the machine has them). Eigen's own
// product in a portable build is SSE2-only: 21 GFLOP/s against OpenBLAS's 60 on the 2-core Zen 3 CI
// machine (`latentq_bench --benchmark_filter=cpu/attention_sgemm`).
//
// Threading: the study runs cells on its own threads, so BLAS runs one thread per call
// (openblas_set_num_threads(1) on first use). A sequential OpenBLAS build without locking is not safe
// to call from several threads at once (OpenBLAS USE_LOCKING), and the OpenMP build's thread count
// is per calling thread; if the loaded library is either (openblas_get_parallel() != 1), calls are
// serialized by a mutex and blas_backend() says so.
//
// Determinism: for the same shapes and the same CPU kernel the result is bit-for-bit repeatable
// (one thread, fixed blocking). Across CPUs (another kernel) the float sums may differ in the last
// bits; nothing that compares CPU and GPU bytes (the quantizers) goes through here.
#pragma once

#include <string>

#include <Eigen/Dense>

namespace latentq::probes {

template <typename Scalar>
using RowMat = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// A row-major matrix view with unit inner stride and any row stride (a Map, a block of rows or
/// columns of a RowMat): what BLAS can read and write without a copy.
template <typename Scalar>
using RowRef = Eigen::Ref<RowMat<Scalar>, 0, Eigen::OuterStride<>>;
template <typename Scalar>
using ConstRowRef = Eigen::Ref<const RowMat<Scalar>, 0, Eigen::OuterStride<>>;

enum class Op { N, T };  ///< op(X) = X or Xᵀ

/// C = alpha·op(A)·op(B) + beta·C, row-major, Scalar = float (sgemm) or double (dgemm).
/// Shapes: op(A) [m, k], op(B) [k, n], C [m, n] (C is written, never resized). With beta = 0, C's
/// old contents are not read (BLAS semantics: NaN in C does not propagate).
/// Errors: std::invalid_argument if the shapes do not agree, a view's row stride is below its row
/// length (overlapping rows), or a dimension or stride exceeds 2^31 − 1 (the BLAS integer); the
/// message names the shapes or the view.
template <typename Scalar>
void gemm(Op op_a, Op op_b, Scalar alpha, const ConstRowRef<Scalar>& A, const ConstRowRef<Scalar>& B, Scalar beta,
          RowRef<Scalar> C);

/// Column-major (Eigen's default, Eigen::MatrixXd and its blocks): the same product with the same
/// shapes, errors and semantics.
template <typename Scalar>
using ColMat = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic>;
template <typename Scalar>
using ColRef = Eigen::Ref<ColMat<Scalar>, 0, Eigen::OuterStride<>>;
template <typename Scalar>
using ConstColRef = Eigen::Ref<const ColMat<Scalar>, 0, Eigen::OuterStride<>>;
template <typename Scalar>
void gemm(Op op_a, Op op_b, Scalar alpha, const ConstColRef<Scalar>& A, const ConstColRef<Scalar>& B, Scalar beta,
          ColRef<Scalar> C);

/// Which BLAS the probes run on: OpenBLAS's configuration and CPU kernel ("OpenBLAS 0.3.21 ...
/// DYNAMIC_ARCH ... Zen"), and "(serialized)" when calls are serialized (see above).
std::string blas_backend();

}  // namespace latentq::probes
