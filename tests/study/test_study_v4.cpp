// The latent-error study on DeepSeek-V4 dumps (synthetic, tests/study/synth_v4.h): the cells per layer type, an
// engine record on one entry row (its c_kv part on the first head_dim - d_r columns, its k_pe part on the last) at
// the bytes its engine states, a fitted format fitted on the entries of the fit split's sequences, the pairs that
// do not apply, and /v4_cache's long-context bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "latentq/applicable.h"
#include "latentq/metrics.h"
#include "latentq/quantize.h"
#include "latentq/study.h"
#include "synth_dump.h"
#include "synth_v4.h"

namespace {
using namespace latentq;
using lqtest::TempDir;
namespace fs = std::filesystem;

const char* kConfig = R"(
[quantizers]
bits = [8]
schemes = ["sym"]
granularities = ["token"]
group_sizes = [0]
extra = ["bf16", "flashmla-model1-fp8", "flashmla-v41-fp8", "flashmla-v41-fp4", "lm3-channel", "sklt,tc3"]
[indexer]
quantizers = ["bf16", "int8-sym-token"]
)";

struct StudyV4Test : ::testing::Test {
  TempDir dir;
  fs::path path = dir / "v4.h5";
  StudyConfig config = parse_config(kConfig, "v4.toml", dir.path());
  Dump load(int64_t head_dim, int64_t rope) {
    lqtest::SynthV4Spec s;
    s.head_dim = head_dim;
    s.qk_rope_head_dim = rope;
    lqtest::write_synth_v4(path, lqtest::make_synth_v4(s));
    return load_dump(path);
  }
  static const Cell& find(const std::vector<Cell>& cells, const std::string& key) {
    for (const Cell& c : cells)
      if (c.key() == key) return c;
    throw std::invalid_argument("no cell " + key);
  }
  static size_t row_of(const ColumnTable& t, int layer, const std::string& target, const std::string& q) {
    for (size_t i = 0; i < t.num_rows(); ++i)
      if (t.get<int64_t>("layer")[i] == layer && t.get<std::string>("target")[i] == target &&
          t.get<std::string>("quantizer")[i] == q)
        return i;
    throw std::invalid_argument("no row " + target + " " + q);
  }
};

