// Batch runs (latentq/batch.h, latentq/batch_study.h): shard assignment, checkpoints and resume,
// shards and merge, the refusals, and the latentq study run as a batch (equal to the study on the loaded dump).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <thread>
#include <chrono>

#include "latentq/batch.h"
#include "latentq/batch_study.h"
#include "latentq/cli.h"
#include "latentq/result_groups.h"
#include "latentq/results.h"
#include "latentq/util.h"
#include "cli_capture.h"
#include "synth_dump.h"

namespace {
using namespace latentq;
using lqtest::cli;
using lqtest::Outcome;
using lqtest::TempDir;
namespace fs = std::filesystem;

// Every group of two results files equal, in the same order, with the same column records (root attributes not
// compared).
void expect_same_file(const fs::path& a, const fs::path& b) {
  const std::vector<std::string> ga = list_tables(a), gb = list_tables(b);
  ASSERT_EQ(ga, gb) << a << " vs " << b;
  for (const std::string& g : ga) {
    const ColumnTable ta = read_table(a, g), tb = read_table(b, g);
    EXPECT_EQ(table_difference(ta, tb), "") << "/" << g;
    EXPECT_EQ(ta.docs(), tb.docs()) << "/" << g;
  }
}

// Every group of a study's results file is one the study declares (latentq/result_groups.h) and records the
// declared columns: names in order, units and definitions.
void expect_declared_columns(const fs::path& f) {
  for (const std::string& g : list_tables(f)) {
    SCOPED_TRACE(f.string() + ": /" + g);
    const GroupSpec* spec = find_results_group(g);
    ASSERT_NE(spec, nullptr) << "a group the study does not declare";
    const ColumnTable t = read_table(f, g);
    ASSERT_EQ(t.names(), column_names(*spec));
    for (size_t i = 0; i < spec->columns.size(); ++i)
      EXPECT_EQ(t.docs()[i], (ColumnDoc{spec->columns[i].unit, spec->columns[i].definition})) << t.names()[i];
  }
}

// ---- shard assignment ----------------------------------------------------------------------------

TEST(TableDifference, RelativeToleranceOnFiniteFloatsOnly) {
  const auto table = [](double x, double y) {
    ColumnTable t;
    t.add_column("key", std::vector<std::string>{"a", "b"});
    t.add_column("kl", std::vector<double>{x, y});
    return t;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(table_difference(table(1.0, 2.0), table(1.0, 2.0)), "");
  EXPECT_EQ(table_difference(table(1.0, 2.0), table(1.0, 2.0 + 1e-9)), "column 'kl', row 1: 2 vs 2.000000001");
  EXPECT_EQ(table_difference(table(1.0, 2.0), table(1.0, 2.0 + 1e-9), 1e-6), "");
  // |x - y| = 2e-6 > 1e-6 * 1.000002: different.
  EXPECT_EQ(table_difference(table(1.0, 2.0), table(1.000002, 2.0), 1e-6), "column 'kl', row 0: 1 vs 1.000002");
  EXPECT_EQ(table_difference(table(0.0, nan), table(0.0, nan), 1e-3), "");
  EXPECT_NE(table_difference(table(inf, 1.0), table(1e308, 1.0), 1e-3), "");   // non-finite: bit for bit
  EXPECT_NE(table_difference(table(0.0, 1.0), table(1e-300, 1.0), 1e-3), "");  // 0 vs tiny: relative to the larger
  EXPECT_EQ(table_difference(table(0.0, 1.0), table(1e-300, 1.0), 1e-3, 1e-12), "");  // ... within atol
  EXPECT_EQ(table_difference(table(-1e-10, 1.0), table(2e-10, 1.0), 0, 1e-9), "");    // a KL either side of 0
  EXPECT_NE(table_difference(table(-1e-10, 1.0), table(2e-9, 1.0), 0, 1e-9), "");
}

TEST(Shard, Parse) {
  EXPECT_EQ(Shard::parse("0/1"), (Shard{0, 1}));
  EXPECT_EQ(Shard::parse("2/3"), (Shard{2, 3}));
  EXPECT_EQ(Shard::parse("15/16").to_string(), "15/16");
  for (const char* bad : {"", "1", "3/3", "-1/2", "0/0", "1/-2", "a/2", "1/b", "1/2/3", " 1/2", "1/2 ", "1.0/2"}) {
    SCOPED_TRACE(bad);
    try {
      Shard::parse(bad);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_CONTAINS(e.what(), std::string("bad shard '") + bad + "'");
    }
  }
}

TEST(Shard, OfKeyIsSha256Prefix) {
  // FIPS 180-2 test vector: SHA-256("abc") = ba7816bf 8f01cfea ...; 0xba7816bf8f01cfea =
  // 13436514500253700074, which is 0 mod 3, 2 mod 7, 4 mod 5, 74 mod 1000.
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(shard_of("abc", 1), 0);
  EXPECT_EQ(shard_of("abc", 3), 0);
  EXPECT_EQ(shard_of("abc", 5), 4);
  EXPECT_EQ(shard_of("abc", 7), 2);
  EXPECT_EQ(shard_of("abc", 1000), 74);
  EXPECT_THROW(shard_of("abc", 0), std::invalid_argument);
}

TEST(Shard, PartitionsAnyKeySet) {
  // Every key lands in exactly one shard in [0, n); over 600 keys no shard of 4 is nearly empty.
  std::vector<std::string> keys;
  for (int l = 0; l < 6; ++l)
    for (int q = 0; q < 50; ++q)
      for (const char* t : {"c_kv", "k_pe"}) keys.push_back(fmt::format("{:03d}/{}/q{}/latent_error", l, t, q));
  for (int64_t n : {1, 2, 3, 4, 7}) {
    SCOPED_TRACE(n);
    std::vector<size_t> count(static_cast<size_t>(n), 0);
    for (const std::string& k : keys) {
      const int64_t s = shard_of(k, n);
      ASSERT_GE(s, 0);
      ASSERT_LT(s, n);
      ++count[static_cast<size_t>(s)];
      EXPECT_EQ(shard_of(k, n), s);  // deterministic
    }
    for (size_t c : count) EXPECT_GT(c, keys.size() / static_cast<size_t>(n) / 2);
  }
}

// ---- a synthetic plan -----------------------------------------------------------------------------
//
// Cell i (key "c<i:03d>/t"): group "a" with i % 3 rows (id = 10 i + j, x = i + j / 2, NaN for
// i % 5 == 1, s = key); cells with i % 4 == 0 also group "b" (one row, v = -i); cell 5 also
// group "c" with a table without columns (so /c is never written).

struct Synthetic {
  int cells = 23;
  std::string config = "synthetic config v1";
  std::string input = "input-sha";
  double salt = 0;     // added to x: "another result" of the same cell
  int fail_cell = -1;  // this cell throws
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);

  std::vector<CellTask> plan() const {
    std::vector<CellTask> p;
    for (int i = 0; i < cells; ++i) {
      CellTask t;
      t.key = fmt::format("c{:03d}/t", i);
      t.groups = {"a"};
      if (i % 4 == 0) t.groups.push_back("b");
      if (i == 5) t.groups.push_back("c");
      t.compute = [i, key = t.key, salt = salt, fail = fail_cell, calls = calls] {
        ++*calls;
        if (i == fail) throw std::runtime_error("synthetic failure");
        ColumnTable a;
        auto& id = a.add<int64_t>("id");
        auto& x = a.add<double>("x", {"1", "the value of the cell's row"});
        auto& s = a.add<std::string>("s");
        for (int j = 0; j < i % 3; ++j) {
          id.push_back(10 * i + j);
          x.push_back(i % 5 == 1 ? std::numeric_limits<double>::quiet_NaN() : i + j / 2.0 + salt);
          s.push_back(key);
        }
        std::vector<ColumnTable> out{a};
        if (i % 4 == 0) {
          ColumnTable b;
          b.add<double>("v") = {-static_cast<double>(i)};
          out.push_back(b);
        }
        if (i == 5) out.emplace_back();
        return out;
      };
      p.push_back(std::move(t));
    }
    return p;
  }
  Attrs attrs() const { return {{"config", config}, {"input_sha256", input}, {"model", std::string("m")}}; }
};

// Derived table "total": the number of rows of /a and the sum of /b v.
std::vector<NamedTable> derive_total(const Attrs&, const std::vector<NamedTable>& tables) {
  ColumnTable t;
  auto& rows = t.add<int64_t>("rows_a");
  auto& sum = t.add<double>("sum_b");
  rows.push_back(0);
  sum.push_back(0);
  for (const NamedTable& n : tables) {
    if (n.group == "a") rows[0] = static_cast<int64_t>(n.table.num_rows());
    if (n.group == "b")
      for (double v : n.table.get<double>("v")) sum[0] += v;
  }
  return {{"total", t, {}}};
}

struct BatchTest : ::testing::Test {
  TempDir dir;
  Synthetic syn;
  BatchResult run(const fs::path& out, const BatchOptions& o = {}, const Synthetic* s = nullptr) {
    const Synthetic& x = s ? *s : syn;
    return run_batch(out, x.attrs(), x.plan(), derive_total, o);
  }
  BatchOptions shard(int64_t i, int64_t n) {
    BatchOptions o;
    o.shard = {i, n};
    return o;
  }
};

TEST_F(BatchTest, UnshardedFileLayout) {
  const fs::path out = dir / "ref.h5";
  const BatchResult r = run(out);
  ASSERT_TRUE(r.complete);
  EXPECT_EQ(r.total, 23u);
  EXPECT_EQ(r.owned, 23u);
  EXPECT_EQ(r.computed, 23u);
  EXPECT_EQ(*syn.calls, 23);
  EXPECT_EQ(list_tables(out), (std::vector<std::string>{"a", "b", "total", "cells"}));  // no /c: no columns
  const ColumnTable a = read_table(out, "a");
  // rows: cell i has i % 3 rows, in cell order: 1: 10; 2: 20, 21; 4: 40; 5: 50, 51; ...
  std::vector<int64_t> ids;
  for (int i = 0; i < 23; ++i)
    for (int j = 0; j < i % 3; ++j) ids.push_back(10 * i + j);
  EXPECT_EQ(a.get<int64_t>("id"), ids);
  EXPECT_EQ(read_table(out, "b").get<double>("v"), (std::vector<double>{0, -4, -8, -12, -16, -20}));
  const ColumnTable total = read_table(out, "total");
  EXPECT_EQ(total.get<int64_t>("rows_a"), std::vector<int64_t>{static_cast<int64_t>(ids.size())});
  EXPECT_EQ(total.get<double>("sum_b"), std::vector<double>{-60});
  // /cells: one row per (cell, group); cell 0 = (a: 0 rows at 0, b: 1 row at 0), cell 5 = (a: 2
  // rows at 5, c: 0 rows).
  const ColumnTable c = read_table(out, "cells");
  EXPECT_EQ(c.names(), (std::vector<std::string>{"cell", "group", "index", "first_row", "rows"}));
  ASSERT_EQ(c.num_rows(), 23u + 6u + 1u);
  const auto& key = c.get<std::string>("cell");
  const auto& group = c.get<std::string>("group");
  EXPECT_EQ(key[0], "c000/t");
  EXPECT_EQ(group[0], "a");
  EXPECT_EQ(key[1], "c000/t");
  EXPECT_EQ(group[1], "b");
  const auto row5 = static_cast<size_t>(std::find(key.begin(), key.end(), "c005/t") - key.begin());
  EXPECT_EQ(group[row5], "a");
  EXPECT_EQ(c.get<int64_t>("first_row")[row5], 4);  // cells 1, 2, 4 hold 1 + 2 + 1 rows before it
  EXPECT_EQ(c.get<int64_t>("rows")[row5], 2);
  EXPECT_EQ(group[row5 + 1], "c");
  EXPECT_EQ(c.get<int64_t>("rows")[row5 + 1], 0);
  EXPECT_EQ(c.get<int64_t>("index")[row5 + 1], 5);
  const Attrs at = read_results_attrs(out);
  EXPECT_EQ(std::get<std::string>(attr(at, "config_sha256")), sha256_hex(syn.config));
  EXPECT_EQ(std::get<std::string>(attr(at, "shard")), "0/1");
  EXPECT_EQ(std::get<int64_t>(attr(at, "cells_total")), 23);
  EXPECT_EQ(std::get<int64_t>(attr(at, "cells")), 23);
  EXPECT_EQ(std::get<int64_t>(attr(at, "complete")), 1);
  EXPECT_EQ(std::get<std::string>(attr(at, "model")), "m");
  // read_batch_file gives the cells back.
  const BatchFile bf = read_batch_file(out);
  ASSERT_EQ(bf.cells.size(), 23u);
  EXPECT_EQ(bf.other_groups, std::vector<std::string>{"total"});
  EXPECT_EQ(bf.cells[5].key, "c005/t");
  ASSERT_EQ(bf.cells[5].parts.size(), 2u);
  EXPECT_EQ(bf.cells[5].parts[0].table.get<int64_t>("id"), (std::vector<int64_t>{50, 51}));
  EXPECT_EQ(bf.cells[5].parts[1].group, "c");
  EXPECT_EQ(bf.cells[5].parts[1].table.num_columns(), 0u);
  EXPECT_FALSE(fs::exists(partial_path(out)));
}

TEST_F(BatchTest, CellTimeByKind) {
  // 2 cells of kind "slow" (30 ms each), 3 of kind "fast" (second group "b" not counted as a kind), 1 thread.
  std::vector<CellTask> p;
  for (int i = 0; i < 5; ++i) {
    CellTask t;
    const bool slow = i < 2;
    t.key = fmt::format("k{}", i);
    t.groups = {slow ? "slow" : "fast"};
    if (!slow) t.groups.push_back("b");
    t.compute = [slow] {
      if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      std::vector<ColumnTable> out(slow ? 1 : 2);
      for (ColumnTable& x : out) x.add<double>("v") = {1.0};
      return out;
    };
    p.push_back(std::move(t));
  }
  BatchOptions o;
  o.threads = 1;
  const BatchResult r = run_batch(dir / "t.h5", syn.attrs(), p, {}, o);
  ASSERT_EQ(r.cell_time.size(), 2u);
  EXPECT_EQ(r.cell_time[0].group, "slow");
  EXPECT_EQ(r.cell_time[0].cells, 2u);
  EXPECT_GE(r.cell_time[0].seconds, 0.06);
  EXPECT_EQ(r.cell_time[1].group, "fast");
  EXPECT_EQ(r.cell_time[1].cells, 3u);
  EXPECT_LT(r.cell_time[1].seconds, r.cell_time[0].seconds);
  EXPECT_GE(r.cells_seconds, 0.06);

  BatchResult h;  // hand-built: the kinds beyond `kinds` summed as "other"
  h.cells_seconds = 2.5;
  h.finish_seconds = 0.3;
  h.cell_time = {{"attention_error", 84, 3.0}, {"latent_error", 168, 1.5}, {"svd", 2, 0.5}, {"cross_layer", 1, 0.25}};
  EXPECT_EQ(format_cell_time(h, 2, 2),
            "cells 2.5 s wall on 2 threads (thread-seconds: attention_error 3.0 s / 84 cells, latent_error 1.5 s / "
            "168 cells, other 0.8 s / 3 cells); derived tables + write 0.3 s");
  EXPECT_EQ(format_cell_time(BatchResult{}, 1), "cells 0.0 s wall on 1 thread (thread-seconds: none computed); "
                                                "derived tables + write 0.0 s");
}

TEST_F(BatchTest, ShardsMergeToTheUnshardedRun) {
  run(dir / "ref.h5");
  for (int64_t n : {1, 2, 3, 5}) {
    SCOPED_TRACE(n);
    *syn.calls = 0;
    std::vector<fs::path> shards;
    size_t owned = 0;
    for (int64_t i = n - 1; i >= 0; --i) {  // any order
      const fs::path p = dir / fmt::format("s{}_{}.h5", i, n);
      const BatchResult r = run(p, shard(i, n));
      ASSERT_TRUE(r.complete);
      owned += r.owned;
      shards.push_back(p);
      const std::vector<std::string> g = list_tables(p);
      if (n > 1) {
        EXPECT_EQ(std::find(g.begin(), g.end(), "total"), g.end()) << "a shard wrote a derived table";
      }
      EXPECT_EQ(std::get<std::string>(attr(read_results_attrs(p), "shard")), fmt::format("{}/{}", i, n));
    }
    EXPECT_EQ(owned, 23u);
    EXPECT_EQ(*syn.calls, 23);  // every cell computed once over all shards
    const fs::path merged = dir / fmt::format("merged_{}.h5", n);
    const MergeResult m = merge_results(merged, shards, derive_total);
    EXPECT_EQ(m.shards, static_cast<size_t>(n));
    EXPECT_EQ(m.cells, 23u);
    EXPECT_EQ(m.overlapping, 0u);
    expect_same_file(dir / "ref.h5", merged);
    const Attrs a = read_results_attrs(merged);
    EXPECT_EQ(std::get<std::string>(attr(a, "shard")), "0/1");
    EXPECT_EQ(std::get<int64_t>(attr(a, "complete")), 1);
  }
}

TEST_F(BatchTest, EmptyShardsAndEmptyStudies) {
  // Two cells over 8 shards: most shard files hold no cell (only an empty /cells); the merge is
  // still the unsharded file.
  syn.cells = 2;
  run(dir / "ref.h5");
  std::vector<fs::path> shards;
  size_t empty = 0;
  for (int64_t i = 0; i < 8; ++i) {
    shards.push_back(dir / fmt::format("s{}.h5", i));
    const BatchResult r = run(shards.back(), shard(i, 8));
    ASSERT_TRUE(r.complete);
    if (r.owned == 0) {
      ++empty;
      EXPECT_EQ(list_tables(shards.back()), std::vector<std::string>{"cells"});
      EXPECT_EQ(read_table(shards.back(), "cells").num_rows(), 0u);
    }
  }
  EXPECT_GE(empty, 6u);
  merge_results(dir / "m.h5", shards, derive_total);
  expect_same_file(dir / "ref.h5", dir / "m.h5");
  // A study without cells.
  syn.cells = 0;
  const BatchResult r = run(dir / "none.h5");
  EXPECT_TRUE(r.complete);
  EXPECT_EQ(list_tables(dir / "none.h5"), (std::vector<std::string>{"total", "cells"}));
}

TEST_F(BatchTest, StopAndResumeEqualsAnUninterruptedRun) {
  run(dir / "ref.h5");
  // 23 cells; with 3 threads up to 2 cells in flight finish after the stop, so the last stop
  // point leaves room for them (stop 22 could complete the run).
  for (size_t stop : {1u, 7u, 20u}) {
    for (int threads : {1, 3}) {
      SCOPED_TRACE(fmt::format("stop after {}, threads {}", stop, threads));
      const fs::path out = dir / fmt::format("r{}_{}.h5", stop, threads);
      *syn.calls = 0;
      BatchOptions o;
      o.threads = threads;
      o.stop_after = stop;
      const BatchResult r1 = run(out, o);
      EXPECT_FALSE(r1.complete);
      EXPECT_FALSE(fs::exists(out));
      ASSERT_TRUE(fs::exists(partial_path(out)));
      EXPECT_EQ(r1.written, partial_path(out));
      // One thread stops after exactly `stop` cells; more threads finish the cells in flight.
      if (threads == 1) {
        EXPECT_EQ(r1.computed, stop);
      }
      EXPECT_GE(r1.computed, stop);
      const Attrs pa = read_results_attrs(partial_path(out));
      EXPECT_EQ(std::get<int64_t>(attr(pa, "complete")), 0);
      EXPECT_EQ(std::get<int64_t>(attr(pa, "cells")), static_cast<int64_t>(r1.computed));
      EXPECT_EQ(read_batch_file(partial_path(out)).cells.size(), r1.computed);

      o.stop_after = 0;
      o.resume = true;
      const int before = *syn.calls;
      const BatchResult r2 = run(out, o);
      ASSERT_TRUE(r2.complete);
      EXPECT_EQ(r2.resumed, r1.computed);
      EXPECT_EQ(r2.computed, 23u - r1.computed);
      EXPECT_EQ(*syn.calls - before, static_cast<int>(23u - r1.computed));
      EXPECT_EQ(r2.resumed_from, partial_path(out));
      EXPECT_FALSE(fs::exists(partial_path(out)));
      expect_same_file(dir / "ref.h5", out);
    }
  }
}

TEST_F(BatchTest, ResumeChainsAndCompleteFiles) {
  run(dir / "ref.h5");
  const fs::path out = dir / "chain.h5";
  BatchOptions o;
  o.threads = 1;
  o.stop_after = 4;
  EXPECT_FALSE(run(out, o).complete);
  o.resume = true;
  o.stop_after = 5;
  const BatchResult r2 = run(out, o);
  EXPECT_FALSE(r2.complete);
  EXPECT_EQ(r2.resumed, 4u);
  EXPECT_EQ(read_batch_file(partial_path(out)).cells.size(), 9u);
  o.stop_after = 0;
  const BatchResult r3 = run(out, o);
  ASSERT_TRUE(r3.complete);
  EXPECT_EQ(r3.resumed, 9u);
  expect_same_file(dir / "ref.h5", out);
  // Resuming a complete file computes nothing and keeps a foreign group (e.g. /e2e).
  ColumnTable e2e;
  e2e.add<double>("kl") = {0.5};
  write_results(out, {}, {{"e2e", e2e, {}}}, WriteMode::Update);
  *syn.calls = 0;
  const BatchResult r4 = run(out, o);
  EXPECT_TRUE(r4.complete);
  EXPECT_EQ(r4.resumed, 23u);
  EXPECT_EQ(*syn.calls, 0);
  EXPECT_EQ(read_table(out, "e2e").get<double>("kl"), std::vector<double>{0.5});
  // Resume without any file starts from scratch.
  const BatchResult r5 = run(dir / "fresh.h5", o);
  EXPECT_TRUE(r5.complete);
  EXPECT_EQ(r5.resumed, 0u);
  EXPECT_TRUE(r5.resumed_from.empty());
  // A shard is resumed like a whole run.
  BatchOptions so = shard(1, 3);
  so.threads = 1;
  so.stop_after = 2;
  EXPECT_FALSE(run(dir / "s1.h5", so).complete);
  so.stop_after = 0;
  so.resume = true;
  EXPECT_TRUE(run(dir / "s1.h5", so).complete);
  run(dir / "s0.h5", shard(0, 3));
  run(dir / "s2.h5", shard(2, 3));
  merge_results(dir / "m.h5", {dir / "s0.h5", dir / "s1.h5", dir / "s2.h5"}, derive_total);
  expect_same_file(dir / "ref.h5", dir / "m.h5");
}

TEST_F(BatchTest, ResumeRefusesAnotherConfigInputOrShard) {
  const fs::path out = dir / "r.h5";
  BatchOptions o;
  o.threads = 1;
  o.stop_after = 3;
  run(out, o);
  o.stop_after = 0;
  o.resume = true;
  auto refused = [&](const Synthetic& s, const BatchOptions& opt, std::vector<std::string> needles) {
    try {
      run(out, opt, &s);
      ADD_FAILURE() << "resume accepted";
    } catch (const std::invalid_argument& e) {
      for (const std::string& n : needles) EXPECT_CONTAINS(e.what(), n);
    }
    EXPECT_FALSE(fs::exists(out));
    EXPECT_EQ(read_batch_file(partial_path(out)).cells.size(), 3u);  // the checkpoint is untouched
  };
  Synthetic other = syn;
  other.config = "synthetic config v2";
  refused(other, o, {"cannot resume", "another config", sha256_hex(syn.config), sha256_hex(other.config)});
  other = syn;
  other.input = "other-input-sha";
  refused(other, o, {"another input", "input-sha", "other-input-sha"});
  BatchOptions os = o;
  os.shard = {1, 2};
  refused(syn, os, {"holds shard 0/1, this run is shard 1/2"});
  other = syn;
  other.cells = 24;  // same config text, another plan
  refused(other, o, {"planned differently"});
  // A results file without /cells (an older latentq) cannot be resumed.
  ColumnTable t;
  t.add<int64_t>("x") = {1};
  write_results(dir / "old.h5", {{"config", syn.config}}, {{"latent_error", t, {}}});
  try {
    run(dir / "old.h5", o);
    ADD_FAILURE() << "resume accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "no /cells table");
  }
}

TEST_F(BatchTest, AFailingCellKeepsTheOthers) {
  run(dir / "ref.h5");
  Synthetic bad = syn;
  bad.fail_cell = 6;
  const fs::path out = dir / "f.h5";
  try {
    run(out, {}, &bad);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "cell c006/t: synthetic failure");
    EXPECT_CONTAINS(e.what(), "1 of 23 cells failed");
    EXPECT_CONTAINS(e.what(), "the first failed cell is c006/t");
    EXPECT_CONTAINS(e.what(), "Its message names the cause: a cell fails the same way on every run, --resume included");
    EXPECT_EQ(std::string(e.what()).find("fp32"), std::string::npos) << e.what();  // the cause is the cell's own
    EXPECT_CONTAINS(e.what(), "The 22 completed cells are kept in the checkpoint " + partial_path(out).string());
    EXPECT_CONTAINS(e.what(), "no f.h5 was written");
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(read_batch_file(partial_path(out)).cells.size(), 22u);
  *syn.calls = 0;
  BatchOptions o;
  o.resume = true;
  EXPECT_TRUE(run(out, o).complete);
  EXPECT_EQ(*syn.calls, 1);
  expect_same_file(dir / "ref.h5", out);
}

TEST_F(BatchTest, MergeRefusals) {
  std::vector<fs::path> s;
  for (int i = 0; i < 3; ++i) {
    s.push_back(dir / fmt::format("s{}.h5", i));
    run(s.back(), shard(i, 3));
  }
  const fs::path out = dir / "merged.h5";
  auto refused = [&](const std::vector<fs::path>& in, std::vector<std::string> needles) {
    SCOPED_TRACE(needles.front());
    try {
      merge_results(out, in, derive_total);
      ADD_FAILURE() << "merge accepted";
    } catch (const std::invalid_argument& e) {
      for (const std::string& n : needles) EXPECT_CONTAINS(e.what(), n);
    }
    EXPECT_FALSE(fs::exists(out));
  };
  refused({}, {"no shard files"});
  refused({s[0], s[2]}, {"1 of 3 shards missing: shard 1"});
  refused({s[1]}, {"2 of 3 shards missing: shard 0, 2"});

  Synthetic other = syn;
  other.config = "synthetic config v2";
  run(dir / "o1.h5", shard(1, 3), &other);
  refused({s[0], dir / "o1.h5", s[2]}, {"different configs", sha256_hex(syn.config), sha256_hex(other.config)});
  other = syn;
  other.input = "other-input-sha";
  run(dir / "i1.h5", shard(1, 3), &other);
  refused({s[0], dir / "i1.h5", s[2]}, {"different inputs", "input-sha vs other-input-sha"});
  run(dir / "h1.h5", shard(1, 2));
  refused({s[0], dir / "h1.h5", s[2]}, {"different shard counts"});

  // Overlapping cells: fine when equal, refused when not.
  const MergeResult m = merge_results(out, {s[0], s[1], s[2], s[1]}, derive_total);
  EXPECT_EQ(m.overlapping, read_batch_file(s[1]).cells.size());
  run(dir / "u.h5");
  expect_same_file(out, dir / "u.h5");
  EXPECT_EQ(merge_results(out, {dir / "u.h5"}, derive_total).cells, 23u);  // one unsharded file: a copy
  expect_same_file(out, dir / "u.h5");
  fs::remove(out);
  refused({s[0], s[1], s[2], dir / "u.h5"}, {"is shard 0/3 but", "u.h5 is shard 0/1"});
  other = syn;
  other.salt = 0.25;
  run(dir / "x1.h5", shard(1, 3), &other);
  refused({s[0], s[1], s[2], dir / "x1.h5"}, {"with different results", "/a column 'x'"});

  // An incomplete shard (a checkpoint) and files of another schema or without batch data.
  BatchOptions stop = shard(1, 3);
  stop.threads = 1;
  stop.stop_after = 1;
  run(dir / "p1.h5", stop);
  refused({s[0], partial_path(dir / "p1.h5"), s[2]}, {"incomplete shard 1/3", "--shard 1/3 --resume"});
  fs::copy_file(s[1], dir / "v1.h5");
  lqtest::set_string_attr(dir / "v1.h5", "schema", "latentq-results/2");
  try {
    merge_results(out, {s[0], dir / "v1.h5", s[2]}, derive_total);
    ADD_FAILURE() << "merge accepted another schema";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "v1.h5: not a latentq-results/1 file (schema = \"latentq-results/2\")");
  }
  ColumnTable t;
  t.add<int64_t>("x") = {1};
  write_results(dir / "old.h5", {{"config", syn.config}}, {{"latent_error", t, {}}});
  refused({s[0], dir / "old.h5", s[2]}, {"no /cells table"});
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(BatchTest, ProgressAndBadPlans) {
  std::vector<std::pair<size_t, size_t>> seen;
  BatchOptions o;
  o.progress = [&](size_t d, size_t t) { seen.emplace_back(d, t); };
  run(dir / "p.h5", o);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), (std::pair<size_t, size_t>{23, 23}));

  std::vector<CellTask> p = syn.plan();
  p.push_back(p.front());
  EXPECT_THROW(run_batch(dir / "x.h5", syn.attrs(), p, nullptr), std::invalid_argument);  // duplicate key
  p = syn.plan();
  p[3].groups = {"cells"};
  EXPECT_THROW(run_batch(dir / "x.h5", syn.attrs(), p, nullptr), std::invalid_argument);
  p = syn.plan();
  p[3].groups = {"a/b"};
  EXPECT_THROW(run_batch(dir / "x.h5", syn.attrs(), p, nullptr), std::invalid_argument);
  EXPECT_FALSE(fs::exists(dir / "x.h5"));
}

