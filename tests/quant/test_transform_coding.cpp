// Transform coding (latentq/transform_coding.h, spec tc<R>[-lm]): hand-computed widths, records and code
// bytes, the textbook Gaussian uniform and Lloyd-Max quantizers, the byte accounting, the per-component error
// bounds and the rate on seeded inputs, the spec grammar and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "latentq/quantize.h"
#include "latentq/spec.h"
#include "latentq/transform.h"
#include "latentq/transform_coding.h"

namespace {

using namespace latentq;
namespace q = latentq::qmath;

float record_f32(const QuantizedTensor& qt, int64_t at) {
  float f;
  std::memcpy(&f, qt.global.data() + at, 4);
  return f;
}

TEST(TransformCodingWidths, DiagonalVariancesByHand) {
  // Variances 16, 4, 1, 0.25 with 8 bits (R = 2, D = 4). Priorities v·4^(−w), ties to the lower index:
  // 16→c0 | 4,4: c0 | 4: c1 | 1,1,1: c0 | 1,1: c1 | 1: c2 | 0.25 ×4: c0 | 0.25 ×3: c1 → widths 4, 3, 1, 0.
  // (Continuous reverse water-filling: θ = 1/8, rates 3.5, 2.5, 1.5, 0.5.)
  EXPECT_EQ(tc_allocate_widths(std::vector<double>{16, 4, 1, 0.25}, 8), (std::vector<int>{4, 3, 1, 0}));
  // No ties: 10, 3, 0.5 with 5 bits: c0 (10) | c1 (3) | c0 (2.5) | c1 (0.75) | c0 (0.625) → 3, 2, 0.
  EXPECT_EQ(tc_allocate_widths(std::vector<double>{10, 3, 0.5}, 5), (std::vector<int>{3, 2, 0}));
  // The 8-bit cap, and components of zero variance never take a bit (the budget stays unspent).
  EXPECT_EQ(tc_allocate_widths(std::vector<double>{1e6, 1}, 12), (std::vector<int>{8, 4}));
  EXPECT_EQ(tc_allocate_widths(std::vector<double>{0, 1, 0}, 20), (std::vector<int>{0, 8, 0}));
  EXPECT_EQ(tc_allocate_widths(std::vector<double>{1, 2}, 0), (std::vector<int>{0, 0}));
  EXPECT_THROW((void)tc_allocate_widths(std::vector<double>{1}, -1), std::invalid_argument);
}

TEST(TransformCodingGaussian, TextbookUniformStepsAndLloydMaxLevels) {
  // Max (1960), Table II (optimal uniform step of N(0, 1)) and Table I (Lloyd-Max levels).
  const double step[] = {1.596, 0.9957, 0.5860, 0.3352};
  for (int w = 1; w <= 4; ++w) EXPECT_NEAR(tc_uniform_step(w), step[w - 1], 6e-4) << "width " << w;
  for (int w = 2; w <= 8; ++w) EXPECT_LT(tc_uniform_step(w), tc_uniform_step(w - 1)) << w;
  EXPECT_NEAR(tc_uniform_mse(1, tc_uniform_step(1)), 1 - 2 / M_PI, 1e-9);  // 1 bit: ±sqrt(2/π), 1 − 2/π
  EXPECT_NEAR(tc_uniform_mse(2, tc_uniform_step(2)), 0.1188, 2e-4);
  EXPECT_NEAR(tc_unit_codebook(1)[1], std::sqrt(2 / M_PI), 1e-12);
  const double l3[] = {0.2451, 0.7560, 1.344, 2.152};
  for (int m = 0; m < 4; ++m) {
    EXPECT_NEAR(tc_unit_codebook(3)[4 + m], l3[m], 6e-4) << m;
    EXPECT_DOUBLE_EQ(tc_unit_codebook(3)[3 - m], -tc_unit_codebook(3)[4 + m]) << m;
  }
  const double l4[] = {0.1284, 0.3881, 0.6568, 0.9424, 1.256, 1.618, 2.069, 2.733};
  for (int m = 0; m < 8; ++m) EXPECT_NEAR(tc_unit_codebook(4)[8 + m], l4[m], 6e-4) << m;
  for (int w = 1; w <= 8; ++w) {
    const std::vector<double>& c = tc_unit_codebook(w);
    ASSERT_EQ(c.size(), size_t{1} << w);
    EXPECT_TRUE(std::is_sorted(c.begin(), c.end())) << w;
  }
  EXPECT_THROW((void)tc_uniform_step(0), std::invalid_argument);
  EXPECT_THROW((void)tc_unit_codebook(9), std::invalid_argument);
}

// The record's scale search restated in double: the multiplier 2^(j/8) of the Gaussian rule with the least
// squared error over the values v of a component of mean mu, std sigma, width w (ties to the smaller j).
double searched_scale(const std::vector<double>& v, double mu, double sigma, int w, bool lm) {
  double best = 0, best_e = INFINITY;
  const int L = 1 << w;
  for (int j = kTcScaleSearchFirst; j <= kTcScaleSearchLast; ++j) {
    const double m = std::exp2(j / 8.0);
    const float s = static_cast<float>(lm ? m * sigma : m * sigma * tc_uniform_step(w));
    const float o = static_cast<float>(lm ? mu : mu - static_cast<double>(s) * (L - 1) / 2);
    double e = 0;
    for (double x : v) {
      double r;
      if (lm) {  // the nearest level of the fp16-rounded unit codebook
        r = INFINITY;
        for (double c : tc_unit_codebook(w))
          if (const double y =
                  o + s * static_cast<double>(q::f16_bits_to_f32(q::f32_to_f16_bits(static_cast<float>(c))));
              std::abs(y - x) < std::abs(r - x))
            r = y;
      } else {
        r = o + s * std::clamp(std::nearbyint((x - o) / s), 0.0, L - 1.0);
      }
      e += (r - x) * (r - x);
    }
    if (e < best_e) best_e = e, best = s;
  }
  return best;
}

TEST(TransformCoding, RecordAndCodesByHand) {
  // D = 4, two sequences of the two tokens ±[4, 2, 1, 0.5]: the fit split (sequence 0) has mean 0 and variances
  // 16, 4, 1, 0.25 → widths 4, 3, 1, 0 (above); tc2 at D = 4 stores floor(2·4/8) = 1 code byte per token:
  // component 0 in bits 0-3, 1 in bits 4-6, 2 in bit 7.
  const std::vector<float> x{4, 2, 1, 0.5f, -4, -2, -1, -0.5f, 4, 2, 1, 0.5f, -4, -2, -1, -0.5f};
  const std::vector<int64_t> seq{0, 2, 4};
  const QuantizedTensor qt = quantize(QuantSpec::parse("tc2"), Target::CKV, x.data(), 4, 4, seq);
  ASSERT_EQ(qt.global.size(), 9u * 4);
  EXPECT_EQ(std::vector<uint8_t>(qt.global.begin(), qt.global.begin() + 4), (std::vector<uint8_t>{4, 3, 1, 0}));
  // Component 2 (±1, one bit): levels ±scale/2 at m·g(1) = m·1.596; |0.798·m − 1| is least on the grid at
  // m = 2^(3/8) = 1.2968 (0.0349; 2^(2/8) gives 0.0510), so scale = 2.0698 and the levels are ±1.0349.
  EXPECT_FLOAT_EQ(record_f32(qt, 4 + 8), static_cast<float>(std::exp2(3 / 8.0) * tc_uniform_step(1)));
  EXPECT_NEAR(record_f32(qt, 4 + 8), 2.0698, 2e-3);
  const double sigma[] = {4, 2, 1}, L[] = {16, 8, 2};
  for (int i = 0; i < 3; ++i) {
    const double s = record_f32(qt, 4 + 4 * i);
    EXPECT_EQ(s, static_cast<float>(searched_scale({sigma[i], -sigma[i]}, 0, sigma[i],
                                                   i == 0   ? 4
                                                   : i == 1 ? 3
                                                            : 1,
                                                   false)))
        << i;
    EXPECT_NEAR(record_f32(qt, 20 + 4 * i), -s * (L[i] - 1) / 2, 1e-6) << i;  // the lowest level
  }
  EXPECT_EQ(record_f32(qt, 16), 0.0f);  // component 3: no bits, scale 0, offset the mean 0
  EXPECT_EQ(record_f32(qt, 32), 0.0f);
  // codes: the nearest level of each component from the stored (scale, offset), packed by hand
  auto code = [&](int i, double v) {
    const double s = record_f32(qt, 4 + 4 * i), o = record_f32(qt, 20 + 4 * i);
    return static_cast<int>(std::clamp(std::nearbyint((v - o) / s), 0.0, L[i] - 1));
  };
  const int plus = code(0, 4) | code(1, 2) << 4 | code(2, 1) << 7,
            minus = code(0, -4) | code(1, -2) << 4 | code(2, -1) << 7;
  EXPECT_EQ(code(2, 1), 1);
  EXPECT_EQ(code(2, -1), 0);
  EXPECT_EQ(qt.codes, (std::vector<uint8_t>{static_cast<uint8_t>(plus), static_cast<uint8_t>(minus),
                                            static_cast<uint8_t>(plus), static_cast<uint8_t>(minus)}));
  std::vector<float> out(16);
  dequantize(qt, out.data());
  EXPECT_NEAR(out[2], 1.0349, 2e-3);
  EXPECT_NEAR(out[6], -1.0349, 2e-3);
  EXPECT_EQ(out[3], 0.0f);
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(out[i], x[i], 0.1 * sigma[i]) << i;
  EXPECT_EQ(qt.storage_bytes(), 4 * 1 + 36);

  // -lm: scale m·σ, offset μ = 0, the fp16 unit codebooks after the 36 bytes. Component 2 (±1, one bit): levels
  // ±m·sqrt(2/π) = ±0.7979·m, least |0.7979·m − 1| at m = 2^(3/8) again (0.0347): decoded ±1.0347.
  const QuantizedTensor lm = quantize(QuantSpec::parse("tc2-lm"), Target::CKV, x.data(), 4, 4, seq);
  ASSERT_EQ(lm.global.size(), 36u + 1020);
  EXPECT_FLOAT_EQ(record_f32(lm, 4 + 8), static_cast<float>(std::exp2(3 / 8.0)));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(record_f32(lm, 4 + 4 * i), static_cast<float>(searched_scale({sigma[i], -sigma[i]}, 0, sigma[i],
                                                                           i == 0   ? 4
                                                                           : i == 1 ? 3
                                                                                    : 1,
                                                                           true)))
        << i;
    EXPECT_EQ(record_f32(lm, 20 + 4 * i), 0.0f) << i;
  }
  dequantize(lm, out.data());
  EXPECT_NEAR(out[2], 1.0347, 2e-3);
  EXPECT_NEAR(out[6], -1.0347, 2e-3);
}

