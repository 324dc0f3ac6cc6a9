// tests/gpu/emu/cub/warp/warp_reduce.cuh — host emulator stand-in for cub::WarpReduce (full warps
// of 32 lanes, result valid in lane 0): a shuffle-down tree through the emulated warp exchange.
#pragma once
#include "../../cuda_emu.h"

namespace cub {
template <class T, int LOGICAL_WARP_THREADS = 32>
class WarpReduce {
  static_assert(LOGICAL_WARP_THREADS == 32, "the emulator models full warps only");

 public:
  struct TempStorage {};
  explicit WarpReduce(TempStorage&) {}
  template <class Op>
  T Reduce(T v, Op op) {
    for (unsigned off = 16; off > 0; off >>= 1) {
      const T other = __shfl_down_sync(0xffffffffu, v, off);
      if (emu::lane() + off < 32) v = op(v, other);
    }
    return v;
  }
};
}  // namespace cub