// ---- the latentq study as a batch -----------------------------------------------------------------

const char* kStudy = R"(
[input]
dump = "dump.h5"
[quantizers]
bits = [8, 4]
schemes = ["sym", "asym"]
granularities = ["tensor", "channel"]
group_sizes = [0, 8]
extra = ["bf16", "flashmla-v32-fp8"]
[targets.k_pe]
quantizers = ["int8-asym-channel", "bf16"]
)";

struct StudyBatchTest : ::testing::Test {
  TempDir dir;
  fs::path dump = dir / "dump.h5", config = dir / "study.toml";
  void SetUp() override {
    lqtest::write_synth(dump, lqtest::make_synth());
    std::ofstream(config) << kStudy;
  }
};

// The batch run (the one execution path: plan_study + run_study_batch, layers streamed) equals the
// latent-error study computed directly on the fully loaded dump, and reads each layer once.
TEST_F(StudyBatchTest, EqualsTheStudyOnTheLoadedDump) {
  const StudyConfig cfg = load_config(config);
  const auto backend = make_cpu_backend();
  const Dump full = load_dump(dump);  // with the attention data, as the batch's latent cells (the probes read it)
  const ColumnTable le = run_latent_error(full, plan_cells(cfg, full), *backend);
  const ColumnTable summary = summarize(le, cfg.all_quantizers(), full.attrs);
  const StudyPlan plan = plan_study(cfg, *backend);
  EXPECT_EQ(plan.tasks.size(), le.num_rows() + plan.probes.cells.size());
  EXPECT_EQ(plan.tasks[0].key, "000/c_kv/int8-sym-tensor/latent_error");
  EXPECT_EQ(plan.tasks[le.num_rows()].key, "000/svd");  // the probe cells follow the latent-error cells
  EXPECT_EQ(plan.store->reads(), 0u);                   // planning reads no layer values
  BatchOptions bo;
  bo.threads = 2;
  const BatchResult r = run_study_batch(dir / "b.h5", plan, bo);
  ASSERT_TRUE(r.complete);
  EXPECT_EQ(plan.store->reads(), full.layers.size());  // every layer read once
  const std::vector<std::string> groups = list_tables(dir / "b.h5");
  EXPECT_EQ(groups.front(), "latent_error");
  EXPECT_EQ(groups.back(), "cells");
  EXPECT_EQ(table_difference(read_table(dir / "b.h5", "latent_error"), le), "");
  EXPECT_EQ(table_difference(read_table(dir / "b.h5", "summary"), summary), "");
  const Attrs a = read_results_attrs(dir / "b.h5");
  EXPECT_EQ(std::get<std::string>(attr(a, "input_sha256")), file_sha256(dump));
  EXPECT_EQ(std::get<std::string>(attr(a, "config")), kStudy);
  // The summary derived from the root attributes alone (as merge does) is the same.
  const std::vector<NamedTable> d = derive_study_tables(a, {{"latent_error", le, {}}});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(table_difference(d[0].table, summary), "");
  EXPECT_EQ(dump_attrs_from_results(a).kv_lora_rank, 16);
}

