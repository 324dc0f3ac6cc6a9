// The latent-error study (latentq/study.h).
#include "latentq/study.h"

#include "latentq/probe_registry.h"
#include "latentq/provenance.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <array>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "latentq/analysis/gemm.h"
#include "latentq/analysis/svd_probe.h"
#include "latentq/applicable.h"
#include "latentq/split.h"
#include "latentq/layer_shared.h"
#include "latentq/transform.h"
#include "latentq/util.h"

namespace latentq {
namespace {

class CpuBackend final : public LatentBackend {
 public:
  std::string name() const override { return "cpu"; }
  bool concurrent() const override { return true; }
  StoredCell run(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                 std::span<const int64_t> seq_offsets, float* decoded) override {
    const QuantizedTensor q = quantize_dequantize(spec, target, X, T, D, seq_offsets, decoded);
    return {q.spec, account(q), diagnose(q, X)};
  }
};

double mean_of(const std::vector<double>& v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}
double max_of(const std::vector<double>& v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  double m = v.front();
  for (double x : v) m = (std::isnan(x) || x > m) ? x : m;  // NaN propagates
  return m;
}

}  // namespace

std::string Cell::key(std::string_view group) const {
  return fmt::format("{:03d}/{}/{}/{}", layer, to_string(target), quantizer.name, group);
}

std::vector<TargetPlan> v4_entry_targets(const StudyConfig& config) {
  const TargetPlan* from = config.plan(Target::CKV);
  if (!from && !config.targets.empty()) from = &config.targets.front();
  if (!from) return {};
  return {{Target::WindowKV, from->quantizers}, {Target::CompressedKV, from->quantizers}};
}

std::vector<TargetPlan> latent_error_targets(const StudyConfig& config, const DumpAttrs& attrs) {
  std::vector<TargetPlan> plans = attrs.v4() ? v4_entry_targets(config) : config.targets;
  for (const Probe* probe : registered_probes())
    for (TargetPlan& p : probe->latent_targets(config, attrs)) plans.push_back(std::move(p));
  return plans;
}

std::vector<Cell> plan_cells(const StudyConfig& config, const Dump& dump) {
  std::vector<Cell> cells;
  const std::vector<TargetPlan> plans = latent_error_targets(config, dump.attrs);
  for (const Layer& l : dump.layers)
    for (const TargetPlan& p : plans)
      for (const Quantizer& q : p.quantizers) {
        if (!dump.holds(l.index, p.target)) continue;                       // e.g. no indexer of its own
        if (!why_not_applicable(q, p.target, dump.attrs).empty()) continue;  // listed in /not_applicable
        Cell c{l.index, p.target, q};
        c.quantizer.spec = q.spec_for(l.index, p.target);            // a mixed assignment: this layer's spec
        c.quantizer.transform = q.transform_for(l.index, p.target);  // ... and its transform
        cells.push_back(std::move(c));
      }
  return cells;
}

std::unique_ptr<LatentBackend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

std::unique_ptr<LatentBackend> make_backend(std::string_view device) {
  if (device == "cpu") return make_cpu_backend();
  if (device == "cuda") return make_cuda_backend();
  throw std::invalid_argument(fmt::format("unknown device '{}' (expected cpu or cuda)", device));
}

const GroupSpec& latent_error_spec() {
  static const GroupSpec g{
      "latent_error",
      {{"layer", ColType::I64, "", "the layer index"},
       {"target", ColType::Str, "",
        "the cached tensor quantized: c_kv or k_pe (the latent cache), or index_k (sparse MLA's indexer key cache)"},
       {"quantizer", ColType::Str, "",
        "the quantizer: a spec string (<transform>,<spec> behind a transform) or a [[mixed]] assignment's name"},
       {"stored", ColType::Str, "",
        "the spec really stored for this layer and target (flashmla-v32-fp8 keeps k_pe in bf16; a mixed "
        "assignment's spec of the layer)"},
       {"bits", ColType::I64, "bit", "bits of an element value of the stored format, metadata excluded"},
       {"scheme", ColType::Str, "", "sym, asym or none (the format descriptor)"},
       {"granularity", ColType::Str, "", "what a scale covers: tensor, channel, token, tile, block or element"},
       {"group_size", ColType::I64, "",
        "elements per scale group (0: the whole channel or token); a block or tile format's block"},
       {"scale_dtype", ColType::Str, "", "the dtype of the stored scales (fp16, fp32, e8m0, ...; none)"},
       {"bits_per_element", ColType::F64, "bit/element", "stored bits per element, scales and offsets included"},
       {"bytes_per_token_layer", ColType::F64, "byte/token",
        "stored bytes per token of this layer and target, metadata included"},
       {"rel_fro", ColType::F64, "1", "‖X̂ − X‖_F / ‖X‖_F over the layer's matrix, in the original basis"},
       {"mse", ColType::F64, "latent unit²", "mean over the elements of (X̂ − X)²"},
       {"sqnr_db", ColType::F64, "dB", "10·log10(‖X‖_F² / ‖X̂ − X‖_F²) (+inf for an exact reconstruction)"},
       {"max_abs_err", ColType::F64, "latent unit", "max |X̂ − X|"},
       {"cos_mean", ColType::F64, "1", "mean over tokens of cos(x̂_t, x_t)"},
       {"format", ColType::Str, "", "the format family from the format descriptor (int, bf16, fp8, mx, nvfp4, ...)"},
       {"scale_underflow_groups", ColType::I64, "",
        "groups with a non-zero range whose stored scale is 0 or subnormal in its dtype"},
       {"offset_rounding_groups", ColType::I64, "",
        "asymmetric groups whose stored offset is off the min by more than half a step"},
       {"saturated_values", ColType::I64, "", "elements clamped at the element format's max"},
       {"bound_rel_fro", ColType::F64, "1",
        "rel_fro of the Gaussian rate–distortion bound at the cell's rate (fit-split covariance; study/README.md)"},
       {"gap_db", ColType::F64, "dB", "10·log10(mse / mse_bound): the distance to that bound (may be negative)"},
       {"score_mse", ColType::F64, "score unit²",
        "mean over tokens of eᵀMe, the squared attention-score error of the latent error e (NaN without the "
        "layer's attention data)"},
       {"score_bound_mse", ColType::F64, "score unit²",
        "the Gaussian rate–distortion bound of score_mse at the cell's rate"},
       {"score_gap_db", ColType::F64, "dB", "10·log10(score_mse / score_bound_mse)"},
       {"transform", ColType::Str, "",
        "none, or the canonical transform before the quantizer (had, had64, rot-s3, klt, sklt)"},
       {"transform_seed", ColType::I64, "",
        "the seed of the Hadamard signs or the random rotation (0 for none, klt and sklt)"}}};
  return g;
}

const LatentSpectrum& SpectrumCache::get(const Dump& dump, int layer, Target target) {
  return get(dump, dump.layer(layer), target);
}

const LatentSpectrum& SpectrumCache::get(const Dump& dump, const Layer& l, Target target) {
  const std::lock_guard<std::mutex> lock(mutex_);
  return spectrum_locked(dump, l, target);
}

const ScoreSpectrum* SpectrumCache::score(const Dump& dump, const Layer& l, Target target) {
  if (!l.has_attention() || !is_latent_target(target)) return nullptr;  // the index score is no quadratic form
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto key = std::make_pair(l.index, static_cast<int>(target));
  if (auto it = scores_.find(key); it != scores_.end()) return &it->second;
  const DumpAttrs& A = dump.attrs;
  const int64_t Tq = l.num_query_rows();
  const Eigen::MatrixXd M = target == Target::CKV
                                ? score_metric(l.q_nope, l.w_uk, Tq, A.num_heads, A.qk_nope_head_dim, A.kv_lora_rank)
                                : score_metric(l.q_pe, {}, Tq, A.num_heads, A.qk_rope_head_dim, A.qk_rope_head_dim);
  return &scores_.emplace(key, score_spectrum(spectrum_locked(dump, l, target), M)).first->second;
}

const LatentSpectrum& SpectrumCache::spectrum_locked(const Dump& dump, const Layer& l, Target target) {
  const auto key = std::make_pair(l.index, static_cast<int>(target));
  if (auto it = spectra_.find(key); it != spectra_.end()) return it->second;
  const std::vector<int64_t>& offsets = l.row_offsets(target, dump.seq_offsets);
  return spectra_
      .emplace(key, latent_spectrum(l.rows(target).data(), offsets.back(), dump.attrs.width(target), offsets))
      .first->second;
}

ColumnTable run_latent_error(const Dump& dump, const std::vector<Cell>& cells, LatentBackend& backend,
                             const RunOptions& options, SpectrumCache* spectra) {
  return run_latent_error(
      dump, [&](int l) -> const Layer& { return dump.layer(l); }, cells, backend, options, spectra);
}

RotatedLatent rotate_latent(std::shared_ptr<const Rotation> r, const float* X, int64_t T, int64_t D) {
  RotatedLatent out;
  out.x.assign(X, X + T * D);
  r->forward(out.x.data(), T, D);
  out.rotation = std::move(r);
  return out;
}

namespace {

// The rotated inputs of the transformed cells: the caller's `rotated` when given, else each distinct
// (layer, target, transform) of `cells` fitted and rotated once, by the first of its cells to run
// (a failure surfaces in that cell).
class CellRotations {
 public:
  CellRotations(const Dump& dump, const std::vector<Cell>& cells, const RotatedLatents& rotated)
      : dump_(dump), rotated_(rotated) {
    if (!rotated_)
      for (const Cell& c : cells)
        if (c.quantizer.transform.kind != TransformKind::None) own_.try_emplace(key_of(c));
  }

