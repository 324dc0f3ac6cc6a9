// lq_results_fixture IN.json OUT.h5: a latentq-results/1 file with chosen values, written by the study's
// own writer (write_results) with each group's columns as the C++ side declares them (results_groups():
// order, dtypes, units, definitions). The report tests make their files with it, so that their column
// lists are the study's and never a copy.
//
// IN.json: {"attrs": {NAME: string | integer | number | [string, ...], ...},
//           "groups": {GROUP: {"values": {COLUMN: [value, ...], ...}, "spec": [...]?}, ...}}
// Groups are written in the order given. A group of results_groups() takes the values of any of its
// columns (the others are left out, as in a file of an older latentq) and is written in its declared
// column order; a group the study does not declare needs "spec": [{"name", "dtype" (int64, float64,
// string), "unit", "definition"}, ...] (a new probe's group; refused for a declared one). Values: int64
// columns integers, float64 columns numbers or null / "nan" / "inf" / "-inf", string columns strings.
// Exit status: 0 written; 2 a usage or input error, named (nothing written).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "latentq/result_groups.h"
#include "latentq/results.h"

namespace {
using latentq::ColType;
using latentq::ColumnSpec;
using latentq::GroupSpec;
using json = nlohmann::ordered_json;

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument(what); }

ColType dtype_of(const std::string& d, const std::string& where) {
  if (d == "int64") return ColType::I64;
  if (d == "float64") return ColType::F64;
  if (d == "string") return ColType::Str;
  fail(fmt::format("{}: dtype '{}' (expected int64, float64 or string)", where, d));
}

GroupSpec spec_from_json(const std::string& group, const json& spec) {
  GroupSpec g{group, {}};
  if (!spec.is_array()) fail(fmt::format("/{}: \"spec\" is not an array", group));
  for (const json& c : spec) {
    for (const char* k : {"name", "dtype", "unit", "definition"})
      if (!c.is_object() || !c.contains(k) || !c[k].is_string())
        fail(fmt::format("/{}: a \"spec\" entry has no string '{}'", group, k));
    g.columns.push_back({c["name"].get<std::string>(), dtype_of(c["dtype"], "/" + group),
                         c["unit"].get<std::string>(), c["definition"].get<std::string>()});
  }
  return g;
}

double number(const json& v, const std::string& where) {
  if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  fail(where + ": a value is not a number");
}

// The table of `spec`'s columns that `values` gives, in spec order, with their units and definitions.
latentq::ColumnTable table_of(const GroupSpec& spec, const json& values) {
  if (!values.is_object()) fail(fmt::format("/{}: \"values\" is not an object", spec.name));
  for (const auto& [name, v] : values.items()) {
    bool known = false;
    for (const ColumnSpec& c : spec.columns) known = known || c.name == name;
    if (!known)
      fail(fmt::format("/{}: '{}' is not one of its columns ({})", spec.name, name,
                       fmt::join(latentq::column_names(spec), ", ")));
    if (!v.is_array()) fail(fmt::format("/{}/{}: not an array", spec.name, name));
  }
  latentq::ColumnTable t;
  for (const ColumnSpec& c : spec.columns) {
    if (!values.contains(c.name)) continue;
    const json& v = values[c.name];
    const std::string where = fmt::format("/{}/{}", spec.name, c.name);
    const latentq::ColumnDoc doc{c.unit, c.definition};
    if (c.type == ColType::I64) {
      std::vector<int64_t> x;
      for (const json& e : v) {
        if (!e.is_number_integer()) fail(where + ": a value is not an integer");
        x.push_back(e.get<int64_t>());
      }
      t.add_column(c.name, std::move(x), doc);
    } else if (c.type == ColType::F64) {
      std::vector<double> x;
      for (const json& e : v) x.push_back(number(e, where));
      t.add_column(c.name, std::move(x), doc);
    } else {
      std::vector<std::string> x;
      for (const json& e : v) {
        if (!e.is_string()) fail(where + ": a value is not a string");
        x.push_back(e.get<std::string>());
      }
      t.add_column(c.name, std::move(x), doc);
    }
  }
  try {
    t.num_rows();
  } catch (const std::logic_error& e) {
    fail(fmt::format("/{}: {}", spec.name, e.what()));
  }
  return t;
}

latentq::Attrs attrs_of(const json& a) {
  latentq::Attrs out;
  if (!a.is_object()) fail("\"attrs\" is not an object");
  for (const auto& [k, v] : a.items()) {
    if (v.is_string()) {
      out.emplace_back(k, v.get<std::string>());
    } else if (v.is_number_integer()) {
      out.emplace_back(k, v.get<int64_t>());
    } else if (v.is_number()) {
      out.emplace_back(k, v.get<double>());
    } else if (v.is_array()) {
      std::vector<std::string> s;
      for (const json& e : v) {
        if (!e.is_string()) fail("attribute " + k + ": an array of strings expected");
        s.push_back(e.get<std::string>());
      }
      out.emplace_back(k, std::move(s));
    } else {
      fail("attribute " + k + ": a string, a number or an array of strings expected");
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fputs("usage: lq_results_fixture IN.json OUT.h5 (see tests/study/results_fixture_main.cpp)\n", stderr);
    return 2;
  }
  try {
    std::ifstream in(argv[1]);
    if (!in) fail(fmt::format("{}: cannot read", argv[1]));
    const json doc = json::parse(in, nullptr, false);
    if (doc.is_discarded() || !doc.is_object()) fail(fmt::format("{}: not a JSON object", argv[1]));
    std::vector<latentq::NamedTable> tables;
    if (doc.contains("groups")) {
      if (!doc["groups"].is_object()) fail("\"groups\" is not an object");
      for (const auto& [name, g] : doc["groups"].items()) {
        if (!g.is_object() || !g.contains("values")) fail(fmt::format("/{}: no \"values\"", name));
        const GroupSpec* declared = latentq::find_results_group(name);
        if (declared && g.contains("spec"))
          fail(fmt::format("/{}: the study declares its columns; a \"spec\" is for a group it does not", name));
        if (!declared && !g.contains("spec"))
          fail(fmt::format("/{}: not a group the study declares; give its \"spec\"", name));
        const GroupSpec spec = declared ? *declared : spec_from_json(name, g["spec"]);
        tables.push_back({name, table_of(spec, g["values"]), {}});
      }
    }
    latentq::write_results(argv[2], attrs_of(doc.value("attrs", json::object())), tables);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lq_results_fixture: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
