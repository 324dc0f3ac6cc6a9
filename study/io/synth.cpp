// Synthetic dumps of a real model's shape (latentq/synth.h).
#include "latentq/synth.h"
#include "latentq/synth_v4.h"

#include <H5Cpp.h>

#include <Eigen/Dense>
#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>

#include "latentq/h5util.h"
#include "latentq/attention/attention.h"
#include "latentq/attention/dsa.h"
#include "latentq/util.h"
#include "synth_internal.h"

namespace latentq {
namespace fs = std::filesystem;

// The presets. Dims: the models' config.json (num_hidden_layers, num_attention_heads, kv_lora_rank,
// qk_rope_head_dim, qk_nope_head_dim, v_head_dim, rope_theta, vocab_size) on each model's Hugging Face repository
// (named in the second column); softmax scales: qk_head_dim^(−1/2)·mscale², mscale = 0.1·mscale_all_dim·ln(factor) + 1
// under YaRN (DeepSeek-V3 inference/model.py, MLA.__init__);
// RoPE layouts: data/README.md "rope_layout" (HF DeepseekV2: interleaved; HF DeepseekV3 / GLM-4.7-Flash /
// MiniCPM3: rotate_half). YaRN (DeepSeek, factor 40) and LongRoPE (MiniCPM3) change the frequencies of
// the slow pairs at long context; the synthetic k_pe uses the base θ (documented, not a model claim).
const std::vector<ModelShape>& model_presets() {
  static const std::vector<ModelShape> p = {
      {"tiny-mla", "tiny-mla", 6, 6, 128, 32, 64, 64, 10000.0, "interleaved", 0.10206207261596575, 256,
       "data/tiny-mla/config.json (the project's model); scale 96^-1/2", LatentModel::kLowRank},
      {"deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite", 27, 16, 512, 64, 128, 128, 10000.0, "interleaved", 0.1147214,
       102400,
       "DeepSeek-V2-Lite config.json; scale 192^-1/2 * 1.2608038^2 (YaRN mscale_all_dim 0.707, "
       "factor 40); HF DeepseekV2 apply_rotary_emb: interleaved"},
      {"deepseek-v3", "deepseek-ai/DeepSeek-V3", 61, 128, 512, 64, 128, 128, 10000.0, "half", 0.1352338, 129280,
       "DeepSeek-V3 config.json; scale "
       "192^-1/2 * mscale^2 (YaRN mscale_all_dim 1.0, factor 40); HF DeepseekV3: rotate_half"},
      {"glm-4.7-flash", "zai-org/GLM-4.7-Flash", 47, 20, 512, 64, 192, 256, 1000000.0, "half", 0.0625, 154880,
       "GLM-4.7-Flash config.json (47 layers, 20 heads, 512 + 64, nope 192 / v 256; rope_theta "
       "1e6, vocab 154880); scale 256^-1/2; HF: rotate_half"},
      {"minicpm3-4b", "openbmb/MiniCPM3-4B", 62, 40, 256, 32, 64, 64, 10000.0, "half", 0.10206207261596575, 73448,
       "MiniCPM3-4B config.json (62 layers, 40 heads, 256 + 32, nope 64 / v 64; rope_theta 1e4, "
       "vocab 73448; LongRoPE short factors not applied); scale 96^-1/2; HF: rotate_half"},
      // Sparse MLA: transformers 5.24's config classes, whose defaults are these checkpoints' configs
      // (DeepseekV32Config: auto_docstring checkpoint deepseek-ai/DeepSeek-V3.2-Exp; GlmMoeDsaConfig: zai-org/GLM-5).
      {"deepseek-v3.2", "deepseek-ai/DeepSeek-V3.2-Exp", 61, 128, 512, 64, 128, 128, 10000.0, "half", 0.1352338,
       129280,
       "DeepSeek-V3.2-Exp config.json as transformers 5.24's DeepseekV32Config defaults (61 layers, 128 heads, "
       "512 + 64, nope 128 / v 128; indexer 64 heads x 128, index_topk 2048); scale 192^-1/2 * mscale^2 (YaRN "
       "mscale_all_dim 1.0, factor 40, as its predecessor's); HF apply_rotary_pos_emb_interleave: rotate_half",
       LatentModel::kStandin, 64, 128, 2048},
      {"glm-5", "zai-org/GLM-5", 78, 64, 512, 64, 192, 256, 10000.0, "half", 0.0625, 154880,
       "GLM-5 config.json as transformers 5.24's GlmMoeDsaConfig defaults (78 layers, 64 heads, 512 + 64, nope "
       "192 / v 256, vocab 154880; indexer 32 heads x 128, index_topk 2048; rope_theta: the class default, 1e4); "
       "scale 256^-1/2; HF apply_rotary_pos_emb_interleave: rotate_half",
       LatentModel::kStandin, 32, 128, 2048},
  };
  return p;
}

const StandinModel& standin_model() {
  static const StandinModel p;
  return p;
}

bool is_standin_sink_layer(int64_t layer) { return layer % standin_model().sink_layer_period == 1; }

int64_t standin_spike_channels(int64_t r) {
  return std::clamp<int64_t>(std::llround(standin_model().spike_channel_frac * static_cast<double>(r)), 0, r - 1);
}

const ModelShape& find_preset(const std::string& name) {
  std::string names;
  for (const ModelShape& s : model_presets()) {
    if (s.name == name) return s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  for (const V4Shape& s : v4_presets()) names += ", " + s.name + " (DeepSeek-V4)";
  throw std::invalid_argument(fmt::format("unknown preset '{}' (presets: {})", name, names));
}

void validate(const SynthOptions& o) {
  const ModelShape& s = o.shape;
  auto pos = [&](const char* what, int64_t v) {
    if (v < 1) throw std::invalid_argument(fmt::format("synth: {} = {} must be >= 1", what, v));
  };
  pos("layers", s.num_layers);
  pos("num_heads", s.num_heads);
  pos("kv_lora_rank", s.kv_lora_rank);
  pos("qk_rope_head_dim", s.qk_rope_head_dim);
  pos("qk_nope_head_dim", s.qk_nope_head_dim);
  pos("v_head_dim", s.v_head_dim);
  pos("vocab_size", s.vocab_size);
  if (s.qk_rope_head_dim % 2)
    throw std::invalid_argument(
        fmt::format("synth: qk_rope_head_dim = {} must be even (RoPE rotates pairs)", s.qk_rope_head_dim));
  if (!(s.rope_theta > 0) || !std::isfinite(s.rope_theta))
    throw std::invalid_argument(fmt::format("synth: rope_theta = {} must be finite and > 0", s.rope_theta));
  if (s.rope_layout != "interleaved" && s.rope_layout != "half")
    throw std::invalid_argument(fmt::format("synth: rope_layout '{}' is not interleaved or half", s.rope_layout));
  if (!(s.softmax_scale > 0) || !std::isfinite(s.softmax_scale))
    throw std::invalid_argument(fmt::format("synth: softmax_scale = {} must be finite and > 0", s.softmax_scale));
  if (s.num_layers > 999)
    throw std::invalid_argument(fmt::format("synth: layers = {} exceeds 999 (NNN)", s.num_layers));
  int64_t T = 0;
  if (o.seq_lens.empty()) {
    pos("seqs", o.seqs);
    pos("seq-len", o.seq_len);
    T = o.seqs * o.seq_len;
  } else {
    for (int64_t n : o.seq_lens) {
      pos("a sequence length", n);
      T += n;
    }
  }
  if (T > INT32_MAX) throw std::invalid_argument(fmt::format("synth: {} tokens exceed int32 token indices", T));
  if (o.query_rows < 1 || o.query_rows > T)
    throw std::invalid_argument(fmt::format("synth: query-rows = {} must be in [1, {}] (the tokens)", o.query_rows, T));
}

namespace {

using synthio::stream;

enum Purpose : uint64_t { kTokens = 1, kLatent = 2, kRope = 3, kQuery = 4, kWeights = 5, kIndexer = 6 };

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// AR(1) rows over the tokens of each sequence: z_t = ρ z_{t−1} + √(1−ρ²) ε_t, z_first = ε (N(0,1)).
MatF ar1_rows(const SynthTokens& tok, int64_t cols, double rho, std::mt19937_64& rng) {
  std::normal_distribution<float> N(0.0f, 1.0f);
  const int64_t T = tok.num_tokens();
  MatF z(T, cols);
  const float a = static_cast<float>(rho), b = static_cast<float>(std::sqrt(1.0 - rho * rho));
  for (size_t s = 0; s + 1 < tok.seq_offsets.size(); ++s)
    for (int64_t t = tok.seq_offsets[s]; t < tok.seq_offsets[s + 1]; ++t)
      for (int64_t c = 0; c < cols; ++c) {
        const float e = N(rng);
        z(t, c) = t == tok.seq_offsets[s] ? e : a * z(t - 1, c) + b * e;
      }
  return z;
}

std::vector<float> randn(size_t n, double stddev, std::mt19937_64& rng) {
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::vector<float> v(n);
  const float s = static_cast<float>(stddev);
  for (float& x : v) x = s * N(rng);
  return v;
}

constexpr double kRho = 0.8;      // AR(1) coefficient of the latent factors over tokens
constexpr double kRmsEps = 1e-6;  // kv_a_layernorm eps (DeepSeek rms_norm_eps)

}  // namespace

void apply_rope(std::vector<float>& x, int64_t d, const std::vector<int32_t>& positions, double theta,
                const std::string& layout) {
  if (d < 2 || d % 2) throw std::invalid_argument(fmt::format("apply_rope: d = {} must be even and >= 2", d));
  const bool half = layout == "half";
  if (!half && layout != "interleaved")
    throw std::invalid_argument(fmt::format("apply_rope: unknown layout '{}'", layout));
  const int64_t rows = static_cast<int64_t>(positions.size()), pairs = d / 2;
  assert(static_cast<int64_t>(x.size()) % (rows * d) == 0 || rows == 0);
  const int64_t per_row = rows ? static_cast<int64_t>(x.size()) / rows : 0;  // d, or H·d for queries
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < pairs; ++i) {
      const double ang =
          static_cast<double>(positions[r]) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      const double c = std::cos(ang), s = std::sin(ang);
      for (int64_t h = 0; h < per_row / d; ++h) {
        float* row = x.data() + r * per_row + h * d;
        const int64_t ia = half ? i : 2 * i, ib = half ? i + pairs : 2 * i + 1;
        const double a = row[ia], b = row[ib];
        row[ia] = static_cast<float>(a * c - b * s);
        row[ib] = static_cast<float>(a * s + b * c);
      }
    }
}

SynthTokens synth_tokens(const SynthOptions& o) {
  validate(o);
  SynthTokens t;
  std::vector<int64_t> lens = o.seq_lens;
  if (lens.empty()) lens.assign(static_cast<size_t>(o.seqs), o.seq_len);
  t.seq_offsets = {0};
  for (int64_t n : lens) t.seq_offsets.push_back(t.seq_offsets.back() + n);
  std::mt19937_64 rng = stream(o.seed, kTokens, 0);
  std::uniform_int_distribution<int32_t> tokd(0, static_cast<int32_t>(o.shape.vocab_size - 1));
  for (int64_t n : lens)
    for (int64_t p = 0; p < n; ++p) {
      t.positions.push_back(static_cast<int32_t>(p));
      t.tokens.push_back(tokd(rng));
    }
  // The query-row rule of data/README.md: k = ⌊Tq/S⌋ rows per sequence (the first Tq mod S get one more),
  // local positions ⌊(j+1)·L/k⌋ − 1.
  const int64_t S = static_cast<int64_t>(lens.size());
  for (int64_t s = 0; s < S; ++s) {
    const int64_t k = o.query_rows / S + (s < o.query_rows % S ? 1 : 0), L = lens[static_cast<size_t>(s)];
    int64_t last = -1;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t p = std::max((j + 1) * L / k - 1, last + 1);  // distinct even when k > L
      if (p >= L) break;
      t.q_rows.push_back(static_cast<int32_t>(t.seq_offsets[static_cast<size_t>(s)] + p));
      last = p;
    }
  }
  // k > L for a short sequence drops rows there: top up from the first sequence's other tokens so Tq holds.
  if (static_cast<int64_t>(t.q_rows.size()) < o.query_rows) {
    std::vector<char> used(static_cast<size_t>(t.num_tokens()), 0);
    for (int32_t q : t.q_rows) used[static_cast<size_t>(q)] = 1;
    for (int64_t i = t.num_tokens() - 1; i >= 0 && static_cast<int64_t>(t.q_rows.size()) < o.query_rows; --i)
      if (!used[static_cast<size_t>(i)]) t.q_rows.push_back(static_cast<int32_t>(i));
    std::sort(t.q_rows.begin(), t.q_rows.end());
  }
  assert(static_cast<int64_t>(t.q_rows.size()) == o.query_rows);
  return t;
}

