// The latent-error study: rows equal the reference computed cell by cell, in a fixed order for any
// thread count; the summary's arithmetic; inspect statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>

#include "latentq/cli.h"
#include "latentq/inspect.h"
#include "latentq/study.h"
#include "synth_dump.h"

namespace {
using namespace latentq;
using lqtest::TempDir;
namespace fs = std::filesystem;

const char* kSmallConfig = R"(
[quantizers]
bits = [4, 2]
schemes = ["asym"]
granularities = ["tensor", "channel", "token"]
group_sizes = [0, 8]
extra = ["bf16", "flashmla-v32-fp8"]
)";

struct StudyTest : ::testing::Test {
  TempDir dir;
  fs::path path = dir / "dump.h5";
  Dump dump;
  StudyConfig config;
  void SetUp() override {
    lqtest::write_synth(path, lqtest::make_synth());
    dump = load_dump(path);  // with the attention data: the score columns are computed (and compared)
    config = parse_config(kSmallConfig, "small.toml", dir.path());
  }
};

TEST_F(StudyTest, CellsAndKeys) {
  const std::vector<Cell> cells = plan_cells(config, dump);
  // 3 layers x 2 targets x (2 bits x (1 + 2 + 2) + 2) quantizers
  ASSERT_EQ(cells.size(), 3u * 2u * 12u);
  EXPECT_EQ(cells[0].key(), "000/c_kv/int4-asym-tensor/latent_error");
  EXPECT_EQ(cells[12].key(), "000/k_pe/int4-asym-tensor/latent_error");
  EXPECT_EQ(cells.back().key("svd"), "002/k_pe/flashmla-v32-fp8/svd");
}

TEST_F(StudyTest, RowsMatchTheReferenceForAnyThreadCount) {
  const std::vector<Cell> cells = plan_cells(config, dump);
  auto backend = make_cpu_backend();
  RunOptions one;
  one.threads = 1;
  const ColumnTable t1 = run_latent_error(dump, cells, *backend, one);
  ASSERT_EQ(t1.names(), column_names(latent_error_spec()));
  ASSERT_EQ(t1.num_rows(), cells.size());
  for (int threads : {2, 3, 7}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    RunOptions o;
    o.threads = threads;
    size_t last = 0, calls = 0;
    o.progress = [&](size_t done, size_t total) {
      EXPECT_EQ(total, cells.size());
      EXPECT_GE(done, last);
      last = done;
      ++calls;
    };
    const ColumnTable t = run_latent_error(dump, cells, *backend, o);
    EXPECT_EQ(last, cells.size());
    EXPECT_GE(calls, 1u);
    for (const auto& [name, col] : t1.columns()) EXPECT_EQ(col, t.at(name)) << name;
  }
  // Each row against a direct computation.
  const int64_t T = dump.num_tokens();
  for (size_t i = 0; i < cells.size(); ++i) {
    const Cell& c = cells[i];
    SCOPED_TRACE(c.key());
    const Layer& l = dump.layer(c.layer);
    const bool ckv = c.target == Target::CKV;
    const int64_t D = ckv ? 16 : 8;
    const std::vector<float>& X = ckv ? l.c_kv : l.k_pe;
    std::vector<float> out(X.size());
    const QuantizedTensor q =
        quantize_dequantize(c.quantizer.spec, c.target, X.data(), T, D, dump.seq_offsets, out.data());
    const ErrorMetrics m = error_metrics(X.data(), out.data(), T, D);
    const Accounting a = account(q);
    EXPECT_EQ(t1.get<int64_t>("layer")[i], c.layer);
    EXPECT_EQ(t1.get<std::string>("target")[i], ckv ? "c_kv" : "k_pe");
    EXPECT_EQ(t1.get<std::string>("quantizer")[i], c.quantizer.name);
    EXPECT_EQ(t1.get<std::string>("stored")[i], q.spec.to_string());
    EXPECT_EQ(t1.get<double>("rel_fro")[i], m.rel_fro);
    EXPECT_EQ(t1.get<double>("mse")[i], m.mse);
    EXPECT_EQ(t1.get<double>("sqnr_db")[i], m.sqnr_db);
    EXPECT_EQ(t1.get<double>("max_abs_err")[i], m.max_abs_err);
    EXPECT_EQ(t1.get<double>("cos_mean")[i], m.cos_mean);
    EXPECT_EQ(t1.get<double>("bits_per_element")[i], a.bits_per_element);
    EXPECT_EQ(t1.get<double>("bytes_per_token_layer")[i], a.bytes_per_token);
  }
}

