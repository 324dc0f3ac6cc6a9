// `latentq plan` (latentq/plan.h).
#include "latentq/plan.h"
#include "latentq/study.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <stdexcept>

#include "latentq/batch_study.h"
#include "latentq/results.h"
#include "latentq/table.h"
#include "latentq/transform.h"

namespace latentq {
namespace {

constexpr int64_t kMaxExact = int64_t{1} << 53;  // integers a double holds exactly
constexpr int64_t kMaxDenominator = int64_t{1} << 40;

// One point of a Pareto frontier's back-pointers: the previous frontier's point and this group's option.
struct Back {
  uint32_t parent;
  uint32_t option;
};

// The options of `g` that no other option dominates (costs no more and scores no worse; of equal
// options the lower index), by cost ascending (objective strictly descending).
std::vector<size_t> undominated(const PlanGroup& g) {
  std::vector<size_t> idx(g.options.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    const PlanOption &x = g.options[a], &y = g.options[b];
    return x.cost != y.cost ? x.cost < y.cost : x.objective < y.objective;
  });
  std::vector<size_t> out;
  for (size_t i : idx)
    if (out.empty() || g.options[i].objective < g.options[out.back()].objective) out.push_back(i);
  return out;
}

// One DP step: the Pareto frontier (cost ascending, objective strictly descending) of the previous
// frontier (cost, obj) plus one option of `g` among `opts`, totals above `limit` dropped. A k-way merge
// of the shifted copies (each sorted by cost) in (cost, objective, option index, parent) order, keeping
// a point only when its objective is below every kept (cheaper or equal) one.
void extend(const std::vector<int64_t>& cost, const std::vector<double>& obj, const PlanGroup& g,
            const std::vector<size_t>& opts, int64_t limit, std::vector<int64_t>& ncost, std::vector<double>& nobj,
            std::vector<Back>& back) {
  ncost.clear();
  nobj.clear();
  back.clear();
  struct Head {
    int64_t cost;
    double obj;
    uint32_t option, parent;
  };
  auto after = [](const Head& a, const Head& b) {  // heap order: the smallest head on top
    if (a.cost != b.cost) return a.cost > b.cost;
    if (a.obj != b.obj) return a.obj > b.obj;
    return a.option != b.option ? a.option > b.option : a.parent > b.parent;
  };
  std::vector<Head> heap;
  auto push = [&](uint32_t option, uint32_t parent) {
    if (parent >= cost.size()) return;
    const PlanOption& o = g.options[option];
    const int64_t c = cost[parent] + o.cost;
    if (c > limit) return;  // the rest of this copy costs more
    heap.push_back({c, obj[parent] + o.objective, option, parent});
    std::push_heap(heap.begin(), heap.end(), after);
  };
  for (size_t k : opts) push(static_cast<uint32_t>(k), 0);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), after);
    const Head h = heap.back();
    heap.pop_back();
    if (nobj.empty() || h.obj < nobj.back()) {
      ncost.push_back(h.cost);
      nobj.push_back(h.obj);
      back.push_back({h.parent, h.option});
      push(h.option, h.parent + 1);
      continue;
    }
    // Dominated: so is every later point of this copy whose objective is not below the best kept one
    // (objectives fall along a copy, costs rise): resume at the first that is below it (binary search).
    const double best = nobj.back(), v = g.options[h.option].objective;
    const auto first =
        std::partition_point(obj.begin() + h.parent + 1, obj.end(), [&](double x) { return x + v >= best; });
    push(h.option, static_cast<uint32_t>(first - obj.begin()));
  }
}

// The plan units of a budget in bytes per token: the largest total within budget · (1 + slack), at
// most sum_max (capped: the budget is above it, beyond the slack); -1 below sum_min.
int64_t budget_units(double budget, int64_t units_per_byte, int64_t sum_min, int64_t sum_max, bool& capped) {
  const long double exact = static_cast<long double>(budget) * static_cast<long double>(units_per_byte);
  const long double lim = exact * (1.0L + static_cast<long double>(kPlanBudgetSlack));
  capped = exact > static_cast<long double>(sum_max) * (1.0L + static_cast<long double>(kPlanBudgetSlack));
  if (budget < 0 || lim < static_cast<long double>(sum_min)) return -1;
  if (lim >= static_cast<long double>(sum_max)) return sum_max;
  return static_cast<int64_t>(std::floor(lim));
}

}  // namespace

