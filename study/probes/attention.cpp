// The absorbed-attention probes: [attention] → /attention_check (the float32 recomputation on exact
// latents against the dump's attn_out, and the rotation fold check; cell "003/attention_check") and
// /attention_error (attention on quantized or SVD-pruned latents against exact latents; cell
// "003/c_kv+k_pe/int4-asym-channel-g32/attention_error"). Definitions: study/README.md
// ("Attention", "Fold check", "Attention check"). Needs the dump's attention datasets; a latent-only
// dump prints one line "attention: skipped: <why>".
#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <exception>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "latentq/applicable.h"
#include "latentq/config.h"
#include "latentq/probe_registry.h"
#include "latentq/probe_attention.h"
#include "latentq/layer_shared.h"
#include "latentq/probe_study.h"
#include "latentq/attention/attention.h"
#include "latentq/attention/dsa.h"
#include "latentq/split.h"
#include "latentq/analysis/svd_probe.h"
#include "latentq/quantize.h"

namespace latentq {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct CheckCell {
  int layer = 0;
};
struct ErrorCell {
  int layer = 0;
  std::string targets;                  // "c_kv", "k_pe" or "c_kv+k_pe": the latents quantized
  std::string quantizer;                // canonical spec string, or "svd-rank<r>"
  QuantSpec spec;                       // unused for svd-rank cells; on c_kv only when spec_kpe is set
  int64_t svd_rank = 0;                 // r > 0 for an svd-rank<r> cell
  std::optional<QuantSpec> spec_kpe{};  // the spec on k_pe when it differs (a mixed assignment); else `spec`
  Transform transform{};  // rotation before the quantizer; None: none (on c_kv only when transform_kpe is set)
  std::optional<Transform> transform_kpe{};  // the rotation on k_pe when spec_kpe is set; else `transform`
  // The plan's /attention_error cells of the same (layer, quantizer), this one included (non-SVD cells):
  // computed together by the first of them to run (run_error_group).
  std::shared_ptr<const std::vector<ErrorCell>> group{};
};

const GroupSpec kCheck = {
    "attention_check",
    {{"layer", ColType::I64, "", "the layer index"},
     {"ref_vs_dump_rel_fro", ColType::F64, "1",
      "‖o − attn_out‖_F / ‖attn_out‖_F: the absorbed attention on exact latents against the dump's attn_out"},
     {"tq", ColType::I64, "", "the query rows"},
     {"keys", ColType::I64, "", "the keys attended, summed over the query rows"},
     {"fold_rel_fro", ColType::F64, "1",
      "the largest out_rel_fro of the attention on a rotated cache with the rotation folded into the weights"},
     {"fold_transforms", ColType::Str, "", "the transforms that fold check ran, ;-separated"}}};
const GroupSpec kError = {
    "attention_error",
    {{"layer", ColType::I64, "", "the layer index"},
     {"quantizer", ColType::Str, "", "the quantizer, as /latent_error names it, or svd-rank<r>"},
     {"targets", ColType::Str, "", "the latents quantized: c_kv, k_pe or c_kv+k_pe (the others rounded to bf16)"},
     {"out_rel_fro", ColType::F64, "1", "‖ô − o‖_F / ‖o‖_F of the absorbed attention output (before o_proj)"},
     {"cos_mean", ColType::F64, "1", "mean over query rows and heads of cos(ô, o)"},
     {"kl_mean", ColType::F64, "nat", "mean over query rows and heads of KL(p ‖ p̂) of the attention weights"},
     {"top1_agree", ColType::F64, "1", "the fraction of query rows and heads whose most-attended key is unchanged"},
     {"top8_agree", ColType::F64, "1", "mean |top-m(p) ∩ top-m(p̂)| / m, m = min(8, keys)"},
     {"bits_per_element_c_kv", ColType::F64, "bit/element", "c_kv as stored (16 when c_kv is not quantized)"},
     {"bytes_per_token_layer", ColType::F64, "byte/token",
      "c_kv + k_pe of one layer, a target not quantized counted as bf16 (+ index_k for a c_kv+k_pe+index_k row)"},
     {"topk_recall", ColType::F64, "1",
      "sparse MLA: mean over query rows of the fraction of the model's selected keys (topk_keys) the row's "
      "attention reads: 1 where it reads the model's selection (the latent's error alone); for c_kv+k_pe+index_k "
      "the causal top-k recomputed from the indexer key cache in the quantizer's c_kv format (what the engine "
      "reads); NaN for dense MLA (no selection). DeepSeek-V4: on CSA layers the same for the entries index_selected "
      "names (1 unless index_k is quantized: its top-k recomputed); NaN on sliding and HCA layers"},
     {"layer_type", ColType::Str, "",
      "DeepSeek-V4: the layer's type (sliding, csa, hca); empty for MLA dumps"}}};

/// The targets of the sparse-MLA row that also quantizes the DSA indexer's key cache (index_k).
constexpr const char* kWithIndexer = "c_kv+k_pe+index_k";

std::string check_key(int64_t l) { return fmt::format("{:03d}/attention_check", l); }
std::string error_key(int64_t l, const std::string& targets, const std::string& q) {
  return fmt::format("{:03d}/{}/{}/attention_error", l, targets, q);
}

}  // namespace

