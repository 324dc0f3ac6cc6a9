// The decode-order attention probe: [decode_order] → /attention_position (cell
// "003/c_kv+k_pe/int4-asym-channel-g32/attention_position"): the absorbed float32 attention on the cache a
// serving engine builds token by token (quant/include/latentq/decode_order.h, the one definition) against
// exact latents, per bucket of query positions, for each cache mode R × S × P and the baseline
// prefill-at-once (which reproduces /attention_error's cell). The query at position t of its sequence
// (the dump's /positions) reads key j quantized iff DecodeOrder::reads_quantized(t, j, G), else bf16.
// Absent section = off. Needs the dump's attention datasets.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "latentq/applicable.h"
#include "latentq/config.h"
#include "latentq/decode_order.h"
#include "latentq/probe_registry.h"
#include "latentq/layer_shared.h"
#include "latentq/probe_attention.h"
#include "latentq/probe_study.h"
#include "latentq/attention/attention.h"
#include "latentq/split.h"
#include "latentq/analysis/svd_probe.h"
#include "latentq/quantize.h"
#include "latentq/transform.h"

namespace latentq {
namespace {

/// [decode_order] (latentq/probe_registry.h settings).
struct DecodeOrderSettings : ProbeSettings {
  bool enabled = false;  // true when the config has the section
  std::vector<int64_t> residual{0}, sink{0}, prefill{0};
  std::vector<std::string> quantizers;            // canonical "<transform>,<quantizer>" strings
  std::vector<std::string> targets{"c_kv+k_pe"};  // each "c_kv", "k_pe" or "c_kv+k_pe"
  int64_t position_bucket = 64;                   // W >= 1
  /// The decode modes, R-major, then S, then P (config order); the baseline not included.
  std::vector<DecodeOrder> modes() const {
    std::vector<DecodeOrder> out;
    for (int64_t r : residual)
      for (int64_t s : sink)
        for (int64_t p : prefill) out.push_back({CacheMode::Decode, r, s, p});
    return out;
  }
};

struct PositionCell {
  int layer = 0;
  std::string targets, quantizer;
};

const GroupSpec kPosition = {
    "attention_position",
    {{"layer", ColType::I64, "", "the layer index"},
     {"targets", ColType::Str, "", "the latents quantized: c_kv, k_pe or c_kv+k_pe"},
     {"quantizer", ColType::Str, "", "the quantizer's spec"},
     {"cache_mode", ColType::Str, "", "prefill-at-once or decode-r<R>-s<S>-p<P> (latentq/decode_order.h)"},
     {"residual", ColType::I64, "", "R: the most recent keys, the query's own included, read in bf16"},
     {"sink", ColType::I64, "", "S: the first tokens of each sequence, stored in bf16"},
     {"prefill", ColType::I64, "", "P: queries at positions < P read every key in bf16 (0 for prefill-at-once)"},
     {"scale_causal", ColType::I64, "", "1 when the spec's scales see no later token (decode_scale_is_causal)"},
     {"pos_start", ColType::I64, "", "the position bucket's first query position within its sequence"},
     {"pos_end", ColType::I64, "", "the bucket's end (exclusive)"},
     {"queries", ColType::I64, "", "the query rows in the bucket"},
     {"quantized_key_frac", ColType::F64, "1", "the fraction of the keys those queries read from the quantized cache"},
     {"kl_mean", ColType::F64, "nat", "mean over the bucket's query rows and heads of KL(p ‖ p̂)"},
     {"out_rel_fro", ColType::F64, "1", "‖ô − o‖_F / ‖o‖_F of the bucket's attention output"},
     {"bytes_per_token", ColType::F64, "byte/token",
      "the cache at each sequence's end, per token, one layer, c_kv + k_pe (decode_order_cache_bytes)"}}};

std::string position_key(int64_t l, const std::string& targets, const std::string& q) {
  return fmt::format("{:03d}/{}/{}/attention_position", l, targets, q);
}

// The targets a "c_kv", "k_pe" or "c_kv+k_pe" cell quantizes.
std::vector<Target> targets_of(const std::string& tg) {
  std::vector<Target> out;
  if (tg != "k_pe") out.push_back(Target::CKV);
  if (tg != "c_kv") out.push_back(Target::KPE);
  return out;
}

class DecodeOrderProbe final : public Probe {
 public:
  std::string section() const override { return "decode_order"; }
  int order() const override { return 350; }  // after the attention probe's groups

