// The decision summary (latentq/decision.h).
#include "latentq/decision.h"
#include "latentq/study.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <variant>

#include "latentq/applicable.h"
#include "latentq/batch_study.h"
#include "latentq/plan.h"
#include "latentq/plan_runs.h"
#include "latentq/regress.h"
#include "latentq/results.h"
#include "latentq/spec.h"
#include "latentq/transform.h"

namespace latentq {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Metric {
  double kl = kNaN, top1 = kNaN, delta_ppl = kNaN;
  double kl_lo = kNaN, kl_hi = kNaN, kl_p999 = kNaN;  ///< /e2e's 95% interval of kl_mean and its p99.9 (when written)
};

// A name of /summary that is a spec or a transformed spec (a mixed assignment's name is not).
std::optional<TransformedSpec> as_spec(const std::string& q) {
  try {
    return TransformedSpec::parse(q);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
}

// A cache layout an engine ships for MLA as it is (the format table's engine field: latentq/spec.h), unrotated.
bool ships_in_an_engine(const TransformedSpec& ts) {
  return ts.transform.kind == TransformKind::None && is_engine_format(ts.spec);
}

const std::vector<std::string>& strings(const ColumnTable& t, const std::string& c) { return t.get<std::string>(c); }
const std::vector<double>& doubles(const ColumnTable& t, const std::string& c) { return t.get<double>(c); }

// The KL of every quantizer: /e2e (prefill-at-once, c_kv+k_pe) when the e2e step ran, else /attention_error
// (c_kv+k_pe, mean over layers). `source` is "e2e" or "attention" ("none" when neither exists).
std::map<std::string, Metric> measured_kl(const std::filesystem::path& results, std::string& source) {
  const std::vector<std::string> groups = list_tables(results);
  const auto has = [&](const char* g) { return std::find(groups.begin(), groups.end(), g) != groups.end(); };
  std::map<std::string, Metric> out;
  if (has("e2e")) {
    const ColumnTable e = read_table(results, "e2e");
    const auto& q = strings(e, "quantizer");
    for (size_t i = 0; i < q.size(); ++i) {
      if (e.has("cache_mode") && strings(e, "cache_mode")[i] != "prefill-at-once") continue;
      if (e.has("targets") && strings(e, "targets")[i] != "c_kv+k_pe") continue;
      const auto col = [&](const char* c) { return e.has(c) ? doubles(e, c)[i] : kNaN; };
      out[q[i]] = {doubles(e, "kl_mean")[i],  doubles(e, "top1_agree")[i],
                   doubles(e, "ppl_quant")[i] - doubles(e, "ppl_ref")[i],
                   col("kl_mean_ci_lo"),      col("kl_mean_ci_hi"),
                   col("kl_p999")};
    }
    if (!out.empty()) {
      source = "e2e";
      return out;
    }
  }
  source = "none";
  if (!has("attention_error")) return out;
  const ColumnTable a = read_table(results, "attention_error");
  const auto& q = strings(a, "quantizer");
  const auto& tg = strings(a, "targets");
  std::map<std::string, std::pair<Metric, int>> acc;
  for (size_t i = 0; i < q.size(); ++i) {
    if (tg[i] != "c_kv+k_pe") continue;
    auto& [m, n] = acc[q[i]];
    if (n == 0) m = {0, 0, kNaN};
    m.kl += doubles(a, "kl_mean")[i];
    m.top1 += doubles(a, "top1_agree")[i];
    ++n;
  }
  for (auto& [name, mn] : acc) out[name] = {mn.first.kl / mn.second, mn.first.top1 / mn.second, kNaN};
  if (!out.empty()) source = "attention";
  return out;
}

// The per-sequence KL sums of the /e2e runs (prefill-at-once, c_kv+k_pe) and the bootstrap draws they share
// (/e2e_seq, /e2e_bootstrap, written by latentq.e2e_stats.paired_groups); empty when the file has none.
struct PerSequence {
  std::map<std::string, std::vector<double>> kl_sum;  ///< quantizer -> per-sequence Σ KL_t
  std::vector<double> tokens;                         ///< per-sequence token count (equal for every run)
  std::vector<std::vector<double>> counts;            ///< [draw][seq]
};

PerSequence per_sequence(const std::filesystem::path& results) {
  PerSequence p;
  const std::vector<std::string> groups = list_tables(results);
  const auto has = [&](const char* g) { return std::find(groups.begin(), groups.end(), g) != groups.end(); };
  if (!has("e2e_seq") || !has("e2e_bootstrap")) return p;
  const ColumnTable s = read_table(results, "e2e_seq");
  for (size_t i = 0; i < s.num_rows(); ++i) {
    if (strings(s, "cache_mode")[i] != "prefill-at-once" || strings(s, "targets")[i] != "c_kv+k_pe") continue;
    const auto b = static_cast<size_t>(s.get<int64_t>("seq")[i]);
    auto& v = p.kl_sum[strings(s, "quantizer")[i]];
    if (v.size() <= b) v.resize(b + 1, kNaN);
    if (p.tokens.size() <= b) p.tokens.resize(b + 1, kNaN);
    v[b] = doubles(s, "kl_sum")[i];
    p.tokens[b] = static_cast<double>(s.get<int64_t>("tokens")[i]);
  }
  const ColumnTable c = read_table(results, "e2e_bootstrap");
  for (size_t i = 0; i < c.num_rows(); ++i) {
    const auto r = static_cast<size_t>(c.get<int64_t>("draw")[i]), b = static_cast<size_t>(c.get<int64_t>("seq")[i]);
    if (p.counts.size() <= r) p.counts.resize(r + 1);
    if (p.counts[r].size() <= b) p.counts[r].resize(b + 1, 0.0);
    p.counts[r][b] = static_cast<double>(c.get<int64_t>("count")[i]);
  }
  return p;
}

}  // namespace

PairedKl paired_kl_difference(const std::vector<double>& kl_sum_a, const std::vector<double>& kl_sum_b,
                              const std::vector<double>& tokens, const std::vector<std::vector<double>>& counts) {
  const size_t n = tokens.size();
  if (kl_sum_a.size() != n || kl_sum_b.size() != n || n == 0)
    throw std::invalid_argument(fmt::format("paired KL: per-sequence values of {} and {} sequences for {} token counts",
                                            kl_sum_a.size(), kl_sum_b.size(), n));
  const double tok = std::accumulate(tokens.begin(), tokens.end(), 0.0);
  PairedKl out;
  out.tokens = static_cast<int64_t>(tok);
  out.num_seqs = static_cast<int64_t>(n);
  out.delta = std::accumulate(kl_sum_a.begin(), kl_sum_a.end(), 0.0) / tok -
              std::accumulate(kl_sum_b.begin(), kl_sum_b.end(), 0.0) / tok;
  if (n < 2 || counts.empty()) return out;
  std::vector<double> d;
  d.reserve(counts.size());
  for (const std::vector<double>& c : counts) {
    if (c.size() != n) throw std::invalid_argument(fmt::format("paired KL: a draw of {} sequences, not {}", c.size(), n));
    double a = 0, b = 0, t = 0;
    for (size_t s = 0; s < n; ++s) a += c[s] * kl_sum_a[s], b += c[s] * kl_sum_b[s], t += c[s] * tokens[s];
    d.push_back(a / t - b / t);
  }
  out.lo = percentile_linear(d, 0.025);  // latentq/regress.h: numpy's "linear"
  out.hi = percentile_linear(d, 0.975);
  return out;
}

std::string paired_verdict(const std::string& best, const std::string& runner_up, double best_bytes,
                           double runner_up_bytes, const PairedKl& p, const std::string& source) {
  if (runner_up.empty()) return fmt::format("{} is the only measured uniform format within the budget", best);
  if (source != "e2e")
    return fmt::format("{} vs {}: verdict not available (the KL is the attention KL; no /e2e per-sequence values)",
                       best, runner_up);
  if (!std::isfinite(p.delta))
    return fmt::format("{} vs {}: verdict not available (/e2e has no per-sequence values: rerun the e2e step)", best,
                       runner_up);
  if (!std::isfinite(p.lo) || !std::isfinite(p.hi))
    return fmt::format("{} vs {}: ΔKL = {:.4g}, no interval: {} sequence (the bootstrap over sequences needs two or "
                       "more)",
                       best, runner_up, p.delta, p.num_seqs);
  if (p.lo > 0)
    return fmt::format("{} beats {}: ΔKL = {:.4g} [{:.4g}, {:.4g}]", best, runner_up, p.delta, p.lo, p.hi);
  const std::string& cheaper = runner_up_bytes < best_bytes ? runner_up : best;
  return fmt::format("{} and {} are indistinguishable on {} tokens; the cheaper is {} (ΔKL = {:.4g} [{:.4g}, {:.4g}])",
                     best, runner_up, p.tokens, cheaper, p.delta, p.lo, p.hi);
}

namespace {

// Σ over the planner's groups of `quantizer`'s objective (NaN when a group lacks it).
double plan_objective_of(const PlanInputs& in, const std::string& quantizer) {
  double s = 0;
  for (const PlanGroup& g : in.groups) {
    const auto it =
        std::find_if(g.options.begin(), g.options.end(), [&](const PlanOption& o) { return o.quantizer == quantizer; });
    if (it == g.options.end()) return kNaN;
    s += it->objective;
  }
  return s;
}

// A row's comparison with another measured format (`other`): that format, its KL and tail, the paired difference
// KL(other) − KL(row) over the /e2e sequences (NaN without them) and the verdict; all empty for none.
struct Comparison {
  std::string other;
  double kl = kNaN, p999 = kNaN;
  PairedKl p;
  std::string verdict;
};
Comparison paired(const PerSequence& seqs, const std::string& other, const Metric& m, const std::string& row) {
  Comparison c{other, m.kl, m.kl_p999, {}, ""};
  const auto a = seqs.kl_sum.find(other), b = seqs.kl_sum.find(row);
  if (a != seqs.kl_sum.end() && b != seqs.kl_sum.end())
    c.p = paired_kl_difference(a->second, b->second, seqs.tokens, seqs.counts);
  return c;
}

// The verdict of a measured plan (its run `run`) against the best uniform format (c.other): the plan named "the plan
// (<run>)", the uniform format first when it wins (the interval below 0: the difference the other way round).
Comparison plan_comparison(Comparison c, const std::string& run, double bytes, double uniform_bytes,
                           const std::string& source) {
  const std::string plan = "the plan (" + run + ")";
  if (c.p.hi < 0) {
    PairedKl r = c.p;
    r.delta = -c.p.delta, r.lo = -c.p.hi, r.hi = -c.p.lo;
    c.verdict = paired_verdict(c.other, plan, uniform_bytes, bytes, r, source);
  } else {
    c.verdict = paired_verdict(plan, c.other, bytes, uniform_bytes, c.p, source);
  }
  return c;
}

std::string plan_name(const PlanInputs& in, const PlanSolution& s) {
  std::map<std::string, int> count;
  std::vector<std::string> order;
  for (size_t g = 0; g < in.groups.size(); ++g) {
    const std::string& q = in.groups[g].options[s.choice[g]].quantizer;
    if (count[q]++ == 0) order.push_back(q);
  }
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) { return count[a] > count[b]; });
  std::string name = "mixed:";
  for (size_t i = 0; i < order.size(); ++i) name += fmt::format("{} {} x{}", i ? "," : "", order[i], count[order[i]]);
  return name;
}

