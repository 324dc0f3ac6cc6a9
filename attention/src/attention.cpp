#include "latentq/attention/attention.h"

#include <algorithm>
#include <bit>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "latentq/analysis/detail.h"
#include "latentq/analysis/gemm.h"
#include "latentq/analysis/narrow.h"
#include "latentq/analysis/split.h"
#include "latentq/quantize.h"

#ifdef _OPENMP
#define LQ_OMP_FOR_DYNAMIC _Pragma("omp parallel for schedule(dynamic)")
#else
#define LQ_OMP_FOR_DYNAMIC
#endif

namespace latentq::probes {

namespace {

using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
constexpr int64_t kChunkRows = 8;  // query rows per GEMM chunk (all heads stacked)
// GEMM rows (query rows × heads) per device segment by default (attach_device): large enough for a GPU's
// GEMM, small enough that a sequence's rows split into segments whose keys follow the causal triangle.
constexpr int64_t kDeviceSegmentGemmRows = 4096;

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
  // NaN/Inf ⇔ all exponent bits set: an integer test the compiler vectorizes (std::isfinite it does not).
  using Bits = std::conditional_t<sizeof(Scalar) == 4, uint32_t, uint64_t>;
  constexpr Bits kExp = static_cast<Bits>(sizeof(Scalar) == 4 ? 0x7f800000ull : 0x7ff0000000000000ull);
  int64_t n = 0;
  for (const Scalar x : v) n += (std::bit_cast<Bits>(x) & kExp) == kExp ? 1 : 0;
  return n;
}

// cos(a, b) of one (row, head) pair from its sums; a pair where either norm is 0 counts 1 if equal, else 0.
double pair_cos(double dot, double na, double nb, bool equal) {
  return (na > 0 && nb > 0) ? dot / (std::sqrt(na) * std::sqrt(nb)) : (equal ? 1.0 : 0.0);
}

// AttentionError from the sums over `pairs` (row, head) pairs (error_over_rows and device_error).
AttentionError finish_error(double err2, double ref2, double cos_sum, double kl_sum, double top1, double top8,
                            double pairs) {
  AttentionError e;
  e.out_rel_fro = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  e.cos_mean = cos_sum / pairs;
  e.kl_mean = kl_sum / pairs;
  e.top1_agree = top1 / pairs;
  e.top8_agree = top8 / pairs;
  return e;
}

/// A result must be finite: the scores, the softmax or the output can overflow the working precision
/// even on finite inputs, and no metric may be computed from a NaN/Inf reference or test.
template <typename Scalar>
void require_finite_counts(const char* what, int64_t bad_out, int64_t n_out, int64_t bad_p, int64_t n_p) {
  if (bad_out + bad_p > 0)
    throw std::invalid_argument(std::string(what) + ": " + sz(bad_out) + " of " + sz(n_out) + " outputs and " + sz(bad_p) +
                                " of " + sz(n_p) + " kept probabilities are NaN/Inf in " + precision_name<Scalar>() +
                                " (the scores or the output overflow the working precision); no metric is computed "
                                "from a non-finite attention");
}

template <typename Scalar>
void require_finite_result(const AttentionResult<Scalar>& r, const char* what) {
  require_finite_counts<Scalar>(what, count_nonfinite_of(r.out), static_cast<int64_t>(r.out.size()),
                                count_nonfinite_of(r.probs), static_cast<int64_t>(r.probs.size()));
}

void check_latents(const MlaDims& d, int64_t T, std::span<const float> c_kv, std::span<const float> k_pe) {
  check_size(c_kv.size(), T * d.kv_lora_rank, "c_kv", "[T, kv_lora_rank]");
  check_size(k_pe.size(), T * d.qk_rope_head_dim, "k_pe", "[T, qk_rope_head_dim]");
  detail::require_finite(c_kv.data(), static_cast<int64_t>(c_kv.size()), "attention: c_kv");
  detail::require_finite(k_pe.data(), static_cast<int64_t>(k_pe.size()), "attention: k_pe");
}

#if defined(__x86_64__) && defined(__GNUC__)
#define LQ_VEC_MATH 1
extern "C" __m256 _ZGVdN8v_expf(__m256);    // glibc libmvec: the AVX2 variant of expf (x86_64 vector ABI)
extern "C" __m256d _ZGVdN4v_log(__m256d);  // ... and of log

// x[j] = exp(x[j] − m) for j in [0, n), eight at a time with libmvec's expf, the tail with std::exp.
__attribute__((target("avx2"))) void exp_shifted_avx2(float* x, int64_t n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, _ZGVdN8v_expf(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm)));
  for (; j < n; ++j) x[j] = std::exp(x[j] - m);
}

// max of x[0, n), n >= 1, sixteen at a time: the same value as the scalar fold for finite x (max is exact;
// a zero's sign cannot change exp(x − m)); a NaN row fails require_finite_result on either path.
__attribute__((target("avx2"))) float max_avx2(const float* x, int64_t n) {
  int64_t j = 0;
  float m = x[0];
  if (n >= 16) {
    __m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8);
    for (j = 16; j + 16 <= n; j += 16) {
      a = _mm256_max_ps(a, _mm256_loadu_ps(x + j));
      b = _mm256_max_ps(b, _mm256_loadu_ps(x + j + 8));
    }
    alignas(32) float lane[8];
    _mm256_store_ps(lane, _mm256_max_ps(a, b));
    m = lane[0];
    for (int k = 1; k < 8; ++k) m = std::max(m, lane[k]);
  }
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// Whether some x[j] > thr for j in [0, 16): the skip test of top_m, sixteen values in one compare each
// half (ordered: a NaN never exceeds thr, as in the scalar test).
__attribute__((target("avx2"))) bool any_greater16_avx2(const float* x, float thr) {
  const __m256 t = _mm256_set1_ps(thr);
  const __m256 g = _mm256_or_ps(_mm256_cmp_ps(_mm256_loadu_ps(x), t, _CMP_GT_OQ),
                                _mm256_cmp_ps(_mm256_loadu_ps(x + 8), t, _CMP_GT_OQ));
  return _mm256_movemask_ps(g) != 0;
}
#endif

