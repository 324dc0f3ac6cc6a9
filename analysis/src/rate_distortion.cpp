// The Gaussian rate–distortion bound (latentq/analysis/rate_distortion.h).
#include "latentq/analysis/rate_distortion.h"

#include <Eigen/Dense>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "latentq/analysis/gemm.h"
#include "latentq/analysis/lapack.h"
#include "latentq/split.h"

namespace latentq {
namespace {

double rate_at(std::span<const double> lambda, double theta) {
  double r = 0;
  for (double l : lambda)
    if (l > theta) r += 0.5 * std::log2(l / theta);
  return r / static_cast<double>(lambda.size());
}

double distortion_at(std::span<const double> lambda, double theta) {
  double d = 0;
  for (double l : lambda) d += std::min(theta, std::max(l, 0.0));
  return d;
}

}  // namespace

WaterFilling reverse_water_filling(std::span<const double> eigenvalues, double rate) {
  if (eigenvalues.empty()) throw std::invalid_argument("reverse_water_filling: empty spectrum");
  if (!std::isfinite(rate))
    throw std::invalid_argument(fmt::format("reverse_water_filling: rate {} is not finite", rate));
  std::vector<double> lambda;
  lambda.reserve(eigenvalues.size());
  for (double l : eigenvalues) {
    if (!std::isfinite(l))
      throw std::invalid_argument(fmt::format("reverse_water_filling: eigenvalue {} is not finite", l));
    lambda.push_back(std::max(l, 0.0));
  }
  const double hi0 = *std::max_element(lambda.begin(), lambda.end());
  if (hi0 == 0) return {0.0, 0.0, 0.0};
  if (rate <= 0) return {hi0, distortion_at(lambda, hi0), 0.0};
  // lo: a level where every positive component is active and R(lo) ≥ rate: the all-active solution
  // θ* = geomean(λ⁺)·2^(−2·d·rate/n⁺), or the smallest positive λ if that is larger.
  double min_pos = hi0, log_sum = 0;
  int64_t npos = 0;
  for (double l : lambda)
    if (l > 0) {
      min_pos = std::min(min_pos, l);
      log_sum += std::log2(l);
      ++npos;
    }
  const double d = static_cast<double>(lambda.size());
  const double log_all_active = log_sum / static_cast<double>(npos) - 2.0 * d * rate / static_cast<double>(npos);
  double lo = std::min(std::log2(min_pos), log_all_active), hi = std::log2(hi0);
  for (int i = 0; i < 200 && hi - lo > 1e-13 * std::max(1.0, std::abs(hi)); ++i) {
    const double mid = 0.5 * (lo + hi);
    (rate_at(lambda, std::exp2(mid)) > rate ? lo : hi) = mid;
  }
  const double theta = std::exp2(0.5 * (lo + hi));
  return {theta, distortion_at(lambda, theta), rate_at(lambda, theta)};
}

LatentSpectrum latent_spectrum(const float* X, int64_t T, int64_t d, std::span<const int64_t> seq_offsets) {
  const probes::TokenSplit split = probes::fit_heldout_split(seq_offsets, T);
  LatentSpectrum s;
  s.tokens = T;
  s.dim = d;
  s.fit_tokens = split.fit_tokens();
  Eigen::VectorXd mean = Eigen::VectorXd::Zero(d);
  Eigen::MatrixXd Z(s.fit_tokens, d);
  int64_t i = 0;
  for (const auto& [b, e] : split.fit)
    for (int64_t t = b; t < e; ++t, ++i) Z.row(i) = Eigen::Map<const Eigen::RowVectorXf>(X + t * d, d).cast<double>();
  if (!Z.allFinite()) throw std::invalid_argument("latent_spectrum: NaN/Inf values in the fit split");
  mean = Z.colwise().mean().transpose();
  Z.rowwise() -= mean.transpose();
  Eigen::MatrixXd cov(d, d);
  probes::gemm<double>(probes::Op::T, probes::Op::N, 1, Z, Z, 0, cov);  // ZᵀZ (dgemm, probes/gemm.h)
  cov /= static_cast<double>(s.fit_tokens);
  const probes::SymmetricEigen es = probes::symmetric_eigen(cov, false);  // LAPACK dsyevd (probes/lapack.h)
  s.eigenvalues.assign(es.values.data(), es.values.data() + d);
  for (double& l : s.eigenvalues) l = std::max(l, 0.0);
  std::sort(s.eigenvalues.rbegin(), s.eigenvalues.rend());
  s.covariance = std::move(cov);
  double ss = 0;
  for (int64_t k = 0; k < T * d; ++k) ss += static_cast<double>(X[k]) * static_cast<double>(X[k]);
  if (!std::isfinite(ss)) throw std::invalid_argument("latent_spectrum: NaN/Inf values");
  s.mean_square = T * d > 0 ? ss / static_cast<double>(T * d) : 0.0;
  return s;
}

RateDistortionBound rate_distortion_bound(const LatentSpectrum& s, double bits_per_element) {
  RateDistortionBound b;
  b.rate = bits_per_element - 32.0 / static_cast<double>(s.tokens);
  const WaterFilling w = reverse_water_filling(s.eigenvalues, b.rate);
  b.mse_bound = w.distortion / static_cast<double>(s.dim);
  b.rel_fro = s.mean_square > 0 ? std::sqrt(b.mse_bound / s.mean_square) : 0.0;
  return b;
}

double gap_db(double mse, double mse_bound) {
  if (mse_bound == 0)
    return mse == 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(mse / mse_bound);
}

Eigen::MatrixXd score_metric(std::span<const float> q, std::span<const float> w, int64_t Tq, int64_t H, int64_t dq,
                             int64_t d) {
  if (Tq < 1 || H < 1 || dq < 1 || d < 1)
    throw std::invalid_argument(
        fmt::format("score_metric: Tq = {}, H = {}, dq = {}, d = {} (expected all >= 1)", Tq, H, dq, d));
  if (static_cast<int64_t>(q.size()) != Tq * H * dq)
    throw std::invalid_argument(
        fmt::format("score_metric: q has {} values, expected Tq·H·dq = {}·{}·{}", q.size(), Tq, H, dq));
  if (w.empty() && dq != d)
    throw std::invalid_argument(fmt::format("score_metric: no W (identity) needs dq = d, got {} and {}", dq, d));
  if (!w.empty() && static_cast<int64_t>(w.size()) != H * dq * d)
    throw std::invalid_argument(
        fmt::format("score_metric: w has {} values, expected H·dq·d = {}·{}·{}", w.size(), H, dq, d));
  auto finite = [](std::span<const float> v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
  };
  if (!finite(q) || !finite(w)) throw std::invalid_argument("score_metric: NaN/Inf in q or w");
  using probes::Op;
  Eigen::MatrixXd M = Eigen::MatrixXd::Zero(d, d);
  Eigen::MatrixXd Qh(Tq, dq), G(dq, dq), Wh(dq, d), GW(dq, d);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t t = 0; t < Tq; ++t)
      for (int64_t k = 0; k < dq; ++k) Qh(t, k) = static_cast<double>(q[(t * H + h) * dq + k]);
    probes::gemm<double>(Op::T, Op::N, 1, Qh, Qh, 0, G);  // Q_hᵀ Q_h [dq, dq]
    if (w.empty()) {
      M += G;
      continue;
    }
    for (int64_t i = 0; i < dq; ++i)
      for (int64_t j = 0; j < d; ++j) Wh(i, j) = static_cast<double>(w[(h * dq + i) * d + j]);
    probes::gemm<double>(Op::N, Op::N, 1, G, Wh, 0, GW);  // (Q_hᵀ Q_h) W_h
    probes::gemm<double>(Op::T, Op::N, 1, Wh, GW, 1, M);  // M += W_hᵀ (Q_hᵀ Q_h) W_h
  }
  M /= static_cast<double>(H * Tq);
  return 0.5 * (M + M.transpose());  // exactly symmetric (the products round differently per triangle)
}

