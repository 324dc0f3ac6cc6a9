// `latentq synth` (latentq/synth.h): preset dims, RoPE by hand, the dump it writes (schema, the attention
// check, c_kv structure), per-layer purity, chunked datasets and layer-streamed memory.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include "cli_capture.h"
#include "latentq/dump.h"
#include "latentq/probe_attention.h"
#include "latentq/probe_study.h"
#include "latentq/attention/attention.h"
#include "latentq/analysis/cross_layer.h"
#include "latentq/synth.h"
#include "latentq/attention/dsa.h"
#include "synth_dump.h"

namespace {
using namespace latentq;

struct Want {
  const char* name;
  int64_t layers, heads, r, rope, nope, v;
  double scale;
  const char* layout;
};

// the models' config.json (synth.cpp cites each), data/tiny-mla/config.json.
TEST(Synth, PresetsHaveTheModelsDims) {
  const Want want[] = {
      {"tiny-mla", 6, 6, 128, 32, 64, 64, 1 / std::sqrt(96.0), "interleaved"},
      {"deepseek-v2-lite", 27, 16, 512, 64, 128, 128, 0.1147214, "interleaved"},
      {"deepseek-v3", 61, 128, 512, 64, 128, 128, 0.1352338, "half"},
      {"glm-4.7-flash", 47, 20, 512, 64, 192, 256, 1.0 / 16, "half"},
      {"minicpm3-4b", 62, 40, 256, 32, 64, 64, 1 / std::sqrt(96.0), "half"},
      {"deepseek-v3.2", 61, 128, 512, 64, 128, 128, 0.1352338, "half"},
      {"glm-5", 78, 64, 512, 64, 192, 256, 1.0 / 16, "half"},
  };
  ASSERT_EQ(model_presets().size(), std::size(want));
  for (const Want& w : want) {
    const ModelShape& m = find_preset(w.name);
    EXPECT_EQ(m.num_layers, w.layers) << w.name;
    EXPECT_EQ(m.num_heads, w.heads) << w.name;
    EXPECT_EQ(m.kv_lora_rank, w.r) << w.name;
    EXPECT_EQ(m.qk_rope_head_dim, w.rope) << w.name;
    EXPECT_EQ(m.qk_nope_head_dim, w.nope) << w.name;
    EXPECT_EQ(m.v_head_dim, w.v) << w.name;
    EXPECT_NEAR(m.softmax_scale, w.scale, 1e-7) << w.name;
    EXPECT_EQ(m.rope_layout, w.layout) << w.name;
  }
  EXPECT_THROW(find_preset("deepseek-v4"), std::invalid_argument);
  // sparse MLA: the indexers of DeepseekV32Config / GlmMoeDsaConfig (transformers 5.24 defaults)
  EXPECT_EQ(find_preset("deepseek-v3.2").index_n_heads, 64);
  EXPECT_EQ(find_preset("glm-5").index_n_heads, 32);
  for (const char* n : {"deepseek-v3.2", "glm-5"}) {
    EXPECT_EQ(find_preset(n).index_head_dim, 128) << n;
    EXPECT_EQ(find_preset(n).index_topk, 2048) << n;
  }
  for (const char* n : {"tiny-mla", "deepseek-v3", "glm-4.7-flash"}) EXPECT_FALSE(find_preset(n).sparse()) << n;
}

// A sparse preset's dump: cache_family sparse_mla; per row min(position + 1, k) keys chosen by the dumped indexer
// tensors (dsa_select_topk), and attn_out the attention over them (the probes' check, < 1e-5; dense is far off).
// One indexer width per dump: a layer whose index_k is 64 wide beside a 128-wide one is refused, naming both layers.
TEST(Synth, IndexerWidthsThatDisagreeAreRefused) {
  lqtest::TempDir dir;
  SynthOptions o;
  o.shape = find_preset("deepseek-v3.2");
  o.shape.num_layers = 2;
  o.shape.index_topk = 8;
  o.seqs = 1;
  o.seq_len = 24;
  o.query_rows = 4;
  const auto path = dir / "v32.h5";
  write_synth_dump(path, o);
  ASSERT_EQ(load_dump(path).attrs.index_head_dim, 128);
  lqtest::delete_link(path, "/layers/001/index_k");
  lqtest::put_f32(path, "/layers/001/index_k", {24, 64}, std::vector<float>(24 * 64, 0.5f));
  try {
    (void)load_dump(path);
    ADD_FAILURE() << "a dump with two index_k widths was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("/layers/001/index_k is 64 wide but layer 000's index_k is 128 wide"),
              std::string::npos)
        << e.what();
  }
}

