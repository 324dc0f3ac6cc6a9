// DeepSeek-V4's attention for one layer (latentq/attention/v4.h): construction and checks, run(), the CSA
// selection from the dump's picks or recomputed from the indexer's tensors.
#include "latentq/attention/v4.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "internal.h"
#include "latentq/analysis/detail.h"
#include "latentq/analysis/gemm.h"
#include "latentq/attention/dsa.h"
#include "latentq/split.h"

namespace latentq::probes {

using namespace attention_detail;

V4LayerType parse_v4_layer_type(std::string_view name) {
  if (name == "sliding") return V4LayerType::Sliding;
  if (name == "csa") return V4LayerType::Csa;
  if (name == "hca") return V4LayerType::Hca;
  throw std::invalid_argument("V4 attention: layer_type '" + std::string(name) + "': expected sliding, csa or hca");
}

std::string to_string(V4LayerType t) {
  switch (t) {
    case V4LayerType::Sliding:
      return "sliding";
    case V4LayerType::Csa:
      return "csa";
    case V4LayerType::Hca:
      return "hca";
  }
  return "?";
}

namespace {

void v4_size(size_t got, int64_t want, const char* what, const char* shape) {
  if (static_cast<int64_t>(got) != want)
    throw std::invalid_argument(std::string("V4 attention: ") + what + " has " + std::to_string(got) +
                                " elements, expected " + sz(want) + " = " + shape);
}

template <typename Scalar>
std::vector<Scalar> to_scalar(std::span<const float> x) {
  return std::vector<Scalar>(x.begin(), x.end());
}

}  // namespace

template <typename Scalar>
V4Attention<Scalar>::V4Attention(const V4Queries& q)
    : type_(q.layer_type), H_(q.num_heads), D_(q.head_dim), rope_(q.rope_dim), T_(q.num_tokens) {
  if (H_ < 1 || D_ < 1 || rope_ < 0 || rope_ > D_ || rope_ % 2 != 0 || q.sliding_window < 1)
    throw std::invalid_argument("V4 attention: num_heads " + sz(H_) + ", head_dim " + sz(D_) + ", rope_dim " +
                                sz(rope_) + ", sliding_window " + sz(q.sliding_window) +
                                ": expected H, D, sliding_window >= 1 and an even rope_dim in [0, D]");
  if (T_ < 1) throw std::invalid_argument("V4 attention: num_tokens " + sz(T_) + " < 1");
  if (!(std::isfinite(q.softmax_scale) && q.softmax_scale > 0))
    throw std::invalid_argument("V4 attention: softmax_scale " + std::to_string(q.softmax_scale) +
                                " must be finite and > 0");
  scale_ = working_scale<Scalar>(q.softmax_scale);
  validate_seq_offsets(q.seq_offsets, T_, "V4 attention: seq_offsets");
  const int64_t S = static_cast<int64_t>(q.seq_offsets.size()) - 1;
  const int64_t Tq = static_cast<int64_t>(q.q_rows.size());
  if (Tq < 1) throw std::invalid_argument("V4 attention: q_rows is empty");
  v4_size(q.positions.size(), T_, "positions", "[T]");
  v4_size(q.q.size(), Tq * H_ * D_, "q", "[Tq, H, D]");
  v4_size(q.sinks.size(), H_, "sinks", "[H]");
  v4_size(q.rope_cos.size(), Tq * rope_ / 2, "rope_cos", "[Tq, rope_dim / 2]");
  v4_size(q.rope_sin.size(), Tq * rope_ / 2, "rope_sin", "[Tq, rope_dim / 2]");
  detail::require_finite(q.q.data(), static_cast<int64_t>(q.q.size()), "V4 attention: q");
  detail::require_finite(q.sinks.data(), H_, "V4 attention: sinks");
  detail::require_finite(q.rope_cos.data(), static_cast<int64_t>(q.rope_cos.size()), "V4 attention: rope_cos");
  detail::require_finite(q.rope_sin.data(), static_cast<int64_t>(q.rope_sin.size()), "V4 attention: rope_sin");
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = q.seq_offsets[s]; t < q.seq_offsets[s + 1]; ++t)
      if (q.positions[t] != t - q.seq_offsets[s])
        throw std::invalid_argument("V4 attention: positions[" + sz(t) + "] = " + sz(q.positions[t]) + ", expected " +
                                    sz(t - q.seq_offsets[s]) + " (each sequence from position 0)");
  seq_offsets_.assign(q.seq_offsets.begin(), q.seq_offsets.end());

