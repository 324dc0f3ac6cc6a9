#include "latentq/metrics.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

namespace latentq {

ErrorMetrics error_metrics(const float* x, const float* x_hat, int64_t T, int64_t D) {
  assert(T > 0 && D > 0);
  double err2 = 0, ref2 = 0, maxabs = 0, cos_sum = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* a = x + t * D;
    const float* b = x_hat + t * D;
    double dot = 0, na = 0, nb = 0, e2 = 0, m = 0;
    bool equal = true;
    for (int64_t d = 0; d < D; ++d) {
      const double xa = a[d], xb = b[d], e = xb - xa;
      dot += xa * xb;
      na += xa * xa;
      nb += xb * xb;
      e2 += e * e;
      m = std::max(m, std::abs(e));
      equal = equal && (a[d] == b[d]);
    }
    err2 += e2;
    ref2 += na;
    maxabs = std::max(maxabs, m);
    cos_sum += (na > 0 && nb > 0) ? dot / (std::sqrt(na) * std::sqrt(nb)) : (equal ? 1.0 : 0.0);
  }
  const double inf = std::numeric_limits<double>::infinity();
  ErrorMetrics r;
  r.rel_fro = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? inf : 0.0);
  r.mse = err2 / (static_cast<double>(T) * static_cast<double>(D));
  r.sqnr_db = err2 > 0 ? (ref2 > 0 ? 10.0 * std::log10(ref2 / err2) : -inf) : inf;
  r.max_abs_err = maxabs;
  r.cos_mean = cos_sum / static_cast<double>(T);
  return r;
}

}  // namespace latentq
