#include "synth_v4.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "latentq/h5util.h"
#include "synth_dump.h"

namespace lqtest {
namespace fs = std::filesystem;

SynthV4 make_synth_v4(const SynthV4Spec& s) {
  SynthV4 d;
  d.spec = s;
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> N(0.0f, 1.0f);
  const auto randn = [&](int64_t n, float scale) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = scale * N(rng);
    return v;
  };
  d.seq_offsets = {0};
  for (int64_t n : s.seq_lens) d.seq_offsets.push_back(d.seq_offsets.back() + n);
  d.T = d.seq_offsets.back();
  for (int64_t t = 0; t < d.T; ++t) d.tokens.push_back(static_cast<int32_t>(rng() % 256));
  for (int64_t n : s.seq_lens)
    for (int64_t p = 0; p < n; ++p) d.positions.push_back(static_cast<int32_t>(p));
  for (int64_t j = 0; j < s.query_rows; ++j) d.q_rows.push_back(static_cast<int32_t>((j + 1) * d.T / s.query_rows - 1));
  const int64_t T = d.T, D = s.head_dim, H = s.num_heads, Tq = s.query_rows, c = s.index_dim, nh = s.index_heads;
  for (const std::string& type : s.layer_types) {
    SynthV4Layer L;
    L.type = type;
    L.rate = type == "csa" ? s.csa_rate : type == "hca" ? s.hca_rate : 0;
    L.window_kv = randn(T * D, 1.0f);
    L.q = randn(Tq * H * D, 1.0f);
    L.rope_cos = randn(Tq * s.qk_rope_head_dim / 2, 1.0f);
    L.rope_sin = randn(Tq * s.qk_rope_head_dim / 2, 1.0f);
    L.attn_out = randn(Tq * H * D, 1.0f);
    L.sinks = randn(H, 1.0f);
    if (L.rate > 0) {
      L.offsets = {0};
      for (int64_t n : s.seq_lens) {
        for (int64_t w = 0; w < n / L.rate; ++w) {
          L.span.push_back(type == "csa" ? std::max<int64_t>(0, (w - 1) * L.rate) : w * L.rate);
          L.span.push_back((w + 1) * L.rate);
          L.rope_position.push_back(w * L.rate);
        }
        L.offsets.push_back(L.offsets.back() + n / L.rate);
      }
      L.compressed_kv = randn(L.offsets.back() * D, 1.0f);
    }
    if (type == "csa") {
      L.index_k = randn(L.offsets.back() * c, 2.0f);
      L.index_q = randn(Tq * nh * c, 1.0f);
      L.index_w = randn(Tq * nh, 1.0f);
      for (int32_t t : d.q_rows) {
        const auto sq = std::upper_bound(d.seq_offsets.begin(), d.seq_offsets.end(), t) - d.seq_offsets.begin() - 1;
        const int64_t visible = (t - d.seq_offsets[sq] + 1) / L.rate;
        for (int64_t j = 0; j < s.index_topk; ++j) L.selected.push_back(j < visible ? visible - 1 - j : -1);
      }
    }
    d.layers.push_back(std::move(L));
  }
  return d;
}

