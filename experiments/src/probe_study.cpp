// The probe groups of `latentq run` as cells (latentq/probe_study.h).
#include "latentq/probe_study.h"
#include "latentq/util.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>

#include "latentq/probes/attention.h"
#include "latentq/probes/cross_layer.h"
#include "latentq/probes/split.h"
#include "latentq/probes/svd_probe.h"
#include "latentq/decode_order.h"
#include "latentq/quantize.h"
#include "latentq/transform.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace latentq {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kEnergyFractions[] = {0.9, 0.99, 0.999};

std::vector<int> loaded_layers(const Dump& dump) {
  std::vector<int> out;
  for (const Layer& l : dump.layers) out.push_back(l.index);
  return out;
}

double mean_finite(const std::vector<double>& v) {
  double s = 0;
  size_t n = 0;
  for (double x : v)
    if (std::isfinite(x)) s += x, ++n;
  return n ? s / static_cast<double>(n) : kNaN;
}

// The probes' OpenMP loops run with one thread on the calling thread while this lives (cells are
// parallelized across cells instead; the values do not depend on it).
class OmpSingleThread {
 public:
#ifdef _OPENMP
  OmpSingleThread() : old_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OmpSingleThread() { omp_set_num_threads(old_); }

 private:
  int old_;
#else
  OmpSingleThread() {}
#endif
};

}  // namespace

// ---- keys ------------------------------------------------------------------------------------------

std::string SvdCell::key() const { return fmt::format("{:03d}/svd", layer); }
std::string CrossLayerCell::key() const { return fmt::format("{:03d}-{:03d}/cross_layer", layer_a, layer_b); }
std::string SharingCell::key() const {
  return fmt::format("w{}-{:03d}/cross_layer_sharing", window, layers.empty() ? 0 : layers.front());
}
std::string AttentionCheckCell::key() const { return fmt::format("{:03d}/attention_check", layer); }
std::string AttentionCell::key() const { return fmt::format("{:03d}/{}/{}/attention_error", layer, targets, quantizer); }
std::string AttentionPositionCell::key() const {
  return fmt::format("{:03d}/{}/{}/attention_position", layer, targets, quantizer);
}

std::string cell_key(const ProbeCell& c) {
  return std::visit([](const auto& x) { return x.key(); }, c);
}
std::vector<std::string> cell_groups(const ProbeCell& c) {
  return std::visit([](const auto& x) { return x.groups(); }, c);
}

// ---- plans -------------------------------------------------------------------------------------------

