// The probe sections of a study config (latentq/probe_config.h), parsed with toml++.
#include "latentq/probe_config.h"
#include "latentq/toml_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <toml++/toml.h>

#include "latentq/spec.h"
#include "latentq/transform.h"

namespace latentq {
namespace fs = std::filesystem;
namespace {

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const toml::node& n, const std::string& msg) const {
    const auto& b = n.source().begin;
    throw std::invalid_argument((b.line ? fmt::format("{}:{}:{}", source_, b.line, b.column) : source_) + ": " + msg);
  }

  void check_keys(const toml::table& t, const std::string& section, std::initializer_list<const char*> valid) const {
    for (auto&& [k, v] : t) {
      if (std::none_of(valid.begin(), valid.end(), [&](const char* s) { return k.str() == s; })) {
        std::vector<std::string> vs(valid.begin(), valid.end());
        fail(v, fmt::format("unknown key '{}.{}' (valid keys in [{}]: {})", section, k.str(), section, fmt::join(vs, ", ")));
      }
    }
  }

  bool boolean(const toml::node& n, const std::string& name) const {
    if (!n.is_boolean()) fail(n, fmt::format("'{}' must be true or false", name));
    return n.as_boolean()->get();
  }
  std::string string(const toml::node& n, const std::string& name) const {
    if (!n.is_string()) fail(n, fmt::format("'{}' must be a string", name));
    return n.as_string()->get();
  }
  double number(const toml::node& n, const std::string& name) const {
    if (n.is_floating_point()) return n.as_floating_point()->get();
    if (n.is_integer()) return static_cast<double>(n.as_integer()->get());
    fail(n, fmt::format("'{}' must be a number", name));
  }
  std::vector<std::string> strings(const toml::node& n, const std::string& name) const {
    if (!n.is_array()) fail(n, fmt::format("'{}' must be an array of strings", name));
    std::vector<std::string> out;
    for (const toml::node& e : *n.as_array()) out.push_back(string(e, name));
    return out;
  }
  // Integers >= lo, no duplicates.
  std::vector<int64_t> ints(const toml::node& n, const std::string& name, int64_t lo) const {
    if (!n.is_array()) fail(n, fmt::format("'{}' must be an array of integers", name));
    std::vector<int64_t> out;
    for (const toml::node& e : *n.as_array()) {
      if (!e.is_integer()) fail(e, fmt::format("'{}' must be an array of integers", name));
      const int64_t v = e.as_integer()->get();
      if (v < lo) fail(e, fmt::format("'{}': {} is < {}", name, v, lo));
      if (std::find(out.begin(), out.end(), v) != out.end()) fail(e, fmt::format("'{}': {} is listed twice", name, v));
      out.push_back(v);
    }
    return out;
  }
  const toml::table* section(const toml::table& root, const char* key) const {
    const toml::node* n = root.get(key);
    if (!n) return nullptr;
    if (!n->is_table()) fail(*n, fmt::format("'{}' must be a table ([{}])", key, key));
    return n->as_table();
  }

 private:
  std::string source_;
};

}  // namespace

std::vector<DecodeOrder> DecodeOrderSettings::modes() const {
  std::vector<DecodeOrder> out;
  for (int64_t r : residual)
    for (int64_t s : sink)
      for (int64_t p : prefill) out.push_back({CacheMode::Decode, r, s, p});
  return out;
}

const char* to_string(PairSelection p) {
  switch (p) {
    case PairSelection::All: return "all";
    case PairSelection::Adjacent: return "adjacent";
    case PairSelection::Auto: break;
  }
  return "auto";
}

