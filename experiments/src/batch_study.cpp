// The latentq study as a batch run (latentq/batch_study.h).
#include "latentq/batch_study.h"

#include <stdexcept>

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
  p.quantizers = config.all_quantizers();
  for (const Cell& c : plan_cells(config, *dump)) {
    CellTask t;
    t.key = c.key();
    t.groups = {"latent_error"};
    t.concurrent = backend.concurrent();
    t.compute = [dump, &backend, c] {
      RunOptions one;
      one.threads = 1;
      return std::vector<ColumnTable>{run_latent_error(*dump, {c}, backend, one)};
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

std::vector<NamedTable> derive_study_tables(const Attrs& root, const std::vector<NamedTable>& cell_tables) {
  std::vector<NamedTable> out;
  for (const NamedTable& t : cell_tables) {
    if (t.group != "latent_error") continue;
    const AttrValue& text = attr(root, "config");
    const AttrValue* source = nullptr;
    for (const auto& [k, v] : root)
      if (k == "config_source") source = &v;
    if (!std::holds_alternative<std::string>(text)) throw std::invalid_argument("attribute 'config' is not a string");
    const std::string src = source && std::holds_alternative<std::string>(*source) ? std::get<std::string>(*source)
                                                                                   : std::string("<config attribute>");
    // Relative paths in the config do not matter here: only the quantizer lists are used.
    const StudyConfig config = parse_config(std::get<std::string>(text), src, ".");
    out.push_back({"summary", summarize(t.table, config.all_quantizers(), dump_attrs_from_results(root)), {}});
  }
  return out;
}

}  // namespace latentq
