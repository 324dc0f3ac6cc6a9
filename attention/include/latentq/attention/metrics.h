// latentq/attention/metrics.h — the errors of one attention result against another: output rel_fro and
// cosine, KL of the probabilities, top-1 / top-8 agreement (AttentionError), a device's per-pair terms of
// them, and the prepared reference the study shares per layer (latentq/attention/attention.h includes it).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "latentq/attention/types.h"

namespace latentq::probes {

/// Errors of a run on quantized/pruned latents (test) against the run on exact latents (ref), same
/// queries. All accumulated in float64; "rows×heads" means the Tq·H (query row, head) pairs.
struct AttentionError {
  double out_rel_fro = 0;  ///< ‖out̂ − out‖_F / ‖out‖_F over all [Tq, H, v] (0 if both 0, inf if only out is 0)
  double cos_mean = 0;     ///< mean over rows×heads of cos(out̂[i,h,:], out[i,h,:]); a pair where either
                           ///< norm is 0 counts 1 if the vectors are equal, else 0 (as latentq/metrics.h)
  double kl_mean = 0;      ///< mean over rows×heads of KL(p ‖ p̂) = Σ_j p_j (ln p_j − ln max(p̂_j, 1e-30)),
                           ///< natural log (nats); terms with p_j = 0 contribute 0; the 1e-30 floor keeps
                           ///< a key that underflowed to 0 in p̂ finite (≈ 69 nats per unit of p); rounding
                           ///< of p, p̂ (each sums to 1 only up to rounding) can leave it ~1e-9 below 0
  double top1_agree = 0;  ///< fraction of rows×heads where argmax p == argmax p̂ (ties → lowest key index)
  double top8_agree = 0;  ///< mean of |topm(p) ∩ topm(p̂)| / m, m = min(8, nkeys) (ties → lowest index)
};

/// One (query row, head) pair's terms of attention_error, as a device that computes them returns them
/// (AttentionDevice::error_terms): float64 sums over the pair's keys and its v_head_dim outputs, a = the
/// reference, b = the test. AbsorbedAttention::device_error() sums them in attention_error's order.
struct AttentionPairTerms {
  double kl = 0;                ///< Σ_j p_j·ln(p_j / max(p̂_j, kKlProbFloor)) over the row's keys with p_j > 0
  double dot = 0;               ///< Σ a·b
  double ref2 = 0;              ///< Σ a²
  double test2 = 0;             ///< Σ b²
  double err2 = 0;              ///< Σ (b − a)²
  bool equal = false;           ///< a == b element for element
  bool top1 = false;            ///< the keys of largest probability agree (ties: the lower key index)
  int32_t top_common = 0;       ///< |top-m(p) ∩ top-m(p̂)|, m = min(8, nkeys) (ties: the lower key index)
  int64_t nonfinite_probs = 0;  ///< NaN/Inf among the test's probabilities of the pair's keys
  int64_t nonfinite_out = 0;    ///< NaN/Inf among the test's outputs of the pair
};

/// Throws std::invalid_argument if the two results differ in shape or nkeys, either lacks probs, or
/// either has a NaN/Inf output or probability: no metric is computed from a non-finite reference (a
/// NaN reference would otherwise score as a perfect row: out_rel_fro 0, KL 0, top-1 1).
template <typename Scalar>
AttentionError attention_error(const AttentionResult<Scalar>& ref, const AttentionResult<Scalar>& test);

/// attention_error over the query rows `rows` only (indices into q_rows order, each < Tq; duplicates
/// count twice): means over those rows × heads, out_rel_fro over their outputs. Same checks as
/// attention_error (the whole results must be finite), and std::invalid_argument for an empty `rows` or
/// an index outside [0, Tq).
template <typename Scalar>
AttentionError attention_error_rows(const AttentionResult<Scalar>& ref, const AttentionResult<Scalar>& test,
                                    std::span<const int64_t> rows);

/// The reference side of attention_error, prepared once and shared by every result scored against it
/// (the study: one per layer, for all quantizers and decode orders): the reference checked to have its
/// probabilities and to be finite, and per (query row, head) the indices of its m = min(8, nkeys) largest
/// probabilities (ties → lowest index), which top1_agree/top8_agree compare with. Keeps a pointer to
/// `ref`, which must outlive it. Throws std::invalid_argument if `ref`'s key counts or offsets do not
/// match its Tq, or it lacks probabilities, or has a NaN/Inf output or probability. attention_error(prepared, test)
/// equals attention_error(ref, test) bit for bit.
template <typename Scalar>
class AttentionReference {
 public:
  explicit AttentionReference(const AttentionResult<Scalar>& ref);
  AttentionReference(AttentionResult<Scalar>&&) = delete;  // would point at a temporary
  const AttentionResult<Scalar>& result() const { return *ref_; }
  /// [Tq, H, 8] row-major: row i, head h's top-m key indices in descending order of probability (−1 past m).
  const int64_t* top_indices() const { return top_.data(); }

 private:
  const AttentionResult<Scalar>* ref_;
  std::vector<int64_t> top_;
};

/// attention_error / attention_error_rows against a prepared reference (same values, same errors for
/// the test; the reference's were raised by its constructor).
template <typename Scalar>
AttentionError attention_error(const AttentionReference<Scalar>& ref, const AttentionResult<Scalar>& test);
template <typename Scalar>
AttentionError attention_error_rows(const AttentionReference<Scalar>& ref, const AttentionResult<Scalar>& test,
                                    std::span<const int64_t> rows);

/// The KL floor used by attention_error.
inline constexpr double kKlProbFloor = 1e-30;

/// KL(p ‖ p̂) of one probability row ([nkeys] each) as attention_error sums it, in float64 (nats):
/// Σ_{j: p_j > 0} p_j · ln(p_j / max(p̂_j, kKlProbFloor)). Float rows under the AVX2 CPU kernel
/// (latentq/quantize.h set_cpu_kernel; the default on CPUs with AVX2) take four terms at a time with
/// glibc's vector log (libmvec `_ZGVdN4v_log`, within 4 ulp of log) into four partial sums; otherwise
/// (double rows, the Baseline or Reference kernel) the terms are summed in index order with std::log.
/// The two agree to ~1e-13 relative (test), so KL's last bits depend on the kernel, as the GEMMs'
/// depend on the BLAS kernel. Throws std::invalid_argument if the sizes differ.
template <typename Scalar>
double kl_row(std::span<const Scalar> p, std::span<const Scalar> p_hat);

}  // namespace latentq::probes
