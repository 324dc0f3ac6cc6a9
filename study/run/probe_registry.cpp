// The probe registry (latentq/probe_registry.h): the descriptors of study/probes/*.cpp, listed
// by the build in latentq_probe_list.inc (one LATENTQ_PROBE(<file stem>) per file).
#include "latentq/probe_registry.h"

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

ColumnTable empty_table(const GroupSpec& g) {
  ColumnTable t;
  for (const ColumnSpec& c : g.columns) {
    switch (c.type) {
      case ColType::I64:
        t.add<int64_t>(c.name);
        break;
      case ColType::F64:
        t.add<double>(c.name);
        break;
      case ColType::Str:
        t.add<std::string>(c.name);
        break;
    }
  }
  return t;
}

void add_row(ColumnTable& t, const std::vector<RowValue>& values) {
  const auto& cols = t.columns();
  if (values.size() != cols.size()) throw std::logic_error("add_row: wrong number of values");
  size_t i = 0;
  for (const auto& [name, col] : cols) {
    Column& c = t.at(name);
    const RowValue& v = values[i++];
    if (c.index() != v.index()) throw std::logic_error("add_row: column '" + name + "' has another type");
    switch (c.index()) {
      case 0:
        std::get<0>(c).push_back(std::get<int64_t>(v));
        break;
      case 1:
        std::get<1>(c).push_back(std::get<double>(v));
        break;
      default:
        std::get<2>(c).push_back(std::get<std::string>(v));
        break;
    }
  }
}

const NamedTable* ProbeReportInput::find(const std::string& group) const {
  for (const NamedTable& t : tables)
    if (t.group == group) return &t;
  return nullptr;
}

}  // namespace latentq
