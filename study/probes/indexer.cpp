// The DSA indexer probe of sparse MLA (DeepSeek-V3.2, GLM-5): [indexer] → /indexer_error, one cell per studied
// layer ("003/indexer") of a dump whose cache_family is sparse_mla (none otherwise: a dense dump's results are
// unchanged). Each cell quantizes the layer's indexer key cache (index_k, [T, d_i]) with each format of [indexer]
// quantizers, recomputes every query row's selection from it (the causal top-index_topk of the index score
// Σ_h w_h · relu(scale · q_h · k): latentq/attention/dsa.h, as python/latentq/sparse_mla.py),
// and measures the attention over the new selection against the attention over the model's own (the dump's
// topk_keys) three ways: the selection's error alone (c_kv and k_pe exact), the latent's error alone (c_kv and k_pe
// in an [indexer] latent format, the model's selection) and both together (what an engine that stores both caches
// quantized computes), one row per (index_k format, latent format).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "latentq/attention/attention.h"
#include "latentq/config.h"
#include "latentq/metrics.h"
#include "latentq/probe_attention.h"
#include "latentq/probe_registry.h"
#include "latentq/quantize.h"

namespace latentq {

namespace {

/// [indexer]: enabled, and the formats of the indexer key cache to study (any spec but an engine preset, whose
/// record pairs c_kv with k_pe). The defaults, each once, in this order: bf16, the format of every engine indexer
/// cache of kIndexerPresets (latentq/spec.h: vLLM's FP8 DeepseekV32IndexerCache, e4m3 with a power-of-two fp32 scale
/// per 128, 132 B per token at d_i = 128; SGLang's MXFP4 index-K cache, 68 B) and MXFP4 (68 B at 128).
std::vector<std::string> default_indexer_quantizers() {
  std::vector<std::string> q{"bf16"};
  const auto add = [&q](const std::string& s) {
    if (std::find(q.begin(), q.end(), s) == q.end()) q.push_back(s);
  };
  for (const IndexerPresetTraits& p : kIndexerPresets) add(p.spec);
  add("mxfp4");
  return q;
}

/// The latent formats the indexer's formats are paired with: "exact" (c_kv and k_pe as dumped) and the record the
/// engines store next to their FP8 indexer cache for DeepSeek-V3.2 / GLM-5 (FlashMLA's V32_FP8Sparse, 656 B at
/// 512 + 64; vLLM's fp8_ds_mla stores the same codes with fp32 scales).
constexpr const char* kExactLatent = "exact";
std::vector<std::string> default_indexer_latents() { return {kExactLatent, "flashmla-v32-fp8"}; }

struct IndexerSettings : ProbeSettings {
  bool enabled = true;
  std::vector<std::string> quantizers = default_indexer_quantizers();
  std::vector<std::string> latent = default_indexer_latents();  ///< "exact" or a c_kv + k_pe spec / preset
};

struct IndexerCell {
  int layer = 0;
};

const GroupSpec kIndexerError = {
    "indexer_error",
    {{"layer", ColType::I64, "", "the layer index (a layer with its own DSA indexer)"},
     {"quantizer", ColType::Str, "", "the format of the indexer key cache (index_k)"},
     {"latent", ColType::Str, "",
      "the format of c_kv and k_pe beside it ([indexer] latent: a spec or engine preset; exact: as dumped)"},
     {"index_bytes_per_token", ColType::F64, "byte/token",
      "bytes of one token's indexer key in that format (one layer; per-matrix bytes amortized over T)"},
     {"index_rel_fro", ColType::F64, "1",
      "‖k̂ − k‖_F / ‖k‖_F of the layer's indexer keys (index_k, all tokens) quantized and decoded: the latent error "
      "of the indexer cache"},
     {"topk_recall", ColType::F64, "1",
      "mean over query rows of |S ∩ Ŝ| / |S|: S the keys the model selected (topk_keys), Ŝ the causal top-k of "
      "the index scores over the quantized index_k"},
     {"rows_changed", ColType::F64, "1", "the fraction of query rows whose selection Ŝ differs from S"},
     {"latent_bytes_per_token", ColType::F64, "byte/token",
      "bytes of one token's c_kv + k_pe in the latent format (one layer; 2 · (kv_lora_rank + qk_rope_head_dim) for "
      "exact, counted as bf16)"},
     {"kl_mean", ColType::F64, "nat",
      "mean over rows×heads of KL(p ‖ p̂): p the attention over S on exact c_kv and k_pe, p̂ the attention over Ŝ on "
      "c_kv and k_pe in the latent format (both caches quantized; a dropped key of S costs ≈ 69 nats per unit of "
      "its probability, the floor 1e-30)"},
     {"kl_selection", ColType::F64, "nat", "kl_mean with c_kv and k_pe exact: the selection's error alone"},
     {"kl_latent", ColType::F64, "nat", "kl_mean over S (the model's selection): the latent's error alone"},
     {"out_rel_fro", ColType::F64, "1", "‖ô − o‖_F / ‖o‖_F of the attention outputs (both caches quantized)"},
     {"top1_agree", ColType::F64, "1",
      "fraction of rows×heads whose most probable key is the same (both caches quantized)"}}};

/// A c_kv + k_pe format of [indexer] latent: parsed, or the error naming it.
QuantSpec parse_latent(const SettingsReader& r, const std::string& name, size_t i) {
  try {
    return QuantSpec::parse(name);
  } catch (const std::invalid_argument& e) {
    r.fail("latent", std::string("'indexer.latent': ") + e.what() + " (or exact: c_kv and k_pe as dumped)", i);
  }
  return {};
}

class IndexerProbe final : public Probe {
 public:
  std::string section() const override { return "indexer"; }
  int order() const override { return 360; }  // after decode order

