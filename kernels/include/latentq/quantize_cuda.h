// latentq/quantize_cuda.h — the CUDA quantizer: every spec of the CPU reference (latentq/quantize.h)
// on the GPU, byte-identical to it (codes, scales, offsets and decoded values). Host C++ header:
// include it from .cpp files and link latentq_cuda.
//
// Two levels, as faiss's GPU indexes:
//   * device API: quantize_device / dequantize_device work on device pointers and a DeviceQuantized
//     (device buffers in the storage layout of QuantizedTensor), on a caller's stream;
//   * host convenience: quantize_gpu / dequantize_gpu / quantize_dequantize_gpu take and return
//     host memory and the CPU types, so a caller can swap latentq::quantize for quantize_gpu.
//
// Element math is qmath.h's (shared with the CPU reference); the storage layout is the one
// documented in quantize.h; the kernel design is described in kernels/README.md.
//
// Limits (refused up front with std::invalid_argument naming the limit): 1 ≤ D ≤ gpu::kMaxCols
// (4096), 1 ≤ T ≤ gpu::kMaxRows (2^31 − 1). Errors: input errors throw std::invalid_argument with
// the CPU reference's message (empty matrix, NaN/Inf count, bad seq_offsets, scale/offset overflow
// of the storage dtype); CUDA failures throw std::runtime_error with file:line and the CUDA error
// (a failed cudaMalloc names the bytes asked for).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "latentq/gpu/device_buffer.h"
#include "latentq/gpu/plan.h"
#include "latentq/quantize.h"

namespace latentq {

/// True if a CUDA device is usable: cudaGetDeviceCount reports ≥ 1 device and a trivial kernel
/// runs on the current device. Otherwise false, with the reason in *why (if given), e.g.
/// "cudaGetDeviceCount failed: cudaErrorNoDevice: no CUDA-capable device is detected".
/// The answer is computed once per process.
bool cuda_device_available(std::string* why = nullptr);

namespace gpu {
/// Reusable device scratch of a DeviceQuantized: launch plans, partial statistics, CUB temporary
/// storage and the status word. Callers never touch it.
struct Workspace {
  DeviceBuffer<DeviceStatus> status;
  // channel plan, cached by (T, group_size, seq_offsets)
  bool plan_valid = false;
  int64_t plan_T = -1, plan_group = -1;
  std::vector<int64_t> plan_seq;
  std::vector<int64_t> bounds;          // [G+1] host
  bool fused = false;                   // every group ≤ kChannelFusedTokens tokens
  DeviceBuffer<ChunkDesc> enc_chunks;   // ≤ kChannelFusedTokens tokens each
  DeviceBuffer<ChunkDesc> stat_chunks;  // ≤ kChannelStatTokens tokens each (long groups only)
  DeviceBuffer<int64_t> stat_begin;     // [G+1] first stat chunk of each group
  DeviceBuffer<float> partial;          // [n_stat_chunks, D, 2] (min, max) or (absmax, 0)
  DeviceBuffer<unsigned char> cub_temp;
  DeviceBuffer<TensorStats> tensor_stats;
  DeviceBuffer<unsigned long long> count;
  // dequantize: token → channel group, cached by the group bounds
  std::vector<int64_t> map_bounds;
  DeviceBuffer<int32_t> token_group;  // [T]
  // TurboQuant: the rotated unit rows [T, D]
  DeviceBuffer<float> tq_rotated;
  // Lloyd-Max: the float32 midpoints (quantize) or centroids (dequantize) of the codebooks
  DeviceBuffer<float> lm_table;
  // transform coding: the bit offsets [D + 1] and the floats (scale [D], offset [D], -lm centroids and midpoints)
  DeviceBuffer<int32_t> tc_offsets;
  DeviceBuffer<float> tc_floats;
};
}  // namespace gpu

/// A quantized [rows, cols] matrix in device memory, in exactly the storage layout of
/// QuantizedTensor (quantize.h). Move-only; buffers are reused by later quantize_device calls.
struct DeviceQuantized {
  QuantSpec spec;                             ///< the format as stored (QuantSpec::stored_for applied)
  int64_t rows = 0;                           ///< T
  int64_t cols = 0;                           ///< D
  std::vector<int64_t> group_bounds;          ///< channel: token-group boundaries [G+1] (host copy)
  gpu::DeviceBuffer<uint8_t> codes;           ///< [rows, row_bytes()]
  gpu::DeviceBuffer<uint8_t> scales;          ///< raw little-endian scale values, layout as QuantizedTensor
  gpu::DeviceBuffer<uint8_t> offsets;         ///< asymmetric only
  std::vector<uint8_t> global;                ///< fp32 per-tensor scale [4 bytes] (fp8-e4m3-tensor, nvfp4), host copy
  gpu::DeviceBuffer<int64_t> d_group_bounds;  ///< channel: device copy of group_bounds [G+1]
  mutable gpu::Workspace ws;                  ///< scratch, see gpu::Workspace