TEST(TransformCoding, TheScaleSearchWidensTheClipForHeavyTails) {
  // Eight iid Laplace channels (equal variances: the greedy rounds give every component 4 bits at tc4): the
  // Gaussian step clips a Laplace tail too early, so the fit-split search picks m > 1 for every component, and
  // its squared error on the fit values is below the Gaussian rule's (m = 1).
  const int64_t T = 4000, D = 8;
  const uint64_t seed = 31;
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> e(1.0);
  std::vector<float> x(static_cast<size_t>(T * D));
  for (float& v : x) v = static_cast<float>(rng() & 1 ? e(rng) : -e(rng));
  const std::vector<int64_t> seq{0, T / 2, T};
  const QuantizedTensor qt = quantize(QuantSpec::parse("tc4"), Target::CKV, x.data(), T, D, seq);
  const TcHostTables tab = tc_tables(qt.spec, qt.global, D);
  for (int64_t i = 0; i < D; ++i) {
    ASSERT_EQ(tab.widths()[i], 4) << i;
    double mu = 0, var = 0;
    for (int64_t t = 0; t < T / 2; ++t) mu += x[t * D + i];
    mu /= T / 2.0;
    for (int64_t t = 0; t < T / 2; ++t) var += std::pow(x[t * D + i] - mu, 2);
    const double sigma = std::sqrt(var / (T / 2.0)), g = static_cast<float>(sigma * tc_uniform_step(4));
    EXPECT_GT(tab.scale[i], 1.05 * g) << "component " << i << ", seed " << seed;
    auto sse = [&](double s) {
      const double o = static_cast<float>(mu - s * 7.5);
      double r = 0;
      for (int64_t t = 0; t < T / 2; ++t) {
        const double v = x[t * D + i];
        r += std::pow(o + s * std::clamp(std::nearbyint((v - o) / s), 0.0, 15.0) - v, 2);
      }
      return r;
    };
    EXPECT_LT(sse(tab.scale[i]), sse(g)) << "component " << i << ", seed " << seed;
  }
}