PlanSolution solve_plan(const std::vector<PlanGroup>& groups, double budget, int64_t units_per_byte) {
  if (groups.empty()) throw std::invalid_argument("plan: no (layer, target) group to assign");
  if (!std::isfinite(budget)) throw std::invalid_argument(fmt::format("plan: budget {} is not finite", budget));
  if (units_per_byte < 1 || units_per_byte > kMaxExact)
    throw std::invalid_argument(fmt::format("plan: {} units per byte (expected 1 .. 2^53)", units_per_byte));
  const size_t G = groups.size();
  std::vector<int64_t> suffix_min(G + 1, 0);  // the cheapest completion of groups g..G-1
  int64_t sum_max = 0;
  for (size_t g = 0; g < G; ++g) {
    const PlanGroup& grp = groups[g];
    if (grp.options.empty())
      throw std::invalid_argument(
          fmt::format("plan: layer {} {} has no measured option", grp.layer, to_string(grp.target)));
    if (grp.options.size() > std::numeric_limits<uint32_t>::max())
      throw std::invalid_argument(
          fmt::format("plan: layer {} {} has too many options", grp.layer, to_string(grp.target)));
    int64_t mn = kMaxExact, mx = 0;
    for (const PlanOption& o : grp.options) {
      if (o.cost < 0 || o.cost > kMaxExact || !std::isfinite(o.objective))
        throw std::invalid_argument(
            fmt::format("plan: layer {} {} {}: cost {} / objective {} (expected finite, cost "
                        "in 0 .. 2^53)",
                        grp.layer, to_string(grp.target), o.quantizer, o.cost, o.objective));
      mn = std::min(mn, o.cost);
      mx = std::max(mx, o.cost);
    }
    suffix_min[g] = mn;
    sum_max += mx;
    if (sum_max > kMaxExact) throw std::invalid_argument("plan: the largest assignment exceeds 2^53 plan units");
  }
  for (size_t g = G; g-- > 0;) suffix_min[g] += suffix_min[g + 1];
  const double upb = static_cast<double>(units_per_byte);
  PlanSolution s;
  s.max_bytes = static_cast<double>(sum_max) / upb;
  s.budget_cost = budget_units(budget, units_per_byte, suffix_min[0], sum_max, s.capped);
  if (s.budget_cost < 0)
    throw std::invalid_argument(fmt::format(
        "plan: budget {} bytes/token is below the cheapest assignment ({:.4f} bytes/token: the cheapest measured "
        "quantizer of every layer and target)",
        budget, static_cast<double>(suffix_min[0]) / upb));
  std::vector<int64_t> cost{0}, ncost;
  std::vector<double> obj{0.0}, nobj;
  std::vector<std::vector<Back>> back(G);
  for (size_t g = 0; g < G; ++g) {
    extend(cost, obj, groups[g], undominated(groups[g]), s.budget_cost - suffix_min[g + 1], ncost, nobj, back[g]);
    if (ncost.empty()) throw std::logic_error("plan: no assignment fits (internal)");
    if (ncost.size() > std::numeric_limits<uint32_t>::max()) throw std::length_error("plan: frontier too large");
    cost.swap(ncost);
    obj.swap(nobj);
    s.frontier_max = std::max(s.frontier_max, cost.size());
    s.frontier_total += cost.size();
  }
  // The last point: the lowest objective (the cheapest of them).
  s.cost = cost.back();
  s.bytes = static_cast<double>(s.cost) / upb;
  s.objective = obj.back();
  s.choice.assign(G, 0);
  size_t j = cost.size() - 1;
  for (size_t g = G; g-- > 0;) {
    s.choice[g] = back[g][j].option;
    j = back[g][j].parent;
  }
  return s;
}

