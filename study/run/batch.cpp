// Batch runs: checkpoints, --resume, --shard i/n, merge (latentq/batch.h).
#include "latentq/batch.h"

#include <openssl/evp.h>
#include <signal.h>
#include <sys/types.h>

#include <cerrno>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "latentq/util.h"

namespace latentq {
namespace fs = std::filesystem;
namespace {

std::vector<unsigned char> sha256_raw(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("OpenSSL: SHA-256 failed");
  return {md, md + len};
}

void set_attr(Attrs& a, const std::string& name, AttrValue v) {
  for (auto& [k, x] : a)
    if (k == name) {
      x = std::move(v);
      return;
    }
  a.emplace_back(name, std::move(v));
}

const AttrValue* find_attr(const Attrs& a, const std::string& name) {
  for (const auto& [k, v] : a)
    if (k == name) return &v;
  return nullptr;
}

// A root attribute of the file `where` of type T; std::invalid_argument when missing or of another type.
template <class T>
const T& need_attr(const Attrs& a, const std::string& name, const fs::path& where, const char* why) {
  const AttrValue* v = find_attr(a, name);
  if (!v || !std::holds_alternative<T>(*v))
    throw std::invalid_argument(fmt::format("{}: no {} root attribute '{}' ({})", where.string(),
                                            std::is_same_v<T, std::string> ? "string" : "integer", name, why));
  return std::get<T>(*v);
}

void check_group_name(const std::string& g, const std::string& key) {
  if (g.empty() || g.find('/') != std::string::npos || g == "." || g == ".." || g == kCellsGroup)
    throw std::invalid_argument(
        fmt::format("cell '{}': bad group name '{}' (one path component, not '{}')", key, g, kCellsGroup));
}

// The rows [first, first + n) of t (same columns).
ColumnTable slice(const ColumnTable& t, size_t first, size_t n) {
  ColumnTable out;
  for (size_t c = 0; c < t.num_columns(); ++c) {
    const auto& [name, col] = t.columns()[c];
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          out.add_column(name,
                         V(v.begin() + static_cast<std::ptrdiff_t>(first),
                           v.begin() + static_cast<std::ptrdiff_t>(first + n)),
                         t.docs()[c]);
        },
        col);
  }
  return out;
}

}  // namespace

std::string table_difference(const ColumnTable& a, const ColumnTable& b, double rtol, double atol) {
  if (a.names() != b.names())
    return fmt::format("columns [{}] vs [{}]", fmt::join(a.names(), ", "), fmt::join(b.names(), ", "));
  if (a.num_rows() != b.num_rows()) return fmt::format("{} vs {} rows", a.num_rows(), b.num_rows());
  for (size_t c = 0; c < a.columns().size(); ++c) {
    const auto& [name, x] = a.columns()[c];
    const Column& y = b.columns()[c].second;
    if (x.index() != y.index()) return fmt::format("column '{}': {} vs {}", name, column_type(x), column_type(y));
    const size_t n = column_size(x);
    for (size_t i = 0; i < n; ++i) {
      bool eq = true;
      std::string vx, vy;
      if (x.index() == 0) {
        const auto p = std::get<0>(x)[i], q = std::get<0>(y)[i];
        eq = p == q, vx = fmt::format("{}", p), vy = fmt::format("{}", q);
      } else if (x.index() == 1) {
        const double p = std::get<1>(x)[i], q = std::get<1>(y)[i];
        eq = std::memcmp(&p, &q, sizeof p) == 0, vx = fmt::format("{}", p), vy = fmt::format("{}", q);
        if (!eq && (rtol > 0 || atol > 0) && std::isfinite(p) && std::isfinite(q))
          eq = std::fabs(p - q) <= rtol * std::max(std::fabs(p), std::fabs(q)) + atol;
      } else {
        const auto& p = std::get<2>(x)[i];
        const auto& q = std::get<2>(y)[i];
        eq = p == q, vx = "'" + p + "'", vy = "'" + q + "'";
      }
      if (!eq) return fmt::format("column '{}', row {}: {} vs {}", name, i, vx, vy);
    }
  }
  return "";
}

namespace {

std::string join_keys(const std::vector<CellTask>& plan) {
  std::string s;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (i) s += '\n';
    s += plan[i].key;
  }
  return s;
}

// Message of an exception from a cell, prefixed with the key unless it names it already.
std::string cell_error(const std::exception_ptr& e, const std::string& key) {
  std::string what;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    what = x.what();
  } catch (...) {
    what = "unknown exception";
  }
  return what.find(key) != std::string::npos ? what : fmt::format("cell {}: {}", key, what);
}

// Cell groups, then derived tables, then /cells. Throws std::logic_error if a derived table
// reuses a per-cell group name.
std::vector<NamedTable> with_derived(std::vector<NamedTable> cell_tables, const Attrs& attrs, const DeriveFn& derive) {
  if (!derive) return cell_tables;
  NamedTable cells = std::move(cell_tables.back());
  cell_tables.pop_back();
  std::vector<NamedTable> derived = derive(attrs, cell_tables);
  for (const NamedTable& d : derived)
    for (const NamedTable& c : cell_tables)
      if (d.group == c.group || d.group == kCellsGroup)
        throw std::logic_error("derived table '" + d.group + "' has the name of a per-cell group");
  for (NamedTable& d : derived) cell_tables.push_back(std::move(d));
  cell_tables.push_back(std::move(cells));
  return cell_tables;
}