TEST(TransformCoding, OnlyTheFitSplitIsFitted) {
  // The fit sequence is constant 1 (variance 0: no bits, decode the mean), the held-out one 10: it decodes to 1.
  std::vector<float> y(8 * 8, 1.0f);
  std::fill(y.begin() + 32, y.end(), 10.0f);
  const QuantizedTensor qt = quantize(QuantSpec::parse("tc4"), Target::CKV, y.data(), 8, 8, {{0, 4, 8}});
  for (int i = 0; i < 8; ++i) EXPECT_EQ(qt.global[i], 0) << i;
  std::vector<float> out(64);
  dequantize(qt, out.data());
  for (float v : out) EXPECT_EQ(v, 1.0f);
}

TEST(TransformCoding, LayoutAndAccounting) {
  // Row bytes floor(R·D/8); per matrix 9·D (+1020 with -lm).
  struct Case {
    const char* spec;
    int64_t D, row_bytes, tensor_bytes;
  } cases[] = {{"tc3", 512, 192, 4608}, {"tc2.5", 512, 160, 4608}, {"tc2-lm", 512, 128, 5628},  {"tc4", 64, 32, 576},
               {"tc3", 5, 1, 45},       {"tc0.125", 64, 1, 576},   {"tc8-lm", 3, 3, 27 + 1020}, {"tc2.999", 8, 2, 72}};
  for (const Case& c : cases) {
    const Layout L = layout(QuantSpec::parse(c.spec), c.D);
    EXPECT_EQ(L.row_code_bytes, c.row_bytes) << c.spec << " D " << c.D;
    EXPECT_EQ(L.bytes_per_token(), c.row_bytes) << c.spec;
    EXPECT_EQ(L.code_budget_bits, 8 * c.row_bytes) << c.spec;
    EXPECT_EQ(L.tensor_bytes, c.tensor_bytes) << c.spec;
    const std::vector<int64_t> seq{0, 40, 100};
    EXPECT_EQ(storage_bytes(QuantSpec::parse(c.spec), Target::KPE, c.D, seq), 100 * c.row_bytes + c.tensor_bytes);
  }
  try {
    (void)layout(QuantSpec::parse("tc1"), 7);
    FAIL() << "7 bits per token is less than a byte";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("0 code bytes per token for rows of D = 7"), std::string::npos) << e.what();
  }
}

