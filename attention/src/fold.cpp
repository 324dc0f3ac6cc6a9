// The cross-checks of the absorbed attention: the unabsorbed reference (per head K = [W_UK·c_kv ; k_pe],
// V = W_UV·c_kv, standard causal attention) and the weight-absorption fold check (a rotation of the cache
// folded into W_UK, W_UV and q_pe).
#include <cstdio>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "internal.h"
#include "latentq/analysis/gemm.h"
#include "latentq/attention/engine.h"
#include "latentq/attention/fold.h"
#include "latentq/attention/metrics.h"

namespace latentq::probes {

using namespace attention_detail;

template <typename Scalar>
AttentionResult<Scalar> unabsorbed_attention(const AttentionQueries& q, std::span<const float> c_kv,
                                             std::span<const float> k_pe, bool keep_probs) {
  using Mat = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const RowInfo info = validate_queries(q);
  const MlaDims& d = q.dims;
  check_latents(d, q.num_tokens, c_kv, k_pe);
  const int64_t Tq = static_cast<int64_t>(info.t.size());
  const int64_t H = d.num_heads, r = d.kv_lora_rank, nope = d.qk_nope_head_dim, rope = d.qk_rope_head_dim,
                v = d.v_head_dim;
  const ScalarView<Scalar> C(c_kv), K(k_pe);
  const Scalar scale = working_scale<Scalar>(q.softmax_scale);
  AttentionResult<Scalar> res = make_result<Scalar>(d, info.nkeys, keep_probs);

  // Query rows grouped by sequence start.
  std::vector<int64_t> order(Tq);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return info.t[a] < info.t[b]; });
  std::vector<std::pair<int64_t, int64_t>> groups;  // [begin, end) in order
  for (int64_t p = 0; p < Tq;) {
    int64_t e = p + 1;
    while (e < Tq && info.s0[order[e]] == info.s0[order[p]]) ++e;
    groups.emplace_back(p, e);
    p = e;
  }
  const int64_t ngroups = static_cast<int64_t>(groups.size());
  const int64_t ntasks = ngroups * H;
  LQ_OMP_FOR_DYNAMIC
  for (int64_t task = 0; task < ntasks; ++task) {
    const auto [gb, ge] = groups[task / H];
    const int64_t h = task % H;
    const int64_t s0 = info.s0[order[gb]], nk = info.nkeys[order[ge - 1]], nq = ge - gb;
    const Eigen::Map<const Mat> Cs(C.ptr + s0 * r, nk, r);
    const Mat wuk = Eigen::Map<const RowMatF>(q.w_uk.data() + h * nope * r, nope, r).template cast<Scalar>();
    const Mat wuv = Eigen::Map<const RowMatF>(q.w_uv.data() + h * v * r, v, r).template cast<Scalar>();
    Mat Knope(nk, nope), Vh(nk, v);
    gemm<Scalar>(Op::N, Op::T, 1, Cs, wuk, 0, Knope);  // [nk, nope]
    gemm<Scalar>(Op::N, Op::T, 1, Cs, wuv, 0, Vh);     // [nk, v]
    Mat Qn(nq, nope), Qp(nq, rope);
    for (int64_t a = 0; a < nq; ++a) {
      const int64_t i = order[gb + a];
      for (int64_t j = 0; j < nope; ++j) Qn(a, j) = static_cast<Scalar>(q.q_nope[(i * H + h) * nope + j]);
      for (int64_t j = 0; j < rope; ++j) Qp(a, j) = static_cast<Scalar>(q.q_pe[(i * H + h) * rope + j]);
    }
    Mat S(nq, nk);
    gemm<Scalar>(Op::N, Op::T, 1, Qn, Knope, 0, S);
    if (rope > 0) {
      const Eigen::Map<const Mat> Kp(K.ptr + s0 * rope, nk, rope);
      gemm<Scalar>(Op::N, Op::T, 1, Qp, Kp, 1, S);
    }
    S *= scale;
    for (int64_t a = 0; a < nq; ++a) {
      const int64_t i = order[gb + a], n = info.nkeys[i];
      Scalar* row = S.row(a).data();
      info.selection.mask_unselected(i, row, n);
      softmax_row(row, n, nk);
      if (keep_probs) std::copy_n(row, n, res.probs.data() + res.prob_offsets[i] + h * n);
    }
    Mat O(nq, v);  // [nq, v]
    gemm<Scalar>(Op::N, Op::N, 1, S, Vh, 0, O);
    for (int64_t a = 0; a < nq; ++a)
      Eigen::Map<Eigen::Matrix<Scalar, 1, Eigen::Dynamic>>(res.out.data() + (order[gb + a] * H + h) * v, v) = O.row(a);
  }
  require_finite_result(res, "attention");
  return res;
}

