// Synthetic DeepSeek-V4 dumps of a real V4 model's cache shapes (latentq/synth_v4.h).
#include "latentq/synth_v4.h"

#include <H5Cpp.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <stdexcept>

#include "latentq/attention/v4.h"
#include "latentq/h5util.h"
#include "latentq/util.h"
#include "synth_internal.h"

namespace latentq {
namespace fs = std::filesystem;

namespace {

// DeepSeek-V4-Flash's attention schedule (config.json compress_ratios, 43 decoder layers; the published list has a
// 44th entry, 0, for the MTP layer, which the model's layers do not include): layers 0 and 1 sliding only, then CSA
// (rate 4) on the even layers 2 .. 42 and HCA (rate 128) on the odd layers 3 .. 41 — 2 sliding, 21 CSA, 20 HCA.
std::vector<int64_t> flash_compress_ratios() {
  std::vector<int64_t> r(43);
  for (int64_t i = 0; i < 43; ++i) r[static_cast<size_t>(i)] = i < 2 ? 0 : (i % 2 == 0 ? 4 : 128);
  return r;
}

constexpr double kRho = 0.8;      // AR(1) coefficient over the tokens of a sequence
constexpr double kRmsEps = 1e-6;  // rms_norm_eps of V4-Flash's config.json
enum Purpose : uint64_t { kWindow = 11, kCompress = 12, kIndexKeys = 13, kQuery = 14, kIndexQuery = 15, kSinks = 16 };

// x^−1/2 as the model computes its scales (head_dim**-0.5 in Python: pow, which can differ from 1/√x in the last bit).
double inv_sqrt(int64_t x) { return std::pow(static_cast<double>(x), -0.5); }

using Rows = std::vector<double>;  // row-major [rows, width]

// AR(1) rows [len, width]: z_0 = ε, z_t = ρ z_{t−1} + √(1−ρ²) ε_t, ε ~ N(0, 1).
Rows ar1(int64_t len, int64_t width, std::mt19937_64& rng) {
  std::normal_distribution<double> N(0.0, 1.0);
  const double b = std::sqrt(1.0 - kRho * kRho);
  Rows z(static_cast<size_t>(len * width));
  for (int64_t t = 0; t < len; ++t)
    for (int64_t c = 0; c < width; ++c) {
      const size_t k = static_cast<size_t>(t * width + c);
      z[k] = t == 0 ? N(rng) : kRho * z[k - static_cast<size_t>(width)] + b * N(rng);
    }
  return z;
}

std::vector<double> draws(size_t n, double scale, std::mt19937_64& rng) {
  std::normal_distribution<double> N(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = scale * N(rng);
  return v;
}

// γ = exp(0.25·N(0, 1)) per channel: an RMSNorm's weight.
std::vector<double> norm_weight(int64_t width, std::mt19937_64& rng) {
  std::vector<double> g = draws(static_cast<size_t>(width), 0.25, rng);
  for (double& x : g) x = std::exp(x);
  return g;
}

// Each `width`-wide row of x → γ ⊙ row / rms(row) (γ empty: unweighted), appended to `out` as float32.
void rms_norm_rows(const Rows& x, int64_t width, const std::vector<double>& gamma, std::vector<float>& out) {
  for (size_t r = 0; r < x.size() / static_cast<size_t>(width); ++r) {
    const double* row = x.data() + r * static_cast<size_t>(width);
    double ss = 0;
    for (int64_t c = 0; c < width; ++c) ss += row[c] * row[c];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(width) + kRmsEps);
    for (int64_t c = 0; c < width; ++c)
      out.push_back(static_cast<float>((gamma.empty() ? 1.0 : gamma[static_cast<size_t>(c)]) * row[c] * inv));
  }
}

// V4's RoPE (transformers 5.24 modeling_deepseek_v4.apply_rotary_pos_emb): in every `block`-wide block of row r of
// x (rows of `row_width` values), the pairs (2k, 2k+1) of the last d_r columns rotated by positions[r]·inv_freq[k].
void rope_tail(std::vector<float>& x, int64_t row_width, int64_t block, int64_t dr,
               const std::vector<int64_t>& positions, const std::vector<double>& inv_freq) {
  for (size_t r = 0; r < positions.size(); ++r)
    for (int64_t k = 0; k < dr / 2; ++k) {
      const double ang = static_cast<double>(positions[r]) * inv_freq[static_cast<size_t>(k)];
      const double c = std::cos(ang), s = std::sin(ang);
      for (int64_t h = 0; h < row_width / block; ++h) {
        float* p = x.data() + static_cast<int64_t>(r) * row_width + h * block + block - dr + 2 * k;
        const double a = p[0], b = p[1];
        p[0] = static_cast<float>(a * c - b * s);
        p[1] = static_cast<float>(b * c + a * s);
      }
    }
}

// The compressor's entries of one sequence of `len` tokens before kv_norm (DeepseekV4HCACompressor /
// DeepseekV4CSACompressor / the indexer's): one per complete window of m tokens, per channel the softmax over the
// window's slots of (gate + position bias) weighting the slots' projections. Without overlap the m tokens of window w
// (projections kv [len, width]); with overlap (CSA) also the previous window's m tokens: projections [len, 2·width],
// slots 0 .. m−1 the previous window's first `width` channels (no slots for w = 0), slots m .. 2m−1 window w's last
// `width`. bias [m, width·(1 + overlap)].
Rows pool_windows(const Rows& kv, const Rows& gate, const std::vector<double>& bias, int64_t len, int64_t m,
                  int64_t width, bool overlap) {
  const int64_t f = overlap ? 2 : 1, nw = len / m, W = f * width;
  Rows out(static_cast<size_t>(nw * width));
  std::vector<double> g, v;
  for (int64_t w = 0; w < nw; ++w)
    for (int64_t ch = 0; ch < width; ++ch) {
      g.clear(), v.clear();
      for (int64_t j = 0; j < m; ++j) {
        if (overlap && w > 0) {
          const int64_t t = (w - 1) * m + j;
          g.push_back(gate[static_cast<size_t>(t * W + ch)] + bias[static_cast<size_t>(j * W + ch)]);
          v.push_back(kv[static_cast<size_t>(t * W + ch)]);
        }
        const int64_t t = w * m + j, c = (f - 1) * width + ch;
        g.push_back(gate[static_cast<size_t>(t * W + c)] + bias[static_cast<size_t>(j * W + c)]);
        v.push_back(kv[static_cast<size_t>(t * W + c)]);
      }
      const double mx = *std::max_element(g.begin(), g.end());
      double z = 0, acc = 0;
      for (size_t k = 0; k < g.size(); ++k) {
        const double e = std::exp(g[k] - mx);
        z += e, acc += e * v[k];
      }
      out[static_cast<size_t>(w * width + ch)] = acc / z;
    }
  return out;
}

// One compressor of a layer over every sequence: entries [N, width] after kv_norm and RoPE at w·m, and with
// `spans` the layer's compressed_span / compressed_rope_position / compressed_offsets.
std::vector<float> compressor(const SynthTokens& tok, int64_t m, int64_t width, int64_t dr, bool overlap,
                              const std::vector<double>& inv_freq,
                              std::mt19937_64& rng, SynthV4Layer* spans) {
  const std::vector<double> gamma = norm_weight(width, rng);
  const std::vector<double> bias = draws(static_cast<size_t>(m * width * (overlap ? 2 : 1)), 1.0, rng);
  std::vector<float> out;
  std::vector<int64_t> pos;
  if (spans) spans->compressed_offsets = {0};
  for (size_t s = 0; s + 1 < tok.seq_offsets.size(); ++s) {
    const int64_t len = tok.seq_offsets[s + 1] - tok.seq_offsets[s], W = width * (overlap ? 2 : 1);
    const Rows kv = ar1(len, W, rng);
    const Rows gate = draws(static_cast<size_t>(len * W), 1.0, rng);
    rms_norm_rows(pool_windows(kv, gate, bias, len, m, width, overlap), width, gamma, out);
    for (int64_t w = 0; w < len / m; ++w) {
      pos.push_back(w * m);
      if (!spans) continue;
      spans->compressed_span.push_back(overlap ? std::max<int64_t>(0, (w - 1) * m) : w * m);
      spans->compressed_span.push_back((w + 1) * m);
      spans->compressed_rope_position.push_back(w * m);
    }
    if (spans) spans->compressed_offsets.push_back(static_cast<int64_t>(pos.size()));
  }
  rope_tail(out, width, width, dr, pos, inv_freq);
  return out;
}

// DeepseekV4Indexer.forward's picks for every query row: the visible entries ((w + 1)·m ≤ p + 1) by descending index
// score s[i, w] = Σ_h index_w[i, h]·relu(scale·index_q[i, h]·index_k[w]) (float64), ties to the lower entry, at most k,
// then −1 up to k.
std::vector<int64_t> indexer_picks(const SynthV4Layer& d, const SynthTokens& tok, int64_t n, int64_t c, int64_t m,
                                   int64_t k, double scale) {
  const int64_t Tq = static_cast<int64_t>(tok.q_rows.size());
  std::vector<int64_t> picks(static_cast<size_t>(Tq * k), -1);
  for (int64_t i = 0; i < Tq; ++i) {
    const int64_t t = tok.q_rows[static_cast<size_t>(i)];
    const size_t s = static_cast<size_t>(
        std::upper_bound(tok.seq_offsets.begin(), tok.seq_offsets.end(), t) - tok.seq_offsets.begin() - 1);
    const int64_t p = t - tok.seq_offsets[s], e0 = d.compressed_offsets[s];
    const int64_t nvis = std::min(d.compressed_offsets[s + 1] - e0, (p + 1) / m);
    std::vector<double> score(static_cast<size_t>(nvis), 0.0);
    for (int64_t w = 0; w < nvis; ++w)
      for (int64_t h = 0; h < n; ++h) {
        const float* q = d.index_q.data() + (i * n + h) * c;
        const float* key = d.index_k.data() + (e0 + w) * c;
        double dot = 0;
        for (int64_t x = 0; x < c; ++x) dot += static_cast<double>(q[x]) * key[x];
        score[static_cast<size_t>(w)] += d.index_w[static_cast<size_t>(i * n + h)] * std::max(0.0, scale * dot);
      }
    std::vector<int64_t> order(static_cast<size_t>(nvis));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)];
    });
    for (int64_t j = 0; j < std::min(k, nvis); ++j)
      picks[static_cast<size_t>(i * k + j)] = order[static_cast<size_t>(j)];
  }
  return picks;
}