namespace {

// The fraction p/q (q ≤ kMaxDenominator, p ≤ 2^53) of smallest denominator among the convergents of
// x's continued fraction with (double)p / (double)q == x; x finite and ≥ 0. A reduced fraction B/T within
// half an ulp of x is such a convergent (Legendre: |x - B/T| < 1/(2T²)), and no other fraction of
// denominator ≤ T is that close while T² < 1/ulp(x) (T ≤ 10^6 for x < 2^11). false when none is found.
bool exact_fraction(double x, int64_t& p, int64_t& q) {
  if (x == 0) {
    p = 0;
    q = 1;
    return true;
  }
  int e = 0;
  const double f = std::frexp(x, &e);  // x = f · 2^e, f in [0.5, 1)
  const auto m = static_cast<unsigned __int128>(std::ldexp(f, 53));
  const int shift = 53 - e;  // x = m / 2^shift
  if (shift <= 0) {
    if (shift < -10 || m << -shift > static_cast<unsigned __int128>(kMaxExact)) return false;
    p = static_cast<int64_t>(m << -shift);
    q = 1;
    return true;
  }
  if (shift > 120) return false;
  unsigned __int128 a = m, b = static_cast<unsigned __int128>(1) << shift;
  unsigned __int128 h1 = 1, h2 = 0, k1 = 0, k2 = 1;  // convergents h/k
  while (b != 0) {
    const unsigned __int128 t = a / b;
    if (t > static_cast<unsigned __int128>(kMaxExact)) return false;  // the next denominator is beyond 2^40
    const unsigned __int128 h = t * h1 + h2, k = t * k1 + k2;
    if (k > static_cast<unsigned __int128>(kMaxDenominator) || h > static_cast<unsigned __int128>(kMaxExact))
      return false;
    if (static_cast<double>(static_cast<int64_t>(h)) / static_cast<double>(static_cast<int64_t>(k)) == x) {
      p = static_cast<int64_t>(h);
      q = static_cast<int64_t>(k);
      return true;
    }
    h2 = h1;
    h1 = h;
    k2 = k1;
    k1 = k;
    const unsigned __int128 r = a - t * b;
    a = b;
    b = r;
  }
  return false;
}

// Where a warning applies: "every layer and target", or the groups it names.
std::string where(const std::vector<std::string>& names, size_t groups) {
  if (names.size() == groups) return "every layer and target";
  std::string s;
  for (size_t i = 0; i < names.size() && i < 6; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > 6) s += fmt::format(" and {} more", names.size() - 6);
  return s;
}

// A row that is no option: its quantizer, the reason, the groups.
struct Skipped {
  std::string quantizer, reason;
  std::vector<std::string> groups;
};

// {(layer, target, quantizer): kl_mean} of the /attention_error rows with one target quantized. Throws
// std::invalid_argument naming the file when there is none.
std::map<std::tuple<int64_t, std::string, std::string>, double> single_target_kl(const std::filesystem::path& results) {
  const ColumnTable ae = read_table(results, "attention_error");
  const auto& al = ae.get<int64_t>("layer");
  const auto& aq = ae.get<std::string>("quantizer");
  const auto& at = ae.get<std::string>("targets");
  const auto& ak = ae.get<double>("kl_mean");
  std::map<std::tuple<int64_t, std::string, std::string>, double> kl;
  for (size_t i = 0; i < al.size(); ++i)
    if (at[i] == "c_kv" || at[i] == "k_pe") kl[{al[i], at[i], aq[i]}] = ak[i];
  if (kl.empty())
    throw std::invalid_argument(
        fmt::format("{}: /attention_error has no single-target rows (targets \"c_kv\" or "
                    "\"k_pe\"); use --objective mse or add them to [attention] targets",
                    results.string()));
  return kl;
}

}  // namespace

