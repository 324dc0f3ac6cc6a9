// test_gpu: the CUDA quantizer (latentq/quantize_cuda.h) against the CPU reference, byte for byte.
//
// One shared runner, check_spec(spec, target, T, D, seed, n_seqs), quantizes the same input on the
// CPU and the GPU and compares codes, scales and offsets with memcmp (reporting the first differing
// index) and the decoded values bit for bit; then one line per spec runs it over a fixed list of
// shapes (odd sizes, several sequences of uneven length, one of them empty). The inputs contain
// zero-range groups (a constant channel and row, all-zero channel/row/tiles) and signed zeros
// placed so that a group's min or max is a zero whose sign only the in-order fold decides.
// Every GPU test skips with "no CUDA device: <reason>" where no device is usable.
#include <gtest/gtest.h>

#include <cctype>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "latentq/quantize.h"
#include "latentq/quantize_cuda.h"
#include "require_gpu.h"
#include "latentq/transform.h"

namespace {
using namespace latentq;

float signed_zero(std::mt19937_64& rng) { return (rng() & 1) ? 0.0f : -0.0f; }

// [T, D] input: per-channel scales and offsets, a few outliers, and the special groups listed above.
std::vector<float> make_input(int64_t T, int64_t D, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> cs(static_cast<size_t>(D));
  for (float& s : cs) s = std::exp(0.7f * nd(rng));
  std::vector<float> X(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) X[t * D + d] = nd(rng) * cs[d] + 0.3f * static_cast<float>(d % 5);
  for (int64_t k = 0; k < T * D / 500 + 1; ++k) X[rng() % (T * D)] *= 20.0f;
  for (int64_t t = 0; t < T; ++t) {
    float* x = X.data() + t * D;
    if (D > 1) x[1] = 0.75f;                                               // constant channel
    if (D > 2) x[2] = signed_zero(rng);                                    // all-zero channel, mixed signs
    if (D > 3) x[3] = (t % 4 == 1) ? signed_zero(rng) : std::fabs(x[3]);   // channel min is a signed zero
    if (D > 4) x[4] = (t % 4 == 2) ? signed_zero(rng) : -std::fabs(x[4]);  // channel max is a signed zero
  }
  auto row = [&](int64_t t) { return X.data() + t * D; };
  if (T > 2) std::fill(row(2), row(2) + D, 1.5f);  // constant row
  if (T > 3)
    for (int64_t d = 0; d < D; ++d) row(3)[d] = signed_zero(rng);  // all-zero row / fp8 tiles
  if (T > 5)
    for (int64_t d = 0; d < D; ++d) row(5)[d] = (d % 3 == 0) ? signed_zero(rng) : std::fabs(row(5)[d]);
  if (T > 6)
    for (int64_t d = 0; d < D; ++d) row(6)[d] = (d % 3 == 1) ? signed_zero(rng) : -std::fabs(row(6)[d]);
  return X;
}

// seq_offsets [n+1] from 0 to T with uneven lengths; with n ≥ 3 the second sequence is empty.
std::vector<int64_t> make_seqs(int64_t T, int n, uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 1);
  std::vector<int64_t> cuts;
  for (int i = 0; i + 1 < n; ++i) cuts.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(T + 1)));
  std::sort(cuts.begin(), cuts.end());
  if (n >= 3) cuts[1] = cuts[0];
  std::vector<int64_t> s = {0};
  s.insert(s.end(), cuts.begin(), cuts.end());
  s.push_back(T);
  return s;
}

std::string describe(const std::string& spec, Target target, int64_t T, int64_t D, uint64_t seed,
                     const std::vector<int64_t>& seqs) {
  std::ostringstream os;
  os << "spec " << spec << ", target " << to_string(target) << ", T " << T << ", D " << D << ", seed " << seed
     << ", seq_offsets {";
  for (size_t i = 0; i < seqs.size(); ++i) os << (i ? "," : "") << seqs[i];
  os << "}";
  return os.str();
}