namespace {

// What the fit split of a dump supports (probes::fit_heldout_split, probes::max_fit_rank).
struct FitLimit {
  int64_t tokens = 0;    // fit tokens
  int64_t max_rank = 0;  // the largest rank they determine
  int64_t seqs = 0;      // non-empty sequences of the dump
};
FitLimit fit_limit(const Dump& dump, bool centered) {
  FitLimit f;
  try {
    f.tokens = probes::fit_heldout_split(dump.seq_offsets, dump.num_tokens()).fit_tokens();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {}", dump.path.string(), e.what()));
  }
  f.max_rank = probes::max_fit_rank(f.tokens, centered);
  for (size_t s = 0; s + 1 < dump.seq_offsets.size(); ++s) f.seqs += dump.seq_offsets[s + 1] > dump.seq_offsets[s];
  return f;
}
std::string fit_split_words(const Dump& dump, const FitLimit& f) {
  return fmt::format("the fit split of {} has {} token{} ({})", dump.path.string(), f.tokens, f.tokens == 1 ? "" : "s",
                     f.seqs == 1 ? "the first half of its only non-empty sequence"
                                 : fmt::format("the first {} of its {} non-empty sequences", f.seqs / 2, f.seqs));
}
std::string fit_words(const Dump& dump, const FitLimit& f, bool centered) {
  return fmt::format("{}, which determine ranks up to {}{}", fit_split_words(dump, f), f.max_rank,
                     centered ? " (centered: one fewer than the tokens)" : "");
}

// The automatic ranks before capping.
std::vector<int64_t> auto_sharing_ranks(int64_t r, int64_t w) {
  std::vector<int64_t> out;
  for (int64_t f : {8, 4, 2}) {
    const int64_t k = std::max(w, (w * r / f) / w * w);
    if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  }
  std::sort(out.begin(), out.end());
  return out;
}
// Each rank capped at `cap` (> 0), duplicates removed, ascending.
std::vector<int64_t> capped(std::vector<int64_t> ranks, int64_t cap) {
  for (int64_t& k : ranks) k = std::min(k, cap);
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

}  // namespace

std::vector<int64_t> svd_ranks(const StudyConfig& config, const Dump& dump) {
  const int64_t r = dump.attrs.kv_lora_rank;
  const bool centered = config.probes.svd.centered;
  const FitLimit f = fit_limit(dump, centered);
  if (config.probes.svd.ranks.empty()) {
    if (f.max_rank < 1)
      throw std::invalid_argument(fmt::format("{}: [svd]: {}: no SVD rank can be fit (disable [svd] or use a dump with "
                                              "more tokens)",
                                              config.source, fit_words(dump, f, centered)));
    return capped(probes::default_svd_ranks(r), f.max_rank);
  }
  for (int64_t k : config.probes.svd.ranks) {
    if (k > r)
      throw std::invalid_argument(fmt::format("{}: [svd] ranks: rank {} is larger than kv_lora_rank {} of the dump "
                                              "(SVD ranks must be 1 .. kv_lora_rank)",
                                              config.source, k, r));
    if (k > f.max_rank)
      throw std::invalid_argument(fmt::format("{}: [svd] ranks: rank {} needs {} fit tokens, but {}", config.source, k,
                                              k + (centered ? 1 : 0), fit_words(dump, f, centered)));
  }
  return config.probes.svd.ranks;
}

std::vector<int64_t> sharing_ranks(const StudyConfig& config, const Dump& dump, int64_t w) {
  const int64_t r = dump.attrs.kv_lora_rank;
  const bool centered = config.probes.cross_layer.centered;
  const FitLimit f = fit_limit(dump, centered);
  const int64_t cap = f.max_rank / w * w;  // the largest multiple of w the fit split determines
  if (config.probes.cross_layer.ranks.empty()) {
    if (cap < w)
      throw std::invalid_argument(fmt::format("{}: [cross_layer]: window {}: {}: no multiple of {} can be fit (disable "
                                              "[cross_layer] or use a dump with more tokens)",
                                              config.source, w, fit_words(dump, f, centered), w));
    return capped(auto_sharing_ranks(r, w), cap);
  }
  for (int64_t k : config.probes.cross_layer.ranks) {
    if (k > w * r)
      throw std::invalid_argument(fmt::format("{}: [cross_layer] ranks: rank {} is larger than window {} x kv_lora_rank "
                                              "{} = {} of the dump",
                                              config.source, k, w, r, w * r));
    if (k > f.max_rank)
      throw std::invalid_argument(fmt::format("{}: [cross_layer] ranks: rank {} needs {} fit tokens, but {}",
                                              config.source, k, k + (centered ? 1 : 0), fit_words(dump, f, centered)));
  }
  return config.probes.cross_layer.ranks;
}

std::vector<std::string> rank_cap_warnings(const StudyConfig& config, const Dump& dump) {
  const int64_t r = dump.attrs.kv_lora_rank;
  std::vector<std::string> parts;
  const bool svd_used = config.probes.svd.enabled || (config.probes.attention.enabled && config.probes.attention.svd &&
                                                      attention_unavailable_reason(dump).empty());
  if (svd_used && config.probes.svd.ranks.empty()) {
    const std::vector<int64_t> full = probes::default_svd_ranks(r), used = svd_ranks(config, dump);
    if (used != full)
      parts.push_back(fmt::format("[svd] ranks {} instead of {}", fmt::join(used, ", "), fmt::join(full, ", ")));
  }
  if (config.probes.cross_layer.enabled && config.probes.cross_layer.ranks.empty()) {
    const size_t studied = dump.layers.size();
    for (int64_t w : config.probes.cross_layer.windows) {
      if (w < 1 || static_cast<size_t>(w) > studied) continue;  // no cell: nothing capped
      const std::vector<int64_t> full = auto_sharing_ranks(r, w), used = sharing_ranks(config, dump, w);
      if (used != full)
        parts.push_back(fmt::format("[cross_layer] window {} ranks {} instead of {}", w, fmt::join(used, ", "),
                                    fmt::join(full, ", ")));
    }
  }
  if (parts.empty()) return {};
  return {fmt::format("{}: automatic ranks capped at what the fit split determines ({}): {}; give the ranks "
                      "explicitly to choose others",
                      config.source, fit_split_words(dump, fit_limit(dump, false)), fmt::join(parts, "; "))};
}

std::vector<SvdCell> plan_svd_cells(const StudyConfig& config, const Dump& dump) {
  std::vector<SvdCell> cells;
  if (!config.probes.svd.enabled) return cells;
  svd_ranks(config, dump);
  for (int l : loaded_layers(dump)) cells.push_back({l});
  return cells;
}

std::vector<CrossLayerCell> plan_cross_layer_cells(const StudyConfig& config, const Dump& dump) {
  std::vector<CrossLayerCell> cells;
  const CrossLayerSettings& s = config.probes.cross_layer;
  if (!s.enabled) return cells;
  const std::vector<int> L = loaded_layers(dump);
  const bool all = s.pairs == PairSelection::All || (s.pairs == PairSelection::Auto && L.size() <= 16);
  for (size_t i = 0; i < L.size(); ++i)
    for (size_t j = i + 1; j < L.size(); ++j)
      if (all || j == i + 1) cells.push_back({L[i], L[j]});
  return cells;
}

std::vector<SharingCell> plan_sharing_cells(const StudyConfig& config, const Dump& dump) {
  std::vector<SharingCell> cells;
  const CrossLayerSettings& s = config.probes.cross_layer;
  if (!s.enabled) return cells;
  const std::vector<int> L = loaded_layers(dump);
  for (int64_t w : s.windows) {
    if (static_cast<size_t>(w) <= L.size()) sharing_ranks(config, dump, w);  // a window without cells takes no rank
    for (size_t i = 0; i + static_cast<size_t>(w) <= L.size(); ++i)
      cells.push_back({static_cast<int>(w), std::vector<int>(L.begin() + static_cast<ptrdiff_t>(i),
                                                             L.begin() + static_cast<ptrdiff_t>(i) + w)});
  }
  return cells;
}

probes::AttentionQueries attention_queries(const Dump& dump, const Layer& l) {
  const DumpAttrs& A = dump.attrs;
  probes::AttentionQueries q;
  q.dims = {A.num_heads, A.kv_lora_rank, A.qk_nope_head_dim, A.qk_rope_head_dim, A.v_head_dim};
  q.num_tokens = dump.num_tokens();
  q.seq_offsets = dump.seq_offsets;
  q.q_rows = l.q_rows;
  q.q_nope = l.q_nope;
  q.q_pe = l.q_pe;
  q.w_uk = l.w_uk;
  q.w_uv = l.w_uv;
  q.softmax_scale = A.softmax_scale;
  return q;
}

std::string attention_unavailable_reason(const Dump& dump) {
  if (dump.layers.empty()) return fmt::format("{}: no layer loaded", dump.path.string());
  const Layer& l = dump.layers.front();
  if (l.has_attention()) return "";
  if (dump.file_has_attention) return fmt::format("{}: the attention datasets were not loaded", dump.path.string());
  return fmt::format("{} has no dataset /layers/{:03d}/q_rows (nor q_nope, q_pe, w_uk, w_uv, attn_out): a latent-only "
                     "dump",
                     dump.path.string(), l.index);
}

std::vector<AttentionCheckCell> plan_attention_check_cells(const StudyConfig& config, const Dump& dump) {
  std::vector<AttentionCheckCell> cells;
  if (!config.probes.attention.enabled || !attention_unavailable_reason(dump).empty()) return cells;
  for (int l : loaded_layers(dump)) cells.push_back({l});
  return cells;
}

std::vector<AttentionCell> plan_attention_cells(const StudyConfig& config, const Dump& dump) {
  std::vector<AttentionCell> cells;
  const AttentionSettings& s = config.probes.attention;
  if (!s.enabled || !attention_unavailable_reason(dump).empty()) return cells;
  const std::vector<int64_t> ranks = s.svd ? svd_ranks(config, dump) : std::vector<int64_t>{};
  const std::vector<Quantizer> qs = config.all_quantizers();
  auto ran = [&](Target t, const Quantizer& q) {
    const TargetPlan* p = config.plan(t);
    return p && std::any_of(p->quantizers.begin(), p->quantizers.end(), [&](const Quantizer& x) { return x.name == q.name; });
  };
  for (int l : loaded_layers(dump)) {
    for (const std::string& tg : s.targets) {
      const bool ckv = tg != "k_pe", kpe = tg != "c_kv";
      for (const Quantizer& q : qs)
        if ((!ckv || ran(Target::CKV, q)) && (!kpe || ran(Target::KPE, q))) {
          AttentionCell c{l, tg, q.name, ckv ? q.spec_for(l, Target::CKV) : q.spec_for(l, Target::KPE), 0};
          if (q.is_mixed() && ckv && kpe) c.spec_kpe = q.spec_for(l, Target::KPE);
          c.transform = q.transform;
          cells.push_back(std::move(c));
        }
    }
    for (int64_t k : ranks) cells.push_back({l, "c_kv", fmt::format("svd-rank{}", k), QuantSpec{}, k});
  }
  return cells;
}

std::vector<AttentionPositionCell> plan_attention_position_cells(const StudyConfig& config, const Dump& dump) {
  std::vector<AttentionPositionCell> cells;
  const DecodeOrderSettings& s = config.probes.decode_order;
  if (!s.enabled || !attention_unavailable_reason(dump).empty()) return cells;
  for (int l : loaded_layers(dump))
    for (const std::string& tg : s.targets)
      for (const std::string& q : s.quantizers) cells.push_back({l, tg, q});
  return cells;
}

Attrs decode_order_attrs(const StudyConfig& config) {
  const DecodeOrderSettings& s = config.probes.decode_order;
  if (!s.enabled) return {};
  std::vector<std::string> modes;
  for (const DecodeOrder& o : s.modes()) modes.push_back(o.label());
  return {{"decode_order_modes", modes},
          {"decode_order_quantizers", s.quantizers},
          {"decode_order_position_bucket", s.position_bucket}};
}

// ---- columns -----------------------------------------------------------------------------------------

namespace {

enum class ColType { I64, F64, Str };
using Schema = std::vector<std::pair<std::string, ColType>>;

const std::map<std::string, Schema>& schemas() {
  using enum ColType;
  static const std::map<std::string, Schema> s = {
      {"svd",
       {{"layer", I64}, {"rank", I64}, {"centered", I64}, {"fit_tokens", I64}, {"heldout_tokens", I64},
        {"heldout_rel_fro", F64}, {"fit_rel_fro", F64}, {"fit_energy", F64}, {"rank_90", I64}, {"rank_99", I64},
        {"rank_999", I64}}},
      {"svd_spectrum", {{"layer", I64}, {"index", I64}, {"singular_value", F64}}},
      {"cross_layer",
       {{"layer_a", I64}, {"layer_b", I64}, {"mean_abs_pearson", F64}, {"pearson_channels", I64},
        {"constant_channels", I64}, {"cka", F64}}},
      {"cross_layer_sharing",
       {{"window_start", I64}, {"window", I64}, {"rank", I64}, {"shared_heldout_rel_fro", F64},
        {"per_layer_heldout_rel_fro", F64}, {"shared_fit_rel_fro", F64}, {"per_layer_fit_rel_fro", F64}}},
      {"attention_check",
       {{"layer", I64}, {"ref_vs_dump_rel_fro", F64}, {"tq", I64}, {"keys", I64}, {"fold_rel_fro", F64},
        {"fold_transforms", Str}}},
      {"attention_error",
       {{"layer", I64}, {"quantizer", Str}, {"targets", Str}, {"out_rel_fro", F64}, {"cos_mean", F64},
        {"kl_mean", F64}, {"top1_agree", F64}, {"top8_agree", F64}, {"bits_per_element_c_kv", F64},
        {"bytes_per_token_layer", F64}}},
      {"attention_position",
       {{"layer", I64}, {"targets", Str}, {"quantizer", Str}, {"cache_mode", Str}, {"residual", I64}, {"sink", I64},
        {"prefill", I64}, {"scale_causal", I64}, {"pos_start", I64}, {"pos_end", I64}, {"queries", I64},
        {"quantized_key_frac", F64}, {"kl_mean", F64}, {"out_rel_fro", F64}, {"bytes_per_token", F64}}},
  };
  return s;
}

const Schema& schema(const std::string& group) {
  const auto it = schemas().find(group);
  if (it == schemas().end()) throw std::invalid_argument(fmt::format("'{}' is not a probe group", group));
  return it->second;
}

// Appends one row: values in column order (int64_t, double or std::string each).
using Value = std::variant<int64_t, double, std::string>;
void add_row(ColumnTable& t, const std::vector<Value>& values) {
  const auto& cols = t.columns();
  if (values.size() != cols.size()) throw std::logic_error("add_row: wrong number of values");
  size_t i = 0;
  for (const auto& [name, col] : cols) {
    Column& c = t.at(name);
    const Value& v = values[i++];
    switch (c.index()) {
      case 0: std::get<0>(c).push_back(std::get<int64_t>(v)); break;
      case 1: std::get<1>(c).push_back(std::get<double>(v)); break;
      default: std::get<2>(c).push_back(std::get<std::string>(v)); break;
    }
  }
}

}  // namespace

const std::vector<std::string>& probe_groups() {
  static const std::vector<std::string> g = {"svd",
                                             "svd_spectrum",
                                             "cross_layer",
                                             "cross_layer_sharing",
                                             "attention_check",
                                             "attention_error",
                                             "attention_position"};
  return g;
}

const std::vector<std::string>& probe_columns(const std::string& group) {
  static const std::map<std::string, std::vector<std::string>> names = [] {
    std::map<std::string, std::vector<std::string>> m;
    for (const auto& [g, s] : schemas())
      for (const auto& [n, t] : s) m[g].push_back(n);
    return m;
  }();
  schema(group);  // throws for an unknown group
  return names.at(group);
}

ColumnTable empty_probe_table(const std::string& group) {
  ColumnTable t;
  for (const auto& [name, type] : schema(group)) {
    switch (type) {
      case ColType::I64: t.add<int64_t>(name); break;
      case ColType::F64: t.add<double>(name); break;
      case ColType::Str: t.add<std::string>(name); break;
    }
  }
  return t;
}

// ---- the runner -----------------------------------------------------------------------------------------

struct ProbeRunner::Impl {
  const StudyConfig config;                   // a copy: tasks may outlive the caller's config
  const std::shared_ptr<const Dump> owner;    // keeps the dump alive when given as a shared_ptr
  const Dump& dump;

