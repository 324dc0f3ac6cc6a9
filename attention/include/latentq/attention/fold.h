// latentq/attention/fold.h — the weight-absorption fold check: a rotation of the cache folded into W_UK, W_UV
// and q_pe must leave the absorbed attention unchanged (latentq/attention/attention.h includes it).
#pragma once

#include <span>
#include <string>

#include "latentq/attention/types.h"
#include "latentq/transform.h"

namespace latentq::probes {

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
/// Relative tolerance of the fold check (float32). The rotation's own float32 rounding reaches 1.04e-5 on the
/// calibrated DeepSeek-V2-Lite stand-in (kv_lora_rank 512, layer 1, rot) on an AVX-512 Xeon's OpenBLAS sgemm, under
/// 1e-5 on AMD Zen 4 (the kernels sum in other orders); a broken fold (a weight path not rotated) is off by > 1e-2
/// (test_probe_study: RotationFoldIsExactAndABrokenFoldFails).
inline constexpr double kFoldTolerance = 1e-4;

/// Folds r_ckv (dimension kv_lora_rank) and r_kpe (qk_rope_head_dim; identity allowed) into the
/// weights — c_kv' = R·c_kv, W_UK' = W_UK·Rᵀ and W_UV' = W_UV·Rᵀ (each row of W_UK[h] / W_UV[h], a
/// vector over the latent, rotated by R), k_pe' = R_pe·k_pe, q_pe' = R_pe·q_pe; for sklt's invertible A
/// the weights take A⁻ᵀ (Rotation::fold: W_UK' = W_UK·A⁻¹, q_pe' = A_pe⁻ᵀ·q_pe) — and runs the float32
/// absorbed attention of q on both caches. Exact in real arithmetic: the same scores and outputs. Throws std::invalid_argument as AbsorbedAttention, or when a rotation's
/// dimension is not the dims' kv_lora_rank / qk_rope_head_dim.
FoldCheck fold_check(const AttentionQueries& q, std::span<const float> c_kv, std::span<const float> k_pe,
                     const Rotation& r_ckv, const Rotation& r_kpe, FoldMode mode = FoldMode::Full);
/// fold_check, then throws std::runtime_error("fold check failed: ... out_rel_fro X > 1e-04 ...") naming
/// `what` (e.g. "layer 3, had") when out_rel_fro > kFoldTolerance. Returns the check otherwise.
FoldCheck require_fold_exact(const AttentionQueries& q, std::span<const float> c_kv, std::span<const float> k_pe,
                             const Rotation& r_ckv, const Rotation& r_kpe, const std::string& what,
                             FoldMode mode = FoldMode::Full);

}  // namespace latentq::probes
