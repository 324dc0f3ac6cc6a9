// tests/gpu/emu/cuda_emu.cpp — the host emulator's scheduler and runtime (see cuda_emu.h).
#include "cuda_emu.h"

#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

#include "cuda_runtime_api.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

// Context switch. x86-64 System V (GCC/Clang), outside AddressSanitizer builds: a 12-instruction
// switch of the callee-saved registers and the stack pointer (glibc's swapcontext makes a system
// call per switch, ~50x slower). Elsewhere: ucontext.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define LQ_EMU_ASM_SWITCH 1
extern "C" void lq_emu_switch(void** save_sp, void* new_sp);
asm(R"(
.text
.globl lq_emu_switch
.type lq_emu_switch,@function
lq_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size lq_emu_switch, .-lq_emu_switch
.section .note.GNU-stack,"",@progbits
.text
)");
#endif

namespace emu {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kStackBytes = 512 * 1024;
#else
constexpr size_t kStackBytes = 128 * 1024;
#endif

struct Barrier {
  int expected = 0;
  int arrived = 0;
  uint64_t gen = 0;
};
struct Fiber {
#if defined(LQ_EMU_ASM_SWITCH)
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
  std::unique_ptr<char[]> stack;
  uint3 tid;
  int warp = 0;
  unsigned lane = 0;
  unsigned parity = 0;
  bool done = false;
  Barrier* waiting = nullptr;
  uint64_t wait_gen = 0;
};
struct Warp {
  Barrier bar;
  alignas(16) unsigned char slot[2][32][64];
};
struct Block {
  std::vector<Warp> warps;
  Barrier bar;
  std::unique_ptr<float4[]> smem;
#if defined(LQ_EMU_ASM_SWITCH)
  void* sched_sp = nullptr;
#else
  ucontext_t sched;
#endif
  const std::function<void()>* body = nullptr;
  Fiber* cur = nullptr;
};

thread_local Block* g_block = nullptr;
thread_local std::vector<Fiber> g_fibers;  // stacks reused across launches
cudaError_t g_last = cudaSuccess;

void release_if_complete(Barrier& b) {
  if (b.arrived > 0 && b.arrived >= b.expected) {
    b.arrived = 0;
    ++b.gen;
  }
}

// fiber → scheduler
void yield_to_scheduler(Fiber* f) {
#if defined(LQ_EMU_ASM_SWITCH)
  lq_emu_switch(&f->sp, g_block->sched_sp);
#else
  swapcontext(&f->ctx, &g_block->sched);
#endif
}
// scheduler → fiber
void resume(Block& blk, Fiber& f) {
#if defined(LQ_EMU_ASM_SWITCH)
  lq_emu_switch(&blk.sched_sp, f.sp);
#else
  swapcontext(&blk.sched, &f.ctx);
#endif
}

void wait_at(Barrier& b) {
  Fiber* f = g_block->cur;
  if (++b.arrived >= b.expected) {  // the last arrival releases everybody and goes on
    b.arrived = 0;
    ++b.gen;
    return;
  }
  f->waiting = &b;
  f->wait_gen = b.gen;
  yield_to_scheduler(f);
  f->waiting = nullptr;
}

void fiber_exit(Block* blk, Fiber* f) {
  f->done = true;  // an exited thread no longer counts at barriers
  --blk->bar.expected;
  release_if_complete(blk->bar);
  Warp& w = blk->warps[static_cast<size_t>(f->warp)];
  --w.bar.expected;
  release_if_complete(w.bar);
}

#if defined(LQ_EMU_ASM_SWITCH)
[[noreturn]] void fiber_entry() {
  Block* blk = g_block;
  Fiber* f = blk->cur;
  (*blk->body)();
  fiber_exit(blk, f);
  lq_emu_switch(&f->sp, blk->sched_sp);  // never resumed
  std::abort();
}
// Initial stack of a fiber: six zero callee-saved registers, then fiber_entry as the return
// address at a 16-byte aligned slot (so fiber_entry starts with rsp ≡ 8 mod 16, as after a call).
void* initial_sp(char* stack, size_t bytes) {
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<void**>(top - 16);
  slot[1] = nullptr;  // fiber_entry's own (never used) return address
  slot[0] = reinterpret_cast<void*>(&fiber_entry);
  void** sp = slot - 6;
  for (int i = 0; i < 6; ++i) sp[i] = nullptr;
  return sp;
}
#else
void fiber_entry() {
  Block* blk = g_block;
  Fiber* f = blk->cur;
  (*blk->body)();
  fiber_exit(blk, f);
}  // returns to uc_link: the scheduler
#endif

}  // namespace

void set_last_error(cudaError_t e) { g_last = e; }
void set_last_error_invalid_value() { g_last = cudaErrorInvalidValue; }

namespace {
std::map<const void*, size_t>& smem_limits() {
  static std::map<const void*, size_t> m;
  return m;
}
}  // namespace
size_t max_dynamic_smem(const void* kernel) {
  const auto it = smem_limits().find(kernel);
  return it != smem_limits().end() ? it->second : 48 * 1024 - 512;
}
void set_max_dynamic_smem(const void* kernel, size_t bytes) { smem_limits()[kernel] = bytes; }

