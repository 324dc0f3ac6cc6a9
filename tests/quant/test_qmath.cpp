// Element math of quant/include/latentq/qmath.h: fp16 / bf16 / e4m3 conversions against
// independent double-precision references and hand values, and rne_clamp ties.
#include <cmath>
#include <random>

#include "latentq/blockfmt.h"
#include "latentq/spec.h"
#include "test_helpers.h"

namespace {
using namespace lqtest;
namespace qm = latentq::qmath;

// ---- fp16 ---------------------------------------------------------------------------------------

TEST(QmathF16, DecodeAllPatternsMatchesIndependentFormula) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = qm::f16_bits_to_f32(static_cast<uint16_t>(h));
    const double want = f16_value(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), want) << "fp16 bits 0x" << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << h;  // -0 keeps its sign
    }
  }
}

TEST(QmathF16, AllPatternsRoundTripExceptNaNPayload) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = qm::f32_to_f16_bits(qm::f16_bits_to_f32(static_cast<uint16_t>(h)));
    const bool nan = ((h >> 10) & 31) == 31 && (h & 1023) != 0;
    // NaN payloads are canonicalized to the quiet NaN 0x7e00, keeping the sign.
    const uint16_t want = nan ? static_cast<uint16_t>(0x7e00u | (h & 0x8000u)) : static_cast<uint16_t>(h);
    ASSERT_EQ(back, want) << "fp16 bits 0x" << std::hex << h;
  }
}

TEST(QmathF16, HandValues) {
  // Largest finite 65504 = 0x7bff; 65519 is below the midpoint 65520 to the (virtual) 65536;
  // 65520 is that midpoint: 65504 has an odd mantissa (0x3ff), so RNE goes to 65536 = inf.
  EXPECT_EQ(qm::f32_to_f16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(qm::f32_to_f16_bits(65519.0f), 0x7bff);
  EXPECT_EQ(qm::f32_to_f16_bits(65520.0f), 0x7c00);
  EXPECT_EQ(qm::f32_to_f16_bits(-65520.0f), 0xfc00);
  EXPECT_EQ(qm::f32_to_f16_bits(1e6f), 0x7c00);
  EXPECT_EQ(qm::f32_to_f16_bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(qm::f32_to_f16_bits(std::numeric_limits<float>::quiet_NaN()), 0x7e00);
  EXPECT_EQ(qm::f32_to_f16_bits(1.0f), 0x3c00);
  EXPECT_EQ(qm::f32_to_f16_bits(-0.0f), 0x8000);
  // 0.1 = 0x3dcccccd (float) -> nearest fp16 1638·2^-14 = 0.0999755859375 = 0x2e66.
  EXPECT_EQ(qm::f32_to_f16_bits(0.1f), 0x2e66);
  // Ties at 1: spacing 2^-10. 1 + 2^-11 is halfway between 1 (even) and 1 + 2^-10 -> 1.
  EXPECT_EQ(qm::f32_to_f16_bits(1.0f + 0x1p-11f), 0x3c00);
  // 1 + 3·2^-11 is halfway between 1 + 2^-10 (odd, 0x3c01) and 1 + 2^-9 (even, 0x3c02) -> 0x3c02.
  EXPECT_EQ(qm::f32_to_f16_bits(1.0f + 0x3p-11f), 0x3c02);
  // Just above the tie goes up.
  EXPECT_EQ(qm::f32_to_f16_bits(1.0f + 0x1p-11f + 0x1p-23f), 0x3c01);
  // Subnormals: 2^-24 is the smallest (0x0001); 2^-25 is the tie between 0 and 2^-24 -> 0;
  // 1.5·2^-24 ties between 1 and 2 (·2^-24) -> 2; largest subnormal 1023·2^-24 = 0x03ff;
  // 1023.5·2^-24 ties to 1024·2^-24 = 2^-14, the smallest normal 0x0400.
  EXPECT_EQ(qm::f32_to_f16_bits(0x1p-24f), 0x0001);
  EXPECT_EQ(qm::f32_to_f16_bits(0x1p-25f), 0x0000);
  EXPECT_EQ(qm::f32_to_f16_bits(0x1p-25f + 0x1p-40f), 0x0001);
  EXPECT_EQ(qm::f32_to_f16_bits(0x3p-25f), 0x0002);
  EXPECT_EQ(qm::f32_to_f16_bits(-0x3p-25f), 0x8002);
  EXPECT_EQ(qm::f32_to_f16_bits(1023.0f * 0x1p-24f), 0x03ff);
  EXPECT_EQ(qm::f32_to_f16_bits(1023.5f * 0x1p-24f), 0x0400);
  EXPECT_EQ(qm::f32_to_f16_bits(0x1p-14f), 0x0400);
  EXPECT_EQ(qm::f32_to_f16_bits(1e-10f), 0x0000);
  EXPECT_EQ(qm::f32_to_f16_bits(-1e-10f), 0x8000);
  EXPECT_EQ(qm::f16_bits_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(qm::f16_bits_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(qm::f16_bits_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
}

// Every fp16 interval of the finite range, the subnormal range and the overflow threshold:
// for each of the 2^19 top bit patterns of a float32 below 2^16 in magnitude, the low 13 bits take the
// values around fp16's rounding point (0x1000 = exactly half an fp16 ulp for normal fp16 results),
// plus random floats of all magnitudes. Checked against the double-precision RNE reference.
TEST(QmathF16, EncodeMatchesReferenceOnTiesAndRandom) {
  auto check = [](float f) {
    const double want = ref_f16(f);
    const uint16_t h = qm::f32_to_f16_bits(f);
    const double got = f16_value(h);
    if (got != want || std::signbit(got) != std::signbit(f))
      return ::testing::AssertionFailure()
             << "f = " << f << " (0x" << std::hex << bits_of(f) << ") -> 0x" << h << ", want value " << want;
    return ::testing::AssertionSuccess();
  };
  const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff};
  for (uint32_t hi = 0; hi < (1u << 19); ++hi) {
    const uint32_t top = hi << 13;
    if ((top & 0x7fffffffu) >= 0x47800000u) continue;  // |f| >= 65536 checked below
    for (uint32_t lo : lows) ASSERT_TRUE(check(float_of(top | lo)));
  }
  // Subnormal fp16 results: exact midpoints (k + 0.5)·2^-24 and their float neighbours.
  for (int k = 0; k < 1100; ++k) {
    const float mid = (static_cast<float>(k) + 0.5f) * 0x1p-24f;
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1.0f), -mid})
      ASSERT_TRUE(check(f)) << "k = " << k;
  }
  for (float f : {65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e30f, -1e30f}) ASSERT_TRUE(check(f));
  std::mt19937 rng(12345);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    const float f = float_of(any(rng));
    if (!std::isfinite(f)) continue;
    ASSERT_TRUE(check(f));
  }
}

