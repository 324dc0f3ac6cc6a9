// latentq/synth_v4.h — synthetic DeepSeek-V4 dumps (cache_family deepseek_v4, data/README.md "DeepSeek-V4 caches")
// with a real V4 model's cache shapes (`latentq synth --preset deepseek-v4-flash`).
//
// The shapes are DeepSeek-V4-Flash's (V4Shape::source; study/io/synth_v4.cpp cites each value). The VALUES are
// shape-faithful only: they follow the structure of transformers 5.24's DeepseekV4Attention (RMS-normalized entries,
// the compressors' softmax-gated pooling over their windows, RoPE on the last qk_rope_head_dim columns, a per-head
// unweighted RMS-normalized query), drawn from seeded random projections; they are NOT the trained model's
// statistics, and no finding about V4's caches may be read off them. Per layer ℓ and sequence (positions 0 .. L−1):
//
//   a_t ~ AR(1) over the tokens of the sequence (ρ = 0.8, N(0, 1) stationary, never across sequences), one
//         independent draw per use below; γ = exp(0.25·N(0, 1)) per channel (each RMSNorm's weight)
//   window_kv[t]  = RoPE_p(γ ⊙ RMSNorm(a_t))                                     [T, D]   (kv_norm(kv_proj(x)))
//   compressed_kv[w] = RoPE_{w·m}(γ ⊙ RMSNorm(Σ_slot softmax_slot(g + b) ⊙ a))   [N, D]   (the compressor)
//       HCA: the m slots of window w (tokens w·m + j, gate g_t ~ N(0,1), position bias b_j ~ N(0,1));
//       CSA: 2m slots, the previous window's tokens (their first D of 2D projected channels; none for w = 0) and
//       window w's (their last D), as DeepseekV4CSACompressor lays them out (overlapping spans)
//   index_k[w]    = the CSA indexer's compressor, the same at index_head_dim c               [N, c]
//   q[i, h]       = RoPE_p(RMSNorm(N(0, 1)))  (q_b_norm: unweighted, per head)               [Tq, H, D]
//   index_q       = RoPE_p(N(0, 1)), index_w = N(0, 1)·n_h^−1/2, sinks ~ N(0, 1)
//   index_selected[i] = the visible entries with the top-index_topk index scores
//       s[i, w] = Σ_h index_w[i, h]·relu(c^−1/2·index_q[i, h]·index_k[w]) (computed in float64), highest first,
//       ties to the lower entry, −1 after the last visible one (DeepseekV4Indexer.forward)
//   attn_out      = latentq/attention/v4.h's V4Attention<double> over these caches (and on CSA layers the
//                   selection of index_selected), rounded once to float32: the dump's own check passes.
// RoPE: pairs (2k, 2k+1) of the last d_r columns rotated by position·inv_freq[k] (v4_inv_freq): θ^(−2k/d_r) with
// θ = rope_theta on sliding layers; on CSA / HCA layers (and their indexer) compress_rope_theta with V4-Flash's YaRN
// (factor 16 over 65,536 original positions: the slow pairs' frequencies divided by up to 16), as transformers 5.24
// computes the "compress" rope; rope_cos / rope_sin hold the query rows' cos / sin. Every layer is a pure function
// of (seed, layer); write_synth_v4_dump holds one layer at a time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "latentq/synth.h"

