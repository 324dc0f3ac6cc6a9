// `latentq study`: the user's checkpoint to a decision (commands.h), apart from the rest of the command line.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <optional>
#include <variant>

#include "commands.h"
#include "latentq/applicable.h"
#include "latentq/batch_study.h"
#include "latentq/cli.h"
#include "latentq/config.h"
#include "latentq/dump.h"
#include "latentq/external.h"
#include "latentq/probe_study.h"
#include "latentq/provenance.h"
#include "latentq/results.h"
#include "latentq/study.h"
#include "latentq/util.h"

namespace latentq::cli_detail {
namespace fs = std::filesystem;
namespace {

// A string root attribute of `attrs`, or "" when absent or not a string.
std::string str_attr(const Attrs& attrs, const std::string& name) {
  for (const auto& [k, v] : attrs)
    if (k == name && std::holds_alternative<std::string>(v)) return std::get<std::string>(v);
  return "";
}
int64_t int_attr_or(const Attrs& attrs, const std::string& name, int64_t fallback) {
  for (const auto& [k, v] : attrs)
    if (k == name && std::holds_alternative<int64_t>(v)) return std::get<int64_t>(v);
  return fallback;
}

// The study step's key, from a results file's root attributes: the dump it studied, the config, the code that
// computed its cells and the device.
StepKey study_key(const Attrs& at) {
  StepKey k;
  k.add("dump sha256", str_attr(at, "input_sha256"));
  k.add("config sha256", sha256_hex(str_attr(at, "config")));
  k.add("latentq code", str_attr(at, "code_sha256"));
  k.add("--device", str_attr(at, "device"));
  return k;
}

// What `latentq run` prints of a complete results file (--verbose): the latent summary and the probes' tables,
// read back from the file (a study that was reused).
void print_results_tables(const fs::path& results, const fs::path& dump, std::ostream& out, std::ostream& err) {
  const Attrs attrs = read_results_attrs(results);
  const StudyConfig cfg = config_from_results(attrs);
  LoadOptions header_only;
  header_only.data = false;
  const ProbePlan probes = plan_probes(cfg, load_dump(dump, header_only));
  std::vector<NamedTable> tables;
  for (const std::string& g : list_tables(results)) tables.push_back({g, read_table(results, g), {}});
  const ColumnTable* summary = find_table(tables, "summary");
  out << format_not_applicable(not_applicable(cfg, dump_attrs_from_results(attrs)));
  if (summary) out << format_summary(*summary, dump_attrs_from_results(attrs));
  print_probe_report(cfg, probes, summary, tables, dump_attrs_from_results(attrs), out, err);
}

// The dump step's inputs from `latentq study`'s arguments (paths made absolute).
DumpStepInputs dump_step_inputs(const StudyArgs& a) {
  DumpStepInputs in;
  in.model = fs::absolute(a.model).lexically_normal();
  in.text = fs::absolute(a.text).lexically_normal();
  in.seq_len = a.seq_len;
  in.num_seqs = a.num_seqs;
  in.q_rows = a.q_rows;
  in.dtype = a.dtype;
  in.device = a.device;
  in.threads = a.threads;
  in.quiet = !a.verbose;
  in.trust_remote_code = a.trust_remote_code;
  in.tokenizer = a.tokenizer;
  in.stream = a.stream;
  in.memory_budget = a.memory_budget;
  return in;
}

}  // namespace

// `latentq study`: the user's checkpoint to a decision. dump -> study (cells, probes, attention) -> e2e (the same
// model and the same tokenized text: the dump's windows from byte 0) -> decision summary -> report, into OUTDIR.
// A rerun resumes: each step is reused only when everything it read is unchanged (latentq/provenance.h): the dump
// when its key matches DUMP.inputs (run_dump_step), a complete results file of the same dump, config, code and
// device (an OUT.partial of them resumes), and /e2e when its step_key (the checkpoint's files, the text, the code,
// the flags) matches; otherwise the step is redone and the terminal says which input changed.
int cmd_study(const StudyArgs& a, std::ostream& out, std::ostream& err, bool progress_bar) {
  const fs::path dir = fs::absolute(a.out).lexically_normal();
  const DumpStepInputs in = dump_step_inputs(a);
  std::error_code ec;
  if (!fs::is_regular_file(in.model / "config.json", ec))
    throw std::invalid_argument(fmt::format("--model {}: no config.json (expected a checkpoint directory)", a.model));
  if (!fs::is_regular_file(in.text, ec)) throw std::invalid_argument(fmt::format("--text {}: no such file", a.text));
  if (!a.no_e2e && a.seq_len < 2)
    throw std::invalid_argument(fmt::format(
        "--seq-len {}: the e2e step needs at least 2 tokens per sequence for a next-token metric (or pass --no-e2e)",
        a.seq_len));
  const fs::path dump = dir / "dump.h5", results = dir / "results.h5";
  fs::path stamp = dump, partial = partial_path(results);
  stamp += ".inputs";
  refuse_output_over_input(
      {{"the checkpoint directory --model", in.model}, {"the text --text", in.text}, {"the config --config", a.config}},
      {{"the output directory --out", dir},
       {"the dump", dump},
       {"the dump's record", stamp},
       {"the results file", results},
       {"the results checkpoint", partial},
       {"the report directory", dir / "report"}});
  const std::string config_text = a.config.empty() ? std::string(default_config_text()) : [&] {
    std::ifstream f(a.config, std::ios::binary);
    if (!f) throw std::invalid_argument(a.config + ": cannot read the config file");
    return std::string{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }();
  const bool made_dir = !fs::exists(dir, ec);
  fs::create_directories(dir);

  // 1. The dump (reused when every input is unchanged). A dump that fails leaves no directory this run made.
  const DumpStepResult d = [&] {
    try {
      return run_dump_step(in, dump, out, err);
    } catch (...) {
      if (made_dir) fs::remove_all(dir, ec);
      throw;
    }
  }();
  const std::string dump_sha = file_sha256(dump);
  const std::string text_sha = file_sha256(in.text);

  // 2. The study: kept when complete for this dump, config, code and device, resumed from its checkpoint, else
  // afresh.
  StepKey study_now;
  study_now.add("dump sha256", dump_sha);
  study_now.add("config sha256", sha256_hex(config_text));
  study_now.add("latentq code", executable_sha256());
  study_now.add("--device", a.device);
  const auto changes_of = [&](const fs::path& p) -> std::optional<std::vector<std::string>> {
    if (!fs::is_regular_file(p, ec)) return std::nullopt;
    return key_changes(study_key(read_results_attrs(p)), study_now);
  };
  const auto done = changes_of(results);
  if (done && done->empty() && int_attr_or(read_results_attrs(results), "complete", 0) == 1) {
    out << "study: reusing " << results.string() << " (complete, of this dump, config, code and device)\n";
    if (a.verbose) print_results_tables(results, dump, out, err);
  } else {
    if (done && !done->empty())
      out << "study: redoing " << results.string() << ": " << fmt::format("{}", fmt::join(*done, "; ")) << "\n";
    const auto part = changes_of(partial);
    RunArgs ra;
    ra.config = a.config;
    ra.input = dump.string();
    ra.out = results.string();
    ra.device = a.device;
    ra.threads = a.threads;
    ra.resume = part && part->empty();
    ra.no_e2e = true;
    ra.no_decision = true;
    ra.verbose = a.verbose;
    if (const int rc = cmd_run(ra, out, err, progress_bar); rc != kExitOk) return rc;
  }

  // 3. The e2e step on the same model and text, reused when its key (step_key) is unchanged.
  const Attrs attrs = read_results_attrs(results);
  StudyConfig cfg = config_from_results(attrs);
  E2eSettings& E = cfg.probes.e2e;
  E.enabled = true;
  E.model = in.model;
  E.text = in.text;
  E.seq_len = a.seq_len;
  E.num_seqs = a.num_seqs;
  E.offset_bytes = 0;  // the dump's windows: the text from its first byte
  E.device = a.device;
  E.dtype = a.dtype;
  E.dump_text_sha256 = text_sha;
  E.trust_remote_code = a.trust_remote_code;
  E.tokenizer = a.tokenizer;
  E.stream = a.stream;
  E.memory_budget = a.memory_budget;
  E.selection = a.e2e;
  E.budgets = a.budgets;
  // Generation and retrieval: on unless the config turns them off (the step notes what it cannot run)
  if (!E.generation) {
    E.generation = true;
    E.generation_auto = true;
  }
  if (!E.retrieval) E.retrieval = true;
  StepKey e2e_now;
  e2e_now.add("latentq code", d.code);
  e2e_now.add("results", str_attr(attrs, "input_sha256") + " " + sha256_hex(str_attr(attrs, "config")));
  e2e_now.add("model", in.model.string());
  for (const FileDigest& f : d.model_files) e2e_now.add("model file " + f.name, f.sha256);
  e2e_now.add("text sha256", text_sha);
  e2e_now.add("--seq-len", std::to_string(a.seq_len));
  e2e_now.add("--num-seqs", std::to_string(a.num_seqs));
  e2e_now.add("--dtype", a.dtype);
  e2e_now.add("--device", a.device);
  e2e_now.add("--trust-remote-code", a.trust_remote_code ? "on" : "off");
  e2e_now.add("--tokenizer", a.tokenizer);
  e2e_now.add("--stream", a.stream);
  e2e_now.add("--memory-budget", a.memory_budget.empty() ? "default" : a.memory_budget);
  e2e_now.add("--e2e", a.e2e);
  e2e_now.add("--budgets", a.budgets.empty() ? "default" : a.budgets);
  e2e_now.add("--generation", *E.generation ? "on" : "off");
  e2e_now.add("--retrieval", *E.retrieval ? "on" : "off");
  const std::vector<std::string> groups = list_tables(results);
  std::optional<std::vector<std::string>> e2e_changes;
  if (std::find(groups.begin(), groups.end(), "e2e") != groups.end()) {
    const std::string recorded = str_attr(read_group_attrs(results, "e2e"), "step_key");
    e2e_changes = recorded.empty() ? std::vector<std::string>{"no step_key recorded"}
                                   : key_changes(StepKey::parse_json(recorded), e2e_now);
  }
  plan_runs_step(results, a.budgets, !a.no_e2e, out);
  if (a.no_e2e) {
    out << "e2e: skipped (--no-e2e)\n";
  } else if (e2e_changes && e2e_changes->empty()) {
    out << "e2e: reusing /e2e of " << results.string() << " (every input unchanged)\n";
    if (a.verbose)
      out << format_e2e_summary(read_table(results, "e2e"),
                                std::find(groups.begin(), groups.end(), "summary") != groups.end()
                                    ? read_table(results, "summary")
                                    : ColumnTable{});
  } else {
    if (e2e_changes) out << "e2e: redoing /e2e: " << fmt::format("{}", fmt::join(*e2e_changes, "; ")) << "\n";
    run_e2e_step(cfg, dump_attrs_from_results(attrs), results, a.threads, out, err, a.verbose, &e2e_now);
  }

  // 4. The decision summary, then 5. the report.
  decision_step(results, a.budgets, out);
  const fs::path report = dir / "report";
  const int rc = run_report(results.string(), report.string(), out, err);
  out << fmt::format("\nstudy: {}\n  dump     {}\n  results  {}\n  report   {}\n", dir.string(), dump.string(),
                     results.string(), (report / "report.md").string());
  return rc;
}

}  // namespace latentq::cli_detail
