// The absorbed attention on the CPU (AbsorbedAttention: construction, run, run_mixed, run_variants,
// ckv_scores); the device seam's members are device.cpp.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "internal.h"
#include "latentq/analysis/detail.h"
#include "latentq/analysis/gemm.h"
#include "latentq/split.h"
#include "latentq/attention/engine.h"

namespace latentq::probes {

namespace attention_detail {

RowInfo validate_queries(const AttentionQueries& q) {
  const MlaDims& d = q.dims;
  if (d.num_heads < 1 || d.kv_lora_rank < 1 || d.qk_nope_head_dim < 1 || d.v_head_dim < 1 || d.qk_rope_head_dim < 0)
    throw std::invalid_argument("attention: bad dims (num_heads " + sz(d.num_heads) + ", kv_lora_rank " +
                                sz(d.kv_lora_rank) + ", qk_nope_head_dim " + sz(d.qk_nope_head_dim) +
                                ", qk_rope_head_dim " + sz(d.qk_rope_head_dim) + ", v_head_dim " + sz(d.v_head_dim) +
                                "); all must be >= 1 (qk_rope_head_dim >= 0)");
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
      throw std::invalid_argument("attention: q_rows[" + sz(i) + "] = " + sz(t) +
                                  " outside [0, T = " + sz(q.num_tokens) + ")");
    // The sequence s with seq_offsets[s] <= t < seq_offsets[s+1] (empty sequences skipped).
    const auto it = std::upper_bound(q.seq_offsets.begin(), q.seq_offsets.end(), t);
    info.t[i] = t;
    info.s0[i] = *(it - 1);
    info.nkeys[i] = t - info.s0[i] + 1;
  }
  if (!q.selected_offsets.empty() || !q.selected_keys.empty()) {
    const auto& off = q.selected_offsets;
    if (static_cast<int64_t>(off.size()) != Tq + 1 || off[0] != 0 ||
        off[Tq] != static_cast<int64_t>(q.selected_keys.size()))
      throw std::invalid_argument("attention: selected_offsets has " + sz(static_cast<int64_t>(off.size())) +
                                  " entries from " + (off.empty() ? std::string("-") : sz(off[0])) + " to " +
                                  (off.empty() ? std::string("-") : sz(off.back())) + "; expected Tq + 1 = " +
                                  sz(Tq + 1) + " from 0 to the " + sz(static_cast<int64_t>(q.selected_keys.size())) +
                                  " selected_keys");
    for (int64_t i = 0; i < Tq; ++i) {
      if (off[i + 1] <= off[i])
        throw std::invalid_argument("attention: query row " + sz(i) + " selects no key (selected_offsets[" + sz(i) +
                                    "] = " + sz(off[i]) + ", [" + sz(i + 1) + "] = " + sz(off[i + 1]) + ")");
      for (int64_t a = off[i]; a < off[i + 1]; ++a) {
        const int64_t j = q.selected_keys[a];
        if (j < 0 || j >= info.nkeys[i] || (a > off[i] && j <= q.selected_keys[a - 1]))
          throw std::invalid_argument("attention: query row " + sz(i) + " selects key " + sz(j) +
                                      "; expected strictly ascending keys in [0, " + sz(info.nkeys[i]) +
                                      ") (its causal window)");
      }
    }
    info.selection.offsets.assign(off.begin(), off.end());
    info.selection.keys.assign(q.selected_keys.begin(), q.selected_keys.end());
  }
  return info;
}

void check_latents(const MlaDims& d, int64_t T, std::span<const float> c_kv, std::span<const float> k_pe) {
  check_size(c_kv.size(), T * d.kv_lora_rank, "c_kv", "[T, kv_lora_rank]");
  check_size(k_pe.size(), T * d.qk_rope_head_dim, "k_pe", "[T, qk_rope_head_dim]");
  detail::require_finite(c_kv.data(), static_cast<int64_t>(c_kv.size()), "attention: c_kv");
  detail::require_finite(k_pe.data(), static_cast<int64_t>(k_pe.size()), "attention: k_pe");
}

}  // namespace attention_detail

using namespace attention_detail;

