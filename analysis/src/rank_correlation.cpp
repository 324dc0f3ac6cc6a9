// Spearman's rank correlation (latentq/analysis/rank_correlation.h).
#include "latentq/analysis/rank_correlation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace latentq {

std::vector<double> average_ranks(std::span<const double> x) {
  for (double v : x)
    if (std::isnan(v)) throw std::invalid_argument("average_ranks: NaN value (no order)");
  std::vector<size_t> order(x.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> rank(x.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i + 1;
    while (j < order.size() && x[order[j]] == x[order[i]]) ++j;
    const double r = 0.5 * static_cast<double>(i + 1 + j);  // mean of the 1-based ranks i+1 .. j
    for (size_t k = i; k < j; ++k) rank[order[k]] = r;
    i = j;
  }
  return rank;
}

double spearman(std::span<const double> x, std::span<const double> y) {
  if (x.size() != y.size())
    throw std::invalid_argument(fmt::format("spearman: {} x values and {} y values", x.size(), y.size()));
  const size_t n = x.size();
  if (n < 2) {
    for (double v : x)  // still refuse a NaN
      if (std::isnan(v)) throw std::invalid_argument("spearman: NaN value");
    for (double v : y)
      if (std::isnan(v)) throw std::invalid_argument("spearman: NaN value");
    return std::numeric_limits<double>::quiet_NaN();
  }
  const std::vector<double> rx = average_ranks(x), ry = average_ranks(y);
  const double mean = 0.5 * static_cast<double>(n + 1);  // the mean of any average ranks of n values
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxy += (rx[i] - mean) * (ry[i] - mean);
    sxx += (rx[i] - mean) * (rx[i] - mean);
    syy += (ry[i] - mean) * (ry[i] - mean);
  }
  if (sxx == 0 || syy == 0) return std::numeric_limits<double>::quiet_NaN();
  return sxy / std::sqrt(sxx * syy);
}

}  // namespace latentq
