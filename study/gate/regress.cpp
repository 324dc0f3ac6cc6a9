#include "latentq/regress.h"
#include "latentq/toml_util.h"

#include <fmt/format.h>
#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <toml++/toml.h>

#include "latentq/probe_study.h"
#include "latentq/results.h"
#include "latentq/spec.h"
#include "latentq/transform.h"

namespace latentq {

bool higher_is_better(const std::string& metric) {
  return metric == "sqnr_db" || metric == "cos_mean" || metric == "top1_agree" || metric == "top8_agree";
}

const std::vector<std::string>& gate_groups() {
  static const std::vector<std::string> groups = [] {
    std::vector<std::string> g = {"latent_error", "summary"};
    for (const std::string& p : probe_groups()) g.push_back(p);
    g.insert(g.end(), {"e2e", "e2e_position"});  // written by python -m latentq.e2e
    return g;
  }();
  return groups;
}

double percentile_linear(std::vector<double> v, double q) {
  if (!(q >= 0 && q <= 1)) throw std::logic_error(fmt::format("percentile_linear: q = {} is not in [0, 1]", q));
  if (v.empty() || std::any_of(v.begin(), v.end(), [](double x) { return std::isnan(x); }))
    return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const double h = static_cast<double>(v.size() - 1) * q;
  const size_t lo = static_cast<size_t>(std::floor(h));
  if (lo + 1 >= v.size()) return v.back();
  return v[lo] + (h - static_cast<double>(lo)) * (v[lo + 1] - v[lo]);
}

namespace {

const char* kStatistics = "max, mean, min or p95";

bool is_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// The result table's column a filter key reads: the key's own name, except `target`, which reads
// `targets` in the groups that hold target sets.
std::string filter_column(const std::string& key, const ColumnTable& t) {
  if (key == "target" && !t.has("target") && t.has("targets")) return "targets";
  return key;
}

}  // namespace

std::string Threshold::name() const {
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : " ") + part; };
  if (!quantizer.empty()) add(quantizer);
  if (target) add(*target);
  if (layer) add(fmt::format("layer {}", *layer));
  if (cache_mode) add(*cache_mode);
  if (rank) add(fmt::format("rank {}", *rank));
  add(fmt::format("/{} {}({})", group, statistic, metric));
  return s;
}

std::vector<Threshold> parse_thresholds(const std::string& text, const std::string& source) {
  const toml::table root = parse_toml(text, source);
  auto where = [&](const toml::node& n) {
    const auto& b = n.source().begin;
    return fmt::format("{}:{}:{}", source, b.line, b.column);
  };
  for (auto&& [k, v] : root)
    if (k.str() != "threshold")
      throw std::invalid_argument(
          fmt::format("{}: unknown key '{}' (expected [[threshold]] entries)", where(v), k.str()));
  const toml::node* arr = root.get("threshold");
  if (!arr) throw std::invalid_argument(source + ": no [[threshold]] entries");
  if (!arr->is_array_of_tables())
    throw std::invalid_argument(where(*arr) + ": 'threshold' must be [[threshold]] tables");
  std::vector<Threshold> out;
  for (const toml::node& n : *arr->as_array()) {
    const toml::table& t = *n.as_table();
    Threshold th;
    th.where = where(n);
    for (auto&& [k, v] : t) {
      const std::string key(k.str());
      th.key_where[key] = where(v);
      auto str = [&]() {
        if (!v.is_string()) throw std::invalid_argument(fmt::format("{}: '{}' must be a string", where(v), key));
        return v.as_string()->get();
      };
      auto integer = [&](int64_t min) {
        if (!v.is_integer() || v.as_integer()->get() < min)
          throw std::invalid_argument(fmt::format("{}: '{}' must be an integer >= {}", where(v), key, min));
        return v.as_integer()->get();
      };
      if (key == "group") {
        th.group = str();
        const auto& g = gate_groups();
        if (std::find(g.begin(), g.end(), th.group) == g.end())
          throw std::invalid_argument(
              fmt::format("{}: unknown group '{}' (groups: {})", where(v), th.group, fmt::join(g, ", ")));
      } else if (key == "quantizer") {
        th.quantizer = str();
        if (th.quantizer.empty()) throw std::invalid_argument(fmt::format("{}: 'quantizer' is empty", where(v)));
        th.quantizer_glob = is_glob(th.quantizer);
        if (!th.quantizer_glob) {
          try {
            th.quantizer = TransformedSpec::parse(th.quantizer).to_string();
          } catch (const std::invalid_argument& e) {
            th.quantizer_error = e.what();  // svd-rank<r>, a [[mixed]] name, or a typo: evaluate_thresholds decides
          }
        }
      } else if (key == "target") {
        th.target = str();
        if (*th.target != "c_kv" && *th.target != "k_pe" && *th.target != "c_kv+k_pe")
          throw std::invalid_argument(
              fmt::format("{}: target '{}' is not c_kv, k_pe or c_kv+k_pe", where(v), *th.target));
      } else if (key == "layer") {
        th.layer = integer(0);
      } else if (key == "rank") {
        th.rank = integer(1);
      } else if (key == "cache_mode") {
        th.cache_mode = str();
      } else if (key == "metric") {
        th.metric = str();
      } else if (key == "statistic") {
        th.statistic = str();
        if (th.statistic != "max" && th.statistic != "mean" && th.statistic != "min" && th.statistic != "p95")
          throw std::invalid_argument(fmt::format("{}: statistic '{}' is not {}", where(v), th.statistic, kStatistics));
      } else if (key == "direction") {
        th.direction = str();
        if (th.direction != "max" && th.direction != "min")
          throw std::invalid_argument(fmt::format(
              "{}: direction '{}' is not max (value <= bound) or min (value >= bound)", where(v), th.direction));
      } else if (key == "bound") {
        if (!v.is_number()) throw std::invalid_argument(fmt::format("{}: 'bound' must be a number", where(v)));
        th.bound = v.is_integer() ? static_cast<double>(v.as_integer()->get()) : v.as_floating_point()->get();
      } else {
        throw std::invalid_argument(
            fmt::format("{}: unknown key '{}' in [[threshold]] (valid: group, metric, statistic, bound, direction, "
                        "quantizer, target, layer, cache_mode, rank)",
                        where(v), key));
      }
    }
    for (const char* req : {"metric", "bound"})
      if (!t.contains(req)) throw std::invalid_argument(fmt::format("{}: [[threshold]] without '{}'", th.where, req));
    if (th.direction.empty()) {  // higher is better for sqnr_db, cos_mean and the agreements, lower for the rest
      th.direction = higher_is_better(th.metric) ? "min" : "max";
      th.direction_inferred = true;
    }
    out.push_back(th);
  }
  return out;
}