double parse_fraction(const std::string& s) {
  const auto bad = [&]() {
    return std::invalid_argument(
        fmt::format("budget '{}': expected a fraction of the bf16 cache in (0, 1], as a/b or a decimal", s));
  };
  size_t used = 0;
  double v = 0;
  try {
    const size_t slash = s.find('/');
    if (slash == std::string::npos) {
      v = std::stod(s, &used);
      if (used != s.size()) throw bad();
    } else {
      const std::string a = s.substr(0, slash), b = s.substr(slash + 1);
      const double num = std::stod(a, &used);
      if (used != a.size()) throw bad();
      const double den = std::stod(b, &used);
      if (used != b.size() || den == 0) throw bad();
      v = num / den;
    }
  } catch (const std::logic_error&) {  // std::stod's invalid_argument / out_of_range, and ours
    throw bad();
  }
  if (!(v > 0 && v <= 1)) throw bad();
  return v;
}

}  // namespace

const std::vector<double>& default_budget_fractions() {
  static const std::vector<double> f = {1.0 / 16, 1.0 / 8, 1.0 / 4, 3.0 / 8, 1.0 / 2};
  return f;
}

std::vector<double> parse_budget_fractions(const std::string& text) {
  std::vector<double> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    out.push_back(parse_fraction(part));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

const GroupSpec& decision_spec() {
  static const GroupSpec g{
      "decision",
      {{"budget_fraction", ColType::F64, "1", "the budget as a fraction of the whole-model bf16 cache"},
       {"budget_bytes", ColType::F64, "byte/token", "the budget: whole model, c_kv + k_pe, metadata included"},
       {"choice", ColType::Str, "", "uniform, engine or plan (latentq/decision.h)"},
       {"quantizer", ColType::Str, "", "the choice's quantizer (- when nothing measured fits; a plan: mixed: ...)"},
       {"bytes_per_token_model", ColType::F64, "byte/token", "the choice's cache: whole model, c_kv + k_pe"},
       {"kl_mean", ColType::F64, "nat", "its KL: the e2e next-token KL, else the attention KL (source)"},
       {"top1_agree", ColType::F64, "1", "its top-1 agreement, from the same source"},
       {"delta_ppl", ColType::F64, "1", "ppl_quant − ppl_ref of its /e2e row (NaN without the e2e step)"},
       {"source", ColType::Str, "",
        "where kl_mean comes from: e2e, attention, measured-e2e, measured-attention, predicted or none"},
       {"plan_objective", ColType::F64, "",
        "the planner's objective of the choice's assignment (the unit of the objective column's kl or mse)"},
       {"engine", ColType::Str, "", "the engine and setting that ship the choice's format (empty when none)"},
       {"objective", ColType::Str, "", "the planner's objective: kl or mse"},
       {"kl_ci_lo", ColType::F64, "nat",
        "the lower end of kl_mean's 95% interval (its /e2e row's kl_mean_ci_lo: a bootstrap over sequences; NaN "
        "without it)"},
       {"kl_ci_hi", ColType::F64, "nat", "the upper end of the same interval"},
       {"kl_p999", ColType::F64, "nat",
        "the 99.9th percentile of the per-token KL (its /e2e row's kl_p999): the tail beside the mean"},
       {"runner_up", ColType::Str, "",
        "a uniform row: the format with the next-lowest KL at the same budget; a measured plan row: the uniform "
        "row's format (the best uniform at the same budget); empty when none"},
       {"runner_up_kl", ColType::F64, "nat", "the runner-up's kl_mean (NaN when none)"},
       {"runner_up_p999", ColType::F64, "nat", "the runner-up's per-token p99.9 KL (NaN when none)"},
       {"delta_kl", ColType::F64, "nat",
        "kl_mean(runner-up) − kl_mean(choice) over the same /e2e tokens (paired_kl_difference; NaN without /e2e_seq; "
        "a plan row: the best uniform format's minus the plan's)"},
       {"delta_kl_lo", ColType::F64, "nat",
        "the lower end of delta_kl's 95% paired percentile bootstrap over sequences (the /e2e_bootstrap draws of "
        "/e2e's intervals); NaN with one sequence"},
       {"delta_kl_hi", ColType::F64, "nat", "the upper end of the same interval"},
       {"verdict", ColType::Str, "",
        "a uniform row: 'X beats Y: ΔKL = a [lo, hi]' when lo > 0, else 'X and Y are indistinguishable on N tokens "
        "...; the cheaper is Z', or why there is none (paired_verdict); a measured plan row: the same of the plan "
        "and the best uniform format (the uniform one named first when its interval is below 0)"},
       {"e2e_run", ColType::Str, "",
        "the /e2e run (its quantizer column: a spec, or a plan's /plan_runs name) the measured columns come from; "
        "empty when none"},
       {"gen_first_divergence", ColType::F64, "token",
        "its /generation row's first_divergence_mean: where its free-running greedy tokens first leave the "
        "reference's (gen_new_tokens when they never do; NaN without /generation)"},
       {"gen_first_divergence_lo", ColType::F64, "token", "the lower end of that row's 95% interval over prompts"},
       {"gen_first_divergence_hi", ColType::F64, "token", "the upper end of the same interval"},
       {"gen_identical", ColType::F64, "1", "its /generation row's identical_fraction"},
       {"gen_new_tokens", ColType::I64, "token", "the tokens generated per prompt (/generation's new_tokens; 0 without)"},
       {"retrieval_accuracy", ColType::F64, "1",
        "its /retrieval_summary row's accuracy: the needle samples its greedy continuation reproduces (NaN without)"},
       {"retrieval_ci_lo", ColType::F64, "1", "the lower end of that accuracy's 95% Wilson interval"},
       {"retrieval_ci_hi", ColType::F64, "1", "the upper end of the same interval"},
       {"retrieval_ref_accuracy", ColType::F64, "1", "the reference's accuracy on the same samples"},
       {"retrieval_samples", ColType::I64, "", "the needle samples (0 without /retrieval_summary)"},
       {"retrieval_lost", ColType::I64, "", "samples the reference retrieves and the choice does not"},
       {"free_running", ColType::Str, "",
        "the row's generation and retrieval figures as one line ('generation: first divergence at a [lo, hi] of N "
        "tokens, identical f; retrieval: acc [lo, hi] of n needles (reference r, lost k)'), the line the terminal and "
        "report.md print under the choice; empty when it has neither"}}};
  return g;
}

std::string free_running_line(const ColumnTable& t, size_t i) {
  std::vector<std::string> parts;
  const auto d = [&](const char* c) { return doubles(t, c)[i]; };
  if (std::isfinite(d("gen_first_divergence"))) {
    const bool ci = std::isfinite(d("gen_first_divergence_lo")) && std::isfinite(d("gen_first_divergence_hi"));
    parts.push_back(fmt::format(
        "generation: first divergence at {:.3g}{} of {} tokens, identical {:.3f}", d("gen_first_divergence"),
        ci ? fmt::format(" [{:.3g}, {:.3g}]", d("gen_first_divergence_lo"), d("gen_first_divergence_hi")) : "",
        t.get<int64_t>("gen_new_tokens")[i], d("gen_identical")));
  }
  if (std::isfinite(d("retrieval_accuracy")))
    parts.push_back(fmt::format("retrieval: {:.3f} [{:.3f}, {:.3f}] of {} needles (reference {:.3f}, lost {})",
                                d("retrieval_accuracy"), d("retrieval_ci_lo"), d("retrieval_ci_hi"),
                                t.get<int64_t>("retrieval_samples")[i], d("retrieval_ref_accuracy"),
                                t.get<int64_t>("retrieval_lost")[i]));
  return fmt::format("{}", fmt::join(parts, "; "));
}

namespace {
// The free-running columns of each /decision row from /generation and /retrieval_summary (their prefill-at-once,
// c_kv+k_pe rows, as the KL of measured_kl), by the row's e2e_run; NaN / 0 where the file has none.
void add_free_running(const std::filesystem::path& results, ColumnTable& t) {
  const std::vector<std::string> groups = list_tables(results);
  const auto has = [&](const char* g) { return std::find(groups.begin(), groups.end(), g) != groups.end(); };
  const auto rows_of = [&](const char* g) {
    std::map<std::string, size_t> at;  // quantizer -> row
    if (!has(g)) return std::pair{ColumnTable{}, at};
    ColumnTable r = read_table(results, g);
    for (size_t i = 0; i < r.num_rows(); ++i)
      if (strings(r, "cache_mode")[i] == "prefill-at-once" && strings(r, "targets")[i] == "c_kv+k_pe")
        at[strings(r, "quantizer")[i]] = i;
    return std::pair{std::move(r), at};
  };
  const auto [gen, gen_at] = rows_of("generation");
  const auto [ret, ret_at] = rows_of("retrieval_summary");
  int64_t new_tokens = 0;
  if (has("generation"))
    for (const auto& [k, v] : read_group_attrs(results, "generation"))
      if (k == "new_tokens" && std::holds_alternative<int64_t>(v)) new_tokens = std::get<int64_t>(v);
  const auto& run = strings(t, "e2e_run");
  for (size_t i = 0; i < run.size(); ++i) {
    const auto g = gen_at.find(run[i]);
    const auto r = ret_at.find(run[i]);
    const auto gcol = [&](const char* c) { return g == gen_at.end() ? kNaN : doubles(gen, c)[g->second]; };
    const auto rcol = [&](const char* c) { return r == ret_at.end() ? kNaN : doubles(ret, c)[r->second]; };
    t.get<double>("gen_first_divergence").push_back(gcol("first_divergence_mean"));
    t.get<double>("gen_first_divergence_lo").push_back(gcol("first_divergence_ci_lo"));
    t.get<double>("gen_first_divergence_hi").push_back(gcol("first_divergence_ci_hi"));
    t.get<double>("gen_identical").push_back(gcol("identical_fraction"));
    t.get<int64_t>("gen_new_tokens").push_back(g == gen_at.end() ? 0 : new_tokens);
    t.get<double>("retrieval_accuracy").push_back(rcol("accuracy"));
    t.get<double>("retrieval_ci_lo").push_back(rcol("accuracy_ci_lo"));
    t.get<double>("retrieval_ci_hi").push_back(rcol("accuracy_ci_hi"));
    t.get<double>("retrieval_ref_accuracy").push_back(rcol("ref_accuracy"));
    t.get<int64_t>("retrieval_samples").push_back(r == ret_at.end() ? 0 : ret.get<int64_t>("samples")[r->second]);
    t.get<int64_t>("retrieval_lost").push_back(r == ret_at.end() ? 0 : ret.get<int64_t>("lost")[r->second]);
    t.get<std::string>("free_running").push_back(free_running_line(t, i));
  }
}
}  // namespace

ColumnTable decision_table(const std::filesystem::path& results, const std::vector<double>& fractions) {
  const DumpAttrs d = dump_attrs_from_results(read_results_attrs(results));
  if (d.v4())  // its budgets are fractions of the bf16 c_kv + k_pe cache
    throw std::invalid_argument(fmt::format("{}: the decision is {}", results.string(), kV4SummaryNotApplicable));
  const double bf16 = static_cast<double>(d.bf16_bytes_per_token());
  const ColumnTable summary = read_table(results, "summary");
  const auto& sq = strings(summary, "quantizer");
  const auto& sb = doubles(summary, "bytes_per_token_model");
  // A quantizer whose format cannot take a target's width cannot be the format of the whole cache.
  const auto inapplicable = [&](size_t i) {
    for (const char* c : {"c_kv_accounting", "k_pe_accounting"})
      if (summary.has(c) && strings(summary, c)[i] == kNotApplicableAccounting) return true;
    return false;
  };
  std::string source;
  const std::map<std::string, Metric> kl = measured_kl(results, source);

  // The planner at every budget (objective kl when /attention_error has single-target rows, else mse), and the
  // mixed runs that may measure it: the study's [[mixed]] assignments, then the runs of /plan_runs.
  const DecisionPlans plans = decision_plans(results, fractions);
  const PlanInputs* in = &plans.in;
  std::vector<std::pair<std::string, Assignment>> mixed;
  for (auto& m : study_mixed_assignments(read_table(results, "latent_error"))) mixed.emplace_back(std::move(m));
  for (auto& m : planned_runs(results)) mixed.emplace_back(std::move(m));

  ColumnTable t = empty_table(decision_spec());
  auto& c_frac = t.get<double>("budget_fraction");
  auto& c_budget = t.get<double>("budget_bytes");
  auto& c_choice = t.get<std::string>("choice");
  auto& c_q = t.get<std::string>("quantizer");
  auto& c_bytes = t.get<double>("bytes_per_token_model");
  auto& c_kl = t.get<double>("kl_mean");
  auto& c_top1 = t.get<double>("top1_agree");
  auto& c_dppl = t.get<double>("delta_ppl");
  auto& c_src = t.get<std::string>("source");
  auto& c_obj = t.get<double>("plan_objective");
  auto& c_engine = t.get<std::string>("engine");
  auto& c_lo = t.get<double>("kl_ci_lo");
  auto& c_hi = t.get<double>("kl_ci_hi");
  auto& c_p999 = t.get<double>("kl_p999");
  auto& c_ru = t.get<std::string>("runner_up");
  auto& c_ru_kl = t.get<double>("runner_up_kl");
  auto& c_ru_p999 = t.get<double>("runner_up_p999");
  auto& c_d = t.get<double>("delta_kl");
  auto& c_dlo = t.get<double>("delta_kl_lo");
  auto& c_dhi = t.get<double>("delta_kl_hi");
  auto& c_verdict = t.get<std::string>("verdict");
  const PerSequence seqs = per_sequence(results);
  const auto push = [&](const Comparison& c) {
    c_ru.push_back(c.other);
    c_ru_kl.push_back(c.kl);
    c_ru_p999.push_back(c.p999);
    c_d.push_back(c.p.delta);
    c_dlo.push_back(c.p.lo);
    c_dhi.push_back(c.p.hi);
    c_verdict.push_back(c.verdict);
  };
  // The runner-up of a uniform row (sq index), its paired difference to the best and the verdict.
  const auto compare = [&](size_t best, std::optional<size_t> second) {
    Comparison c;
    if (second) c = paired(seqs, sq[*second], kl.at(sq[*second]), sq[best]);
    c.verdict = paired_verdict(sq[best], c.other, sb[best], second ? sb[*second] : kNaN, c.p, source);
    push(c);
  };
  const auto no_comparison = [&]() { push(Comparison{}); };
  // A measured plan row (its run `run`) against the best uniform format at its budget (none: no comparison).
  const auto compare_plan = [&](const std::string& run, double bytes, std::optional<size_t> uniform) {
    if (!uniform) return no_comparison();
    push(plan_comparison(paired(seqs, sq[*uniform], kl.at(sq[*uniform]), run), run, bytes, sb[*uniform], source));
  };
  auto& c_run = t.get<std::string>("e2e_run");
  const auto row = [&](double f, const char* choice, const std::string& q, double bytes, const Metric& m,
                       const std::string& src, double obj, const std::string& run = "") {
    c_run.push_back(std::isfinite(m.kl) && src.ends_with("e2e") ? (run.empty() ? q : run) : std::string());
    const std::optional<TransformedSpec> ts = as_spec(q);
    c_engine.push_back(ts && ts->transform.kind == TransformKind::None ? engine_of(ts->spec) : std::string());
    c_frac.push_back(f);
    c_budget.push_back(f * bf16);
    c_choice.push_back(choice);
    c_q.push_back(q);
    c_bytes.push_back(bytes);
    c_kl.push_back(m.kl);
    c_top1.push_back(m.top1);
    c_dppl.push_back(m.delta_ppl);
    c_src.push_back(src);
    c_obj.push_back(obj);
    c_lo.push_back(m.kl_lo);
    c_hi.push_back(m.kl_hi);
    c_p999.push_back(m.kl_p999);
  };
  for (size_t k = 0; k < fractions.size(); ++k) {
    const double f = fractions[k], lim = f * bf16 * (1 + kPlanBudgetSlack);
    std::optional<size_t> uniform_best;  // its /summary row
    for (const bool engine : {false, true}) {
      std::optional<size_t> best, second;
      for (size_t i = 0; i < sq.size(); ++i) {
        const std::optional<TransformedSpec> ts = as_spec(sq[i]);
        const auto m = kl.find(sq[i]);
        if (!ts || m == kl.end() || !std::isfinite(m->second.kl) || sb[i] > lim || inapplicable(i)) continue;
        if (engine && !ships_in_an_engine(*ts)) continue;
        if (!best || m->second.kl < kl.at(sq[*best]).kl) {
          second = best;
          best = i;
        } else if (!second || m->second.kl < kl.at(sq[*second]).kl) {
          second = i;
        }
      }
      const char* choice = engine ? "engine" : "uniform";
      if (best)
        row(f, choice, sq[*best], sb[*best], kl.at(sq[*best]), source, plan_objective_of(*in, sq[*best]));
      else
        row(f, choice, "-", kNaN, {}, "none", kNaN);
      if (!engine) uniform_best = best;
      if (best && !engine)
        compare(*best, second);
      else
        no_comparison();
    }
    const std::optional<PlanSolution>& s = plans.at[k];
    if (!s) {  // the budget is below the cheapest assignment
      row(f, "plan", "-", kNaN, {}, "none", kNaN);
      no_comparison();
      continue;
    }
    const Assignment a = plan_assignment(*in, *s);
    const auto run = std::find_if(mixed.begin(), mixed.end(), [&](const auto& m) {
      const auto k = kl.find(m.first);
      return m.second == a && k != kl.end() && std::isfinite(k->second.kl);
    });
    if (run == mixed.end()) {
      row(f, "plan", plan_name(*in, *s), s->bytes, {}, "predicted", s->objective);
      no_comparison();
      continue;
    }
    row(f, "plan", plan_name(*in, *s), s->bytes, kl.at(run->first), "measured-" + source, s->objective, run->first);
    compare_plan(run->first, s->bytes, uniform_best);
  }
  t.get<std::string>("objective") = std::vector<std::string>(c_frac.size(), in->objective);
  add_free_running(results, t);
  return t;
}

std::string format_decision(const ColumnTable& t) {
  const auto& f = doubles(t, "budget_fraction");
  const auto& budget = doubles(t, "budget_bytes");
  const auto& choice = strings(t, "choice");
  const auto& q = strings(t, "quantizer");
  const auto& bytes = doubles(t, "bytes_per_token_model");
  const auto& kl = doubles(t, "kl_mean");
  const auto& top1 = doubles(t, "top1_agree");
  const auto& dppl = doubles(t, "delta_ppl");
  const auto& src = strings(t, "source");
  const auto& obj = doubles(t, "plan_objective");
  const std::vector<std::string> engine = t.has("engine") ? strings(t, "engine") : std::vector<std::string>(q.size());
  const std::vector<double> none(q.size(), kNaN);  // files written before the columns
  const auto& lo = t.has("kl_ci_lo") ? doubles(t, "kl_ci_lo") : none;
  const auto& hi = t.has("kl_ci_hi") ? doubles(t, "kl_ci_hi") : none;
  const auto& p999 = t.has("kl_p999") ? doubles(t, "kl_p999") : none;
  const std::vector<std::string> verdict =
      t.has("verdict") ? strings(t, "verdict") : std::vector<std::string>(q.size());
  const auto& ru_p999 = t.has("runner_up_p999") ? doubles(t, "runner_up_p999") : none;
  std::vector<std::string> free_running(q.size());  // a file written before the column: from its gen_* columns
  for (size_t i = 0; i < q.size(); ++i)
    free_running[i] = t.has("free_running")           ? strings(t, "free_running")[i]
                      : t.has("gen_first_divergence") ? free_running_line(t, i)
                                                      : std::string();
  std::string out = "decision (bytes: whole model, c_kv + k_pe, metadata included, per token):\n";
  for (size_t i = 0; i < t.num_rows(); ++i) {
    if (i == 0 || f[i] != f[i - 1])
      out += fmt::format("at {:.6g} B/token ({} of bf16):\n", budget[i], budget_fraction_label(f[i]));
    if (q[i] == "-") {
      out += fmt::format("  {:<8} nothing measured fits\n", choice[i]);
      continue;
    }
    std::string what;
    if (std::isfinite(kl[i]))
      what = fmt::format("KL {:.4g}{}{}, top-1 {:.4f}{} ({})", kl[i],
                         std::isfinite(lo[i]) && std::isfinite(hi[i]) ? fmt::format(" [{:.4g}, {:.4g}]", lo[i], hi[i])
                                                                      : std::string(),
                         std::isfinite(p999[i]) ? fmt::format(", p99.9 {:.4g}", p999[i]) : std::string(), top1[i],
                         std::isfinite(dppl[i]) ? fmt::format(", dppl {:+.4g}", dppl[i]) : std::string(), src[i]);
    else
      what = fmt::format("{}, planner objective {:.4g}", src[i], obj[i]);
    const std::string shipped = choice[i] == "engine" && !engine[i].empty() ? " [" + engine[i] + "]" : "";
    out += fmt::format("  {:<8} {}{} at {:.6g} B/token: {}\n", choice[i], q[i], shipped, bytes[i], what);
    if (!verdict[i].empty()) {
      const std::string tails = std::isfinite(p999[i]) && std::isfinite(ru_p999[i])
                                    ? fmt::format(" (p99.9 {:.4g} vs {:.4g})", p999[i], ru_p999[i])
                                    : std::string();
      out += fmt::format("  {:<8} {}{}\n", choice[i] == "plan" ? "vs uniform" : "vs next", verdict[i], tails);
    }
    if (!free_running[i].empty()) out += fmt::format("  {:<8} {}\n", "", free_running[i]);
  }
  const bool e2e = std::any_of(src.begin(), src.end(), [](const std::string& s) { return s.ends_with("e2e"); });
  if (t.num_rows() > 0)
    out += fmt::format("(KL: {}; the planner's objective: {})\n",
                       e2e ? "the model's next-token KL with quantized latents (/e2e), [its 95% interval over "
                             "sequences], p99.9: the per-token tail"
                           : "the absorbed attention's KL, mean over layers (/attention_error)",
                       strings(t, "objective")[0] == "kl" ? "sum of single-target attention KL over (layer, target)"
                                                          : "sum of squared error per token over (layer, target)");
  if (t.has("gen_first_divergence") &&
      std::any_of(t.get<double>("gen_first_divergence").begin(), t.get<double>("gen_first_divergence").end(),
                  [](double x) { return std::isfinite(x); }))
    out += "(generation: free-running greedy tokens vs the reference's, mean over prompts [95% interval]; "
           "retrieval: needles reproduced, [Wilson 95% interval]; both with the prefill-at-once cache)\n";
  return out;
}

}  // namespace latentq
