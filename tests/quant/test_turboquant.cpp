// TurboQuant's MSE stage (latentq/turboquant.h, spec tq<b>[-nc]) and the FlashInfer NVFP4 MLA tile
// (fp4-e2m1-tile16-e4m3-rcp): hand-computed rows, the codebook against closed forms and the textbook
// Lloyd-Max quantizer of a Gaussian, the packing, the distortion on Gaussian rows, the presets' bytes
// and the errors. The byte-exact comparison with vLLM's and FlashInfer's own formulas is in
// tests/python/test_engine_formats.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "latentq/metrics.h"
#include "latentq/quantize.h"
#include "latentq/spec.h"
#include "latentq/turboquant.h"

namespace {

using namespace latentq;
namespace q = latentq::qmath;

std::vector<float> gaussian_rows(int64_t T, int64_t D, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, sigma);
  std::vector<float> x(static_cast<size_t>(T * D));
  for (float& v : x) v = n(rng);
  return x;
}

TEST(TurboQuantCodebook, OneBitIsTheHalfNormalMean) {
  // Lloyd-Max at 1 bit on N(0, σ²): ±σ·sqrt(2/π) (the conditional mean of a half-normal). vLLM's trapezoid
  // rule on 200 panels over [0, 10.5σ] (h = 0.0525σ) lands 2.3e-4 below it, relative.
  for (int64_t D : {64, 512}) {
    const q::TqCodebook& cb = tq_codebook(D, 1);
    const double s = 1.0 / std::sqrt(static_cast<double>(D)), want = s * std::sqrt(2.0 / M_PI);
    ASSERT_EQ(cb.levels, 2);
    EXPECT_NEAR(cb.centroid[1], want, 4e-4 * want) << "D = " << D;
    EXPECT_EQ(cb.centroid[0], -cb.centroid[1]);
    EXPECT_EQ(cb.midpoint[0], 0.0f);
  }
}

TEST(TurboQuantCodebook, CloseToTheTextbookGaussianQuantizer) {
  // Max (1960), Lloyd-Max levels of N(0, 1): 2 bits ±0.4528, ±1.510; 3 bits ±0.2451, ±0.7560, ±1.344, ±2.152.
  // vLLM's iteration (200 steps from a uniform start, trapezoid cells) lands within 2e-3 of them.
  const double l2[] = {0.4528, 1.510}, l3[] = {0.2451, 0.7560, 1.344, 2.152};
  const double s = 1.0 / std::sqrt(512.0);
  const q::TqCodebook& c2 = tq_codebook(512, 2);
  const q::TqCodebook& c3 = tq_codebook(512, 3);
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(c2.centroid[2 + i] / s, l2[i], 2e-3) << "2-bit level " << i;
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(c3.centroid[4 + i] / s, l3[i], 2e-3) << "3-bit level " << i;
  for (const q::TqCodebook* cb : {&c2, &c3, &tq_codebook(512, 4)})
    for (int i = 0; i < cb->levels; ++i) {
      EXPECT_EQ(cb->centroid[i], -cb->centroid[cb->levels - 1 - i]) << "symmetric, level " << i;
      if (i + 1 < cb->levels) {
        EXPECT_LT(cb->centroid[i], cb->centroid[i + 1]);
        EXPECT_EQ(cb->midpoint[i], (cb->centroid[i] + cb->centroid[i + 1]) / 2);
      }
      EXPECT_EQ(cb->centroid_bf16[i], q::bf16_bits_to_f32(q::f32_to_bf16_bits(cb->centroid[i])));
    }
}

TEST(TurboQuantCodebook, RefusesBadArguments) {
  EXPECT_THROW((void)tq_codebook(0, 3), std::invalid_argument);
  EXPECT_THROW((void)tq_codebook(512, 5), std::invalid_argument);
}

