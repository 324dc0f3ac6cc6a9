// The absorbed attention on the device (latentq/attention_cuda.h, through probes::AbsorbedAttention's
// AttentionDevice seam and the CUDA backend's make_cuda_attention_device) against the CPU path: the same
// key counts and layout, outputs and probabilities equal to float32 rounding, and the same errors for bad
// input. In test_gpu (skips without a GPU) and test_gpu_emu (the kernels and a cuBLAS stand-in on the
// host emulator, which checks cuBLAS's argument rules: tests/gpu/emu/cublas_v2.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "latentq/attention_cuda.h"
#include "latentq/decode_order.h"
#include "latentq/attention/attention.h"
#include "latentq/spec.h"
#include "latentq/quantize_cuda.h"
#include "require_gpu.h"
#include "latentq/attention_device_cuda.h"

namespace {

using namespace latentq;
using probes::AbsorbedAttention;
using probes::AttentionResult;

// One layer's queries and cache: H heads, sequences of the given lengths (an empty one allowed), every
// third token a query row plus each sequence's first and last token (so a segment spans several CPU
// chunks of 8 rows and rows with 1 key exist).
struct Case {
  probes::MlaDims d;
  std::vector<int64_t> seq_offsets;
  std::vector<int32_t> q_rows;
  std::vector<float> q_nope, q_pe, w_uk, w_uv, c_kv, k_pe;
  int64_t T = 0;
  probes::AttentionQueries queries() const {
    probes::AttentionQueries q;
    q.dims = d;
    q.num_tokens = T;
    q.seq_offsets = seq_offsets;
    q.q_rows = q_rows;
    q.q_nope = q_nope;
    q.q_pe = q_pe;
    q.w_uk = w_uk;
    q.w_uv = w_uv;
    q.softmax_scale = 1.0 / std::sqrt(static_cast<double>(d.qk_nope_head_dim + d.qk_rope_head_dim));
    return q;
  }
};

Case make_case(uint64_t seed, std::vector<int64_t> lengths, int64_t rope) {
  Case c;
  c.d = {3, 16, 8, rope, 8};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  c.seq_offsets = {0};
  for (int64_t n : lengths) c.seq_offsets.push_back(c.seq_offsets.back() + n);
  c.T = c.seq_offsets.back();
  for (size_t s = 0; s + 1 < c.seq_offsets.size(); ++s)
    for (int64_t t = c.seq_offsets[s]; t < c.seq_offsets[s + 1]; ++t)
      if (t == c.seq_offsets[s] || t == c.seq_offsets[s + 1] - 1 || t % 3 == 0)
        c.q_rows.push_back(static_cast<int32_t>(t));
  std::shuffle(c.q_rows.begin(), c.q_rows.end(), rng);  // the probe sorts them
  const int64_t Tq = static_cast<int64_t>(c.q_rows.size()), H = c.d.num_heads;
  const auto fill = [&](std::vector<float>& v, int64_t n, float s) {
    v.resize(static_cast<size_t>(n));
    for (float& x : v) x = s * nd(rng);
  };
  fill(c.q_nope, Tq * H * c.d.qk_nope_head_dim, 1.0f);
  fill(c.q_pe, Tq * H * rope, 1.0f);
  fill(c.w_uk, H * c.d.qk_nope_head_dim * c.d.kv_lora_rank, 0.5f);
  fill(c.w_uv, H * c.d.v_head_dim * c.d.kv_lora_rank, 0.5f);
  fill(c.c_kv, c.T * c.d.kv_lora_rank, 1.0f);
  fill(c.k_pe, c.T * rope, 1.0f);
  return c;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

void expect_close(const AttentionResult<float>& cpu, const AttentionResult<float>& dev) {
  ASSERT_EQ(cpu.nkeys, dev.nkeys);
  ASSERT_EQ(cpu.prob_offsets, dev.prob_offsets);
  ASSERT_EQ(cpu.out.size(), dev.out.size());
  ASSERT_EQ(cpu.probs.size(), dev.probs.size());
  const double scale = max_abs(cpu.out);
  ASSERT_GT(scale, 0);
  for (size_t j = 0; j < cpu.out.size(); ++j) ASSERT_NEAR(dev.out[j], cpu.out[j], 2e-5 * scale) << "out[" << j << "]";
  for (size_t j = 0; j < cpu.probs.size(); ++j) ASSERT_NEAR(dev.probs[j], cpu.probs[j], 2e-6) << "probs[" << j << "]";
}

// segment_rows 0: attach_device's default (one segment per sequence at these sizes); 5: sequences split in
// segments of 5 query rows, each with its own key count.
// *segments ← the number of segments of the device's layout.
std::unique_ptr<AbsorbedAttention<float>> on_device(const probes::AttentionQueries& q, int64_t segment_rows = 0,
                                                    size_t* segments = nullptr) {
  auto a = std::make_unique<AbsorbedAttention<float>>(q);
  a->attach_device(
      [segments](const probes::AttentionLayout& l) {
        if (segments) *segments = l.segments.size();
        return make_cuda_attention_device(l);
      },
      segment_rows);
  return a;
}

// cuBLAS is loaded on first use (dlopen of the library found at build time): that needs no GPU, so a build
// with cuBLAS proves here that it loads and has every entry point used.
TEST(DeviceAttention, CublasLoadsWithoutAGpu) {
  std::string why;
  if (!cuda_attention_available(&why)) EXPECT_EQ(why.find("cuBLAS"), std::string::npos) << why;
}

TEST(DeviceAttention, MatchesTheCpuPathOverSeveralSequences) {
  LQ_REQUIRE_GPU();
  for (const int64_t rope : {int64_t{4}, int64_t{0}})
    for (const int64_t segment_rows : {int64_t{0}, int64_t{5}}) {
      const uint64_t seed = 20261201 + static_cast<uint64_t>(rope);
      SCOPED_TRACE("seed " + std::to_string(seed) + ", sequences 37, 0, 50, 21, H 3, r 16, rope " +
                   std::to_string(rope) + ", segment_rows " + std::to_string(segment_rows));
      const Case c = make_case(seed, {37, 0, 50, 21}, rope);
      const probes::AttentionQueries q = c.queries();
      const AbsorbedAttention<float> cpu(q);
      size_t segments = 0;
      const std::unique_ptr<AbsorbedAttention<float>> dev = on_device(q, segment_rows, &segments);
      ASSERT_TRUE(dev->on_device());
      // 14, 18 and 9 query rows in the three non-empty sequences: 3 segments, or 3 + 4 + 2 of ≤ 5 rows.
      EXPECT_EQ(segments, segment_rows == 0 ? 3u : 9u);
      const AttentionResult<float> ref_cpu = cpu.run(c.c_kv, c.k_pe, true);
      const AttentionResult<float> ref_dev = dev->run(c.c_kv, c.k_pe, true);
      expect_close(ref_cpu, ref_dev);
      // run_on_cpu with the device attached is the CPU path, bit for bit.
      EXPECT_EQ(dev->run_on_cpu(c.c_kv, c.k_pe, true).out, ref_cpu.out);

      // A perturbed cache (a stand-in for a quantized one): the errors agree across engines.
      std::vector<float> ckv_q = c.c_kv, kpe_q = c.k_pe;
      std::mt19937_64 rng(seed + 7);
      std::normal_distribution<float> nd(0.0f, 0.05f);
      for (float& x : ckv_q) x += nd(rng);
      for (float& x : kpe_q) x += nd(rng);
      const AttentionResult<float> t_cpu = cpu.run(ckv_q, kpe_q, true);
      const AttentionResult<float> t_dev = dev->run(ckv_q, kpe_q, true);
      expect_close(t_cpu, t_dev);
      const probes::AttentionError e_cpu = probes::attention_error(ref_cpu, t_cpu);
      const probes::AttentionError e_dev = probes::attention_error(ref_dev, t_dev);
      EXPECT_GT(e_cpu.kl_mean, 1e-5);
      EXPECT_NEAR(e_dev.kl_mean, e_cpu.kl_mean, 1e-3 * e_cpu.kl_mean);
      EXPECT_NEAR(e_dev.out_rel_fro, e_cpu.out_rel_fro, 1e-3 * e_cpu.out_rel_fro);
      EXPECT_NEAR(e_dev.cos_mean, e_cpu.cos_mean, 1e-6);

      // run_variants on the device: each variant is run() of its cache, bit for bit (scores are not shared).
      const AbsorbedAttention<float>::CkvScores scores = cpu.ckv_scores(c.c_kv);
      std::vector<AbsorbedAttention<float>::Variant> vs(3);
      vs[0].c_kv = ckv_q, vs[0].k_pe = c.k_pe;
      vs[1].c_kv = c.c_kv, vs[1].k_pe = kpe_q, vs[1].scores = &scores;
      vs[2].c_kv = ckv_q, vs[2].k_pe = kpe_q;
      const std::vector<AttentionResult<float>> rv = dev->run_variants(vs, true);
      ASSERT_EQ(rv.size(), 3u);
      EXPECT_EQ(rv[2].out, t_dev.out);
      EXPECT_EQ(rv[2].probs, t_dev.probs);
      expect_close(cpu.run(c.c_kv, kpe_q, true), rv[1]);
      expect_close(cpu.run(ckv_q, c.k_pe, true), rv[0]);
    }
}

// attention_error on the device (keep_device_reference + device_error: the probabilities never come back)
// against attention_error() of the same device's results computed on the host: float64 rounding apart, the
// same values, and the same top-1/top-8 counts, ties included (probes' top_m rule: the lower key index).
TEST(DeviceAttention, ErrorTermsMatchTheHostMetrics) {
  LQ_REQUIRE_GPU();
  for (const int64_t rope : {int64_t{4}, int64_t{0}}) {
    const uint64_t seed = 20261202 + static_cast<uint64_t>(rope);
    const int64_t segment_rows = rope > 0 ? 0 : 7;
    SCOPED_TRACE("seed " + std::to_string(seed) + ", sequences 300, 0, 45, 21, H 3, r 16, rope " +
                 std::to_string(rope) + ", segment_rows " + std::to_string(segment_rows));
    Case c = make_case(seed, {300, 0, 45, 21}, rope);
    // Ties: the first 24 tokens of the first sequence share one c_kv and k_pe row, so every row reading them
    // has 24 equal probabilities (top-8 must take the lowest 8 indices); the test below breaks the tie.
    const int64_t r = c.d.kv_lora_rank;
    for (int64_t t = 1; t < 24; ++t) {
      std::copy_n(c.c_kv.begin(), r, c.c_kv.begin() + t * r);
      std::copy_n(c.k_pe.begin(), rope, c.k_pe.begin() + t * rope);
    }
    const probes::AttentionQueries q = c.queries();
    const std::unique_ptr<AbsorbedAttention<float>> dev = on_device(q, segment_rows);
    ASSERT_TRUE(dev->device_computes_errors());
    EXPECT_THROW((void)dev->device_error(c.c_kv, c.k_pe), std::logic_error);  // no reference kept yet
    const AttentionResult<float> ref = dev->run(c.c_kv, c.k_pe, true);
    const AttentionResult<float> kept = dev->keep_device_reference(c.c_kv, c.k_pe);
    EXPECT_EQ(kept.out, ref.out);
    EXPECT_TRUE(kept.probs.empty());

    std::vector<float> ckv_q = c.c_kv, kpe_q = c.k_pe;
    std::mt19937_64 rng(seed + 7);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    for (float& x : ckv_q) x += nd(rng);
    for (float& x : kpe_q) x += nd(rng);
    for (const bool both : {true, false}) {
      const std::span<const float> kpe = both ? std::span<const float>(kpe_q) : std::span<const float>(c.k_pe);
      const probes::AttentionError host = probes::attention_error(ref, dev->run(ckv_q, kpe, true));
      const probes::AttentionError on = dev->device_error(ckv_q, kpe);
      EXPECT_GT(host.kl_mean, 1e-5);
      EXPECT_NEAR(on.kl_mean, host.kl_mean, 1e-12 * host.kl_mean);
      EXPECT_NEAR(on.out_rel_fro, host.out_rel_fro, 1e-12 * host.out_rel_fro);
      EXPECT_NEAR(on.cos_mean, host.cos_mean, 1e-14);
      EXPECT_EQ(on.top1_agree, host.top1_agree);
      EXPECT_EQ(on.top8_agree, host.top8_agree);
      EXPECT_LT(host.top8_agree, 1.0);  // the perturbation moves some top-8 keys: the counts are exercised
    }
    // The reference against itself: no error, full agreement.
    const probes::AttentionError self = dev->device_error(c.c_kv, c.k_pe);
    EXPECT_EQ(self.out_rel_fro, 0.0);
    EXPECT_EQ(self.kl_mean, 0.0);
    EXPECT_EQ(self.cos_mean, 1.0);
    EXPECT_EQ(self.top1_agree, 1.0);
    EXPECT_EQ(self.top8_agree, 1.0);

    // A finite cache whose scores and outputs overflow float32 (every c_kv value 3e38): refused with the
    // counts, as run() refuses it.
    const std::vector<float> huge(c.c_kv.size(), 3e38f);
    try {
      (void)dev->device_error(huge, c.k_pe);
      ADD_FAILURE() << "a non-finite attention gave an error";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("NaN/Inf"), std::string::npos) << e.what();
    }
    EXPECT_THROW((void)dev->run(huge, c.k_pe, true), std::invalid_argument);
  }
  // A CPU attention has no device metrics.
  const Case c = make_case(3, {10}, 4);
  AbsorbedAttention<float> cpu(c.queries());
  EXPECT_FALSE(cpu.device_computes_errors());
  EXPECT_THROW((void)cpu.keep_device_reference(c.c_kv, c.k_pe), std::logic_error);
}

// A cache mixed per (row, key) from two stores (run_mixed, the decode-order cache) on the device: against the
// CPU's run_mixed (random ranges: empty, whole and partial, different for c_kv and k_pe), its metrics against
// the host's on the same device results, and decode_order_attention on the device against the CPU's.
TEST(DeviceAttention, MixedCachesMatchTheCpuPath) {
  LQ_REQUIRE_GPU();
  for (const int64_t rope : {int64_t{4}, int64_t{0}}) {
    const uint64_t seed = 20261203 + static_cast<uint64_t>(rope);
    const int64_t segment_rows = rope > 0 ? 5 : 0;
    SCOPED_TRACE("seed " + std::to_string(seed) + ", sequences 61, 0, 40, H 3, r 16, rope " + std::to_string(rope) +
                 ", segment_rows " + std::to_string(segment_rows));
    const Case c = make_case(seed, {61, 0, 40}, rope);
    const probes::AttentionQueries q = c.queries();
    const AbsorbedAttention<float> cpu(q);
    const std::unique_ptr<AbsorbedAttention<float>> dev = on_device(q, segment_rows);
    ASSERT_TRUE(dev->device_runs_mixed());
    const int64_t Tq = cpu.num_queries();
    std::mt19937_64 rng(seed + 11);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    std::vector<float> ckv_b = c.c_kv, kpe_b = c.k_pe;  // store B: a perturbed copy
    for (float& x : ckv_b) x += nd(rng);
    for (float& x : kpe_b) x += nd(rng);
    std::vector<probes::KeyRange> rc(static_cast<size_t>(Tq)), rk(static_cast<size_t>(Tq));
    for (int64_t i = 0; i < Tq; ++i) {
      const int64_t n = cpu.nkeys(i);
      std::uniform_int_distribution<int64_t> u(-2, n + 2);
      const int64_t a = u(rng), b = u(rng);
      rc[i] = i % 7 == 0 ? probes::KeyRange{0, 0} : i % 7 == 1 ? probes::KeyRange{0, n} : probes::KeyRange{a, b};
      rk[i] = i % 5 == 0 ? probes::KeyRange{0, n} : probes::KeyRange{std::min(a, b), std::max(a, b) + 1};
    }
    const probes::MixedCache m{c.c_kv, c.k_pe, ckv_b, kpe_b, rc, rk};
    const AttentionResult<float> mc = cpu.run_mixed(m, true);
    const AttentionResult<float> md = dev->run_mixed(m, true);
    expect_close(mc, md);
    // Every range whole: run() of store A; every range empty: run() of store B (on the device too).
    const std::vector<probes::KeyRange> whole_c = [&] {
      std::vector<probes::KeyRange> w(static_cast<size_t>(Tq));
      for (int64_t i = 0; i < Tq; ++i) w[i] = {0, cpu.nkeys(i)};
      return w;
    }();
    const std::vector<probes::KeyRange> none(static_cast<size_t>(Tq), probes::KeyRange{0, 0});
    expect_close(cpu.run(c.c_kv, c.k_pe, true), dev->run_mixed({c.c_kv, c.k_pe, ckv_b, kpe_b, whole_c, whole_c}, true));
    expect_close(cpu.run(ckv_b, kpe_b, true), dev->run_mixed({c.c_kv, c.k_pe, ckv_b, kpe_b, none, none}, true));

    // The device's terms of the mixed cache: attention_error_rows of the same device's results, for every row
    // subset (here: all rows, and the rows of even index).
    const AttentionResult<float> ref = dev->run(c.c_kv, c.k_pe, true);
    (void)dev->keep_device_reference(c.c_kv, c.k_pe);
    const std::vector<probes::AttentionPairTerms> terms = dev->device_error_terms(m);
    std::vector<int64_t> all(static_cast<size_t>(Tq)), even;
    std::iota(all.begin(), all.end(), int64_t{0});
    for (int64_t i = 0; i < Tq; i += 2) even.push_back(i);
    for (const std::vector<int64_t>* rows : {&all, &even}) {
      const probes::AttentionError host = probes::attention_error_rows(ref, md, *rows);
      const probes::AttentionError on = dev->error_from_terms(terms, *rows);
      EXPECT_GT(host.kl_mean, 1e-6);
      EXPECT_NEAR(on.kl_mean, host.kl_mean, 1e-12 * host.kl_mean);
      EXPECT_NEAR(on.out_rel_fro, host.out_rel_fro, 1e-12 * host.out_rel_fro);
      EXPECT_NEAR(on.cos_mean, host.cos_mean, 1e-14);
      EXPECT_EQ(on.top1_agree, host.top1_agree);
      EXPECT_EQ(on.top8_agree, host.top8_agree);
    }
    EXPECT_THROW((void)dev->error_from_terms(terms, std::vector<int64_t>{Tq}), std::invalid_argument);

    // decode_order_attention: the device form against the CPU form on the CPU (engines differ: float32 rounding)
    // and against the CPU form on the same device's results (float64 rounding).
    std::vector<int32_t> positions(static_cast<size_t>(c.T));
    for (size_t s = 0; s + 1 < c.seq_offsets.size(); ++s)
      for (int64_t t = c.seq_offsets[s]; t < c.seq_offsets[s + 1]; ++t)
        positions[t] = static_cast<int32_t>(t - c.seq_offsets[s]);
    const probes::DecodeOrderInput in{c.c_kv, c.k_pe, c.seq_offsets, c.q_rows, positions};
    const probes::DecodeOrderQuantizer dq{QuantSpec::parse("int4-asym-channel-g32")};
    const std::vector<DecodeOrder> orders = {DecodeOrder{}, {CacheMode::Decode, 8, 0, 0}, {CacheMode::Decode, 4, 2, 0}};
    const AttentionResult<float> ref_cpu = cpu.run(c.c_kv, c.k_pe, true);
    const probes::AttentionReference<float> prepared_cpu(ref_cpu);
    const probes::AttentionReference<float> prepared_dev(ref);
    const auto on_cpu = probes::decode_order_attention(cpu, prepared_cpu, in, dq, orders, 16);
    const auto host_of_dev = probes::decode_order_attention(*dev, prepared_dev, in, dq, orders, 16);
    const auto on_dev = probes::decode_order_attention(*dev, in, dq, orders, 16);
    ASSERT_EQ(on_dev.size(), orders.size());
    for (size_t o = 0; o < orders.size(); ++o) {
      ASSERT_EQ(on_dev[o].buckets.size(), on_cpu[o].buckets.size());
      EXPECT_EQ(on_dev[o].bytes_per_token, on_cpu[o].bytes_per_token);
      for (size_t b = 0; b < on_dev[o].buckets.size(); ++b) {
        const probes::PositionBucketError &x = on_dev[o].buckets[b], &y = host_of_dev[o].buckets[b],
                                          &z = on_cpu[o].buckets[b];
        EXPECT_EQ(x.queries, z.queries);
        EXPECT_EQ(x.quantized_key_frac, z.quantized_key_frac);
        EXPECT_NEAR(x.kl_mean, y.kl_mean, 1e-12 * y.kl_mean + 1e-300) << "order " << o << ", bucket " << b;
        EXPECT_NEAR(x.out_rel_fro, y.out_rel_fro, 1e-12 * y.out_rel_fro) << "order " << o << ", bucket " << b;
        // Across engines (float32 scores summed in another order) at KL ≈ 1e-6: the GPU check's 2e-2.
        EXPECT_NEAR(x.kl_mean, z.kl_mean, 2e-2 * z.kl_mean + 1e-12) << "order " << o << ", bucket " << b;
        EXPECT_NEAR(x.out_rel_fro, z.out_rel_fro, 2e-2 * z.out_rel_fro + 1e-9) << "order " << o << ", bucket " << b;
      }
    }
    // The device form needs the device's reference: a CPU attention refuses it.
    EXPECT_THROW((void)probes::decode_order_attention(cpu, in, dq, orders, 16), std::logic_error);
  }
}

TEST(DeviceAttention, RefusesWhatTheCpuPathRefuses) {
  LQ_REQUIRE_GPU();
  const Case c = make_case(11, {20, 13}, 4);
  const std::unique_ptr<AbsorbedAttention<float>> dev = on_device(c.queries());
  const std::vector<float> short_ckv(c.c_kv.begin(), c.c_kv.end() - 1);
  EXPECT_THROW(dev->run(short_ckv, c.k_pe), std::invalid_argument);
  std::vector<float> nan_ckv = c.c_kv;
  nan_ckv[5] = std::numeric_limits<float>::quiet_NaN();
  try {
    dev->run(nan_ckv, c.k_pe);
    ADD_FAILURE() << "a NaN in c_kv was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("c_kv"), std::string::npos) << e.what();
  }
  // A layout whose segments leave rows uncovered is refused by the device class itself.
  const std::vector<int64_t> nkeys = {1, 2, 3};
  const std::vector<DeviceAttentionSegment> segs = {{0, 2, 0, 3}};
  const std::vector<float> z(3 * 16 * 3, 0.5f);
  EXPECT_THROW(DeviceAbsorbedAttention(1, 16, 0, 3, 8, 0.25f, nkeys, segs, z.data(), nullptr, z.data()),
               std::invalid_argument);
  AbsorbedAttention<float> neg(c.queries());
  EXPECT_THROW(neg.attach_device(make_cuda_attention_device, -1), std::invalid_argument);
  // The double path has no device.
  AbsorbedAttention<double> d(c.queries());
  EXPECT_THROW(d.attach_device(make_cuda_attention_device), std::logic_error);
}

}  // namespace
