// DeepSeek-V4's cache bytes at long context (latentq/study.h v4_cache_table): /latent_error's bytes per stored row
// of window_kv, compressed_kv and index_k turned into what a sequence costs, per layer type.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <tuple>

#include "latentq/study.h"

namespace latentq {

std::vector<std::string> v4_layer_records(const Dump& dump) {
  std::vector<std::string> out;
  for (const Layer& l : dump.layers)
    out.push_back(fmt::format("{}:{}:{}:{}", l.index, l.layer_type, l.compress_rate, l.sliding_window));
  return out;
}

std::vector<V4LayerInfo> parse_v4_layer_records(const std::vector<std::string>& records) {
  std::vector<V4LayerInfo> out;
  for (const std::string& r : records) {
    V4LayerInfo v;
    char type[16] = {0};
    long long layer = 0, rate = 0, window = 0;
    if (std::sscanf(r.c_str(), "%lld:%15[a-z]:%lld:%lld", &layer, type, &rate, &window) != 4)
      throw std::invalid_argument(
          fmt::format("v4_layers: '{}' is not layer:type:compress_rate:sliding_window (e.g. 1:csa:4:128)", r));
    v.layer = static_cast<int>(layer);
    v.layer_type = type;
    v.compress_rate = rate;
    v.sliding_window = window;
    out.push_back(v);
  }
  return out;
}

const GroupSpec& v4_cache_spec() {
  static const GroupSpec g{
      "v4_cache",
      {{"quantizer", ColType::Str, "", "the quantizer, as /latent_error names it"},
       {"target", ColType::Str, "", "window_kv, compressed_kv or index_k (DeepSeek-V4's caches)"},
       {"layer_type", ColType::Str, "", "sliding, csa or hca: the rows average the studied layers of this type"},
       {"layers", ColType::I64, "", "studied layers of this type with /latent_error rows of this target"},
       {"bytes_per_row", ColType::F64, "byte/row",
        "/latent_error's bytes_per_token_layer, mean over those layers: bytes of one stored row (a token's window "
        "entry, a compressed entry, an indexer key), metadata included"},
       {"rows_per_token", ColType::F64, "row/token",
        "rows stored per token of context at long context: 1/compress_rate for compressed_kv and index_k (CSA "
        "1/4, HCA 1/128 in V4-Flash); NaN for window_kv (its rows are bounded by the window)"},
       {"bytes_per_token", ColType::F64, "byte/token",
        "bytes_per_row · rows_per_token: one layer's bytes per token of context at long context (NaN for window_kv)"},
       {"bytes_per_sequence", ColType::F64, "byte/sequence",
        "window_kv: sliding_window · bytes_per_row, one layer's window per sequence once the context exceeds the "
        "window (NaN for the compressed caches, which grow with the context)"},
       {"mean_rel_fro", ColType::F64, "1", "mean over those layers of /latent_error's rel_fro"}}};
  return g;
}

ColumnTable v4_cache_table(const ColumnTable& le, const std::vector<V4LayerInfo>& layers) {
  std::map<int, const V4LayerInfo*> by_layer;
  for (const V4LayerInfo& v : layers) by_layer[v.layer] = &v;
  const auto& ly = le.get<int64_t>("layer");
  const auto& q = le.get<std::string>("quantizer");
  const auto& tg = le.get<std::string>("target");
  const auto& bpt = le.get<double>("bytes_per_token_layer");
  const auto& rf = le.get<double>("rel_fro");
  struct Acc {
    int64_t n = 0;
    double bytes = 0, rate_inv = 0, window = 0, rel_fro = 0;
  };
  using Key = std::tuple<std::string, std::string, std::string>;
  std::vector<Key> order;
  std::map<Key, Acc> acc;
  for (size_t i = 0; i < ly.size(); ++i) {
    const Target t = parse_target(tg[i]);
    if (!is_entry_target(t) && t != Target::IndexK) continue;
    const auto it = by_layer.find(static_cast<int>(ly[i]));
    if (it == by_layer.end())
      throw std::invalid_argument(fmt::format("v4_cache: /latent_error layer {} is not in the root attribute v4_layers",
                                              ly[i]));
    const V4LayerInfo& v = *it->second;
    const Key k{q[i], tg[i], v.layer_type};
    if (!acc.count(k)) order.push_back(k);
    Acc& a = acc[k];
    ++a.n;
    a.bytes += bpt[i];
    a.rate_inv += v.compress_rate > 0 ? 1.0 / static_cast<double>(v.compress_rate) : 0.0;
    a.window += static_cast<double>(v.sliding_window);
    a.rel_fro += rf[i];
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ColumnTable t = empty_table(v4_cache_spec());
  for (const Key& k : order) {
    const Acc& a = acc[k];
    const double n = static_cast<double>(a.n), bytes = a.bytes / n;
    const bool window = std::get<1>(k) == "window_kv";
    const double rows = window ? nan : a.rate_inv / n;
    add_row(t, {std::get<0>(k), std::get<1>(k), std::get<2>(k), a.n, bytes, rows, window ? nan : bytes * rows,
                window ? a.window / n * bytes : nan, a.rel_fro / n});
  }
  return t;
}

std::string format_v4_cache(const ColumnTable& t) {
  std::string out =
      "\nDeepSeek-V4 caches (/v4_cache): bytes per stored row, per token of context at long context (compressed "
      "entries: 1/compress_rate rows per token) and per sequence (the window)\n";
  size_t w = 9;
  for (const std::string& s : t.get<std::string>("quantizer")) w = std::max(w, s.size() + 1);
  out += fmt::format("{:<{}} {:<14} {:<8} {:>10} {:>10} {:>11} {:>10}\n", "quantizer", w, "target", "layers",
                     "B/row", "B/token", "B/sequence", "rel_fro");
  const auto num = [](double x) { return std::isnan(x) ? std::string("-") : fmt::format("{:.2f}", x); };
  for (size_t i = 0; i < t.num_rows(); ++i)
    out += fmt::format("{:<{}} {:<14} {:<8} {:>10} {:>10} {:>11} {:>10.3e}\n", t.get<std::string>("quantizer")[i], w,
                       t.get<std::string>("target")[i],
                       fmt::format("{} {}", t.get<int64_t>("layers")[i], t.get<std::string>("layer_type")[i]),
                       num(t.get<double>("bytes_per_row")[i]), num(t.get<double>("bytes_per_token")[i]),
                       num(t.get<double>("bytes_per_sequence")[i]), t.get<double>("mean_rel_fro")[i]);
  return out;
}

}  // namespace latentq
