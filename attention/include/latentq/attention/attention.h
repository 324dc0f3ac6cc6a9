// latentq/attention/attention.h — the absorbed MLA attention check for one layer.
//
// Source of the math: DeepSeek-V3 inference/model.py, MLA.forward, attn_impl == "absorb"
// (see /work/shared/FIELD.md §1):
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
// Precision: Scalar = float computes everything in float32 with float32 accumulation (BLAS sgemm, probes/gemm.h), as
// a GPU kernel would; Scalar = double computes everything in float64 (for tight tests). Inputs are
// float32 either way. In the float path q_lat is rounded to float32 once (it is precomputed).
//
// Cost: the per-layer part that does not depend on the latents (q_lat, the row ordering) is done once
// by AbsorbedAttention's constructor; run() then does two GEMMs per chunk of ≤ 8 query rows of one
// sequence (all heads stacked), over that chunk's causal key range; chunks run in parallel (OpenMP).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <Eigen/Dense>

#include "latentq/attention/device_seam.h"
#include "latentq/decode_order.h"
#include "latentq/spec.h"
#include "latentq/transform.h"

namespace latentq::probes {

struct MlaDims {
  int64_t num_heads = 0;         ///< H
  int64_t kv_lora_rank = 0;      ///< r
  int64_t qk_nope_head_dim = 0;  ///< nope
  int64_t qk_rope_head_dim = 0;  ///< rope
  int64_t v_head_dim = 0;        ///< v
};

/// The latent-independent inputs of one layer, as in a latentq-dump/1 file (all row-major). Views only:
/// AbsorbedAttention copies what it needs, so the spans may die after construction.
struct AttentionQueries {
  MlaDims dims;
  int64_t num_tokens = 0;                ///< T, tokens in the cache (all sequences)
  std::span<const int64_t> seq_offsets;  ///< [S+1] int64
  std::span<const int32_t> q_rows;       ///< [Tq] int32, token index of each query row
  std::span<const float> q_nope;         ///< [Tq, H, qk_nope_head_dim] float32
  std::span<const float> q_pe;           ///< [Tq, H, qk_rope_head_dim] float32, after RoPE
  std::span<const float> w_uk;           ///< [H, qk_nope_head_dim, kv_lora_rank] float32 (W_UK)
  std::span<const float> w_uv;           ///< [H, v_head_dim, kv_lora_rank] float32 (W_UV)
  double softmax_scale = 0;              ///< > 0, finite
};

/// Output of one attention evaluation; query rows in q_rows order.
template <typename Scalar>
struct AttentionResult {
  int64_t num_queries = 0, num_heads = 0, v_head_dim = 0;
  std::vector<Scalar> out;            ///< [Tq, H, v_head_dim] (before o_proj; compare with a dump's attn_out)
  std::vector<int64_t> nkeys;         ///< [Tq] keys of each query row
  std::vector<int64_t> prob_offsets;  ///< [Tq+1] start of row i's probabilities in probs (H·nkeys[i] each)
  std::vector<Scalar> probs;          ///< empty unless requested; see prob()

