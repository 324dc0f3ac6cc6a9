// The cross-layer probes of c_kv: [cross_layer] → /cross_layer (matched-channel |Pearson| and linear
// CKA of two studied layers, cell "003-004/cross_layer") and /cross_layer_sharing (one basis shared by
// a window of w consecutive studied layers against per-layer bases, cell "w2-003/cross_layer_sharing").
// Definitions: study/README.md ("mean |Pearson|", "Linear CKA", "Sharing").
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "latentq/config.h"
#include "latentq/probe_registry.h"
#include "latentq/layer_shared.h"
#include "latentq/probe_study.h"
#include "latentq/analysis/cross_layer.h"

namespace latentq {
namespace {

struct PairCell {
  int layer_a = 0, layer_b = 0;  // layer_a < layer_b
};
struct SharingCell {
  int window = 0;
  std::vector<int> layers;  // the w consecutive studied layers, ascending
};

const GroupSpec kPairs = {
    "cross_layer",
    {{"layer_a", ColType::I64, "", "the first layer of the pair"},
     {"layer_b", ColType::I64, "", "the second layer (layer_a < layer_b)"},
     {"mean_abs_pearson", ColType::F64, "1",
      "mean over the latent dimensions of |Pearson| between the same c_kv dimension of the two layers"},
     {"pearson_channels", ColType::I64, "", "the dimensions that mean covers (constant in neither layer)"},
     {"constant_channels", ColType::I64, "", "the dimensions constant in either layer, left out"},
     {"cka", ColType::F64, "1", "linear CKA of the two layers' c_kv (1 = the same up to rotation and scale)"}}};
const GroupSpec kSharing = {
    "cross_layer_sharing",
    {{"window_start", ColType::I64, "", "the first layer of the window"},
     {"window", ColType::I64, "", "w: the adjacent studied layers of the window"},
     {"rank", ColType::I64, "", "k: the total rank, coefficients per token for all w layers"},
     {"shared_heldout_rel_fro", ColType::F64, "1",
      "held-out rel_fro of one rank-k basis shared by the window's concatenated c_kv"},
     {"per_layer_heldout_rel_fro", ColType::F64, "1", "held-out rel_fro of a rank-k/w basis per layer"},
     {"shared_fit_rel_fro", ColType::F64, "1", "the shared basis's rel_fro on the fit split"},
     {"per_layer_fit_rel_fro", ColType::F64, "1", "the per-layer bases' rel_fro on the fit split"}}};

std::string pair_key(int64_t a, int64_t b) { return fmt::format("{:03d}-{:03d}/cross_layer", a, b); }
std::string sharing_key(int64_t w, int64_t start) { return fmt::format("w{}-{:03d}/cross_layer_sharing", w, start); }
std::string num(double x, int prec) { return std::isfinite(x) ? fmt::format("{:.{}f}", x, prec) : std::string("-"); }
std::string sci(double x) { return std::isfinite(x) ? fmt::format("{:.3e}", x) : std::string("-"); }

class CrossLayerProbe final : public Probe {
 public:
  std::string section() const override { return "cross_layer"; }
  int order() const override { return 200; }
  int print_order() const override { return 300; }

  std::shared_ptr<const ProbeSettings> parse(const SettingsReader& r) const override {
    auto C = std::make_shared<CrossLayerSettings>();
    r.check_keys({"enabled", "pairs", "windows", "ranks", "centered"});
    if (auto v = r.boolean("enabled")) C->enabled = *v;
    if (auto v = r.boolean("centered")) C->centered = *v;
    if (auto v = r.string("pairs")) {
      if (*v == "auto")
        C->pairs = PairSelection::Auto;
      else if (*v == "all")
        C->pairs = PairSelection::All;
      else if (*v == "adjacent")
        C->pairs = PairSelection::Adjacent;
      else
        r.fail("pairs", fmt::format("'cross_layer.pairs' is '{}', expected \"all\", \"adjacent\" or \"auto\"", *v));
    }
    if (auto v = r.ints("windows", 2)) C->windows = *v;
    if (auto v = r.ints("ranks", 1)) {
      C->ranks = *v;
      for (size_t i = 0; i < C->ranks.size(); ++i)
        for (int64_t w : C->windows)
          if (C->ranks[i] % w != 0)
            r.fail("ranks",
                   fmt::format("'cross_layer.ranks': rank {} is not a multiple of the window size {} "
                               "(a window of w layers stores k coefficients, k/w per layer)",
                               C->ranks[i], w),
                   i);
      std::sort(C->ranks.begin(), C->ranks.end());
    }
    return C;
  }

