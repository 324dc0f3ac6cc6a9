// Sparse MLA in the absorbed-attention engine (AttentionQueries::selected_*, DeepSeek Sparse Attention): each query
// row reads only its selected keys. Against the float64 loop reference restricted to those keys
// (attention_test_util.h), the unabsorbed path and run_variants; a selection of every key is dense MLA bit for bit;
// malformed selections and the device path are refused.
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_test_util.h"

namespace {

/// A random selection: each query row reads min(k, nkeys) distinct keys of its window, always its own token.
KeySelection random_selection(const RandomLayer& l, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  KeySelection sel;
  sel.offsets.push_back(0);
  for (int32_t t : l.q_rows) {
    int64_t s0 = 0;
    for (size_t s = 0; s + 1 < l.seq_offsets.size(); ++s)
      if (l.seq_offsets[s] <= t && t < l.seq_offsets[s + 1]) s0 = l.seq_offsets[s];
    const int64_t n = t - s0 + 1;
    std::vector<int32_t> keys(static_cast<size_t>(n - 1));
    std::iota(keys.begin(), keys.end(), 0);
    std::shuffle(keys.begin(), keys.end(), rng);
    keys.resize(static_cast<size_t>(std::min<int64_t>(k, n) - 1));
    keys.push_back(static_cast<int32_t>(n - 1));
    std::sort(keys.begin(), keys.end());
    sel.keys.insert(sel.keys.end(), keys.begin(), keys.end());
    sel.offsets.push_back(static_cast<int64_t>(sel.keys.size()));
  }
  return sel;
}

AttentionQueries with(const RandomLayer& l, const KeySelection& sel) {
  AttentionQueries q = l.queries();
  q.selected_offsets = sel.offsets;
  q.selected_keys = sel.keys;
  return q;
}

}  // namespace

TEST(SparseAttention, MatchesTheLoopReferenceOverTheSelectedKeys) {
  for (uint64_t seed : {41, 42}) {
    const RandomLayer l = make_layer(seed, 3, 40, 20, MlaDims{2, 16, 8, 4, 8});
    const KeySelection sel = random_selection(l, 7, seed + 100);
    SCOPED_TRACE(l.describe() + " k 7");
    const LoopReference ref = loop_reference(l, &sel);
    const auto a = absorbed_attention<double>(with(l, sel), l.c_kv, l.k_pe, true);
    const auto u = unabsorbed_attention<double>(with(l, sel), l.c_kv, l.k_pe, true);
    EXPECT_LT(rel_fro(ref.out, a.out), 1e-12);
    EXPECT_LT(rel_fro(ref.out, u.out), 1e-12);
    ASSERT_EQ(a.probs.size(), ref.probs.size());
    for (size_t j = 0; j < ref.probs.size(); ++j) ASSERT_NEAR(a.probs[j], ref.probs[j], 1e-13) << j;
    // an unselected key has probability exactly 0; the dense answer is another one
    for (size_t i = 0; i < l.q_rows.size(); ++i)
      for (int64_t h = 0; h < 2; ++h) {
        int64_t nonzero = 0;
        for (double p : a.prob(static_cast<int64_t>(i), h)) nonzero += p > 0;
        EXPECT_EQ(nonzero, sel.offsets[i + 1] - sel.offsets[i]) << "row " << i;
      }
    const auto dense = absorbed_attention<double>(l.queries(), l.c_kv, l.k_pe);
    EXPECT_GT(rel_fro(dense.out, a.out), 1e-3);
    const auto f = absorbed_attention<float>(with(l, sel), l.c_kv, l.k_pe);
    std::vector<double> fd(f.out.begin(), f.out.end());
    EXPECT_LT(rel_fro(ref.out, fd), 1e-5);
  }
}

TEST(SparseAttention, RunVariantsAndRunMixedReadTheSelection) {
  const RandomLayer l = make_layer(43, 2, 64, 24, MlaDims{3, 32, 16, 8, 16});
  const KeySelection sel = random_selection(l, 9, 143);
  SCOPED_TRACE(l.describe() + " k 9");
  const AbsorbedAttention<float> att(with(l, sel));
  const auto one = att.run(l.c_kv, l.k_pe, true);
  using V = AbsorbedAttention<float>::Variant;
  const std::vector<V> vs{{l.c_kv, l.k_pe}, {l.c_kv, l.k_pe}};
  const auto both = att.run_variants(vs, true);
  for (const auto& r : both) {
    EXPECT_LE(rel_fro(one.out, r.out), 1e-6);
    ASSERT_EQ(r.probs.size(), one.probs.size());
    for (size_t j = 0; j < r.probs.size(); ++j)
      if (one.probs[j] == 0) ASSERT_EQ(r.probs[j], 0.0f) << j;
  }
  // a mixed cache whose store A covers every key is run() itself
  std::vector<KeyRange> all(l.q_rows.size(), KeyRange{0, 1 << 20});
  const auto mixed = att.run_mixed(MixedCache{l.c_kv, l.k_pe, l.c_kv, l.k_pe, all, all}, true);
  EXPECT_EQ(mixed.out, one.out);
  EXPECT_EQ(mixed.probs, one.probs);
}

TEST(SparseAttention, SelectingEveryKeyIsDenseBitForBit) {
  const RandomLayer l = make_layer(44, 2, 50, 16, MlaDims{2, 16, 8, 4, 8});
  SCOPED_TRACE(l.describe());
  const KeySelection sel = random_selection(l, 1 << 20, 144);
  const auto dense = absorbed_attention<float>(l.queries(), l.c_kv, l.k_pe, true);
  const auto sparse = absorbed_attention<float>(with(l, sel), l.c_kv, l.k_pe, true);
  EXPECT_EQ(dense.out, sparse.out);
  EXPECT_EQ(dense.probs, sparse.probs);
}

TEST(SparseAttention, MalformedSelectionsAreRefused) {
  const RandomLayer l = make_layer(45, 1, 12, 4, MlaDims{1, 4, 2, 2, 2});
  const KeySelection good = random_selection(l, 3, 145);
  const auto refused = [&](KeySelection s, const std::string& what) {
    try {
      AbsorbedAttention<float> a(with(l, s));
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  KeySelection s = good;
  s.offsets.pop_back();
  refused(s, "selected_offsets has 4 entries");
  s = good;
  s.keys.assign(s.keys.size(), 0);
  refused(s, "expected strictly ascending keys in [0, ");
  s = good;
  s.keys[s.offsets[1] - 1] = static_cast<int32_t>(l.q_rows[0] + 5);  // past the row's own token
  refused(s, "(its causal window)");
  s = good;
  s.offsets = {0, 0, 0, 0, 0};
  s.keys.clear();
  refused(s, "query row 0 selects no key");
  AbsorbedAttention<float> a(with(l, good));
  try {
    a.attach_device([](const AttentionLayout&) -> std::unique_ptr<AttentionDevice> { return nullptr; });
    ADD_FAILURE() << "a sparse layer attached a device";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("runs on the CPU"), std::string::npos) << e.what();
  }
}
