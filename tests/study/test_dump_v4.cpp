// The DeepSeek-V4 branch of the dump loader (study/io/dump_v4.cpp): a synthetic V4 dump (tests/study/synth_v4.h)
// loads exactly, by header and by layer; each target's rows and row offsets; every refusal names the path, the
// dataset and what was expected.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "latentq/dump.h"
#include "latentq/inspect.h"
#include "synth_dump.h"
#include "synth_v4.h"

namespace {
using namespace latentq;
using lqtest::TempDir;
namespace fs = std::filesystem;

template <class F>
void expect_invalid(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

struct DumpV4Test : ::testing::Test {
  TempDir dir;
  lqtest::SynthV4 data = lqtest::make_synth_v4();
  fs::path path = dir / "v4.h5";
  void SetUp() override { lqtest::write_synth_v4(path, data); }
  std::string p() const { return path.string(); }
};

TEST_F(DumpV4Test, LoadsWhatWasWritten) {
  const Dump d = load_dump(path);
  EXPECT_EQ(d.attrs.cache_family, "deepseek_v4");
  EXPECT_TRUE(d.attrs.v4());
  EXPECT_EQ(d.attrs.head_dim, 32);
  EXPECT_EQ(d.attrs.qk_rope_head_dim, 8);
  EXPECT_EQ(d.attrs.kv_lora_rank, 0);
  EXPECT_EQ(d.attrs.index_head_dim, 16);
  EXPECT_EQ(d.attrs.width(Target::WindowKV), 32);
  EXPECT_EQ(d.attrs.width(Target::CompressedKV), 32);
  EXPECT_EQ(d.attrs.width(Target::IndexK), 16);
  EXPECT_TRUE(d.file_has_attention);
  EXPECT_EQ(d.num_tokens(), 33);
  // seq_lens 20 + 13: CSA (m = 4) 5 + 3 entries, HCA (m = 8) 2 + 1
  EXPECT_EQ(d.compressed_layers, (std::vector<int>{1, 2}));
  EXPECT_EQ(d.indexer_layers, (std::vector<int>{1}));
  const std::vector<std::pair<Target, std::vector<bool>>> holds = {
      {Target::WindowKV, {true, true, true}},   {Target::CompressedKV, {false, true, true}},
      {Target::IndexK, {false, true, false}},   {Target::CKV, {false, false, false}},
      {Target::KPE, {false, false, false}}};
  for (const auto& [t, want] : holds)
    for (int l = 0; l < 3; ++l) EXPECT_EQ(d.holds(l, t), want[l]) << to_string(t) << " layer " << l;

  const Layer& sl = d.layer(0);
  const Layer& csa = d.layer(1);
  const Layer& hca = d.layer(2);
  EXPECT_EQ(sl.layer_type, "sliding");
  EXPECT_EQ(csa.layer_type, "csa");
  EXPECT_EQ(hca.layer_type, "hca");
  EXPECT_EQ(sl.compress_rate, 0);
  EXPECT_EQ(csa.compress_rate, 4);
  EXPECT_EQ(hca.compress_rate, 8);
  EXPECT_EQ(csa.sliding_window, 8);
  EXPECT_DOUBLE_EQ(csa.softmax_scale, 1.0 / std::sqrt(32.0));
  EXPECT_EQ(csa.index_topk, 3);
  EXPECT_DOUBLE_EQ(csa.index_softmax_scale, 0.25);
  EXPECT_EQ(hca.index_topk, 0);
  for (size_t l = 0; l < 3; ++l) {
    const Layer& L = d.layer(static_cast<int>(l));
    const lqtest::SynthV4Layer& W = data.layers[l];
    EXPECT_EQ(L.window_kv, W.window_kv);
    EXPECT_EQ(L.compressed_kv, W.compressed_kv);
    EXPECT_EQ(L.compressed_span, W.span);
    EXPECT_EQ(L.compressed_rope_position, W.rope_position);
    EXPECT_EQ(L.compressed_offsets, W.offsets);
    EXPECT_EQ(L.index_k, W.index_k);
    EXPECT_EQ(L.q, W.q);
    EXPECT_EQ(L.rope_cos, W.rope_cos);
    EXPECT_EQ(L.rope_sin, W.rope_sin);
    EXPECT_EQ(L.attn_out, W.attn_out);
    EXPECT_EQ(L.sinks, W.sinks);
    EXPECT_EQ(L.index_q, W.index_q);
    EXPECT_EQ(L.index_w, W.index_w);
    EXPECT_EQ(L.index_selected, W.selected);
    EXPECT_EQ(L.q_rows, data.q_rows);
    EXPECT_TRUE(L.has_attention());
    EXPECT_TRUE(L.v4());
  }
  EXPECT_EQ(csa.index_heads, 2);
  EXPECT_EQ(csa.index_dim, 16);
  // rows and their per-sequence offsets: window_kv per token, compressed_kv and index_k per entry
  EXPECT_EQ(&csa.rows(Target::WindowKV), &csa.window_kv);
  EXPECT_EQ(&csa.rows(Target::CompressedKV), &csa.compressed_kv);
  EXPECT_EQ(&csa.rows(Target::IndexK), &csa.index_k);
  EXPECT_EQ(csa.row_offsets(Target::WindowKV, d.seq_offsets), (std::vector<int64_t>{0, 20, 33}));
  EXPECT_EQ(csa.row_offsets(Target::CompressedKV, d.seq_offsets), (std::vector<int64_t>{0, 5, 8}));
  EXPECT_EQ(csa.row_offsets(Target::IndexK, d.seq_offsets), (std::vector<int64_t>{0, 5, 8}));
  EXPECT_EQ(hca.row_offsets(Target::CompressedKV, d.seq_offsets), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(csa.num_rows(Target::WindowKV, d.seq_offsets), 33);
  EXPECT_EQ(csa.num_rows(Target::CompressedKV, d.seq_offsets), 8);
  EXPECT_EQ(hca.num_rows(Target::CompressedKV, d.seq_offsets), 3);
  EXPECT_EQ(sl.num_rows(Target::CompressedKV, d.seq_offsets), 0);
  EXPECT_EQ(csa.rows(Target::CompressedKV).size(), 8u * 32u);
  // spans: HCA [8w, 8w + 8); CSA [max(0, 4w - 4), 4w + 4)
  EXPECT_EQ(hca.compressed_span, (std::vector<int64_t>{0, 8, 8, 16, 0, 8}));
  EXPECT_EQ(std::vector<int64_t>(csa.compressed_span.begin(), csa.compressed_span.begin() + 6),
            (std::vector<int64_t>{0, 4, 0, 8, 4, 12}));
}

// A header (data = false) reads the layer attributes and checks every shape, reads no value; read_layer gives the
// values; without attention only the caches are read.
TEST_F(DumpV4Test, HeaderThenLayers) {
  LoadOptions o;
  o.data = false;
  const Dump h = load_dump(path, o);
  ASSERT_EQ(h.layers.size(), 3u);
  EXPECT_EQ(h.layers[1].layer_type, "csa");
  EXPECT_EQ(h.layers[2].compress_rate, 8);
  EXPECT_TRUE(h.layers[1].index_k.empty() && h.layers[0].window_kv.empty());
  const Layer l = read_layer(h, 1, false);
  EXPECT_EQ(l.compressed_kv, data.layers[1].compressed_kv);
  EXPECT_EQ(l.index_k, data.layers[1].index_k);
  EXPECT_TRUE(l.q.empty() && l.index_q.empty() && l.index_selected.empty() && !l.has_attention());
  validate_layers(h, true);
}

// `latentq inspect` of a V4 dump: its shapes, then per layer each cache it holds over its own rows (window_kv on
// every layer, compressed_kv on CSA / HCA, index_k on CSA).
TEST_F(DumpV4Test, Inspect) {
  const std::string out = format_inspect(load_dump(path));
  EXPECT_NE(out.find("dims            num_heads 2, head_dim 32, qk_rope_head_dim 8, index_head_dim 16 (deepseek_v4)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("attention data  yes (6 query rows per layer, q, rope cos / sin, sinks, attn_out)"),
            std::string::npos);
  std::vector<std::string> rows;
  // the target column as wide as compressed_kv (13), so that every row's numbers line up under the header's
  for (size_t a = out.find("layer target            absmax"), b; (b = out.find('\n', a)) != std::string::npos;
       a = b + 1) {
    const std::string line = out.substr(a, b - a);
    if (line.empty()) break;
    rows.push_back(line);
  }
  ASSERT_EQ(rows.size(), 7u) << out;  // the header, then 3 window_kv, 2 compressed_kv, 1 index_k
  EXPECT_EQ(rows[1].substr(0, 15), "    0 window_kv");
  EXPECT_EQ(rows[3].substr(0, 19), "    1 compressed_kv");
  EXPECT_EQ(rows[4].substr(0, 13), "    1 index_k");
  EXPECT_EQ(rows[6].substr(0, 19), "    2 compressed_kv");
  for (const std::string& r : rows) {  // "absmax" and each row's absmax end in column 29
    EXPECT_EQ(r[19], ' ') << r;
    EXPECT_NE(r[29], ' ') << r;
    EXPECT_EQ(r[30], ' ') << r;
  }
}

// A sequence too short for any HCA entry: the layer holds compressed_kv [0, D] and no compressed_kv rows to study.
TEST(DumpV4, NoEntriesOnALayer) {
  TempDir dir;
  lqtest::SynthV4Spec s;
  s.seq_lens = {7, 6};  // no complete window of 8; CSA 1 + 1 entries
  const fs::path path = dir / "short.h5";
  lqtest::write_synth_v4(path, lqtest::make_synth_v4(s));
  const Dump d = load_dump(path);
  EXPECT_EQ(d.compressed_layers, (std::vector<int>{1}));
  EXPECT_FALSE(d.holds(2, Target::CompressedKV));
  EXPECT_TRUE(d.holds(1, Target::IndexK));
  EXPECT_EQ(d.layer(2).compressed_offsets, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(d.layer(2).num_rows(Target::CompressedKV, d.seq_offsets), 0);
}

// Each broken file is refused with the path, the dataset or attribute, and what was expected.
TEST_F(DumpV4Test, Refusals) {
  const auto reload = [&](auto&& mutate, std::initializer_list<std::string> parts) {
    lqtest::write_synth_v4(path, data);
    mutate();
    std::vector<std::string> all{p()};
    all.insert(all.end(), parts.begin(), parts.end());
    try {
      (void)load_dump(path);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      for (const std::string& x : all) EXPECT_NE(msg.find(x), std::string::npos) << "'" << x << "' not in: " << msg;
    }
  };
  reload([&] { lqtest::delete_link(path, "/layers/001/compressed_kv"); },
         {"missing dataset /layers/001/compressed_kv (float32 N compressed entries, head_dim)"});
  reload([&] { lqtest::delete_link(path, "/layers/001/index_k"); }, {"missing dataset /layers/001/index_k"});
  reload([&] { lqtest::delete_link(path, "/layers/000/window_kv"); },
         {"missing dataset /layers/000/window_kv (float32 T from /tokens, head_dim)"});
  reload([&] { lqtest::put_f32(path, "/layers/002/window_kv", {33, 31}, std::vector<float>(33 * 31)); },
         {"/layers/002/window_kv has shape [33, 31], expected [33, 32] (T from /tokens, head_dim)"});
  reload([&] { lqtest::put_f32(path, "/layers/001/q", {6, 2, 16}, std::vector<float>(6 * 2 * 16)); },
         {"/layers/001/q has shape [6, 2, 16], expected [6, 2, 32] (Tq, num_heads, head_dim)"});
  reload([&] { lqtest::put_i64(path, "/layers/001/index_selected", {6, 2}, std::vector<int64_t>(12)); },
         {"/layers/001/index_selected has shape [6, 2], expected [6, 3] (Tq, index_topk)"});
  reload([&] { lqtest::put_f32(path, "/layers/002/compressed_span", {3, 2}, std::vector<float>(6)); },
         {"/layers/002/compressed_span has dtype float32, expected int64"});
  reload([&] { lqtest::delete_link(path, "/layers/002/sinks"); },
         {"attention datasets must be all present or all absent", "sinks"});
  reload([&] { lqtest::put_i64(path, "/layers/002/compressed_offsets", {3}, {0, 1, 3}); },
         {"/layers/002/compressed_offsets = [0, 1, 3]: sequence 0 (20 tokens) owns 1 entries, expected 2"});
  reload([&] { lqtest::put_i64(path, "/layers/002/compressed_span", {3, 2}, {0, 8, 8, 21, 0, 8}); },
         {"/layers/002: entry 1 (sequence 0, 20 tokens) has compressed_span [8, 21)"});
  reload(
      [&] {
        std::vector<int64_t> sel = data.layers[1].selected;
        sel[5 * 3] = 3;  // the last row is in sequence 1, which has 3 entries
        lqtest::put_i64(path, "/layers/001/index_selected", {6, 3}, sel);
      },
      {"/layers/001/index_selected[5, 0] = 3: expected -1 (none) or an entry of the query row's sequence 1 in [0, 3)"});
  reload(
      [&] {
        std::vector<float> w = data.layers[2].compressed_kv;
        w[7] = std::numeric_limits<float>::quiet_NaN();
        lqtest::put_f32(path, "/layers/002/compressed_kv", {3, 32}, w);
      },
      {"layer 002: /layers/002/compressed_kv has 1 NaN/Inf values (of 96)"});
  reload([&] { lqtest::set_attr_at(path, "/layers/001", "layer_type", std::string("full")); },
         {"/layers/001: attribute 'layer_type' is \"full\", expected sliding, csa or hca"});
  reload([&] { lqtest::set_attr_at(path, "/layers/000", "compress_rate", int64_t{4}); },
         {"/layers/000: attribute 'compress_rate' = 4 on a sliding layer, expected 0"});
  reload([&] { lqtest::put_f32(path, "/layers/000/compressed_kv", {1, 32}, std::vector<float>(32)); },
         {"/layers/000/compressed_kv on a sliding layer: expected none"});
  reload([&] { lqtest::delete_attr_at(path, "/layers/001", "index_topk"); },
         {"/layers/001: missing attribute 'index_topk' (expected an integer)"});
  reload([&] { lqtest::delete_attr_at(path, "/", "head_dim"); }, {"missing root attribute 'head_dim'"});
  reload([&] { lqtest::set_attr_at(path, "/", "qk_rope_head_dim", int64_t{32}); },
         {"root attribute 'qk_rope_head_dim' = 32: expected an even width below head_dim = 32"});
}

}  // namespace
