// Decode-order cache model (latentq/decode_order.h).
#include "latentq/decode_order.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "latentq/quantize.h"

namespace latentq {

std::string DecodeOrder::label() const {
  if (mode == CacheMode::PrefillAtOnce) return "prefill-at-once";
  return "decode-r" + std::to_string(residual) + "-s" + std::to_string(sink) + "-p" + std::to_string(prefill);
}

DecodeOrder DecodeOrder::parse(const std::string& s) {
  DecodeOrder o;
  if (s == "prefill-at-once") return o;
  long long r = -1, k = -1, p = -1;
  int used = 0;
  if (std::sscanf(s.c_str(), "decode-r%lld-s%lld-p%lld%n", &r, &k, &p, &used) != 3 ||
      used != static_cast<int>(s.size()) || r < 0 || k < 0 || p < 0)
    throw std::invalid_argument("cache mode '" + s +
                                "': expected 'prefill-at-once' or 'decode-r<R>-s<S>-p<P>' with R, S, P >= 0");
  o.mode = CacheMode::Decode;
  o.residual = r;
  o.sink = k;
  o.prefill = p;
  // The canonical label only: no leading zeros, signs, blanks, or values that saturated in sscanf.
  if (o.label() != s)
    throw std::invalid_argument("cache mode '" + s + "': not canonical (expected '" + o.label() +
                                "': decimal R, S, P without signs, blanks or leading zeros, each < 2^63)");
  return o;
}

void DecodeOrder::validate() const {
  if (residual < 0 || sink < 0 || prefill < 0)
    throw std::invalid_argument("decode order: residual, sink and prefill must be >= 0 (got residual " +
                                std::to_string(residual) + ", sink " + std::to_string(sink) + ", prefill " +
                                std::to_string(prefill) + ")");
  if (mode == CacheMode::PrefillAtOnce && (residual != 0 || sink != 0 || prefill != 0))
    throw std::invalid_argument("decode order: prefill-at-once takes no residual, sink or prefill (got " +
                                std::to_string(residual) + ", " + std::to_string(sink) + ", " +
                                std::to_string(prefill) + ")");
}

int64_t decode_token_group(const QuantSpec& spec) {
  if (spec.format == Format::Int && spec.granularity == Granularity::Channel && spec.group_size > 0)
    return spec.group_size;
  return 1;
}

bool decode_scale_is_causal(const QuantSpec& spec) {
  switch (traits(spec.format).causality) {  // the format table's row (latentq/spec.h)
    case Causality::PerToken:
      return true;
    case Causality::PerMatrix:
      return false;
    case Causality::ByGranularity:
      return !(spec.granularity == Granularity::Tensor ||
               (spec.granularity == Granularity::Channel && spec.group_size == 0));
    case Causality::ByTargets:
      return decode_scale_is_causal(spec.stored_for(Target::CKV)) &&
             decode_scale_is_causal(spec.stored_for(Target::KPE));
  }
  return false;
}

DecodeCacheTokens decode_cache_tokens(const DecodeOrder& order, int64_t L, int64_t G) {
  if (L <= 0) return {};
  if (order.at_once()) return {0, L};
  const int64_t q = order.quantized_end(L - 1, G) - order.sink;  // quantized keys of the last query
  const int64_t quantized = q > 0 ? q : 0;
  return {L - quantized, quantized};
}

int64_t decode_order_cache_bytes(const QuantSpec& spec, Target target, int64_t D, std::span<const int64_t> seq_offsets,
                                 const DecodeOrder& order, int64_t D_kpe) {
  order.validate();
  if (seq_offsets.empty())
    throw std::invalid_argument("decode-order cache bytes: seq_offsets is empty (expected [S+1])");
  validate_seq_offsets(seq_offsets, seq_offsets.back());
  const int64_t G = decode_token_group(spec.stored_for(target));
  int64_t bf16 = 0;
  std::vector<int64_t> quantized{0};  // the quantized tokens of each sequence, as one matrix's seq_offsets
  for (size_t s = 0; s + 1 < seq_offsets.size(); ++s) {
    const DecodeCacheTokens c = decode_cache_tokens(order, seq_offsets[s + 1] - seq_offsets[s], G);
    bf16 += c.bf16_tokens;
    quantized.push_back(quantized.back() + c.quantized_tokens);
  }
  return bf16 * 2 * D + storage_bytes(spec, target, D, quantized) +
         quantized.back() * record_pad_per_token(spec, target, D, D_kpe);  // 0 but for a preset's c_kv
}

void round_bf16(const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = qmath::bf16_bits_to_f32(qmath::f32_to_bf16_bits(x[i]));
}

QuantizedTensor decode_order_quantize(const QuantSpec& spec, const Rotation& r, Target target, const float* X,
                                      int64_t T, int64_t D, std::span<const int64_t> seq_offsets,
                                      const DecodeOrder& order, float* quantized) {
  order.validate();
  validate_seq_offsets(seq_offsets, T);
  // Checked on the whole input, as quantize() does at once: the compacted rows past the sinks would name
  // their own count and shape, and a NaN in a sink row (rounded to bf16 here) would pass unreported.
  if (const int64_t bad = count_nonfinite(X, T * D)) throw std::invalid_argument(nonfinite_message(bad, T, D));
  if (order.at_once() || order.sink == 0)
    return quantize_dequantize_rotated(spec, r, target, X, T, D, seq_offsets, quantized);
  // Rows [sink, L) of each sequence, compacted, as their own sequences; the sink rows in bf16.
  std::vector<int64_t> rows, offs{0};
  for (size_t s = 0; s + 1 < seq_offsets.size(); ++s) {
    // min() first: seq_offsets[s] + sink may not fit in int64 for a huge sink.
    const int64_t sink_end = seq_offsets[s] + std::min(order.sink, seq_offsets[s + 1] - seq_offsets[s]);
    for (int64_t t = sink_end; t < seq_offsets[s + 1]; ++t) rows.push_back(t);
    if (static_cast<int64_t>(rows.size()) > offs.back()) offs.push_back(static_cast<int64_t>(rows.size()));
    round_bf16(X + seq_offsets[s] * D, (sink_end - seq_offsets[s]) * D, quantized + seq_offsets[s] * D);
  }
  if (rows.empty()) return QuantizedTensor{};
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<float> in(static_cast<size_t>(n * D)), out(static_cast<size_t>(n * D));
  for (int64_t i = 0; i < n; ++i) std::memcpy(&in[i * D], X + rows[i] * D, sizeof(float) * D);
  QuantizedTensor qt = quantize_dequantize_rotated(spec, r, target, in.data(), n, D, offs, out.data());
  for (int64_t i = 0; i < n; ++i) std::memcpy(quantized + rows[i] * D, &out[i * D], sizeof(float) * D);
  return qt;
}

}  // namespace latentq