FoldCheck fold_check(const AttentionQueries& q, std::span<const float> c_kv, std::span<const float> k_pe,
                     const Rotation& r_ckv, const Rotation& r_kpe, FoldMode mode) {
  const MlaDims& d = q.dims;
  const auto check_dim = [](const Rotation& r, int64_t want, const char* what) {
    if (!r.identity() && r.dim() != want)
      throw std::invalid_argument(std::string("fold_check: the ") + what + " rotation has dimension " +
                                  std::to_string(r.dim()) + ", expected " + std::to_string(want));
  };
  check_dim(r_ckv, d.kv_lora_rank, "c_kv");
  check_dim(r_kpe, d.qk_rope_head_dim, "k_pe");
  if (c_kv.size() != static_cast<size_t>(q.num_tokens * d.kv_lora_rank) ||
      k_pe.size() != static_cast<size_t>(q.num_tokens * d.qk_rope_head_dim) ||
      q.w_uk.size() != static_cast<size_t>(d.num_heads * d.qk_nope_head_dim * d.kv_lora_rank) ||
      q.w_uv.size() != static_cast<size_t>(d.num_heads * d.v_head_dim * d.kv_lora_rank) ||
      q.q_pe.size() != q.q_rows.size() * static_cast<size_t>(d.num_heads * d.qk_rope_head_dim))
    throw std::invalid_argument("fold_check: c_kv, k_pe, W_UK, W_UV or q_pe do not match the dims");
  // rows of x through r: the cache's side forward (A·x), the weights' side fold (A⁻ᵀ·w, = R·w for a rotation),
  // so that every dot product of a weight row with the latent is kept
  const auto mapped = [](std::span<const float> x, const Rotation& r, int64_t D, bool weights) {
    std::vector<float> y(x.begin(), x.end());
    const int64_t rows = static_cast<int64_t>(y.size()) / D;
    weights ? r.fold(y.data(), rows, D) : r.forward(y.data(), rows, D);
    return y;
  };
  const int64_t r = d.kv_lora_rank, rope = d.qk_rope_head_dim;
  const std::vector<float> c2 = mapped(c_kv, r_ckv, r, false);
  const std::vector<float> k2 = rope ? mapped(k_pe, r_kpe, rope, false) : std::vector<float>{};
  const std::vector<float> wuk =
      mode == FoldMode::SkipWUK ? std::vector<float>(q.w_uk.begin(), q.w_uk.end()) : mapped(q.w_uk, r_ckv, r, true);
  const std::vector<float> wuv =
      mode == FoldMode::SkipWUV ? std::vector<float>(q.w_uv.begin(), q.w_uv.end()) : mapped(q.w_uv, r_ckv, r, true);
  const std::vector<float> qpe = (mode == FoldMode::SkipQPe || !rope) ? std::vector<float>(q.q_pe.begin(), q.q_pe.end())
                                                                      : mapped(q.q_pe, r_kpe, rope, true);
  AttentionQueries q2 = q;
  q2.w_uk = wuk;
  q2.w_uv = wuv;
  q2.q_pe = qpe;
  const AttentionResult<float> ref = absorbed_attention<float>(q, c_kv, k_pe, true);
  const AttentionResult<float> rot = absorbed_attention<float>(q2, c2, k2, true);
  const AttentionError e = attention_error(ref, rot);
  return {e.out_rel_fro, e.kl_mean};
}

FoldCheck require_fold_exact(const AttentionQueries& q, std::span<const float> c_kv, std::span<const float> k_pe,
                             const Rotation& r_ckv, const Rotation& r_kpe, const std::string& what, FoldMode mode) {
  const FoldCheck f = fold_check(q, c_kv, k_pe, r_ckv, r_kpe, mode);
  if (!(f.out_rel_fro <= kFoldTolerance)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "out_rel_fro %.3g > %.0e (KL %.3g)", f.out_rel_fro, kFoldTolerance, f.kl_mean);
    throw std::runtime_error("fold check failed: " + what +
                             ": the absorbed attention on the rotated cache with the rotated W_UK, W_UV and q_pe "
                             "differs from the unrotated one: " +
                             buf + " (a rotation applied to the cache but not undone on a weight path)");
  }
  return f;
}

template AttentionResult<float> unabsorbed_attention<float>(const AttentionQueries&, std::span<const float>,
                                                            std::span<const float>, bool);
template AttentionResult<double> unabsorbed_attention<double>(const AttentionQueries&, std::span<const float>,
                                                              std::span<const float>, bool);

}  // namespace latentq::probes
