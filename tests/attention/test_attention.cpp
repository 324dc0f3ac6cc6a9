// Absorbed MLA attention check: absorbed vs unabsorbed vs a loop reference, causality within
// sequences, metrics (hand-computed KL / top-1 / top-8), errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "latentq/decode_order.h"
#include "latentq/attention/attention.h"
#include "latentq/quantize.h"
#include "probe_test_util.h"

using namespace latentq::probes;

namespace {

/// A random layer at a realistic scale: c_kv and k_pe ~ N(0, 1) (c_kv is RMS-normalized in a model),
/// W_UK, W_UV ~ N(0, 1/r) so k_nope, v ~ N(0, 1), q ~ N(0, 2²): scores with sd ≈ 2 after the scale
/// (nope+rope)^-1/2, some rows peaked, as in a trained model.
struct RandomLayer {
  MlaDims dims;
  int64_t T = 0;
  std::vector<int64_t> seq_offsets;
  std::vector<int32_t> q_rows;
  std::vector<float> q_nope, q_pe, w_uk, w_uv, c_kv, k_pe;
  double scale = 0;
  uint64_t seed = 0;

  AttentionQueries queries() const {
    return {dims, T, seq_offsets, q_rows, q_nope, q_pe, w_uk, w_uv, scale};
  }
  std::string describe() const {
    return "seed " + std::to_string(seed) + " T " + std::to_string(T) + " S " + std::to_string(seq_offsets.size() - 1) +
           " Tq " + std::to_string(q_rows.size()) + " H " + std::to_string(dims.num_heads) + " r " +
           std::to_string(dims.kv_lora_rank) + " nope " + std::to_string(dims.qk_nope_head_dim) + " rope " +
           std::to_string(dims.qk_rope_head_dim) + " v " + std::to_string(dims.v_head_dim);
  }
};

RandomLayer make_layer(uint64_t seed, int64_t S, int64_t L, int64_t Tq, MlaDims d) {
  std::mt19937_64 rng(seed);
  RandomLayer l;
  l.seed = seed;
  l.dims = d;
  l.T = S * L;
  for (int64_t s = 0; s <= S; ++s) l.seq_offsets.push_back(s * L);
  // Distinct query tokens in random order, always including each sequence's first token (1 key)
  // and last token (L keys).
  std::vector<int32_t> all(static_cast<size_t>(l.T));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  for (int64_t s = 0; s < S; ++s) {
    l.q_rows.push_back(static_cast<int32_t>(s * L));
    l.q_rows.push_back(static_cast<int32_t>(s * L + L - 1));
  }
  for (int32_t t : all) {
    if (static_cast<int64_t>(l.q_rows.size()) >= Tq) break;
    if (t % L != 0 && t % L != L - 1) l.q_rows.push_back(t);
  }
  std::shuffle(l.q_rows.begin(), l.q_rows.end(), rng);
  const int64_t H = d.num_heads, r = d.kv_lora_rank;
  const int64_t nq = static_cast<int64_t>(l.q_rows.size());
  l.q_nope = probe_test::gaussian_vec(rng, nq * H * d.qk_nope_head_dim, 2.0);
  l.q_pe = probe_test::gaussian_vec(rng, nq * H * d.qk_rope_head_dim, 2.0);
  l.w_uk = probe_test::gaussian_vec(rng, H * d.qk_nope_head_dim * r, 1.0 / std::sqrt(double(r)));
  l.w_uv = probe_test::gaussian_vec(rng, H * d.v_head_dim * r, 1.0 / std::sqrt(double(r)));
  l.c_kv = probe_test::gaussian_vec(rng, l.T * r);
  l.k_pe = probe_test::gaussian_vec(rng, l.T * d.qk_rope_head_dim);
  l.scale = 1.0 / std::sqrt(double(d.qk_nope_head_dim + d.qk_rope_head_dim));
  return l;
}

const MlaDims kTinyMla{6, 128, 64, 32, 64};  // tiny-mla: H, kv_lora_rank, nope, rope, v

template <typename Scalar>
double rel_fro(const std::vector<Scalar>& ref, const std::vector<Scalar>& x) {
  double e = 0, n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    e += (double(x[i]) - double(ref[i])) * (double(x[i]) - double(ref[i]));
    n += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(e / n);
}

/// Plain loops in float64, straight from the einsums (no Eigen, no absorption).
struct LoopReference {
  std::vector<double> out;    // [Tq, H, v]
  std::vector<double> probs;  // same layout as AttentionResult::probs
};
LoopReference loop_reference(const RandomLayer& l) {
  const MlaDims& d = l.dims;
  const int64_t H = d.num_heads, r = d.kv_lora_rank, nope = d.qk_nope_head_dim, rope = d.qk_rope_head_dim,
                v = d.v_head_dim;
  LoopReference ref;
  ref.out.assign(l.q_rows.size() * H * v, 0.0);
  for (size_t i = 0; i < l.q_rows.size(); ++i) {
    const int64_t t = l.q_rows[i];
    int64_t s0 = 0;
    for (size_t s = 0; s + 1 < l.seq_offsets.size(); ++s)
      if (l.seq_offsets[s] <= t && t < l.seq_offsets[s + 1]) s0 = l.seq_offsets[s];
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> sc;
      for (int64_t j = s0; j <= t; ++j) {
        double a = 0;
        for (int64_t dn = 0; dn < nope; ++dn) {
          double k = 0;
          for (int64_t c = 0; c < r; ++c) k += double(l.w_uk[(h * nope + dn) * r + c]) * l.c_kv[j * r + c];
          a += double(l.q_nope[(i * H + h) * nope + dn]) * k;
        }
        for (int64_t dr = 0; dr < rope; ++dr) a += double(l.q_pe[(i * H + h) * rope + dr]) * l.k_pe[j * rope + dr];
        sc.push_back(a * l.scale);
      }
      const double m = *std::max_element(sc.begin(), sc.end());
      double z = 0;
      for (auto& x : sc) z += (x = std::exp(x - m));
      for (auto& x : sc) x /= z;
      for (int64_t dv = 0; dv < v; ++dv) {
        double o = 0;
        for (int64_t j = s0; j <= t; ++j) {
          double vv = 0;
          for (int64_t c = 0; c < r; ++c) vv += double(l.w_uv[(h * v + dv) * r + c]) * l.c_kv[j * r + c];
          o += sc[j - s0] * vv;
        }
        ref.out[(i * H + h) * v + dv] = o;
      }
      ref.probs.insert(ref.probs.end(), sc.begin(), sc.end());
    }
  }
  return ref;
}

}  // namespace

