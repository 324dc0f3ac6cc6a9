// kernels/src/blocks.cu — the block formats (fp8 e4m3 tiles with the FlashMLA / vLLM scale rules,
// per-tensor fp8, MXFP8/MXFP4, NVFP4, ggml q8_0/q4_0/q4_1): one thread per (token, block) runs
// qmath::quantize_block / dequantize_block of latentq/blockfmt.h, the functions the CPU reference
// loops over, so codes, scales and offsets are byte-identical by construction. A block's codes are
// its own bytes (blocks start at even elements), so no two threads share a byte.
// Status: NaN/Inf counted per element; the first overflowing stored value (ggml's fp16 d or m) is
// recorded as key 2·(t·nb + j) + (0 scale | 1 offset), the CPU's throw order.
#include "kernels.cuh"

namespace latentq::gpu::detail {
namespace {

constexpr int kBlocksThreads = 128;

__global__ void __launch_bounds__(kBlocksThreads) quantize_blocks_kernel(const BlocksArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // (t, j) flat
  if (i >= a.T * a.nb) return;
  const int64_t t = i / a.nb, j = i % a.nb;
  const int64_t d0 = j * a.desc.block;
  const int64_t d1 = a.D < d0 + a.desc.block ? a.D : d0 + a.desc.block;
  const int n = static_cast<int>(d1 - d0);
  const float* x = a.x + t * a.D + d0;
  unsigned bad = 0;
  for (int k = 0; k < n; ++k) bad += !q::is_finite(x[k]);
  note_nonfinite(a.st, bad);
  if (bad) return;  // the call fails; the CPU reference would not have quantized
  uint8_t* codes = a.codes + t * a.rb + d0 * a.desc.code_bits / 8;
  const q::BlockStatus s = q::quantize_block(a.desc, x, n, a.global, codes, a.scale_bytes ? a.scales + i * a.scale_bytes : nullptr,
                                             a.desc.has_offset ? a.offsets + i * a.scale_bytes : nullptr);
  if (s.overflow) atomicMin(&a.st->overflow_key, 2ull * static_cast<unsigned long long>(i) + (s.overflow_offset ? 1ull : 0ull));
}

__global__ void __launch_bounds__(kBlocksThreads) dequantize_blocks_kernel(const BlocksArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.T * a.nb) return;
  const int64_t t = i / a.nb, j = i % a.nb;
  const int64_t d0 = j * a.desc.block;
  const int64_t d1 = a.D < d0 + a.desc.block ? a.D : d0 + a.desc.block;
  const int n = static_cast<int>(d1 - d0);
  q::dequantize_block(a.desc, a.codes + t * a.rb + d0 * a.desc.code_bits / 8,
                      a.scale_bytes ? a.scales + i * a.scale_bytes : nullptr,
                      a.desc.has_offset ? a.offsets + i * a.scale_bytes : nullptr, a.global, n, a.out + t * a.D + d0);
}

unsigned grid_of(const BlocksArgs& a) {
  return static_cast<unsigned>((a.T * a.nb + kBlocksThreads - 1) / kBlocksThreads);
}

}  // namespace

cudaError_t launch_quantize_blocks(const BlocksArgs& a, cudaStream_t stream) {
  if (a.T <= 0 || a.nb <= 0) return cudaErrorInvalidValue;
  LQ_LAUNCH(quantize_blocks_kernel, grid_of(a), kBlocksThreads, 0, stream, a);
  return cudaGetLastError();
}

cudaError_t launch_dequantize_blocks(const BlocksArgs& a, cudaStream_t stream) {
  if (a.T <= 0 || a.nb <= 0) return cudaErrorInvalidValue;
  LQ_LAUNCH(dequantize_blocks_kernel, grid_of(a), kBlocksThreads, 0, stream, a);
  return cudaGetLastError();
}

}  // namespace latentq::gpu::detail
