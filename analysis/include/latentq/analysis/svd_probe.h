// latentq/analysis/svd_probe.h — SVD pruning probe on c_kv [T, kv_lora_rank] (row-major float32).
//
// A rank-r basis is fit on the fit split of the tokens (latentq/split.h: the first half of
// the sequences) and evaluated on the held-out split. Reconstruction of a token c (row vector):
//     y = (c − μ)·V_r              the r per-token coefficients (what a pruned cache stores)
//     ĉ = round(y)·V_rᵀ + μ
// round() follows CoeffDtype: BF16 (the default) rounds each coefficient to bf16 (float64 → float32 →
// bf16, both round-to-nearest-even, latentq::qmath::f32_to_bf16_bits), so the measured error matches
// the storage charged for it (r bf16 coefficients per token, 16·r/kv_lora_rank bits per element): at
// r = kv_lora_rank the error is bf16-level (≤ 2^-8 relative, ≈ 2^-9.4 RMS), not 0. Float64 keeps the coefficients
// unrounded (the pure subspace error).
// with V_r the first r right singular vectors of the fit matrix (centered: X_fit − μ, μ the fit
// mean per latent dimension; not centered: μ = 0). A centered basis stores μ: kv_lora_rank extra
// floats per layer. The basis comes from LAPACK dsyevd (probes/lapack.h) on the Gram matrix
// ZᵀZ (Z = X_fit − μ; float64 dgemm through probes/gemm.h, as the projections): σ_i = sqrt(max(λ_i, 0)),
// descending.
//
// rel_fro at rank r over a split X (uncentered data, as stored): ‖X − X̂_r‖_F / ‖X‖_F, in float64.
// BF16: computed directly from X̂_r (X and X̂_r in float64). Float64: computed as
// sqrt(Σ_{j>r} ‖(X − μ)·v_j‖² / ‖X‖_F²) (V is a complete orthonormal basis, so this is exact and
// free of cancellation).
// Energy rank for a fraction f: the smallest r with Σ_{i≤r} σ_i² ≥ f · Σ_i σ_i² (spectrum of the
// centered fit matrix when centered).
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <span>
#include <vector>

#include "latentq/transform.h"

namespace latentq::probes {

/// Storage dtype of the per-token SVD coefficients y = (c − μ)·V_r.
enum class CoeffDtype {
  BF16,     ///< rounded to bf16 (RNE) before projecting back: the dtype the accounting charges
  Float64,  ///< unrounded (float64): the error of the rank-r subspace alone
};

/// An orthonormal basis fit on the fit split of X [T, dim].
struct SvdBasis {
  int64_t dim = 0;                  ///< D: kv_lora_rank (or w·kv_lora_rank for a cross-layer window)
  bool centered = false;            ///< μ subtracted before projection
  Eigen::VectorXd mean;             ///< [D] fit mean μ (zeros when !centered)
  Eigen::MatrixXd V;                ///< [D, D]; column j = j-th right singular vector, σ descending
  Eigen::VectorXd singular_values;  ///< [D] σ of the (centered) fit matrix, descending, ≥ 0

