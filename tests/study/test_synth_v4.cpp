// `latentq synth --preset deepseek-v4-flash` (latentq/synth_v4.h): the preset's shapes against V4-Flash's config,
// the dump it writes as load_dump reads it (attributes, shapes, the compressors' rules), the CSA top-k against the
// index score and the V4 engine's own selection, attn_out against the engine, the query's RMSNorm, purity, the CLI.
// The independent float64 recomputation of attn_out is tests/python/test_synth_v4.py's (latentq.dump_v4).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cli_capture.h"
#include "latentq/attention/v4.h"
#include "latentq/dump.h"
#include "latentq/synth_v4.h"
#include "synth_dump.h"

namespace {
using namespace latentq;

const V4Shape& flash() {
  const V4Shape* s = find_v4_preset("deepseek-v4-flash");
  if (!s) throw std::runtime_error("no deepseek-v4-flash preset");
  return *s;
}

// Hand-listed from transformers 5.24 models/deepseek_v4/configuration_deepseek_v4.py (DeepseekV4Config defaults,
// checkpoint deepseek-ai/DeepSeek-V4-Flash-Base) and DeepSeek-V4-Flash's config.json (compress_ratios
// [0, 0, 4, 128, 4, 128, ..., 4] for its 43 layers, then 0 for the MTP layer).
TEST(SynthV4, FlashPresetHasTheConfigShapes) {
  const V4Shape& s = flash();
  EXPECT_EQ(s.model, "deepseek-ai/DeepSeek-V4-Flash");
  EXPECT_EQ(s.num_heads, 64);
  EXPECT_EQ(s.head_dim, 512);
  EXPECT_EQ(s.qk_rope_head_dim, 64);  // head_dim · partial_rotary_factor 64/512
  EXPECT_EQ(s.sliding_window, 128);
  EXPECT_EQ(s.csa_rate, 4);
  EXPECT_EQ(s.hca_rate, 128);
  EXPECT_EQ(s.index_n_heads, 64);
  EXPECT_EQ(s.index_head_dim, 128);
  EXPECT_EQ(s.index_topk, 512);
  EXPECT_EQ(s.rope_theta, 10000.0);
  EXPECT_EQ(s.compress_rope_theta, 160000.0);
  EXPECT_EQ(s.vocab_size, 129280);
  ASSERT_EQ(s.compress_ratios.size(), 43u);
  EXPECT_EQ(std::vector<int64_t>(s.compress_ratios.begin(), s.compress_ratios.begin() + 8),
            (std::vector<int64_t>{0, 0, 4, 128, 4, 128, 4, 128}));
  EXPECT_EQ(s.compress_ratios.back(), 4);  // layer 42
  int64_t n[3] = {0, 0, 0};
  for (int64_t l = 0; l < 43; ++l) {
    const std::string t = s.layer_type(l);
    ++n[t == "sliding" ? 0 : t == "csa" ? 1 : 2];
  }
  EXPECT_EQ(n[0], 2);
  EXPECT_EQ(n[1], 21);
  EXPECT_EQ(n[2], 20);
  // a few layers of each type by default: 0-5 = sliding, sliding, csa, hca, csa, hca
  EXPECT_EQ(s.num_layers, 6);
  EXPECT_EQ(s.layer_type(3), "hca");
  EXPECT_EQ(s.compress_rate(2), 4);
  EXPECT_EQ(s.compress_rate(1), 0);
  EXPECT_THROW((void)s.layer_type(43), std::invalid_argument);
  EXPECT_NE(describe_v4_preset(s).find("shape-faithful only"), std::string::npos);
  EXPECT_NE(s.source.find("shape-faithful only"), std::string::npos);
  EXPECT_EQ(find_v4_preset("deepseek-v3"), nullptr);
}

// The ropes by hand (d_r = 64, 32 pairs). Main: 1e4^(−2k/64). Compress: 1.6e5 with YaRN factor 16 over 65,536
// original positions: correction range [floor(64·ln(65536/(32·2π)) / (2·ln 1.6e5)), ceil(… 1 rotation …)] = [15, 25],
// pairs below 15 keep θ's frequency, pairs from 25 divide it by 16, pair 20 is halfway: (0.5/16 + 0.5)·f.
TEST(SynthV4, RopeFrequenciesAreTheMainAndTheYarnCompressRope) {
  const std::vector<double> main = v4_inv_freq(flash(), false), comp = v4_inv_freq(flash(), true);
  ASSERT_EQ(main.size(), 32u);
  ASSERT_EQ(comp.size(), 32u);
  EXPECT_DOUBLE_EQ(main[1], std::pow(1e4, -2.0 / 64));
  EXPECT_DOUBLE_EQ(comp[0], 1.0);
  EXPECT_DOUBLE_EQ(comp[15], std::pow(1.6e5, -30.0 / 64));
  EXPECT_DOUBLE_EQ(comp[20], std::pow(1.6e5, -40.0 / 64) * (0.5 / 16 + 0.5));
  EXPECT_DOUBLE_EQ(comp[25], std::pow(1.6e5, -50.0 / 64) / 16);
  EXPECT_DOUBLE_EQ(comp[31], std::pow(1.6e5, -62.0 / 64) / 16);
}

// Four layers (sliding, sliding, csa, hca) over sequences of 300 and 200 tokens: HCA entries 2 + 1, CSA 75 + 50;
// index_topk 8 below the CSA entries the later rows see.
V4SynthOptions small(uint64_t seed = 3) {
  V4SynthOptions o;
  o.shape = flash();
  o.shape.num_layers = 4;
  o.shape.index_topk = 8;
  o.seq_lens = {300, 200};
  o.query_rows = 10;
  o.seed = seed;
  return o;
}

struct Written {
  lqtest::TempDir dir;
  Dump dump;
  SynthTokens tok;
};

// One dump of small() for the suite, removed after it.
class SynthV4Dump : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    w_ = new Written;
    write_synth_v4_dump(w_->dir / "v4.h5", small());
    w_->dump = load_dump(w_->dir / "v4.h5");
    w_->tok = synth_v4_tokens(small());
  }
  static void TearDownTestSuite() {
    delete w_;
    w_ = nullptr;
  }
  static const Written& written() { return *w_; }
  static Written* w_;
};
Written* SynthV4Dump::w_ = nullptr;