// window_kv on every layer, compressed_kv on CSA and HCA, index_k on CSA; never c_kv or k_pe; the engine records
// whose native widths (448 + 64) are not the entry's (24 + 8) and the score-metric transform left out with reasons.
TEST_F(StudyV4Test, CellsPerLayerTypeAndWhatDoesNotApply) {
  const Dump d = load(32, 8);
  const std::vector<Cell> cells = plan_cells(config, d);
  std::map<std::string, std::vector<int>> layers;
  for (const Cell& c : cells)
    if (c.quantizer.name == "bf16") layers[to_string(c.target)].push_back(c.layer);
  EXPECT_EQ(layers["window_kv"], (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(layers["compressed_kv"], (std::vector<int>{1, 2}));
  EXPECT_EQ(layers["index_k"], (std::vector<int>{1}));
  EXPECT_EQ(layers.size(), 3u);
  // per entry layer: int8-sym-token, bf16, lm3-channel (3 presets and sklt left out); index_k: 2
  EXPECT_EQ(cells.size(), 3u * 3u + 2u * 3u + 2u);
  const std::vector<NotApplicable> na = not_applicable(config, d.attrs);
  // 4 quantizers x 2 entry targets, then the probes with nothing to measure on V4 ([svd], [cross_layer]: on by
  // default)
  ASSERT_EQ(na.size(), 10u);
  EXPECT_EQ(na[8].quantizer, "[svd]");
  EXPECT_EQ(na[8].reason, "not applicable to deepseek_v4 (no c_kv + k_pe): the SVD of c_kv skipped");
  EXPECT_EQ(na[9].quantizer, "[cross_layer]");
  EXPECT_EQ(na[9].width, 0);
  EXPECT_EQ(na[0].quantizer, "flashmla-model1-fp8");
  EXPECT_EQ(na[0].target, Target::WindowKV);
  EXPECT_EQ(na[0].width, 32);
  EXPECT_EQ(na[0].reason,
            "the engine record is defined for an entry of 448 + 64 (its c_kv part + k_pe part), this one is 24 + 8 "
            "(head_dim 32 less qk_rope_head_dim, qk_rope_head_dim)");
  EXPECT_EQ(na[3].quantizer, "sklt,tc3");
  EXPECT_EQ(na[3].reason, "sklt fits the MLA score metric (q_nope · W_UK, q_pe); deepseek_v4 caches no c_kv + k_pe");
}

// At V4-Flash's entry (head_dim 512, rope 64) each engine record stores one entry row at its stated bytes (FlashMLA
// MODEL1 584, V4.1 FP8 528, V4.1 FP4 288; bf16 1024), and its decoded row is its two parts decoded apart.
TEST_F(StudyV4Test, EngineRecordOnAnEntryRow) {
  const Dump d = load(512, 64);
  const std::vector<Cell> all = plan_cells(config, d);
  const std::vector<std::pair<std::string, double>> stated = {
      {"flashmla-model1-fp8", 584}, {"flashmla-v41-fp8", 528}, {"flashmla-v41-fp4", 288}, {"bf16", 1024}};
  std::vector<Cell> cells;
  for (const auto& [q, bytes] : stated) {
    cells.push_back(find(all, "000/window_kv/" + q + "/latent_error"));
    cells.push_back(find(all, "002/compressed_kv/" + q + "/latent_error"));
  }
  auto backend = make_cpu_backend();
  const ColumnTable t = run_latent_error(d, cells, *backend);
  for (const auto& [q, bytes] : stated) {
    SCOPED_TRACE(q);
    const size_t w = row_of(t, 0, "window_kv", q), c = row_of(t, 2, "compressed_kv", q);
    EXPECT_EQ(t.get<double>("bytes_per_token_layer")[w], bytes);
    EXPECT_EQ(t.get<double>("bytes_per_token_layer")[c], bytes);
    EXPECT_DOUBLE_EQ(t.get<double>("bits_per_element")[w], 8.0 * bytes / 512.0);
    // the decoded rows: c_kv part [T, 448] and k_pe part [T, 64] quantized apart
    const Layer& l = d.layer(0);
    const int64_t T = d.num_tokens();
    const QuantSpec spec = QuantSpec::parse(q);
    std::vector<float> a(T * 448), b(T * 64), da(a.size()), db(b.size()), x = l.window_kv, xh(x.size());
    for (int64_t r = 0; r < T; ++r) {
      std::copy(x.begin() + r * 512, x.begin() + r * 512 + 448, a.begin() + r * 448);
      std::copy(x.begin() + r * 512 + 448, x.begin() + (r + 1) * 512, b.begin() + r * 64);
    }
    const Target tc = spec.format == Format::Preset ? Target::CKV : Target::WindowKV;
    const Target tk = spec.format == Format::Preset ? Target::KPE : Target::WindowKV;
    (void)quantize_dequantize(spec, tc, a.data(), T, 448, d.seq_offsets, da.data());
    (void)quantize_dequantize(spec, tk, b.data(), T, 64, d.seq_offsets, db.data());
    for (int64_t r = 0; r < T; ++r) {
      std::copy(da.begin() + r * 448, da.begin() + (r + 1) * 448, xh.begin() + r * 512);
      std::copy(db.begin() + r * 64, db.begin() + (r + 1) * 64, xh.begin() + r * 512 + 448);
    }
    const double want = error_metrics(x.data(), xh.data(), T, 512).rel_fro;
    std::printf("%s on window_kv [%ld, 512]: %.0f B per entry, rel_fro %.6g\n", q.c_str(), static_cast<long>(T),
                bytes, want);
    EXPECT_DOUBLE_EQ(t.get<double>("rel_fro")[w], want);
  }
}

// A fitted format (Lloyd-Max codebooks) on compressed_kv fits on the entries of the fit split's sequences
// (compressed_offsets), not on the first tokens' worth of rows.
TEST_F(StudyV4Test, FittedFormatFitsOnTheFitSplitsEntries) {
  const Dump d = load(32, 8);
  const std::vector<Cell> cells = {find(plan_cells(config, d), "001/compressed_kv/lm3-channel/latent_error")};
  auto backend = make_cpu_backend();
  const ColumnTable t = run_latent_error(d, cells, *backend);
  const Layer& l = d.layer(1);
  const int64_t N = 8, D = 32;
  ASSERT_EQ(l.compressed_offsets, (std::vector<int64_t>{0, 5, 8}));
  std::vector<float> out(N * D), one(N * D);
  const QuantSpec spec = QuantSpec::parse("lm3-channel");
  (void)quantize_dequantize(spec, Target::CompressedKV, l.compressed_kv.data(), N, D, l.compressed_offsets,
                            out.data());
  const std::vector<int64_t> as_one = {0, N};  // one sequence: the fit would take the first 4 entries
  (void)quantize_dequantize(spec, Target::CompressedKV, l.compressed_kv.data(), N, D, as_one, one.data());
  const double want = error_metrics(l.compressed_kv.data(), out.data(), N, D).rel_fro;
  EXPECT_DOUBLE_EQ(t.get<double>("rel_fro")[0], want);
  EXPECT_NE(want, error_metrics(l.compressed_kv.data(), one.data(), N, D).rel_fro);
}

// One sequence with one CSA entry: no fit and held-out split of the entries, so klt (fitted on the fit split) does
// not apply to compressed_kv and index_k, with the layer named; the window's tokens still split, and lm (which then
// fits on every entry, latentq/split.h quantizer_fit_ranges) still runs.
TEST_F(StudyV4Test, AFitOnTooFewEntriesDoesNotApply) {
  lqtest::SynthV4Spec s;
  s.seq_lens = {6};
  s.query_rows = 2;
  lqtest::write_synth_v4(path, lqtest::make_synth_v4(s));
  LoadOptions o;
  o.data = false;
  const Dump d = load_dump(path, o);
  EXPECT_EQ(d.attrs.entry_split_problem,
            "layer 001 (csa) has 1 compressed entry in 1 sequence: no fit and held-out split of them (latentq/split.h)");
  const StudyConfig c = parse_config(R"(
[quantizers]
bits = [8]
schemes = ["sym"]
granularities = ["token"]
group_sizes = [0]
extra = ["klt,int4-asym-token", "lm3-channel"]
[indexer]
quantizers = ["bf16"]
)",
                                     "klt.toml", dir.path());
  const std::vector<NotApplicable> na = not_applicable(c, d.attrs);
  ASSERT_EQ(na.size(), 3u);  // klt on compressed_kv, then [svd], [cross_layer]
  EXPECT_EQ(na[0].quantizer, "klt,int4-asym-token");
  EXPECT_EQ(na[0].target, Target::CompressedKV);
  EXPECT_EQ(na[0].reason, "klt is fitted on the fit split of the entries, and " + d.attrs.entry_split_problem);
  std::vector<std::string> keys;
  for (const Cell& cell : plan_cells(c, d)) keys.push_back(cell.key());
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "000/window_kv/int8-sym-token/latent_error", "000/window_kv/klt,int4-asym-token/latent_error",
                      "000/window_kv/lm3-channel/latent_error", "001/window_kv/int8-sym-token/latent_error",
                      "001/window_kv/klt,int4-asym-token/latent_error", "001/window_kv/lm3-channel/latent_error",
                      "001/compressed_kv/int8-sym-token/latent_error", "001/compressed_kv/lm3-channel/latent_error",
                      "001/index_k/bf16/latent_error", "002/window_kv/int8-sym-token/latent_error",
                      "002/window_kv/klt,int4-asym-token/latent_error", "002/window_kv/lm3-channel/latent_error"}));
  const Dump full = load_dump(path);
  auto backend = make_cpu_backend();
  const ColumnTable t = run_latent_error(full, plan_cells(c, full), *backend);
  EXPECT_EQ(t.num_rows(), keys.size());
}