TEST(Synth, SparsePresetsWriteTheSelectionAndTheIndexer) {
  lqtest::TempDir dir;
  for (const char* name : {"deepseek-v3.2", "glm-5"}) {
    SynthOptions o;
    o.shape = find_preset(name);
    o.shape.num_layers = 1;
    o.shape.index_topk = 16;  // below the window, as 2048 is at long context
    o.seqs = 2;
    o.seq_len = 48;
    o.query_rows = 6;
    o.seed = 3;
    const auto path = dir / (std::string(name) + ".h5");
    write_synth_dump(path, o);
    const Dump d = load_dump(path);
    SCOPED_TRACE(name);
    EXPECT_EQ(d.attrs.cache_family, "sparse_mla");
    // the family's table row: the latent and the indexer key cache, a per-row selection; index_k's width from the
    // dataset, held by the layer
    EXPECT_TRUE(d.attrs.family().topk_selection);
    EXPECT_EQ(d.attrs.index_head_dim, 128);
    EXPECT_EQ(d.attrs.width(Target::IndexK), 128);
    EXPECT_EQ(d.indexer_layers, std::vector<int>{0});
    EXPECT_TRUE(d.holds(0, Target::IndexK) && d.holds(0, Target::CKV) && d.holds(0, Target::KPE));
    const Layer& L = d.layers.at(0);
    EXPECT_EQ(L.rows(Target::IndexK).size(), L.index_k.size());
    ASSERT_TRUE(L.sparse() && L.has_indexer());
    EXPECT_EQ(L.index_heads, o.shape.index_n_heads);
    EXPECT_EQ(L.index_dim, 128);
    EXPECT_EQ(L.index_topk, 16);
    for (size_t i = 0; i < L.q_rows.size(); ++i)
      EXPECT_EQ(L.topk_offsets[i + 1] - L.topk_offsets[i], std::min<int64_t>(16, L.q_rows[i] % 48 + 1)) << i;
    const probes::KeySelection again = probes::dsa_select_topk(L.index_q, L.index_w, L.index_k, L.index_heads,
                                                               L.index_dim, L.q_rows, d.seq_offsets,
                                                               L.index_softmax_scale, L.index_topk);
    EXPECT_EQ(again.offsets, L.topk_offsets);
    EXPECT_EQ(again.keys, L.topk_keys);
    const auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
      double e = 0, n = 0;
      for (size_t i = 0; i < a.size(); ++i) e += (a[i] - b[i]) * double(a[i] - b[i]), n += double(b[i]) * b[i];
      return std::sqrt(e / n);
    };
    EXPECT_LT(rel(probes::absorbed_attention<float>(attention_queries(d, L), L.c_kv, L.k_pe).out, L.attn_out), 1e-5);
    Layer dense = L;
    dense.topk_offsets.clear(), dense.topk_keys.clear();
    EXPECT_GT(rel(probes::absorbed_attention<float>(attention_queries(d, dense), L.c_kv, L.k_pe).out, L.attn_out),
              1e-2);
  }
}

// Each preset's description names the config.json its dims come from and claims nothing about another model (the
// deepseek-v3 preset once said Kimi K2 shares its attention shape: K2 has 64 heads and another softmax scale).
TEST(Synth, PresetSourcesNameTheirOwnConfigOnly) {
  const std::vector<std::string> models = {"DeepSeek-V2-Lite", "DeepSeek-V3", "GLM-4.7-Flash", "MiniCPM3-4B", "Kimi",
                                           "R1",               "K2",          "V3.2",          "V4"};
  for (const ModelShape& m : model_presets()) {
    SCOPED_TRACE(m.name + ": " + m.source);
    EXPECT_NE(m.source.find("config.json"), std::string::npos);
    const std::string own = m.model.substr(m.model.find('/') + 1);  // "deepseek-ai/DeepSeek-V3" -> "DeepSeek-V3"
    if (m.name != "tiny-mla") EXPECT_EQ(m.source.rfind(own + " config.json", 0), 0u);
    for (const std::string& other : models)
      if (own.find(other) == std::string::npos) EXPECT_EQ(m.source.find(other), std::string::npos) << other;
  }
}