// Bounded memory: with adjacent pairs and windows of 2, a run over 8 layers holds at most threads x 2
// layers, never the dump; each layer is read once; the results equal a run with one thread.
// Why threads x widest cell: tasks run in order of their last layer, so when a cell opens, every layer
// with a use not yet started lies inside the window of the cell just started; the others held belong to
// cells in flight. How far the bound is reached depends on timing: a slow pair cell (0, 1) on one
// thread while the other runs layer 1's cells and then the pair (1, 2) holds {0, 1, 2} plus, if it goes
// on to the pair (2, 3) first, layer 3 (4 = 2 x 2; layer 1 stays for the pair still in flight).
TEST_F(StudyBatchTest, StreamsTheDumpLayerByLayer) {
  lqtest::SynthSpec spec;
  spec.layers = 8;
  lqtest::write_synth(dump, lqtest::make_synth(spec));
  std::ofstream(config) << kStudy << "[cross_layer]\npairs = \"adjacent\"\n";
  const StudyConfig cfg = load_config(config);
  const auto backend = make_cpu_backend();
  const StudyPlan plan = plan_study(cfg, *backend);
  BatchOptions bo;
  bo.threads = 2;
  ASSERT_TRUE(run_study_batch(dir / "two.h5", plan, bo).complete);
  EXPECT_EQ(plan.store->reads(), 8u);
  EXPECT_GE(plan.store->peak_loaded(), 2u);  // a pair needs both of its layers
  EXPECT_LE(plan.store->peak_loaded(), 2u * 2u) << "threads 2, widest cell 2 layers";
  const StudyPlan one_plan = plan_study(cfg, *backend);
  bo.threads = 1;
  ASSERT_TRUE(run_study_batch(dir / "one.h5", one_plan, bo).complete);
  EXPECT_EQ(one_plan.store->reads(), 8u);
  EXPECT_EQ(one_plan.store->peak_loaded(), 2u);
  for (const std::string& g : list_tables(dir / "one.h5"))
    EXPECT_EQ(table_difference(read_table(dir / "one.h5", g), read_table(dir / "two.h5", g)), "") << g;
}

