// latentq/metrics.h — error metrics between a reference X and its reconstruction X̂, both
// [T, D] row-major float32. Accumulation is in float64: per row, element d is summed into lane d mod 8
// (index order within a lane) and the eight lanes are combined pairwise, ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7));
// the rows' sums are added in row order. The same bits under every CPU kernel (latentq/quantize.h).
//   rel_fro     = ‖X̂ − X‖_F / ‖X‖_F                      (0 when both are 0; inf when only X is 0)
//   mse         = ‖X̂ − X‖_F² / (T·D)
//   sqnr_db     = 10·log10(‖X‖_F² / ‖X̂ − X‖_F²)           (+inf for an exact reconstruction)
//   max_abs_err = max |X̂ − X|
//   cos_mean    = mean over tokens t of cos(x̂_t, x_t) = <x̂_t, x_t> / (‖x̂_t‖·‖x_t‖),
//                 a row where either norm is 0 counts 1 if both rows are equal, else 0.
#pragma once

#include <cstdint>

namespace latentq {

struct ErrorMetrics {
  double rel_fro = 0, mse = 0, sqnr_db = 0, max_abs_err = 0, cos_mean = 0;
};

/// Metrics of x_hat against x, both [T, D] row-major float32. T, D > 0 (asserted).
ErrorMetrics error_metrics(const float* x, const float* x_hat, int64_t T, int64_t D);

}  // namespace latentq