// d = 4, θ = 10000, position 1: pair 0 turns by 1 rad, pair 1 by 10000^(-1/2) = 0.01 rad.
TEST(Synth, RopeRotatesThePairsOfEachLayout) {
  std::vector<float> x = {1, 0, 1, 0};
  apply_rope(x, 4, {1}, 10000.0, "interleaved");
  EXPECT_FLOAT_EQ(x[0], static_cast<float>(std::cos(1.0)));
  EXPECT_FLOAT_EQ(x[1], static_cast<float>(std::sin(1.0)));
  EXPECT_FLOAT_EQ(x[2], static_cast<float>(std::cos(0.01)));
  EXPECT_FLOAT_EQ(x[3], static_cast<float>(std::sin(0.01)));
  std::vector<float> y = {1, 1, 0, 0};  // half: pairs (0, 2) and (1, 3)
  apply_rope(y, 4, {1}, 10000.0, "half");
  EXPECT_FLOAT_EQ(y[0], static_cast<float>(std::cos(1.0)));
  EXPECT_FLOAT_EQ(y[1], static_cast<float>(std::cos(0.01)));
  EXPECT_FLOAT_EQ(y[2], static_cast<float>(std::sin(1.0)));
  EXPECT_FLOAT_EQ(y[3], static_cast<float>(std::sin(0.01)));
  std::vector<float> z = {3, 4, 0, 0};  // position 0: unchanged
  apply_rope(z, 4, {0}, 10000.0, "half");
  EXPECT_EQ(z, (std::vector<float>{3, 4, 0, 0}));
  EXPECT_THROW(apply_rope(z, 3, {0}, 1e4, "half"), std::invalid_argument);
  EXPECT_THROW(apply_rope(z, 4, {0}, 1e4, "neox"), std::invalid_argument);
}

SynthOptions small(const std::string& preset, int64_t layers = 2) {
  SynthOptions o;
  o.shape = find_preset(preset);
  o.shape.num_layers = layers;
  o.seqs = 2;
  o.seq_len = 96;
  o.query_rows = 6;
  o.seed = 7;
  return o;
}

// Every preset: the file loads as latentq-dump/1 with the preset's attrs, and the float32 absorbed
// recomputation (what `latentq run`'s /attention_check does) matches attn_out far inside its 1e-4.
TEST(Synth, EveryPresetWritesADumpWhoseAttentionCheckPasses) {
  lqtest::TempDir dir;
  for (const ModelShape& m : model_presets()) {
    const SynthOptions o = small(m.name, m.name == "tiny-mla" ? 2 : 1);
    const auto path = dir / (m.name + ".h5");
    write_synth_dump(path, o);
    const Dump d = load_dump(path);
    EXPECT_EQ(d.attrs.num_layers, m.name == "tiny-mla" ? 2 : 1) << m.name;
    EXPECT_EQ(d.attrs.kv_lora_rank, m.kv_lora_rank) << m.name;
    EXPECT_EQ(d.attrs.num_heads, m.num_heads) << m.name;
    EXPECT_EQ(d.attrs.qk_rope_head_dim, m.qk_rope_head_dim) << m.name;
    EXPECT_EQ(d.attrs.qk_nope_head_dim, m.qk_nope_head_dim) << m.name;
    EXPECT_EQ(d.attrs.v_head_dim, m.v_head_dim) << m.name;
    EXPECT_EQ(d.attrs.rope_layout, m.rope_layout) << m.name;
    EXPECT_DOUBLE_EQ(d.attrs.softmax_scale, m.softmax_scale) << m.name;
    EXPECT_EQ(d.num_tokens(), 192);
    EXPECT_EQ(d.seq_offsets, (std::vector<int64_t>{0, 96, 192}));
    for (const Layer& L : d.layers) {
      ASSERT_TRUE(L.has_attention());
      // the query-row rule: 3 rows per sequence of 96 at local 31, 63, 95
      EXPECT_EQ(L.q_rows, (std::vector<int32_t>{31, 63, 95, 127, 159, 191}));
      // the queries as latentq run's attention check builds them from the dump
      const probes::AttentionQueries q = attention_queries(d, L);
      const auto r = probes::absorbed_attention<float>(q, L.c_kv, L.k_pe);
      double num = 0, den = 0;
      for (size_t i = 0; i < r.out.size(); ++i) {
        num += std::pow(double(r.out[i]) - L.attn_out[i], 2);
        den += std::pow(double(L.attn_out[i]), 2);
      }
      EXPECT_LT(std::sqrt(num / den), 1e-5) << m.name << " layer " << L.index << " seed 7";
      EXPECT_GT(den, 0) << m.name;
    }
  }
}

