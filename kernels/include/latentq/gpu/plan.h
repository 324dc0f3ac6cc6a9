// latentq/gpu/plan.h — pieces of the CUDA quantizer that are plain host/device code and can be
// tested without a GPU: launch limits, fast division by a runtime divisor, the chunking of channel
// token groups, the order-free group statistics and the packing of four codes.
//
// Order-free statistics. The CPU reference (quant/src/cpu/) folds min/max over a group in
// storage order with qmath::min_num/max_num, which keep the EARLIER operand on a tie. The only
// finite values that tie with different bits are +0 and −0, so the reference's min (max) is "the
// first zero of the group" whenever the min (max) compares equal to zero. A parallel reduction in
// any order (cub::WarpReduce, cub::DeviceReduce, which requires a commutative operator) gets every
// other bit right; to get the zero's sign right it also carries zkey = min over the zero elements
// of (index << 1 | sign bit) and fix_zero_signs() copies that sign. Symmetric and fp8 groups reduce
// |x| only (the reference takes max(|min|, |max|) = max|x|), which has no tie with different bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "latentq/qmath.h"

namespace latentq::gpu {

/// Largest D (columns, e.g. kv_lora_rank + 0) the kernels accept: the token/fp8 kernel keeps at
/// least one row and its scales in shared memory (12·D bytes ≤ 48 KiB). Larger D is refused.
inline constexpr int64_t kMaxCols = 4096;
/// Largest T (rows, tokens) the kernels accept: row indices and grid sizes are 32-bit.
inline constexpr int64_t kMaxRows = 2147483647;
/// Channel groups of at most this many tokens are quantized in one pass (statistics, encode and
/// pack in registers); longer groups use a statistics pass and an encode pass.
inline constexpr int kChannelFusedTokens = 32;
/// Tokens per chunk of the statistics pass for long channel groups.
inline constexpr int kChannelStatTokens = 512;

/// Status a quantize call collects on the device: non-finite inputs and the first scale/offset
/// that overflows its storage dtype, as key 2·group + (0 scale | 1 offset) (atomicMin; all ones =
/// none), which is the order in which the CPU reference would throw; block formats also fold
/// max|x| of the finite inputs (float bits, atomicMax: exact and order-free for values ≥ +0).
struct DeviceStatus {
  unsigned long long nonfinite;
  unsigned long long overflow_key;
  unsigned long long amax_bits;
};
inline constexpr unsigned long long kNoOverflow = ~0ull;

/// n / d for 0 ≤ n < 2^31 and 1 ≤ d < 2^31 with one multiply-high, an add and a shift
/// (Granlund & Montgomery 1994, "Division by invariant integers using multiplication", Fig. 4.1;
/// the same trick as cutlass::FastDivmod). m = ⌊2^(32+s)/d⌋ − 2^32 + 1 with s = ⌈log2 d⌉.
struct FastDiv {
  uint32_t d = 1;
  uint32_t m = 1;
  uint32_t s = 0;
  FastDiv() = default;
  explicit FastDiv(int64_t divisor) {
    if (divisor < 1 || divisor > 2147483647)
      throw std::invalid_argument("FastDiv: divisor " + std::to_string(divisor) + " outside [1, 2^31)");
    d = static_cast<uint32_t>(divisor);
    while ((uint64_t{1} << s) < d) ++s;
    m = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - d)) / d + 1);
  }
  LQ_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, m);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> 32);
#endif
    return (hi + n) >> s;  // hi ≤ n < 2^31: no overflow
  }
};

/// A run of at most max_len consecutive tokens [t0, t0 + n) of one channel group.
struct ChunkDesc {
  int64_t t0;
  int64_t group;
  int32_t n;
  int32_t pad;
};

/// Splits each token group [bounds[g], bounds[g+1]) (bounds [G+1], from channel_groups()) into
/// chunks of at most max_len tokens, in token order. If begin is given it receives [G+1]: the
/// chunks of group g are [begin[g], begin[g+1]).
inline std::vector<ChunkDesc> split_groups(std::span<const int64_t> bounds, int64_t max_len,
                                           std::vector<int64_t>* begin = nullptr) {
  std::vector<ChunkDesc> out;
  if (begin) begin->assign(1, 0);
  for (size_t g = 0; g + 1 < bounds.size(); ++g) {
    for (int64_t t = bounds[g]; t < bounds[g + 1]; t += max_len)
      out.push_back({t, static_cast<int64_t>(g), static_cast<int32_t>(std::min(max_len, bounds[g + 1] - t)), 0});
    if (begin) begin->push_back(static_cast<int64_t>(out.size()));
  }
  return out;
}

/// Longest group of bounds [G+1].
inline int64_t max_group_len(std::span<const int64_t> bounds) {
  int64_t m = 0;
  for (size_t g = 0; g + 1 < bounds.size(); ++g) m = std::max(m, bounds[g + 1] - bounds[g]);
  return m;
}

