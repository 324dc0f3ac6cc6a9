// latentq/table.h — a generic column table: ordered, named, 1-D columns of int64, float64 or
// string, all of one length. Every result group of a latentq results file is one such table
// (one HDF5 dataset per column, see latentq/results.h).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace latentq {

/// One column: int64, float64 or string values.
using Column = std::variant<std::vector<int64_t>, std::vector<double>, std::vector<std::string>>;

/// Number of values in a column.
size_t column_size(const Column& c);
/// "int64", "float64" or "string".
const char* column_type(const Column& c);

class ColumnTable {
 public:
  /// Add an empty column of type T (int64_t, double or std::string) at the end and return it.
  /// The reference stays valid while more columns are added (columns live in a deque). Throws std::invalid_argument if
  /// a column with that name exists.
  template <class T>
  std::vector<T>& add(const std::string& name) {
    check_new(name);
    cols_.emplace_back(name, Column(std::vector<T>{}));
    return std::get<std::vector<T>>(cols_.back().second);
  }
  /// Add a filled column at the end (throws as add()).
  void add_column(const std::string& name, Column values);

  bool has(const std::string& name) const;
  /// The column `name`; throws std::invalid_argument naming the column and the table's columns.
  const Column& at(const std::string& name) const;
  Column& at(const std::string& name);
  /// The column as vector<T>; throws std::invalid_argument if absent or of another type.
  template <class T>
  const std::vector<T>& get(const std::string& name) const {
    const Column& c = at(name);
    if (!std::holds_alternative<std::vector<T>>(c)) wrong_type(name);
    return std::get<std::vector<T>>(c);
  }
  template <class T>
  std::vector<T>& get(const std::string& name) {
    Column& c = at(name);
    if (!std::holds_alternative<std::vector<T>>(c)) wrong_type(name);
    return std::get<std::vector<T>>(c);
  }

  /// Column names in order.
  std::vector<std::string> names() const;
  const std::deque<std::pair<std::string, Column>>& columns() const { return cols_; }
  size_t num_columns() const { return cols_.size(); }
  /// Rows (0 for a table without columns). Throws std::logic_error if the columns differ in length.
  size_t num_rows() const;
  /// Append all rows of `other` (same column names, types and order); throws std::invalid_argument otherwise.
  void append(const ColumnTable& other);

 private:
  void check_new(const std::string& name) const;
  [[noreturn]] void wrong_type(const std::string& name) const;
  std::deque<std::pair<std::string, Column>> cols_;
};

}  // namespace latentq
