// The codebook families (kFormats rows of storage TurboQuant, LloydMax and TransformCoding, every example spec)
// on the vectorized rows (CpuKernel::Avx2, quant/src/cpu/codebook_avx2.cpp) against the scalar element math
// (CpuKernel::Reference), byte for byte: codes, row scales, fitted record, decoded floats (bit patterns) and the
// error message; and fit once, encode fast (latentq/fitted.h): encode(fit_quantizer(X), X) is quantize(X), and
// decode(fit) is dequantize(). Random shapes (D not a multiple of 8 included) with fixed seeds, printed on
// failure with the spec and shape; edge inputs coded with a fit of other data: values on the midpoints and one
// ulp either side (a tie goes to the upper centroid), signed zeros, half steps of the uniform codes, zero rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "latentq/fitted.h"
#include "latentq/quantize.h"
#include "latentq/turboquant.h"

namespace {
using namespace latentq;

std::vector<std::string> codebook_specs() {
  std::vector<std::string> out;
  for (const FormatTraits& f : kFormats)
    if (f.storage == Storage::TurboQuant || f.storage == Storage::LloydMax || f.storage == Storage::TransformCoding)
      for (const char* s : f.examples) out.emplace_back(s);
  return out;
}

std::vector<CpuKernel> fast_kernels() {
  std::vector<CpuKernel> k;
  for (CpuKernel c : available_cpu_kernels())
    if (c != CpuKernel::Reference) k.push_back(c);
  return k;
}

struct Coded {
  std::optional<QuantizedTensor> q;
  std::vector<uint32_t> decoded;  // bit patterns
  std::string error;
};

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

// quantize() then dequantize() on kernel k; with a fit: fit_quantizer(fit_x), encode(X) and decode(fit).
Coded code(CpuKernel k, const std::string& spec, const std::vector<float>& x, int64_t T, int64_t D,
           const std::vector<float>* fit_x = nullptr, int64_t fit_T = 0) {
  const ScopedCpuKernel scope(k);
  Coded r;
  try {
    std::vector<float> out(static_cast<size_t>(T * D));
    if (fit_x == nullptr) {
      r.q = quantize(QuantSpec::parse(spec), Target::CKV, x.data(), T, D, std::vector<int64_t>{0, T});
      dequantize(*r.q, out.data());
    } else {
      const QuantFit fit =
          fit_quantizer(QuantSpec::parse(spec), Target::CKV, fit_x->data(), fit_T, D, std::vector<int64_t>{0, fit_T});
      r.q = encode(fit, x.data(), T, std::vector<int64_t>{0, T});
      decode(fit, *r.q, out.data());
      // encode_into a tensor of this shape whose bytes are 0xA5: every code byte is written again
      QuantizedTensor reused = *r.q;
      std::fill(reused.codes.begin(), reused.codes.end(), uint8_t{0xA5});
      encode_into(reused, fit, x.data(), T, std::vector<int64_t>{0, T});
      EXPECT_EQ(reused.codes, r.q->codes) << spec << ": encode_into a reused tensor";
    }
    r.decoded = bits_of(out);
  } catch (const std::invalid_argument& e) {
    r.error = e.what();
  }
  return r;
}

void expect_same(const Coded& a, const Coded& b, const std::string& what) {
  ASSERT_EQ(a.error, b.error) << what;
  if (!a.q) return;
  ASSERT_TRUE(b.q.has_value()) << what;
  EXPECT_EQ(a.q->spec, b.q->spec) << what;
  EXPECT_EQ(a.q->codes, b.q->codes) << what << ": codes";
  EXPECT_EQ(a.q->scales, b.q->scales) << what << ": scales";
  EXPECT_EQ(a.q->global, b.q->global) << what << ": global";
  EXPECT_EQ(a.decoded, b.decoded) << what << ": decoded";
}

// Latent-like rows: per-column scale and offset, a few outliers; seeded.
std::vector<float> random_rows(uint64_t seed, int64_t T, int64_t D) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> sc(static_cast<size_t>(D)), off(static_cast<size_t>(D)), x(static_cast<size_t>(T * D));
  for (int64_t d = 0; d < D; ++d) sc[d] = std::exp(0.7f * nd(rng)), off[d] = 0.2f * nd(rng);
  for (int64_t i = 0; i < T * D; ++i) x[i] = nd(rng) * sc[i % D] + off[i % D];
  for (int64_t k = 0; k < T * D / 50; ++k) x[rng() % (T * D)] *= 20.0f;
  return x;
}