/// In-place softmax of x[0, n) in Scalar precision (max-subtracted); x[n, n_total) set to 0. The sum is
/// taken in index order. Float rows under the AVX2 CPU kernel (quantize.h) take their exponentials
/// from libmvec's expf (within 4 ulp of expf; the probabilities then differ from the scalar path's in
/// their last bits, test); otherwise std::exp.
template <typename Scalar>
void softmax_row(Scalar* x, int64_t n, int64_t n_total) {
  Scalar m = x[0];
  bool done = false;
#ifdef LQ_VEC_MATH
  if constexpr (std::is_same_v<Scalar, float>)
    if (active_cpu_kernel() == CpuKernel::Avx2) m = max_avx2(x, n), exp_shifted_avx2(x, n, m), done = true;
#endif
  if (!done) {
    for (int64_t j = 1; j < n; ++j) m = std::max(m, x[j]);
    for (int64_t j = 0; j < n; ++j) x[j] = std::exp(x[j] - m);
  }
  Scalar sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += x[j];
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
    Mat ql(Tq, r);
    gemm<Scalar>(Op::N, Op::N, 1, qn, wuk, 0, ql);
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
  if (device_) return run_device(c_kv, k_pe, keep_probs);
  return run_impl(c_kv, k_pe, nullptr, keep_probs);
}

template <typename Scalar>
AttentionResult<Scalar> AbsorbedAttention<Scalar>::run_on_cpu(std::span<const float> c_kv, std::span<const float> k_pe,
                                                               bool keep_probs) const {
  return run_impl(c_kv, k_pe, nullptr, keep_probs);
}

template <typename Scalar>
void AbsorbedAttention<Scalar>::attach_device(const AttentionDeviceFactory& make, int64_t segment_rows) {
  if constexpr (!std::is_same_v<Scalar, float>) {
    (void)make, (void)segment_rows;
    throw std::logic_error("attention: attach_device: the device path is float32 only");
  } else {
    if (segment_rows < 0)
      throw std::invalid_argument("attention: attach_device: segment_rows " + sz(segment_rows) + " < 0");
    const int64_t rows = segment_rows > 0 ? segment_rows : std::max<int64_t>(1, kDeviceSegmentGemmRows / dims_.num_heads);
    // Segments of at most `rows` consecutive sorted rows of one sequence (the chunks of a sequence are
    // consecutive and share key_begin; rows are sorted by token index, so a segment's last row has the most
    // keys, its nk).
    std::vector<AttentionSegment> segs;
    for (const Chunk& c : chunks_)
      for (int64_t p = c.begin; p < c.end; ++p) {
        const int64_t n = nkeys_[order_[p]];
        if (!segs.empty() && segs.back().key_begin == c.key_begin && segs.back().end - segs.back().begin < rows) {
          segs.back().end = p + 1;
          segs.back().nk = std::max(segs.back().nk, n);
        } else {
          segs.push_back({p, p + 1, c.key_begin, n});
        }
      }
    std::vector<int64_t> nk(order_.size());
    for (size_t p = 0; p < order_.size(); ++p) nk[p] = nkeys_[order_[p]];
    segments_ = std::move(segs);
    nkeys_sorted_ = std::move(nk);
    AttentionLayout layout;
    layout.dims = dims_;
    layout.num_tokens = T_;
    layout.softmax_scale = scale_;
    layout.nkeys = nkeys_sorted_;
    layout.segments = segments_;
    layout.q_lat = q_lat_.data();
    layout.q_pe = q_pe_.data();
    layout.w_uv = w_uv_.data();
    std::unique_ptr<AttentionDevice> d = make ? make(layout) : nullptr;
    if (!d) throw std::logic_error("attention: attach_device: the factory returned no device");
    device_ = std::move(d);
  }
}

void AttentionDevice::keep_reference(const float*, const float*, float*) const {
  throw std::logic_error("attention device: keep_reference is not implemented by this device");
}

void AttentionDevice::error_terms(const float*, const float*, AttentionPairTerms*) const {
  throw std::logic_error("attention device: error_terms is not implemented by this device");
}

void AttentionDevice::run_mixed(const float*, const float*, const float*, const float*, const int64_t*, float*,
                                float*) const {
  throw std::logic_error("attention device: run_mixed is not implemented by this device");
}

void AttentionDevice::error_terms_mixed(const float*, const float*, const float*, const float*, const int64_t*,
                                        AttentionPairTerms*) const {
  throw std::logic_error("attention device: error_terms_mixed is not implemented by this device");
}

template <typename Scalar>
AttentionResult<Scalar> AbsorbedAttention<Scalar>::keep_device_reference(std::span<const float> c_kv,
                                                                         std::span<const float> k_pe) {
  if constexpr (!std::is_same_v<Scalar, float>) {
    (void)c_kv, (void)k_pe;
    throw std::logic_error("attention: keep_device_reference: the device path is float32 only");
  } else {
    if (!device_computes_errors())
      throw std::logic_error("attention: keep_device_reference: no device that computes attention_error's terms is attached");
    check_latents(dims_, T_, c_kv, k_pe);
    device_reference_ = false;
    AttentionResult<Scalar> res = device_result(false, "attention reference", [&](float* out, float*) {
      device_->keep_reference(c_kv.data(), k_pe.data(), out);
    });
    device_reference_ = true;
    return res;
  }
}

template <typename Scalar>
template <typename Run>
AttentionResult<Scalar> AbsorbedAttention<Scalar>::device_result(bool keep_probs, const char* what, Run&& run) const {
  const int64_t Tq = num_queries(), H = dims_.num_heads, v = dims_.v_head_dim;
  AttentionResult<Scalar> res = make_result<Scalar>(dims_, nkeys_, keep_probs);
  int64_t nprobs = 0;
  for (const AttentionSegment& g : segments_) nprobs += (g.end - g.begin) * H * g.nk;
  std::vector<float> out(static_cast<size_t>(Tq * H * v)), probs(keep_probs ? static_cast<size_t>(nprobs) : 0);
  run(out.data(), keep_probs ? probs.data() : nullptr);
  // Back to q_rows order and the packed probability layout (H·nkeys[i] per row).
  for (int64_t p = 0; p < Tq; ++p)
    std::copy_n(out.data() + p * H * v, H * v, res.out.data() + order_[p] * H * v);
  if (keep_probs) {
    int64_t off = 0;
    for (const AttentionSegment& g : segments_) {
      for (int64_t p = g.begin; p < g.end; ++p) {
        const int64_t i = order_[p], n = nkeys_[i];
        for (int64_t h = 0; h < H; ++h)
          std::copy_n(probs.data() + off + ((p - g.begin) * H + h) * g.nk, n,
                      res.probs.data() + res.prob_offsets[i] + h * n);
      }
      off += (g.end - g.begin) * H * g.nk;
    }
  }
  require_finite_result(res, what);
  return res;
}

