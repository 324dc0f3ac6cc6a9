// The probe groups of `latentq run` (latentq/probe_study.h): the attention recomputation against the
// real dump, cell plans and keys, independence of cells (subsets, thread counts), SVD-pruned
// attention at full rank, latent-only dumps, config errors, the CLI integration (groups written and
// readable, the printed tables, e2e / report skipped without Python).
#include "latentq/analysis/fit_transform.h"
#include "probe_study_test_util.h"

namespace {  // probe_study_test_util.h's using-declarations apply here too

// ---- plans and keys ------------------------------------------------------------------------------

TEST_F(ProbeTest, PlanKeysAreStable) {
  const ProbePlan p = plan_probes(config, dump);
  const std::vector<std::string> k = p.keys();
  ASSERT_EQ(std::set<std::string>(k.begin(), k.end()).size(), k.size()) << "duplicate keys";
  // kv_lora_rank 16: SVD ranks 1, 2, 4, 8, 12, 16. Quantizers: c_kv int4-asym-channel-g32,
  // int4-asym-token-g32, bf16; k_pe int4-asym-channel-g32, int8-sym-token.
  const std::vector<std::string> expected_head = {
      "000/svd",
      "001/svd",
      "002/svd",  // svd + svd_spectrum
      "000-001/cross_layer",
      "000-002/cross_layer",
      "001-002/cross_layer",
      "w2-000/cross_layer_sharing",
      "w2-001/cross_layer_sharing",
      "000/attention_check",
      "001/attention_check",
      "002/attention_check",
      "000/c_kv/int4-asym-channel-g32/attention_error",
      "000/c_kv/int4-asym-token-g32/attention_error",
      "000/c_kv/bf16/attention_error",
      "000/k_pe/int4-asym-channel-g32/attention_error",
      "000/k_pe/int8-sym-token/attention_error",
      "000/c_kv+k_pe/int4-asym-channel-g32/attention_error",  // the only quantizer run on both targets
      "000/c_kv/svd-rank1/attention_error",
      "000/c_kv/svd-rank2/attention_error",
      "000/c_kv/svd-rank4/attention_error",
      "000/c_kv/svd-rank8/attention_error",
      "000/c_kv/svd-rank12/attention_error",
      "000/c_kv/svd-rank16/attention_error",
      "001/c_kv/int4-asym-channel-g32/attention_error"};
  ASSERT_GE(k.size(), expected_head.size());
  EXPECT_EQ(std::vector<std::string>(k.begin(), k.begin() + static_cast<ptrdiff_t>(expected_head.size())),
            expected_head);
  EXPECT_EQ(k.size(), 3u + 3u + 2u + 3u + 3u * 12u);
  // Every group but /attention_position ([decode_order] absent: off) and /indexer_error (sparse MLA dumps only).
  std::vector<std::string> want = probe_groups();
  std::erase(want, "attention_position");
  std::erase(want, "indexer_error");
  EXPECT_EQ(p.groups, want);
  for (const ProbePlan::Part& part : p.parts) EXPECT_TRUE(part.part.notes.empty());
  EXPECT_EQ(p.cells[0].groups, (std::vector<std::string>{"svd", "svd_spectrum"}));
  EXPECT_EQ(p.cells[0].layers, (std::vector<int>{0}));
  EXPECT_EQ(p.cells.back().groups, (std::vector<std::string>{"attention_error"}));
  EXPECT_TRUE(p.cells.back().attention);
}

TEST_F(ProbeTest, PairSelectionAndLayerSubsets) {
  make({.layers = 4}, "[cross_layer]\npairs = \"adjacent\"\nwindows = [2, 3]\nranks = [6, 12]\n");
  ProbePlan p = plan_probes(config, dump);
  std::vector<std::string> cl;
  for (const auto& k : p.keys())
    if (k.find("cross_layer") != std::string::npos) cl.push_back(k);
  EXPECT_EQ(cl, (std::vector<std::string>{"000-001/cross_layer", "001-002/cross_layer", "002-003/cross_layer",
                                          "w2-000/cross_layer_sharing", "w2-001/cross_layer_sharing",
                                          "w2-002/cross_layer_sharing", "w3-000/cross_layer_sharing",
                                          "w3-001/cross_layer_sharing"}));
  // A layer subset: pairs and windows run over the studied layers in order.
  config = parse_config(std::string(kConfig) + "[input]\nlayers = [0, 3]\n", "probe.toml", dir.path());
  config.dump = path;
  reload();
  p = plan_probes(config, dump);
  EXPECT_EQ(p.cells[2].key, "000-003/cross_layer");
  EXPECT_EQ(p.cells[3].key, "w2-000/cross_layer_sharing");
  EXPECT_EQ(p.cells[3].layers, (std::vector<int>{0, 3}));
}

TEST_F(ProbeTest, DefaultSharingRanksAreMultiplesOfTheWindow) {
  EXPECT_EQ(sharing_ranks(config, dump, 2), (std::vector<int64_t>{4, 8, 16}));   // 2·16/8, /4, /2
  EXPECT_EQ(sharing_ranks(config, dump, 3), (std::vector<int64_t>{6, 12, 24}));  // 48/8 = 6, 12, 24
  Dump big = dump;  // the ranks depend on kv_lora_rank and the fit split only
  big.attrs.kv_lora_rank = 128;
  big.tokens.resize(2000);
  big.seq_offsets = {0, 1000, 2000};  // 1000 fit tokens: no cap
  EXPECT_EQ(sharing_ranks(config, big, 2), (std::vector<int64_t>{32, 64, 128}));
  EXPECT_EQ(svd_ranks(config, big), (std::vector<int64_t>{8, 16, 32, 64, 96, 128}));
  EXPECT_TRUE(rank_cap_warnings(config, big).empty());
}

// A short dump of a real model's shape (kv_lora_rank 512, 2 × 256 tokens): the automatic ranks reach
// 512 but the 256 fit tokens (centered) determine ranks up to 255. Automatic ranks are capped, with one
// warning line; a rank given explicitly is an error naming it and the fit tokens.
TEST_F(ProbeTest, AutomaticRanksAreCappedByTheFitSplit) {
  Dump big = dump;
  big.attrs.kv_lora_rank = 512;
  big.tokens.resize(512);
  big.seq_offsets = {0, 256, 512};
  EXPECT_EQ(svd_ranks(config, big), (std::vector<int64_t>{32, 64, 128, 255}));  // 256, 384, 512 → 255
  EXPECT_EQ(sharing_ranks(config, big, 2), (std::vector<int64_t>{128, 254}));   // 256, 512 → 254 (even)
  EXPECT_EQ(sharing_ranks(config, big, 3), (std::vector<int64_t>{192, 255}));   // 384, 768 → 255 (× 3)
  const std::vector<std::string> w = rank_cap_warnings(config, big);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_CONTAINS(w[0], "automatic ranks capped");
  EXPECT_CONTAINS(w[0], "has 256 tokens (the first 1 of its 2 non-empty sequences)");
  EXPECT_CONTAINS(w[0], "[svd] ranks 32, 64, 128, 255 instead of 32, 64, 128, 256, 384, 512");
  EXPECT_CONTAINS(w[0], "[cross_layer] window 2 ranks 128, 254 instead of 128, 256, 512");
  // Uncentered: the fit tokens themselves.
  StudyConfig unc = parse_config(std::string(kConfig) + "[svd]\ncentered = false\n", "probe.toml", dir.path());
  EXPECT_EQ(svd_ranks(unc, big), (std::vector<int64_t>{32, 64, 128, 256}));
  // Explicit ranks are never capped: an error naming the rank, the tokens it needs and those there are.
  StudyConfig expl = parse_config(std::string(kConfig) + "[svd]\nranks = [64, 300]\n", "probe.toml", dir.path());
  try {
    svd_ranks(expl, big);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "probe.toml: [svd] ranks: rank 300 needs 301 fit tokens, but the fit split of ");
    EXPECT_CONTAINS(e.what(), "has 256 tokens");
  }
  expl = parse_config(std::string(kConfig) + "[cross_layer]\nranks = [256]\n", "probe.toml", dir.path());
  try {
    sharing_ranks(expl, big, 2);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "probe.toml: [cross_layer] ranks: rank 256 needs 257 fit tokens");
  }
  // A fit split that determines no rank at all (centered: 1 fit token).
  big.seq_offsets = {0, 1, 512};
  try {
    svd_ranks(config, big);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "has 1 token (the first 1 of its 2 non-empty sequences), which determine ranks up to 0");
    EXPECT_CONTAINS(e.what(), "no SVD rank can be fit");
  }
}