namespace {

constexpr int64_t kChunkRows = 8;  // query rows per GEMM chunk (all heads stacked)

/// One GEMM chunk's sorted query rows as run_impl's helpers see them: sorted positions [begin, end) over nk
/// key columns (row q of a chunk matrix is sorted position begin + q / H, head q % H); order maps a sorted
/// position to its query row, nkeys a query row to its key count (AbsorbedAttention's order_, nkeys_).
struct ChunkRows {
  int64_t begin, end, nk, H;
  const std::vector<int64_t>& order;
  const std::vector<int64_t>& nkeys;
};

/// Which stores a chunk reads, of c_kv and of k_pe (without a mixed cache: A only, the plain run).
struct ChunkStores {
  bool c_a = true, c_b = false, k_a = true, k_b = false;
};

ChunkStores chunk_stores(const ChunkRows& c, const MixedCache* mixed) {
  ChunkStores s;
  if (!mixed) return s;
  s.c_a = s.k_a = false;
  for (int64_t p = c.begin; p < c.end; ++p) {
    const int64_t i = c.order[p], n = c.nkeys[i];
    const KeyRange rc = clip_range(mixed->ckv_from_a[i], n), rk = clip_range(mixed->kpe_from_a[i], n);
    s.c_a = s.c_a || rc.end > rc.begin;
    s.c_b = s.c_b || rc.end - rc.begin < n;
    s.k_a = s.k_a || rk.end > rk.begin;
    s.k_b = s.k_b || rk.end - rk.begin < n;
  }
  return s;
}

/// The c_kv columns of the chunk that some row reads from A, [a_lo, a_hi), and from B, [0, b_lo) and
/// [b_hi, nk) (a row reads B on [0, begin) and [end, n) of its range, all of [0, n) when it is empty):
/// the GEMMs of each store run on those columns only (a decode order reads B on its sink and residual
/// window). b_lo >= b_hi: B on every column. Only a chunk that reads both stores narrows them.
struct CkvColumns {
  int64_t a_lo, a_hi, b_lo, b_hi;
};

CkvColumns ckv_columns(const ChunkRows& c, const MixedCache* mixed, const ChunkStores& s) {
  CkvColumns k{c.nk, 0, 0, c.nk};
  if (mixed && s.c_a && s.c_b)
    for (int64_t p = c.begin; p < c.end; ++p) {
      const int64_t i = c.order[p], n = c.nkeys[i];
      const KeyRange rr = clip_range(mixed->ckv_from_a[i], n);
      const bool some = rr.end > rr.begin;
      if (some) k.a_lo = std::min(k.a_lo, rr.begin), k.a_hi = std::max(k.a_hi, rr.end);
      k.b_lo = std::max(k.b_lo, some ? rr.begin : n);
      k.b_hi = std::min(k.b_hi, some ? rr.end : n);
    }
  if (k.b_lo >= k.b_hi) k.b_lo = c.nk, k.b_hi = c.nk;  // one block [0, nk)
  return k;
}

/// Keeps (keep_a = true) or clears the columns of each row's keys of the chunk matrix M that the row's range
/// does (not) cover.
template <typename Mat>
void mask_cols(const ChunkRows& c, Mat& M, std::span<const KeyRange> ranges, bool keep_a) {
  using Scalar = typename Mat::Scalar;
  for (int64_t p = c.begin; p < c.end; ++p) {
    const int64_t i = c.order[p];
    const KeyRange rr = clip_range(ranges[i], c.nkeys[i]);
    for (int64_t h = 0; h < c.H; ++h) {
      Scalar* row = M.row((p - c.begin) * c.H + h).data();
      if (keep_a) {
        std::fill(row, row + rr.begin, Scalar(0));
        std::fill(row + rr.end, row + c.nk, Scalar(0));
      } else {
        std::fill(row + rr.begin, row + rr.end, Scalar(0));
      }
    }
  }
}

/// A's values where the range covers the key, B's elsewhere: dst (A's) takes B's outside the ranges, on
/// the row's keys (the columns past them are zeroed by the softmax).
template <typename Mat>
void take_b_outside(const ChunkRows& c, Mat& dst, const Mat& b, std::span<const KeyRange> ranges) {
  for (int64_t p = c.begin; p < c.end; ++p) {
    const int64_t i = c.order[p], n = c.nkeys[i];
    const KeyRange rr = clip_range(ranges[i], n);
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t q = (p - c.begin) * c.H + h;
      for (int64_t j = 0; j < rr.begin; ++j) dst(q, j) = b(q, j);
      for (int64_t j = rr.end; j < n; ++j) dst(q, j) = b(q, j);
    }
  }
}