template <typename Scalar>
AttentionResult<Scalar> AbsorbedAttention<Scalar>::run_device(std::span<const float> c_kv, std::span<const float> k_pe,
                                                               bool keep_probs) const {
  check_latents(dims_, T_, c_kv, k_pe);
  return device_result(keep_probs, "attention",
                       [&](float* out, float* probs) { device_->run(c_kv.data(), k_pe.data(), out, probs); });
}

template <typename Scalar>
void AbsorbedAttention<Scalar>::check_mixed_ranges(const MixedCache& m) const {
  const int64_t Tq = num_queries();
  if (static_cast<int64_t>(m.ckv_from_a.size()) != Tq || static_cast<int64_t>(m.kpe_from_a.size()) != Tq)
    throw std::invalid_argument("attention: the mixed cache's key ranges have " + sz(static_cast<int64_t>(m.ckv_from_a.size())) +
                                " (c_kv) and " + sz(static_cast<int64_t>(m.kpe_from_a.size())) +
                                " (k_pe) entries, expected Tq = " + sz(Tq));
}

template <typename Scalar>
AttentionResult<Scalar> AbsorbedAttention<Scalar>::run_mixed(const MixedCache& m, bool keep_probs) const {
  check_mixed_ranges(m);
  if (device_runs_mixed()) return run_mixed_device(m, keep_probs);
  return run_impl(m.c_kv_a, m.k_pe_a, &m, keep_probs);
}

namespace {
/// The part of range r inside [0, n).
KeyRange clip_range(const KeyRange& r, int64_t n) {
  const int64_t b = std::clamp<int64_t>(r.begin, 0, n), e = std::clamp<int64_t>(r.end, 0, n);
  return {b, std::max(b, e)};
}
}  // namespace

