// Internal to the latentq command line (study/cli): the arguments and steps cli.cpp and study_cmd.cpp share.
#pragma once

#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "latentq/results.h"

namespace latentq::cli_detail {

struct RunArgs {
  std::string config, input, out, device = "cpu";
  int threads = 0;
  std::string shard;  // "i/n"; empty = all cells
  bool resume = false;
  double checkpoint_interval = 10;  // seconds (each checkpoint rewrites every completed cell)
  bool no_e2e = false;              // skip [e2e] even when enabled
  std::string budgets;              // the decision summary's budgets (fractions of bf16); empty = default
  std::string e2e = "frontier";     // --e2e: the e2e step runs the formats that can win (frontier) or all
  bool no_decision = false;         // `latentq study`: the summary comes after its own e2e step
  bool verbose = true;              // false (`latentq study` without --verbose): no tables, where they are instead
};

struct StudyArgs {
  std::string model, text, out, config, device = "cpu", dtype = "float32", budgets, e2e = "frontier";
  int64_t seq_len = 512, num_seqs = 4, q_rows = 256;
  int threads = 0;
  bool no_e2e = false;
  bool verbose = false;  // --verbose: the tables `latentq run` prints, the dump's JSON summary, a line per e2e run
  bool trust_remote_code = false;                  // the checkpoint's own code may run (dump and e2e)
  std::string tokenizer = "auto", stream = "auto";  // --tokenizer auto|bytes, --stream auto|on|off
  std::string memory_budget;                       // --memory-budget (empty: half the physical memory)
};

// The decision summary (latentq/decision.h) of a complete results file: printed, and written into it as
// /decision (the report's first section). measure_hint (`decide`): under a plan still predicted, the command
// that measures it.
void decision_step(const std::filesystem::path& results, const std::string& budgets, std::ostream& out,
                   bool measure_hint = false);

// The planner's assignments at the decision's budgets, into /plan_runs (latentq/plan_runs.h), for the e2e step to
// run before the decision reads them; with `e2e` (the step follows) one line naming the runs.
void plan_runs_step(const std::filesystem::path& results, const std::string& budgets, bool e2e, std::ostream& out);

// The table of `group` among `tables`, or nullptr.
const ColumnTable* find_table(const std::vector<NamedTable>& tables, const std::string& group);

// `latentq run`: the study of a dump (cells, probes, summary), then the e2e step and the decision.
int cmd_run(const RunArgs& a, std::ostream& out, std::ostream& err, bool progress_bar);

// `latentq study`: the user's checkpoint to a decision (study_cmd.cpp).
int cmd_study(const StudyArgs& a, std::ostream& out, std::ostream& err, bool progress_bar);

}  // namespace latentq::cli_detail