  struct AttentionEntry {
    std::once_flag once;
    std::unique_ptr<probes::AbsorbedAttention<float>> att;
    probes::AttentionResult<float> ref;
    probes::AttentionQueries queries;  // views into the dump's layer (the fold check rotates copies)
    // The bf16 reads of the targets an /attention_error cell does not quantize, and bf16(c_kv)'s partial
    // scores (every cell that quantizes k_pe only reads them): once per layer, on first use.
    std::once_flag bf16_once;
    std::vector<float> ckv_bf16, kpe_bf16;
    double bytes_ckv_bf16 = 0, bytes_kpe_bf16 = 0;
    probes::AbsorbedAttention<float>::CkvScores ckv_bf16_scores;
  };
  // The /attention_error cells of one (layer, quantizer) in the plan: the first of them to run computes
  // the rows of all (one quantization per target, shared partial scores: AbsorbedAttention::run_variants);
  // the others take theirs. A row is a deterministic function of its cell, so this changes no value.
  struct ErrorGroup {
    std::once_flag once;
    std::vector<AttentionCell> cells;
    std::map<std::string, ColumnTable> rows;           // by cell key
    std::map<std::string, std::exception_ptr> errors;  // by cell key
  };
  std::once_flag groups_once;
  std::map<std::string, ErrorGroup> error_groups;  // "<layer>/<quantizer>"
  struct BasisEntry {
    std::once_flag once;
    probes::SvdBasis basis;
  };
  // One entry per loaded layer, created up front (map nodes never move; only the entries' contents
  // are filled, each once).
  std::map<int, AttentionEntry> attention;
  std::map<int, BasisEntry> basis;

  Impl(const StudyConfig& c, std::shared_ptr<const Dump> o, const Dump& d) : config(c), owner(std::move(o)), dump(d) {
    for (const Layer& l : d.layers) {
      attention[l.index];
      basis[l.index];
    }
  }

  template <class M>
  auto& entry(M& m, int layer) const {
    const auto it = m.find(layer);
    if (it == m.end()) throw std::invalid_argument(fmt::format("layer {} is not loaded", layer));
    return it->second;
  }

  const AttentionEntry& attention_of(int layer) {
    AttentionEntry& e = entry(attention, layer);
    std::call_once(e.once, [&] {
      const Layer& l = dump.layer(layer);
      if (const std::string why = attention_unavailable_reason(dump); !why.empty()) throw std::invalid_argument(why);
      const probes::AttentionQueries q = attention_queries(dump, l);
      auto att = std::make_unique<probes::AbsorbedAttention<float>>(q);
      e.queries = q;
      e.ref = att->run(l.c_kv, l.k_pe, true);
      e.att = std::move(att);
    });
    return e;
  }

  // The rotation of transform t for one layer's target (KLT fitted on its fit split); identity for None.
  Rotation rotation_of(int layer, Target target, const Transform& t) const {
    if (t.kind == TransformKind::None) return {};
    const Layer& l = dump.layer(layer);
    const bool ckv = target == Target::CKV;
    return probes::fit_rotation(t, ckv ? l.c_kv.data() : l.k_pe.data(), dump.num_tokens(),
                                ckv ? dump.attrs.kv_lora_rank : dump.attrs.qk_rope_head_dim, dump.seq_offsets);
  }

  const probes::SvdBasis& basis_of(int layer) {
    BasisEntry& e = entry(basis, layer);
    std::call_once(e.once, [&] {
      const int64_t T = dump.num_tokens();
      const probes::TokenSplit split = probes::fit_heldout_split(dump.seq_offsets, T);
      e.basis = probes::fit_svd_basis(dump.layer(layer).c_kv.data(), T, dump.attrs.kv_lora_rank, split.fit,
                                      config.probes.svd.centered);
    });
    return e.basis;
  }

  std::vector<ColumnTable> run(const SvdCell& c) {
    probes::SvdProbeOptions opt;
    opt.centered = config.probes.svd.centered;
    opt.ranks = svd_ranks(config, dump);
    opt.energy_fractions.assign(std::begin(kEnergyFractions), std::end(kEnergyFractions));
    const probes::SvdProbeResult p = probes::svd_probe(dump.layer(c.layer).c_kv.data(), dump.num_tokens(),
                                                       dump.attrs.kv_lora_rank, dump.seq_offsets, opt);
    ColumnTable t = empty_probe_table("svd"), s = empty_probe_table("svd_spectrum");
    for (const probes::SvdRankError& e : p.ranks)
      add_row(t, {int64_t{c.layer}, e.rank, int64_t{p.centered ? 1 : 0}, p.fit_tokens, p.heldout_tokens,
                  e.heldout_rel_fro, e.fit_rel_fro, e.fit_energy, p.energy_ranks[0], p.energy_ranks[1],
                  p.energy_ranks[2]});
    for (int64_t i = 0; i < p.basis.singular_values.size(); ++i)
      add_row(s, {int64_t{c.layer}, i, p.basis.singular_values[i]});
    return {std::move(t), std::move(s)};
  }

