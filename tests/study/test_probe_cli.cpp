// The probe groups through the latentq CLI: every group written and readable, the printed tables, skips
// and refusals (exit 2, nothing written), e2e / report steps without Python, merge running the e2e step.
#include "probe_study_test_util.h"

namespace {  // probe_study_test_util.h's using-declarations apply here too

// ---- the CLI -----------------------------------------------------------------------------------------

struct ProbeCliTest : ::testing::Test {
  TempDir dir;
  fs::path dump = dir / "dump.h5", config = dir / "study.toml", results = dir / "out.h5";
  void write_config(const std::string& extra) {
    std::ofstream(config) << "[input]\ndump = \"dump.h5\"\n" << kConfig << extra;
  }
};

// The synthetic dump's sequences are 40 and 24 tokens, its query rows at positions 9, 20, 31 and 1, 12,
// 23: with position_bucket 16, two buckets of 3 rows.
const char* kDecodeOrderSection = R"(
[decode_order]
residual = [0, 8]
sink = [0, 2]
quantizers = ["int4-asym-channel-g32", "int2-asym-token"]
position_bucket = 16
)";

TEST_F(ProbeCliTest, RunWritesEveryGroupAndPrintsTheTables) {
  lqtest::write_synth(dump, lqtest::make_synth());
  write_config(kDecodeOrderSection);
  const Outcome o = cli({"run", config.string(), "--out", results.string(), "--threads", "2"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_TRUE(o.err.empty()) << o.err;  // no attention-check warning: the synthetic attn_out is exact
  const std::vector<std::string> groups = list_tables(results);
  for (const std::string& g : probe_groups()) {
    SCOPED_TRACE(g);
    if (g == "indexer_error") {  // sparse MLA dumps only (test_mla_variants.py runs it): a dense dump has none
      EXPECT_EQ(std::find(groups.begin(), groups.end(), g), groups.end());
      continue;
    }
    ASSERT_NE(std::find(groups.begin(), groups.end(), g), groups.end());
    const ColumnTable t = read_table(results, g);
    EXPECT_EQ(t.names(), probe_columns(g));
  }
  EXPECT_EQ(read_table(results, "svd").num_rows(), 3u * 6u);
  EXPECT_EQ(read_table(results, "svd_spectrum").num_rows(), 3u * 16u);
  EXPECT_EQ(read_table(results, "attention_error").num_rows(), 3u * 12u);
  // /attention_position: 3 layers x 2 quantizers x (baseline + 4 modes) x 2 buckets.
  const ColumnTable pos = read_table(results, "attention_position");
  ASSERT_EQ(pos.num_rows(), 3u * 2u * 5u * 2u);
  const ColumnTable err = read_table(results, "attention_error");
  for (size_t row = 0; row < pos.num_rows(); row += 10) {  // each cell's first row: prefill-at-once, bucket 0
    SCOPED_TRACE(row);
    const auto& mode = pos.get<std::string>("cache_mode");
    const auto& kl = pos.get<double>("kl_mean");
    const auto& q = pos.get<int64_t>("queries");
    const auto& frac = pos.get<double>("quantized_key_frac");
    EXPECT_EQ(mode[row], "prefill-at-once");
    EXPECT_EQ(mode[row + 2], "decode-r0-s0-p0");
    EXPECT_EQ(mode[row + 9], "decode-r8-s2-p0");
    EXPECT_EQ(q[row] + q[row + 1], 6);
    EXPECT_EQ(frac[row], 1.0);
    // The baseline reproduces /attention_error's cell (query-weighted mean over the buckets).
    const int64_t layer = pos.get<int64_t>("layer")[row];
    const std::string& quant = pos.get<std::string>("quantizer")[row];
    const double both = (kl[row] * double(q[row]) + kl[row + 1] * double(q[row + 1])) / 6.0;
    for (size_t i = 0; i < err.num_rows(); ++i)
      if (err.get<int64_t>("layer")[i] == layer && err.get<std::string>("quantizer")[i] == quant &&
          err.get<std::string>("targets")[i] == "c_kv+k_pe") {
        EXPECT_NEAR(both, err.get<double>("kl_mean")[i], 1e-12 * err.get<double>("kl_mean")[i]);
        EXPECT_EQ(pos.get<double>("bytes_per_token")[row], err.get<double>("bytes_per_token_layer")[i]);
      }
    if (quant == "int4-asym-channel-g32") {
      // g32 groups: only the query at position 31 with R = 0 and S = 0 completes one ([0, 32) quantized).
      for (size_t i = 2; i < 10; ++i) EXPECT_EQ(frac[row + i], i == 3 ? 1.0 / 3.0 : 0.0) << i;
    } else {
      EXPECT_EQ(frac[row + 2], 1.0);  // int2-asym-token, R = 0, S = 0: every key of [0, t] quantized
      EXPECT_LT(frac[row + 4], 1.0);  // S = 2: the sink keys are bf16
    }
  }
  // What the e2e step reads to run the same decode orders.
  const Attrs attrs = read_results_attrs(results);
  EXPECT_EQ(std::get<std::vector<std::string>>(attr(attrs, "decode_order_modes")),
            (std::vector<std::string>{"decode-r0-s0-p0", "decode-r0-s2-p0", "decode-r8-s0-p0", "decode-r8-s2-p0"}));
  EXPECT_EQ(std::get<std::vector<std::string>>(attr(attrs, "decode_order_quantizers")),
            (std::vector<std::string>{"int4-asym-channel-g32", "int2-asym-token"}));
  EXPECT_EQ(std::get<int64_t>(attr(attrs, "decode_order_position_bucket")), 16);
  EXPECT_EQ(std::get<std::vector<std::string>>(attr(attrs, "decode_order_targets")),
            (std::vector<std::string>{"c_kv+k_pe"}));  // the default
  // Config errors name the key.
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"[decode_order]\nresidual = [0]\n", "[decode_order] needs 'quantizers'"},
           {"[decode_order]\nquantizers = [\"int3-asym-token\"]\n", "'decode_order.quantizers': "},
           {"[decode_order]\nquantizers = [\"int4-asym-token\"]\nresidual = [-1]\n", "-1 is < 0"},
           {"[decode_order]\nquantizers = [\"int4-asym-token\"]\nposition_bucket = 0\n", "position_bucket"},
           {"[decode_order]\nquantizers = [\"int4-asym-token\"]\nresiduals = [1]\n", "residuals"}}) {
    SCOPED_TRACE(text);
    try {
      parse_config(std::string(kConfig) + text, "probe.toml", dir.path());
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_CONTAINS(e.what(), "probe.toml:");
      EXPECT_CONTAINS(e.what(), message);
    }
  }
  EXPECT_CONTAINS(o.out, "Latent error vs attention error");
  EXPECT_CONTAINS(o.out, "svd-rank16");
  EXPECT_CONTAINS(o.out, "SVD of c_kv (kv_lora_rank 16");
  EXPECT_CONTAINS(o.out, "Adjacent layers: c_kv similarity");
  EXPECT_EQ(o.out.find("e2e"), std::string::npos);  // [e2e] absent: off
  EXPECT_EQ(o.out.find("attention: skipped"), std::string::npos);
}