TEST_F(ProbeTest, RanksTheDumpCannotTakeAreErrors) {
  config = parse_config(std::string(kConfig) + "[svd]\nranks = [8, 17]\n", "probe.toml", dir.path());
  try {
    plan_probes(config, dump);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "rank 17 is larger than kv_lora_rank 16");
  }
  config = parse_config(std::string(kConfig) + "[cross_layer]\nranks = [34]\n", "probe.toml", dir.path());
  EXPECT_THROW(plan_probes(config, dump), std::invalid_argument);
}

TEST_F(ProbeTest, ConfigErrorsNameTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[svd]\nrank = [4]\n", "unknown key 'svd.rank'"},
      {"[svd]\nranks = [0]\n", "'svd.ranks': 0 is < 1"},
      {"[svd]\nenabled = 1\n", "'svd.enabled' must be true or false"},
      {"[cross_layer]\nwindows = [2]\nranks = [3]\n", "rank 3 is not a multiple of the window size 2"},
      {"[cross_layer]\npairs = \"some\"\n", "'cross_layer.pairs' is 'some'"},
      {"[cross_layer]\nwindows = [1]\n", "'cross_layer.windows': 1 is < 2"},
      {"[attention]\ntargets = [\"c_kv\", \"q\"]\n", "'attention.targets': 'q' is not one of"},
      {"[attention]\ncheck_tolerance = -1\n", "'attention.check_tolerance' must be > 0"},
      {"[indexer]\nquantizers = [\"flashmla-v32-fp8\"]\n", "'indexer.quantizers': 'flashmla-v32-fp8' is an engine preset"},
      {"[indexer]\nlatent = [\"exact\", \"exact\"]\n", "'indexer.latent': 'exact' is listed twice"},
      {"[indexer]\nlatent = [\"int3-sym-token\"]\n", "(or exact: c_kv and k_pe as dumped)"},
      {"[indexer]\nlatent = []\n", "'indexer.latent' is empty"},
      {"[e2e]\nquantizers = [\"int3-sym-token\"]\n", "'e2e.quantizers'"},
      {"[e2e]\nmodle = \"x\"\n", "unknown key 'e2e.modle'"},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    try {
      parse_config(std::string(kConfig) + text, "probe.toml", dir.path());
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_CONTAINS(e.what(), "probe.toml:");
      EXPECT_CONTAINS(e.what(), message);
    }
  }
  // Defaults when the sections are absent; [e2e] model resolves against the config's directory.
  const StudyConfig c =
      parse_config(std::string(kConfig) + "[e2e]\nenabled = true\nmodel = \"m\"\n", "p.toml", dir.path());
  EXPECT_TRUE(probe_settings<SvdSettings>(c, "svd").enabled &&
              probe_settings<CrossLayerSettings>(c, "cross_layer").enabled &&
              probe_settings<AttentionSettings>(c, "attention").enabled);
  EXPECT_EQ(probe_settings<CrossLayerSettings>(c, "cross_layer").windows, (std::vector<int64_t>{2}));
  EXPECT_TRUE(c.probes.e2e.enabled);
  EXPECT_EQ(c.probes.e2e.model, (dir.path() / "m").lexically_normal());
  EXPECT_FALSE(parse_config(kConfig, "p.toml", dir.path()).probes.e2e.enabled);
}

// ---- values ----------------------------------------------------------------------------------------