namespace {

// The c_kv of a layer and what the queries and weights need to be consistent with it.
struct LatentDraw {
  std::vector<float> c_kv;    // [T, r]
  std::vector<float> gamma;   // [r] the kv_a_layernorm weight; empty: the weights ignore it (low-rank model)
  int64_t sink_channel = -1;  // the channel the attention sinks put their energy in (-1: none)
  float sink_sign = 1.0f;     // its sign
};

// kLowRank: c_kv = γ ⊙ RMSNorm(V·diag(σ)·z_t), σ_i = exp(−i/τ), τ = r/16 (tiny-mla's shape).
LatentDraw lowrank_ckv(const SynthOptions& o, const SynthTokens& tok, uint64_t L) {
  const int64_t T = tok.num_tokens(), r = o.shape.kv_lora_rank;
  std::mt19937_64 rng = stream(o.seed, kLatent, L);
  std::normal_distribution<double> N(0.0, 1.0);
  MatF g(r, r);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < r; ++j) g(i, j) = static_cast<float>(N(rng));
  Eigen::MatrixXd q = Eigen::HouseholderQR<Eigen::MatrixXd>(g.cast<double>()).householderQ();  // Haar up to signs
  const double tau = std::max(1.0, static_cast<double>(r) / 16.0);
  MatF basis(r, r);  // row i = σ_i · v_iᵀ
  for (int64_t i = 0; i < r; ++i)
    for (int64_t c = 0; c < r; ++c) basis(i, c) = static_cast<float>(std::exp(-static_cast<double>(i) / tau) * q(c, i));
  std::vector<float> gamma(static_cast<size_t>(r));
  for (float& x : gamma) x = static_cast<float>(std::exp(0.25 * N(rng)));
  const int64_t outliers = std::min<int64_t>(r, std::max<int64_t>(2, r / 128));
  std::uniform_int_distribution<int64_t> ch(0, r - 1);
  std::uniform_real_distribution<double> big(8.0, 24.0);
  for (int64_t k = 0; k < outliers; ++k) gamma[static_cast<size_t>(ch(rng))] = static_cast<float>(big(rng));
  const MatF z = ar1_rows(tok, r, kRho, rng);
  MatF x = z * basis;  // [T, r]
  LatentDraw out;
  out.c_kv.resize(static_cast<size_t>(T * r));
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t c = 0; c < r; ++c) ss += static_cast<double>(x(t, c)) * x(t, c);
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(r) + kRmsEps);
    for (int64_t c = 0; c < r; ++c)
      out.c_kv[static_cast<size_t>(t * r + c)] = static_cast<float>(gamma[static_cast<size_t>(c)] * (x(t, c) * inv));
  }
  return out;
}