/// out[i, h, :] = o_lat[i, h, :] · W_UV[h]ᵀ  ([r] × [r, v]): o_lat [Tq·H, r] by sorted row, w_uv [H·v, r],
/// out [Tq, H, v] in q_rows order (sorted position p is query row order[p]).
template <typename Mat>
void project_w_uv(const Mat& o_lat, const Mat& w_uv, const std::vector<int64_t>& order, int64_t H,
                  std::vector<typename Mat::Scalar>& out) {
  using Scalar = typename Mat::Scalar;
  const int64_t Tq = static_cast<int64_t>(order.size()), r = o_lat.cols(), v = w_uv.rows() / H;
  for (int64_t h = 0; h < H; ++h) {
    const Eigen::Map<const Mat, 0, Eigen::OuterStride<>> Oh(o_lat.data() + h * r, Tq, r, Eigen::OuterStride<>(H * r));
    const Eigen::Map<const Mat> Wh(w_uv.data() + h * v * r, v, r);
    Mat R(Tq, v);
    gemm<Scalar>(Op::N, Op::T, 1, Oh, Wh, 0, R);
    for (int64_t p = 0; p < Tq; ++p)
      Eigen::Map<Eigen::Matrix<Scalar, 1, Eigen::Dynamic>>(out.data() + (order[p] * H + h) * v, v) = R.row(p);
  }
}

}  // namespace

template <typename Scalar>
AbsorbedAttention<Scalar>::AbsorbedAttention(const AttentionQueries& q) {
  const RowInfo info = validate_queries(q);
  dims_ = q.dims;
  T_ = q.num_tokens;
  scale_ = working_scale<Scalar>(q.softmax_scale);
  nkeys_ = info.nkeys;
  selection_ = info.selection;
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
    Mat ql(Tq, r);
    gemm<Scalar>(Op::N, Op::N, 1, qn, wuk, 0, ql);
    for (int64_t p = 0; p < Tq; ++p) {
      q_lat_.row(p * H + h) = ql.row(p);
      for (int64_t j = 0; j < rope; ++j)
        q_pe_(p * H + h, j) = static_cast<Scalar>(q.q_pe[(order_[p] * H + h) * rope + j]);
    }
  }
  w_uv_ = Eigen::Map<const RowMatF>(q.w_uv.data(), H * v, r).template cast<Scalar>();
}

template <typename Scalar>
AttentionResult<Scalar> AbsorbedAttention<Scalar>::run(std::span<const float> c_kv, std::span<const float> k_pe,
                                                       bool keep_probs) const {
  if (device_) return run_device(c_kv, k_pe, keep_probs);
  return run_impl(c_kv, k_pe, nullptr, keep_probs);
}

template <typename Scalar>
AttentionResult<Scalar> AbsorbedAttention<Scalar>::run_on_cpu(std::span<const float> c_kv, std::span<const float> k_pe,
                                                              bool keep_probs) const {
  return run_impl(c_kv, k_pe, nullptr, keep_probs);
}

template <typename Scalar>
void AbsorbedAttention<Scalar>::check_mixed_ranges(const MixedCache& m) const {
  const int64_t Tq = num_queries();
  if (static_cast<int64_t>(m.ckv_from_a.size()) != Tq || static_cast<int64_t>(m.kpe_from_a.size()) != Tq)
    throw std::invalid_argument(
        "attention: the mixed cache's key ranges have " + sz(static_cast<int64_t>(m.ckv_from_a.size())) +
        " (c_kv) and " + sz(static_cast<int64_t>(m.kpe_from_a.size())) + " (k_pe) entries, expected Tq = " + sz(Tq));
}

template <typename Scalar>
AttentionResult<Scalar> AbsorbedAttention<Scalar>::run_mixed(const MixedCache& m, bool keep_probs) const {
  check_mixed_ranges(m);
  if (device_runs_mixed()) return run_mixed_device(m, keep_probs);
  return run_impl(m.c_kv_a, m.k_pe_a, &m, keep_probs);
}

