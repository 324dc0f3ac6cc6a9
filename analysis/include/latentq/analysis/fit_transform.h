// latentq/analysis/fit_transform.h — the fit of every fitted transform (latentq/transform.h: the kTransforms rows
// whose fit is not Built) on one layer's target, in one place. The study reads what a row's fit needs from the
// dump (fit_layer_rotation, latentq/fit_layer.h: the latent, and for TransformFit::Queries the score metric of the
// layer's fit-split query rows) and calls fit_rotation; the Python module does the same through it.
//
//   klt   R = Vᵀ of fit_svd_basis(X, fit split of fit_heldout_split, uncentered) (latentq/analysis/svd_probe.h):
//         rows are the principal directions of the fit split's second moment, σ descending (the SVD probe's
//         basis at full rank; uncentered so that it is a rotation, foldable into W_UK/W_UV)
//   sklt  fit_score_rotation(X, T, D, seq_offsets, M) (latentq/analysis/score_basis.h), M the score metric of the
//         layer's fit-split query rows (fit_score_metric)
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <span>

#include "latentq/transform.h"

namespace latentq::probes {

/// The rotation of transform t for one target X [T, D] (row-major float32) with sequences seq_offsets [S+1]: a
/// fitted kind fitted as above, every other kind Rotation::make(t, D). `score_metric` M [D, D]: the metric of the
/// layer's fit-split query rows (fit_score_metric), for a kind whose fit reads them (fit_reads_queries; ignored
/// otherwise). Throws std::invalid_argument as fit_svd_basis / fit_score_rotation / Rotation::make, and for such a
/// kind without a score_metric.
Rotation fit_rotation(const Transform& t, const float* X, int64_t T, int64_t D, std::span<const int64_t> seq_offsets,
                      const Eigen::MatrixXd* score_metric = nullptr);

}  // namespace latentq::probes
