// latentq/transform.h — the transform stage before a quantizer: `<transform>,<quantizer>` (faiss's
// "RR64,SQ8" pre-transform), one orthogonal rotation R per target (c_kv and k_pe separately, each with
// its own dimension D). A cell quantizes the rotated rows x' = R·x, dequantizes, and un-rotates
// x̂ = Rᵀ·x̂' so every error is measured in the original basis.
//
// Why it is free for MLA (absorbed decode): with c_kv' = R·c_kv, W_UK' = W_UK·Rᵀ and W_UV' = W_UV·Rᵀ
// give the same scores q_nope·W_UK'·c_kv' and outputs W_UV'·(Σ p·c_kv'); with k_pe' = R_pe·k_pe,
// q_pe' = R_pe·q_pe keeps q_pe'·k_pe'. Folded into the weights, the transform stores 0 bytes per token.
// Not folded (an engine that cannot change its weights), the decoder must store R (hadamard: the D
// signs, 1 bit each, plus the block size; rot/klt: the dense D×D float32 matrix, 4·D² bytes per layer
// and target) and apply Rᵀ to every dequantized row (O(D log D) / O(D²) flops per token).
//
// Grammar (canonical form first):
//   had[N][-s<seed>]   randomized Hadamard H·diag(s): s = D random signs (splitmix64 of seed, default
//                      seed 0), H = block-diagonal normalized Sylvester Hadamard with block N (a power
//                      of two ≥ 2 dividing D); without N the block is the largest power of two dividing
//                      D (512 → 512, 576 = 9·64 → 64, 96 = 3·32 → 32, 384 → 128). If that block is
//                      < 16 (D = 100 → 4) the transform is refused, naming D (use hadN or rot).
//   rot[-s<seed>]      seeded Haar random orthogonal matrix (Gram-Schmidt QR of a Gaussian matrix with
//                      positive diagonal R, i.e. Q·sign(diag R)), the control
//   klt                the KLT/PCA rotation: the eigenbasis of the fit split's uncentered second moment
//                      (the SVD probe's basis at full rank), fitted per layer and target by the study
//   sklt               the score-metric KLT, fitted per layer and target by the study: with Σ the fit split's
//                      uncentered second moment and M the score metric of the fit split's query rows (c_kv:
//                      the mean over heads and rows of q_lat·q_latᵀ, q_lat = W_UKᵀ·q_nope; k_pe: of
//                      q_pe·q_peᵀ; latentq/analysis/rate_distortion.h score_metric), M's eigenvalues
//                      floored at kScoreMetricFloor·max, A = Uᵀ·M^{1/2} with U the eigenvectors of
//                      M^{1/2}·Σ·M^{1/2} (descending): the transform under which the score error eᵀMe is a
//                      plain squared error and the components are uncorrelated, so reverse water-filling on
//                      them (tc<R>) is the score-space bound's allocation. Not orthogonal: x' = A·x,
//                      x = A⁻¹·x', and the weights fold by A⁻ᵀ (W_UK' = W_UK·A⁻¹, W_UV' = W_UV·A⁻¹,
//                      q_pe' = A⁻ᵀ·q_pe), which keeps every score and output.
// A full spec is "<transform>,<quantizer>", e.g. had,int4-asym-token, had64,q4_0, rot,mxfp4,
// klt,int4-asym-channel-g32; a spec without a comma has no transform. One row of kTransforms per kind (below) gives
// its name, whether it takes a block and a seed, whether it is fitted and on what; parse, to_string, the forms
// (transform_forms()) and the study's fit (fit_layer_rotation) read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "latentq/quantize.h"
#include "latentq/spec.h"