std::vector<uint32_t> float_bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// memcmp; on a difference reports the first index (and its row when row_len > 0) and the count.
template <class E>
void expect_same(const char* what, const std::vector<E>& cpu, const std::vector<E>& gpu, int64_t row_len = 0) {
  if (cpu.size() != gpu.size()) {
    ADD_FAILURE() << what << ": " << gpu.size() << " elements on the GPU, " << cpu.size() << " on the CPU";
    return;
  }
  if (cpu.empty() || std::memcmp(cpu.data(), gpu.data(), cpu.size() * sizeof(E)) == 0) return;
  size_t first = cpu.size(), n = 0;
  for (size_t i = 0; i < cpu.size(); ++i)
    if (cpu[i] != gpu[i]) {
      if (first == cpu.size()) first = i;
      ++n;
    }
  std::ostringstream os;
  os << what << ": " << n << " of " << cpu.size() << " differ; first at index " << first;
  if (row_len > 0)
    os << " (row " << first / static_cast<size_t>(row_len) << ", column " << first % static_cast<size_t>(row_len)
       << ")";
  os << ": CPU 0x" << std::hex << static_cast<uint64_t>(cpu[first]) << ", GPU 0x" << static_cast<uint64_t>(gpu[first]);
  ADD_FAILURE() << os.str();
}

void expect_same_storage(const QuantizedTensor& cpu, const QuantizedTensor& gpu) {
  EXPECT_EQ(gpu.spec, cpu.spec) << gpu.spec.to_string() << " vs " << cpu.spec.to_string();
  EXPECT_EQ(gpu.rows, cpu.rows);
  EXPECT_EQ(gpu.cols, cpu.cols);
  EXPECT_EQ(gpu.group_bounds, cpu.group_bounds);
  expect_same("codes", cpu.codes, gpu.codes, cpu.row_bytes());
  expect_same("scales", cpu.scales, gpu.scales);
  expect_same("offsets", cpu.offsets, gpu.offsets);
  expect_same("global (per-tensor scale, codebooks)", cpu.global, gpu.global);
}

// CPU vs GPU on a given input: storage, GPU decode of the GPU storage, and quantize_dequantize_gpu.
void check_input(const std::string& spec_s, Target target, const std::vector<float>& X, int64_t T, int64_t D,
                 const std::vector<int64_t>& seqs) {
  const QuantSpec spec = QuantSpec::parse(spec_s);
  const QuantizedTensor cpu = quantize(spec, target, X.data(), T, D, seqs);
  const QuantizedTensor gpu = quantize_gpu(spec, target, X.data(), T, D, seqs);
  expect_same_storage(cpu, gpu);
  std::vector<float> dc(X.size()), dg(X.size()), dqd(X.size());
  dequantize(cpu, dc.data());
  dequantize_gpu(gpu, dg.data());
  expect_same("dequantize_gpu values (bits)", float_bits(dc), float_bits(dg), D);
  QuantizedTensor st;
  quantize_dequantize_gpu(spec, target, X.data(), T, D, seqs, dqd.data(), &st);
  expect_same("quantize_dequantize_gpu values (bits)", float_bits(dc), float_bits(dqd), D);
  expect_same_storage(cpu, st);
}

/// The shared runner: random [T, D] input from `seed`, n_seqs sequences of uneven lengths.
void check_spec(const std::string& spec, Target target, int64_t T, int64_t D, uint64_t seed, int n_seqs) {
  const std::vector<int64_t> seqs = make_seqs(T, n_seqs, seed);
  SCOPED_TRACE(describe(spec, target, T, D, seed, seqs));
  check_input(spec, target, make_input(T, D, seed), T, D, seqs);
}

struct Shape {
  int64_t T, D;
  uint64_t seed;
  int n_seqs;
};
#if defined(LQ_EMULATE)
// test_gpu_emu (host emulator, slow): smaller shapes; 1100 tokens in one sequence: 3 stat chunks.
constexpr int64_t kDiv = 8;  // special tests: T / kDiv
const Shape kShapes[] = {{1100, 64, 1, 1}, {7, 64, 2, 2}, {1, 512, 3, 1}, {129, 67, 4, 4}, {75, 576, 5, 5}};
#else
// 4097: many row tiles, groups > 512 tokens (several stat chunks); 7 and 1: less than one tile;
// D = 67: not a multiple of 4 (scalar paths, partial bytes).
constexpr int64_t kDiv = 1;
const Shape kShapes[] = {{4097, 576, 1, 3}, {7, 64, 2, 2}, {1, 512, 3, 1}, {129, 67, 4, 4}, {300, 512, 5, 5}};
#endif

