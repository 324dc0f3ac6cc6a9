// kernels/attention/fused_decode.cu — one decode step of the absorbed MLA attention reading the quantized
// latent cache directly (latentq/fused_decode_cuda.h): split-K over the keys, an online softmax per head,
// the output in the latent space, then a combine kernel over the splits.
//
// Design, after two MLA decode kernels (read for this file, not copied):
//   * FlashMLA (github.com/deepseek-ai/FlashMLA, commit 9241ae3ef9bac614dd25e45e507e089f888280e0):
//     csrc/sm90/decode/dense/splitkv_mla.cuh — one CTA per (head block, key range of one request), the key
//     tile in shared memory read by every head of the block; csrc/smxx/decode/combine/combine.cu — the
//     splits' outputs merged by their log-sum-exp (base 2); csrc/smxx/decode/get_decoding_sched_meta/
//     get_decoding_sched_meta.cu — the key ranges cut to balance the SMs; csrc/sm90/decode/sparse_fp8/
//     components/dequant.h — the fp8 cache dequantized on the way into shared memory.
//   * FlashInfer (github.com/flashinfer-ai/flashinfer, commit fb28d7242b3506a2348265962041acc1fb56cca4):
//     include/flashinfer/attention/decode.cuh, BatchDecodeWithPagedKVCacheKernelMLA and
//     compute_qk_and_update_local_stat_mla — the lanes of a warp along the latent dimension, 16 heads per
//     block, each head's query and output state in registers, the score reduced with shfl_xor, the scores in
//     base 2 (sm_scale · log2 e, exp2); include/flashinfer/attention/state.cuh — state_t (o, m, d) and its
//     merge; kv chunks of one size for the whole batch (kv_chunk_size), a request's later chunks empty.
//
// fused_decode_kernel, grid (splits, head tiles, B), 512 threads = 16 warps, warp w owning head 16·tile + w
// (one head per warp: 128 registers a thread, no spills, one CTA of 16 warps per SM; two heads per warp took
// 209 registers, i.e. 8 warps per SM). For each tile of kFusedKeysPerTile (16) keys of its chunk:
//   1. decode: the 512 threads decode the tile's rows, 4 consecutive elements of one row (c_kv, then k_pe)
//      per unit, from the stored codes and scales in global memory into registers — the element math of
//      qmath.h / blockfmt.h that latentq::dequantize runs (decode_sym / decode_asym with the stored scale and
//      offset, bf16_bits_to_f32, dequantize_elements) — and store them as float32 to shared memory
//      ([16, Dc + Dr], float4 stores), where every warp of the CTA reads them; the decoded-keys debug output
//      is written from the same registers;
//   2. scores: lane l of a warp holds q_lat[h, l + 32i] and q_pe[h, l + 32i] of its head in registers;
//      for each key, the partial dot products over its elements, reduced by a shfl_xor butterfly (every lane
//      gets the score), times softmax_scale · log2 e;
//   3. online softmax: m' = max(m, the tile's scores), α = 2^(m − m'), l = α·l + Σ 2^(s − m'),
//      o = α·o + Σ 2^(s − m')·c_kv_j (the output elements of lane l in registers, the keys from step 1).
// At the end of its chunk, a warp writes o / l and lse = m + log2 l per head: to the output directly when
// splits = 1, else to the partials [splits, B, H, Dc] and [splits, B, H]; a chunk without keys writes 0 and
// −inf. fused_combine_kernel, one 128-thread block per (b, h): M = max_s lse_s, w_s = 2^(lse_s − M),
// o = Σ w_s o_s / Σ w_s, lse = (M + log2 Σ w_s) · ln 2 (0 and −inf when every chunk is empty).
// Shared memory: 16 · (Dc + Dr) floats (≤ 40 KiB at the limits). No atomics; every output has one writer.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "kernels.cuh"
#include "latentq/fused_decode_cuda.h"
#include "latentq/gpu/device_buffer.h"