std::vector<Threshold> load_thresholds(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  if (!in || std::filesystem::is_directory(path, ec))
    throw std::runtime_error(path.string() + ": cannot read the thresholds file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_thresholds(ss.str(), path.string());
}

GateTables read_gate_tables(const std::filesystem::path& results) {
  GateTables out;
  const std::vector<std::string> groups = list_tables(results);
  for (const std::string& g : gate_groups())
    if (std::find(groups.begin(), groups.end(), g) != groups.end()) out.emplace(g, read_table(results, g));
  return out;
}

namespace {

// The rows of `t` that the threshold's filters select. Throws std::invalid_argument for the config
// errors that depend on the table (see the header comment).
std::vector<size_t> matching_rows(const Threshold& th, const ColumnTable& t, const std::string& results) {
  const std::string group = "/" + th.group;
  auto key_at = [&](const std::string& key) {
    const auto it = th.key_where.find(key);
    return it == th.key_where.end() ? th.where : it->second;
  };
  auto column = [&](const std::string& key, size_t type) -> const Column& {
    const std::string name = filter_column(key, t);
    if (!t.has(name))
      throw std::invalid_argument(fmt::format("{}: '{}' filters on a column that {} lacks ({} columns: {})",
                                              key_at(key), key, group, group, fmt::join(t.names(), ", ")));
    const Column& c = t.at(name);
    if (c.index() != type)
      throw std::invalid_argument(fmt::format("{}: column '{}' of {} is {}, not {}", results, name, group,
                                              column_type(c), type == 0 ? "int64" : "string"));
    return c;
  };
  const size_t n = t.num_rows();
  std::vector<char> keep(n, 1);
  auto filter_str = [&](const std::string& key, const std::string& value, bool glob) {
    const auto& c = std::get<std::vector<std::string>>(column(key, 2));
    for (size_t i = 0; i < n; ++i) keep[i] &= glob ? ::fnmatch(value.c_str(), c[i].c_str(), 0) == 0 : c[i] == value;
  };
  auto filter_int = [&](const std::string& key, int64_t value) {
    const auto& c = std::get<std::vector<int64_t>>(column(key, 0));
    for (size_t i = 0; i < n; ++i) keep[i] &= c[i] == value;
  };
  if (th.quantizer.empty() && t.has("quantizer"))
    throw std::invalid_argument(
        fmt::format("{}: [[threshold]] on {} without 'quantizer' (a name or a glob; \"*\" selects every quantizer)",
                    th.where, group));
  if (!th.quantizer.empty()) {
    filter_str("quantizer", th.quantizer, th.quantizer_glob);
    if (!th.quantizer_error.empty()) {  // not a spec: a name of the table, or a config error
      const auto& q = t.get<std::string>("quantizer");
      if (std::find(q.begin(), q.end(), th.quantizer) == q.end())
        throw std::invalid_argument(fmt::format("{}: {}, and no quantizer of {} in {} is named so", key_at("quantizer"),
                                                th.quantizer_error, group, results));
    }
  }
  if (th.target) {
    if (filter_column("target", t) == "target" && th.target->find('+') != std::string::npos)
      throw std::invalid_argument(
          fmt::format("{}: target '{}' is a target set, but the target column of {} holds one target (c_kv or k_pe)",
                      key_at("target"), *th.target, group));
    filter_str("target", *th.target, false);
  }
  if (th.layer) filter_int("layer", *th.layer);
  if (th.cache_mode) filter_str("cache_mode", *th.cache_mode, false);
  if (th.rank) filter_int("rank", *th.rank);
  std::vector<size_t> rows;
  for (size_t i = 0; i < n; ++i)
    if (keep[i]) rows.push_back(i);
  return rows;
}

double statistic(const std::string& stat, const std::vector<double>& v) {
  if (v.empty() || std::any_of(v.begin(), v.end(), [](double x) { return std::isnan(x); }))
    return std::numeric_limits<double>::quiet_NaN();
  if (stat == "max") return *std::max_element(v.begin(), v.end());
  if (stat == "min") return *std::min_element(v.begin(), v.end());
  if (stat == "mean") {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  }
  if (stat == "p95") return percentile_linear(v, 0.95);
  throw std::logic_error("unknown statistic " + stat);  // parse_thresholds refuses it
}

}  // namespace

std::vector<ThresholdResult> evaluate_thresholds(const GateTables& tables, const std::vector<Threshold>& thresholds,
                                                 const std::string& results) {
  std::vector<std::string> present;
  for (const auto& [g, t] : tables) present.push_back(g);
  // Every config error first: nothing is evaluated when one threshold is wrong.
  std::vector<std::vector<size_t>> rows;
  for (const Threshold& th : thresholds) {
    const auto it = tables.find(th.group);
    if (it == tables.end()) {
      const auto k = th.key_where.find("group");
      throw std::invalid_argument(fmt::format("{}: group /{} is not in {} (its gate groups: {})",
                                              k == th.key_where.end() ? th.where : k->second, th.group, results,
                                              present.empty() ? "none" : fmt::format("{}", fmt::join(present, ", "))));
    }
    const ColumnTable& t = it->second;
    std::vector<std::string> numeric;
    for (const auto& [name, col] : t.columns())
      if (col.index() != 2) numeric.push_back(name);
    if (std::find(numeric.begin(), numeric.end(), th.metric) == numeric.end()) {
      const auto k = th.key_where.find("metric");
      throw std::invalid_argument(fmt::format("{}: metric '{}' is not a numeric column of /{} (numeric columns: {})",
                                              k == th.key_where.end() ? th.where : k->second, th.metric, th.group,
                                              fmt::join(numeric, ", ")));
    }
    rows.push_back(matching_rows(th, t, results));
  }
  std::vector<ThresholdResult> out;
  for (size_t k = 0; k < thresholds.size(); ++k) {
    const Threshold& th = thresholds[k];
    const Column& col = tables.at(th.group).at(th.metric);
    std::vector<double> vals;
    for (size_t i : rows[k])
      vals.push_back(col.index() == 0 ? static_cast<double>(std::get<std::vector<int64_t>>(col)[i])
                                      : std::get<std::vector<double>>(col)[i]);
    ThresholdResult r;
    r.threshold = th;
    r.rows = vals.size();
    r.value = statistic(th.statistic, vals);
    r.pass = !vals.empty() && (th.direction == "max" ? r.value <= th.bound : r.value >= th.bound);  // NaN fails
    out.push_back(r);
  }
  return out;
}

std::string format_threshold_results(const std::vector<ThresholdResult>& results) {
  std::string out, failures;
  size_t fails = 0, width = 0;
  for (const ThresholdResult& r : results) width = std::max(width, r.threshold.name().size());
  for (const ThresholdResult& r : results) {
    const Threshold& t = r.threshold;
    const std::string what = t.name(), op = t.direction == "max" ? "<=" : ">=";
    if (r.rows == 0) {
      out += fmt::format("FAIL  {:<{}} no rows match in /{}\n", what, width, t.group);
      failures += fmt::format("  FAIL  {}: no rows match   ({})\n", what, t.where);
    } else {
      const std::string inferred = t.direction_inferred && t.direction == "min"
                                       ? fmt::format("; direction min inferred: higher {} is better", t.metric)
                                       : std::string();
      out += fmt::format("{}  {:<{}} = {:<12.6g} {} {:.6g}   ({} rows{})\n", r.pass ? "PASS" : "FAIL", what, width,
                         r.value, op, t.bound, r.rows, inferred);
      if (!r.pass)
        failures += fmt::format("  FAIL  {} = {:.6g}, bound {} {:.6g}   ({})\n", what, r.value, op, t.bound, t.where);
    }
    fails += !r.pass;
  }
  out += fmt::format("gate: {} of {} thresholds pass{}\n", results.size() - fails, results.size(),
                     fails ? fmt::format("; {} fail{}:", fails, fails == 1 ? "s" : "") : " (all)");
  return out + failures;
}

}  // namespace latentq
