// latentq/analysis/cross_layer.h — how much two layers' latents share.
//
// Inputs are c_kv of different layers on the same tokens: [T, kv_lora_rank] row-major float32.
//
// Pair statistics (over all T tokens, float64):
//   matched-channel Pearson: for each latent dimension i, Pearson correlation of A[:, i] with B[:, i];
//     the mean of |ρ_i|. A channel that is constant in A or in B (all T float32 values equal: min == max)
//     has no defined correlation and is skipped; the number skipped is reported and the mean is over
//     the others (NaN when every channel is skipped).
//   linear CKA (Kornblith et al. 2019, "Similarity of Neural Network Representations Revisited", eq. for
//     the linear kernel): X, Y column-centered, CKA = ‖YᵀX‖_F² / (‖XᵀX‖_F · ‖YᵀY‖_F). Invariant to
//     orthogonal transforms and isotropic scaling of either side; NaN when X or Y is constant.
//
// Shared-basis reconstruction (xKV style) for a window of w adjacent layers at total rank k:
//   shared   : concatenate the w layers along the feature axis → [T, w·r]; fit one rank-k basis on
//              the fit split (latentq/split.h); each token stores k coefficients.
//   per-layer: a rank-(k/w) basis per layer fit on the same split; each token stores w·(k/w) = k
//              coefficients.
//   Storage equality: both store exactly k coefficients per token for the window (T·k in all). The
//   bases are a one-off cost, reported separately: shared w·r·k floats, per-layer w·r·(k/w) = r·k
//   floats (each + w·r floats for the means when centered). k must be a multiple of w.
//   Error: held-out rel_fro over all w layers, sqrt(Σ_l ‖X_l − X̂_l‖_F² / Σ_l ‖X_l‖_F²), float64.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "latentq/analysis/svd_probe.h"

namespace latentq::probes {

struct CrossLayerPair {
  double pearson_mean_abs = 0;    ///< mean over non-constant channels of |Pearson(A[:, i], B[:, i])|
  int64_t pearson_channels = 0;   ///< channels in that mean
  int64_t constant_channels = 0;  ///< channels skipped (constant in A or in B)
  double cka_linear = 0;          ///< linear CKA of A and B
};

/// ‖X_cᵀX_c‖_F of X [T, r] (row-major float32) with its columns centered, in float64 (dgemm): linear CKA's
/// per-layer normalizer, a function of the layer alone (the study computes it once per layer for both
/// pairs that contain it). Throws std::invalid_argument for T < 2, r < 1 or NaN/Inf in X.
double centered_gram_norm(const float* X, int64_t T, int64_t r);

/// Pair statistics of A, B [T, r] row-major float32 (same tokens). gram_norm_a / gram_norm_b: the
/// layers' centered_gram_norm when the caller has them (the same values as computing them here; < 0 =
/// compute). Throws std::invalid_argument for T < 2, r < 1 or NaN/Inf in A or B.
CrossLayerPair cross_layer_pair(const float* A, const float* B, int64_t T, int64_t r, double gram_norm_a = -1,
                                double gram_norm_b = -1);

/// Linear CKA of X [T, dx] and Y [T, dy] (row-major float32; dx may differ from dy). See above.
/// Throws std::invalid_argument for T < 2, dx < 1, dy < 1 or NaN/Inf.
double linear_cka(const float* X, int64_t dx, const float* Y, int64_t dy, int64_t T);

struct SharedBasisResult {
  int64_t window = 0;          ///< w
  int64_t rank = 0;            ///< k: coefficients per token for the whole window
  int64_t rank_per_layer = 0;  ///< k / w
  bool centered = false;
  double shared_fit_rel_fro = 0, shared_heldout_rel_fro = 0;
  double per_layer_fit_rel_fro = 0, per_layer_heldout_rel_fro = 0;
  int64_t shared_basis_floats = 0;     ///< w·r·k (+ w·r when centered)
  int64_t per_layer_basis_floats = 0;  ///< r·k   (+ w·r when centered)
};

/// Shared-basis vs per-layer reconstruction for the window `layers` (w pointers, each c_kv [T, r]
/// row-major float32, adjacent layers in order) at each total rank k in `ranks`.
/// Throws std::invalid_argument for: an empty window or a null layer; bad seq_offsets / empty split;
/// k < 1, k > w·r or k not a multiple of w (naming k); a fit split with fewer tokens than k
/// (+1 when centered); NaN/Inf in the latents. `per_layer`: empty, or w pointers to each layer's
/// fit_svd_split(layer, T, r, seq_offsets, centered) when the caller has them (the same values as computing
/// them here); std::invalid_argument if their count, dimension or centering differ.
std::vector<SharedBasisResult> shared_basis_probe(std::span<const float* const> layers, int64_t T, int64_t r,
                                                  std::span<const int64_t> seq_offsets, std::span<const int64_t> ranks,
                                                  bool centered = true,
                                                  std::span<const SvdSplitFit* const> per_layer = {});

}  // namespace latentq::probes
