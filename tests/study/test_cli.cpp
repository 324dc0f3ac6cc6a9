// The CLI logic in-process (run_cli): exit codes, messages, and that errors write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <functional>
#include <sstream>

#include "latentq/batch.h"
#include "latentq/cli.h"
#include "latentq/config.h"
#include "latentq/results.h"
#include "latentq/util.h"
#include "cli_capture.h"
#include "synth_dump.h"

namespace {
using namespace latentq;
using lqtest::cli;
using lqtest::Outcome;
using lqtest::TempDir;
namespace fs = std::filesystem;

const char* kConfig = R"(
[input]
dump = "dump.h5"
[quantizers]
bits = [8, 4]
schemes = ["sym", "asym"]
granularities = ["channel", "token"]
group_sizes = [0, 8]
extra = ["bf16", "flashmla-v32-fp8"]
[output]
results = "out/results.h5"
# the latent study only (the probe groups: test_probe_study.cpp)
[svd]
enabled = false
[cross_layer]
enabled = false
[attention]
enabled = false
)";

struct CliTest : ::testing::Test {
  TempDir dir;
  fs::path dump = dir / "dump.h5", config = dir / "study.toml", results = dir / "out" / "results.h5";
  void SetUp() override {
    lqtest::write_synth(dump, lqtest::make_synth());
    std::ofstream(config) << kConfig;
  }
  void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
};

