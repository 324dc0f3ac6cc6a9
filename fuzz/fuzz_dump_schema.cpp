// libFuzzer harness: the dump loader's schema checks (load_dump, read_layer; study/io/dump.cpp). The
// input does not hold HDF5 bytes: it drives the writing of a latentq-dump/1 file (HDF5 C API, to a file
// of this process under /dev/shm) where each part is right by default and, as the input says, missing,
// of another type or shape, on another storage layout, or with other values: the root attributes
// (strings fixed or variable length, integers and floats of other widths, arrays, null dataspaces),
// /tokens, /positions, /seq_offsets, the /layers/NNN names, c_kv, k_pe and the six attention datasets
// (NaN/Inf, q_rows outside [0, T), declared extents without data, chunked and deflated storage, soft
// links). An input of zeros is a valid dump. The checks are those of fuzz_dump.cpp (dump_check.h).
#include <fuzzer/FuzzedDataProvider.h>
#include <fmt/format.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dump_check.h"
#include "fuzz_util.h"

namespace {

enum class Mode { Right, Absent, OtherType, OtherShape, Exotic };

enum class DT { I8, I16, I32, I64, U32, U64, F32, F64, Str };

hid_t file_type(DT t) {
  switch (t) {
    case DT::I8:
      return H5T_STD_I8LE;
    case DT::I16:
      return H5T_STD_I16LE;
    case DT::I32:
      return H5T_STD_I32LE;
    case DT::I64:
      return H5T_STD_I64LE;
    case DT::U32:
      return H5T_STD_U32LE;
    case DT::U64:
      return H5T_STD_U64LE;
    case DT::F32:
      return H5T_IEEE_F32LE;
    case DT::F64:
      return H5T_IEEE_F64LE;
    case DT::Str:
      break;
  }
  return H5T_IEEE_F64LE;
}

// RAII for HDF5 ids; closing errors are ignored (the harness writes what it can).
struct Id {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  Id(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  ~Id() {
    if (id >= 0) close(id);
  }
  operator hid_t() const { return id; }
};

class Writer {
 public:
  explicit Writer(FuzzedDataProvider& p) : p_(p) {}

  // Right for most inputs (and for an exhausted input, which reads as zeros).
  Mode mode() {
    const int v = p_.ConsumeIntegralInRange<int>(0, 19);
    return v < 15 ? Mode::Right : static_cast<Mode>(v - 14);
  }
  bool flip(int one_in) { return p_.ConsumeIntegralInRange<int>(0, one_in - 1) == one_in - 1; }

  int64_t int_value(int64_t right) {
    switch (p_.ConsumeIntegralInRange<int>(0, 15)) {
      case 11:
        return right + 1;
      case 12:
        return right - 1;
      case 13:
        return p_.PickValueInArray<int64_t>({0, -1, std::numeric_limits<int64_t>::min(),
                                             std::numeric_limits<int64_t>::max(), int64_t{1} << 31, int64_t{1} << 40});
      case 14:
        return p_.ConsumeIntegral<int64_t>();
      case 15:
        return p_.ConsumeIntegralInRange<int64_t>(0, 1000);
      default:
        return right;
    }
  }
  double float_value(double right) {
    switch (p_.ConsumeIntegralInRange<int>(0, 15)) {
      case 12:
        return p_.PickValueInArray<double>({0.0, -0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                                            std::numeric_limits<double>::infinity(), 1e300, 1e-50, 1e-40, 3.5e38,
                                            std::numeric_limits<double>::denorm_min(), 1.1754942e-38});
      case 13:
        return p_.ConsumeFloatingPoint<double>();
      case 14:
        return p_.ConsumeFloatingPointInRange<double>(-4.0, 4.0);
      default:
        return right;
    }
  }
  float element() {
    switch (p_.ConsumeIntegralInRange<int>(0, 63)) {
      case 61:
        return std::numeric_limits<float>::quiet_NaN();
      case 62:
        return p_.ConsumeBool() ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
      case 63:
        return p_.ConsumeFloatingPoint<float>();
      default:
        return static_cast<float>(p_.ConsumeIntegral<int16_t>()) / 256.0f;
    }
  }

