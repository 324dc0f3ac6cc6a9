// The SVD pruning probe on c_kv: [svd] → /svd and /svd_spectrum, one cell per studied layer
// ("003/svd"). Definitions: study/README.md ("Fit / held-out split", "Energy ranks").
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "latentq/config.h"
#include "latentq/probe_registry.h"
#include "latentq/layer_shared.h"
#include "latentq/probe_study.h"
#include "latentq/split.h"
#include "latentq/analysis/svd_probe.h"

namespace latentq {

namespace {

constexpr double kEnergyFractions[] = {0.9, 0.99, 0.999};
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct SvdCell {
  int layer = 0;
};

const GroupSpec kSvd = {
    "svd",
    {{"layer", ColType::I64, "", "the layer index"},
     {"rank", ColType::I64, "", "r: the basis vectors kept (r bf16 coefficients per token)"},
     {"centered", ColType::I64, "", "1: the fit mean is subtracted first and stored; 0: uncentered"},
     {"fit_tokens", ColType::I64, "", "tokens of the fit split (the first half of the sequences)"},
     {"heldout_tokens", ColType::I64, "", "tokens of the held-out split (the other sequences)"},
     {"heldout_rel_fro", ColType::F64, "1", "‖X − X̂_r‖_F / ‖X‖_F of c_kv's rank-r reconstruction on the held-out split"},
     {"fit_rel_fro", ColType::F64, "1", "the same on the fit split"},
     {"fit_energy", ColType::F64, "1", "Σ_{i≤r} σ_i² / Σ σ_i² of the fit matrix"},
     {"rank_90", ColType::I64, "", "the smallest r holding 90% of the fit matrix's energy (the layer's, on each row)"},
     {"rank_99", ColType::I64, "", "the same for 99%"},
     {"rank_999", ColType::I64, "", "the same for 99.9%"}}};
const GroupSpec kSpectrum = {"svd_spectrum",
                             {{"layer", ColType::I64, "", "the layer index"},
                              {"index", ColType::I64, "", "i: the singular value's index, 0 = the largest"},
                              {"singular_value", ColType::F64, "latent unit",
                               "σ_i of c_kv's fit matrix (centered as [svd] centered says)"}}};

std::string sci(double x) { return std::isfinite(x) ? fmt::format("{:.3e}", x) : std::string("-"); }

class SvdProbe final : public Probe {
 public:
  std::string section() const override { return "svd"; }
  int order() const override { return 100; }
  int print_order() const override { return 200; }  // after the attention table

  std::shared_ptr<const ProbeSettings> parse(const SettingsReader& r) const override {
    auto S = std::make_shared<SvdSettings>();
    r.check_keys({"enabled", "centered", "ranks"});
    if (auto v = r.boolean("enabled")) S->enabled = *v;
    if (auto v = r.boolean("centered")) S->centered = *v;
    if (auto v = r.ints("ranks", 1)) {
      S->ranks = *v;
      std::sort(S->ranks.begin(), S->ranks.end());
    }
    return S;
  }

  std::vector<GroupSpec> groups() const override { return {kSvd, kSpectrum}; }

  // DeepSeek-V4 caches no c_kv + k_pe: nothing to measure.
  std::pair<Target, std::string> not_applicable_reason(const StudyConfig& config,
                                                       const DumpAttrs& attrs) const override {
    if (!probe_settings<SvdSettings>(config, "svd").enabled || attrs.family().holds(Target::CKV))
      return {Target::CKV, ""};
    return {Target::CKV,
            fmt::format("not applicable to {} (no c_kv + k_pe): the SVD of c_kv skipped", attrs.cache_family)};
  }

