// latentq/synth.h — synthetic latentq-dump/1 files with the shape of a real MLA model (`latentq synth`).
//
// The dims of each preset are the model's config.json (the table in synth.cpp cites where each was read;
// the models' Hugging Face repositories for the four real ones). The values are a model of what a real
// c_kv / k_pe looks like, not a measurement. c_kv has two models (LatentModel):
//
//   kStandin (deepseek-v2-lite, deepseek-v3, glm-4.7-flash, minicpm3-4b): StandinModel below, fitted so
//     that latentq's own study on a deepseek-v2-lite dump gives DeepSeek-V2-Lite's published c_kv
//     numbers (int8 per-tensor and per-channel rel_fro, SVD-256 held-out, int4 sym / asym and int2 asym
//     per channel; docs/latents.md, "The calibrated stand-in"): a sink channel, spike channels (offset,
//     bursty, heavy-tailed spikes) and a white bulk, RMS-normalized.
//   kLowRank (tiny-mla): the shape of tiny-mla's own dump,
//     c_kv[t] = γ ⊙ x_t / rms(x_t),  x_t = V · diag(σ) · z_t          (kv_a_layernorm: RMSNorm, eps 1e-6)
//     σ_i   = exp(−i / τ), τ = kv_lora_rank / 16: 99% of the energy of x in the first ≈ 0.14·kv_lora_rank
//             directions (tiny-mla's dump has 99% in 18–26 of 128); V a seeded Haar basis per layer;
//     z_t   = AR(1) over the tokens of one sequence, ρ = 0.8, N(0, 1) stationary (never across sequences)
//     γ     = exp(0.25·N(0,1)) per channel, and max(2, r/128) channels ×8 … ×24 (outliers)
//
//   k_pe[t] = RoPE(pos_t, k_t),  k_t = m + s ⊙ z'_t: per-pair mean m and scale s (larger on the slow,
//             high-index frequencies), z'_t AR(1) as above; RoPE with the preset's θ and rope_layout
//   q_nope, q_pe (RoPE at the query's position) ~ N(0, 1); W_UK ~ N(0, 1/qk_nope_head_dim),
//   W_UV ~ N(0, 1/kv_lora_rank), so q_lat = q_nope·W_UK has unit-variance entries; the stand-in folds γ
//   out of W_UK and W_UV and gives the queries a per-head sink component (StandinModel)
//   attn_out = the absorbed attention of data/README.md ("Attention from the dump") on these latents,
//             computed in float64 (latentq/attention/attention.h) and rounded once to float32: the dump's
//             /attention_check passes (its float32 recomputation: rel_fro ~1e-6).
//
// Every layer is a pure function of (seed, layer): synth_layer() needs no other layer, and
// write_synth_dump() generates, writes and frees one layer at a time into chunked datasets, so its
// memory is one layer's arrays (a DeepSeek-V3-shaped layer at 8,192 tokens: c_kv 16 MiB, W_UK + W_UV
// 64 MiB), never the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace latentq {

/// Which generative model draws a preset's c_kv (the rest of the layer is common to both).
enum class LatentModel {
  kLowRank,  ///< tiny-mla's shape: a decaying spectrum (τ = r/16) with a few γ outliers
  kStandin,  ///< the stand-in calibrated to DeepSeek-V2-Lite's measured latents (StandinModel)
};

/// The MLA shape of a model, as in its config.json.
struct ModelShape {
  std::string name;              ///< preset name, e.g. "deepseek-v3"
  std::string model;             ///< the checkpoint, e.g. "deepseek-ai/DeepSeek-V3"
  int64_t num_layers = 0;        ///< num_hidden_layers (MLA layers)
  int64_t num_heads = 0;         ///< num_attention_heads
  int64_t kv_lora_rank = 0;      ///< r: c_kv width
  int64_t qk_rope_head_dim = 0;  ///< k_pe / q_pe width (even)
  int64_t qk_nope_head_dim = 0;  ///< q_nope width per head
  int64_t v_head_dim = 0;        ///< value width per head
  double rope_theta = 0;         ///< RoPE base θ (frequencies θ^(−2i/d_r), i = 0 .. d_r/2 − 1)
  std::string rope_layout;       ///< "interleaved" (pairs 2i, 2i+1) or "half" (pairs i, i + d_r/2)
  double softmax_scale = 0;      ///< the scale the model applies (qk_head_dim^(−1/2)·mscale², see synth.cpp)
  int64_t vocab_size = 0;        ///< token ids of the synthetic /tokens are drawn in [0, vocab_size)
  std::string source;            ///< where the numbers were read
  LatentModel latent = LatentModel::kStandin;  ///< the c_kv model
  /// Sparse MLA (DeepSeek Sparse Attention): the indexer's heads, width and top-k (0: dense MLA). A sparse preset's
  /// dump is a sparse_mla one: per layer the indexer's key cache, queries and head weights drawn N(0, 1)
  /// (shape-faithful, not calibrated: no real indexer statistics are known here), the selection they make
  /// (latentq/attention/dsa.h) and attn_out over it.
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  bool sparse() const { return index_topk > 0; }
};