// A proxy MLA shape for latentq/synth.h's token arrays (its validation and query-row rule): the V4 widths.
SynthOptions token_options(const V4SynthOptions& o) {
  const V4Shape& v = o.shape;
  SynthOptions t;
  t.shape = {v.name, v.model, 1, v.num_heads, v.head_dim - v.qk_rope_head_dim, v.qk_rope_head_dim,
             v.head_dim - v.qk_rope_head_dim, v.head_dim, v.rope_theta, "interleaved",
             inv_sqrt(v.head_dim), v.vocab_size, v.source};
  t.seqs = o.seqs, t.seq_len = o.seq_len, t.seq_lens = o.seq_lens, t.query_rows = o.query_rows, t.seed = o.seed;
  return t;
}

}  // namespace

const std::vector<V4Shape>& v4_presets() {
  // transformers 5.24 models/deepseek_v4/configuration_deepseek_v4.py (DeepseekV4Config, checkpoint
  // deepseek-ai/DeepSeek-V4-Flash-Base): num_attention_heads 64, head_dim 512, partial_rotary_factor 64/512 (d_r 64),
  // sliding_window 128, compress_rates {CSA: 4, HCA: 128}, index_n_heads 64, index_head_dim 128, index_topk 512,
  // rope_theta 1e4, compress_rope_theta 1.6e5, vocab_size 129280. Where V4-Flash's config.json differs from the class
  // defaults, the config.json: its compress_ratios (flash_compress_ratios; the class's own default layer_types are
  // V4-Pro's, two HCA layers then CSA / HCA).
  static const std::vector<V4Shape> p = {
      {"deepseek-v4-flash", "deepseek-ai/DeepSeek-V4-Flash", flash_compress_ratios(), 6, 64, 512, 64, 128, 4, 128, 64,
       128, 512, 10000.0, 160000.0, 129280,
       "DeepSeek-V4-Flash config.json (compress_ratios: layers 0-1 sliding, then CSA 4 / HCA 128 alternating; 43 "
       "layers) and transformers 5.24 DeepseekV4Config defaults (64 heads x head_dim 512, last 64 rotated; "
       "sliding_window 128; indexer 64 heads x 128, index_topk 512; rope_theta 1e4, compress_rope_theta 1.6e5 with "
       "the config.json's YaRN: factor 16, original_max_position_embeddings 65536, beta_fast 32, beta_slow 1, "
       "attention_factor 1); softmax scale 512^-1/2. Values shape-faithful only, not the trained model's statistics",
       16.0, 65536, 32.0, 1.0},
  };
  return p;
}

