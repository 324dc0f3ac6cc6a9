// Python steps started by latentq (latentq/external.h): posix_spawn with a pipe for its stdout and one for its
// stderr, each relayed to its own stream.
#include "latentq/external.h"
#include "latentq/util.h"
#include "latentq/provenance.h"

#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "latentq/batch_study.h"
#include "latentq/probe_study.h"
#include "latentq/plan.h"
#include "latentq/results.h"

extern char** environ;

#ifndef LATENTQ_PYTHON_EXECUTABLE
#define LATENTQ_PYTHON_EXECUTABLE ""
#endif
#ifndef LATENTQ_SOURCE_DIR
#define LATENTQ_SOURCE_DIR ""
#endif
#ifndef LATENTQ_PYMODULE_DIR
#define LATENTQ_PYMODULE_DIR ""
#endif

namespace latentq {
namespace fs = std::filesystem;

namespace {
std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string(fallback);
}

/// The child's PYTHONPATH: <source>/python (the package) and the parent of pymodule_dir (where
/// latentq/_core*.so joins it), ahead of any PYTHONPATH of the caller's environment.
std::vector<std::pair<std::string, std::string>> python_env(const PythonTools& t) {
  std::string path = (t.source_dir / "python").string();
  if (!t.pymodule_dir.empty()) path += ":" + t.pymodule_dir.parent_path().string();
  if (const char* v = std::getenv("PYTHONPATH"); v && *v) path += ":" + std::string(v);
  return {{"PYTHONPATH", path}};
}
}  // namespace

PythonTools python_tools() {
  PythonTools t;
  t.python = env_or("LATENTQ_PYTHON", LATENTQ_PYTHON_EXECUTABLE);
  t.source_dir = env_or("LATENTQ_SOURCE_DIR", LATENTQ_SOURCE_DIR);
  t.pymodule_dir = env_or("LATENTQ_PYMODULE_DIR", LATENTQ_PYMODULE_DIR);
  return t;
}

std::string python_unavailable_reason(const PythonTools& t, const std::string& script, bool need_module) {
  std::error_code ec;
  if (t.python.empty())
    return "no Python interpreter: this latentq was built without LATENTQ_PYTHON_EXECUTABLE (the project venv)";
  if (!fs::is_regular_file(t.python, ec) || ::access(t.python.c_str(), X_OK) != 0)
    return fmt::format("the Python interpreter {} is missing or not executable", t.python.string());
  const fs::path s = t.source_dir / script;
  if (!fs::is_regular_file(s, ec)) return fmt::format("the script {} is missing", s.string());
  if (need_module) {
    bool found = false;
    if (!t.pymodule_dir.empty() && fs::is_directory(t.pymodule_dir, ec)) {
      for (const auto& e : fs::directory_iterator(t.pymodule_dir, ec)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("_core", 0) == 0 && n.size() > 3 && n.substr(n.size() - 3) == ".so") found = true;
      }
    }
    if (!found)
      return fmt::format("the compiled latentq Python module is not in {} (build the target latentq_py)",
                         t.pymodule_dir.empty() ? std::string("(no module directory)") : t.pymodule_dir.string());
  }
  return "";
}

namespace {
/// A child's stream relayed line by line as it arrives: each line (ended by '\n', or by '\r' for a progress bar's
/// updates) written to `to` and flushed at once, the last incomplete one by finish(). Whole lines keep the child's
/// stdout and stderr from cutting into each other's lines where both reach one terminal.
class LineRelay {
 public:
  explicit LineRelay(std::ostream& to) : to_(to) {}
  void feed(const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      line_ += p[i];
      if (p[i] == '\n' || p[i] == '\r') emit();
    }
  }
  void finish() {
    if (!line_.empty()) emit();
  }

 private:
  void emit() {
    to_ << line_;
    to_.flush();
    line_.clear();
  }
  std::ostream& to_;
  std::string line_;
};