namespace latentq {
namespace gpu {
namespace {

namespace q = ::latentq::qmath;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kHeadsPerWarp = kFusedHeadsPerCta / kWarps;  // 1
constexpr int kTile = kFusedKeysPerTile;                   // 16
constexpr int kVc = kFusedMaxCkv / 32;                     // c_kv elements per lane: 16
constexpr int kVr = kFusedMaxKpe / 32;                     // k_pe elements per lane: 4
constexpr int kCombineThreads = 128;
constexpr float kLog2e = 1.44269504088896340736f;
constexpr float kLn2 = 0.693147180559945309417f;
static_assert(kHeadsPerWarp * kWarps == kFusedHeadsPerCta, "heads of a CTA");

struct FusedArgs {
  FusedCacheView ckv, kpe;
  FusedDecodeParams p;
  int splits;
  int64_t chunk;
  int S;              ///< shared-memory floats per key row: Dc + Dr
  int qc, qr;         ///< 4-element units per row of c_kv, k_pe
  FastDiv div_units;  ///< by qc + qr
  float scale2;       ///< softmax_scale · log2 e
  float* o_part;      ///< [splits, B, H, Dc] (splits > 1)
  float* lse_part;    ///< [splits, B, H] base-2 lse of the scaled scores (splits > 1)
};

/// The stored bytes [0, nb) at src (nb ≤ 4) as the low bytes of a word (one aligned load when whole).
__device__ __forceinline__ uint32_t load_code_word(const uint8_t* src, int nb, int full) {
  switch (full) {
    case 4:
      return detail::load_bytes<4>(src, nb);
    case 2:
      return detail::load_bytes<2>(src, nb);
    default:
      return detail::load_bytes<1>(src, nb);
  }
}

/// Decoded elements [d0, d0 + n) (d0 a multiple of 4, n ≤ 4) of row t of v into out[n]: the float32 values
/// latentq::dequantize gives, from qmath.h / blockfmt.h's decode functions.
__device__ __forceinline__ void decode_unit(const FusedCacheView& v, int64_t t, int d0, int n, float* out) {
  const uint8_t* row = v.codes + t * v.row_bytes;
  if (v.kind == FusedKind::Bf16) {  // 2 bytes per element, little-endian
    const uint8_t* c = row + 2 * d0;
    if (n == 4 && (reinterpret_cast<uintptr_t>(c) & 7) == 0) {
      const uint2 w = *reinterpret_cast<const uint2*>(c);
      out[0] = q::bf16_bits_to_f32(static_cast<uint16_t>(w.x));
      out[1] = q::bf16_bits_to_f32(static_cast<uint16_t>(w.x >> 16));
      out[2] = q::bf16_bits_to_f32(static_cast<uint16_t>(w.y));
      out[3] = q::bf16_bits_to_f32(static_cast<uint16_t>(w.y >> 16));
    } else {
      for (int e = 0; e < n; ++e) out[e] = q::bf16_bits_to_f32(static_cast<uint16_t>(c[2 * e] | (c[2 * e + 1] << 8)));
    }
    return;
  }
  if (v.kind == FusedKind::Int) {
    // 4 codes of `bits` bits: bits/2 bytes at byte d0·bits/8 (qmath.h's packing, element 0 in the low bits)
    const int qb = v.bits / 2, off = (d0 / 4) * qb;
    const uint32_t w = load_code_word(row + off, min(qb, v.row_bytes - off), qb);
    const uint32_t mask = (1u << v.bits) - 1u;
    int j = 0, next = 0;  // token groups: group of element d0 and the start of the next one
    int64_t base = 0;     // scale index of element d0's group (tensor: 0; channel: + element)
    if (v.gran == Granularity::Channel) {
      base = static_cast<int64_t>(v.token_group[t]) * v.D + d0;
    } else if (v.gran == Granularity::Token) {
      j = d0 / v.group;
      next = (j + 1) * v.group;
      base = t * v.nb;
    }
    int64_t cur = -1;  // the (scale, offset) index held in sv, ov
    float sv = 0.0f, ov = 0.0f;
    for (int e = 0; e < n; ++e) {
      int64_t si = 0;
      if (v.gran == Granularity::Channel) {
        si = base + e;
      } else if (v.gran == Granularity::Token) {
        if (d0 + e >= next) {
          ++j;
          next += v.group;
        }
        si = base + j;
      }
      if (si != cur) {
        sv = detail::load_scale(v.scales, si, v.sd);
        if (!v.sym) ov = detail::load_scale(v.offsets, si, v.sd);
        cur = si;
      }
      const uint32_t u = (w >> (v.bits * e)) & mask;
      out[e] = v.sym ? q::decode_sym(u, sv, v.bits) : q::decode_asym(u, sv, ov);
    }
    return;
  }
  // block formats: the unit cut at block boundaries, each piece through dequantize_elements
  int d = d0;
  const int end = d0 + n;
  int j = d0 / v.group;
  while (d < end) {
    const int b0 = j * v.group, nj = min(v.group, v.D - b0), e1 = min(end, b0 + nj);
    const int64_t gi = t * v.nb + j;
    const uint8_t* sp = v.scale_bytes ? v.scales + gi * v.scale_bytes : nullptr;
    const uint8_t* op = v.desc.has_offset ? v.offsets + gi * v.scale_bytes : nullptr;
    q::dequantize_elements(v.desc, row + static_cast<int64_t>(j) * v.block_bytes, sp, op, v.global, nj, d - b0, e1 - b0,
                           out + (d - d0));
    d = e1;
    ++j;
  }
}

__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  return s;
}

__global__ void __launch_bounds__(kThreads, 1) fused_decode_kernel(const FusedArgs a) {
  LQ_DYNAMIC_SMEM(float, kv);  // [kTile, S]: c_kv at [0, Dc), k_pe at [Dc, Dc + Dr) of each key row
  const FusedDecodeParams& p = a.p;
  const int split = static_cast<int>(blockIdx.x);
  const int64_t b = blockIdx.z;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int Dc = p.Dc, Dr = p.Dr;
  const int64_t H = p.H;
  const int64_t s0 = p.seq_offsets[b], L = p.seq_offsets[b + 1] - s0;
  const int64_t k_begin = static_cast<int64_t>(split) * a.chunk;
  const int64_t k_end = min(L, k_begin + a.chunk);
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kFusedHeadsPerCta + warp * kHeadsPerWarp;
  const bool active = h0 < H;  // warp-uniform
  const bool debug = blockIdx.y == 0 && (p.decoded_ckv != nullptr || p.decoded_kpe != nullptr);

  float ql[kHeadsPerWarp][kVc], qp[kHeadsPerWarp][kVr], o[kHeadsPerWarp][kVc];
  float m[kHeadsPerWarp], l[kHeadsPerWarp];
#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
    const int64_t h = h0 + hh;
    const bool valid = h < H;
    const float* qlh = p.q_lat + (b * H + (valid ? h : 0)) * Dc;
    const float* qph = p.q_pe + (b * H + (valid ? h : 0)) * Dr;
#pragma unroll
    for (int i = 0; i < kVc; ++i) {
      const int d = lane + 32 * i;
      ql[hh][i] = valid && d < Dc ? qlh[d] : 0.0f;
      o[hh][i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kVr; ++i) {
      const int d = lane + 32 * i;
      qp[hh][i] = valid && d < Dr ? qph[d] : 0.0f;
    }
    m[hh] = -INFINITY;
    l[hh] = 0.0f;
  }

  const int units_per_row = a.qc + a.qr;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kTile) {
    const int nk = static_cast<int>(min(static_cast<int64_t>(kTile), k_end - k0));
    __syncthreads();  // the previous tile has been read by every warp
    // 1. decode the tile's rows into shared memory
    for (int u = tid; u < nk * units_per_row; u += kThreads) {
      const int r = static_cast<int>(a.div_units.div(static_cast<uint32_t>(u)));
      const int c = u - r * units_per_row;
      const int64_t t = s0 + k0 + r;
      const bool is_ckv = c < a.qc;
      const int d0 = 4 * (is_ckv ? c : c - a.qc);
      const int D = is_ckv ? Dc : Dr;
      const int n = min(4, D - d0);
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      decode_unit(is_ckv ? a.ckv : a.kpe, t, d0, n, v);
      float* dst = kv + r * a.S + (is_ckv ? 0 : Dc) + d0;
      if (n == 4 && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
        *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
      } else {
        for (int e = 0; e < n; ++e) dst[e] = v[e];
      }
      if (debug) {
        float* g = is_ckv ? p.decoded_ckv : p.decoded_kpe;
        if (g != nullptr)
          for (int e = 0; e < n; ++e) g[t * D + d0 + e] = v[e];
      }
    }
    __syncthreads();
    if (!active) continue;
    // 2. scores of the tile's keys for the warp's heads (every lane ends with all of them)
    float sc[kHeadsPerWarp][kTile];
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      float s[kHeadsPerWarp];
#pragma unroll
      for (int hh = 0; hh < kHeadsPerWarp; ++hh) s[hh] = 0.0f;
      if (j < nk) {
        const float* row = kv + j * a.S;
#pragma unroll
        for (int i = 0; i < kVc; ++i) {
          const int d = lane + 32 * i;
          if (d < Dc) {
            const float x = row[d];
#pragma unroll
            for (int hh = 0; hh < kHeadsPerWarp; ++hh) s[hh] = fmaf(ql[hh][i], x, s[hh]);
          }
        }
#pragma unroll
        for (int i = 0; i < kVr; ++i) {
          const int d = lane + 32 * i;
          if (d < Dr) {
            const float x = row[Dc + d];
#pragma unroll
            for (int hh = 0; hh < kHeadsPerWarp; ++hh) s[hh] = fmaf(qp[hh][i], x, s[hh]);
          }
        }
#pragma unroll
        for (int hh = 0; hh < kHeadsPerWarp; ++hh) sc[hh][j] = warp_sum(s[hh]) * a.scale2;
      } else {
#pragma unroll
        for (int hh = 0; hh < kHeadsPerWarp; ++hh) sc[hh][j] = -INFINITY;
      }
    }
    // 3. online softmax and the output
#pragma unroll
    for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
      float mt = m[hh];
#pragma unroll
      for (int j = 0; j < kTile; ++j) mt = fmaxf(mt, sc[hh][j]);
      const float alpha = exp2f(m[hh] - mt);  // 0 on the first tile (m = −inf)
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kTile; ++j) {
        sc[hh][j] = j < nk ? exp2f(sc[hh][j] - mt) : 0.0f;
        sum += sc[hh][j];
      }
      l[hh] = fmaf(l[hh], alpha, sum);
      m[hh] = mt;
#pragma unroll
      for (int i = 0; i < kVc; ++i) o[hh][i] *= alpha;
    }
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      if (j < nk) {
        const float* row = kv + j * a.S;
#pragma unroll
        for (int i = 0; i < kVc; ++i) {
          const int d = lane + 32 * i;
          if (d < Dc) {
            const float x = row[d];
#pragma unroll
            for (int hh = 0; hh < kHeadsPerWarp; ++hh) o[hh][i] = fmaf(sc[hh][j], x, o[hh][i]);
          }
        }
      }
    }
  }
  if (!active) return;
  // the chunk's normalised output and lse (base 2); 0 and −inf without keys
  const int64_t B = p.B;
