// Shared set-up of the probe-study tests (test_probe_study.cpp, test_probe_cli.cpp): a synthetic dump, its
// config and layer store, a scoped environment variable.
#pragma once

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>

#include "latentq/batch.h"
#include "latentq/batch_study.h"
#include "latentq/cli.h"
#include "latentq/external.h"
#include "latentq/probe_attention.h"
#include "latentq/probe_study.h"
#include "latentq/attention/attention.h"
#include "latentq/analysis/svd_probe.h"
#include "latentq/results.h"
#include "cli_capture.h"
#include "synth_dump.h"

namespace {
using namespace latentq;
using lqtest::cli;
using lqtest::Outcome;
using lqtest::TempDir;
namespace fs = std::filesystem;

inline size_t count_of(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

// Sets an environment variable for the scope of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v, had_ = true;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

const char* kConfig = R"(
[quantizers]
bits = [4]
schemes = ["asym"]
granularities = ["channel", "token"]
group_sizes = [32]
extra = ["bf16"]
[targets.k_pe]
quantizers = ["int4-asym-channel-g32", "int8-sym-token"]
)";

// The header of the config's dump, as plan_study() reads it (no layer values).
inline Dump header_of(const StudyConfig& config) {
  LoadOptions lo;
  lo.layers = config.layers;
  lo.data = false;
  return load_dump(config.dump, lo);
}

struct ProbeTest : ::testing::Test {
  TempDir dir;
  fs::path path = dir / "dump.h5";
  Dump dump;  // the header
  StudyConfig config;
  std::shared_ptr<LayerStore> store;  // its layers, read when a cell opens them
  void make(const lqtest::SynthSpec& spec, const std::string& extra_config = "", const char* base = kConfig) {
    lqtest::write_synth(path, lqtest::make_synth(spec));
    config = parse_config(std::string(base) + extra_config, "probe.toml", dir.path());
    config.dump = path;
    reload();
  }
  void reload() {
    dump = header_of(config);
    store = std::make_shared<LayerStore>(dump);
  }
  // One planned cell, run as the batch tasks run it (run_probe_cell on the layers it opens).
  std::vector<ColumnTable> run(const std::string& key) {
    const ProbePlan plan = plan_probes(config, dump);
    const ProbeCell& c = plan.cell(key);
    const std::unique_ptr<LayerAccess> in = store->open({c.layers, c.attention});
    return run_probe_cell(config, c, *in);
  }
  void SetUp() override { make({}); }
};

}  // namespace
