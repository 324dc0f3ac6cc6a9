// latentq/dump.h — loader for latent KV-cache dumps, HDF5 schema `latentq-dump/1`
// (written by python -m latentq.dump; format in data/README.md).
//
//   /                 attrs: schema = "latentq-dump/1", model, revision, source, config_json,
//                     rope_layout, original_dtype (strings); num_layers, num_heads, kv_lora_rank,
//                     qk_rope_head_dim, qk_nope_head_dim, v_head_dim (integers); softmax_scale (float)
//   /tokens           int32 [T]
//   /positions        int32 [T]
//   /seq_offsets      int64 [S+1], 0 = o_0 <= o_1 <= ... <= o_S = T
//   /layers/NNN/c_kv  float32 [T, kv_lora_rank]      (after kv_a_layernorm)
//   /layers/NNN/k_pe  float32 [T, qk_rope_head_dim]  (after RoPE)
//   optional, all or none (absorbed-attention data):
//   /layers/NNN/q_rows   int32 [Tq] (indices into /tokens)
//   /layers/NNN/q_nope   float32 [Tq, H, qk_nope_head_dim]
//   /layers/NNN/q_pe     float32 [Tq, H, qk_rope_head_dim]
//   /layers/NNN/w_uk     float32 [H, qk_nope_head_dim, kv_lora_rank]
//   /layers/NNN/w_uv     float32 [H, v_head_dim, kv_lora_rank]
//   /layers/NNN/attn_out float32 [Tq, H, v_head_dim]
//   optional with the attention data, both or neither (sparse MLA: the keys each query row read in the model):
//   /layers/NNN/topk_offsets int64 [Tq+1] (CSR offsets into topk_keys, 0 .. nnz)
//   /layers/NNN/topk_keys    int32 [nnz] (key indices j of each row's causal window, token seq_offsets[s] + j,
//                                         strictly ascending per row, at least one)
//   optional with those (a layer with its own DSA indexer), all or none, with the group attributes index_topk
//   (int64 >= 1) and index_softmax_scale (float64 > 0):
//   /layers/NNN/index_k float32 [T, d_i], index_q float32 [Tq, n_i, d_i], index_w float32 [Tq, n_i]
// NNN is the layer index, zero-padded to 3 digits. All arrays are row-major. Other attributes
// (created, compute_dtype, ...) may be present and are ignored.
//
// DeepSeek-V4 (root attribute cache_family = "deepseek_v4", data/README.md "DeepSeek-V4 caches"): root attributes
// head_dim (D) and qk_rope_head_dim (d_r) instead of kv_lora_rank, qk_nope_head_dim and v_head_dim; per layer, with
// the group attributes layer_type (sliding | csa | hca), compress_rate (0 | >= 1), sliding_window, softmax_scale
// (and on CSA layers index_topk, index_softmax_scale), N the layer's compressed entries over all sequences:
//   window_kv [T, D] (every layer); compressed_kv [N, D], compressed_span int64 [N, 2], compressed_rope_position
//   int64 [N], compressed_offsets int64 [S+1] (CSA, HCA); index_k [N, c] (CSA);
//   with the attention data: q_rows int32 [Tq], q [Tq, H, D], rope_cos / rope_sin [Tq, d_r/2], attn_out [Tq, H, D],
//   sinks [H] (every layer); index_q [Tq, n_h, c], index_w [Tq, n_h], index_selected int64 [Tq, index_topk] (CSA).
// Read by study/io/dump_v4.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "latentq/spec.h"

