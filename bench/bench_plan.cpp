// bench/bench_plan.cpp — `latentq plan`'s solver (solve_plan, latentq/plan.h) at DeepSeek-V3 size.
//
// Input: 61 layers × 2 targets (c_kv [T, 512], k_pe [T, 64]) × 70 quantizers: the embedded default
// config's quantizers (study/config/default.toml), cycled with the transforms had and rot up to 70
// distinct names. Costs are the exact stored bytes of each spec on a [T, D] matrix (T = 1024 tokens in 2
// sequences of 512; N(0, 1) with channel 3 scaled by 20), so bytes per token are bytes / T and plan units
// are 1/1024 byte per token, as read_plan_inputs gives them for a study of every layer. Objectives: each
// spec's measured mse × D on that matrix (a transformed one × a factor in [0.5, 1)), times a per-(layer,
// target) scale (log-normal, σ = 1) and a per-option noise (log-normal, σ = 0.3), seeded: a rate-distortion
// table with distinct values everywhere, the hard case for a Pareto frontier.
//   cpu/plan/deepseek-v3/61x2x70   time = one solve_plan at a budget of 1/4 of bf16 (17,568 bytes/token)
//     counters: groups, options (per group), frontier_max (the most Pareto points held for one prefix),
//     frontier_total (back-pointers held), peak_rss_mb (getrusage of the process, setup included).
// Targets (documented, not asserted): ≤ 10 s and ≤ 100 MB peak RSS (/usr/bin/time -v on
//   latentq_bench --benchmark_filter=cpu/plan/).
#include <benchmark/benchmark.h>

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "latentq/config.h"
#include "latentq/plan.h"
#include "latentq/quantize.h"

namespace latentq::bench {
namespace {

constexpr int kLayers = 61, kQuantizers = 70;
constexpr int64_t kTokens = 1024, kCkv = 512, kKpe = 64;

struct PlanFixture {
  std::vector<PlanGroup> groups;
  double budget = 0;
  PlanFixture() {
    std::vector<std::string> names;
    std::vector<QuantSpec> specs;
    std::vector<bool> transformed;
    for (const char* prefix : {"", "had,", "rot,"})
      for (const Quantizer& q : default_config().all_quantizers()) {
        if (q.transform.kind != TransformKind::None || static_cast<int>(names.size()) == kQuantizers) continue;
        names.push_back(prefix + q.name);
        specs.push_back(q.spec);
        transformed.push_back(*prefix != 0);
      }
    std::mt19937_64 rng(2024);
    std::normal_distribution<double> normal;
    const std::vector<int64_t> seq = {0, kTokens / 2, kTokens};
    std::vector<int64_t> cost[2];
    std::vector<double> mse[2];
    for (int t = 0; t < 2; ++t) {
      const int64_t D = t == 0 ? kCkv : kKpe;
      std::vector<float> X(static_cast<size_t>(kTokens * D)), Y(X.size());
      for (size_t i = 0; i < X.size(); ++i) X[i] = static_cast<float>(normal(rng)) * (i % D == 3 ? 20.0f : 1.0f);
      for (size_t k = 0; k < specs.size(); ++k) {
        const QuantizedTensor q =
            quantize_dequantize(specs[k], t == 0 ? Target::CKV : Target::KPE, X.data(), kTokens, D, seq, Y.data());
        double e = 0;
        for (size_t i = 0; i < X.size(); ++i)
          e += (static_cast<double>(Y[i]) - X[i]) * (static_cast<double>(Y[i]) - X[i]);
        cost[t].push_back(q.storage_bytes());
        const double gain = transformed[k] ? 0.5 + 0.5 * std::generate_canonical<double, 53>(rng) : 1.0;
        mse[t].push_back(e / static_cast<double>(kTokens) * gain);
      }
    }
    for (int l = 0; l < kLayers; ++l)
      for (int t = 0; t < 2; ++t) {
        PlanGroup g{l, t == 0 ? Target::CKV : Target::KPE, {}};
        const double scale = std::exp(normal(rng));
        for (size_t k = 0; k < names.size(); ++k)
          g.options.push_back({names[k], cost[t][k], mse[t][k] * scale * std::exp(0.3 * normal(rng))});
        groups.push_back(std::move(g));
      }
    budget = static_cast<double>(kLayers * (kCkv + kKpe) * 2) / 4;
  }
};

void bm_plan(benchmark::State& st) {
  static const PlanFixture f;
  PlanSolution s;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    s = solve_plan(f.groups, f.budget, kTokens);
    st.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    benchmark::DoNotOptimize(s.objective);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  st.counters["groups"] = static_cast<double>(f.groups.size());
  st.counters["options"] = static_cast<double>(f.groups.front().options.size());
  st.counters["frontier_max"] = static_cast<double>(s.frontier_max);
  st.counters["frontier_total"] = static_cast<double>(s.frontier_total);
  st.counters["bytes"] = s.bytes;
  st.counters["peak_rss_mb"] = static_cast<double>(ru.ru_maxrss) / 1024.0;
}

}  // namespace

void register_plan_benchmarks(const Options&) {
  benchmark::RegisterBenchmark("cpu/plan/deepseek-v3/61x2x70", bm_plan)
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kSecond);
}

}  // namespace latentq::bench