  /// Attention probabilities of row i, head h: nkeys[i] values, key j = token seq_offsets[s] + j.
  std::span<const Scalar> prob(int64_t i, int64_t h) const {
    return {probs.data() + prob_offsets[i] + h * nkeys[i], static_cast<size_t>(nkeys[i])};
  }
};

/// Keys [begin, end) of one query row, as key indices j = 0 .. nkeys − 1 (j = the key's position in
/// its sequence; key j is token seq_offsets[s] + j). begin ≥ end is the empty range.
struct KeyRange {
  int64_t begin = 0, end = 0;
  bool contains(int64_t j) const { return j >= begin && j < end; }
};

/// A cache read from two stores per (query row, key): row i reads key j of c_kv from store A iff
/// ckv_from_a[i].contains(j), else from store B; k_pe likewise with kpe_from_a. Scores and values mix
/// per (row, key): score_j = q_lat·c_kv_X[j] + q_pe·k_pe_Y[j], out = W_UV·Σ_j p_j c_kv_X[j], X and Y the
/// stores the ranges pick. The decode-order cache (latentq/decode_order.h) is this with A = the quantized
/// cache, B = its bf16 reads and the range [sink, quantized_end(t, G)).
struct MixedCache {
  std::span<const float> c_kv_a, k_pe_a;        ///< store A: [T, kv_lora_rank], [T, qk_rope_head_dim] float32
  std::span<const float> c_kv_b, k_pe_b;        ///< store B: same shapes
  std::span<const KeyRange> ckv_from_a;         ///< [Tq], q_rows order
  std::span<const KeyRange> kpe_from_a;         ///< [Tq], q_rows order
};

/// Sorted query rows [begin, end) of one sequence and its keys, tokens key_begin .. key_begin + nk − 1
/// (AttentionLayout).
struct AttentionSegment {
  int64_t begin = 0, end = 0, key_begin = 0, nk = 0;
};

/// One layer's fixed inputs of the absorbed attention as a device takes them: AbsorbedAttention's query
/// rows sorted by token index (row = sorted_pos·H + h), in segments of consecutive rows of one sequence
/// (attach_device's segment_rows). The pointers are views
/// into the AbsorbedAttention that made the layout, valid while it lives.
struct AttentionLayout {
  MlaDims dims;
  int64_t num_tokens = 0;                  ///< T
  float softmax_scale = 0;
  std::span<const int64_t> nkeys;          ///< [Tq] keys of each sorted row
  std::vector<AttentionSegment> segments;  ///< cover the sorted rows [0, Tq) in order
  const float* q_lat = nullptr;            ///< [Tq·H, kv_lora_rank] float32 row-major (q_nope·W_UK)
  const float* q_pe = nullptr;             ///< [Tq·H, qk_rope_head_dim]
  const float* w_uv = nullptr;             ///< [H·v_head_dim, kv_lora_rank] (W_UV)
};

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
  double top1_agree = 0;   ///< fraction of rows×heads where argmax p == argmax p̂ (ties → lowest key index)
  double top8_agree = 0;   ///< mean of |topm(p) ∩ topm(p̂)| / m, m = min(8, nkeys) (ties → lowest index)
};

/// One (query row, head) pair's terms of attention_error, as a device that computes them returns them
/// (AttentionDevice::error_terms): float64 sums over the pair's keys and its v_head_dim outputs, a = the
/// reference, b = the test. AbsorbedAttention::device_error() sums them in attention_error's order.
struct AttentionPairTerms {
  double kl = 0;     ///< Σ_j p_j·ln(p_j / max(p̂_j, kKlProbFloor)) over the row's keys with p_j > 0
  double dot = 0;    ///< Σ a·b
  double ref2 = 0;   ///< Σ a²
  double test2 = 0;  ///< Σ b²
  double err2 = 0;   ///< Σ (b − a)²
  bool equal = false;      ///< a == b element for element
  bool top1 = false;       ///< the keys of largest probability agree (ties: the lower key index)
  int32_t top_common = 0;  ///< |top-m(p) ∩ top-m(p̂)|, m = min(8, nkeys) (ties: the lower key index)
  int64_t nonfinite_probs = 0;  ///< NaN/Inf among the test's probabilities of the pair's keys
  int64_t nonfinite_out = 0;    ///< NaN/Inf among the test's outputs of the pair
};

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
  /// survive the conversion to Scalar (latentq/analysis/narrow.h: 1e300 is inf, 1e-50 is 0 in float32).
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
  /// device, std::invalid_argument for segment_rows < 0, and what `make` throws.
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
  std::shared_ptr<const AttentionDevice> device_;   // null: the CPU
  std::vector<AttentionSegment> segments_;         // with a device: consecutive sorted rows of one sequence
  std::vector<int64_t> nkeys_sorted_;              // with a device: [Tq] by sorted row
  bool device_reference_ = false;                  // keep_device_reference() has run
  MlaDims dims_;
  int64_t T_ = 0;
  Scalar scale_ = 0;
  std::vector<int64_t> order_;   // sorted position → original query row
  std::vector<int64_t> nkeys_;   // [Tq] by original row
  std::vector<Chunk> chunks_;
  Mat q_lat_;                    // [Tq·H, r], row = sorted_pos·H + h
  Mat q_pe_;                     // [Tq·H, rope], same row order
  Mat w_uv_;                     // [H·v, r]
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
/// match its Tq, or it lacks probabilities, or has a NaN/Inf output or probability. attention_error(prepared, test) equals attention_error(ref, test)
/// bit for bit.
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