#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
    const int64_t h = h0 + hh;
    if (h >= H) continue;
    const bool any = l[hh] > 0.0f;
    const float lse2 = any ? m[hh] + log2f(l[hh]) : -INFINITY;
    float* dst;
    if (a.splits == 1) {
      dst = p.out + (b * H + h) * Dc;
      if (lane == 0 && p.lse != nullptr) p.lse[b * H + h] = any ? lse2 * kLn2 : -INFINITY;
    } else {
      const int64_t row = (static_cast<int64_t>(split) * B + b) * H + h;
      dst = a.o_part + row * Dc;
      if (lane == 0) a.lse_part[row] = lse2;
    }
#pragma unroll
    for (int i = 0; i < kVc; ++i) {
      const int d = lane + 32 * i;
      if (d < Dc) dst[d] = any ? o[hh][i] / l[hh] : 0.0f;
    }
  }
}

// Block-wide max or sum of one value per thread (a fixed shared-memory tree: the same order every run).
template <bool Max>
__device__ float block_reduce(float v, float* sh) {
  const int t = static_cast<int>(threadIdx.x);
  sh[t] = v;
  __syncthreads();
  for (int s = kCombineThreads / 2; s > 0; s >>= 1) {
    if (t < s) sh[t] = Max ? fmaxf(sh[t], sh[t + s]) : sh[t] + sh[t + s];
    __syncthreads();
  }
  const float r = sh[0];
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kCombineThreads) fused_combine_kernel(const FusedArgs a) {
  __shared__ float sh[kCombineThreads];
  const int64_t bh = blockIdx.x, BH = a.p.B * a.p.H;
  const int tid = static_cast<int>(threadIdx.x);
  const int Dc = a.p.Dc;
  float mx = -INFINITY;
  for (int s = tid; s < a.splits; s += kCombineThreads) mx = fmaxf(mx, a.lse_part[s * BH + bh]);
  const float M = block_reduce<true>(mx, sh);
  const bool any = M != -INFINITY;
  float z = 0.0f;
  if (any)
    for (int s = tid; s < a.splits; s += kCombineThreads) z += exp2f(a.lse_part[s * BH + bh] - M);
  const float Z = block_reduce<false>(z, sh);
  for (int d = tid; d < Dc; d += kCombineThreads) {
    float acc = 0.0f;
    if (any)
      for (int s = 0; s < a.splits; ++s)
        acc = fmaf(exp2f(a.lse_part[s * BH + bh] - M), a.o_part[(s * BH + bh) * Dc + d], acc);
    a.p.out[bh * Dc + d] = any ? acc / Z : 0.0f;
  }
  if (tid == 0 && a.p.lse != nullptr) a.p.lse[bh] = any ? (M + log2f(Z)) * kLn2 : -INFINITY;
}