// tiny-mla's low-rank model: a decaying spectrum (99% of the energy in ≤ 30% of the directions), a few
// large channels, and each row is γ ⊙ (unit-RMS vector).
TEST(Synth, LowRankModelHasLowEffectiveRankAndOutlierChannels) {
  const SynthOptions o = small("tiny-mla", 1);
  ASSERT_EQ(o.shape.latent, LatentModel::kLowRank);
  const SynthTokens tok = synth_tokens(o);
  const SynthLayer L = synth_layer(o, tok, 0);
  const int64_t T = tok.num_tokens(), r = o.shape.kv_lora_rank;
  Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> c(L.c_kv.data(), T, r);
  // column RMS: the outliers stand out of the median by > 5x
  std::vector<double> rms(static_cast<size_t>(r));
  for (int64_t j = 0; j < r; ++j)
    rms[static_cast<size_t>(j)] = std::sqrt(c.col(j).cast<double>().squaredNorm() / double(T));
  std::vector<double> sorted = rms;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GT(sorted.back() / sorted[sorted.size() / 2], 5.0) << "seed 7, [192, 128]";
  EXPECT_LT(sorted[sorted.size() - 8] / sorted[sorted.size() / 2], 3.0) << "only a few outliers";
  // whiten by the column RMS and look at the spectrum (the gains would otherwise dominate it)
  Eigen::MatrixXd w = c.cast<double>();
  for (int64_t j = 0; j < r; ++j) w.col(j) /= rms[static_cast<size_t>(j)];
  const Eigen::VectorXd s = Eigen::JacobiSVD<Eigen::MatrixXd>(w).singularValues();
  const double total = s.squaredNorm();
  double acc = 0;
  int64_t k99 = 0;
  while (acc < 0.99 * total) acc += s(k99) * s(k99), ++k99;
  EXPECT_LT(k99, r * 3 / 10) << "99% energy rank " << k99 << " of " << r;
  EXPECT_GT(k99, 8);
}

// ---- the stand-in (StandinModel): the properties its parameters set, on seeded V2-Lite-shaped layers ----

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

SynthOptions standin(int64_t layers, int64_t seqs, int64_t seq_len, uint64_t seed = 11) {
  SynthOptions o;
  o.shape = find_preset("deepseek-v2-lite");
  o.shape.num_layers = layers;
  o.seqs = seqs;
  o.seq_len = seq_len;
  o.query_rows = 16;
  o.seed = seed;
  return o;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * double(v.size() - 1))];
}

TEST(Synth, StandinPresetsShareTheModel) {
  for (const ModelShape& m : model_presets())
    EXPECT_EQ(m.latent, m.name == "tiny-mla" ? LatentModel::kLowRank : LatentModel::kStandin) << m.name;
  for (int64_t l : {1, 5, 25}) EXPECT_TRUE(is_standin_sink_layer(l)) << l;
  for (int64_t l : {0, 2, 3, 4, 26}) EXPECT_FALSE(is_standin_sink_layer(l)) << l;
  EXPECT_EQ(standin_spike_channels(512), 96);  // 0.1875 · 512
  EXPECT_EQ(standin_spike_channels(256), 48);
  EXPECT_EQ(standin_spike_channels(1), 0);
}