// ---- decode order (issue 12): attention on the cache a serving engine builds token by token --------

/// Per query row, the keys read from the quantized cache under `order` for token-group length G ≥ 1:
/// the row at sequence position positions[i] = t reads key j ≤ t quantized iff
/// order.reads_quantized(t, j, G) (latentq/decode_order.h, the one definition; the quantized keys of a
/// row are contiguous by that rule, [sink, quantized_end), and this returns them as a KeyRange, checked
/// key by key). Throws std::invalid_argument for a negative position or G < 1.
std::vector<KeyRange> decode_order_ranges(const DecodeOrder& order, std::span<const int64_t> positions, int64_t G);

/// The latents of one layer and where the query rows sit, for decode_order_attention.
struct DecodeOrderInput {
  std::span<const float> c_kv;           ///< [T, kv_lora_rank] float32, exact (as dumped)
  std::span<const float> k_pe;           ///< [T, qk_rope_head_dim] float32, exact
  std::span<const int64_t> seq_offsets;  ///< [S+1], the sequences of the queries (AttentionQueries)
  std::span<const int32_t> q_rows;       ///< [Tq] token index of each query row (AttentionQueries)
  std::span<const int32_t> positions;    ///< [T] position of each token in its sequence (a dump's /positions)
};

/// What is quantized: `spec` (behind the rotations; identity rotations for none) on c_kv and/or k_pe.
/// A target left unquantized is read in bf16 everywhere, as /attention_error charges it.
struct DecodeOrderQuantizer {
  QuantSpec spec;
  const Rotation* r_ckv = nullptr;  ///< null = identity
  const Rotation* r_kpe = nullptr;  ///< null = identity
  bool c_kv = true, k_pe = true;
};

/// The error of one bucket of query positions [pos_start, pos_end) (pos_end = pos_start + bucket).
struct PositionBucketError {
  int64_t pos_start = 0, pos_end = 0;
  int64_t queries = 0;              ///< query rows in the bucket (all sequences)
  double quantized_key_frac = 0;    ///< mean over the rows of (keys read quantized) / (keys), c_kv's keys
                                    ///< (k_pe's when only k_pe is quantized)
  double kl_mean = 0;               ///< attention_error_rows(ref, test, rows).kl_mean (nats)
  double out_rel_fro = 0;           ///< attention_error_rows(...).out_rel_fro
};

/// One decode order's result: its buckets (ascending, non-empty only) and the bytes per token of the
/// cache at each sequence's end: Σ over sequences and targets of (bf16 tokens · 2 · D + quantized tokens ·
/// the format's bytes per token) / T, with decode_cache_tokens(order, L, G) and the format's bytes per
/// token as account() of the quantized rows (decode_order_quantize; metadata included); an unquantized
/// target costs 2 · D per token. One layer, c_kv + k_pe (prefill-at-once: /attention_error's
/// bytes_per_token_layer).
struct DecodeOrderError {
  DecodeOrder order;
  double bytes_per_token = 0;
  std::vector<PositionBucketError> buckets;
};