TEST(TurboQuant, OneHotRowByHand) {
  // x = 4·e_0 at D = 16: n = 4 (fp16 0x4400), x̂ = e_0 (4/(4 + 1e-8) rounds to 1), y = H·e_0 = 1/4 everywhere.
  // 2-bit codebook of N(0, 1/16): top midpoint (0.4528 + 1.510)/2 · 0.25 ≈ 0.2453 ≤ 0.25: every index is 3,
  // so the 4 code bytes are 0xff. Decode without norm correction: H·(n·c₃·1) = 4·c₃·4·e_0 ≈ 6.04·e_0; with
  // it, c₃ / sqrt(16·c₃²) = 1/4 per coordinate, so x̂ = H·(1·1) = 4·e_0 (exact up to float32 rounding).
  const int64_t D = 16;
  std::vector<float> x(D, 0.0f);
  x[0] = 4.0f;
  const std::vector<int64_t> seq{0, 1};
  const QuantizedTensor qt = quantize(QuantSpec::parse("tq2"), Target::CKV, x.data(), 1, D, seq);
  ASSERT_EQ(qt.codes.size(), 4u);
  for (uint8_t b : qt.codes) EXPECT_EQ(b, 0xff);
  ASSERT_EQ(qt.scales.size(), 2u);
  EXPECT_EQ(qt.scales[0], 0x00);
  EXPECT_EQ(qt.scales[1], 0x44);
  const float c3 = tq_codebook(D, 2).centroid_bf16[3];
  std::vector<float> out(D);
  dequantize(qt, out.data());
  EXPECT_NEAR(out[0], 16.0f * c3, 1e-5);
  for (int64_t i = 1; i < D; ++i) EXPECT_NEAR(out[i], 0.0f, 1e-6) << i;
  const QuantizedTensor nc = quantize(QuantSpec::parse("tq2-nc"), Target::CKV, x.data(), 1, D, seq);
  EXPECT_EQ(nc.codes, qt.codes);  // the correction is the decode's: the same stored bytes
  dequantize(nc, out.data());
  EXPECT_NEAR(out[0], 4.0f, 1e-5);
  for (int64_t i = 1; i < D; ++i) EXPECT_NEAR(out[i], 0.0f, 1e-6) << i;
}