TEST(Attention, AbsorbedMatchesLoopReference) {
  const RandomLayer l = make_layer(21, 3, 40, 20, MlaDims{2, 16, 8, 4, 8});
  SCOPED_TRACE(l.describe());
  const LoopReference ref = loop_reference(l);
  const auto a = absorbed_attention<double>(l.queries(), l.c_kv, l.k_pe, true);
  const auto u = unabsorbed_attention<double>(l.queries(), l.c_kv, l.k_pe, true);
  EXPECT_LT(rel_fro(ref.out, a.out), 1e-12);
  EXPECT_LT(rel_fro(ref.out, u.out), 1e-12);
  ASSERT_EQ(a.probs.size(), ref.probs.size());
  for (size_t j = 0; j < ref.probs.size(); ++j) ASSERT_NEAR(a.probs[j], ref.probs[j], 1e-13) << j;
  for (size_t i = 0; i < l.q_rows.size(); ++i) {
    EXPECT_EQ(a.nkeys[i], l.q_rows[i] % 40 + 1);
    for (int64_t h = 0; h < 2; ++h) EXPECT_NEAR(std::accumulate(a.prob(i, h).begin(), a.prob(i, h).end(), 0.0), 1.0, 1e-12);
  }
}

TEST(Attention, AbsorbedMatchesUnabsorbedFloat64) {
  const RandomLayer l = make_layer(22, 4, 512, 256, kTinyMla);
  SCOPED_TRACE(l.describe());
  const auto a = absorbed_attention<double>(l.queries(), l.c_kv, l.k_pe, true);
  const auto u = unabsorbed_attention<double>(l.queries(), l.c_kv, l.k_pe, true);
  EXPECT_LE(rel_fro(u.out, a.out), 1e-12);
  const AttentionError e = attention_error(u, a);
  EXPECT_LT(std::abs(e.kl_mean), 1e-13);  // first-order rounding terms of Σ p·(ln p − ln p̂)
  EXPECT_EQ(e.top1_agree, 1.0);
}

TEST(Attention, AbsorbedMatchesUnabsorbedFloat32) {
  for (uint64_t seed : {23, 24}) {
    const RandomLayer l = make_layer(seed, 4, 512, 256, kTinyMla);
    SCOPED_TRACE(l.describe());
    const auto a = absorbed_attention<float>(l.queries(), l.c_kv, l.k_pe);
    const auto u = unabsorbed_attention<float>(l.queries(), l.c_kv, l.k_pe);
    const auto ref = absorbed_attention<double>(l.queries(), l.c_kv, l.k_pe);
    const double au = rel_fro(u.out, a.out);
    EXPECT_LE(au, 1e-6);
    // Both float32 paths are float32-accurate against float64.
    std::vector<double> af(a.out.begin(), a.out.end()), uf(u.out.begin(), u.out.end());
    EXPECT_LE(rel_fro(ref.out, af), 1e-6);
    EXPECT_LE(rel_fro(ref.out, uf), 1e-6);
    EXPECT_GT(au, 0.0);  // the two float32 paths do round differently
  }
}

TEST(Attention, RunIsReusableAndOrderIndependent) {
  // One AbsorbedAttention per layer, run on several latent variants; a query's output does not
  // depend on the other queries (the row permutation only permutes the output).
  RandomLayer l = make_layer(25, 2, 64, 30, MlaDims{3, 16, 8, 4, 8});
  SCOPED_TRACE(l.describe());
  const AbsorbedAttention<double> att(l.queries());
  const auto r1 = att.run(l.c_kv, l.k_pe);
  RandomLayer p = l;
  std::reverse(p.q_rows.begin(), p.q_rows.end());
  const int64_t H = 3, nope = 8, rope = 4, v = 8, nq = static_cast<int64_t>(l.q_rows.size());
  for (int64_t i = 0; i < nq; ++i) {
    std::copy_n(l.q_nope.begin() + i * H * nope, H * nope, p.q_nope.begin() + (nq - 1 - i) * H * nope);
    std::copy_n(l.q_pe.begin() + i * H * rope, H * rope, p.q_pe.begin() + (nq - 1 - i) * H * rope);
  }
  const auto r2 = AbsorbedAttention<double>(p.queries()).run(p.c_kv, p.k_pe);
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t j = 0; j < H * v; ++j) EXPECT_EQ(r1.out[i * H * v + j], r2.out[(nq - 1 - i) * H * v + j]);
  // Changing a latent after the last key of every query changes nothing; before, it does.
  std::vector<float> c2 = l.c_kv;
  const int64_t last = *std::max_element(l.q_rows.begin(), l.q_rows.end());
  if (last + 1 < l.T) {
    for (int64_t c = 0; c < 16; ++c) c2[(last + 1) * 16 + c] += 5.0f;
    EXPECT_EQ(att.run(c2, l.k_pe).out, r1.out);
  }
  c2 = l.c_kv;
  for (int64_t c = 0; c < 16; ++c) c2[c] += 1.0f;  // token 0: a key of every row of sequence 0
  EXPECT_NE(att.run(c2, l.k_pe).out, r1.out);
}

TEST(Attention, SingleKeyRowIsItsValue) {
  // A query at the first token of a sequence attends only to it: p = 1, out = W_UV·c_kv[s0].
  RandomLayer l = make_layer(26, 2, 16, 4, MlaDims{2, 8, 4, 2, 4});
  l.q_rows = {16, 0, 5, 31};
  SCOPED_TRACE(l.describe());
  const auto a = absorbed_attention<double>(l.queries(), l.c_kv, l.k_pe, true);
  EXPECT_EQ(a.nkeys, (std::vector<int64_t>{1, 1, 6, 16}));
  for (int64_t h = 0; h < 2; ++h) {
    ASSERT_EQ(a.prob(0, h).size(), 1u);
    EXPECT_EQ(a.prob(0, h)[0], 1.0);
    for (int64_t dv = 0; dv < 4; ++dv) {
      double expect = 0;
      for (int64_t c = 0; c < 8; ++c) expect += double(l.w_uv[(h * 4 + dv) * 8 + c]) * l.c_kv[16 * 8 + c];
      EXPECT_NEAR(a.out[(0 * 2 + h) * 4 + dv], expect, 1e-14);
    }
  }
}

TEST(AttentionError, IdenticalInputs) {
  const RandomLayer l = make_layer(27, 2, 100, 40, MlaDims{4, 32, 16, 8, 16});
  SCOPED_TRACE(l.describe());
  const AbsorbedAttention<float> att(l.queries());
  const auto a = att.run(l.c_kv, l.k_pe, true), b = att.run(l.c_kv, l.k_pe, true);
  const AttentionError e = attention_error(a, b);
  EXPECT_EQ(e.out_rel_fro, 0.0);
  EXPECT_DOUBLE_EQ(e.cos_mean, 1.0);
  EXPECT_EQ(e.kl_mean, 0.0);
  EXPECT_EQ(e.top1_agree, 1.0);
  EXPECT_EQ(e.top8_agree, 1.0);
  // Perturbed latents: every metric moves the right way.
  std::mt19937_64 rng(28);
  std::vector<float> noisy = l.c_kv;
  const auto noise = probe_test::gaussian_vec(rng, static_cast<int64_t>(noisy.size()), 0.3);
  for (size_t i = 0; i < noisy.size(); ++i) noisy[i] += noise[i];
  const AttentionError n = attention_error(a, att.run(noisy, l.k_pe, true));
  EXPECT_GT(n.out_rel_fro, 0.01);
  EXPECT_LT(n.cos_mean, 1.0);
  EXPECT_GT(n.kl_mean, 1e-4);
  EXPECT_LT(n.top8_agree, 1.0);
  EXPECT_GT(n.top8_agree, 0.3);
}

