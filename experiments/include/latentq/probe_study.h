// latentq/probe_study.h — the generic probe runner of `latentq run`. The probes themselves are
// registered descriptors (latentq/probe_registry.h, one file each in experiments/src/probes/); this
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
// The shipped probes and their groups (experiments/README.md has the columns and definitions):
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
#include "latentq/probes/attention.h"
#include "latentq/probes/svd_probe.h"
#include "latentq/results.h"
#include "latentq/study.h"
#include "latentq/table.h"

namespace latentq {

// ---- ranks shared by the SVD, cross-layer and attention probes (experiments/src/probe_ranks.cpp) -----

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

// ---- attention helpers (experiments/src/probes/attention.cpp) -------------------------------------------

/// Why the attention probe cannot run on this dump ("" when it can: the file has the attention
/// datasets), naming the missing dataset.
std::string attention_unavailable_reason(const Dump& dump);
/// The absorbed-attention inputs of one dumped layer (query rows, q_nope, q_pe, W_UK, W_UV, dims,
/// seq_offsets and softmax_scale of the dump). Views into `dump` and `layer`: valid while they live.
probes::AttentionQueries attention_queries(const Dump& dump, const Layer& layer);
/// The absorbed attention of one layer on its exact latents: built once per layer (while the layer is
/// held) and shared by that layer's cells of every attention probe (/attention_check, /attention_error,
/// /attention_position). `ref` is att->run(c_kv, k_pe, keep_probs = true); `prepared` its
/// probes::AttentionReference (top-8 keys, finiteness), which points at *ref.
struct AttentionLayerReference {
  probes::AttentionQueries queries;  // views into the layer (the fold check rotates copies)
  std::unique_ptr<probes::AbsorbedAttention<float>> att;
  std::unique_ptr<const probes::AttentionResult<float>> ref;
  std::unique_ptr<const probes::AttentionReference<float>> prepared;
};
/// The layer's AttentionLayerReference (computed by the first cell that asks). Throws
/// std::invalid_argument naming the missing dataset when the dump has no attention data, and as
/// AbsorbedAttention / run / AttentionReference.
std::shared_ptr<const AttentionLayerReference> attention_reference(const LayerAccess& in, int layer);

/// The same on an attention device (`--device cuda`, LayerAccess::attention_device): the attention with the
/// device attached and its reference, computed on the device. A device that computes attention_error's terms
/// (AbsorbedAttention::device_computes_errors) keeps the reference's probabilities itself: `ref` then has none
/// and `prepared` is null.
struct AttentionDeviceReference {
  std::unique_ptr<probes::AbsorbedAttention<float>> att;
  std::unique_ptr<const probes::AttentionResult<float>> ref;
  std::unique_ptr<const probes::AttentionReference<float>> prepared;
};
/// Where the /attention_error cells of a layer evaluate (every one of them, svd-rank cells included): the
/// device when the access has one, else the CPU. A cell's error always compares two results of one engine.
/// The decode-order cells use it too where the device runs mixed caches and computes the errors
/// (device_metrics and AbsorbedAttention::device_runs_mixed), else attention_reference(); the attention check
/// and the fold check use attention_reference() alone.
struct AttentionErrorEngine {
  std::shared_ptr<const AttentionLayerReference> cpu;
  std::shared_ptr<const AttentionDeviceReference> device;  ///< null: the CPU
  const probes::AbsorbedAttention<float>& att() const { return device ? *device->att : *cpu->att; }
  const probes::AttentionReference<float>& prepared() const { return device ? *device->prepared : *cpu->prepared; }
  /// True when the device computes the errors where the probabilities are (device_error); then prepared()
  /// must not be called and error() is the one way to a cell's error.
  bool device_metrics() const { return device && !device->prepared; }
  /// One cell's error: attention_error(prepared(), att().run(c_kv, k_pe, true)), or att().device_error(c_kv,
  /// k_pe) when device_metrics(). Throws as those.
  probes::AttentionError error(std::span<const float> c_kv, std::span<const float> k_pe) const {
    if (device_metrics()) return device->att->device_error(c_kv, k_pe);
    return probes::attention_error(prepared(), att().run(c_kv, k_pe, true));
  }
};
/// The layer's AttentionErrorEngine: attention_reference(), and on a device its AttentionDeviceReference, a
/// shared value of its own (computed by the first cell that asks; a device failure fails the
/// /attention_error cells, not the CPU reference's other users). Throws as attention_reference() and, on a
/// device, as AbsorbedAttention::attach_device and the device's run().
std::shared_ptr<const AttentionErrorEngine> attention_error_engine(const LayerAccess& in, int layer);
/// The rotation of transform `t` for one layer's target (c_kv or k_pe), as probes::fit_rotation builds it
/// (KLT: the PCA basis of the layer's fit split; rot: the seeded Haar matrix; had: the FWHT): fitted
/// once per (layer, target, transform) while the layer is held and shared by the probe cells that
/// quantize through it (/attention_error, /attention_check's fold, /attention_position). The identity
/// for TransformKind::None. Throws as fit_rotation.
std::shared_ptr<const Rotation> layer_rotation(const LayerAccess& in, int layer, Target target, const Transform& t);
/// The layer's c_kv or k_pe rotated by layer_rotation(in, layer, target, t) (with that rotation): made once
/// per (layer, target, transform) while the layer is held and shared by the latent cells and the probe
/// cells that quantize behind t, so each (layer, target, transform) is rotated forward once. Memory: one
/// [T, D] float32 matrix per transform while the layer is held. Throws std::invalid_argument for
/// TransformKind::None (nothing to rotate), and as layer_rotation.
std::shared_ptr<const RotatedLatent> rotated_latent(const LayerAccess& in, int layer, Target target, const Transform& t);
/// quantize_dequantize_rotated(spec, *layer_rotation(in, layer, target, t), target, the layer's c_kv or k_pe,
/// ...) into out [T, D] (row-major float32), the forward rotation taken from rotated_latent(): the same
/// values. Returns the stored tensor. Throws as quantize() and rotated_latent().
QuantizedTensor quantize_dequantize_layer(const LayerAccess& in, int layer, Target target, const QuantSpec& spec,
                                          const Transform& t, float* out);
/// The layer's c_kv fit of the SVD basis (probes::fit_svd_split, centered or not): made once per (layer,
/// centering) while the layer is held and shared by the SVD probe, the shared-basis probe's per-layer side
/// and the svd-rank attention cells. Throws as fit_svd_split.
std::shared_ptr<const probes::SvdSplitFit> svd_split_fit(const LayerAccess& in, int layer, bool centered);
/// Warning lines for the /attention_check rows above `tolerance` (or NaN).
std::vector<std::string> attention_check_warnings(const ColumnTable& check, double tolerance);

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
