// latentq/analysis/score_basis.h — the score-metric KLT (`sklt`, latentq/transform.h): the invertible transform
// under which an error's cost in the attention scores, eᵀ·M·e, is a plain squared error and the components of
// the latent are uncorrelated, so that per-component bit allocation by reverse water-filling (transform coding,
// tc<R>) spends the bits the way the score-space bound of latentq/analysis/rate_distortion.h does.
//
// With Σ the fit split's uncentered second moment of X [T, d] (latentq/split.h; uncentered, as klt, so the
// transform is linear and folds into the weights) and M the score metric of the query rows that lie in the fit
// split (score_metric(): c_kv, M = mean of q_lat·q_latᵀ with q_lat = W_UKᵀ·q_nope; k_pe, of q_pe·q_peᵀ):
//   M = V·diag(w)·Vᵀ,  w_i ← max(w_i, kScoreMetricFloor·max_j w_j),  M^{±1/2} = V·diag(w^{±1/2})·Vᵀ,
//   M^{1/2}·Σ·M^{1/2} = U·diag(μ)·Uᵀ (μ descending),  A = Uᵀ·M^{1/2},  A⁻¹ = M^{-1/2}·U.
// Then x' = A·x has diagonal second moment diag(μ) on the fit split, and eᵀ·M_floored·e = ‖A·e‖² for any error e
// (M_floored = AᵀA). The floor bounds cond(A) by 100 (transform.h); directions read less than that are weighed
// at the floor rather than dropped, so the decoded latent stays usable by W_UV, which M does not see.
// Both eigenproblems by LAPACK dsyevd (lapack.h), in float64; A and A⁻¹ rounded once to float32.
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <span>

#include "latentq/transform.h"

namespace latentq::probes {

/// M of the query rows in the fit split: score_metric(q_fit, w, Tq_fit, H, dq, d) over the rows i of q [Tq, H, dq]
/// (row-major float32) whose token index q_rows[i] (into the T tokens) lies in a fit range of
/// fit_heldout_split(seq_offsets, T); w [H, dq, d] (W_UK) or empty (k_pe, dq = d). Throws std::invalid_argument
/// when q_rows has a size other than q's rows or an index outside [0, T), when no query row lies in the fit
/// split (naming the counts), and as fit_heldout_split() and score_metric().
Eigen::MatrixXd fit_score_metric(std::span<const float> q, std::span<const float> w, std::span<const int32_t> q_rows,
                                 int64_t H, int64_t dq, int64_t d, std::span<const int64_t> seq_offsets, int64_t T);

/// The sklt transform of X [T, d] (row-major float32, sequences seq_offsets [S+1]) under `metric` M [d, d]
/// (fit_score_metric()): Rotation::dense_invertible(d, A, A⁻¹) as above. Throws std::invalid_argument for bad
/// seq_offsets or an empty fit split, NaN/Inf in X or M, M not [d, d], or M with no positive eigenvalue.
Rotation fit_score_rotation(const float* X, int64_t T, int64_t d, std::span<const int64_t> seq_offsets,
                            const Eigen::MatrixXd& metric);

}  // namespace latentq::probes