namespace latentq {

inline constexpr const char* kDumpSchema = "latentq-dump/1";

/// The cache families a dump can hold (its root attribute cache_family): what the model caches per token and layer
/// and which of those tokens each query row reads. Every stage that depends on the family (the dump's reader and
/// its check, the probes' planning, the attention's key selection) asks this table, not the family's name.
struct CacheFamilyTraits {
  const char* name;  ///< the root attribute's value ("dense_mla" when absent: dumps written before it)
  /// The cached tensors a layer of the family holds (latentq/spec.h kTargets), in Target order.
  bool caches[kTargetCount];
  /// Each query row reads a per-row selection of the causal keys (Layer::topk_offsets / topk_keys, chosen by an
  /// indexer from its own key cache) rather than every causal key.
  bool topk_selection;
  /// The caches' rows: one per token (false), or, for the entry caches of DeepSeek-V4, also one per compressed entry
  /// (compressed_kv and index_k: Layer::row_offsets).
  bool compressed_entries;
  const char* models;  ///< the models that cache this way
  const char* source;  ///< what it is computed from (the reference modeling code)
  /// Whether a layer of the family holds `t` (caches[t]).
  constexpr bool holds(Target t) const { return caches[static_cast<size_t>(t)]; }
};
inline constexpr CacheFamilyTraits kCacheFamilies[] = {
    {"dense_mla", {true, true, false, false, false}, false, false,
     "DeepSeek-V2/V3, Kimi K2, GLM-4.7-Flash, MiniCPM3, LongCat-Flash",
     "transformers 5.24 deepseek_v2 / deepseek_v3 (DeepseekV3Attention): c_kv after kv_a_layernorm, k_pe after RoPE, "
     "every causal key read"},
    {"sparse_mla", {true, true, true, false, false}, true, false, "DeepSeek-V3.2, GLM-5 (DeepSeek Sparse Attention)",
     "transformers 5.24 deepseek_v32 / glm_moe_dsa (DeepseekV32Indexer): the latent plus the lightning indexer's key "
     "cache (index_k, after its k_norm and RoPE); each query row reads the causal top-index_topk of the index score"},
    {"deepseek_v4", {false, false, true, true, true}, false, true,
     "DeepSeek-V4 (sliding, CSA and HCA layers; no MLA latent)",
     "transformers 5.24 deepseek_v4 (DeepseekV4Attention): the sliding window's K = V entry of every token "
     "(window_kv), the CSA / HCA compressor's entries (compressed_kv, one per compress_rate tokens) and the CSA "
     "indexer's keys (index_k, one per compressed entry); a CSA query row reads the index_selected entries, an HCA "
     "row every complete entry of its sequence (its selection is the layer's index_selected, not topk_keys)"},
};
/// The row of `name`; throws std::invalid_argument "unknown cache_family 'x', available: dense_mla, sparse_mla,
/// deepseek_v4".
const CacheFamilyTraits& cache_family_traits(std::string_view name);

/// Root attributes of a dump.
struct DumpAttrs {
  std::string model, revision, source, rope_layout, original_dtype, config_json;
  /// "dense_mla" (the attribute absent), "sparse_mla": DeepSeek Sparse Attention, whose layers hold the keys each
  /// query row read (Layer::topk_*) and their DSA indexer's tensors (Layer::index_*), or "deepseek_v4" (Layer's V4
  /// datasets; kv_lora_rank, qk_nope_head_dim and v_head_dim are 0, head_dim is the entry width).
  std::string cache_family = "dense_mla";
  int64_t num_layers = 0, num_heads = 0, kv_lora_rank = 0, qk_rope_head_dim = 0, qk_nope_head_dim = 0, v_head_dim = 0;
  /// DeepSeek-V4: the width D of an attention entry (window_kv, compressed_kv, q, attn_out); its last
  /// qk_rope_head_dim columns are rotated. 0 for the MLA families.
  int64_t head_dim = 0;
  /// DeepSeek-V4: why the compressed entries of a loaded layer give no fit and held-out split (a single non-empty
  /// sequence of one entry), naming the layer; "" when they all do. A transform fitted on the fit split (klt) is
  /// then not applicable to compressed_kv and index_k (latentq/applicable.h).
  std::string entry_split_problem;
  /// Sparse MLA and DeepSeek-V4: the width of the layers' indexer key cache (/layers/NNN/index_k [T or N,
  /// index_head_dim], one for the file); 0 when no layer has one. From the datasets' shapes (no root attribute).
  int64_t index_head_dim = 0;
  double softmax_scale = 0;  ///< the model's attention softmax scale (mscale² included); > 0 and a
                             ///< normal float32 (load_dump checks it after the conversion)