SelectionRecall selection_recall(const Layer& l, const std::vector<int64_t>& offsets, const std::vector<int32_t>& keys) {
  const int64_t Tq = l.num_query_rows();
  assert(static_cast<int64_t>(offsets.size()) == Tq + 1 && static_cast<int64_t>(l.topk_offsets.size()) == Tq + 1);
  double recall = 0;
  int64_t changed = 0;
  std::vector<int32_t> common;
  for (int64_t i = 0; i < Tq; ++i) {
    const auto a0 = l.topk_keys.begin() + l.topk_offsets[i], a1 = l.topk_keys.begin() + l.topk_offsets[i + 1];
    const auto b0 = keys.begin() + offsets[i], b1 = keys.begin() + offsets[i + 1];
    common.clear();
    std::set_intersection(a0, a1, b0, b1, std::back_inserter(common));
    recall += double(common.size()) / double(a1 - a0);
    changed += !std::equal(a0, a1, b0, b1);
  }
  return {recall / double(Tq), double(changed) / double(Tq)};
}

probes::KeySelection indexer_selection(const Dump& dump, const Layer& l, std::span<const float> index_k) {
  return probes::dsa_select_topk(l.index_q, l.index_w, index_k, l.index_heads, l.index_dim, l.q_rows,
                                 dump.seq_offsets, l.index_softmax_scale, l.index_topk);
}

std::shared_ptr<const AttentionLayerReference> attention_reference(const LayerAccess& in, int layer) {
  return in.shared<AttentionLayerReference>(layer, "attention.reference", [&] {
    const Layer& l = in.layer(layer);
    if (!l.has_attention()) {
      const std::string why = attention_unavailable_reason(in.header());
      throw std::invalid_argument(why.empty() ? fmt::format("layer {} has no attention data loaded", layer) : why);
    }
    AttentionLayerReference r;
    r.queries = attention_queries(in.header(), l);
    r.att = std::make_unique<probes::AbsorbedAttention<float>>(r.queries);
    r.ref = std::make_unique<const probes::AttentionResult<float>>(r.att->run(l.c_kv, l.k_pe, true));
    r.prepared = std::make_unique<const probes::AttentionReference<float>>(*r.ref);
    return r;
  });
}

std::shared_ptr<const AttentionErrorEngine> attention_error_engine(const LayerAccess& in, int layer) {
  const std::shared_ptr<const AttentionLayerReference> cpu = attention_reference(in, layer);
  const probes::AttentionDeviceFactory* device = in.attention_device();
  if (!device || !*device) return std::make_shared<const AttentionErrorEngine>(AttentionErrorEngine{cpu, nullptr});
  // A shared value of its own: a device that fails here fails the cells that run on it (/attention_error, and
  // /attention_position where the device runs mixed caches), not the CPU reference's other users (the check,
  // the fold check).
  return in.shared<AttentionErrorEngine>(layer, "attention.device_reference", [&] {
    const Layer& l = in.layer(layer);
    auto d = std::make_shared<AttentionDeviceReference>();
    d->att = std::make_unique<probes::AbsorbedAttention<float>>(cpu->queries);
    d->att->attach_device(*device);
    if (d->att->device_computes_errors()) {  // the reference's probabilities stay on the device
      d->ref = std::make_unique<const probes::AttentionResult<float>>(d->att->keep_device_reference(l.c_kv, l.k_pe));
    } else {
      d->ref = std::make_unique<const probes::AttentionResult<float>>(d->att->run(l.c_kv, l.k_pe, true));
      d->prepared = std::make_unique<const probes::AttentionReference<float>>(*d->ref);
    }
    return AttentionErrorEngine{cpu, std::move(d)};
  });
}