// position_bucket is a TOML number converted to int64: a value beyond int64 made that conversion
// undefined (1e300: UBSan's float-cast-overflow in the fuzz build; gcc on x86 happened to refuse it with
// the wrong message). Refused before the conversion now, naming the file, the key and the value; 2^53,
// the largest integer a float64 holds exactly, is taken.
TEST(DecodeOrderConfig, PositionBucketOutOfRange) {
  const auto text = [](const std::string& v) {
    return std::string(kConfig) + "[decode_order]\nquantizers = [\"int4-asym-token\"]\nposition_bucket = " + v + "\n";
  };
  for (const std::string v : {"1e300", "inf", "-inf", "nan", "9223372036854775807", "1.5", "0"}) {
    SCOPED_TRACE(v);
    try {
      parse_config(text(v), "probe.toml", "/base");
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_CONTAINS(e.what(), "probe.toml:12:");
      EXPECT_CONTAINS(e.what(), "'decode_order.position_bucket' = ");
      EXPECT_CONTAINS(e.what(), "is not an integer in [1, 2^53]");
    }
  }
  EXPECT_NO_THROW(parse_config(text("9007199254740992"), "probe.toml", "/base"));
  EXPECT_NO_THROW(parse_config(text("16.0"), "probe.toml", "/base"));
}

