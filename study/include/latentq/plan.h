// latentq/plan.h — `latentq plan`: a mixed assignment of measured quantizers per (layer, target) that
// minimizes a summed objective under a whole-model byte budget, written as a study config.
//
// The problem is a multiple-choice knapsack: one option per group (layer, target), cost = the
// option's bytes per token (metadata included), value = its objective. Costs are exact integers:
// a matrix's stored bytes are an integer over its T tokens, so bytes per token are rational, and
// read_plan_inputs() expresses every option's whole-model bytes per token as an integer number of
// plan units of 1/units_per_byte byte (PlanInputs::units_per_byte). solve_plan() then finds the exact
// optimum for those integers by a dynamic programme over the Pareto frontier of each prefix of groups
// (the distinct reachable cost totals, each kept only while its objective is strictly below that of
// every cheaper total), so its table never depends on the byte resolution nor on the budget beyond
// the largest assignment (see solve_plan for the complexity).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "latentq/spec.h"

namespace latentq {

/// One measured quantizer of a group.
struct PlanOption {
  std::string quantizer;  ///< canonical TransformedSpec string ("int4-asym-token", "had,int4-asym-token")
  int64_t cost = 0;       ///< exact bytes per token this group costs (whole-model scale, metadata included), in
                          ///< plan units (bytes = cost / units_per_byte); ≥ 0
  double objective = 0;   ///< what it adds to the objective (≥ 0 expected; any finite value accepted)
};

/// One (layer, target) and its options.
struct PlanGroup {
  int layer = 0;
  Target target = Target::CKV;
  std::vector<PlanOption> options;
};

struct PlanSolution {
  std::vector<size_t> choice;  ///< [groups] index into each group's options
  int64_t cost = 0;            ///< Σ chosen costs (plan units, exact)
  double bytes = 0;            ///< cost / units_per_byte: bytes per token
  double objective = 0;        ///< Σ chosen objectives, summed in group order
  int64_t budget_cost = 0;     ///< the budget in plan units: the largest total that fits (after the cap)
  bool capped = false;         ///< the budget exceeded the largest assignment and was capped at it
  double max_bytes = 0;        ///< the largest assignment's bytes per token (Σ of each group's costliest option)
  size_t frontier_max = 0;     ///< the most Pareto points held for one prefix of groups (the DP's width)
  size_t frontier_total = 0;   ///< Σ over prefixes of the Pareto points kept (back-pointers held)
};

/// Relative slack of the budget: a total of at most budget × (1 + kPlanBudgetSlack) bytes per token fits,
/// so that a budget equal to an assignment's bytes as /summary reports them (a double, summed with
/// rounding) admits that assignment. It is less than one plan unit (two totals differ by at least
/// 1 / units_per_byte byte per token) while budget × units_per_byte < 10^13.
inline constexpr double kPlanBudgetSlack = 1e-13;

/// The exact minimum of Σ objective subject to Σ cost ≤ budget_bytes × units_per_byte (with the
/// slack kPlanBudgetSlack), for integer costs in units of 1/units_per_byte byte per token. A budget
/// above the largest assignment (Σ over groups of the costliest option) is capped at it (`capped`).
///
/// Method: options dominated within their group (another costs no more and scores no worse) are dropped;
/// then for groups g = 0..G-1 the Pareto frontier of the first g+1 groups is the merge of the previous
/// frontier shifted by each option, keeping a total only when its objective is strictly below that of
/// every cheaper total and when the cheapest completion still fits the budget. The answer is the last
/// point of the final frontier. Exact: floating-point addition is monotone, so a dominated prefix never
/// completes to a strictly better total than the prefix dominating it. With F_g the frontier of g groups
/// (F_g ≤ min(Π_{h<g} n_h, the distinct totals ≤ the budget) ≤ budget_cost + 1) and n_g the group's
/// undominated options: time O(Σ_g F_g · n_g · log n_g), memory O(max_g F_g · 16 bytes + Σ_g F_g · 8 bytes)
/// (two frontiers of (cost, objective) and one back-pointer per kept point).
///
/// Ties: the cheapest of the minima; among equal totals and objectives, the lower option index of the
/// last group first (deterministic). Throws std::invalid_argument for no group, a group without
/// options, a negative cost or a non-finite objective, units_per_byte < 1, a non-finite budget, totals
/// beyond 2^53 units, or a budget below the cheapest assignment (naming that minimum, in bytes per token).
PlanSolution solve_plan(const std::vector<PlanGroup>& groups, double budget_bytes, int64_t units_per_byte);

/// The planner's view of a results file.
struct PlanInputs {
  std::vector<PlanGroup> groups;      ///< one per (layer, target) of /latent_error, layer-major
  std::vector<std::string> uniform;   ///< quantizers measured in every group (candidates for a uniform plan)
  std::string objective;              ///< "kl" or "mse"
  std::string objective_note;         ///< what the objective sums, in words
  int64_t units_per_byte = 1;         ///< plan units per byte per token (every option's cost is exact in them)
  std::vector<std::string> warnings;  ///< the rows that are no option, each with the reason
};

/// Read /latent_error (and /attention_error for objective "kl") of `results`. Options: every
/// quantizer row of /latent_error that is a spec or a transformed spec ("<transform>,<spec>"); a row
/// that is neither (a mixed assignment's) or has a non-finite objective is no option, and a warning
/// names its quantizer, where and why. Bytes: bytes_per_token_layer is a matrix's stored bytes B over
/// its T tokens; each is recovered as the exact fraction B/T (the fraction of smallest denominator that
/// rounds to the stored double: exact when T ≤ 10^6 tokens), asserted to round-trip, and a group's cost
/// is B/T · num_layers / (studied layers) in units of 1/units_per_byte byte (units_per_byte = the least
/// common denominator × studied layers / gcd), so Σ over groups of a uniform quantizer's cost is its
/// /summary bytes_per_token_model. Objective "kl": kl_mean of the /attention_error row (layer,
/// quantizer, targets = the group's target alone; nats, mean over query rows × heads) — a quantizer
/// without that row is no option there (a warning names it); "mse": mse · D (squared error per token,
/// D = the target's width). Throws std::invalid_argument naming the file for a missing group or column,
/// an unknown objective, kl without /attention_error single-target rows, or bytes that are no fraction
/// of a token count (no round trip with a denominator ≤ 2^40).
PlanInputs read_plan_inputs(const std::filesystem::path& results, const std::string& objective);

/// The best uniform plan: the quantizer of `in.uniform` with the lowest Σ objective (group order)
/// whose exact total fits `budget_cost` plan units; empty `quantizer` when none fits.
struct PlanUniform {
  std::string quantizer;
  int64_t cost = 0;
  double bytes = 0, objective = 0;
};
PlanUniform best_uniform(const PlanInputs& in, int64_t budget_cost);

/// The study config (TOML) of a plan: [input] the results' input dump (absolute), layers and targets;
/// [quantizers] extra = the best uniform quantizer (when given) for comparison; one [[mixed]] rule
/// named "mixed" per (layer, target), its spec string transformed ("had,int4-asym-token") where the
/// plan chose a transformed spec; [e2e] enabled and model copied from the results' config.
std::string plan_config_text(const std::filesystem::path& results, const std::vector<PlanGroup>& groups,
                             const PlanSolution& plan, const std::string& uniform, const std::string& header);

/// Write `text` to `path` through a temporary ".<name>.<pid>.tmp" in the same directory and a
/// rename. Throws std::runtime_error naming the path when it cannot be written.
void write_text_atomic(const std::filesystem::path& path, const std::string& text);

}  // namespace latentq
