// Cross-layer probe: linear CKA invariances, matched-channel Pearson on constructed correlations,
// constant channels, shared-basis reconstruction on constructed windows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "latentq/analysis/cross_layer.h"
#include "latentq/analysis/svd_probe.h"
#include "probe_test_util.h"

using namespace latentq::probes;
using probe_test::gaussian;
using probe_test::orthonormal;
using probe_test::to_row_major_f32;

TEST(LinearCka, OneForOrthogonalTransformsAndScaling) {
  const uint64_t seed = 11;
  std::mt19937_64 rng(seed);
  const int64_t T = 1024, r = 32;
  SCOPED_TRACE(testing::Message() << "seed " << seed << " shape [" << T << ", " << r << "]");
  // Anisotropic columns with a mean, so centering matters.
  Eigen::VectorXd sd(r);
  for (int64_t i = 0; i < r; ++i) sd[i] = 1.0 + i;
  const Eigen::MatrixXd X = (gaussian(rng, T, r) * sd.asDiagonal()).rowwise() + Eigen::RowVectorXd::Constant(r, 3.0);
  const Eigen::MatrixXd Q = orthonormal(rng, r, r);
  const auto x = to_row_major_f32(X);
  const auto xq = to_row_major_f32((2.5 * X * Q).eval());
  EXPECT_NEAR(linear_cka(x.data(), r, x.data(), r, T), 1.0, 1e-9);
  // X·Q is rounded to float32 as stored (~1e-7 relative per element); CKA is at its maximum 1 there,
  // so the rounding enters at second order and the check holds at 1e-9.
  EXPECT_NEAR(linear_cka(x.data(), r, xq.data(), r, T), 1.0, 1e-9);
  const CrossLayerPair p = cross_layer_pair(x.data(), xq.data(), T, r);
  EXPECT_NEAR(p.cka_linear, 1.0, 1e-9);
  const CrossLayerPair self = cross_layer_pair(x.data(), x.data(), T, r);
  EXPECT_NEAR(self.pearson_mean_abs, 1.0, 1e-12);
  EXPECT_EQ(self.pearson_channels, r);
}

TEST(LinearCka, NearZeroForIndependent) {
  const uint64_t seed = 12;
  std::mt19937_64 rng(seed);
  const int64_t T = 4096, r = 32;
  SCOPED_TRACE(testing::Message() << "seed " << seed << " shape [" << T << ", " << r << "]");
  const auto a = probe_test::gaussian_vec(rng, T * r), b = probe_test::gaussian_vec(rng, T * r);
  const CrossLayerPair p = cross_layer_pair(a.data(), b.data(), T, r);
  EXPECT_LT(p.cka_linear, 0.05);
  EXPECT_GT(p.cka_linear, 0.0);
  EXPECT_LT(p.pearson_mean_abs, 0.05);
}

TEST(CrossLayerPair, PearsonOfConstructedChannels) {
  const uint64_t seed = 13;
  std::mt19937_64 rng(seed);
  const int64_t T = 4096, r = 32;
  const double rho = 0.6;
  SCOPED_TRACE(testing::Message() << "seed " << seed << " shape [" << T << ", " << r << "] rho " << rho);
  const Eigen::MatrixXd A = gaussian(rng, T, r), N = gaussian(rng, T, r);
  Eigen::MatrixXd B = rho * A + std::sqrt(1 - rho * rho) * N;
  B.leftCols(r / 2) *= -1.0;                                          // |ρ|: the sign must not matter
  B = (B * 5.0).rowwise() + Eigen::RowVectorXd::LinSpaced(r, -3, 3);  // nor scale and offset
  const auto a = to_row_major_f32(A), b = to_row_major_f32(B);
  const CrossLayerPair p = cross_layer_pair(a.data(), b.data(), T, r);
  // Each sample correlation has sd ≈ (1 − ρ²)/sqrt(T) ≈ 0.01; the mean of 32 is within 0.01 easily.
  EXPECT_NEAR(p.pearson_mean_abs, rho, 0.01);
  EXPECT_EQ(p.constant_channels, 0);
}

// The per-layer normalizer given by the caller (the study shares it per layer) gives the same pair
// statistics, bit for bit, as computing it inside; it is ‖XcᵀXc‖_F (checked against Eigen's product).
TEST(CrossLayerPair, GivenGramNormsGiveTheSameBits) {
  const uint64_t seed = 21;
  std::mt19937_64 rng(seed);
  const int64_t T = 300, r = 24;
  SCOPED_TRACE(testing::Message() << "seed " << seed << " shape [" << T << ", " << r << "]");
  const Eigen::MatrixXd A = gaussian(rng, T, r), B = 0.5 * A + gaussian(rng, T, r);
  const auto a = to_row_major_f32(A), b = to_row_major_f32(B);
  const double na = centered_gram_norm(a.data(), T, r), nb = centered_gram_norm(b.data(), T, r);
  Eigen::MatrixXd Ac = Eigen::Map<const Eigen::Matrix<float, -1, -1, Eigen::RowMajor>>(a.data(), T, r).cast<double>();
  Ac.rowwise() -= Ac.colwise().mean();
  EXPECT_NEAR(na, (Ac.transpose() * Ac).norm(), 1e-12 * na);
  const CrossLayerPair inside = cross_layer_pair(a.data(), b.data(), T, r);
  const CrossLayerPair given = cross_layer_pair(a.data(), b.data(), T, r, na, nb);
  EXPECT_EQ(given.cka_linear, inside.cka_linear);
  EXPECT_EQ(given.pearson_mean_abs, inside.pearson_mean_abs);
  EXPECT_EQ(given.pearson_channels, inside.pearson_channels);
  EXPECT_THROW(centered_gram_norm(a.data(), 1, r), std::invalid_argument);
}

