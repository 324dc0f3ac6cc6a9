// Lloyd-Max codebooks fitted on the fit split (latentq/lloyd_max.h, spec lm<b>-tensor / lm<b>-channel[-g<N>]):
// hand-computed fits and codes, the fit split honoured, the textbook Gaussian quantizer recovered, the
// accounting of the stored codebooks, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "latentq/lloyd_max.h"
#include "latentq/metrics.h"
#include "latentq/quantize.h"
#include "latentq/spec.h"

namespace {

using namespace latentq;
namespace q = latentq::qmath;

float stored_centroid(const QuantizedTensor& qt, int64_t i) {
  return q::load_dtype(qt.global.data() + 2 * i, ScaleDtype::F16);
}

TEST(LloydMax, FourDistinctValuesAreFittedExactly) {
  // D = 1, two sequences of [−3, −1, 1, 3]: the fit split is the first sequence; the quantile start already
  // sits on the four values, so the 2-bit codebook is {−3, −1, 1, 3} and the codes are 0, 1, 2, 3 (one
  // 2-bit code per one-byte row). Decode is exact.
  const std::vector<float> x{-3, -1, 1, 3, -3, -1, 1, 3};
  const std::vector<int64_t> seq{0, 4, 8};
  const QuantizedTensor qt = quantize(QuantSpec::parse("lm2-tensor"), Target::CKV, x.data(), 8, 1, seq);
  ASSERT_EQ(qt.global.size(), 8u);
  const float want[] = {-3, -1, 1, 3};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(stored_centroid(qt, i), want[i]) << i;
  ASSERT_EQ(qt.codes, (std::vector<uint8_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  std::vector<float> out(8);
  dequantize(qt, out.data());
  EXPECT_EQ(out, x);
  EXPECT_EQ(qt.storage_bytes(), 8 + 8);  // 8 one-byte rows + 4 fp16 centroids
}

TEST(LloydMax, OnlyTheFitSplitIsFitted) {
  // The fit sequence is all zeros, the held-out one all 10s: every centroid is 0, so the held-out tokens decode
  // to 0 — the codebook never saw them.
  const std::vector<float> x{0, 0, 0, 0, 10, 10, 10, 10};
  const std::vector<int64_t> seq{0, 4, 8};
  const QuantizedTensor qt = quantize(QuantSpec::parse("lm3-tensor"), Target::CKV, x.data(), 8, 1, seq);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(stored_centroid(qt, i), 0.0f) << i;
  std::vector<float> out(8);
  dequantize(qt, out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
  // one sequence: the fit is its first half; one token: no split, the fit is that token
  const QuantizedTensor one = quantize(QuantSpec::parse("lm3-tensor"), Target::CKV, x.data() + 4, 1, 1, {{0, 1}});
  dequantize(one, out.data());
  EXPECT_EQ(out[0], 10.0f);
}

TEST(LloydMax, RecoversTheTextbookGaussianQuantizer) {
  // Max (1960): the 3-bit Lloyd-Max quantizer of N(0, 1) has levels ±0.2451, ±0.7560, ±1.344, ±2.152 and
  // distortion 0.03454. 40,000 fit values: sampling error of a level ~0.01-0.03.
  const int64_t T = 80000;
  const uint64_t seed = 11;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(T);
  for (float& v : x) v = n(rng);
  const std::vector<int64_t> seq{0, T / 2, T};
  const QuantizedTensor qt = quantize(QuantSpec::parse("lm3-tensor"), Target::CKV, x.data(), T, 1, seq);
  const double want[] = {-2.152, -1.344, -0.7560, -0.2451, 0.2451, 0.7560, 1.344, 2.152};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(stored_centroid(qt, i), want[i], 0.04) << "level " << i << ", seed " << seed;
  std::vector<float> out(T);
  dequantize(qt, out.data());
  const double mse = error_metrics(x.data(), out.data(), T, 1).mse;
  EXPECT_NEAR(mse, 0.03454, 0.003) << "seed " << seed;
}

TEST(LloydMax, PerChannelCodebooksFollowTheChannels) {
  // Two channels of scales 1 and 100: one codebook for both wastes its levels on channel 1's range; a codebook
  // per channel fits each. At 3 bits, per channel gives each channel ~0.0345·σ² (rel_fro ≈ 0.186).
  const int64_t T = 4000, D = 2;
  const uint64_t seed = 12;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(T * D);
  for (int64_t t = 0; t < T; ++t) {
    x[t * D] = n(rng);
    x[t * D + 1] = 100.0f * n(rng);
  }
  const std::vector<int64_t> seq{0, T / 2, T};
  auto err = [&](const char* spec, int64_t d) {
    std::vector<float> out(T * D);
    (void)quantize_dequantize(QuantSpec::parse(spec), Target::CKV, x.data(), T, D, seq, out.data());
    double e = 0, s = 0;
    for (int64_t t = 0; t < T; ++t) {
      e += std::pow(out[t * D + d] - x[t * D + d], 2);
      s += std::pow(x[t * D + d], 2);
    }
    return std::sqrt(e / s);
  };
  EXPECT_NEAR(err("lm3-channel", 0), 0.186, 0.03) << "seed " << seed;
  EXPECT_NEAR(err("lm3-channel", 1), 0.186, 0.03) << "seed " << seed;
  EXPECT_GT(err("lm3-tensor", 0), 0.5) << "one codebook leaves the small channel with ~2 levels";
}

TEST(LloydMax, LayoutAndAccountingCountTheCodebooks) {
  // lm3-channel-g5 at D = 12: codebooks of channels [0,5), [5,10), [10,12): 3 × 8 fp16 = 48 bytes per matrix;
  // codes ceil(12·3/8) = 5 bytes per token.
  const Layout L = layout(QuantSpec::parse("lm3-channel-g5"), 12);
  EXPECT_EQ(L.codebooks, 3);
  EXPECT_EQ(L.codebook_width, 5);
  EXPECT_EQ(L.tensor_bytes, 48);
  EXPECT_EQ(L.bytes_per_token(), 5);
  EXPECT_EQ(layout(QuantSpec::parse("lm4-channel"), 512).tensor_bytes, 512 * 16 * 2);
  EXPECT_EQ(layout(QuantSpec::parse("lm2-tensor"), 512).tensor_bytes, 4 * 2);
  std::mt19937_64 rng(13);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(30 * 12);
  for (float& v : x) v = n(rng);
  const std::vector<int64_t> seq{0, 10, 30};
  const QuantizedTensor qt = quantize(QuantSpec::parse("lm3-channel-g5"), Target::CKV, x.data(), 30, 12, seq);
  EXPECT_EQ(qt.storage_bytes(), 30 * 5 + 48);
  EXPECT_EQ(storage_bytes(QuantSpec::parse("lm3-channel-g5"), Target::CKV, 12, seq), 30 * 5 + 48);
  EXPECT_DOUBLE_EQ(account(qt).bytes_per_token, (30.0 * 5 + 48) / 30);
}

TEST(LloydMax, SpecsAndErrors) {
  for (const char* s : {"lm2-tensor", "lm3-channel", "lm4-channel-g8"}) EXPECT_EQ(QuantSpec::parse(s).to_string(), s);
  EXPECT_EQ(QuantSpec::parse("lm3-channel-g1").to_string(), "lm3-channel");
  for (const char* s :
       {"lm1-tensor", "lm5-channel", "lm3", "lm3-token", "lm3-tensor-g4", "lm3-channel-g0", "lm3-channel-x"})
    EXPECT_THROW((void)QuantSpec::parse(s), std::invalid_argument) << s;
  const std::vector<float> big{1e6f, -1e6f, 1e6f, -1e6f};
  try {
    (void)quantize(QuantSpec::parse("lm2-tensor"), Target::CKV, big.data(), 4, 1, {{0, 2, 4}});
    FAIL() << "a centroid of 1e6 overflows fp16";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("channels [0, 1)"), std::string::npos) << e.what();
  }
}

}  // namespace
