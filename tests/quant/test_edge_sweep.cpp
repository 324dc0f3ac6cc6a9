// The edge sweep: every spec of the default study and every block format against the edge inputs —
// group sizes 2^31 − 1 … 2^63 − 1, values at each storage dtype's max and beyond, subnormal-range
// values, empty sequences. Each either quantizes with every decoded value finite, or is refused with
// std::invalid_argument; never a crash, never a non-finite decode.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "latentq/blockfmt.h"
#include "latentq/quantize.h"

namespace {
using latentq::QuantizedTensor;
using latentq::QuantSpec;
using latentq::Target;

// Every example and engine preset of the format table (latentq/spec.h format_examples()).
std::vector<std::string> all_specs() { return latentq::format_examples(); }

TEST(EdgeSweep, HugeGroupSizesEqualWholeAxisGroups) {
  // A group size beyond a sequence is one group per sequence (channel) / per row (token): byte for
  // byte the -g0 result, with no overflow in the boundary arithmetic.
  std::vector<float> X(4 * 8);
  for (size_t i = 0; i < X.size(); ++i) X[i] = std::sin(0.7f * static_cast<float>(i)) * 3.0f;
  const std::vector<int64_t> seq = {0, 2, 4};
  for (const char* gran : {"channel", "token"})
    for (const char* g : {"2147483647", "2147483648", "4611686018427387904", "9223372036854775807"}) {
      const std::string spec = std::string("int4-asym-") + gran + "-g" + g;
      SCOPED_TRACE(spec + " on [4, 8], seq_offsets [0, 2, 4]");
      const QuantizedTensor a = latentq::quantize(QuantSpec::parse(spec), Target::CKV, X.data(), 4, 8, seq);
      const QuantizedTensor b = latentq::quantize(QuantSpec::parse(std::string("int4-asym-") + gran + "-g0"),
                                                  Target::CKV, X.data(), 4, 8, seq);
      EXPECT_EQ(a.codes, b.codes);
      EXPECT_EQ(a.scales, b.scales);
      EXPECT_EQ(a.offsets, b.offsets);
      EXPECT_EQ(a.group_bounds, b.group_bounds);
    }
  EXPECT_EQ(latentq::channel_groups(std::vector<int64_t>{0, 2, 4}, 4, std::numeric_limits<int64_t>::max()),
            (std::vector<int64_t>{0, 2, 4}));
}

TEST(EdgeSweep, EveryFormatRefusesOrDecodesFinite) {
  const float vals[] = {3.4e38f, -3.4e38f, 3.3895e38f, 65504.0f, 65520.0f, 1e5f,   448.0f, 464.0f,
                        512.0f,  6.0f,     7.0f,       1e-40f,   -1e-45f,  1e-30f, 0.0f,   -0.0f};
  const int64_t T = 6, D = 64;
  for (const std::string& spec : all_specs())
    for (const float v : vals)
      for (const bool empty_seq : {false, true}) {
        SCOPED_TRACE(spec + " with one element " + std::to_string(v) + (empty_seq ? ", an empty first sequence" : ""));
        std::vector<float> X(T * D);
        for (int64_t i = 0; i < T * D; ++i) X[i] = 0.01f * static_cast<float>((i * 37) % 101 - 50);
        X[2 * D + 5] = v;
        const std::vector<int64_t> seq = empty_seq ? std::vector<int64_t>{0, 0, 3, T} : std::vector<int64_t>{0, 3, T};
        for (const Target t : {Target::CKV, Target::KPE}) {
          QuantizedTensor q;
          try {
            q = latentq::quantize(QuantSpec::parse(spec), t, X.data(), T, D, seq);
          } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("overflows"), std::string::npos) << e.what();
            continue;
          }
          std::vector<float> out(T * D);
          latentq::dequantize(q, out.data());
          for (int64_t i = 0; i < T * D; ++i) ASSERT_TRUE(std::isfinite(out[i])) << "element " << i;
        }
      }
}

}  // namespace