namespace {

std::vector<ColumnTable> run_check(const StudyConfig& config, const CheckCell& c, const LayerAccess& in) {
  ColumnTable t = empty_table(kCheck);
  const std::shared_ptr<const AttentionLayerReference> e = attention_reference(in, c.layer);
  const Layer& l = in.layer(c.layer);
  const std::vector<float>& dumped = l.attn_out;
  double err2 = 0, ref2 = 0;
  for (size_t j = 0; j < e->ref->out.size(); ++j) {
    const double d = static_cast<double>(e->ref->out[j]) - static_cast<double>(dumped[j]);
    err2 += d * d;
    ref2 += static_cast<double>(dumped[j]) * static_cast<double>(dumped[j]);
  }
  const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  // The fold check: every transform of the study (rot when it has none), folded into
  // W_UK, W_UV and q_pe, must reproduce the unrotated attention to kFoldTolerance; else the cell fails.
  std::vector<Transform> transforms;
  auto add_transform = [&](const Transform& t) {
    if (t.kind != TransformKind::None && std::find(transforms.begin(), transforms.end(), t) == transforms.end())
      transforms.push_back(t);
  };
  for (const Quantizer& q : config.all_quantizers()) {
    add_transform(q.transform);
    for (const MixedRule& r : q.mixed) add_transform(r.transform);  // a mixed assignment's rules
  }
  if (transforms.empty()) transforms.push_back(Transform::parse("rot"));
  double fold = 0;
  std::string names;
  for (const Transform& tr : transforms) {
    const probes::FoldCheck f = probes::require_fold_exact(
        e->queries, l.c_kv, l.k_pe, *layer_rotation(in, c.layer, Target::CKV, tr),
        *layer_rotation(in, c.layer, Target::KPE, tr), fmt::format("layer {}, transform {}", c.layer, tr.to_string()));
    fold = std::max(fold, f.out_rel_fro);
    if (!names.empty()) names += ';';
    names += tr.to_string();
  }
  add_row(t, {int64_t{c.layer}, rel, e->ref->num_queries,
              std::accumulate(e->ref->nkeys.begin(), e->ref->nkeys.end(), int64_t{0}), fold, names});
  return {std::move(t)};
}

// topk_recall of a row that reads the model's own selection: 1 on a sparse MLA dump, NaN on a dense one.
double model_selection_recall(const Dump& dump) { return dump.attrs.family().topk_selection ? 1.0 : kNaN; }

// The c_kv+k_pe+index_k row (sparse MLA): c_kv and k_pe as the c_kv+k_pe row stores them, the indexer key cache
// in the quantizer's c_kv format, each query row's causal top-k recomputed from it (latentq/attention/dsa.h), the
// attention over that selection against the reference (the model's selection, exact latents). No row for a layer
// without its own indexer (GLM-5's shared layers) or an index width the format cannot take.
std::vector<ColumnTable> run_error_with_indexer(const ErrorCell& c, const LayerAccess& in) {
  ColumnTable t = empty_table(kError);
  const Dump& dump = in.header();
  const Layer& l = in.layer(c.layer);
  const QuantSpec index_spec = c.spec.stored_for(Target::CKV);
  if (!l.has_indexer() || !why_not_applicable(index_spec, Target::CKV, l.index_dim).empty()) return {std::move(t)};
  const int64_t T = dump.num_tokens(), r = dump.attrs.kv_lora_rank, rope = dump.attrs.qk_rope_head_dim;
  std::vector<float> ckv(l.c_kv.size()), kpe(l.k_pe.size()), kq(l.index_k.size());
  const Accounting ac = with_record_pad(
      account(quantize_dequantize_layer(in, c.layer, Target::CKV, c.spec, c.transform, ckv.data())), c.spec,
      Target::CKV, r, rope);
  const QuantSpec& spec_kpe = c.spec_kpe ? *c.spec_kpe : c.spec;
  const Accounting ak = account(quantize_dequantize_layer(in, c.layer, Target::KPE, spec_kpe,
                                                          c.transform_kpe.value_or(c.transform), kpe.data()));
  const QuantizedTensor qi =
      quantize_dequantize(index_spec, Target::CKV, l.index_k.data(), T, l.index_dim, dump.seq_offsets, kq.data());
  const probes::KeySelection sel = indexer_selection(dump, l, kq);
  const std::shared_ptr<const AttentionLayerReference> ref = attention_reference(in, c.layer);
  probes::AttentionQueries qs = ref->queries;
  qs.selected_offsets = sel.offsets;
  qs.selected_keys = sel.keys;
  const probes::AttentionError x =
      probes::attention_error(*ref->prepared, probes::AbsorbedAttention<float>(qs).run(ckv, kpe, true));
  add_row(t, {int64_t{c.layer}, c.quantizer, c.targets, x.out_rel_fro, x.cos_mean, x.kl_mean, x.top1_agree,
              x.top8_agree, ac.bits_per_element,
              ac.bytes_per_token + ak.bytes_per_token + account(qi).bytes_per_token,
              selection_recall(l, sel.offsets, sel.keys).recall, std::string()});
  return {std::move(t)};
}

// The bf16 reads of a layer's targets and bf16(c_kv)'s partial scores, shared by its /attention_error cells.
struct Bf16Stores {
  std::vector<float> ckv, kpe;
  double bytes_ckv = 0, bytes_kpe = 0;
  probes::AbsorbedAttention<float>::CkvScores ckv_scores;
};

// The rows of a group of /attention_error cells of one (layer, quantizer): one quantization per target, the
// layer's bf16 stores, one AbsorbedAttention::run_variants (shared partial scores and output GEMMs). A cell
// whose quantization or metrics fail keeps its own error; when the shared run fails, no rows: each cell
// then computes alone and reports its own error. Each row equals the one the cell computes alone (the same
// float operations; tests).
struct GroupRows {
  std::map<std::string, ColumnTable> rows;           // by cell key
  std::map<std::string, std::exception_ptr> errors;  // by cell key
};

GroupRows run_error_group(const std::vector<ErrorCell>& cells, const LayerAccess& in) {
  GroupRows g;
  const int layer = cells.front().layer;
  const Dump& dump = in.header();
  const Layer& l = in.layer(layer);
  const int64_t T = dump.num_tokens(), r = dump.attrs.kv_lora_rank, rope = dump.attrs.qk_rope_head_dim;
  const std::shared_ptr<const AttentionErrorEngine> e = attention_error_engine(in, layer);
  const std::shared_ptr<const Bf16Stores> b = in.shared<Bf16Stores>(layer, "attention.bf16", [&] {
    static const QuantSpec kBf16 = QuantSpec::parse("bf16");
    Bf16Stores x;
    x.ckv.resize(l.c_kv.size());
    x.kpe.resize(l.k_pe.size());
    x.bytes_ckv = account(quantize_dequantize_rotated(kBf16, Rotation{}, Target::CKV, l.c_kv.data(), T, r,
                                                      dump.seq_offsets, x.ckv.data()))
                      .bytes_per_token;
    x.bytes_kpe = account(quantize_dequantize_rotated(kBf16, Rotation{}, Target::KPE, l.k_pe.data(), T, rope,
                                                      dump.seq_offsets, x.kpe.data()))
                      .bytes_per_token;
    if (!e->device) x.ckv_scores = e->att().ckv_scores(x.ckv);  // the device path does not share scores
    return x;
  });
  struct Store {
    std::vector<float> x;
    Accounting a{};
    std::exception_ptr error;
  };
  std::map<std::string, Store> stores;  // "<target>/<transform>/<spec>"
  const auto store = [&](Target t, const QuantSpec& spec, const Transform& tr) -> const Store& {
    const std::string key = fmt::format("{}/{}/{}", to_string(t), tr.to_string(), spec.to_string());
    if (const auto it = stores.find(key); it != stores.end()) return it->second;
    Store& st = stores[key];
    const bool ckv = t == Target::CKV;
    try {
      st.x.resize(ckv ? l.c_kv.size() : l.k_pe.size());
      st.a = with_record_pad(account(quantize_dequantize_layer(in, layer, t, spec, tr, st.x.data())), spec, t,
                             in.header().attrs.kv_lora_rank, in.header().attrs.qk_rope_head_dim);
    } catch (...) {
      st.error = std::current_exception();
    }
    return st;
  };
  std::vector<const ErrorCell*> planned;
  std::vector<const Store*> sc_of, sk_of;
  std::vector<probes::AbsorbedAttention<float>::Variant> variants;
  for (const ErrorCell& c : cells) {
    const bool q_ckv = c.targets != "k_pe", q_kpe = c.targets != "c_kv";
    const Store* sc = q_ckv ? &store(Target::CKV, c.spec, c.transform) : nullptr;
    const Store* sk = q_kpe ? &store(Target::KPE, c.targets == "k_pe" ? c.spec : c.spec_kpe.value_or(c.spec),
                                     c.transform_kpe.value_or(c.transform))
                            : nullptr;
    const std::string key = error_key(c.layer, c.targets, c.quantizer);
    if ((sc && sc->error) || (sk && sk->error)) {
      g.errors[key] = sc && sc->error ? sc->error : sk->error;
      continue;
    }
    planned.push_back(&c);
    sc_of.push_back(sc);
    sk_of.push_back(sk);
    probes::AbsorbedAttention<float>::Variant v;
    v.c_kv = sc ? std::span<const float>(sc->x) : std::span<const float>(b->ckv);
    v.k_pe = sk ? std::span<const float>(sk->x) : std::span<const float>(b->kpe);
    v.scores = sc || !b->ckv_scores.store ? nullptr : &b->ckv_scores;
    variants.push_back(v);
  }
  // A device that computes the errors itself takes each variant on its own (its probabilities never come
  // back); otherwise one run_variants and the metrics here against the prepared reference.
  const bool device_metrics = e->device_metrics();
  std::vector<probes::AttentionResult<float>> results;
  if (!device_metrics) {
    try {
      results = e->att().run_variants(variants, true);
    } catch (const std::exception&) {
      g.rows.clear();
      g.errors.clear();
      return g;  // each cell computes alone
    }
  }
  for (size_t i = 0; i < planned.size(); ++i) {
    const ErrorCell& c = *planned[i];
    const std::string key = error_key(c.layer, c.targets, c.quantizer);
    try {
      const probes::AttentionError x = device_metrics ? e->error(variants[i].c_kv, variants[i].k_pe)
                                                      : probes::attention_error(e->prepared(), results[i]);
      ColumnTable t = empty_table(kError);
      const double bits_c = sc_of[i] ? sc_of[i]->a.bits_per_element : 16.0;
      const double bytes_c = sc_of[i] ? sc_of[i]->a.bytes_per_token : b->bytes_ckv;
      const double bytes_k = sk_of[i] ? sk_of[i]->a.bytes_per_token : b->bytes_kpe;
      add_row(t, {int64_t{c.layer}, c.quantizer, c.targets, x.out_rel_fro, x.cos_mean, x.kl_mean, x.top1_agree,
                  x.top8_agree, bits_c, bytes_c + bytes_k, model_selection_recall(dump), std::string()});
      g.rows[key] = std::move(t);
    } catch (...) {
      g.errors[key] = std::current_exception();
    }
  }
  return g;
}

std::vector<ColumnTable> run_error(const StudyConfig& config, const ErrorCell& c, const LayerAccess& in) {
  if (c.targets == kWithIndexer) return run_error_with_indexer(c, in);
  if (c.svd_rank == 0 && c.group && !c.group->empty()) {
    const std::shared_ptr<const GroupRows> g =
        in.shared<GroupRows>(c.layer, "attention.group/" + c.quantizer, [&] { return run_error_group(*c.group, in); });
    const std::string key = error_key(c.layer, c.targets, c.quantizer);
    if (const auto it = g->rows.find(key); it != g->rows.end()) return {it->second};
    if (const auto it = g->errors.find(key); it != g->errors.end()) std::rethrow_exception(it->second);
  }
  ColumnTable t = empty_table(kError);
  if (c.targets != "c_kv" && c.targets != "k_pe" && c.targets != "c_kv+k_pe")
    throw std::invalid_argument(fmt::format("unknown targets '{}' (expected c_kv, k_pe or c_kv+k_pe)", c.targets));
  if (c.svd_rank > 0 && c.targets != "c_kv") throw std::invalid_argument("an svd-rank cell quantizes c_kv only");
  const std::shared_ptr<const AttentionErrorEngine> e = attention_error_engine(in, c.layer);
  const Dump& dump = in.header();
  const Layer& l = in.layer(c.layer);
  const int64_t T = dump.num_tokens(), r = dump.attrs.kv_lora_rank, rope = dump.attrs.qk_rope_head_dim;
  // A target this row does not quantize is stored (and charged) as bf16, so it is rounded to bf16 here:
  // the measured error then matches the accounting. SVD rows round their coefficients to bf16
  // (probes::CoeffDtype::BF16), the dtype charged for them.
  static const QuantSpec kBf16 = QuantSpec::parse("bf16");
  std::vector<float> ckv_buf(l.c_kv.size()), kpe_buf(l.k_pe.size());
  double bits_c = 16, bytes_c = 2.0 * static_cast<double>(r), bytes_k = 2.0 * static_cast<double>(rope);
  if (c.svd_rank > 0) {
    const bool centered = probe_settings<SvdSettings>(config, "svd").centered;
    svd_split_fit(in, c.layer, centered)
        ->basis.reconstruct(l.c_kv.data(), T, c.svd_rank, ckv_buf.data(), probes::CoeffDtype::BF16);
    bits_c = 16.0 * static_cast<double>(c.svd_rank) / static_cast<double>(r);
    bytes_c = 2.0 * static_cast<double>(c.svd_rank);
  } else {
    const bool q_ckv = c.targets != "k_pe";
    const Accounting a = with_record_pad(
        account(quantize_dequantize_layer(in, c.layer, Target::CKV, q_ckv ? c.spec : kBf16,
                                          q_ckv ? c.transform : Transform{}, ckv_buf.data())),
        q_ckv ? c.spec : kBf16, Target::CKV, in.header().attrs.kv_lora_rank, in.header().attrs.qk_rope_head_dim);
    bits_c = a.bits_per_element;
    bytes_c = a.bytes_per_token;
  }
  const bool q_kpe = c.svd_rank == 0 && c.targets != "c_kv";
  bytes_k =
      account(quantize_dequantize_layer(in, c.layer, Target::KPE, q_kpe ? c.spec_kpe.value_or(c.spec) : kBf16,
                                        q_kpe ? c.transform_kpe.value_or(c.transform) : Transform{}, kpe_buf.data()))
          .bytes_per_token;
  const std::span<const float> ckv = ckv_buf, kpe = kpe_buf;
  const probes::AttentionError x = e->error(ckv, kpe);
  add_row(t, {int64_t{c.layer}, c.quantizer, c.targets, x.out_rel_fro, x.cos_mean, x.kl_mean, x.top1_agree,
              x.top8_agree, bits_c, bytes_c + bytes_k, model_selection_recall(dump), std::string()});
  return {std::move(t)};
}

// ---- printing ----------------------------------------------------------------------------------------

std::string num(double x, int prec) { return std::isfinite(x) ? fmt::format("{:.{}f}", x, prec) : std::string("-"); }
std::string sci(double x) { return std::isfinite(x) ? fmt::format("{:.3e}", x) : std::string("-"); }
double mean_finite(const std::vector<double>& v) {
  double s = 0;
  size_t n = 0;
  for (double x : v)
    if (std::isfinite(x)) s += x, ++n;
  return n ? s / static_cast<double>(n) : kNaN;
}

// Per (quantizer, targets): the values of each column over layers.
struct AttentionMeans {
  std::map<std::pair<std::string, std::string>, std::vector<double>> out_rel, kl, top1, top8;
};
AttentionMeans attention_means(const ColumnTable& a) {
  AttentionMeans m;
  const auto& q = a.get<std::string>("quantizer");
  const auto& tg = a.get<std::string>("targets");
  const auto& o = a.get<double>("out_rel_fro");
  const auto& kl = a.get<double>("kl_mean");
  const auto& t1 = a.get<double>("top1_agree");
  const auto& t8 = a.get<double>("top8_agree");
  for (size_t i = 0; i < q.size(); ++i) {
    const auto k = std::make_pair(q[i], tg[i]);
    m.out_rel[k].push_back(o[i]);
    m.kl[k].push_back(kl[i]);
    m.top1[k].push_back(t1[i]);
    m.top8[k].push_back(t8[i]);
  }
  return m;
}
double mean_at(const std::map<std::pair<std::string, std::string>, std::vector<double>>& m, const std::string& q,
               const std::string& tg) {
  const auto it = m.find({q, tg});
  return it == m.end() ? kNaN : mean_finite(it->second);
}

// Summary rows sorted as format_summary: bytes per token, then mean c_kv rel_fro.
std::vector<size_t> summary_order(const ColumnTable& s) {
  const auto& bytes = s.get<double>("bytes_per_token_model");
  const auto& mc = s.get<double>("mean_rel_fro_c_kv");
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), 0);
  auto key = [](double x) { return std::isnan(x) ? std::numeric_limits<double>::infinity() : x; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (bytes[a] != bytes[b]) return bytes[a] < bytes[b];
    return key(mc[a]) < key(mc[b]);
  });
  return order;
}