// The CLI in-process: --shard, merge, and the refusals (exit 2, nothing written).

TEST_F(StudyBatchTest, CliShardsMergeAndRefusals) {
  const std::string cfg = config.string();
  Outcome o = cli({"run", cfg, "--out", (dir / "ref.h5").string()});
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_CONTAINS(o.out, "cells (14 quantizers) on cpu");
  std::vector<std::string> merge = {"merge", (dir / "merged.h5").string()};
  for (int i = 0; i < 3; ++i) {
    const std::string s = (dir / fmt::format("shard_{:04d}.h5", i)).string();
    o = cli({"run", cfg, "--shard", fmt::format("{}/3", i), "--out", s, "--threads", "2"});
    ASSERT_EQ(o.rc, 0) << o.err;
    EXPECT_CONTAINS(o.out, fmt::format("shard {}/3: ", i));
    EXPECT_CONTAINS(o.out, "no /summary");
    merge.push_back(s);
  }
  // A missing shard first.
  o = cli({"merge", (dir / "merged.h5").string(), merge[2], merge[4]});
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "latentq: error: merge: 1 of 3 shards missing: shard 1 (given: 2 files)");
  EXPECT_FALSE(fs::exists(dir / "merged.h5"));
  o = cli(merge);
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_CONTAINS(o.out, "merged 3 shards (3 files)");
  EXPECT_CONTAINS(o.out, "int4-asym-channel-g8");  // the summary
  expect_same_file(dir / "ref.h5", dir / "merged.h5");
  expect_declared_columns(dir / "ref.h5");
  expect_declared_columns(dir / "merged.h5");

  // Resume with an edited config: refused with both config hashes.
  const std::string edited = std::string(kStudy) + "# edited\n";
  std::ofstream(dir / "edited.toml") << edited;
  o = cli({"run", (dir / "edited.toml").string(), "--out", (dir / "ref.h5").string(), "--resume"});
  EXPECT_EQ(o.rc, 2);
  EXPECT_CONTAINS(o.err, "cannot resume: it was written for another config (config sha256 " + sha256_hex(kStudy) +
                             " in the file, " + sha256_hex(edited) + " now)");
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"run", cfg, "--shard", "3/3", "--out", (dir / "x.h5").string()},
           {"run", cfg, "--shard", "1-3", "--out", (dir / "x.h5").string()},
           {"run", cfg, "--checkpoint-interval", "-1", "--out", (dir / "x.h5").string()},
           {"merge", (dir / "x.h5").string()},
           {"merge", (dir / "x.h5").string(), (dir / "none.h5").string()},
           {"merge", (dir / "x.h5").string(), cfg}}) {
    SCOPED_TRACE(::testing::PrintToString(args));
    o = cli(args);
    EXPECT_EQ(o.rc, 2);
    EXPECT_CONTAINS(o.err, "latentq: error: ");
    EXPECT_FALSE(fs::exists(dir / "x.h5"));
  }
}

}  // namespace
