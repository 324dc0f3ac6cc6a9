// The Gaussian rate–distortion bound (latentq/analysis/rate_distortion.h): reverse water-filling on spectra
// whose θ and D are computed by hand, the fit-split spectrum of a small matrix, and the /latent_error
// bound columns; the score-space bound (score_metric, score_spectrum, score_bound_mse, score_mse) on hand
// cases, with M = I against the plain bound, and the /latent_error score columns; /score_vs_attention.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
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
    // No attention data loaded: no score columns' values.
    EXPECT_TRUE(std::isnan(t.get<double>("score_mse")[i]));
    EXPECT_TRUE(std::isnan(t.get<double>("score_bound_mse")[i]));
    EXPECT_TRUE(std::isnan(t.get<double>("score_gap_db")[i]));
  }
}

// A LatentSpectrum with a given covariance (what score_spectrum reads) over T tokens.
LatentSpectrum spectrum_of(const Eigen::MatrixXd& cov, int64_t T) {
  LatentSpectrum s;
  s.dim = cov.rows();
  s.tokens = T;
  s.covariance = cov;
  return s;
}

TEST(ScoreBound, HandComputedMetric) {
  // c_kv: Tq = 1, H = 2, dq = 1, d = 2; q = (1 | 2), W_UK,0 = (1, 1), W_UK,1 = (0, 1):
  // q_lat,0 = (1, 1), q_lat,1 = (0, 2); M = ([[1, 1], [1, 1]] + [[0, 0], [0, 4]]) / 2.
  Eigen::MatrixXd M = score_metric(std::vector<float>{1, 2}, std::vector<float>{1, 1, 0, 1}, 1, 2, 1, 2);
  EXPECT_DOUBLE_EQ(M(0, 0), 0.5);
  EXPECT_DOUBLE_EQ(M(0, 1), 0.5);
  EXPECT_DOUBLE_EQ(M(1, 0), 0.5);
  EXPECT_DOUBLE_EQ(M(1, 1), 2.5);
  // k_pe (no W): Tq = 2, H = 1, d = 2; rows (1, 2), (3, 0): M = ([[1, 2], [2, 4]] + [[9, 0], [0, 0]]) / 2.
  M = score_metric(std::vector<float>{1, 2, 3, 0}, {}, 2, 1, 2, 2);
  EXPECT_DOUBLE_EQ(M(0, 0), 5.0);
  EXPECT_DOUBLE_EQ(M(0, 1), 1.0);
  EXPECT_DOUBLE_EQ(M(1, 1), 2.0);
  EXPECT_THROW(score_metric(std::vector<float>{1, 2, 3}, {}, 2, 1, 2, 2), std::invalid_argument);  // q size
  EXPECT_THROW(score_metric(std::vector<float>{1, 2}, {}, 1, 1, 2, 3), std::invalid_argument);     // no W, dq ≠ d
  EXPECT_THROW(score_metric(std::vector<float>{1, 2}, std::vector<float>{1, 1, 0}, 1, 2, 1, 2), std::invalid_argument);
  EXPECT_THROW(score_metric(std::vector<float>{1, NAN}, {}, 1, 1, 2, 2), std::invalid_argument);
}