TEST(Fitted, VectorizedRowsGiveTheReferenceBytesOnRandomShapes) {
  const int64_t shapes[][2] = {{1, 16},  {7, 48},  {9, 576}, {17, 512}, {33, 64},
                               {5, 100}, {12, 13}, {64, 80}, {3, 96},   {10, 128}};
  for (const std::string& spec : codebook_specs())
    for (const auto& [T, D] : shapes)
      for (uint64_t seed : {1u, 2u}) {
        const std::vector<float> x = random_rows(seed * 1000 + static_cast<uint64_t>(T * D), T, D);
        const std::string what =
            spec + " seed " + std::to_string(seed) + " [" + std::to_string(T) + ", " + std::to_string(D) + "]";
        const Coded ref = code(CpuKernel::Reference, spec, x, T, D);
        for (CpuKernel k : fast_kernels()) expect_same(ref, code(k, spec, x, T, D), what);
        set_cpu_stream_min_bytes(0);  // the decoders' non-temporal stores (large outputs)
        for (CpuKernel k : fast_kernels()) expect_same(ref, code(k, spec, x, T, D), what + ", streamed");
        set_cpu_stream_min_bytes(-1);
      }
}

TEST(Fitted, EncodeOfTheFitIsQuantizeAndDecodeIsDequantize) {
  for (const std::string& spec : codebook_specs())
    for (const auto& [T, D] : {std::pair<int64_t, int64_t>{21, 576}, {8, 40}})
      for (CpuKernel k : available_cpu_kernels()) {
        const std::vector<float> x = random_rows(77, T, D);
        const std::string what = spec + " seed 77 [" + std::to_string(T) + ", " + std::to_string(D) + "] kernel " +
                                 std::to_string(static_cast<int>(k));
        expect_same(code(k, spec, x, T, D), code(k, spec, x, T, D, &x, T), what);
      }
}

// Values at the stored midpoints of each lm codebook and one float32 ulp either side, signed zeros, the
// centroids themselves: coded with a fit of random data, every kernel gives the reference's bytes, and a value
// on a midpoint decodes to the upper centroid.
TEST(Fitted, LloydMaxMidpointTiesGiveTheReferenceBytes) {
  for (const std::string& spec : codebook_specs()) {
    if (QuantSpec::parse(spec).format != Format::LloydMax) continue;
    const int64_t D = 37, fitT = 40;
    const std::vector<float> fx = random_rows(5, fitT, D);
    const QuantFit fit =
        fit_quantizer(QuantSpec::parse(spec), Target::CKV, fx.data(), fitT, D, std::vector<int64_t>{0, fitT});
    const int L = fit.lm.levels;
    std::vector<float> x;  // row r: for every column d, candidate r of its codebook
    std::vector<std::vector<float>> cand(static_cast<size_t>(D));
    for (int64_t d = 0; d < D; ++d) {
      const int64_t g = d / fit.lm.width;
      for (int j = 0; j + 1 < L; ++j) {
        const float m = fit.lm.midpoint[g * (L - 1) + j];
        cand[d].insert(cand[d].end(), {m, std::nextafter(m, -INFINITY), std::nextafter(m, INFINITY)});
      }
      for (int j = 0; j < L; ++j) cand[d].push_back(fit.lm.centroid[g * L + j]);
      cand[d].insert(cand[d].end(), {0.0f, -0.0f, 1e30f, -1e30f});
    }
    const int64_t T = static_cast<int64_t>(cand[0].size());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) x.push_back(cand[d][t]);
    const Coded ref = code(CpuKernel::Reference, spec, x, T, D, &fx, fitT);
    ASSERT_TRUE(ref.q.has_value()) << spec << ": " << ref.error;
    for (int64_t d = 0; d < D; ++d) {  // row 0: the first midpoint exactly → centroid 1
      const int64_t g = d / fit.lm.width;
      EXPECT_EQ(ref.decoded[d], bits_of({fit.lm.centroid[g * L + 1]})[0]) << spec << " column " << d;
    }
    for (CpuKernel k : fast_kernels()) expect_same(ref, code(k, spec, x, T, D, &fx, fitT), spec + " ties");
  }
}

