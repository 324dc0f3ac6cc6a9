// latentq/fused_decode_cuda.h — one decode step of the absorbed MLA attention on the GPU, reading the
// quantized latent cache (c_kv, k_pe) directly: its stored bytes are decoded in registers by the element
// math shared with the CPU (qmath.h, blockfmt.h), never written back to memory as float32. Host C++ header;
// link latentq_cuda (kernels/attention/fused_decode.cu; design in kernels/README.md).
//
// The math, per batch element b and head h (DeepSeek-V3 inference/model.py, MLA.forward, attn_impl ==
// "absorb", for the one new query of a decode step against the L_b cached keys of its sequence):
//   s_j    = softmax_scale · (q_lat[b,h,:]·c_kv_j + q_pe[b,h,:]·k_pe_j)       j = 0 .. L_b − 1
//   o[b,h] = Σ_j softmax(s)_j · c_kv_j                     (the latent output, before W_UV; float32)
//   lse    = ln Σ_j exp(s_j)                               (natural log; −inf for an empty sequence)
// q_lat = q_nope·W_UK is the absorbed query, given. c_kv_j and k_pe_j are the decoded values
// latentq::dequantize gives for key j (bit for bit; the FusedDecode tests check it through the kernel's
// decoded-keys output). The keys of sequence b are cache rows [seq_offsets[b], seq_offsets[b + 1]) of one
// QuantizedTensor per target: the study's layout (T tokens of all sequences, per-channel groups never
// spanning two sequences).
//
// Split-K (FlashMLA, FlashInfer): the keys of a sequence are cut into `splits` chunks of `chunk` keys; one
// CTA per (chunk, 16 heads, b) runs an online softmax over its keys and writes its normalised partial output
// and its log-sum-exp; a combine kernel merges the chunks (weights exp(lse_s − lse)). splits = 1 writes the
// output directly, without the combine.
//
// Precision: float32; scores and the online softmax in base 2 (scores pre-multiplied by softmax_scale·log2 e,
// exp2f), products with fused multiply-adds. Outputs equal a float64 evaluation on the same decoded keys to
// float32 rounding (the tests: 8·2^-24·(1 + A)·max|c_kv|, A = max_j softmax_scale·Σ|q·k|), not bit for bit;
// one device and shape repeat bit for bit (no atomics, fixed reduction orders).
//
// Limits: kv_lora_rank (Dc) ≤ kFusedMaxCkv = 512 and qk_rope_head_dim (Dr) ≤ kFusedMaxKpe = 128 (each lane
// of a warp holds Dc/32 and Dr/32 query and output values in registers), 1 ≤ H, 1 ≤ B ≤ 65535.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "latentq/quantize.h"
#include "latentq/quantize_cuda.h"

