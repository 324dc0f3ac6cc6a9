// latentq/regress.h — the regression gate: thresholds on /latent_error of a results file.
//
// thresholds.toml holds [[threshold]] entries:
//   quantizer = "int4-asym-channel-g32"  # a spec (compared in canonical form)
//   target    = "c_kv"                   # c_kv or k_pe
//   metric    = "rel_fro"                # any numeric column of /latent_error
//   statistic = "max"                    # max, mean or min over the matching rows (layers)
//   bound     = 0.11
//   direction = "max"                    # optional: "max" (default): value <= bound;
//                                        #           "min": value >= bound (for sqnr_db, cos_mean)
// A threshold fails when its value breaks the bound, when it is NaN, or when no row matches.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "latentq/table.h"

namespace latentq {

struct Threshold {
  std::string quantizer, target, metric, statistic = "max", direction = "max";
  double bound = 0;
  std::string where;  ///< "<file>:<line>:<col>" of the entry
};

/// Parse a thresholds file. Throws std::runtime_error if unreadable, std::invalid_argument for
/// TOML errors, unknown keys, missing keys, bad values (naming file, line and key).
std::vector<Threshold> load_thresholds(const std::filesystem::path& path);
std::vector<Threshold> parse_thresholds(const std::string& text, const std::string& source);

struct ThresholdResult {
  Threshold threshold;
  size_t rows = 0;     ///< matching rows (0: the threshold fails)
  double value = 0;    ///< the statistic over the matching rows
  bool pass = false;
};

/// Evaluate thresholds on a /latent_error table. Throws std::invalid_argument if a metric is not a
/// numeric column of the table (listing the numeric columns).
std::vector<ThresholdResult> evaluate_thresholds(const ColumnTable& latent_error, const std::vector<Threshold>& thresholds);

/// One line per threshold: PASS/FAIL, quantizer, target, statistic(metric), value, bound.
std::string format_threshold_results(const std::vector<ThresholdResult>& results);

}  // namespace latentq