TEST(AttentionError, HandComputed) {
  // Two query rows, one head, v = 1.
  // Row 0, 3 keys: p = (0.5, 0.25, 0.25), p̂ = (0.25, 0.5, 0.25):
  //   KL = 0.5·ln 2 + 0.25·ln 0.5 = 0.25·ln 2; argmax 0 vs 1 → top-1 miss; m = 3 → top-m agreement 1.
  // Row 1, 10 keys: p = (0.2, 0.1 ×8, 0) with p̂ = (0, 0.1 ×8, 0.2):
  //   KL = 0.2·(ln 0.2 − ln 1e-30) (floor) + 0; top-1: key 0 vs key 9 → miss;
  //   top-8 of p = keys 0..7 (ties → lower index); of p̂ = 9, 1..7 → 7 common → 7/8.
  AttentionResult<double> ref, test;
  for (auto* r : {&ref, &test}) {
    r->num_queries = 2;
    r->num_heads = 1;
    r->v_head_dim = 1;
    r->nkeys = {3, 10};
    r->prob_offsets = {0, 3, 13};
  }
  ref.out = {1.0, 2.0};
  test.out = {1.0, -2.0};
  ref.probs = {0.5, 0.25, 0.25, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.0};
  test.probs = {0.25, 0.5, 0.25, 0.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2};
  const AttentionError e = attention_error(ref, test);
  const double kl0 = 0.25 * std::log(2.0), kl1 = 0.2 * (std::log(0.2) - std::log(1e-30));
  EXPECT_NEAR(e.kl_mean, (kl0 + kl1) / 2, 1e-12);
  EXPECT_EQ(e.top1_agree, 0.0);
  EXPECT_NEAR(e.top8_agree, (1.0 + 7.0 / 8.0) / 2, 1e-15);
  EXPECT_NEAR(e.out_rel_fro, 4.0 / std::sqrt(5.0), 1e-15);  // ‖(0, −4)‖ / ‖(1, 2)‖
  EXPECT_NEAR(e.cos_mean, 0.0, 1e-15);                      // (1 + (−1)) / 2
  test.probs.clear();
  EXPECT_THROW(attention_error(ref, test), std::invalid_argument);
}

TEST(Attention, Errors) {
  const RandomLayer l = make_layer(29, 2, 16, 6, MlaDims{2, 8, 4, 2, 4});
  SCOPED_TRACE(l.describe());
  {
    RandomLayer b = l;
    b.q_rows[2] = 32;  // T = 32
    try {
      AbsorbedAttention<float> att(b.queries());
      FAIL() << "q_row 32 accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("q_rows[2] = 32"), std::string::npos) << e.what();
    }
  }
  {
    RandomLayer b = l;
    b.w_uv.pop_back();
    EXPECT_THROW(AbsorbedAttention<float>{b.queries()}, std::invalid_argument);
    EXPECT_THROW(unabsorbed_attention<float>(b.queries(), b.c_kv, b.k_pe), std::invalid_argument);
  }
  {
    RandomLayer b = l;
    b.scale = 0;
    EXPECT_THROW(AbsorbedAttention<double>{b.queries()}, std::invalid_argument);
    b = l;
    b.q_nope[3] = NAN;
    EXPECT_THROW(AbsorbedAttention<double>{b.queries()}, std::invalid_argument);
    b = l;
    b.seq_offsets = {0, 20, 16};
    EXPECT_THROW(AbsorbedAttention<double>{b.queries()}, std::invalid_argument);
  }
  const AbsorbedAttention<float> att(l.queries());
  std::vector<float> c = l.c_kv;
  c[7] = INFINITY;
  EXPECT_THROW(att.run(c, l.k_pe), std::invalid_argument);
  c.resize(c.size() - 8);
  EXPECT_THROW(att.run(c, l.k_pe), std::invalid_argument);
  const auto a = att.run(l.c_kv, l.k_pe, true);
  AbsorbedAttention<float> other(make_layer(30, 2, 16, 5, MlaDims{2, 8, 4, 2, 4}).queries());
  EXPECT_THROW(attention_error(a, other.run(l.c_kv, l.k_pe, true)), std::invalid_argument);
}

// A double softmax_scale is checked after its conversion to the working precision: 1e300 is finite as a
// double but inf in float32 (a NaN attention), 1e-50 becomes 0 (a uniform softmax). Both used to run.
TEST(Attention, SoftmaxScaleIsCheckedAfterTheConversion) {
  const RandomLayer l = make_layer(31, 2, 16, 6, MlaDims{2, 8, 4, 2, 4});
  auto message = [&](double scale, auto scalar) -> std::string {
    RandomLayer b = l;
    b.scale = scale;
    try {
      AbsorbedAttention<decltype(scalar)> att(b.queries());
      return "";
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
  };
  EXPECT_EQ(message(1e300, 0.0f),
            "attention: softmax_scale 1e+300 is inf in float32 (largest finite 3.4028235e+38), the precision the "
            "attention runs in");
  EXPECT_EQ(message(1e-50, 0.0f),
            "attention: softmax_scale 1e-50 becomes 0 in float32 (smallest normal 1.1754944e-38: the precision is "
            "lost), the precision the attention runs in");
  EXPECT_NE(message(1e-40, 0.0f).find("softmax_scale 1e-40 becomes 9.9999461e-41 in float32"), std::string::npos);
  EXPECT_EQ(message(1e-50, 0.0), "");  // a normal float64
  EXPECT_EQ(message(0.125, 0.0f), "");
  RandomLayer b = l;
  b.scale = 1e300;
  try {
    unabsorbed_attention<float>(b.queries(), b.c_kv, b.k_pe);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("softmax_scale 1e+300 is inf in float32"), std::string::npos) << e.what();
  }
}

// An attention that overflows its working precision on finite inputs is an error, never a result: a
// NaN reference used to score as a perfect row (out_rel_fro 0, KL 0, top-1 1).
TEST(Attention, NonFiniteResultIsAnError) {
  RandomLayer l = make_layer(32, 2, 16, 6, MlaDims{2, 8, 4, 2, 4});
  for (float& x : l.q_nope) x *= 1e20f;  // finite inputs, but q_lat·c_kv ~ 1e40 overflows float32
  for (float& x : l.c_kv) x *= 1e20f;
  const AbsorbedAttention<float> att(l.queries());
  try {
    att.run(l.c_kv, l.k_pe, true);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("are NaN/Inf in float32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no metric is computed from a non-finite attention"), std::string::npos);
  }
  EXPECT_THROW(unabsorbed_attention<float>(l.queries(), l.c_kv, l.k_pe), std::invalid_argument);
  // float64 holds these scores: a finite result.
  const auto d = AbsorbedAttention<double>(l.queries()).run(l.c_kv, l.k_pe, true);
  EXPECT_TRUE(std::all_of(d.out.begin(), d.out.end(), [](double x) { return std::isfinite(x); }));
}