  std::vector<ColumnTable> run(const CrossLayerCell& c) {
    ColumnTable t = empty_probe_table("cross_layer");
    const probes::CrossLayerPair p =
        probes::cross_layer_pair(dump.layer(c.layer_a).c_kv.data(), dump.layer(c.layer_b).c_kv.data(),
                                 dump.num_tokens(), dump.attrs.kv_lora_rank);
    add_row(t, {int64_t{c.layer_a}, int64_t{c.layer_b}, p.pearson_mean_abs, p.pearson_channels, p.constant_channels,
                p.cka_linear});
    return {std::move(t)};
  }

  std::vector<ColumnTable> run(const SharingCell& c) {
    ColumnTable t = empty_probe_table("cross_layer_sharing");
    const std::vector<int64_t> ranks = sharing_ranks(config, dump, c.window);
    std::vector<const float*> ptrs;
    for (int l : c.layers) ptrs.push_back(dump.layer(l).c_kv.data());
    for (const probes::SharedBasisResult& x :
         probes::shared_basis_probe(ptrs, dump.num_tokens(), dump.attrs.kv_lora_rank, dump.seq_offsets, ranks,
                                    config.probes.cross_layer.centered))
      add_row(t, {int64_t{c.layers.front()}, int64_t{c.window}, x.rank, x.shared_heldout_rel_fro,
                  x.per_layer_heldout_rel_fro, x.shared_fit_rel_fro, x.per_layer_fit_rel_fro});
    return {std::move(t)};
  }

  std::vector<ColumnTable> run(const AttentionCheckCell& c) {
    ColumnTable t = empty_probe_table("attention_check");
    const AttentionEntry& e = attention_of(c.layer);
    const std::vector<float>& dumped = dump.layer(c.layer).attn_out;
    double err2 = 0, ref2 = 0;
    for (size_t j = 0; j < e.ref.out.size(); ++j) {
      const double d = static_cast<double>(e.ref.out[j]) - static_cast<double>(dumped[j]);
      err2 += d * d;
      ref2 += static_cast<double>(dumped[j]) * static_cast<double>(dumped[j]);
    }
    const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    // The fold check (issue 11): every transform of the study (rot when it has none), folded into
    // W_UK, W_UV and q_pe, must reproduce the unrotated attention to kFoldTolerance; else the cell fails.
    std::vector<Transform> transforms;
    for (const Quantizer& q : config.all_quantizers())
      if (q.transform.kind != TransformKind::None &&
          std::find(transforms.begin(), transforms.end(), q.transform) == transforms.end())
        transforms.push_back(q.transform);
    if (transforms.empty()) transforms.push_back(Transform::parse("rot"));
    const Layer& l = dump.layer(c.layer);
    double fold = 0;
    std::string names;
    for (const Transform& tr : transforms) {
      const probes::FoldCheck f = probes::require_fold_exact(
          e.queries, l.c_kv, l.k_pe, rotation_of(c.layer, Target::CKV, tr), rotation_of(c.layer, Target::KPE, tr),
          fmt::format("layer {}, transform {}", c.layer, tr.to_string()));
      fold = std::max(fold, f.out_rel_fro);
      if (!names.empty()) names += ';';
      names += tr.to_string();
    }
    add_row(t, {int64_t{c.layer}, rel, e.ref.num_queries,
                std::accumulate(e.ref.nkeys.begin(), e.ref.nkeys.end(), int64_t{0}), fold, names});
    return {std::move(t)};
  }

  static bool same_cell(const AttentionCell& a, const AttentionCell& b) {
    return a.layer == b.layer && a.targets == b.targets && a.quantizer == b.quantizer && a.spec == b.spec &&
           a.svd_rank == b.svd_rank && a.spec_kpe == b.spec_kpe && a.transform == b.transform;
  }

  // The plan's group of cell c, or null (an SVD cell, a cell the plan does not hold, a plan that fails).
  ErrorGroup* group_of(const AttentionCell& c) {
    std::call_once(groups_once, [&] {
      try {
        for (const AttentionCell& x : plan_attention_cells(config, dump))
          if (x.svd_rank == 0) error_groups[fmt::format("{}/{}", x.layer, x.quantizer)].cells.push_back(x);
      } catch (const std::exception&) {
        error_groups.clear();  // every cell computes alone (and reports its own error)
      }
    });
    if (c.svd_rank > 0) return nullptr;
    const auto it = error_groups.find(fmt::format("{}/{}", c.layer, c.quantizer));
    if (it == error_groups.end()) return nullptr;
    for (const AttentionCell& x : it->second.cells)
      if (same_cell(x, c)) return &it->second;
    return nullptr;
  }

  const AttentionEntry& bf16_of(int layer) {
    attention_of(layer);
    AttentionEntry& e = entry(attention, layer);
    std::call_once(e.bf16_once, [&] {
      static const QuantSpec kBf16 = QuantSpec::parse("bf16");
      const Layer& l = dump.layer(layer);
      const int64_t T = dump.num_tokens();
      e.ckv_bf16.resize(l.c_kv.size());
      e.kpe_bf16.resize(l.k_pe.size());
      e.bytes_ckv_bf16 = account(quantize_dequantize_rotated(kBf16, Rotation{}, Target::CKV, l.c_kv.data(), T,
                                                             dump.attrs.kv_lora_rank, dump.seq_offsets, e.ckv_bf16.data()))
                             .bytes_per_token;
      e.bytes_kpe_bf16 = account(quantize_dequantize_rotated(kBf16, Rotation{}, Target::KPE, l.k_pe.data(), T,
                                                             dump.attrs.qk_rope_head_dim, dump.seq_offsets,
                                                             e.kpe_bf16.data()))
                             .bytes_per_token;
      e.ckv_bf16_scores = e.att->ckv_scores(e.ckv_bf16);
    });
    return e;
  }

  // All cells of a group: one quantized store per (target, spec), the bf16 stores of the layer, one
  // run_variants. A cell whose quantization or metrics fail records its own error; when the shared
  // attention itself fails, the cells compute alone (run_alone), so each reports its own error.
  void compute_group(ErrorGroup& g) {
    const int layer = g.cells.front().layer;
    const AttentionEntry& e = bf16_of(layer);
    const Layer& l = dump.layer(layer);
    const int64_t T = dump.num_tokens(), r = dump.attrs.kv_lora_rank, rope = dump.attrs.qk_rope_head_dim;
    struct Store {
      std::vector<float> x;
      Accounting a{};
      std::exception_ptr error;
    };
    std::map<std::string, Store> stores;  // "<target>/<spec>"
    const auto store = [&](Target t, const QuantSpec& spec, const Transform& tr) -> Store& {
      const std::string key = fmt::format("{}/{}", to_string(t), spec.to_string());
      auto it = stores.find(key);
      if (it != stores.end()) return it->second;
      Store& st = stores[key];
      const bool ckv = t == Target::CKV;
      try {
        st.x.resize(ckv ? l.c_kv.size() : l.k_pe.size());
        st.a = account(quantize_dequantize_rotated(spec, rotation_of(layer, t, tr), t, ckv ? l.c_kv.data() : l.k_pe.data(),
                                                   T, ckv ? r : rope, dump.seq_offsets, st.x.data()));
      } catch (...) {
        st.error = std::current_exception();
      }
      return st;
    };
    struct Plan {
      const AttentionCell* cell;
      const Store *c, *k;  // null: bf16
    };
    std::vector<Plan> plans;
    std::vector<probes::AbsorbedAttention<float>::Variant> variants;
    for (const AttentionCell& c : g.cells) {
      const bool q_ckv = c.targets != "k_pe", q_kpe = c.targets != "c_kv";
      const Store* sc = q_ckv ? &store(Target::CKV, c.spec, c.transform) : nullptr;
      const Store* sk =
          q_kpe ? &store(Target::KPE, c.targets == "k_pe" ? c.spec : c.spec_kpe.value_or(c.spec), c.transform) : nullptr;
      if ((sc && sc->error) || (sk && sk->error)) {
        g.errors[c.key()] = sc && sc->error ? sc->error : sk->error;
        continue;
      }
      plans.push_back({&c, sc, sk});
      probes::AbsorbedAttention<float>::Variant v;
      v.c_kv = sc ? std::span<const float>(sc->x) : std::span<const float>(e.ckv_bf16);
      v.k_pe = sk ? std::span<const float>(sk->x) : std::span<const float>(e.kpe_bf16);
      v.scores = sc ? nullptr : &e.ckv_bf16_scores;
      variants.push_back(v);
    }
    std::vector<probes::AttentionResult<float>> results;
    try {
      results = e.att->run_variants(variants, true);
    } catch (const std::exception&) {
      return;  // no rows: each cell runs alone
    }
    for (size_t i = 0; i < plans.size(); ++i) {
      const Plan& p = plans[i];
      try {
        const probes::AttentionError x = probes::attention_error(e.ref, results[i]);
        ColumnTable t = empty_probe_table("attention_error");
        const double bits_c = p.c ? p.c->a.bits_per_element : 16.0;
        const double bytes_c = p.c ? p.c->a.bytes_per_token : e.bytes_ckv_bf16;
        const double bytes_k = p.k ? p.k->a.bytes_per_token : e.bytes_kpe_bf16;
        add_row(t, {int64_t{layer}, p.cell->quantizer, p.cell->targets, x.out_rel_fro, x.cos_mean, x.kl_mean,
                    x.top1_agree, x.top8_agree, bits_c, bytes_c + bytes_k});
        g.rows[p.cell->key()] = std::move(t);
      } catch (...) {
        g.errors[p.cell->key()] = std::current_exception();
      }
    }
  }