PlanInputs read_plan_inputs(const std::filesystem::path& results, const std::string& objective) {
  if (objective != "kl" && objective != "mse")
    throw std::invalid_argument(fmt::format("--objective '{}': expected kl or mse", objective));
  const Attrs root = read_results_attrs(results);
  const DumpAttrs A = dump_attrs_from_results(root);
  if (A.v4())  // the planner budgets the MLA latent cache (c_kv + k_pe per token)
    throw std::invalid_argument(fmt::format("{}: the planner is {}", results.string(), kV4SummaryNotApplicable));
  const std::vector<std::string> groups = list_tables(results);
  auto need = [&](const std::string& g) {
    if (std::find(groups.begin(), groups.end(), g) == groups.end())
      throw std::invalid_argument(fmt::format("{}: no /{} group{}", results.string(), g,
                                              g == "attention_error"
                                                  ? " (use --objective mse, or a study with [attention] "
                                                    "targets \"c_kv\" and \"k_pe\")"
                                                  : ""));
  };
  need("latent_error");
  const ColumnTable le = read_table(results, "latent_error");
  const auto& layer = le.get<int64_t>("layer");
  const auto& target = le.get<std::string>("target");
  const auto& quant = le.get<std::string>("quantizer");
  const auto& bpt = le.get<double>("bytes_per_token_layer");
  const auto& mse = le.get<double>("mse");
  std::map<std::tuple<int64_t, std::string, std::string>, double> kl;
  if (objective == "kl") {
    need("attention_error");
    kl = single_target_kl(results);
  }
  std::set<int64_t> studied(layer.begin(), layer.end());
  PlanInputs in;
  in.objective = objective;
  in.objective_note = objective == "kl"
                          ? "sum over layers and targets of the attention KL (nats) with that target alone quantized"
                          : "sum over layers and targets of the latent squared error per token (mse x width)";
  // Pass 1: the groups, the options (their exact bytes per token as fractions), the rows that are none.
  std::map<std::pair<int64_t, std::string>, size_t> index;
  std::vector<Skipped> skipped;
  auto skip = [&](size_t i, std::string reason) {
    auto it = std::find_if(skipped.begin(), skipped.end(),
                           [&](const Skipped& s) { return s.quantizer == quant[i] && s.reason == reason; });
    if (it == skipped.end()) it = skipped.insert(skipped.end(), {quant[i], std::move(reason), {}});
    it->groups.push_back(fmt::format("layer {} {}", layer[i], target[i]));
  };
  struct Frac {
    int64_t p, q;
  };
  std::vector<std::vector<Frac>> frac;
  int64_t den = 1;  // the least common denominator
  for (size_t i = 0; i < layer.size(); ++i) {
    if (!is_latent_target(parse_target(target[i]))) continue;  // sparse MLA's index_k: not the latent cache's bytes
    const auto key = std::make_pair(layer[i], target[i]);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, in.groups.size()).first;
      in.groups.push_back({static_cast<int>(layer[i]), parse_target(target[i]), {}});
      frac.emplace_back();
    }
    try {
      TransformedSpec::parse(quant[i]);
    } catch (const std::invalid_argument&) {
      skip(i, "a mixed assignment's row, not one spec");
      continue;
    }
    const double width =
        target[i] == "c_kv" ? static_cast<double>(A.kv_lora_rank) : static_cast<double>(A.qk_rope_head_dim);
    double obj = mse[i] * width;
    if (objective == "kl") {
      const auto k = kl.find({layer[i], target[i], quant[i]});
      if (k == kl.end()) {
        skip(i, fmt::format("no /attention_error row with targets \"{}\" alone", target[i]));
        continue;
      }
      obj = k->second;
    }
    if (!std::isfinite(obj)) {
      skip(i, objective == "kl" ? "its kl_mean is not finite" : "its mse is not finite");
      continue;
    }
    Frac f{0, 1};
    if (!std::isfinite(bpt[i]) || bpt[i] < 0 || !exact_fraction(bpt[i], f.p, f.q))
      throw std::invalid_argument(fmt::format(
          "{}: /latent_error layer {} {} {}: bytes_per_token_layer {} is not stored bytes over a token count (no "
          "fraction of denominator <= 2^40 rounds to it)",
          results.string(), layer[i], target[i], quant[i], bpt[i]));
    const int64_t g = std::gcd(den, f.q);
    if (den / g > kMaxDenominator / f.q)
      throw std::invalid_argument(
          fmt::format("{}: the bytes per token of /latent_error have no common token count "
                      "<= 2^40 (row layer {} {} {})",
                      results.string(), layer[i], target[i], quant[i]));
    den = den / g * f.q;
    in.groups[it->second].options.push_back({quant[i], 0, obj});
    frac[it->second].push_back(f);
  }
  if (in.groups.empty()) throw std::invalid_argument(results.string() + ": /latent_error has no quantizer rows");
  // Pass 2: costs in units of 1/units_per_byte byte: (p/q) · L / S = p · (den/q) · (L/g) / (den · S/g).
  const int64_t L = A.num_layers, S = static_cast<int64_t>(std::max<size_t>(studied.size(), 1)), g = std::gcd(L, S);
  in.units_per_byte = den * (S / g);
  for (size_t k = 0; k < in.groups.size(); ++k)
    for (size_t o = 0; o < frac[k].size(); ++o) {
      const Frac f = frac[k][o];
      const auto N = static_cast<unsigned __int128>(f.p) * static_cast<unsigned __int128>(den / f.q);
      const auto c = N * static_cast<unsigned __int128>(L / g);
      if (c > static_cast<unsigned __int128>(kMaxExact) || in.units_per_byte > kMaxExact)
        throw std::invalid_argument(results.string() + ": the plan's exact byte totals exceed 2^53 units");
      // The round trip: the stored matrix bytes over the common token count give the stored double back.
      if (static_cast<double>(static_cast<int64_t>(N)) / static_cast<double>(den) !=
          static_cast<double>(f.p) / static_cast<double>(f.q))
        throw std::logic_error("plan: exact bytes do not round-trip (internal)");
      in.groups[k].options[o].cost = static_cast<int64_t>(c);
    }
  for (const Skipped& s : skipped)
    in.warnings.push_back(fmt::format("plan: quantizer '{}' ({}) is not a candidate: {}", s.quantizer,
                                      where(s.groups, in.groups.size()), s.reason));
  for (const PlanOption& o : in.groups.front().options) {
    const bool everywhere = std::all_of(in.groups.begin(), in.groups.end(), [&](const PlanGroup& g) {
      return std::any_of(g.options.begin(), g.options.end(),
                         [&](const PlanOption& x) { return x.quantizer == o.quantizer; });
    });
    if (everywhere) in.uniform.push_back(o.quantizer);
  }
  return in;
}