namespace {
/// A hand-made result of one query row and one head: output `out` [v_head_dim], probabilities `probs`
/// [nkeys] over its keys.
AttentionResult<double> one_row_result(std::vector<double> out, std::vector<double> probs) {
  AttentionResult<double> r;
  r.num_queries = 1;
  r.num_heads = 1;
  r.v_head_dim = static_cast<int64_t>(out.size());
  r.nkeys = {static_cast<int64_t>(probs.size())};
  r.prob_offsets = {0, static_cast<int64_t>(probs.size())};
  r.out = std::move(out);
  r.probs = std::move(probs);
  return r;
}
}  // namespace

TEST(AttentionError, NonFiniteReferenceOrTestIsAnError) {
  const AttentionResult<double> ref = one_row_result({1.0, 2.0}, {0.75, 0.25});
  const AttentionResult<double> test = ref;
  EXPECT_EQ(attention_error(ref, test).out_rel_fro, 0.0);
  AttentionResult<double> nan_ref = ref;
  nan_ref.out[1] = NAN;
  nan_ref.probs = {NAN, NAN};
  try {
    attention_error(nan_ref, test);
    ADD_FAILURE() << "a NaN reference gave metrics";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "attention_error: the reference: 1 of 2 outputs and 2 of 2 kept probabilities are NaN/Inf in float64 "
              "(the scores or the output overflow the working precision); no metric is computed from a non-finite "
              "attention");
  }
  AttentionResult<double> inf_test = ref;
  inf_test.out[0] = INFINITY;
  try {
    attention_error(ref, inf_test);
    ADD_FAILURE() << "an Inf test gave metrics";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("attention_error: the test: 1 of 2 outputs"), std::string::npos) << e.what();
  }
}

// The float softmax takes its exponentials from libmvec under the AVX2 kernel and from std::exp
// otherwise: the same attention under both differs only in the last bits (probabilities within 1e-6
// relative, outputs within 1e-5 of their norm), and each row still sums to 1.
TEST(Attention, SoftmaxUnderEveryKernelAgrees) {
  const std::vector<latentq::CpuKernel> kernels = latentq::available_cpu_kernels();
  if (kernels.back() != latentq::CpuKernel::Avx2) GTEST_SKIP() << "no AVX2 on this CPU: one softmax path only";
  const RandomLayer l = make_layer(47, 2, 90, 30, MlaDims{4, 32, 16, 8, 16});
  const AbsorbedAttention<float> att(l.queries());
  const auto run_under = [&](latentq::CpuKernel k) {
    const latentq::ScopedCpuKernel kernel(k);
    return att.run(l.c_kv, l.k_pe, true);
  };
  const auto base = run_under(latentq::CpuKernel::Baseline), avx = run_under(latentq::CpuKernel::Avx2);
  ASSERT_EQ(base.probs.size(), avx.probs.size());
  int64_t differ = 0;
  for (size_t k = 0; k < base.probs.size(); ++k) {
    ASSERT_NEAR(avx.probs[k], base.probs[k], 1e-6 * base.probs[k] + 1e-30) << "seed 47, probability " << k;
    differ += avx.probs[k] != base.probs[k];
  }
  EXPECT_GT(differ, 0) << "libmvec's expf gave std::exp's bits everywhere: did the vector path run?";
  double num = 0, den = 0;
  for (size_t k = 0; k < base.out.size(); ++k)
    num += std::pow(double(avx.out[k]) - base.out[k], 2), den += std::pow(double(base.out[k]), 2);
  EXPECT_LT(std::sqrt(num / den), 1e-5);
  for (int64_t i = 0; i < avx.num_queries; ++i)
    for (int64_t h = 0; h < avx.num_heads; ++h) {
      double sum = 0;
      for (const float p : avx.prob(i, h)) sum += p;
      ASSERT_NEAR(sum, 1.0, 1e-5) << "row " << i << " head " << h;
    }
}

// The top-m keys a prepared reference holds (what top1/top8_agree compare) against a stable sort by
// descending probability (ties → lower index), on rows of 0..70 keys with many ties and long flat runs.
TEST(AttentionError, TopKeysAreTheStableSortsFirstM) {
  std::mt19937_64 rng(9090);
  AttentionResult<float> r;
  r.num_heads = 2;
  r.v_head_dim = 1;
  r.prob_offsets = {0};
  for (int64_t n = 1; n <= 70; ++n) {
    r.nkeys.push_back(n);
    for (int64_t h = 0; h < r.num_heads; ++h)
      for (int64_t j = 0; j < n; ++j) {
        const uint64_t u = rng() % 16;
        r.probs.push_back(u < 12 ? 0.001f * static_cast<float>(u % 3) : 0.01f * static_cast<float>(u));
      }
    r.prob_offsets.push_back(static_cast<int64_t>(r.probs.size()));
  }
  r.num_queries = static_cast<int64_t>(r.nkeys.size());
  r.out.assign(static_cast<size_t>(r.num_queries * r.num_heads), 1.0f);
  const AttentionReference<float> prepared(r);
  for (int64_t i = 0; i < r.num_queries; ++i)
    for (int64_t h = 0; h < r.num_heads; ++h) {
      const auto pr = r.prob(i, h);
      std::vector<int64_t> order(pr.size());
      std::iota(order.begin(), order.end(), int64_t{0});
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return pr[a] > pr[b]; });
      const int64_t m = std::min<int64_t>(8, r.nkeys[i]);
      for (int64_t k = 0; k < m; ++k)
        ASSERT_EQ(prepared.top_indices()[(i * r.num_heads + h) * 8 + k], order[k])
            << "seed 9090, row " << i << " (" << r.nkeys[i] << " keys), head " << h << ", rank " << k;
    }
}

// kl_row: a hand-computed row (with a p_j = 0 term and a p̂_j = 0 key floored at 1e-30), and the AVX2
// path (libmvec log, four partial sums) against the scalar definition on random rows of every length
// 0..67 (tails), under each CPU kernel selection.
TEST(AttentionError, KlRowHandComputedAndEveryKernelAgrees) {
  const std::vector<float> p{0.5f, 0.25f, 0.25f, 0.0f, 0.0f}, q{0.25f, 0.25f, 0.5f, 0.0f, 0.0f};
  // 0.5 ln 2 + 0 + 0.25 ln 0.5 = 0.25 ln 2
  EXPECT_NEAR(kl_row<float>(p, q), 0.25 * std::log(2.0), 1e-15);  // libmvec's log: within 4 ulp
  const std::vector<float> p0{1.0f}, q0{0.0f};
  EXPECT_NEAR(kl_row<float>(p0, q0), -std::log(1e-30), 1e-12);  // the floor: 69.08 nats
  EXPECT_THROW(kl_row<float>(p, std::span<const float>(q).first(4)), std::invalid_argument);

  const std::vector<latentq::CpuKernel> kernels = latentq::available_cpu_kernels();
  std::mt19937_64 rng(4242);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  int64_t differ = 0;  // rows where the two kernels' sums differ: the vector path did run
  for (int64_t n = 0; n <= 67; ++n) {
    std::vector<float> a(n), b(n);
    double sa = 0, sb = 0;
    for (int64_t j = 0; j < n; ++j) {
      a[j] = j % 7 == 3 ? 0.0f : u(rng);  // some exact zeros in p
      b[j] = j % 11 == 5 ? 0.0f : a[j] * (1.0f + 0.2f * (u(rng) - 0.5f)) + 1e-6f * u(rng);
      sa += a[j];
      sb += b[j];
    }
    for (int64_t j = 0; j < n; ++j) a[j] = static_cast<float>(a[j] / sa), b[j] = static_cast<float>(b[j] / sb);
    double def = 0;  // the definition, index order, std::log
    for (int64_t j = 0; j < n; ++j)
      if (a[j] > 0) def += double(a[j]) * std::log(double(a[j]) / std::max(double(b[j]), kKlProbFloor));
    for (const latentq::CpuKernel k : kernels) {
      const latentq::ScopedCpuKernel kernel(k);
      const double got = kl_row<float>(a, b);
      EXPECT_NEAR(got, def, 1e-13 * std::max(1.0, std::abs(def)))
          << "seed 4242, n " << n << ", kernel " << static_cast<int>(k) << " (1 Reference, 2 Baseline, 3 Avx2)";
      if (k != latentq::CpuKernel::Avx2) EXPECT_EQ(got, def) << "n " << n;  // the scalar path is the definition
      else differ += got != def;
    }
  }
  if (kernels.back() == latentq::CpuKernel::Avx2)
    EXPECT_GT(differ, 0) << "the AVX2 kernel gave the scalar sums on every row: did it run?";
}