ProbeConfig parse_probe_config(std::string_view text, const std::string& source, const fs::path& base_dir) {
  const Reader R(source);
  const toml::table root = parse_toml(text, source);
  ProbeConfig P;

  if (const toml::table* t = R.section(root, "svd")) {
    R.check_keys(*t, "svd", {"enabled", "centered", "ranks"});
    if (const toml::node* n = t->get("enabled")) P.svd.enabled = R.boolean(*n, "svd.enabled");
    if (const toml::node* n = t->get("centered")) P.svd.centered = R.boolean(*n, "svd.centered");
    if (const toml::node* n = t->get("ranks")) {
      P.svd.ranks = R.ints(*n, "svd.ranks", 1);
      std::sort(P.svd.ranks.begin(), P.svd.ranks.end());
    }
  }

  if (const toml::table* t = R.section(root, "cross_layer")) {
    R.check_keys(*t, "cross_layer", {"enabled", "pairs", "windows", "ranks", "centered"});
    CrossLayerSettings& C = P.cross_layer;
    if (const toml::node* n = t->get("enabled")) C.enabled = R.boolean(*n, "cross_layer.enabled");
    if (const toml::node* n = t->get("centered")) C.centered = R.boolean(*n, "cross_layer.centered");
    if (const toml::node* n = t->get("pairs")) {
      const std::string s = R.string(*n, "cross_layer.pairs");
      if (s == "auto") C.pairs = PairSelection::Auto;
      else if (s == "all") C.pairs = PairSelection::All;
      else if (s == "adjacent") C.pairs = PairSelection::Adjacent;
      else R.fail(*n, fmt::format("'cross_layer.pairs' is '{}', expected \"all\", \"adjacent\" or \"auto\"", s));
    }
    if (const toml::node* n = t->get("windows")) C.windows = R.ints(*n, "cross_layer.windows", 2);
    if (const toml::node* n = t->get("ranks")) {
      C.ranks = R.ints(*n, "cross_layer.ranks", 1);
      const toml::array& a = *n->as_array();
      for (size_t i = 0; i < C.ranks.size(); ++i)
        for (int64_t w : C.windows)
          if (C.ranks[i] % w != 0)
            R.fail(*a.get(i), fmt::format("'cross_layer.ranks': rank {} is not a multiple of the window size {} "
                                          "(a window of w layers stores k coefficients, k/w per layer)",
                                          C.ranks[i], w));
      std::sort(C.ranks.begin(), C.ranks.end());
    }
  }

  if (const toml::table* t = R.section(root, "attention")) {
    R.check_keys(*t, "attention", {"enabled", "targets", "svd", "check_tolerance"});
    AttentionSettings& A = P.attention;
    if (const toml::node* n = t->get("enabled")) A.enabled = R.boolean(*n, "attention.enabled");
    if (const toml::node* n = t->get("svd")) A.svd = R.boolean(*n, "attention.svd");
    if (const toml::node* n = t->get("targets")) {
      A.targets = R.strings(*n, "attention.targets");
      for (size_t i = 0; i < A.targets.size(); ++i) {
        const std::string& s = A.targets[i];
        if (s != "c_kv" && s != "k_pe" && s != "c_kv+k_pe")
          R.fail(*n->as_array()->get(i),
                 fmt::format("'attention.targets': '{}' is not one of \"c_kv\", \"k_pe\", \"c_kv+k_pe\"", s));
        if (std::count(A.targets.begin(), A.targets.end(), s) > 1)
          R.fail(*n->as_array()->get(i), fmt::format("'attention.targets': '{}' is listed twice", s));
      }
    }
    if (const toml::node* n = t->get("check_tolerance")) {
      A.check_tolerance = R.number(*n, "attention.check_tolerance");
      if (!(A.check_tolerance > 0)) R.fail(*n, "'attention.check_tolerance' must be > 0");
    }
  }

  if (const toml::table* t = R.section(root, "decode_order")) {
    R.check_keys(*t, "decode_order", {"residual", "sink", "prefill", "quantizers", "targets", "position_bucket"});
    DecodeOrderSettings& D = P.decode_order;
    D.enabled = true;
    const auto nonempty = [&](const toml::node& n, const std::vector<int64_t>& v, const char* name) {
      if (v.empty()) R.fail(n, fmt::format("'decode_order.{}' is empty (give at least one value)", name));
      return v;
    };
    if (const toml::node* n = t->get("residual")) D.residual = nonempty(*n, R.ints(*n, "decode_order.residual", 0), "residual");
    if (const toml::node* n = t->get("sink")) D.sink = nonempty(*n, R.ints(*n, "decode_order.sink", 0), "sink");
    if (const toml::node* n = t->get("prefill")) D.prefill = nonempty(*n, R.ints(*n, "decode_order.prefill", 0), "prefill");
    if (const toml::node* n = t->get("position_bucket")) {
      if (!n->is_integer() || n->as_integer()->get() < 1)
        R.fail(*n, "'decode_order.position_bucket' must be an integer >= 1 (query positions bucketed as [b*W, (b+1)*W))");
      D.position_bucket = n->as_integer()->get();
    }
    if (const toml::node* n = t->get("targets")) {
      D.targets = R.strings(*n, "decode_order.targets");
      if (D.targets.empty()) R.fail(*n, "'decode_order.targets' is empty");
      for (size_t i = 0; i < D.targets.size(); ++i) {
        const std::string& s = D.targets[i];
        if (s != "c_kv" && s != "k_pe" && s != "c_kv+k_pe")
          R.fail(*n->as_array()->get(i),
                 fmt::format("'decode_order.targets': '{}' is not one of \"c_kv\", \"k_pe\", \"c_kv+k_pe\"", s));
        if (std::count(D.targets.begin(), D.targets.end(), s) > 1)
          R.fail(*n->as_array()->get(i), fmt::format("'decode_order.targets': '{}' is listed twice", s));
      }
    }
    const toml::node* qn = t->get("quantizers");
    if (!qn) R.fail(*t, "[decode_order] needs 'quantizers' (spec strings, e.g. [\"int4-asym-channel-g32\"])");
    const auto specs = R.strings(*qn, "decode_order.quantizers");
    if (specs.empty()) R.fail(*qn, "'decode_order.quantizers' is empty");
    for (size_t i = 0; i < specs.size(); ++i) {
      std::string canon;
      try {
        canon = TransformedSpec::parse(specs[i]).to_string();
      } catch (const std::invalid_argument& e) {
        R.fail(*qn->as_array()->get(i), std::string("'decode_order.quantizers': ") + e.what());
      }
      if (std::find(D.quantizers.begin(), D.quantizers.end(), canon) != D.quantizers.end())
        R.fail(*qn->as_array()->get(i), fmt::format("'decode_order.quantizers': '{}' is listed twice", canon));
      D.quantizers.push_back(canon);
    }
  }

  if (const toml::table* t = R.section(root, "e2e")) {
    R.check_keys(*t, "e2e", {"enabled", "model", "quantizers"});
    E2eSettings& E = P.e2e;
    if (const toml::node* n = t->get("enabled")) E.enabled = R.boolean(*n, "e2e.enabled");
    if (const toml::node* n = t->get("model")) {
      const fs::path p(R.string(*n, "e2e.model"));
      E.model = (p.is_absolute() ? p : base_dir / p).lexically_normal();
    }
    if (const toml::node* n = t->get("quantizers")) {
      const auto specs = R.strings(*n, "e2e.quantizers");
      for (size_t i = 0; i < specs.size(); ++i) {
        try {
          E.quantizers.push_back(TransformedSpec::parse(specs[i]).to_string());
        } catch (const std::invalid_argument& e) {
          R.fail(*n->as_array()->get(i), std::string("'e2e.quantizers': ") + e.what());
        }
      }
    }
  }
  return P;
}

}  // namespace latentq
