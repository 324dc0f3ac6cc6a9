// latentq/spec.h — quantizer specs and the format descriptor: one string names a quantizer
// everywhere (CLI, config, HDF5, thresholds), and one table row per format (kFormats, in the style
// of ggml's type_traits) gives its grammar, its labels, the engine or standard it reproduces and,
// through layout(), its byte layout and bytes per token for a given row length.
//
// Grammar (canonical form first; spec_grammar() prints it from the table):
//   int{8|4|2}-{sym|asym}-tensor[-fp32]
//   int{8|4|2}-{sym|asym}-{channel|token}[-g{N}][-fp32]     N ≥ 0; -g0 (or no -g) = whole axis
//   bf16
//   fp8-e4m3-tile{N}-pow2[-ue8m0] | fp8-e4m3-tile{N}-fp32    N > 0
//   fp8-e4m3-tensor[-s1]
//   mxfp8 | mxfp4 | nvfp4 | fp4-e2m1-tile16-e4m3[-rcp]
//   q8_0 | q4_0 | q4_1
//   tq{2|3|4}[-nc]                                           TurboQuant's MSE stage (latentq/turboquant.h)
//   lm{2|3|4}-tensor | lm{2|3|4}-channel[-g{N}]              Lloyd-Max codebooks fitted on the fit split
//                                                            (latentq/lloyd_max.h); -g{N}: one codebook per N
//                                                            consecutive CHANNELS (N ≥ 1; not tokens as for int)
//   tc{R}[-lm]                                               transform coding (latentq/transform_coding.h): R bits
//                                                            per element, 0 < R ≤ 8, at most 3 decimals (tc2.5);
//                                                            per-component widths by reverse water-filling
//   engine presets (a per-target pair): the names of kPresets (spec_grammar() and `latentq formats` list them)
// The integer scale/offset dtype is fp16 unless -fp32 is given (-fp16 is accepted and omitted).
//
// Integer granularity, on a [T, D] row-major matrix (T tokens of all sequences, D = kv_lora_rank or
// qk_rope_head_dim):
//   tensor  : one (scale, offset) for the whole layer matrix, over all sequences.
//   channel : one (scale, offset) per latent dimension for each group of group_size consecutive
//             tokens of ONE sequence (0 = all tokens of the sequence); KIVI's key grouping. A group
//             never spans two sequences; a group size beyond a sequence's length means one group
//             for that sequence; a last, partial group uses its own statistics.
//   token   : one (scale, offset) per token for each group of group_size consecutive dimensions
//             (0 = all D dimensions); a last, partial group uses its own statistics.
// Block formats (element math in latentq/blockfmt.h): per token, blocks of `block` consecutive
// dimensions, one stored scale per block (see layout()); fp8-e4m3-tensor and nvfp4 also store one
// fp32 per-tensor scale per layer matrix.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "latentq/blockfmt.h"
#include "latentq/qmath.h"

