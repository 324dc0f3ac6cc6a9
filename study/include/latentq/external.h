// latentq/external.h — the Python steps `latentq` starts: python -m latentq.e2e (after `run` has
// written its results) and python -m latentq.report (`latentq report`).
//
// The interpreter is the project venv known at build time (CMake cache variable
// LATENTQ_PYTHON_EXECUTABLE), the `latentq` package lives in the source tree (LATENTQ_SOURCE_DIR/python)
// and its compiled part latentq._core in ${CMAKE_BINARY_DIR}/python/latentq (LATENTQ_PYMODULE_DIR); the
// child runs with PYTHONPATH=<source>/python:<parent of the module directory>, so it needs no .pth file.
// The environment variables LATENTQ_PYTHON, LATENTQ_SOURCE_DIR and LATENTQ_PYMODULE_DIR, when set,
// override the build-time values.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "latentq/config.h"
#include "latentq/dump.h"
#include "latentq/provenance.h"

namespace latentq {

struct PythonTools {
  std::filesystem::path python;      ///< interpreter; empty when the build knew none
  std::filesystem::path source_dir;  ///< the latentq source tree (the package in python/latentq)
  std::filesystem::path
      pymodule_dir;  ///< directory of the compiled latentq._core (<build>/python/latentq); may be empty
};

/// The build-time values with the environment overrides applied.
PythonTools python_tools();

/// Why the module of `script` (relative to source_dir, e.g. "python/latentq/e2e.py") cannot run: no
/// interpreter, an interpreter that is not an executable file, a missing script, or (need_module)
/// no compiled latentq._core (_core*.so) in pymodule_dir. Empty when it can.
std::string python_unavailable_reason(const PythonTools& tools, const std::string& script, bool need_module);

/// Run argv (argv[0] an executable path; no shell) with the current environment plus `env`
/// (overriding same-named variables), relaying its stdout to `out` and its stderr to `err` as they come, line by
/// line ('\n', or '\r' for a progress bar), each line flushed.
/// Returns its exit status (128 + signal number when killed by a signal). Throws std::runtime_error
/// when it cannot be started (naming argv[0] and the reason).
int run_process(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env,
                std::ostream& out, std::ostream& err);

/// The e2e step of `latentq run`, after the results file `results` is written (call it only when
/// config.probes.e2e.enabled): runs
///   <python> -m latentq.e2e --results RESULTS [--model DIR] [--threads N] [--quantizers SPEC...]
/// with PYTHONPATH set (see above), its stdout relayed to `out` and its stderr (progress, notes, warnings, errors)
/// to `err`, then prints the /e2e table
/// (format_e2e_summary). Prints one line "e2e: skipped: <why>" to `out` instead when the [e2e] model
/// is not the dump's model (a dump of the shipped tiny-mla needs no model or its directory; of another TinyMLA
/// directory, that directory, by name; another dump, an HF MLA checkpoint, needs its checkpoint directory as
/// [e2e] model), the model directory has no config.json, or
/// python_unavailable_reason() says why it cannot run; "latentq: warning: e2e: ..." to `err` when the
/// step fails. Never throws for these; returns true when /e2e was written.
/// verbose = false (`latentq study` without --verbose): the step gets --quiet (no line per run: its progress and
/// last line remain) and the /e2e table is not printed after it.
/// step_key (`latentq study`): recorded as /e2e's attribute step_key (python -m latentq.e2e --step-key), what a
/// rerun compares to reuse /e2e.
bool run_e2e_step(const StudyConfig& config, const DumpAttrs& attrs, const std::filesystem::path& results, int threads,
                  std::ostream& out, std::ostream& err, bool verbose = true, const StepKey* step_key = nullptr);

/// The command that runs the e2e step on `results` again as it ran (`decide` prints it under a plan that was not run
/// end to end): "<python> -m latentq.e2e --results RESULTS" with, when the file has /e2e, that step's model, text,
/// --seq-len, --num-seqs, --offset-bytes, --device and --dtype from the group's attributes, else the [e2e] model of
/// the results' config when it names one. Throws as read_results_attrs.
std::string e2e_command_line(const std::filesystem::path& results);

/// The inputs of a dump `latentq study` makes: what decides whether a finished dump can be reused.
struct DumpStepInputs {
  std::filesystem::path model, text;  ///< absolute
  int64_t seq_len = 512, num_seqs = 4, q_rows = 256;
  std::string dtype = "float32";
  std::string device = "cpu";  ///< the torch device the model runs on
  int threads = 0;
  bool quiet = false;               ///< --quiet: one line at the end instead of the dump's JSON summary
  bool trust_remote_code = false;   ///< --trust-remote-code: the checkpoint's own code may run (model, tokenizer)
  std::string tokenizer = "auto";   ///< --tokenizer auto|bytes
  std::string stream = "auto";      ///< --stream auto|on|off (auto: stream when the weights exceed the budget)
  std::string memory_budget;        ///< --memory-budget (empty: the dump's default, half the physical memory)
};
/// What the dump step of `latentq study` read and whether it reused its dump.
struct DumpStepResult {
  bool reused = false;
  std::vector<FileDigest> model_files;  ///< every file of the checkpoint directory, with its sha256
  std::string code;                     ///< code_sha256 of this latentq
};

/// `latentq study`'s dump: DUMP is reused when DUMP.inputs (written after a successful dump) records the same key
/// (latentq/provenance.h): latentq's code (code_sha256), the model directory and the sha256 of every file in it
/// (weights, config, tokenizer, remote code), the text and its sha256, seq_len, num_seqs, q_rows, dtype, device,
/// trust_remote_code, tokenizer, stream, memory_budget, and DUMP's own sha256. A file whose stat fields are those recorded is not hashed again. Otherwise prints
/// "dump: redoing DUMP: <what changed>" (when DUMP exists) and runs
///   <python> -m latentq.dump --model DIR --text FILE --seq-len L --num-seqs S --q-rows Q --dtype D
///                            --device DEV --out DUMP --force --threads N --tokenizer T --stream S
///                            [--trust-remote-code] [--memory-budget B] [--quiet]
/// (its stdout relayed to `out`, its stderr with its progress and notes to `err`, as they come; the checkpoint
/// hashed meanwhile) and writes DUMP.inputs. Throws std::runtime_error when Python is unavailable or the dump fails
/// (its exit code), or a file of the checkpoint cannot be read.
DumpStepResult run_dump_step(const DumpStepInputs& in, const std::filesystem::path& dump, std::ostream& out,
                             std::ostream& err);

/// `latentq report RESULTS.h5 --out DIR`: runs <python> -m latentq.report RESULTS --out DIR (PYTHONPATH
/// as above) and returns its exit code (its stdout relayed to `out`, its stderr to `err`). Throws
/// std::runtime_error (exit 2) when Python or the package is unavailable, saying why.
int run_report(const std::string& results, const std::string& out_dir, std::ostream& out, std::ostream& err);

}  // namespace latentq