// tc: values at the half steps offset + (k + ½)·scale of every component and one ulp either side (RNE ties),
// beyond the clip, and the offset itself; tq: zero rows (norm 0), rows of one non-zero value, constant rows
// (rotated coordinates at exactly 0 and on the Hadamard's ±n/√block).
TEST(Fitted, TransformCodingHalfStepsAndTurboQuantEdgeRowsGiveTheReferenceBytes) {
  for (const std::string& spec : codebook_specs()) {
    const QuantSpec s = QuantSpec::parse(spec);
    if (s.format == Format::TransformCoding) {
      const int64_t D = 29, fitT = 64;
      const std::vector<float> fx = random_rows(9, fitT, D);
      const QuantFit fit = fit_quantizer(s, Target::CKV, fx.data(), fitT, D, std::vector<int64_t>{0, fitT});
      std::vector<float> x;
      const int64_t T = 3 * 6 + 3;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d) {
          const float sc = fit.tc.scale[d], of = fit.tc.offset[d];
          const float h = of + (static_cast<float>(t / 3) + 0.5f) * sc;
          x.push_back(t >= 18      ? (t == 18   ? of
                                      : t == 19 ? of + 1e3f * sc
                                                : of - 1e3f * sc)
                      : t % 3 == 0 ? h
                      : t % 3 == 1 ? std::nextafter(h, -INFINITY)
                                   : std::nextafter(h, INFINITY));
        }
      const Coded ref = code(CpuKernel::Reference, spec, x, T, D, &fx, fitT);
      ASSERT_TRUE(ref.q.has_value()) << spec << ": " << ref.error;
      for (CpuKernel k : fast_kernels()) expect_same(ref, code(k, spec, x, T, D, &fx, fitT), spec + " half steps");
    } else if (s.format == Format::TurboQuant) {
      const int64_t D = 576, T = 11;
      std::vector<float> x(static_cast<size_t>(T * D), 0.0f);
      for (int64_t d = 0; d < D; ++d) {
        x[1 * D + d] = d == 3 ? -2.5f : 0.0f;
        x[2 * D + d] = 1.0f;
        x[3 * D + d] = d % 64 < 32 ? 0.75f : -0.75f;
        x[4 * D + d] = -0.0f;
        for (int64_t t = 5; t < T; ++t) x[t * D + d] = static_cast<float>((d * 7 + t) % 5) - 2.0f;
      }
      const Coded ref = code(CpuKernel::Reference, spec, x, T, D);
      ASSERT_TRUE(ref.q.has_value()) << spec << ": " << ref.error;
      for (CpuKernel k : fast_kernels()) expect_same(ref, code(k, spec, x, T, D), spec + " edge rows");
    }
  }
}