namespace latentq {

namespace gpu {

inline constexpr int kFusedMaxCkv = 512;            ///< largest kv_lora_rank (Dc) the fused decode takes
inline constexpr int kFusedMaxKpe = 128;            ///< largest qk_rope_head_dim (Dr)
inline constexpr int kFusedHeadsPerCta = 16;        ///< heads of one CTA (16 warps, one head each)
inline constexpr int kFusedKeysPerTile = 16;        ///< keys decoded into shared memory at a time
inline constexpr int64_t kFusedMinSplitKeys = 256;  ///< the automatic split keeps at least this many keys per chunk

/// How a cache view's elements are stored (one of the non-preset formats of spec.h).
enum class FusedKind : uint8_t {
  Int = 0,    ///< int{8,4,2}-{sym,asym}-{tensor,channel,token}: qmath::decode_sym / decode_asym
  Bf16 = 1,   ///< bf16: qmath::bf16_bits_to_f32
  Block = 2,  ///< fp8 tiles / tensor, MX, NVFP4, fp4 tiles, ggml: qmath::dequantize_elements
};

/// One stored target (c_kv or k_pe) of the cache in device memory, in the storage layout of QuantizedTensor
/// (quantize.h). Plain data, passed to the kernel by value; built by fused_cache_view().
struct FusedCacheView {
  const uint8_t* codes = nullptr;        ///< [T, row_bytes] packed codes
  const uint8_t* scales = nullptr;       ///< Int tensor [1] · channel [G, D] · token and blocks [T, nb]; null if none
  const uint8_t* offsets = nullptr;      ///< same layout as scales (Int asym, q4_1); else null
  const int32_t* token_group = nullptr;  ///< [T] Int channel: the token group of each row; else null
  int64_t T = 0;                         ///< rows (tokens of every sequence)
  int D = 0;                             ///< elements per row (Dc or Dr)
  int row_bytes = 0;                     ///< code bytes of one row
  FusedKind kind = FusedKind::Int;
  int bits = 8;                            ///< Int: 8, 4 or 2
  bool sym = false;                        ///< Int: symmetric (offset-binary codes)
  Granularity gran = Granularity::Tensor;  ///< Int
  int group = 1;                           ///< Int token: group width along D; Block: the block width
  int nb = 1;                              ///< Int token, Block: scale groups per row
  ScaleDtype sd = ScaleDtype::F16;         ///< Int: dtype of the stored scale / offset
  qmath::BlockDesc desc{};                 ///< Block: the block format
  int scale_bytes = 0;                     ///< Block: bytes of one stored block scale (0: none)
  int block_bytes = 0;                     ///< Block: code bytes of a full block
  float global = 0.0f;                     ///< Block: the stored per-tensor scale (fp8-e4m3-tensor, nvfp4)
};

/// The view of q (a stored target, not a preset: QuantSpec::stored_for already applied, as quantize_device
/// stores it). For a per-channel spec it builds q's token → group map on `stream` (kept in q.ws, reused).
/// Throws std::invalid_argument if q is empty, its buffers do not match its layout, or D exceeds the
/// fused kernel's limit for the role (max_cols: kFusedMaxCkv or kFusedMaxKpe), naming the spec and the shape.
FusedCacheView fused_cache_view(const DeviceQuantized& q, int max_cols, cudaStream_t stream = nullptr);

/// One decode step's queries and outputs (device pointers).
struct FusedDecodeParams {
  int64_t B = 0;                         ///< batch elements (sequences)
  int64_t H = 0;                         ///< query heads
  int Dc = 0;                            ///< kv_lora_rank
  int Dr = 0;                            ///< qk_rope_head_dim
  float softmax_scale = 1.0f;            ///< multiplies q·k (1/sqrt(qk_nope_head_dim + qk_rope_head_dim), × mscale²)
  const float* q_lat = nullptr;          ///< [B, H, Dc] absorbed query q_nope·W_UK
  const float* q_pe = nullptr;           ///< [B, H, Dr] rotary query
  const int64_t* seq_offsets = nullptr;  ///< [B + 1] cache rows of sequence b: [seq_offsets[b], seq_offsets[b + 1])
  float* out = nullptr;                  ///< [B, H, Dc] latent output
  float* lse = nullptr;                  ///< [B, H] natural-log log-sum-exp of the scaled scores, or null
  float* decoded_ckv = nullptr;          ///< [T, Dc] or null: every key row read, as the kernel decoded it (tests)
  float* decoded_kpe = nullptr;          ///< [T, Dr] or null: likewise for k_pe
};

/// Launch plan of one decode step: the split over the keys and the workspace it needs.
struct FusedDecodePlan {
  int splits = 1;              ///< key chunks per sequence (1: no combine)
  int64_t chunk = 0;           ///< keys per chunk, a multiple of kFusedKeysPerTile
  int head_tiles = 1;          ///< ceil(H / kFusedHeadsPerCta)
  size_t workspace_bytes = 0;  ///< partial outputs [splits, B, H, Dc] and their lse [splits, B, H] (0 if splits = 1)
};

/// The plan for B sequences of at most max_len keys and H heads. splits > 0: that many chunks (fewer when
/// max_len has fewer tiles of kFusedKeysPerTile keys); splits = 0: automatic, enough CTAs for two per SM
/// (num_sms) with at least kFusedMinSplitKeys keys per chunk. Host only; throws std::invalid_argument for
/// B < 1, H < 1, Dc < 1, max_len < 0 or splits < 0.
FusedDecodePlan plan_fused_decode(int64_t B, int64_t H, int Dc, int64_t max_len, int splits, int num_sms);

/// The fused decode on `stream` (asynchronous; FlashInfer-style launcher: returns the first CUDA error, or
/// cudaErrorInvalidValue for inconsistent arguments: D of a view unlike Dc / Dr, a view's rows unlike the
/// other's, Dc or Dr beyond the limits, a null pointer that is needed, a workspace smaller than
/// plan.workspace_bytes, B beyond 65535). workspace: device memory of plan.workspace_bytes (16-byte aligned),
/// may be null when that is 0. seq_offsets must be non-decreasing within [0, T] (not checked on the device).
cudaError_t launch_fused_decode(const FusedCacheView& ckv, const FusedCacheView& kpe, const FusedDecodeParams& p,
                                const FusedDecodePlan& plan, void* workspace, cudaStream_t stream = nullptr);

/// Number of SMs of the current device (cached per device; 1 on the host emulator).
int device_sm_count();

}  // namespace gpu

/// Host convenience (synchronous), as the tests and the CPU comparisons use it: uploads the stored c_kv
/// [T, Dc] and k_pe [T, Dr] (non-preset stored specs, quantized with the same seq_offsets), the queries
/// q_lat [B, H, Dc] and q_pe [B, H, Dr] (host, float32) and seq_offsets [B + 1] (host), runs one decode step
/// and copies out [B, H, Dc] back (and lse [B, H], the decoded keys [T, Dc] / [T, Dr] when non-null).
/// splits as plan_fused_decode (0: automatic for this device). Returns the plan it ran.
/// Throws std::invalid_argument for bad seq_offsets (validate_seq_offsets' message; their last entry must be
/// T), c_kv and k_pe of different row counts, H < 1, or a view fused_cache_view refuses; std::runtime_error
/// for CUDA failures.
gpu::FusedDecodePlan fused_decode_gpu(const QuantizedTensor& c_kv, const QuantizedTensor& k_pe,
                                      std::span<const int64_t> seq_offsets, const float* q_lat /*[B, H, Dc]*/,
                                      const float* q_pe /*[B, H, Dr]*/, int64_t H, float softmax_scale, int splits,
                                      float* out /*[B, H, Dc]*/, float* lse /*[B, H] or null*/,
                                      float* decoded_ckv /*[T, Dc] or null*/, float* decoded_kpe /*[T, Dr] or null*/);

}  // namespace latentq
