#include "latentq/probes/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "detail.h"
#include "latentq/probes/narrow.h"
#include "latentq/probes/split.h"

#ifdef _OPENMP
#define LQ_OMP_FOR_DYNAMIC _Pragma("omp parallel for schedule(dynamic)")
#else
#define LQ_OMP_FOR_DYNAMIC
#endif

namespace latentq::probes {

namespace {

using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
constexpr int64_t kChunkRows = 8;  // query rows per GEMM chunk (all heads stacked)

struct RowInfo {
  std::vector<int64_t> t, s0, nkeys;  // per query row
};

std::string sz(int64_t n) { return std::to_string(n); }

void check_size(size_t got, int64_t want, const char* what, const char* shape) {
  if (static_cast<int64_t>(got) != want)
    throw std::invalid_argument(std::string("attention: ") + what + " has " + std::to_string(got) +
                                " elements, expected " + sz(want) + " = " + shape);
}

RowInfo validate_queries(const AttentionQueries& q) {
  const MlaDims& d = q.dims;
  if (d.num_heads < 1 || d.kv_lora_rank < 1 || d.qk_nope_head_dim < 1 || d.v_head_dim < 1 || d.qk_rope_head_dim < 0)
    throw std::invalid_argument("attention: bad dims (num_heads " + sz(d.num_heads) + ", kv_lora_rank " +
                                sz(d.kv_lora_rank) + ", qk_nope_head_dim " + sz(d.qk_nope_head_dim) +
                                ", qk_rope_head_dim " + sz(d.qk_rope_head_dim) + ", v_head_dim " +
                                sz(d.v_head_dim) + "); all must be >= 1 (qk_rope_head_dim >= 0)");
  if (q.num_tokens < 1) throw std::invalid_argument("attention: num_tokens " + sz(q.num_tokens) + " < 1");
  validate_seq_offsets(q.seq_offsets, q.num_tokens, "attention: seq_offsets");
  const int64_t Tq = static_cast<int64_t>(q.q_rows.size());
  if (Tq < 1) throw std::invalid_argument("attention: q_rows is empty");
  const int64_t H = d.num_heads;
  check_size(q.q_nope.size(), Tq * H * d.qk_nope_head_dim, "q_nope", "[Tq, H, qk_nope_head_dim]");
  check_size(q.q_pe.size(), Tq * H * d.qk_rope_head_dim, "q_pe", "[Tq, H, qk_rope_head_dim]");
  check_size(q.w_uk.size(), H * d.qk_nope_head_dim * d.kv_lora_rank, "w_uk", "[H, qk_nope_head_dim, kv_lora_rank]");
  check_size(q.w_uv.size(), H * d.v_head_dim * d.kv_lora_rank, "w_uv", "[H, v_head_dim, kv_lora_rank]");
  if (!(std::isfinite(q.softmax_scale) && q.softmax_scale > 0))
    throw std::invalid_argument("attention: softmax_scale " + std::to_string(q.softmax_scale) +
                                " must be finite and > 0");
  detail::require_finite(q.q_nope.data(), static_cast<int64_t>(q.q_nope.size()), "attention: q_nope");
  detail::require_finite(q.q_pe.data(), static_cast<int64_t>(q.q_pe.size()), "attention: q_pe");
  detail::require_finite(q.w_uk.data(), static_cast<int64_t>(q.w_uk.size()), "attention: w_uk");
  detail::require_finite(q.w_uv.data(), static_cast<int64_t>(q.w_uv.size()), "attention: w_uv");
  RowInfo info;
  info.t.resize(Tq);
  info.s0.resize(Tq);
  info.nkeys.resize(Tq);
  for (int64_t i = 0; i < Tq; ++i) {
    const int64_t t = q.q_rows[i];
    if (t < 0 || t >= q.num_tokens)
      throw std::invalid_argument("attention: q_rows[" + sz(i) + "] = " + sz(t) + " outside [0, T = " +
                                  sz(q.num_tokens) + ")");
    // The sequence s with seq_offsets[s] <= t < seq_offsets[s+1] (empty sequences skipped).
    const auto it = std::upper_bound(q.seq_offsets.begin(), q.seq_offsets.end(), t);
    info.t[i] = t;
    info.s0[i] = *(it - 1);
    info.nkeys[i] = t - info.s0[i] + 1;
  }
  return info;
}

/// The softmax scale in the working precision, checked after the conversion (1e300 is inf and 1e-50 is 0
/// in float32: a NaN or a uniform attention, silently).
template <typename Scalar>
Scalar working_scale(double softmax_scale) {
  if (const std::string p = narrowing_problem<Scalar>(softmax_scale); !p.empty())
    throw std::invalid_argument("attention: softmax_scale " + format_g8(softmax_scale) + " " + p +
                                ", the precision the attention runs in");
  return static_cast<Scalar>(softmax_scale);
}

template <typename Scalar>
int64_t count_nonfinite_of(const std::vector<Scalar>& v) {
  int64_t n = 0;
  for (const Scalar x : v) n += std::isfinite(x) ? 0 : 1;
  return n;
}

/// A result must be finite: the scores, the softmax or the output can overflow the working precision
/// even on finite inputs, and no metric may be computed from a NaN/Inf reference or test.
template <typename Scalar>
void require_finite_result(const AttentionResult<Scalar>& r, const char* what) {
  const int64_t bad_out = count_nonfinite_of(r.out), bad_p = count_nonfinite_of(r.probs);
  if (bad_out + bad_p > 0)
    throw std::invalid_argument(std::string(what) + ": " + sz(bad_out) + " of " + sz(static_cast<int64_t>(r.out.size())) +
                                " outputs and " + sz(bad_p) + " of " + sz(static_cast<int64_t>(r.probs.size())) +
                                " kept probabilities are NaN/Inf in " + precision_name<Scalar>() +
                                " (the scores or the output overflow the working precision); no metric is computed "
                                "from a non-finite attention");
}

void check_latents(const MlaDims& d, int64_t T, std::span<const float> c_kv, std::span<const float> k_pe) {
  check_size(c_kv.size(), T * d.kv_lora_rank, "c_kv", "[T, kv_lora_rank]");
  check_size(k_pe.size(), T * d.qk_rope_head_dim, "k_pe", "[T, qk_rope_head_dim]");
  detail::require_finite(c_kv.data(), static_cast<int64_t>(c_kv.size()), "attention: c_kv");
  detail::require_finite(k_pe.data(), static_cast<int64_t>(k_pe.size()), "attention: k_pe");
}

/// In-place softmax of x[0, n) in Scalar precision (max-subtracted); x[n, n_total) set to 0.
template <typename Scalar>
void softmax_row(Scalar* x, int64_t n, int64_t n_total) {
  Scalar m = x[0];
  for (int64_t j = 1; j < n; ++j) m = std::max(m, x[j]);
  Scalar sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - m);
    sum += x[j];
  }
  for (int64_t j = 0; j < n; ++j) x[j] /= sum;
  for (int64_t j = n; j < n_total; ++j) x[j] = 0;
}