namespace latentq {

/// A transform family; one row of kTransforms each.
enum class TransformKind : uint8_t {
  None = 0,
  Hadamard = 1,
  Random = 2,
  Klt = 3,
  ScoreKlt = 4,
  Count  ///< the number of kinds (kTransforms has one row per value before it)
};
inline constexpr size_t kTransformCount = static_cast<size_t>(TransformKind::Count);

/// What a transform is made from, and so what its fit reads of a layer.
enum class TransformFit : uint8_t {
  Built = 0,   ///< not fitted: Rotation::make builds it from the spec and D alone (none, had, rot)
  Latent = 1,  ///< fitted on the fit split of the target's latent rows (c_kv or k_pe) alone (klt)
  Queries = 2,  ///< fitted on the latent and the score metric of the layer's fit-split query rows (q_nope with W_UK
                ///< for c_kv, q_pe for k_pe; probes::fit_score_metric): the dump's attention datasets (sklt)
};

/// One row of the transform table: everything latentq states about a transform family, in one place. Parsing,
/// to_string(), the forms of transform_forms() and of the error for an unknown transform, the fitted flag and what
/// a fit reads all come from it.
struct TransformTraits {
  TransformKind kind;
  const char* name;  ///< the grammar's word ("" for none); the spec's form is name[N][-s<seed>] as below allow
  bool block;        ///< takes a block size N right after the name (had64)
  bool seed;         ///< takes a -s<seed> suffix (seed 0 is the default and is not written)
  TransformFit fit;  ///< built, or fitted on what (the study's fit_layer_rotation reads that)
  bool orthogonal;   ///< a rotation R (inverse Rᵀ, the weights fold by R; a fitted basis is R [D, D]); false: an
                     ///< invertible A (inverse A⁻¹, the weights fold by A⁻ᵀ; a fitted basis is (A, A⁻¹) [2, D, D])
  const char* what;  ///< what it is, one phrase (transform_forms())
};

/// The transform table, one row per TransformKind in enum order (checked below).
inline constexpr TransformTraits kTransforms[] = {
    {TransformKind::None, "", false, false, TransformFit::Built, true, "no transform"},
    {TransformKind::Hadamard, "had", true, true, TransformFit::Built, true,
     "randomized Hadamard, N a power of two >= 2 dividing the dimension; default: the largest power of two "
     "dividing it, refused below 16"},
    {TransformKind::Random, "rot", false, true, TransformFit::Built, true, "seeded Haar random orthogonal"},
    {TransformKind::Klt, "klt", false, false, TransformFit::Latent, true, "PCA basis of the fit split"},
    {TransformKind::ScoreKlt, "sklt", false, false, TransformFit::Queries, false,
     "score-metric KLT of the fit split and its query rows"},
};

namespace detail {
constexpr bool transform_rows_ok() {
  for (size_t i = 0; i < std::size(kTransforms); ++i) {
    const TransformTraits& r = kTransforms[i];
    if (r.kind != static_cast<TransformKind>(i)) return false;
    // a fitted transform is determined by the data: no block, no seed (so its name alone is its spec)
    if (r.fit != TransformFit::Built && (r.block || r.seed)) return false;
    if ((i == 0) != (std::string_view(r.name).empty())) return false;  // only none has no name
    for (size_t j = 0; j < i; ++j)
      if (std::string_view(r.name) == kTransforms[j].name) return false;
  }
  return true;
}
}  // namespace detail
static_assert(std::size(kTransforms) == kTransformCount, "kTransforms: one row per TransformKind");
static_assert(detail::transform_rows_ok(),
              "kTransforms: rows in TransformKind's enum order, distinct names, fitted rows without block or seed");

/// The table row of a kind.
constexpr const TransformTraits& traits(TransformKind k) { return kTransforms[static_cast<size_t>(k)]; }

/// sklt's floor on the score metric's eigenvalues, relative to the largest: it bounds the condition number of
/// A = Uᵀ·M^{1/2} by 1/sqrt(floor) = 100, so A⁻¹ and the folded weights stay within float32 (directions the
/// queries read 10⁴× less than the strongest are kept at that weight, not dropped).
inline constexpr double kScoreMetricFloor = 1e-4;

/// True for the transforms fitted on the dump (the table's fit is not Built: klt, sklt): Rotation::make cannot
/// build them; the study's fit_layer_rotation fits them.
constexpr bool fitted_transform(TransformKind k) { return traits(k).fit != TransformFit::Built; }
/// True when the fit reads the layer's query rows and W_UK besides the latent (TransformFit::Queries: sklt).
constexpr bool fit_reads_queries(TransformKind k) { return traits(k).fit == TransformFit::Queries; }

/// The valid transform forms, from the table: "had[N][-s<seed>] (randomized Hadamard, ...), rot[-s<seed>] (...),
/// klt (...), sklt (...); a full spec is '<transform>,<quantizer>', e.g. had,int4-asym-token". The message of an
/// unknown transform ends with it.
std::string transform_forms();

/// A parsed transform. Fields that do not apply to the kind hold their defaults.
struct Transform {
  TransformKind kind = TransformKind::None;
  int64_t block = 0;  ///< Hadamard: block size, 0 = automatic (largest power of two dividing D)
  uint64_t seed = 0;  ///< Hadamard signs / random rotation

