// latentq/study.h — the latent-error study: every (layer, target, quantizer) cell of a config is
// quantized and dequantized (latentq/quantize.h, with the dump's seq_offsets), compared with the
// original (latentq/metrics.h) and accounted (account()).
//
// Cells have stable string keys "<layer:03d>/<target>/<quantizer>/<group>", e.g.
// "003/c_kv/int4-asym-channel-g32/latent_error", so later groups (svd, attention_error, e2e ...)
// and resumed or sharded runs can name the same cell. Results are ColumnTables written by
// latentq/results.h; row order is the cell order (layer, then target in config order, then
// quantizer in config order), independent of the thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "latentq/applicable.h"
#include "latentq/config.h"
#include "latentq/dump.h"
#include "latentq/metrics.h"
#include "latentq/attention/device_seam.h"
#include "latentq/quantize.h"
#include "latentq/analysis/rate_distortion.h"
#include "latentq/results.h"
#include "latentq/table.h"
#include "latentq/transform.h"

namespace latentq {

/// One (layer, target, quantizer) cell.
struct Cell {
  int layer = 0;
  Target target = Target::CKV;
  Quantizer quantizer;
  /// "<layer:03d>/<target>/<quantizer>/<group>", e.g. "003/c_kv/int8-sym-tensor/latent_error".
  std::string key(std::string_view group = "latent_error") const;
};

/// DeepSeek-V4's entry caches as the study quantizes them: window_kv and compressed_kv, each with the quantizers of
/// config's c_kv target (the first [input] target's when c_kv is not studied). Plain formats store the whole
/// head_dim row; an engine record its c_kv part on the first head_dim - qk_rope_head_dim columns and its k_pe part on
/// the last (latentq/applicable.h says where its native widths do not match).
std::vector<TargetPlan> v4_entry_targets(const StudyConfig& config);

/// The targets whose /latent_error cells a study plans, with their quantizers: config.targets ([input] targets x
/// the study's quantizers; on a DeepSeek-V4 dump, which caches no c_kv + k_pe, v4_entry_targets() instead), then
/// each registered probe's latent_targets() (e.g. [indexer]'s formats on index_k of a sparse MLA dump or of V4's
/// CSA layers, latentq/probe_registry.h).
std::vector<TargetPlan> latent_error_targets(const StudyConfig& config, const DumpAttrs& attrs);

/// The cells of `config` over the loaded layers of `dump`: layer-major, then target in latent_error_targets()
/// order, then the target's quantizers in order; none of a layer that does not hold the target (Dump::holds: a
/// sparse layer without an indexer of its own) and none of a (quantizer, target) pair whose format cannot take the
/// target's width (latentq/applicable.h: the study lists it in /not_applicable).
std::vector<Cell> plan_cells(const StudyConfig& config, const Dump& dump);

/// What one cell measures.
struct CellResult {
  QuantSpec stored;              ///< the format actually stored (QuantSpec::stored_for)
  Accounting accounting;         ///< bits per element, bytes per token (one layer, one target), metadata included
  ErrorMetrics metrics;          ///< of the dequantized matrix against the original
  QuantDiagnostics diagnostics;  ///< precision lost silently under the format's conventions (diagnose())
};

/// What a backend stores for one cell: CellResult without the error, which run_latent_error measures
/// from the decoded matrix in the original basis (one error_metrics() per cell, on either backend).
struct StoredCell {
  QuantSpec stored;              ///< the format actually stored (QuantSpec::stored_for)
  Accounting accounting;         ///< account() of the stored tensor
  QuantDiagnostics diagnostics;  ///< diagnose() of the stored tensor against its input
};

/// Where cells are computed. The CPU backend is the reference (quantize_dequantize + account +
/// diagnose); a CUDA backend must give the same numbers (codes byte-identical).
class LatentBackend {
 public:
  virtual ~LatentBackend() = default;
  virtual std::string name() const = 0;
  /// True if run() may be called from several threads at once.
  virtual bool concurrent() const = 0;
  /// Quantize X [T, D] (row-major float32) as `spec` for `target` with sequence boundaries
  /// seq_offsets [S+1] and dequantize into `decoded` [T, D] (row-major float32, not overlapping X).
  /// Throws std::invalid_argument as quantize().
  virtual StoredCell run(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                         std::span<const int64_t> seq_offsets, float* decoded) = 0;
  /// Where the attention probes evaluate /attention_error (probes::AbsorbedAttention::attach_device); empty
  /// (the default, and the CPU backend): the CPU.
  virtual probes::AttentionDeviceFactory attention_device() const { return {}; }
};

/// One layer's c_kv or k_pe rotated by a transform's fitted rotation (latentq/transform.h): the input of
/// every latent cell that quantizes behind that transform, made once per (layer, target, transform).
struct RotatedLatent {
  std::shared_ptr<const Rotation> rotation;  ///< probes::fit_rotation of the layer's target (not identity)
  std::vector<float> x;                      ///< [T, D] row-major float32: each row rotated forward, R·x
};
/// (layer, target, transform) → its RotatedLatent; called from the cells' threads, so it must be
/// thread-safe. The batch runner shares one per layer while the layer is held (LayerAccess::shared).
using RotatedLatents =
    std::function<std::shared_ptr<const RotatedLatent>(int layer, Target target, const Transform& t)>;
/// The RotatedLatent of X [T, D] (row-major float32; the layer's target) under transform t with its
/// rotation r (fit_rotation's): r and a rotated copy of X. Throws as Rotation::forward.
RotatedLatent rotate_latent(std::shared_ptr<const Rotation> r, const float* X, int64_t T, int64_t D);

/// The CPU reference backend (thread-safe).
std::unique_ptr<LatentBackend> make_cpu_backend();
/// The CUDA backend: the GPU path's hook. A build without it (LATENTQ_CUDA=OFF, or no
/// study/device/backend_cuda.cpp) throws std::runtime_error saying so; a CUDA build throws
/// std::runtime_error when no GPU is present.
std::unique_ptr<LatentBackend> make_cuda_backend();
/// The devices of this build, for `latentq --version` (defined next to make_cuda_backend): "cpu (no CUDA
/// backend in this build)", or "cpu, cuda (" + cuda_attention_build() + ")" (latentq/attention_device_cuda.h).
std::string device_build_info();
/// "cpu" or "cuda"; throws std::invalid_argument for another name, and as make_cuda_backend().
std::unique_ptr<LatentBackend> make_backend(std::string_view device);

struct RunOptions {
  int threads = 0;  ///< worker threads; 0 = std::thread::hardware_concurrency()
  /// Called from the calling thread about every 100 ms and once at the end with (cells done, total).
  std::function<void(size_t, size_t)> progress;
};

/// One warning line per quantizer of /latent_error `le` with any scale underflow, offset rounding or
/// saturation (columns scale_underflow_groups, offset_rounding_groups, saturated_values), naming the
/// counts, the targets and, for fp16-scaled integer specs, the -fp32 variant. Empty if none.
std::vector<std::string> latent_precision_warnings(const ColumnTable& le);

/// The fit-split spectra of a dump's matrices (latent_spectrum()), computed once per (layer, target)
/// on first use; thread-safe. The /latent_error bound columns read them.
class SpectrumCache {
 public:
  /// Throws as latent_spectrum() and Dump::layer().
  const LatentSpectrum& get(const Dump& dump, int layer, Target target);
  /// The same for the data `layer` of a layer of `dump` (whose header gives T, dims, seq_offsets).
  const LatentSpectrum& get(const Dump& dump, const Layer& layer, Target target);
  /// The score-space spectrum of the same matrix: score_spectrum() of get()'s spectrum under the layer's
  /// score_metric() (c_kv: q_nope and W_UK; k_pe: q_pe), or nullptr when `layer` has no attention data
  /// loaded (not cached: a later call with the data computes it). Throws as get() and score_metric().
  const ScoreSpectrum* score(const Dump& dump, const Layer& layer, Target target);