namespace latentq {

using qmath::ScaleDtype;

/// Format family of a spec; one row of kFormats each.
enum class Format : uint8_t {
  Int = 0,        ///< INT8/4/2 with (scale, offset) per group
  BF16 = 1,       ///< bf16 storage baseline
  Fp8Tile = 2,    ///< FP8 e4m3, one scale per tile of each row (FlashMLA pow2 / vLLM fp32 rule)
  Fp8Tensor = 3,  ///< FP8 e4m3, one fp32 scale per layer matrix (vLLM kv_cache_dtype=fp8)
  MxFp8 = 4,      ///< OCP MX: e4m3 elements, E8M0 scale per 32
  MxFp4 = 5,      ///< OCP MX: e2m1 elements, E8M0 scale per 32
  NvFp4 = 6,      ///< e2m1, e4m3 scale per 16, fp32 per-tensor scale
  Q8_0 = 7,       ///< ggml q8_0
  Q4_0 = 8,       ///< ggml q4_0
  Q4_1 = 9,       ///< ggml q4_1
  Preset = 10,    ///< an engine's per-token record: one stored format for c_kv, one for k_pe
  Fp4Tile = 11,   ///< e2m1, one e4m3 scale per 16, no per-tensor scale (FlashMLA V4.1 FP4; -rcp: FlashInfer NVFP4 MLA)
  TurboQuant = 12,       ///< TurboQuant's MSE stage: Hadamard rotation, Lloyd-Max codebook of N(0, 1/D), fp16 row norm
  LloydMax = 13,         ///< Lloyd-Max codebooks fitted on the fit split: per layer matrix or per group of channels
  TransformCoding = 14,  ///< per-component widths by reverse water-filling, uniform or Gaussian Lloyd-Max codes
  IntTile = 15,          ///< signed INT4 per tile of 32 with an e4m3 scale amax/7 (SGLang's DeepSeek-V4 INT4 KV cache)
  Count                  ///< the number of formats (kFormats has one row per value before it)
};
inline constexpr size_t kFormatCount = static_cast<size_t>(Format::Count);
enum class Scheme : uint8_t { Sym = 0, Asym = 1 };
enum class Granularity : uint8_t { Tensor = 0, Channel = 1, Token = 2 };
/// Scale rule of an FP8 tile / tensor spec.
enum class ScaleRule : uint8_t {
  None = 0,
  Pow2 = 1,              ///< FlashMLA: 2^ceil(log2(max(amax/448, 1e-4)))
  Fp32 = 2,              ///< vLLM fp8_ds_mla: max(amax/448, FLT_MIN), raw fp32
  Calibrated = 3,        ///< per-tensor amax/448
  Unit = 4,              ///< per-tensor 1.0 (uncalibrated)
  Reciprocal = 5,        ///< fp4 tile: s = e4m3(amax/6) unclamped, elements times 1/s (FlashInfer NVFP4 MLA)
  NormCorrected = 6,     ///< TurboQuant: the decode renormalizes the codeword to unit norm (vLLM's `_nc` presets)
  GaussianCodebook = 7,  ///< TransformCoding -lm: unit-variance Gaussian Lloyd-Max codes scaled by each component's std
  Ue8m0Ceil = 8,  ///< mxfp4-ceil (SGLang's MXFP4 indexer cache): 2^ceil(log2(max(amax/6, 1e-4))), e2m1 by thresholds
  Pow2AmaxFloor = 9,  ///< fp8 tile -pow2-amaxfloor (vLLM's DSA indexer cache): 2^ceil(log2(max(amax, 1e-4)/448)), fp32
  Ue8m0Round = 10,    ///< mxfp4-rn (SGLang's DeepSeek-V4 MXFP4 KV cache): 2^round(log2(amax/6)), e2m1 RNE
};

/// Which cached tensor a spec is applied to: the MLA latent cache's two (an engine preset stores them differently),
/// for sparse MLA (DeepSeek-V3.2, GLM-5) and DeepSeek-V4's CSA layers the indexer's key cache, which takes plain
/// formats only, and DeepSeek-V4's two attention entries (one row holds K = V: its first head_dim - qk_rope_head_dim
/// columns are an engine record's "c_kv" part, its last qk_rope_head_dim its "k_pe" part).
enum class Target : uint8_t { CKV = 0, KPE = 1, IndexK = 2, WindowKV = 3, CompressedKV = 4 };

/// One row per target, in Target order: its results name, the dump attribute that gives its row width, and what it
/// is. Whatever names, parses or sizes a target reads this table.
struct TargetTraits {
  Target target;
  const char* name;   ///< as /latent_error, /not_applicable and the config name it
  const char* width;  ///< the row width's name in the dump (latentq/dump.h DumpAttrs)
  const char* what;
};
inline constexpr TargetTraits kTargets[] = {
    {Target::CKV, "c_kv", "kv_lora_rank",
     "the MLA latent c_kv (kv_a_proj_with_mqa's first rows, after kv_a_layernorm)"},
    {Target::KPE, "k_pe", "qk_rope_head_dim", "the shared RoPE key k_pe (after RoPE)"},
    {Target::IndexK, "index_k", "index_head_dim",
     "the DSA indexer's key cache of sparse MLA (after its k_norm and RoPE; one 128-wide key per token in "
     "DeepSeek-V3.2 and GLM-5) and of DeepSeek-V4's CSA layers (one key per compressed entry, not per token)"},
    {Target::WindowKV, "window_kv", "head_dim",
     "DeepSeek-V4's shared K = V sliding-window entry of every token ([T, head_dim], after RoPE on its last "
     "qk_rope_head_dim columns, interleaved pairs)"},
    {Target::CompressedKV, "compressed_kv", "head_dim",
     "DeepSeek-V4's CSA / HCA compressor entries ([N, head_dim], one per compress_rate tokens of a sequence, the "
     "same RoPE slice)"},
};
inline constexpr size_t kTargetCount = std::size(kTargets);
static_assert(kTargets[0].target == Target::CKV && kTargets[1].target == Target::KPE &&
                  kTargets[2].target == Target::IndexK && kTargets[3].target == Target::WindowKV &&
                  kTargets[4].target == Target::CompressedKV,
              "kTargets is in Target order");
/// The MLA latent cache's targets (c_kv, k_pe): what an engine preset's record, /summary's bytes and the decision's
/// budgets count. The indexer key cache is counted apart (/indexer_error, the index_k rows of /latent_error), and so
/// are DeepSeek-V4's entries.
constexpr bool is_latent_target(Target t) { return t == Target::CKV || t == Target::KPE; }
/// DeepSeek-V4's attention entries (window_kv, compressed_kv): rows of head_dim whose last qk_rope_head_dim columns
/// are rotated; an engine record stores one entry row as its c_kv part followed by its k_pe part.
constexpr bool is_entry_target(Target t) { return t == Target::WindowKV || t == Target::CompressedKV; }

/// A parsed quantizer spec. Fields that do not apply to a format hold their defaults.
struct QuantSpec {
  Format format = Format::Int;
  int bits = 8;  ///< code bits: 8/4/2 (Int), 16 (BF16), 8 (fp8, mxfp8, q8_0), 4 (fp4, q4), 2/3/4 (TurboQuant);
                 ///< TransformCoding: ceil(R), the results column `bits` (the widths vary per component)
  Scheme scheme = Scheme::Asym;                   ///< Int only
  Granularity granularity = Granularity::Tensor;  ///< Int only
  int64_t group_size = 0;  ///< Int channel/token: group length, 0 = whole axis; Fp8Tile: tile width; LloydMax
                           ///< channel: channels per codebook (0 = 1)
  ScaleDtype scale_dtype = ScaleDtype::F16;  ///< dtype of the stored per-group scale (see kFormats)
  ScaleRule rule = ScaleRule::None;          ///< Fp8Tile / Fp8Tensor; Fp4Tile (Reciprocal); TurboQuant (NormCorrected);
                                             ///< TransformCoding (GaussianCodebook for -lm)
  uint8_t preset = 0;                        ///< Preset: index into kPresets
  int rate_milli = 0;  ///< TransformCoding: R in thousandths of a bit per element (tc2.5 → 2500), 1..8000

