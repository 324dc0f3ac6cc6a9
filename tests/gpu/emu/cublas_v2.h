// tests/gpu/emu/cublas_v2.h — host emulator stand-in for the cuBLAS calls of kernels/attention/attention.cu
// (see cuda_emu.h): column-major sgemm and strided-batched sgemm on host memory, with cuBLAS's argument
// rules (cuBLAS documentation, "cublas<t>gemm()": CUBLAS_STATUS_INVALID_VALUE if m, n or k < 0, or a leading
// dimension below the rows of the stored matrix: lda < max(1, m) for op N, max(1, k) for op T; ldb likewise
// with k / n; ldc < max(1, m)). beta = 0 does not read C. Sums in float, in k order. Never on the include
// path of a real CUDA build.
#pragma once

struct cublasContext;
using cublasHandle_t = cublasContext*;
enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_PEDANTIC_MATH = 2 };

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
const char* cublasGetStatusName(cublasStatus_t s);
const char* cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long strideA, const float* B, int ldb, long long strideB,
                                         const float* beta, float* C, int ldc, long long strideC, int batchCount);
