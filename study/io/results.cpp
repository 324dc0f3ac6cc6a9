// Results files (latentq/results.h), HDF5 C++ API plus the few C calls it lacks (link creation
// order, object copy).
#include "latentq/results.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "latentq/h5util.h"

namespace latentq {
namespace fs = std::filesystem;
namespace {

// The temporary files being written, for the SIGTERM/SIGINT handler (install_temp_file_signal_cleanup).
// A slot is 0 free, 1 being filled or emptied, 2 armed (path valid); the handler reads only armed slots.
struct TempSlot {
  std::atomic<int> state{0};
  char path[4096];
};
constexpr int kTempSlots = 8;
TempSlot g_temp_slots[kTempSlots];
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free atomic");

// Registers `path` for the handler while alive (no slot free or a path too long: not registered).
class TempRegistration {
 public:
  explicit TempRegistration(const fs::path& path) {
    const std::string s = path.string();
    if (s.size() >= sizeof(TempSlot::path)) return;
    for (int i = 0; i < kTempSlots; ++i) {
      int expected = 0;
      if (!g_temp_slots[i].state.compare_exchange_strong(expected, 1)) continue;
      std::memcpy(g_temp_slots[i].path, s.c_str(), s.size() + 1);
      g_temp_slots[i].state.store(2);
      slot_ = i;
      return;
    }
  }
  ~TempRegistration() {
    if (slot_ < 0) return;
    g_temp_slots[slot_].state.store(1);
    g_temp_slots[slot_].state.store(0);
  }
  TempRegistration(const TempRegistration&) = delete;
  TempRegistration& operator=(const TempRegistration&) = delete;