TEST_F(ProbeCliTest, LatentOnlyDumpRunsWithOneSkipLine) {
  lqtest::write_synth(dump, lqtest::make_synth({.attention = false}));
  write_config("");
  const Outcome o = cli({"run", config.string(), "--out", results.string()});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(count_of(o.out, "attention: skipped: "), 1u) << o.out;
  EXPECT_CONTAINS(o.out, "has no dataset /layers/000/q_rows");
  const std::vector<std::string> groups = list_tables(results);
  EXPECT_EQ(std::count(groups.begin(), groups.end(), "attention_error"), 0);
  EXPECT_EQ(std::count(groups.begin(), groups.end(), "svd"), 1);
  EXPECT_EQ(std::count(groups.begin(), groups.end(), "cross_layer"), 1);
}

// sklt (the score-metric KLT, latentq/analysis/score_basis.h) fits on the layer's fit-split query rows: its cells
// run, with [attention] off too (the latent cells then read the attention data themselves), and pass the fold
// check (A⁻ᵀ into W_UK, W_UV and q_pe); a dump without query rows is refused before any cell, nothing written.
TEST_F(ProbeCliTest, ScoreKltRunsThroughTheFoldCheckAndNeedsTheQueryRows) {
  lqtest::write_synth(dump, lqtest::make_synth());
  const std::string quantizers =
      "[quantizers]\nextra = [\"sklt,int4-asym-channel-g32\", \"klt,int4-asym-channel-g32\", \"bf16\"]\n";
  std::ofstream(config) << "[input]\ndump = \"dump.h5\"\n" << quantizers;
  Outcome o = cli({"run", config.string(), "--out", results.string()});
  ASSERT_EQ(o.rc, 0) << o.err;
  const ColumnTable check = read_table(results, "attention_check");
  for (size_t r = 0; r < check.num_rows(); ++r) {
    EXPECT_EQ(check.get<std::string>("fold_transforms")[r], "sklt;klt");
    EXPECT_LE(check.get<double>("fold_rel_fro")[r], 1e-5);
  }
  const ColumnTable le = read_table(results, "latent_error");
  std::map<std::string, int> rows;
  for (size_t r = 0; r < le.num_rows(); ++r) {
    const std::string& q = le.get<std::string>("quantizer")[r];
    ++rows[q];
    if (q == "sklt,int4-asym-channel-g32") {
      EXPECT_EQ(le.get<std::string>("transform")[r], "sklt");
      EXPECT_GT(le.get<double>("rel_fro")[r], 0);
      EXPECT_LT(le.get<double>("rel_fro")[r], 0.5);
    }
  }
  EXPECT_EQ(rows["sklt,int4-asym-channel-g32"], 3 * 2) << "3 layers x 2 targets";
  fs::remove(results);
  std::ofstream(config) << "[input]\ndump = \"dump.h5\"\n" << quantizers << "[attention]\nenabled = false\n";
  o = cli({"run", config.string(), "--out", results.string()});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(read_table(results, "latent_error").num_rows(), le.num_rows());
  fs::remove(results);
  lqtest::write_synth(dump, lqtest::make_synth({.attention = false}));
  o = cli({"run", config.string(), "--out", results.string()});
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "quantizer sklt,int4-asym-channel-g32 needs the dump's attention datasets");
  EXPECT_FALSE(fs::exists(results));
  EXPECT_FALSE(fs::exists(results.string() + ".partial"));
}

