#include "latentq/inspect.h"

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <limits>

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

}  // namespace

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

std::string format_inspect(const Dump& dump, double outlier_factor) {
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
  out += fmt::format(
      "dims            num_heads {}, kv_lora_rank {}, qk_rope_head_dim {}, qk_nope_head_dim {}, v_head_dim {}\n",
      A.num_heads, A.kv_lora_rank, A.qk_rope_head_dim, A.qk_nope_head_dim, A.v_head_dim);
  out += fmt::format("softmax_scale   {:.7g}\n", A.softmax_scale);
  out += fmt::format("rope_layout     {}\n", A.rope_layout);
  out += fmt::format("original_dtype  {}\n", A.original_dtype);
  if (dump.file_has_attention && !dump.layers.empty() && dump.layers.front().has_attention())
    out += fmt::format("attention data  yes ({} query rows per layer, W_UK, W_UV, attn_out)\n",
                       dump.layers.front().num_query_rows());
  else
    out += fmt::format("attention data  {}\n", dump.file_has_attention ? "yes" : "no (latent-only dump)");
  out += fmt::format(
      "\nper layer: absmax, mean |x|, range spread = max/median over channels of (max - min),\n"
      "outlier channels = channels with absmax > {:g} x the median channel absmax\n\n",
      outlier_factor);
  out += fmt::format("{:>5} {:<6} {:>10} {:>10} {:>8}  {}\n", "layer", "target", "absmax", "mean|x|", "spread",
                     "outlier channels");
  const int64_t T = dump.num_tokens();
  for (const Layer& l : dump.layers) {
    for (int t = 0; t < 2; ++t) {
      const bool ckv = t == 0;
      const int64_t D = ckv ? A.kv_lora_rank : A.qk_rope_head_dim;
      const TensorStats s = tensor_stats(ckv ? l.c_kv.data() : l.k_pe.data(), T, D, outlier_factor);
      const std::string outl = s.outlier_channels.empty() ? "-"
                                                          : fmt::format("{} [{}]", s.outlier_channels.size(),
                                                                        fmt::join(s.outlier_channels, ", "));
      out += fmt::format("{:>5} {:<6} {:>10.4g} {:>10.4g} {:>8.3g}  {}\n", l.index, ckv ? "c_kv" : "k_pe", s.absmax,
                         s.mean_abs, s.range_spread, outl);
    }
  }
  return out;
}

}  // namespace latentq
