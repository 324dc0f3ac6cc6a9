// The regression gate (latentq/regress.h) on hand-built tables: each statistic, each filter, quantizer
// globs, groups other than /latent_error, the config errors and the failure list of the summary.
#include <gtest/gtest.h>

#include <cmath>

#include "latentq/regress.h"
#include "cli_capture.h"

namespace {
using namespace latentq;

// /latent_error-like: c_kv rel_fro of int4-asym-channel-g32 over layers 0..5 is {0.1, 0.5, 0.2, 0.4,
// 0.3, 0.9}; its k_pe rows are 10x that; one int8 row per layer on c_kv (0.01 * (layer + 1)).
ColumnTable latent_error() {
  ColumnTable t;
  auto& layer = t.add<int64_t>("layer");
  auto& target = t.add<std::string>("target");
  auto& quantizer = t.add<std::string>("quantizer");
  auto& rel = t.add<double>("rel_fro");
  auto& bytes = t.add<int64_t>("bytes_per_token_layer");
  const double v[6] = {0.1, 0.5, 0.2, 0.4, 0.3, 0.9};
  for (int64_t l = 0; l < 6; ++l) {
    for (const char* tg : {"c_kv", "k_pe"}) {
      layer.push_back(l);
      target.push_back(tg);
      quantizer.push_back("int4-asym-channel-g32");
      rel.push_back(std::string(tg) == "c_kv" ? v[l] : 10 * v[l]);
      bytes.push_back(40);
    }
    layer.push_back(l);
    target.push_back("c_kv");
    quantizer.push_back("int8-asym-channel-g32");
    rel.push_back(0.01 * static_cast<double>(l + 1));
    bytes.push_back(72);
  }
  return t;
}

// /e2e-like: one row per (quantizer, targets, cache_mode).
ColumnTable e2e() {
  ColumnTable t;
  auto& q = t.add<std::string>("quantizer");
  auto& tg = t.add<std::string>("targets");
  auto& mode = t.add<std::string>("cache_mode");
  auto& kl = t.add<double>("kl_mean");
  auto& top1 = t.add<double>("top1_agree");
  auto& tokens = t.add<int64_t>("num_tokens");
  auto row = [&](const char* quant, const char* targets, const char* cache_mode, double k, double t1) {
    q.push_back(quant);
    tg.push_back(targets);
    mode.push_back(cache_mode);
    kl.push_back(k);
    top1.push_back(t1);
    tokens.push_back(512);
  };
  row("int4-asym-channel-g32", "c_kv+k_pe", "prefill-at-once", 0.010, 0.95);
  row("int4-asym-channel-g32", "c_kv+k_pe", "decode-r32-s4-p0", 0.004, 0.98);
  row("int4-asym-token", "c_kv+k_pe", "prefill-at-once", 0.020, 0.90);
  row("had,int4-asym-channel-g32", "c_kv+k_pe", "prefill-at-once", 0.006, 0.97);
  row("int4-asym-channel-g32", "c_kv", "prefill-at-once", 0.003, 0.99);
  row("int2-asym-channel-g32", "c_kv+k_pe", "prefill-at-once", 0.100, 0.70);
  return t;
}

// /svd-like: no quantizer column; heldout_rel_fro by layer and rank.
ColumnTable svd() {
  ColumnTable t;
  auto& layer = t.add<int64_t>("layer");
  auto& rank = t.add<int64_t>("rank");
  auto& held = t.add<double>("heldout_rel_fro");
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t r : {8, 64}) {
      layer.push_back(l);
      rank.push_back(r);
      held.push_back((r == 8 ? 0.5 : 0.05) + 0.01 * static_cast<double>(l));
    }
  return t;
}

GateTables tables() { return {{"latent_error", latent_error()}, {"e2e", e2e()}, {"svd", svd()}}; }

std::vector<ThresholdResult> gate(const std::string& toml, const GateTables& t = tables()) {
  return evaluate_thresholds(t, parse_thresholds(toml, "t.toml"), "r.h5");
}

