// The decode-order cache model (latentq/decode_order.h): hand-computed read masks, the KIVI
// equivalences the header states, byte accounting, and the cache contents with a sink.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <string>
#include <vector>

#include "latentq/decode_order.h"
#include "latentq/quantize.h"

using namespace latentq;

namespace {

// Row t: one character per key j <= t, 'q' read quantized, 'b' read in bf16.
std::vector<std::string> mask_rows(const DecodeOrder& o, int64_t L, int64_t G) {
  std::vector<std::string> rows;
  for (int64_t t = 0; t < L; ++t) {
    std::string r;
    for (int64_t j = 0; j <= t; ++j) r += o.reads_quantized(t, j, G) ? 'q' : 'b';
    rows.push_back(r);
  }
  return rows;
}

DecodeOrder decode(int64_t R, int64_t S, int64_t P) { return DecodeOrder{CacheMode::Decode, R, S, P}; }

}  // namespace

TEST(DecodeOrder, PrefillAtOnceReadsEveryKeyQuantized) {
  const auto rows = mask_rows(DecodeOrder{}, 4, 1);
  EXPECT_EQ(rows, (std::vector<std::string>{"q", "qq", "qqq", "qqqq"}));
  EXPECT_EQ(DecodeOrder{}.label(), "prefill-at-once");
}

TEST(DecodeOrder, PerTokenResidualAndSinkByHand) {
  // G = 1, R = 2, S = 1: the own key and the one before it in bf16, token 0 always bf16.
  EXPECT_EQ(mask_rows(decode(2, 1, 0), 6, 1), (std::vector<std::string>{"b", "bb", "bbb", "bqbb", "bqqbb", "bqqqbb"}));
  // R = 0: the engines' order, the own key is written to the quantized cache before it is read.
  EXPECT_EQ(mask_rows(decode(0, 0, 0), 3, 1), (std::vector<std::string>{"q", "qq", "qqq"}));
}

TEST(DecodeOrder, PerChannelGroupsFillBeforeTheyAreRead) {
  // G = 4, R = 0, S = 0: a group is read quantized from the query that completes it on.
  const auto rows = mask_rows(decode(0, 0, 0), 9, 4);
  EXPECT_EQ(rows[2], "bbb");
  EXPECT_EQ(rows[3], "qqqq");
  EXPECT_EQ(rows[6], "qqqqbbb");
  EXPECT_EQ(rows[7], "qqqqqqqq");
  EXPECT_EQ(rows[8], "qqqqqqqqb");
  // G = 2, R = 3, S = 1: groups [1,3), [3,5), ...; a group is quantized once all of it is older than
  // the 3 most recent keys: t = 5 reads [1, 3) quantized (5 + 1 - 3 - 1 = 2 -> one group).
  EXPECT_EQ(decode(3, 1, 0).quantized_end(5, 2), 3);
  EXPECT_EQ(decode(3, 1, 0).quantized_end(6, 2), 3);
  EXPECT_EQ(decode(3, 1, 0).quantized_end(7, 2), 5);
  EXPECT_EQ(mask_rows(decode(3, 1, 0), 8, 2)[7], "bqqqqbbb");
}

TEST(DecodeOrder, PrefillQueriesReadBf16) {
  const auto rows = mask_rows(decode(0, 0, 3), 5, 1);
  EXPECT_EQ(rows, (std::vector<std::string>{"b", "bb", "bbb", "qqqq", "qqqqq"}));
}

TEST(DecodeOrder, MatchesKiviKeyAndValueRules) {
  // jy-yuan/KIVI models/llama_kivi.py: keys flushed after the attention once residual_length are held
  // (quantized iff j < R_k * floor(t / R_k)); values quantize the oldest once R_v + 1 are held
  // (quantized iff j < t - R_v). The header maps them to (G = R_k, R = 1) and (G = 1, R = R_v + 1).
  for (int64_t Rk : {1, 4, 32}) {
    for (int64_t t = 0; t < 200; ++t)
      for (int64_t j = 0; j <= t; ++j)
        ASSERT_EQ(decode(1, 0, 0).reads_quantized(t, j, Rk), j < Rk * (t / Rk))
            << "R_k " << Rk << " t " << t << " j " << j;
  }
  for (int64_t Rv : {0, 3, 32}) {
    for (int64_t t = 0; t < 200; ++t)
      for (int64_t j = 0; j <= t; ++j)
        ASSERT_EQ(decode(Rv + 1, 0, 0).reads_quantized(t, j, 1), j < t - Rv)
            << "R_v " << Rv << " t " << t << " j " << j;
  }
}

