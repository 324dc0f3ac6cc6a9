// The decision summary (latentq/decision.h): budgets parsed by hand, and on a real study of a synthetic dump
// the rows checked against the tables they come from (recomputed here from /summary and /attention_error), a
// plan that the study then runs reported as measured, the planner's runs of /plan_runs (latentq/plan_runs.h)
// measured end to end, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "latentq/decision.h"
#include "latentq/results.h"
#include "latentq/spec.h"
#include "cli_capture.h"
#include "synth_dump.h"

namespace {
using namespace latentq;
using lqtest::cli;
using lqtest::Outcome;
namespace fs = std::filesystem;

TEST(Decision, BudgetFractions) {
  EXPECT_EQ(parse_budget_fractions("1/16,1/8,0.25,3/8,1"), (std::vector<double>{0.0625, 0.125, 0.25, 0.375, 1.0}));
  EXPECT_EQ(default_budget_fractions(), (std::vector<double>{1.0 / 16, 1.0 / 8, 1.0 / 4, 3.0 / 8, 1.0 / 2}));
  for (const char* bad : {"0", "2", "1/0", "abc", "1/8,", "-1/8", "1/8x", ""}) {
    SCOPED_TRACE(bad);
    try {
      parse_budget_fractions(bad);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("expected a fraction of the bf16 cache in (0, 1]"), std::string::npos)
          << e.what();
    }
  }
}

struct DecisionTest : ::testing::Test {
  lqtest::TempDir dir;
  fs::path dump = dir / "dump.h5", config = dir / "study.toml", results = dir / "results.h5";
  void SetUp() override {
    lqtest::write_synth(dump, lqtest::make_synth());  // 3 layers, kv_lora_rank 16, qk_rope_head_dim 8
    std::ofstream(config) << "[input]\ndump = \"dump.h5\"\n[quantizers]\nbits = [8, 4, 2]\n"
                             "schemes = [\"asym\"]\ngranularities = [\"token\", \"channel\"]\ngroup_sizes = [0, 8]\n"
                             "extra = [\"bf16\", \"fp8-e4m3-tensor\", \"fp8-e4m3-tensor-s1\", \"nvfp4\", \"had8,int4-asym-token\"]\n"
                             "[svd]\nenabled = false\n[cross_layer]\nenabled = false\n[attention]\nenabled = true\n";
  }
};

// Mean over layers of the c_kv+k_pe attention KL per quantizer, and /summary's bytes.
std::map<std::string, double> attention_kl(const fs::path& results) {
  const ColumnTable a = read_table(results, "attention_error");
  std::map<std::string, std::pair<double, int>> acc;
  for (size_t i = 0; i < a.num_rows(); ++i)
    if (a.get<std::string>("targets")[i] == "c_kv+k_pe") {
      auto& [s, n] = acc[a.get<std::string>("quantizer")[i]];
      s += a.get<double>("kl_mean")[i];
      ++n;
    }
  std::map<std::string, double> out;
  for (const auto& [q, sn] : acc) out[q] = sn.first / sn.second;
  return out;
}

