// Storage-dtype effects, hand-computed: fp16 rounding of scales and offsets (and the -fp32 variant
// keeping full precision), the FP8 e4m3 tile format (FlashMLA), and the bf16 baseline.
#include <random>

#include "test_helpers.h"

namespace {
using namespace lqtest;

// ---- fp16 rounding of scale and offset ----------------------------------------------------------

TEST(FormatsFp16Rounding, ScaleIsRoundedBeforeEncoding) {
  // min 0, max 25.5 -> scale 25.5/255 = 0.1 -> float32 0x3dcccccd -> fp16 0x2e66 = 0.0999755859375.
  // 12.65f = 12.64999961853: with the fp16 scale 12.65/0.0999755859375 = 126.53 -> q 127, whereas the
  // unrounded scale would give 126.49999 -> 126. 25.5/0.0999755859375 = 255.06 -> clamped to 255.
  const std::vector<float> X = {0.0f, 25.5f, 12.65f};
  const QuantizedTensor q = quant("int8-asym-tensor", X, 1, 3);
  ASSERT_EQ(q.scales, (std::vector<uint8_t>{0x66, 0x2e}));
  ASSERT_EQ(q.offsets, (std::vector<uint8_t>{0x00, 0x00}));
  EXPECT_EQ(q.scale_at(0), 0.0999755859375f);
  EXPECT_EQ(unpack_codes(q), (std::vector<uint32_t>{0, 255, 127}));
  // x̂ = 0.0999755859375·q, exact in float32: 255·1638/16384 = 25.4937744140625, 127·… = 12.6968994140625.
  EXPECT_EQ(decode(q), (std::vector<float>{0.0f, 25.4937744140625f, 12.6968994140625f}));

  // -fp32: the float32 scale 0.1f is stored as is (little-endian 0x3dcccccd) and 12.65 gets code 126.
  const QuantizedTensor q32 = quant("int8-asym-tensor-fp32", X, 1, 3);
  ASSERT_EQ(q32.scales, (std::vector<uint8_t>{0xcd, 0xcc, 0xcc, 0x3d}));
  ASSERT_EQ(q32.offsets, (std::vector<uint8_t>{0, 0, 0, 0}));
  EXPECT_EQ(unpack_codes(q32), (std::vector<uint32_t>{0, 255, 126}));
  EXPECT_EQ(decode(q32), (std::vector<float>{0.0f, 255.0f * 0.1f, 126.0f * 0.1f}));
}

TEST(FormatsFp16Rounding, SymScaleRoundedDownClampsTheAbsmax) {
  // absmax 1.4 -> 1.4/7 = 0.2 (float32 0.200000003) -> fp16 0x3266 = 0.199951171875 < 0.2.
  // -1.4/0.199951171875 = -7.0017 -> clamped to -7 (x̂ -1.399658203125); 0.7/0.19995 = 3.50085 -> 4
  // (x̂ 0.7998046875); 0.35/0.19995 = 1.75 -> 2 (x̂ 0.39990234375).
  const QuantizedTensor q = quant("int4-sym-tensor", {0.7f, -1.4f, 0.35f}, 1, 3);
  EXPECT_EQ(le16(q.scales), (std::vector<uint16_t>{0x3266}));
  EXPECT_EQ(unpack_codes(q), (std::vector<uint32_t>{12, 1, 10}));
  EXPECT_EQ(decode(q), (std::vector<float>{0.7998046875f, -1.399658203125f, 0.39990234375f}));
}

TEST(FormatsFp16Rounding, OffsetRoundedAboveMinClampsToCodeZero) {
  // Units of u = 2^-14. min = 1 + 12u, max = 1 + 27u -> scale 15u/15 = u = 2^-14 (fp16 0x0400, exact).
  // offset = fp16(1 + 12u): fp16 spacing at 1 is 2^-10 = 16u, so 1 + 12u rounds UP to 1 + 16u (0x3c01).
  // The stored range is [1 + 16u, 1 + 31u]:
  //   x = 1 + 12u (the min) lies below it -> q 0, x̂ = 1 + 16u, error 4u = 2^-12 = offset - min,
  //     eight times scale/2: the simple scale/2 bound does not hold with fp16 offsets;
  //   x = 1 + 27u   -> q 11, exact;  x = 1 + 20.5u -> 4.5 -> q 4 (tie to even), x̂ = 1 + 20u;
  //   x = 1 + 14u   -> below the range, q 0, x̂ = 1 + 16u.
  const float u = 0x1p-14f;
  const std::vector<float> X = {1 + 12 * u, 1 + 27 * u, 1 + 20.5f * u, 1 + 14 * u};
  const QuantizedTensor q = quant("int4-asym-tensor", X, 1, 4);
  EXPECT_EQ(le16(q.scales), (std::vector<uint16_t>{0x0400}));
  EXPECT_EQ(le16(q.offsets), (std::vector<uint16_t>{0x3c01}));
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{0xb0, 0x04}));
  const std::vector<float> xh = decode(q);
  EXPECT_EQ(xh, (std::vector<float>{1 + 16 * u, 1 + 27 * u, 1 + 20 * u, 1 + 16 * u}));
  EXPECT_EQ(xh[0] - X[0], 0x1p-12f);
  EXPECT_GT(xh[0] - X[0], q.scale_at(0) / 2);

  // -fp32: offset = min exactly, so codes 0, 15, 8.5 -> 8, 2 and every error is within scale/2.
  const QuantizedTensor q32 = quant("int4-asym-tensor-fp32", X, 1, 4);
  EXPECT_EQ(le32f(q32.offsets), (std::vector<float>{1 + 12 * u}));
  EXPECT_EQ(le32f(q32.scales), (std::vector<float>{u}));
  EXPECT_EQ(unpack_codes(q32), (std::vector<uint32_t>{0, 15, 8, 2}));
  EXPECT_EQ(decode(q32), (std::vector<float>{1 + 12 * u, 1 + 27 * u, 1 + 20 * u, 1 + 14 * u}));
}