// ---- order-free group statistics (see the header comment) ------------------------------------
/// min, max and the first zero (zkey = index << 1 | sign bit, all ones if none) of an asymmetric group.
template <class K>
struct MinMaxZ {
  float mn;
  float mx;
  K zkey;
};
template <class K>
LQ_HD MinMaxZ<K> minmaxz_identity() {
  return {qmath::f32_from_bits(0x7f800000u), qmath::f32_from_bits(0xff800000u), static_cast<K>(~K{0})};
}
/// Adds element x, at index i of its group, to s.
template <class K>
LQ_HD void minmaxz_add(MinMaxZ<K>& s, float x, K i) {
  s.mn = qmath::min_num(s.mn, x);
  s.mx = qmath::max_num(s.mx, x);
  if (x == 0.0f) {
    const K key = static_cast<K>((i << 1) | static_cast<K>(qmath::f32_bits(x) >> 31));
    s.zkey = key < s.zkey ? key : s.zkey;
  }
}
/// Commutative and associative combine (up to the sign of a zero min/max, fixed afterwards).
template <class K>
struct MinMaxZOp {
  LQ_HD MinMaxZ<K> operator()(const MinMaxZ<K>& a, const MinMaxZ<K>& b) const {
    return {qmath::min_num(a.mn, b.mn), qmath::max_num(a.mx, b.mx), b.zkey < a.zkey ? b.zkey : a.zkey};
  }
};
/// Gives a zero min/max the sign of the group's first zero, as the in-order CPU fold does.
template <class K>
LQ_HD void fix_zero_signs(MinMaxZ<K>& s) {
  const float z = qmath::f32_from_bits(static_cast<uint32_t>(s.zkey & 1u) << 31);
  if (s.mn == 0.0f) s.mn = z;
  if (s.mx == 0.0f) s.mx = z;
}
/// max over |x| (symmetric and fp8 groups); max_num is exact in any order on |x|.
struct AbsMaxOp {
  LQ_HD float operator()(float a, float b) const { return qmath::max_num(a, b); }
};

/// Per-tensor statistics of the CUB DeviceReduce pass: min, max, first zero, non-finite count.
struct TensorStats {
  float mn;
  float mx;
  unsigned long long zkey;
  unsigned long long nonfinite;
};
struct TensorStatsOp {
  LQ_HD TensorStats operator()(const TensorStats& a, const TensorStats& b) const {
    return {qmath::min_num(a.mn, b.mn), qmath::max_num(a.mx, b.mx), b.zkey < a.zkey ? b.zkey : a.zkey,
            a.nonfinite + b.nonfinite};
  }
};
LQ_HD TensorStats tensor_stats_identity() {
  return {qmath::f32_from_bits(0x7f800000u), qmath::f32_from_bits(0xff800000u), ~0ull, 0ull};
}
/// Statistics of the single element x at flat index i.
LQ_HD TensorStats tensor_stats_of(float x, int64_t i) {
  TensorStats s = tensor_stats_identity();
  if (!qmath::is_finite(x)) {
    s.nonfinite = 1;
    return s;
  }
  s.mn = x;
  s.mx = x;
  if (x == 0.0f) s.zkey = (static_cast<unsigned long long>(i) << 1) | (qmath::f32_bits(x) >> 31);
  return s;
}

/// Statistics of the quad [4q, min(4q + 4, n)) of x [n], folded with TensorStatsOp (the per-tensor
/// reduction runs over quads: a quarter of the items, one 16-byte load each on the device when x is
/// 16-byte aligned (vec) and the quad whole). Same result as over elements: the operator is
/// order-free up to the zero sign, which zkey fixes.
LQ_HD TensorStats tensor_stats_of_quad(const float* x, int64_t n, int64_t q, bool vec) {
  const int64_t i0 = 4 * q;
  const int m = n - i0 < 4 ? static_cast<int>(n - i0) : 4;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#if defined(__CUDA_ARCH__)
  if (vec && m == 4) {
    const float4 f = reinterpret_cast<const float4*>(x)[q];
    v[0] = f.x;
    v[1] = f.y;
    v[2] = f.z;
    v[3] = f.w;
  } else
#endif
  {
    (void)vec;
    for (int k = 0; k < m; ++k) v[k] = x[i0 + k];
  }
  TensorStats s = tensor_stats_of(v[0], i0);
  for (int k = 1; k < m; ++k) s = TensorStatsOp{}(s, tensor_stats_of(v[k], i0 + k));
  return s;
}

/// Four codes u[0..3] (each < 2^bits) packed as in qmath.h: code e at bits [bits·e, bits·(e+1)) of
/// the little-endian word; bits/2 bytes (4, 2, 1 for bits 8, 4, 2).
template <int BITS>
LQ_HD uint32_t pack_quad(uint32_t u0, uint32_t u1, uint32_t u2, uint32_t u3) {
  return u0 | (u1 << BITS) | (u2 << (2 * BITS)) | (u3 << (3 * BITS));
}

}  // namespace latentq::gpu
