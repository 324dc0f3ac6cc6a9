// latentq/table.h — a generic column table: ordered, named, 1-D columns of int64, float64 or
// string, all of one length, each with its unit and definition. Every result group of a latentq
// results file is one such table (one HDF5 dataset per column, and the group's column record: see
// latentq/results.h).
//
// A table's columns are declared once, where the table is built, as a GroupSpec (name, dtype, unit,
// definition per column); the builder starts from empty_table(spec), so the columns it fills carry
// their units and definitions to the writer.
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

/// What a column's values mean. unit: "" for a label, an index, a count or a 0/1 flag; "1" for a
/// dimensionless quantity (a ratio, a fraction, a correlation, a relative error); otherwise the unit, e.g.
/// "bit/element", "byte/token", "dB", "nat". definition: one sentence, the README's name for it.
struct ColumnDoc {
  std::string unit;
  std::string definition;
  bool operator==(const ColumnDoc&) const = default;
};

enum class ColType { I64, F64, Str };
/// "int64", "float64" or "string" (column_type's names).
const char* col_type_name(ColType t);
/// One column of a table: name, dtype (int64, float64, string), unit and definition (ColumnDoc's rules).
struct ColumnSpec {
  std::string name;
  ColType type;
  std::string unit;
  std::string definition;
};
/// A table and its columns, in order: the one declaration of a result group's columns.
struct GroupSpec {
  std::string name;
  std::vector<ColumnSpec> columns;
};
/// The column names of g, in order.
std::vector<std::string> column_names(const GroupSpec& g);

class ColumnTable {
 public:
  /// Add an empty column of type T (int64_t, double or std::string) at the end and return it.
  /// The reference stays valid while more columns are added (columns live in a deque). Throws std::invalid_argument if
  /// a column with that name exists.
  template <class T>
  std::vector<T>& add(const std::string& name, ColumnDoc doc = {}) {
    check_new(name);
    cols_.emplace_back(name, Column(std::vector<T>{}));
    docs_.push_back(std::move(doc));
    return std::get<std::vector<T>>(cols_.back().second);
  }
  /// Add a filled column at the end (throws as add()).
  void add_column(const std::string& name, Column values, ColumnDoc doc = {});

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
  /// The unit and definition of each column, in column order (empty for a column added without them).
  const std::deque<ColumnDoc>& docs() const { return docs_; }
  /// The unit and definition of the column `name` (throws as at()).
  const ColumnDoc& doc(const std::string& name) const;
  size_t num_columns() const { return cols_.size(); }
  /// Rows (0 for a table without columns). Throws std::logic_error if the columns differ in length.
  size_t num_rows() const;
  /// Append all rows of `other` (same column names, types and order); throws std::invalid_argument otherwise.
  /// A column of this table without a unit and definition takes those of `other`.
  void append(const ColumnTable& other);

 private:
  void check_new(const std::string& name) const;
  [[noreturn]] void wrong_type(const std::string& name) const;
  std::deque<std::pair<std::string, Column>> cols_;
  std::deque<ColumnDoc> docs_;  // one per column, in column order
};

/// A table with the columns of g (their units and definitions) and no rows.
ColumnTable empty_table(const GroupSpec& g);
/// One value per column, in column order.
using RowValue = std::variant<int64_t, double, std::string>;
/// Append one row; throws std::logic_error when the values do not match the columns.
void add_row(ColumnTable& t, const std::vector<RowValue>& values);

}  // namespace latentq
