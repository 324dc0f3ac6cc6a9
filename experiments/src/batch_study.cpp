// The latentq study as a batch run (latentq/batch_study.h).
#include "latentq/batch_study.h"

#include <stdexcept>

#include "latentq/probe_study.h"
#include "latentq/util.h"

namespace latentq {

StudyPlan plan_study(const StudyConfig& config, LatentBackend& backend) {
  if (config.dump.empty())
    throw std::invalid_argument(config.source + ": no input dump: set [input] dump or pass --input");
  LoadOptions lo;
  lo.layers = config.layers;
  lo.attention = false;
  StudyPlan p;
  auto dump = std::make_shared<const Dump>(load_dump(config.dump, lo));
  p.dump = dump;
  p.attrs = study_attrs(config, *dump, file_sha256(config.dump), backend.name());
  for (auto& a : decode_order_attrs(config)) p.attrs.push_back(std::move(a));
  p.quantizers = config.all_quantizers();
  auto spectra = std::make_shared<SpectrumCache>();  // one eigendecomposition per (layer, target)
  for (const Cell& c : plan_cells(config, *dump)) {
    CellTask t;
    t.key = c.key();
    t.groups = {"latent_error"};
    t.concurrent = backend.concurrent();
    t.compute = [dump, spectra, &backend, c] {
      RunOptions one;
      one.threads = 1;
      return std::vector<ColumnTable>{run_latent_error(*dump, {c}, backend, one, spectra.get())};
    };
    p.tasks.push_back(std::move(t));
  }
  return p;
}

DumpAttrs dump_attrs_from_results(const Attrs& root) {
  auto num = [&](const char* name) {
    const AttrValue& v = attr(root, name);
    if (!std::holds_alternative<int64_t>(v)) throw std::invalid_argument(std::string("attribute '") + name + "' is not an integer");
    return std::get<int64_t>(v);
  };
  DumpAttrs a;
  const AttrValue& model = attr(root, "model");
  if (const auto* s = std::get_if<std::string>(&model)) a.model = *s;
  a.num_layers = num("num_layers");
  a.kv_lora_rank = num("kv_lora_rank");
  a.qk_rope_head_dim = num("qk_rope_head_dim");
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
  for (const NamedTable& t : cell_tables) {
    if (t.group != "latent_error") continue;
    // Only the quantizer lists of the config are used here.
    const StudyConfig config = config_from_results(root);
    out.push_back({"summary", summarize(t.table, config.all_quantizers(), dump_attrs_from_results(root)), {}});
  }
  return out;
}

}  // namespace latentq