// The first token of each sequence puts its energy in the layer's sink channel: the sink adds 50·‖x‖ to
// a dormant channel, so after RMSNorm that channel holds √r·50/√(50² + 1) of x̂ and |c_kv| there is
// γ_sink times that, γ_sink = sink_layer_gain (28) in a sink layer, sink_gain (4) elsewhere; every other
// entry of the row is ≈ γ·z/50 on a bulk channel (< 0.2) and (z + μ_k + b)/50 on a spike channel (its
// offset and burst, ordinary layers: < (5 + 4·spike_offset_sigma + burst_magnitude)/50). An ordinary
// layer's values stay below spike_gain_hi·√r (|x̂_c| ≤ √r).
TEST(Synth, StandinFirstTokensAreSinks) {
  const StandinModel& P = standin_model();
  const SynthOptions o = standin(6, 3, 64);
  const SynthTokens tok = synth_tokens(o);
  const int64_t T = tok.num_tokens(), r = o.shape.kv_lora_rank;
  const double phi = P.sink_magnitude / std::sqrt(P.sink_magnitude * P.sink_magnitude + 1);
  for (int64_t l = 0; l < 6; ++l) {
    const SynthLayer L = synth_layer(o, tok, l);
    Eigen::Map<const RowMat> c(L.c_kv.data(), T, r);
    const double gain = is_standin_sink_layer(l) ? P.sink_layer_gain : P.sink_gain;
    Eigen::Index ch0 = -1;
    for (size_t s = 0; s + 1 < tok.seq_offsets.size(); ++s) {
      const int64_t t = tok.seq_offsets[s];
      Eigen::Index ch = 0;
      const double top = c.row(t).cwiseAbs().maxCoeff(&ch);
      if (ch0 < 0) ch0 = ch;
      EXPECT_EQ(ch, ch0) << "layer " << l << " sequence " << s << ": one sink channel per layer (seed 11)";
      EXPECT_NEAR(top, gain * std::sqrt(double(r)) * phi, 2e-3 * top) << "layer " << l << " sequence " << s;
      double rest = 0;
      for (int64_t j = 0; j < r; ++j)
        if (j != ch) rest = std::max(rest, double(std::abs(c(t, j))));
      const double bound = is_standin_sink_layer(l) ? 0.2
                                                    : std::max(0.2, (5 + 4 * P.spike_offset_sigma + P.burst_magnitude) /
                                                                        P.sink_magnitude);
      EXPECT_LT(rest, bound) << "layer " << l << ": the sink row is one channel";
    }
    const double amax = c.cwiseAbs().maxCoeff();
    if (is_standin_sink_layer(l))
      EXPECT_NEAR(amax, P.sink_layer_gain * std::sqrt(double(r)) * phi, 2e-3 * amax) << "layer " << l;
    else
      EXPECT_LE(amax, P.spike_gain_hi * std::sqrt(double(r))) << "layer " << l << ": spikes and the sink";
  }
}

// Outlier channels: in an ordinary layer exactly the sink channel and the K = 96 spike channels have an
// absmax above 5x the median channel's (over ≈ 43 spikes per channel one reaches m ≥ 0.5, P = 0.19 each,
// so γ_k·√r·0.45 ≥ 2·22.6·0.45; a bulk channel stays near 4 RMS with γ ≤ e^(0.2·3), a spike channel's
// bursts alone reach ≈ 10 + |μ_k|). Seeded (11, [4096, 512]): the 97th largest absmax is 9.9x the median,
// the 98th 2.0x.
TEST(Synth, StandinOutlierChannelsAreTheSinkAndSpikeChannels) {
  const SynthOptions o = standin(1, 4, 1024);
  const SynthTokens tok = synth_tokens(o);
  const SynthLayer L = synth_layer(o, tok, 0);
  const int64_t T = tok.num_tokens(), r = o.shape.kv_lora_rank;
  Eigen::Map<const RowMat> c(L.c_kv.data(), T, r);
  std::vector<double> amax(static_cast<size_t>(r));
  for (int64_t j = 0; j < r; ++j) amax[static_cast<size_t>(j)] = c.col(j).cwiseAbs().maxCoeff();
  const double med = quantile(amax, 0.5);
  const int64_t outliers = std::count_if(amax.begin(), amax.end(), [&](double a) { return a > 5 * med; });
  EXPECT_EQ(outliers, standin_spike_channels(r) + 1) << "seed 11, [4096, 512], median absmax " << med;
  EXPECT_GT(quantile(amax, 1.0) / med, 15.0) << "the sink channel: 4·√512·φ against ≈ 4 (seed 11)";
}

