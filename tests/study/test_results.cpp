// Results files: column tables round-trip with their column record, Update keeps other groups, failed writes
// leave nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <deque>
#include <limits>
#include <set>

#include "latentq/h5util.h"
#include "latentq/result_groups.h"
#include "latentq/results.h"
#include "latentq/util.h"
#include "synth_dump.h"

namespace {
using namespace latentq;
using lqtest::TempDir;
namespace fs = std::filesystem;

ColumnTable sample_table(int64_t shift = 0) {
  ColumnTable t;
  t.add<int64_t>("layer") = {0 + shift, 1 + shift, 2 + shift};
  t.add<std::string>("name") = {"int4-asym-channel-g32", "", "ünïcode ✓"};
  t.add<double>("value") = {0.5, std::numeric_limits<double>::infinity(), -1e-300};
  t.add<double>("zeta") = {std::numeric_limits<double>::quiet_NaN(), 2.0, 3.0};
  return t;
}

void expect_same(const ColumnTable& a, const ColumnTable& b) {
  ASSERT_EQ(a.names(), b.names());
  for (const auto& [name, col] : a.columns()) {
    SCOPED_TRACE(name);
    const Column& other = b.at(name);
    ASSERT_EQ(col.index(), other.index());
    if (col.index() == 1) {
      const auto& x = std::get<std::vector<double>>(col);
      const auto& y = std::get<std::vector<double>>(other);
      ASSERT_EQ(x.size(), y.size());
      for (size_t i = 0; i < x.size(); ++i)
        if (std::isnan(x[i]))
          EXPECT_TRUE(std::isnan(y[i]));
        else
          EXPECT_EQ(x[i], y[i]);
    } else {
      EXPECT_EQ(col, other);
    }
  }
}

TEST(ColumnTable, Basics) {
  ColumnTable t = sample_table();
  EXPECT_EQ(t.num_rows(), 3u);
  EXPECT_EQ(t.names(), (std::vector<std::string>{"layer", "name", "value", "zeta"}));
  EXPECT_THROW(t.add<double>("layer"), std::invalid_argument);
  EXPECT_THROW(t.get<double>("layer"), std::invalid_argument);
  EXPECT_THROW(t.at("missing"), std::invalid_argument);
  t.append(sample_table(10));
  EXPECT_EQ(t.num_rows(), 6u);
  EXPECT_EQ(t.get<int64_t>("layer"), (std::vector<int64_t>{0, 1, 2, 10, 11, 12}));
  ColumnTable other;
  other.add<int64_t>("layer") = {1};
  EXPECT_THROW(t.append(other), std::invalid_argument);
  t.get<int64_t>("layer").push_back(7);
  EXPECT_THROW(t.num_rows(), std::logic_error);
}

// A table built from its GroupSpec carries each column's unit and definition; append keeps them, and fills
// those of a table built without them.
TEST(ColumnTable, DocsFromTheSpec) {
  const GroupSpec g{"g",
                    {{"layer", ColType::I64, "", "the layer index"},
                     {"rel_fro", ColType::F64, "1", "‖X̂ − X‖_F / ‖X‖_F"},
                     {"name", ColType::Str, "", "a label"}}};
  ColumnTable t = empty_table(g);
  EXPECT_EQ(t.names(), column_names(g));
  EXPECT_EQ(t.doc("rel_fro"), (ColumnDoc{"1", "‖X̂ − X‖_F / ‖X‖_F"}));
  EXPECT_THROW(t.doc("missing"), std::invalid_argument);
  add_row(t, {int64_t{3}, 0.5, std::string("a")});
  ColumnTable bare;
  bare.add<int64_t>("layer") = {4};
  bare.add<double>("rel_fro") = {0.25};
  bare.add<std::string>("name") = {"b"};
  EXPECT_EQ(bare.doc("layer"), ColumnDoc{});
  bare.append(t);
  EXPECT_EQ(bare.get<int64_t>("layer"), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(bare.docs(), t.docs());
  t.append(bare);
  EXPECT_EQ(t.doc("layer"), (ColumnDoc{"", "the layer index"}));
  EXPECT_THROW(add_row(t, {int64_t{1}, 0.5}), std::logic_error);
  EXPECT_STREQ(col_type_name(ColType::F64), "float64");
}

// The group attribute `columns` is the record of results.h, hand-written here; read_table gives the units and
// definitions back.
TEST(Results, ColumnRecord) {
  TempDir dir;
  const fs::path f = dir / "r.h5";
  const GroupSpec g{"probe",
                    {{"layer", ColType::I64, "", "the layer index"},
                     {"kl_mean", ColType::F64, "nat", "mean KL(p ‖ p̂)"},
                     {"mode", ColType::Str, "", "a \"quoted\" label"}}};
  ColumnTable t = empty_table(g);
  add_row(t, {int64_t{0}, 1e-3, std::string("x")});
  ColumnTable bare;
  bare.add<double>("v") = {1.0};
  write_results(f, {}, {{"probe", t, {}}, {"bare", bare, {}}});
  const auto record = [&](const std::string& group) {
    const H5::H5File h(f.string(), H5F_ACC_RDONLY);
    return h5::read_string_attr(h.openGroup(group).openAttribute("columns"));
  };
  EXPECT_EQ(record("probe"),
            R"x([{"name":"layer","dtype":"int64","unit":"","definition":"the layer index"},)x"
            R"x({"name":"kl_mean","dtype":"float64","unit":"nat","definition":"mean KL(p ‖ p̂)"},)x"
            R"x({"name":"mode","dtype":"string","unit":"","definition":"a \"quoted\" label"}])x");
  EXPECT_EQ(record("bare"), R"([{"name":"v","dtype":"float64","unit":"","definition":""}])");
  const ColumnTable back = read_table(f, "probe");
  EXPECT_EQ(back.names(), column_names(g));
  EXPECT_EQ(back.docs(), t.docs());
  EXPECT_EQ(read_table(f, "bare").docs(), bare.docs());
}

