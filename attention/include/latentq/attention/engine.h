// latentq/attention/engine.h — the absorbed MLA attention for one layer, and its device seam.
//
// Source of the math: DeepSeek-V3 inference/model.py, MLA.forward, attn_impl == "absorb":
//   q_lat  = einsum("shd,hdc->shc", q_nope, W_UK)                      [Tq, H, r]
//   scores = (einsum("shc,tc->sht", q_lat, c_kv) + einsum("shr,tr->sht", q_pe, k_pe)) · softmax_scale
//   p      = softmax(scores) over the keys, in the working precision, max-subtracted
//   o_lat  = einsum("sht,tc->shc", p, c_kv)
//   out    = einsum("shc,hdc->shd", o_lat, W_UV)                       [Tq, H, v]
// and the unabsorbed ("naive") path: k_nope = W_UK·c_kv and v = W_UV·c_kv per head, K = [k_nope ; k_pe],
// standard attention. Both give the same output up to rounding.
//
// Keys: a query row i sits at token t = q_rows[i] of sequence s (seq_offsets[s] ≤ t < seq_offsets[s+1]);
// its keys are the tokens seq_offsets[s] .. t (causal within the sequence): nkeys = t − seq_offsets[s] + 1.
//
// Precision: Scalar = float computes everything in float32 with float32 accumulation (BLAS sgemm,
// latentq/analysis/gemm.h), as a GPU kernel would; Scalar = double computes everything in float64 (for tight
// tests). Inputs are float32 either way. In the float path q_lat is rounded to float32 once (it is precomputed).
//
// Cost: the per-layer part that does not depend on the latents (q_lat, the row ordering) is done once
// by AbsorbedAttention's constructor; run() then does two GEMMs per chunk of ≤ 8 query rows of one
// sequence (all heads stacked), over that chunk's causal key range; chunks run in parallel (OpenMP).
//
// The types are latentq/attention/types.h, the metrics latentq/attention/metrics.h; latentq/attention/attention.h
// includes them all.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <Eigen/Dense>

#include "latentq/attention/device_seam.h"
#include "latentq/attention/metrics.h"
#include "latentq/attention/types.h"

namespace latentq::probes {

/// Evaluates AbsorbedAttention<float>::run for one layer on a device: the study's CUDA backend implements
/// it with latentq::DeviceAbsorbedAttention (kernels/include/latentq/attention_cuda.h: cuBLAS sgemm and a
/// softmax kernel). Must be thread-safe.
class AttentionDevice {
 public:
  virtual ~AttentionDevice() = default;
  /// c_kv [T, kv_lora_rank], k_pe [T, qk_rope_head_dim] (row-major float32 host arrays) → out_sorted
  /// [Tq, H, v_head_dim] by sorted row; probs (null: not wanted) ← every segment's probabilities in order,
  /// each [(end − begin)·H, nk] row-major, zeros past a row's nkeys. Throws std::runtime_error on a device
  /// failure.
  virtual void run(const float* c_kv, const float* k_pe, float* out_sorted, float* probs) const = 0;
  /// Whether keep_reference() and error_terms() are implemented: attention_error computed where the
  /// probabilities are, so that they never come back (AbsorbedAttention::device_error). Default false.
  virtual bool computes_error_terms() const { return false; }
  /// Evaluates c_kv, k_pe as run() and keeps the result on the device as the reference of error_terms()
  /// (replacing an earlier one); out_sorted as run(). Default: throws std::logic_error.
  virtual void keep_reference(const float* c_kv, const float* k_pe, float* out_sorted) const;
  /// Evaluates c_kv, k_pe as run() and writes terms [Tq·H] (by sorted row p·H + h) against the kept
  /// reference. Default: throws std::logic_error; std::logic_error also when no reference was kept.
  virtual void error_terms(const float* c_kv, const float* k_pe, AttentionPairTerms* terms) const;
  /// Whether run_mixed() and error_terms_mixed() are implemented (AbsorbedAttention::run_mixed on the device).
  /// Default false.
  virtual bool runs_mixed() const { return false; }
  /// run() over a cache mixed per (row, key) from two stores (MixedCache): A = c_kv_a, k_pe_a; B = c_kv_b,
  /// k_pe_b (each [T, ·] row-major float32 host arrays); ranges [Tq, 4] by sorted row: the row reads keys
  /// [ranges[4p], ranges[4p + 1]) of c_kv and [ranges[4p + 2], ranges[4p + 3]) of k_pe from A (clipped to the
  /// row's keys), the others from B. out_sorted, probs as run(). Default: throws std::logic_error.
  virtual void run_mixed(const float* c_kv_a, const float* k_pe_a, const float* c_kv_b, const float* k_pe_b,
                         const int64_t* ranges, float* out_sorted, float* probs) const;
  /// error_terms() of that mixed cache against the kept reference. Default: throws std::logic_error.
  virtual void error_terms_mixed(const float* c_kv_a, const float* k_pe_a, const float* c_kv_b, const float* k_pe_b,
                                 const int64_t* ranges, AttentionPairTerms* terms) const;
};
// AttentionDeviceFactory: latentq/attention/device_seam.h.

/// Absorbed attention for one layer with its queries fixed: construct once per layer, run() once per
/// latent variant (exact, quantized, SVD-pruned).
template <typename Scalar>
class AbsorbedAttention {
 public:
  /// Validates and precomputes q_lat. Throws std::invalid_argument for dims < 1 (H, r, nope, v; rope
  /// may be 0), span sizes that do not match dims/Tq, bad seq_offsets, a q_row outside [0, T),
  /// NaN/Inf in q_nope/q_pe/W_UK/W_UV, a softmax_scale that is not finite and > 0, or one that does not
  /// survive the conversion to Scalar (latentq/analysis/narrow.h: 1e300 is inf, 1e-50 is 0 in float32), and a
  /// sparse selection (AttentionQueries::selected_*) that is not Tq + 1 offsets over ascending keys of each
  /// row's causal window, at least one per row. With a selection every run reads only the selected keys.
  explicit AbsorbedAttention(const AttentionQueries& q);