TEST(DecodeOrder, LabelsRoundTripAndBadInputThrows) {
  for (const DecodeOrder& o : {DecodeOrder{}, decode(0, 0, 0), decode(128, 4, 512)})
    EXPECT_EQ(DecodeOrder::parse(o.label()), o) << o.label();
  EXPECT_EQ(decode(32, 4, 0).label(), "decode-r32-s4-p0");
  for (const char* bad :
       {"decode", "decode-r-1-s0-p0", "decode-r1-s0", "decode-r1-s0-p0x", "prefill", "decode-r01-s0-p0",
        "decode-r+1-s0-p0", "decode-r 1-s0-p0", "decode-r99999999999999999999-s0-p0"})
    EXPECT_THROW(DecodeOrder::parse(bad), std::invalid_argument) << bad;
  EXPECT_THROW((DecodeOrder{CacheMode::PrefillAtOnce, 4, 0, 0}.validate()), std::invalid_argument);
  EXPECT_THROW(decode(0, -1, 0).validate(), std::invalid_argument);
}

TEST(DecodeOrder, TokenGroupAndCausality) {
  EXPECT_EQ(decode_token_group(QuantSpec::parse("int4-asym-channel-g32")), 32);
  EXPECT_EQ(decode_token_group(QuantSpec::parse("int4-asym-channel")), 1);
  EXPECT_EQ(decode_token_group(QuantSpec::parse("int4-asym-token-g32")), 1);
  EXPECT_EQ(decode_token_group(QuantSpec::parse("mxfp4")), 1);
  EXPECT_TRUE(decode_scale_is_causal(QuantSpec::parse("int2-asym-channel-g128")));
  EXPECT_TRUE(decode_scale_is_causal(QuantSpec::parse("flashmla-v32-fp8")));
  EXPECT_FALSE(decode_scale_is_causal(QuantSpec::parse("int8-sym-tensor")));
  EXPECT_FALSE(decode_scale_is_causal(QuantSpec::parse("int4-asym-channel")));
  EXPECT_FALSE(decode_scale_is_causal(QuantSpec::parse("nvfp4")));
  EXPECT_FALSE(decode_scale_is_causal(QuantSpec::parse("fp8-e4m3-tensor")));
}

TEST(DecodeOrder, CacheTokensAfterTheLastQuery) {
  // L = 10, G = 4, R = 0, S = 2: quantized_end(9) = 2 + 4·floor(8 / 4) = 10 -> 8 quantized, 2 (sink) bf16.
  auto c = decode_cache_tokens(decode(0, 2, 0), 10, 4);
  EXPECT_EQ(c.quantized_tokens, 8);
  EXPECT_EQ(c.bf16_tokens, 2);
  // L = 11: the 11th token waits for its group -> 8 quantized, 3 bf16.
  c = decode_cache_tokens(decode(0, 2, 0), 11, 4);
  EXPECT_EQ(c.quantized_tokens, 8);
  EXPECT_EQ(c.bf16_tokens, 3);
  c = decode_cache_tokens(decode(128, 4, 0), 100, 1);  // the window is longer than the sequence
  EXPECT_EQ(c.quantized_tokens, 0);
  c = decode_cache_tokens(DecodeOrder{}, 7, 32);
  EXPECT_EQ(c.quantized_tokens, 7);
}