TEST_F(SynthV4Dump, DumpLoadsWithTheConfigAttributesAndShapes) {
  const Dump& D = written().dump;
  const DumpAttrs& A = D.attrs;
  EXPECT_EQ(A.cache_family, "deepseek_v4");
  EXPECT_EQ(A.num_layers, 4);
  EXPECT_EQ(A.num_heads, 64);
  EXPECT_EQ(A.head_dim, 512);
  EXPECT_EQ(A.qk_rope_head_dim, 64);
  EXPECT_EQ(A.index_head_dim, 128);
  EXPECT_NEAR(A.softmax_scale, 1 / std::sqrt(512.0), 1e-15);
  EXPECT_EQ(A.model, "synthetic:deepseek-v4-flash");
  EXPECT_EQ(D.seq_offsets, (std::vector<int64_t>{0, 300, 500}));
  EXPECT_EQ(D.compressed_layers, (std::vector<int>{2, 3}));
  EXPECT_EQ(D.indexer_layers, (std::vector<int>{2}));
  const char* types[] = {"sliding", "sliding", "csa", "hca"};
  const int64_t rates[] = {0, 0, 4, 128}, entries[] = {0, 0, 75 + 50, 2 + 1};
  for (int l = 0; l < 4; ++l) {
    SCOPED_TRACE(l);
    const Layer& L = D.layer(l);
    EXPECT_EQ(L.layer_type, types[l]);
    EXPECT_EQ(L.compress_rate, rates[l]);
    EXPECT_EQ(L.sliding_window, 128);
    EXPECT_NEAR(L.softmax_scale, 1 / std::sqrt(512.0), 1e-15);
    EXPECT_EQ(L.window_kv.size(), 500u * 512);
    EXPECT_EQ(L.q.size(), 10u * 64 * 512);
    EXPECT_EQ(L.attn_out.size(), 10u * 64 * 512);
    EXPECT_EQ(L.rope_cos.size(), 10u * 32);
    EXPECT_EQ(L.sinks.size(), 64u);
    EXPECT_EQ(L.num_rows(Target::CompressedKV, D.seq_offsets), entries[l]);
  }
  const Layer& csa = D.layer(2);
  EXPECT_EQ(csa.compressed_offsets, (std::vector<int64_t>{0, 75, 125}));
  EXPECT_EQ(csa.index_topk, 8);
  EXPECT_EQ(csa.index_heads, 64);
  EXPECT_NEAR(csa.index_softmax_scale, 1 / std::sqrt(128.0), 1e-15);
  EXPECT_EQ(csa.index_k.size(), 125u * 128);
  // the compressors' rules (data/README.md): CSA entry w spans [max(0, (w−1)·4), (w+1)·4), HCA [w·128, (w+1)·128),
  // both at RoPE position w·m
  EXPECT_EQ(std::vector<int64_t>(csa.compressed_span.begin(), csa.compressed_span.begin() + 6),
            (std::vector<int64_t>{0, 4, 0, 8, 4, 12}));
  EXPECT_EQ(csa.compressed_rope_position[76], 4);  // sequence 1's entry 1
  const Layer& hca = D.layer(3);
  EXPECT_EQ(hca.compressed_offsets, (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(hca.compressed_span, (std::vector<int64_t>{0, 128, 128, 256, 0, 128}));
  EXPECT_EQ(hca.compressed_rope_position, (std::vector<int64_t>{0, 128, 0}));
}

// index_selected is DeepseekV4Indexer's picks: the visible entries by descending score s[i, w] = Σ_h index_w[i, h] ·
// relu(c^−1/2 · index_q[i, h] · index_k[w]) (recomputed here), −1 after; its set is the V4 engine's select_topk.
TEST_F(SynthV4Dump, CsaPicksAreTheTopKOfTheIndexScore) {
  const Dump& D = written().dump;
  const Layer& L = D.layer(2);
  const int64_t n = L.index_heads, c = L.index_dim, k = L.index_topk;
  int rows_full = 0;
  for (size_t i = 0; i < L.q_rows.size(); ++i) {
    const int64_t t = L.q_rows[i];
    const size_t s = t >= 300 ? 1 : 0;
    const int64_t p = t - D.seq_offsets[s], e0 = L.compressed_offsets[s];
    const int64_t nvis = std::min(L.compressed_offsets[s + 1] - e0, (p + 1) / 4);
    std::vector<double> score(static_cast<size_t>(nvis), 0.0);
    for (int64_t w = 0; w < nvis; ++w)
      for (int64_t h = 0; h < n; ++h) {
        double dot = 0;
        for (int64_t x = 0; x < c; ++x)
          dot += static_cast<double>(L.index_q[(i * n + h) * c + x]) * L.index_k[(e0 + w) * c + x];
        score[static_cast<size_t>(w)] += L.index_w[i * n + h] * std::max(0.0, dot / std::sqrt(128.0));
      }
    std::vector<int64_t> want(static_cast<size_t>(k), -1);
    std::vector<int64_t> order(static_cast<size_t>(nvis));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[a] > score[b]; });
    std::copy_n(order.begin(), std::min(k, nvis), want.begin());
    const std::vector<int64_t> got(L.index_selected.begin() + static_cast<int64_t>(i) * k,
                                   L.index_selected.begin() + static_cast<int64_t>(i + 1) * k);
    EXPECT_EQ(got, want) << "row " << i << " (position " << p << ", " << nvis << " visible)";
    rows_full += nvis > k;
  }
  EXPECT_GE(rows_full, 6);  // most rows choose among more entries than they read
  probes::V4Queries q;
  q.layer_type = probes::V4LayerType::Csa;
  q.num_heads = 64, q.head_dim = 512, q.rope_dim = 64, q.sliding_window = 128, q.softmax_scale = 1 / std::sqrt(512.0);
  q.num_tokens = D.num_tokens(), q.seq_offsets = D.seq_offsets, q.positions = D.positions, q.q_rows = L.q_rows;
  q.q = L.q, q.sinks = L.sinks, q.rope_cos = L.rope_cos, q.rope_sin = L.rope_sin;
  q.compressed_offsets = L.compressed_offsets, q.compressed_span = L.compressed_span;
  const probes::V4Attention<double> engine(q);
  const probes::KeySelection picks = engine.selection_from_picks(L.index_selected, k);
  const probes::KeySelection top =
      engine.select_topk({n, c, k, L.index_softmax_scale, L.index_q, L.index_w}, L.index_k);
  EXPECT_EQ(picks.offsets, top.offsets);
  EXPECT_EQ(picks.keys, top.keys);
  // attn_out is the engine's float64 output rounded once: the float32 engine agrees to float32 rounding
  const probes::V4Attention<float> f32(q);
  const auto r = f32.run(L.window_kv, L.compressed_kv, &picks);
  double num = 0, den = 0;
  for (size_t j = 0; j < r.out.size(); ++j) {
    num = std::max(num, std::abs(static_cast<double>(r.out[j]) - L.attn_out[j]));
    den = std::max(den, std::abs(static_cast<double>(L.attn_out[j])));
  }
  EXPECT_LT(num / den, 1e-5) << num << " / " << den;
}