template <typename Scalar>
AttentionResult<Scalar> make_result(const MlaDims& d, const std::vector<int64_t>& nkeys, bool keep_probs) {
  AttentionResult<Scalar> res;
  const int64_t Tq = static_cast<int64_t>(nkeys.size());
  res.num_queries = Tq;
  res.num_heads = d.num_heads;
  res.v_head_dim = d.v_head_dim;
  res.out.assign(static_cast<size_t>(Tq * d.num_heads * d.v_head_dim), Scalar(0));
  res.nkeys = nkeys;
  res.prob_offsets.assign(Tq + 1, 0);
  for (int64_t i = 0; i < Tq; ++i) res.prob_offsets[i + 1] = res.prob_offsets[i] + d.num_heads * nkeys[i];
  if (keep_probs) res.probs.assign(static_cast<size_t>(res.prob_offsets[Tq]), Scalar(0));
  return res;
}

/// A float32 buffer viewed as Scalar: the data itself for float, a float64 copy for double.
template <typename Scalar>
struct ScalarView {
  std::vector<Scalar> copy;
  const Scalar* ptr = nullptr;
  explicit ScalarView(std::span<const float> x) {
    if constexpr (std::is_same_v<Scalar, float>) {
      ptr = x.data();
    } else {
      copy.assign(x.begin(), x.end());
      ptr = copy.data();
    }
  }
};

}  // namespace

// ---- absorbed -----------------------------------------------------------------------------------