  /// Attention over the cache c_kv [T, kv_lora_rank], k_pe [T, qk_rope_head_dim] (row-major float32).
  /// keep_probs stores the attention probabilities (needed by attention_error).
  /// Throws std::invalid_argument for wrong sizes or NaN/Inf in c_kv / k_pe (with the count), and when
  /// the result itself has NaN/Inf (scores or outputs that overflow Scalar; with the counts): a
  /// returned result is always finite.
  AttentionResult<Scalar> run(std::span<const float> c_kv, std::span<const float> k_pe, bool keep_probs = false) const;

  /// Attention over a cache mixed per (query row, key) from two stores (MixedCache). When every range
  /// covers all of its row's keys this is run(c_kv_a, k_pe_a) (the same float operations, the same
  /// values); when none covers any key it is run(c_kv_b, k_pe_b). Keys read from both stores cost two
  /// score GEMMs and two output GEMMs per chunk. Throws as run() for each store, and
  /// std::invalid_argument when a range span does not hold Tq entries.
  AttentionResult<Scalar> run_mixed(const MixedCache& cache, bool keep_probs = false) const;

  /// The c_kv partial scores q_lat·c_kvᵀ of one store, per GEMM chunk (ckv_scores()); reused by run_variants
  /// for every variant that reads that store. Memory: Σ over chunks of (rows·H) × (the chunk's keys) Scalars.
  struct CkvScores {
    std::vector<Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> chunks;
    const float* store = nullptr;  ///< the c_kv they were computed from
  };
  /// Computes the partial scores of c_kv [T, kv_lora_rank] (a store many runs read, e.g. bf16(c_kv) for
  /// the cells that quantize k_pe only). Throws as run() for a wrong size or NaN/Inf.
  CkvScores ckv_scores(std::span<const float> c_kv) const;

