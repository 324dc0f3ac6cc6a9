#include "synth_dump.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>

#include "latentq/h5util.h"
#include "latentq/attention/attention.h"

namespace lqtest {
namespace fs = std::filesystem;
namespace h5 = latentq::h5;

SynthData make_synth(const SynthSpec& s) {
  SynthData d;
  d.spec = s;
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> N(0.0f, 1.0f);
  d.seq_offsets = {0};
  for (int64_t n : s.seq_lens) d.seq_offsets.push_back(d.seq_offsets.back() + n);
  d.T = d.seq_offsets.back();
  for (int64_t t = 0; t < d.T; ++t) d.tokens.push_back(static_cast<int32_t>(rng() % 256));
  for (int64_t n : s.seq_lens)
    for (int64_t p = 0; p < n; ++p) d.positions.push_back(static_cast<int32_t>(p));
  for (int64_t j = 0; j < s.query_rows; ++j) d.q_rows.push_back(static_cast<int32_t>((j + 1) * d.T / s.query_rows - 1));
  auto randn = [&](size_t n, float scale) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * N(rng);
    return v;
  };
  const int64_t T = d.T, r = s.kv_lora_rank, dr = s.qk_rope_head_dim, H = s.num_heads, dn = s.qk_nope_head_dim,
                dv = s.v_head_dim, Tq = s.query_rows;
  for (int l = 0; l < s.layers; ++l) {
    auto c = randn(static_cast<size_t>(T * r), 1.0f);
    if (s.outlier_channel >= 0)
      for (int64_t t = 0; t < T; ++t) c[static_cast<size_t>(t * r + s.outlier_channel)] *= s.outlier_scale;
    d.c_kv.push_back(c);
    d.k_pe.push_back(randn(static_cast<size_t>(T * dr), 3.0f));
    d.q_nope.push_back(randn(static_cast<size_t>(Tq * H * dn), 1.0f));
    d.q_pe.push_back(randn(static_cast<size_t>(Tq * H * dr), 1.0f));
    d.w_uk.push_back(randn(static_cast<size_t>(H * dn * r), 1.0f));
    d.w_uv.push_back(randn(static_cast<size_t>(H * dv * r), 1.0f));
    d.attn_out.push_back(randn(static_cast<size_t>(Tq * H * dv), 1.0f));  // drawn to keep the RNG stream
  }
  // attn_out as the model would give it: the absorbed attention on these latents (float64, rounded
  // once), so the /attention_check of a synthetic dump passes.
  for (int l = 0; l < s.layers; ++l) {
    latentq::probes::AttentionQueries q;
    q.dims = {H, r, dn, dr, dv};
    q.num_tokens = T;
    q.seq_offsets = d.seq_offsets;
    q.q_rows = d.q_rows;
    q.q_nope = d.q_nope[l];
    q.q_pe = d.q_pe[l];
    q.w_uk = d.w_uk[l];
    q.w_uv = d.w_uv[l];
    q.softmax_scale = kSynthSoftmaxScale;
    const auto out = latentq::probes::absorbed_attention<double>(q, d.c_kv[l], d.k_pe[l]).out;
    std::transform(out.begin(), out.end(), d.attn_out[l].begin(), [](double x) { return static_cast<float>(x); });
  }
  return d;
}

