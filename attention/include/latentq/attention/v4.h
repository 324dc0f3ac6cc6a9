// latentq/attention/v4.h — DeepSeek-V4's attention for one layer, from its caches: the shared K = V window
// entries, the compressed entries (CSA / HCA), the CSA indexer's selection and the per-head sinks.
//
// Source of the math: transformers 5.24.0 models/deepseek_v4/modeling_deepseek_v4.py (DeepseekV4Attention.forward,
// eager_attention_forward, DeepseekV4Indexer.forward, DeepseekV4IndexerScorer.forward), as data/README.md
// ("DeepSeek-V4 caches") states it and python/latentq/dump_v4.py recompute_rows computes it in float64. Query row
// i at token t (position p in sequence s) reads, as keys and values alike:
//   * the window entries window_kv[j] of the tokens j of its sequence with p − sliding_window < pos(j) ≤ p;
//   * CSA / HCA: the compressed entries of its sequence whose span ends by p + 1 (compressed_span[w, 1] ≤ p + 1:
//     the entry's window of tokens is complete at p) — HCA all of them, CSA those the indexer selected;
// then
//   logit[h, key] = softmax_scale · q[i, h] · key
//   w = softmax over [logit[h, :], sinks[h]] (the sink's logit as it is, not scaled), the sink column dropped
//   o[h] = Σ_key w[h, key] · key                                              (V = K, all D columns)
//   out[i, h] = o[h] with its last d_r columns rotated pairwise (2k, 2k+1) by (rope_cos[i, k], −rope_sin[i, k]):
//               (a, b) → (a·cos + b·sin, b·cos − a·sin)                      (apply_rotary_pos_emb(o, cos, −sin))
// The CSA index score (DeepseekV4IndexerScorer) is latentq/attention/dsa.h's over the visible entries:
//   s[i, w] = Σ_h index_w[i, h] · relu(index_softmax_scale · index_q[i, h] · index_k[w]), the top-index_topk
//   visible entries by score (all of them when fewer are visible; ties → the lower entry index).
//
// Probabilities (AttentionResult::probs, for attention_error's KL / top-k): row i's key slots are, in order, its
// window entries (ascending token), its visible compressed entries (ascending entry; on CSA layers an entry the
// indexer did not select has probability exactly 0) and the sink (the model's softmax gives it mass too):
// nkeys(i) = window keys + visible entries + 1. The slots depend on the layer's geometry only, not on the
// selection, so a run whose quantized index_k changes the CSA selection is comparable slot by slot with the
// reference (a selected-away entry then costs KL through the floor of attention_error).
//
// Precision: as AbsorbedAttention (latentq/attention/engine.h) — Scalar = float computes the scores, the softmax
// and the outputs in float32 (BLAS sgemm, latentq/analysis/gemm.h), Scalar = double in float64 (tests); inputs
// are float32 either way. Work: per query row, two score GEMMs [H, D] × [D, keys] (window, compressed entries)
// and two output GEMMs; rows run in parallel (OpenMP).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "latentq/attention/types.h"