  std::vector<GroupSpec> groups() const override { return {kPairs, kSharing}; }

  // DeepSeek-V4 caches no c_kv + k_pe: nothing to measure.
  std::pair<Target, std::string> not_applicable_reason(const StudyConfig& config,
                                                       const DumpAttrs& attrs) const override {
    if (!probe_settings<CrossLayerSettings>(config, "cross_layer").enabled || attrs.family().holds(Target::CKV))
      return {Target::CKV, ""};
    return {Target::CKV,
            fmt::format("not applicable to {} (no c_kv + k_pe): c_kv across layers skipped", attrs.cache_family)};
  }

  ProbePart plan(const StudyConfig& config, const Dump& dump) const override {
    ProbePart p;
    const CrossLayerSettings& s = probe_settings<CrossLayerSettings>(config, "cross_layer");
    if (!s.enabled) return p;
    if (const auto na = not_applicable_reason(config, dump.attrs); !na.second.empty()) {
      p.notes.push_back("cross_layer: " + na.second);
      return p;
    }
    p.groups = {"cross_layer", "cross_layer_sharing"};
    std::vector<int> L;
    for (const Layer& l : dump.layers) L.push_back(l.index);
    // Pairs a < b: all ("all", or "auto" with <= 16 studied layers) or consecutive studied layers, a-major.
    const bool all = s.pairs == PairSelection::All || (s.pairs == PairSelection::Auto && L.size() <= 16);
    for (size_t i = 0; i < L.size(); ++i)
      for (size_t j = i + 1; j < L.size(); ++j)
        if (all || j == i + 1)
          p.cells.push_back(
              ProbeCell::make(this, pair_key(L[i], L[j]), {"cross_layer"}, {L[i], L[j]}, false, PairCell{L[i], L[j]}));
    // For each window size w (config order), each run of w consecutive studied layers, start ascending.
    for (int64_t w : s.windows) {
      if (static_cast<size_t>(w) > L.size()) {
        p.warnings.push_back(
            fmt::format("{}: [cross_layer] windows: window {} is larger than the {} studied layer{}: "
                        "no /cross_layer_sharing rows for it",
                        config.source, w, L.size(), L.size() == 1 ? "" : "s"));
        continue;  // a window without cells takes no rank
      }
      sharing_ranks(config, dump, w);  // throws for ranks the dump cannot take
      for (size_t i = 0; i + static_cast<size_t>(w) <= L.size(); ++i) {
        std::vector<int> layers(L.begin() + static_cast<ptrdiff_t>(i), L.begin() + static_cast<ptrdiff_t>(i) + w);
        p.cells.push_back(ProbeCell::make(this, sharing_key(w, layers.front()), {"cross_layer_sharing"}, layers, false,
                                          SharingCell{static_cast<int>(w), layers}));
      }
    }
    return p;
  }