// Heavy-tailed per-token magnitudes: in an ordinary layer most tokens are ordinary (‖c_t‖ near
// √(416·e^(2σ²) + 96·(1 + spike_offset_sigma² + burst_rate·burst_magnitude²)) ≈ 36 plus a small spike: the
// bulk channels, and the spike channels' offsets and bursts), and a Lomax tail of tokens puts most of its
// energy in one spike channel (‖c_t‖ up to γ_k·√r ≤ 7.5·22.6 = 170). Seeded (11): p10 34.3, p50 39.6,
// p99 145, max 166.
TEST(Synth, StandinTokenNormsAreHeavyTailed) {
  const SynthOptions o = standin(1, 4, 512);
  const SynthTokens tok = synth_tokens(o);
  const SynthLayer L = synth_layer(o, tok, 0);
  const int64_t T = tok.num_tokens(), r = o.shape.kv_lora_rank;
  Eigen::Map<const RowMat> c(L.c_kv.data(), T, r);
  std::vector<double> n;
  for (int64_t t = 0; t < T; ++t)
    if (tok.positions[static_cast<size_t>(t)] > 0) n.push_back(c.row(t).cast<double>().norm());
  const double p50 = quantile(n, 0.5);
  EXPECT_GT(quantile(n, 0.1) / p50, 0.85) << "a narrow body (seed 11, [2048, 512])";
  EXPECT_GT(quantile(n, 0.99) / p50, 3.0) << "a long tail";
  EXPECT_LE(quantile(n, 1.0), standin_model().spike_gain_hi * std::sqrt(double(r)));
}

// The spectrum (centered, all tokens): the outlier channels take the top directions, the white bulk
// keeps the bottom half of the directions far from empty (the real latent's bottom half: ≈ 16%;
// tiny-mla's: 0.001%).
TEST(Synth, StandinSpectrumKeepsEnergyInTheBottomHalf) {
  const SynthOptions o = standin(2, 4, 512);
  const SynthTokens tok = synth_tokens(o);
  const int64_t T = tok.num_tokens(), r = o.shape.kv_lora_rank;
  for (int64_t l : {0, 1}) {
    const SynthLayer L = synth_layer(o, tok, l);
    Eigen::MatrixXd x = Eigen::Map<const RowMat>(L.c_kv.data(), T, r).cast<double>();
    x.rowwise() -= x.colwise().mean();
    const Eigen::VectorXd s2 = Eigen::BDCSVD<Eigen::MatrixXd>(x).singularValues().array().square();
    const double total = s2.sum(), top8 = s2.head(r / 8).sum() / total, bottom = s2.tail(r / 2).sum() / total;
    // seeded (11): layer 0 top 1/8 0.716, bottom half 0.043; layer 1 (sink layer) 0.741, 0.055
    EXPECT_GT(top8, 0.6) << "layer " << l << ": the outlier channels (97 of 512) lead";
    EXPECT_LT(top8, 0.85) << "layer " << l;
    EXPECT_GT(bottom, 0.03) << "layer " << l << ": the bulk is white";
    EXPECT_LT(bottom, 0.08) << "layer " << l;
  }
}

// Layers are independent draws: adjacent layers' matched channels correlate no more than independent
// channels do. Two independent AR(1) series (ρ = 0.8, the bulk's token correlation) over T tokens have a
// sample Pearson of variance (1 + ρ²) / ((1 − ρ²)·T), so E|ρ̂| = √(2/π) times its square root.
TEST(Synth, StandinAdjacentLayersAreUncorrelated) {
  const SynthOptions o = standin(3, 4, 1024);
  const SynthTokens tok = synth_tokens(o);
  const int64_t T = tok.num_tokens(), r = o.shape.kv_lora_rank;
  const double rho = standin_model().rho;
  const double independent = std::sqrt(2 / M_PI) * std::sqrt((1 + rho * rho) / ((1 - rho * rho) * double(T)));
  std::vector<SynthLayer> L;
  for (int64_t l = 0; l < 3; ++l) L.push_back(synth_layer(o, tok, l));
  for (int64_t l = 0; l + 1 < 3; ++l) {
    const auto p = probes::cross_layer_pair(L[l].c_kv.data(), L[l + 1].c_kv.data(), T, r);
    EXPECT_LE(p.pearson_mean_abs, independent) << "layers " << l << "-" << l + 1 << " (seed 11, T " << T << ")";
    EXPECT_LT(p.cka_linear, 0.1) << "layers " << l << "-" << l + 1;
  }
}

