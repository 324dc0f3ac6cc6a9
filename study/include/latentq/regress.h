// latentq/regress.h — the regression gate: thresholds on /latent_error of a results file.
//
// thresholds.toml holds [[threshold]] entries:
//   quantizer = "int4-asym-channel-g32"  # a spec (compared in canonical form)
//   target    = "c_kv"                   # c_kv or k_pe
//   metric    = "rel_fro"                # any numeric column of /latent_error
//   statistic = "max"                    # max, mean or min over the matching rows (layers)
//   bound     = 0.11
//   direction = "max"                    # optional: "max": value <= bound; "min": value >= bound.
//                                        # Without it: "min" for sqnr_db and cos_mean (higher is
//                                        # better; the PASS/FAIL line says it was inferred), else "max".
// A threshold fails when its value breaks the bound, when it is NaN, or when no row matches.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "latentq/table.h"

namespace latentq {

struct Threshold {
  std::string quantizer, target, metric, statistic = "max";
  std::string direction;            ///< "max" or "min"; parse_thresholds() fills it in when absent
  bool direction_inferred = false;  ///< true when the entry had no `direction` (see the header comment)
  double bound = 0;
  std::string where;  ///< "<file>:<line>:<col>" of the entry
};

/// True for the metrics where higher is better (sqnr_db, cos_mean): their default direction is "min".
bool higher_is_better(const std::string& metric);

/// Parse a thresholds file. Throws std::runtime_error if unreadable, std::invalid_argument for
/// TOML errors, unknown keys, missing keys, bad values (naming file, line and key).
std::vector<Threshold> load_thresholds(const std::filesystem::path& path);
std::vector<Threshold> parse_thresholds(const std::string& text, const std::string& source);

struct ThresholdResult {
  Threshold threshold;
  size_t rows = 0;   ///< matching rows (0: the threshold fails)
  double value = 0;  ///< the statistic over the matching rows
  bool pass = false;
};

/// Evaluate thresholds on a /latent_error table. Throws std::invalid_argument if a metric is not a
/// numeric column of the table (listing the numeric columns).
std::vector<ThresholdResult> evaluate_thresholds(const ColumnTable& latent_error,
                                                 const std::vector<Threshold>& thresholds);

/// One line per threshold: PASS/FAIL, quantizer, target, statistic(metric), value, bound.
std::string format_threshold_results(const std::vector<ThresholdResult>& results);

}  // namespace latentq