// Refuse to resume `src` (attrs `old`) for a run with attrs `now`.
void check_resumable(const Attrs& old, const fs::path& src, const Attrs& now) {
  const char* why = "not written by a batch-aware `latentq run`; rerun without --resume";
  const std::string& old_config = need_attr<std::string>(old, "config", src, why);
  const std::string& new_config = std::get<std::string>(attr(now, "config"));
  if (old_config != new_config)
    throw std::invalid_argument(
        fmt::format("{}: cannot resume: it was written for another config (config sha256 {} in the file, {} now); "
                    "rerun without --resume, or resume with the config it was written for",
                    src.string(), sha256_hex(old_config), sha256_hex(new_config)));
  const std::string& old_in = need_attr<std::string>(old, "input_sha256", src, why);
  const std::string& new_in = std::get<std::string>(attr(now, "input_sha256"));
  if (old_in != new_in)
    throw std::invalid_argument(
        fmt::format("{}: cannot resume: it was written for another input (input sha256 {} in the file, {} now); "
                    "rerun without --resume",
                    src.string(), old_in, new_in));
  // The code that computed the cells (files written before latentq recorded it are not checked).
  const AttrValue* oc = find_attr(old, "code_sha256");
  const AttrValue* nc = find_attr(now, "code_sha256");
  if (oc && nc && std::holds_alternative<std::string>(*oc) && std::holds_alternative<std::string>(*nc)) {
    const std::string& old_code = std::get<std::string>(*oc);
    const std::string& new_code = std::get<std::string>(*nc);
    if (old_code != new_code)
      throw std::invalid_argument(
          fmt::format("{}: cannot resume: its cells were computed by another build of latentq (code sha256 {} in "
                      "the file, {} now); rerun without --resume",
                      src.string(), old_code, new_code));
  }
  const std::string& old_shard = need_attr<std::string>(old, "shard", src, why);
  const std::string& new_shard = std::get<std::string>(attr(now, "shard"));
  if (old_shard != new_shard)
    throw std::invalid_argument(
        fmt::format("{}: cannot resume: it holds shard {}, this run is shard {}", src.string(), old_shard, new_shard));
  const std::string& old_plan = need_attr<std::string>(old, "plan_sha256", src, why);
  if (old_plan != std::get<std::string>(attr(now, "plan_sha256")))
    throw std::invalid_argument(
        fmt::format("{}: cannot resume: its cells were planned differently (plan sha256 {} in the file, {} now; "
                    "written by latentq {} at git {}?); rerun without --resume",
                    src.string(), old_plan, std::get<std::string>(attr(now, "plan_sha256")),
                    find_attr(old, "latentq_version") ? std::get<std::string>(*find_attr(old, "latentq_version")) : "?",
                    find_attr(old, "git_commit") ? std::get<std::string>(*find_attr(old, "git_commit")) : "?"));
}

// Remove the temporary files ".<name>.<pid>.tmp" that write_results() left next to `target` when a
// process was killed while writing, if that process is gone (pid not alive on this machine).
void remove_stale_temporaries(const fs::path& target) {
  const fs::path dir = fs::absolute(target).parent_path();
  const std::string prefix = "." + target.filename().string() + ".";
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!n.starts_with(prefix) || !n.ends_with(".tmp")) continue;
    const std::string mid = n.substr(prefix.size(), n.size() - prefix.size() - 4);
    pid_t pid = 0;
    const auto [end, err] = std::from_chars(mid.data(), mid.data() + mid.size(), pid);
    if (err != std::errc() || end != mid.data() + mid.size() || pid <= 0) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) fs::remove(e.path(), ec);
  }
}

}  // namespace

// ---- shards and hashes -----------------------------------------------------------------------------

Shard Shard::parse(std::string_view s) {
  auto bad = [&](const std::string& why) {
    return std::invalid_argument(fmt::format("bad shard '{}': {} (expected i/n with 0 <= i < n, e.g. 0/4)", s, why));
  };
  const size_t slash = s.find('/');
  if (slash == std::string_view::npos) throw bad("no '/'");
  auto num = [&](std::string_view p, const char* what) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
    if (p.empty() || ec != std::errc() || end != p.data() + p.size()) throw bad(std::string(what) + " is not a number");
    return v;
  };
  Shard sh{num(s.substr(0, slash), "i"), num(s.substr(slash + 1), "n")};
  if (sh.count < 1) throw bad("n must be at least 1");
  if (sh.index < 0 || sh.index >= sh.count) throw bad("i must be in 0..n-1");
  return sh;
}

std::string Shard::to_string() const { return fmt::format("{}/{}", index, count); }

