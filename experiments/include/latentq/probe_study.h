// latentq/probe_study.h — the probe groups of `latentq run`, organized as cells like the latent-error
// study (latentq/study.h). Every cell has a stable key, belongs to ONE group, contributes a fixed
// set of rows to it, and is computed independently of every other cell: its rows depend only on the
// config, the dump and the cell — not on the thread count, nor on which other cells run, nor in
// which order. A plan lists the cells in canonical order (kind by kind); running any subset gives
// each cell's rows, so shards and resumed runs can compute subsets and a merge can concatenate by
// cell order (latentq/batch.h: a ProbeCell maps to a CellTask{cell_key, cell_groups, runner.run}).
//
//   group                 cell key                                             rows per cell
//   /svd + /svd_spectrum  "<layer:03d>/svd"                                    one per SVD rank; kv_lora_rank
//   /cross_layer          "<a:03d>-<b:03d>/cross_layer"                        1
//   /cross_layer_sharing  "w<w>-<start:03d>/cross_layer_sharing"               one per rank of size w
//   /attention_check      "<layer:03d>/attention_check"                        1
//   /attention_error      "<layer:03d>/<targets>/<quantizer>/attention_error"  1
//                         targets: c_kv | k_pe | c_kv+k_pe; quantizer: a canonical spec, or
//                         svd-rank<r> (targets c_kv) for SVD-pruned c_kv
//   /attention_position   "<layer:03d>/<targets>/<quantizer>/attention_position"  one per cache mode and
//                         query-position bucket ([decode_order]; prefill-at-once first, then the modes)
//
// Work shared by several cells of one layer (the absorbed attention on the exact latents and the SVD basis for /attention_check and
// /attention_error; the bf16 reads of c_kv and k_pe and bf16(c_kv)'s partial scores) is computed once per
// ProbeRunner, on first use, thread-safely; it is a deterministic function of the layer, so sharing it
// does not change any value. The /attention_error cells of one (layer, quantizer) in the plan (targets
// c_kv, k_pe, c_kv+k_pe) are computed together by the first of them to run (one quantization per
// target, shared partial scores: probes::AbsorbedAttention::run_variants); each takes its own row,
// the same row it would compute alone, so cells stay independent (a cell the plan does not hold, or a
// group whose shared run fails, computes alone and reports its own error).
//
// The probes compute on the CPU (latentq_probes). Quantized latents for attention go through
// latentq/quantize.h quantize_dequantize — the CPU reference a CUDA backend must match byte for byte.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "latentq/batch.h"
#include "latentq/config.h"
#include "latentq/probes/attention.h"
#include "latentq/dump.h"
#include "latentq/results.h"
#include "latentq/study.h"
#include "latentq/table.h"