  // The rotated [T, D] input X of cell c (a transformed cell) of layer l; thread-safe.
  std::shared_ptr<const RotatedLatent> get(const Cell& c, const Layer& l, const float* X, int64_t D) {
    if (rotated_) return rotated_(c.layer, c.target, c.quantizer.transform);
    const int64_t T = l.num_rows(c.target, dump_.seq_offsets);
    Own& o = own_.at(key_of(c));
    std::call_once(o.once, [&] {
      o.value = std::make_shared<const RotatedLatent>(rotate_latent(
          std::make_shared<const Rotation>(fit_layer_rotation(dump_, l, c.target, c.quantizer.transform)), X, T, D));
    });
    return o.value;
  }

 private:
  struct Own {
    std::once_flag once;
    std::shared_ptr<const RotatedLatent> value;
  };
  static std::string key_of(const Cell& c) {
    return fmt::format("{}/{}/{}", c.layer, to_string(c.target), c.quantizer.transform.to_string());
  }
  const Dump& dump_;
  const RotatedLatents& rotated_;
  std::map<std::string, Own> own_;
};

// Whether rows of `offsets` split into a fit and a held-out part (latentq/split.h), as the bound's spectrum needs.
bool splittable(const std::vector<int64_t>& offsets) {
  try {
    (void)probes::fit_heldout_split(offsets, offsets.back());
    return true;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

// An engine record `preset` on the [T, D] entry rows X of a DeepSeek-V4 cache: its c_kv part stores columns
// [0, D - dr), its k_pe part the last dr (their decoded columns written back in place into `decoded`); the bytes are
// the record's (with_record_pad: both parts and the record's zero pad), the diagnostics both parts'; `stored` is the
// c_kv part's format (the row's bulk). The applicability (native widths) is the caller's (why_not_applicable).
StoredCell run_entry_record(LatentBackend& backend, const QuantSpec& preset, const float* X, int64_t T, int64_t D,
                            int64_t dr, std::span<const int64_t> offsets, float* decoded) {
  const int64_t Dn = D - dr;
  std::vector<float> a(static_cast<size_t>(T * Dn)), b(static_cast<size_t>(T * dr)), da(a.size()), db(b.size());
  for (int64_t t = 0; t < T; ++t) {
    std::copy(X + t * D, X + t * D + Dn, a.begin() + t * Dn);
    std::copy(X + t * D + Dn, X + (t + 1) * D, b.begin() + t * dr);
  }
  const StoredCell sa = backend.run(preset, Target::CKV, a.data(), T, Dn, offsets, da.data());
  const StoredCell sb = backend.run(preset, Target::KPE, b.data(), T, dr, offsets, db.data());
  for (int64_t t = 0; t < T; ++t) {
    std::copy(da.begin() + t * Dn, da.begin() + (t + 1) * Dn, decoded + t * D);
    std::copy(db.begin() + t * dr, db.begin() + (t + 1) * dr, decoded + t * D + Dn);
  }
  StoredCell out;
  out.stored = sa.stored;
  out.accounting.bytes_per_token =
      with_record_pad(sa.accounting, preset, Target::CKV, Dn, dr).bytes_per_token + sb.accounting.bytes_per_token;
  out.accounting.bits_per_element = 8.0 * out.accounting.bytes_per_token / static_cast<double>(D);
  out.diagnostics = {sa.diagnostics.scale_underflow + sb.diagnostics.scale_underflow,
                     sa.diagnostics.offset_rounding + sb.diagnostics.offset_rounding,
                     sa.diagnostics.saturated + sb.diagnostics.saturated};
  return out;
}

// Rethrows the first failed cell's exception as std::invalid_argument naming the dump and the cell.
void rethrow_first_cell_error(const Dump& dump, const std::vector<Cell>& cells,
                              const std::vector<std::exception_ptr>& errors) {
  for (size_t i = 0; i < cells.size(); ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format("{}: cell {}: {}", dump.path.string(), cells[i].key(), e.what()));
    }
  }
}

// The /latent_error table (latent_error_spec()), one row per cell.
// A cell's score-space measure and bound (NaN without the layer's attention data).
struct ScoreError {
  double mse = std::numeric_limits<double>::quiet_NaN();
  double bound = std::numeric_limits<double>::quiet_NaN();
};

ColumnTable latent_error_table(const DumpAttrs& A, const std::vector<Cell>& cells,
                               const std::vector<CellResult>& results, const std::vector<RateDistortionBound>& bounds,
                               const std::vector<ScoreError>& scores) {
  ColumnTable t = empty_table(latent_error_spec());
  auto& layer = t.get<int64_t>("layer");
  auto& target = t.get<std::string>("target");
  auto& quantizer = t.get<std::string>("quantizer");
  auto& stored = t.get<std::string>("stored");
  auto& bits = t.get<int64_t>("bits");
  auto& scheme = t.get<std::string>("scheme");
  auto& granularity = t.get<std::string>("granularity");
  auto& group_size = t.get<int64_t>("group_size");
  auto& scale_dtype = t.get<std::string>("scale_dtype");
  auto& bpe = t.get<double>("bits_per_element");
  auto& bpt = t.get<double>("bytes_per_token_layer");
  auto& rel_fro = t.get<double>("rel_fro");
  auto& mse = t.get<double>("mse");
  auto& sqnr = t.get<double>("sqnr_db");
  auto& maxabs = t.get<double>("max_abs_err");
  auto& cos = t.get<double>("cos_mean");
  auto& family = t.get<std::string>("format");
  auto& underflow = t.get<int64_t>("scale_underflow_groups");
  auto& offround = t.get<int64_t>("offset_rounding_groups");
  auto& saturated = t.get<int64_t>("saturated_values");
  auto& bound_rel_fro = t.get<double>("bound_rel_fro");
  auto& gap = t.get<double>("gap_db");
  auto& score_mse = t.get<double>("score_mse");
  auto& score_bound = t.get<double>("score_bound_mse");
  auto& score_gap = t.get<double>("score_gap_db");
  auto& transform = t.get<std::string>("transform");
  auto& transform_seed = t.get<int64_t>("transform_seed");
  for (size_t i = 0; i < cells.size(); ++i) {
    const Cell& c = cells[i];
    const CellResult& r = results[i];
    const QuantSpec& s = r.stored;
    layer.push_back(c.layer);
    target.emplace_back(to_string(c.target));
    quantizer.push_back(c.quantizer.name);
    stored.push_back(s.to_string());
    bits.push_back(s.bits);
    scheme.emplace_back(scheme_of(s));
    granularity.emplace_back(granularity_of(s));
    // an engine record on a V4 entry: `s` is its c_kv part, head_dim - qk_rope_head_dim wide
    const int64_t width = c.quantizer.spec.format == Format::Preset && is_entry_target(c.target)
                              ? A.width(c.target) - A.qk_rope_head_dim
                              : A.width(c.target);
    group_size.push_back(s.format == Format::Int || s.format == Format::Fp8Tile ? s.group_size
                                                                                : layout(s, width).block);
    scale_dtype.emplace_back(scale_dtype_of(s));
    bpe.push_back(r.accounting.bits_per_element);
    bpt.push_back(r.accounting.bytes_per_token);
    rel_fro.push_back(r.metrics.rel_fro);
    mse.push_back(r.metrics.mse);
    sqnr.push_back(r.metrics.sqnr_db);
    maxabs.push_back(r.metrics.max_abs_err);
    cos.push_back(r.metrics.cos_mean);
    family.emplace_back(family_of(s));
    underflow.push_back(r.diagnostics.scale_underflow);
    offround.push_back(r.diagnostics.offset_rounding);
    saturated.push_back(r.diagnostics.saturated);
    bound_rel_fro.push_back(bounds[i].rel_fro);
    gap.push_back(gap_db(r.metrics.mse, bounds[i].mse_bound));
    score_mse.push_back(scores[i].mse);
    score_bound.push_back(scores[i].bound);
    score_gap.push_back(std::isnan(scores[i].mse) ? scores[i].mse : gap_db(scores[i].mse, scores[i].bound));
    const Transform& tr = c.quantizer.transform;
    transform.push_back(tr.kind == TransformKind::None ? "none" : tr.to_string());
    transform_seed.push_back(static_cast<int64_t>(tr.seed));
  }
  return t;
}

}  // namespace

ColumnTable run_latent_error(const Dump& dump, const std::function<const Layer&(int)>& layer_data,
                             const std::vector<Cell>& cells, LatentBackend& backend, const RunOptions& options,
                             SpectrumCache* spectra, const RotatedLatents& rotated) {
  SpectrumCache local;
  if (!spectra) spectra = &local;
  const size_t n = cells.size();
  std::vector<CellResult> results(n);
  std::vector<RateDistortionBound> bounds(n);
  std::vector<ScoreError> scores(n);
  const DumpAttrs& A = dump.attrs;
  // Resolve layer pointers up front (throws for a cell whose layer is not loaded).
  std::vector<const Layer*> layer_of(n);
  for (size_t i = 0; i < n; ++i) layer_of[i] = &layer_data(cells[i].layer);
  // The target's rows [R, D] and their per-sequence offsets (R = T, or a V4 layer's compressed entries N).
  auto input = [&](const Layer& l, Target target) {
    const std::vector<float>& x = l.rows(target);
    const int64_t R = l.num_rows(target, dump.seq_offsets);
    if (R == 0 || x.size() != static_cast<size_t>(R * A.width(target)))
      throw std::invalid_argument(fmt::format("{}: layer {} has no {} loaded ({} values, expected {} x {})",
                                              dump.path.string(), l.index, to_string(target), x.size(), R,
                                              A.width(target)));
    return x.data();
  };
  auto dim = [&](Target target) { return A.width(target); };
  CellRotations rotations(dump, cells, rotated);

  auto one = [&](size_t i) {
    const Cell& c = cells[i];
    const Layer& l = *layer_of[i];
    const float* X = input(l, c.target);
    const int64_t D = dim(c.target);
    const std::vector<int64_t>& offsets = l.row_offsets(c.target, dump.seq_offsets);
    const int64_t T = offsets.back();
    thread_local std::vector<float> decoded;  // [T, D], reused by the thread's cells (no page faults per cell)
    decoded.resize(static_cast<size_t>(T * D));
    StoredCell st;
    if (c.quantizer.spec.format == Format::Preset && is_entry_target(c.target)) {
      // An engine record on a V4 entry row: its c_kv part on the first D - d_r columns, its k_pe part on the last.
      st = run_entry_record(backend, c.quantizer.spec, X, T, D, A.qk_rope_head_dim, offsets, decoded.data());
    } else if (c.quantizer.transform.kind == TransformKind::None) {
      st = backend.run(c.quantizer.spec, c.target, X, T, D, offsets, decoded.data());
      st.accounting = with_record_pad(st.accounting, c.quantizer.spec, c.target, A.kv_lora_rank, A.qk_rope_head_dim);
    } else {
      // Transformed cell: quantize R·x, un-rotate the decoded rows, measure in the original basis. The
      // diagnostics and the accounting are those of the stored (rotated) matrix.
      const std::shared_ptr<const RotatedLatent> xr = rotations.get(c, l, X, D);
      st = backend.run(c.quantizer.spec, c.target, xr->x.data(), T, D, offsets, decoded.data());
      xr->rotation->inverse(decoded.data(), T, D);
      st.accounting = with_record_pad(st.accounting, c.quantizer.spec, c.target, A.kv_lora_rank, A.qk_rope_head_dim);
    }
    results[i] = {st.stored, st.accounting, error_metrics(X, decoded.data(), T, D), st.diagnostics};
    if (&offsets == &dump.seq_offsets || splittable(offsets))  // a V4 target of too few entries has no bound
      bounds[i] = rate_distortion_bound(spectra->get(dump, l, c.target), results[i].accounting.bits_per_element);
    if (const ScoreSpectrum* ss = spectra->score(dump, l, c.target))
      scores[i] = {score_mse(X, decoded.data(), T, D, ss->sqrt_metric),
                   score_bound_mse(*ss, results[i].accounting.bits_per_element)};
  };
  const std::vector<std::exception_ptr> errors =
      parallel_cells(n, backend.concurrent() ? options.threads : 1, one, options.progress);
  rethrow_first_cell_error(dump, cells, errors);
  return latent_error_table(A, cells, results, bounds, scores);
}

std::vector<std::string> latent_precision_warnings(const ColumnTable& le) {
  std::vector<std::string> out;
  if (!le.has("scale_underflow_groups")) return out;  // results of an older version
  const auto& q = le.get<std::string>("quantizer");
  const auto& tg = le.get<std::string>("target");
  const auto& uf = le.get<int64_t>("scale_underflow_groups");
  const auto& orr = le.get<int64_t>("offset_rounding_groups");
  const auto& sat = le.get<int64_t>("saturated_values");
  std::vector<std::string> order;
  std::map<std::string, std::array<int64_t, 3>> sum;
  std::map<std::string, std::set<std::string>> where;
  for (size_t i = 0; i < q.size(); ++i) {
    if (!uf[i] && !orr[i] && !sat[i]) continue;
    if (!sum.count(q[i])) order.push_back(q[i]);
    auto& s = sum[q[i]];
    s[0] += uf[i];
    s[1] += orr[i];
    s[2] += sat[i];
    where[q[i]].insert(tg[i]);
  }
  for (const std::string& name : order) {
    const auto& s = sum[name];
    std::vector<std::string> parts;
    if (s[0]) parts.push_back(fmt::format("{} groups whose scale underflowed to zero or subnormal", s[0]));
    if (s[1])
      parts.push_back(fmt::format("{} groups whose stored offset is off the min by more than half a step", s[1]));
    if (s[2]) parts.push_back(fmt::format("{} values saturated at the element format's max", s[2]));
    std::string targets;
    for (const std::string& t : where[name]) targets += (targets.empty() ? "" : ", ") + t;
    const bool int16 = name.starts_with("int") && name.find("-fp32") == std::string::npos;
    out.push_back(fmt::format("{} ({}): precision lost under its storage conventions: {}{}", name, targets,
                              fmt::join(parts, "; "),
                              int16 && (s[0] || s[1]) ? fmt::format("; try {}-fp32", name) : std::string()));
  }
  return out;
}

const GroupSpec& summary_spec() {
  static const GroupSpec g{
      "summary",
      {{"quantizer", ColType::Str, "", "the quantizer, as /latent_error names it"},
       {"mean_rel_fro_c_kv", ColType::F64, "1", "mean over layers of c_kv's rel_fro (NaN: not run on c_kv)"},
       {"max_rel_fro_c_kv", ColType::F64, "1", "max over layers of c_kv's rel_fro"},
       {"mean_rel_fro_k_pe", ColType::F64, "1", "mean over layers of k_pe's rel_fro (NaN: not run on k_pe)"},
       {"max_rel_fro_k_pe", ColType::F64, "1", "max over layers of k_pe's rel_fro"},
       {"bits_per_element", ColType::F64, "bit/element",
        "c_kv's bits per element, metadata included, mean over layers"},
       {"bytes_per_token_model", ColType::F64, "byte/token",
        "the cache of the whole model per token: all layers, c_kv + k_pe, metadata included (a target that did "
        "not run the quantizer counted as bf16)"},
       {"ratio_vs_bf16", ColType::F64, "1", "bytes_per_token_model / the bf16 cache's bytes per token"},
       {"c_kv_accounting", ColType::Str, "", "how c_kv's bytes are counted: measured, or bf16 (not run)"},
       {"k_pe_accounting", ColType::Str, "", "how k_pe's bytes are counted: measured, or bf16 (not run)"}}};
  return g;
}

ColumnTable summarize(const ColumnTable& le, const std::vector<Quantizer>& quantizers, const DumpAttrs& attrs,
                      const std::vector<NotApplicable>& not_applicable) {
  const auto& q = le.get<std::string>("quantizer");
  const auto& tg = le.get<std::string>("target");
  const auto& rf = le.get<double>("rel_fro");
  const auto& bpe = le.get<double>("bits_per_element");
  const auto& bpt = le.get<double>("bytes_per_token_layer");
  const double L = static_cast<double>(attrs.num_layers);
  const double bf16_ckv = 2.0 * static_cast<double>(attrs.kv_lora_rank);
  const double bf16_kpe = 2.0 * static_cast<double>(attrs.qk_rope_head_dim);
  const double bf16_model = static_cast<double>(attrs.bf16_bytes_per_token());
  const double nan = std::numeric_limits<double>::quiet_NaN();

  ColumnTable t = empty_table(summary_spec());
  auto& name = t.get<std::string>("quantizer");
  auto& mean_c = t.get<double>("mean_rel_fro_c_kv");
  auto& max_c = t.get<double>("max_rel_fro_c_kv");
  auto& mean_k = t.get<double>("mean_rel_fro_k_pe");
  auto& max_k = t.get<double>("max_rel_fro_k_pe");
  auto& bits = t.get<double>("bits_per_element");
  auto& bytes = t.get<double>("bytes_per_token_model");
  auto& ratio = t.get<double>("ratio_vs_bf16");
  auto& acc_c = t.get<std::string>("c_kv_accounting");
  auto& acc_k = t.get<std::string>("k_pe_accounting");
  if (attrs.v4()) {  // no c_kv + k_pe: /v4_cache has the entries' bytes
    for (const Quantizer& qu : quantizers)
      add_row(t, {qu.name, nan, nan, nan, nan, nan, nan, nan, std::string(kV4SummaryNotApplicable),
                  std::string(kV4SummaryNotApplicable)});
    return t;
  }
  for (const Quantizer& qu : quantizers) {
    std::vector<double> rf_c, rf_k, bpe_c, bpt_c, bpt_k;
    for (size_t i = 0; i < q.size(); ++i) {
      if (q[i] != qu.name) continue;
      if (tg[i] == "c_kv") {
        rf_c.push_back(rf[i]);
        bpe_c.push_back(bpe[i]);
        bpt_c.push_back(bpt[i]);
      } else if (tg[i] == "k_pe") {  // index_k rows (sparse MLA's indexer cache) are not the latent cache's
        rf_k.push_back(rf[i]);
        bpt_k.push_back(bpt[i]);
      }
    }
    name.push_back(qu.name);
    mean_c.push_back(mean_of(rf_c));
    max_c.push_back(max_of(rf_c));
    mean_k.push_back(mean_of(rf_k));
    max_k.push_back(max_of(rf_k));
    bits.push_back(bpe_c.empty() ? nan : mean_of(bpe_c));
    const double b = L * ((bpt_c.empty() ? bf16_ckv : mean_of(bpt_c)) + (bpt_k.empty() ? bf16_kpe : mean_of(bpt_k)));
    bytes.push_back(b);
    ratio.push_back(b / bf16_model);
    const auto accounting = [&](const std::vector<double>& b, Target t) -> std::string {
      if (!b.empty()) return "measured";
      const bool na = std::any_of(not_applicable.begin(), not_applicable.end(),
                                  [&](const NotApplicable& n) { return n.quantizer == qu.name && n.target == t; });
      return na ? kNotApplicableAccounting : "bf16 (not run)";
    };
    acc_c.push_back(accounting(bpt_c, Target::CKV));
    acc_k.push_back(accounting(bpt_k, Target::KPE));
  }
  return t;
}

Attrs study_attrs(const StudyConfig& config, const Dump& dump, const std::string& sha, const std::string& device) {
  std::vector<int> layers;
  for (const Layer& l : dump.layers) layers.push_back(l.index);
  std::vector<std::string> targets;
  for (const TargetPlan& p : config.targets) targets.emplace_back(to_string(p.target));
  const DumpAttrs& A = dump.attrs;
  Attrs a = {
      {"created", utc_now_iso8601()},
      {"latentq_version", std::string(version())},
      {"git_commit", std::string(git_commit())},
      {"code_sha256", executable_sha256()},  // the code of the cells (latentq/provenance.h)
      {"config", config.text},
      {"config_source", config.source},
      {"config_dir", std::filesystem::absolute(config.base_dir).lexically_normal().string()},
      {"input_path", std::filesystem::absolute(config.dump).lexically_normal().string()},
      {"input_sha256", sha},
      {"input_revision", A.revision},
      {"input_source", A.source},  // the kind of checkpoint the dump came from (tiny-mla: a TinyMLA directory)
      {"model", A.model},
      {"num_layers", A.num_layers},
      {"kv_lora_rank", A.kv_lora_rank},
      {"qk_rope_head_dim", A.qk_rope_head_dim},
      {"layers", fmt::format("{}", fmt::join(layers, ","))},
      {"targets", fmt::format("{}", fmt::join(targets, ","))},
      {"device", device},
      {"blas", probes::blas_backend()},  // the probes' GEMMs: their last bits depend on its CPU kernel
  };
  if (A.cache_family != kCacheFamilies[0].name) {  // sparse MLA, DeepSeek-V4: the indexer's width, for /summary
    a.push_back({"cache_family", A.cache_family});     // and /not_applicable (dump_attrs_from_results)
    a.push_back({"index_head_dim", A.index_head_dim});
  }
  if (A.v4()) {  // what /summary and /not_applicable need of a DeepSeek-V4 dump
    a.push_back({"head_dim", A.head_dim});
    a.push_back({"v4_layers", v4_layer_records(dump)});
    if (!A.entry_split_problem.empty()) a.push_back({"v4_entry_split_problem", A.entry_split_problem});
  }
  return a;
}

std::string format_summary(const ColumnTable& s, const DumpAttrs& attrs) {
  if (attrs.v4())
    return fmt::format("{}: {} layers, {}: /summary {}; /latent_error has its window_kv, compressed_kv and index_k "
                       "rows, /v4_cache their bytes\n",
                       attrs.model, attrs.num_layers, attrs.cache_family, kV4SummaryNotApplicable);
  const auto& name = s.get<std::string>("quantizer");
  const auto& mc = s.get<double>("mean_rel_fro_c_kv");
  const auto& xc = s.get<double>("max_rel_fro_c_kv");
  const auto& mk = s.get<double>("mean_rel_fro_k_pe");
  const auto& xk = s.get<double>("max_rel_fro_k_pe");
  const auto& bits = s.get<double>("bits_per_element");
  const auto& bytes = s.get<double>("bytes_per_token_model");
  const auto& ratio = s.get<double>("ratio_vs_bf16");
  const auto& acc_c = s.get<std::string>("c_kv_accounting");
  const auto& acc_k = s.get<std::string>("k_pe_accounting");
  std::vector<size_t> order(name.size());
  std::iota(order.begin(), order.end(), 0);
  auto key = [](double x) { return std::isnan(x) ? std::numeric_limits<double>::infinity() : x; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (bytes[a] != bytes[b]) return bytes[a] < bytes[b];
    return key(mc[a]) < key(mc[b]);
  });
  auto num = [](double x, int prec) { return std::isnan(x) ? std::string("-") : fmt::format("{:.{}f}", x, prec); };
  auto sci = [](double x) { return std::isnan(x) ? std::string("-") : fmt::format("{:.3e}", x); };
  size_t w = 9;
  for (const auto& n : name) w = std::max(w, n.size() + 1);
  std::string out;
  out += fmt::format("{}: {} layers, c_kv [T, {}] + k_pe [T, {}]; bf16 = {} bytes/token (whole model)\n", attrs.model,
                     attrs.num_layers, attrs.kv_lora_rank, attrs.qk_rope_head_dim,
                     attrs.bf16_bytes_per_token());
  out += fmt::format("{:<{}} {:>9} {:>11} {:>8} {:>10} {:>10} {:>10} {:>10}\n", "quantizer", w, "bits/elem",
                     "bytes/token", "vs bf16", "c_kv mean", "c_kv max", "k_pe mean", "k_pe max");
  out += fmt::format("{:<{}} {:>9} {:>11} {:>8} {:>21} {:>21}\n", "", w, "(c_kv)", "(model)", "", "rel_fro", "rel_fro");
  bool assumed = false, inapplicable = false;
  for (size_t i : order) {
    const bool na = acc_c[i] == kNotApplicableAccounting || acc_k[i] == kNotApplicableAccounting;
    const bool a = !na && (acc_c[i] != "measured" || acc_k[i] != "measured");
    assumed = assumed || a;
    inapplicable = inapplicable || na;
    out += fmt::format("{:<{}} {:>9} {:>11} {:>8} {:>10} {:>10} {:>10} {:>10}{}\n", name[i], w, num(bits[i], 3),
                       num(bytes[i], 1), num(ratio[i], 3), sci(mc[i]), sci(xc[i]), sci(mk[i]), sci(xk[i]),
                       na ? " +" : a ? " *" : "");
  }
  if (assumed) out += "* a target that did not run this quantizer is counted as bf16\n";
  if (inapplicable)
    out += "+ a target whose width the format cannot take (not applicable, /not_applicable) is counted as bf16\n";
  out += "rel_fro = ||X_hat - X||_F / ||X||_F per layer; mean/max over layers. vs bf16 = bytes / bf16 bytes.\n";
  return out;
}

}  // namespace latentq