int64_t shard_of(std::string_view key, int64_t count) {
  if (count < 1) throw std::invalid_argument(fmt::format("shard count {} (expected >= 1)", count));
  const std::vector<unsigned char> d = sha256_raw(key);
  uint64_t h = 0;
  for (int i = 0; i < 8; ++i) h = (h << 8) | d[static_cast<size_t>(i)];
  return static_cast<int64_t>(h % static_cast<uint64_t>(count));
}

std::string sha256_hex(std::string_view bytes) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : sha256_raw(bytes)) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

fs::path partial_path(const fs::path& out) {
  fs::path p = out;
  p += ".partial";
  return p;
}

// ---- reading and assembling ---------------------------------------------------------------------

const GroupSpec& cells_spec() {
  static const GroupSpec g{
      kCellsGroup,
      {{"cell", ColType::Str, "", "the cell's key, e.g. 003/c_kv/int4-asym-channel-g32/latent_error"},
       {"group", ColType::Str, "", "a group the cell has rows in, e.g. latent_error"},
       {"index", ColType::I64, "", "the cell's position in the canonical plan of the whole study (0-based)"},
       {"first_row", ColType::I64, "", "the cell's first row in /<group>"},
       {"rows", ColType::I64, "", "the cell's number of rows in /<group> (0 allowed): [first_row, first_row + rows)"}}};
  return g;
}

BatchFile read_batch_file(const fs::path& path) {
  BatchFile bf;
  bf.attrs = read_results_attrs(path);
  const std::vector<std::string> groups = list_tables(path);
  const std::string p = path.string();
  if (std::find(groups.begin(), groups.end(), kCellsGroup) == groups.end())
    throw std::invalid_argument(p +
                                ": no /cells table: not written by a batch-aware `latentq run` "
                                "(it cannot be resumed or merged; rerun it)");
  const ColumnTable cells = read_table(path, kCellsGroup);
  auto col = [&]<class T>(const char* name, const T*) -> const std::vector<T>& {
    if (!cells.has(name) || !std::holds_alternative<std::vector<T>>(cells.at(name)))
      throw std::invalid_argument(fmt::format("{}: /cells has no {} column '{}'", p,
                                              std::is_same_v<T, std::string> ? "string" : "int64", name));
    return cells.get<T>(name);
  };
  const auto& key = col("cell", static_cast<const std::string*>(nullptr));
  const auto& group = col("group", static_cast<const std::string*>(nullptr));
  const auto& index = col("index", static_cast<const int64_t*>(nullptr));
  const auto& first = col("first_row", static_cast<const int64_t*>(nullptr));
  const auto& rows = col("rows", static_cast<const int64_t*>(nullptr));

  std::map<std::string, ColumnTable> tables;
  std::unordered_set<std::string> keys;
  std::unordered_set<int64_t> indices;
  for (size_t i = 0; i < key.size(); ++i) {
    const std::string where = fmt::format("{}: /cells row {} (cell '{}', group '{}')", p, i, key[i], group[i]);
    const bool same_cell = !bf.cells.empty() && bf.cells.back().key == key[i];
    if (!same_cell) {
      if (!keys.insert(key[i]).second) throw std::invalid_argument(where + ": the cell is listed twice");
      if (index[i] < 0 || !indices.insert(index[i]).second)
        throw std::invalid_argument(fmt::format("{}: index {} is negative or listed twice", where, index[i]));
      bf.cells.push_back({key[i], index[i], {}});
    } else if (bf.cells.back().index != index[i]) {
      throw std::invalid_argument(
          fmt::format("{}: index {} differs from the cell's index {}", where, index[i], bf.cells.back().index));
    }
    CellRows& cell = bf.cells.back();
    if (group[i] == kCellsGroup || group[i].empty() || group[i].find('/') != std::string::npos)
      throw std::invalid_argument(where + ": bad group name");
    for (const NamedTable& part : cell.parts)
      if (part.group == group[i]) throw std::invalid_argument(where + ": the group is listed twice for the cell");
    if (rows[i] < 0 || first[i] < 0)
      throw std::invalid_argument(fmt::format("{}: negative first_row {} or rows {}", where, first[i], rows[i]));
    ColumnTable r;  // without columns when the group is absent (every cell of it gave no columns)
    auto it = tables.find(group[i]);
    if (it == tables.end() && std::find(groups.begin(), groups.end(), group[i]) != groups.end())
      it = tables.emplace(group[i], read_table(path, group[i])).first;
    if (it != tables.end()) {
      const size_t n = it->second.num_rows();
      if (static_cast<size_t>(first[i] + rows[i]) > n)
        throw std::invalid_argument(fmt::format("{}: rows {}..{} are beyond the {} rows of /{}", where, first[i],
                                                first[i] + rows[i], n, group[i]));
      r = slice(it->second, static_cast<size_t>(first[i]), static_cast<size_t>(rows[i]));
    } else if (rows[i] > 0) {
      throw std::invalid_argument(fmt::format("{}: group /{} is missing", where, group[i]));
    }
    cell.parts.push_back({group[i], std::move(r), {}});
  }
  std::sort(bf.cells.begin(), bf.cells.end(), [](const CellRows& a, const CellRows& b) { return a.index < b.index; });
  const std::set<std::string> cell_groups(group.begin(), group.end());
  for (const std::string& g : groups)
    if (g != kCellsGroup && !cell_groups.count(g)) bf.other_groups.push_back(g);
  return bf;
}