namespace latentq {

// ---- cells -----------------------------------------------------------------------------------------

/// /svd and /svd_spectrum of one layer's c_kv.
struct SvdCell {
  int layer = 0;
  std::string key() const;  ///< "003/svd"
  std::vector<std::string> groups() const { return {"svd", "svd_spectrum"}; }
};
/// /cross_layer: Pearson and CKA of two layers' c_kv.
struct CrossLayerCell {
  int layer_a = 0, layer_b = 0;  ///< layer_a < layer_b
  std::string key() const;       ///< "003-004/cross_layer"
  std::vector<std::string> groups() const { return {"cross_layer"}; }
};
/// /cross_layer_sharing: shared vs per-layer bases over w consecutive loaded layers.
struct SharingCell {
  int window = 0;           ///< w
  std::vector<int> layers;  ///< the w consecutive loaded layers, ascending; front() = window start
  std::string key() const;  ///< "w2-000/cross_layer_sharing"
  std::vector<std::string> groups() const { return {"cross_layer_sharing"}; }
};
/// /attention_check: the absorbed recomputation on exact latents against the dump's attn_out.
struct AttentionCheckCell {
  int layer = 0;
  std::string key() const;  ///< "003/attention_check"
  std::vector<std::string> groups() const { return {"attention_check"}; }
};
/// /attention_error: attention on quantized (or SVD-pruned) latents against exact latents.
struct AttentionCell {
  int layer = 0;
  std::string targets;    ///< "c_kv", "k_pe" or "c_kv+k_pe": the latents quantized
  std::string quantizer;  ///< canonical spec string, or "svd-rank<r>"
  QuantSpec spec;         ///< the spec (unused for svd-rank cells); on c_kv only when spec_kpe is set
  int64_t svd_rank = 0;   ///< r > 0 for an svd-rank<r> cell
  std::optional<QuantSpec> spec_kpe{};  ///< the spec on k_pe when it differs (a mixed assignment); else `spec`
  Transform transform{};  ///< rotation before the quantizer (probes::fit_rotation per target); None: none
  std::string key() const;  ///< "003/c_kv+k_pe/int4-asym-channel-g32/attention_error"
  std::vector<std::string> groups() const { return {"attention_error"}; }
};

/// /attention_position: attention on the decode-order cache (latentq/decode_order.h) of [decode_order]'s
/// modes and the baseline prefill-at-once, per bucket of query positions.
struct AttentionPositionCell {
  int layer = 0;
  std::string targets;      ///< "c_kv", "k_pe" or "c_kv+k_pe"
  std::string quantizer;    ///< canonical "<transform>,<quantizer>" spec string
  std::string key() const;  ///< "003/c_kv+k_pe/int4-asym-channel-g32/attention_position"
  std::vector<std::string> groups() const { return {"attention_position"}; }
};

using ProbeCell =
    std::variant<SvdCell, CrossLayerCell, SharingCell, AttentionCheckCell, AttentionCell, AttentionPositionCell>;
std::string cell_key(const ProbeCell& c);
/// The groups a cell has rows in, in the order ProbeRunner::run returns their tables.
std::vector<std::string> cell_groups(const ProbeCell& c);

// ---- plan functions (one per group; cells in canonical order) --------------------------------------

/// The ranks of the SVD probe for this dump: [svd] ranks as given, or the automatic
/// probes::default_svd_ranks(kv_lora_rank) capped at probes::max_fit_rank(fit tokens, [svd] centered)
/// (the fit split of the dump's non-empty sequences, probes::fit_heldout_split), duplicates removed;
/// ascending. Throws std::invalid_argument for an explicit rank > kv_lora_rank or > what the fit split
/// determines (naming the rank, the tokens it needs and the fit tokens), for a fit split that
/// determines no rank, and as fit_heldout_split (prefixed with the dump path).
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

/// One cell per loaded layer (ascending); none when [svd] is disabled. Throws as svd_ranks.
std::vector<SvdCell> plan_svd_cells(const StudyConfig& config, const Dump& dump);
/// Pairs a < b of loaded layers: all ("all", or "auto" with <= 16 loaded layers) or consecutive
/// loaded layers ("adjacent"), a-major. None when [cross_layer] is disabled.
std::vector<CrossLayerCell> plan_cross_layer_cells(const StudyConfig& config, const Dump& dump);
/// For each window size w (config order), each run of w consecutive loaded layers, start ascending.
/// None when [cross_layer] is disabled. Throws as sharing_ranks.
std::vector<SharingCell> plan_sharing_cells(const StudyConfig& config, const Dump& dump);
/// One per loaded layer when [attention] is enabled and the dump has attention data.
std::vector<AttentionCheckCell> plan_attention_check_cells(const StudyConfig& config, const Dump& dump);
/// Layer-major; per layer, for each [attention] target (config order) each quantizer of the run
/// (StudyConfig::all_quantizers order) that the latent study ran on every target of the combination;
/// then with [attention] svd, svd-rank<r> (targets c_kv) for each SVD rank, ascending. None when
/// disabled or without attention data. Throws as svd_ranks.
std::vector<AttentionCell> plan_attention_cells(const StudyConfig& config, const Dump& dump);

/// Layer-major; per layer, each [decode_order] target (config order), each [decode_order] quantizer
/// (config order). None without a [decode_order] section or without attention data.
std::vector<AttentionPositionCell> plan_attention_position_cells(const StudyConfig& config, const Dump& dump);
/// The root attributes a run with [decode_order] writes (none without it): decode_order_modes (string
/// array of the cache_mode labels, baseline excluded), decode_order_quantizers (string array of the
/// canonical specs), decode_order_position_bucket (int64): what the e2e step reads to run the same settings.
Attrs decode_order_attrs(const StudyConfig& config);

/// Why the attention groups cannot run on this dump ("" when they can), naming the missing dataset.
std::string attention_unavailable_reason(const Dump& dump);
/// The absorbed-attention inputs of one dumped layer (query rows, q_nope, q_pe, W_UK, W_UV, dims,
/// seq_offsets and softmax_scale of the dump), as the attention probes use them. Views into `dump`:
/// valid while it lives.
probes::AttentionQueries attention_queries(const Dump& dump, const Layer& layer);

// ---- columns ------------------------------------------------------------------------------------------

/// The columns of a probe group, in order (throws std::invalid_argument for an unknown group):
///  svd                 layer, rank, centered (0/1), fit_tokens, heldout_tokens, heldout_rel_fro,
///                      fit_rel_fro, fit_energy, rank_90, rank_99, rank_999 (the layer's energy ranks,
///                      repeated on each of its rows)
///  svd_spectrum        layer, index (0-based), singular_value (descending; of the centered fit
///                      matrix when centered)
///  cross_layer         layer_a, layer_b, mean_abs_pearson, pearson_channels, constant_channels, cka
///  cross_layer_sharing window_start, window, rank, shared_heldout_rel_fro, per_layer_heldout_rel_fro,
///                      shared_fit_rel_fro, per_layer_fit_rel_fro
///  attention_check     layer, ref_vs_dump_rel_fro (‖out − attn_out‖_F / ‖attn_out‖_F, float32
///                      absorbed recomputation on the exact latents vs the dump), tq (query rows),
///                      keys (Σ over query rows of the keys each attends to)
///  attention_error     layer, quantizer, targets, out_rel_fro, cos_mean, kl_mean, top1_agree,
///                      top8_agree (probes::attention_error vs the run on exact latents, same queries),
///                      bits_per_element_c_kv (c_kv as stored: 16 when c_kv is not quantized,
///                      16·r/kv_lora_rank for svd-rank<r>), bytes_per_token_layer (c_kv + k_pe of one
///                      layer; a target left unquantized counts as bf16, svd-rank<r> c_kv as r bf16
///                      coefficients; the SVD basis is a one-off cost, not counted)
///  attention_position  layer, targets, quantizer, cache_mode (DecodeOrder::label()), residual, sink,
///                      prefill (0 for prefill-at-once), scale_causal (decode_scale_is_causal of the spec,
///                      0/1), pos_start, pos_end (the bucket [pos_start, pos_end) of query positions in their
///                      sequence), queries, quantized_key_frac, kl_mean, out_rel_fro (probes::
///                      decode_order_attention vs the run on exact latents), bytes_per_token (one layer,
///                      c_kv + k_pe, the cache at each sequence's end)
/// All float columns float64, integer columns int64.
const std::vector<std::string>& probe_columns(const std::string& group);
/// A table with the columns of `group` and no rows.
ColumnTable empty_probe_table(const std::string& group);
/// The probe groups, in canonical order.
const std::vector<std::string>& probe_groups();

// ---- running cells -----------------------------------------------------------------------------------

/// Computes probe cells of one config over one dump. Thread-safe: run() may be called from several
/// threads at once. Keeps a copy of `config`; `dump` must outlive it (or pass a shared_ptr).
class ProbeRunner {
 public:
  ProbeRunner(const StudyConfig& config, const Dump& dump);
  /// Keeps the dump alive (throws std::invalid_argument for a null pointer).
  ProbeRunner(const StudyConfig& config, std::shared_ptr<const Dump> dump);
  ~ProbeRunner();
  ProbeRunner(const ProbeRunner&) = delete;
  ProbeRunner& operator=(const ProbeRunner&) = delete;

