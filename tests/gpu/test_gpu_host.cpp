// Host-only tests of the CUDA quantizer's helpers (latentq/gpu/plan.h): they need no GPU and run
// everywhere test_gpu is built. They pin the pieces whose correctness the kernels' byte identity
// rests on: fast division, the chunking of channel groups, the order-free statistics (any
// reduction order gives the CPU's in-order fold, signed zeros included) and the quad packing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "latentq/gpu/plan.h"
#include "latentq/quantize.h"

namespace {
using namespace latentq;
namespace q = latentq::qmath;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(GpuHelpers, FastDivEqualsIntegerDivision) {
  std::mt19937_64 rng(7);
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= 1100; ++d) divisors.push_back(d);
  for (int64_t d : {4095, 4096, 4097, 65535, 65536, 65537, 1 << 20, (1 << 30) - 1, 1 << 30, 2147483647})
    divisors.push_back(d);
  for (int i = 0; i < 200; ++i) divisors.push_back(static_cast<int64_t>(rng() % 2147483647) + 1);
  for (const int64_t d : divisors) {
    const gpu::FastDiv f(d);
    std::vector<uint32_t> ns = {0, 1, 2, 3, 4, 5, 2147483647u, 2147483646u};
    for (int64_t k = 1; k < 4; ++k)
      for (int64_t m : {d * k - 1, d * k, d * k + 1})
        if (m >= 0 && m < 2147483648LL) ns.push_back(static_cast<uint32_t>(m));
    for (int i = 0; i < 300; ++i) ns.push_back(static_cast<uint32_t>(rng() % 2147483648ULL));
    for (int i = 0; i < 50; ++i) ns.push_back(static_cast<uint32_t>(rng() % 5000));
    for (const uint32_t n : ns) ASSERT_EQ(f.div(n), n / static_cast<uint32_t>(d)) << "n = " << n << ", d = " << d;
  }
  EXPECT_THROW(gpu::FastDiv(0), std::invalid_argument);
  EXPECT_THROW(gpu::FastDiv(int64_t{1} << 31), std::invalid_argument);
}

TEST(GpuHelpers, SplitGroupsCoversEveryTokenOnceInOrder) {
  const std::vector<int64_t> seq = {0, 5, 5, 100, 1300};  // an empty sequence in the middle
  for (const int64_t group : {0, 1, 7, 32, 33, 128}) {
    const std::vector<int64_t> bounds = channel_groups(seq, 1300, group);
    for (const int64_t max_len : {1, 32, 512}) {
      SCOPED_TRACE("group_size " + std::to_string(group) + ", max_len " + std::to_string(max_len));
      std::vector<int64_t> begin;
      const auto chunks = gpu::split_groups(bounds, max_len, &begin);
      ASSERT_EQ(begin.size(), bounds.size());
      EXPECT_EQ(begin.front(), 0);
      EXPECT_EQ(begin.back(), static_cast<int64_t>(chunks.size()));
      int64_t t = 0;
      for (size_t g = 0; g + 1 < bounds.size(); ++g) {
        for (int64_t c = begin[g]; c < begin[g + 1]; ++c) {
          EXPECT_EQ(chunks[c].group, static_cast<int64_t>(g));
          EXPECT_EQ(chunks[c].t0, t);
          EXPECT_GE(chunks[c].n, 1);
          EXPECT_LE(chunks[c].n, max_len);
          t += chunks[c].n;
        }
        EXPECT_EQ(t, bounds[g + 1]);
      }
      EXPECT_EQ(t, 1300);
    }
  }
  const std::vector<int64_t> b = {0, 3, 35, 40};
  EXPECT_EQ(gpu::max_group_len(b), 32);
}

// The CPU reference's fold: mn = x[0], then min_num/max_num in storage order.
std::pair<float, float> cpu_fold(const std::vector<float>& x) {
  float mn = x[0], mx = x[0];
  for (const float v : x) {
    mn = q::min_num(mn, v);
    mx = q::max_num(mx, v);
  }
  return {mn, mx};
}

// Reduces the group in a random order and a random tree shape, as a parallel reduction may.
gpu::MinMaxZ<uint32_t> random_tree_reduce(const std::vector<float>& x, std::mt19937_64& rng) {
  std::vector<gpu::MinMaxZ<uint32_t>> parts;
  for (size_t i = 0; i < x.size(); ++i) {
    auto s = gpu::minmaxz_identity<uint32_t>();
    gpu::minmaxz_add<uint32_t>(s, x[i], static_cast<uint32_t>(i));
    parts.push_back(s);
  }
  std::shuffle(parts.begin(), parts.end(), rng);
  const gpu::MinMaxZOp<uint32_t> op;
  while (parts.size() > 1) {
    const size_t i = rng() % (parts.size() - 1);
    const bool swap = rng() & 1;
    parts[i] = swap ? op(parts[i + 1], parts[i]) : op(parts[i], parts[i + 1]);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(i) + 1);
  }
  gpu::MinMaxZ<uint32_t> r = op(gpu::minmaxz_identity<uint32_t>(), parts[0]);
  gpu::fix_zero_signs(r);
  return r;
}