 private:
  const LatentSpectrum& spectrum_locked(const Dump& dump, const Layer& layer, Target target);
  std::mutex mutex_;
  std::map<std::pair<int, int>, LatentSpectrum> spectra_;
  std::map<std::pair<int, int>, ScoreSpectrum> scores_;
};

/// The /latent_error group: its columns with their dtypes, units and definitions (study.cpp).
const GroupSpec& latent_error_spec();

/// Run the cells and return the /latent_error table (latent_error_spec()), one row per cell in `cells` order;
/// the Gaussian rate–distortion bound at the cell's bits_per_element and its score-space counterpart from
/// latentq/analysis/rate_distortion.h (score columns NaN when the layer's attention data is not loaded).
/// `spectra` caches the fit-split spectra across calls (a local cache when null).
/// The columns describe the stored format (a preset's rows say what it stores for that target, e.g. bf16 for
/// flashmla-v32-fp8 on k_pe). Throws std::invalid_argument naming the cell (key) when a cell fails (e.g. a scale that
/// overflows fp16); with several failures, the first in cell order.
ColumnTable run_latent_error(const Dump& dump, const std::vector<Cell>& cells, LatentBackend& backend,
                             const RunOptions& options = {}, SpectrumCache* spectra = nullptr);
/// The same with the layers' data from `layer_data` (a layer index → its data) and the header from
/// `dump` (T, dims, seq_offsets, path): the batch runner's cells read streamed layers this way. A
/// transformed cell quantizes `rotated`'s matrix for its (layer, target, transform); an empty `rotated`
/// fits and rotates once per distinct (layer, target, transform) of `cells` in this call.
ColumnTable run_latent_error(const Dump& dump, const std::function<const Layer&(int)>& layer_data,
                             const std::vector<Cell>& cells, LatentBackend& backend, const RunOptions& options = {},
                             SpectrumCache* spectra = nullptr, const RotatedLatents& rotated = {});

/// The /summary group: its columns with their dtypes, units and definitions (study.cpp).
const GroupSpec& summary_spec();

/// One row per quantizer (in `quantizers` order) from a /latent_error table:
///   quantizer; mean_rel_fro_c_kv, max_rel_fro_c_kv, mean_rel_fro_k_pe, max_rel_fro_k_pe (over
///   layers; NaN when that target did not run the quantizer); bits_per_element (c_kv, NaN if not
///   run); bytes_per_token_model = num_layers · (c_kv + k_pe bytes per token and layer, averaged
///   over the studied layers), a target that did not run the quantizer counted as bf16;
///   ratio_vs_bf16 = bytes_per_token_model / (num_layers · (kv_lora_rank + qk_rope_head_dim) · 2);
///   c_kv_accounting, k_pe_accounting: "measured", "bf16 (not run)", or kNotApplicableAccounting for a
///   pair of `not_applicable` (its format cannot take the target's width: latentq/applicable.h; also
///   counted as bf16, and so marked).
ColumnTable summarize(const ColumnTable& latent_error, const std::vector<Quantizer>& quantizers,
                      const DumpAttrs& attrs, const std::vector<NotApplicable>& not_applicable = {});

/// The /score_vs_attention group: its columns with their dtypes, units and definitions.
const GroupSpec& score_vs_attention_spec();

/// The /score_vs_attention table: Spearman's ρ (average ranks for ties, latentq/analysis/rank_correlation.h)
/// across quantizers between each /latent_error metric and the kl_mean of the /attention_error row of the
/// same layer and quantizer that quantizes that target alone (targets = "c_kv" or "k_pe"). Per target
/// (/latent_error order): one row per layer (ascending), then layer −1 (the quantizers present on every
/// listed layer of the target, each with its means over those layers of the metrics, kl_mean and
/// bits_per_element), then layer −1 once per bits band k with at least 3 of those quantizers (mean
/// bits_per_element in [k, k + 1): the quantizers of about the same bytes). Columns: score_vs_attention_spec()
/// (rho NaN for fewer than 2 quantizers or a constant side). A target without any such pair has no rows.
/// Throws std::invalid_argument when `latent_error` lacks layer/target/quantizer/bits_per_element/mse/
/// score_mse or `attention_error` lacks layer/targets/quantizer/kl_mean.
ColumnTable score_vs_attention(const ColumnTable& latent_error, const ColumnTable& attention_error);

/// The root attributes of a results file of `config` run on `dump` (loaded from config.dump, whose
/// SHA-256 is `input_sha256`) on `device`: created, latentq_version, git_commit, config, config_source,
/// config_dir (the directory the config's relative paths resolve against), input_path, input_sha256,
/// input_revision, model, num_layers, kv_lora_rank, qk_rope_head_dim, layers, targets, device, blas (the
/// BLAS library and CPU kernel of the probes' GEMMs, probes::blas_backend()).
Attrs study_attrs(const StudyConfig& config, const Dump& dump, const std::string& input_sha256,
                  const std::string& device);

/// A paper-style summary table of a /summary table (fmt), sorted by bytes per token, then by mean
/// c_kv rel_fro. A DeepSeek-V4 dump: one line saying /summary is not applicable (kV4SummaryNotApplicable).
std::string format_summary(const ColumnTable& summary, const DumpAttrs& attrs);

// ---- DeepSeek-V4 ----------------------------------------------------------------------------------------------

/// /summary's c_kv_accounting / k_pe_accounting on a DeepSeek-V4 dump, whose cache holds no c_kv + k_pe: every
/// c_kv / k_pe column NaN. The decision and the planner, which budget the MLA latent cache, refuse such a file with
/// the same words.
inline constexpr const char* kV4SummaryNotApplicable = "not applicable to deepseek_v4 (no c_kv + k_pe)";

/// One studied layer of a DeepSeek-V4 study, as the root attribute v4_layers records it ("1:csa:4:128").
struct V4LayerInfo {
  int layer = 0;
  std::string layer_type;  ///< sliding, csa or hca
  int64_t compress_rate = 0, sliding_window = 0;
};
/// The root attribute v4_layers of a study of `dump` (its loaded layers): "layer:type:compress_rate:sliding_window".
std::vector<std::string> v4_layer_records(const Dump& dump);
/// Parses v4_layer_records(); throws std::invalid_argument naming a malformed record.
std::vector<V4LayerInfo> parse_v4_layer_records(const std::vector<std::string>& records);

/// The /v4_cache group (derived, DeepSeek-V4 studies only): its columns (v4_cache.cpp).
const GroupSpec& v4_cache_spec();
/// One row per (quantizer, target, layer type) of the window_kv, compressed_kv and index_k rows of `latent_error`,
/// first-seen order: bytes per stored row (the one accounting: /latent_error's bytes_per_token_layer, per row),
/// rows per token at long context (1/compress_rate for compressed_kv and index_k), bytes per token of context
/// (compressed caches) and per sequence (window_kv: sliding_window entries), mean rel_fro. Throws
/// std::invalid_argument for a row whose layer `layers` lacks.
ColumnTable v4_cache_table(const ColumnTable& latent_error, const std::vector<V4LayerInfo>& layers);
/// The printed form of a /v4_cache table.
std::string format_v4_cache(const ColumnTable& v4_cache);

}  // namespace latentq