// The prepared reference (top-8 and finiteness once per layer) scores every test exactly as the plain
// reference does, on rows with ties, fewer than 8 keys and more, whole and by rows; and refuses a
// reference without probabilities or with a NaN.
TEST(AttentionError, PreparedReferenceEqualsThePlainOneBitForBit) {
  const RandomLayer l = make_layer(46, 3, 70, 24, MlaDims{3, 16, 8, 4, 8});
  const AbsorbedAttention<float> att(l.queries());
  const auto ref = att.run(l.c_kv, l.k_pe, true);
  const AttentionReference<float> prepared(ref);
  for (const float gain : {1.0f, 1.02f, 0.9f, 1.5f}) {
    SCOPED_TRACE("seed 46, c_kv gain " + std::to_string(gain));
    std::vector<float> c2 = l.c_kv;
    for (auto& x : c2) x *= gain;
    const auto test = att.run(c2, l.k_pe, true);
    const AttentionError a = attention_error(ref, test), b = attention_error(prepared, test);
    EXPECT_EQ(a.kl_mean, b.kl_mean);
    EXPECT_EQ(a.out_rel_fro, b.out_rel_fro);
    EXPECT_EQ(a.cos_mean, b.cos_mean);
    EXPECT_EQ(a.top1_agree, b.top1_agree);
    EXPECT_EQ(a.top8_agree, b.top8_agree);
    const std::vector<int64_t> rows{0, 5, 5, 11};
    const AttentionError ar = attention_error_rows(ref, test, rows), br = attention_error_rows(prepared, test, rows);
    EXPECT_EQ(ar.kl_mean, br.kl_mean);
    EXPECT_EQ(ar.top8_agree, br.top8_agree);
  }
  // Ties: equal probabilities rank by the lower key index, as top_m does for the plain reference.
  const AttentionResult<double> tie = one_row_result({1.0}, std::vector<double>(10, 0.1));
  const AttentionReference<double> pt(tie);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(pt.top_indices()[j], j);
  AttentionResult<double> no_probs = tie;
  no_probs.probs.clear();
  EXPECT_THROW(AttentionReference<double>{no_probs}, std::invalid_argument);
  AttentionResult<double> nan_ref = tie;
  nan_ref.probs[3] = NAN;
  EXPECT_THROW(AttentionReference<double>{nan_ref}, std::invalid_argument);
}

// Empty sequences hold no key: the attention with them equals the attention without them, bit for bit.
TEST(Attention, EmptySequencesChangeNothing) {
  const RandomLayer l = make_layer(33, 3, 40, 20, MlaDims{2, 16, 8, 4, 8});
  RandomLayer e = l;
  e.seq_offsets = {0, 0, 40, 40, 40, 80, 120, 120};
  for (auto path : {0, 1}) {
    SCOPED_TRACE(path ? "unabsorbed" : "absorbed");
    const auto a = path ? unabsorbed_attention<float>(l.queries(), l.c_kv, l.k_pe, true)
                        : absorbed_attention<float>(l.queries(), l.c_kv, l.k_pe, true);
    const auto b = path ? unabsorbed_attention<float>(e.queries(), e.c_kv, e.k_pe, true)
                        : absorbed_attention<float>(e.queries(), e.c_kv, e.k_pe, true);
    EXPECT_EQ(a.nkeys, b.nkeys);
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.probs, b.probs);
  }
}

// ---- the mixed cache and the decode order -----------------------------------------------------------

namespace {

/// Positions of the query rows in their sequences (make_layer: sequences of length L).
std::vector<int32_t> positions_of(const RandomLayer& l) {
  std::vector<int32_t> p(static_cast<size_t>(l.T));
  for (size_t s = 0; s + 1 < l.seq_offsets.size(); ++s)
    for (int64_t t = l.seq_offsets[s]; t < l.seq_offsets[s + 1]; ++t) p[t] = static_cast<int32_t>(t - l.seq_offsets[s]);
  return p;
}

/// The mixed-cache result of row i the slow way: a cache whose keys in row i's sequence are picked per
/// key from A or B, run whole; row i's output and probabilities kept.
template <typename Scalar>
AttentionResult<Scalar> mixed_by_rows(const RandomLayer& l, const AbsorbedAttention<Scalar>& att,
                                      const std::vector<float>& ca, const std::vector<float>& ka,
                                      const std::vector<float>& cb, const std::vector<float>& kb,
                                      const std::vector<KeyRange>& rc, const std::vector<KeyRange>& rk) {
  const int64_t r = l.dims.kv_lora_rank, rope = l.dims.qk_rope_head_dim, H = l.dims.num_heads, v = l.dims.v_head_dim;
  AttentionResult<Scalar> out = att.run(cb, kb, true);
  for (size_t i = 0; i < l.q_rows.size(); ++i) {
    const int64_t t = l.q_rows[i];
    int64_t s0 = 0;
    for (size_t s = 0; s + 1 < l.seq_offsets.size(); ++s)
      if (l.seq_offsets[s] <= t && t < l.seq_offsets[s + 1]) s0 = l.seq_offsets[s];
    std::vector<float> c = cb, k = kb;
    for (int64_t j = 0; s0 + j <= t; ++j) {
      if (rc[i].contains(j)) std::copy_n(ca.begin() + (s0 + j) * r, r, c.begin() + (s0 + j) * r);
      if (rk[i].contains(j)) std::copy_n(ka.begin() + (s0 + j) * rope, rope, k.begin() + (s0 + j) * rope);
    }
    const AttentionResult<Scalar> one = att.run(c, k, true);
    std::copy_n(one.out.begin() + i * H * v, H * v, out.out.begin() + i * H * v);
    std::copy_n(one.probs.begin() + one.prob_offsets[i], H * one.nkeys[i], out.probs.begin() + out.prob_offsets[i]);
  }
  return out;
}

}  // namespace