  std::vector<ColumnTable> run(const AttentionCell& c) {
    if (ErrorGroup* g = group_of(c)) {
      std::call_once(g->once, [&] { compute_group(*g); });
      const std::string k = c.key();
      if (const auto it = g->rows.find(k); it != g->rows.end()) return {it->second};
      if (const auto it = g->errors.find(k); it != g->errors.end()) std::rethrow_exception(it->second);
    }
    return run_alone(c);
  }

  // One /attention_error cell on its own (SVD cells, cells outside the plan, groups whose shared run failed).
  std::vector<ColumnTable> run_alone(const AttentionCell& c) {
    ColumnTable t = empty_probe_table("attention_error");
    if (c.targets != "c_kv" && c.targets != "k_pe" && c.targets != "c_kv+k_pe")
      throw std::invalid_argument(fmt::format("unknown targets '{}' (expected c_kv, k_pe or c_kv+k_pe)", c.targets));
    if (c.svd_rank > 0 && c.targets != "c_kv") throw std::invalid_argument("an svd-rank cell quantizes c_kv only");
    const AttentionEntry& e = attention_of(c.layer);
    const Layer& l = dump.layer(c.layer);
    const int64_t T = dump.num_tokens(), r = dump.attrs.kv_lora_rank, rope = dump.attrs.qk_rope_head_dim;
    // A target this row does not quantize is stored (and charged) as bf16, so it is rounded to bf16 here:
    // the measured error then matches the accounting. SVD rows round their coefficients to bf16
    // (probes::CoeffDtype::BF16), the dtype charged for them.
    static const QuantSpec kBf16 = QuantSpec::parse("bf16");
    std::vector<float> ckv_buf(l.c_kv.size()), kpe_buf(l.k_pe.size());
    double bits_c = 16, bytes_c = 2.0 * static_cast<double>(r), bytes_k = 2.0 * static_cast<double>(rope);
    if (c.svd_rank > 0) {
      basis_of(c.layer).reconstruct(l.c_kv.data(), T, c.svd_rank, ckv_buf.data(), probes::CoeffDtype::BF16);
      bits_c = 16.0 * static_cast<double>(c.svd_rank) / static_cast<double>(r);
      bytes_c = 2.0 * static_cast<double>(c.svd_rank);
    } else {
      const bool q_ckv = c.targets != "k_pe";
      const Accounting a = account(quantize_dequantize_rotated(
          q_ckv ? c.spec : kBf16, rotation_of(c.layer, Target::CKV, q_ckv ? c.transform : Transform{}), Target::CKV,
          l.c_kv.data(), T, r, dump.seq_offsets, ckv_buf.data()));
      bits_c = a.bits_per_element;
      bytes_c = a.bytes_per_token;
    }
    const bool q_kpe = c.svd_rank == 0 && c.targets != "c_kv";
    bytes_k = account(quantize_dequantize_rotated(q_kpe ? c.spec_kpe.value_or(c.spec) : kBf16,
                                                  rotation_of(c.layer, Target::KPE, q_kpe ? c.transform : Transform{}),
                                                  Target::KPE, l.k_pe.data(), T, rope, dump.seq_offsets, kpe_buf.data()))
                  .bytes_per_token;
    const std::span<const float> ckv = ckv_buf, kpe = kpe_buf;
    const probes::AttentionError x = probes::attention_error(e.ref, e.att->run(ckv, kpe, true));
    add_row(t, {int64_t{c.layer}, c.quantizer, c.targets, x.out_rel_fro, x.cos_mean, x.kl_mean, x.top1_agree,
                x.top8_agree, bits_c, bytes_c + bytes_k});
    return {std::move(t)};
  }