const ColumnTable& table_of(const std::vector<NamedTable>& tables, const std::string& group) {
  const auto it = std::find_if(tables.begin(), tables.end(), [&](const NamedTable& t) { return t.group == group; });
  if (it == tables.end()) throw std::invalid_argument("no table " + group);
  return it->table;
}

TEST_F(ProbeTest, CellsAreIndependentOfThreadsAndOfEachOther) {
  config.results = dir / "a.h5";
  const auto backend = make_cpu_backend();
  BatchOptions one, many;
  one.threads = 1;
  many.threads = 3;
  const BatchResult ra = run_study_batch(dir / "a.h5", plan_study(config, *backend), one);
  const BatchResult rb = run_study_batch(dir / "b.h5", plan_study(config, *backend), many);
  for (const std::string& g : probe_groups()) {
    SCOPED_TRACE(g);
    if (g == "attention_position") continue;  // [decode_order] absent (ProbeCliTest runs it)
    if (g == "indexer_error") continue;       // sparse MLA dumps only (test_mla_variants.py runs it)
    const ColumnTable& a = table_of(ra.tables, g);
    EXPECT_EQ(a.names(), probe_columns(g));
    EXPECT_GT(a.num_rows(), 0u);
    EXPECT_EQ(table_difference(a, table_of(rb.tables, g)), "");
  }
  // Only layer 1's cells, in reverse order, each alone on a fresh plan (its own layer store): the same
  // rows as in the full run.
  const StudyPlan plan = plan_study(config, *backend);
  std::vector<size_t> sub;
  for (size_t i = 0; i < plan.tasks.size(); ++i)
    if (plan.tasks[i].key.rfind("001/", 0) == 0 && plan.tasks[i].key.find("latent_error") == std::string::npos)
      sub.push_back(i);
  ASSERT_GT(sub.size(), 10u);
  for (auto it = sub.rbegin(); it != sub.rend(); ++it) {
    const StudyPlan fresh = plan_study(config, *backend);
    const CellTask& task = fresh.tasks[*it];
    const std::vector<ColumnTable> rows = task.compute();
    ASSERT_EQ(rows.size(), task.groups.size());
    for (size_t g = 0; g < task.groups.size(); ++g) {
      const ColumnTable& full = table_of(ra.tables, task.groups[g]);
      const std::vector<std::string> keys = row_keys(task.groups[g], full);
      const std::vector<std::string> mine = row_keys(task.groups[g], rows[g]);
      ASSERT_FALSE(mine.empty());
      for (const std::string& k : mine) EXPECT_EQ(k, task.key);
      // The cell's rows are a contiguous block of the full table.
      const size_t first = static_cast<size_t>(std::find(keys.begin(), keys.end(), task.key) - keys.begin());
      ASSERT_LE(first + rows[g].num_rows(), full.num_rows());
      ColumnTable block = empty_probe_table(task.groups[g]);
      for (const auto& [name, col] : full.columns()) {
        std::visit(
            [&](const auto& v) {
              using V = std::decay_t<decltype(v)>;
              std::get<V>(block.at(name))
                  .assign(v.begin() + static_cast<ptrdiff_t>(first),
                          v.begin() + static_cast<ptrdiff_t>(first + rows[g].num_rows()));
            },
            col);
      }
      EXPECT_EQ(table_difference(block, rows[g]), "") << task.key;
    }
  }
}

