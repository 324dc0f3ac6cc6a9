// kernels/quant/channel.cu — per-channel (per latent dimension) groups of consecutive tokens.
//
// A warp owns 32 consecutive channels of a chunk of ≤ 32 tokens of one group; each lane owns one
// channel and keeps its ≤ 32 values in registers (loads of 128 contiguous bytes per token row).
//   * Short groups (all ≤ kChannelFusedTokens tokens, e.g. -g32): ONE pass — statistics in token
//     order in the lane (exactly the CPU fold), (scale, offset) by qmath, encode, pack.
//   * Long groups (-g0, -g128, ...): channel_stats_kernel folds chunks of ≤ 512 tokens in token
//     order into partial (min, max), channel_finalize_kernel merges a group's chunks in chunk order
//     (min_num/max_num keep the earlier operand, so the merge equals the CPU's in-order fold) and
//     stores (scale, offset); then channel_encode_kernel re-reads the input and encodes with the
//     stored parameters. Two passes over the input.
// Packing: lane l's code goes to bits BITS·(l mod 4·PER) of a 32-bit word shared by 4·PER lanes
// (PER = codes per byte), OR-reduced with __shfl_xor_sync; the word's first lane stores 4 bytes.
#include <algorithm>

#include "kernels.cuh"

namespace latentq::gpu::detail {
namespace {

template <int BITS, bool SYM>
__global__ void __launch_bounds__(kChannelWarps * 32) channel_encode_kernel(const ChannelArgs a) {
  constexpr int PER = 8 / BITS;        // codes per byte
  constexpr int WORD_LANES = 4 * PER;  // lanes whose codes form one 32-bit word
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kChannelWarps + (threadIdx.x >> 5);
  if (task >= a.nchunks * a.nslices) return;  // warp-uniform
  const int64_t ci = task / a.nslices;
  const int64_t slice = task - ci * a.nslices;
  const ChunkDesc ch = a.chunks[ci];
  const int64_t d = slice * 32 + lane;
  const bool active = d < a.D;
  const int n = ch.n;  // 1..32, warp-uniform

  float v[kChannelFusedTokens];
  const float* xp = a.x + ch.t0 * a.D + d;
#pragma unroll
  for (int i = 0; i < kChannelFusedTokens; ++i) v[i] = (active && i < n) ? xp[i * a.D] : 0.0f;

  const int64_t gi = ch.group * a.D + d;  // index of this (group, channel) scale
  float s = 0.0f, o = 0.0f;
  if (a.fused) {
    unsigned bad = 0;
#pragma unroll
    for (int i = 0; i < kChannelFusedTokens; ++i)
      if (i < n) bad += active && !q::is_finite(v[i]);
    note_nonfinite(a.st, bad);
    if (active) {
      q::ScaleOffset p;
      if constexpr (SYM) {
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < kChannelFusedTokens; ++i)
          if (i < n) amax = q::max_num(amax, q::abs_f(v[i]));
        p = finish_int_group<true>(amax, 0.0f, BITS, a.sd, gi, a.scales, a.offsets, a.st);
      } else {
        float mn = v[0], mx = v[0];  // the CPU's fold, in token order
#pragma unroll
        for (int i = 1; i < kChannelFusedTokens; ++i)
          if (i < n) {
            mn = q::min_num(mn, v[i]);
            mx = q::max_num(mx, v[i]);
          }
        p = finish_int_group<false>(mn, mx, BITS, a.sd, gi, a.scales, a.offsets, a.st);
      }
      s = p.scale;
      o = p.offset;
    }
  } else if (active) {
    s = load_scale(a.scales, gi, a.sd);
    if constexpr (!SYM) o = load_scale(a.offsets, gi, a.sd);
  }