  std::vector<ColumnTable> run(const AttentionPositionCell& c) {
    ColumnTable t = empty_probe_table("attention_position");
    if (c.targets != "c_kv" && c.targets != "k_pe" && c.targets != "c_kv+k_pe")
      throw std::invalid_argument(fmt::format("unknown targets '{}' (expected c_kv, k_pe or c_kv+k_pe)", c.targets));
    const AttentionEntry& e = attention_of(c.layer);
    const Layer& l = dump.layer(c.layer);
    const TransformedSpec ts = TransformedSpec::parse(c.quantizer);
    probes::DecodeOrderQuantizer q;
    q.spec = ts.spec;
    q.c_kv = c.targets != "k_pe";
    q.k_pe = c.targets != "c_kv";
    const Rotation r_ckv = q.c_kv ? rotation_of(c.layer, Target::CKV, ts.transform) : Rotation{};
    const Rotation r_kpe = q.k_pe ? rotation_of(c.layer, Target::KPE, ts.transform) : Rotation{};
    q.r_ckv = &r_ckv;
    q.r_kpe = &r_kpe;
    std::vector<DecodeOrder> orders{DecodeOrder{}};  // the baseline prefill-at-once first
    for (const DecodeOrder& o : config.probes.decode_order.modes()) orders.push_back(o);
    const probes::DecodeOrderInput in{l.c_kv, l.k_pe, dump.seq_offsets, l.q_rows, dump.positions};
    const int64_t causal = decode_scale_is_causal(ts.spec) ? 1 : 0;
    for (const probes::DecodeOrderError& o :
         probes::decode_order_attention(*e.att, e.ref, in, q, orders, config.probes.decode_order.position_bucket))
      for (const probes::PositionBucketError& b : o.buckets)
        add_row(t, {int64_t{c.layer}, c.targets, c.quantizer, o.order.label(), o.order.residual, o.order.sink,
                    o.order.prefill, causal, b.pos_start, b.pos_end, b.queries, b.quantized_key_frac, b.kl_mean,
                    b.out_rel_fro, o.bytes_per_token});
    return {std::move(t)};
  }
};

ProbeRunner::ProbeRunner(const StudyConfig& config, const Dump& dump)
    : impl_(std::make_unique<Impl>(config, nullptr, dump)) {}
ProbeRunner::ProbeRunner(const StudyConfig& config, std::shared_ptr<const Dump> dump) {
  if (!dump) throw std::invalid_argument("ProbeRunner: no dump");
  const Dump& d = *dump;
  impl_ = std::make_unique<Impl>(config, std::move(dump), d);
}
ProbeRunner::~ProbeRunner() = default;

std::vector<ColumnTable> ProbeRunner::run(const ProbeCell& cell) const {
  const OmpSingleThread single;
  try {
    return std::visit([&](const auto& c) { return impl_->run(c); }, cell);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: cell {}: {}", impl_->dump.path.string(), cell_key(cell), e.what()));
  }
}

std::vector<NamedTable> run_probe_cells(const ProbeRunner& runner, const std::vector<ProbeCell>& cells,
                                        const RunOptions& options) {
  const size_t n = cells.size();
  std::vector<std::vector<ColumnTable>> rows(n);
  const std::vector<std::exception_ptr> errors =
      parallel_cells(n, options.threads, [&](size_t i) { rows[i] = runner.run(cells[i]); }, options.progress);
  for (size_t i = 0; i < n; ++i)
    if (errors[i]) std::rethrow_exception(errors[i]);

  std::vector<NamedTable> out;
  for (size_t i = 0; i < n; ++i) {
    const std::vector<std::string> groups = cell_groups(cells[i]);
    for (size_t k = 0; k < groups.size(); ++k) {
      const std::string& g = groups[k];
      auto it = std::find_if(out.begin(), out.end(), [&](const NamedTable& t) { return t.group == g; });
      if (it == out.end()) {
        out.push_back({g, empty_probe_table(g), {}});
        it = out.end() - 1;
      }
      it->table.append(rows[i][k]);
    }
  }
  return out;
}

// ---- all probes --------------------------------------------------------------------------------------------

std::vector<std::string> ProbePlan::keys() const {
  std::vector<std::string> k;
  for (const ProbeCell& c : cells) k.push_back(cell_key(c));
  return k;
}

ProbePlan ProbePlan::subset(const std::function<bool(const std::string&)>& keep) const {
  ProbePlan p;
  p.groups = groups;
  p.attention_skipped = attention_skipped;
  p.warnings = warnings;
  for (const ProbeCell& c : cells)
    if (keep(cell_key(c))) p.cells.push_back(c);
  return p;
}

ProbePlan plan_probes(const StudyConfig& config, const Dump& dump) {
  ProbePlan p;
  auto add = [&](const auto& v) {
    for (const auto& c : v) p.cells.emplace_back(c);
  };
  const ProbeConfig& P = config.probes;
  p.warnings = rank_cap_warnings(config, dump);
  if (P.svd.enabled) {
    add(plan_svd_cells(config, dump));
    p.groups.insert(p.groups.end(), {"svd", "svd_spectrum"});
  }
  if (P.cross_layer.enabled) {
    add(plan_cross_layer_cells(config, dump));
    add(plan_sharing_cells(config, dump));
    p.groups.insert(p.groups.end(), {"cross_layer", "cross_layer_sharing"});
  }
  if (P.attention.enabled) {
    p.attention_skipped = attention_unavailable_reason(dump);
    if (p.attention_skipped.empty()) {
      add(plan_attention_check_cells(config, dump));
      add(plan_attention_cells(config, dump));
      p.groups.insert(p.groups.end(), {"attention_check", "attention_error"});
    }
  }
  if (P.decode_order.enabled) {
    // Needs the attention data too (loaded for it when [attention] is disabled: load_probe_dump).
    if (const std::string why = attention_unavailable_reason(dump); !why.empty()) {
      if (p.attention_skipped.empty()) p.attention_skipped = why;
    } else {
      add(plan_attention_position_cells(config, dump));
      p.groups.push_back("attention_position");
    }
  }
  return p;
}

Dump load_probe_dump(const StudyConfig& config) {
  if (config.dump.empty())
    throw std::invalid_argument(config.source + ": no input dump: set [input] dump or pass --input");
  LoadOptions lo;
  lo.layers = config.layers;
  lo.attention = config.probes.attention.enabled || config.probes.decode_order.enabled;
  return load_dump(config.dump, lo);
}

std::vector<NamedTable> run_probes(const StudyConfig& config, const Dump& dump, const ProbePlan& plan,
                                   const RunOptions& options) {
  const ProbeRunner runner(config, dump);
  std::vector<NamedTable> ran = run_probe_cells(runner, plan.cells, options);
  std::vector<NamedTable> out;
  for (const std::string& g : plan.groups) {
    auto it = std::find_if(ran.begin(), ran.end(), [&](const NamedTable& t) { return t.group == g; });
    out.push_back(it != ran.end() ? std::move(*it) : NamedTable{g, empty_probe_table(g), {}});
    NamedTable& t = out.back();
    if (g == "svd")
      t.attrs = {{"definition", std::string("rank-r basis of c_kv fit on the fit split (first half of the non-empty "
                                            "sequences; one: its first half of tokens), rel_fro = ||X - X_hat||_F / "
                                            "||X||_F on each split, X_hat = bf16((X - mu) V_r) V_r^T + mu (the r "
                                            "per-token coefficients rounded to bf16, the dtype charged for them); "
                                            "rank_f = smallest r whose cumulative sigma^2 reaches f of the total")}};
    if (g == "cross_layer")
      t.attrs = {{"definition", std::string("mean over non-constant channels of |Pearson(A[:,i], B[:,i])|; linear CKA "
                                            "= ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F), X, Y column-centered")}};
    if (g == "attention_check") t.attrs = {{"tolerance", config.probes.attention.check_tolerance}};
    if (g == "attention_error")
      t.attrs = {{"definition", std::string("absorbed float32 attention on quantized latents vs on exact latents, same "
                                            "queries; KL(p || p_hat) in nats, p_hat floored at 1e-30; a target the row "
                                            "does not quantize is rounded to bf16 and counted as bf16; svd-rank<r> "
                                            "rows: r bf16 coefficients per token, k_pe bf16")}};
    if (g == "attention_position")
      t.attrs = {{"definition", std::string("absorbed float32 attention on the decode-order cache vs on exact latents, "
                                            "same queries (latentq/decode_order.h): the query at position t reads key j "
                                            "quantized iff reads_quantized(t, j, G), else bf16; scores and values mixed "
                                            "per (t, j); rows per bucket [pos_start, pos_end) of query positions; KL as "
                                            "/attention_error; bytes_per_token: one layer, c_kv + k_pe, the cache at each "
                                            "sequence's end (bf16 tokens at 2 bytes per element)")}};
  }
  return out;
}

std::vector<std::string> row_keys(const std::string& group, const ColumnTable& t) {
  std::vector<std::string> k;
  auto ints = [&](const char* c) -> const std::vector<int64_t>& { return t.get<int64_t>(c); };
  auto strs = [&](const char* c) -> const std::vector<std::string>& { return t.get<std::string>(c); };
  const size_t n = t.num_rows();
  if (group == "latent_error") {
    const auto& l = ints("layer");
    const auto &tg = strs("target"), &q = strs("quantizer");
    for (size_t i = 0; i < n; ++i) k.push_back(fmt::format("{:03d}/{}/{}/latent_error", l[i], tg[i], q[i]));
  } else if (group == "svd" || group == "svd_spectrum") {
    for (int64_t l : ints("layer")) k.push_back(fmt::format("{:03d}/svd", l));
  } else if (group == "attention_check") {
    for (int64_t l : ints("layer")) k.push_back(fmt::format("{:03d}/attention_check", l));
  } else if (group == "cross_layer") {
    const auto &a = ints("layer_a"), &b = ints("layer_b");
    for (size_t i = 0; i < n; ++i) k.push_back(fmt::format("{:03d}-{:03d}/cross_layer", a[i], b[i]));
  } else if (group == "cross_layer_sharing") {
    const auto &s = ints("window_start"), &w = ints("window");
    for (size_t i = 0; i < n; ++i) k.push_back(fmt::format("w{}-{:03d}/cross_layer_sharing", w[i], s[i]));
  } else if (group == "attention_error") {
    const auto& l = ints("layer");
    const auto &tg = strs("targets"), &q = strs("quantizer");
    for (size_t i = 0; i < n; ++i) k.push_back(fmt::format("{:03d}/{}/{}/attention_error", l[i], tg[i], q[i]));
  } else if (group == "attention_position") {
    const auto& l = ints("layer");
    const auto &tg = strs("targets"), &q = strs("quantizer");
    for (size_t i = 0; i < n; ++i) k.push_back(fmt::format("{:03d}/{}/{}/attention_position", l[i], tg[i], q[i]));
  } else {
    throw std::invalid_argument(fmt::format("row_keys: group '{}' has no cell keys", group));
  }
  return k;
}

std::vector<std::string> attention_check_warnings(const ColumnTable& check, double tolerance) {
  std::vector<std::string> out;
  const auto& layer = check.get<int64_t>("layer");
  const auto& rel = check.get<double>("ref_vs_dump_rel_fro");
  for (size_t i = 0; i < layer.size(); ++i)
    if (!(rel[i] <= tolerance))
      out.push_back(fmt::format("attention check: layer {}: the absorbed recomputation on the exact latents differs "
                                "from the dump's attn_out by rel_fro {:.3e} > {:.0e}; /attention_error of this layer "
                                "compares against the recomputation",
                                layer[i], rel[i], tolerance));
  return out;
}

// ---- `latentq run` ---------------------------------------------------------------------------------------

ProbeStage prepare_probe_stage(const StudyConfig& config) {
  ProbeStage s;
  s.dump = std::make_shared<const Dump>(load_probe_dump(config));
  s.plan = plan_probes(config, *s.dump);
  s.tasks = probe_cell_tasks(config, s.dump, s.plan);
  return s;
}

std::vector<CellTask> probe_cell_tasks(const StudyConfig& config, std::shared_ptr<const Dump> dump,
                                       const ProbePlan& plan) {
  const auto runner = std::make_shared<const ProbeRunner>(config, std::move(dump));
  std::vector<CellTask> tasks;
  for (const ProbeCell& c : plan.cells)
  {
    CellTask t;
    t.key = cell_key(c);
    t.groups = cell_groups(c);
    t.compute = [runner, c] { return runner->run(c); };
    t.concurrent = true;
    tasks.push_back(std::move(t));
  }
  return tasks;
}

void print_probe_report(const StudyConfig& config, const ProbeStage& stage, const ColumnTable* summary,
                        const std::vector<NamedTable>& tables, const DumpAttrs& attrs, std::ostream& out,
                        std::ostream& err) {
  if (!stage.plan.attention_skipped.empty()) out << "attention: skipped: " << stage.plan.attention_skipped << "\n";
  for (const NamedTable& t : tables)
    if (t.group == "attention_check")
      for (const std::string& w : attention_check_warnings(t.table, config.probes.attention.check_tolerance))
        err << "latentq: warning: " << w << "\n";
  if (summary) out << format_probe_summary(*summary, tables, attrs);
}

// ---- printed summaries ------------------------------------------------------------------------------------

namespace {

std::string num(double x, int prec) { return std::isfinite(x) ? fmt::format("{:.{}f}", x, prec) : std::string("-"); }
std::string sci(double x) { return std::isfinite(x) ? fmt::format("{:.3e}", x) : std::string("-"); }

const ColumnTable* find_table(const std::vector<NamedTable>& tables, const std::string& group) {
  for (const NamedTable& t : tables)
    if (t.group == group) return &t.table;
  return nullptr;
}

// Mean over layers of `col` for rows with this quantizer and targets.
struct AttentionMeans {
  std::map<std::pair<std::string, std::string>, std::vector<double>> out_rel, kl, top1, top8;
};
AttentionMeans attention_means(const ColumnTable& a) {
  AttentionMeans m;
  const auto& q = a.get<std::string>("quantizer");
  const auto& tg = a.get<std::string>("targets");
  const auto& o = a.get<double>("out_rel_fro");
  const auto& kl = a.get<double>("kl_mean");
  const auto& t1 = a.get<double>("top1_agree");
  const auto& t8 = a.get<double>("top8_agree");
  for (size_t i = 0; i < q.size(); ++i) {
    const auto k = std::make_pair(q[i], tg[i]);
    m.out_rel[k].push_back(o[i]);
    m.kl[k].push_back(kl[i]);
    m.top1[k].push_back(t1[i]);
    m.top8[k].push_back(t8[i]);
  }
  return m;
}
double mean_at(const std::map<std::pair<std::string, std::string>, std::vector<double>>& m, const std::string& q,
               const std::string& tg) {
  const auto it = m.find({q, tg});
  return it == m.end() ? kNaN : mean_finite(it->second);
}

// Summary rows sorted as format_summary: bytes per token, then mean c_kv rel_fro.
std::vector<size_t> summary_order(const ColumnTable& s) {
  const auto& bytes = s.get<double>("bytes_per_token_model");
  const auto& mc = s.get<double>("mean_rel_fro_c_kv");
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), 0);
  auto key = [](double x) { return std::isnan(x) ? std::numeric_limits<double>::infinity() : x; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (bytes[a] != bytes[b]) return bytes[a] < bytes[b];
    return key(mc[a]) < key(mc[b]);
  });
  return order;
}