/// The parameters of the stand-in c_kv model (docs/latents.md, "The calibrated stand-in", gives each
/// value, the calibration row it was fitted to and what it does not model). Per layer ℓ, r = kv_lora_rank:
///   γ: exp(gamma_sigma·N(0,1)) per channel; one sink channel with gain sink_gain (sink_layer_gain in a
///      sink layer, ℓ mod sink_layer_period = 1); K = standin_spike_channels(r) spike channels with gains
///      log-uniform in [spike_gain_lo, spike_gain_hi]; the channels and one sign per outlier channel are
///      seeded per layer;
///   x_t = z_t, z AR(1) over the tokens of one sequence (rho), white: every direction has the same variance;
///      on a spike channel k, x_t[k] = z_t[k] + μ_k + b_t[k]: an offset μ_k ~ N(0, spike_offset_sigma²) (the
///      channel is not centered on 0) and a burst b_t[k] = ±burst_magnitude (random sign) with probability
///      burst_rate, none in a sink layer (a 32-token group holds 2 on average: its range is several times its
///      spread); the sink and spike channels are dormant on ordinary tokens (there x = (z + μ + b) / γ, so
///      γ·x̂ is of ordinary size);
///   spike: token t adds sign·m_t·‖x_t‖ to one spike channel (uniform), m_t = spike_scale·(U^(−1/spike_tail) − 1),
///      U ~ U(0, 1] (Lomax: heavy-tailed per-token magnitudes); none in a sink layer;
///   sink: the first token of each sequence adds sign·sink_magnitude·‖x_t‖ to the sink channel;
///   c_kv[t] = γ ⊙ x_t / rms(x_t) (kv_a_layernorm, eps 1e-6).
/// Weights and queries: W_UK·diag(γ) ~ N(0, 1/d_n), W_UV·diag(γ) ~ N(0, 1/r) (the up-projections undo
/// the gain, so scores and values read x̂ = x / rms(x)); per head h the query's component on the sink
/// channel gains β_h ~ U[0, 2·query_sink_bias], which raises the sink's score by softmax_scale·β_h·√r.
struct StandinModel {
  double gamma_sigma = 0.2;            ///< σ of ln γ on the ordinary channels
  double spike_channel_frac = 0.1875;  ///< K = round(frac·r) spike channels (96 of 512)
  double spike_gain_lo = 2.0;          ///< γ of the spike channels: log-uniform in [lo, hi]
  double spike_gain_hi = 7.5;
  double spike_scale = 0.12;      ///< Lomax scale of the spike magnitude m_t (relative to ‖x_t‖)
  double spike_tail = 1.0;        ///< Lomax tail index: P(m > y) = (1 + y/scale)^(−tail)
  double sink_gain = 4.0;         ///< γ of the sink channel in an ordinary layer
  double sink_layer_gain = 28.0;  ///< γ of the sink channel in a sink layer
  int64_t sink_layer_period = 4;  ///< layers ℓ with ℓ mod period = 1 are sink layers (1, 5, 9, ...)
  double sink_magnitude = 50.0;   ///< the sink's m: its row is 99.98% one channel
  double rho = 0.8;               ///< AR(1) coefficient of the bulk over the tokens of a sequence
  double query_sink_bias = 3.0;   ///< mean β_h: the sink's score rises by softmax_scale·β_h·√r

  // What a spike channel's 32-token groups look like between spikes (the low-bit rows; docs/latents.md).
  double spike_offset_sigma = 1.3;  ///< σ of a spike channel's offset μ_k (units of z, the channel's own spread)
  double burst_rate = 0.0625;       ///< P(burst) per token and spike channel: 2 per group of 32 tokens on average
  double burst_magnitude = 10.0;    ///< a burst adds ±burst_magnitude (random sign, units of z)
};

/// The stand-in's parameters (one definition, used by synth_layer and the tests).
const StandinModel& standin_model();

