// latentq/batch_study.h — `latentq run` and `latentq merge` as batch runs (latentq/batch.h): the
// cells of a study config as CellTasks in canonical order, the tables derived from the per-cell
// tables, and the dimensions a merge needs from a results file's root attributes.
//
// Canonical cell order: the /latent_error cells in plan_cells() order (layer, then target in config
// order, then quantizer in config order), then the probe cells (latentq/probe_study.h). Execution
// order is layer by layer (StudyPlan::schedule): the dump is streamed, never held whole.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "latentq/batch.h"
#include "latentq/config.h"
#include "latentq/dump.h"
#include "latentq/layer_store.h"
#include "latentq/probe_study.h"
#include "latentq/results.h"
#include "latentq/study.h"

namespace latentq {

/// A study ready for run_batch(): the one execution path of `latentq run`, its shards and the tests.
struct StudyPlan {
  std::shared_ptr<LayerStore> store;  ///< the input dump, streamed (header read; layers read by the cells)
  std::vector<CellTask> tasks;        ///< every cell of the study, canonical order
  std::vector<LayerUse> uses;         ///< per task: the dump layers it reads
  Attrs attrs;                        ///< root attributes (study_attrs())
  std::vector<Quantizer> quantizers;  ///< every quantizer (config.all_quantizers(), /summary row order)
  ProbePlan probes;                   ///< the probe cells (the tasks after the latent-error ones)

  const Dump& dump() const { return store->header(); }
  /// BatchOptions::schedule for these tasks: the pending cells ordered by the last dump layer they read,
  /// then the first, then canonical order (so a layer is read once and dropped once its cells — and the
  /// windows that include it — are done); it announces their layer uses to the store. Memory bound:
  /// at most threads x (the most layers one cell reads) layers are held at once when the cells read
  /// runs of consecutive layers (pairs = "adjacent", windows); pairs = "all" keeps a layer until its
  /// pair with the last layer is done.
  std::function<std::vector<size_t>(const std::vector<size_t>&)> schedule() const;
};

/// Read the header of config.dump (load_dump with data = false: attributes, tokens, every studied
/// dataset's dtype and shape; the attention datasets when [attention] is enabled), hash the file and
/// plan every cell: one task per plan_cells() cell (key Cell::key(), group latent_error, one row as
/// run_latent_error() gives it; with the layer's attention data, for the score columns, when a probe cell
/// reads it), then the probe cells (plan_probes(), run_probe_cell()). Every task reads
/// its layers through `store`. Before returning, validate_layers() reads every studied layer's values once
/// (the attention datasets too when a cell needs them; `validate_progress` is its progress callback), so
/// that bad input throws here, before any cell runs or any file is written. `backend` must outlive the
/// tasks. Throws as load_dump(), validate_layers() and plan_probes(); std::invalid_argument if config.dump
/// is empty.
StudyPlan plan_study(const StudyConfig& config, LatentBackend& backend,
                     const std::function<void(size_t, size_t)>& validate_progress = nullptr);

/// The tables of a complete run of `plan` (all shards, no checkpoint) written to `out` and read back:
/// what the tests compare (run_batch() with plan.schedule()).
BatchResult run_study_batch(const std::filesystem::path& out, const StudyPlan& plan, BatchOptions options = {});

/// The DeriveFn of the study: /summary (summarize()) from /latent_error, with the quantizers of the
/// config text in root attribute `config` (source `config_source`) and num_layers, kv_lora_rank,
/// qk_rope_head_dim, model from the root attributes; /not_applicable (latentq/applicable.h) of that config
/// and those dims when it has a row; /score_vs_attention (score_vs_attention()) when
/// /attention_error is present too and /latent_error has score_mse. Nothing without /latent_error. Throws
/// std::invalid_argument for a missing attribute or a config text that does not parse.
std::vector<NamedTable> derive_study_tables(const Attrs& root, const std::vector<NamedTable>& cell_tables);

/// model, num_layers, kv_lora_rank, qk_rope_head_dim of a results file's root attributes, and for a DeepSeek-V4 study
/// (root attribute cache_family) cache_family, head_dim and index_head_dim (other fields default). Throws
/// std::invalid_argument naming a missing attribute or an unknown cache_family.
DumpAttrs dump_attrs_from_results(const Attrs& root);

/// The study config of a results file: the text of root attribute `config` parsed with source
/// `config_source` and base directory `config_dir` (the directory relative paths of the config
/// resolve against, written by study_attrs()); `has_dir` tells whether `config_dir` was there (files of
/// older versions lack it: relative paths then resolve against the current directory). Throws
/// std::invalid_argument for a missing or non-string `config`, and as parse_config().
StudyConfig config_from_results(const Attrs& root, bool* has_dir = nullptr);

}  // namespace latentq