  std::shared_ptr<const ProbeSettings> parse(const SettingsReader& r) const override {
    auto S = std::make_shared<IndexerSettings>();
    r.check_keys({"enabled", "quantizers", "latent"});
    if (auto v = r.boolean("enabled")) S->enabled = *v;
    if (auto v = r.strings("quantizers")) {
      S->quantizers.clear();
      for (size_t i = 0; i < v->size(); ++i) {
        QuantSpec q;
        try {
          q = QuantSpec::parse((*v)[i]);
        } catch (const std::invalid_argument& e) {
          r.fail("quantizers", std::string("'indexer.quantizers': ") + e.what(), i);
        }
        if (q.format == Format::Preset)
          r.fail("quantizers",
                 fmt::format("'indexer.quantizers': '{}' is an engine preset (a c_kv + k_pe record); the indexer "
                             "key cache takes one format, e.g. fp8-e4m3-tile128-pow2-amaxfloor",
                             (*v)[i]),
                 i);
        S->quantizers.push_back(q.to_string());
      }
    }
    if (auto v = r.strings("latent")) {
      S->latent.clear();
      for (size_t i = 0; i < v->size(); ++i) {
        if (std::find(S->latent.begin(), S->latent.end(), (*v)[i]) != S->latent.end())
          r.fail("latent", fmt::format("'indexer.latent': '{}' is listed twice", (*v)[i]), i);
        S->latent.push_back((*v)[i] == kExactLatent ? (*v)[i] : parse_latent(r, (*v)[i], i).to_string());
      }
      if (S->latent.empty()) r.fail("latent", "'indexer.latent' is empty (expected exact and/or c_kv + k_pe formats)");
    }
    return S;
  }

  std::vector<GroupSpec> groups() const override { return {kIndexerError}; }

  // /latent_error rows of index_k for each [indexer] format (rel_fro, bits, bytes and the rate-distortion bound of
  // the indexer cache beside the latent's), on a dump with indexer key caches.
  std::vector<TargetPlan> latent_targets(const StudyConfig& config, const DumpAttrs& attrs) const override {
    const auto& S = probe_settings<IndexerSettings>(config, "indexer");
    if (!S.enabled || attrs.index_head_dim == 0) return {};
    TargetPlan p{Target::IndexK, {}};
    for (const std::string& name : S.quantizers) p.quantizers.push_back({name, QuantSpec::parse(name), {}});
    return {p};
  }

  ProbePart plan(const StudyConfig& config, const Dump& dump) const override {
    ProbePart p;
    const auto& S = probe_settings<IndexerSettings>(config, "indexer");
    if (!S.enabled || !dump.attrs.family().holds(Target::IndexK) || !dump.file_has_attention) return p;
    if (!dump.attrs.family().topk_selection) {  // DeepSeek-V4: index_k selects compressed entries, not topk_keys
      p.notes.push_back(fmt::format("indexer: /indexer_error not applicable to {} (its CSA selection reads compressed "
                                    "entries, not c_kv + k_pe); its index_k rows are in /latent_error",
                                    dump.attrs.cache_family));
      return p;
    }
    p.groups = {"indexer_error"};
    for (const Layer& l : dump.layers)
      p.cells.push_back(ProbeCell::make(this, fmt::format("{:03d}/indexer", l.index), p.groups, {l.index}, true,
                                        IndexerCell{l.index}));
    return p;
  }