bool view_ok(const FusedCacheView& v, int D, int max_cols) {
  if (v.codes == nullptr || v.D != D || D < 1 || D > max_cols || v.T < 0 || v.row_bytes < 1) return false;
  switch (v.kind) {
    case FusedKind::Bf16:
      return true;
    case FusedKind::Int:
      if (v.bits != 2 && v.bits != 4 && v.bits != 8) return false;
      if (v.sd != ScaleDtype::F16 && v.sd != ScaleDtype::F32) return false;
      if (v.scales == nullptr || (!v.sym && v.offsets == nullptr)) return false;
      if (v.gran == Granularity::Channel && v.token_group == nullptr) return false;
      return v.gran != Granularity::Token || (v.group >= 1 && v.nb >= 1);
    case FusedKind::Block:
      return v.group >= 1 && v.nb >= 1 && (v.scale_bytes == 0 || v.scales != nullptr) &&
             (!v.desc.has_offset || v.offsets != nullptr);
  }
  return false;
}

}  // namespace

FusedCacheView fused_cache_view(const DeviceQuantized& dq, int max_cols, cudaStream_t stream) {
  const QuantSpec& st = dq.spec;
  if (st.format == Format::Preset)
    throw std::invalid_argument("fused decode: '" + st.to_string() +
                                "' is a preset; pass each target's stored tensor (QuantSpec::stored_for)");
  // TurboQuant's rows decode through a Hadamard, Lloyd-Max and transform coding through per-matrix tables:
  // no fused kernel yet for any of them
  if (st.format == Format::TurboQuant || st.format == Format::LloydMax || st.format == Format::TransformCoding)
    throw std::invalid_argument("fused decode: '" + st.to_string() + "' (" + family_of(st) +
                                ") has no fused decode kernel; dequantize_device it instead");
  check_device_layout(dq, "fused decode");
  if (dq.cols > max_cols)
    throw std::invalid_argument("fused decode: '" + st.to_string() + "' [" + std::to_string(dq.rows) + ", " +
                                std::to_string(dq.cols) + "]: rows of " + std::to_string(dq.cols) +
                                " elements exceed the kernel's limit of " + std::to_string(max_cols));
  const QuantizedTensor h = dq.header();
  const Layout L = h.layout();
  FusedCacheView v;
  v.codes = dq.codes.data();
  v.scales = dq.scales.size() ? dq.scales.data() : nullptr;
  v.offsets = dq.offsets.size() ? dq.offsets.data() : nullptr;
  v.T = dq.rows;
  v.D = static_cast<int>(dq.cols);
  v.row_bytes = static_cast<int>(h.row_bytes());
  if (st.format == Format::BF16) {
    v.kind = FusedKind::Bf16;
  } else if (L.block_format) {
    v.kind = FusedKind::Block;
    v.desc = L.desc;
    v.group = L.desc.block;
    v.nb = L.blocks_per_row > 0 ? static_cast<int>(L.blocks_per_row) : 1;
    v.scale_bytes = L.scale_bytes;
    v.block_bytes = q::block_code_bytes(L.desc.block, L.desc.code_bits);
    v.global = h.global_scale();
  } else {
    v.kind = FusedKind::Int;
    v.bits = st.bits;
    v.sym = st.scheme == Scheme::Sym;
    v.gran = st.granularity;
    v.sd = st.scale_dtype;
    if (st.granularity == Granularity::Token) {
      v.group = static_cast<int>(L.block);
      v.nb = static_cast<int>(L.blocks_per_row);
    }
    if (st.granularity == Granularity::Channel) v.token_group = token_group_map(dq, stream);
  }
  return v;
}