// kStandin: the calibrated model of latentq/synth.h (StandinModel).
LatentDraw standin_ckv(const SynthOptions& o, const SynthTokens& tok, int64_t layer) {
  const StandinModel& P = standin_model();
  const int64_t T = tok.num_tokens(), r = o.shape.kv_lora_rank;
  const bool sink_layer = is_standin_sink_layer(layer);
  std::mt19937_64 rng = stream(o.seed, kLatent, static_cast<uint64_t>(layer));
  std::normal_distribution<double> N(0.0, 1.0);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  LatentDraw out;
  out.gamma.resize(static_cast<size_t>(r));
  for (float& x : out.gamma) x = static_cast<float>(std::exp(P.gamma_sigma * N(rng)));
  // The outlier channels: the sink channel first, then K spike channels (a seeded partial shuffle).
  const int64_t K = standin_spike_channels(r);
  std::vector<int64_t> perm(static_cast<size_t>(r));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  for (int64_t i = 0; i <= K; ++i)
    std::swap(perm[static_cast<size_t>(i)],
              perm[static_cast<size_t>(i + std::uniform_int_distribution<int64_t>(0, r - 1 - i)(rng))]);
  std::vector<float> sign(static_cast<size_t>(K + 1));
  for (float& s : sign) s = U(rng) < 0.5 ? -1.0f : 1.0f;
  out.sink_channel = perm[0];
  out.sink_sign = sign[0];
  out.gamma[static_cast<size_t>(perm[0])] = static_cast<float>(sink_layer ? P.sink_layer_gain : P.sink_gain);
  const double lo = std::log(P.spike_gain_lo), hi = std::log(P.spike_gain_hi);
  for (int64_t k = 1; k <= K; ++k)
    out.gamma[static_cast<size_t>(perm[static_cast<size_t>(k)])] =
        static_cast<float>(std::exp(lo + (hi - lo) * U(rng)));
  // Ordinary tokens leave the outlier channels dormant: there x = z / γ, so γ·x̂ is of ordinary size.
  std::vector<float> dormant(static_cast<size_t>(r), 1.0f);
  for (int64_t k = 0; k <= K; ++k) {
    const size_t c = static_cast<size_t>(perm[static_cast<size_t>(k)]);
    dormant[c] = 1.0f / out.gamma[c];
  }
  // The spike channels' offsets μ_k (in units of z): they are not centered on 0.
  std::vector<double> offset(static_cast<size_t>(K + 1), 0.0);
  for (int64_t k = 1; k <= K; ++k) offset[static_cast<size_t>(k)] = P.spike_offset_sigma * N(rng);
  const MatF x = ar1_rows(tok, r, P.rho, rng);  // the white bulk, [T, r]
  std::vector<char> first(static_cast<size_t>(T), 0);
  for (size_t s = 0; s + 1 < tok.seq_offsets.size(); ++s)
    if (tok.seq_offsets[s] < tok.seq_offsets[s + 1]) first[static_cast<size_t>(tok.seq_offsets[s])] = 1;
  const double scale = sink_layer ? 0.0 : P.spike_scale;      // a sink layer has no spikes
  const double burst = sink_layer ? 0.0 : P.burst_magnitude;  // nor bursts
  std::uniform_int_distribution<int64_t> pick(1, std::max<int64_t>(1, K));
  out.c_kv.resize(static_cast<size_t>(T * r));
  std::vector<double> row(static_cast<size_t>(r));
  for (int64_t t = 0; t < T; ++t) {
    // A spike for every token (drawn even where unused, so the stream does not depend on positions).
    const double m = scale * (std::pow(1.0 - U(rng), -1.0 / P.spike_tail) - 1.0);
    const int64_t k = pick(rng);
    double ss = 0;
    for (int64_t c = 0; c < r; ++c) row[static_cast<size_t>(c)] = static_cast<double>(x(t, c));
    // Each spike channel: its offset, and a burst of ±burst_magnitude with probability burst_rate (two
    // uniforms per channel and token, drawn in every layer).
    for (int64_t j = 1; j <= K; ++j) {
      const double u = U(rng), v = U(rng);
      row[static_cast<size_t>(perm[static_cast<size_t>(j)])] +=
          offset[static_cast<size_t>(j)] + (u < P.burst_rate ? (v < 0.5 ? -burst : burst) : 0.0);
    }
    for (int64_t c = 0; c < r; ++c) {
      row[static_cast<size_t>(c)] *= dormant[static_cast<size_t>(c)];
      ss += row[static_cast<size_t>(c)] * row[static_cast<size_t>(c)];
    }
    const bool sink = first[static_cast<size_t>(t)] != 0;
    const int64_t slot = sink ? 0 : (K > 0 ? k : -1);
    if (slot >= 0) {
      const size_t c = static_cast<size_t>(perm[static_cast<size_t>(slot)]);
      const double add = sign[static_cast<size_t>(slot)] * (sink ? P.sink_magnitude : m) * std::sqrt(ss);
      ss += add * (2.0 * row[c] + add);
      row[c] += add;
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(r) + kRmsEps);
    for (int64_t c = 0; c < r; ++c)
      out.c_kv[static_cast<size_t>(t * r + c)] =
          static_cast<float>(out.gamma[static_cast<size_t>(c)] * (row[static_cast<size_t>(c)] * inv));
  }
  return out;
}

}  // namespace