ScoreSpectrum score_spectrum(const LatentSpectrum& s, const Eigen::MatrixXd& metric) {
  const int64_t d = s.dim;
  if (s.covariance.rows() != d || s.covariance.cols() != d)
    throw std::invalid_argument(fmt::format("score_spectrum: the spectrum has no [{}, {}] covariance", d, d));
  if (metric.rows() != d || metric.cols() != d)
    throw std::invalid_argument(
        fmt::format("score_spectrum: the metric is [{}, {}], expected [{}, {}]", metric.rows(), metric.cols(), d, d));
  if (!metric.allFinite()) throw std::invalid_argument("score_spectrum: NaN/Inf in the metric");
  const probes::SymmetricEigen em = probes::symmetric_eigen(metric, true);  // M = V·diag(w)·Vᵀ (dsyevd)
  const Eigen::VectorXd root = em.values.cwiseMax(0.0).cwiseSqrt();         // rounding negatives clamped to 0
  ScoreSpectrum out;
  out.tokens = s.tokens;
  out.sqrt_metric = em.vectors * root.asDiagonal() * em.vectors.transpose();
  out.sqrt_metric = 0.5 * (out.sqrt_metric + out.sqrt_metric.transpose());
  Eigen::MatrixXd SM(d, d), A(d, d);
  probes::gemm<double>(probes::Op::N, probes::Op::N, 1, s.covariance, out.sqrt_metric, 0, SM);  // Σ M^{1/2}
  probes::gemm<double>(probes::Op::N, probes::Op::N, 1, out.sqrt_metric, SM, 0, A);             // M^{1/2} Σ M^{1/2}
  const probes::SymmetricEigen ea = probes::symmetric_eigen(A, false);
  out.eigenvalues.assign(ea.values.data(), ea.values.data() + d);
  for (double& m : out.eigenvalues) m = std::max(m, 0.0);
  std::sort(out.eigenvalues.rbegin(), out.eigenvalues.rend());
  return out;
}

