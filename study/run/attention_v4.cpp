// The attention probe on a DeepSeek-V4 dump (cache_family deepseek_v4; study/probes/attention.cpp hands over; a file
// outside probes/, where every file is a probe of its own):
// /attention_check per layer (latentq/attention/v4.h's engine on the dumped caches against the dump's attn_out) and
// /attention_error per (layer, quantized caches, quantizer): each V4 cache the layer holds quantized alone
// (window_kv; compressed_kv on CSA / HCA layers; index_k on CSA layers, its top-k recomputed from the quantized
// keys as an engine does) and all of them with the one quantizer, the others as dumped, against the engine on the
// dumped caches with the model's selection (index_selected). Definitions: study/README.md ("Attention").
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "latentq/applicable.h"
#include "latentq/attention/metrics.h"
#include "latentq/attention/v4.h"
#include "latentq/config.h"
#include "latentq/layer_shared.h"
#include "latentq/probe_attention.h"
#include "latentq/quantize.h"
#include "latentq/study.h"
#include "latentq/transform.h"

namespace latentq {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct V4CheckCell {
  int layer = 0;
};
struct V4ErrorCell {
  int layer = 0;
  std::string layer_type;       // sliding, csa, hca
  std::vector<Target> caches;   // the caches quantized, kTargets order
  std::string targets;          // their names joined by '+'
  Quantizer quantizer;
};

std::string join_targets(const std::vector<Target>& ts) {
  std::string s;
  for (Target t : ts) s += (s.empty() ? "" : "+") + std::string(to_string(t));
  return s;
}

/// The caches a V4 layer holds, kTargets order: window_kv; compressed_kv on CSA / HCA; index_k on CSA.
std::vector<Target> layer_caches(const Dump& dump, int layer) {
  std::vector<Target> out;
  for (Target t : {Target::WindowKV, Target::CompressedKV, Target::IndexK})
    if (dump.holds(layer, t)) out.push_back(t);
  return out;
}

/// The V4 inputs of one layer (views into dump and layer).
probes::V4Queries v4_queries(const Dump& dump, const Layer& l) {
  probes::V4Queries q;
  q.layer_type = probes::parse_v4_layer_type(l.layer_type);
  q.num_heads = dump.attrs.num_heads;
  q.head_dim = dump.attrs.head_dim;
  q.rope_dim = dump.attrs.qk_rope_head_dim;
  q.sliding_window = l.sliding_window;
  q.softmax_scale = l.softmax_scale;
  q.num_tokens = dump.num_tokens();
  q.seq_offsets = dump.seq_offsets;
  q.positions = dump.positions;
  q.q_rows = l.q_rows;
  q.q = l.q;
  q.sinks = l.sinks;
  q.rope_cos = l.rope_cos;
  q.rope_sin = l.rope_sin;
  if (q.layer_type != probes::V4LayerType::Sliding) {
    q.compressed_offsets = l.compressed_offsets;
    q.compressed_span = l.compressed_span;
  }
  return q;
}

probes::V4IndexQueries index_queries(const Layer& l) {
  probes::V4IndexQueries iq;
  iq.n_heads = l.index_heads, iq.dim = l.index_dim, iq.topk = l.index_topk;
  iq.softmax_scale = l.index_softmax_scale;
  iq.index_q = l.index_q, iq.index_w = l.index_w;
  return iq;
}

/// One layer's engine and its reference on the dumped caches with the model's selection (shared by its cells).
struct V4LayerReference {
  std::unique_ptr<probes::V4Attention<float>> att;
  probes::KeySelection model_selection;  // CSA: index_selected; empty otherwise
  std::unique_ptr<const probes::AttentionResult<float>> ref;
  std::unique_ptr<const probes::AttentionReference<float>> prepared;
  const probes::KeySelection* selection() const { return model_selection.empty() ? nullptr : &model_selection; }
};

std::shared_ptr<const V4LayerReference> v4_reference(const LayerAccess& in, int layer) {
  return in.shared<V4LayerReference>(layer, "attention.v4_reference", [&] {
    const Dump& dump = in.header();
    const Layer& l = in.layer(layer);
    if (!l.has_attention()) throw std::invalid_argument(attention_unavailable_reason(dump));
    V4LayerReference r;
    r.att = std::make_unique<probes::V4Attention<float>>(v4_queries(dump, l));
    if (r.att->layer_type() == probes::V4LayerType::Csa)
      r.model_selection = r.att->selection_from_picks(l.index_selected, l.index_topk);
    r.ref = std::make_unique<const probes::AttentionResult<float>>(
        r.att->run(l.window_kv, l.compressed_kv, r.selection(), true));
    r.prepared = std::make_unique<const probes::AttentionReference<float>>(*r.ref);
    return r;
  });
}

/// A cache quantized then dequantized (its rows, each sequence's rows apart: Layer::row_offsets), with its storage,
/// behind the layer's rotation of `tr` (latentq/layer_shared.h layer_rotation: built or fitted on this cache). An
/// engine preset stores one entry row (window_kv, compressed_kv) as its record: its c_kv format on the first
/// head_dim − d_r columns, its k_pe format on the last d_r (why_not_applicable refuses other widths and rotations).
struct QuantizedCache {
  std::vector<float> x;
  double bytes_per_row = 0, bits_per_element = 0;
};
QuantizedCache quantize_cache(const LayerAccess& in, int layer, Target t, const QuantSpec& spec, const Transform& tr) {
  const Dump& dump = in.header();
  const Layer& l = in.layer(layer);
  const std::vector<float>& rows = l.rows(t);
  const std::vector<int64_t>& off = l.row_offsets(t, dump.seq_offsets);
  const int64_t R = off.empty() ? 0 : off.back(), D = dump.attrs.width(t);
  QuantizedCache q;
  q.x.resize(rows.size());
  if (R == 0) return q;
  const std::shared_ptr<const Rotation> rot = layer_rotation(in, layer, t, tr);
  if (!(spec.format == Format::Preset && is_entry_target(t))) {
    const Accounting a = account(quantize_dequantize_rotated(spec, *rot, t, rows.data(), R, D, off, q.x.data()));
    q.bytes_per_row = a.bytes_per_token, q.bits_per_element = a.bits_per_element;
    return q;
  }
  // The record's two parts, each over its own columns.
  const int64_t dr = dump.attrs.qk_rope_head_dim, dn = D - dr;
  std::vector<float> part, out;
  double bytes = 0;
  for (const auto& [target, c0, w] : {std::tuple{Target::CKV, int64_t{0}, dn}, std::tuple{Target::KPE, dn, dr}}) {
    part.resize(static_cast<size_t>(R * w)), out.resize(part.size());
    for (int64_t i = 0; i < R; ++i) std::copy_n(rows.data() + i * D + c0, w, part.data() + i * w);
    const QuantSpec s = spec.stored_for(target);
    bytes += with_record_pad(account(quantize_dequantize(s, target, part.data(), R, w, off, out.data())), spec, target,
                             dn, dr)
                 .bytes_per_token;
    for (int64_t i = 0; i < R; ++i) std::copy_n(out.data() + i * w, w, q.x.data() + i * D + c0);
  }
  q.bytes_per_row = bytes, q.bits_per_element = 8.0 * bytes / static_cast<double>(D);
  return q;
}

/// Mean over the query rows with a model selection of the fraction of it that `sel` keeps (1 for the model's).
double v4_recall(const probes::KeySelection& model, const probes::KeySelection& sel) {
  double sum = 0;
  int64_t rows = 0;
  for (size_t i = 0; i + 1 < model.offsets.size(); ++i) {
    const auto a0 = model.keys.begin() + model.offsets[i], a1 = model.keys.begin() + model.offsets[i + 1];
    if (a0 == a1) continue;
    std::vector<int32_t> common;
    std::set_intersection(a0, a1, sel.keys.begin() + sel.offsets[i], sel.keys.begin() + sel.offsets[i + 1],
                          std::back_inserter(common));
    sum += double(common.size()) / double(a1 - a0), ++rows;
  }
  return rows ? sum / double(rows) : kNaN;
}

std::vector<ColumnTable> run_v4_check(const V4CheckCell& c, const LayerAccess& in) {
  ColumnTable t = empty_table(probe_group_spec("attention_check"));
  const std::shared_ptr<const V4LayerReference> e = v4_reference(in, c.layer);
  const std::vector<float>& dumped = in.layer(c.layer).attn_out;
  double err2 = 0, ref2 = 0;
  for (size_t j = 0; j < e->ref->out.size(); ++j) {
    const double d = static_cast<double>(e->ref->out[j]) - static_cast<double>(dumped[j]);
    err2 += d * d, ref2 += static_cast<double>(dumped[j]) * static_cast<double>(dumped[j]);
  }
  const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  int64_t keys = 0;  // the keys the rows may read: window entries + visible compressed entries (the sink apart)
  for (int64_t n : e->ref->nkeys) keys += n - 1;
  add_row(t, {int64_t{c.layer}, rel, e->ref->num_queries, keys, kNaN, std::string()});
  return {std::move(t)};
}

std::vector<ColumnTable> run_v4_error(const V4ErrorCell& c, const LayerAccess& in) {
  ColumnTable t = empty_table(probe_group_spec("attention_error"));
  const Layer& l = in.layer(c.layer);
  const std::shared_ptr<const V4LayerReference> e = v4_reference(in, c.layer);
  std::vector<QuantizedCache> q;
  for (Target tg : c.caches)
    q.push_back(quantize_cache(in, c.layer, tg, c.quantizer.spec_for(c.layer, tg), c.quantizer.transform_for(c.layer, tg)));
  const auto read = [&](Target tg) -> std::span<const float> {
    for (size_t i = 0; i < c.caches.size(); ++i)
      if (c.caches[i] == tg) return q[i].x;
    return l.rows(tg);
  };
  // index_k quantized: the engine's top-k on it; otherwise the model's selection.
  probes::KeySelection own;
  const probes::KeySelection* sel = e->selection();
  if (std::find(c.caches.begin(), c.caches.end(), Target::IndexK) != c.caches.end()) {
    own = e->att->select_topk(index_queries(l), read(Target::IndexK));
    sel = &own;
  }
  const probes::AttentionError x =
      probes::attention_error(*e->prepared, e->att->run(read(Target::WindowKV), read(Target::CompressedKV), sel, true));
  // Bytes per token at long context: compressed_kv and index_k rows amortized over compress_rate tokens; the
  // window's entries are bounded per sequence (sliding_window of them), not counted per token.
  double bytes = 0;
  bool per_token = false;
  for (size_t i = 0; i < c.caches.size(); ++i)
    if (c.caches[i] != Target::WindowKV) {
      bytes += q[i].bytes_per_row / static_cast<double>(l.compress_rate);
      per_token = true;
    }
  const double recall = sel && !e->model_selection.empty() ? v4_recall(e->model_selection, *sel) : kNaN;
  add_row(t, {int64_t{c.layer}, c.quantizer.name, c.targets, x.out_rel_fro, x.cos_mean, x.kl_mean, x.top1_agree,
              x.top8_agree, q.front().bits_per_element, per_token ? bytes : kNaN, recall, c.layer_type});
  return {std::move(t)};
}

}  // namespace