std::vector<NamedTable> assemble_cell_tables(const std::vector<CellRows>& cells) {
  std::vector<std::string> order;
  std::map<std::string, ColumnTable> tabs;
  ColumnTable index = empty_table(cells_spec());
  auto& c_key = index.get<std::string>("cell");
  auto& c_group = index.get<std::string>("group");
  auto& c_index = index.get<int64_t>("index");
  auto& c_first = index.get<int64_t>("first_row");
  auto& c_rows = index.get<int64_t>("rows");
  for (const CellRows& c : cells) {
    for (const NamedTable& part : c.parts) {
      check_group_name(part.group, c.key);
      auto it = tabs.find(part.group);
      if (it == tabs.end()) {
        order.push_back(part.group);
        it = tabs.emplace(part.group, ColumnTable{}).first;
      }
      ColumnTable& t = it->second;
      const size_t first = t.num_rows();
      const size_t n = part.table.num_rows();
      if (part.table.num_columns() > 0) {
        try {
          t.append(part.table);
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument(fmt::format("cell {}: its rows do not fit /{}: {}", c.key, part.group, e.what()));
        }
      }
      c_key.push_back(c.key);
      c_group.push_back(part.group);
      c_index.push_back(c.index);
      c_first.push_back(static_cast<int64_t>(first));
      c_rows.push_back(static_cast<int64_t>(n));
    }
  }
  std::vector<NamedTable> out;
  for (const std::string& g : order)
    if (tabs[g].num_columns() > 0) out.push_back({g, std::move(tabs[g]), {}});
  out.push_back({kCellsGroup, std::move(index), {}});
  return out;
}

// ---- run ------------------------------------------------------------------------------------------

namespace {

using CellTables = std::vector<ColumnTable>;                       // one table per group of a cell
using DoneCells = std::vector<std::shared_ptr<const CellTables>>;  // by plan index; null = not present

// Checks each cell of the plan (groups, key, compute); returns the plan index of each key.
std::unordered_map<std::string, size_t> index_plan(const std::vector<CellTask>& plan) {
  std::unordered_map<std::string, size_t> index_of;
  for (size_t i = 0; i < plan.size(); ++i) {
    const CellTask& t = plan[i];
    if (t.groups.empty()) throw std::invalid_argument("cell " + t.key + " has no group");
    for (size_t g = 0; g < t.groups.size(); ++g) {
      check_group_name(t.groups[g], t.key);
      for (size_t h = 0; h < g; ++h)
        if (t.groups[h] == t.groups[g])
          throw std::invalid_argument("cell " + t.key + ": group " + t.groups[g] + " given twice");
    }
    if (t.key.empty()) throw std::invalid_argument(fmt::format("cell {} of the plan has an empty key", i));
    if (!t.compute) throw std::invalid_argument("cell " + t.key + " has nothing to compute");
    if (!index_of.emplace(t.key, i).second) throw std::invalid_argument("cell key '" + t.key + "' is planned twice");
  }
  return index_of;
}

// The study's `attrs` with the batch attributes of a run of `shard` (`owned` cells) of `plan`.
Attrs batch_attrs(const Attrs& attrs, const std::vector<CellTask>& plan, const Shard& shard, size_t owned) {
  Attrs base = attrs;
  const std::string& config = std::get<std::string>(attr(attrs, "config"));  // throws if absent
  if (!std::holds_alternative<std::string>(attr(attrs, "input_sha256")))
    throw std::invalid_argument("run_batch: attribute input_sha256 must be a string");
  set_attr(base, "config_sha256", sha256_hex(config));
  set_attr(base, "plan_sha256", sha256_hex(join_keys(plan)));
  set_attr(base, "cells_total", static_cast<int64_t>(plan.size()));
  set_attr(base, "shard", shard.to_string());
  set_attr(base, "shard_index", shard.index);
  set_attr(base, "shard_count", shard.count);
  set_attr(base, "shard_cells", static_cast<int64_t>(owned));
  return base;
}

// Takes the cells of the batch file `src` into `done`, after checking that `src` was written for the
// run of attributes `base` and that each of its cells is an owned cell of the plan, as planned.
// Returns the number of cells taken.
size_t resume_cells(const fs::path& src, const Attrs& base, const std::vector<CellTask>& plan,
                    const std::unordered_map<std::string, size_t>& index_of, const std::vector<char>& is_owned,
                    const Shard& shard, DoneCells& done) {
  size_t resumed = 0;
  BatchFile bf = read_batch_file(src);
  check_resumable(bf.attrs, src, base);
  for (CellRows& c : bf.cells) {
    const auto it = index_of.find(c.key);
    if (it == index_of.end())
      throw std::invalid_argument(
          fmt::format("{}: cannot resume: cell '{}' is not in this study", src.string(), c.key));
    const size_t i = it->second;
    std::vector<std::string> groups;
    CellTables rows;
    for (NamedTable& part : c.parts) groups.push_back(part.group), rows.push_back(std::move(part.table));
    if (!is_owned[i] || plan[i].groups != groups || static_cast<size_t>(c.index) != i)
      throw std::invalid_argument(fmt::format(
          "{}: cannot resume: cell '{}' (groups {}, index {}) does not match the "
          "plan (groups {}, index {}, shard {})",
          src.string(), c.key, fmt::join(groups, ","), c.index, fmt::join(plan[i].groups, ","), i, shard.to_string()));
    done[i] = std::make_shared<const CellTables>(std::move(rows));
    ++resumed;
  }
  return resumed;
}

// The owned cells not done, in the start order of `schedule` (canonical order when unset).
std::vector<size_t> pending_cells(const std::vector<size_t>& owned, const DoneCells& done,
                                  const std::function<std::vector<size_t>(const std::vector<size_t>&)>& schedule) {
  std::vector<size_t> pending;
  for (size_t i : owned)
    if (!done[i]) pending.push_back(i);
  if (schedule) {  // the start order; the results stay in canonical order
    std::vector<size_t> order = schedule(pending);
    std::vector<size_t> a = order, b = pending;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b) throw std::logic_error("run_batch: the schedule is not a permutation of the pending cells");
    pending = std::move(order);
  }
  return pending;
}

