#include "latentq/analysis/cross_layer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "latentq/analysis/detail.h"
#include "latentq/split.h"
#include "latentq/analysis/svd_probe.h"

namespace latentq::probes {

namespace {

using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Eigen::MatrixXd centered_columns(const float* X, int64_t T, int64_t D) {
  Eigen::MatrixXd M = Eigen::Map<const RowMatF>(X, T, D).cast<double>();
  M.rowwise() -= M.colwise().mean();
  return M;
}

void check_shape(int64_t T, int64_t d, const char* what) {
  if (T < 2) throw std::invalid_argument(std::string(what) + ": T = " + std::to_string(T) + " tokens, need at least 2");
  if (d < 1) throw std::invalid_argument(std::string(what) + ": dimension " + std::to_string(d) + " < 1");
}

Eigen::MatrixXd cross(const Eigen::MatrixXd& A, const Eigen::MatrixXd& B) {  // AᵀB
  Eigen::MatrixXd C(A.cols(), B.cols());
  gemm<double>(Op::T, Op::N, 1, A, B, 0, C);
  return C;
}

// CKA of the column-centered X, Y; nx, ny: ‖XᵀX‖_F, ‖YᵀY‖_F when known (< 0: computed).
double cka_centered(const Eigen::MatrixXd& X, const Eigen::MatrixXd& Y, double nx = -1, double ny = -1) {
  const double num = cross(Y, X).squaredNorm();
  const double den = (nx >= 0 ? nx : cross(X, X).norm()) * (ny >= 0 ? ny : cross(Y, Y).norm());
  return den > 0 ? num / den : kNaN;
}

// Per column of X [T, r] (row-major): whether all its T values are equal (min == max), in one
// row-major pass (the same min and max as a pass down each column).
std::vector<bool> constant_columns(const float* X, int64_t T, int64_t r) {
  std::vector<float> mn(X, X + r), mx(X, X + r);
  for (int64_t t = 1; t < T; ++t)
    for (int64_t i = 0; i < r; ++i) {
      mn[i] = std::min(mn[i], X[t * r + i]);
      mx[i] = std::max(mx[i], X[t * r + i]);
    }
  std::vector<bool> c(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) c[i] = mn[i] == mx[i];
  return c;
}

}  // namespace

double linear_cka(const float* X, int64_t dx, const float* Y, int64_t dy, int64_t T) {
  check_shape(T, dx, "linear CKA (X)");
  check_shape(T, dy, "linear CKA (Y)");
  detail::require_finite(X, T * dx, "linear CKA: X");
  detail::require_finite(Y, T * dy, "linear CKA: Y");
  return cka_centered(centered_columns(X, T, dx), centered_columns(Y, T, dy));
}

double centered_gram_norm(const float* X, int64_t T, int64_t r) {
  check_shape(T, r, "centered Gram norm");
  detail::require_finite(X, T * r, "centered Gram norm: X");
  const Eigen::MatrixXd Xc = centered_columns(X, T, r);
  return cross(Xc, Xc).norm();
}

CrossLayerPair cross_layer_pair(const float* A, const float* B, int64_t T, int64_t r, double gram_norm_a,
                                double gram_norm_b) {
  check_shape(T, r, "cross-layer pair");
  detail::require_finite(A, T * r, "cross-layer pair: A");
  detail::require_finite(B, T * r, "cross-layer pair: B");
  const Eigen::MatrixXd Ac = centered_columns(A, T, r), Bc = centered_columns(B, T, r);
  const std::vector<bool> ca = constant_columns(A, T, r), cb = constant_columns(B, T, r);
  CrossLayerPair res;
  double sum = 0;
  for (int64_t i = 0; i < r; ++i) {
    const bool constant = ca[i] || cb[i];
    if (constant) {
      ++res.constant_channels;
      continue;
    }
    const double rho = Ac.col(i).dot(Bc.col(i)) / (Ac.col(i).norm() * Bc.col(i).norm());
    sum += std::abs(rho);
    ++res.pearson_channels;
  }
  res.pearson_mean_abs = res.pearson_channels > 0 ? sum / static_cast<double>(res.pearson_channels) : kNaN;
  res.cka_linear = cka_centered(Ac, Bc, gram_norm_a, gram_norm_b);
  return res;
}

std::vector<SharedBasisResult> shared_basis_probe(std::span<const float* const> layers, int64_t T, int64_t r,
                                                  std::span<const int64_t> seq_offsets, std::span<const int64_t> ranks,
                                                  bool centered, std::span<const SvdSplitFit* const> per_layer) {
  const int64_t w = static_cast<int64_t>(layers.size());
  if (w < 1) throw std::invalid_argument("shared-basis probe: empty layer window");
  if (r < 1) throw std::invalid_argument("shared-basis probe: kv_lora_rank " + std::to_string(r) + " < 1");
  for (int64_t l = 0; l < w; ++l)
    if (layers[l] == nullptr)
      throw std::invalid_argument("shared-basis probe: layer " + std::to_string(l) + " of the window is null");
  const TokenSplit split = fit_heldout_split(seq_offsets, T);
  int64_t max_k = 0;
  for (int64_t k : ranks) {
    if (k < 1 || k > w * r || k % w != 0)
      throw std::invalid_argument("shared-basis probe: rank k = " + std::to_string(k) +
                                  " must be in [1, w·kv_lora_rank = " + std::to_string(w * r) +
                                  "] and a multiple of the window w = " + std::to_string(w));
    max_k = std::max(max_k, k);
  }
  if (max_k > max_fit_rank(split.fit_tokens(), centered))
    throw std::invalid_argument("shared-basis probe: the fit split has " + std::to_string(split.fit_tokens()) +
                                " tokens; rank " + std::to_string(max_k) + (centered ? " centered" : "") +
                                " needs at least " + std::to_string(max_k + (centered ? 1 : 0)));
  for (int64_t l = 0; l < w; ++l)
    detail::require_finite(layers[l], T * r, "shared-basis probe: layer " + std::to_string(l) + " of the window");

  // Shared: [T, w·r], layer l in columns [l·r, (l+1)·r).
  const int64_t Dw = w * r;
  std::vector<float> cat(static_cast<size_t>(T * Dw));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t l = 0; l < w; ++l) std::copy_n(layers[l] + t * r, r, cat.data() + t * Dw + l * r);
  const SvdBasis shared = fit_svd_basis(cat.data(), T, Dw, split.fit, centered);
  const Eigen::MatrixXd Xf = detail::gather_rows(cat.data(), T, Dw, split.fit);
  const Eigen::MatrixXd Xh = detail::gather_rows(cat.data(), T, Dw, split.heldout);
  const Eigen::VectorXd sf = detail::projected_energy(Xf, shared.mean, shared.V);
  const Eigen::VectorXd sh = detail::projected_energy(Xh, shared.mean, shared.V);
  const double nf = Xf.squaredNorm(), nh = Xh.squaredNorm();  // = Σ over layers