// ---- bf16 ---------------------------------------------------------------------------------------

TEST(QmathBf16, HandValuesAndTies) {
  // bf16 keeps 7 mantissa bits: spacing at 1 is 2^-7. 1 + 2^-8 ties between 1 (even) and 1 + 2^-7.
  EXPECT_EQ(qm::f32_to_bf16_bits(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(qm::f32_to_bf16_bits(-(1.0f + 0x1p-8f)), 0xbf80);
  // 1 + 3·2^-8 ties between 1 + 2^-7 (odd 0x3f81) and 1 + 2^-6 (even 0x3f82).
  EXPECT_EQ(qm::f32_to_bf16_bits(1.0f + 0x3p-8f), 0x3f82);
  EXPECT_EQ(qm::f32_to_bf16_bits(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(qm::f32_to_bf16_bits(1.0f), 0x3f80);
  // FLT_MAX = 0x7f7fffff rounds up to 2^128 = inf.
  EXPECT_EQ(qm::f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);
  // A signalling NaN whose payload lies only in the low 16 bits must stay NaN (not become inf).
  const uint16_t n = qm::f32_to_bf16_bits(float_of(0x7f800001u));
  EXPECT_TRUE(std::isnan(qm::bf16_bits_to_f32(n))) << std::hex << n;
  EXPECT_EQ(qm::bf16_bits_to_f32(0x3f81), 1.0f + 0x1p-7f);
  EXPECT_EQ(bits_of(qm::bf16_bits_to_f32(0x8000)), 0x80000000u);
}

TEST(QmathBf16, EncodeMatchesReference) {
  std::mt19937 rng(777);
  std::uniform_int_distribution<uint32_t> any;
  const uint32_t lows[] = {0x0000, 0x7fff, 0x8000, 0x8001, 0xffff};
  for (int i = 0; i < 200000; ++i) {
    const uint32_t r = any(rng);
    for (uint32_t f32 : {r, (r & 0xffff0000u) | lows[i % 5]}) {
      const float f = float_of(f32);
      if (!std::isfinite(f)) continue;
      const float got = qm::bf16_bits_to_f32(qm::f32_to_bf16_bits(f));
      ASSERT_EQ(static_cast<double>(got), ref_bf16(f)) << "f = " << f << " bits 0x" << std::hex << f32;
    }
  }
}

// ---- fp8 e4m3 -----------------------------------------------------------------------------------

TEST(QmathE4m3, HandValues) {
  EXPECT_EQ(qm::f32_to_e4m3_bits(448.0f), 0x7e);  // max finite: e = 15, m = 6
  EXPECT_EQ(qm::f32_to_e4m3_bits(464.0f), 0x7e);  // tie 448/480 (480 would be the NaN code) -> 448
  EXPECT_EQ(qm::f32_to_e4m3_bits(465.0f), 0x7e);  // saturates (no inf in e4m3fn)
  EXPECT_EQ(qm::f32_to_e4m3_bits(1e9f), 0x7e);
  EXPECT_EQ(qm::f32_to_e4m3_bits(-1e9f), 0xfe);
  EXPECT_EQ(qm::f32_to_e4m3_bits(1.0f), 0x38);  // e = 7 (bias), m = 0
  EXPECT_EQ(qm::f32_to_e4m3_bits(-1.0f), 0xb8);
  EXPECT_EQ(qm::f32_to_e4m3_bits(0.5f), 0x30);
  EXPECT_EQ(qm::f32_to_e4m3_bits(3.25f), 0x45);     // 1.625·2^1: e = 8, m = 5
  EXPECT_EQ(qm::f32_to_e4m3_bits(0x1p-6f), 0x08);   // smallest normal
  EXPECT_EQ(qm::f32_to_e4m3_bits(0x1p-9f), 0x01);   // smallest subnormal 2^-9
  EXPECT_EQ(qm::f32_to_e4m3_bits(0x1p-10f), 0x00);  // 0.5·2^-9: tie between 0 (even) and 2^-9 -> 0
  EXPECT_EQ(qm::f32_to_e4m3_bits(0x3p-10f), 0x02);  // 1.5·2^-9 ties to 2·2^-9
  EXPECT_EQ(qm::f32_to_e4m3_bits(0x5p-10f), 0x02);  // 2.5·2^-9 ties to 2·2^-9
  EXPECT_EQ(qm::f32_to_e4m3_bits(-0x1p-9f), 0x81);
  EXPECT_EQ(qm::f32_to_e4m3_bits(15.5f * 0x1p-10f), 0x08);  // 7.75·2^-9 rounds up into the normals
  EXPECT_EQ(qm::f32_to_e4m3_bits(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(qm::f32_to_e4m3_bits(-std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(qm::e4m3_bits_to_f32(0x7e), 448.0f);
  EXPECT_EQ(qm::e4m3_bits_to_f32(0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(qm::e4m3_bits_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(qm::e4m3_bits_to_f32(0xff)));
}

TEST(QmathE4m3, AllCodesDecodeAndRoundTrip) {
  for (uint32_t c = 0; c < 256; ++c) {
    const float f = qm::e4m3_bits_to_f32(static_cast<uint8_t>(c));
    const double want = e4m3_value(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f));
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), want) << std::hex << c;
    ASSERT_EQ(std::signbit(f), (c & 0x80u) != 0) << std::hex << c;
    ASSERT_EQ(qm::f32_to_e4m3_bits(f), c) << std::hex << c;
  }
}

TEST(QmathE4m3, EncodeMatchesReferenceOnMidpointsAndRandom) {
  auto check = [](float f) {
    const uint8_t c = qm::f32_to_e4m3_bits(f);
    const double got = e4m3_value(c), want = ref_e4m3(f);
    if (got != want || std::signbit(got) != std::signbit(f))
      return ::testing::AssertionFailure() << "f = " << f << " -> 0x" << std::hex << int(c) << ", want " << want;
    return ::testing::AssertionSuccess();
  };
  // Midpoints of consecutive non-negative codes (exact ties) and their float neighbours.
  for (uint32_t c = 0; c < 0x7e; ++c) {
    const float mid =
        static_cast<float>((e4m3_value(static_cast<uint8_t>(c)) + e4m3_value(static_cast<uint8_t>(c + 1))) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f), -mid}) ASSERT_TRUE(check(f));
  }
  std::mt19937 rng(4242);
  std::uniform_real_distribution<float> lg(-14.0f, 10.0f);
  for (int i = 0; i < 200000; ++i) {
    const float f = std::exp2(lg(rng)) * ((i & 1) ? -1.0f : 1.0f);
    ASSERT_TRUE(check(f));
  }
}

// ---- integer rounding ---------------------------------------------------------------------------

TEST(QmathRneClamp, TiesGoToEven) {
  EXPECT_EQ(qm::rne_clamp(2.5f, -127, 127), 2.0f);
  EXPECT_EQ(qm::rne_clamp(3.5f, -127, 127), 4.0f);
  EXPECT_EQ(qm::rne_clamp(-2.5f, -127, 127), -2.0f);
  EXPECT_EQ(qm::rne_clamp(-3.5f, -127, 127), -4.0f);
  EXPECT_EQ(qm::rne_clamp(0.5f, -127, 127), 0.0f);
  EXPECT_EQ(qm::rne_clamp(1.5f, -127, 127), 2.0f);
  EXPECT_EQ(qm::rne_clamp(-0.5f, -127, 127), 0.0f);
  EXPECT_EQ(qm::rne_clamp(2.5000002f, -127, 127), 3.0f);
  EXPECT_EQ(qm::rne_clamp(2.4999998f, -127, 127), 2.0f);
  EXPECT_EQ(qm::rne_clamp(254.5f, 0, 255), 254.0f);
  EXPECT_EQ(qm::rne_clamp(4194303.5f, 0, 4194304.0f), 4194304.0f);  // 2^22 - 0.5 -> 2^22 (even)
  EXPECT_EQ(qm::rne_clamp(4194302.5f, 0, 4194304.0f), 4194302.0f);
}

TEST(QmathRneClamp, ClampsOutOfRangeInfAndNaN) {
  EXPECT_EQ(qm::rne_clamp(300.0f, 0, 255), 255.0f);
  EXPECT_EQ(qm::rne_clamp(255.4f, 0, 255), 255.0f);
  EXPECT_EQ(qm::rne_clamp(-0.4f, 0, 255), 0.0f);
  EXPECT_EQ(qm::rne_clamp(-1e30f, -7, 7), -7.0f);
  EXPECT_EQ(qm::rne_clamp(1e30f, -7, 7), 7.0f);
  EXPECT_EQ(qm::rne_clamp(std::numeric_limits<float>::infinity(), -1, 1), 1.0f);
  EXPECT_EQ(qm::rne_clamp(-std::numeric_limits<float>::infinity(), -1, 1), -1.0f);
  // Documented: "a NaN v maps to lo".
  EXPECT_EQ(qm::rne_clamp(std::numeric_limits<float>::quiet_NaN(), -7, 7), -7.0f);
  EXPECT_EQ(qm::rne_clamp(std::numeric_limits<float>::quiet_NaN(), 0, 15), 0.0f);
}

TEST(QmathCodes, ParamsEncodeDecode) {
  EXPECT_EQ(qm::sym_qmax(8), 127);
  EXPECT_EQ(qm::sym_qmax(4), 7);
  EXPECT_EQ(qm::sym_qmax(2), 1);
  EXPECT_EQ(qm::asym_qmax(8), 255);
  EXPECT_EQ(qm::asym_qmax(4), 15);
  EXPECT_EQ(qm::asym_qmax(2), 3);
  // Scale 0 encodes q = 0 without dividing: sym u = 2^(b-1), asym u = 0.
  EXPECT_EQ(qm::encode_sym(5.0f, 0.0f, 4), 8u);
  EXPECT_EQ(qm::encode_asym(5.0f, 0.0f, 5.0f, 2), 0u);
  EXPECT_EQ(qm::decode_sym(8u, 0.0f, 4), 0.0f);
  EXPECT_EQ(qm::decode_asym(0u, 0.0f, 5.0f), 5.0f);
  // Offset binary: q = -7 -> u = 1, q = 7 -> u = 15; q = -1 -> u = 1 for INT2.
  EXPECT_EQ(qm::encode_sym(-7.0f, 1.0f, 4), 1u);
  EXPECT_EQ(qm::encode_sym(7.0f, 1.0f, 4), 15u);
  EXPECT_EQ(qm::encode_sym(-100.0f, 1.0f, 2), 1u);
  EXPECT_EQ(qm::decode_sym(1u, 0.5f, 4), -3.5f);
  // asym_params: (max - min)/(2^b - 1) and min, rounded to fp16: (0.1·255 - 0)/255 -> 0x2e66.
  const qm::ScaleOffset p = qm::asym_params(-1.0f, 0.1f * 255.0f - 1.0f, 8, ScaleDtype::F16);
  EXPECT_EQ(p.scale, 0.0999755859375f);
  EXPECT_EQ(p.offset, -1.0f);
  // power-of-two helpers of the FlashMLA / MX scale rules
  EXPECT_EQ(qm::ceil_log2_normal(1.0f), 0);
  EXPECT_EQ(qm::ceil_log2_normal(std::nextafter(1.0f, 2.0f)), 1);
  EXPECT_EQ(qm::ceil_log2_normal(1e-4f), -13);  // 2^-14 = 6.1e-5 < 1e-4 < 2^-13
  EXPECT_EQ(qm::floor_log2_bits(448.0f), 8);
  EXPECT_EQ(qm::floor_log2_bits(0.0f), -127);
  EXPECT_EQ(qm::floor_log2_bits(1e-40f), -127);  // subnormal: the exponent field, as torchao
  EXPECT_EQ(qm::exp2_int(-127), std::ldexp(1.0f, -127));
  EXPECT_EQ(qm::exp2_int(127), std::ldexp(1.0f, 127));
  EXPECT_EQ(qm::e8m0_bits_to_f32(127), 1.0f);
  EXPECT_TRUE(std::isnan(qm::e8m0_bits_to_f32(255)));
  // C roundf: half away from zero, exact near halves
  EXPECT_EQ(qm::round_half_away(2.5f), 3.0f);
  EXPECT_EQ(qm::round_half_away(-2.5f), -3.0f);
  EXPECT_EQ(qm::round_half_away(0.49999997f), 0.0f);  // 0.49999997 + 0.5 rounds to 1 in float: not used
  EXPECT_EQ(qm::round_half_away(-0.5f), -1.0f);
  EXPECT_EQ(qm::packed_row_bytes(33, 4), 17);
  EXPECT_EQ(qm::packed_row_bytes(33, 2), 9);
  EXPECT_EQ(qm::packed_row_bytes(33, 8), 33);
}

}  // namespace

// count_saturated (what diagnose() reports for a block format) equals the count quantize_block keeps
// while encoding, for every block format, on blocks scaled so that some elements saturate (outliers
// ×1e3 next to small values; a tensor-scaled format's global scale from a smaller amax) and on exact
// zeros. Fixed seed; the format, seed and block index are printed on failure.
TEST(QmathBlocks, CountSaturatedEqualsTheEncodersCount) {
  namespace q = latentq::qmath;
  const char* specs[] = {"fp8-e4m3-tile128-pow2",
                         "fp8-e4m3-tile32-pow2-ue8m0",
                         "fp8-e4m3-tile128-fp32",
                         "fp8-e4m3-tensor",
                         "fp8-e4m3-tensor-s1",
                         "mxfp8",
                         "mxfp4",
                         "nvfp4",
                         "fp4-e2m1-tile16-e4m3",
                         "q8_0",
                         "q4_0",
                         "q4_1"};
  const uint64_t seed = 20261201;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  int total_saturated = 0;
  for (const char* name : specs) {
    const latentq::QuantSpec spec = latentq::QuantSpec::parse(name);
    const latentq::Layout L = latentq::layout(spec, 128);
    ASSERT_TRUE(L.block_format) << name;
    const int n = static_cast<int>(L.desc.block);
    std::vector<float> x(static_cast<size_t>(n));
    std::vector<uint8_t> codes(static_cast<size_t>(q::block_code_bytes(n, L.code_bits)));
    uint8_t sc[4], of[4];
    for (int b = 0; b < 200; ++b) {
      for (int i = 0; i < n; ++i) x[i] = b % 50 == 49 ? 0.0f : nd(rng) * (i % 7 == 3 ? 1e3f : 1.0f);
      // tensor-scaled formats: a global scale from a tenth of the block's amax saturates the outliers
      const float global = b % 2 ? 0.0f : 0.25f;
      q::BlockStatus st;
      const q::BlockParams p = q::block_params(L.desc, x.data(), n, global, sc, of, st);
      const int counted = q::count_saturated(L.desc, p, x.data(), n);
      const int encoded = q::quantize_block(L.desc, x.data(), n, global, codes.data(), sc, of).saturated;
      ASSERT_EQ(counted, encoded) << name << ", seed " << seed << ", block " << b << " of " << n;
      total_saturated += encoded;
    }
  }
  EXPECT_GT(total_saturated, 0);  // the case that matters was exercised
}