  /// The row of kCacheFamilies of cache_family.
  const CacheFamilyTraits& family() const { return cache_family_traits(cache_family); }

  /// Bytes per token of the whole model's latent cache in bf16, c_kv and k_pe of every layer:
  /// num_layers · (kv_lora_rank + qk_rope_head_dim) · 2. What ratio_vs_bf16 and the decision's budgets are
  /// fractions of.
  int64_t bf16_bytes_per_token() const { return num_layers * (kv_lora_rank + qk_rope_head_dim) * 2; }
  /// Whether the dump is DeepSeek-V4's (cache_family deepseek_v4).
  bool v4() const { return family().compressed_entries; }
  /// The row width of `target` (latentq/spec.h kTargets): kv_lora_rank, qk_rope_head_dim, index_head_dim or
  /// head_dim (window_kv, compressed_kv).
  int64_t width(Target target) const;
};

/// One layer of a dump. Latents are always loaded; the attention data only when requested and
/// present (empty vectors otherwise).
struct Layer {
  int index = 0;                ///< the layer index (the NNN of /layers/NNN)
  std::vector<float> c_kv;      ///< [T, kv_lora_rank] row-major float32
  std::vector<float> k_pe;      ///< [T, qk_rope_head_dim] row-major float32
  std::vector<int32_t> q_rows;  ///< [Tq] indices into /tokens
  std::vector<float> q_nope;    ///< [Tq, H, qk_nope_head_dim]
  std::vector<float> q_pe;      ///< [Tq, H, qk_rope_head_dim]
  std::vector<float> w_uk;      ///< [H, qk_nope_head_dim, kv_lora_rank] (W_UK)
  std::vector<float> w_uv;      ///< [H, v_head_dim, kv_lora_rank] (W_UV)
  std::vector<float> attn_out;  ///< [Tq, H, v_head_dim] the model's attention output (before o_proj)
  /// Sparse MLA (DeepSeek Sparse Attention): the keys query row i read in the model, topk_keys[topk_offsets[i] ..
  /// topk_offsets[i+1]) (key index j: token seq_offsets[s] + j); both empty for dense MLA.
  std::vector<int64_t> topk_offsets;  ///< [Tq+1]
  std::vector<int32_t> topk_keys;     ///< [nnz]
  bool sparse() const { return !topk_offsets.empty(); }
  /// Sparse MLA, a layer with its own DSA indexer (/layers/NNN/index_k, index_q, index_w; empty otherwise): the
  /// indexer's key cache [T, index_dim] (after its k_norm and RoPE), its queries [Tq, index_heads, index_dim]
  /// and head weights [Tq, index_heads] (n_i^-0.5 applied); the index score of key t for row q is
  /// Σ_h index_w[q, h] · relu(index_softmax_scale · index_q[q, h] · index_k[t]), and the row reads the causal
  /// top-index_topk (python/latentq/sparse_mla.py, from transformers 5.24's DeepseekV32Indexer).
  std::vector<float> index_k, index_q, index_w;
  int64_t index_heads = 0, index_dim = 0, index_topk = 0;
  double index_softmax_scale = 0;
  bool has_indexer() const { return !index_k.empty(); }

