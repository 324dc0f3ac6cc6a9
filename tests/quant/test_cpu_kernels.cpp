// The fused integer kernels (CpuKernel::Baseline, CpuKernel::Avx2, and both with 2 threads) against the
// reference loops (CpuKernel::Reference), byte for byte: codes, scales, offsets, group bounds, decoded
// floats (bit patterns), and the exception message for bad input. Random inputs with fixed seeds (the
// seed, spec and shape are printed on failure) and edge inputs (signed zeros, constant groups, ties
// at half steps, subnormals, fp16 overflow, NaN/Inf at every position class).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "latentq/qmath.h"
#include "latentq/quantize.h"

namespace {
using namespace latentq;

struct Result {
  std::optional<QuantizedTensor> q;
  std::vector<uint32_t> decoded;  // bit patterns
  std::string error;
};

// One fast-kernel configuration: kernel, threads, the non-temporal store threshold (set_cpu_stream_min_bytes:
// 0 streams every output, -1 the default 4 MiB) and whether quantize_into() fills a reused tensor.
struct Config {
  CpuKernel kernel;
  int threads;
  int64_t stream_min;
  bool into;
};

Result run(const Config& c, const std::string& spec, const std::vector<float>& x, int64_t T, int64_t D,
           const std::vector<int64_t>& seqs) {
  set_cpu_kernel(c.kernel);
  set_cpu_threads(c.threads);
  set_cpu_stream_min_bytes(c.stream_min);
  Result r;
  QuantizedTensor reused;
  if (c.into) {  // a tensor of this spec and shape from other data, its bytes then overwritten with 0xA5:
                 // every byte the kernel does not write would show
    std::vector<float> other(x.rbegin(), x.rend());
    try {
      quantize_into(reused, QuantSpec::parse(spec), Target::CKV, other.data(), T, D, seqs);
    } catch (const std::invalid_argument&) {
      EXPECT_EQ(reused.rows, 0) << spec << ": quantize_into left a tensor after an error";
      EXPECT_TRUE(reused.codes.empty()) << spec;
    }
    for (std::vector<uint8_t>* v : {&reused.codes, &reused.scales, &reused.offsets})
      std::fill(v->begin(), v->end(), 0xA5);
  }
  try {
    if (c.into) {
      quantize_into(reused, QuantSpec::parse(spec), Target::CKV, x.data(), T, D, seqs);
      r.q = reused;
    } else {
      r.q = quantize(QuantSpec::parse(spec), Target::CKV, x.data(), T, D, seqs);
    }
    // decoded one float past a 32-byte boundary when streaming: the peel before the aligned stores runs
    std::vector<float> out(static_cast<size_t>(T * D) + 8);
    float* o = out.data() + (c.stream_min == 0 ? 1 : 0);
    dequantize(*r.q, o);
    r.decoded.resize(static_cast<size_t>(T * D));
    std::memcpy(r.decoded.data(), o, r.decoded.size() * 4);
  } catch (const std::invalid_argument& e) {
    r.error = e.what();
    if (c.into) {
      EXPECT_EQ(reused.rows, 0) << spec << ": quantize_into left a tensor after an error";
      EXPECT_TRUE(reused.codes.empty() && reused.scales.empty()) << spec;
    }
  }
  set_cpu_kernel(CpuKernel::Auto);
  set_cpu_threads(1);
  set_cpu_stream_min_bytes(-1);
  return r;
}

std::vector<Config> fast_kernels() {
  std::vector<Config> k = {
      {CpuKernel::Baseline, 1, -1, false}, {CpuKernel::Baseline, 2, -1, false}, {CpuKernel::Baseline, 1, 0, true}};
  if (available_cpu_kernels().back() == CpuKernel::Avx2) {  // else the Baseline kernels are still compared
    k.push_back({CpuKernel::Avx2, 1, -1, false});
    k.push_back({CpuKernel::Avx2, 2, -1, false});
    k.push_back({CpuKernel::Avx2, 1, 0, true});
    k.push_back({CpuKernel::Avx2, 2, 0, false});
  }
  return k;
}

void expect_same(const std::string& spec, const std::vector<float>& x, int64_t T, int64_t D,
                 const std::vector<int64_t>& seqs, const std::string& what) {
  const Result ref = run({CpuKernel::Reference, 1, -1, false}, spec, x, T, D, seqs);
  for (const Config& c : fast_kernels()) {
    const Result got = run(c, spec, x, T, D, seqs);
    const std::string ctx = spec + " [" + std::to_string(T) + ", " + std::to_string(D) + "] " + what + " kernel " +
                            std::to_string(static_cast<int>(c.kernel)) + " threads " + std::to_string(c.threads) +
                            " stream_min " + std::to_string(c.stream_min) + (c.into ? " quantize_into" : "");
    ASSERT_EQ(got.error, ref.error) << ctx;
    if (!ref.q) continue;
    ASSERT_TRUE(got.q.has_value()) << ctx;
    EXPECT_EQ(got.q->codes, ref.q->codes) << ctx;
    EXPECT_EQ(got.q->scales, ref.q->scales) << ctx;
    EXPECT_EQ(got.q->offsets, ref.q->offsets) << ctx;
    EXPECT_EQ(got.q->group_bounds, ref.q->group_bounds) << ctx;
    EXPECT_EQ(got.decoded, ref.decoded) << ctx;
  }
}

std::vector<std::string> int_specs() {
  std::vector<std::string> s;
  for (const char* g : {"tensor", "channel", "channel-g32", "channel-g7", "token", "token-g32", "token-g7"})
    for (const int bits : {8, 4, 2})
      for (const char* sch : {"sym", "asym"})
        for (const char* dt : {"", "-fp32"}) s.push_back("int" + std::to_string(bits) + "-" + sch + "-" + g + dt);
  return s;
}

TEST(CpuKernels, RandomInputsGiveTheReferenceBytes) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},    {3, 7},   {40, 33}, {97, 576},
                                                           {64, 512}, {1, 577}, {33, 45}};
  uint64_t seed = 100;
  for (const auto& [T, D] : shapes)
    for (const std::string& spec : int_specs()) {
      std::mt19937_64 rng(++seed);
      std::normal_distribution<float> N;
      std::vector<float> x(static_cast<size_t>(T * D));
      for (float& v : x) v = N(rng) * 3.0f + 0.5f;
      const std::vector<int64_t> seqs = T > 10 ? std::vector<int64_t>{0, T / 3, T} : std::vector<int64_t>{0, T};
      expect_same(spec, x, T, D, seqs, "seed " + std::to_string(seed));
    }
}