template <typename Scalar>
AttentionResult<Scalar> AbsorbedAttention<Scalar>::run_impl(std::span<const float> c_kv, std::span<const float> k_pe,
                                                             const MixedCache* mixed, bool keep_probs) const {
  check_latents(dims_, T_, c_kv, k_pe);
  if (mixed) check_latents(dims_, T_, mixed->c_kv_b, mixed->k_pe_b);
  const int64_t Tq = num_queries();
  const int64_t H = dims_.num_heads, r = dims_.kv_lora_rank, rope = dims_.qk_rope_head_dim, v = dims_.v_head_dim;
  const ScalarView<Scalar> C(c_kv), K(k_pe);
  const ScalarView<Scalar> CB(mixed ? mixed->c_kv_b : std::span<const float>{}),
      KB(mixed ? mixed->k_pe_b : std::span<const float>{});
  AttentionResult<Scalar> res = make_result<Scalar>(dims_, nkeys_, keep_probs);
  Mat o_lat(Tq * H, r);

  const int64_t nchunks = static_cast<int64_t>(chunks_.size());
  LQ_OMP_FOR_DYNAMIC
  for (int64_t ci = 0; ci < nchunks; ++ci) {
    const Chunk& c = chunks_[ci];
    const int64_t nH = (c.end - c.begin) * H;
    // Which stores this chunk reads (without a mixed cache: A only, the plain run).
    bool c_a = true, c_b = false, k_a = true, k_b = false;
    if (mixed) {
      c_a = k_a = false;
      for (int64_t p = c.begin; p < c.end; ++p) {
        const int64_t i = order_[p], n = nkeys_[i];
        const KeyRange rc = clip_range(mixed->ckv_from_a[i], n), rk = clip_range(mixed->kpe_from_a[i], n);
        c_a = c_a || rc.end > rc.begin;
        c_b = c_b || rc.end - rc.begin < n;
        k_a = k_a || rk.end > rk.begin;
        k_b = k_b || rk.end - rk.begin < n;
      }
    }
    // Row q of a chunk matrix is (sorted position c.begin + q / H, head q % H); keeps (from_a = true) or
    // clears the columns of its row's keys that the range does (not) cover.
    const auto mask_cols = [&](Mat& M, std::span<const KeyRange> ranges, bool keep_a) {
      for (int64_t p = c.begin; p < c.end; ++p) {
        const int64_t i = order_[p];
        const KeyRange rr = clip_range(ranges[i], nkeys_[i]);
        for (int64_t h = 0; h < H; ++h) {
          Scalar* row = M.row((p - c.begin) * H + h).data();
          if (keep_a) {
            std::fill(row, row + rr.begin, Scalar(0));
            std::fill(row + rr.end, row + c.nk, Scalar(0));
          } else {
            std::fill(row + rr.begin, row + rr.end, Scalar(0));
          }
        }
      }
    };
    // A's values where the range covers the key, B's elsewhere: dst (A's) takes B's outside the ranges, on
    // the row's keys (the columns past them are zeroed by the softmax).
    const auto take_b_outside = [&](Mat& dst, const Mat& b, std::span<const KeyRange> ranges) {
      for (int64_t p = c.begin; p < c.end; ++p) {
        const int64_t i = order_[p], n = nkeys_[i];
        const KeyRange rr = clip_range(ranges[i], n);
        for (int64_t h = 0; h < H; ++h) {
          const int64_t q = (p - c.begin) * H + h;
          for (int64_t j = 0; j < rr.begin; ++j) dst(q, j) = b(q, j);
          for (int64_t j = rr.end; j < n; ++j) dst(q, j) = b(q, j);
        }
      }
    };
    // The c_kv columns of the chunk that some row reads from A, [a_lo, a_hi), and from B, [0, b_lo) and
    // [b_hi, nk) (a row reads B on [0, begin) and [end, n) of its range, all of [0, n) when it is empty):
    // the GEMMs of each store run on those columns only (a decode order reads B on its sink and residual
    // window). b_lo >= b_hi: B on every column.
    int64_t a_lo = c.nk, a_hi = 0, b_lo = 0, b_hi = c.nk;
    if (mixed && c_a && c_b)
      for (int64_t p = c.begin; p < c.end; ++p) {
        const int64_t i = order_[p], n = nkeys_[i];
        const KeyRange rr = clip_range(mixed->ckv_from_a[i], n);
        const bool some = rr.end > rr.begin;
        if (some) a_lo = std::min(a_lo, rr.begin), a_hi = std::max(a_hi, rr.end);
        b_lo = std::max(b_lo, some ? rr.begin : n);
        b_hi = std::min(b_hi, some ? rr.end : n);
      }
    if (b_lo >= b_hi) b_lo = c.nk, b_hi = c.nk;  // one block [0, nk)
    const Eigen::Map<const Mat> Ck(C.ptr + c.key_begin * r, c.nk, r);
    const Eigen::Map<const Mat> CkB(mixed ? CB.ptr + c.key_begin * r : C.ptr, c.nk, r);
    const auto Q = q_lat_.middleRows(c.begin * H, nH);
    Mat S(nH, c.nk);
    const auto scores_cols = [&](const Eigen::Map<const Mat>& store, Mat& dst, int64_t j0, int64_t j1) {
      if (j1 > j0) gemm<Scalar>(Op::N, Op::T, 1, Q, store.middleRows(j0, j1 - j0), 0, dst.middleCols(j0, j1 - j0));
    };
    if (c_a && c_b) {
      S.setZero();  // columns no row reads stay 0 (the softmax zeroes them anyway)
      scores_cols(Ck, S, a_lo, a_hi);
      Mat SB(nH, c.nk);
      scores_cols(CkB, SB, 0, b_lo);
      scores_cols(CkB, SB, b_hi, c.nk);
      take_b_outside(S, SB, mixed->ckv_from_a);
    } else if (c_a) {
      gemm<Scalar>(Op::N, Op::T, 1, Q, Ck, 0, S);
    } else {
      gemm<Scalar>(Op::N, Op::T, 1, Q, CkB, 0, S);
    }
    if (rope > 0) {
      const Eigen::Map<const Mat> Kk(K.ptr + c.key_begin * rope, c.nk, rope);
      const Eigen::Map<const Mat> KkB(mixed ? KB.ptr + c.key_begin * rope : K.ptr, c.nk, rope);
      const auto Qp = q_pe_.middleRows(c.begin * H, nH);
      if (k_a && !k_b) {
        gemm<Scalar>(Op::N, Op::T, 1, Qp, Kk, 1, S);
      } else if (!k_a) {
        gemm<Scalar>(Op::N, Op::T, 1, Qp, KkB, 1, S);
      } else {
        Mat SA(nH, c.nk), SB(nH, c.nk);
        gemm<Scalar>(Op::N, Op::T, 1, Qp, Kk, 0, SA);
        gemm<Scalar>(Op::N, Op::T, 1, Qp, KkB, 0, SB);
        take_b_outside(SA, SB, mixed->kpe_from_a);
        S += SA;
      }
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
    auto O = o_lat.middleRows(c.begin * H, nH);
    if (!c_b) {
      gemm<Scalar>(Op::N, Op::N, 1, S, Ck, 0, O);
    } else if (!c_a) {
      gemm<Scalar>(Op::N, Op::N, 1, S, CkB, 0, O);
    } else {
      // O = P_A·C_A + P_B·C_B, each product over the columns its store is read on (the others are 0).
      Mat PB = S;
      mask_cols(S, mixed->ckv_from_a, true);
      mask_cols(PB, mixed->ckv_from_a, false);
      O.setZero();
      const auto out_cols = [&](const Mat& P, const Eigen::Map<const Mat>& store, int64_t j0, int64_t j1) {
        if (j1 > j0) gemm<Scalar>(Op::N, Op::N, 1, P.middleCols(j0, j1 - j0), store.middleRows(j0, j1 - j0), 1, O);
      };
      out_cols(S, Ck, a_lo, a_hi);
      out_cols(PB, CkB, 0, b_lo);
      out_cols(PB, CkB, b_hi, c.nk);
    }
  }

  // out[i, h, :] = o_lat[i, h, :] · W_UV[h]ᵀ  ([r] × [r, v]).
  for (int64_t h = 0; h < H; ++h) {
    const Eigen::Map<const Mat, 0, Eigen::OuterStride<>> Oh(o_lat.data() + h * r, Tq, r, Eigen::OuterStride<>(H * r));
    const Eigen::Map<const Mat> Wh(w_uv_.data() + h * v * r, v, r);
    Mat R(Tq, v);
    gemm<Scalar>(Op::N, Op::T, 1, Oh, Wh, 0, R);
    for (int64_t p = 0; p < Tq; ++p)
      Eigen::Map<Eigen::Matrix<Scalar, 1, Eigen::Dynamic>>(res.out.data() + (order_[p] * H + h) * v, v) = R.row(p);
  }
  require_finite_result(res, "attention");
  return res;
}

template <typename Scalar>
std::vector<int64_t> AbsorbedAttention<Scalar>::mixed_ranges_sorted(const MixedCache& m) const {
  const int64_t Tq = num_queries();
  std::vector<int64_t> ranges(static_cast<size_t>(Tq * 4));
  for (int64_t p = 0; p < Tq; ++p) {
    const int64_t i = order_[p], n = nkeys_[i];
    const KeyRange rc = clip_range(m.ckv_from_a[i], n), rk = clip_range(m.kpe_from_a[i], n);
    ranges[p * 4 + 0] = rc.begin, ranges[p * 4 + 1] = rc.end;  // clip_range: begin <= end
    ranges[p * 4 + 2] = rk.begin, ranges[p * 4 + 3] = rk.end;
  }
  return ranges;
}

template <typename Scalar>
std::vector<AttentionPairTerms> AbsorbedAttention<Scalar>::device_terms_impl(std::span<const float> c_kv,
                                                                             std::span<const float> k_pe,
                                                                             const MixedCache* mixed) const {
  if (!device_computes_errors() || !device_reference_)
    throw std::logic_error("attention: device_error: no reference kept on a device that computes attention_error's "
                           "terms (keep_device_reference)");
  if (mixed && !device_runs_mixed())
    throw std::logic_error("attention: device_error_terms: the device does not run mixed caches");
  check_latents(dims_, T_, c_kv, k_pe);
  const int64_t Tq = num_queries(), H = dims_.num_heads, v = dims_.v_head_dim;
  std::vector<AttentionPairTerms> sorted(static_cast<size_t>(Tq * H));
  if (mixed) {
    check_latents(dims_, T_, mixed->c_kv_b, mixed->k_pe_b);
    const std::vector<int64_t> ranges = mixed_ranges_sorted(*mixed);
    device_->error_terms_mixed(c_kv.data(), k_pe.data(), mixed->c_kv_b.data(), mixed->k_pe_b.data(), ranges.data(),
                               sorted.data());
  } else {
    device_->error_terms(c_kv.data(), k_pe.data(), sorted.data());
  }
  int64_t bad_p = 0, bad_o = 0, n_p = 0;
  for (const AttentionPairTerms& t : sorted) bad_p += t.nonfinite_probs, bad_o += t.nonfinite_out;
  for (const int64_t n : nkeys_) n_p += H * n;
  require_finite_counts<Scalar>("attention", bad_o, Tq * H * v, bad_p, n_p);
  std::vector<AttentionPairTerms> terms(sorted.size());  // q_rows order
  for (int64_t p = 0; p < Tq; ++p) std::copy_n(sorted.begin() + p * H, H, terms.begin() + order_[p] * H);
  return terms;
}

template <typename Scalar>
std::vector<AttentionPairTerms> AbsorbedAttention<Scalar>::device_error_terms(std::span<const float> c_kv,
                                                                              std::span<const float> k_pe) const {
  return device_terms_impl(c_kv, k_pe, nullptr);
}

template <typename Scalar>
std::vector<AttentionPairTerms> AbsorbedAttention<Scalar>::device_error_terms(const MixedCache& m) const {
  check_mixed_ranges(m);
  return device_terms_impl(m.c_kv_a, m.k_pe_a, &m);
}

template <typename Scalar>
AttentionError AbsorbedAttention<Scalar>::error_from_terms(std::span<const AttentionPairTerms> terms,
                                                           std::span<const int64_t> rows) const {
  const int64_t Tq = num_queries(), H = dims_.num_heads;
  check_size(terms.size(), Tq * H, "error terms", "[Tq, H]");
  if (rows.empty()) throw std::invalid_argument("attention: error_from_terms: no query rows selected");
  double err2 = 0, ref2 = 0, cos_sum = 0, kl_sum = 0, top1 = 0, top8 = 0;
  for (const int64_t i : rows) {
    if (i < 0 || i >= Tq)
      throw std::invalid_argument("attention: error_from_terms: query row " + sz(i) + " outside [0, Tq = " + sz(Tq) + ")");
    const int64_t m = std::min<int64_t>(8, nkeys_[i]);
    for (int64_t h = 0; h < H; ++h) {
      const AttentionPairTerms& t = terms[i * H + h];
      err2 += t.err2;
      ref2 += t.ref2;
      cos_sum += pair_cos(t.dot, t.ref2, t.test2, t.equal);
      kl_sum += t.kl;
      top1 += t.top1 ? 1.0 : 0.0;
      top8 += static_cast<double>(t.top_common) / static_cast<double>(m);
    }
  }
  return finish_error(err2, ref2, cos_sum, kl_sum, top1, top8, static_cast<double>(static_cast<int64_t>(rows.size()) * H));
}

template <typename Scalar>
AttentionError AbsorbedAttention<Scalar>::device_error(std::span<const float> c_kv, std::span<const float> k_pe) const {
  std::vector<int64_t> rows(static_cast<size_t>(num_queries()));
  std::iota(rows.begin(), rows.end(), int64_t{0});
  return error_from_terms(device_error_terms(c_kv, k_pe), rows);
}

template <typename Scalar>
AttentionResult<Scalar> AbsorbedAttention<Scalar>::run_mixed_device(const MixedCache& m, bool keep_probs) const {
  check_latents(dims_, T_, m.c_kv_a, m.k_pe_a);
  check_latents(dims_, T_, m.c_kv_b, m.k_pe_b);
  const std::vector<int64_t> ranges = mixed_ranges_sorted(m);
  return device_result(keep_probs, "attention", [&](float* out, float* probs) {
    device_->run_mixed(m.c_kv_a.data(), m.k_pe_a.data(), m.c_kv_b.data(), m.k_pe_b.data(), ranges.data(), out, probs);
  });
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
  const int64_t H = dims_.num_heads, r = dims_.kv_lora_rank, rope = dims_.qk_rope_head_dim, v = dims_.v_head_dim;
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
        if (rope > 0) Pb.noalias() = Sc + Sk[vk[a]];
        else Pb = Sc;
        Pb *= scale_;
        for (int64_t p = c.begin; p < c.end; ++p) {
          const int64_t i = order_[p], n = nkeys_[i];
          for (int64_t h = 0; h < H; ++h) {
            Scalar* row = P.row(b * nH + (p - c.begin) * H + h).data();
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
    for (int64_t h = 0; h < H; ++h) {
      const Eigen::Map<const Mat, 0, Eigen::OuterStride<>> Oh(o_lat[a].data() + h * r, Tq, r,
                                                              Eigen::OuterStride<>(H * r));
      const Eigen::Map<const Mat> Wh(w_uv_.data() + h * v * r, v, r);
      Mat R(Tq, v);
      gemm<Scalar>(Op::N, Op::T, 1, Oh, Wh, 0, R);
      for (int64_t p = 0; p < Tq; ++p)
        Eigen::Map<Eigen::Matrix<Scalar, 1, Eigen::Dynamic>>(res[a].out.data() + (order_[p] * H + h) * v, v) = R.row(p);
    }
    require_finite_result(res[a], "attention");
  }
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

// ---- metrics ------------------------------------------------------------------------------------

namespace {

/// The m ≤ 8 largest values of p (ties → lower index first): idx[0..m) in descending order of value.
/// Allocation-free insertion into a sorted list, scanning j upward: an equal value never displaces an
/// earlier key, only a strictly larger one. Once m keys are held, blocks of 16 values none of which
/// exceeds the m-th largest so far are skipped with one test (AVX2 compares under the Avx2 CPU kernel;
/// most of a long row).
template <typename Scalar>
void top_m(std::span<const Scalar> p, int64_t m, int64_t* idx) {
  int64_t count = 0;
  const int64_t n = static_cast<int64_t>(p.size());
  const auto insert = [&](int64_t j) {
    int64_t pos = count < m ? count++ : m - 1;
    while (pos > 0 && p[j] > p[idx[pos - 1]]) {
      idx[pos] = idx[pos - 1];
      --pos;
    }
    idx[pos] = j;
  };
  int64_t j = 0;
  for (; j < n && count < m; ++j) insert(j);
  if (m < 1) return;
  Scalar thr = p[idx[m - 1]];  // the m-th largest so far: only a value > thr enters
  constexpr int64_t kBlock = 16;
  bool vec = false;
#ifdef LQ_VEC_MATH
  if constexpr (std::is_same_v<Scalar, float>) vec = active_cpu_kernel() == CpuKernel::Avx2;
#endif
  while (j < n) {
    if (j + kBlock <= n) {
      bool any = false;
#ifdef LQ_VEC_MATH
      if constexpr (std::is_same_v<Scalar, float>)
        if (vec) any = any_greater16_avx2(p.data() + j, thr);
#endif
      if (!vec)
        for (int64_t k = 0; k < kBlock; ++k) any |= p[j + k] > thr;
      if (!any) {
        j += kBlock;
        continue;
      }
    }
    const int64_t e = std::min(n, j + kBlock);
    for (; j < e; ++j)
      if (p[j] > thr) {
        insert(j);
        thr = p[idx[m - 1]];
      }
  }
}

}  // namespace


namespace {
// p·(ln p − ln max(p̂, floor)) summed in index order, one log per term: the ratio stays finite (p ≤ 1,
// floor 1e-30).
template <typename Scalar>
double kl_scalar(const Scalar* p, const Scalar* ph, int64_t n) {
  double kl = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double pj = p[j];
    if (pj > 0) kl += pj * std::log(pj / std::max(static_cast<double>(ph[j]), kKlProbFloor));
  }
  return kl;
}

#ifdef LQ_VEC_MATH

// The same terms four at a time (float → double exactly, IEEE division, libmvec log, mul, masked add
// to four partial sums), the tail and the final sum of the lanes in index order.
__attribute__((target("avx2"))) double kl_avx2(const float* p, const float* ph, int64_t n) {
  const __m256d floor = _mm256_set1_pd(kKlProbFloor), zero = _mm256_setzero_pd();
  __m256d acc = zero;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const __m256d pj = _mm256_cvtps_pd(_mm_loadu_ps(p + j));
    const __m256d qj = _mm256_max_pd(_mm256_cvtps_pd(_mm_loadu_ps(ph + j)), floor);
    const __m256d t = _mm256_mul_pd(pj, _ZGVdN4v_log(_mm256_div_pd(pj, qj)));
    acc = _mm256_add_pd(acc, _mm256_and_pd(t, _mm256_cmp_pd(pj, zero, _CMP_GT_OQ)));
  }
  alignas(32) double lane[4];
  _mm256_store_pd(lane, acc);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + kl_scalar(p + j, ph + j, n - j);
}
#endif
}  // namespace

template <typename Scalar>
double kl_row(std::span<const Scalar> p, std::span<const Scalar> p_hat) {
  if (p.size() != p_hat.size())
    throw std::invalid_argument("kl_row: p has " + sz(static_cast<int64_t>(p.size())) + " keys, p_hat " +
                                sz(static_cast<int64_t>(p_hat.size())));
  const int64_t n = static_cast<int64_t>(p.size());
#ifdef LQ_VEC_MATH
  if constexpr (std::is_same_v<Scalar, float>)
    if (active_cpu_kernel() == CpuKernel::Avx2) return kl_avx2(p.data(), p_hat.data(), n);
#endif
  return kl_scalar(p.data(), p_hat.data(), n);
}

template double kl_row<float>(std::span<const float>, std::span<const float>);
template double kl_row<double>(std::span<const double>, std::span<const double>);

namespace {

// `prepared`: the reference's top-m indices ([Tq, H, 8], AttentionReference), its finiteness already
// checked; null: both computed here. `test_checked`: the test is known finite (a result of run() or
// run_mixed(), which check it; decode_order_attention scores one test over many row buckets).
template <typename Scalar>
AttentionError error_over_rows(const AttentionResult<Scalar>& ref, const AttentionResult<Scalar>& test,
                               std::span<const int64_t> rows, const char* what, const int64_t* prepared = nullptr,
                               bool test_checked = false) {
  if (ref.num_queries != test.num_queries || ref.num_heads != test.num_heads || ref.v_head_dim != test.v_head_dim ||
      ref.out.size() != test.out.size() || ref.nkeys != test.nkeys)
    throw std::invalid_argument(std::string(what) + ": the two results differ in shape (Tq " + sz(ref.num_queries) +
                                " vs " + sz(test.num_queries) + ", H " + sz(ref.num_heads) + " vs " +
                                sz(test.num_heads) + ", v " + sz(ref.v_head_dim) + " vs " + sz(test.v_head_dim) +
                                ") or in their key counts");
  if (ref.probs.size() != static_cast<size_t>(ref.prob_offsets.back()) ||
      test.probs.size() != static_cast<size_t>(test.prob_offsets.back()))
    throw std::invalid_argument(std::string(what) + ": both results need their probabilities (run with keep_probs = true)");
  const int64_t Tq = ref.num_queries, H = ref.num_heads, v = ref.v_head_dim;
  if (Tq < 1) throw std::invalid_argument(std::string(what) + ": no query rows");
  if (rows.empty()) throw std::invalid_argument(std::string(what) + ": no query rows selected");
  for (const int64_t i : rows)
    if (i < 0 || i >= Tq)
      throw std::invalid_argument(std::string(what) + ": query row " + sz(i) + " outside [0, Tq = " + sz(Tq) + ")");
  if (!prepared) require_finite_result(ref, (std::string(what) + ": the reference").c_str());
  if (!test_checked) require_finite_result(test, (std::string(what) + ": the test").c_str());
  double err2 = 0, ref2 = 0, cos_sum = 0, kl_sum = 0, top1 = 0, top8 = 0;
  for (const int64_t i : rows) {
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
      cos_sum += pair_cos(dot, na, nb, equal);

      const auto p = ref.prob(i, h), ph = test.prob(i, h);
      const int64_t n = ref.nkeys[i];
      kl_sum += kl_row<Scalar>(p.first(n), ph.first(n));
      const int64_t m = std::min<int64_t>(8, n);
      int64_t own[8], tph[8];
      const int64_t* tp = prepared ? prepared + (i * H + h) * 8 : own;
      if (!prepared) top_m(p, m, own);
      top_m(ph, m, tph);
      top1 += tp[0] == tph[0] ? 1.0 : 0.0;
      int64_t common = 0;
      for (int64_t a2 = 0; a2 < m; ++a2)
        for (int64_t b2 = 0; b2 < m; ++b2) common += tp[a2] == tph[b2] ? 1 : 0;
      top8 += static_cast<double>(common) / static_cast<double>(m);
    }
  }
  return finish_error(err2, ref2, cos_sum, kl_sum, top1, top8, static_cast<double>(static_cast<int64_t>(rows.size()) * H));
}

}  // namespace

