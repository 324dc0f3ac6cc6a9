#include "latentq/inspect.h"

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "latentq/analysis/cross_layer.h"
#include "latentq/analysis/gemm.h"
#include "latentq/analysis/lapack.h"

namespace latentq {
namespace {

double median(Eigen::ArrayXd v) {
  assert(v.size() > 0);
  const Eigen::Index n = v.size(), h = n / 2;
  std::nth_element(v.data(), v.data() + h, v.data() + n);
  const double hi = v[h];
  if (n % 2) return hi;
  return 0.5 * (*std::max_element(v.data(), v.data() + h) + hi);
}

// The q-quantile of v (0 ≤ q ≤ 1) by linear interpolation between order statistics (numpy's default,
// "linear": position q·(n − 1)).
double quantile(Eigen::ArrayXd v, double q) {
  assert(v.size() > 0);
  std::sort(v.data(), v.data() + v.size());
  const double pos = q * static_cast<double>(v.size() - 1);
  const Eigen::Index lo = static_cast<Eigen::Index>(std::floor(pos));
  const Eigen::Index hi = std::min<Eigen::Index>(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

double ratio(double a, double b) { return b > 0 ? a / b : std::numeric_limits<double>::infinity(); }

}  // namespace

LatentStats latent_stats(const float* x, int64_t T, int64_t D, std::span<const int64_t> seq_offsets) {
  assert(T > 0 && D > 0);
  using RowMajor = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const probes::RowMat<double> X = Eigen::Map<const RowMajor>(x, T, D).cast<double>().matrix();
  LatentStats s;
  const Eigen::ArrayXd ch_rms = (X.array().square().colwise().sum() / static_cast<double>(T)).sqrt().transpose();
  s.channel_rms_ratio = ratio(ch_rms.maxCoeff(), median(ch_rms));
  probes::RowMat<double> G(D, D);
  probes::gemm<double>(probes::Op::T, probes::Op::N, 1.0, X, X, 0.0, G);
  const Eigen::VectorXd ev = probes::symmetric_eigen(Eigen::MatrixXd(G), false).values;  // ascending
  const double total = ev.cwiseMax(0.0).sum();
  const auto top = [&](int64_t k) {
    double e = 0;
    for (int64_t i = 0; i < k; ++i) e += std::max(0.0, ev[D - 1 - i]);
    return total > 0 ? e / total : 1.0;
  };
  s.energy_top_eighth = top(std::max<int64_t>(1, D / 8));
  s.energy_top_quarter = top(std::max<int64_t>(1, D / 4));
  s.energy_top_half = top(std::max<int64_t>(1, D / 2));
  const Eigen::ArrayXd norms = X.rowwise().norm().array();
  const double med = median(norms);
  s.norm_p99_ratio = ratio(quantile(norms, 0.99), med);
  s.norm_max_ratio = ratio(norms.maxCoeff(), med);
  double first = 0;
  int64_t n = 0;
  for (size_t i = 0; i + 1 < seq_offsets.size(); ++i)
    if (seq_offsets[i + 1] > seq_offsets[i]) {
      first += norms[seq_offsets[i]];
      ++n;
    }
  s.first_token_ratio = n ? ratio(first / static_cast<double>(n), med) : 0.0;
  return s;
}

TensorStats tensor_stats(const float* x, int64_t T, int64_t D, double outlier_factor) {
  assert(T > 0 && D > 0);
  using RowMajor = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const RowMajor> X(x, T, D);
  const Eigen::ArrayXXd A = X.cast<double>().abs();
  TensorStats s;
  s.absmax = A.maxCoeff();
  s.mean_abs = A.mean();
  const Eigen::ArrayXd ch_absmax = A.colwise().maxCoeff().transpose();
  const Eigen::ArrayXd ch_range = (X.colwise().maxCoeff() - X.colwise().minCoeff()).cast<double>().transpose();
  s.median_channel_range = median(ch_range);
  s.range_spread = s.median_channel_range > 0 ? ch_range.maxCoeff() / s.median_channel_range
                                              : std::numeric_limits<double>::infinity();
  s.median_channel_absmax = median(ch_absmax);
  for (Eigen::Index d = 0; d < D; ++d)
    if (ch_absmax[d] > outlier_factor * s.median_channel_absmax) s.outlier_channels.push_back(d);
  return s;
}

std::string format_inspect(const Dump& header, const LayerSource& read, double outlier_factor) {
  const Dump& dump = header;
  const DumpAttrs& A = dump.attrs;
  std::string out;
  out += fmt::format("file            {}\n", dump.path.string());
  out += fmt::format("model           {} (revision {})\n", A.model, A.revision);
  out += fmt::format("source          {}\n", A.source);
  out += fmt::format("layers          {} [{}]\n", A.num_layers, fmt::join(dump.file_layers, ", "));
  out += fmt::format("tokens          {} in {} sequences (lengths {})\n", dump.num_tokens(), dump.num_seqs(), [&] {
    std::vector<int64_t> lens;
    for (size_t s = 0; s + 1 < dump.seq_offsets.size(); ++s)
      lens.push_back(dump.seq_offsets[s + 1] - dump.seq_offsets[s]);
    return fmt::format("{}", fmt::join(lens, ", "));
  }());
  if (A.v4())
    out += fmt::format("dims            num_heads {}, head_dim {}, qk_rope_head_dim {}, index_head_dim {} ({})\n",
                       A.num_heads, A.head_dim, A.qk_rope_head_dim, A.index_head_dim, A.cache_family);
  else
    out += fmt::format(
        "dims            num_heads {}, kv_lora_rank {}, qk_rope_head_dim {}, qk_nope_head_dim {}, v_head_dim {}\n",
        A.num_heads, A.kv_lora_rank, A.qk_rope_head_dim, A.qk_nope_head_dim, A.v_head_dim);
  out += fmt::format("softmax_scale   {:.7g}\n", A.softmax_scale);
  out += fmt::format("rope_layout     {}\n", A.rope_layout);
  out += fmt::format("original_dtype  {}\n", A.original_dtype);
  // Layer by layer: at most the previous layer (for the adjacent-layer Pearson) and this one are held.
  std::string stats, decision;
  std::optional<Layer> prev;
  bool attention_rows_known = false;
  int64_t query_rows = 0;
  // the family's caches (MLA: c_kv, k_pe; DeepSeek-V4: window_kv, compressed_kv, index_k), each over its own rows;
  // the target column as wide as the longest of their names
  const std::vector<Target> targets = A.v4() ? std::vector<Target>{Target::WindowKV, Target::CompressedKV,
                                                                    Target::IndexK}
                                             : std::vector<Target>{Target::CKV, Target::KPE};
  size_t tw = 6;
  for (const Target t : targets) tw = std::max(tw, std::strlen(to_string(t)));
  for (const Layer& h : dump.layers) {
    Layer l = read(h.index);
    if (!attention_rows_known) {
      attention_rows_known = true;
      query_rows = l.has_attention() ? l.num_query_rows() : -1;
    }
    for (const Target t : targets) {
      if (A.v4() && !dump.holds(l.index, t)) continue;
      const char* name = to_string(t);
      const int64_t D = A.width(t), R = l.num_rows(t, dump.seq_offsets);
      const float* x = l.rows(t).data();
      const TensorStats s = tensor_stats(x, R, D, outlier_factor);
      const std::string outl = s.outlier_channels.empty() ? "-"
                                                          : fmt::format("{} [{}]", s.outlier_channels.size(),
                                                                        fmt::join(s.outlier_channels, ", "));
      stats += fmt::format("{:>5} {:<{}} {:>10.4g} {:>10.4g} {:>8.3g}  {}\n", l.index, name, tw, s.absmax, s.mean_abs,
                           s.range_spread, outl);
      const LatentStats z = latent_stats(x, R, D, l.row_offsets(t, dump.seq_offsets));
      std::string adjacent = "-";
      if (prev && prev->index == l.index - 1 && R >= 2 && prev->num_rows(t, dump.seq_offsets) == R) {
        const probes::CrossLayerPair p = probes::cross_layer_pair(prev->rows(t).data(), x, R, D);
        adjacent = std::isnan(p.pearson_mean_abs) ? "nan" : fmt::format("{:.4f}", p.pearson_mean_abs);
      }
      decision += fmt::format("{:>5} {:<{}} {:>8.3g} {:>7.4f} {:>7.4f} {:>7.4f} {:>8.3g} {:>8.3g} {:>8.3g}  {}\n",
                              l.index, name, tw, z.channel_rms_ratio, z.energy_top_eighth, z.energy_top_quarter,
                              z.energy_top_half, z.norm_p99_ratio, z.norm_max_ratio, z.first_token_ratio, adjacent);
    }
    prev = std::move(l);
  }
  if (dump.file_has_attention && query_rows >= 0)
    out += fmt::format("attention data  yes ({} query rows per layer, {})\n", query_rows,
                       A.v4() ? "q, rope cos / sin, sinks, attn_out" : "W_UK, W_UV, attn_out");
  else
    out += fmt::format("attention data  {}\n", dump.file_has_attention ? "yes" : "no (latent-only dump)");
  out += fmt::format(
      "\nper layer: absmax, mean |x|, range spread = max/median over channels of (max - min),\n"
      "outlier channels = channels with absmax > {:g} x the median channel absmax\n\n",
      outlier_factor);
  out += fmt::format("{:>5} {:<{}} {:>10} {:>10} {:>8}  {}\n", "layer", "target", tw, "absmax", "mean|x|", "spread",
                     "outlier channels");
  out += stats;
  out += fmt::format(
      "\nper layer, the statistics that decide a quantizer choice:\n"
      "  ch-rms   max / median over channels of the channel RMS (c_kv: ~ max|gamma| / median|gamma|)\n"
      "  E1/8 E1/4 E1/2   energy fraction in the top 1/8, 1/4, 1/2 of directions (SVD, uncentered)\n"
      "  p99 max  token L2 norm p99 / median and max / median;  first  first tokens' mean norm / median\n"
      "  adj|r|   mean |Pearson| of matched channels with the previous layer\n\n");
  out += fmt::format("{:>5} {:<{}} {:>8} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8}  {}\n", "layer", "target", tw, "ch-rms", "E1/8",
                     "E1/4", "E1/2", "p99", "max", "first", "adj|r|");
  out += decision;
  return out;
}

std::string format_inspect(const Dump& dump, double outlier_factor) {
  return format_inspect(
      dump, [&](int index) { return dump.layer(index); }, outlier_factor);
}

}  // namespace latentq
