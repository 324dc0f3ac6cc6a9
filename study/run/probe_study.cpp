// The generic probe runner (latentq/probe_study.h): plans, runs and prints whatever probes are
// registered (latentq/probe_registry.h).
#include "latentq/probe_study.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace latentq {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string num(double x, int prec) { return std::isfinite(x) ? fmt::format("{:.{}f}", x, prec) : std::string("-"); }
std::string sci(double x) { return std::isfinite(x) ? fmt::format("{:.3e}", x) : std::string("-"); }

// The probes' OpenMP loops run with one thread on the calling thread while this lives (cells are
// parallelized across cells instead; the values do not depend on it).
class OmpSingleThread {
 public:
#ifdef _OPENMP
  OmpSingleThread() : old_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OmpSingleThread() { omp_set_num_threads(old_); }

 private:
  int old_;
#else
  OmpSingleThread() {}
#endif
};

}  // namespace

// ---- groups -------------------------------------------------------------------------------------------

const std::vector<std::string>& probe_groups() {
  static const std::vector<std::string> g = [] {
    std::vector<std::string> v;
    for (const Probe* p : registered_probes())
      for (const GroupSpec& s : p->groups()) v.push_back(s.name);
    return v;
  }();
  return g;
}

const std::vector<std::string>& probe_columns(const std::string& group) {
  static const std::map<std::string, std::vector<std::string>> names = [] {
    std::map<std::string, std::vector<std::string>> m;
    for (const std::string& g : probe_groups())
      for (const ColumnSpec& c : probe_group_spec(g).columns) m[g].push_back(c.name);
    return m;
  }();
  probe_group_spec(group);  // throws for an unknown group
  return names.at(group);
}

ColumnTable empty_probe_table(const std::string& group) { return empty_table(probe_group_spec(group)); }

std::vector<std::string> row_keys(const std::string& group, const ColumnTable& t) {
  if (group == "latent_error") {
    std::vector<std::string> k;
    const auto& l = t.get<int64_t>("layer");
    const auto &tg = t.get<std::string>("target"), &q = t.get<std::string>("quantizer");
    for (size_t i = 0; i < l.size(); ++i) k.push_back(fmt::format("{:03d}/{}/{}/latent_error", l[i], tg[i], q[i]));
    return k;
  }
  const Probe* p = probe_of_group(group);
  if (!p) throw std::invalid_argument(fmt::format("row_keys: group '{}' has no cell keys", group));
  return p->row_keys(group, t);
}

// ---- plans --------------------------------------------------------------------------------------------

std::vector<std::string> ProbePlan::keys() const {
  std::vector<std::string> k;
  for (const ProbeCell& c : cells) k.push_back(c.key);
  return k;
}

const ProbeCell& ProbePlan::cell(const std::string& key) const {
  for (const ProbeCell& c : cells)
    if (c.key == key) return c;
  throw std::invalid_argument(fmt::format("no probe cell '{}' in the plan", key));
}

ProbePlan plan_probes(const StudyConfig& config, const Dump& dump) {
  ProbePlan p;
  for (const Probe* probe : registered_probes()) {
    ProbePlan::Part part{probe, probe->plan(config, dump)};
    p.cells.insert(p.cells.end(), part.part.cells.begin(), part.part.cells.end());
    p.groups.insert(p.groups.end(), part.part.groups.begin(), part.part.groups.end());
    p.warnings.insert(p.warnings.end(), part.part.warnings.begin(), part.part.warnings.end());
    p.parts.push_back(std::move(part));
  }
  return p;
}

std::vector<ColumnTable> run_probe_cell(const StudyConfig& config, const ProbeCell& cell, const LayerAccess& in) {
  const OmpSingleThread single;
  try {
    std::vector<ColumnTable> t = cell.probe->run(config, cell, in);
    if (t.size() != cell.groups.size())
      throw std::logic_error(fmt::format("cell {}: {} tables for {} groups", cell.key, t.size(), cell.groups.size()));
    return t;
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: cell {}: {}", in.header().path.string(), cell.key, e.what()));
  }
}

// ---- `latentq run` ---------------------------------------------------------------------------------------