TEST(ScoreBound, HandComputed2x2) {
  // Σ = diag(2, 0.5), M = diag(2, 0.125): M^{1/2} Σ M^{1/2} = diag(4, 1/16), μ = (4, 1/16). T = 32: the mean
  // costs 32/T = 1 bit per element, so b = 2 leaves R = 1, d·R = 2 bits. Both active would need θ =
  // sqrt(4/16)·2^(−2) = 1/8 > 1/16: only μ = 4 is active, ½·log2(4/θ) = 2 → θ = 1/4; D = 1/4 + 1/16.
  Eigen::MatrixXd cov = Eigen::Vector2d(2, 0.5).asDiagonal(), M = Eigen::Vector2d(2, 0.125).asDiagonal();
  ScoreSpectrum ss = score_spectrum(spectrum_of(cov, 32), M);
  ASSERT_EQ(ss.eigenvalues.size(), 2u);
  EXPECT_NEAR(ss.eigenvalues[0], 4.0, 1e-14);
  EXPECT_NEAR(ss.eigenvalues[1], 0.0625, 1e-14);
  EXPECT_NEAR(score_bound_mse(ss, 2.0), 0.3125, 1e-12);
  // b = 4 (R = 3, 6 bits): both active, θ = sqrt(4/16)·2^(−6) = 1/128; D = 2θ = 1/64.
  EXPECT_NEAR(score_bound_mse(ss, 4.0), 1.0 / 64, 1e-12);
  // The same pair rotated by 45° (Σ and M commute): the same μ.
  const double c = std::sqrt(0.5);
  Eigen::Matrix2d Q;
  Q << c, -c, c, c;
  ss = score_spectrum(spectrum_of(Q * cov * Q.transpose(), 32), Q * M * Q.transpose());
  EXPECT_NEAR(ss.eigenvalues[0], 4.0, 1e-12);
  EXPECT_NEAR(ss.eigenvalues[1], 0.0625, 1e-12);
  // Not commuting, M singular: Σ = [[2, 1], [1, 2]], M = diag(4, 0): M^{1/2} = diag(2, 0), M^{1/2} Σ M^{1/2} =
  // diag(8, 0); R = 1 puts all 2 bits on μ = 8: θ = 8/16 = 1/2, D = 1/2.
  cov << 2, 1, 1, 2;
  M = Eigen::Vector2d(4, 0).asDiagonal();
  ss = score_spectrum(spectrum_of(cov, 32), M);
  EXPECT_NEAR(ss.eigenvalues[0], 8.0, 1e-12);
  EXPECT_NEAR(ss.eigenvalues[1], 0.0, 1e-12);
  EXPECT_NEAR(score_bound_mse(ss, 2.0), 0.5, 1e-12);
  EXPECT_NEAR(ss.sqrt_metric(0, 0), 2.0, 1e-14);
  EXPECT_NEAR(ss.sqrt_metric(1, 1), 0.0, 1e-14);
  // score_mse: M = [[2, 1], [1, 2]], errors (1, 0), (0, 1), (1, 1): eᵀMe = 2, 2, 6, mean 10/3.
  M << 2, 1, 1, 2;
  ss = score_spectrum(spectrum_of(cov, 32), M);
  const std::vector<float> X = {0, 0, 1, 1, -1, 2}, dec = {1, 0, 1, 2, 0, 3};
  EXPECT_NEAR(score_mse(X.data(), dec.data(), 3, 2, ss.sqrt_metric), 10.0 / 3, 1e-13);
  EXPECT_THROW(score_spectrum(spectrum_of(cov, 32), Eigen::MatrixXd::Identity(3, 3)), std::invalid_argument);
  EXPECT_THROW(score_spectrum(LatentSpectrum{{1.0, 1.0}, 4, 8, 2, 1.0, {}}, M), std::invalid_argument);
}

TEST(ScoreBound, IdentityMetricIsThePlainBound) {
  // M = I: score_mse = d·mse and score_bound_mse = d·mse_bound, so score_gap_db = gap_db.
  for (const uint64_t seed : {1u, 7u, 42u}) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> n01(0, 1);
    const int64_t T = 96, d = 12;
    SCOPED_TRACE(testing::Message() << "seed " << seed << ", X [" << T << ", " << d << "]");
    std::vector<float> X(T * d), dec(T * d);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < d; ++j) {
        X[t * d + j] = static_cast<float>((1.0 + j) * n01(rng) + 0.5 * j);  // unequal variances and means
        dec[t * d + j] = X[t * d + j] + static_cast<float>(0.1 * n01(rng));
      }
    const LatentSpectrum s = latent_spectrum(X.data(), T, d, std::vector<int64_t>{0, 40, 96});
    const ScoreSpectrum ss = score_spectrum(s, Eigen::MatrixXd::Identity(d, d));
    const double mse = error_metrics(X.data(), dec.data(), T, d).mse;
    const double smse = score_mse(X.data(), dec.data(), T, d, ss.sqrt_metric);
    EXPECT_NEAR(smse, d * mse, 1e-9 * d * mse);
    for (const double bits : {1.0, 2.0, 4.5, 8.0}) {
      SCOPED_TRACE(testing::Message() << "bits " << bits);
      const RateDistortionBound b = rate_distortion_bound(s, bits);
      const double sb = score_bound_mse(ss, bits);
      EXPECT_NEAR(sb, d * b.mse_bound, 1e-9 * d * b.mse_bound);
      EXPECT_NEAR(gap_db(smse, sb), gap_db(mse, b.mse_bound), 1e-8);
    }
  }
}