  /// Parses "had", "had64", "had-s7", "rot", "rot-s3", "klt", "sklt" (or "" = none): a row's name, its block
  /// and seed where the row takes them (kTransforms). Throws std::invalid_argument naming the string and listing
  /// the forms otherwise (an unknown name, block not a power of two ≥ 2, bad seed, a seed on a row without one).
  static Transform parse(std::string_view s);
  /// Canonical string ("" for none): the row's name, the block when set, the seed when non-zero;
  /// parse(to_string()) == *this.
  std::string to_string() const;
  bool operator==(const Transform&) const = default;
};

/// A transform and a quantizer: the unit the study runs. One string names it everywhere.
struct TransformedSpec {
  Transform transform;
  QuantSpec spec;
  /// Parses "<transform>,<quantizer>" or "<quantizer>". Throws std::invalid_argument naming the string
  /// (more than one comma, an empty part, or the errors of Transform::parse / QuantSpec::parse).
  static TransformedSpec parse(std::string_view s);
  /// Canonical string: "<transform>,<quantizer>" or the quantizer's alone when there is no transform.
  std::string to_string() const;
  bool operator==(const TransformedSpec&) const = default;
};

/// The Hadamard block for rows of D elements: `requested` (0 = automatic). Throws std::invalid_argument
/// naming D when D ≤ 0, when a requested block is not a power of two ≥ 2 or does not divide D, or when the
/// automatic block (largest power of two dividing D) is < kMinAutoHadamardBlock.
inline constexpr int64_t kMinAutoHadamardBlock = 16;
int64_t hadamard_block(int64_t D, int64_t requested);

/// The D random signs (+1/−1, float32) of a randomized Hadamard: bit 0 of splitmix64(seed + i + 1)
/// for element i (set = −1). Deterministic on every platform.
std::vector<float> hadamard_signs(int64_t D, uint64_t seed);

/// In-place fast Walsh–Hadamard transform of each row of X [T, D] (row-major float32) in blocks of
/// `block` (a power of two dividing D; not checked beyond that, use hadamard_block): for h = 1, 2, 4,
/// ..., block/2, every pair (i, i+h) with bit h of i clear becomes (a + b, a − b), in increasing i; then
/// every element is multiplied once by the float32 constant float(1/sqrt(block)). Unnormalized
/// butterflies are exact sums, so the result is the same bytes on CPU and GPU (kernels/ reproduces
/// this order). The normalized transform is its own inverse up to rounding (H = Hᵀ, H·H = I).
/// Throws std::invalid_argument for block < 1, D % block != 0 or T < 0.
void fwht_rows(float* X, int64_t T, int64_t D, int64_t block);

/// A seeded Haar random orthogonal matrix R [D, D] (row-major float32, rows orthonormal to ~1e-6):
/// Gaussian entries (Box–Muller on splitmix64, in float64), modified Gram–Schmidt twice on the rows
/// (float64), rounded to float32. Throws std::invalid_argument for D ≤ 0.
std::vector<float> haar_orthogonal(int64_t D, uint64_t seed);

/// One target's transform, ready to apply: an orthogonal rotation (had, rot, klt: forward x' = R·x, inverse
/// x = Rᵀ·x') or an invertible dense map (sklt: forward x' = A·x, inverse x = A⁻¹·x'). fold() is the map the
/// weights that read the latent take (W_UK and W_UV rows for c_kv, q_pe for k_pe), so that scores and outputs
/// are unchanged: R itself for a rotation, A⁻ᵀ otherwise.
class Rotation {
 public:
  Rotation() = default;  ///< identity (no transform)
  /// Hadamard with block `block` (hadamard_block) and the signs of `seed`.
  static Rotation hadamard(int64_t D, int64_t block, uint64_t seed);
  /// Dense orthogonal R [D, D] row-major (rot, klt). Throws std::invalid_argument for a size ≠ D·D or
  /// D ≤ 0. Orthogonality is the caller's (checked by the study's fold check).
  static Rotation dense(int64_t D, std::vector<float> R);
  /// Dense invertible A [D, D] and its inverse A_inv [D, D], row-major float32 (sklt). Throws
  /// std::invalid_argument for sizes ≠ D·D or D ≤ 0. That A_inv inverts A is the caller's (the fit computes
  /// both from one eigendecomposition; the study's fold check measures it).
  static Rotation dense_invertible(int64_t D, std::vector<float> A, std::vector<float> A_inv);
  /// Builds the rotation of a built transform for rows of D elements (a fitted one, fitted_transform(), needs the
  /// fit split: throws std::invalid_argument for it, and for the errors of hadamard_block). None gives identity.
  /// rot: haar_orthogonal(D, seed), built once per (D, seed) in a process and kept (a D·D float matrix).
  static Rotation make(const Transform& t, int64_t D);