// tc-lm: for every component, u = (x − offset)/scale on each midpoint of its width's codebook (x = offset +
// m·scale) and one ulp either side, the offset, clips (±1e3·scale), ±0; widths 0 to 8 (tc0.75-lm, tc2-lm,
// tc6-lm); D = 43 (five groups of eight and a tail), T a multiple of 8 plus a tail of rows. Then the same rows
// with a hand-made record whose scales are 0, −0, NaN and tiny in four components (u = 0, or NaN). Every kernel
// gives the reference's bytes, and where u lands exactly on a midpoint m_j the value decodes to centroid j + 1.
TEST(Fitted, TransformCodingLloydMaxMidpointsWidthsAndScalesGiveTheReferenceBytes) {
  for (const char* spec : {"tc0.75-lm", "tc2-lm", "tc6-lm"}) {
    const int64_t D = 43, fitT = 96;
    const std::vector<float> fx = random_rows(11, fitT, D);
    const QuantFit fit =
        fit_quantizer(QuantSpec::parse(spec), Target::CKV, fx.data(), fitT, D, std::vector<int64_t>{0, fitT});
    const std::vector<int> w = fit.tc.widths();
    std::vector<std::vector<float>> cand(static_cast<size_t>(D));
    for (int64_t d = 0; d < D; ++d) {
      const float sc = fit.tc.scale[d], of = fit.tc.offset[d];
      cand[d] = {of, of + 1e3f * sc, of - 1e3f * sc, 0.0f, -0.0f};
      if (w[d] == 0) continue;
      for (int j = 0; j + 1 < (1 << w[d]); ++j) {
        const float x = of + fit.tc.midpoint[qmath::tc_midpoint_base(w[d]) + j] * sc;
        cand[d].insert(cand[d].end(), {x, std::nextafter(x, -INFINITY), std::nextafter(x, INFINITY)});
      }
    }
    size_t rows = 0;
    for (const auto& c : cand) rows = std::max(rows, c.size());
    const int64_t T = static_cast<int64_t>(rows / 8 * 8 + 8 + 5);  // ≥ 8 rows beyond the longest list
    std::vector<float> x;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) x.push_back(cand[d][static_cast<size_t>(t) % cand[d].size()]);
    const Coded ref = code(CpuKernel::Reference, spec, x, T, D, &fx, fitT);
    ASSERT_TRUE(ref.q.has_value()) << spec << ": " << ref.error;
    int ties = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) {
        const float sc = fit.tc.scale[d], of = fit.tc.offset[d], u = (x[t * D + d] - of) / sc;
        for (int j = 0; w[d] > 0 && j + 1 < (1 << w[d]); ++j)
          if (u == fit.tc.midpoint[qmath::tc_midpoint_base(w[d]) + j]) {
            const float c = fit.tc.centroid[qmath::tc_centroid_base(w[d]) + j + 1];
            EXPECT_EQ(ref.decoded[t * D + d], bits_of({of + sc * c})[0]) << spec << " row " << t << " component " << d;
            ++ties;
            break;
          }
      }
    EXPECT_GT(ties, 10) << spec << ": too few values on a midpoint to test the ties";
    for (CpuKernel k : fast_kernels())
      expect_same(ref, code(k, spec, x, T, D, &fx, fitT), std::string(spec) + " edges");
    set_cpu_stream_min_bytes(0);  // the decode's non-temporal stores (large outputs)
    for (CpuKernel k : fast_kernels())
      expect_same(ref, code(k, spec, x, T, D, &fx, fitT), std::string(spec) + " edges, streamed");
    set_cpu_stream_min_bytes(-1);

    // scales 0, −0, NaN and 1e-38 in components 0, 9, 17 and 42 (a hand-made record, read back by fit_of)
    QuantizedTensor q = *ref.q;
    for (const auto& [d, s] : {std::pair<int64_t, float>{0, 0.0f}, {9, -0.0f}, {17, NAN}, {42, 1e-38f}})
      std::memcpy(q.global.data() + D + 4 * d, &s, 4);
    const QuantFit odd = fit_of(q);
    std::vector<std::vector<uint32_t>> decoded;
    std::vector<std::vector<uint8_t>> codes;
    for (CpuKernel k : available_cpu_kernels()) {
      const ScopedCpuKernel scope(k);
      const QuantizedTensor e = encode(odd, x.data(), T, std::vector<int64_t>{0, T});
      std::vector<float> out(static_cast<size_t>(T * D));
      decode(odd, e, out.data());
      codes.push_back(e.codes);
      decoded.push_back(bits_of(out));
    }
    for (size_t k = 1; k < codes.size(); ++k) {
      EXPECT_EQ(codes[k], codes[0]) << spec << " odd scales: codes, kernel " << k;
      EXPECT_EQ(decoded[k], decoded[0]) << spec << " odd scales: decoded, kernel " << k;
    }
  }
}

