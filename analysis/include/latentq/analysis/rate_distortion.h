// latentq/analysis/rate_distortion.h — the Gaussian rate–distortion bound of a latent matrix, the reference
// each /latent_error cell's measured error is compared with (columns bound_rel_fro, gap_db).
//
// The source model: each token row x ∈ R^d of one (layer, target) matrix is Gaussian N(μ, Σ) with
// μ and Σ the mean and covariance of the fit split of the dump (latentq/split.h: the first
// half of the sequences), Σ = (1/n)·Σ_t (x_t − μ)(x_t − μ)ᵀ over the n fit tokens, accumulated in
// float64; λ_1..λ_d its eigenvalues (LAPACK dsyevd, probes/lapack.h; negatives from rounding clamped
// to 0). Reverse water-filling (Cover & Thomas, Thm 10.3.3) gives, per token vector,
//   D(θ) = Σ_i min(θ, λ_i)                     (squared error, summed over the d components)
//   R(θ) = (1/d)·Σ_i max(0, ½·log2(λ_i / θ))   (bits per element)
// The decoder knows μ: the mean is counted as stored, d float32 values per matrix amortized over the
// T tokens quantized, so a cell storing b bits per element (metadata included) leaves
// R = b − 32/T bits per element for the centered part. mse_bound = D(θ)/d at R(θ) = R.
// A Gaussian is the hardest source of its covariance, so for the real (non-Gaussian) latents this is
// an estimate of what an ideal vector quantizer at that rate could reach, not a floor: a measured
// error below it (a negative gap) is possible and is reported, not clipped.
//
// The score-space bound (columns score_mse, score_bound_mse, score_gap_db). Absorbed MLA attention
// (DeepSeek-V2, arXiv:2405.04434, §2.1.2) scores token t for head h as q_nope,h·(W_UK,h c_t) + q_pe,h·k_pe,t,
// so an error e in c_t moves the (unscaled) score by q_lat,hᵀe with q_lat,h = W_UK,hᵀ q_nope,h
// [kv_lora_rank], and an error e in k_pe,t by q_pe,hᵀe. The squared score error, averaged over heads and
// the dump's query rows, is eᵀMe with the metric
//   M = (1/(H·Tq))·Σ_{h, rows} q_lat q_latᵀ      (c_kv: q_lat = W_UK,hᵀ q_nope,h;  k_pe: q_lat = q_pe,h)
// (no softmax scale; float64). Under the same Gaussian source N(μ, Σ) (fit split, stored mean, R = b − 32/T)
// the least E[eᵀMe] at rate R is reverse water-filling on the eigenvalues μ_i of M^{1/2} Σ M^{1/2}: y =
// M^{1/2}x is Gaussian with that covariance, ‖y − ŷ‖² = eᵀMe for ŷ = M^{1/2}x̂, and a code of x gives one
// of y at the same rate and back (x̂ = (M^{1/2})⁺ŷ; the optimal ŷ lies in the range of M^{1/2}):
//   score_bound_mse = Σ_i min(θ, μ_i)   at   (1/d)·Σ_i max(0, ½·log2(μ_i / θ)) = R.
// With M = I: score_bound_mse = d·mse_bound and score_mse = d·mse, so score_gap_db = gap_db.
#pragma once

#include <Eigen/Dense>

#include <cstdint>
#include <span>
#include <vector>