std::string attention_table(const ColumnTable& summary, const ColumnTable& att, const ColumnTable* svd,
                            const DumpAttrs& A) {
  const AttentionMeans m = attention_means(att);
  const auto& name = summary.get<std::string>("quantizer");
  const auto& bytes = summary.get<double>("bytes_per_token_model");
  const auto& mc = summary.get<double>("mean_rel_fro_c_kv");
  size_t w = 9;
  for (const auto& s : name) w = std::max(w, s.size() + 1);
  std::string out;
  out += "\nLatent error vs attention error (absorbed attention; mean over layers)\n";
  out += fmt::format("{:<{}} {:>11} {:>10} | {:>10} {:>10} {:>7} {:>7} | {:>10}\n", "quantizer", w, "bytes/token",
                     "c_kv", "attn out", "KL", "top-1", "top-8", "attn out");
  out += fmt::format("{:<{}} {:>11} {:>10} | {:>37} | {:>10}\n", "", w, "(model)", "rel_fro", "c_kv+k_pe quantized",
                     "c_kv only");
  for (size_t i : summary_order(summary)) {
    const std::string& q = name[i];
    out += fmt::format("{:<{}} {:>11} {:>10} | {:>10} {:>10} {:>7} {:>7} | {:>10}\n", q, w, num(bytes[i], 1),
                       sci(mc[i]), sci(mean_at(m.out_rel, q, "c_kv+k_pe")), sci(mean_at(m.kl, q, "c_kv+k_pe")),
                       num(mean_at(m.top1, q, "c_kv+k_pe"), 4), num(mean_at(m.top8, q, "c_kv+k_pe"), 4),
                       sci(mean_at(m.out_rel, q, "c_kv")));
  }
  // SVD-pruned c_kv (k_pe bf16).
  std::set<int64_t> ranks;
  for (const auto& [k, v] : m.out_rel)
    if (k.first.rfind("svd-rank", 0) == 0) ranks.insert(std::stoll(k.first.substr(8)));
  if (!ranks.empty()) {
    std::map<int64_t, std::vector<double>> held;
    if (svd) {
      const auto& rk = svd->get<int64_t>("rank");
      const auto& ho = svd->get<double>("heldout_rel_fro");
      for (size_t i = 0; i < rk.size(); ++i) held[rk[i]].push_back(ho[i]);
    }
    out += fmt::format("\nSVD-pruned c_kv (k_pe bf16; r bf16 coefficients per token, basis not counted)\n");
    out += fmt::format("{:<{}} {:>11} {:>10} | {:>10} {:>10} {:>7} {:>7}\n", "quantizer", w, "bytes/token", "held-out",
                       "attn out", "KL", "top-1", "top-8");
    out += fmt::format("{:<{}} {:>11} {:>10} | {:>10}\n", "", w, "(model)", "rel_fro", "rel_fro");
    for (int64_t r : ranks) {
      const std::string q = fmt::format("svd-rank{}", r);
      const double b = static_cast<double>(A.num_layers) * 2.0 * static_cast<double>(r + A.qk_rope_head_dim);
      out += fmt::format("{:<{}} {:>11} {:>10} | {:>10} {:>10} {:>7} {:>7}\n", q, w, num(b, 1),
                         sci(held.count(r) ? mean_finite(held[r]) : kNaN), sci(mean_at(m.out_rel, q, "c_kv")),
                         sci(mean_at(m.kl, q, "c_kv")), num(mean_at(m.top1, q, "c_kv"), 4),
                         num(mean_at(m.top8, q, "c_kv"), 4));
    }
  }
  out +=
      "attn out = ||out_hat - out||_F / ||out||_F of the attention output; KL(p || p_hat) of the attention "
      "probabilities in nats;\ntop-k = agreement of the k most attended keys; all over query rows x heads.\n";
  return out;
}