// ---- FP8 e4m3, one fp32 scale per 128-dimension tile of each token ------------------------------

// Both engine rules on the same hand rows: FlashMLA's pow2 (scale = 2^ceil(log2(max(amax/448, 1e-4)))) and
// vLLM fp8_ds_mla's fp32 (scale = max(amax/448, FLT_MIN)). Where amax = 448·2^k the two agree (scale 2^k).
void hand_fp8_tiles(bool pow2) {
  const int64_t T = 2, D = 576;  // 4.5 tiles: tiles [0,128) ... [384,512) and the partial [512,576)
  // zero tile: pow2 floors amax/448 at 1e-4 -> 2^ceil(log2 1e-4) = 2^-13; fp32 floors it at FLT_MIN
  const float floor_scale = pow2 ? 0x1p-13f : 1.17549435e-38f;
  std::vector<float> X(T * D, 0.0f);
  // Row 0: tile j holds s_j·p(d) with p(d) = 0.25·(d mod 8 − 4) ∈ {−1, …, 0.75} (exact in e4m3) and
  // p = 448 at the tile's first element, so amax = 448·s_j and scale = s_j exactly (powers of two).
  // Tile 2 is all zero. The tail tile (64 elements) has its own scale 0.25.
  const float s_row0[5] = {1.0f, 0.125f, 0.0f, 4.0f, 0.25f};
  for (int j = 0; j < 5; ++j) {
    if (s_row0[j] == 0.0f) continue;
    for (int64_t d = 128 * j; d < std::min<int64_t>(D, 128 * j + 128); ++d)
      X[d] = s_row0[j] * (d == 128 * j ? 448.0f : 0.25f * static_cast<float>(d % 8 - 4));
  }
  // Row 1, tile 0 (scale 1 from the 448): ties in e4m3.
  //   2^-9 -> 0x01; 0.5·2^-9 -> tie 0/1 -> 0x00; 1.5·2^-9 -> tie 1/2 -> 0x02;
  //   17 (spacing 2 in [16,32)) -> tie 16/18 -> 16 (0x58); 19 -> tie 18/20 -> 20 (0x5a).
  float* r1 = X.data() + D;
  r1[0] = 448.0f;
  r1[1] = 0x1p-9f;
  r1[2] = 0x1p-10f;
  r1[3] = 0x3p-10f;
  r1[4] = 17.0f;
  r1[5] = -19.0f;
  // Row 1, tile 1: amax 100; scale s100 = fl(100/448); 100/s100 is 448 up to one float rounding and
  // either rounds to 448 or saturates to it: code 0x7e, x̂ = 448·s100.
  r1[128] = 100.0f;
  r1[129] = -50.0f;
  // Row 1, tail tile: amax 1e-6 < 1e-4 -> floor scale; 1e-6/floor_scale = 4.48 -> 4.5 (0x49).
  r1[512] = 1e-6f;

  const char* spec = pow2 ? "fp8-e4m3-tile128-pow2" : "fp8-e4m3-tile128-fp32";
  const QuantizedTensor q = quant(spec, X, T, D);
  ASSERT_EQ(q.spec, QuantSpec::parse(spec));
  ASSERT_EQ(q.codes.size(), static_cast<size_t>(T * D));
  ASSERT_EQ(q.scales.size(), static_cast<size_t>(T * 5 * 4));  // [T, ceil(576/128) = 5] fp32
  EXPECT_TRUE(q.offsets.empty());
  const std::vector<float> sc = le32f(q.scales);
  // tile 1 of row 1 (amax 100): pow2 2^ceil(log2(0.2232)) = 0.25; fp32 fl(100/448)
  const float s100 = pow2 ? 0.25f : 100.0f / 448.0f;
  // tail of row 1 (amax 1e-6): pow2 floors at 1e-4 -> 2^-13; fp32 fl(1e-6/448)
  const float stail = pow2 ? 0x1p-13f : 1e-6f / 448.0f;
  EXPECT_EQ(sc, (std::vector<float>{1.0f, 0.125f, floor_scale, 4.0f, 0.25f,  //
                                    1.0f, s100, floor_scale, floor_scale, stail}));
  // Row 0 codes: first element of each non-zero tile 0x7e (448); others e4m3(p(d)).
  for (int64_t d = 0; d < D; ++d) {
    const int j = static_cast<int>(d / 128);
    uint8_t want;
    if (s_row0[j] == 0.0f)
      want = 0x00;
    else if (d % 128 == 0)
      want = 0x7e;
    else {
      // p = 0.25·k, k = d mod 8 − 4: −1 0xb8, −0.75 0xb4, −0.5 0xb0, −0.25 0xa8, 0 0x00, 0.25 0x28,
      // 0.5 0x30, 0.75 0x34.
      static const uint8_t code_of_k[8] = {0xb8, 0xb4, 0xb0, 0xa8, 0x00, 0x28, 0x30, 0x34};
      want = code_of_k[d % 8];
    }
    ASSERT_EQ(int(q.codes[d]), int(want)) << "row 0, d = " << d;
  }
  const uint8_t* c1 = q.codes.data() + D;
  EXPECT_EQ(int(c1[0]), 0x7e);
  EXPECT_EQ(int(c1[1]), 0x01);
  EXPECT_EQ(int(c1[2]), 0x00);
  EXPECT_EQ(int(c1[3]), 0x02);
  EXPECT_EQ(int(c1[4]), 0x58);
  EXPECT_EQ(int(c1[5]), 0xda);  // −20
  if (pow2) {
    EXPECT_EQ(int(c1[128]), 0x7c);  // 100/0.25 = 400: tie 384/416 -> 384 = 1.5·2^8 (even mantissa)
    EXPECT_EQ(int(c1[129]), 0xf4);  // −200: tie −192/−208 -> −192 = −1.5·2^7
    EXPECT_EQ(int(c1[512]), 0x04);  // 1e-6 / 2^-13 = 0.008192 = 4.19·2^-9 -> subnormal m = 4
  } else {
    EXPECT_EQ(int(c1[128]), 0x7e);
    EXPECT_EQ(int(c1[129]), 0xf6);  // −50/s100 = −224.000002 -> −224 = −1.75·2^7: e = 14, m = 6
    EXPECT_EQ(int(c1[512]), 0x7e);  // 1e-6 / fl(1e-6/448) = 448 up to one rounding: 448
  }

  const std::vector<float> xh = decode(q);
  for (int64_t d = 0; d < D; ++d) {
    if (s_row0[d / 128] != 0.0f)
      ASSERT_EQ(xh[d], X[d]) << "row 0 is exact, d = " << d;
    else
      ASSERT_EQ(bits_of(xh[d]), 0u) << "zero tile decodes to +0, d = " << d;
  }
  EXPECT_EQ(xh[D + 0], 448.0f);
  EXPECT_EQ(xh[D + 1], 0x1p-9f);
  EXPECT_EQ(xh[D + 2], 0.0f);
  EXPECT_EQ(xh[D + 3], 0x2p-9f);
  EXPECT_EQ(xh[D + 4], 16.0f);
  EXPECT_EQ(xh[D + 5], -20.0f);
  EXPECT_EQ(xh[D + 128], (pow2 ? 384.0f : 448.0f) * s100);
  EXPECT_EQ(xh[D + 512], pow2 ? 4.0f * 0x1p-9f * 0x1p-13f : 448.0f * stail);
  for (int64_t d = 513; d < D; ++d) EXPECT_EQ(xh[D + d], 0.0f);
  for (float v : xh) ASSERT_TRUE(std::isfinite(v));
}

