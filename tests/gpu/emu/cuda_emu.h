// tests/gpu/emu/cuda_emu.h — a small host emulator of the CUDA subset latentq_cuda uses, so the
// kernels (compiled as plain C++ with LQ_EMULATE) run in test_gpu_emu on machines without a GPU.
//
// Model: a launch runs its blocks one after another on the calling thread; every CUDA thread of a
// block is a fiber (ucontext) with its own stack. __syncthreads, __syncwarp and the warp shuffles
// are barriers: a fiber that arrives waits (yields to the block's scheduler) until every live
// thread of its block / warp has arrived. A thread that returns stops counting (as on sm_70+). A
// barrier nobody can complete is reported as a deadlock and aborts. Shuffles exchange through a
// per-warp, double-buffered slot array. Dynamic shared memory is a per-block buffer; __shared__
// variables are function statics (blocks never overlap). Device memory is host memory, so
// AddressSanitizer builds of the emulator check the kernels' accesses. What it does not model:
// timing, memory ordering between blocks, occupancy, and the device's intrinsics (qmath.h's host
// branches run instead, which are the CPU reference's IEEE operations).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

// ---- CUDA C++ keywords ----------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

// built-in variables of the running fiber (set by the scheduler before it resumes a fiber)
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

inline int min(int a, int b) { return b < a ? b : a; }
inline long min(long a, long b) { return b < a ? b : a; }
inline long long min(long long a, long long b) { return b < a ? b : a; }
inline unsigned min(unsigned a, unsigned b) { return b < a ? b : a; }
inline int max(int a, int b) { return a < b ? b : a; }
inline long max(long a, long b) { return a < b ? b : a; }

namespace emu {

/// Runs `body` for every thread of a grid × block launch (see the header comment). dyn_smem bytes
/// of dynamic shared memory per block. Records cudaErrorInvalidConfiguration for an empty grid or
/// a block outside [1, 1024] instead of running.
void launch_body(dim3 grid, dim3 block, size_t dyn_smem, const std::function<void()>& body);
void set_last_error_invalid_value();

/// Largest dynamic shared memory a launch of `kernel` may ask for: 48 KiB less a little static
/// shared memory, unless raised with cudaFuncSetAttribute(MaxDynamicSharedMemorySize), as on a GPU.
size_t max_dynamic_smem(const void* kernel);
void set_max_dynamic_smem(const void* kernel, size_t bytes);

template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, dim3 block, size_t dyn_smem, Args... args) {
  if (dyn_smem > max_dynamic_smem(reinterpret_cast<const void*>(kernel))) {
    set_last_error_invalid_value();  // cudaErrorInvalidValue, as a real launch over the limit
    return;
  }
  launch_body(grid, block, dyn_smem, [=] { kernel(args...); });
}

/// The running block's dynamic shared memory (16-byte aligned).
void* dynamic_smem_raw();
template <class T>
T* dynamic_smem() {
  return static_cast<T*>(dynamic_smem_raw());
}

void syncthreads();
void syncwarp();
/// The running thread's warp exchange: writes `bytes` of v to its lane's slot, waits for the warp,
/// copies lane `src`'s slot into out (src outside [0, 32): own value).
void warp_exchange(const void* v, void* out, size_t bytes, int src);
unsigned lane();

}  // namespace emu

inline void __syncthreads() { emu::syncthreads(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::syncwarp(); }

template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  T out;
  emu::warp_exchange(&v, &out, sizeof(T), static_cast<int>(emu::lane() ^ static_cast<unsigned>(lane_mask)));
  return out;
}
template <class T>
T __shfl_down_sync(unsigned, T v, unsigned delta) {
  T out;
  const unsigned src = emu::lane() + delta;
  emu::warp_exchange(&v, &out, sizeof(T), src < 32 ? static_cast<int>(src) : -1);
  return out;
}

// one host thread runs all fibers: plain read-modify-write is atomic here
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long o = *p;
  *p = o + v;
  return o;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
  const unsigned o = *p;
  if (v > o) *p = v;
  return o;
}
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
  const unsigned long long o = *p;
  if (v > o) *p = v;
  return o;
}
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  const unsigned long long o = *p;
  if (v < o) *p = v;
  return o;
}