TEST(Fitted, ErrorsAreQuantizesOnEveryKernel) {
  for (const std::string& spec : codebook_specs()) {
    std::vector<float> x = random_rows(3, 16, 48);
    x[5 * 48 + 7] = NAN;
    x[9 * 48 + 1] = INFINITY;
    const Coded ref = code(CpuKernel::Reference, spec, x, 16, 48);
    EXPECT_NE(ref.error.find("2 NaN/Inf values in the [16, 48] input"), std::string::npos) << spec << ": " << ref.error;
    for (CpuKernel k : fast_kernels()) expect_same(ref, code(k, spec, x, 16, 48), spec + " NaN/Inf");
    const std::vector<float> big(static_cast<size_t>(8 * 48), 1e5f);  // tq: a row norm beyond fp16
    for (CpuKernel k : fast_kernels())
      expect_same(code(CpuKernel::Reference, spec, big, 8, 48), code(k, spec, big, 8, 48), spec + " overflow");
  }
}

// encode() checks NaN/Inf in its own pass (lm, Avx2): the message of quantize(), before a bad seq_offsets.
TEST(Fitted, EncodeReportsNaNInfAsQuantizeDoes) {
  const std::vector<float> fx = random_rows(4, 16, 44);
  const std::vector<int64_t> seqs{0, 16};
  for (const std::string& spec : codebook_specs())
    for (const int64_t at : {int64_t{0}, int64_t{5 * 44 + 43}, int64_t{15 * 44 + 41}}) {  // vector lanes and the tail
      std::vector<float> x = random_rows(6, 16, 44);
      x[at] = at % 2 ? -INFINITY : NAN;
      for (CpuKernel k : available_cpu_kernels()) {
        const ScopedCpuKernel scope(k);
        const QuantFit fit = fit_quantizer(QuantSpec::parse(spec), Target::CKV, fx.data(), 16, 44, seqs);
        const std::string what =
            spec + " NaN/Inf at " + std::to_string(at) + " kernel " + std::to_string(static_cast<int>(k));
        QuantizedTensor q;
        try {
          encode_into(q, fit, x.data(), 16, seqs);
          ADD_FAILURE() << what << ": no error";
        } catch (const std::invalid_argument& e) {
          EXPECT_STREQ(e.what(), "1 NaN/Inf values in the [16, 44] input") << what;
        }
        EXPECT_TRUE(q.codes.empty()) << what << ": encode_into left a tensor after an error";
        EXPECT_THROW(
            {
              try {
                (void)encode(fit, x.data(), 16, std::vector<int64_t>{0, 17});
              } catch (const std::invalid_argument& e) {
                EXPECT_STREQ(e.what(), "1 NaN/Inf values in the [16, 44] input") << what << " and bad seq_offsets";
                throw;
              }
            },
            std::invalid_argument);
      }
    }
}

// The least float d with d / s ≥ m (s > 0 finite), by a binary search over the floats ordered as integers.
float least_quotient_at_least(float m, float s) {
  auto value = [](int64_t k) {
    const uint32_t b = k < 0 ? static_cast<uint32_t>(-(k + 1)) | 0x80000000u : static_cast<uint32_t>(k);
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  int64_t lo = -0x7f800001, hi = 0x7f800000;  // −Inf, +Inf
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (value(mid) / s >= m)
      hi = mid;
    else
      lo = mid + 1;
  }
  return value(hi);
}

