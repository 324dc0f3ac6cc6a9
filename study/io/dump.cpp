// Loader for `latentq-dump/1` files (see latentq/dump.h).
#include "latentq/dump.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "dump_loader.h"
#include "latentq/analysis/narrow.h"
#include "latentq/h5util.h"

namespace latentq {
namespace {

using dumpio::DType;
using dumpio::layer_group;
using dumpio::Loader;

const std::vector<const char*> kAttentionSets = {"q_rows", "q_nope", "q_pe", "w_uk", "w_uv", "attn_out"};

// The root attributes: the schema first, then the model's (softmax_scale checked finite, > 0 and
// in the float32 normal range).
void read_attrs(Loader& L, DumpAttrs& A) {
  {
    const H5::Attribute a = L.attr("schema", "\"latentq-dump/1\"");
    if (a.getTypeClass() != H5T_STRING)
      L.invalid("root attribute 'schema' is not a string (expected \"latentq-dump/1\")");
    L.single(a, "schema", "the string \"latentq-dump/1\"");
    const std::string schema = h5::read_string_attr(a);
    if (schema != kDumpSchema)
      L.invalid(fmt::format("root attribute 'schema' is \"{}\", expected \"{}\"", schema, kDumpSchema));
  }
  A.model = L.str_attr("model");
  A.revision = L.str_attr("revision");
  A.source = L.str_attr("source");
  A.rope_layout = L.str_attr("rope_layout");
  A.cache_family = L.has_attr("cache_family") ? L.str_attr("cache_family") : kCacheFamilies[0].name;
  try {
    (void)cache_family_traits(A.cache_family);
  } catch (const std::invalid_argument& e) {
    L.invalid(fmt::format("root attribute {}", e.what()));
  }
  A.original_dtype = L.str_attr("original_dtype");
  A.config_json = L.str_attr("config_json");
  A.num_layers = L.int_attr("num_layers", 1);
  A.num_heads = L.int_attr("num_heads", 1);
  if (A.v4()) {
    dumpio::read_v4_attrs(L, A);  // head_dim and qk_rope_head_dim instead of the MLA shapes
  } else {
    A.kv_lora_rank = L.int_attr("kv_lora_rank", 1);
    A.qk_rope_head_dim = L.int_attr("qk_rope_head_dim", 1);
    A.qk_nope_head_dim = L.int_attr("qk_nope_head_dim", 1);
    A.v_head_dim = L.int_attr("v_head_dim", 1);
  }
  A.softmax_scale = L.float_attr("softmax_scale");
  if (!(A.softmax_scale > 0) || !std::isfinite(A.softmax_scale))
    L.invalid(fmt::format("root attribute 'softmax_scale' = {}, expected a finite value > 0", A.softmax_scale));
  // Checked after the conversion too: the attention runs in float32, where 1e300 is inf (a NaN
  // attention) and 1e-50 is 0 (a uniform softmax).
  if (const std::string p = probes::narrowing_problem<float>(A.softmax_scale); !p.empty())
    L.invalid(
        fmt::format("root attribute 'softmax_scale' = {} {}; the attention runs in float32: expected a value "
                    "> 0 in the float32 normal range [{:.8g}, {:.8g}]",
                    A.softmax_scale, p, std::numeric_limits<float>::min(), std::numeric_limits<float>::max()));
}

// /tokens (not empty), /positions and /seq_offsets (0 to T, non-decreasing).
void read_token_arrays(Loader& L, Dump& D) {
  D.tokens = L.read<int32_t>(L.open("/tokens", DType::I32, {-1}, "T"), "/tokens");
  const int64_t T = D.num_tokens();
  if (T == 0) L.invalid("/tokens is empty (T = 0): the dump holds no tokens, every layer is empty");
  D.positions = L.read<int32_t>(L.open("/positions", DType::I32, {T}, "T from /tokens"), "/positions");
  D.seq_offsets = L.read<int64_t>(L.open("/seq_offsets", DType::I64, {-1}, "S+1"), "/seq_offsets");
  const auto& o = D.seq_offsets;
  bool ok = o.size() >= 2 && o.front() == 0 && o.back() == T;
  for (size_t i = 1; ok && i < o.size(); ++i) ok = o[i] >= o[i - 1];
  if (!ok) {
    const size_t show = std::min<size_t>(o.size(), 12);
    L.invalid(fmt::format("/seq_offsets must run from 0 to T = {} non-decreasing (at least 2 entries), got [{}{}]", T,
                          fmt::join(o.begin(), o.begin() + static_cast<std::ptrdiff_t>(show), ", "),
                          o.size() > show ? ", ..." : ""));
  }
}

// D.file_layers: the groups /layers/NNN, sorted, as many as the root attribute num_layers.
void read_layer_list(Loader& L, const H5::H5File& file, Dump& D) {
  if (!L.has("/layers")) L.invalid("missing group /layers");
  {
    const H5::Group g = file.openGroup("/layers");
    for (hsize_t i = 0; i < g.getNumObjs(); ++i) {
      const std::string name = g.getObjnameByIdx(i);
      const bool digits =
          name.size() == 3 && std::all_of(name.begin(), name.end(), [](unsigned char c) { return std::isdigit(c); });
      if (!digits) L.invalid(fmt::format("/layers/{} is not a layer name (expected 3 digits, e.g. 000)", name));
      if (g.getObjTypeByIdx(i) != H5G_GROUP) L.invalid(fmt::format("/layers/{} is not a group", name));
      D.file_layers.push_back(std::stoi(name));
    }
  }
  std::sort(D.file_layers.begin(), D.file_layers.end());
  if (static_cast<int64_t>(D.file_layers.size()) != D.attrs.num_layers)
    L.invalid(fmt::format("/layers holds {} layers, but the root attribute num_layers = {}", D.file_layers.size(),
                          D.attrs.num_layers));
}

// D.file_has_attention: the attention datasets are all present or all absent, the same in every layer.
void check_attention_sets(Loader& L, Dump& D) {
  int first_with = -1, first_without = -1;
  const std::vector<const char*>& sets = D.attrs.v4() ? dumpio::v4_attention_sets() : kAttentionSets;
  for (int li : D.file_layers) {
    std::vector<std::string> present, missing;
    for (const char* n : sets) (L.has(layer_group(li) + "/" + n) ? present : missing).emplace_back(n);
    if (!present.empty() && !missing.empty())
      L.invalid(fmt::format("layer {:03d}: attention datasets must be all present or all absent; has {} but not {}", li,
                            fmt::join(present, ", "), fmt::join(missing, ", ")));
    int& first = present.empty() ? first_without : first_with;
    if (first < 0) first = li;
  }
  if (first_with >= 0 && first_without >= 0)
    L.invalid(fmt::format("layer {:03d} has attention data but layer {:03d} has none", first_with, first_without));
  D.file_has_attention = first_with >= 0;
}

// D.attrs.index_head_dim: the width of every layer's indexer key cache (/layers/NNN/index_k [T, d]; DeepSeek-V4
// [N, d]), one for the whole file; 0 when no layer has one (dense MLA; a sparse dump whose layers share another's
// indexer).
void read_index_width(Loader& L, const H5::H5File& file, Dump& D) {
  int first = -1;
  for (int li : D.file_layers) {
    const std::string kn = layer_group(li) + "/index_k";
    if (!L.has(kn)) continue;
    const std::vector<hsize_t> d = h5::dims_of(file.openDataSet(kn));
    if (d.size() != 2 || d[1] == 0)
      L.invalid(fmt::format("{} has shape {}, expected [{}, index dim] with index dim >= 1", kn, h5::shape_str(d),
                            D.attrs.v4() ? "N" : "T"));
    const auto w = static_cast<int64_t>(d[1]);
    D.indexer_layers.push_back(li);
    if (first < 0) {
      first = li;
      D.attrs.index_head_dim = w;
    } else if (w != D.attrs.index_head_dim) {
      L.invalid(fmt::format("{} is {} wide but layer {:03d}'s index_k is {} wide (one indexer width per dump)", kn, w,
                            first, D.attrs.index_head_dim));
    }
  }
}

// The layers to load: opt.layers (sorted, distinct; every file layer when empty), each in the file.
std::vector<int> wanted_layers(const std::filesystem::path& path, const Dump& D, const LoadOptions& opt) {
  std::vector<int> want = opt.layers.empty() ? D.file_layers : opt.layers;
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  for (int li : want)
    if (!std::binary_search(D.file_layers.begin(), D.file_layers.end(), li))
      throw std::invalid_argument(fmt::format("{}: layer {} was requested but the file has layers [{}]", path.string(),
                                              li, fmt::join(D.file_layers, ", ")));
  return want;
}

// Reads (or only checks, without opt.data) the layers of a dump: each layer's latents against T and
// the root attributes, its attention datasets against Tq, the query count of the first layer read.
class LayerReader {
 public:
  LayerReader(Loader& L, const H5::H5File& file, const Dump& D)
      : L_(L),
        file_(file),
        T_(D.num_tokens()),
        H_(D.attrs.num_heads),
        r_(D.attrs.kv_lora_rank),
        dr_(D.attrs.qk_rope_head_dim),
        dn_(D.attrs.qk_nope_head_dim),
        dv_(D.attrs.v_head_dim),
        seq_offsets_(D.seq_offsets) {}

