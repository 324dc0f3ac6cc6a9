// latentq/decision.h — the decision summary of a results file: at each byte budget, which cache format.
//
// A budget is a fraction of the bf16 cache of the whole model: num_layers × (kv_lora_rank +
// qk_rope_head_dim) × 2 bytes per token, c_kv + k_pe, metadata included (the default ladder: 1/16,
// 1/8, 1/4, 3/8, 1/2). Every byte figure is a whole-model bytes per token (/summary's
// bytes_per_token_model). For each budget three rows (the /decision table, one row each):
//   uniform  the best measured uniform format: the /summary quantizer (a spec or a transformed spec) at
//            no more than the budget with the lowest KL; never one whose format cannot take a target's width
//            (its /summary accounting is kNotApplicableAccounting, latentq/applicable.h);
//   engine   the best engine format at no more than the same bytes: a cache layout a serving engine
//            ships for MLA as it is (the format table's engine field, latentq/spec.h is_engine_format: an
//            engine preset, per-tensor fp8, ggml's q8_0 / q4_0 / q4_1; unrotated), ranked the same way, with
//            the engine and its setting (column `engine`);
//   plan     the planner's mixed assignment at the budget (latentq/plan.h solve_plan, objective "kl",
//            else "mse" when the study has no single-target /attention_error rows: latentq/plan_runs.h
//            decision_plans). It is "measured" when the results hold a run of a mixed assignment with exactly
//            that choice per (layer, target): a [[mixed]] rule of the study, or a run of /plan_runs, which
//            `latentq run`, `merge`, `study` and `decide` write for the e2e step to run (latentq/plan_runs.h);
//            its KL is then that run's, with the same statistics and intervals as the uniform row, and its
//            paired comparison with the best uniform format at the budget. Else "predicted" (its KL is NaN and
//            only its planner objective is known).
// KL: the e2e KL (/e2e, cache_mode prefill-at-once, targets c_kv+k_pe: kl_mean, top1_agree,
// delta_ppl = ppl_quant − ppl_ref) when the e2e step ran; otherwise the attention KL (/attention_error,
// targets c_kv+k_pe, mean over layers of kl_mean and top1_agree; delta_ppl NaN). `source` says which.
// plan_objective: the planner's objective of the row's assignment (Σ over (layer, target) groups; for a
// uniform row the same sum over its options), so the three rows compare in one unit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "latentq/table.h"

namespace latentq {

/// The default ladder of budgets, as fractions of the whole-model bf16 cache.
const std::vector<double>& default_budget_fractions();

/// Parses "1/16,1/8,0.25" (fractions a/b or decimals in (0, 1]); throws std::invalid_argument naming the
/// entry otherwise.
std::vector<double> parse_budget_fractions(const std::string& text);

/// The /decision group: its columns with their dtypes, units and definitions (decision.cpp).
const GroupSpec& decision_spec();

/// The /decision table of `results` (columns: budget_fraction, budget_bytes, choice (uniform, engine,
/// plan), quantizer ("-" when nothing fits; a plan: "mixed: <spec> x<count>, ..."), bytes_per_token_model,
/// kl_mean, top1_agree, delta_ppl, source (e2e, attention, measured-e2e, measured-attention, predicted,
/// none), plan_objective, engine (the engine and setting that ship the row's format, "" when none), objective,
/// kl_ci_lo / kl_ci_hi (the 95% interval of the row's /e2e kl_mean) and kl_p999 (its per-token tail), NaN when
/// the source has none; on a uniform row runner_up, runner_up_kl, runner_up_p999, delta_kl [delta_kl_lo,
/// delta_kl_hi] (paired_kl_difference of the runner-up and the choice) and verdict (paired_verdict); on a measured
/// plan row the same against the best uniform format at the budget, the plan named "the plan (<run>)", the uniform
/// format first in the verdict when it wins). Throws
/// std::invalid_argument naming the file for a missing /summary or root
/// attribute, and as read_table().
ColumnTable decision_table(const std::filesystem::path& results, const std::vector<double>& fractions);

/// The paired difference of two /e2e runs' kl_mean on the same sequences: delta = Σ_s kl_sum_a[s] / Σ_s tokens[s]
/// − the same of b; [lo, hi] its 95% percentile bootstrap (numpy "linear" percentiles 2.5 and 97.5) over the
/// draws `counts` [draw][seq] (how often each sequence is drawn: the /e2e_bootstrap draws of /e2e's intervals,
/// latentq.e2e_stats.paired_difference), each draw's Σ_s c_s·kl_sum_a[s] / Σ_s c_s·tokens[s] minus b's. NaN
/// interval with one sequence or no draws. Throws std::invalid_argument when the lengths differ.
struct PairedKl {
  double delta = std::numeric_limits<double>::quiet_NaN(), lo = std::numeric_limits<double>::quiet_NaN(),
         hi = std::numeric_limits<double>::quiet_NaN();
  int64_t tokens = 0, num_seqs = 0;
};
PairedKl paired_kl_difference(const std::vector<double>& kl_sum_a, const std::vector<double>& kl_sum_b,
                              const std::vector<double>& tokens, const std::vector<std::vector<double>>& counts);

/// The verdict of `best` against `runner_up` (p = paired_kl_difference(runner-up, best)): "B beats R: ΔKL = a [lo,
/// hi]" when lo > 0; else "B and R are indistinguishable on N tokens; the cheaper is C (ΔKL = a [lo, hi])" (C the
/// one with fewer bytes, B on a tie); with one sequence the ΔKL and why there is no interval; with `source` other
/// than "e2e" (the attention KL) or no per-sequence values, "verdict not available" and why. Without a
/// runner-up (empty): "B is the only measured uniform format within the budget".
std::string paired_verdict(const std::string& best, const std::string& runner_up, double best_bytes,
                           double runner_up_bytes, const PairedKl& p, const std::string& source);

/// /decision row i's free_running line from its gen_* and retrieval_* columns: "generation: first divergence at a
/// [lo, hi] of N tokens, identical f" and/or "retrieval: acc [lo, hi] of n needles (reference r, lost k)", joined
/// by "; "; empty when both are NaN. The terminal and report.md print the stored column, not a copy of this.
std::string free_running_line(const ColumnTable& decision, size_t i);

/// The terminal form: one block per budget ("at N B/token (1/8 of bf16): use X ..."), then the objective
/// and the metric's source in words.
std::string format_decision(const ColumnTable& decision);

}  // namespace latentq