// The owned cells present in `d`, in canonical order.
std::vector<CellRows> present_cells(const std::vector<CellTask>& plan, const std::vector<size_t>& owned,
                                    const DoneCells& d) {
  std::vector<CellRows> cells;
  for (size_t i : owned) {
    if (!d[i]) continue;
    CellRows c{plan[i].key, static_cast<int64_t>(i), {}};
    for (size_t g = 0; g < plan[i].groups.size(); ++g) c.parts.push_back({plan[i].groups[g], (*d[i])[g], {}});
    cells.push_back(std::move(c));
  }
  return cells;
}

// Writes the checkpoint `partial`: the owned cells present in `d`, marked incomplete.
void write_checkpoint(const fs::path& partial, const Attrs& base, const std::vector<CellTask>& plan,
                      const std::vector<size_t>& owned, const DoneCells& d) {
  const std::vector<CellRows> cells = present_cells(plan, owned, d);
  Attrs a = base;
  set_attr(a, "cells", static_cast<int64_t>(cells.size()));
  set_attr(a, "complete", int64_t{0});
  write_results(partial, a, assemble_cell_tables(cells), WriteMode::Replace);
}

// The tables of one cell, checked to be one per group with consistent columns; throws the cell's error.
std::shared_ptr<const CellTables> compute_cell(const CellTask& task, std::mutex& serial) {
  std::unique_lock<std::mutex> lk(serial, std::defer_lock);
  if (!task.concurrent) lk.lock();
  auto t = std::make_shared<const CellTables>(task.compute());
  if (t->size() != task.groups.size())
    throw std::logic_error(fmt::format("computed {} tables for {} groups", t->size(), task.groups.size()));
  for (const ColumnTable& x : *t) x.num_rows();  // ragged columns: the task's bug, reported as its error
  return t;
}

// The workers of run_batch: they take the pending cells in order and store each result in `done`
// (or its error in `errors`) while the calling thread reports progress and writes checkpoints.
class CellPool {
 public:
  CellPool(const std::vector<CellTask>& plan, const std::vector<size_t>& pending, const BatchOptions& options,
           DoneCells& done)
      : errors(plan.size()), plan_(plan), pending_(pending), options_(options), done_(done) {}

  // Runs the pending cells until each is computed or failed, or options.stop_after cells were
  // computed; `resumed` cells of the `owned` are present before. `checkpoint` writes a snapshot of
  // `done` (throwing stops the workers and propagates).
  void run(size_t resumed, size_t owned, const std::function<void(const DoneCells&)>& checkpoint) {
    int threads = worker_threads(options_.threads);
    threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), pending_.size()));
    using clock = std::chrono::steady_clock;
    auto last_write = clock::now() - std::chrono::hours(1);
    const auto interval = std::chrono::duration<double>(std::max(0.0, options_.checkpoint_interval));
    std::vector<std::jthread> pool;
    struct StopOnExit {  // an exception here (a failed checkpoint) stops the workers before the pool joins
      std::atomic<bool>& s;
      ~StopOnExit() { s = true; }
    } stop_on_exit{stop_};
    active_ = threads;
    for (int t = 0; t < threads; ++t) pool.emplace_back([this] { work(); });
    for (;;) {
      DoneCells snapshot;
      bool finished = false;
      size_t present = 0;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait_for(lk, std::chrono::milliseconds(100),
                     [&] { return active_ == 0 || (unwritten > 0 && clock::now() - last_write >= interval); });
        finished = active_ == 0;
        present = resumed + computed;
        if (!finished && unwritten > 0 && clock::now() - last_write >= interval) {
          snapshot = done_;
          unwritten = 0;
        }
      }
      if (options_.progress) options_.progress(present, owned);
      if (finished) break;
      if (!snapshot.empty()) {
        checkpoint(snapshot);
        last_write = clock::now();
      }
    }
  }

  // Read after run().
  std::vector<std::exception_ptr> errors;  // by plan index
  size_t unwritten = 0, computed = 0, failed = 0;
  std::map<std::string, CellTime> time_by_group;  // computed cells by their first group

 private:
  void work() {
    for (;;) {
      if (stop_.load()) break;
      const size_t k = next_++;
      if (k >= pending_.size()) break;
      const size_t i = pending_[k];
      std::shared_ptr<const CellTables> t;
      std::exception_ptr err;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        t = compute_cell(plan_[i], serial_);
      } catch (...) {
        err = std::current_exception();
        t.reset();
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      {
        const std::lock_guard<std::mutex> lk(m_);
        if (t) {
          done_[i] = std::move(t);
          ++computed;
          CellTime& ct = time_by_group[plan_[i].groups.empty() ? std::string("?") : plan_[i].groups.front()];
          ++ct.cells;
          ct.seconds += secs;
          ++unwritten;
          if (options_.stop_after && computed >= options_.stop_after) stop_ = true;
        } else {
          errors[i] = err;
          ++failed;
        }
      }
      cv_.notify_one();
    }
    {
      const std::lock_guard<std::mutex> lk(m_);
      --active_;
    }
    cv_.notify_one();
  }

  const std::vector<CellTask>& plan_;
  const std::vector<size_t>& pending_;
  const BatchOptions& options_;
  DoneCells& done_;
  std::mutex m_, serial_;
  std::condition_variable cv_;
  int active_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> next_{0};
};