TEST(GpuHelpers, OrderFreeMinMaxEqualsTheInOrderFoldWithSignedZeros) {
  std::mt19937_64 rng(11);
  const float pool[] = {0.0f, -0.0f, 1.0f, 2.5f, -3.0f, 0.5f, -0.0f, 0.0f};
  for (int trial = 0; trial < 4000; ++trial) {
    const size_t n = 1 + rng() % 40;
    std::vector<float> x(n);
    const int kind = trial % 4;  // 0 any, 1 non-negative (min may be ±0), 2 non-positive, 3 zeros only
    for (float& v : x) {
      v = pool[rng() % 8];
      if (kind == 1) v = q::abs_f(v) == 0.0f ? v : q::abs_f(v);
      if (kind == 2) v = q::abs_f(v) == 0.0f ? v : -q::abs_f(v);
      if (kind == 3) v = (rng() & 1) ? 0.0f : -0.0f;
    }
    const auto [mn, mx] = cpu_fold(x);
    for (int rep = 0; rep < 4; ++rep) {
      const auto r = random_tree_reduce(x, rng);
      ASSERT_EQ(bits_of(r.mn), bits_of(mn)) << "trial " << trial;
      ASSERT_EQ(bits_of(r.mx), bits_of(mx)) << "trial " << trial;
    }
  }
}

TEST(GpuHelpers, TensorStatsEqualTheInOrderFold) {
  std::mt19937_64 rng(13);
  for (int trial = 0; trial < 500; ++trial) {
    const size_t n = 1 + rng() % 300;
    std::vector<float> x(n);
    std::normal_distribution<float> nd;
    for (float& v : x) v = (rng() % 5 == 0) ? ((rng() & 1) ? 0.0f : -0.0f) : nd(rng);
    if (trial % 2)
      for (float& v : x) v = q::abs_f(v) == 0.0f ? v : q::abs_f(v);
    const auto [mn, mx] = cpu_fold(x);
    std::vector<gpu::TensorStats> parts;
    for (size_t i = 0; i < n; ++i) parts.push_back(gpu::tensor_stats_of(x[i], static_cast<int64_t>(i)));
    std::shuffle(parts.begin(), parts.end(), rng);
    gpu::TensorStats s = gpu::tensor_stats_identity();
    for (const auto& p : parts) s = gpu::TensorStatsOp{}(p, s);
    gpu::MinMaxZ<unsigned long long> m{s.mn, s.mx, s.zkey};
    gpu::fix_zero_signs(m);
    ASSERT_EQ(bits_of(m.mn), bits_of(mn)) << "trial " << trial;
    ASSERT_EQ(bits_of(m.mx), bits_of(mx)) << "trial " << trial;
    ASSERT_EQ(s.nonfinite, 0u);
  }
  const float inf = q::f32_from_bits(0x7f800000u), nan = q::f32_from_bits(0x7fc00000u);
  EXPECT_EQ(gpu::TensorStatsOp{}(gpu::tensor_stats_of(inf, 0), gpu::tensor_stats_of(nan, 1)).nonfinite, 2u);
}

// The quad mapping of the row kernels (quad c of a row → bytes [c·bits/2, ...) holding codes 4c..4c+3
// packed by pack_quad) reproduces the CPU reference's packed rows, padding included.
TEST(GpuHelpers, QuadPackingReproducesTheCpuLayout) {
  std::mt19937_64 rng(17);
  std::normal_distribution<float> nd;
  for (const int bits : {8, 4, 2}) {
    for (const int64_t D : {1, 2, 3, 4, 5, 6, 7, 64, 67}) {
      const int64_t T = 3;
      std::vector<float> X(static_cast<size_t>(T * D));
      for (float& v : X) v = nd(rng);
      const QuantSpec spec = QuantSpec::parse("int" + std::to_string(bits) + "-asym-token-g0");
      const std::vector<int64_t> seq = {0, T};
      const QuantizedTensor qt = quantize(spec, Target::CKV, X.data(), T, D, seq);
      const int64_t rb = qt.row_bytes();
      std::vector<uint8_t> mine(static_cast<size_t>(T * rb), 0xAA);
      for (int64_t t = 0; t < T; ++t) {
        const float s = qt.scale_at(t), o = qt.offset_at(t);
        for (int64_t c = 0; c < (D + 3) / 4; ++c) {
          uint32_t u[4] = {0, 0, 0, 0};
          for (int e = 0; e < 4; ++e)
            if (4 * c + e < D) u[e] = q::encode_asym(X[t * D + 4 * c + e], s, o, bits);
          const uint32_t w = bits == 8   ? gpu::pack_quad<8>(u[0], u[1], u[2], u[3])
                             : bits == 4 ? gpu::pack_quad<4>(u[0], u[1], u[2], u[3])
                                         : gpu::pack_quad<2>(u[0], u[1], u[2], u[3]);
          const int64_t qb = bits / 2;
          for (int64_t k = 0; k < qb && c * qb + k < rb; ++k)
            mine[t * rb + c * qb + k] = static_cast<uint8_t>(w >> (8 * k));
        }
      }
      EXPECT_EQ(mine, qt.codes) << "bits " << bits << ", D " << D;
    }
  }
}

}  // namespace