template <typename Scalar>
AttentionError attention_error(const AttentionResult<Scalar>& ref, const AttentionResult<Scalar>& test) {
  std::vector<int64_t> rows(static_cast<size_t>(std::max<int64_t>(ref.num_queries, 0)));
  std::iota(rows.begin(), rows.end(), int64_t{0});
  if (rows.empty()) rows.push_back(0);  // error_over_rows reports "no query rows" (or the shape mismatch) first
  return error_over_rows(ref, test, rows, "attention_error");
}

template <typename Scalar>
AttentionError attention_error_rows(const AttentionResult<Scalar>& ref, const AttentionResult<Scalar>& test,
                                    std::span<const int64_t> rows) {
  return error_over_rows(ref, test, rows, "attention_error_rows");
}

template <typename Scalar>
AttentionReference<Scalar>::AttentionReference(const AttentionResult<Scalar>& ref) : ref_(&ref) {
  const int64_t Tq = ref.num_queries, H = ref.num_heads;
  if (Tq < 0 || H < 0 || static_cast<int64_t>(ref.nkeys.size()) != Tq ||
      static_cast<int64_t>(ref.prob_offsets.size()) != Tq + 1)
    throw std::invalid_argument("attention reference: " + sz(static_cast<int64_t>(ref.nkeys.size())) +
                                " key counts and " + sz(static_cast<int64_t>(ref.prob_offsets.size())) +
                                " probability offsets for Tq = " + sz(Tq) + " query rows (expected Tq and Tq + 1)");
  if (ref.probs.size() != static_cast<size_t>(ref.prob_offsets.back()))
    throw std::invalid_argument("attention reference: the result needs its probabilities (run with keep_probs = true)");
  for (int64_t i = 0; i < Tq; ++i)
    if (ref.nkeys[i] < 0 || ref.prob_offsets[i + 1] - ref.prob_offsets[i] != H * ref.nkeys[i])
      throw std::invalid_argument("attention reference: query row " + sz(i) + " has " +
                                  sz(ref.prob_offsets[i + 1] - ref.prob_offsets[i]) + " probabilities, expected H · nkeys = " +
                                  sz(H) + " · " + sz(ref.nkeys[i]));
  require_finite_result(ref, "attention reference");
  top_.assign(static_cast<size_t>(std::max<int64_t>(Tq, 0) * H * 8), -1);
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t h = 0; h < H; ++h) top_m(ref.prob(i, h), std::min<int64_t>(8, ref.nkeys[i]), top_.data() + (i * H + h) * 8);
}