TEST(Attention, MixedCacheMatchesPerRowCaches) {
  const RandomLayer l = make_layer(41, 2, 40, 24, MlaDims{2, 16, 8, 4, 8});
  SCOPED_TRACE(l.describe());
  std::mt19937_64 rng(42);
  const std::vector<float> cb = probe_test::gaussian_vec(rng, l.T * 16), kb = probe_test::gaussian_vec(rng, l.T * 4);
  std::vector<KeyRange> rc, rk;
  for (const int32_t t : l.q_rows) {
    const int64_t n = t % 40 + 1;
    std::uniform_int_distribution<int64_t> u(0, n);
    int64_t a = u(rng), b = u(rng);
    rc.push_back({std::min(a, b), std::max(a, b)});
    a = u(rng), b = u(rng);
    rk.push_back({std::min(a, b), std::max(a, b)});
  }
  const AbsorbedAttention<double> att(l.queries());
  const auto mixed = att.run_mixed({l.c_kv, l.k_pe, cb, kb, rc, rk}, true);
  const auto slow = mixed_by_rows(l, att, l.c_kv, l.k_pe, cb, kb, rc, rk);
  EXPECT_LT(rel_fro(slow.out, mixed.out), 1e-13);
  ASSERT_EQ(slow.probs.size(), mixed.probs.size());
  for (size_t j = 0; j < slow.probs.size(); ++j) ASSERT_NEAR(mixed.probs[j], slow.probs[j], 1e-14) << j;
  // float32 agrees with float64 to float32 accuracy.
  const auto mixed32 = AbsorbedAttention<float>(l.queries()).run_mixed({l.c_kv, l.k_pe, cb, kb, rc, rk}, true);
  std::vector<double> m32(mixed32.out.begin(), mixed32.out.end());
  EXPECT_LT(rel_fro(mixed.out, m32), 1e-6);
}

TEST(Attention, MixedCacheAllAOrAllBIsThePlainRun) {
  const RandomLayer l = make_layer(43, 3, 50, 30, MlaDims{3, 16, 8, 4, 8});
  std::mt19937_64 rng(44);
  const std::vector<float> cb = probe_test::gaussian_vec(rng, l.T * 16), kb = probe_test::gaussian_vec(rng, l.T * 4);
  std::vector<KeyRange> all, none(l.q_rows.size());
  for (const int32_t t : l.q_rows) all.push_back({0, t % 50 + 1});
  const AbsorbedAttention<float> att(l.queries());
  const auto a = att.run(l.c_kv, l.k_pe, true), b = att.run(cb, kb, true);
  const auto ma = att.run_mixed({l.c_kv, l.k_pe, cb, kb, all, all}, true);
  const auto mb = att.run_mixed({l.c_kv, l.k_pe, cb, kb, none, none}, true);
  EXPECT_EQ(ma.out, a.out);  // bit for bit: the same float operations
  EXPECT_EQ(ma.probs, a.probs);
  EXPECT_EQ(mb.out, b.out);
  EXPECT_EQ(mb.probs, b.probs);
  EXPECT_THROW(att.run_mixed({l.c_kv, l.k_pe, cb, kb, std::span<const KeyRange>(all).first(2), all}), std::invalid_argument);
}

TEST(AttentionError, RowsPartitionAveragesToTheWhole) {
  const RandomLayer l = make_layer(45, 2, 60, 20, MlaDims{2, 16, 8, 4, 8});
  const AbsorbedAttention<double> att(l.queries());
  std::vector<float> c2 = l.c_kv;
  for (auto& x : c2) x *= 1.05f;
  const auto ref = att.run(l.c_kv, l.k_pe, true), test = att.run(c2, l.k_pe, true);
  const AttentionError whole = attention_error(ref, test);
  std::vector<int64_t> even, odd, all(l.q_rows.size());
  std::iota(all.begin(), all.end(), int64_t{0});
  for (int64_t i : all) (i % 2 ? odd : even).push_back(i);
  const AttentionError e = attention_error_rows(ref, test, even), o = attention_error_rows(ref, test, odd);
  const AttentionError w = attention_error_rows(ref, test, all);
  EXPECT_EQ(w.kl_mean, whole.kl_mean);
  EXPECT_EQ(w.out_rel_fro, whole.out_rel_fro);
  EXPECT_NEAR((e.kl_mean * double(even.size()) + o.kl_mean * double(odd.size())) / double(all.size()), whole.kl_mean,
              1e-15);
  EXPECT_GT(e.kl_mean, 0.0);
  EXPECT_THROW(attention_error_rows(ref, test, std::vector<int64_t>{}), std::invalid_argument);
  EXPECT_THROW(attention_error_rows(ref, test, std::vector<int64_t>{20}), std::invalid_argument);
}

TEST(DecodeOrder, RangesHandComputed) {
  using latentq::CacheMode;
  using latentq::DecodeOrder;
  const std::vector<int64_t> pos = {0, 1, 3, 5, 9};
  const auto ranges = [&](DecodeOrder o, int64_t G) {
    std::vector<std::pair<int64_t, int64_t>> v;
    for (const KeyRange& k : decode_order_ranges(o, pos, G)) v.emplace_back(k.begin, k.end);
    return v;
  };
  using V = std::vector<std::pair<int64_t, int64_t>>;
  // prefill-at-once: every key.
  EXPECT_EQ(ranges(DecodeOrder{}, 32), (V{{0, 1}, {0, 2}, {0, 4}, {0, 6}, {0, 10}}));
  // R = 0, S = 0, G = 1: the engines' order, the own key included.
  EXPECT_EQ(ranges({CacheMode::Decode, 0, 0, 0}, 1), (V{{0, 1}, {0, 2}, {0, 4}, {0, 6}, {0, 10}}));
  // R = 2, S = 1, G = 1: quantized_end(t) = 1 + (t + 1 − 3) → t = 5: [1, 4), t = 9: [1, 8).
  EXPECT_EQ(ranges({CacheMode::Decode, 2, 1, 0}, 1), (V{{0, 0}, {0, 0}, {1, 2}, {1, 4}, {1, 8}}));
  // R = 0, S = 0, G = 4: complete groups only → t = 3: [0, 4), t = 5: [0, 4), t = 9: [0, 8).
  EXPECT_EQ(ranges({CacheMode::Decode, 0, 0, 0}, 4), (V{{0, 0}, {0, 0}, {0, 4}, {0, 4}, {0, 8}}));
  // prefill P = 4: t < 4 reads bf16 only.
  EXPECT_EQ(ranges({CacheMode::Decode, 0, 0, 4}, 1), (V{{0, 0}, {0, 0}, {0, 0}, {0, 6}, {0, 10}}));
  // R ≥ the positions: nothing quantized.
  EXPECT_EQ(ranges({CacheMode::Decode, 10, 0, 0}, 1), (V{{0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}}));
  EXPECT_THROW(decode_order_ranges(DecodeOrder{}, pos, 0), std::invalid_argument);
}

