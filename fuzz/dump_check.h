// dump_check.h — the properties both dump harnesses check on one file (fuzz_dump.cpp, fuzz_dump_schema.cpp).
#pragma once

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "latentq/dump.h"
#include "latentq/inspect.h"

namespace lqfuzz {

template <class T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

inline void check_shape(const std::vector<float>& v, std::initializer_list<int64_t> dims, const char* name) {
  unsigned __int128 n = 1;
  for (int64_t d : dims) n *= static_cast<unsigned __int128>(d);
  if (n != v.size()) fail(std::string("a loaded dump with a wrong-sized ") + name);
}

/// Loads `path` in full (load_dump with `layers`, `attention`) and as a header followed by read_layer() of
/// each layer; both succeed or both fail (std::invalid_argument / std::runtime_error naming the path),
/// with the same values. A loaded dump holds the documented shapes and `inspect` formats it.
inline void check_dump(const std::filesystem::path& path, const std::vector<int>& layers, bool attention = true) {
  using namespace latentq;
  const std::string p = path.string();
  LoadOptions full;
  full.layers = layers;
  full.attention = attention;
  Dump d;
  const bool ok = run([&] { d = load_dump(path, full); }, p, "load_dump");

  LoadOptions head = full;
  head.data = false;
  Dump h;
  bool ok_stream = run([&] { h = load_dump(path, head); }, p, "load_dump (header)");
  for (size_t i = 0; ok_stream && i < h.layers.size(); ++i)
    ok_stream = run([&] { h.layers[i] = read_layer(h, h.layers[i].index, attention); }, p, "read_layer");
  if (ok != ok_stream)
    fail(std::string("load_dump ") + (ok ? "accepts" : "refuses") + " the file but the header and read_layer " +
         (ok_stream ? "accept" : "refuse") + " it");
  if (!ok) return;

  if (!same(d.tokens, h.tokens) || !same(d.positions, h.positions) || !same(d.seq_offsets, h.seq_offsets) ||
      d.layers.size() != h.layers.size())
    fail("the full load and the streamed load differ (token arrays)");
  const DumpAttrs& A = d.attrs;
  const int64_t T = d.num_tokens();
  if (T <= 0 || d.positions.size() != d.tokens.size() || d.num_seqs() < 1) fail("a loaded dump with bad token arrays");
  for (size_t i = 0; i < d.layers.size(); ++i) {
    const Layer &a = d.layers[i], &b = h.layers[i];
    if (a.index != b.index || !same(a.c_kv, b.c_kv) || !same(a.k_pe, b.k_pe) || !same(a.q_rows, b.q_rows) ||
        !same(a.q_nope, b.q_nope) || !same(a.q_pe, b.q_pe) || !same(a.w_uk, b.w_uk) || !same(a.w_uv, b.w_uv) ||
        !same(a.attn_out, b.attn_out))
      fail("the full load and the streamed load differ (layer " + std::to_string(a.index) + ")");
    check_shape(a.c_kv, {T, A.kv_lora_rank}, "c_kv");
    check_shape(a.k_pe, {T, A.qk_rope_head_dim}, "k_pe");
    if (a.has_attention()) {
      const int64_t Tq = a.num_query_rows();
      for (int32_t r : a.q_rows)
        if (r < 0 || r >= T) fail("a loaded dump with a q_rows entry outside [0, T)");
      check_shape(a.q_nope, {Tq, A.num_heads, A.qk_nope_head_dim}, "q_nope");
      check_shape(a.q_pe, {Tq, A.num_heads, A.qk_rope_head_dim}, "q_pe");
      check_shape(a.w_uk, {A.num_heads, A.qk_nope_head_dim, A.kv_lora_rank}, "w_uk");
      check_shape(a.w_uv, {A.num_heads, A.v_head_dim, A.kv_lora_rank}, "w_uv");
      check_shape(a.attn_out, {Tq, A.num_heads, A.v_head_dim}, "attn_out");
    }
  }
  (void)format_inspect(d);
}

}  // namespace lqfuzz