// /v4_cache: bytes per row from /latent_error, per token at long context (compressed: 1/compress_rate rows), per
// sequence for the window (sliding_window rows).
TEST_F(StudyV4Test, LongContextBytes) {
  const Dump d = load(32, 8);
  const std::vector<Cell> cells = plan_cells(config, d);
  auto backend = make_cpu_backend();
  const ColumnTable le = run_latent_error(d, cells, *backend);
  const std::vector<V4LayerInfo> info = parse_v4_layer_records(v4_layer_records(d));
  ASSERT_EQ(v4_layer_records(d), (std::vector<std::string>{"0:sliding:0:8", "1:csa:4:8", "2:hca:8:8"}));
  const ColumnTable t = v4_cache_table(le, info);
  bool csa = false, hca = false, window = false, index = false;
  for (size_t i = 0; i < t.num_rows(); ++i) {
    if (t.get<std::string>("quantizer")[i] != "int8-sym-token") continue;
    const std::string tg = t.get<std::string>("target")[i], type = t.get<std::string>("layer_type")[i];
    const double row = t.get<double>("bytes_per_row")[i], tok = t.get<double>("bytes_per_token")[i],
                 seq = t.get<double>("bytes_per_sequence")[i];
    if (tg == "compressed_kv" && type == "csa") csa = row == 34 && tok == 34.0 / 4 && std::isnan(seq);
    if (tg == "compressed_kv" && type == "hca") hca = row == 34 && tok == 34.0 / 8 && std::isnan(seq);
    if (tg == "window_kv" && type == "sliding") window = row == 34 && std::isnan(tok) && seq == 8 * 34;
    if (tg == "index_k") index = row == 18 && tok == 18.0 / 4;
  }
  EXPECT_TRUE(csa && hca && window && index);
  const ColumnTable s = summarize(le, config.all_quantizers(), d.attrs);
  EXPECT_EQ(s.get<std::string>("c_kv_accounting")[0], kV4SummaryNotApplicable);
  EXPECT_TRUE(std::isnan(s.get<double>("bytes_per_token_model")[0]));
}

}  // namespace