namespace {

TEST(EdgeSweep, Bf16ValueBeyondItsRangeIsRefused) {
  // 3.4e38 is a finite float32 that rounds to +inf in bf16 (max 3.3895e38): refused, naming the element.
  std::vector<float> X(2 * 4, 1.0f);
  X[6] = 3.4e38f;
  try {
    (void)latentq::quantize(QuantSpec::parse("bf16"), Target::CKV, X.data(), 2, 4, std::vector<int64_t>{0, 2});
    ADD_FAILURE() << "stored inf";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    for (const char* n : {"value", "token 1, dimension 2", "bf16"})
      EXPECT_NE(m.find(n), std::string::npos) << n << " in " << m;
  }
}

TEST(EdgeSweep, DiagnosticsCountSilentPrecisionLoss) {
  // c_kv scaled by 1e-6: int8-sym-channel scales (absmax/127 ~ 8e-9) underflow fp16 to 0 or subnormals.
  const int64_t T = 8, D = 4;
  std::vector<float> X(T * D);
  for (int64_t i = 0; i < T * D; ++i) X[i] = 1e-6f * std::cos(0.3f * static_cast<float>(i));
  const std::vector<int64_t> seq = {0, T};
  const QuantizedTensor a = latentq::quantize(QuantSpec::parse("int8-sym-channel"), Target::CKV, X.data(), T, D, seq);
  EXPECT_EQ(latentq::diagnose(a, X.data()).scale_underflow, D);  // every channel group
  const QuantizedTensor a32 =
      latentq::quantize(QuantSpec::parse("int8-sym-channel-fp32"), Target::CKV, X.data(), T, D, seq);
  EXPECT_FALSE(latentq::diagnose(a32, X.data()).any());
  // a row [1000.3, 1000.31]: fp16 offset 1000.5 lies above both elements, 0.2 off on a range of 0.01
  const std::vector<float> R = {1000.3f, 1000.31f};
  const QuantizedTensor b =
      latentq::quantize(QuantSpec::parse("int4-asym-token"), Target::CKV, R.data(), 1, 2, std::vector<int64_t>{0, 1});
  const latentq::QuantDiagnostics db = latentq::diagnose(b, R.data());
  EXPECT_EQ(db.offset_rounding, 1);
  EXPECT_EQ(db.scale_underflow, 0);
  // fp8 with the uncalibrated scale 1.0 saturates values beyond 464; MX's floor rule clips a block max in [464,
  // 512)·2^e
  const std::vector<float> S = {500.0f, 1.0f, -1000.0f, 2.0f};
  const QuantizedTensor c = latentq::quantize(QuantSpec::parse("fp8-e4m3-tensor-s1"), Target::CKV, S.data(), 1, 4,
                                              std::vector<int64_t>{0, 1});
  EXPECT_EQ(latentq::diagnose(c, S.data()).saturated, 2);
  const std::vector<float> M = {480.0f, 1.0f};  // floor(log2 480) = 8 -> e = 0, 480 > 464 saturates to 448
  const QuantizedTensor m =
      latentq::quantize(QuantSpec::parse("mxfp8"), Target::CKV, M.data(), 1, 2, std::vector<int64_t>{0, 1});
  EXPECT_EQ(latentq::diagnose(m, M.data()).saturated, 1);
}

TEST(EdgeSweep, SaturationCountsOnlyTheValuesTheClampChanges) {
  // Scale 1: the stored value is the e4m3 cast of x itself. 464 and -464 are ties between 448 and 480 that RNE
  // sends to 448 (even mantissa) whether or not the cast saturates: they are not counted; 464.0001 rounds to 480
  // unclamped, 448 clamped: counted. For e2m1, 7, the tie between 6 and 8, goes to 8 (even mantissa) unclamped
  // and to 6 clamped: counted.
  const std::vector<float> S = {464.0f, -464.0f, 464.0001f, 463.9f, 448.0f, 500.0f, -1000.0f, 1.0f};
  const QuantizedTensor c = latentq::quantize(QuantSpec::parse("fp8-e4m3-tensor-s1"), Target::CKV, S.data(), 1, 8,
                                              std::vector<int64_t>{0, 1});
  EXPECT_EQ(latentq::diagnose(c, S.data()).saturated, 3);  // 464.0001, 500, -1000
  std::vector<float> back(S.size());
  latentq::dequantize(c, back.data());
  EXPECT_EQ(back[0], 448.0f);  // the tie goes to 448: nothing was clamped
  EXPECT_EQ(back[1], -448.0f);
  EXPECT_EQ(back[2], 448.0f);  // clamped from 480
  // the two predicates at their ties and neighbours
  namespace d = latentq::qmath::detail;
  EXPECT_FALSE(d::e4m3_saturates(464.0f));
  EXPECT_TRUE(d::e4m3_saturates(std::nextafter(464.0f, 1e9f)));
  EXPECT_FALSE(d::e4m3_saturates(std::nextafter(464.0f, 0.0f)));
  EXPECT_TRUE(d::e2m1_saturates(7.0f));
  EXPECT_TRUE(d::e2m1_saturates(-7.0f));
  EXPECT_FALSE(d::e2m1_saturates(std::nextafter(7.0f, 0.0f)));
}

}  // namespace