class AttentionProbe final : public Probe {
 public:
  std::string section() const override { return "attention"; }
  int order() const override { return 300; }
  int print_order() const override { return 100; }  // first: next to the latent summary

  std::shared_ptr<const ProbeSettings> parse(const SettingsReader& r) const override {
    auto A = std::make_shared<AttentionSettings>();
    r.check_keys({"enabled", "targets", "svd", "check_tolerance"});
    if (auto v = r.boolean("enabled")) A->enabled = *v;
    if (auto v = r.boolean("svd")) A->svd = *v;
    if (auto v = r.strings("targets")) {
      A->targets = *v;
      for (size_t i = 0; i < A->targets.size(); ++i) {
        const std::string& s = A->targets[i];
        if (s != "c_kv" && s != "k_pe" && s != "c_kv+k_pe")
          r.fail("targets", fmt::format("'attention.targets': '{}' is not one of \"c_kv\", \"k_pe\", \"c_kv+k_pe\"", s),
                 i);
        if (std::count(A->targets.begin(), A->targets.end(), s) > 1)
          r.fail("targets", fmt::format("'attention.targets': '{}' is listed twice", s), i);
      }
    }
    if (auto v = r.number("check_tolerance")) {
      A->check_tolerance = *v;
      if (!(A->check_tolerance > 0)) r.fail("check_tolerance", "'attention.check_tolerance' must be > 0");
    }
    return A;
  }

