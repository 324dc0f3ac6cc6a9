// The groups of a study's results file (latentq/result_groups.h).
#include "latentq/result_groups.h"

#include <fmt/format.h>

#include <set>
#include <stdexcept>

#include "latentq/batch.h"
#include "latentq/decision.h"
#include "latentq/plan_runs.h"
#include "latentq/probe_registry.h"
#include "latentq/study.h"

namespace latentq {

const std::vector<GroupSpec>& results_groups() {
  static const std::vector<GroupSpec> all = [] {
    std::vector<GroupSpec> v = {latent_error_spec()};
    for (const Probe* p : registered_probes())
      for (GroupSpec& g : p->groups()) v.push_back(std::move(g));
    for (const GroupSpec* g :
         {&summary_spec(), &v4_cache_spec(), &score_vs_attention_spec(), &decision_spec(), &cells_spec()})
      v.push_back(*g);
    v.push_back(plan_runs_spec());  // the planner's runs for the e2e step (latentq/plan_runs.h)
    std::set<std::string> names;
    for (const GroupSpec& g : v)
      if (!names.insert(g.name).second)
        throw std::logic_error(fmt::format("results_groups: group /{} declared twice", g.name));
    return v;
  }();
  return all;
}

const GroupSpec* find_results_group(std::string_view name) {
  for (const GroupSpec& g : results_groups())
    if (g.name == name) return &g;
  return nullptr;
}

}  // namespace latentq