  /// One latent variant of run_variants: the c_kv and k_pe it reads, and optionally the partial scores of
  /// its c_kv (ckv_scores() of the same store).
  struct Variant {
    std::span<const float> c_kv, k_pe;
    const CkvScores* scores = nullptr;
  };
  /// run() of each variant, sharing work between them: variants that read the same c_kv store (same data
  /// pointer) share its partial scores q_lat·c_kvᵀ (each keeps its own output GEMM, of run()'s shape: a
  /// variant's bits do not depend on which others it runs with); variants that read the
  /// same k_pe share q_pe·k_peᵀ. E.g. the three /attention_error cells of one quantizer (c_kv quantized +
  /// k_pe bf16, c_kv bf16 + k_pe quantized, both quantized) cost two score and three output GEMMs instead
  /// of six, one score GEMM fewer with the bf16 c_kv's partial scores given. The scores are summed as
  /// q_lat·c_kvᵀ + q_pe·k_peᵀ of separate GEMMs (run() accumulates the second into the first): values
  /// equal run()'s to float32 rounding (tests: out rel_fro ≤ 1e-6). Throws as run() for each variant, and
  /// std::invalid_argument for scores computed from another store.
  std::vector<AttentionResult<Scalar>> run_variants(std::span<const Variant> variants, bool keep_probs = false) const;

  /// From now on run() and run_variants() evaluate on the device that `make` returns (called once, here,
  /// with this layer's AttentionLayout), and run_mixed() too where the device runs mixed caches
  /// (device_runs_mixed); ckv_scores() and run_on_cpu() stay on the CPU. Every
  /// input check, the output layout and the finiteness check are run()'s; the values equal the CPU's to
  /// float32 rounding, not bit for bit (another summation order: tests/gpu, `DeviceAttention.*`), so a
  /// study compares results of one engine only. A variant's partial scores (Variant::scores) are not used
  /// there. The layout's segments hold at most `segment_rows` sorted query rows of one sequence each (0: 4,096
  /// GEMM rows, i.e. max(1, 4096 / num_heads) query rows): each segment's GEMMs cover the keys its last row
  /// reads, so a sequence split in k segments spends ≈ 1/(2k) of its score and output arithmetic on masked
  /// keys instead of ≈ 1/2 (one segment per sequence). Throws std::logic_error for Scalar = double or a null
  /// device, std::invalid_argument for segment_rows < 0 or a sparse selection (the device reads every key of
  /// the window: sparse MLA runs on the CPU), and what `make` throws.
  void attach_device(const AttentionDeviceFactory& make, int64_t segment_rows = 0);
  bool on_device() const { return device_ != nullptr; }
  /// Whether the attached device computes attention_error's terms itself (AttentionDevice::computes_error_terms).
  bool device_computes_errors() const { return device_ && device_->computes_error_terms(); }
  /// With such a device: run(c_kv, k_pe) kept on the device as the reference of device_error(); returns the
  /// result without probabilities (they stay on the device). The outputs are checked finite, as run() (a
  /// NaN/Inf probability propagates into its row's output through p·c_kv). Throws std::logic_error without
  /// such a device (and for Scalar = double), and as run().
  AttentionResult<Scalar> keep_device_reference(std::span<const float> c_kv, std::span<const float> k_pe);
  /// attention_error(reference, run(c_kv, k_pe, true)) with the reference of keep_device_reference(), computed
  /// where the probabilities are: the device's terms per (row, head) (AttentionPairTerms), summed here in
  /// attention_error's order (q_rows, then heads) by its formulas. It equals attention_error() of the same
  /// device's results to float64 rounding (the order of the KL and output sums), with the same top-1 and
  /// top-8 counts (tests/gpu, `DeviceAttention.ErrorTermsMatchTheHostMetrics`). Memory on the host: Tq·H terms.
  /// Throws as run() (wrong sizes, NaN/Inf in c_kv / k_pe, a non-finite result, with the counts), and
  /// std::logic_error when no reference was kept.
  AttentionError device_error(std::span<const float> c_kv, std::span<const float> k_pe) const;
  /// Whether run_mixed() runs on the attached device (AttentionDevice::runs_mixed); else it stays on the CPU.
  bool device_runs_mixed() const { return device_ && device_->runs_mixed(); }
  /// The device's terms of attention_error for one cache (c_kv, k_pe) or a mixed one, by query row as given
  /// (q_rows order, then heads: [Tq·H]), checked finite (throws as run(), with the counts). With
  /// error_from_terms(terms, rows) they give attention_error_rows() of any row subset (the decode-order
  /// probe's position buckets) from one evaluation. Throws as device_error(), and for the mixed form as
  /// run_mixed() and std::logic_error when the device does not run mixed caches.
  std::vector<AttentionPairTerms> device_error_terms(std::span<const float> c_kv, std::span<const float> k_pe) const;
  std::vector<AttentionPairTerms> device_error_terms(const MixedCache& cache) const;
  /// attention_error_rows' value from per-pair terms [Tq·H] (q_rows order): the sums over `rows` in their
  /// order, then heads, by attention_error's formulas. Throws std::invalid_argument for a wrong size, no rows
  /// or a row outside [0, Tq).
  AttentionError error_from_terms(std::span<const AttentionPairTerms> terms, std::span<const int64_t> rows) const;
  /// run() on the CPU, with or without a device attached.
  AttentionResult<Scalar> run_on_cpu(std::span<const float> c_kv, std::span<const float> k_pe,
                                     bool keep_probs = false) const;

