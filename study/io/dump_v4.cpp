// DeepSeek-V4's layers of a `latentq-dump/1` file (cache_family deepseek_v4; latentq/dump.h, data/README.md
// "DeepSeek-V4 caches", written by python/latentq/dump_v4.py): the root shapes, the group attributes, every
// dataset's dtype and shape against T, Tq, N (the layer's compressed entries), S and the root attributes, and the
// values (finite floats; offsets, spans, query rows and selections in range), in the messages of study/io/dump.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "dump_loader.h"
#include "latentq/split.h"

namespace latentq::dumpio {
namespace {

// The layer types of data/README.md and whether each has compressed entries / an indexer.
struct LayerKind {
  const char* name;
  bool compressed, indexer;
};
constexpr LayerKind kLayerKinds[] = {{"sliding", false, false}, {"csa", true, true}, {"hca", true, false}};

// One group attribute of /layers/NNN, of HDF5 class `cls` and one value.
H5::Attribute group_attr(Loader& L, const H5::Group& grp, const std::string& g, const char* name, H5T_class_t cls,
                         const char* expected) {
  if (!grp.attrExists(name)) L.invalid(fmt::format("{}: missing attribute '{}' (expected {})", g, name, expected));
  const H5::Attribute a = grp.openAttribute(name);
  if (a.getTypeClass() != cls || a.getSpace().getSimpleExtentNpoints() != 1)
    L.invalid(fmt::format("{}: attribute '{}' is {} with {} values, expected {}", g, name,
                          h5::dtype_name(a.getDataType()), a.getSpace().getSimpleExtentNpoints(), expected));
  return a;
}

int64_t group_int(Loader& L, const H5::Group& grp, const std::string& g, const char* name, int64_t min_value) {
  int64_t v = 0;
  group_attr(L, grp, g, name, H5T_INTEGER, "an integer").read(H5::PredType::NATIVE_INT64, &v);
  if (v < min_value)
    L.invalid(fmt::format("{}: attribute '{}' = {}, expected an integer >= {}", g, name, v, min_value));
  return v;
}

double group_scale(Loader& L, const H5::Group& grp, const std::string& g, const char* name) {
  double v = 0;
  group_attr(L, grp, g, name, H5T_FLOAT, "a float").read(H5::PredType::NATIVE_DOUBLE, &v);
  if (!(std::isfinite(v) && v > 0) || !std::isnormal(static_cast<float>(v)))
    L.invalid(fmt::format("{}: attribute '{}' = {}, expected a finite value > 0 in the float32 normal range", g, name,
                          v));
  return v;
}

// The group attributes of a V4 layer into ly; returns its kind.
const LayerKind& read_layer_attrs(Loader& L, const H5::H5File& file, Layer& ly) {
  const std::string g = layer_group(ly.index);
  const H5::Group grp = file.openGroup(g);
  ly.layer_type = h5::read_string_attr(group_attr(L, grp, g, "layer_type", H5T_STRING, "sliding, csa or hca"));
  const LayerKind* kind = nullptr;
  for (const LayerKind& k : kLayerKinds)
    if (ly.layer_type == k.name) kind = &k;
  if (!kind)
    L.invalid(fmt::format("{}: attribute 'layer_type' is \"{}\", expected sliding, csa or hca", g, ly.layer_type));
  ly.compress_rate = group_int(L, grp, g, "compress_rate", 0);
  if ((ly.compress_rate == 0) == kind->compressed)
    L.invalid(fmt::format("{}: attribute 'compress_rate' = {} on a {} layer, expected {}", g, ly.compress_rate,
                          ly.layer_type, kind->compressed ? "tokens per compressed entry (>= 1)" : "0"));
  ly.sliding_window = group_int(L, grp, g, "sliding_window", 1);
  ly.softmax_scale = group_scale(L, grp, g, "softmax_scale");
  if (kind->indexer) {
    ly.index_topk = group_int(L, grp, g, "index_topk", 1);
    ly.index_softmax_scale = group_scale(L, grp, g, "index_softmax_scale");
  }
  return *kind;
}

// Refuses a dataset a layer of this type must not have (e.g. compressed_kv on a sliding layer).
void refuse_extra(Loader& L, const std::string& g, const Layer& ly, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (L.has(g + "/" + n))
      L.invalid(fmt::format("{}/{} on a {} layer: expected none (only {} layers have it)", g, n, ly.layer_type,
                            std::string(n).starts_with("compressed") ? "csa and hca" : "csa"));
}

// Values of the compressed entries: compressed_offsets from 0 to N non-decreasing with seq_len // compress_rate
// entries per sequence; each span [a, b) in [0, seq_len] with a < b; each RoPE position in [0, seq_len).
void check_entries(Loader& L, const std::string& g, const Dump& D, const Layer& ly, int64_t N) {
  const auto& o = ly.compressed_offsets;
  for (size_t s = 0; s + 1 < o.size(); ++s) {
    const int64_t len = D.seq_offsets[s + 1] - D.seq_offsets[s], want = len / ly.compress_rate;
    if (o[0] != 0 || o[s + 1] - o[s] != want)
      L.invalid(fmt::format("{}/compressed_offsets = [{}]: sequence {} ({} tokens) owns {} entries, expected {} "
                            "(one per complete window of compress_rate = {} tokens, from 0)",
                            g, fmt::join(o, ", "), s, len, o[s + 1] - o[s], want, ly.compress_rate));
  }
  if (o.back() != N)
    L.invalid(
        fmt::format("{}/compressed_offsets ends at {}, expected N = {} (the rows of compressed_kv)", g, o.back(), N));
  for (size_t s = 0; s + 1 < o.size(); ++s) {
    const int64_t len = D.seq_offsets[s + 1] - D.seq_offsets[s];
    for (int64_t w = o[s]; w < o[s + 1]; ++w) {
      const int64_t a = ly.compressed_span[2 * w], b = ly.compressed_span[2 * w + 1],
                    p = ly.compressed_rope_position[w];
      if (!(0 <= a && a < b && b <= len) || p < 0 || p >= len)
        L.invalid(fmt::format("{}: entry {} (sequence {}, {} tokens) has compressed_span [{}, {}) and "
                              "compressed_rope_position {}; expected 0 <= first < end <= {} and a position in [0, {})",
                              g, w, s, len, a, b, p, len, len));
    }
  }
}

// index_selected: each pick -1 (none) or an entry of the row's own sequence.
void check_selection(Loader& L, const std::string& g, const Dump& D, const Layer& ly) {
  const int64_t k = ly.index_topk;
  for (size_t i = 0; i < ly.q_rows.size(); ++i) {
    const int64_t t = ly.q_rows[i];
    const auto s = static_cast<size_t>(std::upper_bound(D.seq_offsets.begin(), D.seq_offsets.end(), t) -
                                       D.seq_offsets.begin() - 1);
    const int64_t entries = ly.compressed_offsets[s + 1] - ly.compressed_offsets[s];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t w = ly.index_selected[i * k + j];
      if (w < -1 || w >= entries)
        L.invalid(fmt::format("{}/index_selected[{}, {}] = {}: expected -1 (none) or an entry of the query row's "
                              "sequence {} in [0, {})",
                              g, i, j, w, s, entries));
    }
  }
}

}  // namespace