template <typename Scalar>
AttentionResult<Scalar> AbsorbedAttention<Scalar>::run_impl(std::span<const float> c_kv, std::span<const float> k_pe,
                                                            const MixedCache* mixed, bool keep_probs) const {
  check_latents(dims_, T_, c_kv, k_pe);
  if (mixed) check_latents(dims_, T_, mixed->c_kv_b, mixed->k_pe_b);
  const int64_t Tq = num_queries();
  const int64_t H = dims_.num_heads, r = dims_.kv_lora_rank, rope = dims_.qk_rope_head_dim;
  const ScalarView<Scalar> C(c_kv), K(k_pe);
  const ScalarView<Scalar> CB(mixed ? mixed->c_kv_b : std::span<const float>{}),
      KB(mixed ? mixed->k_pe_b : std::span<const float>{});
  AttentionResult<Scalar> res = make_result<Scalar>(dims_, nkeys_, keep_probs);
  Mat o_lat(Tq * H, r);

  const int64_t nchunks = static_cast<int64_t>(chunks_.size());
  LQ_OMP_FOR_DYNAMIC
  for (int64_t ci = 0; ci < nchunks; ++ci) {
    const Chunk& c = chunks_[ci];
    const ChunkRows rows{c.begin, c.end, c.nk, H, order_, nkeys_};
    const int64_t nH = (c.end - c.begin) * H;
    const ChunkStores s = chunk_stores(rows, mixed);
    const CkvColumns col = ckv_columns(rows, mixed, s);
    const Eigen::Map<const Mat> Ck(C.ptr + c.key_begin * r, c.nk, r);
    const Eigen::Map<const Mat> CkB(mixed ? CB.ptr + c.key_begin * r : C.ptr, c.nk, r);
    const auto Q = q_lat_.middleRows(c.begin * H, nH);
    Mat S(nH, c.nk);
    const auto scores_cols = [&](const Eigen::Map<const Mat>& store, Mat& dst, int64_t j0, int64_t j1) {
      if (j1 > j0) gemm<Scalar>(Op::N, Op::T, 1, Q, store.middleRows(j0, j1 - j0), 0, dst.middleCols(j0, j1 - j0));
    };
    if (s.c_a && s.c_b) {
      S.setZero();  // columns no row reads stay 0 (the softmax zeroes them anyway)
      scores_cols(Ck, S, col.a_lo, col.a_hi);
      Mat SB(nH, c.nk);
      scores_cols(CkB, SB, 0, col.b_lo);
      scores_cols(CkB, SB, col.b_hi, c.nk);
      take_b_outside(rows, S, SB, mixed->ckv_from_a);
    } else if (s.c_a) {
      gemm<Scalar>(Op::N, Op::T, 1, Q, Ck, 0, S);
    } else {
      gemm<Scalar>(Op::N, Op::T, 1, Q, CkB, 0, S);
    }
    if (rope > 0) {
      const Eigen::Map<const Mat> Kk(K.ptr + c.key_begin * rope, c.nk, rope);
      const Eigen::Map<const Mat> KkB(mixed ? KB.ptr + c.key_begin * rope : K.ptr, c.nk, rope);
      const auto Qp = q_pe_.middleRows(c.begin * H, nH);
      if (s.k_a && !s.k_b) {
        gemm<Scalar>(Op::N, Op::T, 1, Qp, Kk, 1, S);
      } else if (!s.k_a) {
        gemm<Scalar>(Op::N, Op::T, 1, Qp, KkB, 1, S);
      } else {
        Mat SA(nH, c.nk), SB(nH, c.nk);
        gemm<Scalar>(Op::N, Op::T, 1, Qp, Kk, 0, SA);
        gemm<Scalar>(Op::N, Op::T, 1, Qp, KkB, 0, SB);
        take_b_outside(rows, SA, SB, mixed->kpe_from_a);
        S += SA;
      }
    }
    S *= scale_;
    for (int64_t p = c.begin; p < c.end; ++p) {
      const int64_t i = order_[p], n = nkeys_[i];
      for (int64_t h = 0; h < H; ++h) {
        Scalar* row = S.row((p - c.begin) * H + h).data();
        selection_.mask_unselected(i, row, n);
        softmax_row(row, n, c.nk);
        if (keep_probs) std::copy_n(row, n, res.probs.data() + res.prob_offsets[i] + h * n);
      }
    }
    auto O = o_lat.middleRows(c.begin * H, nH);
    if (!s.c_b) {
      gemm<Scalar>(Op::N, Op::N, 1, S, Ck, 0, O);
    } else if (!s.c_a) {
      gemm<Scalar>(Op::N, Op::N, 1, S, CkB, 0, O);
    } else {
      // O = P_A·C_A + P_B·C_B, each product over the columns its store is read on (the others are 0).
      Mat PB = S;
      mask_cols(rows, S, mixed->ckv_from_a, true);
      mask_cols(rows, PB, mixed->ckv_from_a, false);
      O.setZero();
      const auto out_cols = [&](const Mat& P, const Eigen::Map<const Mat>& store, int64_t j0, int64_t j1) {
        if (j1 > j0) gemm<Scalar>(Op::N, Op::N, 1, P.middleCols(j0, j1 - j0), store.middleRows(j0, j1 - j0), 1, O);
      };
      out_cols(S, Ck, col.a_lo, col.a_hi);
      out_cols(PB, CkB, 0, col.b_lo);
      out_cols(PB, CkB, col.b_hi, c.nk);
    }
  }

  // out[i, h, :] = o_lat[i, h, :] · W_UV[h]ᵀ  ([r] × [r, v]).
  project_w_uv(o_lat, w_uv_, order_, H, res.out);
  require_finite_result(res, "attention");
  return res;
}