// 2^20+ elements: the threaded split is used (tensor: ranges of elements; channel: token groups; token: rows).
TEST(CpuKernels, LargeInputsSplitAcrossThreadsGiveTheReferenceBytes) {
  const int64_t T = 2053, D = 576;  // 1,182,528 elements, T odd
  std::mt19937_64 rng(7);
  std::normal_distribution<float> N;
  std::vector<float> x(static_cast<size_t>(T * D));
  for (size_t i = 0; i < x.size(); ++i) x[i] = N(rng) * (1.0f + static_cast<float>(i % D) / 64.0f);
  for (const char* spec : {"int4-asym-tensor", "int8-sym-tensor", "int4-asym-channel-g32", "int2-asym-channel",
                           "int4-asym-token-g32", "int8-sym-token", "int2-sym-channel-g32-fp32"})
    expect_same(spec, x, T, D, {0, 1000, T}, "seed 7");
}

// int8 codes of exactly 32 MiB (65,536 x 512): quantize() allocates the code buffer anew and advises it for
// huge pages before its zero fill (quant/src/cpu assign_zeroed), quantize_into() on the reused tensor of
// expect_same does not; both must give the reference bytes (int8 rows have no padding, so this checks that
// the branch runs and keeps every code, not the zero fill of pad bits).
TEST(CpuKernels, CodeBuffersOf32MiBGiveTheReferenceBytes) {
  const int64_t T = 65536, D = 512;
  std::mt19937_64 rng(29);
  std::normal_distribution<float> N;
  std::vector<float> x(static_cast<size_t>(T * D));
  for (float& v : x) v = N(rng);
  expect_same("int8-asym-token", x, T, D, {0, 40000, T}, "seed 29");
}

