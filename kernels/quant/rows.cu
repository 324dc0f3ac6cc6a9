// kernels/quant/rows.cu — row-tile kernels: per-token groups (any group size) and the
// encode pass of per-tensor specs, all in ONE pass over the input; and the bf16 encode.
//
// quantize_rows_kernel<BITS, MODE>: a block owns R consecutive rows (R·D floats, contiguous in
// memory and in the output's R·row_bytes bytes).
//   1. load the rows into shared memory (float4 when aligned), counting NaN/Inf;
//   2. statistics of the R·nt groups: groups of ≤ 32 elements one thread each (the thread starts
//      at its lane's offset within the group, which keeps the shared-memory banks apart; the
//      statistics are order-free, see plan.h), wider groups one warp each with cub::WarpReduce;
//      (scale, offset) computed by qmath, stored, kept in shared memory. Per-tensor specs read the
//      stored (scale, offset) instead.
//   3. encode and pack: one thread per quad of 4 elements = bits/2 output bytes, so no two threads
//      share a byte; codes from qmath::encode_*, packed in qmath.h's order.
#include <algorithm>
#include <type_traits>

#include <cub/warp/warp_reduce.cuh>

#include "kernels.cuh"

namespace latentq::gpu::detail {
namespace {

template <Mode M>
using GroupStat = std::conditional_t<M == Mode::Asym, MinMaxZ<uint32_t>, float>;

template <Mode M>
__device__ __forceinline__ GroupStat<M> stat_identity() {
  if constexpr (M == Mode::Asym)
    return minmaxz_identity<uint32_t>();
  else
    return 0.0f;
}
template <Mode M>
__device__ __forceinline__ void stat_add(GroupStat<M>& s, float x, uint32_t i) {
  if constexpr (M == Mode::Asym)
    minmaxz_add<uint32_t>(s, x, i);
  else
    s = q::max_num(s, q::abs_f(x));
}
template <Mode M>
struct StatOp {
  __device__ __forceinline__ GroupStat<M> operator()(const GroupStat<M>& a, const GroupStat<M>& b) const {
    if constexpr (M == Mode::Asym)
      return MinMaxZOp<uint32_t>{}(a, b);
    else
      return AbsMaxOp{}(a, b);
  }
};

/// (scale, offset) of group gi from its statistics, stored to the output.
template <int BITS, Mode M>
__device__ __forceinline__ q::ScaleOffset finish_group(GroupStat<M> s, int64_t gi, const RowsArgs& a) {
  if constexpr (M == Mode::Asym) {
    fix_zero_signs(s);
    return finish_int_group<false>(s.mn, s.mx, BITS, a.sd, gi, a.scales, a.offsets, a.st);
  } else {
    return finish_int_group<true>(s, 0.0f, BITS, a.sd, gi, a.scales, a.offsets, a.st);
  }
}

template <int BITS, Mode M>
__global__ void __launch_bounds__(kRowsThreads) quantize_rows_kernel(const RowsArgs a) {
  LQ_DYNAMIC_SMEM(float4, smem4);
  float* xs = reinterpret_cast<float*>(smem4);  // [R, D]
  float* sc = xs + a.R * a.D;                   // [R, nt]
  float* of = sc + a.R * a.nt;                  // [R, nt] asymmetric only
  using WarpReduce = cub::WarpReduce<GroupStat<M>>;
  __shared__ typename WarpReduce::TempStorage wtemp[kRowsThreads / 32];

  const int tid = static_cast<int>(threadIdx.x);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * a.R;
  const int rows = static_cast<int>(min(static_cast<int64_t>(a.R), a.T - r0));
  const int n = rows * a.D;
  const float* src = a.x + r0 * a.D;

  // 1. load
  unsigned bad = 0;
  if (a.vec) {
    const float4* s4 = reinterpret_cast<const float4*>(src);
#pragma unroll 4
    for (int i = tid; i < n / 4; i += kRowsThreads) {  // unrolled: 4 loads in flight per thread
      const float4 v = s4[i];
      bad += !q::is_finite(v.x) + !q::is_finite(v.y) + !q::is_finite(v.z) + !q::is_finite(v.w);
      smem4[i] = v;
    }
  } else {
    for (int i = tid; i < n; i += kRowsThreads) {
      const float v = src[i];
      bad += !q::is_finite(v);
      xs[i] = v;
    }
  }
  if (!a.tensor) note_nonfinite(a.st, bad);  // per-tensor: counted by the statistics pass
  __syncthreads();

  // 2. group parameters
  const int ng = rows * a.nt;
  if (a.tensor) {
    if constexpr (M == Mode::Sym || M == Mode::Asym) {
      const float s = load_scale(a.scales, 0, a.sd);
      const float o = M == Mode::Asym ? load_scale(a.offsets, 0, a.sd) : 0.0f;
      for (int i = tid; i < ng; i += kRowsThreads) {
        sc[i] = s;
        if constexpr (M == Mode::Asym) of[i] = o;
      }
    }
  } else if (a.g <= kThreadGroupMax) {
    const int lane = tid & 31;
    for (int i = tid; i < ng; i += kRowsThreads) {
      const int r = static_cast<int>(a.div_nt.div(static_cast<uint32_t>(i)));
      const int j = i - r * a.nt;
      const int d0 = j * a.g;
      const int len = min(a.g, a.D - d0);
      const float* xg = xs + r * a.D + d0;
      GroupStat<M> s = stat_identity<M>();
      int k = lane % len;  // start offset: spreads a warp's reads over the banks
      for (int c = 0; c < len; ++c) {
        stat_add<M>(s, xg[k], static_cast<uint32_t>(k));
        if (++k == len) k = 0;
      }
      const q::ScaleOffset p = finish_group<BITS, M>(s, (r0 + r) * a.nt + j, a);
      sc[i] = p.scale;
      if constexpr (M == Mode::Asym) of[i] = p.offset;
    }
  } else {
    const int warp = tid >> 5, lane = tid & 31;
    for (int i = warp; i < ng; i += kRowsThreads / 32) {
      const int r = static_cast<int>(a.div_nt.div(static_cast<uint32_t>(i)));
      const int j = i - r * a.nt;
      const int d0 = j * a.g;
      const int len = min(a.g, a.D - d0);
      const float* xg = xs + r * a.D + d0;
      GroupStat<M> s = stat_identity<M>();
      for (int k = lane; k < len; k += 32) stat_add<M>(s, xg[k], static_cast<uint32_t>(k));
      s = WarpReduce(wtemp[warp]).Reduce(s, StatOp<M>{});  // valid in lane 0
      if (lane == 0) {
        const q::ScaleOffset p = finish_group<BITS, M>(s, (r0 + r) * a.nt + j, a);
        sc[i] = p.scale;
        if constexpr (M == Mode::Asym) of[i] = p.offset;
      }
      __syncwarp();  // wtemp[warp] is reused by the next group
    }
  }
  __syncthreads();

  // 3. encode and pack: thread per quad of 4 elements → BITS/2 bytes
  constexpr int QB = BITS / 2;
  const int nquads = rows * a.nq;
  for (int i = tid; i < nquads; i += kRowsThreads) {
    const int r = static_cast<int>(a.div_nq.div(static_cast<uint32_t>(i)));
    const int c = i - r * a.nq;
    const int d0 = 4 * c;
    const float* xr = xs + r * a.D;
    const float* scr = sc + r * a.nt;
    float v[4];
    if (a.vec) {  // D % 4 == 0: one conflict-free 16-byte shared-memory read
      const float4 v4 = *reinterpret_cast<const float4*>(xr + d0);
      v[0] = v4.x;
      v[1] = v4.y;
      v[2] = v4.z;
      v[3] = v4.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = d0 + e < a.D ? xr[d0 + e] : 0.0f;
    }
    int j = static_cast<int>(a.div_g.div(static_cast<uint32_t>(d0)));
    int next = (j + 1) * a.g;      // first element of group j + 1
    uint32_t u[4] = {0, 0, 0, 0};  // elements past D keep code 0: zero padding bits
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int d = d0 + e;
      if (d < a.D) {
        if (d >= next) {  // g ≥ 1: at most one boundary per element
          ++j;
          next += a.g;
        }
        if constexpr (M == Mode::Sym)
          u[e] = q::encode_sym(v[e], scr[j], BITS);
        else
          u[e] = q::encode_asym(v[e], scr[j], of[r * a.nt + j], BITS);
      }
    }
    store_bytes<QB>(a.codes + (r0 + r) * a.rb + c * QB, pack_quad<BITS>(u[0], u[1], u[2], u[3]),
                    min(QB, a.rb - c * QB));
  }
}

/// bf16 bits of a finite x at flat index i, recording an overflow to ±inf (the CPU's first is the
/// lowest index) as key 2·i.
__device__ __forceinline__ uint16_t bf16_checked(float x, int64_t i, DeviceStatus* st) {
  const uint16_t b = q::f32_to_bf16_bits(x);
  if ((b & 0x7fffu) == 0x7f80u && q::is_finite(x))
    atomicMin(&st->overflow_key, 2ull * static_cast<unsigned long long>(i));
  return b;
}

/// bf16 storage: thread per quad of 4 elements (float4 in, 8 bytes out when aligned).
__global__ void bf16_encode_kernel(const float* __restrict__ x /*[n]*/, int64_t n, bool vec,
                                   uint8_t* __restrict__ codes /*[n, 2]*/, DeviceStatus* st /*[1]*/) {
  unsigned bad = 0;
  const int64_t nquads = (n + 3) / 4;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < nquads;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e0 = 4 * i;
    if (vec && e0 + 4 <= n) {
      const float4 v = reinterpret_cast<const float4*>(x)[i];
      bad += !q::is_finite(v.x) + !q::is_finite(v.y) + !q::is_finite(v.z) + !q::is_finite(v.w);
      const uint16_t b[4] = {bf16_checked(v.x, e0, st), bf16_checked(v.y, e0 + 1, st), bf16_checked(v.z, e0 + 2, st),
                             bf16_checked(v.w, e0 + 3, st)};
      uint2 w;
      w.x = b[0] | (static_cast<uint32_t>(b[1]) << 16);
      w.y = b[2] | (static_cast<uint32_t>(b[3]) << 16);
      reinterpret_cast<uint2*>(codes)[i] = w;
    } else {
      for (int64_t e = e0; e < n && e < e0 + 4; ++e) {
        const float v = x[e];
        bad += !q::is_finite(v);
        reinterpret_cast<uint16_t*>(codes)[e] = bf16_checked(v, e, st);
      }
    }
  }
  note_nonfinite(st, bad);
}

