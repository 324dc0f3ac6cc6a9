// kernels/quant/transform_coding.cu — transform coding (latentq/transform_coding.h) on the device: the
// record is fitted on the host (fit_transform_coding, as the CPU quantizer does), then one thread per code
// byte encodes (tc_encode_byte) and one thread per element decodes (tc_decode_element) with the record's
// tables on the device: byte-identical to the CPU quantizer by construction.
#include "kernels.cuh"
#include "latentq/transform_coding.h"

namespace latentq::gpu::detail {
namespace {

constexpr int kTcThreads = 256;

__global__ void __launch_bounds__(kTcThreads)
    tc_encode_kernel(const float* x /*[T, D]*/, int64_t T, int rb, q::TcTables tab, uint8_t* codes /*[T, rb]*/) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kTcThreads + threadIdx.x;
  if (j >= T * rb) return;
  const int64_t t = j / rb;
  codes[j] = q::tc_encode_byte(tab, x + t * tab.D, static_cast<int>(j - t * rb));
}

__global__ void __launch_bounds__(kTcThreads)
    tc_decode_kernel(const uint8_t* codes /*[T, rb]*/, int64_t T, int rb, q::TcTables tab, float* out /*[T, D]*/) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kTcThreads + threadIdx.x;
  if (j >= T * tab.D) return;
  const int64_t t = j / tab.D;
  out[j] = q::tc_decode_element(tab, codes + t * rb, static_cast<int>(j - t * tab.D));
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kTcThreads - 1) / kTcThreads); }

}  // namespace

cudaError_t launch_tc_encode(const float* x, int64_t T, int rb, const q::TcTables& tab, uint8_t* codes,
                             cudaStream_t stream) {
  LQ_LAUNCH(tc_encode_kernel, blocks_for(T * rb), kTcThreads, 0, stream, x, T, rb, tab, codes);
  return cudaGetLastError();
}

cudaError_t launch_tc_decode(const uint8_t* codes, int64_t T, int rb, const q::TcTables& tab, float* out,
                             cudaStream_t stream) {
  LQ_LAUNCH(tc_decode_kernel, blocks_for(T * tab.D), kTcThreads, 0, stream, codes, T, rb, tab, out);
  return cudaGetLastError();
}

}  // namespace latentq::gpu::detail
