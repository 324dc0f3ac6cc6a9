// `latentq plan` and mixed assignments: the exact multiple-choice knapsack on hand-built tables and
// against brute force; [[mixed]] configs; the plan written, rerun and reproducing its bytes per token.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "cli_capture.h"
#include "latentq/plan.h"
#include "latentq/results.h"
#include "latentq/study.h"
#include "synth_dump.h"

namespace {
using namespace latentq;
namespace fs = std::filesystem;
using lqtest::cli;

PlanGroup group(int layer, Target t, std::vector<PlanOption> o) { return {layer, t, std::move(o)}; }

// Two groups, options (bytes, objective): A (10, 5 | 4), B (20, 1 | 2), C (30, 0.5 | 0).
std::vector<PlanGroup> hand_table() {
  return {group(0, Target::CKV, {{"A", 10, 5}, {"B", 20, 1}, {"C", 30, 0.5}}),
          group(0, Target::KPE, {{"A", 10, 4}, {"B", 20, 2}, {"C", 30, 0}})};
}

TEST(Plan, HandBuiltOptimum) {
  const auto g = hand_table();
  struct Case {
    double budget;
    size_t c0, c1;
    double objective, bytes;
  };
  // 20: only (A, A) = 9. 40: (A,C) 5, (B,B) 3, (C,A) 4.5 -> (B, B). 45: still (B, B). 50: (B,C) 1 vs
  // (C,B) 2.5 -> (B, C). 60: (C, C) 0.5.
  for (const Case& c : {Case{20, 0, 0, 9, 20}, Case{40, 1, 1, 3, 40}, Case{45, 1, 1, 3, 40}, Case{50, 1, 2, 1, 50},
                        Case{60, 2, 2, 0.5, 60}}) {
    SCOPED_TRACE(c.budget);
    const PlanSolution s = solve_plan(g, c.budget);
    EXPECT_EQ(s.choice, (std::vector<size_t>{c.c0, c.c1}));
    EXPECT_DOUBLE_EQ(s.objective, c.objective);
    EXPECT_DOUBLE_EQ(s.bytes, c.bytes);
  }
}

TEST(Plan, BudgetBelowTheCheapestNamesTheMinimum) {
  try {
    solve_plan(hand_table(), 19.5);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "budget 19.5 bytes/token is below the cheapest assignment (20.0000 bytes/token");
  }
  EXPECT_THROW(solve_plan({}, 100), std::invalid_argument);
  EXPECT_THROW(solve_plan({group(0, Target::CKV, {})}, 100), std::invalid_argument);
  EXPECT_THROW(solve_plan({group(0, Target::CKV, {{"A", -1, 0}})}, 100), std::invalid_argument);
  EXPECT_THROW(solve_plan({group(0, Target::CKV, {{"A", 1, std::nan("")}})}, 100), std::invalid_argument);
}

TEST(Plan, MatchesBruteForce) {
  // Costs on the 1/64-byte grid, so rounding up changes nothing and DP = exhaustive search.
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int G = 1 + static_cast<int>(rng() % 4);
    std::vector<PlanGroup> gs;
    for (int g = 0; g < G; ++g) {
      PlanGroup p{g, Target::CKV, {}};
      const int n = 1 + static_cast<int>(rng() % 4);
      for (int o = 0; o < n; ++o)
        p.options.push_back({"q" + std::to_string(o), static_cast<double>(rng() % 2000) / 64.0,
                             static_cast<double>(rng() % 1000) / 7.0});
      gs.push_back(p);
    }
    const double budget = static_cast<double>(rng() % (G * 2000)) / 64.0;
    double best = INFINITY;
    std::vector<size_t> idx(static_cast<size_t>(G), 0);
    double min_bytes = 0;
    for (const PlanGroup& p : gs) {
      double m = INFINITY;
      for (const PlanOption& o : p.options) m = std::min(m, o.bytes);
      min_bytes += m;
    }
    while (true) {
      double b = 0, v = 0;
      for (int g = 0; g < G; ++g) {
        b += gs[static_cast<size_t>(g)].options[idx[static_cast<size_t>(g)]].bytes;
        v += gs[static_cast<size_t>(g)].options[idx[static_cast<size_t>(g)]].objective;
      }
      if (b <= budget) best = std::min(best, v);
      int g = 0;
      while (g < G && ++idx[static_cast<size_t>(g)] == gs[static_cast<size_t>(g)].options.size()) idx[static_cast<size_t>(g++)] = 0;
      if (g == G) break;
    }
    SCOPED_TRACE(trial);
    if (budget < min_bytes) {
      EXPECT_THROW(solve_plan(gs, budget), std::invalid_argument);
      continue;
    }
    const PlanSolution s = solve_plan(gs, budget);
    EXPECT_NEAR(s.objective, best, 1e-9);
    EXPECT_LE(s.bytes, budget);
  }
}