/// Whether layer ℓ of a stand-in dump is a sink layer (ℓ mod sink_layer_period == 1).
bool is_standin_sink_layer(int64_t layer);

/// K, the stand-in's spike channels for kv_lora_rank r: round(spike_channel_frac·r), at most r − 1.
int64_t standin_spike_channels(int64_t r);

/// The MLA presets (DeepSeek-V4's: latentq/synth_v4.h): tiny-mla, deepseek-v2-lite, deepseek-v3, glm-4.7-flash,
/// minicpm3-4b, deepseek-v3.2, glm-5, each with the dims of the
/// config.json it names (ModelShape::source) and nothing more.
const std::vector<ModelShape>& model_presets();

/// The preset called `name`; throws std::invalid_argument naming it and listing the presets.
const ModelShape& find_preset(const std::string& name);

/// What to write. seq_lens empty: `seqs` sequences of `seq_len` tokens each.
struct SynthOptions {
  ModelShape shape;               ///< usually find_preset(...); num_layers may be overridden
  int64_t seqs = 2;               ///< S ≥ 1
  int64_t seq_len = 512;          ///< tokens per sequence ≥ 1
  std::vector<int64_t> seq_lens;  ///< explicit lengths (overrides seqs × seq_len when not empty)
  int64_t query_rows = 32;        ///< Tq per layer, 1 ≤ Tq ≤ T, chosen by the dump's query-row rule
  uint64_t seed = 0;
};

/// The token-level arrays shared by all layers (as in the file).
struct SynthTokens {
  std::vector<int64_t> seq_offsets;  ///< [S+1]
  std::vector<int32_t> tokens;       ///< [T]
  std::vector<int32_t> positions;    ///< [T] position in its sequence
  std::vector<int32_t> q_rows;       ///< [Tq] the query-row rule of data/README.md (sorted)
  int64_t num_tokens() const { return seq_offsets.empty() ? 0 : seq_offsets.back(); }
};

/// One layer's arrays, row-major float32, shapes as in latentq-dump/1.
struct SynthLayer {
  std::vector<float> c_kv;      ///< [T, r]
  std::vector<float> k_pe;      ///< [T, d_r] after RoPE
  std::vector<float> q_nope;    ///< [Tq, H, d_n]
  std::vector<float> q_pe;      ///< [Tq, H, d_r] after RoPE
  std::vector<float> w_uk;      ///< [H, d_n, r]
  std::vector<float> w_uv;      ///< [H, d_v, r]
  std::vector<float> attn_out;  ///< [Tq, H, d_v]
  /// A sparse preset: index_k [T, d_i], index_q [Tq, n_i, d_i], index_w [Tq, n_i] and the selection (CSR by row).
  std::vector<float> index_k, index_q, index_w;
  std::vector<int64_t> topk_offsets;
  std::vector<int32_t> topk_keys;
};

/// Checks the options (throws std::invalid_argument naming the option and value: dims < 1, an odd
/// qk_rope_head_dim, θ ≤ 0, a layout other than interleaved/half, S or a length < 1, Tq outside [1, T],
/// a scale that is not finite and > 0).
void validate(const SynthOptions& o);

/// The tokens, positions, sequence offsets and query rows (validates `o`).
SynthTokens synth_tokens(const SynthOptions& o);

/// Layer `layer` (0 ≤ layer < num_layers), a pure function of (o, layer).
SynthLayer synth_layer(const SynthOptions& o, const SynthTokens& tok, int64_t layer);

/// Rotates the pairs of each row of x [rows, d] (d even) by positions[row]·θ^(−2i/d) in `layout`
/// ("interleaved": (2i, 2i+1); "half": (i, i + d/2)), in float64, rounded once to float32. Exposed for
/// the tests; throws std::invalid_argument for an odd d or an unknown layout.
void apply_rope(std::vector<float>& x, int64_t d, const std::vector<int32_t>& positions, double theta,
                const std::string& layout);

/// Writes the dump to `out` (through ".<name>.<pid>.tmp" in the same directory, renamed at the end;
/// on any error the temporary is removed and `out` is untouched). Datasets are chunked (≈ 1 MiB
/// chunks; /layers/NNN/w_uk and w_uv one head per chunk). Layers are generated and written one at a
/// time; `on_layer(l)` (optional) is called after layer l is written and its arrays are freed.
/// Throws std::invalid_argument for bad options or an output directory that does not exist,
/// std::runtime_error / H5::Exception for write errors.
void write_synth_dump(const std::filesystem::path& out, const SynthOptions& o,
                      const std::function<void(int64_t)>& on_layer = {});

}  // namespace latentq