TEST_F(StudyTest, StoredFormatColumns) {
  const std::vector<Cell> cells = plan_cells(config, dump);
  auto backend = make_cpu_backend();
  const ColumnTable t = run_latent_error(dump, cells, *backend);
  const auto& q = t.get<std::string>("quantizer");
  const auto& tg = t.get<std::string>("target");
  auto row = [&](const std::string& quant, const std::string& target) {
    for (size_t i = 0; i < q.size(); ++i)
      if (q[i] == quant && tg[i] == target) return i;
    ADD_FAILURE() << quant << " " << target << " not found";
    return size_t{0};
  };
  auto expect_row = [&](size_t i, const char* stored, int64_t bits, const char* scheme, const char* gran, int64_t group,
                        const char* sd, double bpe) {
    EXPECT_EQ(t.get<std::string>("stored")[i], stored);
    EXPECT_EQ(t.get<int64_t>("bits")[i], bits);
    EXPECT_EQ(t.get<std::string>("scheme")[i], scheme);
    EXPECT_EQ(t.get<std::string>("granularity")[i], gran);
    EXPECT_EQ(t.get<int64_t>("group_size")[i], group);
    EXPECT_EQ(t.get<std::string>("scale_dtype")[i], sd);
    EXPECT_DOUBLE_EQ(t.get<double>("bits_per_element")[i], bpe);
  };
  // fp8 on c_kv [64, 16]: 1 byte per element + one fp32 scale per token (tile 128 > 16): 8 + 32/16 bits.
  expect_row(row("flashmla-v32-fp8", "c_kv"), "fp8-e4m3-tile128-pow2", 8, "sym", "tile", 128, "fp32", 10.0);
  // fp8 on k_pe stores bf16, and says so.
  expect_row(row("flashmla-v32-fp8", "k_pe"), "bf16", 16, "none", "element", 0, "none", 16.0);
  expect_row(row("bf16", "c_kv"), "bf16", 16, "none", "element", 0, "none", 16.0);
  // int4 asym token g8 on k_pe [64, 8]: 4 bits + fp16 scale and offset per 8 elements = 4 + 32/8.
  expect_row(row("int4-asym-token-g8", "k_pe"), "int4-asym-token-g8", 4, "asym", "token", 8, "fp16", 8.0);
  // int2 asym channel g8 on c_kv: T = 64 in sequences 40 + 24 -> 5 + 3 token groups, 32 bits each per channel.
  expect_row(row("int2-asym-channel-g8", "c_kv"), "int2-asym-channel-g8", 2, "asym", "channel", 8, "fp16",
             2.0 + 8.0 * 32.0 / 64.0);
}

TEST_F(StudyTest, FailingCellNamesTheCell) {
  // A value beyond fp16 range makes the int8-sym-tensor fp16 scale overflow (absmax/127 > 65504).
  Dump d = dump;
  d.layers[1].k_pe[5] = 1e8f;
  StudyConfig c = parse_config("[quantizers]\nextra = [\"bf16\", \"int8-sym-tensor\"]\n", "x.toml", dir.path());
  auto backend = make_cpu_backend();
  try {
    run_latent_error(d, plan_cells(c, d), *backend);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cell 001/k_pe/int8-sym-tensor/latent_error"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fp32"), std::string::npos) << msg;  // the quantizer's own advice
  }
}