// The queries are consistent with the latents: per head the query's sink component gives the first
// token a share of the attention that varies across heads, and no single key takes every query's
// attention (scores read x̂ = x / rms(x), std ≈ softmax_scale·√r ≈ 2.6).
TEST(Synth, StandinSinksDrawAttentionWithoutDegenerateScores) {
  const SynthOptions o = standin(2, 2, 512);
  const SynthTokens tok = synth_tokens(o);
  const ModelShape& m = o.shape;
  for (int64_t l : {0, 1}) {
    const SynthLayer L = synth_layer(o, tok, l);
    probes::AttentionQueries q;
    q.dims = {m.num_heads, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim};
    q.num_tokens = tok.num_tokens();
    q.seq_offsets = tok.seq_offsets;
    q.q_rows = tok.q_rows;
    q.q_nope = L.q_nope;
    q.q_pe = L.q_pe;
    q.w_uk = L.w_uk;
    q.w_uv = L.w_uv;
    q.softmax_scale = m.softmax_scale;
    const auto res = probes::absorbed_attention<double>(q, L.c_kv, L.k_pe, true);
    std::vector<double> sink, top_other;
    for (int64_t i = 0; i < res.num_queries; ++i)
      for (int64_t h = 0; h < res.num_heads; ++h) {
        const auto p = res.prob(i, h);
        sink.push_back(p[0]);
        top_other.push_back(*std::max_element(p.begin() + 1, p.end()));
      }
    const double mean = std::accumulate(sink.begin(), sink.end(), 0.0) / double(sink.size());
    // seeded (11): sink mass mean 0.31 / 0.29, p10 0.000, p90 0.96 / 0.99; top other key p50 0.20 / 0.18
    EXPECT_GT(mean, 0.15) << "layer " << l << ": the first token draws attention";
    EXPECT_LT(mean, 0.5) << "layer " << l;
    EXPECT_GT(quantile(sink, 0.9), 0.9) << "layer " << l << ": some heads are sink heads";
    EXPECT_LT(quantile(sink, 0.1), 0.01) << "layer " << l << ": some heads ignore the sink";
    EXPECT_LT(quantile(top_other, 0.5), 0.5) << "layer " << l << ": no key takes every query";
  }
}

TEST(Synth, LayersArePureFunctionsOfSeedAndIndex) {
  SynthOptions a = small("minicpm3-4b", 3), b = small("minicpm3-4b", 7);
  const SynthTokens ta = synth_tokens(a), tb = synth_tokens(b);
  const SynthLayer la = synth_layer(a, ta, 2), lb = synth_layer(b, tb, 2);
  EXPECT_EQ(la.c_kv, lb.c_kv);
  EXPECT_EQ(la.k_pe, lb.k_pe);
  EXPECT_EQ(la.attn_out, lb.attn_out);
  EXPECT_NE(la.c_kv, synth_layer(a, ta, 1).c_kv);
  b.seed = 8;
  EXPECT_NE(la.c_kv, synth_layer(b, synth_tokens(b), 2).c_kv);
}

TEST(Synth, DatasetsAreChunked) {
  lqtest::TempDir dir;
  write_synth_dump(dir / "d.h5", small("deepseek-v3", 1));
  H5::H5File f((dir / "d.h5").string(), H5F_ACC_RDONLY);
  for (const char* name :
       {"/layers/000/c_kv", "/layers/000/k_pe", "/layers/000/w_uk", "/layers/000/attn_out", "/tokens"}) {
    const H5::DataSet ds = f.openDataSet(name);
    EXPECT_EQ(ds.getCreatePlist().getLayout(), H5D_CHUNKED) << name;
  }
  hsize_t chunk[3];
  f.openDataSet("/layers/000/w_uk").getCreatePlist().getChunk(3, chunk);
  EXPECT_EQ(chunk[0], 1u);  // one head per chunk
  EXPECT_EQ(chunk[1], 128u);
  EXPECT_EQ(chunk[2], 512u);
}

// 16 layers of tiny-mla at 8,192 tokens: 80 MiB of latents in the file. `latentq synth` writes it in a
// child process; the child's peak RSS stays far below the file (one layer is 5 MiB of latents): the
// writer streams layers. (The whole dump in memory would put the peak above 80 MiB plus the process.)
// The bound: the process alone (libraries: 18 MiB), OpenBLAS's packing buffers for the widest attention
// GEMM of attn_out (a fixed ≤ 28 MiB, whatever the number of layers; 46 MiB peak measured), one layer.
// Resident set of this process now (/proc/self/statm, field 2), MiB.
double resident_mib() {
  std::ifstream f("/proc/self/statm");
  long long size = 0, resident = 0;
  f >> size >> resident;
  return double(resident) * double(sysconf(_SC_PAGESIZE)) / 1048576.0;
}