std::string attention_table(const ColumnTable& summary, const ColumnTable& att, const ColumnTable* svd,
                            const DumpAttrs& A) {
  const AttentionMeans m = attention_means(att);
  const auto& name = summary.get<std::string>("quantizer");
  const auto& bytes = summary.get<double>("bytes_per_token_model");
  const auto& mc = summary.get<double>("mean_rel_fro_c_kv");
  size_t w = 9;
  for (const auto& s : name) w = std::max(w, s.size() + 1);
  std::string out;
  out += "\nLatent error vs attention error (absorbed attention; mean over layers)\n";
  out += fmt::format("{:<{}} {:>11} {:>10} | {:>10} {:>10} {:>7} {:>7} | {:>10}\n", "quantizer", w, "bytes/token",
                     "c_kv", "attn out", "KL", "top-1", "top-8", "attn out");
  out += fmt::format("{:<{}} {:>11} {:>10} | {:>37} | {:>10}\n", "", w, "(model)", "rel_fro", "c_kv+k_pe quantized",
                     "c_kv only");
  for (size_t i : summary_order(summary)) {
    const std::string& q = name[i];
    out += fmt::format("{:<{}} {:>11} {:>10} | {:>10} {:>10} {:>7} {:>7} | {:>10}\n", q, w, num(bytes[i], 1), sci(mc[i]),
                       sci(mean_at(m.out_rel, q, "c_kv+k_pe")), sci(mean_at(m.kl, q, "c_kv+k_pe")),
                       num(mean_at(m.top1, q, "c_kv+k_pe"), 4), num(mean_at(m.top8, q, "c_kv+k_pe"), 4),
                       sci(mean_at(m.out_rel, q, "c_kv")));
  }
  // SVD-pruned c_kv (k_pe bf16).
  std::set<int64_t> ranks;
  for (const auto& [k, v] : m.out_rel)
    if (k.first.rfind("svd-rank", 0) == 0) ranks.insert(std::stoll(k.first.substr(8)));
  if (!ranks.empty()) {
    std::map<int64_t, std::vector<double>> held;
    if (svd) {
      const auto& rk = svd->get<int64_t>("rank");
      const auto& ho = svd->get<double>("heldout_rel_fro");
      for (size_t i = 0; i < rk.size(); ++i) held[rk[i]].push_back(ho[i]);
    }
    out += fmt::format("\nSVD-pruned c_kv (k_pe bf16; r bf16 coefficients per token, basis not counted)\n");
    out += fmt::format("{:<{}} {:>11} {:>10} | {:>10} {:>10} {:>7} {:>7}\n", "quantizer", w, "bytes/token", "held-out",
                       "attn out", "KL", "top-1", "top-8");
    out += fmt::format("{:<{}} {:>11} {:>10} | {:>10}\n", "", w, "(model)", "rel_fro", "rel_fro");
    for (int64_t r : ranks) {
      const std::string q = fmt::format("svd-rank{}", r);
      const double b = static_cast<double>(A.num_layers) * 2.0 * static_cast<double>(r + A.qk_rope_head_dim);
      out += fmt::format("{:<{}} {:>11} {:>10} | {:>10} {:>10} {:>7} {:>7}\n", q, w, num(b, 1),
                         sci(held.count(r) ? mean_finite(held[r]) : kNaN), sci(mean_at(m.out_rel, q, "c_kv")),
                         sci(mean_at(m.kl, q, "c_kv")), num(mean_at(m.top1, q, "c_kv"), 4),
                         num(mean_at(m.top8, q, "c_kv"), 4));
    }
  }
  out += "attn out = ||out_hat - out||_F / ||out||_F of the attention output; KL(p || p_hat) of the attention "
         "probabilities in nats;\ntop-k = agreement of the k most attended keys; all over query rows x heads.\n";
  return out;
}

