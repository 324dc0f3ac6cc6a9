// DeepSeek Sparse Attention's top-k selection (latentq/attention/dsa.h).
#include "latentq/attention/dsa.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace latentq::probes {

KeySelection dsa_select_topk(std::span<const float> index_q, std::span<const float> index_w,
                             std::span<const float> index_k, int64_t n, int64_t d, std::span<const int32_t> q_rows,
                             std::span<const int64_t> seq_offsets, double softmax_scale, int64_t topk) {
  const int64_t Tq = static_cast<int64_t>(q_rows.size());
  const int64_t T = seq_offsets.empty() ? 0 : seq_offsets.back();
  if (n < 1 || d < 1 || topk < 1 || !(std::isfinite(softmax_scale) && softmax_scale > 0) ||
      static_cast<int64_t>(index_q.size()) != Tq * n * d || static_cast<int64_t>(index_w.size()) != Tq * n ||
      static_cast<int64_t>(index_k.size()) != T * d)
    throw std::invalid_argument("dsa_select_topk: index_q " + std::to_string(index_q.size()) + ", index_w " +
                                std::to_string(index_w.size()) + ", index_k " + std::to_string(index_k.size()) +
                                " values for Tq " + std::to_string(Tq) + ", T " + std::to_string(T) + ", heads " +
                                std::to_string(n) + ", dim " + std::to_string(d) + "; topk " + std::to_string(topk) +
                                " (>= 1), softmax_scale " + std::to_string(softmax_scale) + " (> 0)");
  KeySelection sel;
  sel.offsets.assign(1, 0);
  std::vector<double> score;
  std::vector<int32_t> order;
  for (int64_t i = 0; i < Tq; ++i) {
    const int64_t t = q_rows[i];
    if (t < 0 || t >= T)
      throw std::invalid_argument("dsa_select_topk: q_rows[" + std::to_string(i) + "] = " + std::to_string(t) +
                                  " outside [0, " + std::to_string(T) + ")");
    const int64_t s0 = *(std::upper_bound(seq_offsets.begin(), seq_offsets.end(), t) - 1);
    const int64_t nk = t - s0 + 1;
    score.assign(static_cast<size_t>(nk), 0.0);
    for (int64_t j = 0; j < nk; ++j) {
      const float* k = index_k.data() + (s0 + j) * d;
      double s = 0;
      for (int64_t h = 0; h < n; ++h) {
        const float* q = index_q.data() + (i * n + h) * d;
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += double(q[c]) * k[c];
        s += double(index_w[i * n + h]) * std::max(0.0, dot * softmax_scale);
      }
      score[static_cast<size_t>(j)] = s;
    }
    order.resize(static_cast<size_t>(nk));
    std::iota(order.begin(), order.end(), 0);
    const int64_t k = std::min<int64_t>(topk, nk);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)] ||
             (score[static_cast<size_t>(a)] == score[static_cast<size_t>(b)] && a < b);
    });
    std::sort(order.begin(), order.begin() + k);
    sel.keys.insert(sel.keys.end(), order.begin(), order.begin() + k);
    sel.offsets.push_back(static_cast<int64_t>(sel.keys.size()));
  }
  return sel;
}

}  // namespace latentq::probes
