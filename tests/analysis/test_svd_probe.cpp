// SVD pruning probe: split rule, known spectra (exact rank, energy ranks), centering, reconstruction
// and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "latentq/metrics.h"
#include "latentq/split.h"
#include "latentq/analysis/svd_probe.h"
#include "probe_test_util.h"

using namespace latentq::probes;
using probe_test::orthonormal;
using probe_test::to_row_major_f32;

namespace {

using Range = std::pair<int64_t, int64_t>;

// σ² fractions with hand-checked cumulative energy 0.85, 0.95, 0.995, 0.9992, 0.9999, 1:
// 90% → rank 2, 99% → rank 3, 99.9% → rank 4.
const std::vector<double> kEnergy{0.85, 0.1, 0.045, 0.0042, 0.0007, 0.0001};

struct KnownSpectrum {
  int64_t n, D, k;
  Eigen::VectorXd sigma;  // [k]
  Eigen::VectorXd mu;     // [D] (zero when not centered)
  std::vector<float> X;   // [2n, D]: sequence 0 (fit) then sequence 1 (held-out)
  std::vector<int64_t> seq_offsets;
};

// Two sequences of n tokens, each U_s·diag(σ)·Vᵀ (+ μ) with U_s [n, k] orthonormal (orthogonal to the
// all-ones vector when with_mean), V [D, k] orthonormal shared: both splits have singular values σ.
KnownSpectrum make_known(uint64_t seed, int64_t n, int64_t D, bool with_mean) {
  std::mt19937_64 rng(seed);
  KnownSpectrum ks;
  ks.n = n;
  ks.D = D;
  ks.k = static_cast<int64_t>(kEnergy.size());
  ks.sigma.resize(ks.k);
  for (int64_t i = 0; i < ks.k; ++i) ks.sigma[i] = 10.0 * std::sqrt(kEnergy[i]);
  const Eigen::MatrixXd V = orthonormal(rng, D, ks.k);
  ks.mu = with_mean ? Eigen::VectorXd(probe_test::gaussian(rng, D, 1, 0.5)) : Eigen::VectorXd::Zero(D);
  Eigen::MatrixXd X(2 * n, D);
  for (int s = 0; s < 2; ++s) {
    Eigen::MatrixXd G = probe_test::gaussian(rng, n, ks.k);
    if (with_mean) G.rowwise() -= G.colwise().mean();
    const Eigen::HouseholderQR<Eigen::MatrixXd> qr(G);
    const Eigen::MatrixXd U = qr.householderQ() * Eigen::MatrixXd::Identity(n, ks.k);
    X.middleRows(s * n, n) = (U * ks.sigma.asDiagonal() * V.transpose()).rowwise() + ks.mu.transpose();
  }
  ks.X = to_row_major_f32(X);
  ks.seq_offsets = {0, n, 2 * n};
  return ks;
}

}  // namespace

TEST(Split, WholeSequencesFirstHalf) {
  const std::vector<int64_t> four{0, 512, 1024, 1536, 2048};
  const TokenSplit s4 = fit_heldout_split(four, 2048);
  ASSERT_EQ(s4.fit.size(), 2u);
  EXPECT_EQ(s4.fit[0], Range(0, 512));
  EXPECT_EQ(s4.fit[1], Range(512, 1024));
  EXPECT_EQ(s4.fit_tokens(), 1024);
  EXPECT_EQ(s4.heldout_tokens(), 1024);
  EXPECT_EQ(s4.heldout[0].first, 1024);

  const std::vector<int64_t> three{0, 10, 30, 35};
  const TokenSplit s3 = fit_heldout_split(three, 35);
  EXPECT_EQ(s3.fit_tokens(), 10);  // ⌊3/2⌋ = 1 sequence
  EXPECT_EQ(s3.heldout_tokens(), 25);

  const std::vector<int64_t> one{0, 101};
  const TokenSplit s1 = fit_heldout_split(one, 101);
  EXPECT_EQ(s1.fit[0], Range(0, 50));
  EXPECT_EQ(s1.heldout[0], Range(50, 101));
}

