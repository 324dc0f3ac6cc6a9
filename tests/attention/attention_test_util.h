// Shared helpers of the attention tests (test_attention.cpp, test_decode_order.cpp): a random layer at a
// realistic scale and a literal loop reference of the absorbed attention.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "latentq/decode_order.h"
#include "latentq/attention/attention.h"
#include "latentq/quantize.h"
#include "probe_test_util.h"

using namespace latentq::probes;

namespace {

/// A random layer at a realistic scale: c_kv and k_pe ~ N(0, 1) (c_kv is RMS-normalized in a model),
/// W_UK, W_UV ~ N(0, 1/r) so k_nope, v ~ N(0, 1), q ~ N(0, 2²): scores with sd ≈ 2 after the scale
/// (nope+rope)^-1/2, some rows peaked, as in a trained model.
struct RandomLayer {
  MlaDims dims;
  int64_t T = 0;
  std::vector<int64_t> seq_offsets;
  std::vector<int32_t> q_rows;
  std::vector<float> q_nope, q_pe, w_uk, w_uv, c_kv, k_pe;
  double scale = 0;
  uint64_t seed = 0;

  AttentionQueries queries() const { return {dims, T, seq_offsets, q_rows, q_nope, q_pe, w_uk, w_uv, scale}; }
  std::string describe() const {
    return "seed " + std::to_string(seed) + " T " + std::to_string(T) + " S " + std::to_string(seq_offsets.size() - 1) +
           " Tq " + std::to_string(q_rows.size()) + " H " + std::to_string(dims.num_heads) + " r " +
           std::to_string(dims.kv_lora_rank) + " nope " + std::to_string(dims.qk_nope_head_dim) + " rope " +
           std::to_string(dims.qk_rope_head_dim) + " v " + std::to_string(dims.v_head_dim);
  }
};

inline RandomLayer make_layer(uint64_t seed, int64_t S, int64_t L, int64_t Tq, MlaDims d) {
  std::mt19937_64 rng(seed);
  RandomLayer l;
  l.seed = seed;
  l.dims = d;
  l.T = S * L;
  for (int64_t s = 0; s <= S; ++s) l.seq_offsets.push_back(s * L);
  // Distinct query tokens in random order, always including each sequence's first token (1 key)
  // and last token (L keys).
  std::vector<int32_t> all(static_cast<size_t>(l.T));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  for (int64_t s = 0; s < S; ++s) {
    l.q_rows.push_back(static_cast<int32_t>(s * L));
    l.q_rows.push_back(static_cast<int32_t>(s * L + L - 1));
  }
  for (int32_t t : all) {
    if (static_cast<int64_t>(l.q_rows.size()) >= Tq) break;
    if (t % L != 0 && t % L != L - 1) l.q_rows.push_back(t);
  }
  std::shuffle(l.q_rows.begin(), l.q_rows.end(), rng);
  const int64_t H = d.num_heads, r = d.kv_lora_rank;
  const int64_t nq = static_cast<int64_t>(l.q_rows.size());
  l.q_nope = probe_test::gaussian_vec(rng, nq * H * d.qk_nope_head_dim, 2.0);
  l.q_pe = probe_test::gaussian_vec(rng, nq * H * d.qk_rope_head_dim, 2.0);
  l.w_uk = probe_test::gaussian_vec(rng, H * d.qk_nope_head_dim * r, 1.0 / std::sqrt(double(r)));
  l.w_uv = probe_test::gaussian_vec(rng, H * d.v_head_dim * r, 1.0 / std::sqrt(double(r)));
  l.c_kv = probe_test::gaussian_vec(rng, l.T * r);
  l.k_pe = probe_test::gaussian_vec(rng, l.T * d.qk_rope_head_dim);
  l.scale = 1.0 / std::sqrt(double(d.qk_nope_head_dim + d.qk_rope_head_dim));
  return l;
}

const MlaDims kTinyMla{6, 128, 64, 32, 64};  // tiny-mla: H, kv_lora_rank, nope, rope, v

template <typename Scalar>
double rel_fro(const std::vector<Scalar>& ref, const std::vector<Scalar>& x) {
  double e = 0, n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    e += (double(x[i]) - double(ref[i])) * (double(x[i]) - double(ref[i]));
    n += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(e / n);
}

/// Plain loops in float64, straight from the einsums (no Eigen, no absorption).
struct LoopReference {
  std::vector<double> out;    // [Tq, H, v]
  std::vector<double> probs;  // same layout as AttentionResult::probs
};
/// sel: sparse attention's keys per query row (KeySelection; null or empty: every key of the window): a key the
/// row does not select has probability 0 and no share of the output.
inline LoopReference loop_reference(const RandomLayer& l, const KeySelection* sel = nullptr) {
  const MlaDims& d = l.dims;
  const int64_t H = d.num_heads, r = d.kv_lora_rank, nope = d.qk_nope_head_dim, rope = d.qk_rope_head_dim,
                v = d.v_head_dim;
  LoopReference ref;
  ref.out.assign(l.q_rows.size() * H * v, 0.0);
  for (size_t i = 0; i < l.q_rows.size(); ++i) {
    const int64_t t = l.q_rows[i];
    int64_t s0 = 0;
    for (size_t s = 0; s + 1 < l.seq_offsets.size(); ++s)
      if (l.seq_offsets[s] <= t && t < l.seq_offsets[s + 1]) s0 = l.seq_offsets[s];
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> sc;
      for (int64_t j = s0; j <= t; ++j) {
        double a = 0;
        for (int64_t dn = 0; dn < nope; ++dn) {
          double k = 0;
          for (int64_t c = 0; c < r; ++c) k += double(l.w_uk[(h * nope + dn) * r + c]) * l.c_kv[j * r + c];
          a += double(l.q_nope[(i * H + h) * nope + dn]) * k;
        }
        for (int64_t dr = 0; dr < rope; ++dr) a += double(l.q_pe[(i * H + h) * rope + dr]) * l.k_pe[j * rope + dr];
        bool read = !sel || sel->empty();
        if (!read)
          for (int64_t e = sel->offsets[i]; e < sel->offsets[i + 1]; ++e) read = read || sel->keys[e] == j - s0;
        sc.push_back(read ? a * l.scale : -INFINITY);
      }
      const double m = *std::max_element(sc.begin(), sc.end());
      double z = 0;
      for (auto& x : sc) z += (x = std::exp(x - m));
      for (auto& x : sc) x /= z;
      for (int64_t dv = 0; dv < v; ++dv) {
        double o = 0;
        for (int64_t j = s0; j <= t; ++j) {
          double vv = 0;
          for (int64_t c = 0; c < r; ++c) vv += double(l.w_uv[(h * v + dv) * r + c]) * l.c_kv[j * r + c];
          o += sc[j - s0] * vv;
        }
        ref.out[(i * H + h) * v + dv] = o;
      }
      ref.probs.insert(ref.probs.end(), sc.begin(), sc.end());
    }
  }
  return ref;
}

}  // namespace
