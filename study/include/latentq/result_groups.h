// latentq/result_groups.h — every group a study's results file can hold, with its columns: the one list
// of the groups the C++ side writes, each declared once where its table is built (a GroupSpec,
// latentq/table.h) and stored in the file as the group's column record (latentq/results.h).
//
//   per cell   /latent_error (study.h), every probe's groups (the registry, probe_registry.h)
//   derived    /summary (study.h), /v4_cache (study.h, DeepSeek-V4 only), /score_vs_attention (study.h)
//   decision   /decision (decision.h)
//   plan runs  /plan_runs (plan_runs.h): the planner's assignments that the e2e step runs
//   index      /cells (batch.h)
//
// The e2e step's /e2e and /e2e_position are declared by the Python step that writes them
// (python/latentq/e2e.py). The report reads every group of a file through its column record, so a new
// group reaches report.md without a change to the report.
#pragma once

#include <string_view>
#include <vector>

#include "latentq/table.h"

namespace latentq {

/// Every group above, in the order a complete results file holds them (group names distinct).
const std::vector<GroupSpec>& results_groups();

/// The group `name` of results_groups(), or nullptr.
const GroupSpec* find_results_group(std::string_view name);

}  // namespace latentq