namespace {

template <class T>
void put(H5::H5File& f, const std::string& name, const std::vector<hsize_t>& dims, const T* data,
         const H5::PredType& file_type, const H5::PredType& mem_type) {
  if (h5::exists(f, name)) H5Ldelete(f.getId(), name.c_str(), H5P_DEFAULT);
  // Create intermediate groups.
  const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  const H5::DataSpace sp(static_cast<int>(dims.size()), dims.data());
  const hid_t ds = H5Dcreate2(f.getId(), name.c_str(), file_type.getId(), sp.getId(), lcpl, H5P_DEFAULT, H5P_DEFAULT);
  H5Pclose(lcpl);
  if (ds < 0) throw std::runtime_error("cannot create " + name);
  size_t n = 1;
  for (hsize_t x : dims) n *= x;
  if (n) H5Dwrite(ds, mem_type.getId(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  H5Dclose(ds);
}

template <class F>
void with_file(const fs::path& path, F&& f) {
  H5::H5File file(path.string(), H5F_ACC_RDWR);
  f(file);
}

}  // namespace

void write_synth(const fs::path& path, const SynthData& d) {
  h5::quiet();
  H5::H5File f(path.string(), H5F_ACC_TRUNC);
  const SynthSpec& s = d.spec;
  h5::write_attr(f, "schema", std::string("latentq-dump/1"));
  h5::write_attr(f, "model", std::string("synthetic"));
  h5::write_attr(f, "revision", std::string("seed-" + std::to_string(s.seed)));
  h5::write_attr(f, "source", std::string("synthetic"));
  h5::write_attr(f, "created", std::string("2025-01-01T00:00:00Z"));
  h5::write_attr(f, "config_json", std::string("{}"));
  h5::write_attr(f, "rope_layout", std::string("interleaved"));
  h5::write_attr(f, "original_dtype", std::string("float32"));
  h5::write_attr(f, "num_layers", static_cast<int64_t>(s.layers));
  h5::write_attr(f, "num_heads", s.num_heads);
  h5::write_attr(f, "kv_lora_rank", s.kv_lora_rank);
  h5::write_attr(f, "qk_rope_head_dim", s.qk_rope_head_dim);
  h5::write_attr(f, "qk_nope_head_dim", s.qk_nope_head_dim);
  h5::write_attr(f, "v_head_dim", s.v_head_dim);
  h5::write_attr(f, "softmax_scale", kSynthSoftmaxScale);
  const hsize_t T = static_cast<hsize_t>(d.T);
  put(f, "/tokens", {T}, d.tokens.data(), H5::PredType::STD_I32LE, H5::PredType::NATIVE_INT32);
  put(f, "/positions", {T}, d.positions.data(), H5::PredType::STD_I32LE, H5::PredType::NATIVE_INT32);
  put(f, "/seq_offsets", {d.seq_offsets.size()}, d.seq_offsets.data(), H5::PredType::STD_I64LE,
      H5::PredType::NATIVE_INT64);
  const hsize_t r = static_cast<hsize_t>(s.kv_lora_rank), dr = static_cast<hsize_t>(s.qk_rope_head_dim),
                H = static_cast<hsize_t>(s.num_heads), dn = static_cast<hsize_t>(s.qk_nope_head_dim),
                dv = static_cast<hsize_t>(s.v_head_dim), Tq = static_cast<hsize_t>(s.query_rows);
  const auto F32 = H5::PredType::IEEE_F32LE;
  const auto MF = H5::PredType::NATIVE_FLOAT;
  for (int l = 0; l < s.layers; ++l) {
    char g[32];
    std::snprintf(g, sizeof g, "/layers/%03d/", l);
    const std::string p(g);
    put(f, p + "c_kv", {T, r}, d.c_kv[l].data(), F32, MF);
    put(f, p + "k_pe", {T, dr}, d.k_pe[l].data(), F32, MF);
    if (!s.attention) continue;
    put(f, p + "q_rows", {Tq}, d.q_rows.data(), H5::PredType::STD_I32LE, H5::PredType::NATIVE_INT32);
    put(f, p + "q_nope", {Tq, H, dn}, d.q_nope[l].data(), F32, MF);
    put(f, p + "q_pe", {Tq, H, dr}, d.q_pe[l].data(), F32, MF);
    put(f, p + "w_uk", {H, dn, r}, d.w_uk[l].data(), F32, MF);
    put(f, p + "w_uv", {H, dv, r}, d.w_uv[l].data(), F32, MF);
    put(f, p + "attn_out", {Tq, H, dv}, d.attn_out[l].data(), F32, MF);
  }
}

void delete_link(const fs::path& path, const std::string& name) {
  with_file(path, [&](H5::H5File& f) { H5Ldelete(f.getId(), name.c_str(), H5P_DEFAULT); });
}
void delete_attr(const fs::path& path, const std::string& name) {
  with_file(path, [&](H5::H5File& f) { f.removeAttr(name); });
}
void set_string_attr(const fs::path& path, const std::string& name, const std::string& value) {
  with_file(path, [&](H5::H5File& f) { h5::write_attr(f, name, value); });
}
void set_int_attr(const fs::path& path, const std::string& name, int64_t value) {
  with_file(path, [&](H5::H5File& f) { h5::write_attr(f, name, value); });
}
void set_double_attr(const fs::path& path, const std::string& name, double value) {
  with_file(path, [&](H5::H5File& f) { h5::write_attr(f, name, value); });
}
void put_f32(const fs::path& path, const std::string& name, const std::vector<hsize_t>& dims,
             const std::vector<float>& v) {
  with_file(path,
            [&](H5::H5File& f) { put(f, name, dims, v.data(), H5::PredType::IEEE_F32LE, H5::PredType::NATIVE_FLOAT); });
}
void put_f64(const fs::path& path, const std::string& name, const std::vector<hsize_t>& dims,
             const std::vector<double>& v) {
  with_file(path, [&](H5::H5File& f) {
    put(f, name, dims, v.data(), H5::PredType::IEEE_F64LE, H5::PredType::NATIVE_DOUBLE);
  });
}
void put_i64(const fs::path& path, const std::string& name, const std::vector<hsize_t>& dims,
             const std::vector<int64_t>& v) {
  with_file(path,
            [&](H5::H5File& f) { put(f, name, dims, v.data(), H5::PredType::STD_I64LE, H5::PredType::NATIVE_INT64); });
}
void put_i32(const fs::path& path, const std::string& name, const std::vector<hsize_t>& dims,
             const std::vector<int32_t>& v) {
  with_file(path,
            [&](H5::H5File& f) { put(f, name, dims, v.data(), H5::PredType::STD_I32LE, H5::PredType::NATIVE_INT32); });
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  dir_ = fs::temp_directory_path() / ("latentq-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(dir_);
  fs::create_directories(dir_);
}
TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}
std::vector<std::string> TempDir::entries() const {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace lqtest