// q = RoPE(q_b_norm(·)): an unweighted RMSNorm per head, which RoPE (a rotation of pairs) keeps: mean q² = 1.
TEST_F(SynthV4Dump, QueryHeadsAreRmsNormalized) {
  const Layer& L = written().dump.layer(3);
  for (size_t ih = 0; ih < L.q.size() / 512; ih += 37) {
    double ss = 0;
    for (size_t x = 0; x < 512; ++x) ss += static_cast<double>(L.q[ih * 512 + x]) * L.q[ih * 512 + x];
    EXPECT_NEAR(ss / 512, 1.0, 1e-5) << "row·head " << ih;
  }
}

TEST_F(SynthV4Dump, LayersArePureFunctionsOfSeedAndIndex) {
  const Written& w = written();
  const SynthV4Layer again = synth_v4_layer(small(), w.tok, 3);
  EXPECT_EQ(again.window_kv, w.dump.layer(3).window_kv);
  EXPECT_EQ(again.compressed_kv, w.dump.layer(3).compressed_kv);
  EXPECT_EQ(again.attn_out, w.dump.layer(3).attn_out);
  const SynthV4Layer other = synth_v4_layer(small(4), synth_v4_tokens(small(4)), 3);
  EXPECT_NE(other.window_kv, again.window_kv);
}