  std::vector<ColumnTable> run(const StudyConfig& config, const ProbeCell& cell, const LayerAccess& in) const override {
    const IndexerCell& c = cell.as<IndexerCell>();
    const Dump& dump = in.header();
    const Layer& l = in.layer(c.layer);
    ColumnTable t = empty_table(kIndexerError);
    if (!l.has_indexer()) return {std::move(t)};  // a GLM-5 "shared" layer: its keys were chosen by another layer
    const IndexerSettings& S = probe_settings<IndexerSettings>(config, "indexer");
    const int64_t T = dump.num_tokens(), d = l.index_dim;
    const int64_t Dc = dump.attrs.kv_lora_rank, Dr = dump.attrs.qk_rope_head_dim;
    const probes::AttentionQueries q = attention_queries(dump, l);  // the model's selection (topk_keys)
    const auto ref = probes::AbsorbedAttention<double>(q).run(l.c_kv, l.k_pe, true);
    // Each latent format's decoded c_kv and k_pe (none for exact: the layer's own are read), and the attention
    // over the model's selection on them.
    struct Latent {
      std::string name;
      std::vector<float> ckv, kpe;
      double bytes_per_token = 0, kl_latent = 0;
    };
    std::vector<Latent> latents;
    for (const std::string& name : S.latent) {
      Latent L{name, {}, {}, double(2 * (Dc + Dr)), 0.0};
      if (name != kExactLatent) {
        const QuantSpec spec = QuantSpec::parse(name);
        if (!why_not_applicable(spec, Target::CKV, Dc).empty() || !why_not_applicable(spec, Target::KPE, Dr).empty())
          continue;
        L.ckv.resize(l.c_kv.size());
        L.kpe.resize(l.k_pe.size());
        const QuantizedTensor a = quantize_dequantize(spec, Target::CKV, l.c_kv.data(), T, Dc, dump.seq_offsets,
                                                      L.ckv.data());
        const QuantizedTensor b = quantize_dequantize(spec, Target::KPE, l.k_pe.data(), T, Dr, dump.seq_offsets,
                                                      L.kpe.data());
        L.bytes_per_token = with_record_pad(account(a), spec, Target::CKV, Dc, Dr).bytes_per_token +
                            account(b).bytes_per_token;
        L.kl_latent = probes::attention_error(ref, probes::AbsorbedAttention<double>(q).run(L.ckv, L.kpe, true)).kl_mean;
      }
      latents.push_back(std::move(L));
    }
    std::vector<float> kq(static_cast<size_t>(T * d));
    for (const std::string& name : S.quantizers) {
      const QuantSpec spec = QuantSpec::parse(name);
      if (!why_not_applicable(spec, Target::IndexK, d).empty()) continue;  // in /not_applicable
      const QuantizedTensor qt = quantize_dequantize(spec, Target::IndexK, l.index_k.data(), T, d, dump.seq_offsets,
                                                     kq.data());
      const probes::KeySelection sel = indexer_selection(dump, l, kq);
      const SelectionRecall rc = selection_recall(l, sel.offsets, sel.keys);
      probes::AttentionQueries qs = q;
      qs.selected_offsets = sel.offsets;
      qs.selected_keys = sel.keys;
      const probes::AbsorbedAttention<double> sel_att(qs);
      const probes::AttentionError exact = probes::attention_error(ref, sel_att.run(l.c_kv, l.k_pe, true));
      const double rel_fro = error_metrics(l.index_k.data(), kq.data(), T, d).rel_fro;
      for (const Latent& L : latents) {
        const probes::AttentionError e =
            L.name == kExactLatent ? exact : probes::attention_error(ref, sel_att.run(L.ckv, L.kpe, true));
        add_row(t, {int64_t{c.layer}, spec.to_string(), L.name, double(qt.storage_bytes()) / double(T), rel_fro,
                    rc.recall, rc.rows_changed, L.bytes_per_token, e.kl_mean, exact.kl_mean,
                    L.kl_latent, e.out_rel_fro, e.top1_agree});
      }
    }
    return {std::move(t)};
  }

  std::vector<std::string> row_keys(const std::string&, const ColumnTable& t) const override {
    std::vector<std::string> k;
    for (int64_t l : t.get<int64_t>("layer")) k.push_back(fmt::format("{:03d}/indexer", l));
    return k;
  }

  std::string report(const ProbeReportInput& in) const override {
    const NamedTable* found = in.find("indexer_error");
    if (!found || found->table.num_rows() == 0) return {};
    const ColumnTable& t = found->table;
    std::string out =
        "\nDSA indexer key cache: the selection recomputed from the quantized index_k, beside c_kv + k_pe in the latent "
        "format (kl_mean: both; kl_selection: the indexer alone; kl_latent: the latent alone)\n";
    out += fmt::format("{:>5} {:<22} {:<18} {:>9} {:>10} {:>11} {:>10} {:>12} {:>10}\n", "layer", "quantizer",
                       "latent", "bytes/tok", "rel_fro", "topk_recall", "kl_mean", "kl_selection", "kl_latent");
    for (size_t i = 0; i < t.num_rows(); ++i)
      out += fmt::format("{:>5} {:<22} {:<18} {:>9.2f} {:>10.3e} {:>11.4f} {:>10.3e} {:>12.3e} {:>10.3e}\n",
                         t.get<int64_t>("layer")[i], t.get<std::string>("quantizer")[i],
                         t.get<std::string>("latent")[i], t.get<double>("index_bytes_per_token")[i],
                         t.get<double>("index_rel_fro")[i], t.get<double>("topk_recall")[i],
                         t.get<double>("kl_mean")[i], t.get<double>("kl_selection")[i], t.get<double>("kl_latent")[i]);
    return out;
  }
};

}  // namespace
}  // namespace latentq

LATENTQ_DEFINE_PROBE(indexer, latentq::IndexerProbe)