void read_v4_attrs(Loader& L, DumpAttrs& A) {
  A.head_dim = L.int_attr("head_dim", 2);
  A.qk_rope_head_dim = L.int_attr("qk_rope_head_dim", 2);
  if (A.qk_rope_head_dim % 2 != 0 || A.qk_rope_head_dim >= A.head_dim)
    L.invalid(fmt::format("root attribute 'qk_rope_head_dim' = {}: expected an even width below head_dim = {} (the "
                          "last columns of an entry, rotated in pairs)",
                          A.qk_rope_head_dim, A.head_dim));
}

const std::vector<const char*>& v4_attention_sets() {
  static const std::vector<const char*> sets = {"q_rows", "q", "rope_cos", "rope_sin", "attn_out", "sinks"};
  return sets;
}

void read_v4_layer_lists(Loader& L, const H5::H5File& file, Dump& D) {
  for (int li : D.file_layers) {
    const std::string n = layer_group(li) + "/compressed_kv";
    if (!L.has(n)) continue;
    const std::vector<hsize_t> d = h5::dims_of(file.openDataSet(n));
    if (!d.empty() && d[0] > 0) D.compressed_layers.push_back(li);
  }
}

void read_v4_layer(Loader& L, const H5::H5File& file, const Dump& D, Layer& ly, bool attention, bool data,
                   int64_t& Tq, int& tq_layer) {
  const int li = ly.index;
  const std::string g = layer_group(li);
  const LayerKind& kind = read_layer_attrs(L, file, ly);
  const DumpAttrs& A = D.attrs;
  const int64_t T = D.num_tokens(), Dh = A.head_dim, half = A.qk_rope_head_dim / 2, H = A.num_heads,
                S1 = D.num_seqs() + 1, c = A.index_head_dim;
  const auto f32 = [&](std::vector<float>& out, const char* n, const std::vector<int64_t>& shape, const char* why) {
    if (data)
      out = L.read_finite(g + "/" + n, shape, why, li);
    else
      L.open(g + "/" + n, DType::F32, shape, why);
  };
  const auto i64 = [&](std::vector<int64_t>& out, const char* n, const std::vector<int64_t>& shape, const char* why) {
    const H5::DataSet ds = L.open(g + "/" + n, DType::I64, shape, why);
    if (data) out = L.read<int64_t>(ds, g + "/" + n);
  };
  f32(ly.window_kv, "window_kv", {T, Dh}, "T from /tokens, head_dim");
  int64_t N = 0;
  if (kind.compressed) {
    N = static_cast<int64_t>(
        h5::dims_of(L.open(g + "/compressed_kv", DType::F32, {-1, Dh}, "N compressed entries, head_dim"))[0]);
    f32(ly.compressed_kv, "compressed_kv", {N, Dh}, "N compressed entries, head_dim");
    i64(ly.compressed_span, "compressed_span", {N, 2}, "N from compressed_kv, [first token, end)");
    i64(ly.compressed_rope_position, "compressed_rope_position", {N}, "N from compressed_kv");
    {  // read with the header too ([S+1]): the fit split of the entries is planned from it
      const std::string on = g + "/compressed_offsets";
      ly.compressed_offsets = L.read<int64_t>(L.open(on, DType::I64, {S1}, "S+1 from /seq_offsets"), on);
    }
    if (data) check_entries(L, g, D, ly, N);
  } else {
    refuse_extra(L, g, ly, {"compressed_kv", "compressed_span", "compressed_rope_position", "compressed_offsets"});
  }
  if (kind.indexer) {
    f32(ly.index_k, "index_k", {N, c}, "N from compressed_kv, index dim");
    ly.index_dim = c;
  } else {
    refuse_extra(L, g, ly, {"index_k", "index_q", "index_w", "index_selected"});
  }
  if (!attention) return;
  const std::string qn = g + "/q_rows";
  const H5::DataSet qd = Tq < 0 ? L.open(qn, DType::I32, {-1}, "Tq")
                                : L.open(qn, DType::I32, {Tq}, fmt::format("Tq of layer {:03d}", tq_layer));
  if (Tq < 0) {
    Tq = static_cast<int64_t>(h5::dims_of(qd)[0]);
    tq_layer = li;
    if (Tq == 0) L.invalid(fmt::format("layer {:03d}: {} is empty (Tq = 0)", li, qn));
  }
  if (data) {
    ly.q_rows = L.read<int32_t>(qd, qn);
    for (size_t i = 0; i < ly.q_rows.size(); ++i)
      if (ly.q_rows[i] < 0 || ly.q_rows[i] >= T)
        L.invalid(fmt::format("layer {:03d}: {}[{}] = {} is not a token index in [0, {})", li, qn, i, ly.q_rows[i], T));
  }
  f32(ly.q, "q", {Tq, H, Dh}, "Tq, num_heads, head_dim");
  f32(ly.rope_cos, "rope_cos", {Tq, half}, "Tq, qk_rope_head_dim / 2");
  f32(ly.rope_sin, "rope_sin", {Tq, half}, "Tq, qk_rope_head_dim / 2");
  f32(ly.attn_out, "attn_out", {Tq, H, Dh}, "Tq, num_heads, head_dim");
  f32(ly.sinks, "sinks", {H}, "num_heads");
  if (!kind.indexer) return;
  const std::vector<hsize_t> iq =
      h5::dims_of(L.open(g + "/index_q", DType::F32, {Tq, -1, c}, "Tq, index heads, index dim"));
  ly.index_heads = static_cast<int64_t>(iq[1]);
  f32(ly.index_q, "index_q", {Tq, ly.index_heads, c}, "Tq, index heads, index dim");
  f32(ly.index_w, "index_w", {Tq, ly.index_heads}, "Tq, index heads from index_q");
  i64(ly.index_selected, "index_selected", {Tq, ly.index_topk}, "Tq, index_topk");
  if (data) check_selection(L, g, D, ly);
}

std::string v4_entry_split_problem(const std::vector<Layer>& layers) {
  for (const Layer& l : layers) {
    const std::vector<int64_t>& o = l.compressed_offsets;
    if (o.empty() || o.back() == 0) continue;  // no entries: no cell
    try {
      (void)probes::fit_heldout_split(o, o.back());
    } catch (const std::invalid_argument&) {
      int64_t seqs = 0;
      for (size_t s = 0; s + 1 < o.size(); ++s) seqs += o[s + 1] > o[s];
      return fmt::format("layer {:03d} ({}) has {} compressed entr{} in {} sequence{}: no fit and held-out split "
                         "of them (latentq/split.h)",
                         l.index, l.layer_type, o.back(), o.back() == 1 ? "y" : "ies", seqs, seqs == 1 ? "" : "s");
    }
  }
  return "";
}

}  // namespace latentq::dumpio
