// Decode order: the absorbed attention on the cache a serving engine builds token by token (the sink and the
// residual window read in bf16, the rest quantized), per order and bucket of query positions, on the CPU or on
// an attached device that computes the error terms.
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "internal.h"
#include "latentq/split.h"
#include "latentq/attention/decode_order.h"
#include "latentq/decode_order.h"
#include "latentq/quantize.h"

namespace latentq::probes {

using namespace attention_detail;

std::vector<KeyRange> decode_order_ranges(const DecodeOrder& order, std::span<const int64_t> positions, int64_t G) {
  if (G < 1) throw std::invalid_argument("decode_order_ranges: token group G = " + sz(G) + " < 1");
  std::vector<KeyRange> out;
  out.reserve(positions.size());
  for (const int64_t t : positions) {
    if (t < 0) throw std::invalid_argument("decode_order_ranges: negative position " + sz(t));
    // Key by key with the one rule; the quantized keys must form one range.
    KeyRange k{0, 0};
    bool seen = false, closed = false;
    for (int64_t j = 0; j <= t; ++j) {
      const bool q = order.reads_quantized(t, j, G);
      if (q && closed)
        throw std::logic_error("decode_order_ranges: " + order.label() + " reads the keys of position " + sz(t) +
                               " quantized in more than one range");
      if (q && !seen)
        k = {j, j + 1}, seen = true;
      else if (q)
        k.end = j + 1;
      else if (seen)
        closed = true;
    }
    out.push_back(k);
  }
  return out;
}

namespace {
// The sizes of `in` against att (T = its positions' count), its seq_offsets, and each query row's position in
// its sequence (the dump's /positions) [Tq], which must be the key index the attention uses.
std::vector<int64_t> checked_positions(const AbsorbedAttention<float>& att, const DecodeOrderInput& in,
                                       const char* what) {
  const MlaDims& d = att.dims();
  const int64_t r = d.kv_lora_rank, rope = d.qk_rope_head_dim, Tq = att.num_queries();
  const int64_t T = static_cast<int64_t>(in.positions.size());
  check_size(in.c_kv.size(), T * r, "c_kv", "[T, kv_lora_rank] (T from positions)");
  check_size(in.k_pe.size(), T * rope, "k_pe", "[T, qk_rope_head_dim] (T from positions)");
  check_size(in.q_rows.size(), Tq, "q_rows", "[Tq] of the attention");
  validate_seq_offsets(in.seq_offsets, T, "decode-order attention: seq_offsets");
  // Each row's position in its sequence (the dump's /positions) must be the key index the attention uses.
  std::vector<int64_t> pos(static_cast<size_t>(Tq));
  for (int64_t i = 0; i < Tq; ++i) {
    const int64_t tok = in.q_rows[i];
    if (tok < 0 || tok >= T)
      throw std::invalid_argument(std::string(what) + ": q_rows[" + sz(i) + "] = " + sz(tok) +
                                  " outside [0, T = " + sz(T) + ")");
    pos[i] = in.positions[tok];
    if (pos[i] != att.nkeys(i) - 1)
      throw std::invalid_argument(std::string(what) + ": /positions[" + sz(tok) + "] = " + sz(pos[i]) +
                                  " for query row " + sz(i) + ", but the row is key " + sz(att.nkeys(i) - 1) +
                                  " of its sequence (positions must count from each sequence's start)");
  }
  return pos;
}

// decode_order_attention on the CPU (ref: the prepared reference) or, ref null, on att's device against the
// reference kept there (each order's errors from one evaluation's per-pair terms, summed per bucket).
std::vector<DecodeOrderError> decode_order_impl(const AbsorbedAttention<float>& att,
                                                const AttentionReference<float>* ref, const DecodeOrderInput& in,
                                                const DecodeOrderQuantizer& q, std::span<const DecodeOrder> orders,
                                                int64_t bucket) {
  const char* what = "decode-order attention";
  if (!ref && !(att.device_computes_errors() && att.device_runs_mixed()))
    throw std::logic_error(std::string(what) +
                           ": no reference, and no device that computes attention_error's terms of "
                           "mixed caches attached");
  if (bucket < 1) throw std::invalid_argument(std::string(what) + ": position bucket " + sz(bucket) + " < 1");
  if (!q.c_kv && !q.k_pe) throw std::invalid_argument(std::string(what) + ": neither c_kv nor k_pe is quantized");
  const MlaDims& d = att.dims();
  const int64_t r = d.kv_lora_rank, rope = d.qk_rope_head_dim, Tq = att.num_queries();
  const int64_t T = static_cast<int64_t>(in.positions.size());
  const std::vector<int64_t> pos = checked_positions(att, in, what);
  for (const DecodeOrder& o : orders) o.validate();

  // The bf16 reads, and the quantized caches (one per distinct sink: the contents do not depend on R or P).
  std::vector<float> bc(in.c_kv.size()), bk(in.k_pe.size());
  round_bf16(in.c_kv.data(), static_cast<int64_t>(bc.size()), bc.data());
  round_bf16(in.k_pe.data(), static_cast<int64_t>(bk.size()), bk.data());
  const Rotation identity;
  struct Quantized {
    std::vector<float> c, k;  // empty: that target reads bf16
  };
  std::map<int64_t, Quantized> caches;  // key: the sink (0 for prefill-at-once: the same contents)
  const auto quantized_for = [&](const DecodeOrder& o) -> const Quantized& {
    const int64_t key = o.at_once() ? 0 : o.sink;
    auto it = caches.find(key);
    if (it != caches.end()) return it->second;
    Quantized Qz;
    const auto one = [&](bool on, Target t, std::span<const float> X, int64_t D, const Rotation* rot,
                         std::vector<float>& out) {
      if (!on || D == 0) return;
      out.resize(X.size());
      decode_order_quantize(q.spec, rot ? *rot : identity, t, X.data(), T, D, in.seq_offsets, o, out.data());
    };
    one(q.c_kv, Target::CKV, in.c_kv, r, q.r_ckv, Qz.c);
    one(q.k_pe, Target::KPE, in.k_pe, rope, q.r_kpe, Qz.k);
    return caches.emplace(key, std::move(Qz)).first->second;
  };
  const int64_t G_c = decode_token_group(q.spec.stored_for(Target::CKV));
  const int64_t G_k = decode_token_group(q.spec.stored_for(Target::KPE));

  // Buckets of rows by position.
  std::map<int64_t, std::vector<int64_t>> rows_of;
  for (int64_t i = 0; i < Tq; ++i) rows_of[pos[i] / bucket].push_back(i);

  std::vector<DecodeOrderError> out;
  for (const DecodeOrder& o : orders) {
    const Quantized& Qz = quantized_for(o);
    const bool qc = !Qz.c.empty(), qk = !Qz.k.empty();
    std::vector<KeyRange> rc, rk;
    if (qc) rc = decode_order_ranges(o, pos, G_c);
    if (qk) rk = decode_order_ranges(o, pos, G_k);
    // A target read in bf16 everywhere has store A = store B: any range gives the same values; the other
    // target's ranges let a chunk read one store only.
    if (!qc) rc = qk ? rk : std::vector<KeyRange>(static_cast<size_t>(Tq));
    if (!qk) rk = rc;
    const MixedCache m{qc ? std::span<const float>(Qz.c) : std::span<const float>(bc),
                       qk ? std::span<const float>(Qz.k) : std::span<const float>(bk),
                       bc,
                       bk,
                       rc,
                       rk};
    // CPU: run_mixed()'s result (checked finite there: not again for each bucket); device: its terms.
    std::optional<AttentionResult<float>> test;
    std::vector<AttentionPairTerms> terms;
    if (ref)
      test.emplace(att.run_mixed(m, true));
    else
      terms = att.device_error_terms(m);

    DecodeOrderError e;
    e.order = o;
    const std::vector<KeyRange>& primary = qc ? rc : rk;
    for (const auto& [b, rows] : rows_of) {
      PositionBucketError pb;
      pb.pos_start = b * bucket;
      pb.pos_end = (b + 1) * bucket;
      pb.queries = static_cast<int64_t>(rows.size());
      double frac = 0;
      for (const int64_t i : rows) {
        const KeyRange k = clip_range(primary[i], att.nkeys(i));
        frac += static_cast<double>(k.end - k.begin) / static_cast<double>(att.nkeys(i));
      }
      pb.quantized_key_frac = frac / static_cast<double>(rows.size());
      const AttentionError x =
          ref ? error_over_rows(ref->result(), *test, rows, "attention_error_rows", ref->top_indices(), true)
              : att.error_from_terms(terms, rows);
      pb.kl_mean = x.kl_mean;
      pb.out_rel_fro = x.out_rel_fro;
      e.buckets.push_back(pb);
    }
    // Bytes at each sequence's end: the one decode-order accounting (a target read in bf16: 2 bytes/element).
    const auto part = [&](bool on, Target t, int64_t D) {
      return on ? decode_order_cache_bytes(q.spec, t, D, in.seq_offsets, o, rope) : T * 2 * D;
    };
    e.bytes_per_token =
        static_cast<double>(part(qc, Target::CKV, r) + part(qk, Target::KPE, rope)) / static_cast<double>(T);
    out.push_back(std::move(e));
  }
  return out;
}
}  // namespace

std::vector<DecodeOrderError> decode_order_attention(const AbsorbedAttention<float>& att,
                                                     const AttentionReference<float>& ref, const DecodeOrderInput& in,
                                                     const DecodeOrderQuantizer& q, std::span<const DecodeOrder> orders,
                                                     int64_t bucket) {
  return decode_order_impl(att, &ref, in, q, orders, bucket);
}

std::vector<DecodeOrderError> decode_order_attention(const AbsorbedAttention<float>& att, const DecodeOrderInput& in,
                                                     const DecodeOrderQuantizer& q, std::span<const DecodeOrder> orders,
                                                     int64_t bucket) {
  return decode_order_impl(att, nullptr, in, q, orders, bucket);
}

}  // namespace latentq::probes