TEST(DecodeOrder, SinkRowsAreBf16AndGroupsStartAfterTheSink) {
  // Two sequences of 5 and 3 tokens, D = 3, int8-asym-channel-g2, S = 1: the quantized rows are
  // {1..4} and {6, 7} quantized as sequences of 4 and 2 tokens (groups [1,3), [3,5) and [6,8)).
  const uint32_t seed = 7;
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int64_t T = 8, D = 3;
  std::vector<float> X(T * D);
  for (float& v : X) v = n(rng);
  X[0] = 1000.0f;  // a huge sink value must not reach the quantized groups
  const std::vector<int64_t> offs{0, 5, 8};
  const QuantSpec spec = QuantSpec::parse("int8-asym-channel-g2");
  std::vector<float> q(T * D);
  decode_order_quantize(spec, Rotation{}, Target::CKV, X.data(), T, D, offs, decode(0, 1, 0), q.data());
  std::vector<float> compact, ref(6 * D);
  for (int64_t t : {1, 2, 3, 4, 6, 7}) compact.insert(compact.end(), X.begin() + t * D, X.begin() + (t + 1) * D);
  const std::vector<int64_t> coffs{0, 4, 6};
  const QuantizedTensor qt = quantize_dequantize(spec, Target::CKV, compact.data(), 6, D, coffs, ref.data());
  EXPECT_EQ(qt.group_bounds, (std::vector<int64_t>{0, 2, 4, 6})) << "seed " << seed;
  const int64_t rows[] = {1, 2, 3, 4, 6, 7};
  for (int i = 0; i < 6; ++i)
    for (int64_t d = 0; d < D; ++d) EXPECT_EQ(q[rows[i] * D + d], ref[i * D + d]) << "row " << rows[i] << " d " << d;
  for (int64_t t : {0, 5})
    for (int64_t d = 0; d < D; ++d) {
      float b;
      round_bf16(&X[t * D + d], 1, &b);
      EXPECT_EQ(q[t * D + d], b) << "sink row " << t;
    }
  // Group [1, 3) of dimension 0 holds only its two tokens: its error is below half a step of their range.
  const float step = std::abs(X[1 * D] - X[2 * D]) / 255.0f;
  EXPECT_LE(std::abs(q[1 * D] - X[1 * D]), 0.51f * step + 1e-3f);
}

TEST(DecodeOrder, HugeWindowsSinksAndPrefillsDoNotOverflow) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const DecodeOrder& o :
       {decode(kMax, 0, 0), decode(kMax, 4, 0), decode(0, kMax, 0), decode(kMax, kMax, kMax), decode(3, kMax - 1, 0)})
    for (int64_t t : {int64_t{0}, int64_t{5}, int64_t{1} << 40}) {
      EXPECT_EQ(o.quantized_end(t, 4), o.sink) << o.label() << " t " << t;
      EXPECT_FALSE(o.reads_quantized(t, t, 1)) << o.label();
    }
  EXPECT_EQ(decode_cache_tokens(decode(kMax, kMax, 0), 100, 1).quantized_tokens, 0);
  // decode_order_quantize with a sink beyond int64 range of seq_offsets[s] + sink: every row bf16.
  const int64_t T = 8, D = 2;
  std::vector<float> X(T * D), q(T * D), b(T * D);
  for (int64_t i = 0; i < T * D; ++i) X[i] = 0.37f * static_cast<float>(i) - 1.0f;
  const std::vector<int64_t> offs{0, 3, 8};
  const QuantizedTensor qt = decode_order_quantize(QuantSpec::parse("int4-asym-token"), Rotation{}, Target::CKV,
                                                   X.data(), T, D, offs, decode(0, kMax, 0), q.data());
  EXPECT_EQ(qt.rows, 0);
  round_bf16(X.data(), T * D, b.data());
  EXPECT_EQ(q, b);
}

// NaN/Inf with a sink: the message is the at-once quantize()'s for the whole [T, D] input (the rows past the
// sinks are quantized compacted, and would name their own shape), and a NaN in a sink row is reported too.
TEST(DecodeOrder, NonFiniteInputWithASinkGivesTheWholeInputsMessage) {
  const int64_t T = 10, D = 4;
  const std::vector<int64_t> offs{0, 6, 10};
  const QuantSpec spec = QuantSpec::parse("int4-asym-token");
  for (const int64_t bad :
       {int64_t{1}, int64_t{8 * D + 2}}) {  // a sink row of sequence 0; a row past sequence 1's sink
    std::vector<float> X(T * D, 0.5f), q(T * D);
    X[static_cast<size_t>(bad)] = std::numeric_limits<float>::quiet_NaN();
    std::string at_once, sunk;
    try {
      (void)quantize(spec, Target::CKV, X.data(), T, D, offs);
    } catch (const std::invalid_argument& e) {
      at_once = e.what();
    }
    try {
      (void)decode_order_quantize(spec, Rotation{}, Target::CKV, X.data(), T, D, offs, decode(2, 2, 0), q.data());
    } catch (const std::invalid_argument& e) {
      sunk = e.what();
    }
    EXPECT_NE(at_once.find("[10, 4]"), std::string::npos) << at_once;
    EXPECT_EQ(sunk, at_once) << "NaN at " << bad;
  }
}