void write_synth_v4(const fs::path& path, const SynthV4& d) {
  namespace h5 = latentq::h5;
  h5::quiet();
  const SynthV4Spec& s = d.spec;
  {
    H5::H5File f(path.string(), H5F_ACC_TRUNC);
    h5::write_attr(f, "schema", std::string("latentq-dump/1"));
    h5::write_attr(f, "cache_family", std::string("deepseek_v4"));
    h5::write_attr(f, "model", std::string("synthetic-v4"));
    h5::write_attr(f, "revision", std::string("seed-" + std::to_string(s.seed)));
    h5::write_attr(f, "source", std::string("synthetic"));
    h5::write_attr(f, "config_json", std::string("{}"));
    h5::write_attr(f, "rope_layout", std::string("interleaved"));
    h5::write_attr(f, "original_dtype", std::string("float32"));
    h5::write_attr(f, "num_layers", static_cast<int64_t>(s.layer_types.size()));
    h5::write_attr(f, "num_heads", s.num_heads);
    h5::write_attr(f, "head_dim", s.head_dim);
    h5::write_attr(f, "qk_rope_head_dim", s.qk_rope_head_dim);
    h5::write_attr(f, "softmax_scale", 1.0 / std::sqrt(static_cast<double>(s.head_dim)));
    f.createGroup("/layers");
    for (size_t l = 0; l < d.layers.size(); ++l) {
      const SynthV4Layer& L = d.layers[l];
      char g[32];
      std::snprintf(g, sizeof g, "/layers/%03zu", l);
      H5::Group lg = f.createGroup(g);
      h5::write_attr(lg, "layer_type", L.type);
      h5::write_attr(lg, "compress_rate", L.rate);
      h5::write_attr(lg, "sliding_window", s.sliding_window);
      h5::write_attr(lg, "softmax_scale", 1.0 / std::sqrt(static_cast<double>(s.head_dim)));
      if (L.type == "csa") {
        h5::write_attr(lg, "index_topk", s.index_topk);
        h5::write_attr(lg, "index_softmax_scale", 1.0 / std::sqrt(static_cast<double>(s.index_dim)));
      }
    }
  }
  const auto T = static_cast<hsize_t>(d.T), D = static_cast<hsize_t>(s.head_dim), H = static_cast<hsize_t>(s.num_heads),
             Tq = static_cast<hsize_t>(s.query_rows), half = static_cast<hsize_t>(s.qk_rope_head_dim / 2),
             c = static_cast<hsize_t>(s.index_dim), nh = static_cast<hsize_t>(s.index_heads);
  put_i32(path, "/tokens", {T}, d.tokens);
  put_i32(path, "/positions", {T}, d.positions);
  put_i64(path, "/seq_offsets", {d.seq_offsets.size()}, d.seq_offsets);
  for (size_t l = 0; l < d.layers.size(); ++l) {
    const SynthV4Layer& L = d.layers[l];
    char g[32];
    std::snprintf(g, sizeof g, "/layers/%03zu/", l);
    const std::string p(g);
    put_f32(path, p + "window_kv", {T, D}, L.window_kv);
    put_i32(path, p + "q_rows", {Tq}, d.q_rows);
    put_f32(path, p + "q", {Tq, H, D}, L.q);
    put_f32(path, p + "rope_cos", {Tq, half}, L.rope_cos);
    put_f32(path, p + "rope_sin", {Tq, half}, L.rope_sin);
    put_f32(path, p + "attn_out", {Tq, H, D}, L.attn_out);
    put_f32(path, p + "sinks", {H}, L.sinks);
    if (L.rate > 0) {
      const auto N = static_cast<hsize_t>(L.offsets.back());
      put_f32(path, p + "compressed_kv", {N, D}, L.compressed_kv);
      put_i64(path, p + "compressed_span", {N, 2}, L.span);
      put_i64(path, p + "compressed_rope_position", {N}, L.rope_position);
      put_i64(path, p + "compressed_offsets", {L.offsets.size()}, L.offsets);
      if (L.type == "csa") {
        put_f32(path, p + "index_k", {N, c}, L.index_k);
        put_f32(path, p + "index_q", {Tq, nh, c}, L.index_q);
        put_f32(path, p + "index_w", {Tq, nh}, L.index_w);
        put_i64(path, p + "index_selected", {Tq, static_cast<hsize_t>(s.index_topk)}, L.selected);
      }
    }
  }
}

namespace {
template <class F>
void with_object(const fs::path& path, const std::string& object, F&& f) {
  latentq::h5::quiet();
  H5::H5File file(path.string(), H5F_ACC_RDWR);
  if (object == "/") {
    f(static_cast<H5::H5Object&>(file));
  } else {
    H5::Group g = file.openGroup(object);
    f(static_cast<H5::H5Object&>(g));
  }
}
}  // namespace

void set_attr_at(const fs::path& path, const std::string& object, const std::string& name, const std::string& value) {
  with_object(path, object, [&](H5::H5Object& o) { latentq::h5::write_attr(o, name, value); });
}
void set_attr_at(const fs::path& path, const std::string& object, const std::string& name, int64_t value) {
  with_object(path, object, [&](H5::H5Object& o) { latentq::h5::write_attr(o, name, value); });
}
void delete_attr_at(const fs::path& path, const std::string& object, const std::string& name) {
  with_object(path, object, [&](H5::H5Object& o) { o.removeAttr(name); });
}

}  // namespace lqtest