// Two shapes: [48, 40], and [20, 300], whose rows hold eight full groups of 32 columns (the Avx2 kernel folds
// those eight together, quant/src/cpu/int_fused.h group_minmax_avx2) and a last group of 12 (read with overlapping
// loads).
TEST(CpuKernels, EdgeInputsGiveTheReferenceBytes) {
  for (const auto& [T, D] : {std::pair<int64_t, int64_t>{48, 40}, std::pair<int64_t, int64_t>{20, 300}}) {
    auto base = [&] {
      std::vector<float> x(static_cast<size_t>(T * D));
      std::mt19937_64 rng(11);
      std::uniform_real_distribution<float> U(0.0f, 4.0f);
      for (float& v : x) v = U(rng);
      return x;
    };
    std::vector<std::pair<std::string, std::vector<float>>> cases;
    {  // signed zeros as the minimum and the maximum, the first zero -0.0 or +0.0, in every group kind
      for (const float first : {-0.0f, 0.0f}) {
        std::vector<float> x = base();
        for (size_t i = 0; i < x.size(); i += 5) x[i] = (i / 5) % 2 ? -first : first;
        cases.push_back({std::string("zeros as min, first ") + (std::signbit(first) ? "-0" : "+0"), x});
        for (float& v : x) v = v == 0.0f ? v : -v;
        cases.push_back({std::string("zeros as max, first ") + (std::signbit(first) ? "-0" : "+0"), x});
      }
    }
    {  // the first zero of a span is not its first element and the eight lanes disagree: -0.0 at i ≡ 3,
       // +0.0 at i ≡ 8 (mod 16), so lane 0 holds +0.0 while the left-to-right fold keeps the -0.0 at i = 3
      std::vector<float> x = base();
      for (size_t i = 0; i < x.size(); ++i)
        if (i % 16 == 3)
          x[i] = -0.0f;
        else if (i % 16 == 8)
          x[i] = 0.0f;
      cases.push_back({"zeros as min, first zero -0 in lane 3", x});
      for (float& v : x) v = v == 0.0f ? v : -v;
      cases.push_back({"zeros as max, first zero -0 in lane 3", x});
    }
    {
      std::vector<float> x(static_cast<size_t>(T * D), 0.0f);
      cases.push_back({"all +0", x});
      for (size_t i = 0; i < x.size(); i += 2) x[i] = -0.0f;
      cases.push_back({"alternating -0/+0", x});
      std::fill(x.begin(), x.end(), 1.25f);
      cases.push_back({"constant", x});
    }
    {  // codes exactly at half steps: x = k/2 over a range [0, 15] -> ties in int4-asym
      std::vector<float> x = base();
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 31) * 0.5f;
      cases.push_back({"half-step ties", x});
    }
    {
      std::vector<float> x = base();
      for (size_t i = 0; i < x.size(); i += 3) x[i] = 1e-40f * static_cast<float>(i % 7);  // float32 subnormals
      cases.push_back({"subnormals", x});
      for (float& v : x) v *= 1e-6f;
      cases.push_back({"tiny range (fp16 scale underflow)", x});
    }
    {
      std::vector<float> x = base();
      x[static_cast<size_t>(T * D / 2)] = 3e5f;  // beyond fp16: the scale or offset overflows in some specs
      x[static_cast<size_t>(T * D / 2 + 1)] = -3e5f;
      cases.push_back({"fp16 overflow", x});
    }
    for (const size_t pos : {size_t{0}, size_t{17}, static_cast<size_t>(T * D - 1)})
      for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()}) {
        std::vector<float> x = base();
        x[pos] = bad;
        cases.push_back({"non-finite " + std::to_string(bad) + " at " + std::to_string(pos), x});
      }
    {  // NaN late and an fp16 overflow early: the NaN message wins, as in the reference
      std::vector<float> x = base();
      x[1] = 1e6f;
      x.back() = std::numeric_limits<float>::quiet_NaN();
      cases.push_back({"overflow then NaN", x});
    }
    for (const auto& [what, x] : cases)
      for (const std::string& spec : int_specs()) expect_same(spec, x, T, D, {0, T * 5 / 12, T}, what);
  }
}

