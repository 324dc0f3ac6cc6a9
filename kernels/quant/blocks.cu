// kernels/quant/blocks.cu — the block formats (fp8 e4m3 tiles with the FlashMLA / vLLM scale rules,
// per-tensor fp8, MXFP8/MXFP4, NVFP4, FlashMLA fp4 tiles, ggml q8_0/q4_0/q4_1), coalesced.
//
// Quantize (quantize_blocks_kernel), one CTA per tile of R consecutive token rows, 256 threads:
//   1. load: the tile's R·D floats (contiguous in x) are read with consecutive threads on consecutive
//      float4 (x 16-byte aligned, D and block multiples of 4; else floats), 4 (8) loads in flight
//      per thread, and stored to shared memory block by block with an odd stride sb ≥ block
//      floats per block (so phase 2's one-thread-per-block walks hit 32 distinct banks; the float4
//      path's stores are 4-way conflicted, cheaper than the encode's arithmetic); NaN/Inf counted;
//   2. statistics: one thread per (row, block) runs qmath::block_params on its block in shared
//      memory (the CPU's in-order fold, exact by construction), stores the block's scale/offset
//      (consecutive threads: consecutive scales) and keeps the parameters in shared memory;
//   3. encode: one thread per 4 code bytes of one block (rb, block bytes multiples of 4; else per
//      byte) runs qmath::encode_block_bytes on them and stores one word (consecutive threads:
//      consecutive words, so the codes [R, rb] leave coalesced).
// Shared memory: R·nb·sb floats + R·nb BlockParams (≤ 24 KiB: R = 8 or 9 at D = 576; one row of
// tiny blocks at large D may need up to 80 KiB, raised per launch); two __shared__
// words (tile NaN flag, tile amax). Both halves of quantize_block are the functions the CPU
// reference calls (latentq/blockfmt.h), so codes, scales and offsets are byte-identical by
// construction; every code byte is written (no memset of the codes needed).
// Per-tensor fp8 has no block statistics: its rows are cut into 32-element pieces here (elements
// are independent, so the codes are the same) instead of one D-element block per thread.
//
// Decode (dequantize_blocks_kernel), one CTA per tile of rows, one thread per 4 consecutive
// elements of one block (D % 4 == 0, block % 4 == 0, out 16-byte aligned; else one element):
// qmath::dequantize_elements on the codes/scale read straight from global memory (consecutive
// threads read consecutive code bytes, the same scale), float4 stores. No shared memory.
//
// Status: NaN/Inf counted per element (a tile holding one is not quantized: the call fails); the
// first overflowing stored value (ggml's fp16 d or m) is recorded as key 2·(t·nb + j) + (0 scale |
// 1 offset), the CPU's throw order; max|x| (finite) is folded into DeviceStatus::amax_bits with
// atomicMax on the float bits (exact, order-free). Deterministic: every output byte has one writer.
#include <algorithm>

#include "kernels.cuh"

