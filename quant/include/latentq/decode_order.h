// latentq/decode_order.h — the decode-order cache model: for the query at position t of a sequence,
// which key positions j ≤ t it reads from the quantized cache and which in bf16.
//
// One definition, used by the absorbed-attention probe (C++), the end-to-end step (through the
// Python module: latentq.decode_order_mask / latentq.decode_order_latents) and the tests.
// Positions are 0-based within one sequence. G is the token-group length of the format
// (decode_token_group): a per-channel integer spec with group_size g > 0 quantizes g tokens of one
// channel together, so it can only quantize a group once all g of its tokens are written; every
// other format quantizes each token on its own (G = 1).
//
// Modes
//   prefill-at-once  (today's study, the default): every key of the window is quantized at once
//                    and every query reads every key quantized; per-channel groups and per-tensor
//                    scales see later tokens. residual = sink = prefill = 0.
//   decode           the cache as a serving engine builds it, token by token:
//     sink S       the first S tokens of each sequence are stored in bf16 and never quantized
//                  (attention sinks: KVQuant §3.5 "attention sink-aware", IntactKV);
//     residual R   the R most recent keys, the query's own key included, are read in bf16;
//     groups       the quantized tokens are [S, L) of each sequence, cut into token groups of G
//                  aligned at S; a group is read quantized only when it is complete AND all its
//                  tokens are older than the residual window:
//                      quantized_end(t) = S + G·floor(max(0, t + 1 − R − S) / G)
//                  and key j is read quantized iff S ≤ j < quantized_end(t);
//     prefill P    queries at t < P are the prefill pass: they read every key in bf16 (engines run
//                  the prefill attention on the fresh keys); decode starts at P. The cache a decode
//                  query reads depends only on t, not on P.
//   R = 0 is the engines' order (vLLM / FlashMLA write the new token into the quantized cache,
//   then attend). Relation to KIVI (Liu et al. 2024, arXiv:2402.02750; reference code
//   jy-yuan/KIVI models/llama_kivi.py, LlamaAttention_KIVI.forward): KIVI's keys are flushed after
//   the attention once its full-precision buffer holds residual_length tokens, i.e. quantized iff
//   j < R_kivi·floor(t / R_kivi): this model with G = R_kivi (= KIVI's group of tokens per channel
//   when group_size = residual_length), R = 1, S = 0. KIVI's values (per-token) quantize the oldest
//   token once R_kivi + 1 are held: quantized iff j < t − R_kivi, this model with G = 1,
//   R = R_kivi + 1. MLA caches one latent for keys and values, so one rule serves both.
//
// A format whose scale spans the sequence (per-tensor, per-channel with group_size 0, NVFP4's and
// fp8-e4m3-tensor's per-tensor scale) has no causal decode order: in decode mode it is quantized
// with the scale of the whole quantized part [S, L) (a calibrated static scale) and G = 1;
// decode_scale_is_causal() says so and the results flag it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "latentq/qmath.h"
#include "latentq/spec.h"
#include "latentq/transform.h"

namespace latentq {

enum class CacheMode : uint8_t { PrefillAtOnce = 0, Decode = 1 };

struct DecodeOrder {
  CacheMode mode = CacheMode::PrefillAtOnce;
  int64_t residual = 0;  ///< R: most recent keys (own key included) read in bf16; ≥ 0
  int64_t sink = 0;      ///< S: first tokens of each sequence stored in bf16; ≥ 0
  int64_t prefill = 0;   ///< P: queries at positions < P read every key in bf16; ≥ 0

  /// One past the last key position read quantized by the query at position t (≥ 0) for token-group
  /// length G ≥ 1; the quantized keys are [sink, quantized_end) (prefill-at-once: [0, t + 1)).
  LQ_HD int64_t quantized_end(int64_t t, int64_t G) const {
    if (mode == CacheMode::PrefillAtOnce) return t + 1;
    if (t < prefill || residual > t + 1 || sink >= t + 1 - residual) return sink;  // no overflow for any R, S ≥ 0
    const int64_t n = t + 1 - residual - sink;                                     // > 0
    return sink + (n / G) * G;
  }
  /// Whether the query at position t reads key j (0 ≤ j ≤ t) quantized.
  LQ_HD bool reads_quantized(int64_t t, int64_t j, int64_t G) const {
    if (mode == CacheMode::PrefillAtOnce) return true;
    return j >= sink && j < quantized_end(t, G);
  }