SynthLayer synth_layer(const SynthOptions& o, const SynthTokens& tok, int64_t layer) {
  const ModelShape& m = o.shape;
  if (layer < 0 || layer >= m.num_layers)
    throw std::invalid_argument(fmt::format("synth_layer: layer {} outside [0, {})", layer, m.num_layers));
  const int64_t T = tok.num_tokens(), r = m.kv_lora_rank, dr = m.qk_rope_head_dim, H = m.num_heads,
                dn = m.qk_nope_head_dim, dv = m.v_head_dim, Tq = static_cast<int64_t>(tok.q_rows.size());
  const uint64_t L = static_cast<uint64_t>(layer);
  SynthLayer out;

  // ---- c_kv ----
  LatentDraw lat = m.latent == LatentModel::kLowRank ? lowrank_ckv(o, tok, L) : standin_ckv(o, tok, layer);
  out.c_kv = std::move(lat.c_kv);

  // ---- k_pe: RoPE(m + s ⊙ z'_t) ----
  {
    std::mt19937_64 rng = stream(o.seed, kRope, L);
    std::normal_distribution<double> N(0.0, 1.0);
    const int64_t pairs = dr / 2;
    std::vector<double> mean(static_cast<size_t>(dr)), scale(static_cast<size_t>(dr));
    for (int64_t i = 0; i < pairs; ++i) {
      const double s = 0.5 + 2.0 * static_cast<double>(i) / static_cast<double>(pairs);  // slow pairs larger
      for (int64_t c : {m.rope_layout == "half" ? i : 2 * i, m.rope_layout == "half" ? i + pairs : 2 * i + 1}) {
        scale[static_cast<size_t>(c)] = s;
        mean[static_cast<size_t>(c)] = s * N(rng);
      }
    }
    const MatF z = ar1_rows(tok, dr, kRho, rng);
    out.k_pe.resize(static_cast<size_t>(T * dr));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < dr; ++c)
        out.k_pe[static_cast<size_t>(t * dr + c)] =
            static_cast<float>(mean[static_cast<size_t>(c)] + scale[static_cast<size_t>(c)] * z(t, c));
    apply_rope(out.k_pe, dr, tok.positions, m.rope_theta, m.rope_layout);
  }

  // ---- weights: W̃_UK ~ N(0, 1/d_n), W̃_UV ~ N(0, 1/r); with γ, W = W̃ · diag(γ)⁻¹ ----
  {
    std::mt19937_64 rng = stream(o.seed, kWeights, L);
    out.w_uk = randn(static_cast<size_t>(H * dn * r), 1.0 / std::sqrt(static_cast<double>(dn)), rng);
    out.w_uv = randn(static_cast<size_t>(H * dv * r), 1.0 / std::sqrt(static_cast<double>(r)), rng);
  }
  // ---- queries: q_nope, q_pe ~ N(0, 1) (q_pe RoPE'd at the query's position); with a sink, per head h
  //      q_nope += sign·β_h·w̃ / ‖w̃‖², w̃ = W̃_UK[h][:, sink channel], so (W̃ᵀq)_sink gains β_h ----
  {
    std::mt19937_64 rng = stream(o.seed, kQuery, L);
    out.q_nope = randn(static_cast<size_t>(Tq * H * dn), 1.0, rng);
    out.q_pe = randn(static_cast<size_t>(Tq * H * dr), 1.0, rng);
    std::vector<int32_t> qpos(static_cast<size_t>(Tq));
    for (int64_t i = 0; i < Tq; ++i)
      qpos[static_cast<size_t>(i)] = tok.positions[static_cast<size_t>(tok.q_rows[static_cast<size_t>(i)])];
    apply_rope(out.q_pe, dr, qpos, m.rope_theta, m.rope_layout);
    if (lat.sink_channel >= 0) {
      std::uniform_real_distribution<double> U(0.0, 2.0 * standin_model().query_sink_bias);
      for (int64_t h = 0; h < H; ++h) {
        const double beta = U(rng);
        std::vector<double> w(static_cast<size_t>(dn));
        double nn = 0;
        for (int64_t d = 0; d < dn; ++d) {
          w[static_cast<size_t>(d)] = out.w_uk[static_cast<size_t>((h * dn + d) * r + lat.sink_channel)];
          nn += w[static_cast<size_t>(d)] * w[static_cast<size_t>(d)];
        }
        if (!(nn > 0)) continue;
        for (int64_t i = 0; i < Tq; ++i)
          for (int64_t d = 0; d < dn; ++d)
            out.q_nope[static_cast<size_t>((i * H + h) * dn + d)] +=
                static_cast<float>(lat.sink_sign * beta * w[static_cast<size_t>(d)] / nn);
      }
    }
  }
  if (!lat.gamma.empty()) {  // fold γ out: W_UK·diag(γ) = W̃_UK, so the scores and values read x̂
    for (int64_t hd = 0; hd < H * dn; ++hd)
      for (int64_t c = 0; c < r; ++c) out.w_uk[static_cast<size_t>(hd * r + c)] /= lat.gamma[static_cast<size_t>(c)];
    for (int64_t hd = 0; hd < H * dv; ++hd)
      for (int64_t c = 0; c < r; ++c) out.w_uv[static_cast<size_t>(hd * r + c)] /= lat.gamma[static_cast<size_t>(c)];
  }

  // ---- attn_out: the absorbed attention in float64, rounded once ----
  probes::AttentionQueries q;
  q.dims = {H, r, dn, dr, dv};
  q.num_tokens = T;
  q.seq_offsets = tok.seq_offsets;
  q.q_rows = tok.q_rows;
  q.q_nope = out.q_nope;
  q.q_pe = out.q_pe;
  q.w_uk = out.w_uk;
  q.w_uv = out.w_uv;
  q.softmax_scale = m.softmax_scale;
  if (m.sparse()) {  // the indexer's tensors, N(0, 1) (head weights N(0, 1)·n_i^-1/2), and the selection they make
    std::mt19937_64 rng = stream(o.seed, kIndexer, L);
    const int64_t n = m.index_n_heads, di = m.index_head_dim;
    out.index_k = randn(static_cast<size_t>(T * di), 1.0, rng);
    out.index_q = randn(static_cast<size_t>(Tq * n * di), 1.0, rng);
    out.index_w = randn(static_cast<size_t>(Tq * n), 1.0 / std::sqrt(static_cast<double>(n)), rng);
    probes::KeySelection sel =
        probes::dsa_select_topk(out.index_q, out.index_w, out.index_k, n, di, tok.q_rows, tok.seq_offsets,
                                1.0 / std::sqrt(static_cast<double>(di)), m.index_topk);
    out.topk_offsets = std::move(sel.offsets);
    out.topk_keys = std::move(sel.keys);
    q.selected_offsets = out.topk_offsets;
    q.selected_keys = out.topk_keys;
  }
  const auto res = probes::absorbed_attention<double>(q, out.c_kv, out.k_pe);
  out.attn_out.resize(res.out.size());
  std::transform(res.out.begin(), res.out.end(), out.attn_out.begin(), [](double v) { return static_cast<float>(v); });
  return out;
}