namespace latentq::gpu::detail {
namespace {

constexpr int kBlocksThreads = 256;
constexpr int kLoadUnroll = 8;            // loads in flight per thread in phase 1 (scalar)
constexpr int kLoadUnroll4 = 4;           // (float4)
constexpr int kTileElems = 4608;          // target R·D of a quantize tile (8 rows at D = 576)
constexpr int64_t kTileSmem = 24 * 1024;  // and its shared memory: ≈ 8 CTAs of 256 threads per SM
constexpr int kDequantTileElems = 8192;
constexpr int kTensorPiece = 32;  // per-tensor fp8: elements per piece

/// Launch geometry of one block-format call (host-computed).
struct BlocksPlan {
  q::BlockDesc desc;  ///< the kernels' blocks (per-tensor fp8: kTensorPiece-element pieces)
  int D;
  int nb;  ///< blocks per row
  int rb;  ///< code bytes per row
  int bb;  ///< code bytes of a full block (block · code_bits / 8; blocks start at even elements)
  int R;   ///< rows per tile
  int sb;  ///< shared-memory floats per block: odd, ≥ block
  FastDiv div_D, div_block, div_nb, div_rb, div_bb;
  bool vec;       ///< decode: float4 stores of 4 elements of one block
  bool vec_load;  ///< quantize: float4 loads (x 16-byte aligned, D % 4 == 0, block % 4 == 0)
  bool words;     ///< quantize: 4-byte code stores (codes 4-byte aligned, rb % 4 == 0, bb % 4 == 0)
};

__device__ __forceinline__ uint8_t* scale_ptr(const BlocksArgs& a, int64_t gi) {
  return a.scale_bytes ? a.scales + gi * a.scale_bytes : nullptr;
}
__device__ __forceinline__ uint8_t* offset_ptr(const BlocksArgs& a, int64_t gi) {
  return a.desc.has_offset ? a.offsets + gi * a.scale_bytes : nullptr;
}

__global__ void __launch_bounds__(kBlocksThreads) quantize_blocks_kernel(const BlocksArgs a, const BlocksPlan p) {
  LQ_DYNAMIC_SMEM(float4, smem);
  float* xs = reinterpret_cast<float*>(smem);  // [R·nb, sb] the tile, block by block
  auto* ps = reinterpret_cast<q::BlockParams*>(xs + static_cast<int64_t>(p.R) * p.nb * p.sb);  // [R·nb]
  __shared__ unsigned tile_bad;
  __shared__ unsigned tile_amax;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * p.R;
  const int rows = static_cast<int>(a.T - t0 < p.R ? a.T - t0 : p.R);
  const int tid = static_cast<int>(threadIdx.x), nthr = static_cast<int>(blockDim.x);
  if (tid == 0) {
    tile_bad = 0;
    tile_amax = 0;
  }
  __syncthreads();

  // 1. load [rows, D] (contiguous) into the padded block layout
  const int n = rows * p.D;
  const float* __restrict__ xg = a.x + t0 * p.D;  // [rows, D]
  unsigned bad = 0;
  if (p.vec_load) {  // float4: 4 elements of one block, consecutive in shared memory too
    const int nq = n / 4;
    for (int base = tid; base < nq; base += kLoadUnroll4 * nthr) {
      float4 v[kLoadUnroll4];
#pragma unroll
      for (int u = 0; u < kLoadUnroll4; ++u) {
        const int i = base + u * nthr;
        if (i < nq) v[u] = reinterpret_cast<const float4*>(xg)[i];
      }
#pragma unroll
      for (int u = 0; u < kLoadUnroll4; ++u) {
        const int i = base + u * nthr;
        if (i < nq) {
          const int e = 4 * i;
          const int t = static_cast<int>(p.div_D.div(static_cast<uint32_t>(e))), d = e - t * p.D;
          const int j = static_cast<int>(p.div_block.div(static_cast<uint32_t>(d))), k = d - j * p.desc.block;
          float* dst = xs + (t * p.nb + j) * p.sb + k;
          dst[0] = v[u].x;
          dst[1] = v[u].y;
          dst[2] = v[u].z;
          dst[3] = v[u].w;
          bad += !q::is_finite(v[u].x) + !q::is_finite(v[u].y) + !q::is_finite(v[u].z) + !q::is_finite(v[u].w);
        }
      }
    }
  } else {
    for (int base = tid; base < n; base += kLoadUnroll * nthr) {
      float v[kLoadUnroll];
#pragma unroll
      for (int u = 0; u < kLoadUnroll; ++u) {
        const int e = base + u * nthr;
        v[u] = e < n ? xg[e] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kLoadUnroll; ++u) {
        const int e = base + u * nthr;
        if (e < n) {
          const int t = static_cast<int>(p.div_D.div(static_cast<uint32_t>(e))), d = e - t * p.D;
          const int j = static_cast<int>(p.div_block.div(static_cast<uint32_t>(d))), k = d - j * p.desc.block;
          xs[(t * p.nb + j) * p.sb + k] = v[u];
          bad += !q::is_finite(v[u]);
        }
      }
    }
  }
  note_nonfinite(a.st, bad);
  if (bad) tile_bad = 1;
  __syncthreads();
  if (tile_bad) return;  // uniform: the call fails; the CPU reference would not have quantized

  // 2. statistics: one thread per (row, block)
  float amax = 0.0f;
  for (int b = tid; b < rows * p.nb; b += nthr) {
    const int t = static_cast<int>(p.div_nb.div(static_cast<uint32_t>(b))), j = b - t * p.nb;
    const int d0 = j * p.desc.block, nj = p.D - d0 < p.desc.block ? p.D - d0 : p.desc.block;
    const int64_t gi = (t0 + t) * p.nb + j;
    q::BlockStatus s;
    ps[b] = q::block_params(p.desc, xs + b * p.sb, nj, a.global, scale_ptr(a, gi), offset_ptr(a, gi), s);
    if (s.overflow)
      atomicMin(&a.st->overflow_key, 2ull * static_cast<unsigned long long>(gi) + (s.overflow_offset ? 1ull : 0ull));
    amax = q::max_num(amax, ps[b].amax);
  }
  if (amax > 0.0f) atomicMax(&tile_amax, q::f32_bits(amax));
  __syncthreads();
  if (tid == 0 && tile_amax) atomicMax(&a.st->amax_bits, static_cast<unsigned long long>(tile_amax));

  // 3. encode: one thread per code word (4 bytes of one block) or byte of [rows, rb] (contiguous in codes)
  uint8_t* cg = a.codes + t0 * p.rb;  // [rows, rb]
  const int w = p.words ? 4 : 1;
  const int units = rows * p.rb / w;
  for (int u = tid; u < units; u += nthr) {
    const int B = u * w;
    const int t = static_cast<int>(p.div_rb.div(static_cast<uint32_t>(B))), r = B - t * p.rb;
    const int j = static_cast<int>(p.div_bb.div(static_cast<uint32_t>(r))), byte = r - j * p.bb;
    const int d0 = j * p.desc.block, nj = p.D - d0 < p.desc.block ? p.D - d0 : p.desc.block;
    const int b = t * p.nb + j;
    if (p.words) {
      uint8_t c[4];
      q::encode_block_bytes(p.desc, ps[b], xs + b * p.sb, nj, byte, byte + 4, c);
      *reinterpret_cast<uint32_t*>(cg + B) = static_cast<uint32_t>(c[0]) | static_cast<uint32_t>(c[1]) << 8 |
                                             static_cast<uint32_t>(c[2]) << 16 | static_cast<uint32_t>(c[3]) << 24;
    } else {
      q::encode_block_bytes(p.desc, ps[b], xs + b * p.sb, nj, byte, byte + 1, cg + B);
    }
  }
}

__global__ void __launch_bounds__(kBlocksThreads) dequantize_blocks_kernel(const BlocksArgs a, const BlocksPlan p) {
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * p.R;
  const int rows = static_cast<int>(a.T - t0 < p.R ? a.T - t0 : p.R);
  const int w = p.vec ? 4 : 1;  // elements per thread
  const int units = rows * p.D / w;
  const uint8_t* cg = a.codes + t0 * p.rb;  // [rows, rb]
  float* og = a.out + t0 * p.D;             // [rows, D]
  for (int u = static_cast<int>(threadIdx.x); u < units; u += static_cast<int>(blockDim.x)) {
    const int e = u * w;
    const int t = static_cast<int>(p.div_D.div(static_cast<uint32_t>(e))), d = e - t * p.D;
    const int j = static_cast<int>(p.div_block.div(static_cast<uint32_t>(d))), k = d - j * p.desc.block;
    const int d0 = j * p.desc.block, nj = p.D - d0 < p.desc.block ? p.D - d0 : p.desc.block;
    const int64_t gi = (t0 + t) * p.nb + j;
    const uint8_t* cb = cg + t * p.rb + j * p.bb;
    if (p.vec) {
      float v[4];
      q::dequantize_elements(p.desc, cb, scale_ptr(a, gi), offset_ptr(a, gi), a.global, nj, k, k + 4, v);
      *reinterpret_cast<float4*>(og + e) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      q::dequantize_elements(p.desc, cb, scale_ptr(a, gi), offset_ptr(a, gi), a.global, nj, k, k + 1, og + e);
    }
  }
}

/// Max of |x| over the finite elements of x [n] into *amax_bits (float bits; atomicMax).
__global__ void __launch_bounds__(kBlocksThreads)
    block_amax_kernel(const float* __restrict__ x /*[n]*/, int64_t n, bool vec, unsigned long long* amax_bits /*[1]*/) {
  float m = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  auto fold = [&m](float v) {
    if (q::is_finite(v)) m = q::max_num(m, q::abs_f(v));
  };
  int64_t tail = 0;
  if (vec) {
    for (int64_t i = i0; i < n / 4; i += stride) {
      const float4 v = reinterpret_cast<const float4*>(x)[i];
      fold(v.x);
      fold(v.y);
      fold(v.z);
      fold(v.w);
    }
    tail = n / 4 * 4;
  }
  for (int64_t i = tail + i0; i < n; i += stride) fold(x[i]);
  unsigned bits = q::f32_bits(m);
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned other = __shfl_xor_sync(0xffffffffu, bits, o);
    bits = other > bits ? other : bits;
  }
  if ((threadIdx.x & 31u) == 0 && bits) atomicMax(amax_bits, static_cast<unsigned long long>(bits));
}

// smem_budget: shared-memory bytes a quantize tile aims at (0: no shared memory, decode)
BlocksPlan plan_of(const BlocksArgs& a, int tile_elems, int64_t smem_budget) {
  BlocksPlan p;
  p.desc = a.desc;
  p.nb = static_cast<int>(a.nb);
  if (a.desc.kind == q::BlockKind::Fp8Tensor) {  // independent elements: pieces instead of whole rows
    p.desc.block = static_cast<int>(std::min<int64_t>(a.D, kTensorPiece));
    p.nb = static_cast<int>((a.D + p.desc.block - 1) / p.desc.block);
  }
  p.D = static_cast<int>(a.D);
  p.rb = static_cast<int>(a.rb);
  p.bb = q::block_code_bytes(p.desc.block, p.desc.code_bits);  // exact but for one odd 4-bit block per row (block = D)
  const int64_t row_smem = static_cast<int64_t>(p.nb) * ((p.desc.block | 1) * static_cast<int64_t>(sizeof(float)) +
                                                         static_cast<int64_t>(sizeof(q::BlockParams)));
  const int64_t by_bytes = smem_budget > 0 ? smem_budget / row_smem : tile_elems / a.D;
  p.R = static_cast<int>(std::max<int64_t>(1, std::min({a.T, tile_elems / a.D, by_bytes})));
  p.sb = p.desc.block | 1;
  p.div_D = FastDiv(p.D);
  p.div_block = FastDiv(p.desc.block);
  p.div_nb = FastDiv(p.nb);
  p.div_rb = FastDiv(p.rb);
  p.div_bb = FastDiv(std::max(p.bb, 1));
  p.vec = a.D % 4 == 0 && p.desc.block % 4 == 0 && (reinterpret_cast<uintptr_t>(a.out) & 15u) == 0;
  p.vec_load = a.D % 4 == 0 && p.desc.block % 4 == 0 && (reinterpret_cast<uintptr_t>(a.x) & 15u) == 0;
  p.words = p.rb % 4 == 0 && p.bb % 4 == 0 && (reinterpret_cast<uintptr_t>(a.codes) & 3u) == 0;
  return p;
}

unsigned grid_of(const BlocksArgs& a, const BlocksPlan& p) { return static_cast<unsigned>((a.T + p.R - 1) / p.R); }

}  // namespace