template <int BITS, Mode M>
cudaError_t launch_rows(const RowsArgs& a, cudaStream_t stream) {
  const size_t smem = rows_smem_bytes(a.R, a.D, a.nt, M == Mode::Asym);
  if (smem > 40 * 1024) {  // static + dynamic above 48 KiB needs the opt-in (sm_80+: up to 99–227 KiB)
    const cudaError_t e = cudaFuncSetAttribute(quantize_rows_kernel<BITS, M>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const int64_t blocks = (a.T + a.R - 1) / a.R;
  auto* kernel = &quantize_rows_kernel<BITS, M>;
  LQ_LAUNCH(kernel, static_cast<unsigned>(blocks), kRowsThreads, smem, stream, a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_quantize_rows(const RowsArgs& a, int bits, Mode mode, cudaStream_t stream) {
  if (mode != Mode::Sym && mode != Mode::Asym) return cudaErrorInvalidValue;
  LQ_DISPATCH_INT(bits, mode == Mode::Sym, return launch_rows<BITS, MODE>(a, stream);)
  return cudaErrorInvalidValue;
}

cudaError_t launch_bf16_encode(const float* x, int64_t n, uint8_t* codes, DeviceStatus* st, cudaStream_t stream) {
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0 && (reinterpret_cast<uintptr_t>(codes) & 7) == 0;
  const int64_t nquads = (n + 3) / 4;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((nquads + threads - 1) / threads, int64_t{1} << 20);
  LQ_LAUNCH(bf16_encode_kernel, static_cast<unsigned>(std::max<int64_t>(blocks, 1)), threads, 0, stream, x, n, vec,
            codes, st);
  return cudaGetLastError();
}

}  // namespace latentq::gpu::detail
