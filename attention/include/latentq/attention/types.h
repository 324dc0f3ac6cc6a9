// latentq/attention/types.h — the data the absorbed attention takes and returns: the layer's dimensions and
// queries, a result, key ranges and the two-store (mixed) cache, and the layout a device takes
// (latentq/attention/attention.h includes it).
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace latentq::probes {

struct MlaDims {
  int64_t num_heads = 0;         ///< H
  int64_t kv_lora_rank = 0;      ///< r
  int64_t qk_nope_head_dim = 0;  ///< nope
  int64_t qk_rope_head_dim = 0;  ///< rope
  int64_t v_head_dim = 0;        ///< v
};

/// The latent-independent inputs of one layer, as in a latentq-dump/1 file (all row-major). Views only:
/// AbsorbedAttention copies what it needs, so the spans may die after construction.
struct AttentionQueries {
  MlaDims dims;
  int64_t num_tokens = 0;                ///< T, tokens in the cache (all sequences)
  std::span<const int64_t> seq_offsets;  ///< [S+1] int64
  std::span<const int32_t> q_rows;       ///< [Tq] int32, token index of each query row
  std::span<const float> q_nope;         ///< [Tq, H, qk_nope_head_dim] float32
  std::span<const float> q_pe;           ///< [Tq, H, qk_rope_head_dim] float32, after RoPE
  std::span<const float> w_uk;           ///< [H, qk_nope_head_dim, kv_lora_rank] float32 (W_UK)
  std::span<const float> w_uv;           ///< [H, v_head_dim, kv_lora_rank] float32 (W_UV)
  double softmax_scale = 0;              ///< > 0, finite
  /// Sparse MLA (DeepSeek Sparse Attention: DeepSeek-V3.2, GLM-5): the keys each query row reads, in CSR form by
  /// query row: row i reads keys selected_keys[selected_offsets[i] .. selected_offsets[i+1]) only, each a key
  /// index j of its causal window (token seq_offsets[s] + j, 0 <= j < nkeys), strictly ascending, at least one
  /// per row; the others get probability 0 (their scores are −inf before the softmax, as transformers'
  /// DeepseekV32Attention masks them). Both empty: dense MLA, every key of the window.
  std::span<const int64_t> selected_offsets;  ///< [Tq+1] int64, or empty
  std::span<const int32_t> selected_keys;     ///< [selected_offsets[Tq]] int32, or empty
  bool sparse() const { return !selected_offsets.empty(); }
};

/// AttentionQueries' selection, owned (AbsorbedAttention keeps it): the keys each query row reads under sparse
/// attention, CSR by query row; empty for dense MLA.
struct KeySelection {
  std::vector<int64_t> offsets;  ///< [Tq+1] or empty
  std::vector<int32_t> keys;     ///< [offsets[Tq]] key indices, strictly ascending per row
  bool empty() const { return offsets.empty(); }
  /// Sets the scores of the keys [0, n) that query row i does not select to −inf (a dense selection: none).
  template <typename Scalar>
  void mask_unselected(int64_t i, Scalar* row, int64_t n) const {
    if (offsets.empty()) return;
    const int32_t* k = keys.data() + offsets[i];
    const int64_t cnt = offsets[i + 1] - offsets[i];
    int64_t next = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (next < cnt && k[next] == j)
        ++next;
      else
        row[j] = -std::numeric_limits<Scalar>::infinity();
    }
  }
};

/// Output of one attention evaluation; query rows in q_rows order.
template <typename Scalar>
struct AttentionResult {
  int64_t num_queries = 0, num_heads = 0, v_head_dim = 0;
  std::vector<Scalar> out;            ///< [Tq, H, v_head_dim] (before o_proj; compare with a dump's attn_out)
  std::vector<int64_t> nkeys;         ///< [Tq] keys of each query row
  std::vector<int64_t> prob_offsets;  ///< [Tq+1] start of row i's probabilities in probs (H·nkeys[i] each)
  std::vector<Scalar> probs;          ///< empty unless requested; see prob()

  /// Attention probabilities of row i, head h: nkeys[i] values, key j = token seq_offsets[s] + j.
  std::span<const Scalar> prob(int64_t i, int64_t h) const {
    return {probs.data() + prob_offsets[i] + h * nkeys[i], static_cast<size_t>(nkeys[i])};
  }
};

/// Keys [begin, end) of one query row, as key indices j = 0 .. nkeys − 1 (j = the key's position in
/// its sequence; key j is token seq_offsets[s] + j). begin ≥ end is the empty range.
struct KeyRange {
  int64_t begin = 0, end = 0;
  bool contains(int64_t j) const { return j >= begin && j < end; }
};

/// A cache read from two stores per (query row, key): row i reads key j of c_kv from store A iff
/// ckv_from_a[i].contains(j), else from store B; k_pe likewise with kpe_from_a. Scores and values mix
/// per (row, key): score_j = q_lat·c_kv_X[j] + q_pe·k_pe_Y[j], out = W_UV·Σ_j p_j c_kv_X[j], X and Y the
/// stores the ranges pick. The decode-order cache (latentq/decode_order.h) is this with A = the quantized
/// cache, B = its bf16 reads and the range [sink, quantized_end(t, G)).
struct MixedCache {
  std::span<const float> c_kv_a, k_pe_a;  ///< store A: [T, kv_lora_rank], [T, qk_rope_head_dim] float32
  std::span<const float> c_kv_b, k_pe_b;  ///< store B: same shapes
  std::span<const KeyRange> ckv_from_a;   ///< [Tq], q_rows order
  std::span<const KeyRange> kpe_from_a;   ///< [Tq], q_rows order
};

/// Sorted query rows [begin, end) of one sequence and its keys, tokens key_begin .. key_begin + nk − 1
/// (AttentionLayout).
struct AttentionSegment {
  int64_t begin = 0, end = 0, key_begin = 0, nk = 0;
};

/// One layer's fixed inputs of the absorbed attention as a device takes them: AbsorbedAttention's query
/// rows sorted by token index (row = sorted_pos·H + h), in segments of consecutive rows of one sequence
/// (attach_device's segment_rows). The pointers are views
/// into the AbsorbedAttention that made the layout, valid while it lives.
struct AttentionLayout {
  MlaDims dims;
  int64_t num_tokens = 0;  ///< T
  float softmax_scale = 0;
  std::span<const int64_t> nkeys;          ///< [Tq] keys of each sorted row
  std::vector<AttentionSegment> segments;  ///< cover the sorted rows [0, Tq) in order
  const float* q_lat = nullptr;            ///< [Tq·H, kv_lora_rank] float32 row-major (q_nope·W_UK)
  const float* q_pe = nullptr;             ///< [Tq·H, qk_rope_head_dim]
  const float* w_uv = nullptr;             ///< [H·v_head_dim, kv_lora_rank] (W_UV)
};

}  // namespace latentq::probes