std::string v4_check_key(int64_t l) { return fmt::format("{:03d}/attention_check", l); }

ProbePart plan_v4_attention(const Probe* probe, const StudyConfig& config, const Dump& dump) {
  ProbePart p;
  p.groups = {"attention_check", "attention_error"};
  // The quantizers of each V4 cache, those of its /latent_error rows: window_kv and compressed_kv the study's
  // entry quantizers (v4_entry_targets), index_k the probes' (latent_targets: [indexer]); a format that cannot take
  // the cache's width has no row quantizing it.
  std::vector<TargetPlan> plans = v4_entry_targets(config);
  for (const Probe* pr : registered_probes())
    for (TargetPlan& tp : pr->latent_targets(config, dump.attrs)) plans.push_back(std::move(tp));
  const auto quantizers = [&](Target t) {
    std::vector<Quantizer> qs;
    for (const TargetPlan& tp : plans)
      if (tp.target == t)
        for (const Quantizer& q : tp.quantizers)
          if (why_not_applicable(q, t, dump.attrs).empty() &&
              std::none_of(qs.begin(), qs.end(), [&](const Quantizer& x) { return x.name == q.name; }))
            qs.push_back(q);
    return qs;
  };
  for (const Layer& hl : dump.layers) {
    const int l = hl.index;
    p.cells.push_back(ProbeCell::make(probe, v4_check_key(l), {"attention_check"}, {l}, true, V4CheckCell{l}));
    const std::vector<Target> caches = layer_caches(dump, l);
    std::vector<std::vector<Quantizer>> per_cache;
    for (Target t : caches) per_cache.push_back(quantizers(t));
    const auto add = [&](std::vector<Target> ts, const Quantizer& q) {
      V4ErrorCell c{l, hl.layer_type, ts, join_targets(ts), q};
      std::string key = fmt::format("{:03d}/{}/{}/attention_error", l, c.targets, q.name);
      p.cells.push_back(ProbeCell::make(probe, std::move(key), {"attention_error"}, {l}, true, std::move(c)));
    };
    for (size_t i = 0; i < caches.size(); ++i)
      for (const Quantizer& q : per_cache[i]) add({caches[i]}, q);
    if (caches.size() < 2) continue;
    // All caches with one quantizer: those every cache of the layer runs.
    for (const Quantizer& q : per_cache[0]) {
      bool everywhere = true;
      for (size_t i = 1; i < caches.size(); ++i)
        everywhere = everywhere && std::any_of(per_cache[i].begin(), per_cache[i].end(),
                                               [&](const Quantizer& x) { return x.name == q.name; });
      if (everywhere) add(caches, q);
    }
  }
  return p;
}

std::vector<ColumnTable> run_v4_attention(const ProbeCell& cell, const LayerAccess& in) {
  if (cell.groups.front() == "attention_check") return run_v4_check(cell.as<V4CheckCell>(), in);
  return run_v4_error(cell.as<V4ErrorCell>(), in);
}

}  // namespace latentq
