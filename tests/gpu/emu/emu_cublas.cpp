// tests/gpu/emu/emu_cublas.cpp — the host emulator's cuBLAS subset (cublas_v2.h beside this).
#include "cublas_v2.h"

#include <algorithm>

struct cublasContext {
  cublasMath_t mode = CUBLAS_DEFAULT_MATH;
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success" : s == CUBLAS_STATUS_INVALID_VALUE ? "invalid value" : "error";
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                                         int n, int k, const float* alpha, const float* A, int lda, long long sA,
                                         const float* B, int ldb, long long sB, const float* beta, float* C, int ldc,
                                         long long sC, int batch) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < std::max(1, ta == CUBLAS_OP_N ? m : k) || ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) ||
      ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  for (int b = 0; b < batch; ++b) {
    const float* Ab = A + b * sA;
    const float* Bb = B + b * sB;
    float* Cb = C + b * sC;
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float acc = 0;
        for (int l = 0; l < k; ++l) {
          const float a =
              ta == CUBLAS_OP_N ? Ab[i + static_cast<long long>(l) * lda] : Ab[l + static_cast<long long>(i) * lda];
          const float x =
              tb == CUBLAS_OP_N ? Bb[l + static_cast<long long>(j) * ldb] : Bb[j + static_cast<long long>(l) * ldb];
          acc += a * x;
        }
        float& c = Cb[i + static_cast<long long>(j) * ldc];
        c = *beta == 0 ? *alpha * acc : *alpha * acc + *beta * c;
      }
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
  return cublasSgemmStridedBatched(handle, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}