  std::vector<GroupSpec> groups() const override { return {kCheck, kError}; }

  ProbePart plan(const StudyConfig& config, const Dump& dump) const override {
    ProbePart p;
    const AttentionSettings& s = probe_settings<AttentionSettings>(config, "attention");
    if (!s.enabled) return p;
    if (std::string why = attention_unavailable_reason(dump); !why.empty()) {
      p.notes.push_back("attention: skipped: " + why);
      return p;
    }
    if (dump.attrs.v4()) return plan_v4_attention(this, config, dump);  // study/run/attention_v4.cpp
    p.groups = {"attention_check", "attention_error"};
    std::vector<int> L;
    for (const Layer& l : dump.layers) L.push_back(l.index);
    for (int l : L)
      p.cells.push_back(ProbeCell::make(this, check_key(l), {"attention_check"}, {l}, true, CheckCell{l}));
    // Layer-major; per layer, for each target combination (config order) each quantizer of the run that
    // the latent study ran on every target of the combination; then svd-rank<r> (c_kv) per SVD rank. A
    // quantizer whose format cannot take a target's width (latentq/applicable.h) has no row that quantizes
    // that target: its rows of the other target stay.
    const std::vector<int64_t> ranks = s.svd ? svd_ranks(config, dump) : std::vector<int64_t>{};
    const std::vector<Quantizer> qs = config.all_quantizers();
    auto ran = [&](Target t, const Quantizer& q) {
      const TargetPlan* tp = config.plan(t);
      return tp &&
             std::any_of(tp->quantizers.begin(), tp->quantizers.end(),
                         [&](const Quantizer& x) { return x.name == q.name; }) &&
             why_not_applicable(q, t, dump.attrs).empty();
    };
    auto add = [&](ErrorCell c) {
      const int l = c.layer;
      std::string key = error_key(l, c.targets, c.quantizer);
      p.cells.push_back(ProbeCell::make(this, std::move(key), {"attention_error"}, {l}, true, std::move(c)));
    };
    for (int l : L) {
      std::vector<ErrorCell> layer_cells;
      for (const std::string& tg : s.targets) {
        const bool ckv = tg != "k_pe", kpe = tg != "c_kv";
        for (const Quantizer& q : qs)
          if ((!ckv || ran(Target::CKV, q)) && (!kpe || ran(Target::KPE, q))) {
            ErrorCell c{l, tg, q.name, ckv ? q.spec_for(l, Target::CKV) : q.spec_for(l, Target::KPE), 0};
            c.transform = ckv ? q.transform_for(l, Target::CKV) : q.transform_for(l, Target::KPE);
            if (q.is_mixed() && ckv && kpe) {
              c.spec_kpe = q.spec_for(l, Target::KPE);
              c.transform_kpe = q.transform_for(l, Target::KPE);
            }
            layer_cells.push_back(std::move(c));
          }
      }
      // The cells of one quantizer share their group (run_error_group).
      std::map<std::string, std::vector<ErrorCell>> by_quantizer;
      for (const ErrorCell& c : layer_cells) by_quantizer[c.quantizer].push_back(c);
      std::map<std::string, std::shared_ptr<const std::vector<ErrorCell>>> groups;
      for (auto& [q, v] : by_quantizer) groups[q] = std::make_shared<const std::vector<ErrorCell>>(std::move(v));
      for (ErrorCell& c : layer_cells) {
        c.group = groups[c.quantizer];
        // sparse MLA: beside each c_kv+k_pe row, the same quantizer on the indexer key cache too (its own cell)
        std::optional<ErrorCell> with_indexer;
        if (c.targets == "c_kv+k_pe" && dump.attrs.family().holds(Target::IndexK)) {
          with_indexer = c;
          with_indexer->targets = kWithIndexer;
          with_indexer->group = nullptr;
        }
        add(std::move(c));
        if (with_indexer) add(std::move(*with_indexer));
      }
      for (int64_t k : ranks) add(ErrorCell{l, "c_kv", fmt::format("svd-rank{}", k), QuantSpec{}, k});
    }
    return p;
  }