const char* kMixed = R"(
[quantizers]
extra = ["bf16", "int8-asym-channel-g32", "int4-asym-channel-g32"]
[[mixed]]
layers = [0]
c_kv = "int8-asym-channel-g32"
k_pe = "bf16"
[[mixed]]
layers = [1, 2]
c_kv = "int4-asym-channel-g32"
k_pe = "int8-asym-channel-g32"
)";

struct MixedTest : ::testing::Test {
  lqtest::TempDir dir;
  fs::path dump_path = dir / "dump.h5";
  void SetUp() override { lqtest::write_synth(dump_path, lqtest::make_synth()); }
};

TEST_F(MixedTest, ConfigRowsAreTheAssignedSpecs) {
  const StudyConfig c = parse_config(kMixed, "mixed.toml", dir.path());
  ASSERT_EQ(c.targets.size(), 2u);
  const Quantizer& m = c.targets[0].quantizers.back();
  EXPECT_EQ(m.name, "mixed");
  EXPECT_EQ(m.spec_for(0, Target::CKV).to_string(), "int8-asym-channel-g32");
  EXPECT_EQ(m.spec_for(2, Target::KPE).to_string(), "int8-asym-channel-g32");
  EXPECT_EQ(m.spec_for(0, Target::KPE).to_string(), "bf16");
  try {
    m.spec_for(3, Target::CKV);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "mixed assignment 'mixed' assigns no spec to layer 3 c_kv");
  }
  LoadOptions o;
  o.attention = false;
  const Dump d = load_dump(dump_path, o);
  auto backend = make_cpu_backend();
  const ColumnTable t = run_latent_error(d, plan_cells(c, d), *backend);
  const auto& q = t.get<std::string>("quantizer");
  const auto& l = t.get<int64_t>("layer");
  const auto& tg = t.get<std::string>("target");
  const auto& rf = t.get<double>("rel_fro");
  const auto& bpt = t.get<double>("bytes_per_token_layer");
  auto row = [&](int64_t layer, const std::string& target, const std::string& quant) {
    for (size_t i = 0; i < q.size(); ++i)
      if (l[i] == layer && tg[i] == target && q[i] == quant) return i;
    ADD_FAILURE() << layer << " " << target << " " << quant;
    return size_t{0};
  };
  for (auto [layer, target, spec] : std::vector<std::tuple<int64_t, std::string, std::string>>{
           {0, "c_kv", "int8-asym-channel-g32"}, {0, "k_pe", "bf16"}, {1, "c_kv", "int4-asym-channel-g32"},
           {2, "k_pe", "int8-asym-channel-g32"}}) {
    EXPECT_EQ(rf[row(layer, target, "mixed")], rf[row(layer, target, spec)]);
    EXPECT_EQ(bpt[row(layer, target, "mixed")], bpt[row(layer, target, spec)]);
  }
  // The summary row counts what each layer stores: bytes = Σ over layers and targets (3 layers studied of 3).
  const ColumnTable s = summarize(t, c.all_quantizers(), d.attrs);
  const auto& sq = s.get<std::string>("quantizer");
  const auto& sb = s.get<double>("bytes_per_token_model");
  double expect = 0;
  for (size_t i = 0; i < q.size(); ++i)
    if (q[i] == "mixed") expect += bpt[i];
  for (size_t i = 0; i < sq.size(); ++i)
    if (sq[i] == "mixed") EXPECT_NEAR(sb[i], expect, 1e-9);
}