  const bool compressed = type_ != V4LayerType::Sliding;
  if (!compressed && (!q.compressed_offsets.empty() || !q.compressed_span.empty()))
    throw std::invalid_argument("V4 attention: a sliding layer has no compressed entries (compressed_offsets / "
                                "compressed_span given)");
  if (compressed) {
    const auto& co = q.compressed_offsets;
    bool ok = static_cast<int64_t>(co.size()) == S + 1 && co[0] == 0;
    for (int64_t s = 0; ok && s < S; ++s) ok = co[s + 1] >= co[s];
    if (!ok)
      throw std::invalid_argument("V4 attention (" + to_string(type_) + "): compressed_offsets has " +
                                  sz(static_cast<int64_t>(co.size())) + " entries; expected S + 1 = " + sz(S + 1) +
                                  " non-decreasing offsets from 0");
    N_ = co[S];
    v4_size(q.compressed_span.size(), 2 * N_, "compressed_span", "[N, 2]");
    for (int64_t s = 0; s < S; ++s)
      for (int64_t w = co[s]; w < co[s + 1]; ++w) {
        const int64_t a = q.compressed_span[2 * w], b = q.compressed_span[2 * w + 1];
        if (b <= a || a < 0 || (w > co[s] && b < q.compressed_span[2 * w - 1]))
          throw std::invalid_argument("V4 attention: compressed_span[" + sz(w) + "] = [" + sz(a) + ", " + sz(b) +
                                      "): expected 0 <= first < end, ends non-decreasing within a sequence");
      }
    compressed_offsets_.assign(co.begin(), co.end());
  }

  q_rows_.assign(q.q_rows.begin(), q.q_rows.end());
  t_.resize(Tq), seq_.resize(Tq), wbeg_.resize(Tq), nvis_.assign(Tq, 0);
  for (int64_t i = 0; i < Tq; ++i) {
    const int64_t t = q.q_rows[i];
    if (t < 0 || t >= T_)
      throw std::invalid_argument("V4 attention: q_rows[" + sz(i) + "] = " + sz(t) + " outside [0, T = " + sz(T_) +
                                  ")");
    const int64_t s = std::upper_bound(seq_offsets_.begin(), seq_offsets_.end(), t) - seq_offsets_.begin() - 1;
    const int64_t s0 = seq_offsets_[s], p = t - s0;
    t_[i] = t, seq_[i] = s;
    wbeg_[i] = std::max(s0, t - q.sliding_window + 1);  // positions p - W < pos <= p
    if (compressed)
      for (int64_t w = compressed_offsets_[s]; w < compressed_offsets_[s + 1]; ++w)
        nvis_[i] += q.compressed_span[2 * w + 1] <= p + 1 ? 1 : 0;
  }
  q_ = to_scalar<Scalar>(q.q);
  sinks_ = to_scalar<Scalar>(q.sinks);
  cos_ = to_scalar<Scalar>(q.rope_cos);
  sin_ = to_scalar<Scalar>(q.rope_sin);
}

template <typename Scalar>
void V4Attention<Scalar>::check_selection(const KeySelection& sel) const {
  const int64_t Tq = num_queries();
  if (static_cast<int64_t>(sel.offsets.size()) != Tq + 1 || sel.offsets[0] != 0 ||
      sel.offsets[Tq] != static_cast<int64_t>(sel.keys.size()))
    throw std::invalid_argument("V4 attention: the CSA selection has " + sz(static_cast<int64_t>(sel.offsets.size())) +
                                " offsets over " + sz(static_cast<int64_t>(sel.keys.size())) +
                                " entries; expected Tq + 1 = " + sz(Tq + 1) + " from 0 to the entry count");
  for (int64_t i = 0; i < Tq; ++i) {
    if (sel.offsets[i + 1] < sel.offsets[i])
      throw std::invalid_argument("V4 attention: the CSA selection's offsets decrease at query row " + sz(i));
    for (int64_t a = sel.offsets[i]; a < sel.offsets[i + 1]; ++a) {
      const int64_t w = sel.keys[a];
      if (w < 0 || w >= nvis_[i] || (a > sel.offsets[i] && w <= sel.keys[a - 1]))
        throw std::invalid_argument("V4 attention: query row " + sz(i) + " selects compressed entry " + sz(w) +
                                    "; expected strictly ascending entries in [0, " + sz(nvis_[i]) +
                                    ") (those visible at its position)");
    }
  }
}

