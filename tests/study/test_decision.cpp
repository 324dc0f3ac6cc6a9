// The decision summary (latentq/decision.h): budgets parsed by hand, and on a real study of a synthetic dump
// the rows checked against the tables they come from (recomputed here from /summary and /attention_error), a
// plan that the study then runs reported as measured, and the errors.
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
    if (choice == "engine" && budget == 108.0) EXPECT_EQ(q.rfind("fp8-e4m3-tensor", 0), 0u) << q;
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

}  // namespace

// The decision line carries the e2e KL's 95% interval and its per-token p99.9 when /e2e has them (the columns
// kl_ci_lo, kl_ci_hi, kl_p999 of /decision), and reads as before without them.
TEST(Decision, TheLineShowsTheIntervalAndTheTail) {
  ColumnTable t = empty_table(decision_spec());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  add_row(t, {0.25, 288.0, std::string("uniform"), std::string("tc3"), 216.0, 0.01927, 0.9497, 0.02554,
              std::string("e2e"), nan, std::string(""), std::string("kl"), 0.0171, 0.0215, 0.2104});
  add_row(t, {0.25, 288.0, std::string("engine"), std::string("q4_0"), 324.0, 0.0674, 0.897, 0.25, std::string("e2e"),
              nan, std::string("llama.cpp --cache-type-k q4_0"), std::string("kl"), nan, nan, nan});
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