TEST(TurboQuant, ZeroRowGivesTheMiddleIndexAndDecodesToZero) {
  // n = 0, x̂ = 0/(0 + 1e-8) = 0, y = 0: a tie at the middle midpoint (0) goes up, to index 2^(b-1) = 4 at 3 bits.
  const int64_t D = 32;
  const std::vector<float> x(D, 0.0f);
  const QuantizedTensor qt = quantize(QuantSpec::parse("tq3"), Target::CKV, x.data(), 1, D, {{0, 1}});
  for (int64_t i = 0; i < D; ++i) EXPECT_EQ(q::lsb_get_code(qt.codes.data(), static_cast<int>(i), 3), 4u) << i;
  std::vector<float> out(D, 1.0f);
  dequantize(qt, out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(TurboQuant, PackingIsAnLsbFirstBitstream) {
  // tq_encode_byte of known indices, read back bit by bit from the stream as written out here.
  for (int bits : {2, 3, 4}) {
    const q::TqCodebook& cb = tq_codebook(64, bits);
    std::mt19937 rng(1000 + bits);
    for (int D : {16, 24, 64, 67}) {
      std::vector<uint32_t> want(D);
      std::vector<float> y(D);
      for (int i = 0; i < D; ++i) {
        want[i] = rng() % cb.levels;
        y[i] = cb.centroid[want[i]];  // a centroid encodes to its own index
      }
      const int rb = (D * bits + 7) / 8;
      std::vector<uint8_t> row(rb);
      for (int k = 0; k < rb; ++k) row[k] = q::tq_encode_byte(cb, y.data(), D, k);
      for (int i = 0; i < D; ++i) {
        uint32_t c = 0;
        for (int j = 0; j < bits; ++j) c |= ((row[(i * bits + j) / 8] >> ((i * bits + j) % 8)) & 1u) << j;
        ASSERT_EQ(c, want[i]) << "bits " << bits << ", D " << D << ", element " << i;
        ASSERT_EQ(q::lsb_get_code(row.data(), i, bits), want[i]);
      }
      const int pad = rb * 8 - D * bits;  // trailing bits are zero
      if (pad > 0) {
        EXPECT_EQ(row[rb - 1] >> (8 - pad), 0) << "bits " << bits << ", D " << D;
      }
    }
  }
}

TEST(TurboQuant, DistortionOfGaussianRowsIsTheLloydMaxDistortion) {
  // Rows of i.i.d. Gaussians rotated by H stay i.i.d. N(0, 1/D) after normalization, so the relative error
  // is about sqrt(D_b) with the Lloyd-Max distortions of N(0, 1): 0.1175 (2 bits), 0.03454 (3), 0.009497 (4)
  // (Max 1960). Norm correction rescales each decoded row to the stored norm: close to the same error.
  const int64_t T = 400, D = 128;
  const uint64_t seed = 77;
  const std::vector<float> x = gaussian_rows(T, D, seed);
  const std::vector<int64_t> seq{0, T};
  const double want[] = {std::sqrt(0.1175), std::sqrt(0.03454), std::sqrt(0.009497)};
  for (int bits : {2, 3, 4})
    for (const char* nc : {"", "-nc"}) {
      const std::string spec = "tq" + std::to_string(bits) + nc;
      std::vector<float> out(static_cast<size_t>(T * D));
      (void)quantize_dequantize(QuantSpec::parse(spec), Target::CKV, x.data(), T, D, seq, out.data());
      const double r = error_metrics(x.data(), out.data(), T, D).rel_fro;
      EXPECT_NEAR(r, want[bits - 2], 0.1 * want[bits - 2])
          << spec << ", seed " << seed << ", [" << T << ", " << D << "]";
    }
}

TEST(TurboQuant, BytesPerTokenAndPresets) {
  EXPECT_EQ(layout(QuantSpec::parse("tq3"), 512).bytes_per_token(), 192 + 2);
  EXPECT_EQ(layout(QuantSpec::parse("tq4-nc"), 512).bytes_per_token(), 256 + 2);
  EXPECT_EQ(layout(QuantSpec::parse("tq2"), 128).bytes_per_token(), 32 + 2);
  // vLLM's MLA cache at DeepSeek-V2-Lite's 512 + 64 (triton_mla_tq.py): 386 / 322 / 640 B; the
  // FlashInfer NVFP4 MLA record at 448 + 64: 224 + 128 + 28 + 4 pad = 384 B.
  EXPECT_EQ(record_bytes(QuantSpec::parse("vllm-turboquant-4bit-nc"), 512, 64), 386);
  EXPECT_EQ(record_bytes(QuantSpec::parse("vllm-turboquant-3bit-nc"), 512, 64), 322);
  EXPECT_EQ(record_bytes(QuantSpec::parse("vllm-turboquant-k8v4"), 512, 64), 640);
  EXPECT_EQ(record_bytes(QuantSpec::parse("flashinfer-nvfp4-mla"), 448, 64), 384);
  for (const char* s :
       {"tq2", "tq3", "tq4", "tq3-nc", "fp4-e2m1-tile16-e4m3-rcp", "vllm-turboquant-3bit-nc", "flashinfer-nvfp4-mla"})
    EXPECT_EQ(QuantSpec::parse(QuantSpec::parse(s).to_string()).to_string(), s);
}

TEST(TurboQuant, PackRecordIsCodesNormThenRope) {
  const int64_t T = 3, Dc = 64, Dr = 16;
  const std::vector<float> c = gaussian_rows(T, Dc, 5), r = gaussian_rows(T, Dr, 6);
  const QuantSpec p = QuantSpec::parse("vllm-turboquant-3bit-nc");
  const std::vector<int64_t> seq{0, T};
  const QuantizedTensor qc = quantize(p, Target::CKV, c.data(), T, Dc, seq);
  const QuantizedTensor qr = quantize(p, Target::KPE, r.data(), T, Dr, seq);
  const std::vector<uint8_t> rec = pack_record(p, qc, qr);
  const int64_t R = 24 + 2 + 32;
  ASSERT_EQ(static_cast<int64_t>(rec.size()), T * R);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < 24; ++k) EXPECT_EQ(rec[t * R + k], qc.codes[t * 24 + k]);
    EXPECT_EQ(rec[t * R + 24], qc.scales[2 * t]);
    EXPECT_EQ(rec[t * R + 25], qc.scales[2 * t + 1]);
    for (int64_t k = 0; k < 32; ++k) EXPECT_EQ(rec[t * R + 26 + k], qr.codes[t * 32 + k]);
  }
}