// LQ_GPU_TEST_MAX_T=<n> skips shapes with more tokens (gpu_check.sh sets it under compute-sanitizer).
int64_t max_tokens() {
  const char* e = std::getenv("LQ_GPU_TEST_MAX_T");
  return e ? std::atoll(e) : INT64_MAX;
}

void run_spec(const std::string& spec, bool both_targets = false) {
  for (const Shape& s : kShapes) {
    if (s.T > max_tokens()) continue;
    bool refused = false;  // a row length the format cannot store (ggml: D % 32; TurboQuant: Hadamard block < 16)
    try {
      (void)layout(QuantSpec::parse(spec).stored_for(Target::CKV), s.D);
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    if (refused) {
      // both refuse, with the same message
      const std::vector<float> X = make_input(s.T, s.D, s.seed);
      const std::vector<int64_t> seqs{0, s.T};
      const QuantSpec q = QuantSpec::parse(spec);
      std::string cpu, gpu;
      try {
        (void)quantize(q, Target::CKV, X.data(), s.T, s.D, seqs);
      } catch (const std::invalid_argument& e) {
        cpu = e.what();
      }
      try {
        (void)quantize_gpu(q, Target::CKV, X.data(), s.T, s.D, seqs);
      } catch (const std::invalid_argument& e) {
        gpu = e.what();
      }
      EXPECT_TRUE(cpu.find("multiple of 32") != std::string::npos || cpu.find("Hadamard block") != std::string::npos)
          << cpu;
      EXPECT_EQ(gpu, cpu);
      continue;
    }
    check_spec(spec, Target::CKV, s.T, s.D, s.seed, s.n_seqs);
    if (both_targets) check_spec(spec, Target::KPE, s.T, s.D, s.seed + 100, s.n_seqs);
    if (::testing::Test::HasFailure()) return;  // one shape's report is enough
  }
}

// ---- every example and engine preset of the format table (latentq/spec.h format_examples()) -----------------------
// bf16 and the presets on both targets (a preset stores k_pe in a format of its own).
class GpuFormat : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuFormat, MatchesTheCpuReference) {
  LQ_REQUIRE_GPU();
  const QuantSpec q = QuantSpec::parse(GetParam());
  run_spec(GetParam(), q.format == Format::Preset || q.format == Format::BF16);
}