  /// out = round((x − μ)·V_r)·V_rᵀ + μ for x [T, dim] row-major float32 → out [T, dim] float32
  /// (computed in float64, the coefficients rounded per `coeff` (CoeffDtype), out rounded to float32
  /// once). out may alias x.
  /// Throws std::invalid_argument if rank < 1 or rank > dim (naming the rank), T < 0, a BF16
  /// coefficient overflows bf16, or an output value overflows float32 (checked after each narrowing).
  void reconstruct(const float* x, int64_t T, int64_t rank, float* out, CoeffDtype coeff = CoeffDtype::BF16) const;
  /// Floats stored for the basis at rank r: dim·r, plus dim for μ when centered.
  int64_t basis_floats(int64_t rank) const { return dim * rank + (centered ? dim : 0); }
};

/// Fit the basis on the rows of X [T, D] (row-major float32) inside `rows` (token ranges [b, e)).
/// Throws std::invalid_argument for D < 1, an empty or out-of-range row set, NaN/Inf in those rows
/// (with the count), or fewer than 2 rows when centered.
SvdBasis fit_svd_basis(const float* X, int64_t T, int64_t D, std::span<const std::pair<int64_t, int64_t>> rows,
                       bool centered);

/// Smallest r with cumulative σ² ≥ fraction · total (singular_values descending). Returns 0 when all σ
/// are 0. Throws std::invalid_argument unless 0 < fraction ≤ 1.
int64_t energy_rank(const Eigen::VectorXd& singular_values, double fraction);

/// The default rank list for kv_lora_rank D: D/16, D/8, D/4, D/2, 3D/4, D (integer division, at
/// least 1, duplicates removed, ascending). D = 128 → {8, 16, 32, 64, 96, 128}.
std::vector<int64_t> default_svd_ranks(int64_t kv_lora_rank);

struct SvdProbeOptions {
  bool centered = true;        ///< subtract the fit mean (stored: D floats)
  std::vector<int64_t> ranks;  ///< empty → default_svd_ranks(kv_lora_rank)
  std::vector<double> energy_fractions{0.9, 0.99, 0.999};
  CoeffDtype coeff_dtype = CoeffDtype::BF16;  ///< dtype of the stored per-token coefficients
};

struct SvdRankError {
  int64_t rank = 0;
  double fit_rel_fro = 0;      ///< rel_fro of the rank-r reconstruction on the fit split
  double heldout_rel_fro = 0;  ///< same on the held-out split (the number that matters)
  double fit_energy = 0;       ///< Σ_{i≤r} σ_i² / Σ σ_i² on the fit split (1 when all σ are 0)
};

struct SvdProbeResult {
  bool centered = false;
  CoeffDtype coeff_dtype = CoeffDtype::BF16;
  int64_t kv_lora_rank = 0;
  int64_t fit_tokens = 0, heldout_tokens = 0;
  SvdBasis basis;                        ///< spectrum in basis.singular_values [kv_lora_rank], descending
  std::vector<SvdRankError> ranks;       ///< in the order of options.ranks
  std::vector<double> energy_fractions;  ///< as requested
  std::vector<int64_t> energy_ranks;     ///< energy_rank(σ, fraction) for each fraction
};

/// One layer's basis on its fit split with the energy of both splits along every basis direction: the
/// part of the SVD probe and of the shared-basis probe's per-layer side that depends on the layer alone
/// (the study computes it once per layer and passes it to both).
struct SvdSplitFit {
  int64_t fit_tokens = 0, heldout_tokens = 0;
  SvdBasis basis;                           ///< fit_svd_basis on the fit split (fit_heldout_split)
  Eigen::VectorXd fit_energy;               ///< [D] Σ over the fit tokens x of ((x − μ)·v_j)², j = 0 .. D−1
  Eigen::VectorXd heldout_energy;           ///< [D] the same over the held-out tokens
  double fit_norm2 = 0, heldout_norm2 = 0;  ///< ‖X_fit‖_F², ‖X_heldout‖_F² (uncentered, as stored)
};
/// The SvdSplitFit of X [T, D] (row-major float32) with sequences seq_offsets [S+1]. Throws
/// std::invalid_argument for bad seq_offsets / an empty split (fit_heldout_split), NaN/Inf in X (with the
/// count), and as fit_svd_basis.
SvdSplitFit fit_svd_split(const float* X, int64_t T, int64_t D, std::span<const int64_t> seq_offsets, bool centered);

/// The SVD pruning probe on c_kv [T, kv_lora_rank] (row-major float32) with sequences seq_offsets [S+1].
/// Throws std::invalid_argument for: bad seq_offsets / empty split (fit_heldout_split); a rank < 1 or
/// > kv_lora_rank (naming it); a fit split with fewer tokens than the largest rank (+1 when centered:
/// every basis direction used must be determined by the fit data: max_fit_rank); NaN/Inf in c_kv; an
/// energy fraction outside (0, 1]; a bf16 coefficient overflow (SvdBasis::reconstruct).
/// `fit`: the layer's fit_svd_split(c_kv, ..., options.centered) when the caller has it (the same values as
/// computing it here); std::invalid_argument if its dimension or centering differ.
SvdProbeResult svd_probe(const float* c_kv, int64_t T, int64_t kv_lora_rank, std::span<const int64_t> seq_offsets,
                         const SvdProbeOptions& options = {}, const SvdSplitFit* fit = nullptr);

}  // namespace latentq::probes