// Quotients (x − offset) / scale exactly at half steps and one ulp either side, for a scale that is not a
// power of two: the codes must be those of the IEEE quotient rounded to nearest, ties to even (an encoder
// that multiplied by a rounded 1/scale, or contracted an FMA, would move some of them; tried on the Avx2
// kernel with a division fallback near half steps, this test failed without the fallback).
// s = 225/1024 is exact in fp16; a group of 7 consecutive tokens or columns holds the min and max of its
// case (positions with (t + d) % 7 == 0 and 3; the shorter last groups of g7 and of the sequences need
// not). asym, min −1 and max −1 + 15·s: int4 stores scale s, and the values −1 + (k + 1/2)·s sit at half
// steps, ± 1 ulp (int2: scale 5·s, a half step when k ≡ 2 mod 5; int8: 15·s/255 is not exact, the
// quotients only come near). sym, absmax Q·s: the spec with qmax = Q (127, 7, 1) stores scale s and the
// values ±(k + 1/2)·s sit at its half steps; the other bit widths see them as ordinary values.
TEST(CpuKernels, QuotientsAtAndNextToHalfStepsGiveTheReferenceBytes) {
  const int64_t T = 48, D = 40;
  const float s = 225.0f / 1024.0f;
  std::mt19937_64 rng(23);
  std::vector<std::pair<std::string, std::vector<float>>> cases;
  auto make = [&](float lo, float hi, int levels, float base) {
    std::vector<float> x(static_cast<size_t>(T * D));
    std::uniform_int_distribution<int> K(0, levels - 1), J(-1, 1), sign(0, 1);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) {
        float& v = x[static_cast<size_t>(t * D + d)];
        const int64_t r = (t + d) % 7;
        if (r == 0)
          v = lo;
        else if (r == 3)
          v = hi;
        else {
          v = base + (static_cast<float>(K(rng)) + 0.5f) * s;  // exact: small odd multiples of s/2 plus base
          if (base == 0.0f && sign(rng)) v = -v;
          for (int j = J(rng); j != 0; j += j > 0 ? -1 : 1) v = std::nextafter(v, j > 0 ? 10.0f * hi : -10.0f * hi);
        }
      }
    return x;
  };
  cases.push_back({"asym: min -1, max -1 + 15 s", make(-1.0f, -1.0f + 15.0f * s, 15, -1.0f)});
  for (const int Q : {127, 7, 1})
    cases.push_back({"sym: absmax " + std::to_string(Q) + " s",
                     make(static_cast<float>(Q) * s, -static_cast<float>(Q) * s, Q, 0.0f)});
  for (const auto& [what, x] : cases)
    for (const std::string& spec : int_specs()) expect_same(spec, x, T, D, {0, 20, T}, what + ", seed 23");
}

