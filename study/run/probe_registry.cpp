// The probe registry (latentq/probe_registry.h): the descriptors of study/probes/*.cpp, listed
// by the build in latentq_probe_list.inc (one LATENTQ_PROBE(<file stem>) per file).
#include "latentq/probe_registry.h"

#include "latentq/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <stdexcept>

namespace latentq {

namespace registry {
#define LATENTQ_PROBE(name) const ::latentq::Probe& probe_##name();
#include "latentq_probe_list.inc"
#undef LATENTQ_PROBE
}  // namespace registry

std::vector<TargetPlan> Probe::latent_targets(const StudyConfig&, const DumpAttrs&) const { return {}; }
std::pair<Target, std::string> Probe::not_applicable_reason(const StudyConfig&, const DumpAttrs&) const {
  return {Target::CKV, ""};
}

const std::vector<const Probe*>& registered_probes() {
  static const std::vector<const Probe*> probes = [] {
    std::vector<const Probe*> v = {
#define LATENTQ_PROBE(name) &registry::probe_##name(),
#include "latentq_probe_list.inc"
#undef LATENTQ_PROBE
    };
    std::stable_sort(v.begin(), v.end(), [](const Probe* a, const Probe* b) { return a->order() < b->order(); });
    std::set<std::string> sections, groups;
    std::set<int> orders;
    for (const Probe* p : v) {
      if (!sections.insert(p->section()).second || !orders.insert(p->order()).second)
        throw std::logic_error(
            fmt::format("probe registry: section [{}] or order {} registered twice", p->section(), p->order()));
      for (const GroupSpec& g : p->groups())
        if (!groups.insert(g.name).second)
          throw std::logic_error(fmt::format("probe registry: group /{} written by two probes", g.name));
    }
    return v;
  }();
  return probes;
}

const Probe* find_probe(std::string_view section) {
  for (const Probe* p : registered_probes())
    if (p->section() == section) return p;
  return nullptr;
}

const Probe* probe_of_group(std::string_view group) {
  for (const Probe* p : registered_probes())
    for (const GroupSpec& g : p->groups())
      if (g.name == group) return p;
  return nullptr;
}

const GroupSpec& probe_group_spec(const std::string& group) {
  static const std::vector<GroupSpec> all = [] {
    std::vector<GroupSpec> v;
    for (const Probe* p : registered_probes())
      for (GroupSpec& g : p->groups()) v.push_back(std::move(g));
    return v;
  }();
  for (const GroupSpec& g : all)
    if (g.name == group) return g;
  throw std::invalid_argument(fmt::format("'{}' is not a probe group", group));
}

const NamedTable* ProbeReportInput::find(const std::string& group) const {
  for (const NamedTable& t : tables)
    if (t.group == group) return &t;
  return nullptr;
}

}  // namespace latentq