TEST(Synth, WritingIsLayerStreamed) {
  lqtest::TempDir dir;
  const std::string out = (dir / "big.h5").string();
  std::vector<std::string> args = {LATENTQ_BIN, "synth",     "--preset", "tiny-mla",     "--layers", "16",    "--seqs",
                                   "1",         "--seq-len", "8192",     "--query-rows", "2",        "--out", out};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Linux counts the pages a forked child shares with its parent until exec into the child's peak RSS
  // (fork copies the page tables, and exec records the old mm's high-water mark): the bound means
  // something only when this process is small, as when ctest runs the test in a process of its own.
  const double parent_mib = resident_mib();
  if (parent_mib > 24.0)
    GTEST_SKIP() << "this test process holds " << parent_mib << " MiB, which the child's peak RSS would include; run "
                 << "the test alone (ctest does: --gtest_filter=Synth.WritingIsLayerStreamed)";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  struct rusage ru {};
  ASSERT_EQ(wait4(pid, &status, 0, &ru), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << LATENTQ_BIN;
  const double file_mib = double(std::filesystem::file_size(out)) / 1048576.0;
  const double peak_mib = double(ru.ru_maxrss) / 1024.0;
  EXPECT_GT(file_mib, 78.0);
  EXPECT_LT(peak_mib, 64.0) << "peak RSS " << peak_mib << " MiB writing a " << file_mib << " MiB dump";
  EXPECT_EQ(load_dump(out, {.layers = {15}, .attention = false}).layers.at(0).index, 15);
}

TEST(Synth, CliListsPresetsAndRefusesBadInput) {
  lqtest::TempDir dir;
  const auto list = lqtest::cli({"synth", "--list"});
  EXPECT_EQ(list.rc, 0) << list.err;
  EXPECT_CONTAINS(list.out, "deepseek-v3");
  EXPECT_CONTAINS(list.out, "glm-4.7-flash");
  const auto bad = lqtest::cli({"synth", "--preset", "deepseek-v9", "--out", (dir / "x.h5").string()});
  EXPECT_EQ(bad.rc, 2);
  EXPECT_CONTAINS(bad.err, "unknown preset 'deepseek-v9'");
  const auto rows = lqtest::cli({"synth", "--preset", "tiny-mla", "--seqs", "1", "--seq-len", "4", "--query-rows", "5",
                                 "--out", (dir / "x.h5").string()});
  EXPECT_EQ(rows.rc, 2);
  EXPECT_CONTAINS(rows.err, "query-rows = 5 must be in [1, 4]");
  EXPECT_TRUE(dir.entries().empty());
  const auto ok = lqtest::cli({"synth", "--preset", "glm-4.7-flash", "--layers", "1", "--seqs", "1", "--seq-len", "32",
                               "--query-rows", "2", "--out", (dir / "g.h5").string()});
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"g.h5"}));
  EXPECT_EQ(load_dump(dir / "g.h5").attrs.qk_nope_head_dim, 192);
  // --index-topk: a sparse preset's top-k (each row reads min(position + 1, k) keys); refused for a dense preset
  const auto dense = lqtest::cli({"synth", "--preset", "deepseek-v3", "--index-topk", "8", "--out",
                                  (dir / "d.h5").string()});
  EXPECT_EQ(dense.rc, 2);
  EXPECT_CONTAINS(dense.err, "--index-topk 8: the preset 'deepseek-v3' is dense MLA (no indexer)");
  const auto sparse = lqtest::cli({"synth", "--preset", "glm-5", "--layers", "1", "--seqs", "1", "--seq-len", "40",
                                   "--query-rows", "4", "--index-topk", "8", "--out", (dir / "s.h5").string()});
  ASSERT_EQ(sparse.rc, 0) << sparse.err;
  const Layer L = load_dump(dir / "s.h5").layers.at(0);
  ASSERT_EQ(L.index_topk, 8);
  for (size_t i = 0; i < L.q_rows.size(); ++i)
    EXPECT_EQ(L.topk_offsets[i + 1] - L.topk_offsets[i], std::min<int64_t>(8, L.q_rows[i] + 1)) << i;
}

}  // namespace
