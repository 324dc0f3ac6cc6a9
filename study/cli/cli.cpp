// The latentq command line (latentq/cli.h).
#include "latentq/cli.h"

#include <H5Cpp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <fstream>
#include <limits>
#include <optional>
#include <regex>
#include <sstream>
#include <variant>
#include <stdexcept>

#include "latentq/applicable.h"
#include "latentq/batch.h"
#include "latentq/batch_study.h"
#include "latentq/config.h"
#include "latentq/decision.h"
#include "latentq/dump.h"
#include "latentq/external.h"
#include "latentq/inspect.h"
#include "latentq/plan.h"
#include "latentq/plan_runs.h"
#include "latentq/provenance.h"
#include "latentq/probe_study.h"
#include "latentq/regress.h"
#include "latentq/results.h"
#include "latentq/study.h"
#include "latentq/synth.h"
#include "latentq/synth_v4.h"
#include "latentq/util.h"
#include "commands.h"

namespace latentq {
namespace fs = std::filesystem;
namespace cli_detail {


// The decision summary (latentq/decision.h) of a complete results file: printed, and written into it as
// /decision (the report's first section).
// measure_hint (`decide`): under a plan still predicted, the command that measures it.
void decision_step(const fs::path& results, const std::string& budgets, std::ostream& out, bool measure_hint) {
  if (dump_attrs_from_results(read_results_attrs(results)).v4()) {  // the budgets are of the MLA latent cache
    out << fmt::format("\ndecision: {}; /v4_cache has the bytes of its caches\n", kV4SummaryNotApplicable);
    return;
  }
  const std::vector<double> f = budgets.empty() ? default_budget_fractions() : parse_budget_fractions(budgets);
  write_plan_runs(results, f);  // a plan at a budget of `decide` the file has no run of: stored for the e2e step
  const ColumnTable t = decision_table(results, f);
  write_results(results, {}, {{"decision", t, {}}}, WriteMode::Update);
  out << "\n" << format_decision(t);
  std::vector<std::string> predicted;
  for (size_t i = 0; i < t.num_rows(); ++i)
    if (t.get<std::string>("source")[i] == "predicted")
      predicted.push_back(budget_fraction_label(t.get<double>("budget_fraction")[i]));
  if (measure_hint && !predicted.empty())
    out << fmt::format(
        "plan: predicted at {} of bf16 (not run end to end); /plan_runs holds its assignments, which the e2e step "
        "runs. Measure them as the other rows, then decide again:\n  {}\n  latentq decide {}{}\n",
        fmt::join(predicted, ", "), e2e_command_line(results), results.string(),
        budgets.empty() ? std::string() : " --budgets " + budgets);
}

// The planner's assignments at the decision's budgets, into /plan_runs (latentq/plan_runs.h), for the e2e step to run
// before the decision reads them; with `e2e` (the step follows) one line naming the runs.
void plan_runs_step(const fs::path& results, const std::string& budgets, bool e2e, std::ostream& out) {
  if (dump_attrs_from_results(read_results_attrs(results)).v4()) return;  // the planner budgets the MLA latent cache
  const std::vector<double> f = budgets.empty() ? default_budget_fractions() : parse_budget_fractions(budgets);
  const std::vector<std::string> runs = write_plan_runs(results, f);
  if (e2e && !runs.empty())
    out << fmt::format("plan runs: {} (/plan_runs: the planner's assignments at the decision's budgets, run by the "
                       "e2e step)\n",
                       fmt::join(runs, ", "));
}

// LATENTQ_TEST_KILL_AFTER_CELLS=N (tests only): stop after N computed cells, checkpoint, SIGKILL.
size_t test_kill_after_cells() {
  const char* v = std::getenv("LATENTQ_TEST_KILL_AFTER_CELLS");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end || n < 1)
    throw std::invalid_argument(fmt::format("LATENTQ_TEST_KILL_AFTER_CELLS='{}' is not a positive integer", v));
  return static_cast<size_t>(n);
}

const ColumnTable* find_table(const std::vector<NamedTable>& tables, const std::string& group) {
  for (const NamedTable& t : tables)
    if (t.group == group) return &t.table;
  return nullptr;
}

int cmd_run(const RunArgs& a, std::ostream& out, std::ostream& err, bool progress_bar) {
  StudyConfig cfg = a.config.empty() ? default_config() : load_config(a.config);
  for (const std::string& w : cfg.warnings) err << "latentq: warning: " << w << "\n";
  if (!a.input.empty()) cfg.dump = fs::absolute(a.input).lexically_normal();
  if (!a.out.empty()) cfg.results = fs::absolute(a.out).lexically_normal();
  if (cfg.results.empty())
    throw std::invalid_argument(cfg.source + ": no results path: set [output] results or pass --out");
  refuse_output_over_input({{"the config", a.config},
                            {"the input dump", cfg.dump},
                            {"the [e2e] model directory", cfg.probes.e2e.model},
                            {"the [e2e] text", cfg.probes.e2e.text}},
                           {{"the results file", cfg.results}, {"the results checkpoint", partial_path(cfg.results)}});
  const Shard shard = a.shard.empty() ? Shard{} : Shard::parse(a.shard);
  const size_t kill_after = test_kill_after_cells();
  const std::unique_ptr<LatentBackend> backend = make_backend(a.device);
  install_temp_file_signal_cleanup();  // SIGTERM/SIGINT during a write: remove the temporary file

  RunOptions opt;
  opt.threads = a.threads;
  opt.progress = progress_reporter(err, progress_bar, "cells");
  const auto t0 = std::chrono::steady_clock::now();
  // the latent-error cells, then the probe cells; every studied layer's values checked first
  const StudyPlan plan = plan_study(cfg, *backend, progress_reporter(err, progress_bar, "layers checked"));
  for (const std::string& w : plan.probes.warnings) err << "latentq: warning: " << w << "\n";
  const double plan_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out << format_not_applicable(not_applicable(cfg, plan.dump().attrs));  // the pairs left out, once
  BatchOptions bo;
  bo.shard = shard;
  bo.resume = a.resume;
  bo.threads = a.threads;
  bo.checkpoint_interval = a.checkpoint_interval;
  bo.progress = opt.progress;
  bo.stop_after = kill_after;
  const BatchResult r = run_study_batch(cfg.results, plan, bo);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.complete) {  // only with LATENTQ_TEST_KILL_AFTER_CELLS: die like a killed job
    err << fmt::format("latentq: LATENTQ_TEST_KILL_AFTER_CELLS={}: SIGKILL after {} computed cells ({} of {} in {})\n",
                       kill_after, r.computed, r.resumed + r.computed, r.owned, r.written.string());
    err.flush();
    ::kill(::getpid(), SIGKILL);
    return kExitUserError;  // not reached
  }
  const std::string resumed = r.resumed_from.empty() ? std::string()
                                                     : fmt::format("; {} resumed from {}, {} computed", r.resumed,
                                                                   r.resumed_from.string(), r.computed);
  if (const ColumnTable* le = find_table(r.tables, "latent_error"))
    for (const std::string& w : latent_precision_warnings(*le)) err << "latentq: warning: " << w << "\n";
  if (shard.count == 1) {
    const ColumnTable* summary = find_table(r.tables, "summary");
    if (summary && a.verbose) out << format_summary(*summary, plan.dump().attrs);
    if (const ColumnTable* v4 = find_table(r.tables, "v4_cache"); v4 && a.verbose) out << format_v4_cache(*v4);
    print_probe_report(cfg, plan.probes, a.verbose ? summary : nullptr, r.tables, plan.dump().attrs, out, err);
    if (!a.verbose)
      out << fmt::format("study: {} tables in {} (--verbose prints them; the report shows them)\n", r.tables.size(),
                         cfg.results.string());
    out << fmt::format("\n{} cells ({} quantizers{}) on {} in {:.1f} s\ntime: plan (dump read, layers checked) {:.1f} s; "
                       "{}\nresults: {}\n",
                       r.owned, plan.quantizers.size(), resumed, backend->name(), secs, plan_secs,
                       format_cell_time(r, worker_threads(a.threads)), cfg.results.string());
    plan_runs_step(cfg.results, a.budgets, cfg.probes.e2e.enabled && !a.no_e2e, out);
    if (cfg.probes.e2e.enabled && !a.no_e2e) {
      cfg.probes.e2e.selection = a.e2e;
      cfg.probes.e2e.budgets = a.budgets;
      run_e2e_step(cfg, plan.dump().attrs, cfg.results, a.threads, out, err, a.verbose);
    }
    if (!a.no_decision) decision_step(cfg.results, a.budgets, out);
  } else {
    print_probe_report(cfg, plan.probes, nullptr, r.tables, plan.dump().attrs, out, err);
    if (cfg.probes.e2e.enabled && !a.no_e2e)
      out << "e2e: skipped: a shard; `latentq merge` runs it on the merged file\n";
    out << fmt::format(
        "shard {}: {} of the {} cells{} on {} in {:.1f} s (no /summary: `latentq merge` writes it)\n"
        "time: plan (dump read, layers checked) {:.1f} s; {}\nresults: {}\n",
        shard.to_string(), r.owned, r.total, resumed, backend->name(), secs, plan_secs,
        format_cell_time(r, worker_threads(a.threads)), cfg.results.string());
  }
  return kExitOk;
}