 private:
  int slot_ = -1;
};

// Async-signal-safe: unlink the armed temporary files, then die of the signal (default action).
extern "C" void remove_temps_and_die(int sig) {
  for (TempSlot& t : g_temp_slots)
    if (t.state.load() == 2) ::unlink(t.path);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
  ::_exit(128 + sig);  // not reached unless the signal is blocked
}

// LATENTQ_TEST_RAISE_IN_WRITE=SIG (tests only): raise signal SIG once the temporary file is written,
// before the rename.
int test_raise_in_write() {
  const char* v = std::getenv("LATENTQ_TEST_RAISE_IN_WRITE");
  return v && *v ? std::atoi(v) : 0;
}

// A group whose links are tracked and indexed in creation order (h5py iterates in that order).
H5::Group create_ordered_group(H5::H5File& file, const std::string& name) {
  const hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
  H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  const hid_t g = H5Gcreate2(file.getId(), name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT);
  H5Pclose(gcpl);
  if (g < 0) throw H5::GroupIException("create_ordered_group", "H5Gcreate2 failed for " + name);
  H5::Group out(g);
  H5Gclose(g);  // H5::Group(hid_t) took its own reference
  return out;
}

// Names of the links of `loc` in creation order when tracked, else in name order.
std::vector<std::string> link_names(hid_t loc) {
  H5G_info_t info;
  if (H5Gget_info(loc, &info) < 0) throw H5::GroupIException("link_names", "H5Gget_info failed");
  std::vector<std::string> out;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    H5_index_t idx = H5_INDEX_CRT_ORDER;
    ssize_t n = H5Lget_name_by_idx(loc, ".", idx, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (n < 0) {
      idx = H5_INDEX_NAME;
      H5Eclear2(H5E_DEFAULT);
      n = H5Lget_name_by_idx(loc, ".", idx, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    }
    if (n < 0) throw H5::GroupIException("link_names", "H5Lget_name_by_idx failed");
    std::string s(static_cast<size_t>(n), '\0');
    H5Lget_name_by_idx(loc, ".", idx, H5_ITER_INC, i, s.data(), static_cast<size_t>(n) + 1, H5P_DEFAULT);
    out.push_back(s);
  }
  return out;
}

void write_column(H5::Group& g, const std::string& name, const Column& col) {
  const hsize_t n = column_size(col);
  const H5::DataSpace sp(1, &n);
  switch (col.index()) {
    case 0: {
      const auto& v = std::get<std::vector<int64_t>>(col);
      H5::DataSet ds = g.createDataSet(name, H5::PredType::STD_I64LE, sp);
      if (n) ds.write(v.data(), H5::PredType::NATIVE_INT64);
      break;
    }
    case 1: {
      const auto& v = std::get<std::vector<double>>(col);
      H5::DataSet ds = g.createDataSet(name, H5::PredType::IEEE_F64LE, sp);
      if (n) ds.write(v.data(), H5::PredType::NATIVE_DOUBLE);
      break;
    }
    default: {
      const auto& v = std::get<std::vector<std::string>>(col);
      const H5::StrType t = h5::vlen_utf8();
      H5::DataSet ds = g.createDataSet(name, t, sp);
      std::vector<const char*> p;
      p.reserve(v.size());
      for (const auto& s : v) p.push_back(s.c_str());
      if (n) ds.write(p.data(), t);
      break;
    }
  }
}

// The record of a table's columns (results.h): a JSON array of {name, dtype, unit, definition}, in column order.
std::string column_record(const ColumnTable& t) {
  nlohmann::ordered_json rec = nlohmann::ordered_json::array();
  for (size_t i = 0; i < t.num_columns(); ++i) {
    const auto& [name, col] = t.columns()[i];
    const ColumnDoc& d = t.docs()[i];
    rec.push_back({{"name", name}, {"dtype", column_type(col)}, {"unit", d.unit}, {"definition", d.definition}});
  }
  return rec.dump();
}

// The units and definitions of the column record `text` of the group at `where`, whose datasets are `names`
// with dtypes `dtypes`; empty when the group has no record (a file of an older latentq: the attribute is
// missing or holds the comma-separated names). Throws std::invalid_argument naming `where` for a record that
// is not such a JSON array or does not list the group's datasets in order.
std::vector<ColumnDoc> parse_column_record(const std::string& text, const std::string& where,
                                           const std::vector<std::string>& names,
                                           const std::vector<std::string>& dtypes) {
  if (text.empty() || text.front() != '[') return {};
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument(
        fmt::format("{}: attribute 'columns' {} (expected a JSON array of {{name, dtype, unit, definition}}, one per "
                    "dataset, in order)",
                    where, why));
  };
  const nlohmann::json rec = nlohmann::json::parse(text, nullptr, false);
  if (rec.is_discarded() || !rec.is_array()) throw bad("is not a JSON array");
  if (rec.size() != names.size()) throw bad(fmt::format("lists {} columns, the group has {}", rec.size(), names.size()));
  std::vector<ColumnDoc> out;
  for (size_t i = 0; i < rec.size(); ++i) {
    const nlohmann::json& c = rec[i];
    for (const char* k : {"name", "dtype", "unit", "definition"})
      if (!c.is_object() || !c.contains(k) || !c[k].is_string())
        throw bad(fmt::format("entry {} has no string '{}'", i, k));
    if (c["name"].get<std::string>() != names[i] || c["dtype"].get<std::string>() != dtypes[i])
      throw bad(fmt::format("entry {} is {} {}, the dataset is {} {}", i, c["dtype"].get<std::string>(),
                            c["name"].get<std::string>(), dtypes[i], names[i]));
    out.push_back({c["unit"].get<std::string>(), c["definition"].get<std::string>()});
  }
  return out;
}

void write_attr_value(H5::H5Object& obj, const std::string& name, const AttrValue& v) {
  std::visit([&](const auto& x) { h5::write_attr(obj, name, x); }, v);
}

void write_table(H5::H5File& f, const NamedTable& t) {
  H5::Group g = create_ordered_group(f, "/" + t.group);
  for (const auto& [name, col] : t.table.columns()) write_column(g, name, col);
  for (const auto& [k, v] : t.attrs) write_attr_value(g, k, v);
  h5::write_attr(g, "rows", static_cast<int64_t>(t.table.num_rows()));
  h5::write_attr(g, "columns", column_record(t.table));
}

AttrValue read_attr_value(const H5::Attribute& a, const std::string& where) {
  if (a.getSpace().getSimpleExtentNpoints() != 1 && a.getTypeClass() != H5T_STRING)
    throw std::invalid_argument(where + ": attribute is not a scalar");
  switch (a.getTypeClass()) {
    case H5T_INTEGER: {
      int64_t v = 0;
      a.read(H5::PredType::NATIVE_INT64, &v);
      return v;
    }
    case H5T_FLOAT: {
      double v = 0;
      a.read(H5::PredType::NATIVE_DOUBLE, &v);
      return v;
    }
    case H5T_STRING: {
      const H5::DataSpace sp = a.getSpace();
      if (sp.getSimpleExtentType() == H5S_SIMPLE && sp.getSimpleExtentNdims() == 1)
        return h5::read_string_array_attr(a);
      return h5::read_string_attr(a);
    }
    default:
      throw std::invalid_argument(where + ": attribute has type " + h5::dtype_name(a.getDataType()));
  }
}

Attrs read_all_attrs(const H5::H5Object& obj, const std::string& where) {
  Attrs out;
  const int n = obj.getNumAttrs();
  for (int i = 0; i < n; ++i) {
    const H5::Attribute a = obj.openAttribute(static_cast<unsigned>(i));
    const std::string name = a.getName();
    out.emplace_back(name, read_attr_value(a, where + " attribute '" + name + "'"));
  }
  return out;
}

// Opens a results file read-only and checks its schema.
H5::H5File open_results(const fs::path& path) {
  h5::quiet();
  const std::string p = path.string();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw std::runtime_error(p + ": no such file");
  bool is_h5 = false;
  try {
    is_h5 = !fs::is_directory(path, ec) && H5::H5File::isHdf5(p);
  } catch (const H5::Exception&) {
  }
  if (!is_h5) throw std::runtime_error(p + ": not an HDF5 file (expected a latentq-results/1 file)");
  H5::H5File f(p, H5F_ACC_RDONLY);
  if (!f.attrExists("schema"))
    throw std::invalid_argument(p + ": not a latentq-results/1 file (no root attribute 'schema')");
  const H5::Attribute a = f.openAttribute("schema");
  const std::string schema = a.getTypeClass() == H5T_STRING ? h5::read_string_attr(a) : std::string("<not a string>");
  if (schema != kResultsSchema)
    throw std::invalid_argument(p + ": not a latentq-results/1 file (schema = \"" + schema + "\")");
  return f;
}

template <class F>
auto with_h5_errors(const fs::path& path, const char* what, F&& f) {
  try {
    return f();
  } catch (const H5::Exception& e) {
    const std::string stack = h5::error_stack();
    throw std::runtime_error(fmt::format("{}: HDF5 error while {}: {}{}", path.string(), what, e.getDetailMsg(),
                                         stack.empty() ? "" : " (" + stack + ")"));
  }
}

void fsync_file(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

const AttrValue& attr(const Attrs& attrs, const std::string& name) {
  for (const auto& [k, v] : attrs)
    if (k == name) return v;
  throw std::invalid_argument("missing attribute '" + name + "'");
}

void write_results(const fs::path& path, const Attrs& root_attrs, const std::vector<NamedTable>& tables,
                   WriteMode mode) {
  const std::lock_guard<std::recursive_mutex> h5_lock(h5::library_mutex());
  h5::quiet();
  for (const NamedTable& t : tables) {
    if (t.group.empty() || t.group.find('/') != std::string::npos || t.group == ".")
      throw std::invalid_argument("bad table group name '" + t.group + "' (one path component expected)");
    t.table.num_rows();  // throws on ragged columns
  }
  for (size_t i = 0; i < tables.size(); ++i)
    for (size_t j = i + 1; j < tables.size(); ++j)
      if (tables[i].group == tables[j].group)
        throw std::invalid_argument("table group '" + tables[i].group + "' given twice");

  const fs::path dest = fs::absolute(path);
  const fs::path dir = dest.parent_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw std::runtime_error(
        fmt::format("{}: cannot create directory {}: {}", path.string(), dir.string(), ec.message()));
  const bool update = mode == WriteMode::Update && fs::exists(dest);
  // Check the existing file before anything is written.
  Attrs old_attrs;
  if (update) old_attrs = with_h5_errors(dest, "reading the existing file", [&] { return read_results_attrs(dest); });

  const fs::path tmp = dir / fmt::format(".{}.{}.tmp", dest.filename().string(), ::getpid());
  const TempRegistration registered(tmp);
  try {
    with_h5_errors(dest, "writing", [&] {
      const hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
      H5Pset_link_creation_order(fcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
      H5::FileCreatPropList fc(fcpl);
      H5Pclose(fcpl);
      H5::H5File f(tmp.string(), H5F_ACC_TRUNC, fc);
      if (update) {
        for (const auto& [k, v] : old_attrs) write_attr_value(f, k, v);
        const H5::H5File old(dest.string(), H5F_ACC_RDONLY);
        for (const std::string& name : link_names(old.getId())) {
          bool replaced = false;
          for (const NamedTable& t : tables) replaced = replaced || t.group == name;
          if (replaced) continue;
          if (H5Ocopy(old.getId(), name.c_str(), f.getId(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT) < 0)
            throw H5::FileIException("write_results", "H5Ocopy failed for /" + name);
        }
      }
      h5::write_attr(f, "schema", std::string(kResultsSchema));
      for (const auto& [k, v] : root_attrs)
        if (k != "schema") write_attr_value(f, k, v);
      for (const NamedTable& t : tables) write_table(f, t);
      f.close();
      return 0;
    });
    fsync_file(tmp);
    if (const int sig = test_raise_in_write()) ::raise(sig);
    fs::rename(tmp, dest);
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
}

void install_temp_file_signal_cleanup() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  for (const int sig : {SIGTERM, SIGINT}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;  // keep an ignored signal ignored
    struct sigaction sa {};
    sa.sa_handler = remove_temps_and_die;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaddset(&sa.sa_mask, SIGINT);
    ::sigaction(sig, &sa, nullptr);
  }
}

Attrs read_results_attrs(const fs::path& path) {
  const std::lock_guard<std::recursive_mutex> h5_lock(h5::library_mutex());
  return with_h5_errors(path, "reading", [&] {
    const H5::H5File f = open_results(path);
    return read_all_attrs(f, path.string());
  });
}

Attrs read_group_attrs(const fs::path& path, const std::string& group) {
  const std::lock_guard<std::recursive_mutex> h5_lock(h5::library_mutex());
  return with_h5_errors(path, "reading", [&] {
    const H5::H5File f = open_results(path);
    if (!h5::exists(f, "/" + group)) throw std::invalid_argument(path.string() + ": no group /" + group);
    return read_all_attrs(f.openGroup("/" + group), path.string() + ":/" + group);
  });
}

std::vector<std::string> list_tables(const fs::path& path) {
  const std::lock_guard<std::recursive_mutex> h5_lock(h5::library_mutex());
  return with_h5_errors(path, "reading", [&] {
    const H5::H5File f = open_results(path);
    std::vector<std::string> out;
    for (const std::string& n : link_names(f.getId())) {
      if (f.childObjType(n) == H5O_TYPE_GROUP) out.push_back(n);
    }
    return out;
  });
}

ColumnTable read_table(const fs::path& path, const std::string& group) {
  const std::lock_guard<std::recursive_mutex> h5_lock(h5::library_mutex());
  return with_h5_errors(path, "reading", [&] {
    const H5::H5File f = open_results(path);
    const std::string p = path.string();
    if (!h5::exists(f, "/" + group)) throw std::invalid_argument(p + ": no group /" + group);
    const H5::Group g = f.openGroup("/" + group);
    std::vector<std::pair<std::string, Column>> cols;
    for (const std::string& name : link_names(g.getId())) {
      const std::string where = p + ": /" + group + "/" + name;
      const H5::DataSet ds = g.openDataSet(name);
      const auto dims = h5::dims_of(ds);
      if (dims.size() != 1) throw std::invalid_argument(where + " has shape " + h5::shape_str(dims) + ", expected 1-D");
      if (const std::string why = h5::storage_problem(ds); !why.empty()) throw std::invalid_argument(where + ": " + why);
      const size_t n = dims[0];
      const H5::DataType dt = ds.getDataType();
      switch (dt.getClass()) {
        case H5T_INTEGER: {
          std::vector<int64_t> v(n);
          if (n) ds.read(v.data(), H5::PredType::NATIVE_INT64);
          cols.emplace_back(name, std::move(v));
          break;
        }
        case H5T_FLOAT: {
          std::vector<double> v(n);
          if (n) ds.read(v.data(), H5::PredType::NATIVE_DOUBLE);
          cols.emplace_back(name, std::move(v));
          break;
        }
        case H5T_STRING: {
          std::vector<std::string> v(n);
          const H5::StrType st = ds.getStrType();
          if (n && st.isVariableStr()) {
            std::vector<char*> buf(n, nullptr);
            ds.read(buf.data(), st);
            for (size_t i = 0; i < n; ++i) v[i] = buf[i] ? buf[i] : "";
            H5::DataSet::vlenReclaim(buf.data(), st, ds.getSpace());
          } else if (n) {
            const size_t len = st.getSize();
            std::vector<char> buf(n * len);
            ds.read(buf.data(), st);
            for (size_t i = 0; i < n; ++i) {
              std::string s(buf.data() + i * len, len);
              if (const size_t z = s.find('\0'); z != std::string::npos) s.resize(z);
              v[i] = s;
            }
          }
          cols.emplace_back(name, std::move(v));
          break;
        }
        default:
          throw std::invalid_argument(where + " has type " + h5::dtype_name(dt) + ", expected int, float or string");
      }
    }
    std::vector<ColumnDoc> docs;
    if (g.attrExists("columns")) {
      const H5::Attribute a = g.openAttribute("columns");
      if (a.getTypeClass() == H5T_STRING && a.getSpace().getSimpleExtentNpoints() == 1) {
        std::vector<std::string> names, dtypes;
        for (const auto& [name, col] : cols) names.push_back(name), dtypes.push_back(column_type(col));
        docs = parse_column_record(h5::read_string_attr(a), p + ": /" + group, names, dtypes);
      }
    }
    ColumnTable t;
    for (size_t i = 0; i < cols.size(); ++i)
      t.add_column(cols[i].first, std::move(cols[i].second), docs.empty() ? ColumnDoc{} : docs[i]);
    t.num_rows();
    return t;
  });
}

}  // namespace latentq
