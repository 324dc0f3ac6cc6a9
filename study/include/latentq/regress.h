// latentq/regress.h — the regression gate: thresholds on any numeric column of any table of a
// results file (/latent_error, /attention_error, /attention_position, /e2e, /e2e_position, /svd, ...).
//
// thresholds.toml holds [[threshold]] entries:
//   group      = "latent_error"           # optional (default latent_error): the results table (see
//                                         # gate_groups(): latent_error, summary, the probe groups,
//                                         # e2e, e2e_position)
//   metric     = "rel_fro"                # any numeric (int64 or float64) column of that group
//   statistic  = "max"                    # optional (default max): max, mean, min or p95 over the
//                                         # matching rows (p95: see percentile_linear())
//   bound      = 0.11
//   direction  = "max"                    # optional: "max": value <= bound; "min": value >= bound.
//                                         # Without it: "min" for sqnr_db, cos_mean, top1_agree and
//                                         # top8_agree (higher is better; the PASS/FAIL line says it was
//                                         # inferred), else "max".
// and the filters that select the rows, each applied to the group's column of that name:
//   quantizer  = "int4-*-channel-g32"     # a glob (POSIX fnmatch, no flags: * ? [...]), matched against
//                                         # the quantizer column as written. Without * ? [ it is a name: a
//                                         # spec is compared in canonical form (int8-asym-channel-g8-fp16
//                                         # matches int8-asym-channel-g8); another name (svd-rank64, a
//                                         # [[mixed]] name) as written, and when no row of the group has it
//                                         # the spec's parse error is a config error. Required in a group
//                                         # with a quantizer column ("*" selects every quantizer).
//   target     = "c_kv"                   # c_kv, k_pe or c_kv+k_pe: the `target` column (/latent_error)
//                                         # or the `targets` column (the attention and e2e groups)
//   layer      = 3                        # the `layer` column
//   cache_mode = "decode-r32-s4-p0"       # the `cache_mode` column (/attention_position, /e2e, ...)
//   rank       = 64                       # the `rank` column (/svd, /cross_layer_sharing)
//
// A threshold fails when its value breaks the bound, when it is NaN, or when no row matches.
// Config errors (std::invalid_argument naming the threshold's <file>:<line>:<column>; the CLI exits 2):
// an unknown group (listing the gate groups), a group the results file lacks (listing those it has),
// a metric that is not a numeric column of the group (listing them), a filter on a column the group
// lacks (listing its columns).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "latentq/table.h"

namespace latentq {

struct Threshold {
  std::string group = "latent_error";
  std::string metric, statistic = "max";
  std::string quantizer;                  ///< a glob or a name (canonical when it is a spec); empty: no filter
  bool quantizer_glob = false;            ///< quantizer holds * ? or [
  std::string quantizer_error;            ///< why the name does not parse as a spec (empty if it does)
  std::optional<std::string> target;      ///< c_kv, k_pe or c_kv+k_pe
  std::optional<int64_t> layer, rank;     ///< filters on the layer / rank column
  std::optional<std::string> cache_mode;  ///< filter on the cache_mode column
  std::string direction;                  ///< "max" or "min"; parse_thresholds() fills it in when absent
  bool direction_inferred = false;        ///< true when the entry had no `direction` (see the header comment)
  double bound = 0;
  std::string where;                             ///< "<file>:<line>:<col>" of the entry
  std::map<std::string, std::string> key_where;  ///< "<file>:<line>:<col>" of each key of the entry
  /// The threshold's name in the output: "<quantizer> <target> [layer L] [<cache_mode>] [rank R]
  /// /<group> <statistic>(<metric>)", the absent filters left out.
  std::string name() const;
};

/// True for the metrics where higher is better (sqnr_db, cos_mean, top1_agree, top8_agree): their
/// default direction is "min".
bool higher_is_better(const std::string& metric);

/// The groups a threshold may name: latent_error, summary, every probe group (probe_groups()), e2e and
/// e2e_position.
const std::vector<std::string>& gate_groups();

/// The q-quantile (0 <= q <= 1) of `values` by linear interpolation between order statistics, as
/// numpy.quantile's default (method "linear"): with v sorted ascending, n values, h = (n - 1)·q,
/// lo = floor(h): v[lo] + (h - lo)·(v[lo + 1] - v[lo]) (v[n - 1] when lo = n - 1). NaN if any value
/// is NaN or `values` is empty.
double percentile_linear(std::vector<double> values, double q);

/// Parse a thresholds file. Throws std::runtime_error if unreadable, std::invalid_argument for
/// TOML errors, unknown keys, missing keys, bad values (naming file, line and key). What depends on
/// the results file (groups, columns) is checked by evaluate_thresholds().
std::vector<Threshold> load_thresholds(const std::filesystem::path& path);
std::vector<Threshold> parse_thresholds(const std::string& text, const std::string& source);

struct ThresholdResult {
  Threshold threshold;
  size_t rows = 0;   ///< matching rows (0: the threshold fails)
  double value = 0;  ///< the statistic over the matching rows (NaN when none)
  bool pass = false;
};

/// The tables of one results file by group name (the gate groups it has).
using GateTables = std::map<std::string, ColumnTable>;

/// Evaluate thresholds on the tables of `results` (a name for messages). Throws std::invalid_argument
/// (the config errors of the header comment) before evaluating any threshold.
std::vector<ThresholdResult> evaluate_thresholds(const GateTables& tables, const std::vector<Threshold>& thresholds,
                                                 const std::string& results);

/// Read every gate group a results file has (throws as read_table()).
GateTables read_gate_tables(const std::filesystem::path& results);

/// One line per threshold: PASS/FAIL, its name(), value, bound; then the summary line
/// "gate: P of N thresholds pass" and, when some fail, each failing threshold again (name, value
/// against the bound, the entry's file:line:column).
std::string format_threshold_results(const std::vector<ThresholdResult>& results);

}  // namespace latentq