  const int sub = lane & (WORD_LANES - 1);
  const int64_t bo = d / PER;  // writer lane (sub == 0): first byte of its word in the row
#pragma unroll
  for (int i = 0; i < kChannelFusedTokens; ++i) {
    if (i < n) {  // warp-uniform: every lane takes part in the shuffles
      uint32_t u = 0;
      if (active) u = SYM ? q::encode_sym(v[i], s, BITS) : q::encode_asym(v[i], s, o, BITS);
      uint32_t w = u << (BITS * sub);
#pragma unroll
      for (int off = 1; off < WORD_LANES; off <<= 1) w |= __shfl_xor_sync(0xffffffffu, w, off);
      if (sub == 0 && active)
        store_bytes<4>(a.codes + (ch.t0 + i) * a.rb + bo, w, a.rb - bo < 4 ? static_cast<int>(a.rb - bo) : 4);
    }
  }
}

template <bool SYM>
__global__ void __launch_bounds__(kChannelWarps * 32) channel_stats_kernel(const ChannelStatsArgs a) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kChannelWarps + (threadIdx.x >> 5);
  if (task >= a.nchunks * a.nslices) return;
  const int64_t ci = task / a.nslices;
  const int64_t slice = task - ci * a.nslices;
  const int64_t d = slice * 32 + lane;
  if (d >= a.D) return;  // no shuffles below
  const ChunkDesc ch = a.chunks[ci];
  const float* xp = a.x + ch.t0 * a.D + d;
  constexpr int U = 8;  // loads in flight per lane
  float mn = q::f32_from_bits(0x7f800000u), mx = q::f32_from_bits(0xff800000u), amax = 0.0f;
  unsigned bad = 0;
  for (int i0 = 0; i0 < ch.n; i0 += U) {
    float b[U];
#pragma unroll
    for (int k = 0; k < U; ++k) b[k] = (i0 + k < ch.n) ? xp[static_cast<int64_t>(i0 + k) * a.D] : 0.0f;
#pragma unroll
    for (int k = 0; k < U; ++k)
      if (i0 + k < ch.n) {  // in token order: min_num/max_num keep the earlier value on a tie
        bad += !q::is_finite(b[k]);
        if constexpr (SYM) {
          amax = q::max_num(amax, q::abs_f(b[k]));
        } else {
          mn = q::min_num(mn, b[k]);
          mx = q::max_num(mx, b[k]);
        }
      }
  }
  float* pp = a.partial + 2 * (ci * a.D + d);
  pp[0] = SYM ? amax : mn;
  pp[1] = SYM ? 0.0f : mx;
  note_nonfinite(a.st, bad);
}

template <bool SYM>
__global__ void channel_finalize_kernel(const ChannelFinalizeArgs a) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.G * a.D;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t g = i / a.D;
    const int64_t d = i - g * a.D;
    float x0 = SYM ? 0.0f : q::f32_from_bits(0x7f800000u), x1 = q::f32_from_bits(0xff800000u);
    for (int64_t c = a.begin[g]; c < a.begin[g + 1]; ++c) {  // chunk order = token order
      const float* pp = a.partial + 2 * (c * a.D + d);
      if constexpr (SYM) {
        x0 = q::max_num(x0, pp[0]);
      } else {
        x0 = q::min_num(x0, pp[0]);
        x1 = q::max_num(x1, pp[1]);
      }
    }
    finish_int_group<SYM>(x0, x1, a.bits, a.sd, i, a.scales, a.offsets, a.st);  // i = g·D + d
  }
}

int64_t warp_blocks(int64_t tasks) { return (tasks + kChannelWarps - 1) / kChannelWarps; }

}  // namespace

cudaError_t launch_channel_encode(const ChannelArgs& a, int bits, bool sym, cudaStream_t stream) {
  const int64_t blocks = warp_blocks(a.nchunks * a.nslices);
  if (blocks == 0) return cudaSuccess;
  LQ_DISPATCH_INT(bits, sym, {
    auto* kernel = &channel_encode_kernel<BITS, MODE == Mode::Sym>;
    LQ_LAUNCH(kernel, static_cast<unsigned>(blocks), kChannelWarps * 32, 0, stream, a);
    return cudaGetLastError();
  })
  return cudaErrorInvalidValue;
}

cudaError_t launch_channel_stats(const ChannelStatsArgs& a, bool sym, cudaStream_t stream) {
  const int64_t blocks = warp_blocks(a.nchunks * a.nslices);
  if (blocks == 0) return cudaSuccess;
  auto* kernel = sym ? &channel_stats_kernel<true> : &channel_stats_kernel<false>;
  LQ_LAUNCH(kernel, static_cast<unsigned>(blocks), kChannelWarps * 32, 0, stream, a);
  return cudaGetLastError();
}

cudaError_t launch_channel_finalize(const ChannelFinalizeArgs& a, bool sym, cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((a.G * a.D + threads - 1) / threads, int64_t{1} << 20);
  if (blocks == 0) return cudaSuccess;
  auto* kernel = sym ? &channel_finalize_kernel<true> : &channel_finalize_kernel<false>;
  LQ_LAUNCH(kernel, static_cast<unsigned>(blocks), threads, 0, stream, a);
  return cudaGetLastError();
}

}  // namespace latentq::gpu::detail