// tc-lm's Avx2 encode compares x − offset with a threshold per midpoint instead of dividing: a hand-made record with
// offsets 0 (so that x is x − offset) and scales from 1e-40 (subnormal quotients) to 1e30, and for every midpoint
// m_j of a component the least x with x / scale ≥ m_j, and one and two ulps either side. Every kernel gives the
// reference's bytes, and the least x codes one above its lower neighbour.
TEST(Fitted, TransformCodingLloydMaxThresholdsGiveTheReferenceBytes) {
  for (const char* spec : {"tc0.75-lm", "tc2-lm", "tc6-lm"}) {
    const int64_t D = 43, fitT = 96;
    const std::vector<float> fx = random_rows(12, fitT, D);
    const QuantFit fit =
        fit_quantizer(QuantSpec::parse(spec), Target::CKV, fx.data(), fitT, D, std::vector<int64_t>{0, fitT});
    QuantizedTensor q = encode(fit, fx.data(), fitT, std::vector<int64_t>{0, fitT});
    const float scales[] = {1e-40f, 1e-30f, 3e-5f, 0.37f, 1.0f, 2.5f, 1e30f};
    for (int64_t d = 0; d < D; ++d) {
      const float s = scales[d % 7], zero = 0.0f;
      std::memcpy(q.global.data() + D + 4 * d, &s, 4);
      std::memcpy(q.global.data() + 5 * D + 4 * d, &zero, 4);
    }
    const QuantFit odd = fit_of(q);
    const std::vector<int> w = odd.tc.widths();
    std::vector<std::vector<float>> cand(static_cast<size_t>(D));
    std::vector<std::vector<bool>> least(static_cast<size_t>(D));
    for (int64_t d = 0; d < D; ++d) {
      cand[d] = {0.0f};
      least[d] = {false};
      for (int j = 0; w[d] > 0 && j + 1 < (1 << w[d]); ++j) {
        const float x = least_quotient_at_least(odd.tc.midpoint[qmath::tc_midpoint_base(w[d]) + j], odd.tc.scale[d]);
        const float below = std::nextafter(x, -INFINITY), above = std::nextafter(x, INFINITY);
        cand[d].insert(cand[d].end(),
                       {below, x, std::nextafter(below, -INFINITY), above, std::nextafter(above, INFINITY)});
        least[d].insert(least[d].end(), {false, true, false, false, false});
      }
    }
    size_t rows = 0;
    for (const auto& c : cand) rows = std::max(rows, c.size());
    const int64_t T = static_cast<int64_t>(rows / 8 * 8 + 8 + 3);
    std::vector<float> x;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) x.push_back(cand[d][static_cast<size_t>(t) % cand[d].size()]);
    std::vector<QuantizedTensor> coded;
    for (CpuKernel k : available_cpu_kernels()) {
      const ScopedCpuKernel scope(k);
      coded.push_back(encode(odd, x.data(), T, std::vector<int64_t>{0, T}));
    }
    for (size_t k = 1; k < coded.size(); ++k) EXPECT_EQ(coded[k].codes, coded[0].codes) << spec << ", kernel " << k;
    // the reference's decoded values: the least x decodes above the x one ulp below it (row t − 1 holds that x)
    std::vector<float> out(static_cast<size_t>(T * D));
    decode(odd, coded[0], out.data());
    int steps = 0;
    for (int64_t t = 1; t < T && t < static_cast<int64_t>(rows); ++t)
      for (int64_t d = 0; d < D; ++d)
        if (static_cast<size_t>(t) < cand[d].size() && least[d][t]) {
          EXPECT_GT(out[t * D + d], out[(t - 1) * D + d]) << spec << " row " << t << " component " << d;
          ++steps;
        }
    EXPECT_GT(steps, 40) << spec << ": too few thresholds tested";
  }
}