template <typename Scalar>
AttentionError attention_error(const AttentionReference<Scalar>& ref, const AttentionResult<Scalar>& test) {
  std::vector<int64_t> rows(static_cast<size_t>(std::max<int64_t>(ref.result().num_queries, 0)));
  std::iota(rows.begin(), rows.end(), int64_t{0});
  if (rows.empty()) rows.push_back(0);
  return error_over_rows(ref.result(), test, rows, "attention_error", ref.top_indices());
}

template <typename Scalar>
AttentionError attention_error_rows(const AttentionReference<Scalar>& ref, const AttentionResult<Scalar>& test,
                                    std::span<const int64_t> rows) {
  return error_over_rows(ref.result(), test, rows, "attention_error_rows", ref.top_indices());
}

// ---- decode order (issue 12) -------------------------------------------------------------------

std::vector<KeyRange> decode_order_ranges(const DecodeOrder& order, std::span<const int64_t> positions, int64_t G) {
  if (G < 1) throw std::invalid_argument("decode_order_ranges: token group G = " + sz(G) + " < 1");
  std::vector<KeyRange> out;
  out.reserve(positions.size());
  for (const int64_t t : positions) {
    if (t < 0) throw std::invalid_argument("decode_order_ranges: negative position " + sz(t));
    // Key by key with the one rule; the quantized keys must form one range.
    KeyRange k{0, 0};
    bool seen = false, closed = false;
    for (int64_t j = 0; j <= t; ++j) {
      const bool q = order.reads_quantized(t, j, G);
      if (q && closed)
        throw std::logic_error("decode_order_ranges: " + order.label() + " reads the keys of position " + sz(t) +
                               " quantized in more than one range");
      if (q && !seen) k = {j, j + 1}, seen = true;
      else if (q) k.end = j + 1;
      else if (seen) closed = true;
    }
    out.push_back(k);
  }
  return out;
}