// `latentq init STUDY.toml [--model DIR]`: the embedded default config with its relative paths resolved
// (against the directory it stands for), so the copy works wherever it is written. With --model: [e2e] model is
// DIR and [input] dump is dump.h5 next to STUDY.toml (what `latentq study --config STUDY.toml` or
// `python -m latentq.dump --model DIR ... --out` writes). Refuses an existing file; written atomically.
int cmd_init(const std::string& path, const std::string& model, std::ostream& out) {
  const fs::path target = fs::absolute(path).lexically_normal();
  std::error_code ec;
  if (fs::exists(target, ec)) throw std::invalid_argument(target.string() + ": exists; choose another name");
  const fs::path base = default_config_path().parent_path();
  std::istringstream in{std::string(default_config_text())};
  std::string section, text, line;
  const std::regex header(R"re(^\[([A-Za-z0-9_.]+)\]\s*$)re");
  const std::regex key(R"re(^(\s*)(dump|results|model|text)(\s*=\s*)"([^"]*)"(.*)$)re");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, header)) section = m[1];
    if (std::regex_match(line, m, key)) {
      fs::path p = fs::path(m[4].str());
      if (!model.empty() && section == "e2e" && m[2] == "model")
        p = fs::absolute(model);
      else if (!model.empty() && section == "input" && m[2] == "dump")
        p = target.parent_path() / "dump.h5";
      else if (p.is_relative())
        p = base / p;
      line =
          fmt::format("{}{}{}\"{}\"{}", m[1].str(), m[2].str(), m[3].str(), p.lexically_normal().string(), m[5].str());
    }
    text += line + "\n";
  }
  text = fmt::format("# written by `latentq init{}`: the default study with its paths resolved.\n",
                     model.empty() ? std::string() : " --model " + model) +
         text;
  (void)parse_config(text, target.string(), target.parent_path());  // what `run` will read parses
  fs::create_directories(target.parent_path());
  write_text_atomic(target, text);
  out << "config: " << target.string() << "\n";
  return kExitOk;
}

struct MergeArgs {
  std::string out;
  std::vector<std::string> inputs;
  int threads = 0;
  bool no_e2e = false;
  std::string budgets, e2e = "frontier";
};

// The e2e step of a merged study: what `latentq run` does after writing an unsharded OUT, so the
// merged file gets every group of the unsharded run (shards never run it).
void merged_e2e_step(const fs::path& merged, const Attrs& attrs, const MergeArgs& a, std::ostream& out,
                     std::ostream& err) {
  bool has_dir = false;
  StudyConfig cfg = config_from_results(attrs, &has_dir);
  cfg.probes.e2e.selection = a.e2e;
  cfg.probes.e2e.budgets = a.budgets;
  if (!cfg.probes.e2e.enabled) return;
  if (!has_dir) {
    out << fmt::format(
        "e2e: skipped: {} has no root attribute config_dir (shards of an older latentq), so the "
        "config's [e2e] model cannot be resolved; run python -m latentq.e2e --results {}\n",
        merged.string(), merged.string());
    return;
  }
  run_e2e_step(cfg, dump_attrs_from_results(attrs), merged, a.threads, out, err);
}

int cmd_merge(const MergeArgs& a, std::ostream& out, std::ostream& err) {
  const std::string& merged = a.out;
  const std::vector<std::string>& inputs = a.inputs;
  const std::vector<fs::path> in(inputs.begin(), inputs.end());
  // The same file twice (also through another name) would count its cells twice; OUT among the
  // inputs would be replaced while it is read.
  auto same = [](const fs::path& a, const fs::path& b) {
    std::error_code ec;
    if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec) && !ec;
    return fs::absolute(a).lexically_normal() == fs::absolute(b).lexically_normal();
  };
  for (size_t i = 0; i < in.size(); ++i) {
    if (same(in[i], merged))
      throw std::invalid_argument(fmt::format("merge: the output {} is also input {} ({}); choose another output file",
                                              merged, i + 1, in[i].string()));
    for (size_t j = 0; j < i; ++j)
      if (same(in[i], in[j]))
        throw std::invalid_argument(
            fmt::format("merge: inputs {} ({}) and {} ({}) are the same file; give each shard once", j + 1,
                        in[j].string(), i + 1, in[i].string()));
  }
  install_temp_file_signal_cleanup();
  const MergeResult m = merge_results(merged, in, derive_study_tables);
  if (const ColumnTable* summary = find_table(m.tables, "summary"))
    out << format_summary(*summary, dump_attrs_from_results(m.attrs)) << "\n";
  out << fmt::format(
      "merged {} shard{} ({} files): {} cells{}\nresults: {}\n", m.shards, m.shards == 1 ? "" : "s", inputs.size(),
      m.cells, m.overlapping ? fmt::format(" ({} of them in more than one file, equal)", m.overlapping) : "", merged);
  plan_runs_step(merged, a.budgets, !a.no_e2e && config_from_results(m.attrs).probes.e2e.enabled, out);
  if (!a.no_e2e) merged_e2e_step(merged, m.attrs, a, out, err);
  decision_step(merged, a.budgets, out);
  return kExitOk;
}

