// DeepSeek-V4's attention (latentq/attention/v4.h) on hand-computed tiny layers (one head unless said, D = 4,
// d_r = 2, softmax_scale 1): the sliding window's edges, an HCA entry whose window is not complete yet, the CSA
// selection (from the dump's picks and recomputed from the indexer, a quantized index_k changing it), a sink that
// takes mass, the rope slice rotated back; the metrics of attention_error on V4 results; malformed inputs refused.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "latentq/attention/metrics.h"
#include "latentq/attention/v4.h"

using namespace latentq::probes;

namespace {

/// A one-sequence V4 layer of T tokens (positions 0..T-1) with the given query rows; q, cos, sin per row.
struct TinyV4 {
  V4LayerType type = V4LayerType::Sliding;
  int64_t H = 1, D = 4, rope = 2, W = 2, T = 0;
  std::vector<int64_t> seq_offsets, comp_offsets, spans;
  std::vector<int32_t> positions, q_rows;
  std::vector<float> q, sinks, cos, sin;

  V4Queries queries() const {
    V4Queries x;
    x.layer_type = type;
    x.num_heads = H, x.head_dim = D, x.rope_dim = rope, x.sliding_window = W, x.softmax_scale = 1.0;
    x.num_tokens = T, x.seq_offsets = seq_offsets, x.positions = positions, x.q_rows = q_rows;
    x.q = q, x.sinks = sinks, x.rope_cos = cos, x.rope_sin = sin;
    x.compressed_offsets = comp_offsets, x.compressed_span = spans;
    return x;
  }
};

TinyV4 tiny(V4LayerType type, int64_t T, int64_t W, std::vector<int32_t> rows) {
  TinyV4 l;
  l.type = type, l.T = T, l.W = W, l.q_rows = rows;
  l.seq_offsets = {0, T};
  for (int32_t t = 0; t < T; ++t) l.positions.push_back(t);
  for (size_t i = 0; i < rows.size(); ++i) {
    l.q.insert(l.q.end(), {1, 0, 0, 0});  // logit = first column of the key
    l.cos.push_back(1), l.sin.push_back(0);
  }
  l.sinks = {0};  // exp(0) = 1
  return l;
}

/// Entries of rate m without overlap (HCA): entry w = [w·m, (w+1)·m).
void hca_entries(TinyV4& l, int64_t n, int64_t m) {
  l.comp_offsets = {0, n};
  for (int64_t w = 0; w < n; ++w) l.spans.insert(l.spans.end(), {w * m, (w + 1) * m});
}

// float64 compute on float32 inputs: ln 3, 0.6, ... are rounded to float32 (relative 6e-8) before it.
void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-7) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < want.size(); ++j) EXPECT_NEAR(got[j], want[j], tol) << "element " << j;
}

std::vector<double> row_out(const AttentionResult<double>& r, int64_t i) {
  const int64_t n = r.num_heads * r.v_head_dim;
  return {r.out.begin() + i * n, r.out.begin() + (i + 1) * n};
}
std::vector<double> row_probs(const AttentionResult<double>& r, int64_t i, int64_t h = 0) {
  const auto p = r.prob(i, h);
  return {p.begin(), p.end()};
}

}  // namespace

TEST(V4Attention, SlidingWindowEdgesSinkAndRopeBack) {
  // W = 2: the row at token 3 reads tokens 2, 3 only (tokens 0, 1 have logit 10 and would take everything).
  // logits 0 (k2), ln 3 (k3), sink 0: weights 1 : 3 : 1 -> p = 0.2, 0.6, 0.2 (sink).
  // o = 0.2·k2 + 0.6·k3 = [0.6 ln 3, 0.4, 0.6, 0]; its rope pair (0.6, 0) rotated back by cos 0.6, sin 0.8:
  // (a c + b s, b c − a s) = (0.36, −0.48). The row at token 0 reads k0 only: p0 = e^10 / (e^10 + 1).
  TinyV4 l = tiny(V4LayerType::Sliding, 4, 2, {3, 0});
  l.cos[0] = 0.6f, l.sin[0] = 0.8f;
  const float ln3 = std::log(3.0f);
  const std::vector<float> win = {10, 0, 0, 0, 10, 0, 0, 0, 0, 2, 0, 0, ln3, 0, 1, 0};
  const V4Attention<double> att(l.queries());
  const auto r = att.run(win, {}, nullptr, true);
  EXPECT_EQ(r.nkeys, (std::vector<int64_t>{3, 2}));  // window keys + the sink
  EXPECT_EQ(att.window_begin(0), 2);
  expect_near(row_probs(r, 0), {0.2, 0.6, 0.2});
  expect_near(row_out(r, 0), {0.6 * double(ln3), 0.4, 0.36, -0.48});
  const double p0 = std::exp(10.0) / (std::exp(10.0) + 1);
  expect_near(row_probs(r, 1), {p0, 1 - p0});
  expect_near(row_out(r, 1), {10 * p0, 0, 0, 0});
  // float32 computes the same values to float32 rounding
  const auto f = V4Attention<float>(l.queries()).run(win, {}, nullptr, true);
  for (size_t j = 0; j < r.out.size(); ++j) EXPECT_NEAR(f.out[j], r.out[j], 1e-6) << j;
  // W = 3: token 1 enters the window of token 3, with logit 10
  l.W = 3;
  const auto wide = V4Attention<double>(l.queries()).run(win, {}, nullptr, true);
  EXPECT_EQ(wide.nkeys[0], 4);
  EXPECT_GT(wide.prob(0, 0)[0], 0.99);
}