namespace latentq {

/// The water level at a rate.
struct WaterFilling {
  double theta = 0;       ///< the water level θ (variance units of the source)
  double distortion = 0;  ///< D(θ) = Σ_i min(θ, λ_i): squared error per vector, summed over components
  double rate = 0;        ///< R(θ) in bits per element (equals the requested rate up to ~1e-12 relative)
};

/// Reverse water-filling on `eigenvalues` [d] (variances, float64, any order; values < 0 are taken as
/// 0) at `rate_bits_per_element` bits per element: θ solved by bisection on log2 θ (R(θ) is
/// decreasing). A rate ≤ 0 gives θ = max λ and D = Σ λ (store nothing, decode the mean); all λ = 0
/// gives θ = 0, D = 0. Throws std::invalid_argument for an empty spectrum or a NaN/Inf eigenvalue or
/// rate.
WaterFilling reverse_water_filling(std::span<const double> eigenvalues, double rate_bits_per_element);

/// The spectrum of the fit-split covariance of one matrix.
struct LatentSpectrum {
  std::vector<double> eigenvalues;  ///< [d] eigenvalues of Σ (fit split, centered, divided by n), descending, ≥ 0
  int64_t fit_tokens = 0;           ///< n
  int64_t tokens = 0;               ///< T, the tokens of the whole matrix (all splits)
  int64_t dim = 0;                  ///< d
  double mean_square = 0;           ///< ‖X‖_F² / (T·d) over the whole matrix (rel_fro's normalization)
  Eigen::MatrixXd covariance;       ///< [d, d] Σ itself (float64; the score bound's input)
};

/// The spectrum of X [T, d] (row-major float32) with sequence boundaries seq_offsets [S+1] (the fit
/// split of latentq/split.h). Throws std::invalid_argument as fit_heldout_split() and for
/// NaN/Inf values.
LatentSpectrum latent_spectrum(const float* X, int64_t T, int64_t d, std::span<const int64_t> seq_offsets);

/// The bound of one cell storing `bits_per_element` bits per element (metadata included).
struct RateDistortionBound {
  double rate = 0;       ///< bits per element left for the centered part: bits_per_element − 32/T
  double mse_bound = 0;  ///< D(θ)/d, the Gaussian bound's mean squared error per element
  double rel_fro = 0;    ///< sqrt(mse_bound / mean_square): in rel_fro's normalization (‖X‖_F of the whole matrix)
};
RateDistortionBound rate_distortion_bound(const LatentSpectrum& s, double bits_per_element);

/// gap in dB of a measured mse against the bound: 10·log10(mse / mse_bound); negative when the cell
/// beats the Gaussian bound; +inf when mse_bound = 0 < mse, NaN when both are 0.
double gap_db(double mse, double mse_bound);

/// The score metric M [d, d] (float64, symmetric positive semi-definite) of one (layer, target), see above:
/// `q` [Tq, H, dq] the query parts (row-major float32: q_nope for c_kv, dq = qk_nope_head_dim; q_pe for k_pe,
/// dq = qk_rope_head_dim), `w` [H, dq, d] the per-head up-projection W_UK (row-major float32, d =
/// kv_lora_rank), or empty for the identity (k_pe: dq = d). M = (1/(H·Tq))·Σ_{t,h} W_hᵀ q_{t,h} q_{t,h}ᵀ W_h,
/// accumulated in float64 (per head W_hᵀ (Q_hᵀ Q_h) W_h, dgemm). Units: squared score per squared latent unit.
/// Throws std::invalid_argument when Tq, H, dq or d is < 1, q or w has the wrong size, w is empty and dq ≠ d,
/// or q or w has a NaN/Inf.
Eigen::MatrixXd score_metric(std::span<const float> q, std::span<const float> w, int64_t Tq, int64_t H, int64_t dq,
                             int64_t d);

/// The score-space spectrum of one matrix: μ_i and the factor M^{1/2} that measures score_mse.
struct ScoreSpectrum {
  std::vector<double> eigenvalues;  ///< [d] μ_i of M^{1/2} Σ M^{1/2}, descending, ≥ 0 (rounding negatives clamped)
  Eigen::MatrixXd sqrt_metric;      ///< [d, d] M^{1/2} = V·diag(sqrt(max(w_i, 0)))·Vᵀ from M = V·diag(w)·Vᵀ
  int64_t tokens = 0;               ///< T (for the stored-mean rate R = b − 32/T)
};

/// The ScoreSpectrum of the fit-split covariance s.covariance under `metric` M [d, d] (score_metric()); both
/// eigenproblems by LAPACK dsyevd (probes/lapack.h). Throws std::invalid_argument when M is not [d, d] for
/// s.dim, has a NaN/Inf, or s has no covariance.
ScoreSpectrum score_spectrum(const LatentSpectrum& s, const Eigen::MatrixXd& metric);

/// score_bound_mse of a cell storing `bits_per_element` bits per element (metadata included): Σ_i min(θ, μ_i)
/// at R = bits_per_element − 32/T (reverse_water_filling on μ), the squared score error per token vector
/// (summed over the d components, not divided by d).
double score_bound_mse(const ScoreSpectrum& s, double bits_per_element);

/// score_mse of a cell: (1/T)·Σ_t e_tᵀ M e_t = (1/T)·‖E·M^{1/2}‖_F² with E = decoded − X [T, d] (row-major
/// float32, the original coordinates), accumulated in float64 (dgemm over blocks of rows). Throws
/// std::invalid_argument when sqrt_metric is not [d, d] or T < 1.
double score_mse(const float* X, const float* decoded, int64_t T, int64_t d, const Eigen::MatrixXd& sqrt_metric);

}  // namespace latentq
