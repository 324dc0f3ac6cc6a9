// Synthetic latentq-dump/1 files for the study tests, written with the HDF5 C++ API, and
// helpers to break them in one way each (bad-input tests).
#pragma once

#include <H5Cpp.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace lqtest {

struct SynthSpec {
  int layers = 3;
  std::vector<int64_t> seq_lens = {40, 24};  ///< T = sum
  int64_t kv_lora_rank = 16, qk_rope_head_dim = 8, num_heads = 2, qk_nope_head_dim = 4, v_head_dim = 4;
  int64_t query_rows = 6;
  bool attention = true;
  uint64_t seed = 1234;
  int outlier_channel = 3;  ///< c_kv channel scaled by outlier_scale (-1: none)
  float outlier_scale = 20.0f;
};

/// The data a synthetic dump holds (row-major, as in the file).
struct SynthData {
  SynthSpec spec;
  int64_t T = 0;
  std::vector<int32_t> tokens, positions, q_rows;
  std::vector<int64_t> seq_offsets;
  std::vector<std::vector<float>> c_kv, k_pe, q_nope, q_pe, w_uk, w_uv, attn_out;  ///< per layer
};

/// The softmax_scale attribute of a synthetic dump.
inline constexpr double kSynthSoftmaxScale = 0.125;

/// Random data: c_kv ~ N(0,1) (channel outlier_channel × outlier_scale), k_pe ~ 3·N(0,1), q_nope,
/// q_pe, W_UK, W_UV ~ N(0,1), from std::mt19937_64(seed); attn_out = the absorbed attention of those
/// (latentq/attention/attention.h, float64, rounded to float32).
SynthData make_synth(const SynthSpec& spec = {});

/// Write `d` as a latentq-dump/1 file.
void write_synth(const std::filesystem::path& path, const SynthData& d);

// ---- mutations of an existing file (open read-write, change one thing) ----
void delete_link(const std::filesystem::path& path, const std::string& name);
void delete_attr(const std::filesystem::path& path, const std::string& name);
void set_string_attr(const std::filesystem::path& path, const std::string& name, const std::string& value);
void set_int_attr(const std::filesystem::path& path, const std::string& name, int64_t value);
/// Write the root attribute `name` as a float64 scalar (e.g. softmax_scale).
void set_double_attr(const std::filesystem::path& path, const std::string& name, double value);
/// Replace dataset `name` by a float32 / float64 / int64 dataset of shape `dims` with `values`.
void put_f32(const std::filesystem::path& path, const std::string& name, const std::vector<hsize_t>& dims,
             const std::vector<float>& values);
void put_f64(const std::filesystem::path& path, const std::string& name, const std::vector<hsize_t>& dims,
             const std::vector<double>& values);
void put_i64(const std::filesystem::path& path, const std::string& name, const std::vector<hsize_t>& dims,
             const std::vector<int64_t>& values);
void put_i32(const std::filesystem::path& path, const std::string& name, const std::vector<hsize_t>& dims,
             const std::vector<int32_t>& values);

/// A fresh, empty directory under the system temp dir for one test (removed at exit of the object).
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return dir_; }
  std::filesystem::path operator/(const std::string& name) const { return dir_ / name; }
  /// Names of the entries of the directory (to check that nothing, or no temp file, was left).
  std::vector<std::string> entries() const;

 private:
  std::filesystem::path dir_;
};

}  // namespace lqtest
