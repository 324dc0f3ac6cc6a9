// The device seam of the absorbed attention: AbsorbedAttention's members that evaluate on an attached
// AttentionDevice (attach_device, the sorted layout and its segments, the results and error terms a device
// returns, reordered to q_rows order and checked finite) and AttentionDevice's defaults. The CPU engine is
// engine.cpp.
#include <algorithm>
#include <memory>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "internal.h"
#include "latentq/attention/engine.h"

namespace latentq::probes {

using namespace attention_detail;

namespace {

// GEMM rows (query rows × heads) per device segment by default (attach_device): large enough for a GPU's
// GEMM, small enough that a sequence's rows split into segments whose keys follow the causal triangle.
constexpr int64_t kDeviceSegmentGemmRows = 4096;

}  // namespace

template <typename Scalar>
void AbsorbedAttention<Scalar>::attach_device(const AttentionDeviceFactory& make, int64_t segment_rows) {
  if constexpr (!std::is_same_v<Scalar, float>) {
    (void)make, (void)segment_rows;
    throw std::logic_error("attention: attach_device: the device path is float32 only");
  } else {
    if (segment_rows < 0)
      throw std::invalid_argument("attention: attach_device: segment_rows " + sz(segment_rows) + " < 0");
    if (!selection_.empty())
      throw std::invalid_argument(
          "attention: attach_device: the device attention reads every key of the causal window; a sparse "
          "selection (DeepSeek Sparse Attention) runs on the CPU (--device cpu)");
    const int64_t rows =
        segment_rows > 0 ? segment_rows : std::max<int64_t>(1, kDeviceSegmentGemmRows / dims_.num_heads);
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
      throw std::logic_error(
          "attention: keep_device_reference: no device that computes attention_error's terms is attached");
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
  for (int64_t p = 0; p < Tq; ++p) std::copy_n(out.data() + p * H * v, H * v, res.out.data() + order_[p] * H * v);
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
    throw std::logic_error(
        "attention: device_error: no reference kept on a device that computes attention_error's "
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
      throw std::invalid_argument("attention: error_from_terms: query row " + sz(i) + " outside [0, Tq = " + sz(Tq) +
                                  ")");
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
  return finish_error(err2, ref2, cos_sum, kl_sum, top1, top8,
                      static_cast<double>(static_cast<int64_t>(rows.size()) * H));
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

// The device members for both precisions (the CPU members and the class: engine.cpp); Scalar = double
// throws std::logic_error where a device would be needed.
template void AbsorbedAttention<float>::attach_device(const AttentionDeviceFactory&, int64_t);
template void AbsorbedAttention<double>::attach_device(const AttentionDeviceFactory&, int64_t);
template AttentionResult<float> AbsorbedAttention<float>::keep_device_reference(std::span<const float>,
                                                                                std::span<const float>);
template AttentionResult<double> AbsorbedAttention<double>::keep_device_reference(std::span<const float>,
                                                                                  std::span<const float>);
template AttentionResult<float> AbsorbedAttention<float>::run_device(std::span<const float>, std::span<const float>,
                                                                     bool) const;
template AttentionResult<double> AbsorbedAttention<double>::run_device(std::span<const float>, std::span<const float>,
                                                                       bool) const;
template std::vector<int64_t> AbsorbedAttention<float>::mixed_ranges_sorted(const MixedCache&) const;
template std::vector<int64_t> AbsorbedAttention<double>::mixed_ranges_sorted(const MixedCache&) const;
template std::vector<AttentionPairTerms> AbsorbedAttention<float>::device_terms_impl(std::span<const float>,
                                                                                     std::span<const float>,
                                                                                     const MixedCache*) const;
template std::vector<AttentionPairTerms> AbsorbedAttention<double>::device_terms_impl(std::span<const float>,
                                                                                      std::span<const float>,
                                                                                      const MixedCache*) const;
template std::vector<AttentionPairTerms> AbsorbedAttention<float>::device_error_terms(std::span<const float>,
                                                                                      std::span<const float>) const;
template std::vector<AttentionPairTerms> AbsorbedAttention<double>::device_error_terms(std::span<const float>,
                                                                                       std::span<const float>) const;
template std::vector<AttentionPairTerms> AbsorbedAttention<float>::device_error_terms(const MixedCache&) const;
template std::vector<AttentionPairTerms> AbsorbedAttention<double>::device_error_terms(const MixedCache&) const;
template AttentionError AbsorbedAttention<float>::error_from_terms(std::span<const AttentionPairTerms>,
                                                                   std::span<const int64_t>) const;
template AttentionError AbsorbedAttention<double>::error_from_terms(std::span<const AttentionPairTerms>,
                                                                    std::span<const int64_t>) const;
template AttentionError AbsorbedAttention<float>::device_error(std::span<const float>, std::span<const float>) const;
template AttentionError AbsorbedAttention<double>::device_error(std::span<const float>, std::span<const float>) const;
template AttentionResult<float> AbsorbedAttention<float>::run_mixed_device(const MixedCache&, bool) const;
template AttentionResult<double> AbsorbedAttention<double>::run_mixed_device(const MixedCache&, bool) const;

}  // namespace latentq::probes