template <typename Scalar>
AttentionResult<Scalar> V4Attention<Scalar>::run(std::span<const float> window_kv, std::span<const float> compressed_kv,
                                                 const KeySelection* selection, bool keep_probs) const {
  using Mat = RowMat<Scalar>;
  v4_size(window_kv.size(), T_ * D_, "window_kv", "[T, D]");
  v4_size(compressed_kv.size(), N_ * D_, "compressed_kv", "[N, D]");
  detail::require_finite(window_kv.data(), static_cast<int64_t>(window_kv.size()), "V4 attention: window_kv");
  detail::require_finite(compressed_kv.data(), static_cast<int64_t>(compressed_kv.size()),
                         "V4 attention: compressed_kv");
  const bool csa = type_ == V4LayerType::Csa;
  if (csa != (selection != nullptr))
    throw std::invalid_argument(csa ? "V4 attention: a CSA layer needs the indexer's selection"
                                    : "V4 attention: a selection is for CSA layers only, this one is " +
                                          to_string(type_));
  if (selection) check_selection(*selection);
  const ScalarView<Scalar> W(window_kv), C(compressed_kv);
  const int64_t Tq = num_queries(), H = H_, D = D_, half = rope_ / 2;

  AttentionResult<Scalar> res;
  res.num_queries = Tq, res.num_heads = H, res.v_head_dim = D;
  res.out.assign(static_cast<size_t>(Tq * H * D), Scalar(0));
  res.nkeys.resize(Tq);
  res.prob_offsets.assign(Tq + 1, 0);
  for (int64_t i = 0; i < Tq; ++i) {
    res.nkeys[i] = key_slots(i);
    res.prob_offsets[i + 1] = res.prob_offsets[i] + H * res.nkeys[i];
  }
  if (keep_probs) res.probs.assign(static_cast<size_t>(res.prob_offsets[Tq]), Scalar(0));

  LQ_OMP_FOR_DYNAMIC
  for (int64_t i = 0; i < Tq; ++i) {
    const int64_t nw = t_[i] - wbeg_[i] + 1, nv = nvis_[i], n = nw + nv + 1;
    const Eigen::Map<const Mat> Q(q_.data() + i * H * D, H, D);
    const Eigen::Map<const Mat> Kw(W.ptr + wbeg_[i] * D, nw, D);
    const Scalar* cptr = nv > 0 ? C.ptr + compressed_offsets_[seq_[i]] * D : W.ptr;
    const Eigen::Map<const Mat> Kc(cptr, nv, D);
    Mat P(H, n);
    gemm<Scalar>(Op::N, Op::T, scale_, Q, Kw, 0, P.leftCols(nw));
    if (nv > 0) gemm<Scalar>(Op::N, Op::T, scale_, Q, Kc, 0, P.middleCols(nw, nv));
    std::vector<char> read(static_cast<size_t>(nv), selection ? 0 : 1);
    if (selection)
      for (int64_t a = selection->offsets[i]; a < selection->offsets[i + 1]; ++a) read[selection->keys[a]] = 1;
    for (int64_t h = 0; h < H; ++h) {
      Scalar* row = P.row(h).data();
      for (int64_t w = 0; w < nv; ++w)
        if (!read[w]) row[nw + w] = -std::numeric_limits<Scalar>::infinity();
      row[n - 1] = sinks_[h];
      softmax_row(row, n, n);
      if (keep_probs) std::copy_n(row, n, res.probs.data() + res.prob_offsets[i] + h * n);
    }
    Mat O(H, D);
    gemm<Scalar>(Op::N, Op::N, 1, P.leftCols(nw), Kw, 0, O);
    if (nv > 0) gemm<Scalar>(Op::N, Op::N, 1, P.middleCols(nw, nv), Kc, 1, O);
    // The rope slice rotated back: pair (2k, 2k+1) of the last d_r columns by (cos, −sin).
    const Scalar* c = cos_.data() + i * half;
    const Scalar* s = sin_.data() + i * half;
    for (int64_t h = 0; h < H; ++h) {
      Scalar* o = O.row(h).data() + (D - rope_);
      for (int64_t k = 0; k < half; ++k) {
        const Scalar a = o[2 * k], b = o[2 * k + 1];
        o[2 * k] = a * c[k] + b * s[k];
        o[2 * k + 1] = b * c[k] - a * s[k];
      }
    }
    std::copy_n(O.data(), H * D, res.out.data() + i * H * D);
  }
  require_finite_result(res, "V4 attention");
  return res;
}

