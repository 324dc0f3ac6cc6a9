// bench/bench_study.cpp — the stages of the default study at DeepSeek-V2-Lite shape, through the one
// execution path `latentq run` uses (plan_study()'s tasks, their LayerStore reads, their compute()).
//
// Input: a `latentq synth --preset deepseek-v2-lite` dump of 2 layers × 4 sequences × 2048 tokens with
// 256 query rows (the V2-Lite study shape: 16 heads, kv_lora_rank 512, qk_rope_head_dim 64),
// written once into a temporary directory (removed at exit), planned with the embedded default config
// (study/config/default.toml). A row times every task of one group that reads layer 1 alone (or layers
// {0, 1} for the cross-layer groups), one after the other on one thread, with the layer(s) read from
// the file before the timing and held for the stage. The values a layer's cells share (the SVD basis,
// the reference attention, bf16(c_kv)'s partial scores, a quantizer's three attention targets) are
// computed inside the timing by the first cell that needs them, as in a run; each row pays for the
// shared values it uses (a run computes the reference attention once per layer for the three
// attention rows, so their sum counts it up to three times):
//   cpu/study_stage/<group>/v2lite   time = one layer's (or pair's) cells of <group>
//     counters: cells (how many tasks that is), s_per_cell, study_s = time × 27 layers (× 26 adjacent
//     pairs / windows for cross_layer and cross_layer_sharing: pairs = "auto" is "adjacent" above 16
//     layers), the stage's single-threaded share of a 27-layer V2-Lite default study without e2e.
// The sum of study_s over the rows is that study on one thread (an upper bound: a run computes a value
// shared across groups once per layer, a row for each group); `latentq run --threads 2` divides the cell
// work between two threads.
//   cpu/study_layer/latent_svd_cross_layer/v2lite   the latent, SVD and cross-layer stages in one hold, with
//     what they share across groups computed once per layer, as in a run; counters latent_s, svd_s,
//     cross_layer_s, sharing_s (one layer, pair or window) and study_s (those stages of the 27-layer study).
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "latentq/batch_study.h"
#include "latentq/config.h"
#include "latentq/layer_store.h"
#include "latentq/study.h"
#include "latentq/synth.h"

namespace latentq::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int64_t kStudyLayers = 27;  // DeepSeek-V2-Lite's num_hidden_layers