TEST(FormatsFp8Tile, HandTilesFlashMlaPow2) { hand_fp8_tiles(true); }
TEST(FormatsFp8Tile, HandTilesVllmFp32) { hand_fp8_tiles(false); }

TEST(FormatsFp8Tile, PresetOnKpeStoresBf16) {
  // The FlashMLA V3.2 preset applied to k_pe stores bf16 (its record keeps the rope dims in bf16):
  // 2 bytes per element, no scales.
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int64_t T = 3, D = 64;
  std::vector<float> X(T * D);
  for (float& v : X) v = nd(rng);
  const QuantizedTensor q = quant("flashmla-v32-fp8", X, T, D, {}, Target::KPE);
  EXPECT_EQ(q.spec, QuantSpec::parse("bf16"));
  EXPECT_EQ(q.codes.size(), static_cast<size_t>(2 * T * D));
  EXPECT_TRUE(q.scales.empty());
  EXPECT_TRUE(q.offsets.empty());
  const std::vector<float> xh = decode(q);
  for (int64_t i = 0; i < T * D; ++i) ASSERT_EQ(static_cast<double>(xh[i]), ref_bf16(X[i])) << i;
}

TEST(FormatsFp8Tile, RandomTilesMatchReference) {
  // Each element decodes to e4m3(x/s)·s with the engine's s from the per-tile amax computed here
  // (pow2: 2^ceil(log2(max(amax/448, 1e-4))) in double; fp32: max(amax/448, FLT_MIN)); codes
  // re-derived with the independent double-precision RNE reference (saturating at 448).
  for (const bool pow2 : {true, false})
    for (uint32_t seed : {1u, 2u, 3u}) {
      for (int64_t D : {576, 64, 33, 128}) {
        const int64_t T = 7;
        SCOPED_TRACE(std::string(pow2 ? "pow2" : "fp32") + " seed " + std::to_string(seed) + " [" + std::to_string(T) +
                     ", " + std::to_string(D) + "]");
        std::mt19937 rng(seed);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> X(T * D);
        for (int64_t i = 0; i < T * D; ++i) X[i] = nd(rng) * ((i % D) < 16 ? 20.0f : 1.0f);
        const QuantizedTensor q = quant(pow2 ? "fp8-e4m3-tile128-pow2" : "fp8-e4m3-tile128-fp32", X, T, D);
        const int64_t nt = (D + 127) / 128;
        ASSERT_EQ(q.scales.size(), static_cast<size_t>(T * nt * 4));
        const std::vector<float> sc = le32f(q.scales), xh = decode(q);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = 0; j < nt; ++j) {
            float amax = 0;
            for (int64_t d = 128 * j; d < std::min(D, 128 * j + 128); ++d)
              amax = std::max(amax, std::fabs(X[t * D + d]));
            const float s =
                pow2 ? static_cast<float>(std::exp2(std::ceil(std::log2(std::max<double>(amax / 448.0f, 1e-4f)))))
                     : std::max(amax / 448.0f, 1.17549435e-38f);
            ASSERT_EQ(sc[t * nt + j], s) << "t " << t << " tile " << j;
            for (int64_t d = 128 * j; d < std::min(D, 128 * j + 128); ++d) {
              const float x = X[t * D + d];
              const double want = std::clamp(ref_e4m3(x / s), -448.0, 448.0);
              ASSERT_EQ(e4m3_value(q.codes[t * D + d]), want) << "t " << t << " d " << d;
              ASSERT_EQ(xh[t * D + d], static_cast<float>(want) * s) << "t " << t << " d " << d;
            }
          }
      }
    }
}