  ProbePart plan(const StudyConfig& config, const Dump& dump) const override {
    ProbePart p;
    if (const auto na = not_applicable_reason(config, dump.attrs); !na.second.empty()) {
      p.notes.push_back("svd: " + na.second);
      return p;
    }
    if (!dump.attrs.family().holds(Target::CKV)) return p;  // disabled on a family without c_kv
    // One line for every automatic rank list capped by a short dump ([svd], [cross_layer]).
    p.warnings = rank_cap_warnings(config, dump);
    if (!probe_settings<SvdSettings>(config, "svd").enabled) return p;
    svd_ranks(config, dump);  // throws for ranks the dump cannot take
    p.groups = {"svd", "svd_spectrum"};
    for (const Layer& l : dump.layers)
      p.cells.push_back(
          ProbeCell::make(this, fmt::format("{:03d}/svd", l.index), p.groups, {l.index}, false, SvdCell{l.index}));
    return p;
  }

  std::vector<ColumnTable> run(const StudyConfig& config, const ProbeCell& cell, const LayerAccess& in) const override {
    const SvdCell& c = cell.as<SvdCell>();
    const Dump& dump = in.header();
    probes::SvdProbeOptions opt;
    opt.centered = probe_settings<SvdSettings>(config, "svd").centered;
    opt.ranks = svd_ranks(config, dump);
    opt.energy_fractions.assign(std::begin(kEnergyFractions), std::end(kEnergyFractions));
    const probes::SvdProbeResult p =
        probes::svd_probe(in.layer(c.layer).c_kv.data(), dump.num_tokens(), dump.attrs.kv_lora_rank, dump.seq_offsets,
                          opt, svd_split_fit(in, c.layer, opt.centered).get());
    ColumnTable t = empty_table(kSvd), s = empty_table(kSpectrum);
    for (const probes::SvdRankError& e : p.ranks)
      add_row(t,
              {int64_t{c.layer}, e.rank, int64_t{p.centered ? 1 : 0}, p.fit_tokens, p.heldout_tokens, e.heldout_rel_fro,
               e.fit_rel_fro, e.fit_energy, p.energy_ranks[0], p.energy_ranks[1], p.energy_ranks[2]});
    for (int64_t i = 0; i < p.basis.singular_values.size(); ++i)
      add_row(s, {int64_t{c.layer}, i, p.basis.singular_values[i]});
    return {std::move(t), std::move(s)};
  }

  std::vector<std::string> row_keys(const std::string&, const ColumnTable& t) const override {
    std::vector<std::string> k;
    for (int64_t l : t.get<int64_t>("layer")) k.push_back(fmt::format("{:03d}/svd", l));
    return k;
  }

  // Per layer: rank_90/99/999, held-out rel_fro at kv_lora_rank/4 and /2, fit rel_fro at /2, the gap.
  std::string report(const ProbeReportInput& in) const override {
    const NamedTable* found = in.find("svd");
    if (!found || found->table.num_rows() == 0) return {};
    const ColumnTable& svd = found->table;
    const DumpAttrs& A = in.attrs;
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
    out += fmt::format(
        "\nSVD of c_kv (kv_lora_rank {}; energy ranks of the fit split; rel_fro of the rank-r "
        "reconstruction)\n",
        r);
    out += fmt::format("{:>5} {:>7} {:>7} {:>8} | {:>12} {:>12} {:>12} {:>12}\n", "layer", "rank_90", "rank_99",
                       "rank_999", fmt::format("held-out {}", q4), fmt::format("held-out {}", h2),
                       fmt::format("fit {}", h2), "gap");
    for (int64_t l : layers) {
      size_t i0 = 0;
      while (layer[i0] != l) ++i0;
      const double hh = at(l, h2, ho), fh = at(l, h2, fit);
      out += fmt::format("{:>5} {:>7} {:>7} {:>8} | {:>12} {:>12} {:>12} {:>12}\n", l, r90[i0], r99[i0], r999[i0],
                         sci(at(l, q4, ho)), sci(hh), sci(fh), sci(hh - fh));
    }
    out += fmt::format(
        "gap = held-out - fit rel_fro at rank {}; fit = first half of the non-empty sequences, held-out "
        "= the rest.\n",
        h2);
    return out;
  }
};

}  // namespace
}  // namespace latentq

LATENTQ_DEFINE_PROBE(svd, latentq::SvdProbe)