namespace {

struct DecodeFixture {
  RandomLayer l;
  std::vector<int32_t> pos;
  AbsorbedAttention<float> att;
  AttentionResult<float> ref;
  AttentionReference<float> prepared;  // ref, prepared once (as the study does per layer)
  explicit DecodeFixture(RandomLayer layer)
      : l(std::move(layer)), pos(positions_of(l)), att(l.queries()), ref(att.run(l.c_kv, l.k_pe, true)), prepared(ref) {}
  DecodeFixture(const DecodeFixture&) = delete;  // prepared points at this ref
  DecodeFixture& operator=(const DecodeFixture&) = delete;
  DecodeOrderInput input() const { return {l.c_kv, l.k_pe, l.seq_offsets, l.q_rows, pos}; }
  std::vector<int64_t> rows_of(const PositionBucketError& b) const {
    std::vector<int64_t> rows;
    for (size_t i = 0; i < l.q_rows.size(); ++i)
      if (pos[l.q_rows[i]] >= b.pos_start && pos[l.q_rows[i]] < b.pos_end) rows.push_back(static_cast<int64_t>(i));
    return rows;
  }
};

std::vector<float> bf16_of(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  latentq::round_bf16(x.data(), static_cast<int64_t>(x.size()), y.data());
  return y;
}

}  // namespace

TEST(DecodeOrder, PrefillAtOnceIsTheQuantizedRunAndLongResidualIsBf16) {
  using latentq::CacheMode;
  using latentq::DecodeOrder;
  const DecodeFixture f(make_layer(51, 2, 96, 40, MlaDims{2, 32, 8, 8, 8}));
  SCOPED_TRACE(f.l.describe());
  const latentq::QuantSpec spec = latentq::QuantSpec::parse("int4-asym-channel-g32");
  const DecodeOrderQuantizer q{spec, nullptr, nullptr, true, true};
  const std::vector<DecodeOrder> orders = {DecodeOrder{}, {CacheMode::Decode, 96, 0, 0}, {CacheMode::Decode, 0, 96, 0}};
  const auto res = decode_order_attention(f.att, f.prepared, f.input(), q, orders, 32);
  ASSERT_EQ(res.size(), 3u);
  // prefill-at-once: the cache quantized at once, every key read quantized (what /attention_error measures).
  std::vector<float> qc(f.l.c_kv.size()), qk(f.l.k_pe.size());
  const latentq::Rotation id;
  const double bpt_c = latentq::account(latentq::quantize_dequantize_rotated(spec, id, latentq::Target::CKV, f.l.c_kv.data(),
                                                                            f.l.T, 32, f.l.seq_offsets, qc.data()))
                           .bytes_per_token;
  const double bpt_k = latentq::account(latentq::quantize_dequantize_rotated(spec, id, latentq::Target::KPE, f.l.k_pe.data(),
                                                                            f.l.T, 8, f.l.seq_offsets, qk.data()))
                           .bytes_per_token;
  const auto at_once = f.att.run(qc, qk, true);
  const AttentionError whole = attention_error(f.ref, at_once);
  // bf16 everywhere: R ≥ the sequence length, or S ≥ it.
  const auto bf16 = f.att.run(bf16_of(f.l.c_kv), bf16_of(f.l.k_pe), true);
  ASSERT_EQ(res[0].buckets.size(), 3u);  // positions 0..95 in buckets of 32
  double kl_weighted = 0;
  int64_t queries = 0;
  for (size_t b = 0; b < 3; ++b) {
    const PositionBucketError& x = res[0].buckets[b];
    EXPECT_EQ(x.pos_start, 32 * int64_t(b));
    EXPECT_EQ(x.pos_end, 32 * int64_t(b) + 32);
    const std::vector<int64_t> rows = f.rows_of(x);
    EXPECT_EQ(x.queries, int64_t(rows.size()));
    const AttentionError e = attention_error_rows(f.ref, at_once, rows);
    EXPECT_EQ(x.kl_mean, e.kl_mean);
    EXPECT_EQ(x.out_rel_fro, e.out_rel_fro);
    EXPECT_EQ(x.quantized_key_frac, 1.0);
    kl_weighted += x.kl_mean * double(x.queries);
    queries += x.queries;
    for (size_t o : {1, 2}) {
      const PositionBucketError& y = res[o].buckets[b];
      const AttentionError eb = attention_error_rows(f.ref, bf16, rows);
      EXPECT_EQ(y.kl_mean, eb.kl_mean) << o;
      EXPECT_EQ(y.out_rel_fro, eb.out_rel_fro) << o;
      EXPECT_EQ(y.quantized_key_frac, 0.0);
      EXPECT_LT(y.kl_mean, 0.05 * x.kl_mean) << "bf16 reads are far below int4";
    }
  }
  EXPECT_EQ(queries, int64_t(f.l.q_rows.size()));
  EXPECT_NEAR(kl_weighted / double(queries), whole.kl_mean, 1e-12 * whole.kl_mean);
  EXPECT_DOUBLE_EQ(res[0].bytes_per_token, bpt_c + bpt_k);
  EXPECT_EQ(res[1].bytes_per_token, 2.0 * (32 + 8));
  EXPECT_EQ(res[2].bytes_per_token, 2.0 * (32 + 8));
}

TEST(DecodeOrder, MatchesPerRowCachesWithSinkResidualAndGroups) {
  using latentq::CacheMode;
  using latentq::DecodeOrder;
  const DecodeFixture f(make_layer(52, 3, 70, 45, MlaDims{2, 16, 8, 4, 8}));
  SCOPED_TRACE(f.l.describe());
  for (const char* s : {"int4-asym-channel-g16", "int2-asym-token", "int4-asym-tensor"}) {
    SCOPED_TRACE(s);
    const latentq::QuantSpec spec = latentq::QuantSpec::parse(s);
    const int64_t G = latentq::decode_token_group(spec);
    for (const DecodeOrder o : {DecodeOrder{CacheMode::Decode, 5, 4, 0}, DecodeOrder{CacheMode::Decode, 0, 3, 10}}) {
      SCOPED_TRACE(o.label());
      const auto res = decode_order_attention(f.att, f.prepared, f.input(), DecodeOrderQuantizer{spec}, {&o, 1}, 1000);
      ASSERT_EQ(res.size(), 1u);
      ASSERT_EQ(res[0].buckets.size(), 1u);
      // The slow way: the decode-order contents, one cache per row mixed key by key with reads_quantized.
      std::vector<float> qc(f.l.c_kv.size()), qk(f.l.k_pe.size());
      const latentq::Rotation id;
      latentq::decode_order_quantize(spec, id, latentq::Target::CKV, f.l.c_kv.data(), f.l.T, 16, f.l.seq_offsets, o,
                                     qc.data());
      latentq::decode_order_quantize(spec, id, latentq::Target::KPE, f.l.k_pe.data(), f.l.T, 4, f.l.seq_offsets, o,
                                     qk.data());
      // Sink rows hold bf16 in the quantized cache too.
      const std::vector<float> bc = bf16_of(f.l.c_kv), bk = bf16_of(f.l.k_pe);
      for (int64_t j = 0; j < o.sink; ++j)
        for (int64_t c = 0; c < 16; ++c) EXPECT_EQ(qc[(70 + j) * 16 + c], bc[(70 + j) * 16 + c]);
      std::vector<KeyRange> rng;
      double frac = 0;
      for (const int32_t t : f.l.q_rows) {
        const int64_t p = f.pos[t];
        KeyRange k{0, 0};
        int64_t nq = 0;
        for (int64_t j = 0; j <= p; ++j)
          if (o.reads_quantized(p, j, G)) {
            if (nq++ == 0) k.begin = j;
            k.end = j + 1;
            EXPECT_GE(j, o.sink) << "a sink key read quantized";
          }
        EXPECT_EQ(k.end - k.begin, nq);
        frac += double(nq) / double(p + 1);
        rng.push_back(k);
      }
      const auto slow = mixed_by_rows(f.l, f.att, qc, qk, bc, bk, rng, rng);
      const AttentionError e = attention_error(f.ref, slow);
      // Both sides are float32 attention through OpenBLAS, on GEMMs of other shapes (one per row here, one
      // per chunk there), so their probabilities differ by rounding; how much depends on the BLAS kernel the
      // CPU gets (1.07e-6 relative in kl_mean under OPENBLAS_CORETYPE=Haswell for this seed). A wrong sink,
      // window or group moves a key between int4 and bf16 and changes kl_mean by far more than 1e-5.
      EXPECT_NEAR(res[0].buckets[0].kl_mean, e.kl_mean, 1e-5 * e.kl_mean);
      EXPECT_NEAR(res[0].buckets[0].out_rel_fro, e.out_rel_fro, 1e-5 * e.out_rel_fro);
      EXPECT_NEAR(res[0].buckets[0].quantized_key_frac, frac / double(f.l.q_rows.size()), 1e-12);
      EXPECT_GT(res[0].buckets[0].quantized_key_frac, 0.3);
    }
  }
}

