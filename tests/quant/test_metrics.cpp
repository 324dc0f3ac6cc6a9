// error_metrics (quant/include/latentq/metrics.h) on tiny hand-computed inputs.
#include "latentq/metrics.h"

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