  bool at_once() const { return mode == CacheMode::PrefillAtOnce; }
  /// "prefill-at-once", or "decode-r<R>-s<S>-p<P>" (the results column `cache_mode`).
  std::string label() const;
  /// Inverse of label(): only canonical labels (no leading zeros, signs or blanks). Throws
  /// std::invalid_argument naming the string.
  static DecodeOrder parse(const std::string& s);
  /// Throws std::invalid_argument naming the value for a negative R, S or P, or a prefill-at-once
  /// order with R, S or P ≠ 0.
  void validate() const;
  bool operator==(const DecodeOrder&) const = default;
};

/// G of a spec in decode order: group_size for a per-channel integer spec with group_size > 0, else 1.
int64_t decode_token_group(const QuantSpec& spec);
/// False when the spec's scale spans the sequence (per-tensor integer, per-channel g0, nvfp4,
/// fp8-e4m3-tensor[-s1] with its calibrated scale): its decode order uses a non-causal scale.
bool decode_scale_is_causal(const QuantSpec& spec);

/// Tokens of one sequence of length L held in bf16 and quantized once all L tokens are decoded
/// (the query at t = L − 1 has run; prefill-at-once: all L quantized).
struct DecodeCacheTokens {
  int64_t bf16_tokens = 0;       ///< sink + residual window + incomplete group
  int64_t quantized_tokens = 0;  ///< L − bf16_tokens
};
DecodeCacheTokens decode_cache_tokens(const DecodeOrder& order, int64_t L, int64_t G);

/// The one byte accounting of a decode-order cache: the bytes one target's cache holds once every sequence
/// of seq_offsets [S+1] is decoded to its end. Per sequence of length L, with G = decode_token_group of the
/// spec stored for `target`, decode_cache_tokens(order, L, G) splits the tokens:
///   bf16_tokens      the attention sink, the residual window and the incomplete token group, at 2·D bytes;
///   quantized_tokens the complete groups, counted as storage_bytes() (quantize.h) of the spec storing the
///                    quantized tokens of all sequences as one matrix: their codes and per-group metadata,
///                    a per-tensor scale once.
/// No metadata is charged for a group held in bf16. Prefill-at-once: storage_bytes() of the whole matrix. An engine
/// preset's c_kv also carries its record's zero pad on each quantized token (record_pad_per_token, quantize.h,
/// which needs the layer's k_pe width D_kpe; the pad is not charged to a token held in bf16).
/// /attention_position (the attention probe) and /e2e, /e2e_position (through latentq._core) all count
/// with it. Throws std::invalid_argument as storage_bytes() and for an invalid order.
int64_t decode_order_cache_bytes(const QuantSpec& spec, Target target, int64_t D, std::span<const int64_t> seq_offsets,
                                 const DecodeOrder& order, int64_t D_kpe);

/// The cache contents under a decode order, for X [T, D] row-major float32 (c_kv or k_pe of the
/// sequences given by seq_offsets [S+1], validate_seq_offsets rules):
///   quantized [T, D]: rows [sink, L) of each sequence quantize-dequantized by `spec` (rotated by r,
///     as quantize_dequantize_rotated) as their own sequences, so per-channel token groups start at
///     position `sink`; the sink rows hold bf16(X). Prefill-at-once: quantize_dequantize_rotated of X.
///   The bf16 reads are bf16(X) (round to nearest even, qmath.h f32_to_bf16_bits): the caller mixes
///   the two per (t, j) with DecodeOrder::reads_quantized.
/// Returns the storage of the quantized rows (empty QuantizedTensor when no row is quantized).
/// Throws as quantize() (naming the spec), and std::invalid_argument for an invalid order. NaN/Inf anywhere in
/// X, the sink rows included, gives quantize()'s message for the whole [T, D] input.
QuantizedTensor decode_order_quantize(const QuantSpec& spec, const Rotation& r, Target target, const float* X,
                                      int64_t T, int64_t D, std::span<const int64_t> seq_offsets,
                                      const DecodeOrder& order, float* quantized);

/// bf16(x) for n floats (the bf16 reads of a decode-order cache), out may alias x.
void round_bf16(const float* x, int64_t n, float* out);

}  // namespace latentq