FusedDecodePlan plan_fused_decode(int64_t B, int64_t H, int Dc, int64_t max_len, int splits, int num_sms) {
  if (B < 1 || H < 1 || Dc < 1 || max_len < 0 || splits < 0)
    throw std::invalid_argument("plan_fused_decode: need B >= 1, H >= 1, Dc >= 1, max_len >= 0, splits >= 0; got B = " +
                                std::to_string(B) + ", H = " + std::to_string(H) + ", Dc = " + std::to_string(Dc) +
                                ", max_len = " + std::to_string(max_len) + ", splits = " + std::to_string(splits));
  FusedDecodePlan plan;
  plan.head_tiles = static_cast<int>((H + kFusedHeadsPerCta - 1) / kFusedHeadsPerCta);
  const int64_t tiles = std::max<int64_t>(1, (max_len + kTile - 1) / kTile);
  int64_t want = splits;
  if (want == 0) {
    const int64_t ctas = B * plan.head_tiles, target = 2 * static_cast<int64_t>(std::max(num_sms, 1));
    want = std::min((target + ctas - 1) / ctas,
                    std::max<int64_t>(1, (max_len + kFusedMinSplitKeys - 1) / kFusedMinSplitKeys));
  }
  want = std::clamp<int64_t>(want, 1, tiles);
  const int64_t chunk_tiles = (tiles + want - 1) / want;
  plan.chunk = chunk_tiles * kTile;
  plan.splits = static_cast<int>((tiles + chunk_tiles - 1) / chunk_tiles);
  plan.workspace_bytes = plan.splits > 1 ? static_cast<size_t>(plan.splits) * static_cast<size_t>(B * H) *
                                               (static_cast<size_t>(Dc) + 1) * 4
                                         : 0;
  return plan;
}

