// latentq/cli.h — the `latentq` command line (CLI11). main.cpp only calls cli_main().
//
//   latentq run [CONFIG.toml] [--input DUMP.h5] [--out RESULTS.h5] [--threads N] [--device cpu|cuda]
//               [--shard I/N] [--resume] [--checkpoint-interval SECONDS] [--no-e2e]
//   latentq merge MERGED.h5 SHARD.h5... [--threads N] [--no-e2e]   (then the e2e step when [e2e] is enabled)
// (batch runs: latentq/batch.h; the test hook LATENTQ_TEST_KILL_AFTER_CELLS=N makes `run` stop after
// N computed cells, checkpoint them to OUT.partial and SIGKILL itself, like a killed job)
//   latentq inspect DUMP.h5
//   latentq report RESULTS.h5 --out DIR      (python -m latentq.report; its exit code passed through)
//   latentq regress RESULTS.h5 --thresholds THRESHOLDS.toml
//   latentq --version
//
// Exit codes: 0 ok; 1 gate failure (regress: a threshold broken or matching no row);
// 2 user, input or config error ("latentq: error: <message>" on stderr, nothing written).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace latentq {

inline constexpr int kExitOk = 0;
inline constexpr int kExitGateFailure = 1;
inline constexpr int kExitUserError = 2;

/// Run the CLI on args (args[0] is the program name). Normal output goes to `out`, errors,
/// warnings and the progress bar (only when `progress_bar`) to `err`. Returns the exit code.
int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, bool progress_bar = false);

/// main(): run_cli on std::cout/std::cerr, with a progress bar when stderr is a terminal.
int cli_main(int argc, char** argv);

}  // namespace latentq