// Throws std::invalid_argument for the first failed cell of `owned`, if any: its message, how many
// failed and where the `present` completed cells are kept.
void throw_first_failure(const std::vector<CellTask>& plan, const std::vector<size_t>& owned,
                         const std::vector<std::exception_ptr>& errors, size_t failed, size_t present,
                         const fs::path& partial, const fs::path& out) {
  for (size_t i : owned)
    if (errors[i])
      throw std::invalid_argument(fmt::format(
          "{} ({} of {} cells failed; the first failed cell is {}. Its message names the cause: a cell "
          "fails the same way on every run, --resume included, until that cause is fixed in the config or the "
          "input{}; no {} was written)",
          cell_error(errors[i], plan[i].key), failed, owned.size(), plan[i].key,
          present ? fmt::format(". The {} completed cells are kept in the checkpoint {}", present, partial.string())
                  : "",
          out.filename().string()));
}

}  // namespace

BatchResult run_batch(const fs::path& out, const Attrs& attrs, const std::vector<CellTask>& plan,
                      const DeriveFn& derive, const BatchOptions& options) {
  const std::unordered_map<std::string, size_t> index_of = index_plan(plan);
  const Shard shard = options.shard;
  if (shard.count < 1 || shard.index < 0 || shard.index >= shard.count)
    throw std::invalid_argument("bad shard " + shard.to_string());
  std::vector<size_t> owned;
  std::vector<char> is_owned(plan.size(), 0);
  for (size_t i = 0; i < plan.size(); ++i)
    if (shard_of(plan[i].key, shard.count) == shard.index) owned.push_back(i), is_owned[i] = 1;

  BatchResult res;
  res.total = plan.size();
  res.owned = owned.size();
  const Attrs base = batch_attrs(attrs, plan, shard, owned.size());

  DoneCells done(plan.size());
  const fs::path partial = partial_path(out);
  std::error_code ec;
  remove_stale_temporaries(out);
  remove_stale_temporaries(partial);
  if (!options.resume) fs::remove(partial, ec);  // a fresh run discards an old checkpoint
  if (options.resume) {
    const fs::path src = fs::exists(partial, ec) ? partial : fs::exists(out, ec) ? out : fs::path();
    if (!src.empty()) {
      res.resumed = resume_cells(src, base, plan, index_of, is_owned, shard, done);
      res.resumed_from = src;
    }
  }
  const std::vector<size_t> pending = pending_cells(owned, done, options.schedule);
  auto write_partial = [&](const DoneCells& d) { write_checkpoint(partial, base, plan, owned, d); };

  // Workers take pending cells in canonical order; the calling thread checkpoints.
  CellPool pool(plan, pending, options, done);
  const auto t_cells = std::chrono::steady_clock::now();
  pool.run(res.resumed, owned.size(), write_partial);
  const auto t_finish = std::chrono::steady_clock::now();
  res.cells_seconds = std::chrono::duration<double>(t_finish - t_cells).count();
  for (auto& [g, ct] : pool.time_by_group) res.cell_time.push_back({g, ct.cells, ct.seconds});
  std::stable_sort(res.cell_time.begin(), res.cell_time.end(),
                   [](const CellTime& a, const CellTime& b) { return a.seconds > b.seconds; });
  const size_t computed = pool.computed;
  res.computed = computed;

  const bool complete = res.resumed + computed == owned.size();
  if (!complete) {
    if (pool.unwritten > 0 || (res.resumed > 0 && res.resumed_from != partial)) write_partial(done);
    res.written = partial;
    res.attrs = base;
    set_attr(res.attrs, "cells", static_cast<int64_t>(res.resumed + computed));
    set_attr(res.attrs, "complete", int64_t{0});
    throw_first_failure(plan, owned, pool.errors, pool.failed, res.resumed + computed, partial, out);
    res.tables = assemble_cell_tables(present_cells(plan, owned, done));
    return res;  // stopped (options.stop_after)
  }

  Attrs a = base;
  set_attr(a, "cells", static_cast<int64_t>(owned.size()));
  set_attr(a, "complete", int64_t{1});
  std::vector<NamedTable> tables = assemble_cell_tables(present_cells(plan, owned, done));
  if (shard.count == 1) tables = with_derived(std::move(tables), a, derive);
  const bool keep_foreign = !res.resumed_from.empty() && res.resumed_from == out;
  write_results(out, a, tables, keep_foreign ? WriteMode::Update : WriteMode::Replace);
  fs::remove(partial, ec);
  res.finish_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_finish).count();
  res.complete = true;
  res.written = out;
  res.attrs = std::move(a);
  res.tables = std::move(tables);
  return res;
}