template <typename Scalar>
KeySelection V4Attention<Scalar>::selection_from_picks(std::span<const int64_t> picks, int64_t k) const {
  const int64_t Tq = num_queries();
  if (k < 0 || static_cast<int64_t>(picks.size()) != Tq * k)
    throw std::invalid_argument("V4 attention: index_selected has " + sz(static_cast<int64_t>(picks.size())) +
                                " values, expected Tq · k = " + sz(Tq) + " · " + sz(k));
  KeySelection sel;
  sel.offsets.assign(1, 0);
  for (int64_t i = 0; i < Tq; ++i) {
    const size_t first = sel.keys.size();
    for (int64_t a = 0; a < k; ++a) {
      const int64_t w = picks[i * k + a];
      if (w == -1) continue;
      if (w < 0 || w >= nvis_[i])
        throw std::invalid_argument("V4 attention: index_selected[" + sz(i) + ", " + sz(a) + "] = " + sz(w) +
                                    ": expected -1 or an entry in [0, " + sz(nvis_[i]) +
                                    ") (visible at the row's position)");
      sel.keys.push_back(static_cast<int32_t>(w));
    }
    std::sort(sel.keys.begin() + first, sel.keys.end());
    if (std::adjacent_find(sel.keys.begin() + first, sel.keys.end()) != sel.keys.end())
      throw std::invalid_argument("V4 attention: index_selected row " + sz(i) + " names an entry twice");
    sel.offsets.push_back(static_cast<int64_t>(sel.keys.size()));
  }
  return sel;
}

template <typename Scalar>
KeySelection V4Attention<Scalar>::select_topk(const V4IndexQueries& iq, std::span<const float> index_k) const {
  if (type_ != V4LayerType::Csa)
    throw std::invalid_argument("V4 attention: the indexer's selection is for CSA layers, this one is " +
                                to_string(type_));
  const int64_t Tq = num_queries(), n = iq.n_heads, d = iq.dim;
  if (n < 1 || d < 1) throw std::invalid_argument("V4 attention: index heads " + sz(n) + ", dim " + sz(d) + " < 1");
  v4_size(iq.index_q.size(), Tq * n * d, "index_q", "[Tq, n_h, c]");
  v4_size(iq.index_w.size(), Tq * n, "index_w", "[Tq, n_h]");
  v4_size(index_k.size(), N_ * d, "index_k", "[N, c]");
  // dsa_select_topk on the rows that see an entry: its "tokens" are the compressed entries (sequence s owns
  // compressed_offsets[s] ..), each row's "token" its last visible entry, so its causal window is the visible ones.
  std::vector<int32_t> rows;
  std::vector<float> q, w;
  std::vector<int64_t> which;
  for (int64_t i = 0; i < Tq; ++i) {
    if (nvis_[i] == 0) continue;
    which.push_back(i);
    rows.push_back(static_cast<int32_t>(compressed_offsets_[seq_[i]] + nvis_[i] - 1));
    q.insert(q.end(), iq.index_q.begin() + i * n * d, iq.index_q.begin() + (i + 1) * n * d);
    w.insert(w.end(), iq.index_w.begin() + i * n, iq.index_w.begin() + (i + 1) * n);
  }
  KeySelection part;
  if (!rows.empty())
    part = dsa_select_topk(q, w, index_k, n, d, rows, compressed_offsets_, iq.softmax_scale, iq.topk);
  else if (iq.topk < 1)
    throw std::invalid_argument("V4 attention: index_topk " + sz(iq.topk) + " < 1");
  KeySelection sel;
  sel.offsets.assign(1, 0);
  size_t r = 0;
  for (int64_t i = 0; i < Tq; ++i) {
    if (r < which.size() && which[r] == i) {
      sel.keys.insert(sel.keys.end(), part.keys.begin() + part.offsets[r], part.keys.begin() + part.offsets[r + 1]);
      ++r;
    }
    sel.offsets.push_back(static_cast<int64_t>(sel.keys.size()));
  }
  return sel;
}

template class V4Attention<float>;
template class V4Attention<double>;

}  // namespace latentq::probes