TEST(Split, RejectsBadOffsetsAndEmptySplits) {
  EXPECT_THROW(fit_heldout_split(std::vector<int64_t>{0}, 0), std::invalid_argument);
  EXPECT_THROW(fit_heldout_split(std::vector<int64_t>{1, 10}, 10), std::invalid_argument);
  EXPECT_THROW(fit_heldout_split(std::vector<int64_t>{0, 9}, 10), std::invalid_argument);
  EXPECT_THROW(fit_heldout_split(std::vector<int64_t>{0, 6, 4, 10}, 10), std::invalid_argument);
  EXPECT_THROW(fit_heldout_split(std::vector<int64_t>{0, 1}, 1), std::invalid_argument);     // 0 fit tokens
  EXPECT_THROW(fit_heldout_split(std::vector<int64_t>{0, 1, 1}, 1), std::invalid_argument);  // the same, + an empty one
  EXPECT_THROW(fit_heldout_split(std::vector<int64_t>{0, 0, 0}, 0), std::invalid_argument);  // no token at all
  try {
    fit_heldout_split(std::vector<int64_t>{0, 0, 1, 1}, 1);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("1 of 3 sequences are non-empty) leaves 0 fit and 1 held-out tokens"),
              std::string::npos)
        << e.what();
  }
}

// Empty sequences hold no token and take no place in the split: with them or without, the same token
// ranges (dumps with one empty sequence first, or four).
TEST(Split, EmptySequencesAreSkipped) {
  const TokenSplit ref = fit_heldout_split(std::vector<int64_t>{0, 512, 1024, 1536, 2048}, 2048);
  for (const std::vector<int64_t>& offs :
       {std::vector<int64_t>{0, 0, 512, 1024, 1536, 2048}, std::vector<int64_t>{0, 0, 0, 0, 0, 512, 1024, 1536, 2048},
        std::vector<int64_t>{0, 512, 512, 1024, 1536, 1536, 2048, 2048}}) {
    SCOPED_TRACE(::testing::PrintToString(offs));
    const TokenSplit s = fit_heldout_split(offs, 2048);
    EXPECT_EQ(s.fit, ref.fit);
    EXPECT_EQ(s.heldout, ref.heldout);
  }
  // Three non-empty sequences among five entries: fit on the first non-empty one (⌊3/2⌋ = 1).
  const TokenSplit s3 = fit_heldout_split(std::vector<int64_t>{0, 0, 10, 10, 30, 35}, 35);
  EXPECT_EQ(s3.fit, (std::vector<Range>{Range(0, 10)}));
  EXPECT_EQ(s3.heldout, (std::vector<Range>{Range(10, 30), Range(30, 35)}));
  // One non-empty sequence after an empty one: its halves, as for a dump with that sequence alone.
  const TokenSplit s1 = fit_heldout_split(std::vector<int64_t>{0, 0, 10}, 10);
  EXPECT_EQ(s1.fit, (std::vector<Range>{Range(0, 5)}));
  EXPECT_EQ(s1.heldout, (std::vector<Range>{Range(5, 10)}));
  const TokenSplit s1b = fit_heldout_split(std::vector<int64_t>{0, 4, 4, 4}, 4);
  EXPECT_EQ(s1b.fit, (std::vector<Range>{Range(0, 2)}));
  EXPECT_EQ(s1b.heldout, (std::vector<Range>{Range(2, 4)}));
}

TEST(Split, MaxFitRank) {
  EXPECT_EQ(max_fit_rank(256, true), 255);
  EXPECT_EQ(max_fit_rank(256, false), 256);
  EXPECT_EQ(max_fit_rank(1, true), 0);
  EXPECT_EQ(max_fit_rank(0, true), 0);
}

TEST(EnergyRank, HandComputed) {
  Eigen::VectorXd s(6);
  for (int i = 0; i < 6; ++i) s[i] = std::sqrt(kEnergy[i]);
  EXPECT_EQ(energy_rank(s, 0.9), 2);
  EXPECT_EQ(energy_rank(s, 0.99), 3);
  EXPECT_EQ(energy_rank(s, 0.999), 4);
  EXPECT_EQ(energy_rank(s, 0.5), 1);
  EXPECT_EQ(energy_rank(s, 1.0), 6);
  EXPECT_EQ(energy_rank(Eigen::VectorXd::Zero(4), 0.9), 0);
  EXPECT_THROW(energy_rank(s, 0.0), std::invalid_argument);
  EXPECT_THROW(energy_rank(s, 1.5), std::invalid_argument);
}