namespace {
// decode_order_attention on the CPU (ref: the prepared reference) or, ref null, on att's device against the
// reference kept there (each order's errors from one evaluation's per-pair terms, summed per bucket).
std::vector<DecodeOrderError> decode_order_impl(const AbsorbedAttention<float>& att, const AttentionReference<float>* ref,
                                                const DecodeOrderInput& in, const DecodeOrderQuantizer& q,
                                                std::span<const DecodeOrder> orders, int64_t bucket) {
  const char* what = "decode-order attention";
  if (!ref && !(att.device_computes_errors() && att.device_runs_mixed()))
    throw std::logic_error(std::string(what) + ": no reference, and no device that computes attention_error's terms of "
                           "mixed caches attached");
  if (bucket < 1) throw std::invalid_argument(std::string(what) + ": position bucket " + sz(bucket) + " < 1");
  if (!q.c_kv && !q.k_pe) throw std::invalid_argument(std::string(what) + ": neither c_kv nor k_pe is quantized");
  const MlaDims& d = att.dims();
  const int64_t r = d.kv_lora_rank, rope = d.qk_rope_head_dim, Tq = att.num_queries();
  const int64_t T = static_cast<int64_t>(in.positions.size());
  check_size(in.c_kv.size(), T * r, "c_kv", "[T, kv_lora_rank] (T from positions)");
  check_size(in.k_pe.size(), T * rope, "k_pe", "[T, qk_rope_head_dim] (T from positions)");
  check_size(in.q_rows.size(), Tq, "q_rows", "[Tq] of the attention");
  validate_seq_offsets(in.seq_offsets, T, "decode-order attention: seq_offsets");
  // Each row's position in its sequence (the dump's /positions) must be the key index the attention uses.
  std::vector<int64_t> pos(static_cast<size_t>(Tq));
  for (int64_t i = 0; i < Tq; ++i) {
    const int64_t tok = in.q_rows[i];
    if (tok < 0 || tok >= T)
      throw std::invalid_argument(std::string(what) + ": q_rows[" + sz(i) + "] = " + sz(tok) + " outside [0, T = " + sz(T) + ")");
    pos[i] = in.positions[tok];
    if (pos[i] != att.nkeys(i) - 1)
      throw std::invalid_argument(std::string(what) + ": /positions[" + sz(tok) + "] = " + sz(pos[i]) + " for query row " +
                                  sz(i) + ", but the row is key " + sz(att.nkeys(i) - 1) +
                                  " of its sequence (positions must count from each sequence's start)");
  }
  for (const DecodeOrder& o : orders) o.validate();

  // The bf16 reads, and the quantized caches (one per distinct sink: the contents do not depend on R or P).
  std::vector<float> bc(in.c_kv.size()), bk(in.k_pe.size());
  round_bf16(in.c_kv.data(), static_cast<int64_t>(bc.size()), bc.data());
  round_bf16(in.k_pe.data(), static_cast<int64_t>(bk.size()), bk.data());
  const Rotation identity;
  struct Quantized {
    std::vector<float> c, k;  // empty: that target reads bf16
    double bpt_c = 0, bpt_k = 0;
  };
  std::map<int64_t, Quantized> caches;  // key: the sink (0 for prefill-at-once: the same contents)
  const auto quantized_for = [&](const DecodeOrder& o) -> const Quantized& {
    const int64_t key = o.at_once() ? 0 : o.sink;
    auto it = caches.find(key);
    if (it != caches.end()) return it->second;
    Quantized Qz;
    const auto one = [&](bool on, Target t, std::span<const float> X, int64_t D, const Rotation* rot,
                         std::vector<float>& out, double& bpt) {
      bpt = 2.0 * static_cast<double>(D);
      if (!on || D == 0) return;
      out.resize(X.size());
      const QuantizedTensor qt = decode_order_quantize(q.spec, rot ? *rot : identity, t, X.data(), T, D, in.seq_offsets,
                                                       o, out.data());
      bpt = qt.rows > 0 ? account(qt).bytes_per_token : 0.0;
    };
    one(q.c_kv, Target::CKV, in.c_kv, r, q.r_ckv, Qz.c, Qz.bpt_c);
    one(q.k_pe, Target::KPE, in.k_pe, rope, q.r_kpe, Qz.k, Qz.bpt_k);
    return caches.emplace(key, std::move(Qz)).first->second;
  };
  const int64_t G_c = decode_token_group(q.spec.stored_for(Target::CKV));
  const int64_t G_k = decode_token_group(q.spec.stored_for(Target::KPE));

  // Buckets of rows by position.
  std::map<int64_t, std::vector<int64_t>> rows_of;
  for (int64_t i = 0; i < Tq; ++i) rows_of[pos[i] / bucket].push_back(i);

  std::vector<DecodeOrderError> out;
  for (const DecodeOrder& o : orders) {
    const Quantized& Qz = quantized_for(o);
    const bool qc = !Qz.c.empty(), qk = !Qz.k.empty();
    std::vector<KeyRange> rc, rk;
    if (qc) rc = decode_order_ranges(o, pos, G_c);
    if (qk) rk = decode_order_ranges(o, pos, G_k);
    // A target read in bf16 everywhere has store A = store B: any range gives the same values; the other
    // target's ranges let a chunk read one store only.
    if (!qc) rc = qk ? rk : std::vector<KeyRange>(static_cast<size_t>(Tq));
    if (!qk) rk = rc;
    const MixedCache m{qc ? std::span<const float>(Qz.c) : std::span<const float>(bc),
                       qk ? std::span<const float>(Qz.k) : std::span<const float>(bk),
                       bc, bk, rc, rk};
    // CPU: run_mixed()'s result (checked finite there: not again for each bucket); device: its terms.
    std::optional<AttentionResult<float>> test;
    std::vector<AttentionPairTerms> terms;
    if (ref) test.emplace(att.run_mixed(m, true));
    else terms = att.device_error_terms(m);

    DecodeOrderError e;
    e.order = o;
    const std::vector<KeyRange>& primary = qc ? rc : rk;
    for (const auto& [b, rows] : rows_of) {
      PositionBucketError pb;
      pb.pos_start = b * bucket;
      pb.pos_end = (b + 1) * bucket;
      pb.queries = static_cast<int64_t>(rows.size());
      double frac = 0;
      for (const int64_t i : rows) {
        const KeyRange k = clip_range(primary[i], att.nkeys(i));
        frac += static_cast<double>(k.end - k.begin) / static_cast<double>(att.nkeys(i));
      }
      pb.quantized_key_frac = frac / static_cast<double>(rows.size());
      const AttentionError x =
          ref ? error_over_rows(ref->result(), *test, rows, "attention_error_rows", ref->top_indices(), true)
              : att.error_from_terms(terms, rows);
      pb.kl_mean = x.kl_mean;
      pb.out_rel_fro = x.out_rel_fro;
      e.buckets.push_back(pb);
    }
    // Bytes at each sequence's end.
    double bytes = 0;
    for (size_t s = 0; s + 1 < in.seq_offsets.size(); ++s) {
      const int64_t L = in.seq_offsets[s + 1] - in.seq_offsets[s];
      const auto part = [&](bool on, int64_t G, int64_t D, double bpt) {
        if (!on) return static_cast<double>(L) * 2.0 * static_cast<double>(D);
        const DecodeCacheTokens c = decode_cache_tokens(o, L, G);
        return static_cast<double>(c.bf16_tokens) * 2.0 * static_cast<double>(D) +
               static_cast<double>(c.quantized_tokens) * bpt;
      };
      bytes += part(qc, G_c, r, Qz.bpt_c) + part(qk, G_k, rope, Qz.bpt_k);
    }
    e.bytes_per_token = bytes / static_cast<double>(T);
    out.push_back(std::move(e));
  }
  return out;
}
}  // namespace