INSTANTIATE_TEST_SUITE_P(FormatTable, GpuFormat, ::testing::ValuesIn(format_examples()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

// Rows narrower than a block (one clipped block per row: odd 4-bit blocks, a code byte with one
// element), odd tiles, and tiny tiles at D = 4096 (the quantize tile needs > 48 KiB of shared memory).
TEST(GpuSpec, block_formats_narrow_rows_and_tiny_tiles) {
  LQ_REQUIRE_GPU();
  for (const int64_t D : {1, 5, 7, 33})
    for (const char* spec : {"mxfp4", "nvfp4", "fp4-e2m1-tile16-e4m3", "mxfp8", "fp8-e4m3-tile128-pow2",
                             "fp8-e4m3-tile3-fp32", "fp8-e4m3-tensor"}) {
      check_spec(spec, Target::CKV, 37, D, 40 + static_cast<uint64_t>(D), 2);
      if (::testing::Test::HasFailure()) return;
    }
  for (const char* spec : {"fp8-e4m3-tile1-fp32", "fp8-e4m3-tile2-pow2", "fp8-e4m3-tile3-pow2-ue8m0"}) {
    check_spec(spec, Target::CKV, 3, 4096, 50, 1);
    if (::testing::Test::HasFailure()) return;
  }
}

// ---- signed zeros in per-tensor statistics (cub::DeviceReduce order) ---------------------------
TEST(GpuSpecial, PerTensorMinIsTheFirstZerosSign) {
  LQ_REQUIRE_GPU();
  for (const float first : {-0.0f, 0.0f}) {
    const int64_t T = 2048 / kDiv, D = 576;
    std::mt19937_64 rng(std::signbit(first) ? 22 : 21);
    std::normal_distribution<float> nd;
    std::vector<float> X(static_cast<size_t>(T * D));
    for (float& v : X) v = std::fabs(nd(rng)) + 0.01f;  // min is the zero below
    const int64_t z1 = (T * 3 / 8) * D + 5, z2 = (T * 3 / 4) * D + 9;
    X[z1] = first;
    X[z2] = -first;  // a later zero of the other sign
    for (int64_t i = z2 + 1; i < T * D; ++i)
      if (rng() % 1000 == 0) X[i] = signed_zero(rng);
    const std::vector<int64_t> seqs = {0, T};
    for (const char* spec : {"int8-asym-tensor", "int4-asym-tensor", "int2-asym-tensor-fp32"}) {
      SCOPED_TRACE(std::string(spec) + ", first zero " + (std::signbit(first) ? "-0" : "+0"));
      check_input(spec, Target::CKV, X, T, D, seqs);
      for (float& v : X) v = -v;  // now the max is the first zero (of the opposite sign)
      check_input(spec, Target::CKV, X, T, D, seqs);
      for (float& v : X) v = -v;
    }
  }
}

// ---- NaN/Inf: same exception and message as the CPU, on every kernel path ---------------------
template <class F>
std::string what_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument thrown)";
}

TEST(GpuSpecial, NonFiniteInputThrowsTheCpuMessage) {
  LQ_REQUIRE_GPU();
  const int64_t T = 1500 / kDiv, D = 576;
  std::vector<float> X = make_input(T, D, 31);
  const float nan = std::nanf(""), inf = INFINITY;
  X[5] = nan;
  X[D * (T * 7 / 15) + 3] = inf;
  X[D * (T - 1) + 575] = -inf;
  X[D * (T / 23) + 100] = nan;
  X[D * (T * 2 / 9) + 1] = nan;
  const std::vector<int64_t> seqs = {0, T * 2 / 5, T};
  const std::string expected = "5 NaN/Inf values in the [" + std::to_string(T) + ", 576] input";
  for (const char* spec :
       {"int8-asym-tensor", "int4-sym-tensor", "int4-asym-channel-g32", "int2-sym-channel-g0", "int4-asym-token-g32",
        "int8-sym-token-g128", "fp8-e4m3-tile128-pow2", "mxfp4", "nvfp4", "fp8-e4m3-tensor", "q4_1", "bf16"}) {
    SCOPED_TRACE(spec);
    const QuantSpec s = QuantSpec::parse(spec);
    const std::string cpu = what_of([&] { (void)quantize(s, Target::CKV, X.data(), T, D, seqs); });
    EXPECT_NE(cpu.find(expected), std::string::npos) << cpu;
    EXPECT_EQ(what_of([&] { (void)quantize_gpu(s, Target::CKV, X.data(), T, D, seqs); }), cpu);
    std::vector<float> out(X.size());
    EXPECT_EQ(what_of([&] { quantize_dequantize_gpu(s, Target::CKV, X.data(), T, D, seqs, out.data(), nullptr); }),
              cpu);
  }
  // NaN is reported before bad seq_offsets, as on the CPU
  const std::vector<int64_t> bad_seqs = {0, T * 3 / 5, T * 8 / 15, T};
  const QuantSpec s = QuantSpec::parse("int4-asym-channel-g32");
  const std::string cpu = what_of([&] { (void)quantize(s, Target::CKV, X.data(), T, D, bad_seqs); });
  EXPECT_EQ(what_of([&] { (void)quantize_gpu(s, Target::CKV, X.data(), T, D, bad_seqs); }), cpu);
  std::vector<float> d_count_input(X);
  gpu::DeviceBuffer<float> dx;
  dx.upload(d_count_input.data(), d_count_input.size(), nullptr);
  EXPECT_EQ(count_nonfinite_device(dx.data(), T * D), count_nonfinite(X.data(), T * D));
}

