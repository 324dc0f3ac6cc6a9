// The /score_vs_attention table (latentq/study.h): how well score_mse and mse order the quantizers the way
// attention KL does.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "latentq/analysis/rank_correlation.h"
#include "latentq/study.h"

namespace latentq {
namespace {

// One quantizer's values on one (layer, target).
struct Triple {
  double score_mse, mse, kl, bits;
};

// The fewest quantizers of a bits band with a row of their own.
constexpr size_t kMinBand = 3;

}  // namespace

const GroupSpec& score_vs_attention_spec() {
  static const GroupSpec g{
      "score_vs_attention",
      {{"layer", ColType::I64, "", "the layer index; -1: the quantizers present on every layer, ranked by their means"},
       {"target", ColType::Str, "", "the latent quantized alone: c_kv or k_pe"},
       {"bits_band", ColType::I64, "bit/element",
        "-1: all quantizers; k: those whose mean bits_per_element is in [k, k + 1)"},
       {"n_quantizers", ColType::I64, "", "the quantizers ranked (rows with a non-finite value left out)"},
       {"spearman_score_mse", ColType::F64, "1",
        "Spearman's rho across quantizers between score_mse and the attention KL of that target alone"},
       {"spearman_mse", ColType::F64, "1", "the same for mse"}}};
  return g;
}

ColumnTable score_vs_attention(const ColumnTable& le, const ColumnTable& ae) {
  for (const char* c : {"layer", "target", "quantizer", "bits_per_element", "mse", "score_mse"})
    if (!le.has(c)) throw std::invalid_argument(fmt::format("score_vs_attention: /latent_error has no column '{}'", c));
  for (const char* c : {"layer", "targets", "quantizer", "kl_mean"})
    if (!ae.has(c))
      throw std::invalid_argument(fmt::format("score_vs_attention: /attention_error has no column '{}'", c));
  // kl_mean of the /attention_error rows that quantize one target alone, by (layer, target, quantizer).
  std::map<std::tuple<int64_t, std::string, std::string>, double> kl;
  {
    const auto& l = ae.get<int64_t>("layer");
    const auto& tg = ae.get<std::string>("targets");
    const auto& q = ae.get<std::string>("quantizer");
    const auto& k = ae.get<double>("kl_mean");
    for (size_t i = 0; i < l.size(); ++i)
      if (tg[i] == "c_kv" || tg[i] == "k_pe") kl[{l[i], tg[i], q[i]}] = k[i];
  }
  // target (first-seen order) -> layer -> quantizer -> values; rows with a non-finite value are left out.
  std::vector<std::string> targets;
  std::map<std::string, std::map<int64_t, std::map<std::string, Triple>>> by;
  const auto& l = le.get<int64_t>("layer");
  const auto& tg = le.get<std::string>("target");
  const auto& q = le.get<std::string>("quantizer");
  const auto& mse = le.get<double>("mse");
  const auto& smse = le.get<double>("score_mse");
  const auto& bpe = le.get<double>("bits_per_element");
  for (size_t i = 0; i < l.size(); ++i) {
    const auto it = kl.find({l[i], tg[i], q[i]});
    if (it == kl.end() || !std::isfinite(it->second) || !std::isfinite(mse[i]) || !std::isfinite(smse[i])) continue;
    if (!by.count(tg[i])) targets.push_back(tg[i]);
    by[tg[i]][l[i]][q[i]] = {smse[i], mse[i], it->second, bpe[i]};
  }
  ColumnTable t = empty_table(score_vs_attention_spec());
  auto& layer = t.get<int64_t>("layer");
  auto& target = t.get<std::string>("target");
  auto& band = t.get<int64_t>("bits_band");
  auto& n_q = t.get<int64_t>("n_quantizers");
  auto& rho_score = t.get<double>("spearman_score_mse");
  auto& rho_mse = t.get<double>("spearman_mse");
  auto add = [&](int64_t lay, const std::string& tgt, int64_t bits, const std::vector<Triple>& v) {
    std::vector<double> s, m, k;
    for (const Triple& x : v) s.push_back(x.score_mse), m.push_back(x.mse), k.push_back(x.kl);
    layer.push_back(lay);
    target.push_back(tgt);
    band.push_back(bits);
    n_q.push_back(static_cast<int64_t>(v.size()));
    rho_score.push_back(spearman(s, k));
    rho_mse.push_back(spearman(m, k));
  };
  for (const std::string& tgt : targets) {
    const auto& layers = by.at(tgt);
    for (const auto& [lay, qs] : layers) {
      std::vector<Triple> v;
      for (const auto& [name, x] : qs) v.push_back(x);
      add(lay, tgt, -1, v);
    }
    // layer -1: per quantizer present on every layer above, the means over those layers.
    std::set<std::string> common;
    for (const auto& [name, x] : layers.begin()->second) common.insert(name);
    for (const auto& [lay, qs] : layers)
      std::erase_if(common, [&](const std::string& name) { return !qs.count(name); });
    std::vector<Triple> v;
    for (const std::string& name : common) {
      Triple m{0, 0, 0, 0};
      for (const auto& [lay, qs] : layers) {
        const Triple& x = qs.at(name);
        m.score_mse += x.score_mse, m.mse += x.mse, m.kl += x.kl, m.bits += x.bits;
      }
      const double n = static_cast<double>(layers.size());
      v.push_back({m.score_mse / n, m.mse / n, m.kl / n, m.bits / n});
    }
    add(-1, tgt, -1, v);
    // ... and within each bits band k (mean bits_per_element in [k, k + 1)) of at least kMinBand of them.
    std::map<int64_t, std::vector<Triple>> bands;
    for (const Triple& x : v) bands[static_cast<int64_t>(std::floor(x.bits))].push_back(x);
    for (const auto& [k, b] : bands)
      if (b.size() >= kMinBand) add(-1, tgt, k, b);
  }
  return t;
}

}  // namespace latentq
