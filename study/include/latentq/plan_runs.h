// latentq/plan_runs.h — the planner's assignment at each budget of the decision, run end to end.
//
// The decision (latentq/decision.h) has, per budget, a plan row: the planner's exact optimum (solve_plan over
// read_plan_inputs, objective kl, else mse). So that this row carries the e2e statistics of the uniform and engine
// rows, `latentq run` (unsharded), `merge`, `study` and `decide` store those assignments in the results file as the
// group /plan_runs before the e2e step runs: one row per (run, layer, target), the run named "plan-<budget>"
// ("plan-1/4": the first budget of the ladder where the planner chose it). The e2e step (python -m latentq.e2e,
// latentq.e2e_results.planned_runs) runs each as a mixed run on c_kv + k_pe, quantizing each (layer, target) with
// its `stored` spec behind its `transform`, as a [[mixed]] rule of the study config does; its /e2e rows carry the
// run's name. The decision recomputes the plan at its budgets with the same function (decision_plans) and finds the
// /e2e row of the run whose assignment equals it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "latentq/plan.h"
#include "latentq/table.h"

namespace latentq {

/// A mixed assignment in /latent_error's terms: (layer, target) -> (transform: "none" or its string, such as
/// "had"; stored: the spec the target stores, TransformedSpec::spec.stored_for(target)).
using Assignment = std::map<std::pair<int64_t, std::string>, std::pair<std::string, std::string>>;

/// The mixed assignments of a /latent_error table (rows whose quantizer is neither a spec nor a transformed spec:
/// the [[mixed]] rules of the study config): name -> assignment ({} without the stored and transform columns).
std::map<std::string, Assignment> study_mixed_assignments(const ColumnTable& latent_error);

/// The planner at each budget of a decision: its inputs (objective "kl" when /attention_error has single-target
/// rows, else "mse") and, per fraction f, its exact optimum at f × the whole-model bf16 cache (nullopt when that
/// budget is below the cheapest assignment).
struct DecisionPlans {
  PlanInputs in;
  std::vector<std::optional<PlanSolution>> at;  ///< [fractions]
};

/// decision_plans of `results` at `fractions`. Throws std::invalid_argument as read_plan_inputs (objective mse).
DecisionPlans decision_plans(const std::filesystem::path& results, const std::vector<double>& fractions);

/// The assignment of solution `s` of `in`, in /latent_error's terms.
Assignment plan_assignment(const PlanInputs& in, const PlanSolution& s);

/// A budget fraction as the decision prints it: "1/16", "3/8", "all", else 4 significant digits.
std::string budget_fraction_label(double f);

/// The /plan_runs group (columns: run, budget_fraction, layer, target, quantizer, transform, stored,
/// bytes_per_token_model, plan_objective).
const GroupSpec& plan_runs_spec();

/// run name -> assignment of the /plan_runs rows of `results`, in the rows' order of first appearance ({} when the
/// file has no /plan_runs).
std::vector<std::pair<std::string, Assignment>> planned_runs(const std::filesystem::path& results);

/// Adds the planner's assignment at each of `fractions` to /plan_runs of `results` (WriteMode::Update: every other
/// group kept), unless it is already there, or is a [[mixed]] assignment of the study (its /latent_error rows, which
/// the e2e step runs already). The rows already in /plan_runs are kept first, unchanged, so a run of the e2e step
/// stays findable after a `decide` at other budgets; a run's name is "plan-" + budget_fraction_label(the first
/// fraction that chose it), "-2", "-3", ... appended when that name is taken by another assignment. Nothing is
/// written when nothing is added. Returns the names of the runs the fractions need (added or already there), in
/// the fractions' order, each once. Throws std::invalid_argument as decision_plans.
std::vector<std::string> write_plan_runs(const std::filesystem::path& results, const std::vector<double>& fractions);

}  // namespace latentq