TEST_F(ProbeCliTest, SvdRankAboveKvLoraRankIsExit2AndWritesNothing) {
  lqtest::write_synth(dump, lqtest::make_synth());
  write_config("[svd]\nranks = [4, 40]\n");
  const Outcome o = cli({"run", config.string(), "--out", results.string()});
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "latentq: error: ");
  EXPECT_CONTAINS(o.err, "rank 40 is larger than kv_lora_rank 16");
  EXPECT_FALSE(fs::exists(results));
}

// Edge inputs (the same kind): a short dump of a real model's shape, kv_lora_rank 512 and 2 × 256
// tokens. The automatic SVD ranks reach 512 (513 fit tokens needed) and used to fail the whole run
// (exit 2); now they are capped at the 255 that the 256 fit tokens determine, with one warning line.
TEST_F(ProbeCliTest, ShortDumpOfARealShapeCapsTheAutomaticRanks) {
  lqtest::write_synth(
      dump, lqtest::make_synth(
                {.layers = 2, .seq_lens = {256, 256}, .kv_lora_rank = 512, .qk_rope_head_dim = 64, .query_rows = 8}));
  write_config("");
  const Outcome o = cli({"run", config.string(), "--out", results.string(), "--threads", "2"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(count_of(o.err, "latentq: warning: "), 1u) << o.err;
  EXPECT_CONTAINS(o.err,
                  "automatic ranks capped at what the fit split determines (the fit split of " + dump.string() +
                      " has 256 tokens (the first 1 of its 2 non-empty sequences)): [svd] ranks 32, 64, 128, 255 "
                      "instead of 32, 64, 128, 256, 384, 512; [cross_layer] window 2 ranks 128, 254 instead of "
                      "128, 256, 512");
  const ColumnTable svd = read_table(results, "svd");
  EXPECT_EQ(svd.get<int64_t>("rank"), (std::vector<int64_t>{32, 64, 128, 255, 32, 64, 128, 255}));
  EXPECT_EQ(svd.get<int64_t>("fit_tokens")[0], 256);
  EXPECT_EQ(read_table(results, "cross_layer_sharing").get<int64_t>("rank"), (std::vector<int64_t>{128, 254}));
  const auto q = read_table(results, "attention_error").get<std::string>("quantizer");
  EXPECT_EQ(std::count(q.begin(), q.end(), "svd-rank255"), 2);
  // Ranks given explicitly are never capped: exit 2 naming the rank and the fit tokens, nothing written.
  fs::remove(results);
  write_config("[svd]\nranks = [64, 300]\n");
  const Outcome e = cli({"run", config.string(), "--out", results.string(), "--threads", "2"});
  EXPECT_EQ(e.rc, 2);
  EXPECT_CONTAINS(e.err, "latentq: error: " + config.string() +
                             ": [svd] ranks: rank 300 needs 301 fit tokens, but the "
                             "fit split of " +
                             dump.string() + " has 256 tokens");
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"dump.h5", "study.toml"}));
}

// Edge inputs (the same kind): finite inputs whose float32 attention overflows. The reference on
// exact latents is NaN; metrics from it used to be a "perfect" row (out_rel_fro 0, KL 0, top-1 1). Now
// the cell fails with its real cause (no hint about -fp32 scales), the run exits 2, no OUT.
TEST_F(ProbeCliTest, AttentionOverflowingFloat32IsAnErrorNotAPerfectRow) {
  const lqtest::SynthData d = lqtest::make_synth();
  lqtest::write_synth(dump, d);
  std::vector<float> q = d.q_nope[0];
  for (float& x : q) x *= 1e37f;  // finite (|q| < 1e38), but q_nope·W_UK·c_kv overflows float32
  const auto& sp = d.spec;
  lqtest::put_f32(dump, "/layers/000/q_nope",
                  {static_cast<hsize_t>(sp.query_rows), static_cast<hsize_t>(sp.num_heads),
                   static_cast<hsize_t>(sp.qk_nope_head_dim)},
                  q);
  write_config("");
  const Outcome o = cli({"run", config.string(), "--out", results.string(), "--threads", "2"});
  EXPECT_EQ(o.rc, 2) << o.out;
  EXPECT_CONTAINS(o.err, "latentq: error: " + dump.string() + ": cell 000/attention_check: attention: ");
  EXPECT_CONTAINS(o.err,
                  "are NaN/Inf in float32 (the scores or the output overflow the working precision); no metric "
                  "is computed from a non-finite attention");
  EXPECT_CONTAINS(o.err, "the first failed cell is 000/attention_check. Its message names the cause");
  EXPECT_EQ(o.err.find("fp32"), std::string::npos) << o.err;  // no hint about scale dtypes
  EXPECT_FALSE(fs::exists(results));
}

