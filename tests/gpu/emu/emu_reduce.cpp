// tests/gpu/emu/emu_reduce.cpp — the emulator's stand-ins for the cub::DeviceReduce calls of
// kernels/quant/tensor.cu. They reduce in a scrambled order (blocks of a stride permutation, combined
// in a shuffled order), as a device-wide reduction may, with the same operators.
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "kernels.cuh"

namespace latentq::gpu::detail {
namespace {
template <class T, class Op, class Of>
T scrambled_reduce(int64_t n, T init, Op op, Of of) {
  const int64_t block = 97;
  std::vector<T> parts;
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    T acc = init;
    for (int64_t i = std::min(n, b0 + block) - 1; i >= b0; --i) acc = op(of(i), acc);  // backwards
    parts.push_back(acc);
  }
  std::mt19937_64 rng(static_cast<uint64_t>(n));
  std::shuffle(parts.begin(), parts.end(), rng);
  T r = init;
  for (const T& p : parts) r = op(r, p);
  return r;
}
}  // namespace

cudaError_t tensor_stats(void* d_temp, size_t& temp_bytes, const float* x, int64_t n, TensorStats* out, cudaStream_t) {
  if (d_temp == nullptr) {
    temp_bytes = 256;
    return cudaSuccess;
  }
  // over quads, as the device (tensor.cu)
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  *out = scrambled_reduce((n + 3) / 4, tensor_stats_identity(), TensorStatsOp{},
                          [x, n, vec](int64_t q) { return tensor_stats_of_quad(x, n, q, vec); });
  return cudaSuccess;
}

cudaError_t nonfinite_count(void* d_temp, size_t& temp_bytes, const float* x, int64_t n, unsigned long long* out,
                            cudaStream_t) {
  if (d_temp == nullptr) {
    temp_bytes = 256;
    return cudaSuccess;
  }
  *out = scrambled_reduce(
      n, 0ull, [](unsigned long long a, unsigned long long b) { return a + b; },
      [x](int64_t i) { return q::is_finite(x[i]) ? 0ull : 1ull; });
  return cudaSuccess;
}

}  // namespace latentq::gpu::detail
