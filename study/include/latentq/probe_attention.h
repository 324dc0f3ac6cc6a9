// latentq/probe_attention.h — what the attention probes' cells share (study/probes/attention.cpp,
// study/probes/decode_order.cpp): the layer's absorbed-attention inputs, its reference on the exact latents
// (CPU, and on an attention device), and the attention check's warnings. The generic runner
// (latentq/probe_study.h) does not include it.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "latentq/attention/attention.h"
#include "latentq/dump.h"
#include "latentq/probe_registry.h"
#include "latentq/table.h"

namespace latentq {

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
/// Sparse MLA: how much of the model's selection (l.topk_offsets / topk_keys) another selection of the same query
/// rows keeps (offsets [Tq+1] into keys, each row's keys ascending, as latentq/attention/dsa.h gives them):
/// recall = mean over rows of |S ∩ Ŝ| / |S|, rows_changed = the fraction of rows with Ŝ ≠ S.
struct SelectionRecall {
  double recall = 0, rows_changed = 0;
};
SelectionRecall selection_recall(const Layer& l, const std::vector<int64_t>& offsets, const std::vector<int32_t>& keys);

/// DeepSeek-V4 (a dump of cache_family deepseek_v4; study/run/attention_v4.cpp): the attention probe's cells on
/// it, which the probe hands over to: per layer an /attention_check cell (latentq/attention/v4.h's engine on the
/// dumped caches against attn_out) and /attention_error cells, one per (layer, quantizer) for each cache the layer
/// holds quantized alone (window_kv, compressed_kv, index_k: study/README.md) and for all of them. Throws
/// std::invalid_argument as attention_reference.
ProbePart plan_v4_attention(const Probe* probe, const StudyConfig& config, const Dump& dump);
std::vector<ColumnTable> run_v4_attention(const ProbeCell& cell, const LayerAccess& in);
/// Sparse MLA, a layer with its own DSA indexer: each query row's causal top-index_topk (latentq/attention/dsa.h
/// dsa_select_topk) from the layer's index_q, index_w and scale over `index_k` [T, index_dim] (the layer's own key
/// cache, or its quantize-dequantize). Throws as dsa_select_topk.
probes::KeySelection indexer_selection(const Dump& dump, const Layer& l, std::span<const float> index_k);

/// Warning lines for the /attention_check rows above `tolerance` (or NaN).
std::vector<std::string> attention_check_warnings(const ColumnTable& check, double tolerance);

}  // namespace latentq
