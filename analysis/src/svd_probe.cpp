#include "latentq/analysis/svd_probe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include "latentq/analysis/detail.h"
#include "latentq/analysis/gemm.h"
#include "latentq/analysis/lapack.h"
#include "latentq/split.h"
#include "latentq/qmath.h"

namespace latentq::probes {

using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

/// Coefficients Y = (X − μ)·V_r [n, r] of the rows of X [n, D], rounded per `coeff`; not checked.
Eigen::MatrixXd coefficients_unchecked(const Eigen::MatrixXd& Z, const SvdBasis& b, int64_t rank, CoeffDtype coeff) {
  Eigen::MatrixXd Y(Z.rows(), rank);
  gemm<double>(Op::N, Op::N, 1, Z, b.V.leftCols(rank), 0, Y);
  if (coeff == CoeffDtype::BF16)
    Y = Y.unaryExpr([](double y) {
      return static_cast<double>(qmath::bf16_bits_to_f32(qmath::f32_to_bf16_bits(static_cast<float>(y))));
    });
  return Y;
}
/// Checked after the narrowing: a coefficient beyond the bf16 range is inf, and the error computed from it
/// would be NaN/inf silently. Y: the coefficients of rank `rank`.
void require_finite_coefficients(const Eigen::Ref<const Eigen::MatrixXd>& Y, int64_t rank) {
  if (!Y.allFinite())
    throw std::invalid_argument("SVD: " + std::to_string((!Y.array().isFinite()).count()) + " rank-" +
                                std::to_string(rank) +
                                " coefficient(s) overflow bf16 (|y| > 3.39e38): the latents are out of range "
                                "for bf16 coefficients");
}
/// Coefficients Y = (X − μ)·V_r [n, r] of the rows of X [n, D], rounded per `coeff`.
Eigen::MatrixXd coefficients(const Eigen::MatrixXd& X, const SvdBasis& b, int64_t rank, CoeffDtype coeff) {
  Eigen::MatrixXd Y = coefficients_unchecked(X.rowwise() - b.mean.transpose(), b, rank, coeff);
  require_finite_coefficients(Y, rank);
  return Y;
}

/// ‖X − X̂_r‖_F² for every rank r of `ranks` (ascending, distinct), X̂_r = round(Y)[:, :r]·V_rᵀ + μ, from
/// Z = X − μ: one coefficient matrix at the largest rank (the rounding is per element, so rank r's
/// coefficients are its first r columns), and the residual Z − Σ_b Y_b·V_bᵀ updated block by block of
/// ranks in ascending order (the work of one product for all ranks instead of one per rank). Y:
/// coefficients_unchecked(Z) at ranks.back(), checked by the caller.
std::vector<double> residuals_at_ranks(const Eigen::MatrixXd& Z, const Eigen::MatrixXd& Y, const SvdBasis& b,
                                       std::span<const int64_t> ranks) {
  Eigen::MatrixXd E = Z;
  std::vector<double> out;
  int64_t done = 0;
  for (int64_t r : ranks) {
    gemm<double>(Op::N, Op::T, -1, Y.middleCols(done, r - done), b.V.middleCols(done, r - done), 1, E);
    done = r;
    out.push_back(E.squaredNorm());
  }
  return out;
}

/// X̂ = Y·V_rᵀ + μ for coefficients Y [n, r].
Eigen::MatrixXd project_back(const Eigen::MatrixXd& Y, const SvdBasis& b) {
  Eigen::MatrixXd Xhat(Y.rows(), b.V.rows());
  gemm<double>(Op::N, Op::T, 1, Y, b.V.leftCols(Y.cols()), 0, Xhat);
  Xhat.rowwise() += b.mean.transpose();
  return Xhat;
}

}  // namespace

void SvdBasis::reconstruct(const float* x, int64_t T, int64_t rank, float* out, CoeffDtype coeff) const {
  if (rank < 1 || rank > dim)
    throw std::invalid_argument("SVD reconstruction rank " + std::to_string(rank) + " outside [1, " +
                                std::to_string(dim) + "]");
  if (T < 0) throw std::invalid_argument("SVD reconstruction: T = " + std::to_string(T) + " < 0");
  if (T == 0) return;
  const Eigen::MatrixXd X = Eigen::Map<const RowMatF>(x, T, dim).cast<double>();
  const Eigen::MatrixXd Xhat = project_back(coefficients(X, *this, rank, coeff), *this);
  if (Xhat.cwiseAbs().maxCoeff() > static_cast<double>(std::numeric_limits<float>::max()))
    throw std::invalid_argument("SVD reconstruction at rank " + std::to_string(rank) +
                                ": a value overflows float32 (|x| > 3.4028235e+38)");
  Eigen::Map<RowMatF>(out, T, dim) = Xhat.cast<float>();
}

