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
#include "latentq/analysis/split.h"

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

}  // namespace latentq
