// `latentq plan` (latentq/plan.h).
#include "latentq/plan.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <stdexcept>

#include "latentq/batch_study.h"
#include "latentq/results.h"
#include "latentq/table.h"

namespace latentq {

PlanSolution solve_plan(const std::vector<PlanGroup>& groups, double budget) {
  if (groups.empty()) throw std::invalid_argument("plan: no (layer, target) group to assign");
  if (!std::isfinite(budget)) throw std::invalid_argument(fmt::format("plan: budget {} is not finite", budget));
  const size_t G = groups.size();
  std::vector<std::vector<int64_t>> cost(G);
  int64_t min_units = 0;
  double min_bytes = 0;
  for (size_t g = 0; g < G; ++g) {
    const PlanGroup& grp = groups[g];
    if (grp.options.empty())
      throw std::invalid_argument(fmt::format("plan: layer {} {} has no measured option", grp.layer, to_string(grp.target)));
    int64_t mu = std::numeric_limits<int64_t>::max();
    double mb = std::numeric_limits<double>::infinity();
    for (const PlanOption& o : grp.options) {
      if (!std::isfinite(o.bytes) || o.bytes < 0 || !std::isfinite(o.objective))
        throw std::invalid_argument(fmt::format("plan: layer {} {} {}: bytes {} / objective {} (expected finite, bytes >= 0)",
                                                grp.layer, to_string(grp.target), o.quantizer, o.bytes, o.objective));
      const int64_t u = static_cast<int64_t>(std::ceil(o.bytes * kPlanUnitsPerByte - 1e-9));
      cost[g].push_back(u);
      mu = std::min(mu, u);
      mb = std::min(mb, o.bytes);
    }
    min_units += mu;
    min_bytes += mb;
  }
  const int64_t B = budget < 0 ? -1 : static_cast<int64_t>(std::floor(budget * kPlanUnitsPerByte + 1e-9));
  if (B < min_units)
    throw std::invalid_argument(fmt::format(
        "plan: budget {} bytes/token is below the cheapest assignment ({:.4f} bytes/token: the cheapest measured "
        "quantizer of every layer and target)", budget, std::max(min_bytes, static_cast<double>(min_units) / kPlanUnitsPerByte)));
  // best[b] = min objective of groups 0..g with total units exactly ≤ b (monotone in b).
  const double inf = std::numeric_limits<double>::infinity();
  const size_t W = static_cast<size_t>(B) + 1;
  std::vector<double> best(W, 0.0), next(W);
  std::vector<std::vector<int32_t>> pick(G, std::vector<int32_t>(W, -1));
  for (size_t g = 0; g < G; ++g) {
    std::fill(next.begin(), next.end(), inf);
    for (size_t o = 0; o < cost[g].size(); ++o) {
      const int64_t c = cost[g][o];
      const double v = groups[g].options[o].objective;
      for (size_t b = static_cast<size_t>(std::min<int64_t>(c, B + 1)); b < W; ++b) {
        const double prev = best[b - static_cast<size_t>(c)];
        if (prev + v < next[b]) {
          next[b] = prev + v;
          pick[g][b] = static_cast<int32_t>(o);
        }
      }
    }
    best.swap(next);
  }
  PlanSolution s;
  s.choice.assign(G, 0);
  size_t b = W - 1;
  for (size_t g = G; g-- > 0;) {
    const int32_t o = pick[g][b];
    if (o < 0) throw std::logic_error("plan: no assignment fits (internal)");
    s.choice[g] = static_cast<size_t>(o);
    b -= static_cast<size_t>(cost[g][static_cast<size_t>(o)]);
    s.bytes += groups[g].options[static_cast<size_t>(o)].bytes;
    s.objective += groups[g].options[static_cast<size_t>(o)].objective;
  }
  return s;
}

PlanInputs read_plan_inputs(const std::filesystem::path& results, const std::string& objective) {
  if (objective != "kl" && objective != "mse")
    throw std::invalid_argument(fmt::format("--objective '{}': expected kl or mse", objective));
  const Attrs root = read_results_attrs(results);
  const DumpAttrs A = dump_attrs_from_results(root);
  const std::vector<std::string> groups = list_tables(results);
  auto need = [&](const std::string& g) {
    if (std::find(groups.begin(), groups.end(), g) == groups.end())
      throw std::invalid_argument(fmt::format("{}: no /{} group{}", results.string(), g,
                                              g == "attention_error" ? " (use --objective mse, or a study with [attention] "
                                                                       "targets \"c_kv\" and \"k_pe\")" : ""));
  };
  need("latent_error");
  const ColumnTable le = read_table(results, "latent_error");
  const auto& layer = le.get<int64_t>("layer");
  const auto& target = le.get<std::string>("target");
  const auto& quant = le.get<std::string>("quantizer");
  const auto& bpt = le.get<double>("bytes_per_token_layer");
  const auto& mse = le.get<double>("mse");
  std::map<std::tuple<int64_t, std::string, std::string>, double> kl;
  if (objective == "kl") {
    need("attention_error");
    const ColumnTable ae = read_table(results, "attention_error");
    const auto& al = ae.get<int64_t>("layer");
    const auto& aq = ae.get<std::string>("quantizer");
    const auto& at = ae.get<std::string>("targets");
    const auto& ak = ae.get<double>("kl_mean");
    for (size_t i = 0; i < al.size(); ++i)
      if (at[i] == "c_kv" || at[i] == "k_pe") kl[{al[i], at[i], aq[i]}] = ak[i];
    if (kl.empty())
      throw std::invalid_argument(fmt::format("{}: /attention_error has no single-target rows (targets \"c_kv\" or "
                                              "\"k_pe\"); use --objective mse or add them to [attention] targets",
                                              results.string()));
  }
  std::set<int64_t> studied(layer.begin(), layer.end());
  const double scale = static_cast<double>(A.num_layers) / static_cast<double>(std::max<size_t>(studied.size(), 1));
  PlanInputs in;
  in.objective = objective;
  in.objective_note = objective == "kl"
                          ? "sum over layers and targets of the attention KL (nats) with that target alone quantized"
                          : "sum over layers and targets of the latent squared error per token (mse x width)";
  std::map<std::pair<int64_t, std::string>, size_t> index;
  for (size_t i = 0; i < layer.size(); ++i) {
    try {
      QuantSpec::parse(quant[i]);
    } catch (const std::invalid_argument&) {
      continue;  // a mixed assignment's row
    }
    const auto key = std::make_pair(layer[i], target[i]);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, in.groups.size()).first;
      in.groups.push_back({static_cast<int>(layer[i]), parse_target(target[i]), {}});
    }
    const double width = target[i] == "c_kv" ? static_cast<double>(A.kv_lora_rank) : static_cast<double>(A.qk_rope_head_dim);
    double obj = mse[i] * width;
    if (objective == "kl") {
      const auto k = kl.find({layer[i], target[i], quant[i]});
      if (k == kl.end()) continue;
      obj = k->second;
    }
    in.groups[it->second].options.push_back({quant[i], bpt[i] * scale, obj});
  }
  if (in.groups.empty()) throw std::invalid_argument(results.string() + ": /latent_error has no quantizer rows");
  for (const PlanOption& o : in.groups.front().options) {
    const bool everywhere = std::all_of(in.groups.begin(), in.groups.end(), [&](const PlanGroup& g) {
      return std::any_of(g.options.begin(), g.options.end(), [&](const PlanOption& x) { return x.quantizer == o.quantizer; });
    });
    if (everywhere) in.uniform.push_back(o.quantizer);
  }
  return in;
}