// Seeded Gaussian rows with per-channel scales 2^(−d/16) and means d/3 (every fit variance > 0: the budget is
// spent): the stored widths never exceed the budget; every element is within the bound of its component —
// half a step (uniform) or half the widest codebook gap (-lm) inside the levels, the distance to the end
// level outside (held-out tokens beyond the fit split's range are clipped).
TEST(TransformCoding, SeededPropertiesErrorBoundsAndRate) {
  const uint64_t seed = 20261202;
  std::mt19937_64 rng(seed);
  const char* specs[] = {"tc3", "tc2-lm", "tc4", "tc2.5", "tc0.5-lm", "tc8", "tc1.375"};
  for (int it = 0; it < 12; ++it) {
    const int64_t D = 16 + static_cast<int64_t>(rng() % 90), T = 4 + static_cast<int64_t>(rng() % 300);
    const int64_t cut = 2 + static_cast<int64_t>(rng() % (T - 3));  // fit tokens: at least 2
    const std::vector<int64_t> seq{0, cut, T};
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(T * D));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d)
        x[t * D + d] = static_cast<float>(d) / 3 + std::ldexp(n(rng), -static_cast<int>(d / 16));
    for (const char* s : specs) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " iteration " << it << ": " << s << " on [" << T << ", "
                                        << D << "], fit tokens " << cut);
      const QuantSpec spec = QuantSpec::parse(s);
      const Layout L = layout(spec, D);
      const QuantizedTensor qt = quantize(spec, Target::CKV, x.data(), T, D, seq);
      EXPECT_EQ(qt.storage_bytes(), storage_bytes(spec, Target::CKV, D, seq));
      EXPECT_LE(8 * L.row_code_bytes * 1000, static_cast<int64_t>(spec.rate_milli) * D);  // the rate is kept
      const TcHostTables tab = tc_tables(spec, qt.global, D);
      const std::vector<int> w = tab.widths();
      int64_t sum = 0;
      for (int v : w) sum += v;
      EXPECT_LE(sum, L.code_budget_bits);
      EXPECT_EQ(sum, std::min<int64_t>(L.code_budget_bits, 8 * D)) << "the budget is spent (every variance > 0)";
      std::vector<float> out(x.size());
      dequantize(qt, out.data());
      const bool lm = spec.rule == ScaleRule::GaussianCodebook;
      for (int64_t i = 0; i < D; ++i) {
        const double sc = tab.scale[i], of = tab.offset[i];
        double lo = of, hi = of, half = 0;
        if (w[i] > 0 && !lm) {
          hi = of + sc * ((1 << w[i]) - 1);
          half = sc / 2;
        } else if (w[i] > 0) {
          const std::vector<double>& c = tc_unit_codebook(w[i]);
          lo = of + sc * c.front();
          hi = of + sc * c.back();
          for (size_t j = 0; j + 1 < c.size(); ++j) half = std::max(half, sc * (c[j + 1] - c[j]) / 2 * 1.01);
        }
        for (int64_t t = 0; t < T; ++t) {
          const double v = x[t * D + i], e = std::abs(out[t * D + i] - v);
          const double clip = std::max({0.0, lo - v, v - hi});
          ASSERT_LE(e, std::max(half, clip) + 1e-5 * (std::abs(v) + std::abs(of) + 1) + (lm ? 4e-3 * sc : 0))
              << "token " << t << " component " << i << " width " << w[i];
        }
      }
    }
  }
}