std::string svd_table(const ColumnTable& svd, const DumpAttrs& A) {
  const auto& layer = svd.get<int64_t>("layer");
  const auto& rank = svd.get<int64_t>("rank");
  const auto& ho = svd.get<double>("heldout_rel_fro");
  const auto& fit = svd.get<double>("fit_rel_fro");
  const auto& r90 = svd.get<int64_t>("rank_90");
  const auto& r99 = svd.get<int64_t>("rank_99");
  const auto& r999 = svd.get<int64_t>("rank_999");
  const int64_t r = A.kv_lora_rank, q4 = std::max<int64_t>(1, r / 4), h2 = std::max<int64_t>(1, r / 2);
  std::vector<int64_t> layers;
  for (int64_t l : layer)
    if (std::find(layers.begin(), layers.end(), l) == layers.end()) layers.push_back(l);
  auto at = [&](int64_t l, int64_t k, const std::vector<double>& v) {
    for (size_t i = 0; i < layer.size(); ++i)
      if (layer[i] == l && rank[i] == k) return v[i];
    return kNaN;
  };
  std::string out;
  out += fmt::format("\nSVD of c_kv (kv_lora_rank {}; energy ranks of the fit split; rel_fro of the rank-r "
                     "reconstruction)\n", r);
  out += fmt::format("{:>5} {:>7} {:>7} {:>8} | {:>12} {:>12} {:>12} {:>12}\n", "layer", "rank_90", "rank_99", "rank_999",
                     fmt::format("held-out {}", q4), fmt::format("held-out {}", h2), fmt::format("fit {}", h2), "gap");
  for (int64_t l : layers) {
    size_t i0 = 0;
    while (layer[i0] != l) ++i0;
    const double hh = at(l, h2, ho), fh = at(l, h2, fit);
    out += fmt::format("{:>5} {:>7} {:>7} {:>8} | {:>12} {:>12} {:>12} {:>12}\n", l, r90[i0], r99[i0], r999[i0],
                       sci(at(l, q4, ho)), sci(hh), sci(fh), sci(hh - fh));
  }
  out += fmt::format("gap = held-out - fit rel_fro at rank {}; fit = first half of the non-empty sequences, held-out = "
                     "the rest.\n", h2);
  return out;
}

std::string cross_layer_table(const ColumnTable& cl, const ColumnTable* sharing) {
  const auto& a = cl.get<int64_t>("layer_a");
  const auto& b = cl.get<int64_t>("layer_b");
  const auto& p = cl.get<double>("mean_abs_pearson");
  const auto& cka = cl.get<double>("cka");
  std::string out = "\nAdjacent layers: c_kv similarity over the same tokens\n";
  out += fmt::format("{:>7} {:>14} {:>8}\n", "layers", "mean |Pearson|", "CKA");
  // Consecutive pairs: b is the next layer after a among the layers of the table.
  std::set<int64_t> L(a.begin(), a.end());
  L.insert(b.begin(), b.end());
  for (size_t i = 0; i < a.size(); ++i) {
    const auto next = L.upper_bound(a[i]);
    if (next == L.end() || *next != b[i]) continue;
    out += fmt::format("{:>7} {:>14} {:>8}\n", fmt::format("{}-{}", a[i], b[i]), num(p[i], 4), num(cka[i], 4));
  }
  if (sharing && sharing->num_rows() > 0) {
    const auto& s = sharing->get<int64_t>("window_start");
    const auto& w = sharing->get<int64_t>("window");
    const auto& k = sharing->get<int64_t>("rank");
    const auto& sh = sharing->get<double>("shared_heldout_rel_fro");
    const auto& pl = sharing->get<double>("per_layer_heldout_rel_fro");
    out += "\nShared basis over a window of adjacent layers vs per-layer bases (same k coefficients per token)\n";
    out += fmt::format("{:>7} {:>6} {:>16} {:>16}\n", "layers", "rank k", "shared held-out", "per-layer held-out");
    for (size_t i = 0; i < s.size(); ++i)
      out += fmt::format("{:>7} {:>6} {:>16} {:>16}\n", fmt::format("{}-{}", s[i], s[i] + w[i] - 1), k[i], sci(sh[i]),
                         sci(pl[i]));
  }
  return out;
}

}  // namespace

std::string format_probe_summary(const ColumnTable& summary, const std::vector<NamedTable>& tables, const DumpAttrs& attrs) {
  std::string out;
  const ColumnTable* svd = find_table(tables, "svd");
  if (const ColumnTable* a = find_table(tables, "attention_error"); a && a->num_rows() > 0)
    out += attention_table(summary, *a, svd, attrs);
  if (svd && svd->num_rows() > 0) out += svd_table(*svd, attrs);
  if (const ColumnTable* cl = find_table(tables, "cross_layer"); cl && cl->num_rows() > 0)
    out += cross_layer_table(*cl, find_table(tables, "cross_layer_sharing"));
  return out;
}

std::string format_e2e_summary(const ColumnTable& e2e, const ColumnTable& summary) {
  const auto& q = e2e.get<std::string>("quantizer");
  const auto& kl = e2e.get<double>("kl_mean");
  const auto& top1 = e2e.get<double>("top1_agree");
  const auto& pr = e2e.get<double>("ppl_ref");
  const auto& pq = e2e.get<double>("ppl_quant");
  std::map<std::string, double> bytes;
  if (summary.has("quantizer") && summary.has("bytes_per_token_model")) {
    const auto& sq = summary.get<std::string>("quantizer");
    const auto& sb = summary.get<double>("bytes_per_token_model");
    for (size_t i = 0; i < sq.size(); ++i) bytes[sq[i]] = sb[i];
  }
  auto b_of = [&](const std::string& s) { return bytes.count(s) ? bytes[s] : kNaN; };
  std::vector<size_t> order(q.size());
  std::iota(order.begin(), order.end(), 0);
  auto key = [](double x) { return std::isnan(x) ? std::numeric_limits<double>::infinity() : x; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (key(b_of(q[a])) != key(b_of(q[b]))) return key(b_of(q[a])) < key(b_of(q[b]));
    return key(kl[a]) < key(kl[b]);
  });
  size_t w = 9;
  for (const auto& s : q) w = std::max(w, s.size() + 1);
  std::string out = "\nEnd to end (model logits with quantized latents on every layer)\n";
  out += fmt::format("{:<{}} {:>11} {:>10} {:>7} {:>9} {:>9} {:>9}\n", "quantizer", w, "bytes/token", "KL", "top-1",
                     "ppl ref", "ppl quant", "delta");
  for (size_t i : order)
    out += fmt::format("{:<{}} {:>11} {:>10} {:>7} {:>9} {:>9} {:>9}\n", q[i], w, num(b_of(q[i]), 1), sci(kl[i]),
                       num(top1[i], 4), num(pr[i], 4), num(pq[i], 4), fmt::format("{:+.4f}", pq[i] - pr[i]));
  out += "KL(p_ref || p_quant) of the next-byte distribution, mean over tokens, nats; ppl = exp(mean next-byte NLL).\n";
  return out;
}

}  // namespace latentq