TEST(DecodeOrder, BytesPerTokenHandComputed) {
  using latentq::CacheMode;
  // Sequences of 16 tokens, int8-asym-token (G = 1; D + 4 bytes per token: codes, fp16 scale and offset),
  // R = 4, S = 2: at the end quantized_end(15) = 2 + (16 − 4 − 2) = 12 → 10 tokens quantized, 6 bf16.
  const DecodeFixture f(make_layer(53, 2, 16, 8, MlaDims{2, 16, 8, 4, 8}));
  const latentq::DecodeOrder o{CacheMode::Decode, 4, 2, 0};
  const latentq::QuantSpec spec = latentq::QuantSpec::parse("int8-asym-token");
  auto res = decode_order_attention(f.att, f.prepared, f.input(), DecodeOrderQuantizer{spec}, {&o, 1}, 4);
  EXPECT_DOUBLE_EQ(res[0].bytes_per_token, (6.0 * 2 * (16 + 4) + 10.0 * ((16 + 4) + (4 + 4))) / 16.0);
  // c_kv only: k_pe stays bf16 for every token.
  res = decode_order_attention(f.att, f.prepared, f.input(), DecodeOrderQuantizer{spec, nullptr, nullptr, true, false},
                               {&o, 1}, 4);
  EXPECT_DOUBLE_EQ(res[0].bytes_per_token, (6.0 * 2 * 16 + 10.0 * (16 + 4)) / 16.0 + 2.0 * 4);
  // Errors: a bucket < 1, nothing quantized, positions that do not count from the sequence start.
  EXPECT_THROW(decode_order_attention(f.att, f.prepared, f.input(), DecodeOrderQuantizer{spec}, {&o, 1}, 0),
               std::invalid_argument);
  EXPECT_THROW(decode_order_attention(f.att, f.prepared, f.input(), DecodeOrderQuantizer{spec, nullptr, nullptr, false, false},
                                      {&o, 1}, 4),
               std::invalid_argument);
  std::vector<int32_t> shifted = f.pos;
  for (auto& p : shifted) p += 1;
  DecodeOrderInput bad = f.input();
  bad.positions = shifted;
  try {
    decode_order_attention(f.att, f.prepared, bad, DecodeOrderQuantizer{spec}, {&o, 1}, 4);
    ADD_FAILURE() << "shifted positions accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("/positions["), std::string::npos) << e.what();
  }
}

// run_variants shares partial scores and output GEMMs between variants; each result equals run() on the
// same latents to float32 rounding (tolerance: out rel_fro ≤ 1e-6, probabilities within 1e-6 absolute),
// and exactly in float64 up to 1e-13 (the scores are summed from two GEMMs instead of accumulated).
TEST(Attention, RunVariantsEqualsRun) {
  const RandomLayer l = make_layer(61, 3, 200, 60, kTinyMla);
  SCOPED_TRACE(l.describe());
  std::mt19937_64 rng(62);
  std::vector<float> c2 = l.c_kv, k2 = l.k_pe;
  for (auto& x : c2) x += 0.05f * std::normal_distribution<float>()(rng);
  for (auto& x : k2) x += 0.05f * std::normal_distribution<float>()(rng);
  {
    const AbsorbedAttention<float> att(l.queries());
    const auto scores = att.ckv_scores(l.c_kv);
    using V = AbsorbedAttention<float>::Variant;
    // The three /attention_error variants of one quantizer, the exact c_kv's scores given.
    const std::vector<V> vs = {{c2, l.k_pe, nullptr}, {l.c_kv, k2, &scores}, {c2, k2, nullptr}};
    const auto res = att.run_variants(vs, true);
    ASSERT_EQ(res.size(), 3u);
    for (size_t a = 0; a < 3; ++a) {
      SCOPED_TRACE(a);
      const auto one = att.run(vs[a].c_kv, vs[a].k_pe, true);
      EXPECT_LE(rel_fro(one.out, res[a].out), 1e-6);
      ASSERT_EQ(one.probs.size(), res[a].probs.size());
      double worst = 0;
      for (size_t j = 0; j < one.probs.size(); ++j) worst = std::max(worst, double(std::abs(one.probs[j] - res[a].probs[j])));
      EXPECT_LE(worst, 1e-6);
      const AttentionError e1 = attention_error(att.run(l.c_kv, l.k_pe, true), one);
      const AttentionError e2 = attention_error(att.run(l.c_kv, l.k_pe, true), res[a]);
      EXPECT_NEAR(e2.kl_mean, e1.kl_mean, 1e-4 * e1.kl_mean);
      EXPECT_NEAR(e2.out_rel_fro, e1.out_rel_fro, 1e-4 * e1.out_rel_fro);
    }
    // Scores of another store are refused.
    const std::vector<V> bad = {{c2, l.k_pe, &scores}};
    EXPECT_THROW(att.run_variants(bad), std::invalid_argument);
  }
  {
    const AbsorbedAttention<double> att(l.queries());
    using V = AbsorbedAttention<double>::Variant;
    const std::vector<V> vs = {{c2, l.k_pe, nullptr}, {c2, k2, nullptr}};
    const auto res = att.run_variants(vs, false);
    for (size_t a = 0; a < 2; ++a) EXPECT_LE(rel_fro(att.run(vs[a].c_kv, vs[a].k_pe).out, res[a].out), 1e-13);
  }
}