TEST(TransformCoding, KltBasisThenWidthsOnTheComponents) {
  // A rank-2 latent in D = 16 (two directions of variances 100 and 1, a little noise): after its KLT-like basis
  // (the two directions first), tc1 spends 16 bits on the 2 strong components; error far below the
  // per-channel tc1 on the unrotated rows, whose 16 channels all carry energy.
  const int64_t T = 600, D = 16;
  const uint64_t seed = 7;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const std::vector<float> R = haar_orthogonal(D, 3);  // rows orthonormal: the basis
  std::vector<float> x(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t) {
    const float a = 10 * n(rng), b = n(rng);
    for (int64_t d = 0; d < D; ++d) x[t * D + d] = a * R[d] + b * R[D + d] + 0.01f * n(rng);
  }
  const Rotation rot = Rotation::dense(D, R);
  std::vector<float> out(x.size()), plain(x.size());
  const std::vector<int64_t> seq{0, T / 2, T};
  const QuantizedTensor qt =
      quantize_dequantize_rotated(QuantSpec::parse("tc1"), rot, Target::CKV, x.data(), T, D, seq, out.data());
  const std::vector<int> w = tc_tables(qt.spec, qt.global, D).widths();
  EXPECT_GE(w[0], 6) << "seed " << seed;
  EXPECT_GE(w[1], 3) << "seed " << seed;
  (void)quantize_dequantize(QuantSpec::parse("tc1"), Target::CKV, x.data(), T, D, seq, plain.data());
  double e1 = 0, e2 = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e1 += std::pow(out[i] - x[i], 2);
    e2 += std::pow(plain[i] - x[i], 2);
    s += std::pow(x[i], 2);
  }
  EXPECT_LT(std::sqrt(e1 / s), 0.05) << "seed " << seed;
  EXPECT_LT(e1, 0.1 * e2) << "seed " << seed;
}