  std::shared_ptr<const ProbeSettings> parse(const SettingsReader& r) const override {
    auto D = std::make_shared<DecodeOrderSettings>();
    if (!r.present()) return D;
    D->enabled = true;
    r.check_keys({"residual", "sink", "prefill", "quantizers", "targets", "position_bucket"});
    const auto nonempty = [&](const char* key, std::vector<int64_t>& dst) {
      if (auto v = r.ints(key, 0)) {
        if (v->empty()) r.fail(key, fmt::format("'decode_order.{}' is empty (give at least one value)", key));
        dst = *v;
      }
    };
    nonempty("residual", D->residual);
    nonempty("sink", D->sink);
    nonempty("prefill", D->prefill);
    if (auto v = r.number("position_bucket")) {
      // Checked in float64 before the conversion, which is undefined for 2^63 and beyond (1e300, inf);
      // float64 holds every integer up to 2^53 exactly.
      if (!(*v >= 1 && *v <= 0x1p53) || *v != std::floor(*v))
        r.fail("position_bucket",
               fmt::format("'decode_order.position_bucket' = {} is not an integer in [1, 2^53] (query positions are "
                           "bucketed as [b*W, (b+1)*W))",
                           *v));
      D->position_bucket = static_cast<int64_t>(*v);
    }
    if (auto v = r.strings("targets")) {
      if (v->empty()) r.fail("targets", "'decode_order.targets' is empty");
      D->targets = *v;
      for (size_t i = 0; i < v->size(); ++i) {
        const std::string& s = (*v)[i];
        if (s != "c_kv" && s != "k_pe" && s != "c_kv+k_pe")
          r.fail("targets",
                 fmt::format("'decode_order.targets': '{}' is not one of \"c_kv\", \"k_pe\", \"c_kv+k_pe\"", s), i);
        if (std::count(v->begin(), v->end(), s) > 1)
          r.fail("targets", fmt::format("'decode_order.targets': '{}' is listed twice", s), i);
      }
    }
    const auto q = r.strings("quantizers");
    if (!q) r.fail("quantizers", "[decode_order] needs 'quantizers' (spec strings, e.g. [\"int4-asym-channel-g32\"])");
    if (q->empty()) r.fail("quantizers", "'decode_order.quantizers' is empty");
    for (size_t i = 0; i < q->size(); ++i) {
      std::string canon;
      try {
        canon = TransformedSpec::parse((*q)[i]).to_string();
      } catch (const std::invalid_argument& e) {
        r.fail("quantizers", std::string("'decode_order.quantizers': ") + e.what(), i);
      }
      if (std::find(D->quantizers.begin(), D->quantizers.end(), canon) != D->quantizers.end())
        r.fail("quantizers", fmt::format("'decode_order.quantizers': '{}' is listed twice", canon), i);
      D->quantizers.push_back(canon);
    }
    return D;
  }

  std::vector<GroupSpec> groups() const override { return {kPosition}; }

  // DeepSeek-V4 caches no c_kv + k_pe: nothing to measure.
  std::pair<Target, std::string> not_applicable_reason(const StudyConfig& config,
                                                       const DumpAttrs& attrs) const override {
    if (!probe_settings<DecodeOrderSettings>(config, "decode_order").enabled || attrs.family().holds(Target::CKV))
      return {Target::CKV, ""};
    return {Target::CKV,
            fmt::format("not applicable to {} (no c_kv + k_pe): the absorbed MLA attention in decode order skipped",
                        attrs.cache_family)};
  }

  ProbePart plan(const StudyConfig& config, const Dump& dump) const override {
    ProbePart p;
    const DecodeOrderSettings& s = probe_settings<DecodeOrderSettings>(config, "decode_order");
    if (!s.enabled) return p;
    if (const auto na = not_applicable_reason(config, dump.attrs); !na.second.empty()) {
      p.notes.push_back("decode_order: " + na.second);
      return p;
    }
    if (std::string why = attention_unavailable_reason(dump); !why.empty()) {
      p.notes.push_back("decode_order: skipped: " + why);
      return p;
    }
    p.groups = {"attention_position"};
    // Layer-major; per layer, each target (config order), each quantizer (config order); none that quantizes a
    // target whose width the quantizer's format cannot take (listed by the study: quantized_pairs()).
    auto applicable = [&](const std::string& tg, const std::string& q) {
      const QuantSpec spec = TransformedSpec::parse(q).spec;
      for (const Target t : targets_of(tg))
        if (!why_not_applicable(spec, t, dump.attrs.width(t)).empty()) return false;
      return true;
    };
    for (const Layer& l : dump.layers)
      for (const std::string& tg : s.targets)
        for (const std::string& q : s.quantizers)
          if (applicable(tg, q))
            p.cells.push_back(ProbeCell::make(this, position_key(l.index, tg, q), {"attention_position"}, {l.index},
                                              true, PositionCell{l.index, tg, q}));
    return p;
  }

