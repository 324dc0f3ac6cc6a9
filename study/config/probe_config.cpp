// The probe sections of a study config (latentq/probe_config.h) and the SettingsReader of
// latentq/probe_registry.h, parsed with toml++.
#include "latentq/probe_config.h"
#include "latentq/config.h"
#include "latentq/toml_util.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include <algorithm>
#include <stdexcept>
#include <toml++/toml.h>

#include "latentq/spec.h"
#include "latentq/transform.h"

namespace latentq {
namespace fs = std::filesystem;

struct SettingsReader::Impl {
  std::string source, section;
  fs::path base_dir;
  std::shared_ptr<const toml::table> root;  // keeps the parsed text alive
  const toml::table* table = nullptr;       // the section; null when absent

  [[noreturn]] void fail(const toml::node& n, const std::string& msg) const {
    const auto& b = n.source().begin;
    throw std::invalid_argument((b.line ? fmt::format("{}:{}:{}", source, b.line, b.column) : source) + ": " + msg);
  }
  const toml::node* get(const char* key) const { return table ? table->get(key) : nullptr; }
  std::string name(const char* key) const { return section + "." + key; }
};

SettingsReader::SettingsReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SettingsReader::~SettingsReader() = default;
const std::string& SettingsReader::section() const { return impl_->section; }
bool SettingsReader::present() const { return impl_->table != nullptr; }
bool SettingsReader::has(const char* key) const { return impl_->get(key) != nullptr; }

void SettingsReader::check_keys(std::initializer_list<const char*> valid) const {
  if (!impl_->table) return;
  for (auto&& [k, v] : *impl_->table) {
    if (std::none_of(valid.begin(), valid.end(), [&](const char* s) { return k.str() == s; })) {
      std::vector<std::string> vs(valid.begin(), valid.end());
      impl_->fail(v, fmt::format("unknown key '{}.{}' (valid keys in [{}]: {})", impl_->section, k.str(),
                                 impl_->section, fmt::join(vs, ", ")));
    }
  }
}

void SettingsReader::fail(const char* key, const std::string& message, std::optional<size_t> index) const {
  const toml::node* n = impl_->get(key);
  if (n && index && n->is_array() && *index < n->as_array()->size()) n = n->as_array()->get(*index);
  if (n) impl_->fail(*n, message);
  throw std::invalid_argument(impl_->source + ": " + message);
}

std::optional<bool> SettingsReader::boolean(const char* key) const {
  const toml::node* n = impl_->get(key);
  if (!n) return std::nullopt;
  if (!n->is_boolean()) impl_->fail(*n, fmt::format("'{}' must be true or false", impl_->name(key)));
  return n->as_boolean()->get();
}
std::optional<std::string> SettingsReader::string(const char* key) const {
  const toml::node* n = impl_->get(key);
  if (!n) return std::nullopt;
  if (!n->is_string()) impl_->fail(*n, fmt::format("'{}' must be a string", impl_->name(key)));
  return n->as_string()->get();
}
std::optional<double> SettingsReader::number(const char* key) const {
  const toml::node* n = impl_->get(key);
  if (!n) return std::nullopt;
  if (n->is_floating_point()) return n->as_floating_point()->get();
  if (n->is_integer()) return static_cast<double>(n->as_integer()->get());
  impl_->fail(*n, fmt::format("'{}' must be a number", impl_->name(key)));
}
std::optional<std::vector<std::string>> SettingsReader::strings(const char* key) const {
  const toml::node* n = impl_->get(key);
  if (!n) return std::nullopt;
  const std::string name = impl_->name(key);
  if (!n->is_array()) impl_->fail(*n, fmt::format("'{}' must be an array of strings", name));
  std::vector<std::string> out;
  for (const toml::node& e : *n->as_array()) {
    if (!e.is_string()) impl_->fail(e, fmt::format("'{}' must be a string", name));
    out.push_back(e.as_string()->get());
  }
  return out;
}
std::optional<std::vector<int64_t>> SettingsReader::ints(const char* key, int64_t lo) const {
  const toml::node* n = impl_->get(key);
  if (!n) return std::nullopt;
  const std::string name = impl_->name(key);
  if (!n->is_array()) impl_->fail(*n, fmt::format("'{}' must be an array of integers", name));
  std::vector<int64_t> out;
  for (const toml::node& e : *n->as_array()) {
    if (!e.is_integer()) impl_->fail(e, fmt::format("'{}' must be an array of integers", name));
    const int64_t v = e.as_integer()->get();
    if (v < lo) impl_->fail(e, fmt::format("'{}': {} is < {}", name, v, lo));
    if (std::find(out.begin(), out.end(), v) != out.end())
      impl_->fail(e, fmt::format("'{}': {} is listed twice", name, v));
    out.push_back(v);
  }
  return out;
}
std::optional<fs::path> SettingsReader::path(const char* key) const {
  const std::optional<std::string> s = string(key);
  if (!s) return std::nullopt;
  const fs::path p(*s);
  return (p.is_absolute() ? p : impl_->base_dir / p).lexically_normal();
}

namespace {
std::unique_ptr<SettingsReader> reader_over(std::shared_ptr<const toml::table> root, const std::string& source,
                                            const fs::path& base_dir, const std::string& section) {
  auto impl = std::make_unique<SettingsReader::Impl>();
  impl->source = source;
  impl->section = section;
  impl->base_dir = base_dir;
  if (const toml::node* n = root->get(section)) {
    if (!n->is_table()) impl->fail(*n, fmt::format("'{}' must be a table ([{}])", section, section));
    impl->table = n->as_table();
  }
  impl->root = std::move(root);
  return std::make_unique<SettingsReader>(std::move(impl));
}
}  // namespace

std::unique_ptr<SettingsReader> make_settings_reader(std::string_view text, const std::string& source,
                                                     const fs::path& base_dir, const std::string& section) {
  return reader_over(std::make_shared<const toml::table>(parse_toml(text, source)), source, base_dir, section);
}

std::map<std::string, std::shared_ptr<const ProbeSettings>> parse_probe_sections(std::string_view text,
                                                                                 const std::string& source,
                                                                                 const fs::path& base_dir) {
  const auto root = std::make_shared<const toml::table>(parse_toml(text, source));
  std::map<std::string, std::shared_ptr<const ProbeSettings>> out;
  for (const Probe* p : registered_probes()) {
    const std::string s = p->section();
    out[s] = p->parse(*reader_over(root, source, base_dir, s));
  }
  return out;
}

const ProbeSettings& probe_settings_any(const StudyConfig& config, const std::string& section) {
  const auto it = config.probes.sections.find(section);
  if (it == config.probes.sections.end() || !it->second)
    throw std::logic_error("no probe settings for section [" + section + "] (not a registered probe)");
  return *it->second;
}

const char* to_string(PairSelection p) {
  switch (p) {
    case PairSelection::All:
      return "all";
    case PairSelection::Adjacent:
      return "adjacent";
    case PairSelection::Auto:
      break;
  }
  return "auto";
}

ProbeConfig parse_probe_config(std::string_view text, const std::string& source, const fs::path& base_dir) {
  ProbeConfig P;
  P.sections = parse_probe_sections(text, source, base_dir);
  const auto r = make_settings_reader(text, source, base_dir, "e2e");
  r->check_keys({"enabled", "model", "quantizers", "text", "seq_len", "num_seqs", "offset_bytes", "device", "dtype",
                 "batch_runs", "trust_remote_code", "tokenizer", "stream", "memory_budget", "generation",
                 "generation_prompts", "generation_prompt_len", "generation_new_tokens", "retrieval", "needle_lengths",
                 "needle_samples"});
  E2eSettings& E = P.e2e;
  if (auto v = r->boolean("enabled")) E.enabled = *v;
  if (auto v = r->path("model")) E.model = *v;
  if (auto v = r->path("text")) E.text = *v;
  const auto integer = [&](const char* key, int64_t lo, int64_t& out, const char* why = "") {
    const std::optional<double> v = r->number(key);
    if (!v) return;
    if (!(*v >= static_cast<double>(lo) && *v <= 1e15 && *v == std::floor(*v)))
      r->fail(key, fmt::format("'e2e.{}' must be an integer >= {}{}", key, lo, why));
    out = static_cast<int64_t>(*v);
  };
  integer("seq_len", 2, E.seq_len, " (at least 2 tokens per sequence for a next-token metric)");
  integer("num_seqs", 1, E.num_seqs);
  integer("offset_bytes", 0, E.offset_bytes);
  integer("batch_runs", 1, E.batch_runs);
  if (auto v = r->boolean("generation")) E.generation = *v;
  integer("generation_prompts", 1, E.gen_prompts);
  integer("generation_prompt_len", 1, E.gen_prompt_len);
  integer("generation_new_tokens", 1, E.gen_new_tokens);
  if (auto v = r->boolean("retrieval")) E.retrieval = *v;
  if (auto v = r->ints("needle_lengths", 2)) {
    if (v->empty()) r->fail("needle_lengths", "'e2e.needle_lengths' is empty: expected context lengths, e.g. [128, 256]");
    E.needle_lengths = *v;
  }
  integer("needle_samples", 1, E.needle_samples);
  if (auto v = r->string("device")) {
    if (*v != "cpu" && v->rfind("cuda", 0) != 0)
      r->fail("device", fmt::format("'e2e.device' = '{}': expected cpu, cuda or cuda:N", *v));
    E.device = *v;
  }
  if (auto v = r->string("dtype")) {
    if (*v != "float32" && *v != "bfloat16" && *v != "float16")
      r->fail("dtype", fmt::format("'e2e.dtype' = '{}': expected float32, bfloat16 or float16", *v));
    E.dtype = *v;
  }
  if (auto v = r->boolean("trust_remote_code")) E.trust_remote_code = *v;
  if (auto v = r->string("tokenizer")) {
    if (*v != "auto" && *v != "bytes")
      r->fail("tokenizer", fmt::format("'e2e.tokenizer' = '{}': expected auto or bytes", *v));
    E.tokenizer = *v;
  }
  if (auto v = r->string("stream")) {
    if (*v != "auto" && *v != "on" && *v != "off")
      r->fail("stream", fmt::format("'e2e.stream' = '{}': expected auto, on or off", *v));
    E.stream = *v;
  }
  if (auto v = r->string("memory_budget")) {
    if (v->empty()) r->fail("memory_budget", "'e2e.memory_budget' is empty: expected a size such as 24G");
    E.memory_budget = *v;
  }
  if (auto specs = r->strings("quantizers")) {
    std::vector<std::vector<std::string>> given;  // the spellings of each canonical spec, in E.quantizers' order
    for (size_t i = 0; i < specs->size(); ++i) {
      try {
        const std::string c = TransformedSpec::parse((*specs)[i]).to_string();
        const auto it = std::find(E.quantizers.begin(), E.quantizers.end(), c);
        if (it == E.quantizers.end()) {
          E.quantizers.push_back(c);
          given.push_back({(*specs)[i]});
        } else {
          given[static_cast<size_t>(it - E.quantizers.begin())].push_back((*specs)[i]);
        }
      } catch (const std::invalid_argument& e) {
        r->fail("quantizers", std::string("'e2e.quantizers': ") + e.what(), i);
      }
    }
    for (size_t i = 0; i < given.size(); ++i)
      if (given[i].size() > 1)
        P.warnings.push_back(fmt::format("{}: 'e2e.quantizers' names {} {} times ({}): it runs once", source,
                                         E.quantizers[i], given[i].size(), fmt::join(given[i], ", ")));
  }
  return P;
}

}  // namespace latentq