std::vector<double> v4_inv_freq(const V4Shape& s, bool compress) {
  const int64_t dim = s.qk_rope_head_dim, half = dim / 2;
  const double base = compress ? s.compress_rope_theta : s.rope_theta;
  std::vector<double> pos_freq(static_cast<size_t>(half)), inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    pos_freq[static_cast<size_t>(i)] = std::pow(base, static_cast<double>(2 * i) / static_cast<double>(dim));
  if (!compress || s.yarn_factor <= 0) {
    for (int64_t i = 0; i < half; ++i) inv[static_cast<size_t>(i)] = 1.0 / pos_freq[static_cast<size_t>(i)];
    return inv;
  }
  // _compute_yarn_parameters: the correction range of beta_fast / beta_slow rotations over the original context
  // (truncated: floor / ceil), a linear ramp over it from extrapolation (θ's own frequency) to interpolation (/factor)
  const double orig = static_cast<double>(s.yarn_original_max_position);
  const auto dim_of = [&](double rotations) {
    return static_cast<double>(dim) * std::log(orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  const double low = std::max(std::floor(dim_of(s.yarn_beta_fast)), 0.0);
  double high = std::min(std::ceil(dim_of(s.yarn_beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0), extra = 1 - ramp;
    const double f = pos_freq[static_cast<size_t>(i)];
    inv[static_cast<size_t>(i)] = 1.0 / (s.yarn_factor * f) * (1 - extra) + 1.0 / f * extra;
  }
  return inv;
}

const V4Shape* find_v4_preset(const std::string& name) {
  for (const V4Shape& s : v4_presets())
    if (s.name == name) return &s;
  return nullptr;
}

std::string V4Shape::layer_type(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(compress_ratios.size()))
    throw std::invalid_argument(
        fmt::format("{}: layer {} outside the model's {} layers", name, layer, compress_ratios.size()));
  const int64_t r = compress_ratios[static_cast<size_t>(layer)];
  if (r == 0) return "sliding";
  if (r == csa_rate) return "csa";
  if (r == hca_rate) return "hca";
  throw std::invalid_argument(fmt::format("{}: layer {} has compress rate {}, expected 0, {} (CSA) or {} (HCA)", name,
                                          layer, r, csa_rate, hca_rate));
}

int64_t V4Shape::compress_rate(int64_t layer) const {
  return layer_type(layer) == "sliding" ? 0 : compress_ratios[static_cast<size_t>(layer)];
}

std::string describe_v4_preset(const V4Shape& s) {
  std::vector<std::string> types;
  for (int64_t l = 0; l < s.num_layers; ++l) types.push_back(s.layer_type(l));
  return fmt::format(
      "{:<17} cache_family deepseek_v4: {} heads x head_dim {} (last {} rotated), sliding_window {}, CSA rate {} "
      "(indexer {} x {}, index_topk {}), HCA rate {}; writes layers 0-{} of {} ({}); values shape-faithful only, not "
      "the trained model's  {}\n",
      s.name, s.num_heads, s.head_dim, s.qk_rope_head_dim, s.sliding_window, s.csa_rate, s.index_n_heads,
      s.index_head_dim, s.index_topk, s.hca_rate, s.num_layers - 1, s.compress_ratios.size(), fmt::join(types, ", "),
      s.model);
}

void validate_v4(const V4SynthOptions& o) {
  const V4Shape& s = o.shape;
  const auto bad = [&](const std::string& what) { throw std::invalid_argument("synth " + s.name + ": " + what); };
  if (s.num_layers < 1 || s.num_layers > static_cast<int64_t>(s.compress_ratios.size()))
    bad(fmt::format("layers = {} must be in [1, {}] (the model's layers)", s.num_layers, s.compress_ratios.size()));
  for (int64_t l = 0; l < s.num_layers; ++l) (void)s.layer_type(l);
  for (const auto& [what, v] : {std::pair{"num_heads", s.num_heads}, {"sliding_window", s.sliding_window},
                                {"csa_rate", s.csa_rate}, {"hca_rate", s.hca_rate}, {"index_n_heads", s.index_n_heads},
                                {"index_topk", s.index_topk}, {"vocab_size", s.vocab_size}})
    if (v < 1) bad(fmt::format("{} = {} must be >= 1", what, v));
  const int64_t dr = s.qk_rope_head_dim;
  if (dr < 2 || dr % 2 || dr >= s.head_dim || dr >= s.index_head_dim)
    bad(fmt::format("qk_rope_head_dim = {} must be even, >= 2 and below head_dim = {} and index_head_dim = {}", dr,
                    s.head_dim, s.index_head_dim));
  if (!(s.rope_theta > 0 && std::isfinite(s.rope_theta) && s.compress_rope_theta > 0 &&
        std::isfinite(s.compress_rope_theta)))
    bad(fmt::format("rope_theta = {}, compress_rope_theta = {} must be finite and > 0", s.rope_theta,
                    s.compress_rope_theta));
  if (s.yarn_factor < 0 || (s.yarn_factor > 0 && (s.yarn_original_max_position < 1 || !(s.yarn_beta_fast > 0) ||
                                                    !(s.yarn_beta_slow > 0))))
    bad(fmt::format("YaRN factor = {}, original_max_position_embeddings = {}, beta_fast = {}, beta_slow = {}: expected "
                    "factor 0 (none) or > 0 with positive others",
                    s.yarn_factor, s.yarn_original_max_position, s.yarn_beta_fast, s.yarn_beta_slow));
  validate(token_options(o));
}

SynthTokens synth_v4_tokens(const V4SynthOptions& o) {
  validate_v4(o);
  return synth_tokens(token_options(o));
}

SynthV4Layer synth_v4_layer(const V4SynthOptions& o, const SynthTokens& tok, int64_t layer) {
  const V4Shape& m = o.shape;
  if (layer < 0 || layer >= m.num_layers)
    throw std::invalid_argument(fmt::format("synth_v4_layer: layer {} outside [0, {})", layer, m.num_layers));
  const int64_t T = tok.num_tokens(), Tq = static_cast<int64_t>(tok.q_rows.size()), H = m.num_heads, D = m.head_dim,
                dr = m.qk_rope_head_dim, n = m.index_n_heads, c = m.index_head_dim, k = m.index_topk;
  const uint64_t L = static_cast<uint64_t>(layer);
  SynthV4Layer d;
  d.layer_type = m.layer_type(layer);
  d.compress_rate = m.compress_rate(layer);
  d.rope_theta = d.layer_type == "sliding" ? m.rope_theta : m.compress_rope_theta;
  const std::vector<double> inv_freq = v4_inv_freq(m, d.layer_type != "sliding");
  const std::vector<int64_t> tpos(tok.positions.begin(), tok.positions.end());
  std::vector<int64_t> qpos;
  for (int32_t t : tok.q_rows) qpos.push_back(tok.positions[static_cast<size_t>(t)]);

  {  // window_kv = RoPE(γ ⊙ RMSNorm(a_t))
    std::mt19937_64 rng = synthio::stream(o.seed, kWindow, L);
    const std::vector<double> gamma = norm_weight(D, rng);
    for (size_t s = 0; s + 1 < tok.seq_offsets.size(); ++s)
      rms_norm_rows(ar1(tok.seq_offsets[s + 1] - tok.seq_offsets[s], D, rng), D, gamma, d.window_kv);
    rope_tail(d.window_kv, D, D, dr, tpos, inv_freq);
  }
  if (d.compress_rate > 0) {
    std::mt19937_64 rng = synthio::stream(o.seed, kCompress, L);
    d.compressed_kv = compressor(tok, d.compress_rate, D, dr, d.layer_type == "csa", inv_freq, rng, &d);
  }
  {  // q: q_b_norm (unweighted RMSNorm per head), RoPE at the query's position; the sinks
    std::mt19937_64 rng = synthio::stream(o.seed, kQuery, L);
    rms_norm_rows(draws(static_cast<size_t>(Tq * H * D), 1.0, rng), D, {}, d.q);
    rope_tail(d.q, H * D, D, dr, qpos, inv_freq);
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = 0; j < dr / 2; ++j) {
        const double ang = static_cast<double>(qpos[static_cast<size_t>(i)]) * inv_freq[static_cast<size_t>(j)];
        d.rope_cos.push_back(static_cast<float>(std::cos(ang)));
        d.rope_sin.push_back(static_cast<float>(std::sin(ang)));
      }
    std::mt19937_64 srng = synthio::stream(o.seed, kSinks, L);
    for (double x : draws(static_cast<size_t>(H), 1.0, srng)) d.sinks.push_back(static_cast<float>(x));
  }
  const bool csa = d.layer_type == "csa";
  if (csa) {  // the indexer: its compressor's keys, its queries and head weights, its picks
    std::mt19937_64 krng = synthio::stream(o.seed, kIndexKeys, L);
    d.index_k = compressor(tok, d.compress_rate, c, dr, true, inv_freq, krng, nullptr);
    std::mt19937_64 rng = synthio::stream(o.seed, kIndexQuery, L);
    for (double x : draws(static_cast<size_t>(Tq * n * c), 1.0, rng)) d.index_q.push_back(static_cast<float>(x));
    rope_tail(d.index_q, n * c, c, dr, qpos, inv_freq);
    for (double x : draws(static_cast<size_t>(Tq * n), inv_sqrt(n), rng))
      d.index_w.push_back(static_cast<float>(x));
    d.index_selected = indexer_picks(d, tok, n, c, d.compress_rate, k, inv_sqrt(c));
  }

  // attn_out: the V4 engine in float64 on the stored float32 arrays, rounded once.
  probes::V4Queries vq;
  vq.layer_type = probes::parse_v4_layer_type(d.layer_type);
  vq.num_heads = H, vq.head_dim = D, vq.rope_dim = dr, vq.sliding_window = m.sliding_window;
  vq.softmax_scale = inv_sqrt(D);
  vq.num_tokens = T, vq.seq_offsets = tok.seq_offsets, vq.positions = tok.positions, vq.q_rows = tok.q_rows;
  vq.q = d.q, vq.sinks = d.sinks, vq.rope_cos = d.rope_cos, vq.rope_sin = d.rope_sin;
  vq.compressed_offsets = d.compressed_offsets, vq.compressed_span = d.compressed_span;
  const probes::V4Attention<double> engine(vq);
  const probes::KeySelection sel = csa ? engine.selection_from_picks(d.index_selected, k) : probes::KeySelection{};
  const auto res = engine.run(d.window_kv, d.compressed_kv, csa ? &sel : nullptr);
  d.attn_out.assign(res.out.begin(), res.out.end());
  return d;
}

namespace {

std::string v4_config_json(const V4SynthOptions& o) {
  const V4Shape& m = o.shape;
  std::vector<std::string> types;
  for (int64_t l = 0; l < m.num_layers; ++l) types.push_back(fmt::format("\"{}\"", m.layer_type(l)));
  return fmt::format(
      "{{\"model_type\": \"latentq-synthetic\", \"preset\": \"{}\", \"model\": \"{}\", \"num_hidden_layers\": {}, "
      "\"num_attention_heads\": {}, \"head_dim\": {}, \"qk_rope_head_dim\": {}, \"sliding_window\": {}, "
      "\"compress_ratios\": [{}], \"layer_types\": [{}], \"index_n_heads\": {}, \"index_head_dim\": {}, "
      "\"index_topk\": {}, \"rope_theta\": {}, \"compress_rope_theta\": {}, \"rope_scaling\": {}, \"vocab_size\": {}, "
      "\"rms_norm_eps\": {}}}",
      m.name, m.model, m.num_layers, m.num_heads, m.head_dim, m.qk_rope_head_dim, m.sliding_window,
      fmt::join(std::vector<int64_t>(m.compress_ratios.begin(), m.compress_ratios.begin() + m.num_layers), ", "),
      fmt::join(types, ", "), m.index_n_heads, m.index_head_dim, m.index_topk, m.rope_theta, m.compress_rope_theta,
      m.yarn_factor > 0 ? fmt::format("{{\"type\": \"yarn\", \"factor\": {}, \"original_max_position_embeddings\": {}, "
                                      "\"beta_fast\": {}, \"beta_slow\": {}}}",
                                      m.yarn_factor, m.yarn_original_max_position, m.yarn_beta_fast, m.yarn_beta_slow)
                        : std::string("null"),
      m.vocab_size, kRmsEps);
}

void write_root(H5::H5File& f, const V4SynthOptions& o, const SynthTokens& tok) {
  const V4Shape& m = o.shape;
  const int64_t S = static_cast<int64_t>(tok.seq_offsets.size()) - 1;
  bool equal = true;
  for (int64_t s = 1; s < S; ++s) equal = equal && tok.seq_offsets[s + 1] - tok.seq_offsets[s] == tok.seq_offsets[1];
  h5::write_attr(f, "schema", std::string("latentq-dump/1"));
  h5::write_attr(f, "cache_family", std::string("deepseek_v4"));
  h5::write_attr(f, "model", "synthetic:" + m.name);
  h5::write_attr(f, "revision", fmt::format("synthetic-seed-{}", o.seed));
  h5::write_attr(f, "source", std::string("synthetic"));
  h5::write_attr(f, "created", utc_now_iso8601());
  h5::write_attr(f, "config_json", v4_config_json(o));
  h5::write_attr(f, "num_layers", m.num_layers);
  h5::write_attr(f, "num_heads", m.num_heads);
  h5::write_attr(f, "head_dim", m.head_dim);
  h5::write_attr(f, "qk_rope_head_dim", m.qk_rope_head_dim);
  h5::write_attr(f, "softmax_scale", inv_sqrt(m.head_dim));
  h5::write_attr(f, "softmax_scale_source", std::string("preset:" + m.name + " (head_dim^-1/2)"));
  h5::write_attr(f, "rope_layout", std::string("interleaved"));
  h5::write_attr(f, "rope_function", std::string("latentq synth (V4 apply_rotary_pos_emb on the last d_r columns)"));
  h5::write_attr(f, "original_dtype", std::string("float32"));
  h5::write_attr(f, "compute_dtype", std::string("float64"));
  h5::write_attr(f, "num_seqs", S);
  h5::write_attr(f, "seq_len", equal ? tok.seq_offsets[1] : int64_t{-1});
  h5::write_attr(f, "text_sha256", std::string(""));
  h5::write_attr(f, "tokenizer", std::string("synthetic"));
  h5::write_attr(f, "q_rows_rule", std::string("per sequence k = floor(Tq/S) (+1 for the first Tq mod S), local "
                                               "positions floor((j+1)*L/k)-1"));
  h5::write_attr(f, "synth_preset", m.name);
  h5::write_attr(f, "synth_seed", static_cast<int64_t>(o.seed));
  h5::write_attr(f, "synth_source", m.source);
  h5::write_attr(f, "synth_statistics",
                 std::string("shape-faithful only: seeded random values with V4's structure (latentq/synth_v4.h), not "
                             "the trained model's statistics"));
}

void write_layer(H5::H5File& f, const V4SynthOptions& o, const SynthTokens& tok, int64_t l, const SynthV4Layer& d) {
  using synthio::put_chunked;
  using synthio::rows_per_mib;
  const V4Shape& m = o.shape;
  const hid_t fid = f.getId();
  const std::string p = fmt::format("/layers/{:03d}/", l);
  const hsize_t T = static_cast<hsize_t>(tok.num_tokens()), Tq = tok.q_rows.size(),
                H = static_cast<hsize_t>(m.num_heads), D = static_cast<hsize_t>(m.head_dim),
                half = static_cast<hsize_t>(m.qk_rope_head_dim / 2), n = static_cast<hsize_t>(m.index_n_heads),
                c = static_cast<hsize_t>(m.index_head_dim), k = static_cast<hsize_t>(m.index_topk),
                N = d.compressed_kv.size() / D, S1 = tok.seq_offsets.size();
  const auto empty = [&](const char* name, const std::vector<hsize_t>& dims, const H5::PredType& type) {
    f.createDataSet(p + name, type, H5::DataSpace(static_cast<int>(dims.size()), dims.data()));  // contiguous, 0 rows
  };
  const auto f32 = [&](const char* name, std::vector<hsize_t> dims, const std::vector<float>& v) {
    if (dims[0] == 0) return empty(name, dims, H5::PredType::IEEE_F32LE);
    int64_t row = 1;
    for (size_t i = 1; i < dims.size(); ++i) row *= static_cast<int64_t>(dims[i]);
    std::vector<hsize_t> chunk = dims;
    chunk[0] = rows_per_mib(row);
    put_chunked(fid, p + name, dims, chunk, v.data(), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT);
  };
  const auto i64 = [&](const char* name, std::vector<hsize_t> dims, const std::vector<int64_t>& v) {
    if (dims[0] == 0) return empty(name, dims, H5::PredType::STD_I64LE);
    std::vector<hsize_t> chunk = dims;
    chunk[0] = 1 << 16;
    put_chunked(fid, p + name, dims, chunk, v.data(), H5T_STD_I64LE, H5T_NATIVE_INT64);
  };
  f32("window_kv", {T, D}, d.window_kv);
  put_chunked(fid, p + "q_rows", {Tq}, {1 << 16}, tok.q_rows.data(), H5T_STD_I32LE, H5T_NATIVE_INT32);
  f32("q", {Tq, H, D}, d.q);
  f32("rope_cos", {Tq, half}, d.rope_cos);
  f32("rope_sin", {Tq, half}, d.rope_sin);
  f32("attn_out", {Tq, H, D}, d.attn_out);
  f32("sinks", {H}, d.sinks);
  if (d.compress_rate > 0) {
    f32("compressed_kv", {N, D}, d.compressed_kv);
    i64("compressed_span", {N, 2}, d.compressed_span);
    i64("compressed_rope_position", {N}, d.compressed_rope_position);
    i64("compressed_offsets", {S1}, d.compressed_offsets);
  }
  if (d.layer_type == "csa") {
    f32("index_k", {N, c}, d.index_k);
    f32("index_q", {Tq, n, c}, d.index_q);
    f32("index_w", {Tq, n}, d.index_w);
    i64("index_selected", {Tq, k}, d.index_selected);
  }
  H5::Group g = f.openGroup(p.substr(0, p.size() - 1));
  h5::write_attr(g, "module", fmt::format("model.layers.{}.self_attn", l));
  h5::write_attr(g, "layer", l);
  h5::write_attr(g, "layer_type", d.layer_type);
  h5::write_attr(g, "compress_rate", d.compress_rate);
  h5::write_attr(g, "sliding_window", m.sliding_window);
  h5::write_attr(g, "softmax_scale", inv_sqrt(m.head_dim));
  h5::write_attr(g, "rope_dims", fmt::format("last {}, interleaved pairs", m.qk_rope_head_dim));
  h5::write_attr(g, "rope_layer_type", std::string(d.layer_type == "sliding" ? "main" : "compress"));
  h5::write_attr(g, "rope_theta", d.rope_theta);
  if (d.layer_type == "csa") {
    h5::write_attr(g, "index_topk", m.index_topk);
    h5::write_attr(g, "index_softmax_scale", inv_sqrt(m.index_head_dim));
  }
}

}  // namespace

void write_synth_v4_dump(const fs::path& out_path, const V4SynthOptions& o,
                         const std::function<void(int64_t)>& on_layer) {
  const SynthTokens tok = synth_v4_tokens(o);  // validates
  synthio::write_via_temp(out_path, [&](H5::H5File& f) {
    write_root(f, o, tok);
    const hid_t fid = f.getId();
    synthio::put_token_arrays(fid, tok);
    for (int64_t l = 0; l < o.shape.num_layers; ++l) {
      write_layer(f, o, tok, l, synth_v4_layer(o, tok, l));
      H5Fflush(fid, H5F_SCOPE_LOCAL);
      if (on_layer) on_layer(l);
    }
  });
}

}  // namespace latentq
