// A format that cannot take a shape is left out, not fatal (latentq/applicable.h): the embedded default study on a
// synthetic dump whose k_pe is 16 wide completes, lists q8_0 / q4_0 / q4_1 (and their rotated runs) on k_pe once in
// /not_applicable and on the terminal, and keeps their c_kv cells; a format that fails for another reason (a value
// it cannot hold) still fails the run.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "latentq/applicable.h"
#include "latentq/config.h"
#include "latentq/decision.h"
#include "latentq/plan.h"
#include "latentq/results.h"
#include "latentq/study.h"
#include "cli_capture.h"
#include "synth_dump.h"

namespace {
using namespace latentq;
using lqtest::cli;
using lqtest::Outcome;
namespace fs = std::filesystem;

// 2 layers of c_kv 32 wide (every format takes it) and k_pe 16 wide (ggml's blocks of 32 do not).
lqtest::SynthSpec kpe16() {
  lqtest::SynthSpec s;
  s.layers = 2;
  s.kv_lora_rank = 32;
  s.qk_rope_head_dim = 16;
  return s;
}

const std::vector<std::string> kGgml = {"q8_0", "q4_0", "q4_1", "had,q4_0", "klt,q4_0"};
const std::string kReason = "ggml blocks need a row length that is a multiple of 32, got 16";

// The number of times `needle` occurs in `s`.
size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

struct NotApplicableTest : ::testing::Test {
  lqtest::TempDir dir;
  fs::path dump = dir / "kpe16.h5", results = dir / "results.h5";
  void SetUp() override { lqtest::write_synth(dump, lqtest::make_synth(kpe16())); }
};

TEST_F(NotApplicableTest, DefaultStudyOnA16WideKpeCompletesAndListsThemOnce) {
  const Outcome o = cli({"run", "--input", dump.string(), "--out", results.string(), "--threads", "2", "--no-e2e"});
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  // one terminal line, naming every pair once
  const std::string line =
      "not applicable: q8_0, q4_0, q4_1, had,q4_0, klt,q4_0 on k_pe (16 wide): " + kReason + "\n";
  EXPECT_EQ(count(o.out, line), 1u) << o.out;
  EXPECT_EQ(count(o.out + o.err, "not applicable:"), 1u) << o.out << o.err;

  // /not_applicable: (quantizer, target, width, reason), default config order
  const ColumnTable na = read_table(results, "not_applicable");
  EXPECT_EQ(na.names(), column_names(not_applicable_spec()));
  EXPECT_EQ(na.get<std::string>("quantizer"), kGgml);
  EXPECT_EQ(na.get<std::string>("target"), std::vector<std::string>(5, "k_pe"));
  EXPECT_EQ(na.get<int64_t>("width"), std::vector<int64_t>(5, 16));
  EXPECT_EQ(na.get<std::string>("reason"), std::vector<std::string>(5, kReason));

  // /latent_error: every other pair on both layers; the ggml quantizers on c_kv only
  const StudyConfig cfg = default_config();
  const ColumnTable le = read_table(results, "latent_error");
  const auto& q = le.get<std::string>("quantizer");
  const auto& tg = le.get<std::string>("target");
  const size_t n_ckv = cfg.plan(Target::CKV)->quantizers.size(), n_kpe = cfg.plan(Target::KPE)->quantizers.size();
  EXPECT_EQ(le.num_rows(), 2 * (n_ckv + n_kpe - kGgml.size()));
  for (const std::string& g : kGgml) {
    SCOPED_TRACE(g);
    size_t ckv = 0, kpe = 0;
    for (size_t i = 0; i < q.size(); ++i)
      if (q[i] == g) (tg[i] == "c_kv" ? ckv : kpe)++;
    EXPECT_EQ(ckv, 2u);
    EXPECT_EQ(kpe, 0u);
  }

  // /attention_error: their c_kv rows stay, no row quantizes k_pe with them
  const ColumnTable ae = read_table(results, "attention_error");
  std::set<std::string> ggml_targets;
  size_t other_kpe = 0;
  for (size_t i = 0; i < ae.num_rows(); ++i) {
    const std::string& aq = ae.get<std::string>("quantizer")[i];
    const std::string& at = ae.get<std::string>("targets")[i];
    if (std::find(kGgml.begin(), kGgml.end(), aq) != kGgml.end())
      ggml_targets.insert(at);
    else if (aq == "int4-asym-channel-g32" && at != "c_kv")
      ++other_kpe;
  }
  EXPECT_EQ(ggml_targets, (std::set<std::string>{"c_kv"}));
  EXPECT_EQ(other_kpe, 4u);  // k_pe and c_kv+k_pe on 2 layers: an applicable quantizer keeps its rows

  // /summary: k_pe counted as bf16 and marked not applicable; bytes = 2 layers x (c_kv measured + 16 x 2)
  const ColumnTable s = read_table(results, "summary");
  const auto& sq = s.get<std::string>("quantizer");
  for (size_t i = 0; i < sq.size(); ++i) {
    const bool ggml = std::find(kGgml.begin(), kGgml.end(), sq[i]) != kGgml.end();
    SCOPED_TRACE(sq[i]);
    EXPECT_EQ(s.get<std::string>("c_kv_accounting")[i], "measured");
    EXPECT_EQ(s.get<std::string>("k_pe_accounting")[i], ggml ? kNotApplicableAccounting : "measured");
  }
  const size_t q8 = std::find(sq.begin(), sq.end(), "q8_0") - sq.begin();
  ASSERT_LT(q8, sq.size());
  // q8_0 on 32 elements: 32 int8 + one fp16 d = 34 bytes per token and layer
  EXPECT_EQ(s.get<double>("bytes_per_token_model")[q8], 2.0 * (34 + 32));
  EXPECT_CONTAINS(o.out, "+ a target whose width the format cannot take (not applicable, /not_applicable)");

  // the planner: no option of a pair that does not apply; none of them is a uniform candidate
  const PlanInputs in = read_plan_inputs(results, "kl");
  for (const PlanGroup& g : in.groups)
    for (const PlanOption& opt : g.options)
      if (g.target == Target::KPE) {
        EXPECT_EQ(std::find(kGgml.begin(), kGgml.end(), opt.quantizer), kGgml.end()) << opt.quantizer;
      }
  for (const std::string& u : in.uniform) EXPECT_EQ(std::find(kGgml.begin(), kGgml.end(), u), kGgml.end()) << u;
}

// The decision never takes a quantizer that cannot store the whole cache as the uniform or engine format, even when
// a c_kv+k_pe KL is there for it (here a fabricated /e2e in which q8_0 is by far the best).
TEST_F(NotApplicableTest, DecisionNeverChoosesAFormatThatCannotTakeATarget) {
  const Outcome o = cli({"run", "--input", dump.string(), "--out", results.string(), "--threads", "2", "--no-e2e"});
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  const ColumnTable s = read_table(results, "summary");
  ColumnTable e2e;
  auto& q = e2e.add<std::string>("quantizer");
  auto& targets = e2e.add<std::string>("targets");
  auto& mode = e2e.add<std::string>("cache_mode");
  auto& kl = e2e.add<double>("kl_mean");
  auto& top1 = e2e.add<double>("top1_agree");
  auto& pr = e2e.add<double>("ppl_ref");
  auto& pq = e2e.add<double>("ppl_quant");
  for (const std::string& name : s.get<std::string>("quantizer")) {
    q.push_back(name);
    targets.emplace_back("c_kv+k_pe");
    mode.emplace_back("prefill-at-once");
    kl.push_back(name == "q8_0" ? 1e-9 : name == "int8-asym-channel-g32" ? 1e-3 : 1.0);
    top1.push_back(1.0);
    pr.push_back(2.0);
    pq.push_back(2.0);
  }
  write_results(results, {}, {{"e2e", e2e, {}}}, WriteMode::Update);
  const ColumnTable d = decision_table(results, {1.0});
  ASSERT_EQ(d.num_rows(), 3u);
  EXPECT_EQ(d.get<std::string>("choice")[0], "uniform");
  EXPECT_EQ(d.get<std::string>("quantizer")[0], "int8-asym-channel-g32");  // not q8_0
  EXPECT_EQ(d.get<std::string>("choice")[1], "engine");
  const std::string engine = d.get<std::string>("quantizer")[1];
  EXPECT_EQ(std::find(kGgml.begin(), kGgml.end(), engine), kGgml.end()) << engine;
}

// [decode_order]'s own quantizers: a pair it quantizes that the format cannot take is listed with the study's and
// its cells are left out (those of the other target stay), even for a quantizer the study does not run.
TEST_F(NotApplicableTest, DecodeOrderQuantizersAreListedAndLeftOut) {
  const fs::path config = dir / "study.toml";
  std::ofstream(config) << "[input]\ndump = \"kpe16.h5\"\n[quantizers]\nbits = [8]\nschemes = [\"asym\"]\n"
                          "granularities = [\"token\"]\ngroup_sizes = [0]\nextra = [\"q8_0\"]\n"
                          "[svd]\nenabled = false\n[cross_layer]\nenabled = false\n"
                          "[attention]\nenabled = true\ntargets = [\"c_kv\", \"c_kv+k_pe\"]\nsvd = false\n"
                          "[decode_order]\nresidual = [0]\nsink = [0]\nquantizers = [\"q4_0\", \"int4-asym-token\"]\n"
                          "targets = [\"c_kv\", \"c_kv+k_pe\"]\n";
  const Outcome o = cli({"run", config.string(), "--out", results.string(), "--threads", "2", "--no-e2e"});
  ASSERT_EQ(o.rc, 0) << o.out << o.err;
  EXPECT_EQ(count(o.out, "not applicable: q8_0, q4_0 on k_pe (16 wide): " + kReason + "\n"), 1u) << o.out;
  const ColumnTable na = read_table(results, "not_applicable");
  EXPECT_EQ(na.get<std::string>("quantizer"), (std::vector<std::string>{"q8_0", "q4_0"}));
  const ColumnTable ap = read_table(results, "attention_position");
  std::set<std::pair<std::string, std::string>> cells;
  for (size_t i = 0; i < ap.num_rows(); ++i)
    cells.insert({ap.get<std::string>("quantizer")[i], ap.get<std::string>("targets")[i]});
  EXPECT_EQ(cells, (std::set<std::pair<std::string, std::string>>{
                       {"q4_0", "c_kv"}, {"int4-asym-token", "c_kv"}, {"int4-asym-token", "c_kv+k_pe"}}));
}

// A format that fails for another reason still fails the run: tq4 stores each row's norm in fp16, and a k_pe row of
// 16 values of 20,000 has norm 80,000 > 65,504. The pairs that do not apply are still listed; nothing is written.
TEST_F(NotApplicableTest, AFormatFailingForAnotherReasonStillFailsTheRun) {
  const lqtest::SynthData d = lqtest::make_synth(kpe16());
  lqtest::put_f32(dump, "/layers/001/k_pe", {static_cast<hsize_t>(d.T), 16},
                  std::vector<float>(static_cast<size_t>(d.T) * 16, 20000.0f));
  const fs::path config = dir / "study.toml";
  std::ofstream(config) << "[input]\ndump = \"kpe16.h5\"\n[quantizers]\nbits = [8]\nschemes = [\"asym\"]\n"
                          "granularities = [\"token\"]\ngroup_sizes = [0]\nextra = [\"q8_0\", \"tq4\"]\n"
                          "[svd]\nenabled = false\n[cross_layer]\nenabled = false\n[attention]\nenabled = false\n";
  const Outcome o = cli({"run", config.string(), "--out", results.string(), "--threads", "2", "--no-e2e"});
  EXPECT_EQ(o.rc, 2) << o.out << o.err;
  EXPECT_CONTAINS(o.out, "not applicable: q8_0 on k_pe (16 wide): " + kReason);
  EXPECT_CONTAINS(o.err, "latentq: error: ");
  EXPECT_CONTAINS(o.err, "cell 001/k_pe/tq4/latent_error");
  EXPECT_CONTAINS(o.err, "row norm");
  EXPECT_FALSE(fs::exists(results));
}

}  // namespace