int cmd_inspect(const std::string& path, std::ostream& out) {
  LoadOptions header_only;
  header_only.data = false;  // the layers are read one at a time: a dump larger than memory can be inspected
  const Dump h = load_dump(path, header_only);
  out << format_inspect(h, [&h](int index) { return read_layer(h, index, true); });
  return kExitOk;
}

// Refuses shards and checkpoints for a step over every cell (`what`: "a gate", "a decision"); files without
// these attributes, older or synthetic, are accepted. Schema checked first: a wrong file is an input error.
void require_complete_results(const std::string& results, const char* what) {
  const Attrs attrs = read_results_attrs(results);
  auto int_attr = [&](const char* name) -> std::optional<int64_t> {
    for (const auto& [k, v] : attrs)
      if (k == name && std::holds_alternative<int64_t>(v)) return std::get<int64_t>(v);
    return std::nullopt;
  };
  if (const auto count = int_attr("shard_count"); count && *count > 1)
    throw std::invalid_argument(fmt::format(
        "{}: is shard {}/{} (root attribute shard_count = {}): {} over a subset of the cells is meaningless; "
        "run `latentq merge MERGED.h5 SHARD.h5...` and use the merged file",
        results, int_attr("shard_index").value_or(-1), *count, *count, what));
  if (const auto complete = int_attr("complete"); complete && *complete == 0)
    throw std::invalid_argument(fmt::format(
        "{}: is an incomplete run (root attribute complete = 0: a checkpoint with {} of {} cells): {} over part "
        "of the cells is meaningless; finish it with `latentq run ... --resume`",
        results, int_attr("cells").value_or(-1), int_attr("shard_cells").value_or(int_attr("cells_total").value_or(-1)),
        what));
}