TEST(SvdProbe, DefaultRanks) {
  EXPECT_EQ(default_svd_ranks(128), (std::vector<int64_t>{8, 16, 32, 64, 96, 128}));
  EXPECT_EQ(default_svd_ranks(512), (std::vector<int64_t>{32, 64, 128, 256, 384, 512}));
  EXPECT_EQ(default_svd_ranks(8), (std::vector<int64_t>{1, 2, 4, 6, 8}));
}

TEST(SvdProbe, KnownSpectrumUncentered) {
  const uint64_t seed = 1234;
  const KnownSpectrum ks = make_known(seed, 256, 16, false);
  SCOPED_TRACE(testing::Message() << "seed " << seed << " shape [" << 2 * ks.n << ", " << ks.D << "]");
  SvdProbeOptions opt;
  opt.centered = false;
  opt.coeff_dtype = CoeffDtype::Float64;  // the exact subspace error; bf16 coefficients: KnownSpectrumBf16
  opt.ranks = {1, 2, 3, 4, 5, 6, 8, 16};
  const SvdProbeResult res = svd_probe(ks.X.data(), 2 * ks.n, ks.D, ks.seq_offsets, opt);
  EXPECT_FALSE(res.centered);
  EXPECT_EQ(res.fit_tokens, ks.n);
  EXPECT_EQ(res.heldout_tokens, ks.n);
  ASSERT_EQ(res.basis.singular_values.size(), ks.D);
  for (int64_t i = 0; i < ks.k; ++i) EXPECT_NEAR(res.basis.singular_values[i], ks.sigma[i], 1e-5 * ks.sigma[0]) << i;
  for (int64_t i = ks.k; i < ks.D; ++i) EXPECT_LT(res.basis.singular_values[i], 1e-5 * ks.sigma[0]) << i;
  for (int64_t i = 1; i < ks.D; ++i) EXPECT_GE(res.basis.singular_values[i - 1], res.basis.singular_values[i]);
  const double total = ks.sigma.squaredNorm();
  ASSERT_EQ(res.ranks.size(), opt.ranks.size());
  for (const auto& e : res.ranks) {
    SCOPED_TRACE(testing::Message() << "rank " << e.rank);
    const double tail = e.rank < ks.k ? ks.sigma.tail(ks.k - e.rank).squaredNorm() : 0.0;
    const double expect = std::sqrt(tail / total);
    EXPECT_NEAR(e.fit_rel_fro, expect, 1e-6);
    EXPECT_NEAR(e.heldout_rel_fro, expect, 1e-6);
    EXPECT_NEAR(e.fit_energy, 1.0 - tail / total, 1e-6);
  }
  EXPECT_EQ(res.energy_ranks, (std::vector<int64_t>{2, 3, 4}));
}

