// Synthetic DeepSeek-V4 dumps (cache_family deepseek_v4, data/README.md "DeepSeek-V4 caches") for the study tests,
// written with the HDF5 C++ API: one layer of each type (sliding, csa, hca by default) with random float data and
// the compressors' index rules (spans, RoPE positions, offsets), so that the reader's checks pass. attn_out is random
// (the reader does not recompute the attention); python/latentq/dump_v4.py writes the real thing.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace lqtest {

struct SynthV4Spec {
  std::vector<std::string> layer_types = {"sliding", "csa", "hca"};
  std::vector<int64_t> seq_lens = {20, 13};  ///< T = sum
  int64_t head_dim = 32, qk_rope_head_dim = 8, num_heads = 2;
  int64_t csa_rate = 4, hca_rate = 8, sliding_window = 8;
  int64_t index_heads = 2, index_dim = 16, index_topk = 3;
  int64_t query_rows = 6;
  uint64_t seed = 7;
};

/// The data of one layer (row-major, as in the file); the compressed and index arrays are empty on layer types
/// that have none.
struct SynthV4Layer {
  std::string type;
  int64_t rate = 0;
  std::vector<float> window_kv, compressed_kv, index_k, q, rope_cos, rope_sin, attn_out, sinks, index_q, index_w;
  std::vector<int64_t> span, rope_position, offsets, selected;
};

struct SynthV4 {
  SynthV4Spec spec;
  int64_t T = 0;
  std::vector<int32_t> tokens, positions, q_rows;
  std::vector<int64_t> seq_offsets;
  std::vector<SynthV4Layer> layers;
};

/// Random data (std::mt19937_64(seed)): window_kv, compressed_kv ~ N(0, 1), index_k ~ 2·N(0, 1), the query-side
/// arrays N(0, 1); entry w of a sequence of a layer of rate m spans [w·m, (w+1)·m) (HCA) or [max(0, (w−1)·m),
/// (w+1)·m) (CSA) at RoPE position w·m, one per complete window; each CSA query row picks min(index_topk, its
/// visible entries) entries, -1 after.
SynthV4 make_synth_v4(const SynthV4Spec& spec = {});

/// Write `d` as a latentq-dump/1 file of cache_family deepseek_v4.
void write_synth_v4(const std::filesystem::path& path, const SynthV4& d);

/// Attributes of the object `object` ("/" or a group such as "/layers/001") of an existing file: set (a string or an
/// int64 scalar, replacing it) or delete.
void set_attr_at(const std::filesystem::path& path, const std::string& object, const std::string& name,
                 const std::string& value);
void set_attr_at(const std::filesystem::path& path, const std::string& object, const std::string& name, int64_t value);
void delete_attr_at(const std::filesystem::path& path, const std::string& object, const std::string& name);

}  // namespace lqtest
