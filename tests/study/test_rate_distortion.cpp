// The Gaussian rate–distortion bound (latentq/analysis/rate_distortion.h): reverse water-filling on spectra
// whose θ and D are computed by hand, the fit-split spectrum of a small matrix, and the /latent_error
// bound columns.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "latentq/analysis/rate_distortion.h"
#include "latentq/study.h"
#include "synth_dump.h"

namespace {
using namespace latentq;

// λ = diag(4, 1, 1/4, 1/16), d = 4, R = rate per element, so d·R bits per vector.
const std::vector<double> kLambda = {0.25, 4.0, 0.0625, 1.0};  // any order

TEST(WaterFilling, HandComputedLevels) {
  // R = 2 (8 bits): all active, θ = geomean(λ)·2^(−2R) = 0.5/16 = 1/32; D = 4θ = 1/8.
  WaterFilling w = reverse_water_filling(kLambda, 2.0);
  EXPECT_NEAR(w.theta, 1.0 / 32, 1e-12);
  EXPECT_NEAR(w.distortion, 0.125, 1e-12);
  EXPECT_NEAR(w.rate, 2.0, 1e-12);
  // R = 1 (4 bits): three active, −1.5·log2 θ = 4 → θ = 2^(−8/3) ∈ (1/16, 1/4); D = 3θ + 1/16.
  w = reverse_water_filling(kLambda, 1.0);
  EXPECT_NEAR(w.theta, std::exp2(-8.0 / 3), 1e-12);
  EXPECT_NEAR(w.distortion, 3 * std::exp2(-8.0 / 3) + 0.0625, 1e-12);
  // R = 0.5 (2 bits): {4, 1} active, ½·log2(4/θ²) = 2 → θ = 1/2; D = 0.5 + 0.5 + 0.25 + 0.0625.
  w = reverse_water_filling(kLambda, 0.5);
  EXPECT_NEAR(w.theta, 0.5, 1e-12);
  EXPECT_NEAR(w.distortion, 1.3125, 1e-12);
  // R = 0.25 (1 bit): {4} active, θ = 1 (exactly at λ = 1); D = 1 + 1 + 0.25 + 0.0625.
  w = reverse_water_filling(kLambda, 0.25);
  EXPECT_NEAR(w.theta, 1.0, 1e-12);
  EXPECT_NEAR(w.distortion, 2.3125, 1e-12);
  // R ≤ 0: store nothing, D = Σλ.
  for (double r : {0.0, -3.0}) {
    w = reverse_water_filling(kLambda, r);
    EXPECT_EQ(w.theta, 4.0);
    EXPECT_EQ(w.distortion, 5.3125);
    EXPECT_EQ(w.rate, 0.0);
  }
}

TEST(WaterFilling, ZeroAndNegativeEigenvalues) {
  // λ = {1, 0}: R = 1 per element = 2 bits on the one positive component: θ = 2^(−4), D = 1/16.
  WaterFilling w = reverse_water_filling(std::vector<double>{1.0, 0.0}, 1.0);
  EXPECT_NEAR(w.theta, 1.0 / 16, 1e-13);
  EXPECT_NEAR(w.distortion, 1.0 / 16, 1e-13);
  // A rounding-negative eigenvalue counts as 0.
  w = reverse_water_filling(std::vector<double>{1.0, -1e-17}, 1.0);
  EXPECT_NEAR(w.distortion, 1.0 / 16, 1e-13);
  w = reverse_water_filling(std::vector<double>{0.0, 0.0}, 3.0);
  EXPECT_EQ(w.theta, 0.0);
  EXPECT_EQ(w.distortion, 0.0);
  EXPECT_THROW(reverse_water_filling(std::vector<double>{}, 1.0), std::invalid_argument);
  EXPECT_THROW(reverse_water_filling(std::vector<double>{1.0, std::nan("")}, 1.0), std::invalid_argument);
  EXPECT_THROW(reverse_water_filling(std::vector<double>{1.0}, std::numeric_limits<double>::infinity()),
               std::invalid_argument);
}

TEST(WaterFilling, FitSpectrumAndBound) {
  // Two sequences of 4 and 2 tokens: fit = the first. Fit rows centered at μ = (3, −1) are
  // (±2, 0), (0, ±1): Σ = diag(8/4, 2/4) = diag(2, 0.5). ‖X‖² = 26 + 2 + 9 + 13 + 2 + 2 = 54 over
  // 6·2 elements: mean_square = 4.5.
  const std::vector<float> X = {5, -1, 1, -1, 3, 0, 3, -2, 1, 1, 1, 1};
  const std::vector<int64_t> offsets = {0, 4, 6};
  const LatentSpectrum s = latent_spectrum(X.data(), 6, 2, offsets);
  ASSERT_EQ(s.eigenvalues.size(), 2u);
  EXPECT_NEAR(s.eigenvalues[0], 2.0, 1e-12);
  EXPECT_NEAR(s.eigenvalues[1], 0.5, 1e-12);
  EXPECT_EQ(s.fit_tokens, 4);
  EXPECT_DOUBLE_EQ(s.mean_square, 4.5);
  // b = 32/6 + 1 bits per element: the mean (2 fp32 over 6 tokens) leaves R = 1; both active,
  // θ = sqrt(2·0.5)·2^(−2) = 1/4, D = 1/2, mse_bound = 1/4, bound rel_fro = sqrt(0.25/4.5).
  const RateDistortionBound b = rate_distortion_bound(s, 32.0 / 6 + 1);
  EXPECT_NEAR(b.rate, 1.0, 1e-12);
  EXPECT_NEAR(b.mse_bound, 0.25, 1e-12);
  EXPECT_NEAR(b.rel_fro, std::sqrt(0.25 / 4.5), 1e-12);
  EXPECT_NEAR(gap_db(0.025, 0.25), -10.0, 1e-12);  // a negative gap is reported as is
  EXPECT_NEAR(gap_db(2.5, 0.25), 10.0, 1e-12);
  EXPECT_EQ(gap_db(1.0, 0.0), std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(gap_db(0.0, 0.0)));
  // A split with an empty side is an error (as the probes).
  EXPECT_THROW(latent_spectrum(X.data(), 6, 2, std::vector<int64_t>{0, 1, 1}), std::invalid_argument);
}

TEST(WaterFilling, LatentErrorColumns) {
  lqtest::TempDir dir;
  const auto path = dir / "dump.h5";
  lqtest::write_synth(path, lqtest::make_synth());
  LoadOptions o;
  o.attention = false;
  const Dump dump = load_dump(path, o);
  const StudyConfig config = parse_config(
      "[quantizers]\nbits = [4, 2]\nschemes = [\"asym\"]\ngranularities = "
      "[\"channel\"]\ngroup_sizes = [0]\nextra = [\"bf16\"]\n",
      "rd.toml", dir.path());
  auto backend = make_cpu_backend();
  const ColumnTable t = run_latent_error(dump, plan_cells(config, dump), *backend);
  const auto& layer = t.get<int64_t>("layer");
  const auto& target = t.get<std::string>("target");
  const auto& bpe = t.get<double>("bits_per_element");
  const auto& rf = t.get<double>("rel_fro");
  const auto& brf = t.get<double>("bound_rel_fro");
  const auto& gap = t.get<double>("gap_db");
  ASSERT_GT(t.num_rows(), 0u);
  for (size_t i = 0; i < t.num_rows(); ++i) {
    const Layer& l = dump.layer(static_cast<int>(layer[i]));
    const bool ckv = target[i] == "c_kv";
    const int64_t D = ckv ? dump.attrs.kv_lora_rank : dump.attrs.qk_rope_head_dim;
    const LatentSpectrum s =
        latent_spectrum(ckv ? l.c_kv.data() : l.k_pe.data(), dump.num_tokens(), D, dump.seq_offsets);
    EXPECT_DOUBLE_EQ(brf[i], rate_distortion_bound(s, bpe[i]).rel_fro);
    // gap = 10·log10(mse/mse_bound) = 20·log10(rel_fro/bound_rel_fro): same normalization.
    EXPECT_NEAR(gap[i], 20 * std::log10(rf[i] / brf[i]), 1e-9);
  }
}

}  // namespace