// A stand-in for the CUDA backend's attention device: the device contract of probes::AttentionDevice
// written out literally in float64 (scores, causal softmax, o_lat, W_UV per head) over the layout, counting
// its runs. With `metrics` it also computes attention_error's terms itself (keep_reference, error_terms) as
// the CUDA device does, here by a sort of each row's keys (value descending, then key index) for the top-8.
class LiteralAttentionDevice final : public probes::AttentionDevice {
 public:
  LiteralAttentionDevice(const probes::AttentionLayout& l, std::shared_ptr<std::atomic<int>> runs, bool metrics = false)
      : l_(l), nkeys_(l.nkeys.begin(), l.nkeys.end()), runs_(std::move(runs)), metrics_(metrics) {
    const int64_t Tq = static_cast<int64_t>(nkeys_.size()), H = l.dims.num_heads;
    q_lat_.assign(l.q_lat, l.q_lat + Tq * H * l.dims.kv_lora_rank);
    q_pe_.assign(l.q_pe, l.q_pe + Tq * H * l.dims.qk_rope_head_dim);
    w_uv_.assign(l.w_uv, l.w_uv + H * l.dims.v_head_dim * l.dims.kv_lora_rank);
  }
  void run(const float* c_kv, const float* k_pe, float* out, float* probs) const override {
    literal(c_kv, k_pe, nullptr, nullptr, nullptr, out, probs);
  }
  // A mixed cache: row p reads c_kv key j from A iff j in [ranges[4p], ranges[4p + 1]), k_pe likewise with
  // [ranges[4p + 2], ranges[4p + 3]); B elsewhere (ranges null: A everywhere).
  void literal(const float* c_kv, const float* k_pe, const float* c_kv_b, const float* k_pe_b, const int64_t* ranges,
               float* out, float* probs) const {
    ++*runs_;
    const int64_t H = l_.dims.num_heads, r = l_.dims.kv_lora_rank, rope = l_.dims.qk_rope_head_dim,
                  v = l_.dims.v_head_dim;
    int64_t off = 0;
    for (const probes::AttentionSegment& g : l_.segments) {
      for (int64_t p = g.begin; p < g.end; ++p)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t row = p * H + h, n = nkeys_[p];
          const auto from_a = [&](int which, int64_t j) {
            return !ranges || (j >= ranges[p * 4 + 2 * which] && j < ranges[p * 4 + 2 * which + 1]);
          };
          const auto ckv = [&](int64_t j) { return (from_a(0, j) ? c_kv : c_kv_b) + (g.key_begin + j) * r; };
          const auto kpe = [&](int64_t j) { return (from_a(1, j) ? k_pe : k_pe_b) + (g.key_begin + j) * rope; };
          std::vector<double> s(static_cast<size_t>(n));
          double m = -1e300;
          for (int64_t j = 0; j < n; ++j) {
            double x = 0;
            for (int64_t c = 0; c < r; ++c) x += double(q_lat_[row * r + c]) * ckv(j)[c];
            for (int64_t c = 0; c < rope; ++c) x += double(q_pe_[row * rope + c]) * kpe(j)[c];
            s[j] = x * l_.softmax_scale;
            m = std::max(m, s[j]);
          }
          double z = 0;
          for (double& x : s) z += (x = std::exp(x - m));
          std::vector<double> o(static_cast<size_t>(r), 0.0);
          for (int64_t j = 0; j < n; ++j) {
            s[j] /= z;
            for (int64_t c = 0; c < r; ++c) o[c] += s[j] * ckv(j)[c];
          }
          if (probs)
            for (int64_t j = 0; j < g.nk; ++j)
              probs[off + (row - g.begin * H) * g.nk + j] = j < n ? static_cast<float>(s[j]) : 0.0f;
          for (int64_t d = 0; d < v; ++d) {
            double x = 0;
            for (int64_t c = 0; c < r; ++c) x += o[c] * w_uv_[(h * v + d) * r + c];
            out[row * v + d] = static_cast<float>(x);
          }
        }
      off += (g.end - g.begin) * H * g.nk;
    }
  }
  bool computes_error_terms() const override { return metrics_; }
  void keep_reference(const float* c_kv, const float* k_pe, float* out) const override {
    const int64_t n_out = static_cast<int64_t>(nkeys_.size()) * l_.dims.num_heads * l_.dims.v_head_dim;
    ref_probs_.assign(static_cast<size_t>(probs_size()), 0.0f);
    ref_out_.assign(static_cast<size_t>(n_out), 0.0f);
    run(c_kv, k_pe, ref_out_.data(), ref_probs_.data());
    std::copy(ref_out_.begin(), ref_out_.end(), out);
  }
  void error_terms(const float* c_kv, const float* k_pe, probes::AttentionPairTerms* terms) const override {
    terms_of(c_kv, k_pe, nullptr, nullptr, nullptr, terms);
  }
  bool runs_mixed() const override { return metrics_; }
  void run_mixed(const float* c_kv_a, const float* k_pe_a, const float* c_kv_b, const float* k_pe_b,
                 const int64_t* ranges, float* out, float* probs) const override {
    literal(c_kv_a, k_pe_a, c_kv_b, k_pe_b, ranges, out, probs);
  }
  void error_terms_mixed(const float* c_kv_a, const float* k_pe_a, const float* c_kv_b, const float* k_pe_b,
                         const int64_t* ranges, probes::AttentionPairTerms* terms) const override {
    terms_of(c_kv_a, k_pe_a, c_kv_b, k_pe_b, ranges, terms);
  }

 private:
  void terms_of(const float* c_kv, const float* k_pe, const float* c_kv_b, const float* k_pe_b, const int64_t* ranges,
                probes::AttentionPairTerms* terms) const {
    const int64_t H = l_.dims.num_heads, v = l_.dims.v_head_dim;
    std::vector<float> probs(static_cast<size_t>(probs_size())), out(ref_out_.size());
    literal(c_kv, k_pe, c_kv_b, k_pe_b, ranges, out.data(), probs.data());
    const auto top = [](const float* x, int64_t n) {
      std::vector<int64_t> idx(static_cast<size_t>(n));
      std::iota(idx.begin(), idx.end(), int64_t{0});
      std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return x[a] > x[b]; });
      idx.resize(static_cast<size_t>(std::min<int64_t>(8, n)));
      return idx;
    };
    int64_t off = 0;
    for (const probes::AttentionSegment& g : l_.segments) {
      for (int64_t p = g.begin; p < g.end; ++p)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t row = p * H + h, n = nkeys_[p];
          const float* a = ref_probs_.data() + off + (row - g.begin * H) * g.nk;
          const float* b = probs.data() + off + (row - g.begin * H) * g.nk;
          probes::AttentionPairTerms t;
          for (int64_t j = 0; j < n; ++j)
            if (a[j] > 0) t.kl += double(a[j]) * std::log(double(a[j]) / std::max(double(b[j]), probes::kKlProbFloor));
          const std::vector<int64_t> ta = top(a, n), tb = top(b, n);
          t.top1 = ta[0] == tb[0];
          for (const int64_t x : ta) t.top_common += std::count(tb.begin(), tb.end(), x) > 0 ? 1 : 0;
          t.equal = true;
          for (int64_t d = 0; d < v; ++d) {
            const double x = ref_out_[row * v + d], y = out[row * v + d];
            t.dot += x * y, t.ref2 += x * x, t.test2 += y * y, t.err2 += (y - x) * (y - x);
            t.equal = t.equal && x == y;
          }
          terms[row] = t;
        }
      off += (g.end - g.begin) * H * g.nk;
    }
  }

  int64_t probs_size() const {
    int64_t n = 0;
    for (const probes::AttentionSegment& g : l_.segments) n += (g.end - g.begin) * l_.dims.num_heads * g.nk;
    return n;
  }
  probes::AttentionLayout l_;
  std::vector<int64_t> nkeys_;
  std::vector<float> q_lat_, q_pe_, w_uv_;
  std::shared_ptr<std::atomic<int>> runs_;
  bool metrics_ = false;
  mutable std::vector<float> ref_probs_, ref_out_;  // the kept reference
};

// /attention_error columns of two runs row by row: |y − x| ≤ rtol·|x| + atol.
void expect_columns_near(const ColumnTable& x, const ColumnTable& y, std::initializer_list<const char*> cols,
                         double rtol, double atol) {
  for (const char* col : cols) {
    const auto& u = x.get<double>(col);
    const auto& w = y.get<double>(col);
    for (size_t i = 0; i < u.size(); ++i)
      EXPECT_NEAR(w[i], u[i], rtol * std::fabs(u[i]) + atol)
          << col << " row " << i << " (" << x.get<std::string>("quantizer")[i] << ", "
          << x.get<std::string>("targets")[i] << ")";
  }
}