TEST_F(DecisionTest, RowsComeFromTheTablesAndARunPlanIsMeasured) {
  const Outcome o = cli({"run", config.string(), "--out", results.string(), "--threads", "2", "--budgets", "1/4,3/4"});
  ASSERT_EQ(o.rc, 0) << o.err;
  // bf16 = 3 layers x (16 + 8) x 2 = 144 B/token
  EXPECT_CONTAINS(o.out,
                  "decision (bytes: whole model, c_kv + k_pe, metadata included, per token):\nat 36 B/token "
                  "(1/4 of bf16):\n");
  EXPECT_CONTAINS(o.out, "at 108 B/token (3/4 of bf16):");
  const ColumnTable d = read_table(results, "decision");
  ASSERT_EQ(d.num_rows(), 6u);
  const std::map<std::string, double> kl = attention_kl(results);
  const ColumnTable s = read_table(results, "summary");
  // the engine formats: those the format table says an engine ships (latentq/spec.h), unrotated
  const auto ships = [](const std::string& n) {
    try {
      return is_engine_format(QuantSpec::parse(n));
    } catch (const std::invalid_argument&) {
      return false;  // a transformed spec or a mixed assignment
    }
  };
  int found = 0;
  for (size_t i = 0; i < 6; ++i) {
    const double budget = d.get<double>("budget_bytes")[i];
    const std::string choice = d.get<std::string>("choice")[i], q = d.get<std::string>("quantizer")[i];
    SCOPED_TRACE(choice + " at " + std::to_string(budget));
    EXPECT_EQ(budget, i < 3 ? 36.0 : 108.0);
    EXPECT_EQ(d.get<std::string>("choice")[i], (std::vector<std::string>{"uniform", "engine", "plan"})[i % 3]);
    if (choice == "plan") {
      EXPECT_EQ(d.get<std::string>("source")[i], "predicted");
      EXPECT_LE(d.get<double>("bytes_per_token_model")[i], budget);
      EXPECT_TRUE(std::isnan(d.get<double>("kl_mean")[i]));
      continue;
    }
    // the argmin of the mean attention KL over the /summary rows within the budget (engine: the engine formats)
    std::string best;
    for (size_t r = 0; r < s.num_rows(); ++r) {
      const std::string& n = s.get<std::string>("quantizer")[r];
      if (s.get<double>("bytes_per_token_model")[r] > budget || !kl.count(n)) continue;
      if (choice == "engine" && !ships(n)) continue;
      if (best.empty() || kl.at(n) < kl.at(best)) best = n;
    }
    // fp8-e4m3-tensor[-s1] is (16 + 8) codes per layer and token plus an f32 scale per layer and target over the
    // dump's 64 tokens: 3 x 24 + 3 x 2 x 4 / 64 = 72.375 B/token, so no engine format fits 36 and one fits 108
    if (choice == "engine" && budget == 108.0) {
      EXPECT_EQ(q.rfind("fp8-e4m3-tensor", 0), 0u) << q;
    }
    if (best.empty()) {
      EXPECT_EQ(choice + " " + q + " " + d.get<std::string>("source")[i], "engine - none");
      continue;
    }
    ++found;
    EXPECT_EQ(q, best);
    EXPECT_EQ(d.get<std::string>("engine")[i], engine_of(QuantSpec::parse(q)));
    if (choice == "engine") {
      EXPECT_CONTAINS(o.out, "engine   " + q + " [" + engine_of(QuantSpec::parse(q)) + "]");
    }
    EXPECT_EQ(d.get<std::string>("source")[i], "attention");
    EXPECT_DOUBLE_EQ(d.get<double>("kl_mean")[i], kl.at(best));
    EXPECT_TRUE(std::isnan(d.get<double>("delta_ppl")[i]));  // no e2e step in this study
  }
  EXPECT_EQ(found, 3);  // uniform at 1/4 and 3/4, engine at 3/4
  // The plan at 3/4 run by the same study (its [[mixed]] rules added to the config): the decision reports it
  // measured, with the mixed row's KL.
  const fs::path plan = dir / "plan.toml", planned = dir / "planned.h5", with_plan = dir / "with_plan.toml";
  ASSERT_EQ(cli({"plan", results.string(), "--budget", "108", "--out", plan.string()}).rc, 0);
  std::ostringstream text;
  text << std::ifstream(plan).rdbuf();
  const std::string p = text.str();
  const size_t from = p.find("[[mixed]]");  // the rules are the last tables of the plan config
  ASSERT_NE(from, std::string::npos) << p;
  const size_t to = p.size();
  std::ostringstream base;
  base << std::ifstream(config).rdbuf();
  std::ofstream(with_plan) << base.str() << "\n" << p.substr(from, to - from);
  const Outcome run_plan =
      cli({"run", with_plan.string(), "--out", planned.string(), "--threads", "2", "--budgets", "3/4"});
  ASSERT_EQ(run_plan.rc, 0) << run_plan.err;
  const ColumnTable m = read_table(planned, "decision");
  ASSERT_EQ(m.num_rows(), 3u);
  EXPECT_EQ(m.get<std::string>("source")[2], "measured-attention");
  EXPECT_DOUBLE_EQ(m.get<double>("kl_mean")[2], attention_kl(planned).at("mixed"));
  EXPECT_EQ(m.get<std::string>("quantizer")[2], d.get<std::string>("quantizer")[5]);
  // `decide` recomputes it; a shard or an incomplete run is refused
  const Outcome again = cli({"decide", planned.string(), "--budgets", "3/4"});
  ASSERT_EQ(again.rc, 0) << again.err;
  EXPECT_CONTAINS(again.out, "measured-attention");
  const Outcome bad = cli({"decide", planned.string(), "--budgets", "3/2"});
  EXPECT_EQ(bad.rc, 2);
  EXPECT_CONTAINS(bad.err, "budget '3/2': expected a fraction of the bf16 cache in (0, 1]");
  const fs::path shard = dir / "shard.h5";
  ASSERT_EQ(cli({"run", config.string(), "--out", shard.string(), "--shard", "0/2"}).rc, 0);
  const Outcome sh = cli({"decide", shard.string()});
  EXPECT_EQ(sh.rc, 2);
  EXPECT_CONTAINS(sh.err, "a decision over a subset of the cells is meaningless");
}