namespace {

std::string config_json(const SynthOptions& o) {
  const ModelShape& m = o.shape;
  return fmt::format(
      "{{\"model_type\": \"latentq-synthetic\", \"preset\": \"{}\", \"model\": \"{}\", \"num_hidden_layers\": {}, "
      "\"num_attention_heads\": {}, \"kv_lora_rank\": {}, \"qk_rope_head_dim\": {}, \"qk_nope_head_dim\": {}, "
      "\"v_head_dim\": {}, \"rope_theta\": {}, \"vocab_size\": {}, \"rms_norm_eps\": {}}}",
      m.name, m.model, m.num_layers, m.num_heads, m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim,
      m.rope_theta, m.vocab_size, kRmsEps);
}

}  // namespace

void write_synth_dump(const fs::path& out_path, const SynthOptions& o, const std::function<void(int64_t)>& on_layer) {
  using synthio::put_chunked;
  using synthio::rows_per_mib;
  const SynthTokens tok = synth_tokens(o);  // validates
  const ModelShape& m = o.shape;
  synthio::write_via_temp(out_path, [&](H5::H5File& f) {
    const int64_t T = tok.num_tokens(), S = static_cast<int64_t>(tok.seq_offsets.size()) - 1;
    bool equal = true;
    for (int64_t s = 1; s < S; ++s)
      equal = equal && tok.seq_offsets[s + 1] - tok.seq_offsets[s] == tok.seq_offsets[1];
    h5::write_attr(f, "schema", std::string("latentq-dump/1"));
    h5::write_attr(f, "model", "synthetic:" + m.name);
    h5::write_attr(f, "revision", fmt::format("synthetic-seed-{}", o.seed));
    h5::write_attr(f, "source", std::string("synthetic"));
    h5::write_attr(f, "created", utc_now_iso8601());
    h5::write_attr(f, "config_json", config_json(o));
    h5::write_attr(f, "num_layers", m.num_layers);
    h5::write_attr(f, "num_heads", m.num_heads);
    h5::write_attr(f, "kv_lora_rank", m.kv_lora_rank);
    h5::write_attr(f, "qk_rope_head_dim", m.qk_rope_head_dim);
    h5::write_attr(f, "qk_nope_head_dim", m.qk_nope_head_dim);
    h5::write_attr(f, "v_head_dim", m.v_head_dim);
    h5::write_attr(f, "softmax_scale", m.softmax_scale);
    h5::write_attr(f, "softmax_scale_source", std::string("preset:" + m.name));
    h5::write_attr(f, "rope_layout", m.rope_layout);
    h5::write_attr(f, "rope_function", std::string("latentq synth (rope_theta in config_json)"));
    h5::write_attr(f, "original_dtype", std::string("float32"));
    h5::write_attr(f, "compute_dtype", std::string("float64"));
    h5::write_attr(f, "num_seqs", S);
    h5::write_attr(f, "seq_len", equal ? tok.seq_offsets[1] : int64_t{-1});
    h5::write_attr(f, "text_sha256", std::string(""));
    h5::write_attr(f, "tokenizer", std::string("synthetic"));
    h5::write_attr(f, "q_rows_rule",
                   std::string("per sequence k = floor(Tq/S) (+1 for the first Tq mod S), local "
                               "positions floor((j+1)*L/k)-1"));
    h5::write_attr(f, "synth_preset", m.name);
    h5::write_attr(f, "synth_seed", static_cast<int64_t>(o.seed));
    h5::write_attr(f, "synth_source", m.source);
    if (m.sparse()) h5::write_attr(f, "cache_family", std::string("sparse_mla"));
    const hid_t fid = f.getId();
    synthio::put_token_arrays(fid, tok);
    const hsize_t uT = static_cast<hsize_t>(T);
    const hsize_t r = static_cast<hsize_t>(m.kv_lora_rank), dr = static_cast<hsize_t>(m.qk_rope_head_dim),
                  H = static_cast<hsize_t>(m.num_heads), dn = static_cast<hsize_t>(m.qk_nope_head_dim),
                  dv = static_cast<hsize_t>(m.v_head_dim), Tq = tok.q_rows.size();
    for (int64_t l = 0; l < m.num_layers; ++l) {
      const std::string p = fmt::format("/layers/{:03d}/", l);
      {
        const SynthLayer d = synth_layer(o, tok, l);
        put_chunked(fid, p + "c_kv", {uT, r}, {rows_per_mib(m.kv_lora_rank), r}, d.c_kv.data(), H5T_IEEE_F32LE,
                    H5T_NATIVE_FLOAT);
        put_chunked(fid, p + "k_pe", {uT, dr}, {rows_per_mib(m.qk_rope_head_dim), dr}, d.k_pe.data(), H5T_IEEE_F32LE,
                    H5T_NATIVE_FLOAT);
        put_chunked(fid, p + "q_rows", {Tq}, {1 << 16}, tok.q_rows.data(), H5T_STD_I32LE, H5T_NATIVE_INT32);
        put_chunked(fid, p + "q_nope", {Tq, H, dn}, {rows_per_mib(m.num_heads * m.qk_nope_head_dim), H, dn},
                    d.q_nope.data(), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
        put_chunked(fid, p + "q_pe", {Tq, H, dr}, {rows_per_mib(m.num_heads * m.qk_rope_head_dim), H, dr},
                    d.q_pe.data(), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
        put_chunked(fid, p + "w_uk", {H, dn, r}, {1, dn, r}, d.w_uk.data(), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
        put_chunked(fid, p + "w_uv", {H, dv, r}, {1, dv, r}, d.w_uv.data(), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
        put_chunked(fid, p + "attn_out", {Tq, H, dv}, {rows_per_mib(m.num_heads * m.v_head_dim), H, dv},
                    d.attn_out.data(), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
        if (m.sparse()) {  // data/README.md: the selection and the layer's own indexer
          const hsize_t n = static_cast<hsize_t>(m.index_n_heads), di = static_cast<hsize_t>(m.index_head_dim);
          put_chunked(fid, p + "topk_offsets", {Tq + 1}, {1 << 16}, d.topk_offsets.data(), H5T_STD_I64LE,
                      H5T_NATIVE_INT64);
          put_chunked(fid, p + "topk_keys", {static_cast<hsize_t>(d.topk_keys.size())}, {1 << 16},
                      d.topk_keys.data(), H5T_STD_I32LE, H5T_NATIVE_INT32);
          put_chunked(fid, p + "index_k", {uT, di}, {rows_per_mib(m.index_head_dim), di}, d.index_k.data(),
                      H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
          put_chunked(fid, p + "index_q", {Tq, n, di}, {rows_per_mib(m.index_n_heads * m.index_head_dim), n, di},
                      d.index_q.data(), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
          put_chunked(fid, p + "index_w", {Tq, n}, {rows_per_mib(m.index_n_heads), n}, d.index_w.data(),
                      H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
          H5::Group g = f.openGroup(p.substr(0, p.size() - 1));
          h5::write_attr(g, "index_source", int64_t{l});
          h5::write_attr(g, "index_topk", m.index_topk);
          h5::write_attr(g, "index_softmax_scale", 1.0 / std::sqrt(static_cast<double>(m.index_head_dim)));
        }
      }
      H5Fflush(fid, H5F_SCOPE_LOCAL);
      if (on_layer) on_layer(l);
    }
  });
}

}  // namespace latentq
