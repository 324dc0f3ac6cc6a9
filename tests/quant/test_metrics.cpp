// error_metrics (quant/include/latentq/metrics.h) on tiny hand-computed inputs.
#include "latentq/metrics.h"

#include <random>
#include <utility>
#include <vector>

#include "latentq/quantize.h"
#include "test_helpers.h"

namespace {
using latentq::error_metrics;
const double kInf = std::numeric_limits<double>::infinity();

TEST(Metrics, HandComputed2x2) {
  // x = [1 2; 3 4], x̂ = [1 2; 3 5]: ‖e‖² = 1, ‖x‖² = 1+4+9+16 = 30.
  //   rel_fro = sqrt(1/30) = 0.18257418583505536, mse = 1/4, sqnr = 10·log10(30) = 14.771212547196624 dB,
  //   max_abs_err = 1, cos: row 0 = 1, row 1 = (9 + 20) / (5·sqrt(34)) = 0.99469179382655...,
  //   cos_mean = 0.99734589691327...
  const float x[] = {1, 2, 3, 4}, xh[] = {1, 2, 3, 5};
  const latentq::ErrorMetrics m = error_metrics(x, xh, 2, 2);
  EXPECT_DOUBLE_EQ(m.rel_fro, std::sqrt(1.0 / 30.0));
  EXPECT_NEAR(m.rel_fro, 0.18257418583505536, 1e-15);
  EXPECT_DOUBLE_EQ(m.mse, 0.25);
  EXPECT_NEAR(m.sqnr_db, 14.771212547196624, 1e-12);
  EXPECT_DOUBLE_EQ(m.max_abs_err, 1.0);
  EXPECT_NEAR(m.cos_mean, (1.0 + 29.0 / (5.0 * std::sqrt(34.0))) / 2.0, 1e-15);
  EXPECT_NEAR(m.cos_mean, 0.9973458969132757, 1e-13);
}

TEST(Metrics, ExactReconstruction) {
  const float x[] = {0.5f, -3, 7, 0, 1e-3f, 2};
  const latentq::ErrorMetrics m = error_metrics(x, x, 2, 3);
  EXPECT_EQ(m.rel_fro, 0.0);
  EXPECT_EQ(m.mse, 0.0);
  EXPECT_EQ(m.sqnr_db, kInf);
  EXPECT_EQ(m.max_abs_err, 0.0);
  EXPECT_DOUBLE_EQ(m.cos_mean, 1.0);
}

TEST(Metrics, ZeroRows) {
  // Row 0 zero in both (equal): cos counts 1. Row 1: x = [1, 0], x̂ = [0, 1]: cos 0.
  //   ‖e‖² = 2, ‖x‖² = 1: rel_fro = sqrt(2), mse = 2/4, sqnr = 10·log10(1/2) = -3.0102999566398116 dB.
  {
    const float x[] = {0, 0, 1, 0}, xh[] = {0, 0, 0, 1};
    const latentq::ErrorMetrics m = error_metrics(x, xh, 2, 2);
    EXPECT_DOUBLE_EQ(m.rel_fro, std::sqrt(2.0));
    EXPECT_DOUBLE_EQ(m.mse, 0.5);
    EXPECT_NEAR(m.sqnr_db, -3.0102999566398116, 1e-12);
    EXPECT_DOUBLE_EQ(m.max_abs_err, 1.0);
    EXPECT_DOUBLE_EQ(m.cos_mean, 0.5);
  }
  // x̂ row zero, x row not: cos 0 for that row; x row zero, x̂ not: cos 0.
  {
    const float x[] = {3, 4, 0, 0}, xh[] = {0, 0, 1, 0};
    const latentq::ErrorMetrics m = error_metrics(x, xh, 2, 2);
    EXPECT_DOUBLE_EQ(m.cos_mean, 0.0);
    EXPECT_DOUBLE_EQ(m.rel_fro, std::sqrt(26.0 / 25.0));
    EXPECT_DOUBLE_EQ(m.max_abs_err, 4.0);
  }
  // All-zero reference: rel_fro inf and sqnr -inf when x̂ is not zero; 0 and +inf when it is.
  {
    const float x[] = {0, 0}, xh[] = {0, 0.5f};
    const latentq::ErrorMetrics m = error_metrics(x, xh, 1, 2);
    EXPECT_EQ(m.rel_fro, kInf);
    EXPECT_EQ(m.sqnr_db, -kInf);
    EXPECT_DOUBLE_EQ(m.mse, 0.125);
    EXPECT_DOUBLE_EQ(m.cos_mean, 0.0);
    const latentq::ErrorMetrics z = error_metrics(x, x, 1, 2);
    EXPECT_EQ(z.rel_fro, 0.0);
    EXPECT_EQ(z.sqnr_db, kInf);
    EXPECT_DOUBLE_EQ(z.cos_mean, 1.0);
  }
}

TEST(Metrics, AccumulatesInDouble) {
  // 1e6 elements, x = 1 + 2^-12, x̂ = 1. In double every partial sum is exact (at most 45 significant
  // bits), so ‖x‖² = 1e6·(1 + 2^-12)² and ‖e‖² = 1e6·2^-24 exactly; a float32 accumulator of ‖x‖² would
  // drop the 2^-11 terms once the sum passes 2^13 and miss rel_fro in the 5th digit.
  const int64_t n = 1000000;
  std::vector<float> x(n, 1.0f + 0x1p-12f), xh(n, 1.0f);
  const latentq::ErrorMetrics m = error_metrics(x.data(), xh.data(), 1000, 1000);
  const double ref2 = 1e6 * (1 + 0x1p-12) * (1 + 0x1p-12), err2 = 1e6 * 0x1p-24;
  EXPECT_NEAR(m.rel_fro, std::sqrt(err2 / ref2), 1e-15);
  EXPECT_NEAR(m.sqnr_db, 10 * std::log10(ref2 / err2), 1e-9);
  EXPECT_DOUBLE_EQ(m.mse, 0x1p-24);
  EXPECT_DOUBLE_EQ(m.max_abs_err, 0x1p-12);
}

}  // namespace

