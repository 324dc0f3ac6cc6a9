// latentq/inspect.h — statistics of a dump for `latentq inspect`.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "latentq/dump.h"

namespace latentq {

/// Statistics of a [T, D] row-major float32 matrix (accumulated in float64, Eigen reductions).
struct TensorStats {
  double absmax = 0;                      ///< max |x|
  double mean_abs = 0;                    ///< mean |x|
  double median_channel_range = 0;        ///< median over channels d of (max_t x[t,d] − min_t x[t,d])
  double range_spread = 0;                ///< max over channels of that range / its median (inf if the median is 0)
  double median_channel_absmax = 0;       ///< median over channels of max_t |x[t,d]|
  std::vector<int64_t> outlier_channels;  ///< channels whose absmax > outlier_factor · median channel absmax
};

/// Statistics of x [T, D]; T, D > 0 (asserted).
TensorStats tensor_stats(const float* x, int64_t T, int64_t D, double outlier_factor = 6.0);

/// The statistics that decide a quantizer choice, of one [T, D] row-major float32 matrix (float64):
struct LatentStats {
  /// max / median over channels d of RMS_t x[t, d]. For c_kv (after kv_a_layernorm: c_kv = γ ⊙ x̂ with x̂
  /// of unit RMS per token) the channel RMS is |γ_d| · RMS_t x̂[t, d], so this estimates the outlier-channel
  /// ratio max|γ| / median|γ| when γ is not in the dump. inf when the median is 0.
  double channel_rms_ratio = 0;
  /// Fraction of the energy ‖X‖_F² = Σ σ_i² (uncentered, as stored: the SVD of X over all T tokens,
  /// eigenvalues of XᵀX through the LAPACK seam) in the top max(1, D/8), max(1, D/4), max(1, D/2) directions.
  double energy_top_eighth = 0, energy_top_quarter = 0, energy_top_half = 0;
  /// Token L2 norms ‖x_t‖: the 99th percentile (linear interpolation between order statistics, numpy's
  /// default) and the max, each / the median; inf when the median is 0.
  double norm_p99_ratio = 0, norm_max_ratio = 0;
  /// The mean norm of each non-empty sequence's first token / the median token norm: > 1 when first tokens
  /// behave like attention sinks (large norms).
  double first_token_ratio = 0;
};

/// latent_stats of x [T, D] with sequences seq_offsets [S+1] (T, D > 0, x finite: asserted; a dump's
/// values are checked when read).
LatentStats latent_stats(const float* x, int64_t T, int64_t D, std::span<const int64_t> seq_offsets);

/// One layer of a dump, by index (read_layer(header, index, true) for a file; a copy for a loaded dump).
using LayerSource = std::function<Layer(int index)>;

/// The `latentq inspect` report (model, source, layers, tokens, sequences, dims, softmax_scale,
/// rope_layout, attention data; per layer c_kv/k_pe statistics (tensor_stats); per layer the decision
/// statistics (latent_stats) and the adjacent-layer mean |Pearson| of matched channels
/// (latentq/analysis/cross_layer.h cross_layer_pair, with the previous layer of the file when it is the
/// index before). The layers of `header` are read one at a time through `read` (at most two held), so
/// a dump larger than memory can be inspected. Throws as `read`.
std::string format_inspect(const Dump& header, const LayerSource& read, double outlier_factor = 6.0);
/// The report of a loaded dump (load_dump with data): format_inspect over its layers.
std::string format_inspect(const Dump& dump, double outlier_factor = 6.0);

}  // namespace latentq
