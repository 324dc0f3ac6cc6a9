// The planner's assignments at the decision's budgets, stored for the e2e step (latentq/plan_runs.h).
#include "latentq/plan_runs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <stdexcept>

#include "latentq/batch_study.h"
#include "latentq/results.h"
#include "latentq/spec.h"
#include "latentq/transform.h"

namespace latentq {
namespace {

bool is_spec(const std::string& q) {
  try {
    (void)TransformedSpec::parse(q);
    return true;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

bool has_group(const std::filesystem::path& results, const char* g) {
  const std::vector<std::string> groups = list_tables(results);
  return std::find(groups.begin(), groups.end(), g) != groups.end();
}

}  // namespace

std::map<std::string, Assignment> study_mixed_assignments(const ColumnTable& le) {
  std::map<std::string, Assignment> out;
  if (!le.has("stored") || !le.has("transform")) return out;
  const auto& q = le.get<std::string>("quantizer");
  for (size_t i = 0; i < q.size(); ++i) {
    if (is_spec(q[i])) continue;
    out[q[i]][{le.get<int64_t>("layer")[i], le.get<std::string>("target")[i]}] = {
        le.get<std::string>("transform")[i], le.get<std::string>("stored")[i]};
  }
  return out;
}

DecisionPlans decision_plans(const std::filesystem::path& results, const std::vector<double>& fractions) {
  const double bf16 = static_cast<double>(dump_attrs_from_results(read_results_attrs(results)).bf16_bytes_per_token());
  DecisionPlans p;
  try {
    p.in = read_plan_inputs(results, "kl");
  } catch (const std::invalid_argument&) {  // no single-target /attention_error rows
    p.in = read_plan_inputs(results, "mse");
  }
  for (const double f : fractions) {
    try {
      p.at.emplace_back(solve_plan(p.in.groups, f * bf16, p.in.units_per_byte));
    } catch (const std::invalid_argument&) {  // the budget is below the cheapest assignment
      p.at.emplace_back(std::nullopt);
    }
  }
  return p;
}

Assignment plan_assignment(const PlanInputs& in, const PlanSolution& s) {
  Assignment a;
  for (size_t g = 0; g < in.groups.size(); ++g) {
    const PlanGroup& G = in.groups[g];
    const TransformedSpec ts = TransformedSpec::parse(G.options[s.choice[g]].quantizer);
    const std::string tr = ts.transform.to_string();
    a[{G.layer, to_string(G.target)}] = {tr.empty() ? "none" : tr, ts.spec.stored_for(G.target).to_string()};
  }
  return a;
}

std::string budget_fraction_label(double f) {
  for (int den : {2, 4, 8, 16, 32, 64})
    for (int num = 1; num <= den; ++num)
      if (std::abs(f * den - num) < 1e-12) {
        const int g = std::gcd(num, den);
        return num == den ? "all" : fmt::format("{}/{}", num / g, den / g);
      }
  return fmt::format("{:.4g}", f);
}

const GroupSpec& plan_runs_spec() {
  static const GroupSpec g{
      "plan_runs",
      {{"run", ColType::Str, "",
        "the run's name: its /e2e rows' quantizer (plan-<budget>: the first budget where the planner chose it)"},
       {"budget_fraction", ColType::F64, "1", "that budget, as a fraction of the whole-model bf16 cache"},
       {"layer", ColType::I64, "", "the layer of the (layer, target) group"},
       {"target", ColType::Str, "", "c_kv or k_pe"},
       {"quantizer", ColType::Str, "", "the planner's choice for the group: a spec or a transformed spec"},
       {"transform", ColType::Str, "", "its transform (none when untransformed), as /latent_error's column"},
       {"stored", ColType::Str, "", "the spec the target stores, as /latent_error's column; the e2e step quantizes "
                                    "with it, behind the transform"},
       {"bytes_per_token_model", ColType::F64, "byte/token",
        "the whole assignment's cache: whole model, c_kv + k_pe, metadata included (the planner's exact total)"},
       {"plan_objective", ColType::F64, "",
        "the planner's objective of the whole assignment (the attribute objective: kl or mse)"}}};
  return g;
}

std::vector<std::pair<std::string, Assignment>> planned_runs(const std::filesystem::path& results) {
  std::vector<std::pair<std::string, Assignment>> out;
  if (!has_group(results, "plan_runs")) return out;
  const ColumnTable t = read_table(results, "plan_runs");
  const auto& run = t.get<std::string>("run");
  for (size_t i = 0; i < t.num_rows(); ++i) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& r) { return r.first == run[i]; });
    if (it == out.end()) it = out.emplace(out.end(), run[i], Assignment{});
    it->second[{t.get<int64_t>("layer")[i], t.get<std::string>("target")[i]}] = {t.get<std::string>("transform")[i],
                                                                                 t.get<std::string>("stored")[i]};
  }
  return out;
}

std::vector<std::string> write_plan_runs(const std::filesystem::path& results, const std::vector<double>& fractions) {
  const DecisionPlans p = decision_plans(results, fractions);
  const std::map<std::string, Assignment> mixed = study_mixed_assignments(read_table(results, "latent_error"));
  std::vector<std::pair<std::string, Assignment>> runs = planned_runs(results);  // kept, then added
  ColumnTable t = has_group(results, "plan_runs") ? read_table(results, "plan_runs") : empty_table(plan_runs_spec());
  std::set<std::string> names;
  for (const auto& [name, a] : runs) names.insert(name);
  std::vector<std::string> needed;
  bool added = false;
  for (size_t k = 0; k < fractions.size(); ++k) {
    if (!p.at[k]) continue;
    const PlanSolution& s = *p.at[k];
    const Assignment a = plan_assignment(p.in, s);
    std::string name;
    for (const auto& [n, m] : runs)
      if (name.empty() && m == a) name = n;
    if (name.empty() && std::any_of(mixed.begin(), mixed.end(), [&](const auto& m) { return m.second == a; }))
      continue;  // a [[mixed]] assignment of the study: the e2e step runs it under its own name
    if (name.empty()) {
      const std::string base = "plan-" + budget_fraction_label(fractions[k]);
      name = base;
      for (int i = 2; names.count(name); ++i) name = fmt::format("{}-{}", base, i);
      names.insert(name);
      runs.emplace_back(name, a);
      for (size_t g = 0; g < p.in.groups.size(); ++g) {
        const PlanGroup& G = p.in.groups[g];
        const std::string& q = G.options[s.choice[g]].quantizer;
        const auto& [transform, stored] = a.at({G.layer, to_string(G.target)});
        add_row(t, {name, fractions[k], static_cast<int64_t>(G.layer), to_string(G.target), q, transform, stored,
                    s.bytes, s.objective});
      }
      added = true;
    }
    if (std::find(needed.begin(), needed.end(), name) == needed.end()) needed.push_back(name);
  }
  if (added) {
    const Attrs attrs = {
        {"objective", p.in.objective},
        {"definition", std::string("the planner's assignment at the decision's budgets (latentq/plan_runs.h): the e2e "
                                   "step runs each as a mixed run named by its run column")}};
    write_results(results, {}, {{"plan_runs", t, attrs}}, WriteMode::Update);
  }
  return needed;
}

}  // namespace latentq
