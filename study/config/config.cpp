// Study configs (latentq/config.h), parsed with toml++.
#include "latentq/config.h"
#include "latentq/toml_util.h"

#include <fnmatch.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <toml++/toml.h>

#include "latentq_default_config.h"  // generated: kDefaultConfigText, kDefaultConfigPath

namespace latentq {
namespace fs = std::filesystem;
namespace {

class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  std::string where(const toml::node& n) const {
    const auto& b = n.source().begin;
    return b.line ? fmt::format("{}:{}:{}", source_, b.line, b.column) : source_;
  }
  [[noreturn]] void fail(const toml::node& n, const std::string& msg) const {
    throw std::invalid_argument(where(n) + ": " + msg);
  }
  [[noreturn]] void fail(const std::string& msg) const { throw std::invalid_argument(source_ + ": " + msg); }

  void check_keys(const toml::table& t, const std::string& prefix, std::initializer_list<const char*> valid) const {
    check_keys(t, prefix, std::vector<std::string>(valid.begin(), valid.end()));
  }
  void check_keys(const toml::table& t, const std::string& prefix, const std::vector<std::string>& vs) const {
    for (auto&& [k, v] : t) {
      const bool ok = std::any_of(vs.begin(), vs.end(), [&](const std::string& s) { return k.str() == s; });
      if (!ok) {
        fail(v, fmt::format("unknown key '{}{}' (valid keys{}: {})", prefix, k.str(),
                            prefix.empty() ? "" : " in [" + prefix.substr(0, prefix.size() - 1) + "]",
                            fmt::join(vs, ", ")));
      }
    }
  }

  const toml::table* table(const toml::table& t, const char* key, const std::string& name) const {
    const toml::node* n = t.get(key);
    if (!n) return nullptr;
    if (!n->is_table()) fail(*n, fmt::format("'{}' must be a table", name));
    return n->as_table();
  }

  std::string string(const toml::node& n, const std::string& name) const {
    if (!n.is_string()) fail(n, fmt::format("'{}' must be a string", name));
    return n.as_string()->get();
  }

  std::vector<std::string> strings(const toml::node& n, const std::string& name) const {
    if (!n.is_array()) fail(n, fmt::format("'{}' must be an array of strings", name));
    std::vector<std::string> out;
    for (const toml::node& e : *n.as_array()) {
      if (!e.is_string()) fail(e, fmt::format("'{}' must be an array of strings", name));
      out.push_back(e.as_string()->get());
    }
    return out;
  }

  std::vector<int64_t> ints(const toml::node& n, const std::string& name) const {
    if (!n.is_array()) fail(n, fmt::format("'{}' must be an array of integers", name));
    std::vector<int64_t> out;
    for (const toml::node& e : *n.as_array()) {
      if (!e.is_integer()) fail(e, fmt::format("'{}' must be an array of integers", name));
      out.push_back(e.as_integer()->get());
    }
    return out;
  }

