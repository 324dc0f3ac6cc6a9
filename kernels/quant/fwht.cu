// kernels/quant/fwht.cu — the randomized Hadamard transform (latentq/transform.h) on the device:
// one CUDA block per (row, Hadamard block), the block's `block` floats in shared memory, butterfly
// stages h = 1, 2, ..., block/2 separated by __syncthreads (within a stage every pair (i, i+h) is
// independent, and a + b, a − b are single IEEE float32 operations, so the thread order does not
// matter), then one multiply by the host-computed float32 constant. Byte-identical to
// latentq::fwht_rows (the signs are exact ±1 multiplies, before the stages forward, after inverse).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels.cuh"
#include "latentq/gpu/device_buffer.h"
#include "latentq/quantize_cuda.h"

namespace latentq::gpu::detail {
namespace {

constexpr int kFwhtThreads = 256;

__global__ void __launch_bounds__(kFwhtThreads)
    hadamard_kernel(float* x, int D, int block, const float* signs, int inverse, float norm) {
  LQ_DYNAMIC_SMEM(float, sh);
  const int nb = D / block;
  const int64_t row = static_cast<int64_t>(blockIdx.x) / nb;
  const int b0 = static_cast<int>(static_cast<int64_t>(blockIdx.x) - row * nb) * block;
  float* xr = x + row * D + b0;
  for (int i = static_cast<int>(threadIdx.x); i < block; i += kFwhtThreads)
    sh[i] = (signs && !inverse) ? xr[i] * signs[b0 + i] : xr[i];
  __syncthreads();
  for (int h = 1; h < block; h <<= 1) {
    for (int p = static_cast<int>(threadIdx.x); p < block / 2; p += kFwhtThreads) {
      const int i = (p / h) * 2 * h + (p % h);  // the p-th index with bit h clear
      const float a = sh[i], c = sh[i + h];
      sh[i] = a + c;
      sh[i + h] = a - c;
    }
    __syncthreads();
  }
  for (int i = static_cast<int>(threadIdx.x); i < block; i += kFwhtThreads) {
    const float v = sh[i] * norm;
    xr[i] = (signs && inverse) ? v * signs[b0 + i] : v;
  }
}

}  // namespace
}  // namespace latentq::gpu::detail

namespace latentq {

void hadamard_rows_device(float* d_x, int64_t T, int64_t D, int64_t block, const float* d_signs, bool inverse,
                          cudaStream_t stream) {
  if (block < 1 || T < 0 || D < 1 || D % block != 0 || (block & (block - 1)) != 0)
    throw std::invalid_argument("fwht_rows: block " + std::to_string(block) + " must be a power of two dividing D = " +
                                std::to_string(D) + " (T = " + std::to_string(T) + " >= 0)");
  if (block > kMaxHadamardBlock || D > (int64_t{1} << 30) || T * (D / block) > int64_t{0x7fffffff})
    throw std::invalid_argument(
        "hadamard_rows_device: block " + std::to_string(block) + " (max " + std::to_string(kMaxHadamardBlock) +
        ") or T*D/block = " + std::to_string(T * (D / block)) + " (max 2^31 - 1) beyond the kernel's limits");
  if (T == 0) return;
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  const size_t smem = static_cast<size_t>(block) * sizeof(float);  // ≤ 16 KiB: under the default 48 KiB
  const unsigned grid = static_cast<unsigned>(T * (D / block));
  LQ_LAUNCH(gpu::detail::hadamard_kernel, grid, gpu::detail::kFwhtThreads, smem, stream, d_x, static_cast<int>(D),
            static_cast<int>(block), d_signs, inverse ? 1 : 0, norm);
  LQ_CUDA_CHECK(cudaGetLastError());
}

void hadamard_rows_gpu(float* X, int64_t T, int64_t D, int64_t block, const float* signs, bool inverse) {
  if (T < 0 || D < 1)
    throw std::invalid_argument("hadamard_rows_gpu: T = " + std::to_string(T) + ", D = " + std::to_string(D) +
                                " (expected T >= 0, D >= 1)");
  gpu::DeviceBuffer<float> dx, ds;
  dx.upload(X, static_cast<size_t>(T * D), nullptr, "Hadamard rows");
  if (signs) ds.upload(signs, static_cast<size_t>(D), nullptr, "Hadamard signs");
  hadamard_rows_device(dx.data(), T, D, block, signs ? ds.data() : nullptr, inverse, nullptr);
  dx.download(X, nullptr);
}

}  // namespace latentq
