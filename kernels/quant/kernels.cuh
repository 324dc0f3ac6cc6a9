// kernels/quant/kernels.cuh — internal: kernel argument structs, launchers (each returns the
// cudaError_t of its launch, FlashInfer style), the (bits, scheme) dispatch and device helpers.
// Element math comes from latentq/qmath.h only; nothing here rounds, encodes or converts itself.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "latentq/gpu/plan.h"
#include "latentq/qmath.h"
#include "latentq/spec.h"
#include "latentq/transform_coding.h"
#include "latentq/turboquant.h"

// Launch and dynamic shared memory through macros so the kernels also compile as plain C++ against
// the host emulator of tests/gpu/emu (LQ_EMULATE; runs every kernel on CPU fibers, see there).
#if defined(LQ_EMULATE)
#define LQ_LAUNCH(kernel, grid, block, smem, stream, ...) ::emu::launch(kernel, grid, block, smem, __VA_ARGS__)
#define LQ_DYNAMIC_SMEM(T, name) T* name = ::emu::dynamic_smem<T>()
#else
#define LQ_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
#define LQ_DYNAMIC_SMEM(T, name) extern __shared__ T name[]
#endif

namespace latentq::gpu::detail {

namespace q = ::latentq::qmath;

/// What a kernel instantiation encodes: integer symmetric / asymmetric codes, bf16. The block
/// formats (fp8 tiles, MX, NVFP4, ggml) have their own kernel (blocks.cu).
enum class Mode : uint8_t { Sym = 0, Asym = 1, Bf16 = 3 };

/// Dispatch on (bits, scheme) of an integer spec: defines constexpr BITS and MODE for the body.
/// Unsupported bits return cudaErrorInvalidValue from the enclosing launcher.
#define LQ_DISPATCH_INT(bits, sym, ...)   \
  switch (bits) {                         \
    case 8: {                             \
      constexpr int BITS = 8;             \
      if (sym) {                          \
        constexpr Mode MODE = Mode::Sym;  \
        __VA_ARGS__                       \
      } else {                            \
        constexpr Mode MODE = Mode::Asym; \
        __VA_ARGS__                       \
      }                                   \
      break;                              \
    }                                     \
    case 4: {                             \
      constexpr int BITS = 4;             \
      if (sym) {                          \
        constexpr Mode MODE = Mode::Sym;  \
        __VA_ARGS__                       \
      } else {                            \
        constexpr Mode MODE = Mode::Asym; \
        __VA_ARGS__                       \
      }                                   \
      break;                              \
    }                                     \
    case 2: {                             \
      constexpr int BITS = 2;             \
      if (sym) {                          \
        constexpr Mode MODE = Mode::Sym;  \
        __VA_ARGS__                       \
      } else {                            \
        constexpr Mode MODE = Mode::Asym; \
        __VA_ARGS__                       \
      }                                   \
      break;                              \
    }                                     \
    default:                              \
      return cudaErrorInvalidValue;       \
  }

// ---- arguments ----------------------------------------------------------------------------------
/// Token groups, fp8 tiles and the encode pass of per-tensor specs: one block per R rows.
struct RowsArgs {
  const float* x;  ///< [T, D] input
  int64_t T;
  int D;
  int rb;  ///< bytes of a packed code row
  int g;   ///< group (tile) width along D; D for per-tensor
  int nt;  ///< groups per row, ceil(D / g); 1 for per-tensor
  int R;   ///< rows per block
  int nq;  ///< quads (4 elements) per row, ceil(D / 4)
  FastDiv div_nq, div_g, div_nt;
  bool tensor;       ///< per-tensor: (scale, offset) already stored at index 0, no statistics
  bool vec;          ///< x is 16-byte aligned and D % 4 == 0: float4 loads
  ScaleDtype sd;     ///< scale/offset storage dtype (fp8: always F32)
  uint8_t* codes;    ///< [T, rb]
  uint8_t* scales;   ///< [T, nt] (per-tensor: [1], read only)
  uint8_t* offsets;  ///< [T, nt] asymmetric only
  DeviceStatus* st;
};
/// Dynamic shared memory of the rows kernel for R rows.
inline size_t rows_smem_bytes(int R, int D, int nt, bool asym) {
  return static_cast<size_t>(R) * (static_cast<size_t>(D) + static_cast<size_t>(nt) * (asym ? 2 : 1)) * sizeof(float);
}
constexpr int kRowsThreads = 256;
/// Groups up to this width are reduced by one thread each, wider ones by a warp (cub::WarpReduce).
constexpr int kThreadGroupMax = 32;

/// Per-channel groups: one warp per (chunk of ≤ 32 tokens, 32 consecutive channels).
struct ChannelArgs {
  const float* x;  ///< [T, D]
  int64_t D;
  int64_t rb;
  const ChunkDesc* chunks;  ///< [nchunks] encode chunks
  int64_t nchunks;
  int64_t nslices;  ///< ceil(D / 32)
  bool fused;       ///< chunk == whole group: statistics in registers; else read stored params
  ScaleDtype sd;
  uint8_t* codes;    ///< [T, rb]
  uint8_t* scales;   ///< [G, D]
  uint8_t* offsets;  ///< [G, D] asymmetric only
  DeviceStatus* st;
};
constexpr int kChannelWarps = 8;

/// Statistics pass of long channel groups: one warp per (stat chunk, 32 channels).
struct ChannelStatsArgs {
  const float* x;  ///< [T, D]
  int64_t D;
  const ChunkDesc* chunks;  ///< [nchunks] stat chunks (≤ kChannelStatTokens tokens)
  int64_t nchunks;
  int64_t nslices;
  float* partial;  ///< [nchunks, D, 2]
  DeviceStatus* st;
};
struct ChannelFinalizeArgs {
  const float* partial;  ///< [nchunks, D, 2]
  const int64_t* begin;  ///< [G+1] stat chunks of group g: [begin[g], begin[g+1])
  int64_t G;
  int64_t D;
  int bits;
  ScaleDtype sd;
  uint8_t* scales;   ///< [G, D]
  uint8_t* offsets;  ///< [G, D] asymmetric only
  DeviceStatus* st;
};

/// Decode of every format: one block per R rows, one thread per quad of 4 elements.
struct DequantArgs {
  const uint8_t* codes;        ///< [T, rb]
  const uint8_t* scales;       ///< layout of the granularity
  const uint8_t* offsets;      ///< asymmetric only
  const int32_t* token_group;  ///< [T] channel only: group of each token
  int64_t T;
  int D;
  int rb;
  int g;   ///< token/fp8: group width; else unused
  int nt;  ///< token/fp8: groups per row
  int R;
  int nq;
  FastDiv div_nq, div_g;
  Granularity gran;  ///< Int only
  ScaleDtype sd;
  bool vec;    ///< D % 4 == 0, out 16-byte and codes 8-byte aligned: float4 / uint2 accesses
  float* out;  ///< [T, D]
};
constexpr int kDequantThreads = 256;

/// Block formats (latentq/blockfmt.h), tiles of token rows (blocks.cu): the halves of the CPU
/// reference's qmath::quantize_block (block_params, encode_block_bytes) and dequantize_elements.
struct BlocksArgs {
  const float* x;  ///< [T, D] input (quantize)
  float* out;      ///< [T, D] output (dequantize)
  int64_t T;
  int64_t D;
  int64_t rb;  ///< code bytes of a row
  int64_t nb;  ///< blocks per row (1 for a per-tensor-only format)
  q::BlockDesc desc;
  int scale_bytes;   ///< bytes of a stored block scale (0: none)
  float global;      ///< the per-tensor scale (fp8-e4m3-tensor, nvfp4)
  uint8_t* codes;    ///< [T, rb]
  uint8_t* scales;   ///< [T, nb] of scale_bytes
  uint8_t* offsets;  ///< [T, nb] q4_1 only
  DeviceStatus* st;
};

// ---- launchers (defined in the .cu files; each returns the launch's cudaError_t) -----------------
cudaError_t launch_quantize_blocks(const BlocksArgs& a, cudaStream_t stream);
cudaError_t launch_dequantize_blocks(const BlocksArgs& a, cudaStream_t stream);
/// max|x| over the finite elements of x [n], atomicMax'ed as float bits into *amax_bits [1] (the
/// per-tensor scale of fp8-e4m3-tensor / nvfp4; one pass, float4 loads when aligned).
cudaError_t launch_block_amax(const float* x /*[n]*/, int64_t n, unsigned long long* amax_bits /*[1]*/,
                              cudaStream_t stream);
cudaError_t launch_quantize_rows(const RowsArgs& a, int bits, Mode mode, cudaStream_t stream);
cudaError_t launch_bf16_encode(const float* x /*[n]*/, int64_t n, uint8_t* codes /*[n, 2]*/, DeviceStatus* st,
                               cudaStream_t stream);
cudaError_t launch_channel_encode(const ChannelArgs& a, int bits, bool sym, cudaStream_t stream);
cudaError_t launch_channel_stats(const ChannelStatsArgs& a, bool sym, cudaStream_t stream);
cudaError_t launch_channel_finalize(const ChannelFinalizeArgs& a, bool sym, cudaStream_t stream);
/// Per-tensor statistics with cub::DeviceReduce::TransformReduce; d_temp == nullptr: size query.
cudaError_t tensor_stats(void* d_temp, size_t& temp_bytes, const float* x /*[n]*/, int64_t n, TensorStats* out /*[1]*/,
                         cudaStream_t stream);
cudaError_t launch_tensor_finalize(const TensorStats* s /*[1]*/, int bits, bool sym, ScaleDtype sd,
                                   uint8_t* scales /*[1]*/, uint8_t* offsets /*[1]*/, DeviceStatus* st,
                                   cudaStream_t stream);
/// NaN/Inf count with cub::DeviceReduce::TransformReduce; d_temp == nullptr: size query.
cudaError_t nonfinite_count(void* d_temp, size_t& temp_bytes, const float* x /*[n]*/, int64_t n,
                            unsigned long long* out /*[1]*/, cudaStream_t stream);
cudaError_t launch_token_group_map(const int64_t* bounds /*[G+1]*/, int64_t G, int64_t T, int32_t* map /*[T]*/,
                                   cudaStream_t stream);
cudaError_t launch_dequantize(const DequantArgs& a, int bits, Mode mode, cudaStream_t stream);

#if defined(__CUDACC__) || defined(LQ_EMULATE)
// ---- device helpers ------------------------------------------------------------------------------
/// Stored scale/offset i of a raw little-endian buffer, decoded exactly (qmath's fp16 decode).
__device__ __forceinline__ float load_scale(const uint8_t* buf, int64_t i, ScaleDtype d) {
  if (d == ScaleDtype::F16) return q::f16_bits_to_f32(reinterpret_cast<const uint16_t*>(buf)[i]);
  return reinterpret_cast<const float*>(buf)[i];
}
/// Stores v (already rounded to the dtype) as stored scale/offset i.
__device__ __forceinline__ void store_scale(uint8_t* buf, int64_t i, float v, ScaleDtype d) {
  if (d == ScaleDtype::F16)
    reinterpret_cast<uint16_t*>(buf)[i] = q::f32_to_f16_bits(v);
  else
    reinterpret_cast<float*>(buf)[i] = v;
}
__device__ __forceinline__ void note_nonfinite(DeviceStatus* st, unsigned n) {
  if (n) atomicAdd(&st->nonfinite, static_cast<unsigned long long>(n));
}
/// Stored (scale, offset) of integer group gi from its statistics; stores them and records an
/// overflow of the storage dtype (the CPU reference checks scale, then offset, group by group).
template <bool SYM>
__device__ __forceinline__ q::ScaleOffset finish_int_group(float a, float b, int bits, ScaleDtype sd, int64_t gi,
                                                           uint8_t* scales, uint8_t* offsets, DeviceStatus* st) {
  // SYM: a = max|x|; else a = min, b = max (zero signs already fixed)
  const q::ScaleOffset p = SYM ? q::sym_params(a, bits, sd) : q::asym_params(a, b, bits, sd);
  if (!q::is_finite(p.scale))
    atomicMin(&st->overflow_key, 2ull * static_cast<unsigned long long>(gi));
  else if (!q::is_finite(p.offset))
    atomicMin(&st->overflow_key, 2ull * static_cast<unsigned long long>(gi) + 1ull);
  store_scale(scales, gi, p.scale, sd);
  if (!SYM) store_scale(offsets, gi, p.offset, sd);
  return p;
}
/// Stores the low nb ≤ NB bytes of w at dst (one NB-byte store when whole and aligned).
template <int NB>
__device__ __forceinline__ void store_bytes(uint8_t* dst, uint32_t w, int nb) {
  if (nb == NB && (reinterpret_cast<uintptr_t>(dst) & (NB - 1)) == 0) {
    if constexpr (NB == 4)
      *reinterpret_cast<uint32_t*>(dst) = w;
    else if constexpr (NB == 2)
      *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(w);
    else
      *dst = static_cast<uint8_t>(w);
  } else {
    for (int k = 0; k < nb; ++k) dst[k] = static_cast<uint8_t>(w >> (8 * k));
  }
}
/// Loads nb ≤ NB bytes at src into the low bytes of a word (zero above).
template <int NB>
__device__ __forceinline__ uint32_t load_bytes(const uint8_t* src, int nb) {
  if (nb == NB && (reinterpret_cast<uintptr_t>(src) & (NB - 1)) == 0) {
    if constexpr (NB == 4)
      return *reinterpret_cast<const uint32_t*>(src);
    else if constexpr (NB == 2)
      return *reinterpret_cast<const uint16_t*>(src);
    else
      return *src;
  }
  uint32_t w = 0;
  for (int k = 0; k < nb; ++k) w |= static_cast<uint32_t>(src[k]) << (8 * k);
  return w;
}
#endif  // __CUDACC__ || LQ_EMULATE

/// TurboQuant (turboquant.cu): the row norms (fp16, norms [T, 2]) and unit rows y [T, D] of x [T, D]; the
/// code bytes of rotated rows y into codes [T, rb]; the decoded rotated rows of codes/norms into out [T, D]
/// (the caller applies the Hadamard after normalize and after decode).
cudaError_t launch_tq_normalize(const float* x /*[T, D]*/, int64_t T, int D, float* y /*[T, D]*/,
                                uint8_t* norms /*[T, 2]*/, cudaStream_t stream);
cudaError_t launch_tq_encode(const float* y /*[T, D]*/, int64_t T, int D, int rb, const q::TqCodebook& cb,
                             uint8_t* codes /*[T, rb]*/, cudaStream_t stream);
cudaError_t launch_tq_decode(const uint8_t* codes /*[T, rb]*/, const uint8_t* norms /*[T, 2]*/, int64_t T, int D,
                             int rb, const q::TqCodebook& cb, bool nc, float* out /*[T, D]*/, cudaStream_t stream);

/// Lloyd-Max codebooks (lloyd_max.cu): the code bytes of x [T, D] into codes [T, rb] with the midpoints
/// [codebooks, 2^bits − 1]; the decoded values of codes into out [T, D] with the centroids [codebooks, 2^bits]
/// (device tables of latentq::lloyd_max_tables; `width` channels per codebook).
cudaError_t launch_lm_encode(const float* x /*[T, D]*/, int64_t T, int D, int rb, int bits, const float* midpoint,
                             int64_t width, uint8_t* codes /*[T, rb]*/, cudaStream_t stream);
cudaError_t launch_lm_decode(const uint8_t* codes /*[T, rb]*/, int64_t T, int D, int rb, int bits,
                             const float* centroid, int64_t width, float* out /*[T, D]*/, cudaStream_t stream);

/// Transform coding (transform_coding.cu): the code bytes of x [T, tab.D] into codes [T, rb]; the decoded values
/// of codes into out [T, tab.D] (tab: device pointers to latentq::tc_tables' arrays).
cudaError_t launch_tc_encode(const float* x /*[T, D]*/, int64_t T, int rb, const q::TcTables& tab,
                             uint8_t* codes /*[T, rb]*/, cudaStream_t stream);
cudaError_t launch_tc_decode(const uint8_t* codes /*[T, rb]*/, int64_t T, int rb, const q::TcTables& tab,
                             float* out /*[T, D]*/, cudaStream_t stream);

}  // namespace latentq::gpu::detail