TEST_F(CliTest, RunWritesResultsAndPrintsTheSummary) {
  const Outcome o = cli({"run", config.string(), "--threads", "2"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_TRUE(o.err.empty()) << o.err;  // no progress bar when not asked
  EXPECT_CONTAINS(o.out, "int4-asym-channel-g8");
  EXPECT_CONTAINS(o.out, "bf16 = 144 bytes/token");  // 3 layers x (16 + 8) x 2
  EXPECT_CONTAINS(o.out, "results: " + results.string());
  EXPECT_CONTAINS(o.out, "108 cells (18 quantizers)");  // 3 layers x 2 targets x (2 x 2 x 4 + 2)
  const Attrs a = read_results_attrs(results);
  EXPECT_EQ(std::get<std::string>(attr(a, "input_sha256")), file_sha256(dump));
  EXPECT_EQ(std::get<std::string>(attr(a, "input_path")), dump.string());
  EXPECT_EQ(std::get<std::string>(attr(a, "config")), kConfig);
  EXPECT_EQ(std::get<std::string>(attr(a, "model")), "synthetic");
  EXPECT_EQ(std::get<int64_t>(attr(a, "num_layers")), 3);
  EXPECT_EQ(std::get<int64_t>(attr(a, "kv_lora_rank")), 16);
  EXPECT_EQ(std::get<int64_t>(attr(a, "qk_rope_head_dim")), 8);
  EXPECT_EQ(std::get<std::string>(attr(a, "latentq_version")), version());
  EXPECT_EQ(std::get<std::string>(attr(a, "git_commit")), git_commit());
  const std::string created = std::get<std::string>(attr(a, "created"));
  EXPECT_EQ(created.size(), 20u);
  EXPECT_EQ(created.back(), 'Z');
  EXPECT_EQ(list_tables(results),
            (std::vector<std::string>{"latent_error", "summary", "cells", "plan_runs",
                                      "decision"}));  // /cells: latentq/batch.h; /plan_runs: latentq/plan_runs.h;
                                                      // /decision: latentq/decision.h
  EXPECT_EQ(read_table(results, "latent_error").num_rows(), 108u);
  EXPECT_EQ(read_table(results, "summary").num_rows(), 18u);
}

// Progress without a terminal: a line about every LATENTQ_PROGRESS_INTERVAL seconds with counts and an ETA (0:
// a line per cell, the last one left to the summary); none by default for a step this short; off silences it.
TEST_F(CliTest, ProgressLinesWithoutATerminal) {
  ::setenv("LATENTQ_PROGRESS_INTERVAL", "0", 1);
  Outcome o = cli({"run", config.string(), "--threads", "1"});
  ::unsetenv("LATENTQ_PROGRESS_INTERVAL");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_CONTAINS(o.err, "latentq: 1/3 layers checked, 0 s, ETA ");
  EXPECT_CONTAINS(o.err, "latentq: 2/3 layers checked, 0 s, ETA ");
  EXPECT_EQ(o.err.find("3/3 layers checked"), std::string::npos) << o.err;
  {  // the reporter itself: a line per new count, none for a repeated count or the end; a bar on a terminal
    ::setenv("LATENTQ_PROGRESS_INTERVAL", "0", 1);
    std::ostringstream lines, bar;
    const auto p = progress_reporter(lines, false, "cells");
    for (const auto& [d, t] : std::vector<std::pair<size_t, size_t>>{{0, 4}, {1, 4}, {1, 4}, {3, 4}, {4, 4}}) p(d, t);
    const auto b = progress_reporter(bar, true, "cells");
    b(2, 4);
    b(4, 4);
    ::unsetenv("LATENTQ_PROGRESS_INTERVAL");
    const std::string l = lines.str();
    EXPECT_EQ(std::count(l.begin(), l.end(), '\n'), 2) << l;
    EXPECT_CONTAINS(l, "latentq: 1/4 cells, 0 s, ETA 0 s\n");
    EXPECT_CONTAINS(l, "latentq: 3/4 cells, 0 s, ETA 0 s\n");
    EXPECT_CONTAINS(bar.str(), "\r[####################....................] 2/4 cells, 0 s, ETA 0 s");
    EXPECT_CONTAINS(bar.str(), "\r[########################################] 4/4 cells, 0 s   \n");
  }
  ::setenv("LATENTQ_PROGRESS", "off", 1);
  o = cli({"run", config.string(), "--threads", "1"}, true);
  ::unsetenv("LATENTQ_PROGRESS");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_TRUE(o.err.empty()) << o.err;
  ::setenv("LATENTQ_PROGRESS_INTERVAL", "soon", 1);
  o = cli({"run", config.string()});
  ::unsetenv("LATENTQ_PROGRESS_INTERVAL");
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "LATENTQ_PROGRESS_INTERVAL='soon' is not a number of seconds >= 0");
}

TEST_F(CliTest, OverridesAndRelativePaths) {
  // --input and --out are relative to the current directory; config paths to the config's.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  const Outcome o = cli({"run", "study.toml", "--input", "dump.h5", "--out", "elsewhere.h5"});
  fs::current_path(cwd);
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_TRUE(fs::exists(dir / "elsewhere.h5"));
  EXPECT_FALSE(fs::exists(results));
}

// Edge inputs: the default study on a copy of the shipped dump whose softmax_scale is finite as a
// float64 but not as the float32 the attention runs in. It used to exit 0 with a NaN attention check and
// /attention_error rows scored out_rel_fro 0, KL 0, top-1 1 (1e300), or a uniform softmax (1e-50).
TEST_F(CliTest, DefaultStudyRefusesASoftmaxScaleThatFloat32CannotHold) {
  const fs::path shipped = fs::path(LATENTQ_SOURCE_DIR) / "data" / "latents" / "tiny-mla.h5";
  ASSERT_TRUE(fs::exists(shipped)) << shipped << " is missing (a tracked file)";
  const fs::path copy = dir / "tiny-mla-scale.h5", out = dir / "default.h5";
  fs::copy_file(shipped, copy);
  for (const auto& [scale, words] : std::vector<std::pair<double, std::string>>{
           {1e300, "root attribute 'softmax_scale' = 1e+300 is inf in float32"},
           {1e-50, "root attribute 'softmax_scale' = 1e-50 becomes 0 in float32"}}) {
    SCOPED_TRACE(words);
    lqtest::set_double_attr(copy, "softmax_scale", scale);
    const Outcome o = cli({"run", "--input", copy.string(), "--out", out.string(), "--threads", "2"});
    EXPECT_EQ(o.rc, 2) << o.out << o.err;
    EXPECT_CONTAINS(o.err, "latentq: error: " + copy.string() + ": " + words);
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(partial_path(out)));
    EXPECT_EQ(dir.entries(), (std::vector<std::string>{"dump.h5", "study.toml", "tiny-mla-scale.h5"}));
  }
}