// The CPU backend with that device as its attention device (what the CUDA backend is to the study).
class DeviceAttentionBackend final : public LatentBackend {
 public:
  explicit DeviceAttentionBackend(bool metrics = false) : metrics_(metrics) {}
  std::shared_ptr<std::atomic<int>> runs = std::make_shared<std::atomic<int>>(0);
  std::string name() const override { return "cpu+literal-attention"; }
  bool concurrent() const override { return true; }
  StoredCell run(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                 std::span<const int64_t> seq_offsets, float* decoded) override {
    return cpu_->run(spec, target, X, T, D, seq_offsets, decoded);
  }
  probes::AttentionDeviceFactory attention_device() const override {
    const std::shared_ptr<std::atomic<int>> n = runs;
    const bool m = metrics_;
    return [n, m](const probes::AttentionLayout& l) { return std::make_unique<LiteralAttentionDevice>(l, n, m); };
  }

 private:
  bool metrics_ = false;
  std::unique_ptr<LatentBackend> cpu_ = make_cpu_backend();
};

TEST_F(ProbeTest, AttentionErrorCellsRunOnTheBackendsAttentionDevice) {
  const auto cpu = make_cpu_backend();
  DeviceAttentionBackend dev;
  BatchOptions o;
  o.threads = 2;
  const BatchResult a = run_study_batch(dir / "cpu.h5", plan_study(config, *cpu), o);
  const BatchResult b = run_study_batch(dir / "dev.h5", plan_study(config, dev), o);
  // Each layer's reference and every cell's attention went through the device: per layer 1 reference +
  // 12 cells (the plan of PlanKeysAreStable), 3 layers.
  EXPECT_EQ(dev.runs->load(), 3 * (1 + 12));
  for (const std::string& g : probe_groups()) {
    SCOPED_TRACE(g);
    if (g == "attention_position" || g == "indexer_error") continue;  // not in this config / a dense dump
    const ColumnTable& x = table_of(a.tables, g);
    const ColumnTable& y = table_of(b.tables, g);
    if (g != "attention_error") {
      EXPECT_EQ(table_difference(x, y), "");  // the attention check stays on the CPU, as every other probe
      continue;
    }
    ASSERT_EQ(x.num_rows(), y.num_rows());
    EXPECT_EQ(x.get<std::string>("quantizer"), y.get<std::string>("quantizer"));
    EXPECT_EQ(x.get<double>("bytes_per_token_layer"), y.get<double>("bytes_per_token_layer"));
    expect_columns_near(x, y, {"out_rel_fro", "kl_mean", "cos_mean", "top1_agree", "top8_agree"}, 1e-3, 1e-7);
  }
}

// A device that computes attention_error's terms itself (the CUDA device does): the cells take its
// metrics, and they equal those computed here from the same device's probabilities (float64 rounding apart;
// the same top-1/top-8 counts); every other table is the CPU's, bit for bit.
TEST_F(ProbeTest, AttentionErrorCellsTakeTheDevicesOwnMetrics) {
  DeviceAttentionBackend host_metrics(false), device_metrics(true);
  BatchOptions o;
  o.threads = 2;
  const BatchResult a = run_study_batch(dir / "host.h5", plan_study(config, host_metrics), o);
  const BatchResult b = run_study_batch(dir / "dev.h5", plan_study(config, device_metrics), o);
  EXPECT_EQ(device_metrics.runs->load(), 3 * (1 + 12));  // per layer the kept reference + 12 cells
  for (const std::string& g : probe_groups()) {
    SCOPED_TRACE(g);
    if (g == "attention_position" || g == "indexer_error") continue;  // not in this config / a dense dump
    const ColumnTable& x = table_of(a.tables, g);
    const ColumnTable& y = table_of(b.tables, g);
    if (g != "attention_error") {
      EXPECT_EQ(table_difference(x, y), "");
      continue;
    }
    ASSERT_EQ(x.num_rows(), y.num_rows());
    EXPECT_EQ(x.get<std::string>("quantizer"), y.get<std::string>("quantizer"));
    EXPECT_EQ(x.get<std::string>("targets"), y.get<std::string>("targets"));
    EXPECT_EQ(x.get<double>("top1_agree"), y.get<double>("top1_agree"));
    EXPECT_EQ(x.get<double>("top8_agree"), y.get<double>("top8_agree"));
    expect_columns_near(x, y, {"out_rel_fro", "kl_mean", "cos_mean"}, 1e-9, 1e-15);
  }
}

// The decode-order cells on a device that evaluates mixed caches and computes the errors itself: every
// order of every /attention_position cell runs there (one mixed run per order), and the rows equal the CPU
// engine's to float32 rounding (the device is float64); the other tables are as without decode order.
TEST_F(ProbeTest, DecodeOrderCellsRunOnTheDevice) {
  make({},
       "\n[decode_order]\nresidual = [0, 8]\nsink = [0, 2]\nquantizers = [\"int4-asym-channel-g32\"]\n"
       "position_bucket = 16\n");
  const auto cpu = make_cpu_backend();
  DeviceAttentionBackend device_metrics(true);
  BatchOptions o;
  o.threads = 2;
  const BatchResult a = run_study_batch(dir / "cpu.h5", plan_study(config, *cpu), o);
  const BatchResult b = run_study_batch(dir / "dev.h5", plan_study(config, device_metrics), o);
  // Per layer: the kept reference, 12 /attention_error cells, and 1 decode-order cell × (baseline + 4 modes).
  EXPECT_EQ(device_metrics.runs->load(), 3 * (1 + 12 + 5));
  const ColumnTable& x = table_of(a.tables, "attention_position");
  const ColumnTable& y = table_of(b.tables, "attention_position");
  ASSERT_EQ(x.num_rows(), 3u * 5u * 2u);
  ASSERT_EQ(x.num_rows(), y.num_rows());
  EXPECT_EQ(x.get<std::string>("cache_mode"), y.get<std::string>("cache_mode"));
  EXPECT_EQ(x.get<int64_t>("queries"), y.get<int64_t>("queries"));
  EXPECT_EQ(x.get<double>("quantized_key_frac"), y.get<double>("quantized_key_frac"));
  EXPECT_EQ(x.get<double>("bytes_per_token"), y.get<double>("bytes_per_token"));
  for (const char* col : {"kl_mean", "out_rel_fro"}) {
    const auto& u = x.get<double>(col);
    const auto& w = y.get<double>(col);
    for (size_t i = 0; i < u.size(); ++i)
      EXPECT_NEAR(w[i], u[i], 1e-3 * std::fabs(u[i]) + 1e-7)
          << col << " row " << i << " (" << x.get<std::string>("cache_mode")[i] << ")";
  }
}