int cmd_regress(const std::string& results, const std::string& thresholds, std::ostream& out) {
  require_complete_results(results, "a gate");
  const std::vector<Threshold> th = load_thresholds(thresholds);
  const std::vector<ThresholdResult> r = evaluate_thresholds(read_gate_tables(results), th, results);
  out << format_threshold_results(r);
  for (const ThresholdResult& x : r)
    if (!x.pass) return kExitGateFailure;
  return kExitOk;
}

struct SynthArgs {
  std::string preset, out;
  int64_t layers = 0, seqs = 2, seq_len = 512, query_rows = 32;
  int64_t index_topk = 0;  // a sparse preset's top-k (0: the preset's)
  uint64_t seed = 0;
  bool list = false;
};

std::string format_presets() {
  std::string s = fmt::format("{:<17} {:>6} {:>5} {:>5} {:>4} {:>5} {:>4} {:>9} {:<11} {:>9}  {}\n", "preset", "layers",
                              "heads", "r", "rope", "nope", "v", "theta", "layout", "scale", "checkpoint");
  for (const ModelShape& m : model_presets())
    s += fmt::format("{:<17} {:>6} {:>5} {:>5} {:>4} {:>5} {:>4} {:>9.0f} {:<11} {:>9.7f}  {}\n", m.name, m.num_layers,
                     m.num_heads, m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim, m.rope_theta,
                     m.rope_layout, m.softmax_scale, m.model);
  for (const V4Shape& v : v4_presets()) s += describe_v4_preset(v);
  return s;
}

// `latentq synth` of a DeepSeek-V4 preset (latentq/synth_v4.h).
int synth_v4(const V4Shape& shape, const SynthArgs& a, std::ostream& out) {
  V4SynthOptions o;
  o.shape = shape;
  if (a.layers != 0) o.shape.num_layers = a.layers;
  if (a.index_topk != 0) o.shape.index_topk = a.index_topk;
  o.seqs = a.seqs, o.seq_len = a.seq_len, o.query_rows = a.query_rows, o.seed = a.seed;
  validate_v4(o);
  out << fmt::format("synth {}: {} layers, {} x {} tokens, {} query rows, index_topk {}, seed {} (values "
                     "shape-faithful only)\n",
                     shape.name, o.shape.num_layers, o.seqs, o.seq_len, o.query_rows, o.shape.index_topk, o.seed);
  write_synth_v4_dump(a.out, o);
  out << "dump: " << fs::absolute(a.out).lexically_normal().string() << "\n";
  return kExitOk;
}