// Edge inputs: empty sequences (seq_offsets entries repeated) hold no token, so every result group
// equals that of the dump without them, bit for bit (table_difference, the comparator of
// lq_results_equal). The fit/held-out split used to count an empty sequence in its "first half": /svd,
// /cross_layer_sharing and the svd-rank rows of /attention_error changed silently (one empty sequence
// first), or the run failed with a hint about -fp32 scales (four empty sequences first).
void expect_same_groups(const fs::path& ref, const fs::path& test) {
  const std::vector<std::string> groups = list_tables(ref);
  ASSERT_EQ(list_tables(test), groups);
  for (const std::string& g : groups) {
    SCOPED_TRACE(g);
    EXPECT_EQ(table_difference(read_table(ref, g), read_table(test, g)), "");
  }
}

TEST_F(ProbeCliTest, EmptySequencesChangeNoResultGroupSynthetic) {
  // The synthetic data depends on T only, so these dumps differ in /seq_offsets alone.
  write_config("");  // per-channel g32 groups (which follow the sequences), per-token, bf16; every probe group
  lqtest::write_synth(dump, lqtest::make_synth({.seq_lens = {40, 24, 32}}));
  const Outcome ref = cli({"run", config.string(), "--out", results.string(), "--threads", "2"});
  ASSERT_EQ(ref.rc, 0) << ref.err;
  const std::vector<std::vector<int64_t>> variants = {{0, 40, 24, 32}, {0, 0, 0, 0, 40, 24, 32}, {40, 0, 24, 0, 32, 0}};
  for (const std::vector<int64_t>& lens : variants) {
    SCOPED_TRACE(::testing::PrintToString(lens));
    const fs::path d = dir / "empty.h5", r = dir / "empty_out.h5";
    lqtest::write_synth(d, lqtest::make_synth({.seq_lens = lens}));
    const Outcome o = cli({"run", config.string(), "--input", d.string(), "--out", r.string(), "--threads", "2"});
    ASSERT_EQ(o.rc, 0) << o.err;
    expect_same_groups(results, r);
  }
}

TEST_F(ProbeCliTest, EmptySequencesChangeNoResultGroupShippedDump) {
  const fs::path shipped = fs::path(LATENTQ_SOURCE_DIR) / "data" / "latents" / "tiny-mla.h5";
  ASSERT_TRUE(fs::exists(shipped)) << shipped << " is missing (a tracked file)";
  // Two layers, per-channel groups (which follow the sequences), automatic SVD and sharing ranks, every
  // probe group.
  std::ofstream(config) << "[input]\nlayers = [0, 1]\n[quantizers]\nextra = [\"int4-asym-channel-g32\", "
                           "\"int4-asym-channel\", \"int4-asym-tensor\", \"bf16\"]\n[attention]\ntargets = "
                           "[\"c_kv+k_pe\"]\n";
  const fs::path ref = dir / "ref.h5";
  ASSERT_EQ(cli({"run", config.string(), "--input", shipped.string(), "--out", ref.string(), "--threads", "2"}).rc, 0);
  for (const std::vector<int64_t>& offsets : {std::vector<int64_t>{0, 0, 512, 1024, 1536, 2048},
                                              std::vector<int64_t>{0, 0, 0, 0, 0, 512, 1024, 1536, 2048}}) {
    SCOPED_TRACE(::testing::PrintToString(offsets));
    fs::copy_file(shipped, dump, fs::copy_options::overwrite_existing);
    lqtest::put_i64(dump, "/seq_offsets", {offsets.size()}, offsets);
    const Outcome o =
        cli({"run", config.string(), "--input", dump.string(), "--out", results.string(), "--threads", "2"});
    ASSERT_EQ(o.rc, 0) << o.err;
    expect_same_groups(ref, results);
  }
}