// ---- bf16 ---------------------------------------------------------------------------------------

TEST(FormatsBf16, DecodeIsBf16RoundedInputBitForBit) {
  // Hand: 1 + 2^-8 ties to 1 (0x3f80, bytes 80 3f little-endian); 1 + 3·2^-8 ties to 1 + 2^-6 (0x3f82);
  // -2.5 is exact (0xc020).
  const QuantizedTensor h = quant("bf16", {1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -2.5f}, 1, 3);
  EXPECT_EQ(h.codes, (std::vector<uint8_t>{0x80, 0x3f, 0x82, 0x3f, 0x20, 0xc0}));
  EXPECT_TRUE(h.scales.empty());
  EXPECT_EQ(decode(h), (std::vector<float>{1.0f, 1.0f + 0x1p-6f, -2.5f}));

  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> any;
  const int64_t T = 129, D = 33;
  std::vector<float> X(T * D);
  for (float& v : X) {
    do v = float_of(any(rng));
    while (!std::isfinite(v) || std::fabs(v) > 1e38f);
  }
  const QuantizedTensor q = quant("bf16", X, T, D);
  const std::vector<float> xh = decode(q);
  for (int64_t i = 0; i < T * D; ++i) {
    ASSERT_EQ(static_cast<double>(xh[i]), ref_bf16(X[i])) << i;
    ASSERT_EQ(std::signbit(xh[i]), std::signbit(X[i])) << i;
    // bf16 = the high half of the float32 bits after rounding; the low half of the decode is zero.
    ASSERT_EQ(bits_of(xh[i]) & 0xffffu, 0u);
  }
}

}  // namespace
