// kernels/quant/tensor.cu — per-tensor statistics and NaN/Inf counts with cub::DeviceReduce, the
// per-tensor (scale, offset), and the token → channel-group map used by the decode.
//
// The per-tensor statistics reduce quads of 4 elements (tensor_stats_of_quad: float4 loads, a
// quarter of the items). cub::DeviceReduce needs a commutative operator; TensorStatsOp is one up to the sign of a zero
// min/max, which the first-zero key fixes (plan.h), so the result equals the CPU's in-order fold.
#include <algorithm>

#if !defined(LQ_EMULATE)
#include <cub/device/device_reduce.cuh>
#include <thrust/iterator/counting_iterator.h>
#endif

#include "kernels.cuh"

namespace latentq::gpu::detail {
namespace {

#if !defined(LQ_EMULATE)
struct QuadStatsOf {
  const float* x;  ///< [n]
  int64_t n;
  bool vec;
  __host__ __device__ TensorStats operator()(int64_t q) const { return tensor_stats_of_quad(x, n, q, vec); }
};

struct NonfiniteOf {
  __host__ __device__ unsigned long long operator()(float v) const { return q::is_finite(v) ? 0ull : 1ull; }
};

struct Sum {
  __host__ __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const { return a + b; }
};

#endif

template <bool SYM>
__global__ void tensor_finalize_kernel(const TensorStats* s /*[1]*/, int bits, ScaleDtype sd, uint8_t* scales /*[1]*/,
                                       uint8_t* offsets /*[1] or null*/, DeviceStatus* st /*[1]*/) {
  TensorStats v = *s;
  st->nonfinite += v.nonfinite;  // single thread; the rows kernel does not count per-tensor inputs
  MinMaxZ<unsigned long long> m{v.mn, v.mx, v.zkey};
  fix_zero_signs(m);
  if constexpr (SYM)
    finish_int_group<true>(q::max_num(q::abs_f(m.mn), q::abs_f(m.mx)), 0.0f, bits, sd, 0, scales, offsets, st);
  else
    finish_int_group<false>(m.mn, m.mx, bits, sd, 0, scales, offsets, st);
}

__global__ void token_group_map_kernel(const int64_t* __restrict__ bounds /*[G+1]*/, int64_t G, int64_t T,
                                       int32_t* map /*[T]*/) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < T;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t lo = 0, hi = G;  // largest g with bounds[g] ≤ t, over non-empty groups
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (bounds[mid] <= t)
        lo = mid;
      else
        hi = mid;
    }
    map[t] = static_cast<int32_t>(lo);
  }
}

}  // namespace

#if !defined(LQ_EMULATE)  // the emulator (tests/gpu/emu) reduces on the host
cudaError_t tensor_stats(void* d_temp, size_t& temp_bytes, const float* x, int64_t n, TensorStats* out,
                         cudaStream_t stream) {
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  return cub::DeviceReduce::TransformReduce(d_temp, temp_bytes, thrust::counting_iterator<int64_t>(0), out, (n + 3) / 4,
                                            TensorStatsOp{}, QuadStatsOf{x, n, vec}, tensor_stats_identity(), stream);
}

cudaError_t nonfinite_count(void* d_temp, size_t& temp_bytes, const float* x, int64_t n, unsigned long long* out,
                            cudaStream_t stream) {
  return cub::DeviceReduce::TransformReduce(d_temp, temp_bytes, x, out, n, Sum{}, NonfiniteOf{}, 0ull, stream);
}
#endif

cudaError_t launch_tensor_finalize(const TensorStats* s, int bits, bool sym, ScaleDtype sd, uint8_t* scales,
                                   uint8_t* offsets, DeviceStatus* st, cudaStream_t stream) {
  auto* kernel = sym ? &tensor_finalize_kernel<true> : &tensor_finalize_kernel<false>;
  LQ_LAUNCH(kernel, 1u, 1, 0, stream, s, bits, sd, scales, offsets, st);
  return cudaGetLastError();
}

cudaError_t launch_token_group_map(const int64_t* bounds, int64_t G, int64_t T, int32_t* map, cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((T + threads - 1) / threads, int64_t{1} << 20);
  if (blocks == 0) return cudaSuccess;
  LQ_LAUNCH(token_group_map_kernel, static_cast<unsigned>(blocks), threads, 0, stream, bounds, G, T, map);
  return cudaGetLastError();
}

}  // namespace latentq::gpu::detail
