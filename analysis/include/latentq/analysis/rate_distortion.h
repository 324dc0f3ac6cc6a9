// latentq/analysis/rate_distortion.h — the Gaussian rate–distortion bound of a latent matrix, the reference
// each /latent_error cell's measured error is compared with (columns bound_rel_fro, gap_db).
//
// The source model: each token row x ∈ R^d of one (layer, target) matrix is Gaussian N(μ, Σ) with
// μ and Σ the mean and covariance of the fit split of the dump (latentq/analysis/split.h: the first
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
#pragma once

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
};

/// The spectrum of X [T, d] (row-major float32) with sequence boundaries seq_offsets [S+1] (the fit
/// split of latentq/analysis/split.h). Throws std::invalid_argument as fit_heldout_split() and for
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

}  // namespace latentq
