// The latentq study as a batch run (latentq/batch_study.h).
#include "latentq/batch_study.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "latentq/applicable.h"
#include "latentq/probe_registry.h"
#include "latentq/layer_shared.h"
#include "latentq/probe_study.h"
#include "latentq/util.h"

namespace latentq {

StudyPlan plan_study(const StudyConfig& config, LatentBackend& backend,
                     const std::function<void(size_t, size_t)>& validate_progress) {
  if (config.dump.empty())
    throw std::invalid_argument(config.source + ": no input dump: set [input] dump or pass --input");
  LoadOptions lo;
  lo.layers = config.layers;
  lo.attention = false;
  lo.data = false;
  Dump header = load_dump(config.dump, lo);
  ProbePlan probes = plan_probes(config, header);
  // A transform whose fit reads the layer's query rows and W_UK (fit_reads_queries: sklt): the latent cells read
  // the attention data too
  const auto qs = config.all_quantizers();
  const auto sklt = std::find_if(qs.begin(), qs.end(), [](const Quantizer& q) {
    return fit_reads_queries(q.transform.kind) ||
           std::any_of(q.mixed.begin(), q.mixed.end(),
                       [](const MixedRule& r) { return fit_reads_queries(r.transform.kind); });
  });
  if (sklt != qs.end() && !header.file_has_attention)
    throw std::invalid_argument(fmt::format(
        "{}: quantizer {} needs the dump's attention datasets (its transform fits its score metric on the query rows "
        "and W_UK), and this dump has none: dump with query rows, or use klt",
        config.dump.string(), sklt->name));
  if (sklt != qs.end() ||
      std::any_of(probes.cells.begin(), probes.cells.end(), [](const ProbeCell& c) { return c.attention; })) {
    lo.attention = true;  // check the attention datasets' shapes too (still no values read)
    header = load_dump(config.dump, lo);
  }
  // Every value the cells will read, checked before the first cell runs: bad input is refused with nothing
  // written (no OUT.partial: a resume cannot fix it).
  validate_layers(header, lo.attention, validate_progress);
  StudyPlan p;
  p.store = std::make_shared<LayerStore>(std::move(header));
  p.store->set_attention_device(backend.attention_device());
  p.probes = std::move(probes);
  const std::shared_ptr<LayerStore> store = p.store;
  const Dump& dump = store->header();
  p.attrs = study_attrs(config, dump, file_sha256(config.dump), backend.name());
  for (const Probe* probe : registered_probes())
    for (auto& a : probe->root_attrs(config)) p.attrs.push_back(std::move(a));
  p.quantizers = config.all_quantizers();
  auto spectra = std::make_shared<SpectrumCache>();  // one eigendecomposition per (layer, target)
  for (const Cell& c : plan_cells(config, dump)) {
    CellTask t;
    t.key = c.key();
    t.groups = {"latent_error"};
    t.concurrent = backend.concurrent();
    // With the attention data when the probes read it: the score columns need the layer's queries and W_UK.
    const LayerUse use{{c.layer}, lo.attention || dump.reads_with_attention(c.target)};  // sparse index_k: with them
    t.compute = [store, spectra, &backend, c, use] {
      const std::unique_ptr<LayerAccess> in = store->open(use);
      RunOptions one;
      one.threads = 1;
      // A transformed cell's rotated input: one per (layer, target, transform) while the layer is held,
      // shared with the probe cells (rotated_latent).
      const RotatedLatents rotated = [&](int layer, Target target, const Transform& tr) {
        return rotated_latent(*in, layer, target, tr);
      };
      return std::vector<ColumnTable>{run_latent_error(
          store->header(), [&](int l) -> const Layer& { return in->layer(l); }, {c}, backend, one, spectra.get(),
          rotated)};
    };
    p.tasks.push_back(std::move(t));
    p.uses.push_back(use);
  }
  const auto cfg = std::make_shared<const StudyConfig>(config);  // tasks may outlive the caller's config
  for (const ProbeCell& c : p.probes.cells) {
    CellTask t;
    t.key = c.key;
    t.groups = c.groups;
    const LayerUse use{c.layers, c.attention};
    t.compute = [store, cfg, c, use] {
      const std::unique_ptr<LayerAccess> in = store->open(use);
      return run_probe_cell(*cfg, c, *in);
    };
    p.tasks.push_back(std::move(t));
    p.uses.push_back(use);
  }
  return p;
}

std::function<std::vector<size_t>(const std::vector<size_t>&)> StudyPlan::schedule() const {
  const std::shared_ptr<LayerStore> s = store;
  const std::vector<LayerUse> u = uses;
  return [s, u](const std::vector<size_t>& pending) {
    std::vector<size_t> order = pending;
    auto last = [&](size_t i) {
      return u[i].layers.empty() ? -1 : *std::max_element(u[i].layers.begin(), u[i].layers.end());
    };
    auto first = [&](size_t i) {
      return u[i].layers.empty() ? -1 : *std::min_element(u[i].layers.begin(), u[i].layers.end());
    };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      if (last(a) != last(b)) return last(a) < last(b);
      return first(a) < first(b);
    });
    std::vector<LayerUse> announced;
    for (size_t i : order) announced.push_back(u[i]);
    s->expect(announced);
    return order;
  };
}