template <typename Scalar>
typename AbsorbedAttention<Scalar>::CkvScores AbsorbedAttention<Scalar>::ckv_scores(std::span<const float> c_kv) const {
  check_size(c_kv.size(), T_ * dims_.kv_lora_rank, "c_kv", "[T, kv_lora_rank]");
  detail::require_finite(c_kv.data(), static_cast<int64_t>(c_kv.size()), "attention: c_kv");
  const int64_t H = dims_.num_heads, r = dims_.kv_lora_rank;
  const ScalarView<Scalar> C(c_kv);
  CkvScores out;
  out.store = c_kv.data();
  out.chunks.resize(chunks_.size());
  const int64_t nchunks = static_cast<int64_t>(chunks_.size());
  LQ_OMP_FOR_DYNAMIC
  for (int64_t ci = 0; ci < nchunks; ++ci) {
    const Chunk& c = chunks_[ci];
    const Eigen::Map<const Mat> Ck(C.ptr + c.key_begin * r, c.nk, r);
    out.chunks[ci].resize((c.end - c.begin) * H, c.nk);
    gemm<Scalar>(Op::N, Op::T, 1, q_lat_.middleRows(c.begin * H, (c.end - c.begin) * H), Ck, 0, out.chunks[ci]);
  }
  return out;
}