PlanUniform best_uniform(const PlanInputs& in, int64_t budget_cost) {
  PlanUniform best;
  best.objective = std::numeric_limits<double>::infinity();
  for (const std::string& q : in.uniform) {
    int64_t cost = 0;
    double obj = 0;
    for (const PlanGroup& g : in.groups)
      for (const PlanOption& o : g.options)
        if (o.quantizer == q) {
          obj += o.objective;
          cost += o.cost;
          break;
        }
    if (cost <= budget_cost && obj < best.objective)
      best = {q, cost, static_cast<double>(cost) / static_cast<double>(in.units_per_byte), obj};
  }
  if (best.quantizer.empty()) best.objective = 0;
  return best;
}

std::string plan_config_text(const std::filesystem::path& results, const std::vector<PlanGroup>& groups,
                             const PlanSolution& plan, const std::string& uniform, const std::string& header) {
  const Attrs root = read_results_attrs(results);
  const StudyConfig src = config_from_results(root);
  const AttrValue& input = attr(root, "input_path");
  if (!std::holds_alternative<std::string>(input))
    throw std::invalid_argument(results.string() + ": attribute 'input_path' is not a string");
  toml::table t;
  std::set<int> layers;
  std::vector<std::string> targets;
  for (const PlanGroup& g : groups) {
    layers.insert(g.layer);
    const std::string tg(to_string(g.target));
    if (std::find(targets.begin(), targets.end(), tg) == targets.end()) targets.push_back(tg);
  }
  toml::array la, ta;
  for (int l : layers) la.push_back(l);
  for (const std::string& s : targets) ta.push_back(s);
  t.insert("input", toml::table{{"dump", std::get<std::string>(input)}, {"layers", la}, {"targets", ta}});
  if (!uniform.empty()) t.insert("quantizers", toml::table{{"extra", toml::array{uniform}}});
  toml::array mixed;
  for (size_t i = 0; i < groups.size(); ++i) {
    const PlanGroup& g = groups[i];
    mixed.push_back(toml::table{{"name", "mixed"},
                                {"layers", toml::array{g.layer}},
                                {std::string(to_string(g.target)), g.options[plan.choice[i]].quantizer}});
  }
  t.insert("mixed", mixed);
  toml::table e2e{{"enabled", src.probes.e2e.enabled}};
  if (!src.probes.e2e.model.empty())
    e2e.insert("model", std::filesystem::absolute(src.probes.e2e.model).lexically_normal().string());
  t.insert("e2e", e2e);
  std::ostringstream out;
  std::istringstream h(header);
  for (std::string line; std::getline(h, line);) out << "# " << line << "\n";
  out << "\n" << t << "\n";
  return out.str();
}

void write_text_atomic(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp =
      path.parent_path() / fmt::format(".{}.{}.tmp", path.filename().string(), static_cast<long>(::getpid()));
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    if (!f) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw std::runtime_error(path.string() + ": cannot write");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw std::runtime_error(path.string() + ": cannot write (rename failed)");
  }
}

}  // namespace latentq