  // An empty layer gets its own message before the shape check against /tokens.
  void check_not_empty(int li) {
    const std::string g = layer_group(li);
    for (const char* n : {"c_kv", "k_pe"}) {
      const std::string name = g + "/" + n;
      if (L_.has(name)) {
        const H5::DataSet ds = file_.openDataSet(name);
        const auto d = h5::dims_of(ds);
        if (!d.empty() && d[0] == 0)
          L_.invalid(fmt::format("layer {:03d} is empty: {} has shape {} (T = 0)", li, name, h5::shape_str(d)));
      }
    }
  }

  // Shapes and dtypes only (read_layer() reads the values).
  void check_shapes(int li, bool attention) {
    const std::string g = layer_group(li);
    L_.open(g + "/c_kv", DType::F32, {T_, r_}, "T from /tokens, kv_lora_rank");
    L_.open(g + "/k_pe", DType::F32, {T_, dr_}, "T from /tokens, qk_rope_head_dim");
    if (!attention) return;
    const std::string qn = g + "/q_rows";
    const H5::DataSet q = Tq_ < 0 ? L_.open(qn, DType::I32, {-1}, "Tq")
                                  : L_.open(qn, DType::I32, {Tq_}, fmt::format("Tq of layer {:03d}", tq_layer_));
    if (Tq_ < 0) {
      Tq_ = static_cast<int64_t>(h5::dims_of(q)[0]);
      tq_layer_ = li;
      if (Tq_ == 0) L_.invalid(fmt::format("layer {:03d}: {} is empty (Tq = 0)", li, qn));
    }
    L_.open(g + "/q_nope", DType::F32, {Tq_, H_, dn_}, "Tq, num_heads, qk_nope_head_dim");
    L_.open(g + "/q_pe", DType::F32, {Tq_, H_, dr_}, "Tq, num_heads, qk_rope_head_dim");
    L_.open(g + "/w_uk", DType::F32, {H_, dn_, r_}, "num_heads, qk_nope_head_dim, kv_lora_rank");
    L_.open(g + "/w_uv", DType::F32, {H_, dv_, r_}, "num_heads, v_head_dim, kv_lora_rank");
    L_.open(g + "/attn_out", DType::F32, {Tq_, H_, dv_}, "Tq, num_heads, v_head_dim");
  }