/// The absorbed float32 attention of `att`'s queries on the decode-order cache of each order in `orders`
/// against `ref` (att.run on the exact latents, keep_probs): per (row at position t, key j) the quantized
/// cache (decode_order_quantize: groups aligned at the sink, rotations as quantize_dequantize_rotated)
/// when reads_quantized(t, j, G), else bf16 (round_bf16); G = decode_token_group of the format stored for
/// that target. Rows bucketed by position: bucket b = [b·bucket, (b+1)·bucket). Cost: one quantization per
/// distinct sink, one mixed attention per order. Throws std::invalid_argument for bucket < 1, nothing
/// quantized, sizes that do not match att, a row whose positions[q_row] is not its key index in its
/// sequence (the dump's /positions must count from each sequence's start), an invalid order, and as
/// decode_order_quantize / run_mixed / attention_error_rows.
std::vector<DecodeOrderError> decode_order_attention(const AbsorbedAttention<float>& att, const AttentionReference<float>& ref,
                                                     const DecodeOrderInput& in, const DecodeOrderQuantizer& q,
                                                     std::span<const DecodeOrder> orders, int64_t bucket);
/// The same on att's device (att.device_computes_errors() and att.device_runs_mixed(), its reference kept by
/// keep_device_reference on the exact latents): each order's mixed cache is evaluated there once
/// (device_error_terms) and every bucket's errors are summed from its per-pair terms (error_from_terms);
/// equal to the CPU form on the same device's results to float64 rounding. Throws as the CPU form, and
/// std::logic_error without such a device.
std::vector<DecodeOrderError> decode_order_attention(const AbsorbedAttention<float>& att, const DecodeOrderInput& in,
                                                     const DecodeOrderQuantizer& q, std::span<const DecodeOrder> orders,
                                                     int64_t bucket);

/// Which weights the fold check rotates. Full is the real fold; the others leave one part out on
/// purpose (the bug the field keeps making: MLA's value is a view of the same latent, so a rotated
/// c_kv needs W_UV rotated too) and must fail the check.
enum class FoldMode { Full, SkipWUV, SkipWUK, SkipQPe };

/// Result of fold_check: the float32 absorbed attention on the rotated cache with the folded weights
/// against the same on the unrotated cache, no quantization.
struct FoldCheck {
  double out_rel_fro = 0;  ///< ‖out_rot − out‖_F / ‖out‖_F over [Tq, H, v]
  double kl_mean = 0;      ///< attention_error's KL(p ‖ p_rot), nats
};
/// Relative tolerance of the fold check (float32): issue 11.
inline constexpr double kFoldTolerance = 1e-5;

/// Folds r_ckv (dimension kv_lora_rank) and r_kpe (qk_rope_head_dim; identity allowed) into the
/// weights — c_kv' = R·c_kv, W_UK' = W_UK·Rᵀ and W_UV' = W_UV·Rᵀ (each row of W_UK[h] / W_UV[h], a
/// vector over the latent, rotated by R), k_pe' = R_pe·k_pe, q_pe' = R_pe·q_pe — and runs the float32
/// absorbed attention of q on both caches. Exact in real arithmetic: R orthogonal gives the same
/// scores and outputs. Throws std::invalid_argument as AbsorbedAttention, or when a rotation's
/// dimension is not the dims' kv_lora_rank / qk_rope_head_dim.
FoldCheck fold_check(const AttentionQueries& q, std::span<const float> c_kv, std::span<const float> k_pe,
                     const Rotation& r_ckv, const Rotation& r_kpe, FoldMode mode = FoldMode::Full);
/// fold_check, then throws std::runtime_error("fold check failed: ... out_rel_fro X > 1e-05 ...") naming
/// `what` (e.g. "layer 3, had") when out_rel_fro > kFoldTolerance. Returns the check otherwise.
FoldCheck require_fold_exact(const AttentionQueries& q, std::span<const float> c_kv, std::span<const float> k_pe,
                             const Rotation& r_ckv, const Rotation& r_kpe, const std::string& what,
                             FoldMode mode = FoldMode::Full);

}  // namespace latentq::probes