TEST(Summary, HandComputed) {
  // Two layers; quantizer A on both targets, B only on c_kv, C only on k_pe.
  ColumnTable le;
  le.add<std::string>("quantizer") = {"A", "A", "A", "A", "B", "B", "C", "C"};
  le.add<std::string>("target") = {"c_kv", "k_pe", "c_kv", "k_pe", "c_kv", "c_kv", "k_pe", "k_pe"};
  le.add<double>("rel_fro") = {0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 0.01, 0.03};
  le.add<double>("bits_per_element") = {4.5, 4.5, 4.5, 4.5, 8, 8, 16, 16};
  le.add<double>("bytes_per_token_layer") = {72, 18, 72, 18, 128, 128, 64, 64};
  DumpAttrs a;
  a.num_layers = 4;  // the model has 4 layers; 2 were studied
  a.kv_lora_rank = 128;
  a.qk_rope_head_dim = 32;
  const ColumnTable s = summarize(le, {{"A", {}}, {"B", {}}, {"C", {}}}, a);
  ASSERT_EQ(s.names(), column_names(summary_spec()));
  ASSERT_EQ(s.num_rows(), 3u);
  const double bf16 = 4 * (128 + 32) * 2;  // 1280 bytes per token
  EXPECT_DOUBLE_EQ(s.get<double>("mean_rel_fro_c_kv")[0], 0.2);
  EXPECT_DOUBLE_EQ(s.get<double>("max_rel_fro_c_kv")[0], 0.3);
  EXPECT_DOUBLE_EQ(s.get<double>("mean_rel_fro_k_pe")[0], 0.3);
  EXPECT_DOUBLE_EQ(s.get<double>("max_rel_fro_k_pe")[0], 0.4);
  EXPECT_DOUBLE_EQ(s.get<double>("bits_per_element")[0], 4.5);
  EXPECT_DOUBLE_EQ(s.get<double>("bytes_per_token_model")[0], 4 * (72 + 18));
  EXPECT_DOUBLE_EQ(s.get<double>("ratio_vs_bf16")[0], 360.0 / bf16);
  EXPECT_EQ(s.get<std::string>("k_pe_accounting")[0], "measured");
  // B: k_pe counted as bf16 (64 bytes per layer).
  EXPECT_DOUBLE_EQ(s.get<double>("mean_rel_fro_c_kv")[1], 0.6);
  EXPECT_TRUE(std::isnan(s.get<double>("mean_rel_fro_k_pe")[1]));
  EXPECT_DOUBLE_EQ(s.get<double>("bytes_per_token_model")[1], 4 * (128 + 64));
  EXPECT_EQ(s.get<std::string>("c_kv_accounting")[1], "measured");
  EXPECT_EQ(s.get<std::string>("k_pe_accounting")[1], "bf16 (not run)");
  // C: c_kv counted as bf16 (256 bytes per layer), no c_kv bits.
  EXPECT_TRUE(std::isnan(s.get<double>("bits_per_element")[2]));
  EXPECT_DOUBLE_EQ(s.get<double>("max_rel_fro_k_pe")[2], 0.03);
  EXPECT_DOUBLE_EQ(s.get<double>("bytes_per_token_model")[2], 4 * (256 + 64));
  EXPECT_DOUBLE_EQ(s.get<double>("ratio_vs_bf16")[2], 1.0);
  EXPECT_EQ(s.get<std::string>("c_kv_accounting")[2], "bf16 (not run)");

  const std::string text = format_summary(s, a);
  // Sorted by bytes: A (360) before B (768) before C (1280); assumptions flagged.
  EXPECT_LT(text.find("\nA "), text.find("\nB "));
  EXPECT_LT(text.find("\nB "), text.find("\nC "));
  EXPECT_NE(text.find("counted as bf16"), std::string::npos);
  EXPECT_NE(text.find("bf16 = 1280 bytes/token"), std::string::npos);
}

