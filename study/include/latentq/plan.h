// latentq/plan.h — `latentq plan`: a mixed assignment of measured quantizers per (layer, target) that
// minimizes a summed objective under a whole-model byte budget, written as a study config.
//
// The problem is a multiple-choice knapsack: one option per group (layer, target), cost = the
// option's bytes per token (metadata included), value = its objective. solve_plan() solves it exactly
// by dynamic programming over the budget in integer units of 1/kPlanUnitsPerByte byte, each option's
// cost rounded UP to a unit (so a plan never exceeds the budget in true bytes; an assignment whose
// true total fits but whose rounded total does not — within G/kPlanUnitsPerByte bytes of the budget,
// G the number of groups — is not considered).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "latentq/spec.h"

namespace latentq {

inline constexpr int64_t kPlanUnitsPerByte = 64;

/// One measured quantizer of a group.
struct PlanOption {
  std::string quantizer;  ///< canonical spec string
  double bytes = 0;       ///< bytes per token this group costs (whole-model scale), metadata included
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
  double bytes = 0;            ///< Σ chosen bytes (true, not rounded)
  double objective = 0;        ///< Σ chosen objectives
};

/// The exact minimum of Σ objective subject to Σ bytes ≤ budget (see the header comment for the
/// rounding). Ties: the first minimum found (lower option index in the last group first). Throws
/// std::invalid_argument for no group, a group without options, a non-finite or negative cost or a
/// non-finite objective, or a budget below the cheapest assignment (naming that minimum, in bytes per
/// token).
PlanSolution solve_plan(const std::vector<PlanGroup>& groups, double budget_bytes);

/// The planner's view of a results file.
struct PlanInputs {
  std::vector<PlanGroup> groups;       ///< one per (layer, target) of /latent_error, layer-major
  std::vector<std::string> uniform;    ///< quantizers measured in every group (candidates for a uniform plan)
  std::string objective;               ///< "kl" or "mse"
  std::string objective_note;          ///< what the objective sums, in words
};

/// Read /latent_error (and /attention_error for objective "kl") of `results`. Options: every
/// quantizer row of /latent_error that is a spec (mixed rows are skipped), bytes =
/// bytes_per_token_layer · num_layers / (studied layers) (so Σ over groups = the whole model's bytes
/// per token, as /summary counts them); objective "kl": kl_mean of the /attention_error row (layer,
/// quantizer, targets = the group's target alone; nats, mean over query rows × heads) — a quantizer
/// without that row is not an option; "mse": mse · D (squared error per token, D = the target's
/// width). Throws std::invalid_argument naming the file for a missing group or column, an unknown
/// objective, or kl without /attention_error single-target rows.
PlanInputs read_plan_inputs(const std::filesystem::path& results, const std::string& objective);

/// The study config (TOML) of a plan: [input] the results' input dump (absolute), layers and targets;
/// [quantizers] extra = the best uniform quantizer (when given) for comparison; one [[mixed]] rule
/// named "mixed" per (layer, target); [e2e] enabled and model copied from the results' config.
std::string plan_config_text(const std::filesystem::path& results, const std::vector<PlanGroup>& groups,
                             const PlanSolution& plan, const std::string& uniform, const std::string& header);

/// Write `text` to `path` through a temporary ".<name>.<pid>.tmp" in the same directory and a
/// rename. Throws std::runtime_error naming the path when it cannot be written.
void write_text_atomic(const std::filesystem::path& path, const std::string& text);

}  // namespace latentq
