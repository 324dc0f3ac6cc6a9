// Spearman's rank correlation (latentq/analysis/rank_correlation.h): average ranks and ρ on hand-computed
// cases with ties.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "latentq/analysis/rank_correlation.h"

namespace {
using namespace latentq;

TEST(RankCorrelation, AverageRanksOfTies) {
  // 5 → 1; the three 10s span ranks 2, 3, 4 → 3 each; 20 → 5.
  EXPECT_EQ(average_ranks(std::vector<double>{10, 20, 10, 10, 5}), (std::vector<double>{3, 5, 3, 3, 1}));
  // Two ties: {1, 1} → 1.5, {4, 4} → 3.5; -inf and +inf are ordered.
  EXPECT_EQ(average_ranks(std::vector<double>{4, 1, 4, 1}), (std::vector<double>{3.5, 1.5, 3.5, 1.5}));
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(average_ranks(std::vector<double>{inf, 0, -inf}), (std::vector<double>{3, 2, 1}));
  EXPECT_TRUE(average_ranks(std::vector<double>{}).empty());
  EXPECT_THROW(average_ranks(std::vector<double>{1, std::nan("")}), std::invalid_argument);
}

TEST(RankCorrelation, SpearmanHandCases) {
  // x = (1, 2, 2, 3) → ranks (1, 2.5, 2.5, 4); y = (1, 3, 2, 4) → ranks (1, 3, 2, 4); mean rank 2.5.
  // Deviations (−1.5, 0, 0, 1.5) and (−1.5, 0.5, −0.5, 1.5): Σxy = 4.5, Σxx = 4.5, Σyy = 5, ρ = 4.5/√22.5 = 3/√10.
  // (The no-ties shortcut 1 − 6Σd²/(n(n²−1)) would give 1 − 6·0.5/60 = 0.95: not the same.)
  EXPECT_NEAR(spearman(std::vector<double>{1, 2, 2, 3}, std::vector<double>{1, 3, 2, 4}), 3 / std::sqrt(10.0), 1e-15);
  // Any increasing map is ρ = 1, any decreasing one ρ = −1.
  const std::vector<double> x = {0.3, 7, -2, 1e-9, 50};
  std::vector<double> up, down;
  for (double v : x) up.push_back(std::exp(v / 10)), down.push_back(-v * v * v);
  EXPECT_DOUBLE_EQ(spearman(x, up), 1.0);
  EXPECT_DOUBLE_EQ(spearman(x, down), -1.0);
  // x = (1, 2, 3), y = (2, 1, 3): deviations (−1, 0, 1) and (0, −1, 1): ρ = 1/2.
  EXPECT_DOUBLE_EQ(spearman(std::vector<double>{1, 2, 3}, std::vector<double>{2, 1, 3}), 0.5);
  // A constant side, or fewer than 2 values: NaN.
  EXPECT_TRUE(std::isnan(spearman(std::vector<double>{1, 2, 3}, std::vector<double>{4, 4, 4})));
  EXPECT_TRUE(std::isnan(spearman(std::vector<double>{1}, std::vector<double>{2})));
  EXPECT_TRUE(std::isnan(spearman(std::vector<double>{}, std::vector<double>{})));
  EXPECT_THROW(spearman(std::vector<double>{1, 2}, std::vector<double>{1}), std::invalid_argument);
  EXPECT_THROW(spearman(std::vector<double>{1, 2}, std::vector<double>{1, std::nan("")}), std::invalid_argument);
  EXPECT_THROW(spearman(std::vector<double>{std::nan("")}, std::vector<double>{1}), std::invalid_argument);
}

}  // namespace
