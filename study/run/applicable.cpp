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

namespace {

// Why `q` cannot store DeepSeek-V4's entry rows (window_kv, compressed_kv: head_dim wide, the last
// qk_rope_head_dim rotated) or V4's index_k, or "" when it can.
std::string why_not_on_v4(const Quantizer& q, Target target, const DumpAttrs& dims) {
  if (q.is_mixed())
    return fmt::format("a [[mixed]] assignment assigns c_kv and k_pe; {} caches no c_kv + k_pe", dims.cache_family);
  if (fit_reads_queries(q.transform.kind))
    return fmt::format("{} fits the MLA score metric (q_nope · W_UK, q_pe); {} caches no c_kv + k_pe",
                       q.transform.to_string(), dims.cache_family);
  const bool entries = target == Target::CompressedKV || target == Target::IndexK;
  if (entries && fitted_transform(q.transform.kind) && !dims.entry_split_problem.empty())
    return fmt::format("{} is fitted on the fit split of the entries, and {}", q.transform.to_string(),
                       dims.entry_split_problem);
  if (q.spec.format != Format::Preset || !is_entry_target(target))
    return why_not_applicable(q.spec, target, dims.width(target));
  if (q.transform.kind != TransformKind::None)
    return "a rotation mixes the entry's RoPE columns into the others; an engine record stores them apart";
  const PresetTraits& p = kPresets[q.spec.preset];
  const int64_t dn = dims.head_dim - dims.qk_rope_head_dim, dr = dims.qk_rope_head_dim;
  if ((p.native_ckv && p.native_ckv != dn) || (p.native_kpe && p.native_kpe != dr))
    return fmt::format(
        "the engine record is defined for an entry of {} + {} (its c_kv part + k_pe part), this one is {} + {} "
        "(head_dim {} less qk_rope_head_dim, qk_rope_head_dim)",
        p.native_ckv ? std::to_string(p.native_ckv) : "any", p.native_kpe ? std::to_string(p.native_kpe) : "any", dn,
        dr, dims.head_dim);
  if (std::string why = why_not_applicable(q.spec, Target::CKV, dn); !why.empty()) return "its c_kv part: " + why;
  if (std::string why = why_not_applicable(q.spec, Target::KPE, dr); !why.empty()) return "its k_pe part: " + why;
  return "";
}

}  // namespace

std::string why_not_applicable(const Quantizer& q, Target target, const DumpAttrs& dims) {
  const int64_t D = dims.width(target);
  if (dims.v4()) return why_not_on_v4(q, target, dims);
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
  for (const Probe* probe : registered_probes())  // probes that have nothing to measure on this family
    if (auto [t, why] = probe->not_applicable_reason(config, dims); !why.empty())
      out.push_back({"[" + probe->section() + "]", t, 0, std::move(why)});
  for (const Probe* probe : registered_probes())
    for (const auto& [name, t] : probe->quantized_pairs(config))
      if (dims.family().holds(t))  // e.g. [decode_order]'s c_kv / k_pe: no cell on a DeepSeek-V4 dump
        add(name, t, why_not_applicable(TransformedSpec::parse(name).spec, t, dims.width(t)));
  return out;
}

const GroupSpec& not_applicable_spec() {
  static const GroupSpec g{
      "not_applicable",
      {{"quantizer", ColType::Str, "", "the quantizer, as /summary names it"},
       {"target", ColType::Str, "",
        "the cached tensor its format cannot take: c_kv, k_pe or index_k; window_kv or compressed_kv (DeepSeek-V4)"},
       {"width", ColType::I64, "",
        "elements per row of the target in the dump (kv_lora_rank, qk_rope_head_dim, index_head_dim or head_dim)"},
       {"reason", ColType::Str, "",
        "why the format cannot take that width (the format table's shapes), or the target (a DeepSeek-V4 entry: an "
        "engine record's native widths, a [[mixed]] assignment, a score-metric transform)"}}};
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