  // The values, checked finite (q_rows: token indices in [0, T)).
  void read(Layer& ly, bool attention) {
    const int li = ly.index;
    const std::string g = layer_group(li);
    ly.c_kv = L_.read_finite(g + "/c_kv", {T_, r_}, "T from /tokens, kv_lora_rank", li);
    ly.k_pe = L_.read_finite(g + "/k_pe", {T_, dr_}, "T from /tokens, qk_rope_head_dim", li);
    if (!attention) return;
    const std::string qn = g + "/q_rows";
    if (Tq_ < 0) {
      ly.q_rows = L_.read<int32_t>(L_.open(qn, DType::I32, {-1}, "Tq"), qn);
      Tq_ = static_cast<int64_t>(ly.q_rows.size());
      tq_layer_ = li;
      if (Tq_ == 0) L_.invalid(fmt::format("layer {:03d}: {} is empty (Tq = 0)", li, qn));
    } else {
      ly.q_rows = L_.read<int32_t>(L_.open(qn, DType::I32, {Tq_}, fmt::format("Tq of layer {:03d}", tq_layer_)), qn);
    }
    for (size_t i = 0; i < ly.q_rows.size(); ++i)
      if (ly.q_rows[i] < 0 || ly.q_rows[i] >= T_)
        L_.invalid(
            fmt::format("layer {:03d}: {}[{}] = {} is not a token index in [0, {})", li, qn, i, ly.q_rows[i], T_));
    ly.q_nope = L_.read_finite(g + "/q_nope", {Tq_, H_, dn_}, "Tq, num_heads, qk_nope_head_dim", li);
    ly.q_pe = L_.read_finite(g + "/q_pe", {Tq_, H_, dr_}, "Tq, num_heads, qk_rope_head_dim", li);
    ly.w_uk = L_.read_finite(g + "/w_uk", {H_, dn_, r_}, "num_heads, qk_nope_head_dim, kv_lora_rank", li);
    ly.w_uv = L_.read_finite(g + "/w_uv", {H_, dv_, r_}, "num_heads, v_head_dim, kv_lora_rank", li);
    ly.attn_out = L_.read_finite(g + "/attn_out", {Tq_, H_, dv_}, "Tq, num_heads, v_head_dim", li);
    read_selection(ly, g);
  }