template <typename Scalar>
std::vector<AttentionResult<Scalar>> AbsorbedAttention<Scalar>::run_variants(std::span<const Variant> variants,
                                                                             bool keep_probs) const {
  const int64_t nv = static_cast<int64_t>(variants.size());
  const auto check_scores = [&](int64_t a) {
    const Variant& x = variants[a];
    if (x.scores && (x.scores->store != x.c_kv.data() || x.scores->chunks.size() != chunks_.size()))
      throw std::invalid_argument("attention: run_variants: variant " + sz(a) +
                                  "'s partial scores were computed from another c_kv store");
  };
  if (device_) {  // run_device checks each variant's latents
    for (int64_t a = 0; a < nv; ++a) check_scores(a);
    std::vector<AttentionResult<Scalar>> out;
    out.reserve(nv);
    for (const Variant& x : variants) out.push_back(run_device(x.c_kv, x.k_pe, keep_probs));
    return out;
  }
  const int64_t Tq = num_queries();
  const int64_t H = dims_.num_heads, r = dims_.kv_lora_rank, rope = dims_.qk_rope_head_dim;
  // Distinct stores (by data pointer), checked once each.
  std::vector<const float*> cs, ks;
  std::vector<int64_t> vc(nv), vk(nv);
  std::vector<const CkvScores*> c_scores;
  for (int64_t a = 0; a < nv; ++a) {
    const Variant& x = variants[a];
    check_latents(dims_, T_, x.c_kv, x.k_pe);
    check_scores(a);
    auto ic = std::find(cs.begin(), cs.end(), x.c_kv.data());
    if (ic == cs.end()) {
      cs.push_back(x.c_kv.data());
      c_scores.push_back(x.scores);
      ic = cs.end() - 1;
    } else if (!c_scores[ic - cs.begin()]) {
      c_scores[ic - cs.begin()] = x.scores;
    }
    vc[a] = ic - cs.begin();
    auto ik = std::find(ks.begin(), ks.end(), x.k_pe.data());
    if (ik == ks.end()) ks.push_back(x.k_pe.data()), ik = ks.end() - 1;
    vk[a] = ik - ks.begin();
  }
  const int64_t ncs = static_cast<int64_t>(cs.size()), nks = static_cast<int64_t>(ks.size());
  std::vector<ScalarView<Scalar>> C, K;
  C.reserve(ncs);
  K.reserve(nks);
  for (int64_t u = 0; u < nv; ++u) {
    if (static_cast<int64_t>(C.size()) == vc[u]) C.emplace_back(variants[u].c_kv);
    if (static_cast<int64_t>(K.size()) == vk[u]) K.emplace_back(variants[u].k_pe);
  }
  // Variants of each c_kv store, in order: they share its score GEMM.
  std::vector<std::vector<int64_t>> by_c(ncs);
  for (int64_t a = 0; a < nv; ++a) by_c[vc[a]].push_back(a);

  std::vector<AttentionResult<Scalar>> res;
  res.reserve(nv);
  for (int64_t a = 0; a < nv; ++a) res.push_back(make_result<Scalar>(dims_, nkeys_, keep_probs));
  std::vector<Mat> o_lat(nv, Mat(Tq * H, r));

  const int64_t nchunks = static_cast<int64_t>(chunks_.size());
  LQ_OMP_FOR_DYNAMIC
  for (int64_t ci = 0; ci < nchunks; ++ci) {
    const Chunk& c = chunks_[ci];
    const int64_t nH = (c.end - c.begin) * H;
    const auto Q = q_lat_.middleRows(c.begin * H, nH);
    std::vector<Mat> Sk(nks);
    if (rope > 0) {
      const auto Qp = q_pe_.middleRows(c.begin * H, nH);
      for (int64_t u = 0; u < nks; ++u) {
        const Eigen::Map<const Mat> Kk(K[u].ptr + c.key_begin * rope, c.nk, rope);
        Sk[u].resize(nH, c.nk);
        gemm<Scalar>(Op::N, Op::T, 1, Qp, Kk, 0, Sk[u]);
      }
    }
    for (int64_t u = 0; u < ncs; ++u) {
      const Eigen::Map<const Mat> Ck(C[u].ptr + c.key_begin * r, c.nk, r);
      const std::vector<int64_t>& vs = by_c[u];
      const int64_t m = static_cast<int64_t>(vs.size());
      Mat own;
      if (!c_scores[u]) {
        own.resize(nH, c.nk);
        gemm<Scalar>(Op::N, Op::T, 1, Q, Ck, 0, own);
      }
      const Mat& Sc = c_scores[u] ? c_scores[u]->chunks[ci] : own;
      Mat P(m * nH, c.nk);  // the variants' probabilities, stacked
      for (int64_t b = 0; b < m; ++b) {
        const int64_t a = vs[b];
        auto Pb = P.middleRows(b * nH, nH);
        if (rope > 0)
          Pb.noalias() = Sc + Sk[vk[a]];
        else
          Pb = Sc;
        Pb *= scale_;
        for (int64_t p = c.begin; p < c.end; ++p) {
          const int64_t i = order_[p], n = nkeys_[i];
          for (int64_t h = 0; h < H; ++h) {
            Scalar* row = P.row(b * nH + (p - c.begin) * H + h).data();
            selection_.mask_unselected(i, row, n);
            softmax_row(row, n, c.nk);
            if (keep_probs) std::copy_n(row, n, res[a].probs.data() + res[a].prob_offsets[i] + h * n);
          }
        }
      }
      // One output GEMM per variant, of the same shape as run()'s: a variant's bits do not depend on how
      // many variants share its c_kv store (BLAS's blocking and edge kernels depend on the row count).
      for (int64_t b = 0; b < m; ++b)
        gemm<Scalar>(Op::N, Op::N, 1, P.middleRows(b * nH, nH), Ck, 0, o_lat[vs[b]].middleRows(c.begin * H, nH));
    }
  }

  // out[i, h, :] = o_lat[i, h, :] · W_UV[h]ᵀ  ([r] × [r, v]), per variant.
  for (int64_t a = 0; a < nv; ++a) {
    project_w_uv(o_lat[a], w_uv_, order_, H, res[a].out);
    require_finite_result(res[a], "attention");
  }
  return res;
}

template <typename Scalar>
AttentionResult<Scalar> absorbed_attention(const AttentionQueries& q, std::span<const float> c_kv,
                                           std::span<const float> k_pe, bool keep_probs) {
  return AbsorbedAttention<Scalar>(q).run(c_kv, k_pe, keep_probs);
}

template class AbsorbedAttention<float>;
template class AbsorbedAttention<double>;
template AttentionResult<float> absorbed_attention<float>(const AttentionQueries&, std::span<const float>,
                                                          std::span<const float>, bool);
template AttentionResult<double> absorbed_attention<double>(const AttentionQueries&, std::span<const float>,
                                                            std::span<const float>, bool);

}  // namespace latentq::probes