cudaError_t launch_quantize_blocks(const BlocksArgs& a, cudaStream_t stream) {
  if (a.T <= 0 || a.nb <= 0 || a.D <= 0 || a.D > kMaxCols) return cudaErrorInvalidValue;
  const BlocksPlan p = plan_of(a, kTileElems, kTileSmem);
  const size_t smem =
      static_cast<size_t>(p.R) * p.nb * (static_cast<size_t>(p.sb) * sizeof(float) + sizeof(q::BlockParams));
  if (smem > 32 * 1024) {  // one row of tiny blocks at large D (e.g. tile 2 at D = 4096): ≤ 80 KiB
    const cudaError_t e = cudaFuncSetAttribute(quantize_blocks_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  LQ_LAUNCH(quantize_blocks_kernel, grid_of(a, p), kBlocksThreads, smem, stream, a, p);
  return cudaGetLastError();
}

cudaError_t launch_dequantize_blocks(const BlocksArgs& a, cudaStream_t stream) {
  if (a.T <= 0 || a.nb <= 0 || a.D <= 0 || a.D > kMaxCols) return cudaErrorInvalidValue;
  const BlocksPlan p = plan_of(a, kDequantTileElems, 0);
  LQ_LAUNCH(dequantize_blocks_kernel, grid_of(a, p), kBlocksThreads, 0, stream, a, p);
  return cudaGetLastError();
}

cudaError_t launch_block_amax(const float* x, int64_t n, unsigned long long* amax_bits, cudaStream_t stream) {
  if (n <= 0) return cudaErrorInvalidValue;
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  const int64_t per = static_cast<int64_t>(kBlocksThreads) * (vec ? 4 : 1);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((n + per - 1) / per, 4096));
  LQ_LAUNCH(block_amax_kernel, grid, kBlocksThreads, 0, stream, x, n, vec, amax_bits);
  return cudaGetLastError();
}

}  // namespace latentq::gpu::detail