TEST(CrossLayerPair, ConstantChannelsSkipped) {
  std::mt19937_64 rng(14);
  const int64_t T = 256, r = 8;
  auto a = probe_test::gaussian_vec(rng, T * r);
  auto b = a;                                            // identical: every usable channel has |ρ| = 1
  for (int64_t t = 0; t < T; ++t) a[t * r + 3] = 0.75f;  // channel 3 constant in A
  for (int64_t t = 0; t < T; ++t) b[t * r + 5] = -2.0f;  // channel 5 constant in B
  const CrossLayerPair p = cross_layer_pair(a.data(), b.data(), T, r);
  EXPECT_EQ(p.constant_channels, 2);
  EXPECT_EQ(p.pearson_channels, r - 2);
  EXPECT_NEAR(p.pearson_mean_abs, 1.0, 1e-12);
  std::vector<float> c(static_cast<size_t>(T * r), 1.0f);
  const CrossLayerPair q = cross_layer_pair(c.data(), b.data(), T, r);
  EXPECT_EQ(q.pearson_channels, 0);
  EXPECT_TRUE(std::isnan(q.pearson_mean_abs));
  EXPECT_TRUE(std::isnan(q.cka_linear));
  a[7] = INFINITY;
  EXPECT_THROW(cross_layer_pair(a.data(), b.data(), T, r), std::invalid_argument);
  EXPECT_THROW(cross_layer_pair(b.data(), b.data(), 1, r), std::invalid_argument);
}

TEST(SharedBasis, SharedStructureFavoursSharedBasis) {
  // Two layers driven by the same rank-4 latent: the concatenation has rank 4, so a shared rank-4
  // basis is exact, while rank 2 per layer (same 4 coefficients per token) is not.
  const uint64_t seed = 15;
  std::mt19937_64 rng(seed);
  const int64_t S = 4, L = 200, T = S * L, r = 16, k0 = 4;
  SCOPED_TRACE(testing::Message() << "seed " << seed << " shape [" << T << ", " << r << "]");
  const Eigen::MatrixXd Z = gaussian(rng, T, k0);
  const auto l0 = to_row_major_f32((Z * gaussian(rng, k0, r)).eval());
  const auto l1 = to_row_major_f32((Z * gaussian(rng, k0, r)).eval());
  std::vector<int64_t> offs(S + 1);
  for (int64_t s = 0; s <= S; ++s) offs[s] = s * L;
  const std::vector<const float*> window{l0.data(), l1.data()};
  const std::vector<int64_t> ranks{4, 8, 32};
  const auto res = shared_basis_probe(window, T, r, offs, ranks, /*centered=*/false);
  ASSERT_EQ(res.size(), 3u);
  EXPECT_EQ(res[0].rank_per_layer, 2);
  EXPECT_LT(res[0].shared_heldout_rel_fro, 1e-5);
  EXPECT_GT(res[0].per_layer_heldout_rel_fro, 0.1);
  EXPECT_LT(res[1].per_layer_heldout_rel_fro, 1e-5);  // rank 4 per layer covers each layer
  EXPECT_LT(res[2].shared_heldout_rel_fro, 1e-6);     // full rank: exact
  EXPECT_LT(res[2].per_layer_heldout_rel_fro, 1e-6);
  EXPECT_EQ(res[0].shared_basis_floats, 2 * r * 4);
  EXPECT_EQ(res[0].per_layer_basis_floats, r * 4);
}