TEST_F(CliTest, InputErrorsWriteNothing) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  write(dir / "bad_key.toml", "[input]\ndump = \"dump.h5\"\nlayerz = 1\n");
  write(dir / "bad_spec.toml", "[input]\ndump = \"dump.h5\"\n[quantizers]\nextra = [\"int5-sym-token\"]\n");
  write(dir / "bad_layer.toml", "[input]\ndump = \"dump.h5\"\nlayers = [9]\n[quantizers]\nextra = [\"bf16\"]\n");
  const fs::path broken = dir / "broken.h5";
  fs::copy_file(dump, broken);
  fs::resize_file(broken, fs::file_size(broken) / 3);
  const std::vector<Case> cases = {
      {{"run", config.string(), "--input", (dir / "missing.h5").string()}, "missing.h5: no such file"},
      {{"run", config.string(), "--input", broken.string()}, "broken.h5"},
      {{"run", config.string(), "--input", config.string()}, "not an HDF5 file"},
      {{"run", (dir / "bad_key.toml").string()}, "unknown key 'input.layerz'"},
      {{"run", (dir / "bad_spec.toml").string(), "--out", results.string()}, "unknown quantizer spec 'int5-sym-token'"},
      {{"run", (dir / "bad_layer.toml").string(), "--out", results.string()}, "layer 9 was requested"},
      {{"run", (dir / "none.toml").string()}, "cannot read the config file"},
      {{"run", config.string(), "--out", dump.string()}, "is the input dump"},
      {{"run", config.string(), "--device", "cuda"}, "CUDA"},
      {{"run", config.string(), "--device", "tpu"}, "--device"},
      {{"run", config.string(), "--threads", "-1"}, "--threads"},
      {{"frobnicate"}, "latentq: error:"},
      {{}, "A subcommand is required"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.args));
    const Outcome o = cli(c.args);
    if (c.message == "CUDA" && o.rc == 0) continue;  // a CUDA build on a GPU machine
    EXPECT_EQ(o.rc, 2);
    EXPECT_CONTAINS(o.err, "latentq: error: ");
    EXPECT_CONTAINS(o.err, c.message);
    EXPECT_FALSE(fs::exists(results));
    EXPECT_FALSE(fs::exists(dir / "out"));
  }
}

// No command writes over a path it reads: by the same name, through a symlink or a hard link, or inside an input
// directory. Each is refused with exit 2 naming both roles, and the input is left byte for byte as it was.
TEST_F(CliTest, OutputsThatAreInputsAreRefused) {
  ASSERT_EQ(cli({"run", config.string()}).rc, 0);
  const auto bytes = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  };
  fs::create_symlink(results, dir / "link.h5");
  fs::create_hard_link(results, dir / "hard.h5");
  fs::create_symlink(config, dir / "config_link.toml");
  fs::create_directories(dir / "model");
  write(dir / "model" / "config.json", "{}");
  write(dir / "e2e.toml", std::string(kConfig) + "[e2e]\nmodel = \"model\"\n");
  struct Case {
    std::vector<std::string> args;
    fs::path input;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {{"plan", results.string(), "--budget", "100", "--out", results.string()},
       results,
       {"the plan --out", "is the results file"}},
      {{"plan", results.string(), "--budget", "100", "--out", (dir / "link.h5").string()},
       results,
       {"link.h5 is the results file"}},
      {{"plan", results.string(), "--budget", "100", "--out", (dir / "hard.h5").string()},
       results,
       {"hard.h5 is the results file"}},
      {{"run", config.string(), "--out", config.string()}, config, {"the results file", "is the config"}},
      {{"run", config.string(), "--out", (dir / "config_link.toml").string()}, config, {"is the config"}},
      {{"run", (dir / "e2e.toml").string(), "--out", (dir / "model" / "r.h5").string()},
       dir / "model" / "config.json",
       {"lies inside the [e2e] model directory"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.args));
    const std::string before = bytes(c.input);
    const Outcome o = cli(c.args);
    EXPECT_EQ(o.rc, 2);
    for (const std::string& m : c.message) EXPECT_CONTAINS(o.err, m);
    EXPECT_EQ(bytes(c.input), before);
  }
  EXPECT_FALSE(fs::exists(dir / "model" / "r.h5"));
}

