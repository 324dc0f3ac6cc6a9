// The latentq command line (latentq/cli.h).
#include "latentq/cli.h"

#include <H5Cpp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <stdexcept>

#include "latentq/config.h"
#include "latentq/dump.h"
#include "latentq/inspect.h"
#include "latentq/regress.h"
#include "latentq/results.h"
#include "latentq/study.h"
#include "latentq/util.h"

namespace latentq {
namespace fs = std::filesystem;
namespace {

struct RunArgs {
  std::string config, input, out, device = "cpu";
  int threads = 0;
};

int cmd_run(const RunArgs& a, std::ostream& out, std::ostream& err, bool progress_bar) {
  StudyConfig cfg = a.config.empty() ? default_config() : load_config(a.config);
  for (const std::string& w : cfg.warnings) err << "latentq: warning: " << w << "\n";
  if (!a.input.empty()) cfg.dump = fs::absolute(a.input).lexically_normal();
  if (!a.out.empty()) cfg.results = fs::absolute(a.out).lexically_normal();
  if (cfg.results.empty()) throw std::invalid_argument(cfg.source + ": no results path: set [output] results or pass --out");
  std::error_code ec;
  if (!cfg.dump.empty() && fs::equivalent(cfg.dump, cfg.results, ec))
    throw std::invalid_argument(cfg.results.string() + ": the results path is the input dump; choose another --out");
  const std::unique_ptr<LatentBackend> backend = make_backend(a.device);

  RunOptions opt;
  opt.threads = a.threads;
  if (progress_bar) {
    opt.progress = [&err](size_t done, size_t total) {
      const int w = 40;
      const int fill = total ? static_cast<int>(static_cast<double>(w) * static_cast<double>(done) / static_cast<double>(total)) : w;
      err << fmt::format("\r[{}{}] {}/{} cells", std::string(static_cast<size_t>(fill), '#'),
                         std::string(static_cast<size_t>(w - fill), '.'), done, total);
      if (done == total) err << "\n";
      err.flush();
    };
  }
  const auto t0 = std::chrono::steady_clock::now();
  const StudyOutput o = run_study(cfg, *backend, opt);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_results(cfg.results, o.attrs, {{"latent_error", o.latent_error, {}}, {"summary", o.summary, {}}}, WriteMode::Replace);
  out << format_summary(o.summary, o.dump_attrs);
  out << fmt::format("\n{} cells ({} quantizers) on {} in {:.1f} s\nresults: {}\n", o.latent_error.num_rows(),
                     o.quantizers.size(), backend->name(), secs, cfg.results.string());
  return kExitOk;
}

int cmd_inspect(const std::string& path, std::ostream& out) {
  const Dump d = load_dump(path);
  out << format_inspect(d);
  return kExitOk;
}

int cmd_regress(const std::string& results, const std::string& thresholds, std::ostream& out) {
  read_results_attrs(results);  // schema check first: a wrong file is an input error
  const std::vector<Threshold> th = load_thresholds(thresholds);
  const std::vector<std::string> groups = list_tables(results);
  if (std::find(groups.begin(), groups.end(), "latent_error") == groups.end())
    throw std::invalid_argument(results + ": no /latent_error group (groups: " + fmt::format("{}", fmt::join(groups, ", ")) + ")");
  const ColumnTable le = read_table(results, "latent_error");
  for (const char* c : {"quantizer", "target"})
    if (!le.has(c) || le.at(c).index() != 2)
      throw std::invalid_argument(results + ": /latent_error has no string column '" + c + "'");
  const std::vector<ThresholdResult> r = evaluate_thresholds(le, th);
  out << format_threshold_results(r);
  for (const ThresholdResult& x : r)
    if (!x.pass) return kExitGateFailure;
  return kExitOk;
}

}  // namespace

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, bool progress_bar) {
  CLI::App app{"latentq: quantization study of the latent KV cache (c_kv, k_pe) of MLA models", "latentq"};
  app.set_version_flag("--version", fmt::format("latentq {} (git {})", version(), git_commit()));
  app.require_subcommand(1);
  app.footer("Exit codes: 0 ok, 1 gate failure (regress), 2 user/input/config error.");

  RunArgs ra;
  CLI::App* run = app.add_subcommand("run", "Run the latent-error study of a config and write a results file");
  run->add_option("config", ra.config, "study config (TOML); default: the embedded experiments/default.toml");
  run->add_option("--input", ra.input, "the dump (latentq-dump/1 HDF5), overrides [input] dump");
  run->add_option("--out", ra.out, "the results file (latentq-results/1 HDF5), overrides [output] results");
  run->add_option("--threads", ra.threads, "worker threads (0 = all cores)")->check(CLI::NonNegativeNumber);
  run->add_option("--device", ra.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  run->footer("Quantizer specs:\n" + spec_grammar());

  std::string inspect_path;
  CLI::App* inspect = app.add_subcommand("inspect", "Validate a dump and summarize it (dims, per-layer statistics)");
  inspect->add_option("dump", inspect_path, "the dump (latentq-dump/1 HDF5)")->required();

  std::string reg_results, reg_thresholds;
  CLI::App* regress = app.add_subcommand("regress", "Check a results file against thresholds (exit 1 on failure)");
  regress->add_option("results", reg_results, "results file (latentq-results/1 HDF5)")->required();
  regress->add_option("--thresholds", reg_thresholds, "thresholds TOML ([[threshold]] entries)")->required();

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
    if (regress->parsed()) return cmd_regress(reg_results, reg_thresholds, out);
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