double score_bound_mse(const ScoreSpectrum& s, double bits_per_element) {
  return reverse_water_filling(s.eigenvalues, bits_per_element - 32.0 / static_cast<double>(s.tokens)).distortion;
}

double score_mse(const float* X, const float* decoded, int64_t T, int64_t d, const Eigen::MatrixXd& sqrt_metric) {
  if (T < 1) throw std::invalid_argument(fmt::format("score_mse: T = {} (expected >= 1)", T));
  if (sqrt_metric.rows() != d || sqrt_metric.cols() != d)
    throw std::invalid_argument(fmt::format("score_mse: the factor is [{}, {}], expected [{}, {}]", sqrt_metric.rows(),
                                            sqrt_metric.cols(), d, d));
  constexpr int64_t kBlock = 1024;  // rows per dgemm: bounds the float64 copies at kBlock·d each
  const int64_t rows = std::min(T, kBlock);
  const probes::RowMat<double> S = sqrt_metric;  // symmetric: the same matrix row-major
  probes::RowMat<double> E(rows, d), Y(rows, d);
  double sum = 0;
  for (int64_t t0 = 0; t0 < T; t0 += kBlock) {
    const int64_t n = std::min(kBlock, T - t0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) {
        const int64_t k = (t0 + i) * d + j;
        E(i, j) = static_cast<double>(decoded[k]) - static_cast<double>(X[k]);
      }
    probes::gemm<double>(probes::Op::N, probes::Op::N, 1, E.topRows(n), S, 0, Y.topRows(n));  // E·M^{1/2}
    sum += Y.topRows(n).squaredNorm();
  }
  return sum / static_cast<double>(T);
}

}  // namespace latentq