cudaError_t launch_fused_decode(const FusedCacheView& ckv, const FusedCacheView& kpe, const FusedDecodeParams& p,
                                const FusedDecodePlan& plan, void* workspace, cudaStream_t stream) {
  if (p.B < 1 || p.B > 65535 || p.H < 1 || plan.head_tiles < 1 || plan.head_tiles > 65535 || plan.splits < 1 ||
      plan.chunk < kTile || plan.chunk % kTile != 0 ||
      plan.head_tiles != (p.H + kFusedHeadsPerCta - 1) / kFusedHeadsPerCta)
    return cudaErrorInvalidValue;
  if (!view_ok(ckv, p.Dc, kFusedMaxCkv) || !view_ok(kpe, p.Dr, kFusedMaxKpe) || ckv.T != kpe.T)
    return cudaErrorInvalidValue;
  if (p.q_lat == nullptr || p.q_pe == nullptr || p.seq_offsets == nullptr || p.out == nullptr)
    return cudaErrorInvalidValue;
  const size_t need = plan.splits > 1 ? static_cast<size_t>(plan.splits) * static_cast<size_t>(p.B * p.H) *
                                            (static_cast<size_t>(p.Dc) + 1) * 4
                                      : 0;
  if (plan.workspace_bytes < need || (need > 0 && workspace == nullptr)) return cudaErrorInvalidValue;
  FusedArgs a{};
  a.ckv = ckv;
  a.kpe = kpe;
  a.p = p;
  a.splits = plan.splits;
  a.chunk = plan.chunk;
  a.S = p.Dc + p.Dr;
  a.qc = (p.Dc + 3) / 4;
  a.qr = (p.Dr + 3) / 4;
  a.div_units = FastDiv(a.qc + a.qr);
  a.scale2 = p.softmax_scale * kLog2e;
  if (plan.splits > 1) {
    a.o_part = static_cast<float*>(workspace);
    a.lse_part =
        a.o_part + static_cast<size_t>(plan.splits) * static_cast<size_t>(p.B * p.H) * static_cast<size_t>(p.Dc);
  }
  const size_t smem = static_cast<size_t>(kTile) * static_cast<size_t>(a.S) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(plan.splits), static_cast<unsigned>(plan.head_tiles),
                  static_cast<unsigned>(p.B));
  LQ_LAUNCH(fused_decode_kernel, grid, kThreads, smem, stream, a);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (plan.splits > 1) {
    LQ_LAUNCH(fused_combine_kernel, static_cast<unsigned>(p.B * p.H), kCombineThreads, 0, stream, a);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

int device_sm_count() {
  static std::mutex mu;
  static std::map<int, int> cache;
  int dev = 0;
  LQ_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mu);
  if (const auto it = cache.find(dev); it != cache.end()) return it->second;
  cudaDeviceProp prop{};
  LQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return cache[dev] = std::max(prop.multiProcessorCount, 1);
}

}  // namespace gpu