void print_probe_report(const StudyConfig& config, const ProbePlan& plan, const ColumnTable* summary,
                        const std::vector<NamedTable>& tables, const DumpAttrs& attrs, std::ostream& out,
                        std::ostream& err) {
  std::vector<const ProbePlan::Part*> parts;
  for (const ProbePlan::Part& p : plan.parts) parts.push_back(&p);
  for (const ProbePlan::Part* p : parts)
    for (const std::string& n : p->part.notes) out << n << "\n";
  for (const ProbePlan::Part* p : parts) {
    const ProbeReportInput in{config, summary, tables, attrs, p->part};
    for (const std::string& w : p->probe->report_warnings(in)) err << "latentq: warning: " << w << "\n";
  }
  if (!summary) return;
  std::stable_sort(parts.begin(), parts.end(), [](const ProbePlan::Part* a, const ProbePlan::Part* b) {
    return a->probe->print_order() < b->probe->print_order();
  });
  for (const ProbePlan::Part* p : parts) out << p->probe->report({config, summary, tables, attrs, p->part});
}

// ---- printed summaries ------------------------------------------------------------------------------------

std::string format_e2e_summary(const ColumnTable& e2e, const ColumnTable& summary) {
  const auto& q = e2e.get<std::string>("quantizer");
  const auto& kl = e2e.get<double>("kl_mean");
  const auto& top1 = e2e.get<double>("top1_agree");
  const auto& pr = e2e.get<double>("ppl_ref");
  const auto& pq = e2e.get<double>("ppl_quant");
  std::map<std::string, double> bytes;
  if (summary.has("quantizer") && summary.has("bytes_per_token_model")) {
    const auto& sq = summary.get<std::string>("quantizer");
    const auto& sb = summary.get<double>("bytes_per_token_model");
    for (size_t i = 0; i < sq.size(); ++i) bytes[sq[i]] = sb[i];
  }
  auto b_of = [&](const std::string& s) { return bytes.count(s) ? bytes[s] : kNaN; };
  // Rows of a decode-order cache (cache_mode other than prefill-at-once) get their own table below.
  const bool has_mode = e2e.has("cache_mode");
  auto at_once = [&](size_t i) { return !has_mode || e2e.get<std::string>("cache_mode")[i] == "prefill-at-once"; };
  std::vector<size_t> order, decode;
  for (size_t i = 0; i < q.size(); ++i) (at_once(i) ? order : decode).push_back(i);
  auto key = [](double x) { return std::isnan(x) ? std::numeric_limits<double>::infinity() : x; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (key(b_of(q[a])) != key(b_of(q[b]))) return key(b_of(q[a])) < key(b_of(q[b]));
    return key(kl[a]) < key(kl[b]);
  });
  size_t w = 9;
  for (const auto& s : q) w = std::max(w, s.size() + 1);
  std::string out = "\nEnd to end (model logits with quantized latents on the study's layers)\n";
  out += fmt::format("{:<{}} {:>11} {:>10} {:>7} {:>9} {:>9} {:>9}\n", "quantizer", w, "bytes/token", "KL", "top-1",
                     "ppl ref", "ppl quant", "delta");
  for (size_t i : order)
    out += fmt::format("{:<{}} {:>11} {:>10} {:>7} {:>9} {:>9} {:>9}\n", q[i], w, num(b_of(q[i]), 1), sci(kl[i]),
                       num(top1[i], 4), num(pr[i], 4), num(pq[i], 4), fmt::format("{:+.4f}", pq[i] - pr[i]));
  out += "KL(p_ref || p_quant) of the next-byte distribution, mean over tokens, nats; ppl = exp(mean next-byte NLL).\n";
  if (decode.empty()) return out;
  const auto& mode = e2e.get<std::string>("cache_mode");
  const bool has_b = e2e.has("bytes_per_token");
  size_t wm = 10;
  for (size_t i : decode) wm = std::max(wm, mode[i].size() + 1);
  out += "\nEnd to end in decode order (residual R and sink S tokens in bf16; quant/include/latentq/decode_order.h)\n";
  out += fmt::format("{:<{}} {:<{}} {:>11} {:>10} {:>7} {:>9}\n", "quantizer", w, "cache_mode", wm, "B/tok/layer", "KL",
                     "top-1", "delta");
  for (size_t i : decode)
    out += fmt::format("{:<{}} {:<{}} {:>11} {:>10} {:>7} {:>9}\n", q[i], w, mode[i], wm,
                       has_b ? num(e2e.get<double>("bytes_per_token")[i], 1) : std::string("-"), sci(kl[i]),
                       num(top1[i], 4), fmt::format("{:+.4f}", pq[i] - pr[i]));
  out +=
      "B/tok/layer: the cache of one layer at the sequence end (bf16 tokens at 2 bytes per element); /e2e_position "
      "has the error by query position.\n";
  return out;
}

}  // namespace latentq