struct StudyFixture {
  fs::path dir;
  std::unique_ptr<LatentBackend> backend = make_cpu_backend();
  StudyPlan plan;
  StudyFixture() {
    dir = fs::temp_directory_path() / ("latentq-bench-study-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    SynthOptions o;
    o.shape = find_preset("deepseek-v2-lite");
    o.shape.num_layers = 2;
    o.seqs = 4;
    o.seq_len = 2048;
    o.query_rows = 256;
    write_synth_dump(dir / "v2lite.h5", o);
    StudyConfig cfg = default_config();
    cfg.dump = dir / "v2lite.h5";
    plan = plan_study(cfg, *backend);
  }
  ~StudyFixture() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

StudyFixture& fixture() {
  static StudyFixture f;
  return f;
}

// The tasks of `group` (their first group) that read exactly `layers`.
std::vector<const CellTask*> stage_tasks(const StudyPlan& p, const std::string& group, const std::vector<int>& layers) {
  std::vector<const CellTask*> out;
  for (size_t i = 0; i < p.tasks.size(); ++i)
    if (p.tasks[i].groups.front() == group && p.uses[i].layers == layers) out.push_back(&p.tasks[i]);
  return out;
}

void bm_stage(benchmark::State& st, std::string group, std::vector<int> layers, double multiplier) {
  const OneThread one;
  StudyFixture& f = fixture();
  const std::vector<const CellTask*> tasks = stage_tasks(f.plan, group, layers);
  if (tasks.empty()) {
    st.SkipWithError(("the default study has no " + group + " cell on these layers").c_str());
    return;
  }
  bool attention = false;
  for (size_t i = 0; i < f.plan.tasks.size(); ++i)
    if (f.plan.tasks[i].groups.front() == group) attention = attention || f.plan.uses[i].attention;
  double total = 0;
  for (auto _ : st) {
    // Held open for the stage: the layers are read once (outside the timing) and the values the
    // stage's cells share are computed by the first cell that needs them, as in a run; closing the
    // hold drops them, so every iteration and every row pays for its own.
    const std::unique_ptr<LayerAccess> hold = f.plan.store->open(LayerUse{layers, attention});
    const auto t0 = Clock::now();
    for (const CellTask* t : tasks) benchmark::DoNotOptimize(t->compute());
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    st.SetIterationTime(sec);
    total += sec;
  }
  const double per = total / static_cast<double>(st.iterations());
  st.counters["cells"] = static_cast<double>(tasks.size());
  st.counters["s_per_cell"] = per / static_cast<double>(tasks.size());
  st.counters["study_s"] = per * multiplier;
}

// The latent, SVD and cross-layer stages as a run computes them: one hold of layers {0, 1}, so the
// values a layer's cells share across these groups (its SVD fit: the SVD probe and both windows that
// contain the layer) are computed once per layer. Timed in turn: layer 1's latent cells, the SVD cells
// of layers 0 and 1 (each fits its layer once), the pair and the window (0, 1), which reuse both fits.
//   study_s = 27 × (latent + mean SVD cell) + 26 × (pair + window): these stages of the 27-layer study.
void bm_layer_stages(benchmark::State& st) {
  const OneThread one;
  StudyFixture& f = fixture();
  const std::vector<const CellTask*> latent = stage_tasks(f.plan, "latent_error", {1}),
                                     svd0 = stage_tasks(f.plan, "svd", {0}), svd1 = stage_tasks(f.plan, "svd", {1}),
                                     pair = stage_tasks(f.plan, "cross_layer", {0, 1}),
                                     window = stage_tasks(f.plan, "cross_layer_sharing", {0, 1});
  if (latent.empty() || svd0.empty() || svd1.empty() || pair.empty() || window.empty()) {
    st.SkipWithError("the default study lacks a latent, svd or cross-layer cell on layers 0 and 1");
    return;
  }
  double t_latent = 0, t_svd = 0, t_pair = 0, t_window = 0;
  for (auto _ : st) {
    const std::unique_ptr<LayerAccess> hold = f.plan.store->open(LayerUse{{0, 1}, false});
    auto timed = [](const std::vector<const CellTask*>& tasks) {
      const auto t0 = Clock::now();
      for (const CellTask* t : tasks) benchmark::DoNotOptimize(t->compute());
      return std::chrono::duration<double>(Clock::now() - t0).count();
    };
    const double a = timed(latent), b = timed(svd0) + timed(svd1), c = timed(pair), d = timed(window);
    st.SetIterationTime(a + b + c + d);
    t_latent += a;
    t_svd += b / 2;
    t_pair += c;
    t_window += d;
  }
  const double n = static_cast<double>(st.iterations());
  const double L = static_cast<double>(kStudyLayers), P = static_cast<double>(kStudyLayers - 1);
  st.counters["latent_s"] = t_latent / n;
  st.counters["svd_s"] = t_svd / n;
  st.counters["cross_layer_s"] = t_pair / n;
  st.counters["sharing_s"] = t_window / n;
  st.counters["study_s"] = (L * (t_latent + t_svd) + P * (t_pair + t_window)) / n;
}

}  // namespace

void register_study_benchmarks(const Options&) {
  const std::vector<int> one = {1}, pair = {0, 1};
  const double L = static_cast<double>(kStudyLayers), P = static_cast<double>(kStudyLayers - 1);
  const std::vector<std::tuple<std::string, std::vector<int>, double>> stages = {
      {"latent_error", one, L},      {"svd", one, L},
      {"cross_layer", pair, P},      {"cross_layer_sharing", pair, P},
      {"attention_check", one, L},   {"attention_error", one, L},
      {"attention_position", one, L}};
  for (const auto& [g, layers, m] : stages)
    benchmark::RegisterBenchmark(("cpu/study_stage/" + g + "/v2lite").c_str(), bm_stage, g, layers, m)
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("cpu/study_layer/latent_svd_cross_layer/v2lite", bm_layer_stages)
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kSecond);
}

}  // namespace latentq::bench