TEST_F(MixedTest, ConfigErrors) {
  auto err = [&](const std::string& text) {
    try {
      parse_config(text, "m.toml", dir.path());
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_CONTAINS(err("[[mixed]]\nname = \"bf16\"\nc_kv = \"bf16\"\nk_pe = \"bf16\"\n"), "needs a name that is not a spec");
  EXPECT_CONTAINS(err("[[mixed]]\nlayers = [0]\nc_kv = \"bf16\"\nk_pe = \"bf16\"\n[[mixed]]\nlayers = [0, 1]\nc_kv = \"bf16\"\n"),
                  "m.toml:7:8: mixed assignment 'mixed' assigns c_kv of a layer twice");
  EXPECT_CONTAINS(err("[[mixed]]\nc_kv = \"bf16\"\n"), "assigns nothing to k_pe");
  EXPECT_CONTAINS(err("[input]\ntargets = [\"c_kv\"]\n[[mixed]]\nc_kv = \"bf16\"\nk_pe = \"bf16\"\n"),
                  "'mixed.k_pe' is given but 'k_pe' is not in input.targets");
  EXPECT_CONTAINS(err("[[mixed]]\nc_kv = \"int5\"\nk_pe = \"bf16\"\n"), "m.toml:2:8");
  EXPECT_CONTAINS(err("[[mixed]]\nc_kv = \"bf16\"\nk_pe = \"bf16\"\nbits = 4\n"), "unknown key 'mixed.bits'");
  // Layers not covered: an error when the cells are planned (the layers are known then).
  const StudyConfig c = parse_config("[[mixed]]\nlayers = [0, 1]\nc_kv = \"bf16\"\nk_pe = \"bf16\"\n", "m.toml", dir.path());
  LoadOptions o;
  o.attention = false;
  const Dump d = load_dump(dump_path, o);
  EXPECT_THROW(plan_cells(c, d), std::invalid_argument);
}

// A [[mixed]] rule's "<transform>,<spec>" is run behind its transform: the mixed rows of /latent_error
// and /attention_error equal those of the transformed quantizer on the layers it covers (the rule used
// to keep the spec and drop the transform).
TEST_F(MixedTest, RuleCarriesATransform) {
  const fs::path cfg = dir / "study.toml", res = dir / "res.h5";
  std::ofstream(cfg) << "[input]\ndump = \"dump.h5\"\n[quantizers]\nbits = [4]\nschemes = [\"asym\"]\n"
                        "granularities = [\"token\"]\ngroup_sizes = [0]\n"
                        "extra = [\"had8,int4-asym-token\", \"int8-asym-token\"]\n"
                        "[cross_layer]\nenabled = false\n[svd]\nenabled = false\n"
                        "[[mixed]]\nlayers = [0, 1]\nc_kv = \"had8,int4-asym-token\"\n"
                        "[[mixed]]\nlayers = [2]\nc_kv = \"int4-asym-token\"\n"
                        "[[mixed]]\nk_pe = \"int8-asym-token\"\n";
  const StudyConfig c = load_config(cfg);
  const Quantizer& m = c.targets[0].quantizers.back();
  ASSERT_EQ(m.name, "mixed");
  EXPECT_EQ(m.transform_for(0, Target::CKV).to_string(), "had8");
  EXPECT_EQ(m.transform_for(2, Target::CKV).to_string(), "");
  EXPECT_EQ(m.transform_for(1, Target::KPE).to_string(), "");
  const lqtest::Outcome o = cli({"run", cfg.string(), "--out", res.string(), "--threads", "2"});
  ASSERT_EQ(o.rc, 0) << o.err;
  const ColumnTable le = read_table(res, "latent_error");
  const auto& q = le.get<std::string>("quantizer");
  const auto& l = le.get<int64_t>("layer");
  const auto& tg = le.get<std::string>("target");
  const auto& rf = le.get<double>("rel_fro");
  const auto& tr = le.get<std::string>("transform");
  auto row = [&](int64_t layer, const std::string& target, const std::string& quant) {
    for (size_t i = 0; i < q.size(); ++i)
      if (l[i] == layer && tg[i] == target && q[i] == quant) return i;
    ADD_FAILURE() << layer << " " << target << " " << quant;
    return size_t{0};
  };
  for (auto [layer, target, spec] : std::vector<std::tuple<int64_t, std::string, std::string>>{
           {0, "c_kv", "had8,int4-asym-token"}, {1, "c_kv", "had8,int4-asym-token"}, {2, "c_kv", "int4-asym-token"},
           {0, "k_pe", "int8-asym-token"}, {2, "k_pe", "int8-asym-token"}}) {
    SCOPED_TRACE(fmt::format("{} {} {}", layer, target, spec));
    EXPECT_EQ(rf[row(layer, target, "mixed")], rf[row(layer, target, spec)]);
    EXPECT_EQ(tr[row(layer, target, "mixed")], tr[row(layer, target, spec)]);
  }
  EXPECT_NE(rf[row(0, "c_kv", "had8,int4-asym-token")], rf[row(0, "c_kv", "int4-asym-token")]);
  const ColumnTable ae = read_table(res, "attention_error");
  const auto& aq = ae.get<std::string>("quantizer");
  const auto& al = ae.get<int64_t>("layer");
  const auto& at = ae.get<std::string>("targets");
  const auto& kl = ae.get<double>("kl_mean");
  auto att = [&](int64_t layer, const std::string& targets, const std::string& quant) {
    for (size_t i = 0; i < aq.size(); ++i)
      if (al[i] == layer && at[i] == targets && aq[i] == quant) return kl[i];
    ADD_FAILURE() << layer << " " << targets << " " << quant;
    return 0.0;
  };
  EXPECT_EQ(att(0, "c_kv", "mixed"), att(0, "c_kv", "had8,int4-asym-token"));
  EXPECT_EQ(att(2, "c_kv", "mixed"), att(2, "c_kv", "int4-asym-token"));
  EXPECT_EQ(att(1, "k_pe", "mixed"), att(1, "k_pe", "int8-asym-token"));
}

TEST_F(MixedTest, PlanRoundTrips) {
  const fs::path cfg = dir / "study.toml";
  {
    std::ofstream f(cfg);
    f << "[input]\ndump = \"dump.h5\"\n[quantizers]\nbits = [8, 4, 2]\nschemes = [\"asym\"]\n"
         "granularities = [\"channel\"]\ngroup_sizes = [16]\nextra = [\"bf16\"]\n[cross_layer]\nenabled = false\n";
  }
  const fs::path res = dir / "res.h5", plan = dir / "plan.toml", res2 = dir / "res2.h5";
  lqtest::Outcome o = cli({"run", cfg.string(), "--out", res.string(), "--threads", "2"});
  ASSERT_EQ(o.rc, 0) << o.err;
  // Too small: exit 2 naming the minimum, nothing written.
  o = cli({"plan", res.string(), "--budget", "10", "--out", plan.string()});
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "budget 10 bytes/token is below the cheapest assignment");
  EXPECT_FALSE(fs::exists(plan));
  for (const std::string objective : {"kl", "mse"}) {
    SCOPED_TRACE(objective);
    o = cli({"plan", res.string(), "--budget", "100", "--objective", objective, "--out", plan.string()});
    ASSERT_EQ(o.rc, 0) << o.err;
    EXPECT_CONTAINS(o.out, "best uniform quantizer within the budget");
    const PlanInputs in = read_plan_inputs(res, objective);
    const PlanSolution s = solve_plan(in.groups, 100);
    EXPECT_LE(s.bytes, 100);
    o = cli({"run", plan.string(), "--out", res2.string(), "--threads", "2", "--no-e2e"});
    ASSERT_EQ(o.rc, 0) << o.err;
    const ColumnTable sum = read_table(res2, "summary");
    const auto& q = sum.get<std::string>("quantizer");
    const auto& b = sum.get<double>("bytes_per_token_model");
    bool found = false;
    for (size_t i = 0; i < q.size(); ++i)
      if (q[i] == "mixed") {
        found = true;
        EXPECT_NEAR(b[i], s.bytes, 1e-9 * s.bytes);
      }
    EXPECT_TRUE(found);
    // The mixed rows of the rerun measure what the plan predicted (the same cells, the same numbers).
    const ColumnTable le = read_table(res2, "latent_error");
    const auto& lq = le.get<std::string>("quantizer");
    const auto& ls = le.get<std::string>("stored");
    size_t k = 0;
    for (size_t i = 0; i < lq.size(); ++i)
      if (lq[i] == "mixed") {
        ASSERT_LT(k, in.groups.size());
        EXPECT_EQ(ls[i], in.groups[k].options[s.choice[k]].quantizer);
        ++k;
      }
    EXPECT_EQ(k, in.groups.size());
  }
}

}  // namespace