// A spec named twice in one list, under one or two spellings, is studied (or run) once, with a warning naming the
// spellings: [quantizers] extra and [e2e] quantizers.
TEST_F(CliTest, ASpecNamedTwiceRunsOnce) {
  write(dir / "dup.toml", std::string(kConfig) +
                              "[e2e]\nquantizers = [\"int4-asym-channel-g16-fp16\", \"int4-asym-channel-g16\", "
                              "\"int4-asym-channel-g16\"]\n");
  const StudyConfig c = load_config(dir / "dup.toml");
  EXPECT_EQ(c.probes.e2e.quantizers, std::vector<std::string>{"int4-asym-channel-g16"});
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_CONTAINS(c.warnings[0], "'e2e.quantizers' names int4-asym-channel-g16 3 times");
  EXPECT_CONTAINS(c.warnings[0], "int4-asym-channel-g16-fp16, int4-asym-channel-g16, int4-asym-channel-g16");
  std::string extra = kConfig;
  extra.replace(extra.find("extra = [\"bf16\""), 15, "extra = [\"q4_0\", \"int8-sym-token-fp16\", \"int8-sym-token\", \"bf16\"");
  write(dir / "dup_extra.toml", extra);
  const StudyConfig e = load_config(dir / "dup_extra.toml");
  const std::vector<Quantizer> qs = e.all_quantizers();
  EXPECT_EQ(std::count_if(qs.begin(), qs.end(), [](const Quantizer& q) { return q.name == "int8-sym-token"; }), 1);
  ASSERT_EQ(e.warnings.size(), 1u);
  EXPECT_CONTAINS(e.warnings[0], "'quantizers.extra' names int8-sym-token 2 times (int8-sym-token-fp16, int8-sym-token)");
}

// Bad values in the last layer a study reads (NaN/Inf in c_kv, k_pe or w_uk; a q_rows index outside [0, T)):
// `run` refuses before its first cell, exit 2 naming the dataset, and writes no file at all (no OUT.partial:
// a resume cannot fix the input). With a progress bar, the check counts its layers.
TEST_F(CliTest, BadLayerValuesAreRefusedBeforeAnyCellRuns) {
  write(dir / "attn.toml",
        "[input]\ndump = \"bad.h5\"\n[quantizers]\nextra = [\"int4-asym-token\"]\n"
        "[output]\nresults = \"out/results.h5\"\n[attention]\nenabled = true\n");
  const lqtest::SynthData d = lqtest::make_synth();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string dataset;
    std::function<void(const fs::path&)> breaks;
    std::string message;
  };
  const auto with = [](std::vector<float> v, size_t i, float x) {
    v[i] = x;
    return v;
  };
  const hsize_t T = static_cast<hsize_t>(d.T), r = 16, rope = 8;
  std::vector<int32_t> rows = d.q_rows;
  rows.back() = static_cast<int32_t>(d.T);
  const std::vector<Case> cases = {
      {"/layers/002/c_kv",
       [&](const fs::path& p) {
         lqtest::put_f32(p, "/layers/002/c_kv", {T, r}, with(d.c_kv[2], 17, nan));
       },
       "/layers/002/c_kv"},
      {"/layers/002/k_pe",
       [&](const fs::path& p) {
         lqtest::put_f32(p, "/layers/002/k_pe", {T, rope}, with(d.k_pe[2], 3, inf));
       },
       "/layers/002/k_pe"},
      {"/layers/002/w_uk",
       [&](const fs::path& p) {
         lqtest::put_f32(p, "/layers/002/w_uk", {2, 4, r}, with(d.w_uk[2], 5, nan));
       },
       "/layers/002/w_uk"},
      {"/layers/002/q_rows", [&](const fs::path& p) { lqtest::put_i32(p, "/layers/002/q_rows", {rows.size()}, rows); },
       "is not a token index in [0, 64)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dataset);
    const fs::path bad = dir / "bad.h5";
    fs::copy_file(dump, bad, fs::copy_options::overwrite_existing);
    c.breaks(bad);
    for (const bool bar : {false, true}) {
      const Outcome o = cli({"run", (dir / "attn.toml").string(), "--threads", "1"}, bar);
      EXPECT_EQ(o.rc, 2) << o.out << o.err;
      EXPECT_CONTAINS(o.err, "latentq: error: " + bad.string());
      EXPECT_CONTAINS(o.err, c.message);
      if (bar) {
        EXPECT_CONTAINS(o.err, "2/3 layers checked");
      }
      EXPECT_EQ(o.err.find("cell"), std::string::npos) << o.err;  // refused before any cell, not by one
      EXPECT_FALSE(fs::exists(dir / "out")) << "a file was written";
    }
  }
}

