// latentq/attention_cuda.h — the absorbed MLA attention of one layer on the GPU (cuBLAS sgemm + a
// softmax kernel): the device side of probes::AbsorbedAttention<float> (analysis/include/
// latentq/attention/attention.h), which owns the math and the row order and calls this through its
// AttentionDevice seam. Host C++ header; link latentq_cuda built with cuBLAS's headers (kernels/CMakeLists.txt
// compiles attention.cu only then; the library itself is loaded with dlopen on first use).
//
// Source of the math: DeepSeek-V3 inference/model.py, MLA.forward, attn_impl == "absorb":
//   scores = (q_lat·c_kvᵀ + q_pe·k_peᵀ) · softmax_scale      q_lat = q_nope·W_UK, computed on the host
//   p      = softmax(scores) over the row's causal keys (max-subtracted), 0 past them
//   o_lat  = p·c_kv,   out[h] = o_lat[h]·W_UV[h]ᵀ
// Rows are the probe's sorted query rows × heads (row = sorted_pos·H + h). A segment is a run of sorted
// rows of one sequence: its keys are tokens key_begin .. key_begin + nk − 1, and sorted row p reads the
// first nkeys[p] of them. The probe makes segments of ≈ 4,096 GEMM rows (AbsorbedAttention::attach_device):
// one GEMM per segment over all its rows and its keys (the masked keys cost arithmetic, not values: p is 0
// there; a sequence split in several segments follows the causal triangle).
//
// Precision: float32 throughout, cuBLAS sgemm in CUBLAS_PEDANTIC_MATH (no TF32 or other reduced-precision
// mode, whatever NVIDIA_TF32_OVERRIDE says), expf, float sums in a tree. The values equal the CPU path's to
// float32 rounding, not bit for bit (other summation orders); the probe's tests state the tolerance.
// Determinism: for one device, shapes and cuBLAS version the results repeat bit for bit (the softmax's
// reduction order is fixed; cuBLAS sgemm without split-K atomics).
//
// Memory (device, held while the object lives): q_lat, q_pe, W_UV, one c_kv and k_pe, o_lat, the output, and the
// scores of every segment, Σ (end − begin)·H·nk floats (at V2-Lite shape, 4 × 64 query rows × 16 heads × 2,048
// keys: 33 MB; it grows with query rows × keys per sequence). run() copies those probabilities back when asked;
// error_terms() computes attention_error's terms next to them (the probabilities never leave the device) against
// a reference kept by keep_reference() (as much memory again for its probabilities).
//
// Errors: std::invalid_argument for inconsistent shapes (naming them); std::runtime_error when cuBLAS cannot be
// loaded (the paths tried), and for CUDA and cuBLAS failures ("<file>:<line>: <call> failed: <status>"), an allocation
// naming its bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