// ---- scale/offset overflow of the storage dtype: same group and message as the CPU -------------
TEST(GpuSpecial, ScaleOverflowThrowsTheCpuMessage) {
  LQ_REQUIRE_GPU();
  const int64_t T = 1100 / kDiv, D = 512;
  std::vector<float> X = make_input(T, D, 41);
  // one token gets an fp16-overflowing range (1e7 / 127 > 65504), channel 9 a min below −65504
  for (int64_t d = 0; d < D; ++d) X[(T * 7 / 11) * D + d] = (d % 2 ? 1e7f : -1e7f);
  for (int64_t t = T * 9 / 11; t < T; ++t) X[t * D + 9] = -1e5f;
  const std::vector<int64_t> seqs = {0, T * 9 / 22, T};
  for (const char* spec :
       {"int8-sym-token-g32", "int4-asym-token-g0", "int2-asym-token-g128", "int8-sym-tensor", "int4-asym-tensor",
        "int4-asym-channel-g32", "int8-sym-channel-g0", "int2-asym-channel-g128"}) {
    SCOPED_TRACE(spec);
    const QuantSpec s = QuantSpec::parse(spec);
    const std::string cpu = what_of([&] { (void)quantize(s, Target::CKV, X.data(), T, D, seqs); });
    EXPECT_NE(cpu.find("overflows the fp16 storage"), std::string::npos) << cpu;
    EXPECT_EQ(what_of([&] { (void)quantize_gpu(s, Target::CKV, X.data(), T, D, seqs); }), cpu);
  }
  // the -fp32 variant holds these values: identical storage again
  check_input("int8-sym-token-g32-fp32", Target::CKV, X, T, D, seqs);
  check_input("int4-asym-channel-g32-fp32", Target::CKV, X, T, D, seqs);
  // a range beyond float32 overflows even fp32 scales (max − min = inf)
  for (int64_t d = 0; d < D; ++d) {
    X[(T / 3) * D + d] = (d % 2 ? 3e38f : -3e38f);
    X[(T / 3 + 1) * D + d] = (d % 2 ? -3e38f : 3e38f);
  }
  for (const char* spec : {"int8-asym-token-g32-fp32", "int4-asym-channel-g0-fp32", "int2-asym-tensor-fp32"}) {
    SCOPED_TRACE(spec);
    const QuantSpec s = QuantSpec::parse(spec);
    const std::string cpu = what_of([&] { (void)quantize(s, Target::CKV, X.data(), T, D, seqs); });
    EXPECT_NE(cpu.find("overflows the fp32 storage"), std::string::npos) << cpu;
    EXPECT_EQ(what_of([&] { (void)quantize_gpu(s, Target::CKV, X.data(), T, D, seqs); }), cpu);
  }
}

// ---- a hand-built spec with fields parse() never produces: the CPU's message ---------------------
TEST(GpuSpecial, HandBuiltSpecsAreRefusedAsOnTheCpu) {
  LQ_REQUIRE_GPU();
  const int64_t T = 40, D = 64;
  const std::vector<float> X = make_input(T, D, 61);
  const std::vector<int64_t> seqs = {0, T};
  QuantSpec bits3 = QuantSpec::parse("int4-asym-token-g32");
  bits3.bits = 3;
  QuantSpec neg_group = QuantSpec::parse("int8-sym-channel-g32");
  neg_group.group_size = -4;
  QuantSpec tile0 = QuantSpec::parse("fp8-e4m3-tile128-pow2");
  tile0.group_size = 0;
  QuantSpec fp8_f16 = QuantSpec::parse("fp8-e4m3-tile128-pow2");  // block formats have no free fields
  fp8_f16.scale_dtype = ScaleDtype::F16;
  for (const QuantSpec& s : {bits3, neg_group, tile0, fp8_f16}) {
    const std::string cpu = what_of([&] { (void)quantize(s, Target::CKV, X.data(), T, D, seqs); });
    EXPECT_NE(cpu.find("invalid quantizer spec fields"), std::string::npos) << cpu;
    EXPECT_EQ(what_of([&] { (void)quantize_gpu(s, Target::CKV, X.data(), T, D, seqs); }), cpu);
  }
}