template <typename Scalar>
AbsorbedAttention<Scalar>::AbsorbedAttention(const AttentionQueries& q) {
  const RowInfo info = validate_queries(q);
  dims_ = q.dims;
  T_ = q.num_tokens;
  scale_ = working_scale<Scalar>(q.softmax_scale);
  nkeys_ = info.nkeys;
  const int64_t Tq = static_cast<int64_t>(info.t.size());
  const int64_t H = dims_.num_heads, r = dims_.kv_lora_rank, nope = dims_.qk_nope_head_dim,
                rope = dims_.qk_rope_head_dim, v = dims_.v_head_dim;

  order_.resize(Tq);
  std::iota(order_.begin(), order_.end(), int64_t{0});
  std::stable_sort(order_.begin(), order_.end(), [&](int64_t a, int64_t b) { return info.t[a] < info.t[b]; });
  for (int64_t p = 0; p < Tq;) {
    const int64_t s0 = info.s0[order_[p]];
    int64_t e = p + 1;
    while (e < Tq && e - p < kChunkRows && info.s0[order_[e]] == s0) ++e;
    chunks_.push_back({p, e, s0, info.nkeys[order_[e - 1]]});  // sorted by t: the last row has the most keys
    p = e;
  }

  // q_lat[i, h, :] = q_nope[i, h, :] · W_UK[h]  ([nope] × [nope, r]), in Scalar precision.
  q_lat_.resize(Tq * H, r);
  q_pe_.resize(Tq * H, rope);
  Mat qn(Tq, nope);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t p = 0; p < Tq; ++p)
      for (int64_t j = 0; j < nope; ++j) qn(p, j) = static_cast<Scalar>(q.q_nope[(order_[p] * H + h) * nope + j]);
    const Mat wuk = Eigen::Map<const RowMatF>(q.w_uk.data() + h * nope * r, nope, r).template cast<Scalar>();
    const Mat ql = qn * wuk;
    for (int64_t p = 0; p < Tq; ++p) {
      q_lat_.row(p * H + h) = ql.row(p);
      for (int64_t j = 0; j < rope; ++j) q_pe_(p * H + h, j) = static_cast<Scalar>(q.q_pe[(order_[p] * H + h) * rope + j]);
    }
  }
  w_uv_ = Eigen::Map<const RowMatF>(q.w_uv.data(), H * v, r).template cast<Scalar>();
}

template <typename Scalar>
AttentionResult<Scalar> AbsorbedAttention<Scalar>::run(std::span<const float> c_kv, std::span<const float> k_pe,
                                                        bool keep_probs) const {
  check_latents(dims_, T_, c_kv, k_pe);
  const int64_t Tq = num_queries();
  const int64_t H = dims_.num_heads, r = dims_.kv_lora_rank, rope = dims_.qk_rope_head_dim, v = dims_.v_head_dim;
  const ScalarView<Scalar> C(c_kv), K(k_pe);
  AttentionResult<Scalar> res = make_result<Scalar>(dims_, nkeys_, keep_probs);
  Mat o_lat(Tq * H, r);

  const int64_t nchunks = static_cast<int64_t>(chunks_.size());
  LQ_OMP_FOR_DYNAMIC
  for (int64_t ci = 0; ci < nchunks; ++ci) {
    const Chunk& c = chunks_[ci];
    const int64_t nH = (c.end - c.begin) * H;
    const Eigen::Map<const Mat> Ck(C.ptr + c.key_begin * r, c.nk, r);
    Mat S(nH, c.nk);
    S.noalias() = q_lat_.middleRows(c.begin * H, nH) * Ck.transpose();
    if (rope > 0) {
      const Eigen::Map<const Mat> Kk(K.ptr + c.key_begin * rope, c.nk, rope);
      S.noalias() += q_pe_.middleRows(c.begin * H, nH) * Kk.transpose();
    }
    S *= scale_;
    for (int64_t p = c.begin; p < c.end; ++p) {
      const int64_t i = order_[p], n = nkeys_[i];
      for (int64_t h = 0; h < H; ++h) {
        Scalar* row = S.row((p - c.begin) * H + h).data();
        softmax_row(row, n, c.nk);
        if (keep_probs) std::copy_n(row, n, res.probs.data() + res.prob_offsets[i] + h * n);
      }
    }
    o_lat.middleRows(c.begin * H, nH).noalias() = S * Ck;
  }

  // out[i, h, :] = o_lat[i, h, :] · W_UV[h]ᵀ  ([r] × [r, v]).
  for (int64_t h = 0; h < H; ++h) {
    const Eigen::Map<const Mat, 0, Eigen::OuterStride<>> Oh(o_lat.data() + h * r, Tq, r, Eigen::OuterStride<>(H * r));
    const Eigen::Map<const Mat> Wh(w_uv_.data() + h * v * r, v, r);
    const Mat R = Oh * Wh.transpose();
    for (int64_t p = 0; p < Tq; ++p)
      Eigen::Map<Eigen::Matrix<Scalar, 1, Eigen::Dynamic>>(res.out.data() + (order_[p] * H + h) * v, v) = R.row(p);
  }
  require_finite_result(res, "attention");
  return res;
}