TEST(SvdProbe, KnownSpectrumCentered) {
  const uint64_t seed = 99;
  const KnownSpectrum ks = make_known(seed, 300, 24, true);
  SCOPED_TRACE(testing::Message() << "seed " << seed << " shape [" << 2 * ks.n << ", " << ks.D << "]");
  SvdProbeOptions opt;
  opt.centered = true;
  opt.coeff_dtype = CoeffDtype::Float64;
  opt.ranks = {1, 3, 5, 6, 7};
  const SvdProbeResult res = svd_probe(ks.X.data(), 2 * ks.n, ks.D, ks.seq_offsets, opt);
  EXPECT_TRUE(res.centered);
  EXPECT_LT((res.basis.mean - ks.mu).cwiseAbs().maxCoeff(), 1e-5);
  for (int64_t i = 0; i < ks.k; ++i) EXPECT_NEAR(res.basis.singular_values[i], ks.sigma[i], 1e-5 * ks.sigma[0]) << i;
  // rel_fro is relative to the stored (uncentered) data: ‖X‖² = Σσ² + n‖μ‖² since U ⟂ 1.
  const double ref = ks.sigma.squaredNorm() + static_cast<double>(ks.n) * ks.mu.squaredNorm();
  for (const auto& e : res.ranks) {
    SCOPED_TRACE(testing::Message() << "rank " << e.rank);
    const double tail = e.rank < ks.k ? ks.sigma.tail(ks.k - e.rank).squaredNorm() : 0.0;
    EXPECT_NEAR(e.heldout_rel_fro, std::sqrt(tail / ref), 1e-6);
    EXPECT_NEAR(e.fit_rel_fro, std::sqrt(tail / ref), 1e-6);
  }
  EXPECT_EQ(res.energy_ranks, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(res.basis.basis_floats(6), 24 * 6 + 24);
}

TEST(SvdProbe, KnownSpectrumBf16) {
  // bf16 coefficients: the rounding error Y − round(Y) lies in span(V_r), orthogonal to the residual,
  // so rel_fro_bf16² = rel_fro_exact² + ‖Y − round(Y)‖²/‖X‖², and RNE to bf16 (8 significant bits, unit
  // roundoff 2^-8) changes each coefficient by at most 2^-8 of it:
  // 0 < rel_fro_bf16² − rel_fro_exact² ≤ 2^-16 · ‖Y_r‖²/‖X‖² = 2^-16 · energy(r).
  // A rank-k matrix at rank ≥ k therefore has a bf16-level error (not 0).
  const uint64_t seed = 4321;
  const KnownSpectrum ks = make_known(seed, 256, 16, false);
  SCOPED_TRACE(testing::Message() << "seed " << seed << " shape [" << 2 * ks.n << ", " << ks.D << "]");
  SvdProbeOptions opt;
  opt.centered = false;
  opt.ranks = {1, 3, 6, 8, 16};
  EXPECT_EQ(opt.coeff_dtype, CoeffDtype::BF16);  // the default
  const SvdProbeResult bf = svd_probe(ks.X.data(), 2 * ks.n, ks.D, ks.seq_offsets, opt);
  EXPECT_EQ(bf.coeff_dtype, CoeffDtype::BF16);
  opt.coeff_dtype = CoeffDtype::Float64;
  const SvdProbeResult ex = svd_probe(ks.X.data(), 2 * ks.n, ks.D, ks.seq_offsets, opt);
  ASSERT_EQ(bf.ranks.size(), ex.ranks.size());
  for (size_t i = 0; i < bf.ranks.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "rank " << bf.ranks[i].rank);
    const double bound = std::ldexp(1.0, -16) * ex.ranks[i].fit_energy;
    for (auto [b, e] : {std::pair{bf.ranks[i].fit_rel_fro, ex.ranks[i].fit_rel_fro},
                        std::pair{bf.ranks[i].heldout_rel_fro, ex.ranks[i].heldout_rel_fro}}) {
      const double d2 = b * b - e * e;
      EXPECT_GT(d2, 0.0);
      EXPECT_LE(d2, bound * (1 + 1e-6) + 1e-12);
      EXPECT_GT(d2, bound / 64);  // random coefficients: the mean squared RNE error is ≈ 2^-19 of ‖Y‖²
    }
    if (bf.ranks[i].rank >= ks.k) {
      EXPECT_GT(bf.ranks[i].heldout_rel_fro, 1e-4);
      EXPECT_LT(bf.ranks[i].heldout_rel_fro, std::ldexp(1.0, -8));
    }
  }
}

