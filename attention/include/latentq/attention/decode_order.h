// latentq/attention/decode_order.h — decode order: attention on the cache a serving engine builds token by
// token (an attention sink and a residual window read in bf16, the rest quantized), the error per bucket of
// query positions and the bytes per token (latentq/attention/attention.h includes it; the order itself is
// latentq/decode_order.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "latentq/attention/engine.h"
#include "latentq/attention/metrics.h"
#include "latentq/attention/types.h"
#include "latentq/decode_order.h"
#include "latentq/spec.h"
#include "latentq/transform.h"

namespace latentq::probes {

/// Per query row, the keys read from the quantized cache under `order` for token-group length G ≥ 1:
/// the row at sequence position positions[i] = t reads key j ≤ t quantized iff
/// order.reads_quantized(t, j, G) (latentq/decode_order.h, the one definition; the quantized keys of a
/// row are contiguous by that rule, [sink, quantized_end), and this returns them as a KeyRange, checked
/// key by key). Throws std::invalid_argument for a negative position or G < 1.
std::vector<KeyRange> decode_order_ranges(const DecodeOrder& order, std::span<const int64_t> positions, int64_t G);

/// The latents of one layer and where the query rows sit, for decode_order_attention.
struct DecodeOrderInput {
  std::span<const float> c_kv;           ///< [T, kv_lora_rank] float32, exact (as dumped)
  std::span<const float> k_pe;           ///< [T, qk_rope_head_dim] float32, exact
  std::span<const int64_t> seq_offsets;  ///< [S+1], the sequences of the queries (AttentionQueries)
  std::span<const int32_t> q_rows;       ///< [Tq] token index of each query row (AttentionQueries)
  std::span<const int32_t> positions;    ///< [T] position of each token in its sequence (a dump's /positions)
};

/// What is quantized: `spec` (behind the rotations; identity rotations for none) on c_kv and/or k_pe.
/// A target left unquantized is read in bf16 everywhere, as /attention_error charges it.
struct DecodeOrderQuantizer {
  QuantSpec spec;
  const Rotation* r_ckv = nullptr;  ///< null = identity
  const Rotation* r_kpe = nullptr;  ///< null = identity
  bool c_kv = true, k_pe = true;
};

/// The error of one bucket of query positions [pos_start, pos_end) (pos_end = pos_start + bucket).
struct PositionBucketError {
  int64_t pos_start = 0, pos_end = 0;
  int64_t queries = 0;            ///< query rows in the bucket (all sequences)
  double quantized_key_frac = 0;  ///< mean over the rows of (keys read quantized) / (keys), c_kv's keys
                                  ///< (k_pe's when only k_pe is quantized)
  double kl_mean = 0;             ///< attention_error_rows(ref, test, rows).kl_mean (nats)
  double out_rel_fro = 0;         ///< attention_error_rows(...).out_rel_fro
};

/// One decode order's result: its buckets (ascending, non-empty only) and the bytes per token of the
/// cache at each sequence's end: Σ over targets of decode_order_cache_bytes (latentq/decode_order.h: the
/// sink, the residual window and the incomplete group in bf16, the complete groups with their metadata) / T;
/// an unquantized target costs 2 · D per token. One layer, c_kv + k_pe (prefill-at-once: /attention_error's
/// bytes_per_token_layer).
struct DecodeOrderError {
  DecodeOrder order;
  double bytes_per_token = 0;
  std::vector<PositionBucketError> buckets;
};

/// The absorbed float32 attention of `att`'s queries on the decode-order cache of each order in `orders`
/// against `ref` (att.run on the exact latents, keep_probs): per (row at position t, key j) the quantized
/// cache (decode_order_quantize: groups aligned at the sink, rotations as quantize_dequantize_rotated)
/// when reads_quantized(t, j, G), else bf16 (round_bf16); G = decode_token_group of the format stored for
/// that target. Rows bucketed by position: bucket b = [b·bucket, (b+1)·bucket). Cost: one quantization per
/// distinct sink, one mixed attention per order. Throws std::invalid_argument for bucket < 1, nothing
/// quantized, sizes that do not match att, a row whose positions[q_row] is not its key index in its
/// sequence (the dump's /positions must count from each sequence's start), an invalid order, and as
/// decode_order_quantize / run_mixed / attention_error_rows.
std::vector<DecodeOrderError> decode_order_attention(const AbsorbedAttention<float>& att,
                                                     const AttentionReference<float>& ref, const DecodeOrderInput& in,
                                                     const DecodeOrderQuantizer& q, std::span<const DecodeOrder> orders,
                                                     int64_t bucket);
/// The same on att's device (att.device_computes_errors() and att.device_runs_mixed(), its reference kept by
/// keep_device_reference on the exact latents): each order's mixed cache is evaluated there once
/// (device_error_terms) and every bucket's errors are summed from its per-pair terms (error_from_terms);
/// equal to the CPU form on the same device's results to float64 rounding. Throws as the CPU form, and
/// std::logic_error without such a device.
std::vector<DecodeOrderError> decode_order_attention(const AbsorbedAttention<float>& att, const DecodeOrderInput& in,
                                                     const DecodeOrderQuantizer& q, std::span<const DecodeOrder> orders,
                                                     int64_t bucket);
}  // namespace latentq::probes
