#include "latentq/regress.h"
#include "latentq/toml_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <toml++/toml.h>

#include "latentq/spec.h"
#include "latentq/transform.h"

namespace latentq {

bool higher_is_better(const std::string& metric) { return metric == "sqnr_db" || metric == "cos_mean"; }

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
      auto str = [&]() {
        if (!v.is_string()) throw std::invalid_argument(fmt::format("{}: '{}' must be a string", where(v), key));
        return v.as_string()->get();
      };
      if (key == "quantizer") {
        const std::string s = str();
        try {
          th.quantizer = TransformedSpec::parse(s).to_string();
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument(fmt::format("{}: {}", where(v), e.what()));
        }
      } else if (key == "target") {
        th.target = str();
        if (th.target != "c_kv" && th.target != "k_pe")
          throw std::invalid_argument(fmt::format("{}: target '{}' is not c_kv or k_pe", where(v), th.target));
      } else if (key == "metric") {
        th.metric = str();
      } else if (key == "statistic") {
        th.statistic = str();
        if (th.statistic != "max" && th.statistic != "mean" && th.statistic != "min")
          throw std::invalid_argument(
              fmt::format("{}: statistic '{}' is not max, mean or min", where(v), th.statistic));
      } else if (key == "direction") {
        th.direction = str();
        if (th.direction != "max" && th.direction != "min")
          throw std::invalid_argument(fmt::format(
              "{}: direction '{}' is not max (value <= bound) or min (value >= bound)", where(v), th.direction));
      } else if (key == "bound") {
        if (!v.is_number()) throw std::invalid_argument(fmt::format("{}: 'bound' must be a number", where(v)));
        th.bound = v.is_integer() ? static_cast<double>(v.as_integer()->get()) : v.as_floating_point()->get();
      } else {
        throw std::invalid_argument(fmt::format(
            "{}: unknown key '{}' in [[threshold]] (valid: quantizer, target, metric, statistic, bound, direction)",
            where(v), key));
      }
    }
    for (const char* req : {"quantizer", "target", "metric", "bound"})
      if (!t.contains(req)) throw std::invalid_argument(fmt::format("{}: [[threshold]] without '{}'", th.where, req));
    if (th.direction.empty()) {  // higher is better for sqnr_db and cos_mean, lower for the rest
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

std::vector<ThresholdResult> evaluate_thresholds(const ColumnTable& le, const std::vector<Threshold>& thresholds) {
  std::vector<std::string> numeric;
  for (const auto& [name, col] : le.columns())
    if (col.index() != 2) numeric.push_back(name);
  const auto& q = le.get<std::string>("quantizer");
  const auto& tg = le.get<std::string>("target");
  std::vector<ThresholdResult> out;
  for (const Threshold& th : thresholds) {
    if (std::find(numeric.begin(), numeric.end(), th.metric) == numeric.end())
      throw std::invalid_argument(
          fmt::format("{}: metric '{}' is not a numeric column of /latent_error (numeric columns: {})", th.where,
                      th.metric, fmt::join(numeric, ", ")));
    const Column& col = le.at(th.metric);
    std::vector<double> vals;
    for (size_t i = 0; i < q.size(); ++i) {
      if (q[i] != th.quantizer || tg[i] != th.target) continue;
      vals.push_back(col.index() == 0 ? static_cast<double>(std::get<std::vector<int64_t>>(col)[i])
                                      : std::get<std::vector<double>>(col)[i]);
    }
    ThresholdResult r;
    r.threshold = th;
    r.rows = vals.size();
    r.value = std::numeric_limits<double>::quiet_NaN();
    if (!vals.empty()) {
      double acc = th.statistic == "mean" ? 0.0 : vals.front();
      bool nan = false;
      for (double v : vals) {
        nan = nan || std::isnan(v);
        if (th.statistic == "mean")
          acc += v;
        else if (th.statistic == "max")
          acc = std::max(acc, v);
        else
          acc = std::min(acc, v);
      }
      if (th.statistic == "mean") acc /= static_cast<double>(vals.size());
      r.value = nan ? std::numeric_limits<double>::quiet_NaN() : acc;
      r.pass = th.direction == "max" ? r.value <= th.bound : r.value >= th.bound;  // NaN fails
    }
    out.push_back(r);
  }
  return out;
}

std::string format_threshold_results(const std::vector<ThresholdResult>& results) {
  std::string out;
  size_t fails = 0;
  for (const ThresholdResult& r : results) {
    const Threshold& t = r.threshold;
    const std::string what = fmt::format("{} {} {}({})", t.quantizer, t.target, t.statistic, t.metric);
    if (r.rows == 0) {
      out += fmt::format("FAIL  {:<52} no rows match (quantizer '{}', target '{}' not in /latent_error)\n", what,
                         t.quantizer, t.target);
    } else {
      const std::string inferred = t.direction_inferred && t.direction == "min"
                                       ? fmt::format("; direction min inferred: higher {} is better", t.metric)
                                       : std::string();
      out += fmt::format("{}  {:<52} = {:<12.6g} {} {:.6g}   ({} rows{})\n", r.pass ? "PASS" : "FAIL", what, r.value,
                         t.direction == "max" ? "<=" : ">=", t.bound, r.rows, inferred);
    }
    fails += !r.pass;
  }
  out +=
      fmt::format("gate: {} of {} thresholds pass{}\n", results.size() - fails, results.size(), fails ? "" : " (all)");
  return out;
}

}  // namespace latentq