namespace latentq {

/// True if the device attention can run: cuBLAS, which is loaded here on first use (dlopen; not linked, so
/// processes that never use it do not pay for loading it), and a CUDA device (cuda_device_available). Otherwise
/// false with the reason in *why: "cuBLAS could not be loaded: tried ..." or "no CUDA device: ...".
bool cuda_attention_available(std::string* why = nullptr);

/// Sorted query rows [begin, end) of one sequence: keys key_begin .. key_begin + nk − 1 (tokens).
struct DeviceAttentionSegment {
  int64_t begin = 0, end = 0, key_begin = 0, nk = 0;
};

/// One (sorted row, head) pair's terms of probes::attention_error (analysis/include/latentq/probes/
/// attention.h, AttentionError) between the kept reference (keep_reference) and a test cache, as
/// error_terms() computes them on the device: float64 sums of float32 values.
struct DeviceAttentionTerms {
  double kl = 0;                ///< Σ_j p_j·ln(p_j / max(p̂_j, kl_floor)) over the row's keys with p_j > 0
  double dot = 0;               ///< Σ a·b over the pair's v_head_dim outputs (a: reference, b: test)
  double ref2 = 0;              ///< Σ a²
  double test2 = 0;             ///< Σ b²
  double err2 = 0;              ///< Σ (b − a)²
  int32_t equal = 0;            ///< 1 when a == b element for element
  int32_t top1 = 0;             ///< 1 when the keys of largest probability agree (ties: the lower key index)
  int32_t top_common = 0;       ///< |top-m(p) ∩ top-m(p̂)|, m = min(8, nkeys) (ties: the lower key index)
  int32_t nonfinite_probs = 0;  ///< NaN/Inf among the test's probabilities of the pair's keys
  int32_t nonfinite_out = 0;    ///< NaN/Inf among the test's outputs of the pair
  int32_t pad = 0;
};
static_assert(sizeof(DeviceAttentionTerms) == 64, "DeviceAttentionTerms is copied as bytes between host and device");

/// Store B of a cache mixed per (row, key) from two stores (probes::MixedCache; run_mixed): c_kv_b [T,
/// kv_lora_rank], k_pe_b [T, qk_rope_head_dim] (host arrays) and ranges [Tq, 4] by sorted row: sorted row p
/// reads keys [ranges[4p], ranges[4p + 1]) of c_kv and [ranges[4p + 2], ranges[4p + 3]) of k_pe from store A
/// (the run's c_kv, k_pe), every other key from B; the ranges clipped to the row's keys.
struct DeviceMixedStores {
  const float* c_kv_b = nullptr;
  const float* k_pe_b = nullptr;
  const int64_t* ranges = nullptr;
};

/// The fixed inputs of one layer, uploaded once; run() then evaluates one cache. Thread-safe: run(),
/// keep_reference() and error_terms() are serialized (one device, one set of buffers).
class DeviceAbsorbedAttention {
 public:
  /// q_lat [Tq·H, kv_lora_rank], q_pe [Tq·H, qk_rope_head_dim] (row = sorted_pos·H + h), w_uv [H·v_head_dim,
  /// kv_lora_rank], all row-major float32 host arrays, copied. nkeys [Tq] per sorted row (1 ≤ nkeys[p] ≤ the
  /// nk of its segment); segments cover [0, Tq) in order. Throws std::invalid_argument otherwise.
  DeviceAbsorbedAttention(int64_t num_heads, int64_t kv_lora_rank, int64_t qk_rope_head_dim, int64_t v_head_dim,
                          int64_t num_tokens, float softmax_scale, std::span<const int64_t> nkeys,
                          std::span<const DeviceAttentionSegment> segments, const float* q_lat, const float* q_pe,
                          const float* w_uv);
  ~DeviceAbsorbedAttention();
  DeviceAbsorbedAttention(const DeviceAbsorbedAttention&) = delete;
  DeviceAbsorbedAttention& operator=(const DeviceAbsorbedAttention&) = delete;

  /// Attention over c_kv [T, kv_lora_rank] and k_pe [T, qk_rope_head_dim] (row-major float32 host arrays):
  /// out_sorted [Tq, H, v_head_dim] by sorted row; probs (null: not copied back) ← the probabilities of every
  /// segment in order, each [(end − begin)·H, nk] row-major (zeros past a row's nkeys): probs_size() floats.
  void run(const float* c_kv, const float* k_pe, float* out_sorted, float* probs) const;
  int64_t probs_size() const;
  /// run() over a cache mixed per (row, key): store A is c_kv_a, k_pe_a, store B and the ranges are `b`. Per
  /// segment the score and output GEMMs of each store run on the key columns some row of the segment reads from
  /// it (as probes' AbsorbedAttention::run_mixed per chunk: a decode order reads B on its sink and residual
  /// window); device memory for B's stores and a second scores buffer (probs_size()).
  void run_mixed(const float* c_kv_a, const float* k_pe_a, const DeviceMixedStores& b, float* out_sorted,
                 float* probs) const;

  /// run(c_kv, k_pe, out_sorted, nullptr), then keeps that result on the device as the reference of
  /// error_terms(): its probabilities, outputs and the top-8 keys of every row (probs_size() + Tq·H·(v_head_dim
  /// + 8) more device memory). Replaces an earlier reference.
  void keep_reference(const float* c_kv, const float* k_pe, float* out_sorted) const;
  /// Evaluates c_kv, k_pe as run() (mixed non-null: as run_mixed() with that store B) and writes terms [Tq·H]
  /// (by sorted row p·H + h) against the kept reference; the probabilities and outputs stay on the device
  /// (Tq·H·64 bytes come back). kl_floor: the floor of p̂ in the KL term (probes::kKlProbFloor). Throws
  /// std::logic_error when no reference was kept.
  void error_terms(const float* c_kv, const float* k_pe, const DeviceMixedStores* mixed, double kl_floor,
                   DeviceAttentionTerms* terms) const;
  bool has_reference() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  mutable std::mutex mu_;
};

}  // namespace latentq
