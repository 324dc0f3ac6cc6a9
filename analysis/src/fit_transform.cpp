// The fit of every fitted transform (latentq/analysis/fit_transform.h).
#include "latentq/analysis/fit_transform.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "latentq/analysis/score_basis.h"
#include "latentq/analysis/svd_probe.h"
#include "latentq/split.h"

namespace latentq::probes {

namespace {

// klt: Vᵀ of the fit split's uncentered SVD basis, rounded once to float32.
Rotation klt_rotation(const float* X, int64_t T, int64_t D, std::span<const int64_t> seq_offsets) {
  const TokenSplit split = fit_heldout_split(seq_offsets, T);
  const SvdBasis b = fit_svd_basis(X, T, D, split.fit, false);
  std::vector<float> R(static_cast<size_t>(D * D));
  for (int64_t i = 0; i < D; ++i)
    for (int64_t j = 0; j < D; ++j) R[i * D + j] = static_cast<float>(b.V(j, i));
  return Rotation::dense(D, std::move(R));
}

}  // namespace

Rotation fit_rotation(const Transform& t, const float* X, int64_t T, int64_t D, std::span<const int64_t> seq_offsets,
                      const Eigen::MatrixXd* score_metric) {
  if (!fitted_transform(t.kind)) return Rotation::make(t, D);
  if (fit_reads_queries(t.kind) && !score_metric)
    throw std::invalid_argument("fit_rotation: " + t.to_string() +
                                " needs the score metric of the layer's query rows (a dump with attention data)");
  switch (t.kind) {
    case TransformKind::Klt:
      return klt_rotation(X, T, D, seq_offsets);
    case TransformKind::ScoreKlt:
      return fit_score_rotation(X, T, D, seq_offsets, *score_metric);
    default:
      break;
  }
  throw std::logic_error("fit_rotation: transform '" + t.to_string() + "' is fitted (kTransforms) but has no fit here");
}

}  // namespace latentq::probes