// fp16 scales and offsets at fp16 rounding ties, one float32 ulp either side, and across the normal and
// subnormal fp16 range: the Avx2 kernel converts them with vcvtps2ph / vcvtph2ps (quant/src/cpu/int_avx2.cpp
// f16_round_store_avx2, f16_load_avx2), the reference with qmath.h's f32_to_f16_bits / f16_bits_to_f32.
// Group (t, j) of 8 columns holds v at one position and -w at another, the rest inside (-v, w) / 2. v is
// m·Q for Q = 127, 7 or 1 in turn, m the midpoint of two neighbouring fp16 values (h, h + 1), random h, or
// m moved by one float32 ulp (m < 512, so that v / 1 and (v + w) / 3 stay below fp16's 65504): the sym
// spec of qmax Q (int8 / int4 / int2) stores the scale v / Q = m, a tie (or not) that the conversion rounds
// to even; the asym specs store the offset -w (also such a value) and the scale (v + w) / qmax. The channel
// specs see other groups of the same data.
TEST(CpuKernels, Fp16ScalesAtRoundingTiesGiveTheReferenceBytes) {
  const int64_t T = 64, D = 64;
  const uint64_t seed = 31;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> H(0, 0x5fff), J(-1, 1), pos(0, 7);  // m < 512: no spec's scale overflows fp16
  std::uniform_real_distribution<float> U(-0.5f, 0.5f);
  const float Qs[3] = {127.0f, 7.0f, 1.0f};
  int k = 0;
  auto tie_value = [&](bool subnormal) {
    const int h = subnormal ? H(rng) % 0x400 : H(rng);
    float m = 0.5f *
              (qmath::f16_bits_to_f32(static_cast<uint16_t>(h)) + qmath::f16_bits_to_f32(static_cast<uint16_t>(h + 1)));
    if (const int j = J(rng); j != 0) m = std::nextafter(m, j > 0 ? 1e9f : 0.0f);
    return m * Qs[k++ % 3];  // exact for a midpoint m (12 significant bits; Q at most 7); a moved m may round
  };
  std::vector<float> x(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < D / 8; ++j) {
      const bool sub = (t + j) % 4 == 0;
      const float v = tie_value(sub), w = tie_value(!sub);
      const int a = pos(rng), b = (a + 1 + pos(rng) % 7) % 8;
      for (int i = 0; i < 8; ++i) x[static_cast<size_t>(t * D + 8 * j + i)] = std::min(v, w) * U(rng);
      x[static_cast<size_t>(t * D + 8 * j + a)] = v;
      x[static_cast<size_t>(t * D + 8 * j + b)] = -w;
    }
  for (const char* g : {"token-g8", "token", "channel-g8", "channel"})
    for (const int bits : {8, 4, 2})
      for (const char* sch : {"sym", "asym"})
        expect_same("int" + std::to_string(bits) + "-" + sch + "-" + g, x, T, D, {0, 24, T},
                    "seed " + std::to_string(seed));
}

// One tensor reused across specs and shapes (sizes grow, shrink, repeat) and for a non-integer format:
// after each call it equals what quantize() returns for the same arguments.
// The block formats under the fast kernels (rows split across threads; the Avx2 kernel's e4m3 elements,
// decode and max|x|): every engine preset and block kind, random rows and edge rows. In the edge rows each
// block's first element is 448, so every kind's scale is 1 and the other elements are encoded as written:
// every e4m3 value, every midpoint between neighbours and the floats next to it (the RNE ties), the
// subnormal range and the smallest normal, signed zeros and float32 subnormals; the -s1 spec (scale 1
// whatever amax is) also meets 448 .. 470 (saturation at 464). The fp4 kinds likewise with 6 and the e2m1
// values, midpoints and neighbours. And a NaN and an Inf: the same message.
// Every example and engine preset of the format table (latentq/spec.h) whose c_kv is stored in a block format.
std::vector<std::string> block_specs() {
  std::vector<std::string> out;
  for (const std::string& s : format_examples())
    if (traits(QuantSpec::parse(s).stored_for(Target::CKV).format).storage == Storage::Block) out.push_back(s);
  return out;
}