namespace latentq::probes {

/// A V4 layer's type (the dump's `layer_type` attribute; transformers' layer_types sliding_attention,
/// compressed_sparse_attention, heavily_compressed_attention).
enum class V4LayerType { Sliding, Csa, Hca };

/// "sliding", "csa" or "hca"; throws std::invalid_argument naming the value otherwise.
V4LayerType parse_v4_layer_type(std::string_view name);
std::string to_string(V4LayerType t);

/// One V4 layer's inputs that do not depend on the caches, as in a `deepseek_v4` dump (data/README.md, row-major).
/// Views only: V4Attention copies what it needs.
struct V4Queries {
  V4LayerType layer_type = V4LayerType::Sliding;
  int64_t num_heads = 0;       ///< H
  int64_t head_dim = 0;        ///< D, the width of a window / compressed entry and of a query head
  int64_t rope_dim = 0;        ///< d_r: the last d_r columns are rotated (even, 0 ≤ d_r ≤ D)
  int64_t sliding_window = 0;  ///< >= 1
  double softmax_scale = 0;    ///< > 0, finite (D^-1/2 in V4)
  int64_t num_tokens = 0;                ///< T
  std::span<const int64_t> seq_offsets;  ///< [S+1]
  std::span<const int32_t> positions;    ///< [T], position of each token in its sequence: 0, 1, ... per sequence
  std::span<const int32_t> q_rows;       ///< [Tq], token index of each query row
  std::span<const float> q;              ///< [Tq, H, D] after RoPE
  std::span<const float> sinks;          ///< [H]
  std::span<const float> rope_cos;       ///< [Tq, d_r/2]
  std::span<const float> rope_sin;       ///< [Tq, d_r/2]
  /// CSA / HCA (empty on sliding layers): sequence s owns entries compressed_offsets[s] .. [s+1]; entry w's
  /// [first token, end) positions within its sequence.
  std::span<const int64_t> compressed_offsets;  ///< [S+1], 0 .. N
  std::span<const int64_t> compressed_span;     ///< [N, 2]
};

/// The CSA indexer's inputs of one layer at its query rows (dump datasets index_q, index_w; index_topk,
/// index_softmax_scale attributes); index_k is the cache the study quantizes, given per selection.
struct V4IndexQueries {
  int64_t n_heads = 0;  ///< n_h
  int64_t dim = 0;      ///< c, index_head_dim
  int64_t topk = 0;     ///< index_topk >= 1
  double softmax_scale = 0;
  std::span<const float> index_q;  ///< [Tq, n_h, c] after RoPE
  std::span<const float> index_w;  ///< [Tq, n_h], n_h^-1/2 applied
};

/// DeepSeek-V4 attention for one layer with its queries fixed: construct once per layer, run() once per cache
/// variant (exact, window_kv / compressed_kv quantized, a selection from a quantized index_k).
template <typename Scalar>
class V4Attention {
 public:
  /// Validates and copies the queries. Throws std::invalid_argument (naming the value and what was expected)
  /// for H, D < 1, d_r odd or outside [0, D], sliding_window < 1, span sizes that do not match, bad
  /// seq_offsets, positions that are not 0, 1, ... within each sequence, a q_row outside [0, T), NaN/Inf in
  /// q / sinks / rope_cos / rope_sin, a softmax_scale that is not finite and > 0 (or not one in Scalar), and on
  /// CSA / HCA layers compressed_offsets that are not S + 1 ascending offsets from 0, or a span [a, b) with
  /// b <= a; on sliding layers any compressed span given.
  explicit V4Attention(const V4Queries& q);

  /// The attention over window_kv [T, D] and compressed_kv [N, D] (empty on sliding layers); on a CSA layer
  /// `selection` is required: the entries each query row reads (CSR by query row, entry indices within the
  /// row's sequence, strictly ascending, each visible to the row; selection_from_picks / select_topk),
  /// elsewhere it must be null. keep_probs stores the probabilities (the slots of the header comment).
  /// Throws std::invalid_argument for wrong sizes, NaN/Inf in the caches (with the count), a missing or
  /// malformed selection, or a result that is not finite.
  AttentionResult<Scalar> run(std::span<const float> window_kv, std::span<const float> compressed_kv,
                              const KeySelection* selection = nullptr, bool keep_probs = false) const;

  /// The selection of a dump's index_selected [Tq, k] (the model's picks, in the indexer's order; −1 = none):
  /// per row the picks other than −1, sorted. Throws std::invalid_argument for a size that is not Tq·k, a pick
  /// < −1, a pick twice in a row, or a pick the row cannot see (naming row and pick).
  KeySelection selection_from_picks(std::span<const int64_t> index_selected, int64_t k) const;

  /// The top-k selection recomputed from the indexer's queries and index_k [N, c] (a quantized one gives the
  /// engine's selection on that cache): latentq/attention/dsa.h's dsa_select_topk over each row's visible
  /// entries, in float64. Throws std::invalid_argument for sizes that do not match, topk < 1 or a bad scale.
  KeySelection select_topk(const V4IndexQueries& iq, std::span<const float> index_k) const;

  int64_t num_queries() const { return static_cast<int64_t>(t_.size()); }
  /// Window keys of query row i: tokens [window_begin(i), t_i], t_i = q_rows[i].
  int64_t window_begin(int64_t i) const { return wbeg_[i]; }
  /// Visible compressed entries of row i: the entries [0, visible_entries(i)) of its sequence.
  int64_t visible_entries(int64_t i) const { return nvis_[i]; }
  /// nkeys of the result's row i: window keys + visible entries + 1 (the sink).
  int64_t key_slots(int64_t i) const { return t_[i] - wbeg_[i] + 1 + nvis_[i] + 1; }
  V4LayerType layer_type() const { return type_; }

 private:
  void check_selection(const KeySelection& sel) const;
  V4LayerType type_ = V4LayerType::Sliding;
  int64_t H_ = 0, D_ = 0, rope_ = 0, T_ = 0, N_ = 0;
  Scalar scale_ = 0;
  std::vector<int64_t> seq_offsets_, compressed_offsets_;
  std::vector<int32_t> q_rows_;
  std::vector<int64_t> t_, seq_, wbeg_, nvis_;  // per query row: token, sequence, first window token, entries
  std::vector<Scalar> q_, sinks_, cos_, sin_;   // [Tq, H, D], [H], [Tq, d_r/2] ×2
};

}  // namespace latentq::probes