template <typename Scalar>
AttentionResult<Scalar> absorbed_attention(const AttentionQueries& q, std::span<const float> c_kv,
                                           std::span<const float> k_pe, bool keep_probs) {
  return AbsorbedAttention<Scalar>(q).run(c_kv, k_pe, keep_probs);
}

// ---- unabsorbed ---------------------------------------------------------------------------------

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
    const Mat Knope = Cs * wuk.transpose();  // [nk, nope]
    const Mat Vh = Cs * wuv.transpose();     // [nk, v]
    Mat Qn(nq, nope), Qp(nq, rope);
    for (int64_t a = 0; a < nq; ++a) {
      const int64_t i = order[gb + a];
      for (int64_t j = 0; j < nope; ++j) Qn(a, j) = static_cast<Scalar>(q.q_nope[(i * H + h) * nope + j]);
      for (int64_t j = 0; j < rope; ++j) Qp(a, j) = static_cast<Scalar>(q.q_pe[(i * H + h) * rope + j]);
    }
    Mat S(nq, nk);
    S.noalias() = Qn * Knope.transpose();
    if (rope > 0) {
      const Eigen::Map<const Mat> Kp(K.ptr + s0 * rope, nk, rope);
      S.noalias() += Qp * Kp.transpose();
    }
    S *= scale;
    for (int64_t a = 0; a < nq; ++a) {
      const int64_t i = order[gb + a], n = info.nkeys[i];
      Scalar* row = S.row(a).data();
      softmax_row(row, n, nk);
      if (keep_probs) std::copy_n(row, n, res.probs.data() + res.prob_offsets[i] + h * n);
    }
    const Mat O = S * Vh;  // [nq, v]
    for (int64_t a = 0; a < nq; ++a)
      Eigen::Map<Eigen::Matrix<Scalar, 1, Eigen::Dynamic>>(res.out.data() + (order[gb + a] * H + h) * v, v) = O.row(a);
  }
  require_finite_result(res, "attention");
  return res;
}

// ---- metrics ------------------------------------------------------------------------------------

namespace {

/// The m ≤ 8 largest values of p (ties → lower index first): idx[0..m) in descending order of value.
/// Allocation-free insertion into a sorted list: O(n·m) worst case, O(n) typically.
template <typename Scalar>
void top_m(std::span<const Scalar> p, int64_t m, int64_t* idx) {
  int64_t count = 0;
  const int64_t n = static_cast<int64_t>(p.size());
  for (int64_t j = 0; j < n; ++j) {
    // Scanning j upward, an equal value never displaces an earlier key: only strictly larger ones do.
    if (count == m && !(p[j] > p[idx[m - 1]])) continue;
    int64_t pos = count < m ? count++ : m - 1;
    while (pos > 0 && p[j] > p[idx[pos - 1]]) {
      idx[pos] = idx[pos - 1];
      --pos;
    }
    idx[pos] = j;
  }
}

}  // namespace