BatchResult run_study_batch(const std::filesystem::path& out, const StudyPlan& plan, BatchOptions options) {
  options.schedule = plan.schedule();
  return run_batch(out, plan.attrs, plan.tasks, derive_study_tables, options);
}

DumpAttrs dump_attrs_from_results(const Attrs& root) {
  auto num = [&](const char* name) {
    const AttrValue& v = attr(root, name);
    if (!std::holds_alternative<int64_t>(v))
      throw std::invalid_argument(std::string("attribute '") + name + "' is not an integer");
    return std::get<int64_t>(v);
  };
  DumpAttrs a;
  const AttrValue& model = attr(root, "model");
  if (const auto* s = std::get_if<std::string>(&model)) a.model = *s;
  a.num_layers = num("num_layers");
  a.kv_lora_rank = num("kv_lora_rank");
  a.qk_rope_head_dim = num("qk_rope_head_dim");
  for (const auto& [k, v] : root)  // sparse MLA's and DeepSeek-V4's (study_attrs); absent: dense MLA
    if (k == "cache_family" && std::holds_alternative<std::string>(v)) {
      a.cache_family = std::get<std::string>(v);
      (void)a.family();  // throws for an unknown family
      a.index_head_dim = num("index_head_dim");
      if (a.v4()) a.head_dim = num("head_dim");
    } else if (k == "v4_entry_split_problem" && std::holds_alternative<std::string>(v)) {
      a.entry_split_problem = std::get<std::string>(v);
    } else if (k == "input_source" && std::holds_alternative<std::string>(v)) {  // absent in older files
      a.source = std::get<std::string>(v);
    }
  return a;
}

StudyConfig config_from_results(const Attrs& root, bool* has_dir) {
  auto string_attr = [&](const char* name) -> const std::string* {
    for (const auto& [k, v] : root)
      if (k == name) return std::get_if<std::string>(&v);
    return nullptr;
  };
  const AttrValue& text = attr(root, "config");  // throws naming a missing attribute
  if (!std::holds_alternative<std::string>(text)) throw std::invalid_argument("attribute 'config' is not a string");
  const std::string* source = string_attr("config_source");
  const std::string* dir = string_attr("config_dir");
  if (has_dir) *has_dir = dir != nullptr;
  return parse_config(std::get<std::string>(text), source ? *source : std::string("<config attribute>"),
                      dir ? std::filesystem::path(*dir) : std::filesystem::path("."));
}

std::vector<NamedTable> derive_study_tables(const Attrs& root, const std::vector<NamedTable>& cell_tables) {
  std::vector<NamedTable> out;
  const ColumnTable *le = nullptr, *ae = nullptr;
  for (const NamedTable& t : cell_tables) {
    if (t.group == "attention_error") ae = &t.table;
    if (t.group != "latent_error") continue;
    le = &t.table;
    // Only the quantizer lists of the config are used here (and the probes' quantizers, for /not_applicable).
    const StudyConfig config = config_from_results(root);
    const DumpAttrs dims = dump_attrs_from_results(root);
    const std::vector<NotApplicable> na = not_applicable(config, dims);
    out.push_back({"summary", summarize(t.table, config.all_quantizers(), dims, na), {}});
    if (!na.empty()) out.push_back({"not_applicable", not_applicable_table(na), {}});
    if (dims.v4()) {  // DeepSeek-V4: the entries' bytes per token and per sequence
      const AttrValue& layers = attr(root, "v4_layers");
      if (!std::holds_alternative<std::vector<std::string>>(layers))
        throw std::invalid_argument("attribute 'v4_layers' is not a list of strings");
      const std::vector<V4LayerInfo> info = parse_v4_layer_records(std::get<std::vector<std::string>>(layers));
      out.push_back({"v4_cache", v4_cache_table(t.table, info), {}});
    }
  }
  if (le && ae && le->has("score_mse")) out.push_back({"score_vs_attention", score_vs_attention(*le, *ae), {}});
  return out;
}

}  // namespace latentq