  /// Rows of X [T, D] in place. Hadamard: x' = H·(s ⊙ x) (fwht_rows); dense: x'_i = Σ_j R_ij x_j,
  /// accumulated in float64 over j ascending, rounded once (each output's sum in that order: the
  /// loops run over tiles of rows with the outputs in vector lanes, not a reassociating GEMM, so the
  /// bits do not depend on the ISA or the tiling). Throws std::invalid_argument if D differs.
  void forward(float* X, int64_t T, int64_t D) const;
  /// Rows of X in place: Hadamard: x = s ⊙ (H·x'); dense: x_j = Σ_i R_ij x'_i (float64, i ascending);
  /// invertible: x_j = Σ_i A⁻¹_ji x'_i (the same loops).
  void inverse(float* X, int64_t T, int64_t D) const;
  /// Rows w of X [T, D] (weights that take dot products with the latent: W_UK / W_UV rows, q_pe) in place,
  /// to A⁻ᵀ·w so that (A⁻ᵀw)·(Ax) = w·x: forward() for a rotation; w'_i = Σ_j A⁻¹_ji w_j for sklt.
  void fold(float* X, int64_t T, int64_t D) const;
  /// The dense matrix R (or A) [D, D] row-major (built for Hadamard): x' = R·x.
  std::vector<float> matrix() const;
  /// The inverse matrix [D, D] row-major: Rᵀ for a rotation, A⁻¹ for sklt.
  std::vector<float> inverse_matrix() const;
  bool identity() const { return D_ == 0; }
  /// False for sklt's invertible map, true for the identity and every rotation.
  bool orthogonal() const { return Inv_.empty(); }
  int64_t dim() const { return D_; }

 private:
  int64_t D_ = 0;          // 0 = identity
  int64_t block_ = 0;      // Hadamard block; 0 = dense
  std::vector<float> s_;   // Hadamard signs [D]
  std::vector<float> R_;   // dense [D, D]
  std::vector<float> Rt_;  // dense Rᵀ [D, D] (forward reads it row by row)
  std::vector<float> Inv_;   // sklt: (A⁻¹)ᵀ [D, D] (inverse reads it); empty for a rotation
  std::vector<float> Fold_;  // sklt: A⁻¹ [D, D] (fold reads it)
};

/// The cell of a transformed quantizer on the CPU reference: X' = rows of X [T, D] rotated by r
/// (forward), quantize_dequantize(spec, target, X', ...) into out, then out un-rotated in place
/// (inverse), so out [T, D] is the reconstruction in the original basis. Returns the storage of the
/// rotated matrix (its accounting is the format's: the folded rotation stores nothing per token).
/// An identity r is quantize_dequantize itself. Throws as quantize() and Rotation::forward.
QuantizedTensor quantize_dequantize_rotated(const QuantSpec& spec, const Rotation& r, Target target, const float* X,
                                            int64_t T, int64_t D, std::span<const int64_t> seq_offsets, float* out);

}  // namespace latentq
