// kernels/quant/lloyd_max.cu — the fitted Lloyd-Max codebooks (latentq/lloyd_max.h) on the device: the
// codebooks are fitted on the host (fit_lloyd_max, as the CPU quantizer does), then one thread per code byte
// encodes (lm_encode_byte) and one thread per element decodes (lm_decode_element): byte-identical to the CPU
// quantizer by construction.
#include "kernels.cuh"
#include "latentq/lloyd_max.h"

namespace latentq::gpu::detail {
namespace {

constexpr int kLmThreads = 256;

__global__ void __launch_bounds__(kLmThreads)
    lm_encode_kernel(const float* x /*[T, D]*/, int64_t T, int D, int rb, int bits,
                     const float* midpoint
                     /*[codebooks, 2^bits − 1]*/,
                     int64_t width, uint8_t* codes /*[T, rb]*/) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kLmThreads + threadIdx.x;
  if (j >= T * rb) return;
  const int64_t t = j / rb;
  codes[j] = q::lm_encode_byte(x + t * D, D, bits, midpoint, width, static_cast<int>(j - t * rb));
}

__global__ void __launch_bounds__(kLmThreads)
    lm_decode_kernel(const uint8_t* codes /*[T, rb]*/, int64_t T, int D, int rb, int bits,
                     const float* centroid
                     /*[codebooks, 2^bits]*/,
                     int64_t width, float* out /*[T, D]*/) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kLmThreads + threadIdx.x;
  if (j >= T * D) return;
  const int64_t t = j / D;
  out[j] = q::lm_decode_element(codes + t * rb, static_cast<int>(j - t * D), bits, centroid, width);
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kLmThreads - 1) / kLmThreads); }

}  // namespace

cudaError_t launch_lm_encode(const float* x, int64_t T, int D, int rb, int bits, const float* midpoint, int64_t width,
                             uint8_t* codes, cudaStream_t stream) {
  LQ_LAUNCH(lm_encode_kernel, blocks_for(T * rb), kLmThreads, 0, stream, x, T, D, rb, bits, midpoint, width, codes);
  return cudaGetLastError();
}

cudaError_t launch_lm_decode(const uint8_t* codes, int64_t T, int D, int rb, int bits, const float* centroid,
                             int64_t width, float* out, cudaStream_t stream) {
  LQ_LAUNCH(lm_decode_kernel, blocks_for(T * D), kLmThreads, 0, stream, codes, T, D, rb, bits, centroid, width, out);
  return cudaGetLastError();
}

}  // namespace latentq::gpu::detail