TEST(ScoreBound, LatentErrorScoreColumns) {
  lqtest::TempDir dir;
  const auto path = dir / "dump.h5";
  lqtest::write_synth(path, lqtest::make_synth());
  const Dump dump = load_dump(path);  // with the attention data
  const StudyConfig config = parse_config(
      "[quantizers]\nbits = [4, 2]\nschemes = [\"asym\"]\ngranularities = "
      "[\"channel\"]\ngroup_sizes = [0]\nextra = [\"bf16\", \"rot,int4-asym-token\"]\n",
      "rd.toml", dir.path());
  const std::vector<Cell> cells = plan_cells(config, dump);
  auto backend = make_cpu_backend();
  const ColumnTable t = run_latent_error(dump, cells, *backend);
  const auto& bpe = t.get<double>("bits_per_element");
  const auto& smse = t.get<double>("score_mse");
  const auto& sb = t.get<double>("score_bound_mse");
  const auto& sg = t.get<double>("score_gap_db");
  const DumpAttrs& A = dump.attrs;
  const int64_t T = dump.num_tokens();
  ASSERT_EQ(t.num_rows(), cells.size());
  for (size_t i = 0; i < cells.size(); ++i) {
    const Cell& c = cells[i];
    SCOPED_TRACE(c.key());
    const Layer& l = dump.layer(c.layer);
    const bool ckv = c.target == Target::CKV;
    const int64_t D = ckv ? A.kv_lora_rank : A.qk_rope_head_dim;
    const float* X = ckv ? l.c_kv.data() : l.k_pe.data();
    const Eigen::MatrixXd M =
        ckv ? score_metric(l.q_nope, l.w_uk, l.num_query_rows(), A.num_heads, A.qk_nope_head_dim, A.kv_lora_rank)
            : score_metric(l.q_pe, {}, l.num_query_rows(), A.num_heads, D, D);
    const ScoreSpectrum ss = score_spectrum(latent_spectrum(X, T, D, dump.seq_offsets), M);
    EXPECT_DOUBLE_EQ(sb[i], score_bound_mse(ss, bpe[i]));
    EXPECT_GT(sb[i], 0.0);
    if (c.quantizer.transform.kind == TransformKind::None) {
      // eᵀMe summed directly, against the dgemm with M^{1/2}.
      std::vector<float> dec(T * D);
      quantize_dequantize(c.quantizer.spec, c.target, X, T, D, dump.seq_offsets, dec.data());
      double sum = 0;
      for (int64_t k = 0; k < T; ++k)
        for (int64_t a = 0; a < D; ++a)
          for (int64_t b = 0; b < D; ++b)
            sum += (double{dec[k * D + a]} - X[k * D + a]) * M(a, b) * (double{dec[k * D + b]} - X[k * D + b]);
      EXPECT_NEAR(smse[i], sum / T, 1e-9 * sum / T);
    } else {
      EXPECT_GT(smse[i], 0.0);
    }
    EXPECT_DOUBLE_EQ(sg[i], gap_db(smse[i], sb[i]));
  }
}

