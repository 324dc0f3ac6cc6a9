#include "latentq/table.h"

#include <fmt/format.h>

#include <stdexcept>

namespace latentq {

size_t column_size(const Column& c) {
  return std::visit([](const auto& v) { return v.size(); }, c);
}

const char* column_type(const Column& c) {
  switch (c.index()) {
    case 0:
      return "int64";
    case 1:
      return "float64";
    default:
      return "string";
  }
}

const char* col_type_name(ColType t) {
  switch (t) {
    case ColType::I64:
      return "int64";
    case ColType::F64:
      return "float64";
    case ColType::Str:
      return "string";
  }
  return "?";
}

std::vector<std::string> column_names(const GroupSpec& g) {
  std::vector<std::string> out;
  for (const ColumnSpec& c : g.columns) out.push_back(c.name);
  return out;
}

void ColumnTable::check_new(const std::string& name) const {
  if (name.empty()) throw std::invalid_argument("a column needs a name");
  if (has(name)) throw std::invalid_argument(fmt::format("column '{}' already exists", name));
}

void ColumnTable::wrong_type(const std::string& name) const {
  throw std::invalid_argument(fmt::format("column '{}' has type {}", name, column_type(at(name))));
}

void ColumnTable::add_column(const std::string& name, Column values, ColumnDoc doc) {
  check_new(name);
  cols_.emplace_back(name, std::move(values));
  docs_.push_back(std::move(doc));
}

const ColumnDoc& ColumnTable::doc(const std::string& name) const {
  for (size_t i = 0; i < cols_.size(); ++i)
    if (cols_[i].first == name) return docs_[i];
  at(name);  // throws, naming the columns
  throw std::logic_error("unreachable");
}

bool ColumnTable::has(const std::string& name) const {
  for (const auto& [n, c] : cols_)
    if (n == name) return true;
  return false;
}

const Column& ColumnTable::at(const std::string& name) const {
  for (const auto& [n, c] : cols_)
    if (n == name) return c;
  throw std::invalid_argument(fmt::format("no column '{}' (columns: {})", name, fmt::join(names(), ", ")));
}

Column& ColumnTable::at(const std::string& name) {
  return const_cast<Column&>(static_cast<const ColumnTable&>(*this).at(name));
}

std::vector<std::string> ColumnTable::names() const {
  std::vector<std::string> out;
  for (const auto& [n, c] : cols_) out.push_back(n);
  return out;
}

size_t ColumnTable::num_rows() const {
  if (cols_.empty()) return 0;
  const size_t n = column_size(cols_.front().second);
  for (const auto& [name, c] : cols_)
    if (column_size(c) != n)
      throw std::logic_error(
          fmt::format("column '{}' has {} rows, column '{}' has {}", name, column_size(c), cols_.front().first, n));
  return n;
}

void ColumnTable::append(const ColumnTable& other) {
  if (cols_.empty()) {
    *this = other;
    return;
  }
  if (other.names() != names())
    throw std::invalid_argument(fmt::format("cannot append a table with columns [{}] to one with [{}]",
                                            fmt::join(other.names(), ", "), fmt::join(names(), ", ")));
  for (size_t i = 0; i < cols_.size(); ++i) {
    if (cols_[i].second.index() != other.cols_[i].second.index())
      throw std::invalid_argument(fmt::format("column '{}': cannot append {} to {}", cols_[i].first,
                                              column_type(other.cols_[i].second), column_type(cols_[i].second)));
    std::visit(
        [&](auto& dst) {
          using V = std::decay_t<decltype(dst)>;
          const V& src = std::get<V>(other.cols_[i].second);
          dst.insert(dst.end(), src.begin(), src.end());
        },
        cols_[i].second);
    if (docs_[i] == ColumnDoc{}) docs_[i] = other.docs_[i];
  }
}

ColumnTable empty_table(const GroupSpec& g) {
  ColumnTable t;
  for (const ColumnSpec& c : g.columns) {
    ColumnDoc doc{c.unit, c.definition};
    switch (c.type) {
      case ColType::I64:
        t.add<int64_t>(c.name, std::move(doc));
        break;
      case ColType::F64:
        t.add<double>(c.name, std::move(doc));
        break;
      case ColType::Str:
        t.add<std::string>(c.name, std::move(doc));
        break;
    }
  }
  return t;
}

void add_row(ColumnTable& t, const std::vector<RowValue>& values) {
  const auto& cols = t.columns();
  if (values.size() != cols.size()) throw std::logic_error("add_row: wrong number of values");
  size_t i = 0;
  for (const auto& [name, col] : cols) {
    Column& c = t.at(name);
    const RowValue& v = values[i++];
    if (c.index() != v.index()) throw std::logic_error("add_row: column '" + name + "' has another type");
    switch (c.index()) {
      case 0:
        std::get<0>(c).push_back(std::get<int64_t>(v));
        break;
      case 1:
        std::get<1>(c).push_back(std::get<double>(v));
        break;
      default:
        std::get<2>(c).push_back(std::get<std::string>(v));
        break;
    }
  }
}

}  // namespace latentq