std::string format_cell_time(const BatchResult& r, int threads, size_t kinds) {
  std::string parts;
  double other = 0;
  size_t other_cells = 0;
  for (size_t k = 0; k < r.cell_time.size(); ++k) {
    const CellTime& c = r.cell_time[k];
    if (k < kinds) {
      parts += fmt::format("{}{} {:.1f} s / {} cells", parts.empty() ? "" : ", ", c.group, c.seconds, c.cells);
    } else {
      other += c.seconds;
      other_cells += c.cells;
    }
  }
  if (other_cells) parts += fmt::format(", other {:.1f} s / {} cells", other, other_cells);
  return fmt::format("cells {:.1f} s wall on {} thread{} (thread-seconds: {}); derived tables + write {:.1f} s",
                     r.cells_seconds, threads, threads == 1 ? "" : "s", parts.empty() ? "none computed" : parts,
                     r.finish_seconds);
}

// ---- merge ----------------------------------------------------------------------------------------

namespace {

// A shard file given to merge_results.
struct ShardFile {
  fs::path path;
  BatchFile file;
  int64_t index = 0, count = 0;
};

// Reads the shard files, each with the batch attributes and complete.
std::vector<ShardFile> read_shards(const std::vector<fs::path>& inputs) {
  std::vector<ShardFile> ins;
  const char* why = "not a shard written by a batch-aware `latentq run --shard`";
  for (const fs::path& p : inputs) {
    ShardFile in{p, read_batch_file(p)};
    const Attrs& a = in.file.attrs;
    need_attr<std::string>(a, "config", p, why);
    need_attr<std::string>(a, "input_sha256", p, why);
    need_attr<std::string>(a, "plan_sha256", p, why);
    need_attr<int64_t>(a, "cells_total", p, why);
    in.index = need_attr<int64_t>(a, "shard_index", p, why);
    in.count = need_attr<int64_t>(a, "shard_count", p, why);
    const int64_t complete = need_attr<int64_t>(a, "complete", p, why);
    if (complete != 1)
      throw std::invalid_argument(
          fmt::format("merge: {} is an incomplete shard {}/{} (a checkpoint with {} cells of {}); finish it with "
                      "`latentq run CONFIG --shard {}/{} --resume --out <its results file>`",
                      p.string(), in.index, in.count, in.file.cells.size(),
                      need_attr<int64_t>(a, "shard_cells", p, why), in.index, in.count));
    ins.push_back(std::move(in));
  }
  return ins;
}

// Checks that the shards are of one study (the first's config, input, shard count and plan) and
// that none is missing.
void check_shards(const std::vector<ShardFile>& ins) {
  const ShardFile& first = ins.front();
  const Attrs& fa = first.file.attrs;
  const std::string& config = std::get<std::string>(attr(fa, "config"));
  const std::string& input = std::get<std::string>(attr(fa, "input_sha256"));
  const std::string& planh = std::get<std::string>(attr(fa, "plan_sha256"));
  const int64_t total = std::get<int64_t>(attr(fa, "cells_total"));
  for (const ShardFile& in : ins) {
    const Attrs& a = in.file.attrs;
    const std::string& c = std::get<std::string>(attr(a, "config"));
    if (c != config)
      throw std::invalid_argument(
          fmt::format("merge: {} and {} are results of different configs (config sha256 {} vs {})", first.path.string(),
                      in.path.string(), sha256_hex(config), sha256_hex(c)));
    const std::string& i = std::get<std::string>(attr(a, "input_sha256"));
    if (i != input)
      throw std::invalid_argument(
          fmt::format("merge: {} and {} are results of different inputs (input sha256 {} vs {})", first.path.string(),
                      in.path.string(), input, i));
    if (in.count != first.count)
      throw std::invalid_argument(fmt::format("merge: {} is shard {}/{} but {} is shard {}/{}: different shard counts",
                                              first.path.string(), first.index, first.count, in.path.string(), in.index,
                                              in.count));
    if (std::get<std::string>(attr(a, "plan_sha256")) != planh || std::get<int64_t>(attr(a, "cells_total")) != total)
      throw std::invalid_argument(fmt::format(
          "merge: {} and {} planned different cells for the same config and input (plan sha256 {} vs {}): written by "
          "different latentq versions?",
          first.path.string(), in.path.string(), planh, std::get<std::string>(attr(a, "plan_sha256"))));
    if (in.index < 0 || in.index >= in.count)
      throw std::invalid_argument(fmt::format("merge: {}: bad shard {}/{}", in.path.string(), in.index, in.count));
  }
  std::vector<char> have(static_cast<size_t>(first.count), 0);
  for (const ShardFile& in : ins) have[static_cast<size_t>(in.index)] = 1;
  std::vector<int64_t> missing;
  for (int64_t i = 0; i < first.count; ++i)
    if (!have[static_cast<size_t>(i)]) missing.push_back(i);
  if (!missing.empty())
    throw std::invalid_argument(fmt::format("merge: {} of {} shards missing: shard {} (given: {} file{})",
                                            missing.size(), first.count, fmt::join(missing, ", "), ins.size(),
                                            ins.size() == 1 ? "" : "s"));
}

// The union of the shards' cells in canonical order, checked to be the study's `total` cells; equal
// duplicates are fine (counted in `overlapping`), different ones are an error.
std::vector<CellRows> union_of_cells(const std::vector<ShardFile>& ins, int64_t total, size_t& overlapping) {
  std::unordered_map<std::string, std::pair<const CellRows*, const ShardFile*>> by_key;
  std::vector<CellRows> cells;
  for (const ShardFile& in : ins)
    for (const CellRows& c : in.file.cells) {
      const auto [it, fresh] = by_key.emplace(c.key, std::make_pair(&c, &in));
      if (fresh) continue;
      const CellRows& o = *it->second.first;
      std::string diff;
      if (o.index != c.index)
        diff = fmt::format("index {} vs {}", o.index, c.index);
      else if (o.parts.size() != c.parts.size())
        diff = fmt::format("{} vs {} groups", o.parts.size(), c.parts.size());
      for (size_t g = 0; diff.empty() && g < o.parts.size(); ++g) {
        if (o.parts[g].group != c.parts[g].group)
          diff = fmt::format("group {} vs {}", o.parts[g].group, c.parts[g].group);
        else if (std::string d = table_difference(o.parts[g].table, c.parts[g].table); !d.empty())
          diff = "/" + o.parts[g].group + " " + d;
      }
      if (!diff.empty())
        throw std::invalid_argument(fmt::format("merge: cell {} is in {} and {} with different results ({})", c.key,
                                                it->second.second->path.string(), in.path.string(), diff));
      ++overlapping;
    }
  for (auto& [k, v] : by_key) cells.push_back(*v.first);
  std::sort(cells.begin(), cells.end(), [](const CellRows& a, const CellRows& b) { return a.index < b.index; });
  for (size_t i = 0; i < cells.size(); ++i)
    if (static_cast<int64_t>(cells.size()) != total || cells[i].index != static_cast<int64_t>(i))
      throw std::invalid_argument(
          fmt::format("merge: the shards hold {} distinct cells, the study has {} (first gap or "
                      "inconsistency at index {}): inconsistent shard files",
                      cells.size(), total, i));
  if (static_cast<int64_t>(cells.size()) != total)
    throw std::invalid_argument(fmt::format("merge: the shards hold no cells, the study has {}", total));
  return cells;
}

// Root attributes: those of shard 0, as an unsharded complete file of `total` cells.
Attrs merged_attrs(const std::vector<ShardFile>& ins, int64_t total) {
  const ShardFile* zero = &ins.front();
  for (const ShardFile& in : ins)
    if (in.index == 0) {
      zero = &in;
      break;
    }
  Attrs a = zero->file.attrs;
  std::vector<std::string> names;
  for (const ShardFile& in : ins) names.push_back(in.path.string());
  set_attr(a, "created", utc_now_iso8601());
  set_attr(a, "shard", std::string("0/1"));
  set_attr(a, "shard_index", int64_t{0});
  set_attr(a, "shard_count", int64_t{1});
  set_attr(a, "shard_cells", total);
  set_attr(a, "cells", total);
  set_attr(a, "complete", int64_t{1});
  set_attr(a, "merged_from", fmt::format("{}", fmt::join(names, ", ")));
  return a;
}

}  // namespace

MergeResult merge_results(const fs::path& out, const std::vector<fs::path>& inputs, const DeriveFn& derive) {
  if (inputs.empty()) throw std::invalid_argument("merge: no shard files given");
  const std::vector<ShardFile> ins = read_shards(inputs);
  check_shards(ins);
  const ShardFile& first = ins.front();
  const int64_t total = std::get<int64_t>(attr(first.file.attrs, "cells_total"));
  MergeResult mr;
  mr.shards = static_cast<size_t>(first.count);
  const std::vector<CellRows> cells = union_of_cells(ins, total, mr.overlapping);
  Attrs a = merged_attrs(ins, total);
  std::vector<NamedTable> tables = with_derived(assemble_cell_tables(cells), a, derive);
  write_results(out, a, tables, WriteMode::Replace);
  mr.cells = cells.size();
  mr.attrs = std::move(a);
  mr.tables = std::move(tables);
  return mr;
}

}  // namespace latentq