  /// DeepSeek-V4 (cache_family deepseek_v4; empty / 0 otherwise), data/README.md "DeepSeek-V4 caches". The group
  /// attributes (read with the header too): layer_type "sliding", "csa" or "hca"; compress_rate m (0 on sliding
  /// layers: tokens per compressed entry); sliding_window (window entries a query row reads); softmax_scale (the
  /// layer's, D^-1/2); on CSA layers index_topk and index_softmax_scale above.
  std::string layer_type;
  int64_t compress_rate = 0, sliding_window = 0;
  double softmax_scale = 0;
  std::vector<float> window_kv;                  ///< [T, head_dim] K = V entry of every token, after RoPE
  std::vector<float> compressed_kv;              ///< [N, head_dim] CSA / HCA entries, after RoPE (empty on sliding)
  std::vector<int64_t> compressed_span;          ///< [N, 2] [first token, end) within the sequence
  std::vector<int64_t> compressed_rope_position; ///< [N] entry w's RoPE position w · m
  std::vector<int64_t> compressed_offsets;       ///< [S+1] sequence s owns entries [o_s, o_{s+1}) (CSA, HCA)
  // with the attention data (every layer): q [Tq, H, head_dim] after RoPE, rope_cos / rope_sin [Tq, d_r/2] (the
  // query rows' cos / sin, one per pair), sinks [H]; attn_out above is [Tq, H, head_dim] on V4; CSA also index_q,
  // index_w above and index_selected [Tq, index_topk] (entries within the row's sequence; -1: none).
  std::vector<float> q, rope_cos, rope_sin, sinks;
  std::vector<int64_t> index_selected;
  /// Whether this is a DeepSeek-V4 layer (its layer_type was read).
  bool v4() const { return !layer_type.empty(); }

  /// The rows of `target` [rows, DumpAttrs::width(target)]: c_kv, k_pe, index_k, window_kv or compressed_kv (empty
  /// when the layer has none; index_k of sparse MLA when its attention data was not loaded).
  const std::vector<float>& rows(Target target) const;
  /// The row ranges of each sequence in rows(target), [S+1] from 0 to the row count: `seq_offsets` (the dump's,
  /// one row per token) except for DeepSeek-V4's compressed_kv and index_k, whose rows are the layer's compressed
  /// entries (compressed_offsets; empty on a sliding layer). Nothing may assume a target has T rows.
  const std::vector<int64_t>& row_offsets(Target target, const std::vector<int64_t>& seq_offsets) const;
  /// The number of rows of `target`: row_offsets(target, seq_offsets).back() (0 when it has none).
  int64_t num_rows(Target target, const std::vector<int64_t>& seq_offsets) const;

  /// True when the attention datasets were loaded: all six of MLA, or on a DeepSeek-V4 layer q_rows, q, rope_cos,
  /// rope_sin, attn_out and sinks.
  bool has_attention() const {
    if (v4()) return !q_rows.empty() && !q.empty() && !rope_cos.empty() && !attn_out.empty() && !sinks.empty();
    return !q_rows.empty() && !q_nope.empty() && !q_pe.empty() && !w_uk.empty() && !w_uv.empty() && !attn_out.empty();
  }
  /// Number of query rows Tq (0 without attention data).
  int64_t num_query_rows() const { return static_cast<int64_t>(q_rows.size()); }
};

/// A loaded dump. Invariants (checked by load_dump): every loaded layer has the shapes above,
/// all latents are finite, seq_offsets runs from 0 to T non-decreasing.
struct Dump {
  DumpAttrs attrs;
  std::vector<int32_t> tokens;       ///< [T]
  std::vector<int32_t> positions;    ///< [T]
  std::vector<int64_t> seq_offsets;  ///< [S+1]
  std::vector<Layer> layers;         ///< the loaded layers, ascending index
  std::vector<int> file_layers;      ///< every layer index present in the file, ascending
  bool file_has_attention = false;   ///< the file holds the attention datasets (even if not loaded)
  std::vector<int> indexer_layers;   ///< the file's layers with an indexer key cache (index_k), ascending
  /// DeepSeek-V4: the file's layers with at least one compressed entry (compressed_kv of N >= 1 rows), ascending.
  std::vector<int> compressed_layers;
  /// Whether layer `index` of the file holds `target` with its values loadable, at least one row of it: c_kv and
  /// k_pe always (MLA); index_k of sparse MLA on indexer_layers with the attention datasets (it is read with them);
  /// DeepSeek-V4's window_kv always, compressed_kv on compressed_layers, index_k on the indexer_layers among them.
  bool holds(int index, Target target) const;
  /// Whether `target`'s values are read with the attention datasets (LoadOptions::attention): index_k of sparse
  /// MLA. DeepSeek-V4's caches are read without them.
  bool reads_with_attention(Target target) const { return target == Target::IndexK && !attrs.v4(); }
  std::filesystem::path path;        ///< the file it was loaded from

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }         ///< T
  int64_t num_seqs() const { return static_cast<int64_t>(seq_offsets.size()) - 1; }  ///< S
  /// The loaded layer with this index; throws std::invalid_argument if it was not loaded.
  const Layer& layer(int index) const;
};