TEST(SvdProbe, ReconstructMatchesReportedError) {
  // Random data with a decaying spectrum: the error of basis.reconstruct on the held-out tokens,
  // measured by latentq::error_metrics, is the probe's held-out rel_fro.
  const uint64_t seed = 7;
  std::mt19937_64 rng(seed);
  const int64_t D = 32, S = 4, L = 128, T = S * L;
  SCOPED_TRACE(testing::Message() << "seed " << seed << " shape [" << T << ", " << D << "]");
  Eigen::VectorXd decay(D);
  for (int64_t i = 0; i < D; ++i) decay[i] = std::pow(0.8, static_cast<double>(i));
  const Eigen::MatrixXd X = probe_test::gaussian(rng, T, D) * decay.asDiagonal() * orthonormal(rng, D, D).transpose();
  std::vector<float> x = to_row_major_f32((X.rowwise() + Eigen::RowVectorXd::Constant(D, 2.0)).eval());
  std::vector<int64_t> offs(S + 1);
  for (int64_t s = 0; s <= S; ++s) offs[s] = s * L;
  for (bool centered : {false, true})
    for (CoeffDtype coeff : {CoeffDtype::BF16, CoeffDtype::Float64}) {
      SvdProbeOptions opt;
      opt.centered = centered;
      opt.coeff_dtype = coeff;
      const SvdProbeResult res = svd_probe(x.data(), T, D, offs, opt);
      for (const auto& e : res.ranks) {
        SCOPED_TRACE(testing::Message() << "centered " << centered << " bf16 " << (coeff == CoeffDtype::BF16)
                                        << " rank " << e.rank);
        const float* held = x.data() + 2 * L * D;
        std::vector<float> rec(static_cast<size_t>(2 * L * D));
        res.basis.reconstruct(held, 2 * L, e.rank, rec.data(), coeff);
        const auto m = latentq::error_metrics(held, rec.data(), 2 * L, D);
        EXPECT_NEAR(m.rel_fro, e.heldout_rel_fro, 1e-5 * std::max(1.0, e.heldout_rel_fro) + 1e-6);
        if (e.rank > 1) {
          EXPECT_LE(e.heldout_rel_fro, res.ranks.front().heldout_rel_fro);
        }
      }
      // Centering helps data with a large common offset.
      if (centered) {
        EXPECT_LT(res.ranks.front().heldout_rel_fro, 0.5);
      }
    }
}

TEST(SvdProbe, Errors) {
  std::mt19937_64 rng(3);
  const int64_t T = 64, D = 8;
  std::vector<float> x = probe_test::gaussian_vec(rng, T * D);
  const std::vector<int64_t> offs{0, 32, 64};
  SvdProbeOptions opt;
  opt.ranks = {9};
  try {
    svd_probe(x.data(), T, D, offs, opt);
    FAIL() << "rank 9 > kv_lora_rank 8 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 9"), std::string::npos) << e.what();
  }
  opt.ranks = {0};
  EXPECT_THROW(svd_probe(x.data(), T, D, offs, opt), std::invalid_argument);
  opt.ranks = {8};
  const std::vector<int64_t> few{0, 8, 64};  // 8 fit tokens: rank 8 centered needs 9
  EXPECT_THROW(svd_probe(x.data(), T, D, few, opt), std::invalid_argument);
  opt.centered = false;
  EXPECT_NO_THROW(svd_probe(x.data(), T, D, few, opt));
  opt.energy_fractions = {1.2};
  EXPECT_THROW(svd_probe(x.data(), T, D, offs, opt), std::invalid_argument);
  x[5] = NAN;
  EXPECT_THROW(svd_probe(x.data(), T, D, offs, {}), std::invalid_argument);
  const SvdProbeResult ok = svd_probe(probe_test::gaussian_vec(rng, T * D).data(), T, D, offs, {});
  std::vector<float> out(static_cast<size_t>(T * D));
  EXPECT_THROW(ok.basis.reconstruct(out.data(), T, 9, out.data()), std::invalid_argument);
  EXPECT_THROW(ok.basis.reconstruct(out.data(), T, 0, out.data()), std::invalid_argument);
}

// The bf16 coefficients are checked after the narrowing: one beyond the bf16 range would be inf and the
// reconstruction (and any error computed from it) NaN/inf, silently.
TEST(SvdBasis, CoefficientOverflowingBf16IsAnError) {
  const std::vector<float> X = {1, 1, 2, 2, 3, 3};  // [3, 2]: the first direction is (1, 1)/√2
  const std::vector<std::pair<int64_t, int64_t>> rows = {{0, 3}};
  const SvdBasis b = fit_svd_basis(X.data(), 3, 2, rows, false);
  const std::vector<float> x = {3e38f, 3e38f};  // finite float32, coefficient ≈ 4.2e38
  std::vector<float> out(2);
  try {
    b.reconstruct(x.data(), 1, 1, out.data(), CoeffDtype::BF16);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "SVD: 1 rank-1 coefficient(s) overflow bf16 (|y| > 3.39e38): the latents are out "
              "of range for bf16 coefficients");
  }
  // Unrounded coefficients hold it, and the reconstruction is back in float32 range.
  b.reconstruct(x.data(), 1, 1, out.data(), CoeffDtype::Float64);
  EXPECT_NEAR(out[0], 3e38f, 3e38 * 1e-6);
  EXPECT_NEAR(out[1], 3e38f, 3e38 * 1e-6);
}