  // Per layer: energies along each layer's own basis (the caller's fits, or computed here).
  if (!per_layer.empty() && static_cast<int64_t>(per_layer.size()) != w)
    throw std::invalid_argument("shared-basis probe: " + std::to_string(per_layer.size()) +
                                " per-layer fits for a window of " + std::to_string(w));
  std::vector<Eigen::VectorXd> pf(w), ph(w);
  for (int64_t l = 0; l < w; ++l) {
    if (!per_layer.empty()) {
      const SvdSplitFit* f = per_layer[l];
      if (!f || f->basis.dim != r || f->basis.centered != centered)
        throw std::invalid_argument("shared-basis probe: the fit of layer " + std::to_string(l) +
                                    " of the window is missing, not " + std::to_string(r) + "-dimensional or " +
                                    (centered ? "not centered" : "centered"));
      pf[l] = f->fit_energy;
      ph[l] = f->heldout_energy;
      continue;
    }
    const SvdSplitFit f = fit_svd_split(layers[l], T, r, seq_offsets, centered);
    pf[l] = f.fit_energy;
    ph[l] = f.heldout_energy;
  }
  auto rel = [](double resid, double ref) { return ref > 0 ? std::sqrt(resid / ref) : (resid > 0 ? INFINITY : 0.0); };
  std::vector<SharedBasisResult> out;
  for (int64_t k : ranks) {
    SharedBasisResult res;
    res.window = w;
    res.rank = k;
    res.rank_per_layer = k / w;
    res.centered = centered;
    res.shared_fit_rel_fro = rel(sf.tail(Dw - k).sum(), nf);
    res.shared_heldout_rel_fro = rel(sh.tail(Dw - k).sum(), nh);
    double rf = 0, rh = 0;
    for (int64_t l = 0; l < w; ++l) {
      rf += pf[l].tail(r - k / w).sum();
      rh += ph[l].tail(r - k / w).sum();
    }
    res.per_layer_fit_rel_fro = rel(rf, nf);
    res.per_layer_heldout_rel_fro = rel(rh, nh);
    res.shared_basis_floats = Dw * k + (centered ? Dw : 0);
    res.per_layer_basis_floats = r * k + (centered ? Dw : 0);
    out.push_back(res);
  }
  return out;
}

}  // namespace latentq::probes
