// Absorbed MLA attention check: absorbed vs unabsorbed vs a loop reference, causality within
// sequences, metrics (hand-computed KL / top-1 / top-8), errors.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "attention_test_util.h"

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
    for (int64_t h = 0; h < 2; ++h)
      EXPECT_NEAR(std::accumulate(a.prob(i, h).begin(), a.prob(i, h).end(), 0.0), 1.0, 1e-12);
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
      if (k != latentq::CpuKernel::Avx2)
        EXPECT_EQ(got, def) << "n " << n;  // the scalar path is the definition
      else
        differ += got != def;
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
      for (size_t j = 0; j < one.probs.size(); ++j)
        worst = std::max(worst, double(std::abs(one.probs[j] - res[a].probs[j])));
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