TEST(SynthV4, CliWritesTheV4PresetAndRefusesBadInput) {
  lqtest::TempDir dir;
  const auto list = lqtest::cli({"synth", "--list"});
  EXPECT_EQ(list.rc, 0) << list.err;
  EXPECT_CONTAINS(list.out, "deepseek-v4-flash cache_family deepseek_v4");
  const auto many = lqtest::cli({"synth", "--preset", "deepseek-v4-flash", "--layers", "44", "--out",
                                 (dir / "x.h5").string()});
  EXPECT_EQ(many.rc, 2);
  EXPECT_CONTAINS(many.err, "layers = 44 must be in [1, 43]");
  const auto unknown = lqtest::cli({"synth", "--preset", "deepseek-v9", "--out", (dir / "x.h5").string()});
  EXPECT_CONTAINS(unknown.err, "deepseek-v4-flash (DeepSeek-V4)");
  EXPECT_TRUE(dir.entries().empty());
  // 64 tokens: 16 CSA entries, no HCA entry (fewer tokens than its rate 128): an empty compressed_kv [0, 512]
  const auto ok = lqtest::cli({"synth", "--preset", "deepseek-v4-flash", "--layers", "4", "--seqs", "1", "--seq-len",
                               "64", "--query-rows", "4", "--index-topk", "5", "--out", (dir / "f.h5").string()});
  ASSERT_EQ(ok.rc, 0) << ok.err;
  EXPECT_CONTAINS(ok.out, "shape-faithful only");
  const Dump D = load_dump(dir / "f.h5");
  EXPECT_EQ(D.layer(2).layer_type, "csa");
  EXPECT_EQ(D.layer(2).index_topk, 5);
  EXPECT_EQ(D.layer(2).compressed_offsets, (std::vector<int64_t>{0, 16}));
  EXPECT_EQ(D.layer(3).layer_type, "hca");
  EXPECT_EQ(D.layer(3).compressed_offsets, (std::vector<int64_t>{0, 0}));
  EXPECT_TRUE(D.layer(3).compressed_kv.empty());
  EXPECT_EQ(D.compressed_layers, (std::vector<int>{2}));
}

}  // namespace