// A file of an older latentq (the comma-separated names) reads without units and definitions; a record that
// does not list the datasets is an input error naming the file, the group and what is wrong.
TEST(Results, ColumnRecordOfOlderAndBrokenFiles) {
  TempDir dir;
  const fs::path f = dir / "r.h5";
  const GroupSpec g{"probe", {{"a", ColType::I64, "", "first"}, {"b", ColType::F64, "1", "second"}}};
  ColumnTable t = empty_table(g);
  add_row(t, {int64_t{1}, 2.0});
  write_results(f, {}, {{"probe", t, {}}});
  const auto set_record = [&](const std::string& text) {
    H5::H5File h(f.string(), H5F_ACC_RDWR);
    H5::Group grp = h.openGroup("probe");
    h5::write_attr(grp, "columns", text);
  };
  set_record("a,b");
  ColumnTable back = read_table(f, "probe");
  EXPECT_EQ(back.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(back.docs(), (std::deque<ColumnDoc>{{}, {}}));
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"[not json", "is not a JSON array"},
           {R"([{"name":"a","dtype":"int64","unit":"","definition":""}])", "lists 1 columns, the group has 2"},
           {R"([{"name":"a","dtype":"int64","unit":""},{"name":"b","dtype":"float64","unit":"1","definition":""}])",
            "entry 0 has no string 'definition'"},
           {R"([{"name":"b","dtype":"float64","unit":"","definition":""},)"
            R"({"name":"a","dtype":"int64","unit":"","definition":""}])",
            "entry 0 is float64 b, the dataset is int64 a"}}) {
    SCOPED_TRACE(text);
    set_record(text);
    try {
      read_table(f, "probe");
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(f.string() + ": /probe: attribute 'columns' " + why), std::string::npos)
          << e.what();
    }
  }
}

// Every group the study writes declares each of its columns with a definition, once.
TEST(ResultGroups, EveryColumnIsDefined) {
  const std::vector<GroupSpec>& groups = results_groups();
  for (const char* name : {"latent_error", "summary", "score_vs_attention", "decision", "cells", "svd",
                           "attention_check", "attention_error", "attention_position"})
    EXPECT_NE(find_results_group(name), nullptr) << name;
  EXPECT_EQ(find_results_group("e2e"), nullptr);  // the Python step's (python/latentq/e2e.py)
  for (const GroupSpec& g : groups) {
    std::set<std::string> names;
    for (const ColumnSpec& c : g.columns) {
      SCOPED_TRACE("/" + g.name + "/" + c.name);
      EXPECT_TRUE(names.insert(c.name).second) << "declared twice";
      EXPECT_FALSE(c.definition.empty());
    }
  }
}