TEST(V4Attention, ASinkTakesMassPerHead) {
  // Two heads reading one key with logit 0: head 0's sink logit 0 takes 1/2, head 1's ln 9 takes 9/10.
  TinyV4 l = tiny(V4LayerType::Sliding, 1, 4, {0});
  l.H = 2;
  l.q = {1, 0, 0, 0, 1, 0, 0, 0};
  l.sinks = {0, std::log(9.0f)};
  const std::vector<float> win = {0, 2, 0, 0};
  const auto r = V4Attention<double>(l.queries()).run(win, {}, nullptr, true);
  expect_near(row_probs(r, 0, 0), {0.5, 0.5});
  expect_near(row_probs(r, 0, 1), {0.1, 0.9});
  expect_near(row_out(r, 0), {0, 1, 0, 0, 0, 0.2, 0, 0});
}

TEST(V4Attention, AnHcaEntryNotYetCompleteIsInvisible) {
  // Rate 2, 5 tokens: entries [0, 2) and [2, 4); token 4 is in none. W = 1 (each row reads its own token).
  // Row at position 2: entry 0 visible (end 2 <= 3), entry 1 not (end 4 > 3; logit 10 if it were read).
  // logits 0 (own), ln 2 (entry 0), sink 0: p = 1/4, 1/2, 1/4; o = 0.5·entry 0 = [0.5 ln 2, 0, 0, 0].
  TinyV4 l = tiny(V4LayerType::Hca, 5, 1, {2, 3});
  hca_entries(l, 2, 2);
  const float ln2 = std::log(2.0f);
  std::vector<float> win(5 * 4, 0.0f);
  const std::vector<float> comp = {ln2, 0, 0, 0, 10, 0, 0, 0};
  const V4Attention<double> att(l.queries());
  EXPECT_EQ(att.visible_entries(0), 1);
  EXPECT_EQ(att.visible_entries(1), 2);  // position 3: entry 1's window [2, 4) is complete
  const auto r = att.run(win, comp, nullptr, true);
  EXPECT_EQ(r.nkeys, (std::vector<int64_t>{3, 4}));
  expect_near(row_probs(r, 0), {0.25, 0.5, 0.25});
  expect_near(row_out(r, 0), {0.5 * double(ln2), 0, 0, 0});
  // position 3 reads entry 1: weights 1 (own), 2, e^10, 1 (sink)
  const double z = 4 + std::exp(10.0);
  expect_near(row_probs(r, 1), {1 / z, 2 / z, std::exp(10.0) / z, 1 / z});
}