struct LoadOptions {
  std::vector<int> layers;  ///< layer indices to load; empty = all layers of the file
  bool attention = true;    ///< load q_rows/q_nope/q_pe/w_uk/w_uv/attn_out (V4: q_rows, q, ...) when present
  /// false: a header only — attributes, tokens, positions, seq_offsets, the layer list, and every
  /// dataset's dtype and shape checked, but no layer values read (Layer entries hold their index only;
  /// read_layer() reads one layer's values). The finiteness checks happen when the values are read.
  bool data = true;
};

/// Load and validate a `latentq-dump/1` file.
/// Throws std::runtime_error for a missing/unreadable file, a file that is not HDF5, or an HDF5
/// error while reading (truncated or corrupt file; the message names the path and dataset), and
/// std::invalid_argument for content that breaks the schema: wrong or missing `schema` or other
/// root attribute, a root attribute that holds no value or several (a string array for 'model'), missing
/// dataset, a dataset not written in full (fewer bytes or chunks stored than its shape needs: HDF5 would
/// read fill values; checked before its memory is allocated), wrong dtype/rank/shape (e.g. "/layers/003/c_kv has shape
/// [2048, 127], expected [2048, 128] (T, kv_lora_rank)"), attention data present in part or with
/// shapes that differ across layers, a softmax_scale that is not > 0 and finite as a float64 or that
/// is not a normal float32 after the conversion (1e300 → inf, 1e-50 → 0; the attention runs in
/// float32), NaN/Inf in any loaded float dataset (layer, dataset, count),
/// an empty layer (T = 0), bad seq_offsets or q_rows, a requested layer that is not in the file.
/// Every message starts with the file path.
Dump load_dump(const std::filesystem::path& path, const LoadOptions& options = {});

/// The layers among `layers` (every /layers/NNN group of the file when empty) that have no query rows
/// (/layers/NNN/q_rows), ascending: what a fit on the query rows (latentq/fit_layer.h) cannot use. Reads no values
/// and checks nothing else (a file with attention datasets in part is load_dump's to refuse, naming them). Throws
/// std::runtime_error naming the path for a missing file or one HDF5 cannot open.
std::vector<int> layers_without_query_rows(const std::filesystem::path& path, const std::vector<int>& layers = {});

/// The values of one layer of the dump whose header (load_dump with data = false) is `header`: c_kv,
/// k_pe and, with `attention` and when the file has them, the attention datasets. Validated as
/// load_dump() validates them (the same messages); also throws std::invalid_argument when the file's
/// tokens changed since the header was read. Thread-safe (HDF5 calls hold h5::library_mutex()).
Layer read_layer(const Dump& header, int index, bool attention);

/// One streaming pass over the values of every layer of `header` (read_layer() for each, ascending, one
/// layer held at a time, then dropped): the checks load_dump() and `latentq inspect` make on values
/// (NaN/Inf in c_kv, k_pe and, with `attention`, the attention datasets; q_rows outside [0, T)). The study
/// runs it before its first cell, so that bad input is refused with nothing written. `progress`, when
/// set, is called after each layer with (layers done, layers). Throws as read_layer().
void validate_layers(const Dump& header, bool attention, const std::function<void(size_t, size_t)>& progress = nullptr);

}  // namespace latentq