TEST(Results, RoundTrip) {
  TempDir dir;
  const fs::path f = dir / "sub" / "r.h5";  // the parent directory is created
  const Attrs attrs = {{"model", std::string("m")}, {"num_layers", int64_t{6}}, {"softmax_scale", 0.25}};
  ColumnTable empty;
  empty.add<int64_t>("a");
  empty.add<std::string>("b");
  write_results(f, attrs, {{"zz_first", sample_table(), {{"note", std::string("x")}}}, {"empty", empty, {}}});
  const Attrs back = read_results_attrs(f);
  EXPECT_EQ(std::get<std::string>(attr(back, "schema")), "latentq-results/1");
  EXPECT_EQ(std::get<std::string>(attr(back, "model")), "m");
  EXPECT_EQ(std::get<int64_t>(attr(back, "num_layers")), 6);
  EXPECT_EQ(std::get<double>(attr(back, "softmax_scale")), 0.25);
  EXPECT_EQ(list_tables(f), (std::vector<std::string>{"zz_first", "empty"}));  // creation order
  expect_same(read_table(f, "zz_first"), sample_table());
  const ColumnTable e = read_table(f, "empty");
  EXPECT_EQ(e.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(e.num_rows(), 0u);
  EXPECT_THROW(read_table(f, "nope"), std::invalid_argument);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"sub"}));
  EXPECT_EQ(std::vector<std::string>{"r.h5"}, [&] {
    std::vector<std::string> v;
    for (const auto& x : fs::directory_iterator(dir / "sub")) v.push_back(x.path().filename().string());
    return v;
  }());
}

TEST(Results, UpdateKeepsOtherGroups) {
  TempDir dir;
  const fs::path f = dir / "r.h5";
  ColumnTable probe;
  probe.add<double>("s") = {3.0, 2.0, 1.0};
  write_results(f, {{"model", std::string("m")}, {"old_only", int64_t{1}}},
                {{"latent_error", sample_table(), {}}, {"svd", probe, {{"k", int64_t{4}}}}});
  // A later run replaces latent_error and adds e2e; svd is kept as it was.
  ColumnTable e2e;
  e2e.add<std::string>("quantizer") = {"bf16"};
  write_results(f, {{"model", std::string("m2")}}, {{"latent_error", sample_table(100), {}}, {"e2e", e2e, {}}},
                WriteMode::Update);
  EXPECT_EQ(list_tables(f), (std::vector<std::string>{"svd", "latent_error", "e2e"}));
  expect_same(read_table(f, "svd"), probe);
  expect_same(read_table(f, "latent_error"), sample_table(100));
  expect_same(read_table(f, "e2e"), e2e);
  const Attrs a = read_results_attrs(f);
  EXPECT_EQ(std::get<std::string>(attr(a, "model")), "m2");
  EXPECT_EQ(std::get<int64_t>(attr(a, "old_only")), 1);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"r.h5"}));

  // Replace drops the other groups.
  write_results(f, {}, {{"e2e", e2e, {}}}, WriteMode::Replace);
  EXPECT_EQ(list_tables(f), (std::vector<std::string>{"e2e"}));
}

TEST(Results, UpdateRefusesForeignFile) {
  TempDir dir;
  const fs::path f = dir / "dump.h5";
  lqtest::write_synth(f, lqtest::make_synth());
  const std::string before = file_sha256(f);
  try {
    write_results(f, {}, {{"t", sample_table(), {}}}, WriteMode::Update);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not a latentq-results/1 file"), std::string::npos) << e.what();
  }
  EXPECT_EQ(file_sha256(f), before);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"dump.h5"}));
  EXPECT_THROW(read_results_attrs(f), std::invalid_argument);
  EXPECT_THROW(read_results_attrs(dir / "missing.h5"), std::runtime_error);
}

TEST(Results, FailedWriteLeavesNothing) {
  TempDir dir;
  const fs::path f = dir / "r.h5";
  // A column name HDF5 cannot create ("a/b" needs a group "a") fails in the middle of the write.
  ColumnTable bad = sample_table();
  bad.add<double>("a/b") = {1, 2, 3};
  EXPECT_THROW(write_results(f, {}, {{"t", sample_table(), {}}, {"bad", bad, {}}}), std::runtime_error);
  EXPECT_TRUE(dir.entries().empty()) << ::testing::PrintToString(dir.entries());

  // With a previous good file, a failed write keeps it byte for byte.
  write_results(f, {{"run", int64_t{1}}}, {{"t", sample_table(), {}}});
  const std::string good = file_sha256(f);
  EXPECT_THROW(write_results(f, {{"run", int64_t{2}}}, {{"bad", bad, {}}}), std::runtime_error);
  EXPECT_THROW(write_results(f, {{"run", int64_t{2}}}, {{"bad", bad, {}}}, WriteMode::Update), std::runtime_error);
  EXPECT_EQ(file_sha256(f), good);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"r.h5"}));

  // Checked before anything is written.
  ColumnTable ragged = sample_table();
  ragged.get<double>("value").push_back(1.0);
  EXPECT_THROW(write_results(f, {}, {{"t", ragged, {}}}), std::logic_error);
  EXPECT_THROW(write_results(f, {}, {{"a/b", sample_table(), {}}}), std::invalid_argument);
  EXPECT_THROW(write_results(f, {}, {{"t", sample_table(), {}}, {"t", sample_table(), {}}}), std::invalid_argument);
  EXPECT_EQ(file_sha256(f), good);
}

}  // namespace