  /// The rows of one cell: one table per group of cell_groups(cell), with the group's columns (the
  /// /svd_spectrum rows of an svd cell second). Runs on the calling thread only
  /// (the OpenMP loops of the probes run with one thread inside it): parallelize across cells.
  /// Throws std::invalid_argument "<dump>: cell <key>: <why>" when the probe rejects the data, a
  /// quantizer fails, or the cell's layer is not loaded / has no attention data.
  std::vector<ColumnTable> run(const ProbeCell& cell) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Run `cells` on `threads` worker threads (options.threads; 0 = all cores), and return one table
/// per group of the cells (groups in order of their first cell), rows in cell order. Throws
/// std::invalid_argument for the first failing cell in the given order.
std::vector<NamedTable> run_probe_cells(const ProbeRunner& runner, const std::vector<ProbeCell>& cells,
                                        const RunOptions& options = {});

// ---- all probe groups together -------------------------------------------------------------------

/// Every probe cell of a config over a dump, canonical order: svd, cross_layer, cross_layer_sharing,
/// attention_check, attention_error cells.
struct ProbePlan {
  std::vector<ProbeCell> cells;
  /// The groups the run writes (the enabled probes; attention groups only with attention data), in
  /// canonical order, including groups that have no cell in this plan.
  std::vector<std::string> groups;
  /// Non-empty when [attention] is enabled but the dump has no attention data: one line, why.
  std::string attention_skipped;
  /// Lines `latentq run` prints as warnings before it runs the cells (rank_cap_warnings()).
  std::vector<std::string> warnings;