TEST(CpuKernels, BlockFormatsGiveTheReferenceBytes) {
  std::vector<float> edge;
  for (int c = 0; c < 0x7e; ++c) {
    const float v = qmath::e4m3_bits_to_f32(static_cast<uint8_t>(c)),
                w = qmath::e4m3_bits_to_f32(static_cast<uint8_t>(c + 1));
    const float m = (v + w) / 2;  // exact: one more mantissa bit
    for (const float y : {v, m, std::nextafter(m, 0.0f), std::nextafter(m, 1e9f)})
      edge.push_back(y), edge.push_back(-y);
  }
  for (int k = 0; k <= 20; ++k) edge.push_back(static_cast<float>(k) * 0.0009765625f);  // k · 2^-10
  for (const float y : {0.015625f, std::nextafter(0.015625f, 0.0f), -0.0f, 0.0f, 1e-40f, -1e-40f, 448.0f, -448.0f})
    edge.push_back(y);
  // The same for e2m1 (the fp4 kinds, whose blocks start with 6: scale 1 for MXFP4 and the fp4 tiles).
  std::vector<float> edge4;
  for (int c = 0; c < 7; ++c) {
    const float v = qmath::e2m1_bits_to_f32(static_cast<uint8_t>(c)),
                w = qmath::e2m1_bits_to_f32(static_cast<uint8_t>(c + 1));
    const float m = (v + w) / 2;
    for (const float y : {v, m, std::nextafter(m, 0.0f), std::nextafter(m, 1e9f)})
      edge4.push_back(y), edge4.push_back(-y);
  }
  for (const float y : {0.1f, -0.0f, 1e-40f, 6.0f, -6.0f, std::nextafter(6.0f, 0.0f)}) edge4.push_back(y);
  for (const auto& [T, D] : std::vector<std::pair<int64_t, int64_t>>{{40, 576}, {7, 64}, {2048, 576}}) {
    std::mt19937_64 rng(static_cast<uint64_t>(T * 1000 + D));
    std::normal_distribution<float> N;
    std::vector<float> rnd(static_cast<size_t>(T * D)), ed(static_cast<size_t>(T * D));
    for (float& v : rnd) v = N(rng) * 2.0f + 0.25f;
    std::vector<float> ed4(static_cast<size_t>(T * D));
    for (int64_t i = 0; i < T * D; ++i) ed[i] = edge[static_cast<size_t>(i) % edge.size()];
    for (int64_t i = 0; i < T * D; ++i) ed4[i] = edge4[static_cast<size_t>(i) % edge4.size()];
    for (const std::string& spec : block_specs()) {
      const QuantSpec stored = QuantSpec::parse(spec).stored_for(Target::CKV);
      const Layout L = layout(stored, D);
      const int64_t blk = L.block > 0 && L.block < D ? L.block : 16;  // the block max at every multiple
      const bool fp4 =
          stored.format == Format::MxFp4 || stored.format == Format::NvFp4 || stored.format == Format::Fp4Tile;
      std::vector<float> e = fp4 ? ed4 : ed;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; d += blk) e[t * D + d] = fp4 ? 6.0f : 448.0f;
      if (spec == "fp8-e4m3-tensor-s1")
        for (int64_t i = 0; i < T * D; i += 97) e[i] = 448.0f + static_cast<float>(i % 23);
      const std::vector<int64_t> seqs = {0, T};
      expect_same(spec, rnd, T, D, seqs, "random");
      expect_same(spec, e, T, D, seqs, "edge");
      std::vector<float> bad = rnd;  // NaN/Inf: the reference's message (the count), from the fused pass too
      bad[static_cast<size_t>(T * D / 2)] = std::numeric_limits<float>::quiet_NaN();
      bad.back() = -std::numeric_limits<float>::infinity();
      expect_same(spec, bad, T, D, seqs, "nan/inf");
    }
  }
}

