// The absorbed attention on mixed caches (keys per row from two stores) and in decode order (attention sink,
// residual window, token groups), against per-row caches run the slow way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "attention_test_util.h"

using namespace latentq::probes;
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
  EXPECT_THROW(att.run_mixed({l.c_kv, l.k_pe, cb, kb, std::span<const KeyRange>(all).first(2), all}),
               std::invalid_argument);
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
      : l(std::move(layer)),
        pos(positions_of(l)),
        att(l.queries()),
        ref(att.run(l.c_kv, l.k_pe, true)),
        prepared(ref) {}
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
  const double bpt_c =
      latentq::account(latentq::quantize_dequantize_rotated(spec, id, latentq::Target::CKV, f.l.c_kv.data(), f.l.T, 32,
                                                            f.l.seq_offsets, qc.data()))
          .bytes_per_token;
  const double bpt_k =
      latentq::account(latentq::quantize_dequantize_rotated(spec, id, latentq::Target::KPE, f.l.k_pe.data(), f.l.T, 8,
                                                            f.l.seq_offsets, qk.data()))
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

// The one decode-order accounting: the incomplete group is held in bf16 and charged no metadata. Two sequences
// of 40 tokens, c_kv 32 and k_pe 16 columns, int4-asym-channel-g16 (codes D/2 B per token; per complete group of
// 16 tokens D fp16 scales + D fp16 offsets = 4·D B). tests/python/test_e2e_decode.py checks /e2e and
// /e2e_position against the same values.
TEST(DecodeOrder, BytesOfTheIncompleteGroupAreBf16Only) {
  using latentq::CacheMode;
  using latentq::DecodeOrder;
  const DecodeFixture f(make_layer(54, 2, 40, 12, MlaDims{2, 32, 8, 16, 8}));
  SCOPED_TRACE(f.l.describe());
  const latentq::QuantSpec spec = latentq::QuantSpec::parse("int4-asym-channel-g16");
  // r0-s0 and r0-s4: 32 tokens in 2 complete groups, 8 in bf16 (the incomplete group; the sink of 4 moves the
  // groups to [4, 36) and leaves 4 + 4 bf16 tokens). c_kv: 8·64 + 32·16 + 2·128 = 1280 B; k_pe: 8·32 + 32·8 +
  // 2·64 = 640 B per sequence -> 1920 / 40 = 48 B/token. r16-s4: quantized_end(39) = 4 + 16·floor(20/16) = 20,
  // 16 tokens in 1 group, 24 in bf16: c_kv 24·64 + 16·16 + 128 = 1920, k_pe 24·32 + 16·8 + 64 = 960 -> 72 B/token.
  const std::vector<DecodeOrder> orders = {
      {CacheMode::Decode, 0, 0, 0}, {CacheMode::Decode, 16, 4, 0}, {CacheMode::Decode, 0, 4, 0}};
  const std::vector<double> expected = {48.0, 72.0, 48.0};
  const auto res = decode_order_attention(f.att, f.prepared, f.input(), DecodeOrderQuantizer{spec}, orders, 40);
  ASSERT_EQ(res.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(orders[i].label());
    EXPECT_EQ(res[i].bytes_per_token, expected[i]);
    const int64_t c = latentq::decode_order_cache_bytes(spec, latentq::Target::CKV, 32, f.l.seq_offsets, orders[i], 16);
    const int64_t k = latentq::decode_order_cache_bytes(spec, latentq::Target::KPE, 16, f.l.seq_offsets, orders[i], 16);
    EXPECT_EQ(static_cast<double>(c + k), expected[i] * 80);
  }
  // Prefill-at-once: the whole matrix as quantize() stores it (the incomplete group [32, 40) quantized, with its
  // metadata): c_kv 40·16 + 3·128 = 1024, k_pe 40·8 + 3·64 = 512 per sequence -> 38.4 B/token.
  EXPECT_EQ(latentq::decode_order_cache_bytes(spec, latentq::Target::CKV, 32, f.l.seq_offsets, DecodeOrder{}, 16), 2048);
  EXPECT_EQ(latentq::decode_order_cache_bytes(spec, latentq::Target::KPE, 16, f.l.seq_offsets, DecodeOrder{}, 16), 1024);
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
  EXPECT_THROW(decode_order_attention(f.att, f.prepared, f.input(),
                                      DecodeOrderQuantizer{spec, nullptr, nullptr, false, false}, {&o, 1}, 4),
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