// `latentq synth`: a synthetic dump of a preset's shape (latentq/synth.h), layer by layer.
int cmd_synth(const SynthArgs& a, std::ostream& out) {
  if (a.list) {
    out << format_presets();
    return kExitOk;
  }
  if (a.preset.empty()) throw std::invalid_argument("synth: --preset is required (--list shows the presets)");
  if (a.out.empty()) throw std::invalid_argument("synth: --out is required");
  if (const V4Shape* v4 = find_v4_preset(a.preset)) return synth_v4(*v4, a, out);
  SynthOptions o;
  o.shape = find_preset(a.preset);
  if (a.layers != 0) o.shape.num_layers = a.layers;
  if (a.index_topk != 0) {
    if (!o.shape.sparse())
      throw std::invalid_argument(fmt::format(
          "synth: --index-topk {}: the preset '{}' is dense MLA (no indexer); the sparse presets are deepseek-v3.2, "
          "glm-5 and deepseek-v4-flash",
          a.index_topk, a.preset));
    o.shape.index_topk = a.index_topk;
  }
  o.seqs = a.seqs;
  o.seq_len = a.seq_len;
  o.query_rows = a.query_rows;
  o.seed = a.seed;
  validate(o);
  const ModelShape& m = o.shape;
  const double layer_bytes =
      4.0 * static_cast<double>(o.seqs * o.seq_len * (m.kv_lora_rank + m.qk_rope_head_dim) +
                                o.query_rows * m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) +
                                m.num_heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank);
  out << fmt::format(
      "synth {}: {} layers, {} x {} tokens, {} query rows, seed {}: {:.1f} MiB per layer, {:.1f} MiB in all\n", m.name,
      m.num_layers, o.seqs, o.seq_len, o.query_rows, o.seed, layer_bytes / 1048576.0,
      layer_bytes * static_cast<double>(m.num_layers) / 1048576.0);
  write_synth_dump(a.out, o);
  out << "dump: " << fs::absolute(a.out).lexically_normal().string() << "\n";
  return kExitOk;
}

// `latentq formats`: the format table (latentq/spec.h format_rows()), one line per named format; --sources adds
// each row's source and the test that checks it against code latentq did not write.
int cmd_formats(bool sources, std::ostream& out) {
  const std::vector<FormatRow> rows = format_rows();
  size_t w = 4;
  for (const FormatRow& r : rows) w = std::max(w, r.name.size());
  out << fmt::format("{:<{}} {:<16} {:>7} {:>6} {:<6} {}\n", "name", w, "family", "B/token", "b/elem", "causal",
                     "engine (setting)");
  for (const FormatRow& r : rows) {
    out << fmt::format("{:<{}} {:<16} {:>7} {:>6} {:<6} {}\n", r.name, w, r.family,
                       r.record_bytes < 0 ? std::string("-") : std::to_string(r.record_bytes),
                       r.record_bytes < 0 ? std::string("-") : fmt::format("{:.3f}", r.bits_per_element),
                       r.causal ? "yes" : "no", r.engine.empty() ? "-" : r.engine);
    if (sources) out << fmt::format("    shapes: {}\n    source: {}\n    reference: {}\n", r.shapes, r.source, r.reference);
  }
  out << fmt::format(
      "{} formats. B/token: one token's record of c_kv 512 + k_pe 64 (per-matrix bytes left out; -: a width the "
      "format refuses); causal: decode order encodes it token by token; engine: the engine that ships it for MLA.\n",
      rows.size());
  return kExitOk;
}

struct PlanArgs {
  std::string results, out, objective = "kl";
  double budget = 0;
};