TEST_F(ProbeTest, AttentionRowsOnASyntheticDump) {
  // Sequences of 40, 24 and 5 tokens: the g32 channel groups of the last two are partial.
  // k_pe runs bf16 too, so that the c_kv, k_pe and c_kv+k_pe bf16 rows are all planned.
  const std::string with_bf16 =
      std::regex_replace(std::string(kConfig), std::regex("\"int8-sym-token\"\\]"), "\"int8-sym-token\", \"bf16\"]");
  ASSERT_NE(with_bf16, kConfig);
  make({.seq_lens = {40, 24, 5}}, "", with_bf16.c_str());
  const int64_t r = dump.attrs.kv_lora_rank, rope = dump.attrs.qk_rope_head_dim;
  for (int layer = 0; layer < 3; ++layer) {
    SCOPED_TRACE(layer);
    // The synthetic attn_out is the float64 absorbed attention: the float32 recomputation is close.
    auto key = [&](const char* targets, const std::string& q) {
      return fmt::format("{:03d}/{}/{}/attention_error", layer, targets, q);
    };
    const ColumnTable check = run(fmt::format("{:03d}/attention_check", layer))[0];
    EXPECT_LT(check.get<double>("ref_vs_dump_rel_fro")[0], 1e-4);
    EXPECT_EQ(check.get<int64_t>("tq")[0], 6);
    // A target the row does not quantize is rounded to bf16 (it is charged as bf16): quantizing c_kv,
    // k_pe or both with "bf16" is the same computation, so the three rows agree exactly.
    const ColumnTable bc = run(key("c_kv", "bf16"))[0];
    const ColumnTable bk = run(key("k_pe", "bf16"))[0];
    const ColumnTable bb = run(key("c_kv+k_pe", "bf16"))[0];
    const double bf16_err = bb.get<double>("out_rel_fro")[0];
    EXPECT_GT(bf16_err, 0.0);
    EXPECT_LT(bf16_err, 1e-2);
    EXPECT_EQ(bc.get<double>("out_rel_fro")[0], bf16_err);
    EXPECT_EQ(bk.get<double>("out_rel_fro")[0], bf16_err);
    EXPECT_EQ(bc.get<double>("bytes_per_token_layer")[0], 2.0 * static_cast<double>(r + rope));
    // SVD-pruned c_kv at full rank: the coefficients are rounded to bf16 (the dtype charged) and k_pe is
    // bf16, so the error is bf16-level: not 0, the same order as the bf16 row.
    const ColumnTable full = run(key("c_kv", "svd-rank16"))[0];
    EXPECT_GT(full.get<double>("out_rel_fro")[0], bf16_err / 4);
    EXPECT_LT(full.get<double>("out_rel_fro")[0], bf16_err * 4);
    EXPECT_EQ(full.get<double>("bits_per_element_c_kv")[0], 16.0);
    EXPECT_EQ(full.get<double>("bytes_per_token_layer")[0], 2.0 * static_cast<double>(r + rope));
    // Low rank: a real error, accounted as r bf16 coefficients.
    const ColumnTable low = run(key("c_kv", "svd-rank2"))[0];
    EXPECT_GT(low.get<double>("out_rel_fro")[0], 1e-2);
    EXPECT_EQ(low.get<double>("bits_per_element_c_kv")[0], 2.0);
    EXPECT_EQ(low.get<double>("bytes_per_token_layer")[0], 4.0 + 2.0 * static_cast<double>(rope));
    // Quantized k_pe only: c_kv counted as bf16; int8 sym token over 8 dims: 8 bits + fp16 scale per token.
    const QuantSpec s8 = QuantSpec::parse("int8-sym-token");
    const ColumnTable k = run(key("k_pe", s8.to_string()))[0];
    EXPECT_EQ(k.get<double>("bits_per_element_c_kv")[0], 16.0);
    EXPECT_EQ(k.get<double>("bytes_per_token_layer")[0],
              2.0 * static_cast<double>(r) + static_cast<double>(rope) + 2.0);
    EXPECT_GT(k.get<double>("out_rel_fro")[0], 0.0);
    EXPECT_LT(k.get<double>("out_rel_fro")[0], 0.1);
    // Quantizing more cannot be free: c_kv+k_pe at int4 has an error, a top-1 agreement in [0, 1].
    const QuantSpec s4 = QuantSpec::parse("int4-asym-channel-g32");
    const ColumnTable both = run(key("c_kv+k_pe", s4.to_string()))[0];
    EXPECT_GT(both.get<double>("out_rel_fro")[0], 1e-3);
    EXPECT_GE(both.get<double>("top1_agree")[0], 0.0);
    EXPECT_LE(both.get<double>("top1_agree")[0], 1.0);
    EXPECT_GE(both.get<double>("kl_mean")[0], -1e-9);
  }
}