  /// Metadata-only QuantizedTensor (spec, rows, cols, group_bounds, global; no codes): its row_bytes(),
  /// row_group() and scales_per_row() define this layout.
  QuantizedTensor header() const;
  int64_t storage_bytes() const {
    return static_cast<int64_t>(codes.size() + scales.size() + offsets.size() + global.size());
  }
};

/// Quantize d_x [T, D] (device, row-major float32) with `spec` as stored for `target` into `out`,
/// on `stream`. seq_offsets [S+1] (host, int64) as in latentq::quantize (only channel grouping
/// uses it). Returns after the work has finished on the stream (it reads back the device status to
/// detect NaN/Inf and scale overflow). Result byte-identical to latentq::quantize.
/// Throws as latentq::quantize (same messages) plus the limits above; `out` is then unspecified.
void quantize_device(const QuantSpec& spec, Target target, const float* d_x /*[T, D]*/, int64_t T, int64_t D,
                     std::span<const int64_t> seq_offsets, DeviceQuantized& out, cudaStream_t stream = nullptr);

/// Decode q into d_out [T, D] (device, row-major float32) on `stream` (asynchronous). Reads only
/// q's codes, scales, offsets and group bounds. Bit-identical to latentq::dequantize.
/// Throws std::invalid_argument if q's buffers do not match its layout.
void dequantize_device(const DeviceQuantized& q, float* d_out /*[T, D]*/, cudaStream_t stream = nullptr);

namespace gpu {
/// Throws std::invalid_argument ("<who>: ...") unless q's device buffers match its layout: codes [rows,
/// row_bytes()], scales and offsets as quantize.h lays them out, per-channel group bounds from 0 to rows with
/// their device copy; and the kernels' limits on rows and cols.
void check_device_layout(const DeviceQuantized& q, const char* who);
/// The token → channel group map [rows] (int32, device) of a per-channel q, built on `stream` on first use and
/// kept in q.ws (rebuilt when the group bounds change).
const int32_t* token_group_map(const DeviceQuantized& q, cudaStream_t stream);
}  // namespace gpu

/// Number of NaN/Inf values in d_x [n] (device), with cub::DeviceReduce. Synchronizes `stream`.
int64_t count_nonfinite_device(const float* d_x /*[n]*/, int64_t n, cudaStream_t stream = nullptr);

/// Copies between host and device storage (synchronous). to_device throws std::invalid_argument if
/// q's vectors do not match its layout.
DeviceQuantized to_device(const QuantizedTensor& q, cudaStream_t stream = nullptr);
QuantizedTensor to_host(const DeviceQuantized& q, cudaStream_t stream = nullptr);

/// latentq::quantize on the GPU: copies X [T, D] (host) in, quantizes, copies the storage back.
QuantizedTensor quantize_gpu(const QuantSpec& spec, Target target, const float* X /*[T, D]*/, int64_t T, int64_t D,
                             std::span<const int64_t> seq_offsets);

/// latentq::dequantize on the GPU: out [rows, cols] (host, float32).
void dequantize_gpu(const QuantizedTensor& q, float* out /*[T, D]*/);

/// One (layer, target, quantizer) cell on the GPU: quantize X [T, D] (host) and decode into
/// out [T, D] (host), without a round trip of the codes. If storage_out is non-null it receives
/// the storage (as latentq::quantize_dequantize returns it). Equal to the CPU run bit for bit.
void quantize_dequantize_gpu(const QuantSpec& spec, Target target, const float* X /*[T, D]*/, int64_t T, int64_t D,
                             std::span<const int64_t> seq_offsets, float* out /*[T, D]*/,
                             QuantizedTensor* storage_out = nullptr);

/// The randomized Hadamard of latentq/transform.h on the device, in place on d_x [T, D] (device,
/// row-major float32), blocks of `block` (a power of two dividing D, ≤ kMaxHadamardBlock): forward
/// x' = H·(s ⊙ x), inverse x = s ⊙ (H·x'), with d_signs [D] (device, ±1; null = no signs, the plain
/// fwht_rows). One CUDA block per (row, Hadamard block) in shared memory, butterfly stages in the
/// order of latentq::fwht_rows (each butterfly is an exact a ± b, no FMA) and the same float32
/// constant float(1/sqrt(block)) at the end: byte-identical to latentq::fwht_rows /
/// Rotation::forward / Rotation::inverse. Asynchronous on `stream`. Throws std::invalid_argument for a
/// bad block (the messages of latentq::fwht_rows) or T < 0.
inline constexpr int64_t kMaxHadamardBlock = 4096;
void hadamard_rows_device(float* d_x /*[T, D]*/, int64_t T, int64_t D, int64_t block, const float* d_signs /*[D]*/,
                          bool inverse, cudaStream_t stream = nullptr);
/// Host wrapper (synchronous): X [T, D] (host) in place; signs [D] (host) or null.
void hadamard_rows_gpu(float* X /*[T, D]*/, int64_t T, int64_t D, int64_t block, const float* signs /*[D]*/,
                       bool inverse);

}  // namespace latentq