// `latentq plan`: the exact multiple-choice knapsack (latentq/plan.h), the best uniform quantizer within
// the same budget, and the plan written as a study config. Rows that are no option: warnings on `err`.
int cmd_plan(const PlanArgs& a, std::ostream& out, std::ostream& err) {
  refuse_output_over_input({{"the results file", a.results}}, {{"the plan --out", a.out}});
  const PlanInputs in = read_plan_inputs(a.results, a.objective);
  for (const std::string& w : in.warnings) err << "latentq: warning: " << w << "\n";
  const PlanSolution s =
      solve_plan(in.groups, a.budget, in.units_per_byte);  // throws naming the minimum below the cheapest
  const PlanUniform best = best_uniform(in, s.budget_cost);
  std::string header = fmt::format(
      "written by `latentq plan {} --budget {} --objective {}`\n"
      "objective: {}\n",
      a.results, a.budget, a.objective, in.objective_note);
  if (s.capped)
    header += fmt::format(
        "budget {} bytes/token is above the largest assignment ({:.2f} bytes/token: the costliest "
        "measured quantizer of every layer and target): planned for that\n",
        a.budget, s.max_bytes);
  header += fmt::format(
      "planned (row \"mixed\"): {:.2f} bytes/token (whole model, c_kv + k_pe, metadata included), predicted objective "
      "{:.4e}\n",
      s.bytes, s.objective);
  header += best.quantizer.empty()
                ? std::string("best uniform quantizer within the budget: none fits\n")
                : fmt::format("best uniform quantizer within the budget: {} ({:.2f} bytes/token, objective {:.4e})\n",
                              best.quantizer, best.bytes, best.objective);
  header += fmt::format(
      "exact multiple-choice knapsack: DP over the Pareto frontiers of exact byte totals (units of "
      "1/{} byte/token; largest frontier {} point{})\n",
      in.units_per_byte, s.frontier_max, s.frontier_max == 1 ? "" : "s");
  write_text_atomic(a.out, plan_config_text(a.results, in.groups, s, best.quantizer, header));
  out << fmt::format("{:>5} {:<5} {:<32} {:>11} {:>11}\n", "layer", "target", "quantizer", "bytes/token", a.objective);
  for (size_t i = 0; i < in.groups.size(); ++i) {
    const PlanOption& o = in.groups[i].options[s.choice[i]];
    out << fmt::format("{:>5} {:<6} {:<32} {:>11.2f} {:>11.4e}\n", in.groups[i].layer, to_string(in.groups[i].target),
                       o.quantizer, static_cast<double>(o.cost) / static_cast<double>(in.units_per_byte), o.objective);
  }
  out << header << "plan: " << a.out << "\n";
  return kExitOk;
}

}  // namespace cli_detail

