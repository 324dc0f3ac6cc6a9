// latentq/applicable.h — the (quantizer, target) pairs of a study that a format cannot take.
//
// A format refuses some row widths (latentq/spec.h why_not_applicable: ggml's q8_0 / q4_0 / q4_1 need a multiple
// of 32, TurboQuant a Hadamard block, transform coding R·D >= 8 bits; a preset as its stored format of the target).
// On a model whose k_pe is 16 wide, q8_0 cannot store k_pe: that is a fact about the format, not an error of the
// study. The study plans only the pairs a format can take and lists the others once:
//   - /latent_error has no cell of such a pair (plan_cells);
//   - /attention_error keeps the quantizer's rows of the targets it can take and leaves out those that quantize
//     the other (its "c_kv+k_pe" and "k_pe" rows when it cannot take k_pe: the attention on a cache it cannot
//     store does not exist); /attention_position likewise for [decode_order]'s quantizers;
//   - /summary counts that target as bf16 and says so (kNotApplicableAccounting), and the decision never
//     chooses such a quantizer as the format of the whole cache; the planner has no option of such a pair;
//   - the e2e step does not run the quantizer on that target;
//   - the results file lists the pairs in /not_applicable (not_applicable_columns(); present only when there is
//     one), and `latentq run` prints one line per width and reason (format_not_applicable()).
// A quantizer that fails for any other reason (a value its format cannot hold, a transform that cannot rotate the
// width) still fails its cell, and so the run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "latentq/config.h"
#include "latentq/dump.h"
#include "latentq/spec.h"
#include "latentq/table.h"

namespace latentq {

/// Why quantizer `q` cannot store `target` of a dump of dims `dims`, or "" when it can: why_not_applicable() of
/// its spec, or of the first rule of a mixed assignment on that target whose format refuses the width.
std::string why_not_applicable(const Quantizer& q, Target target, const DumpAttrs& dims);

/// One pair a format cannot take.
struct NotApplicable {
  std::string quantizer;  ///< the quantizer's name (canonical "<transform>,<spec>", or a mixed assignment's name)
  Target target = Target::CKV;
  int64_t width = 0;   ///< the target's row length in the dump
  std::string reason;  ///< why_not_applicable()
};

/// Every (quantizer, target) pair of `config` whose format cannot take the target's width in a dump of `dims`: the
/// quantizers of each studied target (config order), then one row per enabled probe with nothing to measure on the
/// dump's cache family (Probe::not_applicable_reason; quantizer "[section]", width 0: [svd] on DeepSeek-V4), then
/// the pairs the probes quantize on their own
/// (Probe::quantized_pairs, e.g. [decode_order]'s quantizers on its targets); each pair once.
std::vector<NotApplicable> not_applicable(const StudyConfig& config, const DumpAttrs& dims);

/// The value of /summary's c_kv_accounting / k_pe_accounting for a target the quantizer cannot take.
inline constexpr const char* kNotApplicableAccounting = "not applicable (bf16 counted)";

/// The columns of /not_applicable: quantizer (str), target (str, a kTargets name), width (int64, elements per
/// row), reason (str); a derived group (latentq/result_groups.h).
const GroupSpec& not_applicable_spec();
/// The /not_applicable table of `pairs` (one row each, in order).
ColumnTable not_applicable_table(const std::vector<NotApplicable>& pairs);

/// The terminal lines, one per (target, width, reason) in first-seen order, each naming its quantizers once:
/// "not applicable: q8_0, q4_0, q4_1 on k_pe (16 wide): ggml blocks need a row length that is a multiple of 32,
/// got 16\n". Empty for no pair.
std::string format_not_applicable(const std::vector<NotApplicable>& pairs);

}  // namespace latentq