std::vector<DecodeOrderError> decode_order_attention(const AbsorbedAttention<float>& att, const AttentionReference<float>& ref,
                                                     const DecodeOrderInput& in, const DecodeOrderQuantizer& q,
                                                     std::span<const DecodeOrder> orders, int64_t bucket) {
  return decode_order_impl(att, &ref, in, q, orders, bucket);
}

std::vector<DecodeOrderError> decode_order_attention(const AbsorbedAttention<float>& att, const DecodeOrderInput& in,
                                                     const DecodeOrderQuantizer& q, std::span<const DecodeOrder> orders,
                                                     int64_t bucket) {
  return decode_order_impl(att, nullptr, in, q, orders, bucket);
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
template class AttentionReference<float>;
template class AttentionReference<double>;
template AttentionError attention_error<float>(const AttentionReference<float>&, const AttentionResult<float>&);
template AttentionError attention_error<double>(const AttentionReference<double>&, const AttentionResult<double>&);
template AttentionError attention_error_rows<float>(const AttentionReference<float>&, const AttentionResult<float>&,
                                                    std::span<const int64_t>);
template AttentionError attention_error_rows<double>(const AttentionReference<double>&, const AttentionResult<double>&,
                                                     std::span<const int64_t>);
template AttentionError attention_error<float>(const AttentionResult<float>&, const AttentionResult<float>&);
template AttentionError attention_error<double>(const AttentionResult<double>&, const AttentionResult<double>&);
template AttentionError attention_error_rows<float>(const AttentionResult<float>&, const AttentionResult<float>&,
                                                    std::span<const int64_t>);
template AttentionError attention_error_rows<double>(const AttentionResult<double>&, const AttentionResult<double>&,
                                                     std::span<const int64_t>);

}  // namespace latentq::probes