// The one result of a one-threshold file.
ThresholdResult one(const std::string& body) {
  const auto r = gate("[[threshold]]\n" + body);
  EXPECT_EQ(r.size(), 1u);
  return r.at(0);
}

std::string config_error(const std::string& toml, const GateTables& t = tables()) {
  try {
    gate(toml, t);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no config error for:\n" << toml;
  return "";
}

TEST(Percentile, LinearInterpolationAsNumpyDefault) {
  // numpy.quantile([1, 2, 3, 4], 0.95) = 3 + 0.85 * (4 - 3): h = 3 * 0.95 = 2.85.
  EXPECT_DOUBLE_EQ(percentile_linear({4, 1, 3, 2}, 0.95), 3.85);
  EXPECT_DOUBLE_EQ(percentile_linear({4, 1, 3, 2}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(percentile_linear({4, 1, 3, 2}, 1.0), 4);
  EXPECT_DOUBLE_EQ(percentile_linear({4, 1, 3, 2}, 0.0), 1);
  EXPECT_DOUBLE_EQ(percentile_linear({7}, 0.95), 7);
  EXPECT_TRUE(std::isnan(percentile_linear({}, 0.95)));
  EXPECT_TRUE(std::isnan(percentile_linear({1, NAN, 3}, 0.95)));
}

TEST(Regress, EachStatisticByHand) {
  // c_kv int4 rows: {0.1, 0.5, 0.2, 0.4, 0.3, 0.9}; sorted 0.1 .. 0.5, 0.9; p95: h = 5 * 0.95 = 4.75,
  // 0.5 + 0.75 * (0.9 - 0.5) = 0.8.
  const std::string q = "quantizer = \"int4-asym-channel-g32\"\ntarget = \"c_kv\"\nmetric = \"rel_fro\"\n";
  struct Case {
    const char* stat;
    double value;
  };
  for (const Case& c : {Case{"max", 0.9}, Case{"min", 0.1}, Case{"mean", 0.4}, Case{"p95", 0.8}}) {
    SCOPED_TRACE(c.stat);
    const ThresholdResult r = one(q + "statistic = \"" + c.stat + "\"\nbound = 1\n");
    EXPECT_EQ(r.rows, 6u);
    EXPECT_NEAR(r.value, c.value, 1e-15);
    EXPECT_TRUE(r.pass);
  }
  // The default statistic is max; an int64 metric reads as a number.
  EXPECT_DOUBLE_EQ(one(q + "bound = 1\n").value, 0.9);
  EXPECT_DOUBLE_EQ(one("quantizer = \"int8-asym-channel-g32\"\nmetric = \"bytes_per_token_layer\"\nbound = 72\n").value,
                   72);
}

TEST(Regress, BoundAndDirection) {
  const std::string q = "quantizer = \"int4-asym-channel-g32\"\ntarget = \"c_kv\"\nmetric = \"rel_fro\"\n";
  EXPECT_TRUE(one(q + "bound = 0.9\n").pass);  // value <= bound
  EXPECT_FALSE(one(q + "bound = 0.89\n").pass);
  EXPECT_TRUE(one(q + "statistic = \"min\"\ndirection = \"min\"\nbound = 0.1\n").pass);  // value >= bound
  EXPECT_FALSE(one(q + "statistic = \"min\"\ndirection = \"min\"\nbound = 0.11\n").pass);
  // top1_agree: higher is better, direction min inferred.
  const ThresholdResult r =
      one("group = \"e2e\"\nquantizer = \"int4-asym-token\"\nmetric = \"top1_agree\"\nstatistic = \"min\"\nbound = "
          "0.91\n");
  EXPECT_EQ(r.threshold.direction, "min");
  EXPECT_TRUE(r.threshold.direction_inferred);
  EXPECT_DOUBLE_EQ(r.value, 0.90);
  EXPECT_FALSE(r.pass);
}

TEST(Regress, EachFilter) {
  // layer: layer 3 of int4 c_kv is 0.4; of int4 k_pe 4.0.
  ThresholdResult r =
      one("quantizer = \"int4-asym-channel-g32\"\ntarget = \"c_kv\"\nlayer = 3\nmetric = "
          "\"rel_fro\"\nbound = 1\n");
  EXPECT_EQ(r.rows, 1u);
  EXPECT_DOUBLE_EQ(r.value, 0.4);
  // target: k_pe rows are 10x; without a target both (12 rows; max 9.0).
  r =
      one("quantizer = \"int4-asym-channel-g32\"\ntarget = \"k_pe\"\nmetric = \"rel_fro\"\nstatistic = \"mean\"\nbound "
          "= 9\n");
  EXPECT_EQ(r.rows, 6u);
  EXPECT_DOUBLE_EQ(r.value, 4.0);
  r = one("quantizer = \"int4-asym-channel-g32\"\nmetric = \"rel_fro\"\nbound = 9\n");
  EXPECT_EQ(r.rows, 12u);
  EXPECT_DOUBLE_EQ(r.value, 9.0);
  // cache_mode on /e2e: the decode row's KL 0.004 (the prefill rows: 0.010 on c_kv+k_pe, 0.003 on c_kv).
  r =
      one("group = \"e2e\"\nquantizer = \"int4-asym-channel-g32\"\ncache_mode = \"decode-r32-s4-p0\"\nmetric = "
          "\"kl_mean\"\nbound = 1\n");
  EXPECT_EQ(r.rows, 1u);
  EXPECT_DOUBLE_EQ(r.value, 0.004);
  // target on /e2e reads its targets column: c_kv selects the c_kv-only row, c_kv+k_pe the others.
  r =
      one("group = \"e2e\"\nquantizer = \"int4-asym-channel-g32\"\ntarget = \"c_kv\"\nmetric = \"kl_mean\"\nbound = "
          "1\n");
  EXPECT_EQ(r.rows, 1u);
  EXPECT_DOUBLE_EQ(r.value, 0.003);
  r =
      one("group = \"e2e\"\nquantizer = \"int4-asym-channel-g32\"\ntarget = \"c_kv+k_pe\"\nmetric = "
          "\"kl_mean\"\nstatistic = \"mean\"\nbound = 1\n");
  EXPECT_EQ(r.rows, 2u);
  EXPECT_DOUBLE_EQ(r.value, 0.007);
  // rank on /svd (no quantizer column, so no quantizer key): rank 64 of layers 0, 1 = 0.05, 0.06.
  r = one("group = \"svd\"\nrank = 64\nmetric = \"heldout_rel_fro\"\nbound = 1\n");
  EXPECT_EQ(r.rows, 2u);
  EXPECT_DOUBLE_EQ(r.value, 0.06);
  r = one("group = \"svd\"\nrank = 8\nlayer = 0\nmetric = \"heldout_rel_fro\"\nbound = 1\n");
  EXPECT_EQ(r.rows, 1u);
  EXPECT_DOUBLE_EQ(r.value, 0.5);
}

TEST(Regress, QuantizerGlobsAndNames) {
  const std::string pre = "group = \"e2e\"\ncache_mode = \"prefill-at-once\"\ntarget = \"c_kv+k_pe\"\n";
  const std::string post = "metric = \"kl_mean\"\nstatistic = \"mean\"\nbound = 1\n";
  struct Case {
    const char* quantizer;
    size_t rows;
    double mean;
  };
  const std::vector<Case> cases = {
      {"int4-asym-*", 2, 0.015},                 // int4-asym-channel-g32, int4-asym-token; not had,int4-...
      {"*int4-asym-channel-g32", 2, 0.008},      // and had,int4-asym-channel-g32
      {"int[24]-asym-channel-g32", 2, 0.055},    // a bracket expression
      {"int?-asym-channel-g32", 2, 0.055},       // one character
      {"*", 4, 0.034},                           // every quantizer
      {"int4-asym-channel-g32-fp16", 1, 0.010},  // an exact spec, compared in canonical form
      {"had,int4-asym-channel-g32", 1, 0.006},
      {"int3-*", 0, NAN},  // no rows: fails
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.quantizer);
    const ThresholdResult r = one(pre + "quantizer = \"" + c.quantizer + "\"\n" + post);
    EXPECT_EQ(r.rows, c.rows);
    if (c.rows) {
      EXPECT_NEAR(r.value, c.mean, 1e-15);
      EXPECT_TRUE(r.pass);
    } else {
      EXPECT_FALSE(r.pass);
    }
  }
  // A name that is not a spec matches as written when the group has it (svd-rank<r>, a [[mixed]] name).
  ColumnTable ae;
  ae.add<std::string>("quantizer") = {"svd-rank64", "int4-asym-channel-g32"};
  ae.add<double>("kl_mean") = {0.25, 0.5};
  const auto r = gate(
      "[[threshold]]\ngroup = \"attention_error\"\nquantizer = \"svd-rank64\"\nmetric = "
      "\"kl_mean\"\nbound = 1\n",
      {{"attention_error", ae}});
  EXPECT_EQ(r.at(0).rows, 1u);
  EXPECT_DOUBLE_EQ(r.at(0).value, 0.25);
}

TEST(Regress, ConfigErrorsNameTheEntry) {
  const std::string q = "quantizer = \"int4-asym-channel-g32\"\nmetric = \"rel_fro\"\nbound = 1\n";
  // parse_thresholds: an unknown group, statistic, a bad layer.
  EXPECT_CONTAINS(config_error("[[threshold]]\ngroup = \"latent_errors\"\n" + q),
                  "t.toml:2:9: unknown group 'latent_errors' (groups: latent_error, summary, svd, svd_spectrum, "
                  "cross_layer, cross_layer_sharing, attention_check, attention_error, attention_position, "
                  "indexer_error, e2e, e2e_position)");
  EXPECT_CONTAINS(config_error("[[threshold]]\n" + q + "statistic = \"p99\"\n"),
                  "t.toml:5:13: statistic 'p99' is not max, mean, min or p95");
  EXPECT_CONTAINS(config_error("[[threshold]]\n" + q + "layer = -1\n"), "t.toml:5:9: 'layer' must be an integer >= 0");
  EXPECT_CONTAINS(config_error("[[threshold]]\n" + q + "layer = \"3\"\n"), "'layer' must be an integer >= 0");
  EXPECT_CONTAINS(config_error("[[threshold]]\n" + q + "target = \"kv\"\n"),
                  "t.toml:5:10: target 'kv' is not c_kv, k_pe or c_kv+k_pe");
  // evaluate_thresholds: a group the results file lacks.
  EXPECT_CONTAINS(config_error("[[threshold]]\nmetric = \"kl_mean\"\nbound = 1\ngroup = \"attention_error\"\n"
                               "quantizer = \"*\"\n"),
                  "t.toml:4:9: group /attention_error is not in r.h5 (its gate groups: e2e, latent_error, svd)");
  // A metric that is not numeric in that group, listing the numeric columns.
  EXPECT_CONTAINS(
      config_error("[[threshold]]\ngroup = \"e2e\"\nquantizer = \"*\"\nmetric = \"cache_mode\"\nbound = 1\n"),
      "t.toml:4:10: metric 'cache_mode' is not a numeric column of /e2e (numeric columns: kl_mean, "
      "top1_agree, num_tokens)");
  EXPECT_CONTAINS(config_error("[[threshold]]\ngroup = \"e2e\"\nquantizer = \"*\"\nmetric = \"rel_fro\"\nbound = 1\n"),
                  "metric 'rel_fro' is not a numeric column of /e2e");
  // A filter on a column the group lacks, listing its columns.
  EXPECT_CONTAINS(config_error("[[threshold]]\ngroup = \"e2e\"\nquantizer = \"*\"\nmetric = \"kl_mean\"\nbound = "
                               "1\nlayer = 2\n"),
                  "t.toml:6:9: 'layer' filters on a column that /e2e lacks (/e2e columns: quantizer, targets, "
                  "cache_mode, kl_mean, top1_agree, num_tokens)");
  EXPECT_CONTAINS(config_error("[[threshold]]\n" + q + "cache_mode = \"prefill-at-once\"\n"),
                  "t.toml:5:14: 'cache_mode' filters on a column that /latent_error lacks (/latent_error columns: "
                  "layer, target, quantizer, rel_fro, bytes_per_token_layer)");
  EXPECT_CONTAINS(config_error("[[threshold]]\ngroup = \"svd\"\nquantizer = \"bf16\"\nmetric = \"heldout_rel_fro\"\n"
                               "bound = 1\n"),
                  "t.toml:3:13: 'quantizer' filters on a column that /svd lacks (/svd columns: layer, rank, "
                  "heldout_rel_fro)");
  // No quantizer in a group with a quantizer column; a target set on /latent_error's single target.
  EXPECT_CONTAINS(config_error("[[threshold]]\nmetric = \"rel_fro\"\nbound = 1\n"),
                  "t.toml:1:1: [[threshold]] on /latent_error without 'quantizer'");
  EXPECT_CONTAINS(config_error("[[threshold]]\n" + q + "target = \"c_kv+k_pe\"\n"),
                  "t.toml:5:10: target 'c_kv+k_pe' is a target set, but the target column of /latent_error holds "
                  "one target");
  // A name that is neither a spec nor a quantizer of the group.
  EXPECT_CONTAINS(config_error("[[threshold]]\nquantizer = \"bf17\"\nmetric = \"rel_fro\"\nbound = 1\n"),
                  "t.toml:2:13: unknown quantizer spec 'bf17'");
  EXPECT_CONTAINS(config_error("[[threshold]]\nquantizer = \"bf17\"\nmetric = \"rel_fro\"\nbound = 1\n"),
                  "and no quantizer of /latent_error in r.h5 is named so");
  // One wrong entry stops the whole gate, whatever its position.
  EXPECT_CONTAINS(config_error("[[threshold]]\n" + q +
                               "\n[[threshold]]\ngroup = \"e2e\"\nquantizer = \"*\"\nmetric = \"kl_mean\"\nbound = "
                               "1\nlayer = 99\n"),
                  "t.toml:11:9: 'layer' filters on a column that /e2e lacks");
}

TEST(Regress, SummaryListsTheFailuresByName) {
  const auto r = gate(R"([[threshold]]
quantizer = "int4-asym-channel-g32"
target = "c_kv"
metric = "rel_fro"
statistic = "p95"
bound = 0.5

[[threshold]]
quantizer = "int8-asym-channel-g32"
metric = "rel_fro"
bound = 0.06

[[threshold]]
group = "e2e"
quantizer = "int4-asym-channel-g32"
target = "c_kv+k_pe"
cache_mode = "decode-r32-s4-p0"
metric = "top1_agree"
bound = 0.99

[[threshold]]
group = "e2e"
quantizer = "int3-*"
metric = "kl_mean"
bound = 1
)");
  ASSERT_EQ(r.size(), 4u);
  const std::string s = format_threshold_results(r);
  const std::string tail = s.substr(s.find("gate: "));
  EXPECT_EQ(tail,
            "gate: 1 of 4 thresholds pass; 3 fail:\n"
            "  FAIL  int4-asym-channel-g32 c_kv /latent_error p95(rel_fro) = 0.8, bound <= 0.5   (t.toml:1:1)\n"
            "  FAIL  int4-asym-channel-g32 c_kv+k_pe decode-r32-s4-p0 /e2e max(top1_agree) = 0.98, bound >= 0.99   "
            "(t.toml:13:1)\n"
            "  FAIL  int3-* /e2e max(kl_mean): no rows match   (t.toml:21:1)\n")
      << s;
  EXPECT_CONTAINS(s, "PASS  int8-asym-channel-g32 /latent_error max(rel_fro)");
  EXPECT_CONTAINS(s, "= 0.06 ");
  // All passing: the summary says so and lists nothing.
  const std::string ok =
      format_threshold_results(gate("[[threshold]]\nquantizer = \"int8-asym-channel-g32\"\nmetric = \"rel_fro\"\nbound "
                                    "= 0.06\n"));
  EXPECT_EQ(ok.substr(ok.find("gate: ")), "gate: 1 of 1 thresholds pass (all)\n");
}

}  // namespace