gpu::FusedDecodePlan fused_decode_gpu(const QuantizedTensor& c_kv, const QuantizedTensor& k_pe,
                                      std::span<const int64_t> seq_offsets, const float* q_lat, const float* q_pe,
                                      int64_t H, float softmax_scale, int splits, float* out, float* lse,
                                      float* decoded_ckv, float* decoded_kpe) {
  validate_seq_offsets(seq_offsets, c_kv.rows);
  if (k_pe.rows != c_kv.rows)
    throw std::invalid_argument("fused decode: c_kv has " + std::to_string(c_kv.rows) + " rows but k_pe has " +
                                std::to_string(k_pe.rows) + "; both hold one row per cached token");
  if (H < 1) throw std::invalid_argument("fused decode: the number of heads must be >= 1, got " + std::to_string(H));
  const int64_t B = static_cast<int64_t>(seq_offsets.size()) - 1, T = c_kv.rows;
  int64_t max_len = 0;
  for (int64_t b = 0; b < B; ++b) max_len = std::max(max_len, seq_offsets[b + 1] - seq_offsets[b]);
  const DeviceQuantized dc = to_device(c_kv), dk = to_device(k_pe);
  const gpu::FusedCacheView vc = gpu::fused_cache_view(dc, gpu::kFusedMaxCkv),
                            vk = gpu::fused_cache_view(dk, gpu::kFusedMaxKpe);
  const int Dc = vc.D, Dr = vk.D;
  const gpu::FusedDecodePlan plan = gpu::plan_fused_decode(B, H, Dc, max_len, splits, gpu::device_sm_count());
  gpu::DeviceBuffer<float> d_ql, d_qp, d_out(static_cast<size_t>(B * H * Dc), "fused decode output"),
      d_lse(static_cast<size_t>(B * H), "fused decode lse"), d_kc, d_kr;
  gpu::DeviceBuffer<int64_t> d_seq;
  gpu::DeviceBuffer<float> ws(plan.workspace_bytes / sizeof(float), "fused decode partial outputs");
  d_ql.upload(q_lat, static_cast<size_t>(B * H * Dc), nullptr, "q_lat");
  d_qp.upload(q_pe, static_cast<size_t>(B * H * Dr), nullptr, "q_pe");
  d_seq.upload(seq_offsets.data(), seq_offsets.size(), nullptr, "seq_offsets");
  // the decoded keys start as NaN (all-ones bytes), so a row the kernel does not write cannot pass for decoded
  if (decoded_ckv) {
    d_kc.resize(static_cast<size_t>(T * Dc), "decoded c_kv");
    LQ_CUDA_CHECK(cudaMemsetAsync(d_kc.data(), 0xff, d_kc.bytes(), nullptr));
  }
  if (decoded_kpe) {
    d_kr.resize(static_cast<size_t>(T * Dr), "decoded k_pe");
    LQ_CUDA_CHECK(cudaMemsetAsync(d_kr.data(), 0xff, d_kr.bytes(), nullptr));
  }
  gpu::FusedDecodeParams p;
  p.B = B;
  p.H = H;
  p.Dc = Dc;
  p.Dr = Dr;
  p.softmax_scale = softmax_scale;
  p.q_lat = d_ql.data();
  p.q_pe = d_qp.data();
  p.seq_offsets = d_seq.data();
  p.out = d_out.data();
  p.lse = d_lse.data();
  p.decoded_ckv = decoded_ckv ? d_kc.data() : nullptr;
  p.decoded_kpe = decoded_kpe ? d_kr.data() : nullptr;
  LQ_CUDA_CHECK(gpu::launch_fused_decode(vc, vk, p, plan, ws.data(), nullptr));
  LQ_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  d_out.download(out, nullptr);
  if (lse) d_lse.download(lse, nullptr);
  if (decoded_ckv) d_kc.download(decoded_ckv, nullptr);
  if (decoded_kpe) d_kr.download(decoded_kpe, nullptr);
  return plan;
}

}  // namespace latentq
