// latentq/inspect.h — statistics of a dump for `latentq inspect`.
#pragma once

#include <cstdint>
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

/// The `latentq inspect` report of a loaded dump (model, source, layers, tokens, sequences, dims,
/// softmax_scale, rope_layout, attention data, and per layer c_kv/k_pe statistics).
std::string format_inspect(const Dump& dump, double outlier_factor = 6.0);

}  // namespace latentq