TEST(TransformCoding, SpecsAndErrors) {
  for (const char* s : {"tc3", "tc2-lm", "tc2.5", "tc0.75-lm", "tc8", "tc0.001", "tc7.125"})
    EXPECT_EQ(QuantSpec::parse(s).to_string(), s);
  EXPECT_EQ(QuantSpec::parse("tc2.500").to_string(), "tc2.5");
  EXPECT_EQ(QuantSpec::parse("tc3.0").to_string(), "tc3");
  const QuantSpec q = QuantSpec::parse("tc2.5-lm");
  EXPECT_EQ(q.format, Format::TransformCoding);
  EXPECT_EQ(q.rate_milli, 2500);
  EXPECT_EQ(q.bits, 3);
  EXPECT_EQ(q.rule, ScaleRule::GaussianCodebook);
  EXPECT_EQ(TransformedSpec::parse("klt,tc3").to_string(), "klt,tc3");
  EXPECT_STREQ(family_of(q), "transform-coding");
  struct Bad {
    const char* spec;
    const char* why;
  } bad[] = {{"tc0", "must be > 0"},
             {"tc0.000", "must be > 0"},
             {"tc9", "at most 8 bits"},
             {"tc8.001", "at most 8 bits"},
             {"tc2.5x", "at most 3 decimals"},
             {"tc2.1234", "at most 3 decimals"},
             {"tc", "at most 3 decimals"},
             {"tc.5", "at most 3 decimals"},
             {"tc2.", "at most 3 decimals"},
             {"tc-1", "at most 3 decimals"},
             {"tc3-lm-x", "expected tc<R> or tc<R>-lm"},
             {"tc3-nc", "expected tc<R> or tc<R>-lm"}};
  for (const Bad& b : bad) {
    try {
      (void)QuantSpec::parse(b.spec);
      ADD_FAILURE() << b.spec << " parsed";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(b.why), std::string::npos) << b.spec << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("'") + b.spec + "'"), std::string::npos) << e.what();
    }
  }
  QuantSpec hand = QuantSpec::parse("tc3");
  hand.rate_milli = 9000;  // a field parse() never produces
  const std::vector<float> x(64, 1.0f);
  EXPECT_THROW((void)quantize(hand, Target::CKV, x.data(), 2, 32, {{0, 2}}), std::invalid_argument);
  const std::vector<float> big{3e38f, -3e38f, 3e38f, -3e38f, 3e38f, -3e38f, 3e38f, -3e38f};
  try {
    (void)quantize(QuantSpec::parse("tc8"), Target::CKV, big.data(), 8, 1, {{0, 4, 8}});
    FAIL() << "the lowest level, −127.5 steps of 0.031·3e38, overflows float32";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("component 0"), std::string::npos) << e.what();
  }
}

}  // namespace
