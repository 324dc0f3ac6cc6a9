// latentq/analysis/rank_correlation.h — Spearman's rank correlation, for the /score_vs_attention table (how
// well a latent error metric orders the quantizers the way attention KL does).
//
// Spearman's ρ is Pearson's correlation of the ranks (Spearman 1904; with ties, each tied value takes the mean
// of the ranks its group spans — "fractional" or average ranks — and ρ is Pearson's r of those ranks, not the
// 1 − 6Σd²/(n(n²−1)) shortcut, which holds only without ties).
#pragma once

#include <span>
#include <vector>

namespace latentq {

/// The average ranks [n] of x [n] (1-based: the smallest value has rank 1; a group of k equal values that
/// would take ranks r..r+k−1 each gets r + (k−1)/2). Throws std::invalid_argument for a NaN (no order).
std::vector<double> average_ranks(std::span<const double> x);

/// Spearman's ρ of x and y (same length n, float64): Pearson's r of average_ranks(x) and average_ranks(y).
/// NaN when n < 2 or either side is constant (a rank variance of 0). Throws std::invalid_argument for
/// lengths that differ or a NaN value (±inf are ordered and allowed).
double spearman(std::span<const double> x, std::span<const double> y);

}  // namespace latentq