TEST_F(ProbeCliTest, E2eIsSkippedWithOneLine) {
  lqtest::write_synth(dump, lqtest::make_synth());
  write_config("[e2e]\nenabled = true\n");
  Outcome o = cli({"run", config.string(), "--out", results.string(), "--threads", "1"});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(count_of(o.out, "e2e: skipped: "), 1u);
  EXPECT_CONTAINS(o.out, "e2e: skipped: the dump's model is 'synthetic'");
  // A tiny-mla dump, but no interpreter.
  lqtest::set_string_attr(dump, "model", "tiny-mla");
  {
    const ScopedEnv env("LATENTQ_PYTHON", (dir / "no-python").string());
    o = cli({"run", config.string(), "--out", results.string(), "--threads", "1"});
  }
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(count_of(o.out, "e2e: skipped: "), 1u);
  EXPECT_CONTAINS(o.out, "e2e: skipped: the Python interpreter " + (dir / "no-python").string() + " is missing");
  // No compiled module.
  if (python_unavailable_reason(python_tools(), "python/latentq/e2e.py", false).empty()) {
    const ScopedEnv env("LATENTQ_PYMODULE_DIR", dir.path().string());
    o = cli({"run", config.string(), "--out", results.string(), "--threads", "1"});
    ASSERT_EQ(o.rc, 0) << o.err;
    EXPECT_CONTAINS(o.out, "e2e: skipped: the compiled latentq Python module is not in " + dir.path().string());
  }
}

// Shards never run the e2e step; `latentq merge` runs it on the merged file (as an
// unsharded run does) unless --no-e2e, resolving [e2e] model against the root attribute config_dir.
// (With Python and the model: ctest study.e2e_and_report, study.default_study_sharded and
// slurm.array_merge compare the merged /e2e with the unsharded run's.)
TEST_F(ProbeCliTest, MergeRunsTheE2eStep) {
  lqtest::write_synth(dump, lqtest::make_synth());
  write_config("[e2e]\nenabled = true\nmodel = \"no-model\"\n");
  std::vector<std::string> merge_args = {"merge", (dir / "merged.h5").string()};
  for (int i = 0; i < 2; ++i) {
    const fs::path shard = dir / ("s" + std::to_string(i) + ".h5");
    const Outcome o = cli({"run", config.string(), "--shard", std::to_string(i) + "/2", "--out", shard.string()});
    ASSERT_EQ(o.rc, 0) << o.err;
    EXPECT_CONTAINS(o.out, "e2e: skipped: a shard; `latentq merge` runs it on the merged file\n");
    merge_args.push_back(shard.string());
  }
  const Attrs attrs = read_results_attrs(dir / "s0.h5");
  const auto it = std::find_if(attrs.begin(), attrs.end(), [](const auto& a) { return a.first == "config_dir"; });
  ASSERT_NE(it, attrs.end());
  EXPECT_EQ(std::get<std::string>(it->second), dir.path().string());
  // The step runs: here it stops at its first check, the [e2e] model directory (it has no config.json;
  // a dump of another model than tiny-mla runs with its checkpoint directory as [e2e] model).
  Outcome o = cli(merge_args);
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(count_of(o.out, "e2e: skipped: "), 1u) << o.out;
  EXPECT_CONTAINS(
      o.out, "e2e: skipped: the model directory " + (dir / "no-model").string() + " ([e2e] model) has no config.json");
  // A tiny-mla dump: the next check resolves [e2e] model against the config's directory.
  for (int i = 0; i < 2; ++i) lqtest::set_string_attr(dir / ("s" + std::to_string(i) + ".h5"), "model", "tiny-mla");
  o = cli(merge_args);
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_CONTAINS(
      o.out, "e2e: skipped: the model directory " + (dir / "no-model").string() + " ([e2e] model) has no config.json");
  // --no-e2e: no step.
  merge_args.push_back("--no-e2e");
  o = cli(merge_args);
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.out.find("e2e"), std::string::npos) << o.out;
  merge_args.pop_back();
  // Shards without config_dir (an older latentq): the step is skipped, saying why.
  for (int i = 0; i < 2; ++i) lqtest::delete_attr(dir / ("s" + std::to_string(i) + ".h5"), "config_dir");
  o = cli(merge_args);
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_CONTAINS(o.out, "e2e: skipped: " + (dir / "merged.h5").string() + " has no root attribute config_dir");
  // [e2e] disabled: merge says nothing about it.
  write_config("");
  ASSERT_EQ(cli({"run", config.string(), "--shard", "0/1", "--out", (dir / "one.h5").string()}).rc, 0);
  o = cli({"merge", (dir / "merged1.h5").string(), (dir / "one.h5").string()});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.out.find("e2e"), std::string::npos) << o.out;
}