  std::vector<ColumnTable> run(const StudyConfig& config, const ProbeCell& cell, const LayerAccess& in) const override {
    if (in.header().attrs.v4()) return run_v4_attention(cell, in);
    if (cell.groups.front() == "attention_check") return run_check(config, cell.as<CheckCell>(), in);
    return run_error(config, cell.as<ErrorCell>(), in);
  }

  std::vector<std::string> row_keys(const std::string& group, const ColumnTable& t) const override {
    std::vector<std::string> k;
    const auto& l = t.get<int64_t>("layer");
    if (group == "attention_check") {
      for (int64_t x : l) k.push_back(check_key(x));
    } else {
      const auto &tg = t.get<std::string>("targets"), &q = t.get<std::string>("quantizer");
      for (size_t i = 0; i < l.size(); ++i) k.push_back(error_key(l[i], tg[i], q[i]));
    }
    return k;
  }

  std::vector<std::string> report_warnings(const ProbeReportInput& in) const override {
    const NamedTable* check = in.find("attention_check");
    if (!check) return {};
    return attention_check_warnings(check->table,
                                    probe_settings<AttentionSettings>(in.config, "attention").check_tolerance);
  }

  std::string report(const ProbeReportInput& in) const override {
    const NamedTable* a = in.find("attention_error");
    if (!in.summary || !a || a->table.num_rows() == 0 || in.attrs.v4()) return {};  // the table is MLA's
    const NamedTable* svd = in.find("svd");
    return attention_table(*in.summary, a->table, svd ? &svd->table : nullptr, in.attrs);
  }
};

}  // namespace