std::string plan_config_text(const std::filesystem::path& results, const std::vector<PlanGroup>& groups,
                             const PlanSolution& plan, const std::string& uniform, const std::string& header) {
  const Attrs root = read_results_attrs(results);
  const StudyConfig src = config_from_results(root);
  const AttrValue& input = attr(root, "input_path");
  if (!std::holds_alternative<std::string>(input))
    throw std::invalid_argument(results.string() + ": attribute 'input_path' is not a string");
  toml::table t;
  std::set<int> layers;
  std::vector<std::string> targets;
  for (const PlanGroup& g : groups) {
    layers.insert(g.layer);
    const std::string tg(to_string(g.target));
    if (std::find(targets.begin(), targets.end(), tg) == targets.end()) targets.push_back(tg);
  }
  toml::array la, ta;
  for (int l : layers) la.push_back(l);
  for (const std::string& s : targets) ta.push_back(s);
  t.insert("input", toml::table{{"dump", std::get<std::string>(input)}, {"layers", la}, {"targets", ta}});
  if (!uniform.empty()) t.insert("quantizers", toml::table{{"extra", toml::array{uniform}}});
  toml::array mixed;
  for (size_t i = 0; i < groups.size(); ++i) {
    const PlanGroup& g = groups[i];
    mixed.push_back(toml::table{{"name", "mixed"},
                                {"layers", toml::array{g.layer}},
                                {std::string(to_string(g.target)), g.options[plan.choice[i]].quantizer}});
  }
  t.insert("mixed", mixed);
  toml::table e2e{{"enabled", src.probes.e2e.enabled}};
  if (!src.probes.e2e.model.empty()) e2e.insert("model", std::filesystem::absolute(src.probes.e2e.model).lexically_normal().string());
  t.insert("e2e", e2e);
  std::ostringstream out;
  std::istringstream h(header);
  for (std::string line; std::getline(h, line);) out << "# " << line << "\n";
  out << "\n" << t << "\n";
  return out.str();
}

void write_text_atomic(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp =
      path.parent_path() / fmt::format(".{}.{}.tmp", path.filename().string(), static_cast<long>(::getpid()));
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    if (!f) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw std::runtime_error(path.string() + ": cannot write");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw std::runtime_error(path.string() + ": cannot write (rename failed)");
  }
}

}  // namespace latentq
