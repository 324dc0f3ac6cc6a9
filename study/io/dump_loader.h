// dump_loader.h — the reader of one dump file shared by study/io/dump.cpp (the MLA families) and
// study/io/dump_v4.cpp (DeepSeek-V4): dtype and shape checks, reads that refuse a dataset not written in full,
// finiteness, every message starting with the file's path. Internal to study/io.
#pragma once

#include <H5Cpp.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "latentq/dump.h"
#include "latentq/h5util.h"
#include "latentq/quantize.h"  // count_nonfinite

namespace latentq::dumpio {

enum class DType { I32, I64, F32 };
inline const char* dtype_str(DType d) { return d == DType::I32 ? "int32" : d == DType::I64 ? "int64" : "float32"; }

inline bool dtype_is(const H5::DataType& t, DType want) {
  if (want == DType::F32) return t.getClass() == H5T_FLOAT && t.getSize() == 4;
  if (t.getClass() != H5T_INTEGER) return false;
  const H5::IntType it(t.getId());
  return it.getSign() != H5T_SGN_NONE && t.getSize() == (want == DType::I32 ? 4u : 8u);
}

inline std::string layer_group(int index) { return fmt::format("/layers/{:03d}", index); }

// Reads one file; `where` tracks the object being read for HDF5 error messages.
class Loader {
 public:
  Loader(const std::filesystem::path& path, const H5::H5File& file) : path_(path.string()), file_(file) {}

  [[noreturn]] void invalid(const std::string& msg) const { throw std::invalid_argument(path_ + ": " + msg); }

  // ---- attributes ----
  bool has_attr(const std::string& name) const { return file_.attrExists(name); }
  H5::Attribute attr(const std::string& name, const char* expected) {
    where_ = "root attribute '" + name + "'";
    if (!file_.attrExists(name)) invalid(fmt::format("missing root attribute '{}' (expected {})", name, expected));
    return file_.openAttribute(name);
  }
  std::string str_attr(const std::string& name) {
    const H5::Attribute a = attr(name, "a string");
    if (a.getTypeClass() != H5T_STRING)
      invalid(fmt::format("root attribute '{}' has type {}, expected a string", name, h5::dtype_name(a.getDataType())));
    single(a, name, "a string");
    return h5::read_string_attr(a);
  }
  // An attribute holding one value (a scalar or a one-element array).
  void single(const H5::Attribute& a, const std::string& name, const char* expected) const {
    if (const hssize_t n = a.getSpace().getSimpleExtentNpoints(); n != 1)
      invalid(fmt::format("root attribute '{}' holds {} values, expected {}", name, n, expected));
  }
  H5::Attribute scalar_attr(const std::string& name, H5T_class_t cls, const char* expected) {
    const H5::Attribute a = attr(name, expected);
    if (a.getTypeClass() != cls)
      invalid(
          fmt::format("root attribute '{}' has type {}, expected {}", name, h5::dtype_name(a.getDataType()), expected));
    single(a, name, expected);
    return a;
  }
  int64_t int_attr(const std::string& name, int64_t min_value) {
    int64_t v = 0;
    scalar_attr(name, H5T_INTEGER, "an integer").read(H5::PredType::NATIVE_INT64, &v);
    if (v < min_value) invalid(fmt::format("root attribute '{}' = {}, expected an integer >= {}", name, v, min_value));
    return v;
  }
  double float_attr(const std::string& name) {
    double v = 0;
    scalar_attr(name, H5T_FLOAT, "a float").read(H5::PredType::NATIVE_DOUBLE, &v);
    return v;
  }

  // ---- datasets ----
  bool has(const std::string& name) const { return h5::exists(file_, name); }

  // Opens `name` and checks dtype and shape. expected[i] < 0 means "any extent".
  H5::DataSet open(const std::string& name, DType dt, const std::vector<int64_t>& expected, const std::string& why) {
    where_ = name;
    if (!has(name)) invalid(fmt::format("missing dataset {} ({} {})", name, dtype_str(dt), why));
    if (file_.childObjType(name) != H5O_TYPE_DATASET) invalid(fmt::format("{} is not a dataset", name));
    H5::DataSet ds = file_.openDataSet(name);
    const H5::DataType t = ds.getDataType();
    if (!dtype_is(t, dt)) invalid(fmt::format("{} has dtype {}, expected {}", name, h5::dtype_name(t), dtype_str(dt)));
    const std::vector<hsize_t> d = h5::dims_of(ds);
    bool ok = d.size() == expected.size();
    for (size_t i = 0; ok && i < d.size(); ++i) ok = expected[i] < 0 || static_cast<int64_t>(d[i]) == expected[i];
    if (!ok) {
      std::vector<std::string> e;
      for (int64_t x : expected) e.push_back(x < 0 ? "*" : std::to_string(x));
      invalid(fmt::format("{} has shape {}, expected [{}] ({})", name, h5::shape_str(d), fmt::join(e, ", "), why));
    }
    return ds;
  }

