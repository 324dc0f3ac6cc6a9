#include "latentq/h5util.h"

#include <fmt/format.h>

#include <filesystem>

namespace latentq::h5 {

void quiet() { H5::Exception::dontPrint(); }

std::recursive_mutex& library_mutex() {
  static std::recursive_mutex m;
  return m;
}

std::string error_stack() {
  std::vector<std::string> descs;
  auto cb = [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
    auto* v = static_cast<std::vector<std::string>*>(data);
    if (e && e->desc && *e->desc) v->emplace_back(e->desc);
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, cb, &descs);
  // The innermost entries say what actually went wrong ("truncated file: eof = ...").
  std::string out;
  const size_t keep = 3;
  for (size_t i = descs.size() > keep ? descs.size() - keep : 0; i < descs.size(); ++i) {
    if (!out.empty()) out += "; ";
    out += descs[i];
  }
  return out;
}

std::string dtype_name(const H5::DataType& t) {
  const size_t sz = t.getSize();
  switch (t.getClass()) {
    case H5T_INTEGER: {
      const H5::IntType it(t.getId());
      const bool sgn = it.getSign() != H5T_SGN_NONE;
      return fmt::format("{}int{}", sgn ? "" : "u", 8 * sz);
    }
    case H5T_FLOAT:
      return fmt::format("float{}", 8 * sz);
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "vlen";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_BITFIELD:
      return "bitfield";
    case H5T_REFERENCE:
      return "reference";
    default:
      return "unknown";
  }
}

std::vector<hsize_t> dims_of(const H5::DataSet& ds) {
  const H5::DataSpace sp = ds.getSpace();
  const int rank = sp.getSimpleExtentNdims();
  std::vector<hsize_t> d(static_cast<size_t>(rank > 0 ? rank : 0));
  if (rank > 0) sp.getSimpleExtentDims(d.data());
  return d;
}

std::string shape_str(const std::vector<hsize_t>& dims) { return fmt::format("[{}]", fmt::join(dims, ", ")); }

bool exists(const H5::H5File& file, const std::string& name) {
  // H5Lexists needs every intermediate link to exist: walk the components.
  std::string cur;
  size_t start = name.starts_with('/') ? 1 : 0;
  while (start <= name.size()) {
    const size_t p = name.find('/', start);
    const std::string comp = name.substr(start, p == std::string::npos ? std::string::npos : p - start);
    if (!comp.empty()) {
      cur += "/" + comp;
      if (H5Lexists(file.getId(), cur.c_str(), H5P_DEFAULT) <= 0) return false;
    }
    if (p == std::string::npos) break;
    start = p + 1;
  }
  return true;
}

H5::StrType vlen_utf8() {
  H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
  t.setCset(H5T_CSET_UTF8);
  return t;
}

std::string read_string_attr(const H5::Attribute& a) {
  // H5::Attribute::read(type, std::string) reads every element into one string: an array of variable-length
  // strings would write its pointers past the one it has.
  if (const hssize_t n = a.getSpace().getSimpleExtentNpoints(); n != 1)
    throw H5::AttributeIException("read_string_attr",
                                  fmt::format("attribute '{}' holds {} values, expected one string", a.getName(), n));
  std::string s;
  const H5::StrType t = a.getStrType();
  a.read(t, s);
  // Fixed-length strings may carry NUL padding.
  if (const size_t z = s.find('\0'); z != std::string::npos) s.resize(z);
  return s;
}

namespace {
H5::Attribute fresh_attr(H5::H5Object& obj, const std::string& name, const H5::DataType& t) {
  if (obj.attrExists(name)) obj.removeAttr(name);
  return obj.createAttribute(name, t, H5::DataSpace(H5S_SCALAR));
}
}  // namespace

void write_attr(H5::H5Object& obj, const std::string& name, const std::string& value) {
  const H5::StrType t = vlen_utf8();
  fresh_attr(obj, name, t).write(t, value);
}
void write_attr(H5::H5Object& obj, const std::string& name, int64_t value) {
  fresh_attr(obj, name, H5::PredType::STD_I64LE).write(H5::PredType::NATIVE_INT64, &value);
}
void write_attr(H5::H5Object& obj, const std::string& name, double value) {
  fresh_attr(obj, name, H5::PredType::IEEE_F64LE).write(H5::PredType::NATIVE_DOUBLE, &value);
}
void write_attr(H5::H5Object& obj, const std::string& name, const std::vector<std::string>& value) {
  if (obj.attrExists(name)) obj.removeAttr(name);
  const H5::StrType t = vlen_utf8();
  const hsize_t n = value.size();
  const H5::Attribute a = obj.createAttribute(name, t, H5::DataSpace(1, &n));
  std::vector<const char*> p;
  for (const std::string& s : value) p.push_back(s.c_str());
  if (n) a.write(t, p.data());
}
std::vector<std::string> read_string_array_attr(const H5::Attribute& a) {
  const hssize_t n = a.getSpace().getSimpleExtentNpoints();
  std::vector<std::string> out;
  if (n <= 0) return out;
  const H5::StrType t = a.getStrType();
  if (t.isVariableStr()) {
    const H5::StrType vt = vlen_utf8();
    std::vector<char*> p(static_cast<size_t>(n), nullptr);
    a.read(vt, p.data());
    for (char* c : p) out.emplace_back(c ? c : "");
    H5Dvlen_reclaim(vt.getId(), a.getSpace().getId(), H5P_DEFAULT, p.data());
  } else {
    const size_t len = t.getSize();
    std::vector<char> buf(static_cast<size_t>(n) * len);
    a.read(t, buf.data());
    for (hssize_t i = 0; i < n; ++i) {
      std::string s(buf.data() + static_cast<size_t>(i) * len, len);
      if (const size_t z = s.find('\0'); z != std::string::npos) s.resize(z);
      out.push_back(std::move(s));
    }
  }
  return out;
}

std::string storage_problem(const H5::DataSet& ds) {
  const hid_t dcpl = H5Dget_create_plist(ds.getId());
  if (dcpl < 0) return "";
  std::string why;
  const int nfilters = H5Pget_nfilters(dcpl);
  for (int i = 0; why.empty() && i < nfilters; ++i) {
    unsigned flags = 0, config = 0;
    size_t nvalues = 0;
    char name[256] = {0};
    const H5Z_filter_t id = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nvalues, nullptr, sizeof name,
                                           name, &config);
    if (id >= 0 && H5Zfilter_avail(id) <= 0)
      why = fmt::format("its values are compressed with the HDF5 filter '{}' (id {}), which this HDF5 library does "
                        "not have{}; write it without that filter (e.g. h5py compression=\"gzip\" or none)",
                        *name ? name : "unnamed", static_cast<long>(id), id == 32000 ? " (lzf is h5py's own filter)" : "");
  }
  const int nexternal = H5Pget_external_count(dcpl);
  for (int i = 0; why.empty() && i < nexternal; ++i) {
    char name[4096] = {0};
    off_t offset = 0;
    hsize_t size = 0;
    if (H5Pget_external(dcpl, static_cast<unsigned>(i), sizeof name, name, &offset, &size) < 0) continue;
    // HDF5 looks an external file up under the dataset access prefix (HDF5_EXTFILE_PREFIX), else the
    // working directory.
    std::string prefix;
    if (const hid_t dapl = H5Dget_access_plist(ds.getId()); dapl >= 0) {
      const ssize_t n = H5Pget_efile_prefix(dapl, nullptr, 0);
      if (n > 0) {
        prefix.resize(static_cast<size_t>(n) + 1);
        H5Pget_efile_prefix(dapl, prefix.data(), prefix.size());
        prefix.resize(static_cast<size_t>(n));
      }
      H5Pclose(dapl);
    }
    const std::filesystem::path p = std::filesystem::path(name).is_absolute() || prefix.empty()
                                        ? std::filesystem::path(name)
                                        : std::filesystem::path(prefix) / name;
    std::error_code ec;
    const std::filesystem::path shown = std::filesystem::absolute(p, ec);
    if (!std::filesystem::is_regular_file(p, ec))
      why = fmt::format("its values are stored in the external raw file '{}' (looked up as {}), which does not exist",
                        name, shown.string());
    else if (size != H5F_UNLIMITED &&
             std::filesystem::file_size(p, ec) < static_cast<std::uintmax_t>(offset) + static_cast<std::uintmax_t>(size))
      why = fmt::format("its values are stored in the external raw file '{}' ({}), which holds {} bytes, fewer than the "
                        "{} from offset {} the dataset declares",
                        name, shown.string(), std::filesystem::file_size(p, ec), size, static_cast<long long>(offset));
  }
  H5Pclose(dcpl);
  return why;
}

}  // namespace latentq::h5