// `latentq init`: the default config with resolved paths (the copy runs from anywhere); --model points [e2e]
// at the checkpoint and [input] at dump.h5 beside the config; an existing file is refused.
TEST_F(CliTest, InitWritesTheDefaultConfigWithResolvedPaths) {
  const fs::path c = dir / "cfg" / "mine.toml";
  Outcome o = cli({"init", c.string()});
  ASSERT_EQ(o.rc, 0) << o.err;
  const StudyConfig got = load_config(c);
  const StudyConfig def = default_config();
  EXPECT_EQ(got.dump, def.dump);
  EXPECT_TRUE(got.dump.is_absolute());
  EXPECT_EQ(got.results, def.results);
  EXPECT_EQ(got.probes.e2e.model, def.probes.e2e.model);
  EXPECT_EQ(got.all_quantizers().size(), def.all_quantizers().size());
  o = cli({"init", c.string()});
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "mine.toml: exists");
  const fs::path m = dir / "m.toml";
  o = cli({"init", m.string(), "--model", (dir / "ckpt").string()});
  ASSERT_EQ(o.rc, 0) << o.err;
  const StudyConfig with_model = load_config(m);
  EXPECT_EQ(with_model.dump, dir / "dump.h5");
  EXPECT_EQ(with_model.probes.e2e.model, dir / "ckpt");
  EXPECT_TRUE(with_model.probes.e2e.enabled);
}

TEST_F(CliTest, Inspect) {
  Outcome o = cli({"inspect", dump.string()});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_CONTAINS(o.out, "kv_lora_rank 16");
  EXPECT_CONTAINS(o.out, "1 [3]");  // the outlier channel of the synthetic c_kv
  lqtest::set_string_attr(dump, "schema", "something/else");
  o = cli({"inspect", dump.string()});
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "expected \"latentq-dump/1\"");
  o = cli({"inspect"});
  EXPECT_EQ(o.rc, 2);
}

TEST_F(CliTest, VersionAndHelp) {
  Outcome o = cli({"--version"});
  EXPECT_EQ(o.rc, 0);
  EXPECT_CONTAINS(o.out, std::string("latentq ") + version());
  o = cli({"run", "--help"});
  EXPECT_EQ(o.rc, 0);
  EXPECT_CONTAINS(o.out, "int4-asym-channel-g32");
}

struct RegressTest : CliTest {
  void SetUp() override {
    CliTest::SetUp();
    const Outcome o = cli({"run", config.string()});
    ASSERT_EQ(o.rc, 0) << o.err;
  }
  Outcome regress(const std::string& thresholds) {
    const fs::path p = dir / "thresholds.toml";
    write(p, thresholds);
    return cli({"regress", results.string(), "--thresholds", p.string()});
  }
};

const char* kPassing = R"(
[[threshold]]
quantizer = "int8-asym-channel-g8"
target = "c_kv"
metric = "rel_fro"
statistic = "max"
bound = 0.05

[[threshold]]
quantizer = "int8-asym-channel-g8-fp16"   # canonical form int8-asym-channel-g8
target = "k_pe"
metric = "cos_mean"
statistic = "min"
direction = "min"
bound = 0.99

[[threshold]]
quantizer = "bf16"
target = "k_pe"
metric = "sqnr_db"
statistic = "mean"
direction = "min"
bound = 40
)";

TEST_F(RegressTest, Passes) {
  const Outcome o = regress(kPassing);
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_CONTAINS(o.out, "PASS  int8-asym-channel-g8 c_kv /latent_error max(rel_fro)");
  EXPECT_CONTAINS(o.out, ">= 0.99");
  EXPECT_CONTAINS(o.out, "(3 rows)");
  EXPECT_CONTAINS(o.out, "gate: 3 of 3 thresholds pass");
}

TEST_F(RegressTest, FailsOnAViolatedBound) {
  const Outcome o = regress(std::string(kPassing) + R"(
[[threshold]]
quantizer = "int4-sym-token"
target = "c_kv"
metric = "rel_fro"
statistic = "mean"
bound = 1e-6
)");
  EXPECT_EQ(o.rc, 1);
  EXPECT_CONTAINS(o.out, "FAIL  int4-sym-token c_kv /latent_error mean(rel_fro)");
  EXPECT_CONTAINS(o.out, "gate: 3 of 4 thresholds pass");
}

