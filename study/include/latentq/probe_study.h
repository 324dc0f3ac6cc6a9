// latentq/probe_study.h — the generic probe runner of `latentq run`. The probes themselves are
// registered descriptors (latentq/probe_registry.h, one file each in study/probes/); this
// header plans them, runs their cells and prints their reports, whatever probes are registered.
//
// Every cell has a stable key, belongs to ONE probe, contributes a fixed set of rows to its groups,
// and is computed independently of every other cell: its rows depend only on the config, the dump
// and the cell — not on the thread count, nor on which other cells run, nor in which order. A plan
// lists the cells in canonical order (probe by probe, ascending Probe::order()); running any subset
// gives each cell's rows, so shards and resumed runs compute subsets and a merge concatenates by cell
// order (latentq/batch.h). The cells run as batch tasks of the one execution path,
// latentq/batch_study.h plan_study(), which streams the dump's layers (latentq/layer_store.h).
//
// The shipped probes and their groups (study/README.md has the columns and definitions):
//   [svd]          /svd + /svd_spectrum        "<layer:03d>/svd"
//   [cross_layer]  /cross_layer                "<a:03d>-<b:03d>/cross_layer"
//                  /cross_layer_sharing        "w<w>-<start:03d>/cross_layer_sharing"
//   [attention]    /attention_check            "<layer:03d>/attention_check"
//                  /attention_error            "<layer:03d>/<targets>/<quantizer>/attention_error"
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "latentq/batch.h"
#include "latentq/config.h"
#include "latentq/dump.h"
#include "latentq/layer_store.h"
#include "latentq/probe_registry.h"
#include "latentq/results.h"
#include "latentq/study.h"
#include "latentq/table.h"

namespace latentq {

// ---- ranks shared by the SVD, cross-layer and attention probes (study/run/probe_ranks.cpp) -----

/// The ranks of the SVD probe for this dump: [svd] ranks as given, or the automatic
/// probes::default_svd_ranks(kv_lora_rank) capped at probes::max_fit_rank(fit tokens, [svd] centered)
/// (the fit split of the dump's non-empty sequences, probes::fit_heldout_split), duplicates removed;
/// ascending. Needs the dump header only. Throws std::invalid_argument for an explicit rank >
/// kv_lora_rank or > what the fit split determines (naming the rank, the tokens it needs and the fit
/// tokens), for a fit split that determines no rank, and as fit_heldout_split (prefixed with the path).
std::vector<int64_t> svd_ranks(const StudyConfig& config, const Dump& dump);
/// The total ranks k of a sharing window of w layers: [cross_layer] ranks as given, or w·r/8, w·r/4,
/// w·r/2 (rounded down to a multiple of w, at least w), each capped at the largest multiple of w that
/// the fit split determines (probes::max_fit_rank with [cross_layer] centered), duplicates removed;
/// ascending. Throws std::invalid_argument for an explicit rank > w·kv_lora_rank or > what the fit
/// split determines (naming it), or a fit split that determines no multiple of w.
std::vector<int64_t> sharing_ranks(const StudyConfig& config, const Dump& dump, int64_t window);
/// One warning line when svd_ranks() or sharing_ranks() capped automatic ranks that the study uses (a
/// short dump of a large kv_lora_rank: kv_lora_rank 512 with 2 × 256 tokens fits ranks up to 255), naming
/// the fit tokens and every capped list; empty otherwise. Throws as svd_ranks() and sharing_ranks().
std::vector<std::string> rank_cap_warnings(const StudyConfig& config, const Dump& dump);

// ---- groups ----------------------------------------------------------------------------------------

/// Every registered probe group, in canonical order.
const std::vector<std::string>& probe_groups();
/// The columns of a probe group, in order (throws std::invalid_argument for an unknown group).
const std::vector<std::string>& probe_columns(const std::string& group);
/// A table with the columns of `group` and no rows.
ColumnTable empty_probe_table(const std::string& group);
/// The cell key of every row of a results table of `group` (latent_error or a probe group),
/// computed from its columns. Throws std::invalid_argument for another group or a missing column.
std::vector<std::string> row_keys(const std::string& group, const ColumnTable& table);

// ---- plans -------------------------------------------------------------------------------------------

/// Every probe cell of a config over a dump, canonical order.
struct ProbePlan {
  struct Part {
    const Probe* probe = nullptr;
    ProbePart part;
  };
  std::vector<Part> parts;  ///< one per registered probe, ascending order()
  std::vector<ProbeCell> cells;
  /// The groups the run writes (the enabled probes), in canonical order, including groups that have no
  /// cell in this plan.
  std::vector<std::string> groups;
  /// Lines `latentq run` prints as warnings before it runs the cells.
  std::vector<std::string> warnings;

  std::vector<std::string> keys() const;
  /// The cell with this key; throws std::invalid_argument naming it when there is none.
  const ProbeCell& cell(const std::string& key) const;
};

/// Plan every registered probe over `dump` (a header is enough: load_dump with data = false). Throws
/// std::invalid_argument for values the dump cannot take (an SVD rank > kv_lora_rank, a sharing rank >
/// w·kv_lora_rank, an explicit rank the fit split does not determine), naming the value.
ProbePlan plan_probes(const StudyConfig& config, const Dump& dump);

/// The rows of one cell: one table per group of the cell. Runs on the calling thread only (the
/// probes' OpenMP loops run with one thread inside it: cells are parallel across cells). Throws
/// std::invalid_argument "<dump>: cell <key>: <why>" when the probe rejects the data or a quantizer fails.
std::vector<ColumnTable> run_probe_cell(const StudyConfig& config, const ProbeCell& cell, const LayerAccess& in);

// ---- `latentq run` -----------------------------------------------------------------------------------

/// What `latentq run` prints after the latent summary: each probe's notes ("attention: skipped:
/// <why>", to `out`), its warnings (to `err`, "latentq: warning: ..."), then the probes' tables
/// (Probe::report, ascending print_order(); only with a /summary, i.e. not for a shard).
void print_probe_report(const StudyConfig& config, const ProbePlan& plan, const ColumnTable* summary,
                        const std::vector<NamedTable>& tables, const DumpAttrs& attrs, std::ostream& out,
                        std::ostream& err);

/// The /e2e table (python -m latentq.e2e): quantizer, bytes/token of the model (from /summary),
/// KL (nats), top-1, perplexity reference and quantized, sorted by bytes per token.
std::string format_e2e_summary(const ColumnTable& e2e, const ColumnTable& summary);

}  // namespace latentq