  // The element count of `ds`, checked before its memory is allocated: every value must be stored in
  // the file. HDF5 reads fill values for storage that was never written, so a dataset declared with
  // an extent but written in part (an interrupted writer) or not at all would load as zeros, and a
  // file of a few kB could ask for gigabytes.
  size_t stored_count(const H5::DataSet& ds, const std::string& name, size_t mem_size) {
    const std::vector<hsize_t> d = h5::dims_of(ds);
    const size_t file_size = ds.getDataType().getSize();
    size_t n = 1, bytes = 0;
    for (hsize_t x : d)
      if (__builtin_mul_overflow(n, x, &n)) n = std::numeric_limits<size_t>::max();
    if (__builtin_mul_overflow(n, std::max(mem_size, file_size), &bytes))
      invalid(fmt::format("{} has shape {}: too many elements to hold in memory", name, h5::shape_str(d)));
    if (n == 0) return 0;
    const H5::DSetCreatPropList cp = ds.getCreatePlist();
    switch (cp.getLayout()) {
      case H5D_CHUNKED: {
        std::vector<hsize_t> c(d.size());
        cp.getChunk(static_cast<int>(c.size()), c.data());
        hsize_t chunks = 1, written = 0;
        for (size_t i = 0; i < d.size(); ++i) chunks *= c[i] ? (d[i] + c[i] - 1) / c[i] : 0;
        if (const H5::DataSpace all = ds.getSpace(); H5Dget_num_chunks(ds.getId(), all.getId(), &written) < 0)
          throw H5::DataSetIException("H5Dget_num_chunks", "cannot count the written chunks");
        if (written < chunks)
          invalid(
              fmt::format("{} has shape {} in {} chunks, of which {} are written: the dataset was not written in "
                          "full (an interrupted write?)",
                          name, h5::shape_str(d), chunks, written));
        break;
      }
      case H5D_CONTIGUOUS:
      case H5D_COMPACT:
        if (cp.getExternalCount() > 0) break;  // in external raw files: reading reports a missing or short one
        if (const hsize_t stored = ds.getStorageSize(); stored < n * file_size)
          invalid(
              fmt::format("{} has shape {} ({} bytes) but {} bytes of it are stored: the dataset was not written "
                          "in full (an interrupted write?)",
                          name, h5::shape_str(d), n * file_size, stored));
        break;
      default:
        invalid(fmt::format("{} is a virtual dataset: a dump holds its values itself", name));
    }
    return n;
  }

  template <class T>
  std::vector<T> read(const H5::DataSet& ds, const std::string& name) {
    where_ = name;
    if (const std::string why = h5::storage_problem(ds); !why.empty()) invalid(name + ": " + why);
    const size_t n = stored_count(ds, name, sizeof(T));
    std::vector<T> v(n);
    if (n == 0) return v;
    if constexpr (std::is_same_v<T, float>)
      ds.read(v.data(), H5::PredType::NATIVE_FLOAT);
    else if constexpr (std::is_same_v<T, int32_t>)
      ds.read(v.data(), H5::PredType::NATIVE_INT32);
    else
      ds.read(v.data(), H5::PredType::NATIVE_INT64);
    return v;
  }

  std::vector<float> read_finite(const std::string& name, const std::vector<int64_t>& expected, const std::string& why,
                                 int layer) {
    std::vector<float> v = read<float>(open(name, DType::F32, expected, why), name);
    if (const int64_t bad = count_nonfinite(v.data(), static_cast<int64_t>(v.size())))
      invalid(fmt::format("layer {:03d}: {} has {} NaN/Inf values (of {}); the dump must be finite", layer, name, bad,
                          v.size()));
    return v;
  }

  const std::string& where() const { return where_; }

 private:
  std::string path_;
  const H5::H5File& file_;
  std::string where_ = "the file";
};

// DeepSeek-V4's layers (study/io/dump_v4.cpp), called by load_dump for cache_family deepseek_v4.
/// head_dim and qk_rope_head_dim (>= 1, qk_rope_head_dim even and < head_dim) into A.
void read_v4_attrs(Loader& L, DumpAttrs& A);
/// The attention dataset names of a V4 layer (all present or all absent).
const std::vector<const char*>& v4_attention_sets();
/// D.compressed_layers: the layers whose compressed_kv has at least one row.
void read_v4_layer_lists(Loader& L, const H5::H5File& file, Dump& D);
/// Checks the shapes and dtypes of V4 layer ly.index (its group attributes read into ly), and with `data` reads and
/// checks its values; with `attention` the attention datasets too. `Tq`, `tq_layer`: the query count of the first
/// layer whose q_rows was opened (-1 before), kept across layers.
void read_v4_layer(Loader& L, const H5::H5File& file, const Dump& D, Layer& ly, bool attention, bool data,
                   int64_t& Tq, int& tq_layer);

/// Why the compressed entries of some layer of `layers` give no fit and held-out split (latentq/split.h: a single
/// non-empty sequence of 1 entry), naming the first such layer; "" when every layer's do (or it has none).
std::string v4_entry_split_problem(const std::vector<Layer>& layers);

}  // namespace latentq::dumpio