using namespace cli_detail;

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, bool progress_bar) {
  CLI::App app{"latentq: quantization study of the latent KV cache (c_kv, k_pe) of MLA models", "latentq"};
  app.set_version_flag("--version",
                       fmt::format("latentq {} (git {})\ndevices: {}", version(), git_commit(), device_build_info()));
  app.require_subcommand(1);
  app.footer("Exit codes: 0 ok, 1 gate failure (regress), 2 user/input/config error.");

  RunArgs ra;
  CLI::App* run = app.add_subcommand("run", "Run the latent-error study of a config and write a results file");
  run->add_option("config", ra.config, "study config (TOML); default: the embedded study/config/default.toml");
  run->add_option("--input", ra.input, "the dump (latentq-dump/1 HDF5), overrides [input] dump");
  run->add_option("--out", ra.out, "the results file (latentq-results/1 HDF5), overrides [output] results");
  run->add_option("--threads", ra.threads, "worker threads (0 = all cores)")->check(CLI::NonNegativeNumber);
  run->add_option("--device", ra.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  run->add_option("--shard", ra.shard,
                  "run only shard i/n of the cells (0 <= i < n; a cell goes to shard sha256(key) mod n); "
                  "the shard files are joined by `latentq merge`");
  run->add_flag("--resume", ra.resume,
                "continue a run: skip the cells already in OUT.partial (the checkpoint of an interrupted run) "
                "or OUT; refused if they were written for another config or input");
  run->add_option("--checkpoint-interval", ra.checkpoint_interval,
                  "minimum seconds between checkpoints to OUT.partial (default 10; 0: whenever cells completed)")
      ->check(CLI::NonNegativeNumber);
  run->add_flag("--no-e2e", ra.no_e2e, "do not start python -m latentq.e2e even when the config has [e2e] enabled");
  const char* budgets_help =
      "budgets of the decision summary, as fractions of the bf16 cache (default 1/16,1/8,1/4,3/8,1/2)";
  run->add_option("--budgets", ra.budgets, budgets_help);
  const char* e2e_help =
      "frontier (default): the e2e step runs the formats the probes leave in reach of the decision at some budget "
      "(the others listed in /e2e_not_run); all: every quantizer of the study";
  run->add_option("--e2e", ra.e2e, e2e_help)->check(CLI::IsMember({"frontier", "all"}));
  run->footer("Quantizer specs:\n" + spec_grammar());

  std::string inspect_path;
  CLI::App* inspect = app.add_subcommand("inspect", "Validate a dump and summarize it (dims, per-layer statistics)");
  inspect->add_option("dump", inspect_path, "the dump (latentq-dump/1 HDF5)")->required();

  std::string report_results, report_out;
  CLI::App* report = app.add_subcommand(
      "report",
      "Figures (PNG) and report.md from a results file: runs python -m latentq.report with the project venv "
      "and passes its exit code through");
  report->add_option("results", report_results, "results file (latentq-results/1 HDF5)")->required();
  report->add_option("--out", report_out, "output directory (created)")->required();

  std::string reg_results, reg_thresholds;
  CLI::App* regress = app.add_subcommand("regress", "Check a results file against thresholds (exit 1 on failure)");
  regress->add_option("results", reg_results, "results file (latentq-results/1 HDF5)")->required();
  regress->add_option("--thresholds", reg_thresholds, "thresholds TOML ([[threshold]] entries)")->required();

  MergeArgs ma;
  CLI::App* merge = app.add_subcommand(
      "merge",
      "Join the shard files of a `latentq run --shard i/n` study into one results file (= an unsharded run: "
      "with [e2e] enabled it then runs the e2e step on the merged file, as `run` does)");
  merge->add_option("merged", ma.out, "the merged results file to write")->required();
  merge->add_option("shards", ma.inputs, "the shard files (every shard 0..n-1 of one config and input)")->required();
  merge->add_option("--threads", ma.threads, "threads of the e2e step (0 = all cores)")->check(CLI::NonNegativeNumber);
  merge->add_flag("--no-e2e", ma.no_e2e, "do not start python -m latentq.e2e even when the config has [e2e] enabled");
  merge->add_option("--budgets", ma.budgets, budgets_help);
  merge->add_option("--e2e", ma.e2e, e2e_help)->check(CLI::IsMember({"frontier", "all"}));

  std::string init_path, init_model;
  CLI::App* init = app.add_subcommand(
      "init", "Write the default study config with its paths resolved (to edit, then `latentq run STUDY.toml`)");
  init->add_option("config", init_path, "the config file to write (refused if it exists)")->required();
  init->add_option("--model", init_model, "a checkpoint directory: [e2e] model, and [input] dump = dump.h5 beside");

  StudyArgs sta;
  CLI::App* study = app.add_subcommand(
      "study",
      "Your checkpoint to a decision in one command: dump its latents, run the study (cells, probes, attention), "
      "the e2e step on the same model and text, the decision summary and the report, into OUTDIR (a rerun "
      "resumes)");
  study->add_option("--model", sta.model, "the checkpoint directory (HF MLA model or tiny-mla)")->required();
  study->add_option("--text", sta.text, "the text file whose windows are dumped and scored")->required();
  study->add_option("--out", sta.out, "the output directory: dump.h5, results.h5, report/")->required();
  study->add_option("--config", sta.config, "a study config (default: the embedded default study)");
  study->add_option("--device", sta.device, "cpu or cuda: the dump, the study's cells and the e2e step")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  study->add_option("--dtype", sta.dtype, "the model's compute dtype (dump and e2e)")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  study->add_option("--seq-len", sta.seq_len, "tokens per window (default 512)")->check(CLI::PositiveNumber);
  study->add_option("--num-seqs", sta.num_seqs, "windows (default 4)")->check(CLI::PositiveNumber);
  study->add_option("--q-rows", sta.q_rows, "query rows per layer over all windows (default 256)")
      ->check(CLI::PositiveNumber);
  study->add_option("--budgets", sta.budgets, budgets_help);
  study->add_option("--e2e", sta.e2e, e2e_help)->check(CLI::IsMember({"frontier", "all"}));
  study->add_option("--threads", sta.threads, "worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
  study->add_flag("--trust-remote-code", sta.trust_remote_code,
                  "let the checkpoint's own code run (its model or tokenizer classes), in the dump and the e2e step; "
                  "a config whose architectures name a class transformers ships loads that class without it");
  study->add_option("--tokenizer", sta.tokenizer,
                    "auto: the checkpoint's tokenizer (byte tokens only when it has none; one that fails to load "
                    "is an error); bytes: the text's bytes are the tokens")
      ->check(CLI::IsMember({"auto", "bytes"}));
  study->add_option("--stream", sta.stream,
                    "run the model layer by layer from its safetensors shards: auto (when the weights exceed the "
                    "memory budget), on or off; the dump and the e2e step")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  study->add_option("--memory-budget", sta.memory_budget,
                    "host memory for weights and hidden states when streaming, e.g. 24G (default: half the "
                    "physical memory)");
  study->add_flag("--no-e2e", sta.no_e2e, "skip the e2e step (the decision then uses the attention KL)");
  study->add_flag("--verbose", sta.verbose,
                  "print every table (as `latentq run` does), the dump's summary and a line per e2e run; by "
                  "default: the progress, the warnings, the decision summary and where the tables are");

  std::string decide_results, decide_budgets;
  CLI::App* decide = app.add_subcommand(
      "decide",
      "The decision summary of a complete results file: at each budget the best uniform format, the best engine "
      "format and the planner's assignment (written into the file as /decision)");
  decide->add_option("results", decide_results, "results file of a complete study")->required();
  decide->add_option("--budgets", decide_budgets, budgets_help);

  PlanArgs pa;
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Pick one measured quantizer per (layer, target) minimizing the summed objective under a whole-model "
      "byte budget (exact: DP over the exact byte totals) and write it as a study config with a \"mixed\" row");
  plan->add_option("results", pa.results, "results file of a study (latentq-results/1 HDF5)")->required();
  plan->add_option("--budget", pa.budget, "bytes per token, whole model (all layers, c_kv + k_pe, metadata included)")
      ->required();
  plan->add_option("--objective", pa.objective, "kl (attention KL per target, /attention_error) or mse (latent)")
      ->check(CLI::IsMember({"kl", "mse"}));
  plan->add_option("--out", pa.out, "the study config to write (TOML)")->required();

  bool formats_sources = false;
  CLI::App* formats = app.add_subcommand(
      "formats", "List the format table: every example spec and engine preset, its bytes per token at c_kv 512 + "
                 "k_pe 64, whether it is causal, and the engine that ships it");
  formats->add_flag("--sources", formats_sources, "add each format's source and its reference test");

  SynthArgs sa;
  CLI::App* synth = app.add_subcommand(
      "synth",
      "Write a synthetic latentq-dump/1 file with a real model's MLA shape (RMS-normalized c_kv: the "
      "stand-in calibrated to DeepSeek-V2-Lite's latents, sink and spike outlier channels; tiny-mla: "
      "low-rank; RoPE'd k_pe, queries, W_UK/W_UV, exact attn_out), one layer at a time");
  synth->add_option("--preset", sa.preset,
                    "tiny-mla, deepseek-v2-lite, deepseek-v3, glm-4.7-flash, minicpm3-4b, sparse MLA: deepseek-v3.2, "
                    "glm-5, or DeepSeek-V4: deepseek-v4-flash (shape-faithful values)");
  synth->add_flag("--list", sa.list, "print the presets' dims and exit");
  synth->add_option("--layers", sa.layers,
                    "number of layers (default: the preset's; deepseek-v4-flash: 6, the first N of its 43)")
      ->check(CLI::PositiveNumber);
  synth->add_option("--index-topk", sa.index_topk,
                    "a sparse or V4 preset's top-k (default: the preset's, 2048; deepseek-v4-flash 512): below the "
                    "sequence length (V4: the CSA entries) to study the long-context ratio of selected keys on a "
                    "short dump")
      ->check(CLI::PositiveNumber);
  synth->add_option("--seqs", sa.seqs, "number of sequences (default 2)")->check(CLI::PositiveNumber);
  synth->add_option("--seq-len", sa.seq_len, "tokens per sequence (default 512)")->check(CLI::PositiveNumber);
  synth->add_option("--query-rows", sa.query_rows, "query rows per layer (default 32; attn_out costs Tq x H x T x r)")
      ->check(CLI::PositiveNumber);
  synth->add_option("--seed", sa.seed, "random seed (default 0)");
  synth->add_option("--out", sa.out, "the dump to write (HDF5; written to a temporary file and renamed)");

  std::vector<const char*> argv;
  for (const auto& s : args) argv.push_back(s.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e, out, err);  // --help, --version
    err << "latentq: error: " << e.what() << "\nRun 'latentq --help' for usage.\n";
    return kExitUserError;
  }

  try {
    if (run->parsed()) return cmd_run(ra, out, err, progress_bar);
    if (inspect->parsed()) return cmd_inspect(inspect_path, out);
    if (report->parsed()) return run_report(report_results, report_out, out, err);
    if (merge->parsed()) return cmd_merge(ma, out, err);
    if (regress->parsed()) return cmd_regress(reg_results, reg_thresholds, out);
    if (plan->parsed()) return cmd_plan(pa, out, err);
    if (study->parsed()) return cmd_study(sta, out, err, progress_bar);
    if (init->parsed()) return cmd_init(init_path, init_model, out);
    if (decide->parsed()) {
      require_complete_results(decide_results, "a decision");
      decision_step(decide_results, decide_budgets, out, true);
      return kExitOk;
    }
    if (synth->parsed()) return cmd_synth(sa, out);
    if (formats->parsed()) return cmd_formats(formats_sources, out);
  } catch (const std::invalid_argument& e) {
    err << "latentq: error: " << e.what() << "\n";
    return kExitUserError;
  } catch (const std::runtime_error& e) {
    err << "latentq: error: " << e.what() << "\n";
    return kExitUserError;
  } catch (const H5::Exception& e) {
    err << "latentq: error: HDF5: " << e.getDetailMsg() << "\n";
    return kExitUserError;
  } catch (const std::exception& e) {
    err << "latentq: internal error: " << e.what() << "\n";
    return kExitUserError;
  }
  return kExitUserError;
}

int cli_main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  return run_cli(args, std::cout, std::cerr, ::isatty(STDERR_FILENO) == 1);
}

}  // namespace latentq