  std::vector<std::string> keys() const;
  /// The cells whose key satisfies `keep` (order, groups, attention_skipped and warnings kept).
  ProbePlan subset(const std::function<bool(const std::string&)>& keep) const;
};

/// Plan every probe group (warnings: rank_cap_warnings()). Throws std::invalid_argument for values
/// the dump cannot take (an SVD rank > kv_lora_rank, a sharing rank > w·kv_lora_rank, an explicit rank
/// the fit split does not determine), naming the value.
ProbePlan plan_probes(const StudyConfig& config, const Dump& dump);

/// The dump the probes need: config.dump and config.layers, with the attention datasets when
/// [attention] is enabled. Throws as load_dump().
Dump load_probe_dump(const StudyConfig& config);

/// Run a plan: one table per group of plan.groups (empty tables with their columns for groups
/// without cells), group attributes (definitions, the attention check tolerance) set.
std::vector<NamedTable> run_probes(const StudyConfig& config, const Dump& dump, const ProbePlan& plan,
                                   const RunOptions& options = {});

/// The cell key of every row of a results table of `group` (latent_error or a probe group),
/// computed from its columns. Throws std::invalid_argument for another group or a missing column.
std::vector<std::string> row_keys(const std::string& group, const ColumnTable& table);

/// Warning lines for the /attention_check rows above `tolerance` (or NaN).
std::vector<std::string> attention_check_warnings(const ColumnTable& check, double tolerance);

// ---- `latentq run` (batch tasks, latentq/batch.h) -------------------------------------------------

/// The probe part of a `latentq run`: the dump with attention data, the plan, the plan's cells as
/// batch tasks (key cell_key, groups cell_groups, one shared ProbeRunner that keeps the dump alive;
/// all concurrent). They go after the latent-error tasks in the canonical order.
struct ProbeStage {
  std::shared_ptr<const Dump> dump;
  ProbePlan plan;
  std::vector<CellTask> tasks;
};
/// Load (load_probe_dump) and plan. Throws as load_probe_dump() and plan_probes().
ProbeStage prepare_probe_stage(const StudyConfig& config);
/// The batch tasks of `plan`'s cells on `dump`.
std::vector<CellTask> probe_cell_tasks(const StudyConfig& config, std::shared_ptr<const Dump> dump,
                                       const ProbePlan& plan);

/// What `latentq run` prints after the latent summary: "attention: skipped: <why>" (one line, to
/// `out`) when the dump has no attention data, one warning per /attention_check row above the
/// tolerance (to `err`, "latentq: warning: ..."), then format_probe_summary().
void print_probe_report(const StudyConfig& config, const ProbeStage& stage, const ColumnTable* summary,
                        const std::vector<NamedTable>& tables, const DumpAttrs& attrs, std::ostream& out,
                        std::ostream& err);

// ---- printed summaries ---------------------------------------------------------------------------

/// The tables `latentq run` prints after the latent summary (fmt), from the results tables (a
/// missing group leaves its table out):
///   - per quantizer (sorted as format_summary): bytes/token of the model, mean c_kv rel_fro and,
///     from /attention_error (mean over layers), attention out_rel_fro, KL, top-1, top-8 with c_kv
///     and k_pe quantized, out_rel_fro with c_kv only; then the svd-rank<r> rows;
///   - per layer (/svd): rank_90/99/999, held-out rel_fro at kv_lora_rank/4 and /2, fit rel_fro at
///     /2 and the held-out − fit gap;
///   - per consecutive layer pair (/cross_layer): mean |Pearson| and CKA; /cross_layer_sharing.
std::string format_probe_summary(const ColumnTable& summary, const std::vector<NamedTable>& probe_tables,
                                 const DumpAttrs& attrs);
/// The /e2e table (experiments/e2e_inject.py): quantizer, bytes/token of the model (from /summary),
/// KL (nats), top-1, perplexity reference and quantized, sorted by bytes per token.
std::string format_e2e_summary(const ColumnTable& e2e, const ColumnTable& summary);

}  // namespace latentq