template <typename Scalar>
AttentionError attention_error(const AttentionResult<Scalar>& ref, const AttentionResult<Scalar>& test) {
  if (ref.num_queries != test.num_queries || ref.num_heads != test.num_heads || ref.v_head_dim != test.v_head_dim ||
      ref.out.size() != test.out.size() || ref.nkeys != test.nkeys)
    throw std::invalid_argument("attention_error: the two results differ in shape (Tq " + sz(ref.num_queries) +
                                " vs " + sz(test.num_queries) + ", H " + sz(ref.num_heads) + " vs " +
                                sz(test.num_heads) + ", v " + sz(ref.v_head_dim) + " vs " + sz(test.v_head_dim) +
                                ") or in their key counts");
  if (ref.probs.size() != static_cast<size_t>(ref.prob_offsets.back()) ||
      test.probs.size() != static_cast<size_t>(test.prob_offsets.back()))
    throw std::invalid_argument("attention_error: both results need their probabilities (run with keep_probs = true)");
  const int64_t Tq = ref.num_queries, H = ref.num_heads, v = ref.v_head_dim;
  if (Tq < 1) throw std::invalid_argument("attention_error: no query rows");
  require_finite_result(ref, "attention_error: the reference");
  require_finite_result(test, "attention_error: the test");
  double err2 = 0, ref2 = 0, cos_sum = 0, kl_sum = 0, top1 = 0, top8 = 0;
  for (int64_t i = 0; i < Tq; ++i) {
    for (int64_t h = 0; h < H; ++h) {
      const Scalar* a = ref.out.data() + (i * H + h) * v;
      const Scalar* b = test.out.data() + (i * H + h) * v;
      double dot = 0, na = 0, nb = 0;
      bool equal = true;
      for (int64_t j = 0; j < v; ++j) {
        const double xa = a[j], xb = b[j];
        dot += xa * xb;
        na += xa * xa;
        nb += xb * xb;
        err2 += (xb - xa) * (xb - xa);
        equal = equal && a[j] == b[j];
      }
      ref2 += na;
      cos_sum += (na > 0 && nb > 0) ? dot / (std::sqrt(na) * std::sqrt(nb)) : (equal ? 1.0 : 0.0);

      const auto p = ref.prob(i, h), ph = test.prob(i, h);
      const int64_t n = ref.nkeys[i];
      double kl = 0;
      for (int64_t j = 0; j < n; ++j) {
        const double pj = p[j];
        // p·(ln p − ln max(p̂, floor)), one log: the ratio stays finite (p ≤ 1, floor 1e-30).
        if (pj > 0) kl += pj * std::log(pj / std::max(static_cast<double>(ph[j]), kKlProbFloor));
      }
      kl_sum += kl;
      const int64_t m = std::min<int64_t>(8, n);
      int64_t tp[8], tph[8];
      top_m(p, m, tp);
      top_m(ph, m, tph);
      top1 += tp[0] == tph[0] ? 1.0 : 0.0;
      int64_t common = 0;
      for (int64_t a = 0; a < m; ++a)
        for (int64_t b = 0; b < m; ++b) common += tp[a] == tph[b] ? 1 : 0;
      top8 += static_cast<double>(common) / static_cast<double>(m);
    }
  }
  const double pairs = static_cast<double>(Tq * H);
  AttentionError e;
  e.out_rel_fro = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  e.cos_mean = cos_sum / pairs;
  e.kl_mean = kl_sum / pairs;
  e.top1_agree = top1 / pairs;
  e.top8_agree = top8 / pairs;
  return e;
}

// ---- the fold check (issue 11) ------------------------------------------------------------------

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
  const auto rotated = [](std::span<const float> x, const Rotation& r, int64_t D) {
    std::vector<float> y(x.begin(), x.end());
    r.forward(y.data(), static_cast<int64_t>(y.size()) / D, D);
    return y;
  };
  const int64_t r = d.kv_lora_rank, rope = d.qk_rope_head_dim;
  const std::vector<float> c2 = rotated(c_kv, r_ckv, r);
  const std::vector<float> k2 = rope ? rotated(k_pe, r_kpe, rope) : std::vector<float>{};
  const std::vector<float> wuk = mode == FoldMode::SkipWUK ? std::vector<float>(q.w_uk.begin(), q.w_uk.end())
                                                           : rotated(q.w_uk, r_ckv, r);
  const std::vector<float> wuv = mode == FoldMode::SkipWUV ? std::vector<float>(q.w_uv.begin(), q.w_uv.end())
                                                           : rotated(q.w_uv, r_ckv, r);
  const std::vector<float> qpe = (mode == FoldMode::SkipQPe || !rope)
                                     ? std::vector<float>(q.q_pe.begin(), q.q_pe.end())
                                     : rotated(q.q_pe, r_kpe, rope);
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
                             "differs from the unrotated one: " + buf +
                             " (a rotation applied to the cache but not undone on a weight path)");
  }
  return f;
}

// ---- instantiations -----------------------------------------------------------------------------

template class AbsorbedAttention<float>;
template class AbsorbedAttention<double>;
template AttentionResult<float> absorbed_attention<float>(const AttentionQueries&, std::span<const float>,
                                                          std::span<const float>, bool);
template AttentionResult<double> absorbed_attention<double>(const AttentionQueries&, std::span<const float>,
                                                            std::span<const float>, bool);
template AttentionResult<float> unabsorbed_attention<float>(const AttentionQueries&, std::span<const float>,
                                                            std::span<const float>, bool);
template AttentionResult<double> unabsorbed_attention<double>(const AttentionQueries&, std::span<const float>,
                                                              std::span<const float>, bool);
template AttentionError attention_error<float>(const AttentionResult<float>&, const AttentionResult<float>&);
template AttentionError attention_error<double>(const AttentionResult<double>&, const AttentionResult<double>&);

}  // namespace latentq::probes