  // A sparse layer's own DSA indexer, when it has one: index_k [T, d], index_q [Tq, n, d], index_w [Tq, n] (all or
  // none) and the group attributes index_topk >= 1, index_softmax_scale > 0.
  void read_indexer(Layer& ly, const std::string& g) {
    const int li = ly.index;
    const std::string kn = g + "/index_k", qn = g + "/index_q", wn = g + "/index_w";
    const int present = L_.has(kn) + L_.has(qn) + L_.has(wn);
    if (present == 0) return;
    if (present != 3)
      L_.invalid(fmt::format("layer {:03d}: {}, {} and {} must be all present or all absent", li, kn, qn, wn));
    const std::vector<hsize_t> qd = h5::dims_of(L_.open(qn, DType::F32, {Tq_, -1, -1}, "Tq, index heads, index dim"));
    ly.index_heads = static_cast<int64_t>(qd[1]);
    ly.index_dim = static_cast<int64_t>(qd[2]);
    ly.index_q = L_.read_finite(qn, {Tq_, ly.index_heads, ly.index_dim}, "Tq, index heads, index dim", li);
    ly.index_k = L_.read_finite(kn, {T_, ly.index_dim}, "T from /tokens, index dim", li);
    ly.index_w = L_.read_finite(wn, {Tq_, ly.index_heads}, "Tq, index heads", li);
    const H5::Group grp = file_.openGroup(g);
    const auto attr = [&](const char* name, auto& out, const H5::PredType& t) {
      if (!grp.attrExists(name)) L_.invalid(fmt::format("layer {:03d}: {} has index_k but no attribute {}", li, g, name));
      grp.openAttribute(name).read(t, &out);
    };
    attr("index_topk", ly.index_topk, H5::PredType::NATIVE_INT64);
    attr("index_softmax_scale", ly.index_softmax_scale, H5::PredType::NATIVE_DOUBLE);
    if (ly.index_topk < 1 || !(std::isfinite(ly.index_softmax_scale) && ly.index_softmax_scale > 0))
      L_.invalid(fmt::format("layer {:03d}: index_topk {} (expected >= 1), index_softmax_scale {} (expected > 0)", li,
                             ly.index_topk, ly.index_softmax_scale));
  }

  // Sparse MLA's selection, when the layer has one: topk_offsets [Tq+1] from 0 to the length of topk_keys, each
  // row's keys strictly ascending in its causal window, at least one.
  void read_selection(Layer& ly, const std::string& g) {
    const int li = ly.index;
    const std::string on = g + "/topk_offsets", kn = g + "/topk_keys";
    if (L_.has(on) != L_.has(kn))
      L_.invalid(fmt::format("layer {:03d}: {} and {} must be both present or both absent", li, on, kn));
    if (!L_.has(on)) return;
    read_indexer(ly, g);
    ly.topk_offsets = L_.read<int64_t>(L_.open(on, DType::I64, {Tq_ + 1}, "Tq + 1"), on);
    ly.topk_keys = L_.read<int32_t>(L_.open(kn, DType::I32, {-1}, "the number of selected keys"), kn);
    const auto& off = ly.topk_offsets;
    if (off.front() != 0 || off.back() != static_cast<int64_t>(ly.topk_keys.size()))
      L_.invalid(fmt::format("layer {:03d}: {} runs from {} to {}; expected 0 to {} (the length of {})", li, on,
                             off.front(), off.back(), ly.topk_keys.size(), kn));
    for (int64_t i = 0; i < Tq_; ++i) {
      const int64_t t = ly.q_rows[i];
      const int64_t s0 = *(std::upper_bound(seq_offsets_.begin(), seq_offsets_.end(), t) - 1);
      if (off[i + 1] <= off[i])
        L_.invalid(fmt::format("layer {:03d}: query row {} selects no key ({}[{}] = {}, [{}] = {})", li, i, on, i,
                               off[i], i + 1, off[i + 1]));
      for (int64_t a = off[i]; a < off[i + 1]; ++a)
        if (ly.topk_keys[a] < 0 || ly.topk_keys[a] > t - s0 || (a > off[i] && ly.topk_keys[a] <= ly.topk_keys[a - 1]))
          L_.invalid(fmt::format("layer {:03d}: {}[{}] = {} (query row {}); expected strictly ascending keys of the "
                                 "row's causal window [0, {}]",
                                 li, kn, a, ly.topk_keys[a], i, t - s0));
    }
  }