SvdBasis fit_svd_basis(const float* X, int64_t T, int64_t D, std::span<const std::pair<int64_t, int64_t>> rows,
                       bool centered) {
  if (D < 1) throw std::invalid_argument("SVD basis: dimension " + std::to_string(D) + " < 1");
  const Eigen::MatrixXd Xf = detail::gather_rows(X, T, D, rows);
  const int64_t n = Xf.rows();
  if (n < (centered ? 2 : 1))
    throw std::invalid_argument("SVD basis: " + std::to_string(n) + " fit token(s); need at least " +
                                std::to_string(centered ? 2 : 1));
  if (!Xf.allFinite()) {
    int64_t bad = 0;
    for (const auto& [b, e] : rows) bad += latentq::count_nonfinite(X + b * D, (e - b) * D);
    throw std::invalid_argument("SVD basis: " + std::to_string(bad) + " NaN/Inf value(s) in the fit tokens");
  }
  SvdBasis basis;
  basis.dim = D;
  basis.centered = centered;
  basis.mean = centered ? Eigen::VectorXd(Xf.colwise().mean().transpose()) : Eigen::VectorXd::Zero(D);
  const Eigen::MatrixXd Z = Xf.rowwise() - basis.mean.transpose();
  Eigen::MatrixXd G(D, D);
  gemm<double>(Op::T, Op::N, 1, Z, Z, 0, G);           // G = ZᵀZ (the solver reads its lower triangle)
  const SymmetricEigen es = symmetric_eigen(G, true);  // LAPACK dsyevd (probes/lapack.h)
  // Eigenvalues ascending; reverse to σ descending. Sign convention: the largest-|.| entry of each
  // column is positive, so the basis is deterministic.
  basis.V = es.vectors.rowwise().reverse();
  basis.singular_values = es.values.reverse().cwiseMax(0.0).cwiseSqrt();
  for (int64_t j = 0; j < D; ++j) {
    Eigen::Index imax = 0;
    basis.V.col(j).cwiseAbs().maxCoeff(&imax);
    if (basis.V(imax, j) < 0) basis.V.col(j) *= -1.0;
  }
  return basis;
}

int64_t energy_rank(const Eigen::VectorXd& singular_values, double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0))
    throw std::invalid_argument("energy fraction " + std::to_string(fraction) + " outside (0, 1]");
  const Eigen::VectorXd e = singular_values.cwiseAbs2();
  const double total = e.sum();
  if (total == 0.0) return 0;
  double cum = 0;
  for (Eigen::Index i = 0; i < e.size(); ++i) {
    cum += e[i];
    if (cum >= fraction * total) return i + 1;
  }
  return e.size();  // rounding: the full sum always holds the fraction
}