TEST_F(ProbeCliTest, ReportNeedsPythonAndPassesItsExitCodeThrough) {
  {
    const ScopedEnv env("LATENTQ_PYTHON", (dir / "no-python").string());
    const Outcome o = cli({"report", (dir / "r.h5").string(), "--out", (dir / "rep").string()});
    EXPECT_EQ(o.rc, 2);
    EXPECT_CONTAINS(o.err, "latentq: error: report: the Python interpreter");
  }
  if (!python_unavailable_reason(python_tools(), "python/latentq/report/__main__.py", false).empty())
    GTEST_SKIP() << "no project Python";
  // latentq.report's own input error (a missing file): exit 2 passed through.
  const Outcome o = cli({"report", (dir / "missing.h5").string(), "--out", (dir / "rep").string()});
  EXPECT_EQ(o.rc, 2) << o.out << o.err;
  EXPECT_CONTAINS(o.err, "latentq report: error:");
}

// A Python step's streams: its stdout reaches `out` and its stderr `err`, each whole (a progress bar's '\r'
// updates and a last line without '\n' included), however the child interleaves them; the exit code comes back.
TEST(RunProcess, RelaysTheChildsStdoutAndStderrEachToItsOwnStream) {
  const std::string script =
      "echo one; echo 'note 1' >&2; printf 'bar 1/2\\rbar 2/2\\r' >&2; echo two; echo 'note 2' >&2; "
      "printf 'last'; exit 3";
  std::ostringstream out, err;
  EXPECT_EQ(run_process({"/bin/sh", "-c", script}, {}, out, err), 3);
  EXPECT_EQ(out.str(), "one\ntwo\nlast");
  EXPECT_EQ(err.str(), "note 1\nbar 1/2\rbar 2/2\rnote 2\n");
  // a large output on both streams at once: neither pipe blocks the other, nothing is lost
  std::ostringstream big_out, big_err;
  EXPECT_EQ(run_process({"/bin/sh", "-c", "i=0; while [ $i -lt 20000 ]; do echo o$i; echo e$i >&2; i=$((i+1)); done"},
                        {}, big_out, big_err),
            0);
  std::string want_out, want_err;
  for (int i = 0; i < 20000; ++i) {
    want_out += "o" + std::to_string(i) + "\n";
    want_err += "e" + std::to_string(i) + "\n";
  }
  EXPECT_EQ(big_out.str(), want_out);
  EXPECT_EQ(big_err.str(), want_err);
  EXPECT_THROW(run_process({"/no/such/program"}, {}, out, err), std::runtime_error);
}

// The registry: the shipped probes in canonical order; config sections come from it (an unregistered
// section is an error naming the file and the known sections); a probe reads its own section's
// settings with SettingsReader (here a section no registered probe owns, as a new probe would).

}  // namespace