 private:
  Loader& L_;
  const H5::H5File& file_;
  const int64_t T_, H_, r_, dr_, dn_, dv_;
  const std::vector<int64_t>& seq_offsets_;
  int64_t Tq_ = -1;    // the query count, of the first layer whose q_rows was opened
  int tq_layer_ = -1;  // that layer
};

Dump load(const std::filesystem::path& path, const H5::H5File& file, const LoadOptions& opt, Loader& L) {
  Dump D;
  D.path = path;
  read_attrs(L, D.attrs);
  read_token_arrays(L, D);
  read_layer_list(L, file, D);
  check_attention_sets(L, D);
  read_index_width(L, file, D);
  if (D.attrs.v4()) dumpio::read_v4_layer_lists(L, file, D);
  const std::vector<int> want = wanted_layers(path, D, opt);
  const bool attention = opt.attention && D.file_has_attention;
  LayerReader R(L, file, D);
  int64_t v4_tq = -1;
  int v4_tq_layer = -1;
  for (int li : want) {
    Layer ly;
    ly.index = li;
    if (D.attrs.v4()) {
      dumpio::read_v4_layer(L, file, D, ly, attention, opt.data, v4_tq, v4_tq_layer);
      D.layers.push_back(std::move(ly));
      continue;
    }
    R.check_not_empty(li);
    if (opt.data)
      R.read(ly, attention);
    else
      R.check_shapes(li, attention);
    D.layers.push_back(std::move(ly));
  }
  if (D.attrs.v4()) D.attrs.entry_split_problem = dumpio::v4_entry_split_problem(D.layers);
  return D;
}

}  // namespace

const CacheFamilyTraits& cache_family_traits(std::string_view name) {
  std::string names;
  for (const CacheFamilyTraits& f : kCacheFamilies) {
    if (name == f.name) return f;
    names += std::string(names.empty() ? "" : ", ") + f.name;
  }
  throw std::invalid_argument(fmt::format("unknown cache_family '{}', available: {}", name, names));
}

int64_t DumpAttrs::width(Target t) const {
  switch (t) {
    case Target::CKV:
      return kv_lora_rank;
    case Target::KPE:
      return qk_rope_head_dim;
    case Target::IndexK:
      return index_head_dim;
    case Target::WindowKV:
    case Target::CompressedKV:
      return head_dim;
  }
  throw std::logic_error(fmt::format("invalid Target {}", static_cast<int>(t)));
}

const std::vector<float>& Layer::rows(Target t) const {
  switch (t) {
    case Target::CKV:
      return c_kv;
    case Target::KPE:
      return k_pe;
    case Target::IndexK:
      return index_k;
    case Target::WindowKV:
      return window_kv;
    case Target::CompressedKV:
      return compressed_kv;
  }
  throw std::logic_error(fmt::format("invalid Target {}", static_cast<int>(t)));
}

const std::vector<int64_t>& Layer::row_offsets(Target t, const std::vector<int64_t>& seq_offsets) const {
  static const std::vector<int64_t> none;
  if (!v4() || !(t == Target::CompressedKV || t == Target::IndexK)) return seq_offsets;
  return compressed_offsets.empty() ? none : compressed_offsets;
}

int64_t Layer::num_rows(Target t, const std::vector<int64_t>& seq_offsets) const {
  const std::vector<int64_t>& o = row_offsets(t, seq_offsets);
  return o.empty() ? 0 : o.back();
}

bool Dump::holds(int index, Target target) const {
  if (!attrs.family().holds(target)) return false;
  const auto in = [index](const std::vector<int>& v) { return std::binary_search(v.begin(), v.end(), index); };
  if (attrs.v4()) {
    if (target == Target::WindowKV) return true;
    return in(compressed_layers) && (target == Target::CompressedKV || in(indexer_layers));
  }
  if (target != Target::IndexK) return true;
  return file_has_attention && in(indexer_layers);
}

const Layer& Dump::layer(int index) const {
  for (const Layer& l : layers)
    if (l.index == index) return l;
  throw std::invalid_argument(fmt::format("{}: layer {} was not loaded", path.string(), index));
}

Dump load_dump(const std::filesystem::path& path, const LoadOptions& options) {
  const std::lock_guard<std::recursive_mutex> lock(h5::library_mutex());  // HDF5 is not thread-safe here
  h5::quiet();
  const std::string p = path.string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw std::runtime_error(p + ": no such file");
  if (std::filesystem::is_directory(path, ec))
    throw std::runtime_error(p + ": is a directory, expected an HDF5 dump file");
  bool is_h5 = false;
  try {
    is_h5 = H5::H5File::isHdf5(p);
  } catch (const H5::Exception&) {
    is_h5 = false;
  }
  if (!is_h5) throw std::runtime_error(p + ": not an HDF5 file (expected a latentq-dump/1 file)");
  std::string where = "the file", stack;
  try {
    const H5::H5File file(p, H5F_ACC_RDONLY);
    Loader L(path, file);
    try {
      return load(path, file, options, L);
    } catch (const H5::Exception&) {
      where = L.where();
      stack = h5::error_stack();  // before the file's destructor makes HDF5 calls
      throw;
    }
  } catch (const H5::Exception& e) {
    if (stack.empty()) stack = h5::error_stack();
    throw std::runtime_error(fmt::format("{}: HDF5 error while reading {}: {}{}; the file may be truncated or corrupt",
                                         p, where, e.getDetailMsg(), stack.empty() ? "" : " (" + stack + ")"));
  }
}

}  // namespace latentq