TEST(V4Attention, CsaReadsTheSelectedEntriesAndAQuantizedIndexKeyMovesThem) {
  // Rate 2 (overlap not needed here), 7 tokens, entries ending at 2, 4, 6: the row at position 6 sees all 3.
  // Entry logits 0, ln 4, ln 2; own token 0; sink 0. Picks {2, 0} (in the indexer's order, -1 padding):
  // weights 1 (own), 1 (entry 0), 0 (entry 1, not read), 2 (entry 2), 1 (sink) -> / 5.
  TinyV4 l = tiny(V4LayerType::Csa, 7, 1, {6});
  hca_entries(l, 3, 2);
  const std::vector<float> win(7 * 4, 0.0f);
  const std::vector<float> comp = {0, 1, 0, 0, std::log(4.0f), 0, 0, 0, std::log(2.0f), 0, 0, 0};
  const V4Attention<double> att(l.queries());
  const std::vector<int64_t> picks = {2, -1, 0};
  const KeySelection sel = att.selection_from_picks(picks, 3);
  EXPECT_EQ(sel.keys, (std::vector<int32_t>{0, 2}));
  const auto r = att.run(win, comp, &sel, true);
  expect_near(row_probs(r, 0), {0.2, 0.2, 0.0, 0.4, 0.2});
  expect_near(row_out(r, 0), {0.4 * std::log(2.0), 0.2, 0, 0});
  // The indexer (one head, c = 2, weight 1, scale 1): scores relu(index_q · index_k) = 3, 1, 2 -> top-2 {0, 2};
  // a quantized index_k whose entry 1 reads 5 makes it {0, 1}; a negative dot scores 0 (relu).
  V4IndexQueries iq;
  iq.n_heads = 1, iq.dim = 2, iq.topk = 2, iq.softmax_scale = 1.0;
  const std::vector<float> index_q = {1, 0}, index_w = {1};
  iq.index_q = index_q, iq.index_w = index_w;
  EXPECT_EQ(att.select_topk(iq, std::vector<float>{3, 0, 1, 0, 2, 0}).keys, (std::vector<int32_t>{0, 2}));
  const KeySelection moved = att.select_topk(iq, std::vector<float>{3, 0, 5, 0, 2, 0});
  EXPECT_EQ(moved.keys, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(att.select_topk(iq, std::vector<float>{-3, 0, -1, 0, 2, 0}).keys, (std::vector<int32_t>{0, 2}));
  // The moved selection against the model's: the same slots, KL through the floor of the entry selected away.
  const auto m = att.run(win, comp, &moved, true);
  EXPECT_EQ(m.nkeys, r.nkeys);
  expect_near(row_probs(m, 0), {1.0 / 7, 1.0 / 7, 4.0 / 7, 0.0, 1.0 / 7});
  const AttentionError e = attention_error(r, m);
  EXPECT_GT(e.kl_mean, 0.4 * std::log(0.4 / 1e-30) - 1);  // entry 2's p = 0.4 against p̂ = 0 (floored)
  EXPECT_EQ(e.top1_agree, 0.0);                           // argmax: entry 2 (0.4) vs entry 1 (4/7)
  const AttentionError same = attention_error(r, r);
  EXPECT_EQ(same.kl_mean, 0.0);
  EXPECT_EQ(same.out_rel_fro, 0.0);
  EXPECT_EQ(same.top1_agree, 1.0);
  // a row that sees no entry selects none
  TinyV4 early = tiny(V4LayerType::Csa, 7, 1, {0});
  hca_entries(early, 3, 2);
  const V4Attention<double> ea(early.queries());
  const std::vector<float> one_q = {1, 0};
  iq.index_q = one_q;
  EXPECT_TRUE(ea.select_topk(iq, std::vector<float>{3, 0, 1, 0, 2, 0}).keys.empty());
}

TEST(V4Attention, MalformedInputsAreRefused) {
  TinyV4 l = tiny(V4LayerType::Csa, 7, 1, {6});
  hca_entries(l, 3, 2);
  const V4Attention<double> att(l.queries());
  const std::vector<float> win(7 * 4, 0.0f), comp(3 * 4, 0.0f);
  EXPECT_THROW(att.run(win, comp, nullptr), std::invalid_argument);          // CSA without a selection
  EXPECT_THROW(att.run(win, {}, nullptr), std::invalid_argument);            // compressed_kv missing
  EXPECT_THROW(att.selection_from_picks(std::vector<int64_t>{0, 0}, 2), std::invalid_argument);  // twice
  EXPECT_THROW(att.selection_from_picks(std::vector<int64_t>{3}, 1), std::invalid_argument);     // not visible
  TinyV4 h = tiny(V4LayerType::Hca, 7, 1, {2});
  hca_entries(h, 3, 2);
  const KeySelection any = V4Attention<double>(h.queries()).selection_from_picks(std::vector<int64_t>{0}, 1);
  EXPECT_THROW(V4Attention<double>(h.queries()).run(win, comp, &any), std::invalid_argument);  // HCA reads all
  TinyV4 p = tiny(V4LayerType::Sliding, 4, 2, {3});
  p.positions[2] = 7;  // not 0, 1, ... within the sequence
  EXPECT_THROW(V4Attention<double>(p.queries()), std::invalid_argument);
  TinyV4 r = tiny(V4LayerType::Sliding, 4, 2, {3});
  r.rope = 3;  // odd
  EXPECT_THROW(V4Attention<double>(r.queries()), std::invalid_argument);
  TinyV4 s = tiny(V4LayerType::Sliding, 4, 2, {3});
  std::vector<float> bad(4 * 4, 0.0f);
  bad[5] = std::nanf("");
  EXPECT_THROW(V4Attention<double>(s.queries()).run(bad, {}), std::invalid_argument);
  EXPECT_THROW(parse_v4_layer_type("dense"), std::invalid_argument);
  EXPECT_EQ(parse_v4_layer_type("hca"), V4LayerType::Hca);
}