std::vector<int64_t> default_svd_ranks(int64_t D) {
  if (D < 1) throw std::invalid_argument("kv_lora_rank " + std::to_string(D) + " < 1");
  std::vector<int64_t> r{D / 16, D / 8, D / 4, D / 2, 3 * D / 4, D};
  for (auto& x : r) x = std::max<int64_t>(1, x);
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

SvdSplitFit fit_svd_split(const float* X, int64_t T, int64_t D, std::span<const int64_t> seq_offsets, bool centered) {
  const TokenSplit split = fit_heldout_split(seq_offsets, T);
  detail::require_finite(X, T * D, "SVD fit");
  SvdSplitFit f;
  f.fit_tokens = split.fit_tokens();
  f.heldout_tokens = split.heldout_tokens();
  f.basis = fit_svd_basis(X, T, D, split.fit, centered);
  const Eigen::MatrixXd Xf = detail::gather_rows(X, T, D, split.fit);
  const Eigen::MatrixXd Xh = detail::gather_rows(X, T, D, split.heldout);
  f.fit_energy = detail::projected_energy(Xf, f.basis.mean, f.basis.V);
  f.heldout_energy = detail::projected_energy(Xh, f.basis.mean, f.basis.V);
  f.fit_norm2 = Xf.squaredNorm();
  f.heldout_norm2 = Xh.squaredNorm();
  return f;
}

SvdProbeResult svd_probe(const float* c_kv, int64_t T, int64_t D, std::span<const int64_t> seq_offsets,
                         const SvdProbeOptions& options, const SvdSplitFit* fit) {
  if (D < 1) throw std::invalid_argument("SVD probe: kv_lora_rank " + std::to_string(D) + " < 1");
  const TokenSplit split = fit_heldout_split(seq_offsets, T);
  const std::vector<int64_t> ranks = options.ranks.empty() ? default_svd_ranks(D) : options.ranks;
  int64_t max_rank = 0;
  for (int64_t r : ranks) {
    if (r < 1 || r > D)
      throw std::invalid_argument("SVD probe: rank " + std::to_string(r) +
                                  " outside [1, kv_lora_rank = " + std::to_string(D) + "]");
    max_rank = std::max(max_rank, r);
  }
  for (double f : options.energy_fractions)
    if (!(f > 0.0 && f <= 1.0))
      throw std::invalid_argument("SVD probe: energy fraction " + std::to_string(f) + " outside (0, 1]");
  if (max_rank > max_fit_rank(split.fit_tokens(), options.centered))
    throw std::invalid_argument("SVD probe: the fit split has " + std::to_string(split.fit_tokens()) +
                                " tokens; rank " + std::to_string(max_rank) + (options.centered ? " centered" : "") +
                                " needs at least " + std::to_string(max_rank + (options.centered ? 1 : 0)));
  detail::require_finite(c_kv, T * D, "SVD probe: c_kv");

  if (fit && (fit->basis.dim != D || fit->basis.centered != options.centered))
    throw std::invalid_argument("SVD probe: the given fit is " + std::to_string(fit->basis.dim) + "-dimensional, " +
                                (fit->basis.centered ? "centered" : "not centered") + "; expected " +
                                std::to_string(D) + ", " + (options.centered ? "centered" : "not centered"));
  SvdSplitFit own;
  if (!fit) {
    own = fit_svd_split(c_kv, T, D, seq_offsets, options.centered);
    fit = &own;
  }
  SvdProbeResult res;
  res.centered = options.centered;
  res.coeff_dtype = options.coeff_dtype;
  res.kv_lora_rank = D;
  res.fit_tokens = split.fit_tokens();
  res.heldout_tokens = split.heldout_tokens();
  res.basis = fit->basis;

  const Eigen::VectorXd& ef = fit->fit_energy;
  const Eigen::VectorXd& eh = fit->heldout_energy;
  const double nf = fit->fit_norm2, nh = fit->heldout_norm2;
  const Eigen::VectorXd s2 = res.basis.singular_values.cwiseAbs2();
  const double s2_total = s2.sum();
  auto rel = [](double resid, double ref) { return ref > 0 ? std::sqrt(resid / ref) : (resid > 0 ? INFINITY : 0.0); };
  // The bf16 reconstructions: every rank from one coefficient matrix per split (residuals_at_ranks); an
  // overflow is reported for the first rank in `ranks` order, fit split first, as rank by rank would.
  std::map<int64_t, std::pair<double, double>> bf16_resid;  // rank → (fit, held-out) ‖X − X̂_r‖²
  if (options.coeff_dtype != CoeffDtype::Float64) {
    std::vector<int64_t> asc(ranks.begin(), ranks.end());
    std::sort(asc.begin(), asc.end());
    asc.erase(std::unique(asc.begin(), asc.end()), asc.end());
    // The centered splits Z = X − μ (the fit energies came from the shared fit; only this reads the rows).
    const Eigen::MatrixXd Zf = detail::gather_rows(c_kv, T, D, split.fit).rowwise() - res.basis.mean.transpose();
    const Eigen::MatrixXd Zh = detail::gather_rows(c_kv, T, D, split.heldout).rowwise() - res.basis.mean.transpose();
    const Eigen::MatrixXd Yf = coefficients_unchecked(Zf, res.basis, asc.back(), options.coeff_dtype);
    const Eigen::MatrixXd Yh = coefficients_unchecked(Zh, res.basis, asc.back(), options.coeff_dtype);
    for (int64_t r : ranks) {
      require_finite_coefficients(Yf.leftCols(r), r);
      require_finite_coefficients(Yh.leftCols(r), r);
    }
    const std::vector<double> rf = residuals_at_ranks(Zf, Yf, res.basis, asc);
    const std::vector<double> rh = residuals_at_ranks(Zh, Yh, res.basis, asc);
    for (size_t i = 0; i < asc.size(); ++i) bf16_resid[asc[i]] = {rf[i], rh[i]};
  }
  for (int64_t r : ranks) {
    SvdRankError e;
    e.rank = r;
    if (options.coeff_dtype == CoeffDtype::Float64) {
      e.fit_rel_fro = rel(ef.tail(D - r).sum(), nf);
      e.heldout_rel_fro = rel(eh.tail(D - r).sum(), nh);
    } else {
      e.fit_rel_fro = rel(bf16_resid.at(r).first, nf);
      e.heldout_rel_fro = rel(bf16_resid.at(r).second, nh);
    }
    e.fit_energy = s2_total > 0 ? s2.head(r).sum() / s2_total : 1.0;
    res.ranks.push_back(e);
  }
  res.energy_fractions = options.energy_fractions;
  for (double f : options.energy_fractions) res.energy_ranks.push_back(energy_rank(res.basis.singular_values, f));
  return res;
}

}  // namespace latentq::probes