namespace latentq {

std::vector<int> layers_without_query_rows(const std::filesystem::path& path, const std::vector<int>& layers) {
  const std::lock_guard<std::recursive_mutex> lock(h5::library_mutex());
  h5::quiet();
  const std::string p = path.string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw std::runtime_error(p + ": no such file");
  try {
    const H5::H5File file(p, H5F_ACC_RDONLY);
    std::vector<int> want = layers;
    if (want.empty() && h5::exists(file, "/layers")) {
      const H5::Group g = file.openGroup("/layers");
      for (hsize_t i = 0; i < g.getNumObjs(); ++i) {
        const std::string name = g.getObjnameByIdx(i);
        if (name.size() == 3 && std::all_of(name.begin(), name.end(), [](unsigned char c) { return std::isdigit(c); }))
          want.push_back(std::stoi(name));
      }
    }
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    std::vector<int> out;
    for (int li : want)
      if (!h5::exists(file, layer_group(li) + "/q_rows")) out.push_back(li);
    return out;
  } catch (const H5::Exception& e) {
    throw std::runtime_error(fmt::format("{}: HDF5 error while looking for the query rows of its layers: {}; the file "
                                         "may not be HDF5, or be truncated or corrupt",
                                         p, e.getDetailMsg()));
  }
}

Layer read_layer(const Dump& header, int index, bool attention) {
  LoadOptions o;
  o.layers = {index};
  o.attention = attention;
  Dump d = load_dump(header.path, o);
  if (d.num_tokens() != header.num_tokens() || d.seq_offsets != header.seq_offsets)
    throw std::invalid_argument(
        fmt::format("{}: the file changed while it was read (tokens or seq_offsets differ)", header.path.string()));
  return std::move(d.layers.front());
}

void validate_layers(const Dump& header, bool attention, const std::function<void(size_t, size_t)>& progress) {
  const size_t n = header.layers.size();
  for (size_t i = 0; i < n; ++i) {
    (void)read_layer(header, header.layers[i].index, attention);
    if (progress) progress(i + 1, n);
  }
}

}  // namespace latentq