namespace latentq {

/// A DeepSeek-V4 model's cache shapes, as in its config.json.
struct V4Shape {
  std::string name;   ///< preset name, "deepseek-v4-flash"
  std::string model;  ///< the checkpoint, "deepseek-ai/DeepSeek-V4-Flash"
  /// The model's attention schedule, one compress rate per decoder layer: 0 sliding, csa_rate CSA, hca_rate HCA
  /// (config.json compress_ratios without the MTP layer's trailing entry).
  std::vector<int64_t> compress_ratios;
  int64_t num_layers = 0;  ///< the layers written: the first num_layers of compress_ratios (their own indices)
  int64_t num_heads = 0;         ///< num_attention_heads (H)
  int64_t head_dim = 0;          ///< D, the width of a window / compressed entry, a query head and attn_out
  int64_t qk_rope_head_dim = 0;  ///< d_r: the last d_r columns are rotated (head_dim · partial_rotary_factor)
  int64_t sliding_window = 0;    ///< window entries a query row reads
  int64_t csa_rate = 0, hca_rate = 0;  ///< compress_rates of compressed_sparse / heavily_compressed attention
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;  ///< the CSA lightning indexer
  double rope_theta = 0;           ///< the main rope (sliding layers)
  double compress_rope_theta = 0;  ///< the compress rope (CSA / HCA layers and the indexer)
  int64_t vocab_size = 0;          ///< /tokens are drawn in [0, vocab_size)
  std::string source;              ///< where the numbers were read
  /// The compress rope's YaRN (config.json rope_scaling; transformers applies it to the CSA / HCA layers and the
  /// indexer only, with attention_factor 1): factor (0: none), original_max_position_embeddings, beta_fast / _slow.
  double yarn_factor = 0;
  int64_t yarn_original_max_position = 0;
  double yarn_beta_fast = 32, yarn_beta_slow = 1;
  /// "sliding", "csa" or "hca" for layer `layer` (throws std::invalid_argument outside compress_ratios or for a rate
  /// that is none of 0, csa_rate, hca_rate).
  std::string layer_type(int64_t layer) const;
  /// 0 on a sliding layer, else the layer's compress rate.
  int64_t compress_rate(int64_t layer) const;
};

/// The inverse frequencies [d_r/2] of the main rope (θ^(−2k/d_r), θ = rope_theta) or, with `compress`, of the
/// compress rope (compress_rope_theta, with the preset's YaRN as transformers 5.24 modeling_rope_utils
/// _compute_yarn_parameters computes it, truncate true).
std::vector<double> v4_inv_freq(const V4Shape& s, bool compress);

/// The V4 presets (deepseek-v4-flash), each with the shapes of the config.json it names.
const std::vector<V4Shape>& v4_presets();
/// The V4 preset called `name`, or nullptr when there is none (the MLA presets are latentq/synth.h's).
const V4Shape* find_v4_preset(const std::string& name);
/// What `latentq synth --list` says of a V4 preset: shapes, the layer pattern and that its values are
/// shape-faithful only.
std::string describe_v4_preset(const V4Shape& s);

/// What to write. seq_lens empty: `seqs` sequences of `seq_len` tokens each.
struct V4SynthOptions {
  V4Shape shape;                  ///< find_v4_preset(...); num_layers and index_topk may be overridden
  int64_t seqs = 2;               ///< S ≥ 1
  int64_t seq_len = 512;          ///< tokens per sequence ≥ 1
  std::vector<int64_t> seq_lens;  ///< explicit lengths (overrides seqs × seq_len when not empty)
  int64_t query_rows = 32;        ///< Tq, chosen by the dump's query-row rule (latentq/synth.h synth_tokens)
  uint64_t seed = 0;
};

/// One V4 layer's arrays, row-major, shapes as in data/README.md "DeepSeek-V4 caches" (compressed and indexer
/// arrays empty where the layer type has none).
struct SynthV4Layer {
  std::string layer_type;  ///< sliding, csa, hca
  int64_t compress_rate = 0;
  double rope_theta = 0;   ///< the θ this layer's RoPE used
  std::vector<float> window_kv, compressed_kv, index_k;                         ///< [T, D], [N, D], [N, c]
  std::vector<int64_t> compressed_span, compressed_rope_position, compressed_offsets;  ///< [N, 2], [N], [S+1]
  std::vector<float> q, rope_cos, rope_sin, sinks, attn_out;  ///< [Tq, H, D], [Tq, d_r/2] ×2, [H], [Tq, H, D]
  std::vector<float> index_q, index_w;                        ///< [Tq, n_h, c], [Tq, n_h]
  std::vector<int64_t> index_selected;                        ///< [Tq, index_topk], −1: none
};

/// Checks the options (throws std::invalid_argument naming the option and value: num_layers outside
/// [1, compress_ratios.size()], a dim < 1, an odd d_r or one not below head_dim or index_head_dim, index_topk < 1,
/// θ ≤ 0, a sequence length < 1, Tq outside [1, T]).
void validate_v4(const V4SynthOptions& o);

/// The tokens, positions, sequence offsets and query rows (latentq/synth.h's rule; validates `o`).
SynthTokens synth_v4_tokens(const V4SynthOptions& o);

/// Layer `layer` (0 ≤ layer < num_layers), a pure function of (o, layer) (header comment).
SynthV4Layer synth_v4_layer(const V4SynthOptions& o, const SynthTokens& tok, int64_t layer);

/// Writes the dump to `out` through ".<name>.<pid>.tmp" in the same directory, renamed at the end (on any error the
/// temporary is removed and `out` untouched), one layer at a time; `on_layer(l)` (optional) after layer l is written.
/// Throws std::invalid_argument for bad options or a missing output directory, std::runtime_error / H5::Exception
/// for write errors.
void write_synth_v4_dump(const std::filesystem::path& out, const V4SynthOptions& o,
                         const std::function<void(int64_t)>& on_layer = {});

}  // namespace latentq
