// latentq/batch_study.h — `latentq run` and `latentq merge` as batch runs (latentq/batch.h): the
// cells of a study config as CellTasks in canonical order, the tables derived from the per-cell
// tables, and the dimensions a merge needs from a results file's root attributes.
//
// Canonical cell order: the /latent_error cells in plan_cells() order (layer, then target in config
// order, then quantizer in config order); cell kinds added later (probe groups) come after them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "latentq/batch.h"
#include "latentq/config.h"
#include "latentq/dump.h"
#include "latentq/results.h"
#include "latentq/study.h"

namespace latentq {

/// A study ready for run_batch().
struct StudyPlan {
  std::shared_ptr<const Dump> dump;   ///< the loaded input; the tasks refer to it
  std::vector<CellTask> tasks;        ///< every cell of the study, canonical order
  Attrs attrs;                        ///< root attributes (study_attrs())
  std::vector<Quantizer> quantizers;  ///< every quantizer (config.all_quantizers(), /summary row order)
};

/// Load config.dump (latents only), hash it and plan every cell: one task per plan_cells() cell,
/// key Cell::key() ("<layer:03d>/<target>/<quantizer>/latent_error"), group latent_error, one row
/// as run_latent_error() gives it (the same numbers as an unbatched run). `backend` must outlive
/// the tasks. Throws as load_dump(); std::invalid_argument if config.dump is empty.
StudyPlan plan_study(const StudyConfig& config, LatentBackend& backend);

/// The DeriveFn of the study: /summary (summarize()) from /latent_error, with the quantizers of the
/// config text in root attribute `config` (source `config_source`) and num_layers, kv_lora_rank,
/// qk_rope_head_dim, model from the root attributes. Nothing without /latent_error. Throws
/// std::invalid_argument for a missing attribute or a config text that does not parse.
std::vector<NamedTable> derive_study_tables(const Attrs& root, const std::vector<NamedTable>& cell_tables);

/// model, num_layers, kv_lora_rank, qk_rope_head_dim of a results file's root attributes (other
/// fields default). Throws std::invalid_argument naming a missing attribute.
DumpAttrs dump_attrs_from_results(const Attrs& root);

/// The study config of a results file: the text of root attribute `config` parsed with source
/// `config_source` and base directory `config_dir` (the directory relative paths of the config
/// resolve against, written by study_attrs()); `has_dir` tells whether `config_dir` was there (files of
/// older versions lack it: relative paths then resolve against the current directory). Throws
/// std::invalid_argument for a missing or non-string `config`, and as parse_config().
StudyConfig config_from_results(const Attrs& root, bool* has_dir = nullptr);

}  // namespace latentq