  /// Parse a spec string. Throws std::invalid_argument naming the string and listing the valid
  /// forms for an unknown string, bits outside {2,4,8}, a negative or malformed group size, a
  /// group size on a per-tensor spec, or a retired name (with its replacement).
  static QuantSpec parse(std::string_view s);
  /// Canonical string; parse(to_string()) == *this.
  std::string to_string() const;

  /// The format actually stored for `target` (a preset's per-target format; else *this). Throws
  /// std::invalid_argument for a preset and Target::IndexK (a record holds c_kv and k_pe only).
  QuantSpec stored_for(Target target) const;

  bool operator==(const QuantSpec&) const = default;
};

/// Which code quantizes and dequantizes a stored format (quantize.cpp's kernels, kernels/quant/quantize_cuda.cu).
enum class Storage : uint8_t {
  Int = 0,              ///< integer groups (scale, offset)
  Bf16 = 1,             ///< bf16 elements
  Block = 2,            ///< the block formats of latentq/blockfmt.h (fp8, mx, nvfp4, fp4, ggml)
  TurboQuant = 3,       ///< rotated codebook rows (latentq/turboquant.h)
  LloydMax = 4,         ///< fitted Lloyd-Max codebooks (latentq/lloyd_max.h)
  TransformCoding = 5,  ///< per-component widths (latentq/transform_coding.h)
  Record = 6,           ///< an engine preset: one stored format per target (kPresets)
};

/// Whether a token's stored bytes depend on that token alone, as decode order needs (latentq/decode_order.h).
enum class Causality : uint8_t {
  PerToken = 0,       ///< per-token scales or a fixed codebook: each token is encoded as it arrives
  PerMatrix = 1,      ///< a per-matrix constant (a per-tensor scale, codebooks or widths fitted on the matrix)
  ByGranularity = 2,  ///< Int: token groups and channel groups of N tokens are causal; tensor and whole-axis not
  ByTargets = 3,      ///< Preset: causal when the formats of both targets are
};

/// One row of the format descriptor table (ggml's type_traits style): everything latentq states about a format
/// family, in one place. Tests iterate the rows (their `examples`) rather than lists of their own.
struct FormatTraits {
  Format format;
  const char* grammar;      ///< the spec forms of this family (one line of spec_grammar())
  const char* family;       ///< results column `format`
  const char* scheme;       ///< results column `scheme` (nullptr: from the Int spec)
  const char* granularity;  ///< results column `granularity` (nullptr: from the Int spec)
  Storage storage;          ///< which code quantizes it
  Causality causality;      ///< whether decode order can encode it token by token
  const char* shapes;       ///< the row lengths D it takes, derived from layout() (what it refuses, and why)
  const char* engine;  ///< the engine that ships it as an MLA KV-cache setting, with that setting; nullptr: none does
                       ///< (a preset row names its own)
  const char* source;  ///< the engine file and commit, or the standard and section, it reproduces
  const char* reference;  ///< the test against code latentq did not write, or "hand-computed: <tests>" for latentq's
                          ///< own families
  std::span<const char* const> examples;  ///< specs of this family that every format test runs (presets: kPresets)
};
/// The descriptor table, one row per Format in enum order (checked at compile time in spec.cpp).
extern const FormatTraits kFormats[kFormatCount];
inline const FormatTraits& traits(Format f) { return kFormats[static_cast<int>(f)]; }

/// Order of the parts of an engine's per-token record (pack_record() in quantize.h).
enum class RecordOrder : uint8_t {
  CodesScalesRope = 0,         ///< c_kv codes | c_kv scales | k_pe (V3.2 / vLLM fp8_ds_mla)
  CodesRopeScalesPad8 = 1,     ///< c_kv codes | k_pe | c_kv scales | zero pad to a multiple of 8 (MODEL1)
  CodesCodesScalesScales = 2,  ///< c_kv codes | k_pe codes | c_kv scales | k_pe scales (V4.1)
  CodesScalesPad16Rope = 3,    ///< c_kv codes | c_kv scales | 16 zero bytes | k_pe (vLLM fork nvfp4_ds_mla)
  CodesScalesAlign16Rope = 4,  ///< c_kv codes | c_kv scales | zero pad to a 16-byte boundary | k_pe (SGLang V4 368 B)
  /// c_kv codes | e2m1 codes of k_pe | c_kv scales | k_pe's e2m1 scales | 16 zero bytes | k_pe (the DeepSeek-V4 NVFP4
  /// 432 B record: all 512 entry columns in c_kv's fp4 format, then the rope columns again as stored; native 64-wide
  /// k_pe only)
  Fp4AllScalesPad16Rope = 5,
};

/// Zero bytes a record of `order` adds to its parts' `bytes` (pack_record writes them as 0).
constexpr int64_t record_pad_bytes(RecordOrder order, int64_t bytes) {
  if (order == RecordOrder::CodesRopeScalesPad8) return (bytes + 7) / 8 * 8 - bytes;
  if (order == RecordOrder::CodesScalesPad16Rope) return 16;
  if (order == RecordOrder::CodesScalesAlign16Rope) return (bytes + 15) / 16 * 16 - bytes;  // k_pe: 16-byte multiple
  if (order == RecordOrder::Fp4AllScalesPad16Rope) return 32 + 4 + 16;  // 64 rope columns in e2m1, 4 scales, 16 zero
  return 0;
}

/// One target's part of an engine record as its source describes it: code bits per element, one scale of
/// `scale_bytes` per `block` elements (block 0: none per token), and `row_bytes` more per token (TurboQuant's
/// fp16 norm). The bytes of D elements: ceil(D·bits/8) + ceil(D/block)·scale_bytes + row_bytes.
struct RecordPart {
  int bits = 0;
  int64_t block = 0;
  int scale_bytes = 0;
  int row_bytes = 0;
  constexpr int64_t bytes(int64_t D) const {
    return (D * bits + 7) / 8 + (block > 0 ? (D + block - 1) / block * scale_bytes : 0) + row_bytes;
  }
};

/// An engine preset: the formats of c_kv and k_pe in the engine's per-token record.
struct PresetTraits {
  const char* name;
  const char* ckv;     ///< spec of c_kv
  const char* kpe;     ///< spec of k_pe
  const char* source;  ///< engine file / layout name, with the commit or PR read
  RecordOrder order;   ///< the per-token record (pack_record)
  int64_t native_ckv;  ///< the c_kv width the engine record is defined for (0: any); pack_record refuses others
  int64_t native_kpe;  ///< the k_pe width likewise
  const char* engine;  ///< the engine and the setting that store this record (e.g. vLLM --kv-cache-dtype fp8_ds_mla)
  int64_t stated_bytes;          ///< the record's bytes per token as the source states them, at the native widths
                                 ///< (512 + 64 where native is 0)
  RecordPart ckv_part, kpe_part;  ///< the record's parts as the source describes them (their sum, padded as
                                  ///< `order` says, is checked against stated_bytes at compile time)
  const char* reference;          ///< the test of its bytes against the engine's code
  /// The bytes of the parts at the native widths (512 + 64 where native is 0), padded as `order` says.
  constexpr int64_t parts_bytes() const {
    const int64_t b = ckv_part.bytes(native_ckv ? native_ckv : 512) + kpe_part.bytes(native_kpe ? native_kpe : 64);
    return b + record_pad_bytes(order, b);
  }
};
inline constexpr size_t kPresetCount = 14;
extern const PresetTraits kPresets[kPresetCount];

/// An engine's cache of the sparse-attention (DSA) indexer key, one row of kIndexerPresets: the indexer key of
/// one token (index_head_dim wide, 128 on DeepSeek-V3.2 and GLM-5) as the engine stores it, in one of the formats
/// of kFormats: vLLM's FP8 DeepseekV32IndexerCache (132 B) and SGLang's MXFP4 index-K cache (68 B). The table says
/// which stored format reproduces which engine's bytes, and on which scale blocks (`exact_when`); the test named in
/// `reference` checks every row against its engine's formula block by block, both ways.
struct IndexerPresetTraits {
  const char* name;
  const char* spec;          ///< the kFormats example that stores the key (layout(), quantize())
  int64_t width;             ///< the key width the engine's cache is defined for (index_head_dim)
  const char* engine;        ///< the engine, its cache class and the setting that selects this cache
  const char* source;        ///< the engine's quantizing code: file, function and commit
  const char* page_layout;   ///< where the engine puts a token's codes and scale (its page, not one record)
  int64_t stated_bytes;      ///< bytes per token as the source states them, at `width`
  RecordPart part;           ///< the key's part as the source describes it (checked against stated_bytes)
  const char* exact_when;    ///< the scale blocks on which `spec` gives the engine's bytes ("all", or the condition)
  const char* reference;     ///< the test of its bytes against the engine's formula
};
inline constexpr size_t kIndexerPresetCount = 2;
extern const IndexerPresetTraits kIndexerPresets[kIndexerPresetCount];

/// One named format of the table, as `latentq formats` and latentq.formats() list it: every example of every
/// format row, and every preset.
struct FormatRow {
  std::string name;       ///< the spec string
  std::string family;     ///< results column `format` of its c_kv
  std::string engine;     ///< the engine and setting that ship it ("" when none)
  int64_t record_bytes;   ///< bytes per token of c_kv 512 + k_pe 64 (per-matrix bytes left out); -1: a width the
                          ///< format refuses
  double bits_per_element;  ///< record_bytes · 8 / 576
  bool causal;            ///< decode order can encode it token by token (decode_scale_is_causal)
  std::string shapes;     ///< the row lengths it takes
  std::string source;     ///< engine file and commit, or standard
  std::string reference;  ///< the test against code latentq did not write
};
/// Every example of kFormats and every preset, in table order.
std::vector<FormatRow> format_rows();
/// The spec strings of format_rows() (what the format tests iterate).
std::vector<std::string> format_examples();
/// True when an engine ships `spec` as an MLA KV-cache setting (the row's or the preset's engine field).
bool is_engine_format(const QuantSpec& spec);
/// The engine and setting of `spec` ("" when none ships it).
std::string engine_of(const QuantSpec& spec);

/// Byte layout of one stored target ([T, D] matrix) of a non-preset spec. Every stored byte is one
/// of: codes [T, row_code_bytes]; scales/offsets per group; a constant per matrix.
struct Layout {
  int code_bits = 0;                ///< bits per element code (16 for bf16)
  int64_t row_code_bytes = 0;       ///< code bytes of one token row, padded to a whole byte
  int64_t block = 0;                ///< width along D of a per-row scale group (token groups, tiles, blocks); 0 = none
  int64_t blocks_per_row = 0;       ///< ceil(D / block); 0 = none
  ScaleDtype sd = ScaleDtype::F32;  ///< dtype of the per-group scale and offset
  int scale_bytes = 0;              ///< bytes of one stored scale (0 = none stored per group)
  bool offsets = false;             ///< an offset is stored next to each scale
  bool channel = false;             ///< per-channel token groups: scales [G, D] (count depends on seq_offsets)
  int64_t tensor_bytes = 0;         ///< bytes stored once per matrix (per-tensor scale/offset, global scale, codebooks)
  int64_t codebooks = 0;            ///< LloydMax: fitted codebooks per matrix (1 per tensor, ceil(D / N) per channel)
  int64_t codebook_width = 0;       ///< LloydMax: channels per codebook (D for tensor)
  int64_t code_budget_bits = 0;  ///< TransformCoding: Σ of the component widths may not exceed it (8·row_code_bytes)
  bool block_format = false;     ///< quantized through latentq/blockfmt.h
  qmath::BlockDesc desc{};       ///< block formats: the kernel/CPU block description