// The ggml kinds at their rounding points: each block of 32 pins its scale to 1 (q8_0: an element 127, d =
// 127/127; q4_0: an element −8, d = −8/−8; q4_1: elements 15 and 0, d = 15/15, min 0), so the others are
// rounded as written: k + 1/2 and its float neighbours (q8_0's round-half-away; q4_0's and q4_1's C
// truncation after + 8.5 / + 0.5), over each format's range, both signs.
TEST(CpuKernels, GgmlBlocksAtRoundingPointsGiveTheReferenceBytes) {
  const int64_t T = 24, D = 512;
  for (const std::string spec : {"q8_0", "q4_0", "q4_1"}) {
    const float lo = spec == "q8_0" ? -127.0f : spec == "q4_0" ? -8.0f : 0.0f;
    const float hi = spec == "q8_0" ? 127.0f : spec == "q4_0" ? 7.0f : 15.0f;
    std::vector<float> vals;
    for (float k = lo; k < hi; k += 1.0f) {
      const float m = k + 0.5f;
      for (const float v : {m, std::nextafter(m, -1e9f), std::nextafter(m, 1e9f), k}) vals.push_back(v);
    }
    std::vector<float> x(static_cast<size_t>(T * D));
    for (int64_t i = 0; i < T * D; ++i) x[i] = vals[static_cast<size_t>(i) % vals.size()];
    for (int64_t b = 0; b < T * D; b += 32) {
      if (spec == "q8_0") x[b] = 127.0f;
      if (spec == "q4_0") x[b] = -8.0f;
      if (spec == "q4_1") x[b] = 15.0f, x[b + 1] = 0.0f;
    }
    expect_same(spec, x, T, D, {0, T}, "rounding points");
  }
}

TEST(CpuKernels, QuantizeIntoAReusedTensorEqualsQuantize) {
  const uint64_t seed = 23;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N;
  std::vector<float> x(static_cast<size_t>(70 * 96));
  for (float& v : x) v = N(rng) * 2.0f - 0.25f;
  QuantizedTensor qt;
  const std::vector<std::pair<std::string, int64_t>> calls = {{"int8-sym-token", 70},
                                                              {"int4-asym-channel-g32", 70},
                                                              {"int2-asym-tensor", 70},
                                                              {"int4-asym-channel-g32", 70},
                                                              {"int4-asym-channel-g32", 33},
                                                              {"int8-asym-token-g32-fp32", 70},
                                                              {"bf16", 70},
                                                              {"int2-sym-token-g7", 51},
                                                              {"q4_0", 70},
                                                              {"int4-sym-channel", 70}};
  for (const auto& [spec, T] : calls) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = x[i] * -1.0625f + 0.01f;  // new data for every call
    const std::vector<int64_t> seqs = {0, T / 2, T};
    const QuantizedTensor want = quantize(QuantSpec::parse(spec), Target::CKV, x.data(), T, 96, seqs);
    quantize_into(qt, QuantSpec::parse(spec), Target::CKV, x.data(), T, 96, seqs);
    const std::string ctx = spec + " T " + std::to_string(T) + " seed " + std::to_string(seed);
    EXPECT_EQ(qt.spec, want.spec) << ctx;
    EXPECT_EQ(qt.rows, want.rows) << ctx;
    EXPECT_EQ(qt.cols, want.cols) << ctx;
    EXPECT_EQ(qt.codes, want.codes) << ctx;
    EXPECT_EQ(qt.scales, want.scales) << ctx;
    EXPECT_EQ(qt.offsets, want.offsets) << ctx;
    EXPECT_EQ(qt.global, want.global) << ctx;
    EXPECT_EQ(qt.group_bounds, want.group_bounds) << ctx;
  }
  // an error empties the tensor and names the input as quantize() does
  x[5] = std::numeric_limits<float>::quiet_NaN();
  try {
    quantize_into(qt, QuantSpec::parse("int4-asym-token"), Target::CKV, x.data(), 70, 96, std::vector<int64_t>{0, 70});
    ADD_FAILURE() << "no error for a NaN";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "1 NaN/Inf values in the [70, 96] input");
  }
  EXPECT_EQ(qt.rows, 0);
  EXPECT_TRUE(qt.codes.empty() && qt.scales.empty() && qt.offsets.empty());
}

TEST(CpuKernels, AutoPicksAFastKernel) {
  set_cpu_kernel(CpuKernel::Auto);
  EXPECT_NE(active_cpu_kernel(), CpuKernel::Reference);
  EXPECT_NE(active_cpu_kernel(), CpuKernel::Auto);
  set_cpu_threads(0);
  EXPECT_EQ(cpu_threads(), 1);
}

}  // namespace