// ---- bad input: refused, never a wrong answer ----------------------------------------------------
TEST(GpuSpecial, BadShapesAndSeqOffsetsAreRefused) {
  LQ_REQUIRE_GPU();
  const QuantSpec s = QuantSpec::parse("int4-asym-channel-g32");
  std::vector<float> X(static_cast<size_t>(2 * 4097), 0.5f);
  const std::vector<int64_t> seqs = {0, 2};
  // D above the kernels' limit: std::invalid_argument naming the limit (the CPU accepts it)
  const std::string msg = what_of([&] { (void)quantize_gpu(s, Target::CKV, X.data(), 2, 4097, seqs); });
  EXPECT_NE(msg.find("at most 4096 columns"), std::string::npos) << msg;
  // empty matrix: the CPU's message
  const std::string cpu = what_of([&] { (void)quantize(s, Target::CKV, X.data(), 0, 64, seqs); });
  EXPECT_EQ(what_of([&] { (void)quantize_gpu(s, Target::CKV, X.data(), 0, 64, seqs); }), cpu);
  // seq_offsets that do not end at T / decrease: the CPU's message
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{0, 1}, std::vector<int64_t>{0, 2, 1, 2}}) {
    const std::string c = what_of([&] { (void)quantize(s, Target::CKV, X.data(), 2, 64, bad); });
    EXPECT_EQ(what_of([&] { (void)quantize_gpu(s, Target::CKV, X.data(), 2, 64, bad); }), c);
  }
  // a QuantizedTensor whose buffers do not match its layout
  QuantizedTensor qt = quantize(s, Target::CKV, X.data(), 2, 64, seqs);
  qt.codes.pop_back();
  std::vector<float> out(128);
  EXPECT_THROW(dequantize_gpu(qt, out.data()), std::invalid_argument);
}

// ---- the largest D: one row and its scales fill the shared memory of the token kernel -----------
TEST(GpuSpecial, LargestSupportedD) {
  LQ_REQUIRE_GPU();
  const int64_t D = gpu::kMaxCols;
  for (const char* spec : {"int4-asym-token-g1", "int2-sym-token-g3", "int8-asym-token-g0", "int4-asym-channel-g32",
                           "int2-asym-channel-g0", "fp8-e4m3-tile128-pow2", "nvfp4", "q4_0", "int8-sym-tensor"})
    check_spec(spec, Target::CKV, 9, D, 71, 2);
}

// ---- device API: reuse of a DeviceQuantized and an input that is not 16-byte aligned ------------
TEST(GpuSpecial, DeviceApiReuseAndUnalignedInput) {
  LQ_REQUIRE_GPU();
  DeviceQuantized dq;
  const struct {
    const char* spec;
    int64_t T, D;
    int n_seqs;
  } runs[] = {{"int4-asym-channel-g32", 1000 / kDiv, 576, 3}, {"int4-asym-channel-g32", 1000 / kDiv, 576, 3},
              {"int2-sym-channel-g0", 300 / kDiv, 64, 2},     {"int8-asym-token-g32", 2000 / kDiv, 512, 1},
              {"fp8-e4m3-tile128-fp32", 50, 576, 1},          {"nvfp4", 50, 576, 1},
              {"int4-asym-channel-g32", 1000 / kDiv, 576, 4}};
  uint64_t seed = 51;
  for (const auto& r : runs) {
    const std::vector<int64_t> seqs = make_seqs(r.T, r.n_seqs, seed);  // the same for both shifts: cached plan
    const std::vector<float> X = make_input(r.T, r.D, seed);
    for (const int64_t shift : {0, 1}) {  // shift 1: input pointer 4 bytes past a 16-byte boundary
      SCOPED_TRACE(describe(r.spec, Target::CKV, r.T, r.D, seed, seqs) + ", input shift " + std::to_string(shift));
      std::vector<float> padded(static_cast<size_t>(shift));
      padded.insert(padded.end(), X.begin(), X.end());
      gpu::DeviceBuffer<float> dx;
      dx.upload(padded.data(), padded.size(), nullptr);
      const QuantSpec s = QuantSpec::parse(r.spec);
      quantize_device(s, Target::CKV, dx.data() + shift, r.T, r.D, seqs, dq);
      const QuantizedTensor cpu = quantize(s, Target::CKV, X.data(), r.T, r.D, seqs);
      expect_same_storage(cpu, to_host(dq));
      gpu::DeviceBuffer<float> dout(padded.size());
      dequantize_device(dq, dout.data() + shift);
      std::vector<float> got(padded.size()), want(X.size());
      dout.download(got.data(), nullptr);
      dequantize(cpu, want.data());
      expect_same("dequantize_device values (bits)", float_bits(want),
                  float_bits(std::vector<float>(got.begin() + shift, got.end())), r.D);
    }
    ++seed;
  }
}