/// Relay the read ends `fds` [2] (the child's stdout and stderr) to `relays` until both are at their end; closes them.
void relay_pipes(const int (&fds)[2], LineRelay (&relays)[2]) {
  pollfd polls[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
  int open = 2;
  char buf[4096];
  while (open > 0) {
    if (::poll(polls, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;  // cannot wait on the pipes: stop relaying (the child is still reaped)
    }
    for (int i = 0; i < 2; ++i) {
      if (polls[i].fd < 0 || polls[i].revents == 0) continue;
      const ssize_t n = ::read(polls[i].fd, buf, sizeof buf);
      if (n > 0) {
        relays[i].feed(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(polls[i].fd);
        polls[i].fd = -1;  // poll skips it from now on
        --open;
      }
    }
  }
  for (const pollfd& p : polls)
    if (p.fd >= 0) ::close(p.fd);
  relays[0].finish();
  relays[1].finish();
}
}  // namespace

int run_process(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env,
                std::ostream& out, std::ostream& err) {
  if (argv.empty()) throw std::runtime_error("run_process: empty command");
  // Environment: the current one with `env` replacing same-named entries.
  std::vector<std::string> envs;
  for (char** e = environ; e && *e; ++e) {
    const std::string s(*e);
    bool replaced = false;
    for (const auto& [k, v] : env) replaced = replaced || s.rfind(k + "=", 0) == 0;
    if (!replaced) envs.push_back(s);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  int out_pipe[2], err_pipe[2];
  if (::pipe(out_pipe) != 0)
    throw std::runtime_error(fmt::format("{}: cannot create a pipe: {}", argv[0], std::strerror(errno)));
  if (::pipe(err_pipe) != 0) {
    const int e = errno;
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    throw std::runtime_error(fmt::format("{}: cannot create a pipe: {}", argv[0], std::strerror(e)));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addclose(&fa, out_pipe[0]);
  posix_spawn_file_actions_addclose(&fa, err_pipe[0]);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, err_pipe[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&fa, out_pipe[1]);
  posix_spawn_file_actions_addclose(&fa, err_pipe[1]);
  pid_t pid = 0;
  out.flush();
  err.flush();
  const int rc = ::posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (rc != 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    throw std::runtime_error(fmt::format("{}: cannot start: {}", argv[0], std::strerror(rc)));
  }
  LineRelay relays[2] = {LineRelay(out), LineRelay(err)};
  relay_pipes({out_pipe[0], err_pipe[0]}, relays);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

namespace {
/// Whether the model directory's config.json names the tiny-mla architecture (latentq.tiny_mla);
/// false when it cannot be read.
bool is_tiny_mla_dir(const fs::path& dir) {
  std::ifstream f(dir / "config.json");
  const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  return text.find("\"TinyMLAForCausalLM\"") != std::string::npos;
}
}  // namespace

std::string e2e_command_line(const fs::path& results) {
  const fs::path abs = fs::absolute(results);
  const PythonTools t = python_tools();
  std::vector<std::string> argv = {t.python.empty() ? std::string("python") : t.python.string(), "-m", "latentq.e2e",
                                   "--results", abs.string()};
  const std::vector<std::string> groups = list_tables(abs);
  if (std::find(groups.begin(), groups.end(), "e2e") == groups.end()) {
    const fs::path model = config_from_results(read_results_attrs(abs)).probes.e2e.model;
    if (!model.empty()) argv.insert(argv.end(), {"--model", model.string()});
  } else {
    const Attrs e = read_group_attrs(abs, "e2e");
    const auto value = [&](const std::string& name) -> std::string {
      for (const auto& [k, v] : e)
        if (k == name) {
          if (const auto* s = std::get_if<std::string>(&v)) return *s;
          if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
        }
      return "";
    };
    for (const auto& [flag, name] : {std::pair<const char*, const char*>{"--model", "model"},
                                     {"--text", "text"},
                                     {"--seq-len", "seq_len"},
                                     {"--num-seqs", "num_seqs"},
                                     {"--offset-bytes", "text_offset_bytes"},
                                     {"--device", "device"},
                                     {"--dtype", "dtype"}}) {
      const std::string v = value(name);
      if (!v.empty() && !(std::string(name) == "text" && v == "kjv-heldout")) argv.insert(argv.end(), {flag, v});
    }
  }
  return fmt::format("{}", fmt::join(argv, " "));
}

bool run_e2e_step(const StudyConfig& config, const DumpAttrs& attrs, const fs::path& results, int threads,
                  std::ostream& out, std::ostream& err, bool verbose, const StepKey* step_key) {
  const E2eSettings& E = config.probes.e2e;
  const PythonTools t = python_tools();
  std::error_code ec;
  std::string why;
  // The step runs the [e2e] model (default: the shipped tiny-mla); it must be the dump's model: a dump of a TinyMLA
  // directory (source tiny-mla: tiny-mla, copy-mla) with a TinyMLA directory, another dump (an HF checkpoint) with
  // another directory; a TinyMLA dump's model is its directory's name (latentq.dump), which the [e2e] model's must
  // be (the default config's tiny-mla does not serve a copy-mla dump). A results file written before input_source:
  // the model's name decides.
  const bool dump_tiny = attrs.source.empty() ? attrs.model == "tiny-mla" : attrs.source == "tiny-mla";
  if (E.model.empty() && attrs.model != "tiny-mla")
    why = fmt::format(
        "the dump's model is '{}' and [e2e] names no model: set [e2e] model to its checkpoint "
        "directory",
        attrs.model);
  else if (!E.model.empty() && !fs::is_regular_file(E.model / "config.json", ec))
    why = fmt::format("the model directory {} ([e2e] model) has no config.json", E.model.string());
  else if (!E.model.empty() && dump_tiny != is_tiny_mla_dir(E.model))
    why = fmt::format(
        "the dump's model is '{}' but the [e2e] model {} is {}a tiny-mla directory: set [e2e] model "
        "to the dump's checkpoint directory",
        attrs.model, E.model.string(), dump_tiny ? "not " : "");
  else if (!E.model.empty() && dump_tiny && (E.model.lexically_normal() / "").parent_path().filename() != attrs.model)
    why = fmt::format(
        "the dump's model is '{}' but the [e2e] model {} is another TinyMLA directory (a TinyMLA dump names its "
        "directory): set [e2e] model to the dump's checkpoint directory",
        attrs.model, E.model.string());
  else
    why = python_unavailable_reason(t, "python/latentq/e2e.py", true);
  if (!why.empty()) {
    out << "e2e: skipped: " << why << "\n";
    return false;
  }
  std::vector<std::string> argv = {t.python.string(), "-m", "latentq.e2e", "--results", fs::absolute(results).string()};
  if (!E.model.empty()) argv.insert(argv.end(), {"--model", E.model.string()});
  if (!E.text.empty()) argv.insert(argv.end(), {"--text", E.text.string()});
  if (E.seq_len > 0) argv.insert(argv.end(), {"--seq-len", std::to_string(E.seq_len)});
  if (E.num_seqs > 0) argv.insert(argv.end(), {"--num-seqs", std::to_string(E.num_seqs)});
  if (E.offset_bytes >= 0) argv.insert(argv.end(), {"--offset-bytes", std::to_string(E.offset_bytes)});
  if (!E.device.empty()) argv.insert(argv.end(), {"--device", E.device});
  if (!E.dtype.empty()) argv.insert(argv.end(), {"--dtype", E.dtype});
  if (E.batch_runs > 0) argv.insert(argv.end(), {"--batch-runs", std::to_string(E.batch_runs)});
  if (!E.dump_text_sha256.empty()) argv.insert(argv.end(), {"--dump-text-sha256", E.dump_text_sha256});
  if (E.trust_remote_code) argv.push_back("--trust-remote-code");
  if (!E.tokenizer.empty()) argv.insert(argv.end(), {"--tokenizer", E.tokenizer});
  if (!E.stream.empty()) argv.insert(argv.end(), {"--stream", E.stream});
  if (!E.memory_budget.empty()) argv.insert(argv.end(), {"--memory-budget", E.memory_budget});
  if (!E.selection.empty()) argv.insert(argv.end(), {"--e2e", E.selection});
  if (!E.budgets.empty()) argv.insert(argv.end(), {"--budgets", E.budgets});
  if (E.generation.value_or(false)) {
    argv.push_back("--generation");
    if (E.generation_auto) argv.push_back("auto");
    if (E.gen_prompts > 0) argv.insert(argv.end(), {"--gen-prompts", std::to_string(E.gen_prompts)});
    if (E.gen_prompt_len > 0) argv.insert(argv.end(), {"--gen-prompt-len", std::to_string(E.gen_prompt_len)});
    if (E.gen_new_tokens > 0) argv.insert(argv.end(), {"--gen-new-tokens", std::to_string(E.gen_new_tokens)});
  }
  if (E.retrieval.value_or(false)) {
    argv.push_back("--retrieval");
    if (!E.needle_lengths.empty()) {
      argv.push_back("--needle-lengths");
      for (const int64_t L : E.needle_lengths) argv.push_back(std::to_string(L));
    }
    if (E.needle_samples > 0) argv.insert(argv.end(), {"--needle-samples", std::to_string(E.needle_samples)});
  }
  const int n = worker_threads(threads);
  argv.insert(argv.end(), {"--threads", std::to_string(n)});
  if (!verbose) argv.push_back("--quiet");
  if (step_key) argv.insert(argv.end(), {"--step-key", step_key->json()});
  if (!E.quantizers.empty()) {
    argv.push_back("--quantizers");
    argv.insert(argv.end(), E.quantizers.begin(), E.quantizers.end());
  }
  std::vector<std::string> shown = argv;  // the key is long (a digest per checkpoint file): not printed
  for (size_t i = 0; i + 1 < shown.size(); ++i)
    if (shown[i] == "--step-key") shown[i + 1] = "<key>";
  out << "\ne2e: " << fmt::format("{}", fmt::join(shown, " ")) << "\n";
  out.flush();
  // The step's lines (one per run on its stdout; its progress with counts and an ETA, its notes and warnings on its
  // stderr) are relayed as they come, each to its stream; on a terminal it draws a bar (latentq/progress.py), else a
  // line every ~10 s.
  std::vector<std::pair<std::string, std::string>> env = python_env(t);
  if (!std::getenv("LATENTQ_PROGRESS") && ::isatty(STDERR_FILENO)) env.emplace_back("LATENTQ_PROGRESS", "bar");
  int rc = 0;
  try {
    rc = run_process(argv, env, out, err);
  } catch (const std::runtime_error& e) {
    err << "latentq: warning: e2e: " << e.what() << "\n";
    return false;
  }
  if (rc != 0) {
    err << fmt::format("latentq: warning: e2e: python -m latentq.e2e exited with code {}; {} has no new /e2e\n", rc,
                       results.string());
    return false;
  }
  if (!verbose) return true;
  try {
    const std::vector<std::string> groups = list_tables(results);
    const bool has_summary = std::find(groups.begin(), groups.end(), "summary") != groups.end();
    out << format_e2e_summary(read_table(results, "e2e"), has_summary ? read_table(results, "summary") : ColumnTable{});
  } catch (const std::exception& e) {
    err << "latentq: warning: e2e: cannot read /e2e back: " << e.what() << "\n";
    return false;
  }
  return true;
}

namespace {
/// The dump step's key: the code, the checkpoint (its path and every file's sha256), the text, the flags, and last
/// the dump's own sha256 (a dump changed since it was written is not reused).
StepKey dump_key(const DumpStepInputs& in, const std::string& code, const std::vector<FileDigest>& model_files,
                 const std::string& text_sha, const std::string& dump_sha) {
  StepKey k;
  k.add("latentq code", code);
  k.add("model", in.model.string());
  for (const FileDigest& f : model_files) k.add("model file " + f.name, f.sha256);
  k.add("text", in.text.string());
  k.add("text sha256", text_sha);
  k.add("--seq-len", std::to_string(in.seq_len));
  k.add("--num-seqs", std::to_string(in.num_seqs));
  k.add("--q-rows", std::to_string(in.q_rows));
  k.add("--dtype", in.dtype);
  k.add("--device", in.device);
  k.add("--trust-remote-code", in.trust_remote_code ? "on" : "off");
  k.add("--tokenizer", in.tokenizer);
  k.add("--stream", in.stream);
  k.add("--memory-budget", in.memory_budget.empty() ? "default" : in.memory_budget);
  k.add("dump sha256", dump_sha);
  return k;
}

/// DUMP.inputs: {"key": the dump's key, "files": [[name, sha256, size, mtime_ns, ctime_ns, inode, device], ...]}.
std::string stamp_text(const StepKey& key, const std::vector<FileDigest>& files) {
  nlohmann::ordered_json j;
  j["schema"] = "latentq-step-key/1";
  j["key"] = nlohmann::ordered_json::parse(key.json());
  j["files"] = nlohmann::ordered_json::array();
  for (const FileDigest& f : files)
    j["files"].push_back({f.name, f.sha256, f.size, f.mtime_ns, f.ctime_ns, f.inode, f.device});
  return j.dump(1) + "\n";
}

/// The key and the files of DUMP.inputs; nullopt when it is absent or not such a file.
std::optional<std::pair<StepKey, std::vector<FileDigest>>> read_stamp(const fs::path& stamp) {
  std::ifstream f(stamp);
  if (!f) return std::nullopt;
  try {
    const nlohmann::ordered_json j = nlohmann::ordered_json::parse(f);
    if (j.value("schema", "") != "latentq-step-key/1") return std::nullopt;
    StepKey key = StepKey::parse_json(j.at("key").dump());
    std::vector<FileDigest> files;
    for (const auto& e : j.at("files")) {
      FileDigest d;
      d.name = e.at(0).get<std::string>();
      d.sha256 = e.at(1).get<std::string>();
      d.size = e.at(2).get<std::uintmax_t>();
      d.mtime_ns = e.at(3).get<std::int64_t>();
      d.ctime_ns = e.at(4).get<std::int64_t>();
      d.inode = e.at(5).get<std::uint64_t>();
      d.device = e.at(6).get<std::uint64_t>();
      files.push_back(std::move(d));
    }
    return std::make_pair(std::move(key), std::move(files));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::function<void(size_t, size_t)> hash_progress(std::ostream& out) {
  auto last = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  return [&out, last](size_t done, size_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - *last < std::chrono::seconds(10)) return;
    *last = now;
    out << fmt::format("dump: hashed {:.1f} of {:.1f} MiB of the checkpoint\n", static_cast<double>(done) / 1048576.0,
                       static_cast<double>(total) / 1048576.0);
    out.flush();
  };
}
}  // namespace

DumpStepResult run_dump_step(const DumpStepInputs& in, const fs::path& dump, std::ostream& out, std::ostream& err) {
  const auto sha_or = [](const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec) ? file_sha256(p) : std::string("-");
  };
  const PythonTools t = python_tools();
  DumpStepResult res;
  res.code = code_sha256(t.source_dir, t.pymodule_dir);
  const std::string text_sha = sha_or(in.text);
  fs::path stamp = dump;
  stamp += ".inputs";
  std::error_code ec;
  if (fs::is_regular_file(dump, ec)) {
    const auto old = read_stamp(stamp);
    if (!old) {
      out << "dump: redoing " << dump.string() << " (no record of its inputs in " << stamp.string() << ")\n";
    } else {
      // Files whose stat fields are unchanged keep their recorded digest; the others are hashed again.
      res.model_files = directory_digests(in.model, old->second, hash_progress(out));
      const StepKey now = dump_key(in, res.code, res.model_files, text_sha, file_sha256(dump));
      const std::vector<std::string> changes = key_changes(old->first, now);
      if (changes.empty()) {
        out << "dump: reusing " << dump.string() << " (every input unchanged: " << stamp.string() << ")\n";
        if (old->second.size() != res.model_files.size() ||
            !std::equal(old->second.begin(), old->second.end(), res.model_files.begin(),
                        [](const FileDigest& a, const FileDigest& b) { return a.ctime_ns == b.ctime_ns; }))
          write_text_atomic(stamp, stamp_text(now, res.model_files));  // touched, not changed: new stat fields
        res.reused = true;
        return res;
      }
      out << "dump: redoing " << dump.string() << ": " << fmt::format("{}", fmt::join(changes, "; ")) << "\n";
    }
  }
  if (const std::string why = python_unavailable_reason(t, "python/latentq/dump.py", false); !why.empty())
    throw std::runtime_error("dump: " + why);
  std::vector<std::string> argv = {t.python.string(),
                                   "-m",
                                   "latentq.dump",
                                   "--model",
                                   in.model.string(),
                                   "--text",
                                   in.text.string(),
                                   "--seq-len",
                                   std::to_string(in.seq_len),
                                   "--num-seqs",
                                   std::to_string(in.num_seqs),
                                   "--q-rows",
                                   std::to_string(in.q_rows),
                                   "--dtype",
                                   in.dtype,
                                   "--out",
                                   dump.string(),
                                   "--force",
                                   "--device",
                                   in.device,
                                   "--threads",
                                   std::to_string(worker_threads(in.threads))};
  argv.insert(argv.end(), {"--tokenizer", in.tokenizer, "--stream", in.stream});
  if (in.trust_remote_code) argv.push_back("--trust-remote-code");
  if (!in.memory_budget.empty()) argv.insert(argv.end(), {"--memory-budget", in.memory_budget});
  if (in.quiet) argv.push_back("--quiet");
  out << "dump: " << fmt::format("{}", fmt::join(argv, " ")) << "\n";
  std::vector<std::pair<std::string, std::string>> env = python_env(t);
  if (!std::getenv("LATENTQ_PROGRESS") && ::isatty(STDERR_FILENO)) env.emplace_back("LATENTQ_PROGRESS", "bar");
  fs::remove(stamp, ec);  // a dump being rewritten is not reusable until it is complete
  // The checkpoint's files are hashed while the dump reads them (the page cache serves both), so the key costs
  // no pass of its own; a file whose stat fields change meanwhile is hashed again by the next run.
  std::future<std::vector<FileDigest>> files =
      res.model_files.empty()
          ? std::async(std::launch::async, [&] { return directory_digests(in.model); })
          : std::async(std::launch::deferred, [&] { return res.model_files; });
  const int rc = run_process(argv, env, out, err);
  res.model_files = files.get();
  if (rc != 0) throw std::runtime_error(fmt::format("dump: python -m latentq.dump exited with code {}", rc));
  write_text_atomic(stamp, stamp_text(dump_key(in, res.code, res.model_files, text_sha, file_sha256(dump)),
                                      res.model_files));
  return res;
}

int run_report(const std::string& results, const std::string& out_dir, std::ostream& out, std::ostream& err) {
  const PythonTools t = python_tools();
  if (const std::string why = python_unavailable_reason(t, "python/latentq/report/__main__.py", false); !why.empty())
    throw std::runtime_error("report: " + why);
  return run_process({t.python.string(), "-m", "latentq.report", results, "--out", out_dir}, python_env(t), out,
                     err);
}

}  // namespace latentq