  /// Bytes per token of one layer for one target, metadata included, for formats whose storage is
  /// per token (per-token groups, blocks, bf16); per-matrix bytes are left out (amortized over T).
  int64_t bytes_per_token() const { return row_code_bytes + blocks_per_row * scale_bytes * (offsets ? 2 : 1); }
};
/// The layout of `stored` (not a preset) for rows of D elements. Throws std::invalid_argument for
/// D ≤ 0, a preset, or a width the format cannot take (why_not_applicable(), whose reason it gives).
Layout layout(const QuantSpec& stored, int64_t D);

/// Why `spec` cannot store `target` as rows of D elements, or "" when it can: the widths the `shapes` of its
/// kFormats row state, the one rule layout() and the quantizers refuse by (ggml q8_0 / q4_0 / q4_1: D a multiple
/// of 32; TurboQuant: a Hadamard block of D, transform.h hadamard_block; transform coding: R·D >= 8 bits; a
/// preset: its stored format of `target`; no preset can store index_k). The reason does not name the spec (e.g.
/// "ggml blocks need a row length that is a multiple of 32, got 16"), so specs refused alike share it. Throws
/// std::invalid_argument for D ≤ 0 (no width at all, not a shape a format refuses).
std::string why_not_applicable(const QuantSpec& spec, Target target, int64_t D);

/// Bytes of the engine's per-token record of a preset for c_kv of D_ckv and k_pe of D_kpe elements.
int64_t record_bytes(const QuantSpec& preset, int64_t D_ckv, int64_t D_kpe);

/// Human-readable list of the valid spec forms (used in error messages and --help).
std::string spec_grammar();

const char* to_string(Scheme);
const char* to_string(Granularity);
const char* to_string(Target);
const char* to_string(ScaleDtype);
/// Results labels of a stored spec: columns format, scheme, granularity, scale_dtype.
const char* family_of(const QuantSpec&);
const char* scheme_of(const QuantSpec&);
const char* granularity_of(const QuantSpec&);
const char* scale_dtype_of(const QuantSpec&);
/// Parses a kTargets name ("c_kv", "k_pe", "index_k", "window_kv", "compressed_kv"); throws std::invalid_argument
/// listing them otherwise.
Target parse_target(std::string_view);

}  // namespace latentq
