// latentq/spec.h — quantizer specs: one string names a quantizer everywhere (CLI, config, HDF5,
// thresholds).
//
// Grammar (canonical form first; parsing also accepts the optional parts spelled out):
//   int{8|4|2}-{sym|asym}-tensor[-fp32]
//   int{8|4|2}-{sym|asym}-{channel|token}[-g{N}][-fp32]     N ≥ 0; -g0 (or no -g) = whole axis
//   bf16
//   fp8-e4m3-tile{N}                                          N > 0 (production: tile128)
// The scale/offset dtype is fp16 unless -fp32 is given (-fp16 is accepted and omitted).
//
// Granularity, on a [T, D] row-major matrix (T tokens of all sequences, D = kv_lora_rank or
// qk_rope_head_dim):
//   tensor  : one (scale, offset) for the whole layer matrix, over all sequences (a calibrated
//             static scale, as vLLM's per-tensor FP8).
//   channel : one (scale, offset) per latent dimension for each group of group_size consecutive
//             tokens of ONE sequence (0 = all tokens of the sequence); KIVI's key grouping. A group
//             never spans two sequences; a last, partial group uses its own statistics.
//   token   : one (scale, offset) per token for each group of group_size consecutive dimensions
//             (0 = all D dimensions); a last, partial group uses its own statistics.
// Baselines:
//   bf16             : every element stored as bf16 (RNE); no metadata.
//   fp8-e4m3-tile128 : c_kv as FP8 e4m3 with one fp32 scale (max(amax,1e-4)/448) per 128-dimension
//                      tile of each token; applied to k_pe it stores bf16, as the production
//                      layout does. This is DeepSeek FlashMLA / vLLM `fp8_ds_mla` (656 bytes per
//                      token per layer for 512 + 64).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "latentq/qmath.h"

namespace latentq {

using qmath::ScaleDtype;

/// Format family of a spec.
enum class Format : uint8_t {
  Int = 0,      ///< INT8/4/2 scalar quantization with (scale, offset) per group
  BF16 = 1,     ///< bf16 storage baseline
  Fp8Tile = 2,  ///< FP8 e4m3 with an fp32 scale per tile of each row (FlashMLA layout)
};
enum class Scheme : uint8_t { Sym = 0, Asym = 1 };
enum class Granularity : uint8_t { Tensor = 0, Channel = 1, Token = 2 };

/// Which cached tensor a spec is applied to. Some formats store the two differently.
enum class Target : uint8_t { CKV = 0, KPE = 1 };

/// A parsed quantizer spec. Fields that do not apply to a format hold their defaults.
struct QuantSpec {
  Format format = Format::Int;
  int bits = 8;                                 ///< 8, 4 or 2 (Int); 16 (BF16); 8 (Fp8Tile)
  Scheme scheme = Scheme::Asym;                 ///< Int only
  Granularity granularity = Granularity::Tensor;///< Int only
  int64_t group_size = 0;                       ///< Int channel/token: group length, 0 = whole axis; Fp8Tile: tile width
  ScaleDtype scale_dtype = ScaleDtype::F16;     ///< Int only; Fp8Tile scales are always fp32

  /// Parse a spec string. Throws std::invalid_argument naming the string and listing the valid
  /// forms for an unknown string, bits outside {2,4,8}, a negative or malformed group size, or a
  /// group size on a per-tensor spec.
  static QuantSpec parse(std::string_view s);
  /// Canonical string; parse(to_string()) == *this.
  std::string to_string() const;

  /// The format actually stored for `target` (fp8-e4m3-tile keeps k_pe in bf16).
  QuantSpec stored_for(Target target) const;

  bool operator==(const QuantSpec&) const = default;
};

/// Human-readable list of the valid spec forms (used in error messages and --help).
std::string spec_grammar();

const char* to_string(Scheme);
const char* to_string(Granularity);
const char* to_string(Target);
const char* to_string(ScaleDtype);
/// Parses "c_kv" / "k_pe"; throws std::invalid_argument otherwise.
Target parse_target(std::string_view);

}  // namespace latentq