// /score_vs_attention from hand-made tables: 2 layers, c_kv, quantizers a, b, c, e (and d on layer 0 only).
TEST(ScoreBound, ScoreVsAttentionTable) {
  ColumnTable le, ae;
  le.add<int64_t>("layer") = {0, 0, 0, 0, 0, 1, 1, 1, 1};
  le.add<std::string>("target") = std::vector<std::string>(9, "c_kv");
  le.add<std::string>("quantizer") = {"a", "b", "c", "d", "e", "a", "b", "c", "e"};
  le.add<double>("bits_per_element") = {4.25, 4.5, 4.75, 2, 8, 4.25, 4.5, 4.75, 8};
  le.add<double>("mse") = {1, 2, 3, 4, 10, 1, 1, 5, 10};
  le.add<double>("score_mse") = {3, 1, 2, 4, 10, 10, 20, 30, 40};
  ae.add<int64_t>("layer") = {0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1};
  ae.add<std::string>("targets") = {"c_kv", "c_kv", "c_kv", "c_kv", "c_kv", "c_kv+k_pe",
                                    "c_kv", "c_kv", "c_kv", "c_kv", "c_kv"};
  ae.add<std::string>("quantizer") = {"a", "b", "c", "d", "e", "a", "a", "b", "c", "e", "svd-rank4"};
  ae.add<double>("kl_mean") = {0.3, 0.1, 0.2, NAN, 1, 9, 0.1, 0.2, 0.3, 1, 0.5};
  const ColumnTable t = score_vs_attention(le, ae);
  ASSERT_EQ(t.names(), column_names(score_vs_attention_spec()));
  ASSERT_EQ(t.num_rows(), 4u);
  EXPECT_EQ(t.get<int64_t>("layer"), (std::vector<int64_t>{0, 1, -1, -1}));
  EXPECT_EQ(t.get<std::string>("target"), std::vector<std::string>(4, "c_kv"));
  // Band 4 (a, b, c) gets a row; band 8 (e alone) does not (fewer than 3).
  EXPECT_EQ(t.get<int64_t>("bits_band"), (std::vector<int64_t>{-1, -1, -1, 4}));
  EXPECT_EQ(t.get<int64_t>("n_quantizers"), (std::vector<int64_t>{4, 4, 4, 3}));
  // Layer 0: d left out (NaN kl). kl (0.3, 0.1, 0.2, 1) against score_mse (3, 1, 2, 10): ρ = 1; against mse
  // (1, 2, 3, 10): rank deviations (−1.5, −0.5, 0.5, 1.5) and (0.5, −1.5, −0.5, 1.5): ρ = 2/5.
  // Layer 1: kl (0.1, 0.2, 0.3, 1); score_mse (10, 20, 30, 40): ρ = 1; mse (1, 1, 5, 10): ranks (1.5, 1.5, 3, 4),
  // deviations (−1, −1, 0.5, 1.5) against (−1.5, −0.5, 0.5, 1.5): Σxy = 4.5, Σxx = 4.5, Σyy = 5: ρ = 3/√10.
  // Layer −1 (d is not on layer 1): means kl (0.2, 0.15, 0.25, 1), score_mse (6.5, 10.5, 16, 25), mse
  // (1, 1.5, 4, 10): kl ranks (2, 1, 3, 4) against (1, 2, 3, 4) for both: Σxy = 4 of 5, ρ = 0.8.
  // Band 4: a, b, c alone: kl ranks (2, 1, 3) against (1, 2, 3): ρ = 1/2 for both.
  const auto& rs = t.get<double>("spearman_score_mse");
  const auto& rm = t.get<double>("spearman_mse");
  EXPECT_DOUBLE_EQ(rs[0], 1.0);
  EXPECT_DOUBLE_EQ(rm[0], 0.4);
  EXPECT_DOUBLE_EQ(rs[1], 1.0);
  EXPECT_NEAR(rm[1], 3 / std::sqrt(10.0), 1e-15);
  EXPECT_DOUBLE_EQ(rs[2], 0.8);
  EXPECT_DOUBLE_EQ(rm[2], 0.8);
  EXPECT_DOUBLE_EQ(rs[3], 0.5);
  EXPECT_DOUBLE_EQ(rm[3], 0.5);
  ColumnTable no_score;
  no_score.add<int64_t>("layer");
  EXPECT_THROW(score_vs_attention(no_score, ae), std::invalid_argument);
}

}  // namespace