void launch_body(dim3 grid, dim3 block, size_t dyn_smem, const std::function<void()>& body) {
  const size_t nthreads = static_cast<size_t>(block.x) * block.y * block.z;
  const size_t nblocks = static_cast<size_t>(grid.x) * grid.y * grid.z;
  if (nblocks == 0 || nthreads == 0 || nthreads > 1024) {
    g_last = cudaErrorInvalidConfiguration;
    return;
  }
  if (dyn_smem > 227 * 1024) {
    g_last = cudaErrorInvalidValue;
    return;
  }
  if (g_block != nullptr) {
    std::fprintf(stderr, "emu: a kernel launched a kernel (dynamic parallelism is not emulated)\n");
    std::abort();
  }
  if (g_fibers.size() < nthreads) g_fibers.resize(nthreads);
  for (size_t i = 0; i < nthreads; ++i)
    if (!g_fibers[i].stack) g_fibers[i].stack.reset(new char[kStackBytes]);

  Block blk;
  blk.body = &body;
  const size_t nwarps = (nthreads + 31) / 32;
  blk.warps.resize(nwarps);
  const size_t smem_vec = (dyn_smem + sizeof(float4) - 1) / sizeof(float4);
  blk.smem.reset(new float4[std::max<size_t>(smem_vec, 1)]);
  g_block = &blk;
  blockDim = block;
  gridDim = grid;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        blockIdx = {bx, by, bz};
        blk.bar = Barrier{static_cast<int>(nthreads), 0, 0};
        for (size_t w = 0; w < nwarps; ++w)
          blk.warps[w].bar = Barrier{static_cast<int>(std::min<size_t>(32, nthreads - 32 * w)), 0, 0};
        std::memset(blk.smem.get(), 0xCD, smem_vec * sizeof(float4));  // shared memory starts as garbage
        for (size_t i = 0; i < nthreads; ++i) {
          Fiber& f = g_fibers[i];
          f.tid = {static_cast<unsigned>(i % block.x), static_cast<unsigned>((i / block.x) % block.y),
                   static_cast<unsigned>(i / (static_cast<size_t>(block.x) * block.y))};
          f.warp = static_cast<int>(i / 32);
          f.lane = static_cast<unsigned>(i % 32);
          f.parity = 0;
          f.done = false;
          f.waiting = nullptr;
#if defined(LQ_EMU_ASM_SWITCH)
          f.sp = initial_sp(f.stack.get(), kStackBytes);
#else
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = f.stack.get();
          f.ctx.uc_stack.ss_size = kStackBytes;
          f.ctx.uc_link = &blk.sched;
          makecontext(&f.ctx, fiber_entry, 0);
#endif
        }
        size_t live = nthreads;
        while (live > 0) {
          bool progress = false;
          for (size_t i = 0; i < nthreads; ++i) {
            Fiber& f = g_fibers[i];
            if (f.done || (f.waiting != nullptr && f.waiting->gen == f.wait_gen)) continue;
            blk.cur = &f;
            threadIdx = f.tid;
            resume(blk, f);
            progress = true;
            if (f.done) --live;
          }
          if (!progress) {
            std::fprintf(stderr,
                         "emu: deadlock in block (%u, %u, %u): %zu of %zu threads wait at a barrier that the others "
                         "never reach (divergent __syncthreads/__syncwarp/shuffle)\n",
                         bx, by, bz, live, nthreads);
            std::abort();
          }
        }
      }
  g_block = nullptr;
}

void* dynamic_smem_raw() { return g_block->smem.get(); }
void syncthreads() { wait_at(g_block->bar); }
void syncwarp() { wait_at(g_block->warps[static_cast<size_t>(g_block->cur->warp)].bar); }
unsigned lane() { return g_block->cur->lane; }

void warp_exchange(const void* v, void* out, size_t bytes, int src) {
  if (bytes > 64) {
    std::fprintf(stderr, "emu: shuffle of a %zu-byte value (at most 64)\n", bytes);
    std::abort();
  }
  Fiber* f = g_block->cur;
  Warp& w = g_block->warps[static_cast<size_t>(f->warp)];
  auto& buf = w.slot[f->parity];  // double-buffered: one barrier per exchange suffices
  f->parity ^= 1u;
  std::memcpy(buf[f->lane], v, bytes);
  wait_at(w.bar);
  if (src >= 0 && src < 32 && static_cast<size_t>(f->warp) * 32 + static_cast<size_t>(src) < g_fibers.size())
    std::memcpy(out, buf[src], bytes);
  else
    std::memcpy(out, v, bytes);
}

}  // namespace emu

// ---- runtime ---------------------------------------------------------------------------------------
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
  }
  return "unknown error";
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = emu::g_last;
  emu::g_last = cudaSuccess;
  return e;
}
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "latentq host emulator");
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 1;
  p->totalGlobalMem = size_t{1} << 32;
  p->l2CacheSize = 1 << 20;
  p->sharedMemPerBlockOptin = 227 * 1024;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes) {
  // exact size (no rounding up): an AddressSanitizer build reports any access past the end
  if (posix_memalign(p, 256, bytes > 0 ? bytes : 1) != 0) {
    *p = nullptr;
    return cudaErrorMemoryAllocation;
  }
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes) std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind) {
  for (size_t r = 0; r < height; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind k, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, k);
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