  std::vector<std::pair<std::string, Target>> quantized_pairs(const StudyConfig& config) const override {
    const DecodeOrderSettings& s = probe_settings<DecodeOrderSettings>(config, "decode_order");
    std::vector<std::pair<std::string, Target>> out;
    if (!s.enabled) return out;
    for (const std::string& tg : s.targets)
      for (const std::string& q : s.quantizers)
        for (const Target t : targets_of(tg)) out.emplace_back(q, t);
    return out;
  }

  std::vector<ColumnTable> run(const StudyConfig& config, const ProbeCell& cell, const LayerAccess& in) const override {
    const PositionCell& c = cell.as<PositionCell>();
    const DecodeOrderSettings& s = probe_settings<DecodeOrderSettings>(config, "decode_order");
    const Dump& dump = in.header();
    const Layer& l = in.layer(c.layer);
    const TransformedSpec ts = TransformedSpec::parse(c.quantizer);
    probes::DecodeOrderQuantizer q;
    q.spec = ts.spec;
    q.c_kv = c.targets != "k_pe";
    q.k_pe = c.targets != "c_kv";
    const std::shared_ptr<const Rotation> r_ckv =
        layer_rotation(in, c.layer, Target::CKV, q.c_kv ? ts.transform : Transform{});
    const std::shared_ptr<const Rotation> r_kpe =
        layer_rotation(in, c.layer, Target::KPE, q.k_pe ? ts.transform : Transform{});
    q.r_ckv = r_ckv.get();
    q.r_kpe = r_kpe.get();
    std::vector<DecodeOrder> orders{DecodeOrder{}};  // the baseline prefill-at-once first
    for (const DecodeOrder& o : s.modes()) orders.push_back(o);
    const probes::DecodeOrderInput input{l.c_kv, l.k_pe, dump.seq_offsets, l.q_rows, dump.positions};
    const int64_t causal = decode_scale_is_causal(ts.spec) ? 1 : 0;
    ColumnTable t = empty_table(kPosition);
    // The /attention_error cells' engine: on a device that evaluates mixed caches and computes the errors
    // itself, the orders run there against the device's reference; otherwise on the CPU against the layer's
    // exact-latent attention (shared with the /attention_check cell).
    const std::shared_ptr<const AttentionErrorEngine> e = attention_error_engine(in, c.layer);
    const std::vector<probes::DecodeOrderError> errors =
        e->device_metrics() && e->att().device_runs_mixed()
            ? probes::decode_order_attention(e->att(), input, q, orders, s.position_bucket)
            : probes::decode_order_attention(*e->cpu->att, *e->cpu->prepared, input, q, orders, s.position_bucket);
    for (const probes::DecodeOrderError& o : errors)
      for (const probes::PositionBucketError& b : o.buckets)
        add_row(t, {int64_t{c.layer}, c.targets, c.quantizer, o.order.label(), o.order.residual, o.order.sink,
                    o.order.prefill, causal, b.pos_start, b.pos_end, b.queries, b.quantized_key_frac, b.kl_mean,
                    b.out_rel_fro, o.bytes_per_token});
    return {std::move(t)};
  }

  std::vector<std::string> row_keys(const std::string&, const ColumnTable& t) const override {
    std::vector<std::string> k;
    const auto& l = t.get<int64_t>("layer");
    const auto &tg = t.get<std::string>("targets"), &q = t.get<std::string>("quantizer");
    for (size_t i = 0; i < l.size(); ++i) k.push_back(position_key(l[i], tg[i], q[i]));
    return k;
  }

  /// decode_order_modes (string array of the cache_mode labels, the baseline excluded), decode_order_quantizers
  /// (canonical specs), decode_order_targets (string array: "c_kv", "k_pe", "c_kv+k_pe"),
  /// decode_order_position_bucket (int64): the e2e step reads them to run the same settings.
  Attrs root_attrs(const StudyConfig& config) const override {
    const DecodeOrderSettings& s = probe_settings<DecodeOrderSettings>(config, "decode_order");
    if (!s.enabled) return {};
    std::vector<std::string> modes;
    for (const DecodeOrder& o : s.modes()) modes.push_back(o.label());
    return {{"decode_order_modes", modes},
            {"decode_order_quantizers", s.quantizers},
            {"decode_order_targets", s.targets},
            {"decode_order_position_bucket", s.position_bucket}};
  }
};

}  // namespace

}  // namespace latentq

LATENTQ_DEFINE_PROBE(decode_order, latentq::DecodeOrderProbe)