// A gate on /e2e (a table added to the study's results by hand): the failing thresholds are listed again
// after the summary line, by name, value and bound, with their file:line:column.
TEST_F(RegressTest, GatesAnotherGroupAndListsTheFailuresAtTheEnd) {
  ColumnTable e2e;
  e2e.add<std::string>("quantizer") = {"int4-asym-channel-g32", "int4-asym-channel-g32", "int8-asym-token"};
  e2e.add<std::string>("targets") = {"c_kv+k_pe", "c_kv+k_pe", "c_kv+k_pe"};
  e2e.add<std::string>("cache_mode") = {"prefill-at-once", "decode-r16-s4-p0", "prefill-at-once"};
  e2e.add<double>("kl_mean") = {0.03, 0.01, 0.001};
  e2e.add<double>("ppl_quant") = {12.5, 12.25, 12.0};
  write_results(results, {}, {{"e2e", e2e, {}}}, WriteMode::Update);
  const Outcome o = regress(std::string(kPassing) + R"(
[[threshold]]
group = "e2e"
quantizer = "int4-*"
cache_mode = "prefill-at-once"
metric = "kl_mean"
bound = 0.02

[[threshold]]
group = "e2e"
quantizer = "*"
metric = "ppl_quant"
statistic = "mean"
bound = 12.2

[[threshold]]
group = "e2e"
quantizer = "int8-asym-token"
target = "c_kv+k_pe"
metric = "kl_mean"
bound = 0.002
)");
  EXPECT_EQ(o.rc, 1) << o.out << o.err;
  const std::string p = (dir / "thresholds.toml").string();
  EXPECT_CONTAINS(o.out, "PASS  int8-asym-token c_kv+k_pe /e2e max(kl_mean)");
  const size_t summary = o.out.find("gate: ");
  ASSERT_NE(summary, std::string::npos) << o.out;
  std::string want = "gate: 4 of 6 thresholds pass; 2 fail:\n";
  want += "  FAIL  int4-* prefill-at-once /e2e max(kl_mean) = 0.03, bound <= 0.02   (" + p + ":25:1)\n";
  want += "  FAIL  * /e2e mean(ppl_quant) = 12.25, bound <= 12.2   (" + p + ":32:1)\n";  // 36.75 / 3
  EXPECT_EQ(o.out.substr(summary), want) << o.out;
  // A group the file lacks is a config error naming the entry and the file's gate groups.
  write(dir / "absent.toml",
        "[[threshold]]\ngroup = \"attention_error\"\nquantizer = \"*\"\nmetric = \"kl_mean\"\nbound = 1\n");
  const Outcome a = cli({"regress", results.string(), "--thresholds", (dir / "absent.toml").string()});
  EXPECT_EQ(a.rc, 2);
  EXPECT_CONTAINS(a.err, "latentq: error: " + (dir / "absent.toml").string() +
                             ":2:9: group /attention_error is not in " + results.string() +
                             " (its gate groups: e2e, latent_error, summary)");
  EXPECT_TRUE(a.out.empty()) << a.out;
}

TEST_F(RegressTest, FailsOnAThresholdMatchingNothing) {
  const Outcome o = regress(std::string(kPassing) + R"(
[[threshold]]
quantizer = "int2-asym-channel-g32"
target = "c_kv"
metric = "rel_fro"
bound = 1.0
)");
  EXPECT_EQ(o.rc, 1);
  EXPECT_CONTAINS(o.out, "no rows match");
}