// tq at D = 576 (Hadamard blocks of 64: y = (x / (n + 1e-8)) · 1/8 where a block holds one non-zero x): rows whose
// rotated coordinates land on every midpoint m_j of the codebook and within 8 ulps either side (x_0 = a stepped
// ulp by ulp around 8·m_j, x_64 = √(1 − 64·m_j²)), 16 rows at a time on Avx2 (the codes by a binary search over the
// midpoints, packed eight groups at once). Every kernel gives the reference's bytes, and a coordinate on m_j codes
// as j + 1 (a tie goes up).
TEST(Fitted, TurboQuantCoordinatesOnTheMidpointsGiveTheReferenceBytes) {
  const int64_t D = 576;
  for (const char* spec : {"tq2", "tq3", "tq4-nc"}) {
    const QuantSpec s = QuantSpec::parse(spec);
    const qmath::TqCodebook& cb = tq_codebook(D, s.bits);
    std::vector<float> x;
    std::vector<float> y0;  // the rotated coordinate of block 0 of each row, as the scalar math gives it
    for (int j = 0; j + 1 < cb.levels; ++j) {
      float a = 8.0f * cb.midpoint[j];
      const float b = std::sqrt(1.0f - a * a);
      for (int k = 0; k < 8; ++k) a = std::nextafter(a, -INFINITY);
      for (int k = 0; k <= 16; ++k, a = std::nextafter(a, INFINITY)) {
        std::vector<float> row(static_cast<size_t>(D), 0.0f);
        row[0] = a;
        row[64] = b;
        y0.push_back(qmath::mul_rn(qmath::tq_unit(a, qmath::tq_row_norm(row.data(), static_cast<int>(D))), 0.125f));
        x.insert(x.end(), row.begin(), row.end());
      }
    }
    const int64_t T = static_cast<int64_t>(y0.size());
    const Coded ref = code(CpuKernel::Reference, spec, x, T, D);
    ASSERT_TRUE(ref.q.has_value()) << spec << ": " << ref.error;
    int ties = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j + 1 < cb.levels; ++j)
        if (y0[t] == cb.midpoint[j]) {
          // code 0 of the row: the low s.bits bits of its first byte
          EXPECT_EQ(ref.q->codes[t * ref.q->row_bytes()] & ((1 << s.bits) - 1), j + 1) << spec << " row " << t;
          ++ties;
        }
    EXPECT_GE(ties, cb.levels / 2) << spec << ": too few coordinates on a midpoint to test the ties";
    for (CpuKernel k : fast_kernels()) expect_same(ref, code(k, spec, x, T, D), std::string(spec) + " on midpoints");
  }
}

// tq on Avx2 checks NaN/Inf in its norm pass: a row norm beyond fp16 in row 1 and a NaN in row 13 (and an Inf in
// row 13 alone) still report the NaN/Inf, with quantize()'s count, on every kernel; an overflow alone its own error.
TEST(Fitted, TurboQuantReportsNaNInfBeforeANormOverflow) {
  const int64_t T = 16, D = 64;
  for (const char* spec : {"tq3", "tq4-nc"})
    for (const float bad : {NAN, INFINITY}) {
      std::vector<float> x = random_rows(8, T, D);
      for (int64_t d = 0; d < D; ++d) x[1 * D + d] = 1e5f;  // norm 8e5 > 65504
      x[13 * D + 5] = bad;
      std::vector<float> over = x;
      over[13 * D + 5] = 0.0f;
      for (CpuKernel k : available_cpu_kernels()) {
        const ScopedCpuKernel scope(k);
        const std::string what = std::string(spec) + " kernel " + std::to_string(static_cast<int>(k));
        try {
          (void)quantize(QuantSpec::parse(spec), Target::CKV, x.data(), T, D, std::vector<int64_t>{0, T});
          ADD_FAILURE() << what << ": no error";
        } catch (const std::invalid_argument& e) {
          EXPECT_STREQ(e.what(), "1 NaN/Inf values in the [16, 64] input") << what;
        }
        try {
          (void)quantize(QuantSpec::parse(spec), Target::CKV, over.data(), T, D, std::vector<int64_t>{0, T});
          ADD_FAILURE() << what << ": no error for the overflow";
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("of token 1 overflows the fp16 storage"), std::string::npos)
              << what << ": " << e.what();
        }
      }
    }
}

TEST(Fitted, DecodeRefusesATensorOfAnotherFit) {
  const std::vector<float> a = random_rows(1, 16, 48), b = random_rows(2, 16, 48);
  const std::vector<int64_t> seqs{0, 16};
  const QuantSpec spec = QuantSpec::parse("lm3-channel");
  const QuantFit fa = fit_quantizer(spec, Target::CKV, a.data(), 16, 48, seqs);
  const QuantFit fb = fit_quantizer(spec, Target::CKV, b.data(), 16, 48, seqs);
  const QuantizedTensor q = encode(fb, a.data(), 16, seqs);
  std::vector<float> out(16 * 48);
  EXPECT_THROW(decode(fa, q, out.data()), std::invalid_argument);
  EXPECT_NO_THROW(decode(fit_of(q), q, out.data()));
  EXPECT_NE(q.codes, quantize(spec, Target::CKV, a.data(), 16, 48, seqs).codes)
      << "a fit of other data gave quantize()'s codes: the test data do not tell the fits apart";
}

}  // namespace