TEST_F(ProbeTest, LatentOnlyDumpSkipsTheAttentionGroups) {
  const ProbePlan with = plan_probes(config, dump);  // the dump with attention data
  make({.attention = false});
  const ProbePlan p = plan_probes(config, dump);
  std::vector<std::string> notes;
  for (const ProbePlan::Part& part : p.parts) notes.insert(notes.end(), part.part.notes.begin(), part.part.notes.end());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_CONTAINS(notes[0], "attention: skipped: ");
  EXPECT_CONTAINS(notes[0], "has no dataset /layers/000/q_rows");
  for (const std::string& k : p.keys()) EXPECT_EQ(k.find("attention"), std::string::npos) << k;
  EXPECT_EQ(p.groups, (std::vector<std::string>{"svd", "svd_spectrum", "cross_layer", "cross_layer_sharing"}));
  // An attention cell run on the latent-only dump anyway names the cell and the missing dataset.
  const ProbeCell& c = with.cell("000/attention_check");
  try {
    const std::unique_ptr<LayerAccess> in = store->open({c.layers, c.attention});
    run_probe_cell(config, c, *in);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "cell 000/attention_check");
    EXPECT_CONTAINS(e.what(), "q_rows");
  }
}

// The recomputation on the shipped dump equals the model's attn_out.
TEST(ProbeRealDump, AbsorbedRecomputationMatchesTheDumpedAttnOut) {
  const fs::path dump_path = fs::path(LATENTQ_SOURCE_DIR) / "data" / "latents" / "tiny-mla.h5";
  ASSERT_TRUE(fs::exists(dump_path)) << dump_path << " is missing (a tracked file)";
  StudyConfig config = default_config();
  config.dump = dump_path;
  const Dump dump = header_of(config);
  ASSERT_EQ(dump.layers.size(), 6u);
  LayerStore store(dump);
  const ProbePlan plan = plan_probes(config, dump);
  auto run = [&](const std::string& key) {
    const ProbeCell& c = plan.cell(key);
    const std::unique_ptr<LayerAccess> in = store.open({c.layers, c.attention});
    return run_probe_cell(config, c, *in);
  };
  for (const Layer& l : dump.layers) {
    SCOPED_TRACE(l.index);
    const ColumnTable t = run(fmt::format("{:03d}/attention_check", l.index))[0];
    const double rel = t.get<double>("ref_vs_dump_rel_fro")[0];
    EXPECT_LE(rel, 1e-4);
    EXPECT_GT(rel, 0.0);  // float32 against the model's float32 path: equal only up to rounding
    EXPECT_EQ(t.get<int64_t>("tq")[0], 256);
    // SVD-pruned c_kv at full rank (kv_lora_rank 128), bf16 coefficients and bf16 k_pe: a bf16-level
    // attention error, the same order as the bf16 row's.
    const double bf16_err =
        run(fmt::format("{:03d}/c_kv+k_pe/bf16/attention_error", l.index))[0].get<double>("out_rel_fro")[0];
    const ColumnTable s = run(fmt::format("{:03d}/c_kv/svd-rank128/attention_error", l.index))[0];
    EXPECT_GT(bf16_err, 0.0);
    EXPECT_LT(bf16_err, 1e-2);
    EXPECT_GT(s.get<double>("out_rel_fro")[0], bf16_err / 4);
    EXPECT_LT(s.get<double>("out_rel_fro")[0], bf16_err * 4);
  }
}

// The rotation fold: on every layer of tiny-mla, the absorbed attention with the cache rotated (c_kv and k_pe, each
// with its own rotation) and W_UK, W_UV, q_pe rotated, no quantization, equals the unrotated one to 1e-4
// relative in float32 (kFoldTolerance) — for had, had32 (block-diagonal: 4 blocks on c_kv, 1 on k_pe), rot and klt. Leaving
// W_UV (or W_UK, or q_pe) unrotated must fail the check loudly.
TEST(ProbeRealDump, RotationFoldIsExactAndABrokenFoldFails) {
  const fs::path dump_path = fs::path(LATENTQ_SOURCE_DIR) / "data" / "latents" / "tiny-mla.h5";
  ASSERT_TRUE(fs::exists(dump_path)) << dump_path << " is missing (a tracked file)";
  const Dump dump = load_dump(dump_path);  // every layer with its attention data
  const DumpAttrs& A = dump.attrs;
  ASSERT_EQ(A.kv_lora_rank, 128);
  ASSERT_EQ(A.qk_rope_head_dim, 32);
  const int64_t T = dump.num_tokens();
  for (const Layer& l : dump.layers) {
    const probes::AttentionQueries q = latentq::attention_queries(dump, l);
    for (const char* name : {"had", "had32-s5", "rot", "rot-s1", "klt"}) {
      SCOPED_TRACE(fmt::format("layer {} transform {} T={}", l.index, name, T));
      const Transform tr = Transform::parse(name);
      const Rotation rc = probes::fit_rotation(tr, l.c_kv.data(), T, A.kv_lora_rank, dump.seq_offsets);
      const Rotation rk = probes::fit_rotation(tr, l.k_pe.data(), T, A.qk_rope_head_dim, dump.seq_offsets);
      const probes::FoldCheck f = probes::require_fold_exact(q, l.c_kv, l.k_pe, rc, rk, name);
      EXPECT_LE(f.out_rel_fro, probes::kFoldTolerance);
      EXPECT_GT(f.out_rel_fro, 0.0);  // float32: the rotation rounds, so not bit-equal
      EXPECT_LT(std::abs(f.kl_mean), 1e-6);
      // The broken folds: the cache rotated, one weight path not.
      for (const auto& [mode, what] :
           {std::pair{probes::FoldMode::SkipWUV, "W_UV"}, std::pair{probes::FoldMode::SkipWUK, "W_UK"},
            std::pair{probes::FoldMode::SkipQPe, "q_pe"}}) {
        SCOPED_TRACE(what);
        const probes::FoldCheck b = probes::fold_check(q, l.c_kv, l.k_pe, rc, rk, mode);
        EXPECT_GT(b.out_rel_fro, 100 * probes::kFoldTolerance);  // far beyond rounding
        try {
          probes::require_fold_exact(q, l.c_kv, l.k_pe, rc, rk, std::string("skip ") + what, mode);
          ADD_FAILURE() << "a fold without " << what << " passed the check";
        } catch (const std::runtime_error& e) {
          EXPECT_NE(std::string(e.what()).find("fold check failed: skip"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("> 1e-04"), std::string::npos) << e.what();
        }
      }
    }
  }
}

TEST(ProbeRegistry, SectionsGroupsAndSettings) {
  std::vector<std::string> sections;
  for (const Probe* p : registered_probes()) sections.push_back(p->section());
  EXPECT_EQ(sections, (std::vector<std::string>{"svd", "cross_layer", "attention", "decode_order", "indexer"}));
  EXPECT_EQ(probe_groups(),
            (std::vector<std::string>{"svd", "svd_spectrum", "cross_layer", "cross_layer_sharing", "attention_check",
                                      "attention_error", "attention_position", "indexer_error"}));
  EXPECT_EQ(probe_of_group("indexer_error"), find_probe("indexer"));
  EXPECT_EQ(probe_of_group("cross_layer_sharing"), find_probe("cross_layer"));
  EXPECT_EQ(probe_of_group("attention_position"), find_probe("decode_order"));
  try {
    parse_config("[decode_order]\nresidual = [0, 32]\n", "probe.toml", ".");
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "probe.toml:");
    EXPECT_CONTAINS(e.what(), "[decode_order] needs 'quantizers'");
  }
  try {
    parse_config("[decode_orders]\nresidual = [0, 32]\n", "probe.toml", ".");
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "unknown key 'decode_orders'");
    EXPECT_CONTAINS(e.what(), "attention, decode_order");
  }
  const std::string text = "[decode_order]\nresidual = [0, 32, 128]\nsink = [0, 4]\nprefill = 0\n";
  const auto r = make_settings_reader(text, "probe.toml", ".", "decode_order");
  EXPECT_TRUE(r->present());
  r->check_keys({"residual", "sink", "prefill"});
  EXPECT_EQ(*r->ints("residual", 0), (std::vector<int64_t>{0, 32, 128}));
  EXPECT_EQ(*r->ints("sink", 0), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(*r->number("prefill"), 0.0);
  EXPECT_FALSE(r->boolean("enabled").has_value());  // absent: the probe's default
  try {
    make_settings_reader(text, "probe.toml", ".", "decode_order")->check_keys({"residual", "sink"});
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "probe.toml:4:");
    EXPECT_CONTAINS(e.what(), "unknown key 'decode_order.prefill' (valid keys in [decode_order]: residual, sink)");
  }
  try {
    make_settings_reader("[decode_order]\nsink = [4, 4]\n", "probe.toml", ".", "decode_order")->ints("sink", 0);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "'decode_order.sink': 4 is listed twice");
  }
  EXPECT_FALSE(make_settings_reader("", "probe.toml", ".", "decode_order")->present());
}