// The planner's assignment at a budget, stored by `run` as /plan_runs (the rows checked against /latent_error and
// /attention_error: its bytes and objective recomputed here), then given /e2e rows by hand as the e2e step writes
// them: the plan row is measured-e2e with the run's KL, interval and tail, and the paired comparison with the best
// uniform format uses the per-sequence sums and draws of Decision.PairedDifferenceByHand (uniform int8-asym-token
// sums (1, 2, 8), the plan's (0.5, 2, 4) over 10, 10 and 20 tokens: ΔKL = 0.1125 [0.005, 0.1925]). Before the
// /e2e rows, the plan is predicted and the command that measures it is printed.
TEST_F(DecisionTest, APlanRunEndToEndIsMeasured) {
  const Outcome o = cli({"run", config.string(), "--out", results.string(), "--threads", "2", "--budgets", "3/4"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.out.find("plan runs:"), std::string::npos) << o.out;  // no e2e step to announce them to
  EXPECT_EQ(o.out.find("plan: predicted"), std::string::npos) << o.out;  // the command: from `decide`
  const Outcome pred = cli({"decide", results.string(), "--budgets", "3/4"});
  ASSERT_EQ(pred.rc, 0) << pred.err;
  EXPECT_CONTAINS(pred.out, "plan: predicted at 3/4 of bf16 (not run end to end)");
  EXPECT_CONTAINS(pred.out, " -m latentq.e2e --results " + fs::absolute(results).string() + "\n");
  EXPECT_CONTAINS(pred.out, "  latentq decide " + results.string() + " --budgets 3/4\n");
  const ColumnTable d0 = read_table(results, "decision");
  ASSERT_EQ(d0.get<std::string>("choice")[2], "plan");
  EXPECT_EQ(d0.get<std::string>("source")[2], "predicted");

  // /plan_runs: one row per (layer, target) of the 3 studied layers, each a quantizer /latent_error measured there;
  // Σ of their bytes_per_token_layer (every layer studied) and of their single-target attention KL are the plan's.
  const ColumnTable pr = read_table(results, "plan_runs");
  ASSERT_EQ(pr.num_rows(), 6u);
  const ColumnTable le = read_table(results, "latent_error"), ae = read_table(results, "attention_error");
  double bytes = 0, objective = 0;
  std::set<std::pair<int64_t, std::string>> groups;
  for (size_t i = 0; i < pr.num_rows(); ++i) {
    const int64_t layer = pr.get<int64_t>("layer")[i];
    const std::string target = pr.get<std::string>("target")[i], q = pr.get<std::string>("quantizer")[i];
    SCOPED_TRACE(std::to_string(layer) + " " + target + " " + q);
    EXPECT_EQ(pr.get<std::string>("run")[i], "plan-3/4");
    EXPECT_EQ(pr.get<double>("budget_fraction")[i], 0.75);
    groups.insert({layer, target});
    int found = 0;
    for (size_t r = 0; r < le.num_rows(); ++r)
      if (le.get<int64_t>("layer")[r] == layer && le.get<std::string>("target")[r] == target &&
          le.get<std::string>("quantizer")[r] == q) {
        bytes += le.get<double>("bytes_per_token_layer")[r];
        EXPECT_EQ(pr.get<std::string>("stored")[i], le.get<std::string>("stored")[r]);
        EXPECT_EQ(pr.get<std::string>("transform")[i], le.get<std::string>("transform")[r]);
        ++found;
      }
    for (size_t r = 0; r < ae.num_rows(); ++r)
      if (ae.get<int64_t>("layer")[r] == layer && ae.get<std::string>("targets")[r] == target &&
          ae.get<std::string>("quantizer")[r] == q)
        objective += ae.get<double>("kl_mean")[r];
    EXPECT_EQ(found, 1);
  }
  EXPECT_EQ(groups.size(), 6u);
  EXPECT_NEAR(pr.get<double>("bytes_per_token_model")[0], bytes, 1e-9);
  EXPECT_NEAR(d0.get<double>("bytes_per_token_model")[2], bytes, 1e-9);
  EXPECT_LE(bytes, 108.0);
  EXPECT_NEAR(d0.get<double>("plan_objective")[2], objective, 1e-12 * objective);
  EXPECT_NEAR(pr.get<double>("plan_objective")[0], objective, 1e-12 * objective);

  // the e2e step's groups, by hand: two uniform formats within 108 B/token and the plan's run, each with its
  // per-sequence KL sums over 10, 10 and 20 tokens (kl_mean = Σ sums / 40, interval [kl - 0.0125, kl + 0.0175])
  const auto col = [](const char* n, ColType t) { return ColumnSpec{n, t, "", ""}; };
  const auto write_e2e = [&](const std::map<std::string, std::vector<double>>& sums) {
    ColumnTable e = empty_table(GroupSpec{
        "e2e",
        {col("quantizer", ColType::Str), col("targets", ColType::Str), col("cache_mode", ColType::Str),
         col("kl_mean", ColType::F64), col("top1_agree", ColType::F64), col("ppl_ref", ColType::F64),
         col("ppl_quant", ColType::F64), col("kl_mean_ci_lo", ColType::F64), col("kl_mean_ci_hi", ColType::F64),
         col("kl_p999", ColType::F64)}});
    ColumnTable seq = empty_table(GroupSpec{
        "e2e_seq",
        {col("quantizer", ColType::Str), col("targets", ColType::Str), col("cache_mode", ColType::Str),
         col("seq", ColType::I64), col("kl_sum", ColType::F64), col("tokens", ColType::I64)}});
    const std::vector<int64_t> tokens = {10, 10, 20};
    for (const auto& [q, v] : sums) {
      const double kl = (v[0] + v[1] + v[2]) / 40;
      add_row(e, {q, std::string("c_kv+k_pe"), std::string("prefill-at-once"), kl, 0.97, 4.0, 4.01, kl - 0.0125,
                  kl + 0.0175, 0.9});
      for (int64_t b = 0; b < 3; ++b)
        add_row(seq, {q, std::string("c_kv+k_pe"), std::string("prefill-at-once"), b, v[b], tokens[b]});
    }
    ColumnTable boot = empty_table(
        GroupSpec{"e2e_bootstrap", {col("draw", ColType::I64), col("seq", ColType::I64), col("count", ColType::I64)}});
    const std::vector<std::vector<int64_t>> draws = {{3, 0, 0}, {0, 3, 0}, {0, 0, 3}, {1, 1, 1}, {2, 0, 1}};
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t b = 0; b < 3; ++b) add_row(boot, {r, b, draws[r][b]});
    write_results(results, {}, {{"e2e", e, {}}, {"e2e_seq", seq, {}}, {"e2e_bootstrap", boot, {}}},
                  WriteMode::Update);
  };
  const ColumnTable s = read_table(results, "summary");
  for (size_t r = 0; r < s.num_rows(); ++r) {
    const std::string& q = s.get<std::string>("quantizer")[r];
    if (q == "int8-asym-token" || q == "int4-asym-token") EXPECT_LE(s.get<double>("bytes_per_token_model")[r], 108.0);
  }
  write_e2e({{"int8-asym-token", {1, 2, 8}}, {"int4-asym-token", {5, 5, 10}}, {"plan-3/4", {0.5, 2, 4}}});

  const Outcome dec = cli({"decide", results.string(), "--budgets", "3/4"});
  ASSERT_EQ(dec.rc, 0) << dec.err;
  EXPECT_EQ(dec.out.find("predicted"), std::string::npos) << dec.out;
  const ColumnTable d = read_table(results, "decision");
  ASSERT_EQ(d.num_rows(), 3u);
  EXPECT_EQ(d.get<std::string>("quantizer")[0], "int8-asym-token");
  EXPECT_EQ(d.get<std::string>("quantizer")[2], d0.get<std::string>("quantizer")[2]);
  EXPECT_EQ(d.get<std::string>("source")[2], "measured-e2e");
  EXPECT_DOUBLE_EQ(d.get<double>("kl_mean")[2], 0.1625);
  EXPECT_DOUBLE_EQ(d.get<double>("kl_ci_lo")[2], 0.15);
  EXPECT_DOUBLE_EQ(d.get<double>("kl_ci_hi")[2], 0.18);
  EXPECT_DOUBLE_EQ(d.get<double>("kl_p999")[2], 0.9);
  EXPECT_NEAR(d.get<double>("delta_ppl")[2], 0.01, 1e-12);
  EXPECT_EQ(d.get<std::string>("runner_up")[2], "int8-asym-token");
  EXPECT_DOUBLE_EQ(d.get<double>("runner_up_kl")[2], 0.275);
  EXPECT_DOUBLE_EQ(d.get<double>("delta_kl")[2], 0.1125);
  EXPECT_NEAR(d.get<double>("delta_kl_lo")[2], 0.005, 1e-15);
  EXPECT_NEAR(d.get<double>("delta_kl_hi")[2], 0.1925, 1e-15);
  EXPECT_EQ(d.get<std::string>("verdict")[2], "the plan (plan-3/4) beats int8-asym-token: ΔKL = 0.1125 [0.005, 0.1925]");
  EXPECT_CONTAINS(dec.out, "KL 0.1625 [0.15, 0.18], p99.9 0.9, top-1 0.9700, dppl +0.01 (measured-e2e)\n"
                           "  vs uniform the plan (plan-3/4) beats int8-asym-token: ΔKL = 0.1125 [0.005, 0.1925]");

  // the uniform format ahead: the verdict names it first, the difference the other way round
  write_e2e({{"int8-asym-token", {0.5, 2, 4}}, {"int4-asym-token", {5, 5, 10}}, {"plan-3/4", {1, 2, 8}}});
  ASSERT_EQ(cli({"decide", results.string(), "--budgets", "3/4"}).rc, 0);
  const ColumnTable w = read_table(results, "decision");
  EXPECT_DOUBLE_EQ(w.get<double>("kl_mean")[2], 0.275);
  EXPECT_DOUBLE_EQ(w.get<double>("delta_kl")[2], -0.1125);
  EXPECT_NEAR(w.get<double>("delta_kl_lo")[2], -0.1925, 1e-15);
  EXPECT_NEAR(w.get<double>("delta_kl_hi")[2], -0.005, 1e-15);
  EXPECT_EQ(w.get<std::string>("verdict")[2], "int8-asym-token beats the plan (plan-3/4): ΔKL = 0.1125 [0.005, 0.1925]");

  // `decide` at another budget adds that plan's run after the first, whose rows stay as they were
  ASSERT_EQ(cli({"decide", results.string(), "--budgets", "1/2"}).rc, 0);
  const ColumnTable pr2 = read_table(results, "plan_runs");
  ASSERT_GT(pr2.num_rows(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(pr2.get<std::string>("run")[i], "plan-3/4");
  EXPECT_EQ(pr2.get<std::string>("run")[6], "plan-1/2");
  EXPECT_EQ(cli({"decide", results.string(), "--budgets", "3/4"}).rc, 0);
  EXPECT_EQ(read_table(results, "decision").get<std::string>("source")[2], "measured-e2e");
}
}  // namespace

// The decision line carries the e2e KL's 95% interval and its per-token p99.9 when /e2e has them (the columns
// kl_ci_lo, kl_ci_hi, kl_p999 of /decision), and reads as before without them.
TEST(Decision, TheLineShowsTheIntervalAndTheTail) {
  ColumnTable t = empty_table(decision_spec());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  add_row(t, {0.25, 288.0, std::string("uniform"), std::string("tc3"), 216.0, 0.01927, 0.9497, 0.02554,
              std::string("e2e"), nan, std::string(""), std::string("kl"), 0.0171, 0.0215, 0.2104, std::string(""), nan, nan,
              nan, nan, nan, std::string(""), std::string(""), nan, nan, nan, nan, int64_t{0}, nan, nan, nan, nan,
              int64_t{0}, int64_t{0}, std::string()});
  add_row(t, {0.25, 288.0, std::string("engine"), std::string("q4_0"), 324.0, 0.0674, 0.897, 0.25, std::string("e2e"),
              nan, std::string("llama.cpp --cache-type-k q4_0"), std::string("kl"), nan, nan, nan, std::string(""), nan,
              nan, nan, nan, nan, std::string(""), std::string(""), nan, nan, nan, nan, int64_t{0}, nan, nan, nan,
              nan, int64_t{0}, int64_t{0}, std::string()});
  const std::string out = format_decision(t);
  EXPECT_NE(out.find("uniform  tc3 at 216 B/token: KL 0.01927 [0.0171, 0.0215], p99.9 0.2104, top-1 0.9497, dppl "
                     "+0.02554 (e2e)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("engine   q4_0 [llama.cpp --cache-type-k q4_0] at 324 B/token: KL 0.0674, top-1 0.8970, dppl "
                     "+0.25 (e2e)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("[its 95% interval over sequences], p99.9: the per-token tail"), std::string::npos) << out;
}

// The paired difference of two runs on hand-computed draws: 3 sequences of 10, 10 and 20 tokens; run a's KL
// sums (1, 2, 8), run b's (0.5, 2, 4): delta = 11/40 − 6.5/40 = 0.1125. Draws (each draw's Σ c·a / Σ c·t −
// Σ c·b / Σ c·t): (3,0,0): 3/30 − 1.5/30 = 0.05; (0,3,0): 0; (0,0,3): 24/60 − 12/60 = 0.2; (1,1,1): 0.1125;
// (2,0,1): 10/40 − 5/40 = 0.125. Sorted 0, 0.05, 0.1125, 0.125, 0.2; numpy linear at 2.5%: position 0.1 ->
// 0 + 0.1 × 0.05 = 0.005; at 97.5%: position 3.9 -> 0.125 + 0.9 × 0.075 = 0.1925.
TEST(Decision, PairedDifferenceByHand) {
  const std::vector<std::vector<double>> draws = {{3, 0, 0}, {0, 3, 0}, {0, 0, 3}, {1, 1, 1}, {2, 0, 1}};
  const PairedKl p = paired_kl_difference({1, 2, 8}, {0.5, 2, 4}, {10, 10, 20}, draws);
  EXPECT_DOUBLE_EQ(p.delta, 0.1125);
  EXPECT_NEAR(p.lo, 0.005, 1e-15);
  EXPECT_NEAR(p.hi, 0.1925, 1e-15);
  EXPECT_EQ(p.tokens, 40);
  EXPECT_EQ(p.num_seqs, 3);
  // one sequence: the difference, no interval
  const PairedKl one = paired_kl_difference({3}, {1}, {10}, {{1}, {1}});
  EXPECT_DOUBLE_EQ(one.delta, 0.2);
  EXPECT_TRUE(std::isnan(one.lo) && std::isnan(one.hi));
  EXPECT_THROW(paired_kl_difference({1, 2}, {1}, {10, 10}, draws), std::invalid_argument);
}

// The verdict's wording: a clear win (the interval above 0), a tie (the interval holding 0: the cheaper named),
// one sequence (no interval, and why), and the attention KL (no verdict).
TEST(Decision, VerdictWording) {
  PairedKl win;
  win.delta = 0.0123, win.lo = 0.0081, win.hi = 0.0165, win.tokens = 2048, win.num_seqs = 4;
  EXPECT_EQ(paired_verdict("int4-asym-channel-g32", "q4_0", 216, 180, win, "e2e"),
            "int4-asym-channel-g32 beats q4_0: ΔKL = 0.0123 [0.0081, 0.0165]");
  PairedKl tie = win;
  tie.delta = 0.0011, tie.lo = -0.0004, tie.hi = 0.0027;
  EXPECT_EQ(paired_verdict("int4-asym-channel-g32", "q4_0", 216, 180, tie, "e2e"),
            "int4-asym-channel-g32 and q4_0 are indistinguishable on 2048 tokens; the cheaper is q4_0 "
            "(ΔKL = 0.0011 [-0.0004, 0.0027])");
  EXPECT_EQ(paired_verdict("a", "b", 100, 120, tie, "e2e"),
            "a and b are indistinguishable on 2048 tokens; the cheaper is a (ΔKL = 0.0011 [-0.0004, 0.0027])");
  PairedKl one;
  one.delta = 0.002, one.tokens = 512, one.num_seqs = 1;
  EXPECT_EQ(paired_verdict("a", "b", 100, 120, one, "e2e"),
            "a vs b: ΔKL = 0.002, no interval: 1 sequence (the bootstrap over sequences needs two or more)");
  EXPECT_EQ(paired_verdict("a", "b", 100, 120, PairedKl{}, "attention"),
            "a vs b: verdict not available (the KL is the attention KL; no /e2e per-sequence values)");
  EXPECT_EQ(paired_verdict("a", "b", 100, 120, PairedKl{}, "e2e"),
            "a vs b: verdict not available (/e2e has no per-sequence values: rerun the e2e step)");
  EXPECT_EQ(paired_verdict("a", "", 100, 0, win, "e2e"), "a is the only measured uniform format within the budget");
}

// A good mean with a bad tail: the choice wins on the mean, and the "vs next" line puts both p99.9 beside it.
TEST(Decision, TheVerdictLineShowsBothTails) {
  ColumnTable t = empty_table(decision_spec());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  add_row(t, {0.25, 288.0, std::string("uniform"), std::string("int4-asym-token"), 216.0, 0.0150, 0.95, 0.02,
              std::string("e2e"), nan, std::string(""), std::string("kl"), 0.0140, 0.0161, 1.873,
              std::string("had,int4-asym-token"), 0.0172, 0.2210, 0.0022, 0.0012, 0.0031,
              std::string("int4-asym-token beats had,int4-asym-token: ΔKL = 0.0022 [0.0012, 0.0031]"),
              std::string("int4-asym-token"), 21.25, 17.5, 25.0, 0.6875, int64_t{32}, 0.8, 0.548, 0.930, 1.0, int64_t{15},
              int64_t{3}, std::string()});
  const std::string line = free_running_line(t, 0);
  EXPECT_EQ(line,
            "generation: first divergence at 21.2 [17.5, 25] of 32 tokens, identical 0.688; "
            "retrieval: 0.800 [0.548, 0.930] of 15 needles (reference 1.000, lost 3)");
  t.get<std::string>("free_running")[0] = line;  // as decision_table stores it
  const std::string out = format_decision(t);
  EXPECT_NE(out.find("uniform  int4-asym-token at 216 B/token: KL 0.015 [0.014, 0.0161], p99.9 1.873, top-1 0.9500"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("  vs next  int4-asym-token beats had,int4-asym-token: ΔKL = 0.0022 [0.0012, 0.0031] "
                     "(p99.9 1.873 vs 0.221)\n"),
            std::string::npos)
      << out;
  // generation and retrieval, under the verdict (hand-set values of /generation and /retrieval_summary)
  EXPECT_NE(out.find("           generation: first divergence at 21.2 [17.5, 25] of 32 tokens, identical 0.688; "
                     "retrieval: 0.800 [0.548, 0.930] of 15 needles (reference 1.000, lost 3)\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("(generation: free-running greedy tokens vs the reference's"), std::string::npos) << out;
}