// The per-layer fits given by the caller (the study shares each layer's fit_svd_split between the SVD
// probe and both windows that contain the layer) give the same rows, bit for bit, as fitting inside; the
// SVD probe likewise; a fit of the wrong centering is refused.
TEST(SharedBasis, GivenPerLayerFitsGiveTheSameBits) {
  const uint64_t seed = 23;
  std::mt19937_64 rng(seed);
  const int64_t S = 4, L = 150, T = S * L, r = 16;
  SCOPED_TRACE(testing::Message() << "seed " << seed << " shape [" << T << ", " << r << "]");
  const auto l0 = to_row_major_f32(gaussian(rng, T, r)), l1 = to_row_major_f32(gaussian(rng, T, r));
  std::vector<int64_t> offs(S + 1);
  for (int64_t s = 0; s <= S; ++s) offs[s] = s * L;
  const std::vector<const float*> window{l0.data(), l1.data()};
  const std::vector<int64_t> ranks{4, 8, 32};
  const SvdSplitFit f0 = fit_svd_split(l0.data(), T, r, offs, true), f1 = fit_svd_split(l1.data(), T, r, offs, true);
  const std::vector<const SvdSplitFit*> fits{&f0, &f1};
  const auto inside = shared_basis_probe(window, T, r, offs, ranks, true);
  const auto given = shared_basis_probe(window, T, r, offs, ranks, true, fits);
  ASSERT_EQ(given.size(), inside.size());
  for (size_t i = 0; i < given.size(); ++i) {
    EXPECT_EQ(given[i].per_layer_fit_rel_fro, inside[i].per_layer_fit_rel_fro) << "rank " << ranks[i];
    EXPECT_EQ(given[i].per_layer_heldout_rel_fro, inside[i].per_layer_heldout_rel_fro) << "rank " << ranks[i];
    EXPECT_EQ(given[i].shared_heldout_rel_fro, inside[i].shared_heldout_rel_fro) << "rank " << ranks[i];
  }
  SvdProbeOptions o;
  o.ranks = {2, 8, 16};
  const SvdProbeResult a = svd_probe(l0.data(), T, r, offs, o), b = svd_probe(l0.data(), T, r, offs, o, &f0);
  for (size_t i = 0; i < a.ranks.size(); ++i) {
    EXPECT_EQ(a.ranks[i].heldout_rel_fro, b.ranks[i].heldout_rel_fro) << "rank " << o.ranks[i];
    EXPECT_EQ(a.ranks[i].fit_rel_fro, b.ranks[i].fit_rel_fro) << "rank " << o.ranks[i];
  }
  const SvdSplitFit uncentered = fit_svd_split(l0.data(), T, r, offs, false);
  EXPECT_THROW(svd_probe(l0.data(), T, r, offs, o, &uncentered), std::invalid_argument);
  const std::vector<const SvdSplitFit*> wrong{&uncentered, &f1};
  EXPECT_THROW(shared_basis_probe(window, T, r, offs, ranks, true, wrong), std::invalid_argument);
}

TEST(SharedBasis, WindowOfOneEqualsSvdProbe) {
  const uint64_t seed = 16;
  std::mt19937_64 rng(seed);
  const int64_t S = 2, L = 300, T = S * L, r = 24;
  SCOPED_TRACE(testing::Message() << "seed " << seed << " shape [" << T << ", " << r << "]");
  Eigen::VectorXd decay(r);
  for (int64_t i = 0; i < r; ++i) decay[i] = std::pow(0.85, static_cast<double>(i));
  const auto x = to_row_major_f32((gaussian(rng, T, r) * decay.asDiagonal() * orthonormal(rng, r, r)).eval());
  const std::vector<int64_t> offs{0, L, T}, ranks{3, 6, 12};
  const std::vector<const float*> window{x.data()};
  const auto res = shared_basis_probe(window, T, r, offs, ranks, true);
  SvdProbeOptions opt;
  opt.ranks = ranks;
  opt.coeff_dtype = CoeffDtype::Float64;  // the shared-basis probe keeps unrounded coefficients
  const SvdProbeResult svd = svd_probe(x.data(), T, r, offs, opt);
  for (size_t i = 0; i < ranks.size(); ++i) {
    EXPECT_NEAR(res[i].shared_heldout_rel_fro, svd.ranks[i].heldout_rel_fro, 1e-12);
    EXPECT_NEAR(res[i].per_layer_heldout_rel_fro, svd.ranks[i].heldout_rel_fro, 1e-12);
    EXPECT_NEAR(res[i].shared_fit_rel_fro, svd.ranks[i].fit_rel_fro, 1e-12);
  }
}

TEST(SharedBasis, Errors) {
  std::mt19937_64 rng(17);
  const int64_t T = 64, r = 8;
  const auto a = probe_test::gaussian_vec(rng, T * r), b = probe_test::gaussian_vec(rng, T * r);
  const std::vector<int64_t> offs{0, 32, 64};
  const std::vector<const float*> window{a.data(), b.data()};
  for (int64_t k : {3, 0, 18}) {
    const std::vector<int64_t> ranks{k};
    try {
      shared_basis_probe(window, T, r, offs, ranks);
      FAIL() << "k = " << k << " accepted for w = 2, r = 8";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("k = " + std::to_string(k)), std::string::npos) << e.what();
    }
  }
  const std::vector<int64_t> ok{16};
  EXPECT_THROW(shared_basis_probe(window, T, r, std::vector<int64_t>{0, 10, 64}, ok),
               std::invalid_argument);  // 10 fit tokens
  EXPECT_THROW(shared_basis_probe(std::vector<const float*>{}, T, r, offs, ok), std::invalid_argument);
  EXPECT_THROW(shared_basis_probe(std::vector<const float*>{a.data(), nullptr}, T, r, offs, ok), std::invalid_argument);
}