std::string attention_unavailable_reason(const Dump& dump) {
  if (dump.layers.empty()) return fmt::format("{}: no layer loaded", dump.path.string());
  if (dump.file_has_attention) return "";
  return fmt::format(
      "{} has no dataset /layers/{:03d}/q_rows (nor q_nope, q_pe, w_uk, w_uv, attn_out): a latent-only "
      "dump",
      dump.path.string(), dump.layers.front().index);
}

probes::AttentionQueries attention_queries(const Dump& dump, const Layer& l) {
  const DumpAttrs& A = dump.attrs;
  probes::AttentionQueries q;
  q.dims = {A.num_heads, A.kv_lora_rank, A.qk_nope_head_dim, A.qk_rope_head_dim, A.v_head_dim};
  q.num_tokens = dump.num_tokens();
  q.seq_offsets = dump.seq_offsets;
  q.q_rows = l.q_rows;
  q.q_nope = l.q_nope;
  q.q_pe = l.q_pe;
  q.w_uk = l.w_uk;
  q.w_uv = l.w_uv;
  q.softmax_scale = A.softmax_scale;
  q.selected_offsets = l.topk_offsets;  // sparse MLA: the keys each row read in the model (empty: dense)
  q.selected_keys = l.topk_keys;
  return q;
}

std::vector<std::string> attention_check_warnings(const ColumnTable& check, double tolerance) {
  std::vector<std::string> out;
  const auto& layer = check.get<int64_t>("layer");
  const auto& rel = check.get<double>("ref_vs_dump_rel_fro");
  for (size_t i = 0; i < layer.size(); ++i)
    if (!(rel[i] <= tolerance))
      out.push_back(
          fmt::format("attention check: layer {}: the absorbed recomputation on the exact latents differs "
                      "from the dump's attn_out by rel_fro {:.3e} > {:.0e}; /attention_error of this layer "
                      "compares against the recomputation",
                      layer[i], rel[i], tolerance));
  return out;
}

}  // namespace latentq

LATENTQ_DEFINE_PROBE(attention, latentq::AttentionProbe)
