// The (quantizer, target) pairs a format cannot take (latentq/applicable.h).
#include "latentq/applicable.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <tuple>

#include "latentq/probe_registry.h"
#include "latentq/study.h"
#include "latentq/transform.h"

namespace latentq {

std::string why_not_applicable(const Quantizer& q, Target target, const DumpAttrs& dims) {
  const int64_t D = dims.width(target);
  if (!q.is_mixed()) return why_not_applicable(q.spec, target, D);
  for (const MixedRule& r : q.mixed)
    if (r.target == target)
      if (std::string why = why_not_applicable(r.spec, target, D); !why.empty()) return why;
  return "";
}

std::vector<NotApplicable> not_applicable(const StudyConfig& config, const DumpAttrs& dims) {
  std::vector<NotApplicable> out;
  const auto add = [&](const std::string& name, Target t, std::string why) {
    if (why.empty()) return;
    if (std::any_of(out.begin(), out.end(),
                    [&](const NotApplicable& n) { return n.quantizer == name && n.target == t; }))
      return;
    out.push_back({name, t, dims.width(t), std::move(why)});
  };
  for (const TargetPlan& p : latent_error_targets(config, dims))
    for (const Quantizer& q : p.quantizers) add(q.name, p.target, why_not_applicable(q, p.target, dims));
  for (const Probe* probe : registered_probes())
    for (const auto& [name, t] : probe->quantized_pairs(config))
      add(name, t, why_not_applicable(TransformedSpec::parse(name).spec, t, dims.width(t)));
  return out;
}

const GroupSpec& not_applicable_spec() {
  static const GroupSpec g{
      "not_applicable",
      {{"quantizer", ColType::Str, "", "the quantizer, as /summary names it"},
       {"target", ColType::Str, "", "the cached tensor its format cannot take: c_kv, k_pe or index_k"},
       {"width", ColType::I64, "", "elements per row of the target in the dump (kv_lora_rank or qk_rope_head_dim)"},
       {"reason", ColType::Str, "", "why the format cannot take that width (the format table's shapes)"}}};
  return g;
}

ColumnTable not_applicable_table(const std::vector<NotApplicable>& pairs) {
  ColumnTable t = empty_table(not_applicable_spec());
  for (const NotApplicable& n : pairs) add_row(t, {n.quantizer, std::string(to_string(n.target)), n.width, n.reason});
  return t;
}

std::string format_not_applicable(const std::vector<NotApplicable>& pairs) {
  using Key = std::tuple<Target, int64_t, std::string>;
  std::vector<std::pair<Key, std::vector<std::string>>> lines;
  for (const NotApplicable& n : pairs) {
    const Key k{n.target, n.width, n.reason};
    auto it = std::find_if(lines.begin(), lines.end(), [&](const auto& l) { return l.first == k; });
    if (it == lines.end()) it = lines.insert(lines.end(), {k, {}});
    it->second.push_back(n.quantizer);
  }
  std::string out;
  for (const auto& [k, names] : lines)
    out += fmt::format("not applicable: {} on {} ({} wide): {}\n", fmt::join(names, ", "), to_string(std::get<0>(k)),
                       std::get<1>(k), std::get<2>(k));
  return out;
}

}  // namespace latentq