TEST(Backend, Devices) {
  EXPECT_EQ(make_backend("cpu")->name(), "cpu");
  EXPECT_THROW(make_backend("tpu"), std::invalid_argument);
  try {
    const auto b = make_backend("cuda");
    EXPECT_EQ(b->name(), "cuda");  // a CUDA build on a machine with a GPU
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
}

TEST(Inspect, TensorStatsHandComputed) {
  // x [3, 4]: channel 2 is an outlier (absmax 70 vs median channel absmax (2 + 3) / 2 = 2.5).
  const std::vector<float> x = {1,  -2, 70,  0,  //
                                -1, 2,  -10, 3,  //
                                0,  1,  5,   -3};
  const TensorStats s = tensor_stats(x.data(), 3, 4);
  EXPECT_DOUBLE_EQ(s.absmax, 70);
  EXPECT_DOUBLE_EQ(s.mean_abs, (1 + 2 + 70 + 0 + 1 + 2 + 10 + 3 + 0 + 1 + 5 + 3) / 12.0);
  // channel ranges 2, 4, 80, 6 -> median 5, spread 80 / 5
  EXPECT_DOUBLE_EQ(s.median_channel_range, 5);
  EXPECT_DOUBLE_EQ(s.range_spread, 16);
  // channel absmax 1, 2, 70, 3 -> median 2.5
  EXPECT_DOUBLE_EQ(s.median_channel_absmax, 2.5);
  EXPECT_EQ(s.outlier_channels, (std::vector<int64_t>{2}));
  const TensorStats loose = tensor_stats(x.data(), 3, 4, 100.0);
  EXPECT_TRUE(loose.outlier_channels.empty());
}

// Columns 1.. of the Sylvester Hadamard matrix of order 64: ±1 entries, zero mean, mutually orthogonal.
float hadamard64(int64_t t, int64_t j) { return __builtin_popcountll(static_cast<uint64_t>(t & j)) % 2 ? -1.0f : 1.0f; }

TEST(Inspect, LatentStatsHandComputed) {
  // X [64, 16], X[t, d] = s_d · H[t, d + 1]: channel RMS s_d, XᵀX = 64 · diag(s_d²), every token norm sqrt(Σ s²).
  // s = 1 (11 channels), 2 (4), 20 (1): median channel RMS 1 -> ratio 20; energy 64 · (11 + 16 + 400):
  // top 2 = (400 + 4) / 427, top 4 = (400 + 12) / 427, top 8 = (400 + 16 + 3) / 427.
  std::vector<float> x(64 * 16);
  for (int64_t t = 0; t < 64; ++t)
    for (int64_t d = 0; d < 16; ++d) x[t * 16 + d] = (d < 11 ? 1.0f : d < 15 ? 2.0f : 20.0f) * hadamard64(t, d + 1);
  const std::vector<int64_t> seq = {0, 40, 64};
  LatentStats s = latent_stats(x.data(), 64, 16, seq);
  EXPECT_NEAR(s.channel_rms_ratio, 20.0, 1e-12);
  EXPECT_NEAR(s.energy_top_eighth, 404.0 / 427, 1e-12);
  EXPECT_NEAR(s.energy_top_quarter, 412.0 / 427, 1e-12);
  EXPECT_NEAR(s.energy_top_half, 419.0 / 427, 1e-12);
  EXPECT_NEAR(s.norm_p99_ratio, 1.0, 1e-12);
  EXPECT_NEAR(s.norm_max_ratio, 1.0, 1e-12);
  EXPECT_NEAR(s.first_token_ratio, 1.0, 1e-12);
  // Token norms 10 (token 0, the first of sequence 0), 1 (the other 15; token 8 starts sequence 1) along one
  // channel: p99 at position 0.99 · 15 = 14.85 -> 1 + 0.85 · 9 = 8.65; max 10; first tokens (10 + 1) / 2;
  // channel RMS sqrt(115 / 16) and 0 -> median half of it, ratio 2; one direction holds all the energy.
  std::vector<float> y(16 * 2, 0.0f);
  for (int64_t t = 0; t < 16; ++t) y[t * 2] = t == 0 ? 10.0f : 1.0f;
  s = latent_stats(y.data(), 16, 2, std::vector<int64_t>{0, 8, 16});
  EXPECT_NEAR(s.norm_p99_ratio, 8.65, 1e-12);
  EXPECT_DOUBLE_EQ(s.norm_max_ratio, 10.0);
  EXPECT_DOUBLE_EQ(s.first_token_ratio, 5.5);
  EXPECT_NEAR(s.channel_rms_ratio, 2.0, 1e-12);
  EXPECT_DOUBLE_EQ(s.energy_top_eighth, 1.0);
  EXPECT_DOUBLE_EQ(s.energy_top_half, 1.0);
}

// `latentq inspect` on a hand-built dump: layer 1's c_kv equals layer 0's (adjacent mean |Pearson| 1),
// layer 2's uses other Hadamard columns (0); the decision rows carry latent_stats' values.
TEST(Inspect, DecisionStatisticsOfAHandBuiltDump) {
  lqtest::TempDir dir;
  lqtest::SynthData d = lqtest::make_synth();  // 3 layers, T = 64 (40 + 24), kv_lora_rank 16
  ASSERT_EQ(d.T, 64);
  for (int l = 0; l < 3; ++l)
    for (int64_t t = 0; t < 64; ++t)
      for (int64_t c = 0; c < 16; ++c)
        d.c_kv[l][t * 16 + c] = (c < 11 ? 1.0f : c < 15 ? 2.0f : 20.0f) * hadamard64(t, c + 1 + (l == 2 ? 16 : 0));
  const fs::path path = dir / "hand.h5";
  lqtest::write_synth(path, d);
  std::ostringstream out, err;
  ASSERT_EQ(run_cli({"latentq", "inspect", path.string()}, out, err), 0) << err.str();
  const std::string r = out.str();
  // the decision rows: layer, target, ch-rms, E1/8, E1/4, E1/2, p99, max, first, adj|r|
  std::map<std::string, std::vector<std::string>> rows;
  std::istringstream lines(r.substr(r.find("adj|r|\n")));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::vector<std::string> v;
    for (std::string w; f >> w;) v.push_back(w);
    if (v.size() == 10 && v[1] == "c_kv") rows[v[0]] = v;
  }
  ASSERT_EQ(rows.size(), 3u) << r;
  for (const char* l : {"0", "1", "2"}) {
    SCOPED_TRACE(l);
    EXPECT_EQ(std::vector<std::string>(rows[l].begin() + 2, rows[l].end() - 1),
              (std::vector<std::string>{"20", "0.9461", "0.9649", "0.9813", "1", "1", "1"}));
  }
  EXPECT_EQ(rows["0"].back(), "-");
  EXPECT_EQ(rows["1"].back(), "1.0000");
  EXPECT_EQ(rows["2"].back(), "0.0000");
}

TEST_F(StudyTest, InspectReport) {
  const Dump d = load_dump(path);
  const std::string r = format_inspect(d);
  for (const char* part : {"model           synthetic", "tokens          64 in 2 sequences (lengths 40, 24)",
                           "kv_lora_rank 16, qk_rope_head_dim 8", "softmax_scale   0.125",
                           "rope_layout     interleaved", "attention data  yes (6 query rows"})
    EXPECT_NE(r.find(part), std::string::npos) << part << "\n" << r;
  // The synthetic c_kv has channel 3 scaled by 20: an outlier in every layer.
  size_t n = 0;
  for (size_t p = r.find("1 [3]"); p != std::string::npos; p = r.find("1 [3]", p + 1)) ++n;
  EXPECT_EQ(n, 3u) << r;
}

}  // namespace
