// kernels/quant/turboquant.cu — TurboQuant's MSE stage (latentq/turboquant.h) on the device, byte-identical
// to the CPU quantizer (quant/src/turboquant.cpp) by construction: the same element functions, the same
// rotation (hadamard_rows_device = fwht_rows). Quantize: one thread per row for the norm and the unit
// vector (the norm is a sequential sum, as on the CPU), the Hadamard in place, one thread per code byte
// (tq_encode_byte). Dequantize: one thread per row decodes its D coordinates (the norm correction is a
// sequential sum over the row), then the Hadamard in place (H is its own inverse).
#include "kernels.cuh"
#include "latentq/turboquant.h"

namespace latentq::gpu::detail {
namespace {

constexpr int kTqThreads = 128;

__global__ void __launch_bounds__(kTqThreads)
    tq_normalize_kernel(const float* x /*[T, D]*/, int64_t T, int D, float* y /*[T, D]*/, uint8_t* norms /*[T, 2]*/) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kTqThreads + threadIdx.x;
  if (t >= T) return;
  const float* xr = x + t * D;
  const float n = q::tq_row_norm(xr, D);
  q::store_dtype(norms + 2 * t, n, q::ScaleDtype::F16);
  for (int i = 0; i < D; ++i) y[t * D + i] = q::tq_unit(xr[i], n);
}

__global__ void __launch_bounds__(kTqThreads) tq_encode_kernel(const float* y /*[T, D]*/, int64_t T, int D, int rb,
                                                               q::TqCodebook cb, uint8_t* codes /*[T, rb]*/) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kTqThreads + threadIdx.x;
  if (j >= T * rb) return;
  const int64_t t = j / rb;
  codes[j] = q::tq_encode_byte(cb, y + t * D, D, static_cast<int>(j - t * rb));
}

__global__ void __launch_bounds__(kTqThreads)
    tq_decode_kernel(const uint8_t* codes /*[T, rb]*/, const uint8_t* norms /*[T, 2]*/, int64_t T, int D, int rb,
                     q::TqCodebook cb, int nc, float* out /*[T, D]*/) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kTqThreads + threadIdx.x;
  if (t >= T) return;
  const uint8_t* row = codes + t * rb;
  const float n = q::load_dtype(norms + 2 * t, q::ScaleDtype::F16);
  const float inv = nc ? q::tq_nc_inverse(cb, row, D) : 1.0f;
  for (int i = 0; i < D; ++i) out[t * D + i] = q::tq_decode_element(cb, row, i, n, nc != 0, inv);
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kTqThreads - 1) / kTqThreads); }

}  // namespace

cudaError_t launch_tq_normalize(const float* x, int64_t T, int D, float* y, uint8_t* norms, cudaStream_t stream) {
  LQ_LAUNCH(tq_normalize_kernel, blocks_for(T), kTqThreads, 0, stream, x, T, D, y, norms);
  return cudaGetLastError();
}

cudaError_t launch_tq_encode(const float* y, int64_t T, int D, int rb, const q::TqCodebook& cb, uint8_t* codes,
                             cudaStream_t stream) {
  LQ_LAUNCH(tq_encode_kernel, blocks_for(T * rb), kTqThreads, 0, stream, y, T, D, rb, cb, codes);
  return cudaGetLastError();
}

cudaError_t launch_tq_decode(const uint8_t* codes, const uint8_t* norms, int64_t T, int D, int rb,
                             const q::TqCodebook& cb, bool nc, float* out, cudaStream_t stream) {
  LQ_LAUNCH(tq_decode_kernel, blocks_for(T), kTqThreads, 0, stream, codes, norms, T, D, rb, cb, nc ? 1 : 0, out);
  return cudaGetLastError();
}

}  // namespace latentq::gpu::detail