TEST_F(RegressTest, InfersDirectionMinForHigherIsBetterMetrics) {
  // No `direction`: cos_mean and sqnr_db are gated from below (value >= bound), rel_fro from above.
  const char* th = R"(
[[threshold]]
quantizer = "int8-asym-channel-g8"
target = "k_pe"
metric = "cos_mean"
statistic = "min"
bound = 0.99

[[threshold]]
quantizer = "bf16"
target = "k_pe"
metric = "sqnr_db"
statistic = "mean"
bound = 40

[[threshold]]
quantizer = "int8-asym-channel-g8"
target = "c_kv"
metric = "rel_fro"
bound = 0.05
)";
  Outcome o = regress(th);
  EXPECT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_CONTAINS(o.out, "PASS  int8-asym-channel-g8 k_pe /latent_error min(cos_mean)");
  EXPECT_CONTAINS(o.out, ">= 0.99");
  EXPECT_CONTAINS(o.out, "direction min inferred: higher cos_mean is better");
  EXPECT_CONTAINS(o.out, "direction min inferred: higher sqnr_db is better");
  EXPECT_CONTAINS(o.out, "<= 0.05   (3 rows)\n");  // rel_fro: max, nothing said
  EXPECT_CONTAINS(o.out, "gate: 3 of 3 thresholds pass");
  // A bound above every value fails under the inferred "min" (it would pass as "max").
  o = regress("[[threshold]]\nquantizer = \"bf16\"\ntarget = \"k_pe\"\nmetric = \"cos_mean\"\nbound = 2\n");
  EXPECT_EQ(o.rc, 1) << o.out;
  EXPECT_CONTAINS(o.out, "FAIL  bf16 k_pe /latent_error max(cos_mean)");
  EXPECT_CONTAINS(o.out, ">= 2");
  // An explicit direction is kept and nothing is said about it.
  o = regress(
      "[[threshold]]\nquantizer = \"bf16\"\ntarget = \"k_pe\"\nmetric = \"cos_mean\"\nbound = 2\n"
      "direction = \"max\"\n");
  EXPECT_EQ(o.rc, 0) << o.out;
  EXPECT_CONTAINS(o.out, "<= 2");
  EXPECT_EQ(o.out.find("inferred"), std::string::npos) << o.out;
}

TEST_F(CliTest, WarnsAboutCrossLayerWindowsLargerThanTheStudiedLayers) {
  std::string cfg = kConfig;
  const std::string off = "[cross_layer]\nenabled = false\n";
  ASSERT_NE(cfg.find(off), std::string::npos);
  cfg.replace(cfg.find(off), off.size(), "[cross_layer]\nwindows = [2, 7, 4]\n");
  write(config, cfg);
  const Outcome o = cli({"run", config.string()});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_CONTAINS(o.err, "window 7 is larger than the 3 studied layers");
  EXPECT_CONTAINS(o.err, "window 4 is larger than the 3 studied layers");
  EXPECT_EQ(o.err.find("window 2 "), std::string::npos) << o.err;
  size_t n = 0;
  for (size_t p = o.err.find("[cross_layer] windows"); p != std::string::npos;
       p = o.err.find("[cross_layer] windows", p + 1))
    ++n;
  EXPECT_EQ(n, 2u) << o.err;
}

TEST_F(RegressTest, MalformedInputs) {
  Outcome o =
      regress(std::string(kPassing) +
              "[[threshold]]\nquantizer = \"bf16\"\ntarget = \"c_kv\"\nmetric = \"rel_fro\"\nbound = 1\nslack = 2\n");
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "unknown key 'slack'");
  o = regress("[[threshold]]\nquantizer = \"bf16\"\ntarget = \"c_kv\"\nmetric = \"scheme\"\nbound = 1\n");
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "metric 'scheme' is not a numeric column of /latent_error");
  o = regress("[[threshold]]\nquantizer = \"bf16\"\ntarget = \"c_kv\"\nmetric = \"rel_fro\"\n");
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "without 'bound'");
  o = regress("[[threshold]]\nquantizer = \"bf17\"\ntarget = \"c_kv\"\nmetric = \"rel_fro\"\nbound = 1\n");
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "unknown quantizer spec 'bf17'");
  o = regress(
      "[[threshold]]\nquantizer = \"bf16\"\ntarget = \"c_kv\"\nmetric = \"rel_fro\"\nbound = 1\ndirection = \"up\"\n");
  EXPECT_EQ(o.rc, 2);
  o = regress(
      "[[threshold]]\nquantizer = \"bf16\"\ntarget = \"c_kv\"\nmetric = \"rel_fro\"\nbound = 1\nstatistic = \"p99\"\n");
  EXPECT_EQ(o.rc, 2);
  // A results path that is a dump, not a results file.
  const fs::path p = dir / "t.toml";
  write(p, kPassing);
  o = cli({"regress", dump.string(), "--thresholds", p.string()});
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "not a latentq-results/1 file");
  o = cli({"regress", (dir / "missing.h5").string(), "--thresholds", p.string()});
  EXPECT_EQ(o.rc, 2);
  o = cli({"regress", results.string(), "--thresholds", (dir / "missing.toml").string()});
  EXPECT_EQ(o.rc, 2);
  o = cli({"regress", results.string()});
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "--thresholds");
}

}  // namespace