  // Parse a spec string, prefixing QuantSpec::parse's message with the location.
  Quantizer quantizer(const toml::node& n, const std::string& s) const {
    try {
      const TransformedSpec q = TransformedSpec::parse(s);
      return {q.to_string(), q.spec, q.transform};
    } catch (const std::invalid_argument& e) {
      fail(n, e.what());
    }
  }

  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

void add_unique(std::vector<Quantizer>& v, const Quantizer& q) {
  if (std::none_of(v.begin(), v.end(), [&](const Quantizer& x) { return x.name == q.name; })) v.push_back(q);
}

// Removes the quantizers matching any pattern; returns, per pattern, whether it matched.
std::vector<bool> apply_excludes(std::vector<Quantizer>& v, const std::vector<std::string>& patterns) {
  std::vector<bool> matched(patterns.size(), false);
  std::erase_if(v, [&](const Quantizer& q) {
    bool hit = false;
    for (size_t i = 0; i < patterns.size(); ++i)
      if (quantizer_matches(q.name, patterns[i])) hit = matched[i] = true;
    return hit;
  });
  return matched;
}

fs::path resolve(const fs::path& base, const std::string& p) {
  const fs::path x(p);
  return (x.is_absolute() ? x : base / x).lexically_normal();
}

}  // namespace

bool quantizer_matches(const std::string& name, const std::string& pattern) {
  if (pattern.find('*') != std::string::npos) return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
  try {
    return TransformedSpec::parse(pattern).to_string() == name;
  } catch (const std::invalid_argument&) {
    return pattern == name;
  }
}

std::vector<Quantizer> expand_matrix(const std::vector<int64_t>& bits, const std::vector<std::string>& schemes,
                                     const std::vector<std::string>& granularities,
                                     const std::vector<int64_t>& group_sizes,
                                     const std::vector<std::string>& scale_dtypes) {
  for (int64_t b : bits)
    if (b != 2 && b != 4 && b != 8) throw std::invalid_argument(fmt::format("bits = {} is not one of 2, 4, 8", b));
  for (const auto& s : schemes)
    if (s != "sym" && s != "asym") throw std::invalid_argument(fmt::format("scheme '{}' is not one of sym, asym", s));
  for (const auto& g : granularities)
    if (g != "tensor" && g != "channel" && g != "token")
      throw std::invalid_argument(fmt::format("granularity '{}' is not one of tensor, channel, token", g));
  for (int64_t g : group_sizes)
    if (g < 0)
      throw std::invalid_argument(fmt::format("group size {} is negative (group sizes are >= 0; 0 = whole axis)", g));
  for (const auto& d : scale_dtypes)
    if (d != "fp16" && d != "fp32")
      throw std::invalid_argument(fmt::format("scale dtype '{}' is not one of fp16, fp32", d));
  // spec values built directly (the grammar's fields), named by their canonical string
  std::vector<Quantizer> out;
  auto add = [&](int64_t b, const std::string& s, Granularity g, int64_t gs, const std::string& d) {
    QuantSpec q;
    q.format = Format::Int;
    q.bits = static_cast<int>(b);
    q.scheme = s == "sym" ? Scheme::Sym : Scheme::Asym;
    q.granularity = g;
    q.group_size = gs;
    q.scale_dtype = d == "fp32" ? ScaleDtype::F32 : ScaleDtype::F16;
    add_unique(out, {q.to_string(), q, {}});
  };
  for (int64_t b : bits)
    for (const auto& s : schemes)
      for (const auto& g : granularities) {
        if (g == "tensor") {
          for (const auto& d : scale_dtypes) add(b, s, Granularity::Tensor, 0, d);
          continue;
        }
        for (int64_t gs : group_sizes)
          for (const auto& d : scale_dtypes)
            add(b, s, g == "channel" ? Granularity::Channel : Granularity::Token, gs, d);
      }
  return out;
}

namespace {
const MixedRule& mixed_rule(const Quantizer& q, int layer, Target target) {
  for (const MixedRule& r : q.mixed)
    if (r.target == target &&
        (r.layers.empty() || std::find(r.layers.begin(), r.layers.end(), layer) != r.layers.end()))
      return r;
  const std::string& name = q.name;
  throw std::invalid_argument(
      fmt::format("mixed assignment '{}' assigns no spec to layer {} {} (add a [[mixed]] rule "
                  "with name = \"{}\" covering it)",
                  name, layer, to_string(target), name));
}
}  // namespace

const QuantSpec& Quantizer::spec_for(int layer, Target target) const {
  return mixed.empty() ? spec : mixed_rule(*this, layer, target).spec;
}

const Transform& Quantizer::transform_for(int layer, Target target) const {
  return mixed.empty() ? transform : mixed_rule(*this, layer, target).transform;
}

std::vector<Quantizer> StudyConfig::all_quantizers() const {
  std::vector<Quantizer> out;
  for (const TargetPlan& p : targets)
    for (const Quantizer& q : p.quantizers) add_unique(out, q);
  return out;
}

const TargetPlan* StudyConfig::plan(Target t) const {
  for (const TargetPlan& p : targets)
    if (p.target == t) return &p;
  return nullptr;
}

namespace {

// The top-level keys: the study's own sections, [e2e], then every registered probe's section
// (latentq/probe_registry.h).
void check_sections(const Parser& P, const toml::table& root) {
  std::vector<std::string> sections = {"input", "quantizers", "targets", "output"};
  for (const Probe* p : registered_probes()) sections.push_back(p->section());
  sections.insert(sections.end(), {"e2e", "mixed"});
  P.check_keys(root, "", sections);
}

// 'input.layers': "all" (leaves `layers` empty) or distinct layer indices 0..999.
void parse_input_layers(const Parser& P, const toml::node& n, std::vector<int>& layers) {
  if (n.is_string()) {
    if (n.as_string()->get() != "all") P.fail(n, "'input.layers' must be \"all\" or an array of layer indices");
    return;
  }
  for (int64_t l : P.ints(n, "input.layers")) {
    if (l < 0 || l > 999) P.fail(n, fmt::format("'input.layers': {} is not a layer index (0..999)", l));
    if (std::find(layers.begin(), layers.end(), static_cast<int>(l)) != layers.end())
      P.fail(n, fmt::format("'input.layers': layer {} is listed twice", l));
    layers.push_back(static_cast<int>(l));
  }
  if (layers.empty()) P.fail(n, "'input.layers' is empty (use \"all\" for every layer)");
}

// 'input.targets': distinct target names, at least one.
std::vector<Target> parse_input_targets(const Parser& P, const toml::node& n) {
  std::vector<Target> targets;
  for (const std::string& s : P.strings(n, "input.targets")) {
    Target t;
    try {
      t = parse_target(s);
    } catch (const std::invalid_argument& e) {
      P.fail(n, std::string("'input.targets': ") + e.what());
    }
    if (!is_latent_target(t))
      P.fail(n, fmt::format("'input.targets': '{}' is studied by [indexer] on a sparse MLA dump (its quantizers); "
                            "input.targets lists c_kv and/or k_pe",
                            s));
    if (std::find(targets.begin(), targets.end(), t) != targets.end())
      P.fail(n, fmt::format("'input.targets': '{}' is listed twice", s));
    targets.push_back(t);
  }
  if (targets.empty()) P.fail(n, "'input.targets' is empty (expected c_kv and/or k_pe)");
  return targets;
}

// [input]: sets C.dump and C.layers; returns the studied targets (c_kv and k_pe by default).
std::vector<Target> parse_input(const Parser& P, const toml::table& root, const fs::path& base_dir, StudyConfig& C) {
  std::vector<Target> targets = {Target::CKV, Target::KPE};
  if (const toml::table* in = P.table(root, "input", "input")) {
    P.check_keys(*in, "input.", {"dump", "layers", "targets"});
    if (const toml::node* n = in->get("dump")) C.dump = resolve(base_dir, P.string(*n, "input.dump"));
    if (const toml::node* n = in->get("layers")) parse_input_layers(P, *n, C.layers);
    if (const toml::node* n = in->get("targets")) targets = parse_input_targets(P, *n);
  }
  return targets;
}

// [output]: sets C.results.
void parse_output(const Parser& P, const toml::table& root, const fs::path& base_dir, StudyConfig& C) {
  if (const toml::table* out = P.table(root, "output", "output")) {
    P.check_keys(*out, "output.", {"results"});
    if (const toml::node* n = out->get("results")) C.results = resolve(base_dir, P.string(*n, "output.results"));
  }
}

// The matrix of [quantizers] (bits, schemes, granularities, and optional group_sizes and
// scale_dtypes), each list checked against its own node for the location in the message.
std::vector<Quantizer> parse_matrix(const Parser& P, const toml::table& q) {
  const toml::node* nb = q.get("bits");
  const toml::node* ns = q.get("schemes");
  const toml::node* ng = q.get("granularities");
  if (!(nb || ns || ng)) return {};
  if (!(nb && ns && ng))
    P.fail(*(nb ? nb : ns ? ns : ng), "'quantizers.bits', 'schemes' and 'granularities' go together: give all three");
  const auto bits = P.ints(*nb, "quantizers.bits");
  const auto schemes = P.strings(*ns, "quantizers.schemes");
  const auto grans = P.strings(*ng, "quantizers.granularities");
  std::vector<int64_t> groups{0};
  std::vector<std::string> dtypes{"fp16"};
  const toml::node* ngs = q.get("group_sizes");
  const toml::node* nsd = q.get("scale_dtypes");
  if (ngs) groups = P.ints(*ngs, "quantizers.group_sizes");
  if (nsd) dtypes = P.strings(*nsd, "quantizers.scale_dtypes");
  auto check = [&](const toml::node& n, const char* key, auto&& fn) {
    try {
      fn();
    } catch (const std::invalid_argument& e) {
      P.fail(n, fmt::format("'quantizers.{}': {}", key, e.what()));
    }
  };
  check(*nb, "bits", [&] { expand_matrix(bits, {}, {}, {}, {}); });
  check(*ns, "schemes", [&] { expand_matrix({}, schemes, {}, {}, {}); });
  check(*ng, "granularities", [&] { expand_matrix({}, {}, grans, {}, {}); });
  if (ngs) check(*ngs, "group_sizes", [&] { expand_matrix({}, {}, {}, groups, {}); });
  if (nsd) check(*nsd, "scale_dtypes", [&] { expand_matrix({}, {}, {}, {}, dtypes); });
  if (groups.empty()) P.fail(ngs ? *ngs : *ng, "'quantizers.group_sizes' is empty (use [0] for whole-axis groups)");
  if (dtypes.empty()) P.fail(nsd ? *nsd : *ng, "'quantizers.scale_dtypes' is empty");
  return expand_matrix(bits, schemes, grans, groups, dtypes);
}

// An 'exclude' list `name` (node n): checks its plain entries are specs, removes the matching
// quantizers from v, and warns of each pattern that matches none.
void parse_exclude(const Parser& P, const toml::node& n, const std::string& name, std::vector<Quantizer>& v,
                   std::vector<std::string>& warnings) {
  const auto pats = P.strings(n, name);
  for (const toml::node& e : *n.as_array()) {
    const std::string s = e.as_string()->get();
    if (s.find('*') == std::string::npos) P.quantizer(e, s);  // a plain entry must be a valid spec
  }
  const auto matched = apply_excludes(v, pats);
  for (size_t i = 0; i < pats.size(); ++i)
    if (!matched[i])
      warnings.push_back(fmt::format("{}: exclude pattern '{}' matches no quantizer", P.where(n), pats[i]));
}

// A list of spec strings (`name`, node n) appended to v, each spec once whatever its spelling; a spec the list names
// more than once (the same canonical spec under one or several spellings) is kept once, with a warning.
void add_spec_list(const Parser& P, const toml::node& n, const std::string& name, std::vector<Quantizer>& v,
                   std::vector<std::string>& warnings) {
  if (!n.is_array()) P.fail(n, fmt::format("'{}' must be an array of strings", name));
  std::vector<std::pair<std::string, std::vector<std::string>>> given;  // canonical -> spellings, in order
  for (const toml::node& e : *n.as_array()) {
    const std::string s = P.string(e, name);
    const Quantizer q = P.quantizer(e, s);
    auto it = std::find_if(given.begin(), given.end(), [&](const auto& g) { return g.first == q.name; });
    if (it == given.end())
      given.push_back({q.name, {s}});
    else
      it->second.push_back(s);
    add_unique(v, q);
  }
  for (const auto& [c, spellings] : given)
    if (spellings.size() > 1)
      warnings.push_back(fmt::format("{}: '{}' names {} {} times ({}): it is studied once", P.where(n), name, c,
                                     spellings.size(), fmt::join(spellings, ", ")));
}

// [quantizers]: the quantizers common to every target (the matrix, then extra, less exclude).
std::vector<Quantizer> parse_quantizers(const Parser& P, const toml::table& root, std::vector<std::string>& warnings) {
  std::vector<Quantizer> common;
  if (const toml::table* q = P.table(root, "quantizers", "quantizers")) {
    P.check_keys(*q, "quantizers.",
                 {"bits", "schemes", "granularities", "group_sizes", "scale_dtypes", "extra", "exclude"});
    common = parse_matrix(P, *q);
    if (const toml::node* n = q->get("extra")) add_spec_list(P, *n, "quantizers.extra", common, warnings);
    if (const toml::node* n = q->get("exclude")) parse_exclude(P, *n, "quantizers.exclude", common, warnings);
  }
  return common;
}

// [targets.<name>]: a target's own quantizers list (replacing the common ones) and exclude.
void parse_targets(const Parser& P, const toml::table& root, const std::vector<Target>& targets,
                   std::map<Target, std::vector<Quantizer>>& per_target, std::vector<std::string>& warnings) {
  const toml::table* ts = P.table(root, "targets", "targets");
  if (!ts) return;
  P.check_keys(*ts, "targets.", {"c_kv", "k_pe"});
  for (auto&& [k, v] : *ts) {
    const std::string name = std::string(k.str());
    if (!v.is_table()) P.fail(v, fmt::format("'targets.{}' must be a table", name));
    const Target t = parse_target(name);
    if (std::find(targets.begin(), targets.end(), t) == targets.end())
      P.fail(v, fmt::format("[targets.{}] is configured but '{}' is not in input.targets", name, name));
    const toml::table& tt = *v.as_table();
    P.check_keys(tt, "targets." + name + ".", {"quantizers", "exclude"});
    if (const toml::node* n = tt.get("quantizers")) {
      per_target[t].clear();
      add_spec_list(P, *n, "targets." + name + ".quantizers", per_target[t], warnings);
    }
    if (const toml::node* n = tt.get("exclude"))
      parse_exclude(P, *n, "targets." + name + ".exclude", per_target[t], warnings);
  }
}

// A [[mixed]] rule's name ("mixed" by default): not a spec, not empty, no '/' or '*'.
std::string parse_mixed_name(const Parser& P, const toml::table& m) {
  std::string name = "mixed";
  if (const toml::node* nn = m.get("name")) name = P.string(*nn, "mixed.name");
  bool is_spec = true;
  try {
    TransformedSpec::parse(name);
  } catch (const std::invalid_argument&) {
    is_spec = false;
  }
  if (is_spec || name.empty() || name.find_first_of("/*") != std::string::npos)
    P.fail(m, fmt::format("'mixed.name' = '{}': a mixed assignment needs a name that is not a spec and holds no '/' "
                          "or '*' (e.g. \"mixed\")",
                          name));
  return name;
}

// A [[mixed]] rule's layers: "all" (empty) or layer indices 0..999.
std::vector<int> parse_mixed_layers(const Parser& P, const toml::table& m) {
  std::vector<int> layers;
  const toml::node* nl = m.get("layers");
  if (!nl) return layers;
  if (nl->is_string()) {
    if (nl->as_string()->get() != "all") P.fail(*nl, "'mixed.layers' must be \"all\" or an array of layer indices");
    return layers;
  }
  for (int64_t l : P.ints(*nl, "mixed.layers")) {
    if (l < 0 || l > 999) P.fail(*nl, fmt::format("'mixed.layers': {} is not a layer index (0..999)", l));
    layers.push_back(static_cast<int>(l));
  }
  if (layers.empty()) P.fail(*nl, "'mixed.layers' is empty (use \"all\" for every layer)");
  return layers;
}

// One [[mixed]] table: its rules (one per target it gives) appended to the quantizer of its name
// in `mixed` (created at its first rule).
void parse_mixed_rule(const Parser& P, const toml::table& m, const std::vector<Target>& targets,
                      std::vector<Quantizer>& mixed) {
  P.check_keys(m, "mixed.", {"name", "layers", "c_kv", "k_pe"});
  const std::string name = parse_mixed_name(P, m);
  MixedRule base;
  base.layers = parse_mixed_layers(P, m);
  auto it = std::find_if(mixed.begin(), mixed.end(), [&](const Quantizer& q) { return q.name == name; });
  if (it == mixed.end()) it = mixed.insert(mixed.end(), Quantizer{name, QuantSpec{}, {}});
  bool any = false;
  for (Target t : {Target::CKV, Target::KPE}) {
    const toml::node* ns = m.get(to_string(t));
    if (!ns) continue;
    any = true;
    if (std::find(targets.begin(), targets.end(), t) == targets.end())
      P.fail(*ns, fmt::format("'mixed.{}' is given but '{}' is not in input.targets", to_string(t), to_string(t)));
    MixedRule r = base;
    r.target = t;
    const Quantizer q = P.quantizer(*ns, P.string(*ns, "mixed." + std::string(to_string(t))));
    r.spec = q.spec;
    r.transform = q.transform;
    for (const MixedRule& o : it->mixed) {
      if (o.target != t) continue;
      const bool overlap =
          o.layers.empty() || r.layers.empty() || std::any_of(r.layers.begin(), r.layers.end(), [&](int l) {
            return std::find(o.layers.begin(), o.layers.end(), l) != o.layers.end();
          });
      if (overlap) P.fail(*ns, fmt::format("mixed assignment '{}' assigns {} of a layer twice", name, to_string(t)));
    }
    it->mixed.push_back(r);
  }
  if (!any) P.fail(m, "a [[mixed]] rule needs c_kv and/or k_pe (a spec string)");
}

// [[mixed]]: the rules of each name form one quantizer, appended to every target it assigns.
void parse_mixed(const Parser& P, const toml::table& root, const std::vector<Target>& targets,
                 std::map<Target, std::vector<Quantizer>>& per_target) {
  const toml::node* n = root.get("mixed");
  if (!n) return;
  if (!n->is_array_of_tables()) P.fail(*n, "'mixed' must be an array of tables ([[mixed]])");
  std::vector<Quantizer> mixed;
  for (const toml::node& e : *n->as_array()) parse_mixed_rule(P, *e.as_table(), targets, mixed);
  for (const Quantizer& q : mixed)
    for (Target t : targets) {
      const bool assigns =
          std::any_of(q.mixed.begin(), q.mixed.end(), [&](const MixedRule& r) { return r.target == t; });
      if (!assigns)
        P.fail(*n, fmt::format("mixed assignment '{}' assigns nothing to {} (every studied target needs a spec)",
                               q.name, to_string(t)));
      if (std::any_of(per_target[t].begin(), per_target[t].end(), [&](const Quantizer& x) { return x.name == q.name; }))
        P.fail(*n, fmt::format("mixed assignment '{}' has the name of a quantizer", q.name));
      per_target[t].push_back(q);
    }
}

}  // namespace

StudyConfig parse_config(std::string_view text, const std::string& source, const fs::path& base_dir) {
  const Parser P(source);
  const toml::table root = parse_toml(text, source);
  StudyConfig C;
  C.text = std::string(text);
  C.source = source;
  C.base_dir = base_dir;
  check_sections(P, root);
  C.probes = parse_probe_config(text, source, base_dir);  // the probe sections (latentq/probe_config.h)
  C.warnings.insert(C.warnings.end(), C.probes.warnings.begin(), C.probes.warnings.end());
  const std::vector<Target> targets = parse_input(P, root, base_dir, C);
  parse_output(P, root, base_dir, C);
  const std::vector<Quantizer> common = parse_quantizers(P, root, C.warnings);
  std::map<Target, std::vector<Quantizer>> per_target;
  for (Target t : targets) per_target[t] = common;
  parse_targets(P, root, targets, per_target, C.warnings);
  parse_mixed(P, root, targets, per_target);
  for (Target t : targets) {
    if (per_target[t].empty())
      P.fail(
          fmt::format("no quantizer for target {}: give [quantizers] bits/schemes/granularities or extra, "
                      "or [targets.{}] quantizers",
                      to_string(t), to_string(t)));
    C.targets.push_back({t, per_target[t]});
  }
  return C;
}

StudyConfig load_config(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  if (!in || fs::is_directory(path, ec)) throw std::runtime_error(path.string() + ": cannot read the config file");
  std::ostringstream ss;
  ss << in.rdbuf();
  const fs::path abs = fs::absolute(path);
  return parse_config(ss.str(), path.string(), abs.parent_path());
}

std::string_view default_config_text() { return kDefaultConfigText; }
fs::path default_config_path() { return fs::path(kDefaultConfigPath); }

StudyConfig default_config() {
  return parse_config(kDefaultConfigText, std::string(kDefaultConfigPath) + " (embedded)",
                      fs::path(kDefaultConfigPath).parent_path());
}

}  // namespace latentq