  std::vector<ColumnTable> run(const StudyConfig& config, const ProbeCell& cell, const LayerAccess& in) const override {
    const Dump& dump = in.header();
    if (cell.groups.front() == "cross_layer") {
      const PairCell& c = cell.as<PairCell>();
      ColumnTable t = empty_table(kPairs);
      const int64_t T = dump.num_tokens(), r = dump.attrs.kv_lora_rank;
      // CKA's per-layer normalizer, once per layer for both pairs that contain it.
      const auto gram_norm = [&](int l) {
        return *in.shared<double>(l, "cross_layer.gram_norm",
                                  [&] { return probes::centered_gram_norm(in.layer(l).c_kv.data(), T, r); });
      };
      const probes::CrossLayerPair p =
          probes::cross_layer_pair(in.layer(c.layer_a).c_kv.data(), in.layer(c.layer_b).c_kv.data(), T, r,
                                   gram_norm(c.layer_a), gram_norm(c.layer_b));
      add_row(t, {int64_t{c.layer_a}, int64_t{c.layer_b}, p.pearson_mean_abs, p.pearson_channels, p.constant_channels,
                  p.cka_linear});
      return {std::move(t)};
    }
    const SharingCell& c = cell.as<SharingCell>();
    ColumnTable t = empty_table(kSharing);
    const std::vector<int64_t> ranks = sharing_ranks(config, dump, c.window);
    const bool centered = probe_settings<CrossLayerSettings>(config, "cross_layer").centered;
    std::vector<const float*> ptrs;
    std::vector<std::shared_ptr<const probes::SvdSplitFit>> fits;  // each layer's own basis, shared per layer
    std::vector<const probes::SvdSplitFit*> fit_ptrs;
    for (int l : c.layers) {
      ptrs.push_back(in.layer(l).c_kv.data());
      fits.push_back(svd_split_fit(in, l, centered));
      fit_ptrs.push_back(fits.back().get());
    }
    for (const probes::SharedBasisResult& x : probes::shared_basis_probe(
             ptrs, dump.num_tokens(), dump.attrs.kv_lora_rank, dump.seq_offsets, ranks, centered, fit_ptrs))
      add_row(t, {int64_t{c.layers.front()}, int64_t{c.window}, x.rank, x.shared_heldout_rel_fro,
                  x.per_layer_heldout_rel_fro, x.shared_fit_rel_fro, x.per_layer_fit_rel_fro});
    return {std::move(t)};
  }

  std::vector<std::string> row_keys(const std::string& group, const ColumnTable& t) const override {
    std::vector<std::string> k;
    const size_t n = t.num_rows();
    if (group == "cross_layer") {
      const auto &a = t.get<int64_t>("layer_a"), &b = t.get<int64_t>("layer_b");
      for (size_t i = 0; i < n; ++i) k.push_back(pair_key(a[i], b[i]));
    } else {
      const auto &s = t.get<int64_t>("window_start"), &w = t.get<int64_t>("window");
      for (size_t i = 0; i < n; ++i) k.push_back(sharing_key(w[i], s[i]));
    }
    return k;
  }

  // Per consecutive layer pair: mean |Pearson| and CKA; then /cross_layer_sharing.
  std::string report(const ProbeReportInput& in) const override {
    const NamedTable* found = in.find("cross_layer");
    if (!found || found->table.num_rows() == 0) return {};
    const ColumnTable& cl = found->table;
    const NamedTable* sharing = in.find("cross_layer_sharing");
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
    if (sharing && sharing->table.num_rows() > 0) {
      const ColumnTable& sh_t = sharing->table;
      const auto& s = sh_t.get<int64_t>("window_start");
      const auto& w = sh_t.get<int64_t>("window");
      const auto& k = sh_t.get<int64_t>("rank");
      const auto& sh = sh_t.get<double>("shared_heldout_rel_fro");
      const auto& pl = sh_t.get<double>("per_layer_heldout_rel_fro");
      out += "\nShared basis over a window of adjacent layers vs per-layer bases (same k coefficients per token)\n";
      out += fmt::format("{:>7} {:>6} {:>16} {:>16}\n", "layers", "rank k", "shared held-out", "per-layer held-out");
      for (size_t i = 0; i < s.size(); ++i)
        out += fmt::format("{:>7} {:>6} {:>16} {:>16}\n", fmt::format("{}-{}", s[i], s[i] + w[i] - 1), k[i], sci(sh[i]),
                           sci(pl[i]));
    }
    return out;
  }
};

}  // namespace
}  // namespace latentq

LATENTQ_DEFINE_PROBE(cross_layer, latentq::CrossLayerProbe)