// The documented summation order, bit for bit, under every CPU kernel selection: per row, element d in
// lane d mod 8 (index order within a lane), lanes combined ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), rows in
// order; rows shorter than 8 and tails of 1-7 elements; an exactly reconstructed row and a zero row (cos
// counted 1 when equal). Fixed seed; kernel, T and D in the trace.
TEST(ErrorMetrics, LaneSumsInTheDocumentedOrderUnderEveryKernel) {
  for (const latentq::CpuKernel k : latentq::available_cpu_kernels())
    for (const auto& [T, D] : std::vector<std::pair<int64_t, int64_t>>{{3, 5}, {7, 8}, {5, 19}, {4, 576}, {2, 1}}) {
      const latentq::ScopedCpuKernel kernel(k);
      SCOPED_TRACE("kernel=" + std::to_string(static_cast<int>(k)) + " T=" + std::to_string(T) +
                   " D=" + std::to_string(D) + " seed=7");
      std::mt19937 rng(7);
      std::normal_distribution<float> nd;
      std::vector<float> x(static_cast<size_t>(T * D)), xh(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = nd(rng);
        xh[i] = x[i] + 0.01f * nd(rng);
      }
      if (T > 2) {
        for (int64_t d = 0; d < D; ++d) xh[D + d] = x[D + d];              // row 1 exact
        for (int64_t d = 0; d < D; ++d) x[2 * D + d] = xh[2 * D + d] = 0;  // row 2 zero in both
      }
      double err2 = 0, ref2 = 0, maxabs = 0, cos_sum = 0;
      for (int64_t t = 0; t < T; ++t) {
        double l[5][8] = {};
        bool equal = true;
        for (int64_t d = 0; d < D; ++d) {
          const double a = x[t * D + d], b = xh[t * D + d], e = b - a;
          l[0][d % 8] += a * b;
          l[1][d % 8] += a * a;
          l[2][d % 8] += b * b;
          l[3][d % 8] += e * e;
          maxabs = std::max(maxabs, std::abs(e));
          equal = equal && a == b;
        }
        double s[4];
        for (int j = 0; j < 4; ++j)
          s[j] = ((l[j][0] + l[j][1]) + (l[j][2] + l[j][3])) + ((l[j][4] + l[j][5]) + (l[j][6] + l[j][7]));
        err2 += s[3];
        ref2 += s[1];
        cos_sum += (s[1] > 0 && s[2] > 0) ? s[0] / (std::sqrt(s[1]) * std::sqrt(s[2])) : (equal ? 1.0 : 0.0);
      }
      const latentq::ErrorMetrics m = error_metrics(x.data(), xh.data(), T, D);
      EXPECT_EQ(m.rel_fro, std::sqrt(err2 / ref2));
      EXPECT_EQ(m.mse, err2 / (static_cast<double>(T) * static_cast<double>(D)));
      EXPECT_EQ(m.sqnr_db, 10.0 * std::log10(ref2 / err2));
      EXPECT_EQ(m.max_abs_err, maxabs);
      EXPECT_EQ(m.cos_mean, cos_sum / static_cast<double>(T));
    }
}