  /// Key index range of query row i (0 .. nkeys(i) − 1) and the row's position in its sequence
  /// (nkeys(i) − 1).
  int64_t nkeys(int64_t i) const { return nkeys_[i]; }

  int64_t num_queries() const { return static_cast<int64_t>(nkeys_.size()); }
  const MlaDims& dims() const { return dims_; }

 private:
  using Mat = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  struct Chunk {
    int64_t begin, end;  // positions in the sorted query order
    int64_t key_begin;   // first key token (sequence start)
    int64_t nk;          // keys covered by the chunk (max nkeys of its rows)
  };
  AttentionResult<Scalar> run_impl(std::span<const float> c_kv_a, std::span<const float> k_pe_a,
                                   const MixedCache* mixed, bool keep_probs) const;
  AttentionResult<Scalar> run_device(std::span<const float> c_kv, std::span<const float> k_pe, bool keep_probs) const;
  AttentionResult<Scalar> run_mixed_device(const MixedCache& m, bool keep_probs) const;
  // A result from the device's sorted output and probabilities: run(out, probs) fills them (probs null
  // without keep_probs); checked finite, `what` naming it in the error.
  template <typename Run>
  AttentionResult<Scalar> device_result(bool keep_probs, const char* what, Run&& run) const;
  std::vector<AttentionPairTerms> device_terms_impl(std::span<const float> c_kv, std::span<const float> k_pe,
                                                    const MixedCache* mixed) const;
  std::vector<int64_t> mixed_ranges_sorted(const MixedCache& m) const;  // [Tq, 4] by sorted row, clipped
  void check_mixed_ranges(const MixedCache& m) const;
  std::shared_ptr<const AttentionDevice> device_;  // null: the CPU
  std::vector<AttentionSegment> segments_;         // with a device: consecutive sorted rows of one sequence
  std::vector<int64_t> nkeys_sorted_;              // with a device: [Tq] by sorted row
  bool device_reference_ = false;                  // keep_device_reference() has run
  MlaDims dims_;
  int64_t T_ = 0;
  Scalar scale_ = 0;
  std::vector<int64_t> order_;  // sorted position → original query row
  std::vector<int64_t> nkeys_;  // [Tq] by original row
  KeySelection selection_;      // sparse MLA: the keys each row reads (empty: dense)
  std::vector<Chunk> chunks_;
  Mat q_lat_;  // [Tq·H, r], row = sorted_pos·H + h
  Mat q_pe_;   // [Tq·H, rope], same row order
  Mat w_uv_;   // [H·v, r]
};

/// Convenience: AbsorbedAttention<Scalar>(q).run(c_kv, k_pe, keep_probs).
template <typename Scalar>
AttentionResult<Scalar> absorbed_attention(const AttentionQueries& q, std::span<const float> c_kv,
                                           std::span<const float> k_pe, bool keep_probs = false);

/// The unabsorbed path (per head K = [W_UK·c_kv ; k_pe], V = W_UV·c_kv, standard causal attention).
/// Same inputs, errors and output layout as AbsorbedAttention. Slower; a cross-check.
template <typename Scalar>
AttentionResult<Scalar> unabsorbed_attention(const AttentionQueries& q, std::span<const float> c_kv,
                                             std::span<const float> k_pe, bool keep_probs = false);

}  // namespace latentq::probes