TEST(TurboQuant, Errors) {
  const std::vector<float> x(24, 1.0f);
  try {
    (void)quantize(QuantSpec::parse("tq3"), Target::CKV, x.data(), 1, 24, {{0, 1}});
    FAIL() << "D = 24 has a Hadamard block of 8";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("D = 24"), std::string::npos) << e.what();
  }
  std::vector<float> big(32, 20000.0f);  // norm 113,137 > fp16's 65,504
  try {
    (void)quantize(QuantSpec::parse("tq4"), Target::CKV, big.data(), 1, 32, {{0, 1}});
    FAIL() << "the fp16 row norm overflows";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("token 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("row norm"), std::string::npos) << e.what();
  }
  for (const char* s : {"tq1", "tq5", "tq3-x", "tq3-nc-nc", "tq"})
    EXPECT_THROW((void)QuantSpec::parse(s), std::invalid_argument) << s;
}

TEST(Fp4TileRcp, HandComputedBlocks) {
  // FlashInfer: s = e4m3(amax/6) (RNE), codes e2m1(x · (1/s)). Block 1: amax 6 → s = 1: codes of 6, 3, 0.25,
  // −1.5 are 7 (6.0), 5 (3.0), 0 (0.25 is the tie of 0 and 0.5: even → 0), 0xB (−1.5). Block 2: amax 0.0006
  // → amax/6 = 1e-4 below half of e4m3's smallest subnormal 2^-9 (9.8e-4) → s = 0 → every element times 0:
  // +0 (code 0) or, for a negative element, −0 (code 0x8, as the PTX cvt of −0.0 keeps the sign).
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f;
  x[1] = 3.0f;
  x[2] = 0.25f;
  x[3] = -1.5f;
  x[16] = 0.0006f;
  x[17] = -0.0003f;
  const QuantizedTensor qt =
      quantize(QuantSpec::parse("fp4-e2m1-tile16-e4m3-rcp"), Target::CKV, x.data(), 1, 32, {{0, 1}});
  ASSERT_EQ(qt.codes.size(), 16u);
  ASSERT_EQ(qt.scales.size(), 2u);
  EXPECT_EQ(qt.scales[0], 0x38);  // e4m3 1.0
  EXPECT_EQ(qt.scales[1], 0x00);
  EXPECT_EQ(qt.codes[0], 0x57);  // element 0 low nibble (7), element 1 high (5)
  EXPECT_EQ(qt.codes[1], 0xB0);
  EXPECT_EQ(qt.codes[8], 0x80);  // element 16 (+0) low, element 17 (−0.0003 · 0 = −0) high
  for (int k = 9; k < 16; ++k) EXPECT_EQ(qt.codes[k], 0) << k;
  // FlashMLA's rule clamps the scale at 2^-9 instead, so its block 2 keeps a code: the two rules differ.
  const QuantizedTensor fm = quantize(QuantSpec::parse("fp4-e2m1-tile16-e4m3"), Target::CKV, x.data(), 1, 32, {{0, 1}});
  EXPECT_NE(fm.scales[1], 0x00);
}

}  // namespace