TEST(ProbeRowKeys, KeysFromColumns) {
  ColumnTable t = empty_probe_table("attention_error");
  std::get<std::vector<int64_t>>(t.at("layer")) = {3};
  std::get<std::vector<std::string>>(t.at("quantizer")) = {"svd-rank32"};
  std::get<std::vector<std::string>>(t.at("targets")) = {"c_kv"};
  for (const char* c : {"out_rel_fro", "cos_mean", "kl_mean", "top1_agree", "top8_agree", "bits_per_element_c_kv",
                        "bytes_per_token_layer"})
    std::get<std::vector<double>>(t.at(c)) = {0.0};
  EXPECT_EQ(row_keys("attention_error", t), (std::vector<std::string>{"003/c_kv/svd-rank32/attention_error"}));
  ColumnTable s = empty_probe_table("cross_layer_sharing");
  EXPECT_TRUE(row_keys("cross_layer_sharing", s).empty());
  EXPECT_THROW(row_keys("summary", s), std::invalid_argument);
  EXPECT_THROW(probe_columns("nope"), std::invalid_argument);
}

}  // namespace

// The printed e2e summary: prefill-at-once rows in the first table (sorted by bytes, then KL), rows of
// a decode-order cache once each in a second table with their cache_mode and per-layer bytes.
TEST(E2eSummary, DecodeOrderRowsGetTheirOwnTable) {
  ColumnTable e2e, summary;
  e2e.add<std::string>("quantizer") = {"int4-asym-token", "int4-asym-token", "bf16"};
  e2e.add<std::string>("cache_mode") = {"prefill-at-once", "decode-r32-s4-p0", "prefill-at-once"};
  e2e.add<double>("kl_mean") = {1.5e-2, 1.7e-4, 7e-6};
  e2e.add<double>("top1_agree") = {0.9, 0.99, 1.0};
  e2e.add<double>("ppl_ref") = {4.25, 4.25, 4.25};
  e2e.add<double>("ppl_quant") = {4.5, 4.26, 4.25};
  e2e.add<double>("bytes_per_token") = {88.0, 103.5, 320.0};
  summary.add<std::string>("quantizer") = {"int4-asym-token", "bf16"};
  summary.add<double>("bytes_per_token_model") = {528.0, 1920.0};
  const std::string out = format_e2e_summary(e2e, summary);
  const size_t second = out.find("End to end in decode order");
  ASSERT_NE(second, std::string::npos) << out;
  const std::string first = out.substr(0, second), rest = out.substr(second);
  EXPECT_EQ(first.find("1.700e-04"), std::string::npos) << out;
  EXPECT_NE(first.find("1.500e-02"), std::string::npos) << out;
  EXPECT_LT(first.find("int4-asym-token"), first.find("bf16")) << out;  // 528 < 1920 bytes/token
  EXPECT_NE(rest.find("decode-r32-s4-p0"), std::string::npos) << out;
  EXPECT_NE(rest.find("103.5"), std::string::npos) << out;
  EXPECT_EQ(rest.find("1.500e-02"), std::string::npos) << out;
  // Without a cache_mode column (results of an older run) every row is in the first table.
  ColumnTable old;
  for (const char* c : {"quantizer", "kl_mean", "top1_agree", "ppl_ref", "ppl_quant"}) old.add_column(c, e2e.at(c));
  EXPECT_EQ(format_e2e_summary(old, summary).find("decode order"), std::string::npos);
}