TEST(GpuSpecial, ReportsTheDevice) {
  std::string why;
  const bool ok = cuda_device_available(&why);
  EXPECT_FALSE(why.empty());  // the device's name, or the reason there is none
  std::printf("cuda_device_available: %s (%s)\n", ok ? "yes" : "no", why.c_str());
}

}  // namespace

// ---- the randomized Hadamard -------------------------------------------------------------------
// hadamard_rows_gpu against latentq::fwht_rows / Rotation::forward / Rotation::inverse, byte for byte
// (memcmp), on make_input rows (outliers, signed zeros), for several (T, D, block): 576 = 9 · 64 blocks,
// the 2-wide block, the largest block (4096, 16 KiB of shared memory) and T = 0.
TEST(GpuHadamard, ByteIdenticalToTheCpuReference) {
  LQ_REQUIRE_GPU();
  struct Shape {
    int64_t T, D, block;
    uint64_t seed;
  };
  for (const Shape s : {Shape{7, 128, 128, 1}, Shape{5, 576, 64, 2}, Shape{3, 96, 32, 3}, Shape{9, 32, 2, 4},
                        Shape{2, 4096, 4096, 5}, Shape{0, 64, 64, 6}}) {
    SCOPED_TRACE(::testing::Message() << "T=" << s.T << " D=" << s.D << " block=" << s.block << " seed=" << s.seed);
    const std::vector<float> x0 = s.T > 0 ? make_input(s.T, s.D, s.seed) : std::vector<float>{};
    // plain FWHT
    std::vector<float> cpu = x0, gpu = x0;
    fwht_rows(cpu.data(), s.T, s.D, s.block);
    hadamard_rows_gpu(gpu.data(), s.T, s.D, s.block, nullptr, false);
    EXPECT_EQ(std::memcmp(cpu.data(), gpu.data(), cpu.size() * sizeof(float)), 0);
    // randomized, forward then inverse
    const Rotation r = Rotation::hadamard(s.D, s.block, s.seed);
    const std::vector<float> signs = hadamard_signs(s.D, s.seed);
    cpu = x0;
    gpu = x0;
    r.forward(cpu.data(), s.T, s.D);
    hadamard_rows_gpu(gpu.data(), s.T, s.D, s.block, signs.data(), false);
    EXPECT_EQ(std::memcmp(cpu.data(), gpu.data(), cpu.size() * sizeof(float)), 0);
    r.inverse(cpu.data(), s.T, s.D);
    hadamard_rows_gpu(gpu.data(), s.T, s.D, s.block, signs.data(), true);
    EXPECT_EQ(std::memcmp(cpu.data(), gpu.data(), cpu.size() * sizeof(float)), 0);
    if (s.T > 0)
      EXPECT_NE(std::memcmp(cpu.data(), x0.data(), cpu.size() * sizeof(float)), 0);  // rounding: not the identity
  }
  std::vector<float> x(6);
  try {
    hadamard_rows_gpu(x.data(), 1, 6, 4, nullptr, false);
    ADD_FAILURE() << "block 4 on D = 6 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("D = 6"), std::string::npos) << e.what();
  }
}