  // An attribute of type t on dataspace `space` (0 scalar, 1 [2], 2 null) from doubles/ints/a string.
  void attr(hid_t loc, const char* name, DT t, int space, const std::string& s, int64_t i, double f) {
    Id sp(space == 0 ? H5Screate(H5S_SCALAR) : space == 2 ? H5Screate(H5S_NULL) : [] {
      const hsize_t two = 2;
      return H5Screate_simple(1, &two, nullptr);
    }(), H5Sclose);
    if (t == DT::Str) {
      const bool vlen = !flip(3);
      Id ty(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(ty, vlen ? H5T_VARIABLE : std::max<size_t>(1, s.size() + (flip(2) ? 3 : 0)));
      H5Tset_cset(ty, flip(2) ? H5T_CSET_ASCII : H5T_CSET_UTF8);
      Id a(H5Acreate2(loc, name, ty, sp, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
      if (a < 0 || space == 2) return;
      if (vlen) {
        const char* v[2] = {s.c_str(), s.c_str()};
        H5Awrite(a, ty, v);
      } else {
        const size_t n = H5Tget_size(ty);
        std::string buf(2 * n, '\0');
        std::copy_n(s.begin(), std::min(n, s.size()), buf.begin());
        std::copy_n(s.begin(), std::min(n, s.size()), buf.begin() + static_cast<std::ptrdiff_t>(n));
        H5Awrite(a, ty, buf.data());
      }
      return;
    }
    Id a(H5Acreate2(loc, name, file_type(t), sp, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (a < 0 || space == 2) return;
    if (t == DT::F32 || t == DT::F64) {
      const double v[2] = {f, f};
      H5Awrite(a, H5T_NATIVE_DOUBLE, v);
    } else {
      const int64_t v[2] = {i, i};
      H5Awrite(a, H5T_NATIVE_INT64, v);
    }
  }

  // A root attribute whose right type is `right`.
  void root_attr(hid_t root, const char* name, DT right, const std::string& s, int64_t i, double f) {
    const Mode m = mode();
    if (m == Mode::Absent) return;
    DT t = right;
    int space = 0;
    if (m == Mode::OtherType)
      t = p_.PickValueInArray({DT::I8, DT::I32, DT::I64, DT::U64, DT::F32, DT::F64, DT::Str});
    else if (m == Mode::OtherShape)
      space = p_.ConsumeIntegralInRange<int>(1, 2);
    else if (m == Mode::Exotic && right != DT::Str)
      t = right == DT::I64 ? p_.PickValueInArray({DT::I8, DT::I32, DT::U32, DT::U64}) : DT::F32;
    attr(root, name, t, space, t == DT::Str && right != DT::Str ? std::to_string(i) : s, i, f);
  }

  std::string str_value(const std::string& right) { return flip(8) ? p_.ConsumeRandomLengthString(24) : right; }

  // Dims `right`, or (by the input) one changed: ±1 on a dim, a dim added or dropped, a zero first dim,
  // a huge first dim.
  std::vector<hsize_t> dims(std::vector<hsize_t> d, Mode m) {
    if (m != Mode::OtherShape) return d;
    switch (p_.ConsumeIntegralInRange<int>(0, 6)) {
      case 0:
        if (!d.empty()) d[p_.ConsumeIntegralInRange<size_t>(0, d.size() - 1)] += 1;
        break;
      case 1:
        if (!d.empty()) {
          hsize_t& x = d[p_.ConsumeIntegralInRange<size_t>(0, d.size() - 1)];
          x = x > 0 ? x - 1 : 0;
        }
        break;
      case 2:
        d.push_back(1);
        break;
      case 3:
        if (!d.empty()) d.pop_back();
        break;
      case 4:
        if (!d.empty()) d[0] = 0;
        break;
      case 5:
        if (!d.empty()) std::reverse(d.begin(), d.end());
        break;
      default:
        if (!d.empty()) d[0] = hsize_t{1} << p_.ConsumeIntegralInRange<int>(20, 40);
        break;
    }
    return d;
  }

  // A dataset at `name` of type `right` and dims `d` (before the input's changes), values from `fill`
  // (called with the element count when the data is written; large declared extents get none).
  template <class Fill>
  void dataset(hid_t loc, const std::string& name, DT right, std::vector<hsize_t> d, Fill&& fill) {
    const Mode m = mode();
    if (m == Mode::Absent) return;
    if (m == Mode::Exotic) {
      switch (p_.ConsumeIntegralInRange<int>(0, 3)) {
        case 0: {  // a group of that name
          Id g(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
          return;
        }
        case 1:  // a dangling soft link
          H5Lcreate_soft("/nowhere", loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
          return;
        case 2:  // a soft link to /tokens
          H5Lcreate_soft("/tokens", loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
          return;
        default:
          break;  // written right, on another storage layout (below)
      }
    }
    const DT t = m == Mode::OtherType
                     ? p_.PickValueInArray({DT::I16, DT::I32, DT::I64, DT::U32, DT::U64, DT::F32, DT::F64})
                     : right;
    d = dims(d, m);
    unsigned __int128 n = 1;
    for (hsize_t x : d) n *= x;
    Id sp(d.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr),
          H5Sclose);
    Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    const bool no_data = n > 4096 || (m == Mode::Exotic && flip(3));  // declared, never written: fill values
    if (m == Mode::Exotic && !d.empty() && n > 0 && n <= 4096) {
      std::vector<hsize_t> chunk(d.size());
      for (size_t k = 0; k < d.size(); ++k)
        chunk[k] = std::max<hsize_t>(1, std::min<hsize_t>(d[k], 1 + p_.ConsumeIntegralInRange<hsize_t>(0, 3)));
      H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
      if (flip(2)) H5Pset_deflate(dcpl, 1);
    }
    Id ds(H5Dcreate2(loc, name.c_str(), file_type(t), sp, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
    if (ds < 0 || no_data || n == 0) return;
    std::vector<double> v = fill(static_cast<size_t>(n));
    v.resize(static_cast<size_t>(n));
    H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  }

  FuzzedDataProvider& p_;
};

struct Shape {
  hsize_t T, r, dr, H, dn, dv, Tq;
  int layers;
  bool attention;
};

void write_dump(FuzzedDataProvider& p, const std::filesystem::path& path, std::vector<int>& want, bool& attention) {
  Writer w(p);
  Shape s{};
  s.T = p.ConsumeIntegralInRange<hsize_t>(1, 8);
  s.r = p.ConsumeIntegralInRange<hsize_t>(1, 6);
  s.dr = p.ConsumeIntegralInRange<hsize_t>(1, 4);
  s.H = p.ConsumeIntegralInRange<hsize_t>(1, 3);
  s.dn = p.ConsumeIntegralInRange<hsize_t>(1, 3);
  s.dv = p.ConsumeIntegralInRange<hsize_t>(1, 3);
  s.Tq = p.ConsumeIntegralInRange<hsize_t>(1, s.T);
  s.layers = p.ConsumeIntegralInRange<int>(1, 3);
  s.attention = !p.ConsumeBool();

  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_core(fapl, 1 << 16, 1);  // in memory, written to the file at close
  if (w.flip(4)) H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
  {
    Id f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), H5Fclose);
    if (f < 0) lqfuzz::fail("cannot create " + path.string());
    Id root(H5Gopen2(f, "/", H5P_DEFAULT), H5Gclose);

    w.root_attr(root, "schema", DT::Str, w.str_value("latentq-dump/1"), 1, 1.0);
    for (const char* a : {"model", "revision", "source", "rope_layout", "original_dtype", "config_json"})
      w.root_attr(root, a, DT::Str, w.str_value(std::string(a) == "rope_layout" ? "interleaved" : "x"), 1, 1.0);
    const std::pair<const char*, hsize_t> ints[] = {{"num_layers", static_cast<hsize_t>(s.layers)},
                                                    {"num_heads", s.H},
                                                    {"kv_lora_rank", s.r},
                                                    {"qk_rope_head_dim", s.dr},
                                                    {"qk_nope_head_dim", s.dn},
                                                    {"v_head_dim", s.dv}};
    for (const auto& [a, v] : ints) w.root_attr(root, a, DT::I64, "1", w.int_value(static_cast<int64_t>(v)), 1.0);
    w.root_attr(root, "softmax_scale", DT::F64, "0.125", 1, w.float_value(0.125));

    const auto ints_from = [&](auto gen) {
      return [gen](size_t n) {
        std::vector<double> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = static_cast<double>(gen(i));
        return v;
      };
    };
    const bool bad_tokens = w.flip(16);
    w.dataset(f, "/tokens", DT::I32, {s.T}, ints_from([&](size_t i) {
                return bad_tokens ? p.ConsumeIntegral<int32_t>() : static_cast<int32_t>(i % 100);
              }));
    w.dataset(f, "/positions", DT::I32, {s.T}, ints_from([](size_t i) { return static_cast<int64_t>(i); }));
    // seq_offsets: 0, a cut, T (or, by the input, other values)
    const hsize_t cut = p.ConsumeIntegralInRange<hsize_t>(0, s.T);
    const bool bad_offsets = w.flip(8);
    w.dataset(f, "/seq_offsets", DT::I64, {3}, ints_from([&](size_t i) -> int64_t {
                if (bad_offsets) return p.ConsumeIntegralInRange<int64_t>(-2, static_cast<int64_t>(s.T) + 2);
                return i == 0 ? 0 : i == 1 ? static_cast<int64_t>(cut) : static_cast<int64_t>(s.T);
              }));

    const Mode layers_mode = w.mode();
    if (layers_mode == Mode::Absent) return;
    if (layers_mode == Mode::OtherType) {  // /layers is a dataset
      w.dataset(f, "/layers", DT::I32, {1}, ints_from([](size_t) { return 0; }));
      return;
    }
    Id layers(H5Gcreate2(f, "/layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    const auto floats = [&](size_t n) {
      std::vector<double> v(n);
      for (double& x : v) x = w.element();
      return v;
    };
    for (int li = 0; li < s.layers; ++li) {
      std::string name = fmt::format("{:03d}", li);
      if (w.flip(24))
        name = p.PickValueInArray<std::string>({"1000", "00", "-01", "00a", "0x1", " 01", "٠٠٠", ""}) +
               p.ConsumeRandomLengthString(3);
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") name = "0/0";
      const std::string g = name.find('/') != std::string::npos ? "/layers/999" : "/layers/" + name;
      if (w.flip(32)) {  // a layer that is a dataset
        w.dataset(f, g, DT::F32, {1}, floats);
        continue;
      }
      Id lg(H5Gcreate2(f, g.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      w.dataset(f, g + "/c_kv", DT::F32, {s.T, s.r}, floats);
      w.dataset(f, g + "/k_pe", DT::F32, {s.T, s.dr}, floats);
      if (!s.attention && !w.flip(32)) continue;
      const bool bad_rows = w.flip(8);
      w.dataset(
          f, g + "/q_rows", DT::I32, {s.Tq}, ints_from([&](size_t i) -> int64_t {
            if (bad_rows)
              return p.PickValueInArray<int64_t>({-1, static_cast<int64_t>(s.T), std::numeric_limits<int32_t>::max(),
                                                  std::numeric_limits<int32_t>::min(), static_cast<int64_t>(i)});
            return static_cast<int64_t>((i + 1) * s.T / s.Tq - 1);
          }));
      w.dataset(f, g + "/q_nope", DT::F32, {s.Tq, s.H, s.dn}, floats);
      w.dataset(f, g + "/q_pe", DT::F32, {s.Tq, s.H, s.dr}, floats);
      w.dataset(f, g + "/w_uk", DT::F32, {s.H, s.dn, s.r}, floats);
      w.dataset(f, g + "/w_uv", DT::F32, {s.H, s.dv, s.r}, floats);
      w.dataset(f, g + "/attn_out", DT::F32, {s.Tq, s.H, s.dv}, floats);
    }
  }
  // What to load: every layer (usually), or some (a layer the file lacks, by the input).
  attention = !w.flip(4);
  if (w.flip(4)) {
    const int n = p.ConsumeIntegralInRange<int>(1, 3);
    for (int i = 0; i < n; ++i) want.push_back(p.ConsumeIntegralInRange<int>(-1, 4));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  const std::filesystem::path& path = lqfuzz::temp_file("latentq-fuzz-dump-schema");
  std::vector<int> want;
  bool attention = true;
  write_dump(p, path, want, attention);
  lqfuzz::check_dump(path, want, attention);
  return 0;
}
