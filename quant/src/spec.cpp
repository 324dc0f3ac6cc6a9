#include "latentq/spec.h"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "latentq/decode_order.h"
#include "latentq/transform.h"

namespace latentq {

// Each row's examples: what every format test runs (the edge sweep, the CPU kernels, the GPU and emulator tests,
// the engine references). The integer row: every bits x scheme x granularity x group size {0, 32, 128}, fp32 scales,
// and group sizes that do not divide a byte, a warp or D.
constexpr const char* kIntExamples[] = {
    "int8-sym-tensor", "int8-asym-tensor", "int4-sym-tensor", "int4-asym-tensor", "int2-sym-tensor", "int2-asym-tensor",
    "int8-sym-channel", "int8-sym-channel-g32", "int8-sym-channel-g128", "int8-asym-channel", "int8-asym-channel-g32",
    "int8-asym-channel-g128", "int4-sym-channel", "int4-sym-channel-g32", "int4-sym-channel-g128", "int4-asym-channel",
    "int4-asym-channel-g32", "int4-asym-channel-g128", "int2-sym-channel", "int2-sym-channel-g32",
    "int2-sym-channel-g128", "int2-asym-channel", "int2-asym-channel-g32", "int2-asym-channel-g128", "int8-sym-token",
    "int8-sym-token-g32", "int8-sym-token-g128", "int8-asym-token", "int8-asym-token-g32", "int8-asym-token-g128",
    "int4-sym-token", "int4-sym-token-g32", "int4-sym-token-g128", "int4-asym-token", "int4-asym-token-g32",
    "int4-asym-token-g128", "int2-sym-token", "int2-sym-token-g32", "int2-sym-token-g128", "int2-asym-token",
    "int2-asym-token-g32", "int2-asym-token-g128",
    "int8-sym-tensor-fp32", "int4-asym-channel-g32-fp32", "int2-asym-channel-fp32", "int4-asym-token-g128-fp32",
    "int8-sym-token-g32-fp32",
    "int4-asym-token-g3", "int2-sym-token-g5", "int4-asym-token-g1", "int8-asym-token-g33", "int2-asym-token-g100",
    "int4-asym-channel-g1", "int2-asym-channel-g7", "int4-sym-channel-g33", "int8-asym-channel-g600"};
constexpr const char* kBf16Examples[] = {"bf16"};
constexpr const char* kFp8TileExamples[] = {"fp8-e4m3-tile128-pow2", "fp8-e4m3-tile64-pow2-ue8m0",
                                            "fp8-e4m3-tile32-pow2-ue8m0", "fp8-e4m3-tile20-pow2",
                                            "fp8-e4m3-tile128-fp32", "fp8-e4m3-tile32-fp32",
                                            "fp8-e4m3-tile128-pow2-amaxfloor"};
constexpr const char* kFp8TensorExamples[] = {"fp8-e4m3-tensor", "fp8-e4m3-tensor-s1"};
constexpr const char* kMxFp8Examples[] = {"mxfp8"};
constexpr const char* kMxFp4Examples[] = {"mxfp4", "mxfp4-ceil", "mxfp4-rn"};
constexpr const char* kNvFp4Examples[] = {"nvfp4"};
constexpr const char* kQ8_0Examples[] = {"q8_0"};
constexpr const char* kQ4_0Examples[] = {"q4_0"};
constexpr const char* kQ4_1Examples[] = {"q4_1"};
constexpr const char* kFp4TileExamples[] = {"fp4-e2m1-tile16-e4m3", "fp4-e2m1-tile16-e4m3-rcp"};
constexpr const char* kTurboQuantExamples[] = {"tq2", "tq3", "tq4", "tq3-nc", "tq4-nc"};
constexpr const char* kLloydMaxExamples[] = {"lm2-tensor", "lm3-channel", "lm4-channel-g8", "lm3-channel-g5"};
constexpr const char* kTransformCodingExamples[] = {"tc3", "tc4", "tc2-lm", "tc2.5", "tc0.75-lm", "tc8"};
constexpr const char* kIntTileExamples[] = {"int4-sym-g32-e4m3"};

// clang-format off
constexpr FormatTraits kFormats[kFormatCount] = {
  {Format::Int, "int{8|4|2}-{sym|asym}-tensor[-fp32] | int{8|4|2}-{sym|asym}-{channel|token}[-g<N>][-fp32]   (N >= 0; g0 or no -g = whole axis; scale/offset fp16 unless -fp32)",
   "int", nullptr, nullptr, Storage::Int, Causality::ByGranularity, "any D",
   nullptr, "KIVI (arXiv 2402.02750) min/max scalar quantization",
   "hand-computed: QuantizeHand.*, QuantizeProps.* (tests/quant)", kIntExamples},
  {Format::BF16, "bf16", "bf16", "none", "element", Storage::Bf16, Causality::PerToken, "any D",
   nullptr, "bf16 storage, round to nearest even (the engines' default cache dtype on a bf16 model)",
   "engine_refs.bf16_bits (ml-dtypes bfloat16; tests/python/test_engine_formats.py)", kBf16Examples},
  {Format::Fp8Tile, "fp8-e4m3-tile<N>-pow2[-ue8m0 | -amaxfloor] | fp8-e4m3-tile<N>-fp32   (N > 0; pow2: FlashMLA 2^ceil(log2(max(amax/448,1e-4))), -ue8m0 stores it as one byte; -amaxfloor: vLLM's DSA indexer cache 2^ceil(log2(max(amax,1e-4)/448)); fp32: vLLM max(amax/448, FLT_MIN))",
   "fp8", "sym", "tile", Storage::Block, Causality::PerToken, "any D (a last, partial tile keeps its own scale)",
   nullptr, "FlashMLA tests/quant.py quantize_k_cache at 520fec6 / 9a7d253 (pow2); vLLM csrc/cache_kernels.cu concat_and_cache_ds_mla_kernel at 254db42e (fp32)",
   "engine_refs.fp8_tile_pow2 / fp8_tile_fp32 (FlashMLA, vLLM written out; tests/python/test_engine_formats.py)", kFp8TileExamples},
  {Format::Fp8Tensor, "fp8-e4m3-tensor[-s1]   (one fp32 scale per layer matrix: amax/448, or 1.0 with -s1)",
   "fp8", "sym", "tensor", Storage::Block, Causality::PerMatrix, "any D",
   "vLLM --kv-cache-dtype fp8 (one k_scale per layer: calibrated, or 1.0 as -s1)", "vLLM kv_cache_dtype=fp8 on MLA (scaled_convert: x/scale, saturating)",
   "engine_refs.fp8_tensor (vLLM written out; tests/python/test_engine_formats.py)", kFp8TensorExamples},
  {Format::MxFp8, "mxfp8   (e4m3, one E8M0 scale per 32)", "mx", "sym", "block", Storage::Block, Causality::PerToken, "any D (a last, partial block keeps its own scale)",
   nullptr, "OCP Microscaling v1.0 MXFP8, section 6.3 floor rule",
   "engine_refs.mx (against torchao to_mx and ml-dtypes; tests/python/test_engine_formats.py)", kMxFp8Examples},
  {Format::MxFp4, "mxfp4   (e2m1, one E8M0 scale per 32; mxfp4-ceil: SGLang's ceil scale, codes by thresholds; mxfp4-rn: SGLang's round-to-nearest scale 2^round(log2(amax/6)), RNE codes)", "mx", "sym", "block", Storage::Block, Causality::PerToken, "any D (a last, partial block keeps its own scale)",
   nullptr, "OCP Microscaling v1.0 MXFP4, section 6.3 floor rule; mxfp4-ceil: SGLang python/sglang/srt/layers/attention/dsv4/fp4_indexer.py at 301bcf08 (_quantize_fp4_indexer_kernel, its DSA indexer key cache); mxfp4-rn: SGLang python/sglang/srt/layers/attention/dsv4/mxfp4_k_cache.py at 07619bc2 (_quantize_mxfp4_k_cache_into_kernel, the DeepSeek-V4 MXFP4 KV cache of PRs 37136 / 37138)",
   "engine_refs.mx (against torchao to_mx and ml-dtypes); mxfp4-ceil: engine_refs.sglang_mxfp4; mxfp4-rn: engine_refs.sglang_mxfp4_rn (tests/python/test_engine_formats.py)", kMxFp4Examples},
  {Format::NvFp4, "nvfp4   (e2m1, one e4m3 scale per 16, one fp32 per-tensor scale)", "nvfp4", "sym", "block", Storage::Block, Causality::PerMatrix, "any D (a last, partial block keeps its own scale)",
   nullptr, "NVFP4 as torchao prototype/mx_formats/nvfp4_tensor.py nvfp4_quantize (two-level scaling)",
   "engine_refs.nvfp4 (against torchao nvfp4_quantize; tests/python/test_engine_formats.py)", kNvFp4Examples},
  {Format::Q8_0, "q8_0   (ggml: int8, fp16 d per 32)", "ggml", "sym", "block", Storage::Block, Causality::PerToken, "D a multiple of 32 (ggml's blocks never straddle rows)",
   "llama.cpp --cache-type-k q8_0 (the MLA cache's 576-wide K row)", "ggml ggml-quants.c quantize_row_q8_0_ref",
   "engine_refs.q8_0 (against gguf.quants; tests/python/test_engine_formats.py)", kQ8_0Examples},
  {Format::Q4_0, "q4_0   (ggml: 4-bit, fp16 d per 32)", "ggml", "sym", "block", Storage::Block, Causality::PerToken, "D a multiple of 32 (ggml's blocks never straddle rows)",
   "llama.cpp --cache-type-k q4_0 (the MLA cache's 576-wide K row)", "ggml ggml-quants.c quantize_row_q4_0_ref",
   "engine_refs.q4_0 (against gguf.quants; tests/python/test_engine_formats.py)", kQ4_0Examples},
  {Format::Q4_1, "q4_1   (ggml: 4-bit, fp16 d and min per 32)", "ggml", "asym", "block", Storage::Block, Causality::PerToken, "D a multiple of 32 (ggml's blocks never straddle rows)",
   "llama.cpp --cache-type-k q4_1 (the MLA cache's 576-wide K row)", "ggml ggml-quants.c quantize_row_q4_1_ref",
   "engine_refs.q4_1 (against gguf.quants; tests/python/test_engine_formats.py)", kQ4_1Examples},
  {Format::Preset, "an engine preset   (an engine's per-token record: c_kv and k_pe formats; the names: kPresets)",
   "preset", nullptr, nullptr, Storage::Record, Causality::ByTargets, "those of its two formats; pack_record: the record's native widths",
   nullptr, "see kPresets", "see kPresets", {}},
  {Format::Fp4Tile, "fp4-e2m1-tile16-e4m3[-rcp]   (e2m1, one e4m3 scale per 16, no per-tensor scale: e4m3(clamp(amax/6, 2^-9, 448)) and x/s; -rcp: e4m3(amax/6) and x·(1/s))",
   "fp4", "sym", "tile", Storage::Block, Causality::PerToken, "any D (a last, partial tile keeps its own scale)",
   nullptr, "FlashMLA tests/quant.py V41_FP4Sparse at 9a7d253; -rcp: FlashInfer sparse_mla_sm120 nvfp4_quantization.cuh at 3fe65b06 (PR 4955), and vLLM's cvt_warp_fp16_to_fp4 at global scale 1.0 on bf16/fp16 rows (the vllm-nvfp4-ds-mla preset)",
   "engine_refs.fp4_tile16_e4m3_flashmla / fp4_tile16_e4m3_flashinfer (FlashMLA, FlashInfer written out; tests/python/test_engine_formats.py)", kFp4TileExamples},
  {Format::TurboQuant, "tq{2|3|4}[-nc]   (TurboQuant MSE stage: Hadamard, Lloyd-Max codebook of N(0,1/D), fp16 row norm per token; -nc: norm-corrected decode)",
   "turboquant", "codebook", "token", Storage::TurboQuant, Causality::PerToken, "D with a power-of-two Hadamard block (quant/README.md, TurboQuant)",
   nullptr, "vLLM TurboQuant for MLA (arXiv 2504.19874; turboquant/centroids.py at 06d0369d, triton_turboquant_store.py at b40f4cc9)",
   "test_turboquant_vllm.test_store_matches_vllm (vLLM's codebook and store written out)", kTurboQuantExamples},
  {Format::LloydMax, "lm{2|3|4}-tensor | lm{2|3|4}-channel[-g<N>]   (Lloyd-Max codebooks fitted on the fit split: one per layer matrix, per channel, or per N consecutive channels; fp16 centroids stored per matrix)",
   "lloyd-max", "codebook", nullptr, Storage::LloydMax, Causality::PerMatrix, "any D",
   nullptr, "Lloyd (1982) / Max (1960) scalar quantizer, fitted per layer as KVQuant's non-uniform codebooks (arXiv 2401.18079)",
   "hand-computed: LloydMax.* (fits by hand, Max's Gaussian tables)", kLloydMaxExamples},
  {Format::TransformCoding, "tc<R>[-lm]   (transform coding at R bits per element, 0 < R <= 8, at most 3 decimals: widths 0..8 per component by greedy reverse water-filling on the fit split's variances; uniform codes, or -lm: Gaussian Lloyd-Max codes; use after klt, for the KLT basis)",
   "transform-coding", "water-filling", "component", Storage::TransformCoding, Causality::PerMatrix, "R·D >= 8 (at least one code byte per token)",
   nullptr, "Huang & Schultheiss (1963) block quantization; greedy integer bit allocation (Gersho & Gray 1992, section 8.4)",
   "hand-computed: TransformCoding* (widths, record and code bytes, Max's tables)", kTransformCodingExamples},
  {Format::IntTile, "int4-sym-g32-e4m3   (signed INT4 in [-7, 7] per tile of 32, one e4m3 scale e4m3(min(amax/7, 448)), codes rne(x/s); SGLang's DeepSeek-V4 INT4 KV cache)",
   "int-e4m3", "sym", "tile", Storage::Block, Causality::PerToken, "any D (a last, partial tile keeps its own scale)",
   nullptr, "SGLang python/sglang/srt/mem_cache/kvbit_dsv4_codec.py encode_dsv4_int4_reference at 2754fe74 (PR 38301, --kv-cache-dtype int4; its Triton _dsv4_int4_pack_scatter_kernel states the same rule)",
   "engine_refs.sglang_int4_e4m3 (SGLang's reference codec written out; tests/python/test_engine_formats.py)", kIntTileExamples},
};

constexpr PresetTraits kPresets[kPresetCount] = {
  {"flashmla-v32-fp8", "fp8-e4m3-tile128-pow2", "bf16", "FlashMLA V32_FP8Sparse (tests/quant.py quantize_k_cache at 520fec6): 656 B at 512 + 64",
   RecordOrder::CodesScalesRope, 0, 0, "FlashMLA sparse decode, DeepSeek-V3.2's FP8 KV cache (V32_FP8Sparse)", 656,
   {8, 128, 4, 0}, {16, 0, 0, 0}, "engine_refs.flashmla_v32_record (test_cpp_pack_record_matches_reference)"},
  {"vllm-fp8-ds-mla", "fp8-e4m3-tile128-fp32", "bf16",
   "vLLM fp8_ds_mla (csrc/cache_kernels.cu concat_and_cache_ds_mla_kernel at 254db42e): 656 B at 512 + 64",
   RecordOrder::CodesScalesRope, 0, 0, "vLLM --kv-cache-dtype fp8_ds_mla", 656,
   {8, 128, 4, 0}, {16, 0, 0, 0}, "engine_refs.vllm_fp8_ds_mla_record (test_cpp_pack_record_matches_reference)"},
  {"flashmla-model1-fp8", "fp8-e4m3-tile64-pow2-ue8m0", "bf16",
   "FlashMLA MODEL1_FP8Sparse (tests/quant.py at 9a7d253; 448 nope + 64 rope, tile 64, UE8M0 scale bytes): 584 B at 448 + 64",
   RecordOrder::CodesRopeScalesPad8, 448, 64, "FlashMLA sparse decode, DeepSeek-V4's FP8 cache entry (MODEL1_FP8Sparse)", 584,
   {8, 64, 1, 0}, {16, 0, 0, 0}, "engine_refs.flashmla_model1_record (test_cpp_pack_record_matches_reference)"},
  {"flashmla-v41-fp8", "fp8-e4m3-tile32-pow2-ue8m0", "fp8-e4m3-tile32-pow2-ue8m0",
   "FlashMLA V4.1 FP8 (csrc/cuda_kernels/kv_cache_format.h at 9a7d253; tile 32, rope dims quantized too): 528 B at 448 + 64",
   RecordOrder::CodesCodesScalesScales, 448, 64, "FlashMLA V4.1 FP8 KV cache (kv_cache_format.h)", 528,
   {8, 32, 1, 0}, {8, 32, 1, 0}, "engine_refs.flashmla_v41_fp8_record (test_cpp_pack_record_matches_reference)"},
  {"flashmla-v41-fp4", "fp4-e2m1-tile16-e4m3", "fp4-e2m1-tile16-e4m3",
   "FlashMLA V4.1 FP4 (tests/quant.py V41_FP4Sparse at 9a7d253; tile 16, e4m3 scales): 288 B at 448 + 64",
   RecordOrder::CodesCodesScalesScales, 448, 64, "FlashMLA V4.1 FP4 KV cache (V41_FP4Sparse)", 288,
   {4, 16, 1, 0}, {4, 16, 1, 0}, "engine_refs.flashmla_v41_fp4_record (test_cpp_pack_record_matches_reference)"},
  {"vllm-turboquant-4bit-nc", "tq4-nc", "bf16",
   "vLLM --kv-cache-dtype turboquant_4bit_nc on MLA (triton_mla_tq.py at b40f4cc9, PR 41803): 512 4-bit indices | fp16 norm | 64 bf16 k_pe = 386 B",
   RecordOrder::CodesScalesRope, 0, 0, "vLLM --kv-cache-dtype turboquant_4bit_nc", 386,
   {4, 0, 0, 2}, {16, 0, 0, 0}, "test_turboquant_vllm.test_record_matches_vllm_at_deepseek_v2_lite_dims (vLLM's store written out)"},
  {"vllm-turboquant-3bit-nc", "tq3-nc", "bf16",
   "vLLM --kv-cache-dtype turboquant_3bit_nc / turboquant_k3v4_nc on MLA (triton_mla_tq.py at b40f4cc9, PR 41803): 512 3-bit indices | fp16 norm | 64 bf16 k_pe = 322 B",
   RecordOrder::CodesScalesRope, 0, 0, "vLLM --kv-cache-dtype turboquant_3bit_nc (= turboquant_k3v4_nc on MLA)", 322,
   {3, 0, 0, 2}, {16, 0, 0, 0}, "test_turboquant_vllm.test_record_matches_vllm_at_deepseek_v2_lite_dims (vLLM's store written out)"},
  {"vllm-turboquant-k8v4", "fp8-e4m3-tensor-s1", "bf16",
   "vLLM --kv-cache-dtype turboquant_k8v4 on MLA (triton_mla_tq.py at b40f4cc9, PR 41803; k_scale 1.0): 512 e4m3 | 64 bf16 k_pe = 640 B",
   RecordOrder::CodesScalesRope, 0, 0, "vLLM --kv-cache-dtype turboquant_k8v4", 640,
   {8, 0, 0, 0}, {16, 0, 0, 0}, "engine_refs.vllm_turboquant_k8v4_record (test_cpp_pack_record_matches_reference)"},
  {"flashinfer-nvfp4-mla", "fp4-e2m1-tile16-e4m3-rcp", "bf16",
   "FlashInfer NVFP4 sparse MLA for DeepSeek-V4 (nvfp4_cache_traits.cuh at 3fe65b06, PR 4955; SGLang PR 38646): 224 B e2m1 | 128 B bf16 rope | 28 e4m3 scales | 4 pad = 384 B",
   RecordOrder::CodesRopeScalesPad8, 448, 64, "FlashInfer NVFP4 sparse MLA (PR 4955), SGLang's DeepSeek-V4 NVFP4 KV cache (PR 38646)", 384,
   {4, 16, 1, 0}, {16, 0, 0, 0}, "engine_refs.flashinfer_nvfp4_mla_record (test_cpp_pack_record_matches_reference)"},
  {"vllm-nvfp4-ds-mla", "fp4-e2m1-tile16-e4m3-rcp", "bf16",
   "local-inference-lab/vllm nvfp4_ds_mla (PR 82; csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu concat_and_cache_nvfp4_mla_kernel at 42d67f76, cvt_warp_fp16_to_fp4 of quantization/fp4/nvfp4_utils.cuh at 28be48fa with global scale 1.0): 256 B e2m1 | 32 e4m3 scales | 16 zero bytes | 64 bf16 k_pe = 432 B",
   RecordOrder::CodesScalesPad16Rope, 512, 64, "vLLM fork local-inference-lab/vllm --kv-cache-dtype nvfp4_ds_mla (B12X_MLA_SPARSE: GLM-5, DeepSeek-V3.2)", 432,
   {4, 16, 1, 0}, {16, 0, 0, 0}, "engine_refs.vllm_nvfp4_ds_mla_record (test_cpp_pack_record_matches_reference)"},
  {"sglang-dsv4-mxfp4", "mxfp4-rn", "bf16",
   "SGLang DeepSeek-V4 MXFP4 KV cache (python/sglang/srt/layers/attention/dsv4/mxfp4_k_cache.py at 07619bc2, PRs 37136 / 37138): 224 B e2m1 | 14 UE8M0 | 2 zero bytes | 64 bf16 rope = 368 B",
   RecordOrder::CodesScalesAlign16Rope, 448, 64, "SGLang --kv-cache-dtype fp4_e2m1 (--fp4-kv-cache-recipe mxfp4) for DeepSeek-V4 on SM90 (PR 37138: SWA, C4 and C128 pools)", 368,
   {4, 32, 1, 0}, {16, 0, 0, 0}, "engine_refs.sglang_dsv4_mxfp4_record (test_cpp_pack_record_matches_reference)"},
  {"sglang-dsv4-int4", "int4-sym-g32-e4m3", "bf16",
   "SGLang DeepSeek-V4 Direct INT4 KV cache (python/sglang/srt/mem_cache/kvbit_dsv4_codec.py encode_dsv4_int4_reference and kvbit_dsv4_layout_constants.py at 2754fe74, PR 38301, layout aos_368): 224 B int4 | 14 e4m3 | 2 zero bytes | 64 bf16 rope = 368 B",
   RecordOrder::CodesScalesAlign16Rope, 448, 64, "SGLang --kv-cache-dtype int4 for DeepSeek-V4 on SM90 (PR 38301; SGLANG_DSV4_INT4_LAYOUT=aos_368)", 368,
   {4, 32, 1, 0}, {16, 0, 0, 0}, "engine_refs.sglang_dsv4_int4_record (test_cpp_pack_record_matches_reference)"},
  {"b12x-dsv4-nvfp4", "fp4-e2m1-tile16-e4m3-rcp", "bf16",
   "DeepSeek-V4 NVFP4 432 B record of local-inference-lab/vllm PR 632 and b12x PR 304 (neither in the corpus read); layout and rule as tpurtell/ds4fv-vllm-28-sm12x overlay/vllm/models/deepseek_v4/common/ops/nvfp4_ds_mla.py _store_nvfp4_latent at 6407692e writes B12x's record: 256 B e2m1 of all 512 entry columns | 32 e4m3 | 16 zero bytes | 64 bf16 rope = 432 B",
   RecordOrder::Fp4AllScalesPad16Rope, 448, 64, "vLLM fork local-inference-lab/vllm native NVFP4 MLA cache for DeepSeek-V4 (PR 632; kv_cache_dtype nvfp4_ds_mla, read by B12X compressed sparse MLA, b12x PR 304)", 432,
   {4, 16, 1, 0}, {16, 0, 0, 0}, "engine_refs.b12x_dsv4_nvfp4_record (test_cpp_pack_record_matches_reference)"},
  {"trtllm-dsv4-nvfp4-cold", "fp4-e2m1-tile16-e4m3-rcp", "bf16",
   "TensorRT-LLM NVFP4 cold-page compression of DeepSeek-V4's CSA entries (PRs 18783, 19317; cpp/tensorrt_llm/kernels/nvfp4ColdPageKernels.cu offloadFrom16BitTiledKernel at 2d7f402e, cvt_warp_fp16_to_fp4 at the identity global scale of nvfp4_quantization.py): per entry 224 B e2m1 NoPE | 28 e4m3 | 64 bf16 rope copied losslessly = 380 B",
   RecordOrder::CodesScalesRope, 448, 64, "TensorRT-LLM KVCM V2 cold-page NVFP4 (host / disk tier only; the GPU keeps BF16) with skip_rope_quantization, no ModelOpt KV scales", 380,
   {4, 16, 1, 0}, {16, 0, 0, 0}, "engine_refs.trtllm_dsv4_nvfp4_cold_record (test_cpp_pack_record_matches_reference)"},
};

constexpr IndexerPresetTraits kIndexerPresets[kIndexerPresetCount] = {
  {"vllm-dsa-indexer-fp8", "fp8-e4m3-tile128-pow2-amaxfloor", 128,
   "vLLM DeepseekV32IndexerCache (DeepSeek-V3.2, GLM-5 DSA indexer; Indexer.scale_fmt \"ue8m0\", quant_block_size 128)",
   "vLLM csrc/cache_kernels.cu indexer_k_quant_and_cache_kernel and vllm/model_executor/models/deepseek_v2.py Indexer, as carried by local-inference-lab/vllm at 28be48fa: s = 2^ceil(log2(max(amax, 1e-4) / 448)) stored as fp32, code = e4m3(x / s)",
   "a page of B tokens: B x 128 e4m3 codes (token-major), then B fp32 scales", 132, {8, 128, 4, 0},
   "all",
   "engine_refs.vllm_indexer_k_cache (test_indexer_presets_match_engine)"},
  {"sglang-dsa-indexer-mxfp4", "mxfp4-ceil", 128,
   "SGLang DSA indexer (DeepSeek-V3.2, GLM-5) --enable-dsa-fp4-indexer (PR 30546, closed unmerged), reusing the DeepSeek-V4 --enable-deepseek-v4-fp4-indexer cache of PR 26209",
   "SGLang python/sglang/srt/layers/attention/dsv4/fp4_indexer.py quantize_fp4_indexer_tensor and store_fp4_index_k_cache at sgl-project/sglang 301bcf08726b97f5d5cdae493f5fe8e31a59ab31 (PR 26209; PR 30546's fused MXFP4 store in jit_kernel/csrc/deepseek_v32/indexer_k.cuh matches it): per 32, s = 2^ceil(log2(max(amax / 6, 1e-4))) as one UE8M0 byte, code = e2m1(x / s) with ties toward zero and no -0, element 2k in the low nibble",
   "a page of B tokens (64 on CUDA): B x 64 e2m1 code bytes (token-major), then B x 4 UE8M0 bytes (group 0 first)", 68, {4, 32, 1, 0},
   "all",
   "engine_refs.sglang_mxfp4_index_k_cache (test_indexer_presets_match_engine)"},
};

// The table's invariants, at compile time: one row per Format in enum order, and every preset's parts summing to the
// record size its source states.
constexpr bool rows_in_enum_order() {
  for (size_t i = 0; i < kFormatCount; ++i)
    if (kFormats[i].format != static_cast<Format>(i)) return false;
  return true;
}
static_assert(std::size(kFormats) == kFormatCount, "kFormats: one row per Format");
static_assert(rows_in_enum_order(), "kFormats: rows in Format's enum order");
static_assert(kPresets[0].parts_bytes() == kPresets[0].stated_bytes, "flashmla-v32-fp8: 512 e4m3 + 4 fp32 + 64 bf16");
static_assert(kPresets[1].parts_bytes() == kPresets[1].stated_bytes, "vllm-fp8-ds-mla: 512 e4m3 + 4 fp32 + 64 bf16");
static_assert(kPresets[2].parts_bytes() == kPresets[2].stated_bytes, "flashmla-model1-fp8: 448 + 128 + 7, pad 8");
static_assert(kPresets[3].parts_bytes() == kPresets[3].stated_bytes, "flashmla-v41-fp8: 512 e4m3 + 16 ue8m0");
static_assert(kPresets[4].parts_bytes() == kPresets[4].stated_bytes, "flashmla-v41-fp4: 256 e2m1 + 32 e4m3");
static_assert(kPresets[5].parts_bytes() == kPresets[5].stated_bytes, "vllm-turboquant-4bit-nc: 256 + 2 + 128");
static_assert(kPresets[6].parts_bytes() == kPresets[6].stated_bytes, "vllm-turboquant-3bit-nc: 192 + 2 + 128");
static_assert(kPresets[7].parts_bytes() == kPresets[7].stated_bytes, "vllm-turboquant-k8v4: 512 + 128");
static_assert(kPresets[8].parts_bytes() == kPresets[8].stated_bytes, "flashinfer-nvfp4-mla: 224 + 128 + 28, pad 8");
static_assert(kPresets[9].parts_bytes() == kPresets[9].stated_bytes, "vllm-nvfp4-ds-mla: 256 + 32 + 16 pad + 128");
static_assert(kPresets[10].parts_bytes() == kPresets[10].stated_bytes, "sglang-dsv4-mxfp4: 224 + 14 + 2 pad + 128");
static_assert(kPresets[11].parts_bytes() == kPresets[11].stated_bytes, "sglang-dsv4-int4: 224 + 14 + 2 pad + 128");
static_assert(kPresets[12].parts_bytes() == kPresets[12].stated_bytes, "b12x-dsv4-nvfp4: 224 + 28 + 128, 52 more");
static_assert(kPresets[13].parts_bytes() == kPresets[13].stated_bytes, "trtllm-dsv4-nvfp4-cold: 224 + 28 + 128");
static_assert(std::size(kPresets) == kPresetCount);
static_assert(kIndexerPresets[0].part.bytes(kIndexerPresets[0].width) == kIndexerPresets[0].stated_bytes,
              "vllm-dsa-indexer-fp8: 128 e4m3 + 1 fp32");
static_assert(kIndexerPresets[1].part.bytes(kIndexerPresets[1].width) == kIndexerPresets[1].stated_bytes,
              "sglang-dsa-indexer-mxfp4: 128 e2m1 + 4 ue8m0");
static_assert(std::size(kIndexerPresets) == kIndexerPresetCount);
// clang-format on

namespace {

std::vector<std::string_view> split_dash(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t p = s.find('-', start);
    out.push_back(s.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
    if (p == std::string_view::npos) break;
    start = p + 1;
  }
  return out;
}

[[noreturn]] void bad(std::string_view s, const std::string& why) {
  throw std::invalid_argument("unknown quantizer spec '" + std::string(s) + "': " + why + ".\nValid forms:\n" +
                              spec_grammar());
}

// Parses a non-negative decimal integer; false on anything else (sign, junk, overflow).
bool parse_int(std::string_view t, int64_t& v) {
  if (t.empty()) return false;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  return ec == std::errc() && p == t.data() + t.size();
}

QuantSpec simple(Format f, int bits, ScaleDtype sd) {
  QuantSpec q;
  q.format = f;
  q.bits = bits;
  q.scale_dtype = sd;
  return q;
}

}  // namespace

std::string spec_grammar() {
  std::string s;
  for (const FormatTraits& t : kFormats) {
    if (t.format != Format::Preset) {
      s += "  " + std::string(t.grammar) + "\n";
      continue;
    }
    std::string names;  // the presets' names from their table, not a copy
    for (const PresetTraits& p : kPresets) names += (names.empty() ? "" : " | ") + std::string(p.name);
    s += "  " + names + "   (an engine's per-token record: c_kv and k_pe formats)\n";
  }
  s += "  examples: int4-asym-channel-g32, int8-sym-tensor, int2-asym-token-g64, fp8-e4m3-tile128-pow2, mxfp4, q4_0, "
       "tc2.5, "
       "flashmla-v32-fp8, bf16";
  return s;
}

namespace {
// The specs named by one fixed string (bf16, the MX and NVFP4 block formats, ggml's, the fp4 tiles, SGLang's INT4
// entry format), or nothing.
std::optional<QuantSpec> named_spec(std::string_view s) {
  if (s == "bf16") return simple(Format::BF16, 16, ScaleDtype::F32);
  if (s == "mxfp8") return simple(Format::MxFp8, 8, ScaleDtype::UE8M0);
  if (s == "mxfp4") return simple(Format::MxFp4, 4, ScaleDtype::UE8M0);
  if (s == "mxfp4-ceil") {
    QuantSpec q = simple(Format::MxFp4, 4, ScaleDtype::UE8M0);
    q.rule = ScaleRule::Ue8m0Ceil;
    return q;
  }
  if (s == "mxfp4-rn") {
    QuantSpec q = simple(Format::MxFp4, 4, ScaleDtype::UE8M0);
    q.rule = ScaleRule::Ue8m0Round;
    return q;
  }
  if (s == "int4-sym-g32-e4m3") {
    QuantSpec q = simple(Format::IntTile, 4, ScaleDtype::E4M3);
    q.scheme = Scheme::Sym;
    q.group_size = 32;
    return q;
  }
  if (s == "nvfp4") return simple(Format::NvFp4, 4, ScaleDtype::E4M3);
  if (s == "q8_0") return simple(Format::Q8_0, 8, ScaleDtype::F16);
  if (s == "q4_0") return simple(Format::Q4_0, 4, ScaleDtype::F16);
  if (s == "q4_1") return simple(Format::Q4_1, 4, ScaleDtype::F16);
  if (s == "fp4-e2m1-tile16-e4m3" || s == "fp4-e2m1-tile16-e4m3-rcp") {
    QuantSpec q = simple(Format::Fp4Tile, 4, ScaleDtype::E4M3);
    q.group_size = 16;
    if (s.ends_with("-rcp")) q.rule = ScaleRule::Reciprocal;
    return q;
  }
  return std::nullopt;
}
}  // namespace

QuantSpec QuantSpec::parse(std::string_view s) {
  if (const std::optional<QuantSpec> q = named_spec(s)) return *q;
  if (s.starts_with("lm")) {
    const auto p = split_dash(s);
    int64_t b = 0;
    if (!parse_int(p[0].substr(2), b) || b < 2 || b > 4) bad(s, "Lloyd-Max takes 2, 3 or 4 index bits (lm2, lm3, lm4)");
    QuantSpec q = simple(Format::LloydMax, static_cast<int>(b), ScaleDtype::F16);
    if (p.size() < 2 || (p[1] != "tensor" && p[1] != "channel"))
      bad(s, "expected lm<bits>-tensor or lm<bits>-channel[-g<N>]");
    q.granularity = p[1] == "tensor" ? Granularity::Tensor : Granularity::Channel;
    if (p.size() == 3) {
      int64_t n = 0;
      if (q.granularity == Granularity::Tensor) bad(s, "a per-tensor codebook takes no channel group");
      if (!p[2].starts_with("g") || !parse_int(p[2].substr(1), n) || n < 1)
        bad(s, "the channel group must be -g<N> with N >= 1 channels");
      q.group_size = n == 1 ? 0 : n;
    } else if (p.size() > 3) {
      bad(s, "unexpected '" + std::string(p[3]) + "'");
    }
    return q;
  }
  if (s.starts_with("tc")) {
    const auto p = split_dash(s);
    const std::string_view r = p[0].substr(2);
    const size_t dot = r.find('.');
    int64_t whole = 0, frac = 0;
    const std::string_view fr = dot == std::string_view::npos ? std::string_view{} : r.substr(dot + 1);
    if (!parse_int(r.substr(0, dot), whole) ||
        (dot != std::string_view::npos && (fr.size() > 3 || !parse_int(fr, frac))))
      bad(s, "the rate must be bits per element as a decimal number with at most 3 decimals (tc3, tc2.5, tc0.75)");
    for (size_t i = fr.size(); i < 3; ++i) frac *= 10;
    if (whole > 8) bad(s, "transform coding spends at most 8 bits per element (components are 0..8 bits wide)");
    const int64_t milli = whole * 1000 + frac;
    if (milli <= 0) bad(s, "the rate must be > 0 bits per element");
    if (milli > 8000) bad(s, "transform coding spends at most 8 bits per element (components are 0..8 bits wide)");
    if (p.size() > 2 || (p.size() == 2 && p[1] != "lm")) bad(s, "expected tc<R> or tc<R>-lm");
    QuantSpec q = simple(Format::TransformCoding, static_cast<int>((milli + 999) / 1000), ScaleDtype::F32);
    q.rate_milli = static_cast<int>(milli);
    if (p.size() == 2) q.rule = ScaleRule::GaussianCodebook;
    return q;
  }
  if (s.starts_with("tq")) {
    const auto p = split_dash(s);
    int64_t b = 0;
    if (!parse_int(p[0].substr(2), b) || b < 2 || b > 4)
      bad(s, "TurboQuant takes 2, 3 or 4 index bits (tq2, tq3, tq4)");
    if (p.size() > 2 || (p.size() == 2 && p[1] != "nc")) bad(s, "expected tq<bits> or tq<bits>-nc");
    QuantSpec q = simple(Format::TurboQuant, static_cast<int>(b), ScaleDtype::F16);
    if (p.size() == 2) q.rule = ScaleRule::NormCorrected;
    return q;
  }
  for (size_t i = 0; i < std::size(kPresets); ++i)
    if (s == kPresets[i].name) {
      QuantSpec q = simple(Format::Preset, 8, ScaleDtype::F32);
      q.preset = static_cast<uint8_t>(i);
      return q;
    }
  const auto parts = split_dash(s);
  if (parts.size() >= 3 && parts[0] == "fp8" && parts[1] == "e4m3") {
    if (parts[2] == "tensor") {
      QuantSpec q = simple(Format::Fp8Tensor, 8, ScaleDtype::F32);
      q.rule = ScaleRule::Calibrated;
      if (parts.size() == 4 && parts[3] == "s1")
        q.rule = ScaleRule::Unit;
      else if (parts.size() != 3)
        bad(s, "expected fp8-e4m3-tensor or fp8-e4m3-tensor-s1");
      return q;
    }
    if (parts[2].starts_with("tile")) {
      int64_t tile = 0;
      if (!parse_int(parts[2].substr(4), tile) || tile <= 0) bad(s, "the tile width must be a positive integer");
      QuantSpec q = simple(Format::Fp8Tile, 8, ScaleDtype::F32);
      q.group_size = tile;
      if (parts.size() == 3)
        bad(s,
            "fp8-e4m3-tile<N> (scale max(amax,1e-4)/448) is retired: it reproduced neither engine. Use "
            "fp8-e4m3-tile<N>-pow2 (FlashMLA), fp8-e4m3-tile<N>-fp32 (vLLM fp8_ds_mla), or the presets "
            "flashmla-v32-fp8 / vllm-fp8-ds-mla (k_pe in bf16)");
      if (parts[3] == "pow2" && parts.size() == 4)
        q.rule = ScaleRule::Pow2;
      else if (parts[3] == "pow2" && parts.size() == 5 && parts[4] == "ue8m0") {
        q.rule = ScaleRule::Pow2;
        q.scale_dtype = ScaleDtype::UE8M0;
      } else if (parts[3] == "pow2" && parts.size() == 5 && parts[4] == "amaxfloor") {
        q.rule = ScaleRule::Pow2AmaxFloor;
      } else if (parts[3] == "fp32" && parts.size() == 4)
        q.rule = ScaleRule::Fp32;
      else
        bad(s, "the fp8 tile scale rule must be pow2, pow2-ue8m0, pow2-amaxfloor or fp32");
      return q;
    }
  }
  QuantSpec q;
  if (parts.size() < 3 || !parts[0].starts_with("int"))
    bad(s, "expected int<bits>-<scheme>-<granularity>, a block format or an engine preset");
  int64_t bits = 0;
  if (!parse_int(parts[0].substr(3), bits)) bad(s, "bits must be a number");
  if (bits != 8 && bits != 4 && bits != 2) bad(s, "bits must be 2, 4 or 8, got " + std::to_string(bits));
  q.bits = static_cast<int>(bits);
  if (parts[1] == "sym")
    q.scheme = Scheme::Sym;
  else if (parts[1] == "asym")
    q.scheme = Scheme::Asym;
  else
    bad(s, "scheme must be sym or asym, got '" + std::string(parts[1]) + "'");
  if (parts[2] == "tensor")
    q.granularity = Granularity::Tensor;
  else if (parts[2] == "channel")
    q.granularity = Granularity::Channel;
  else if (parts[2] == "token")
    q.granularity = Granularity::Token;
  else
    bad(s, "granularity must be tensor, channel or token, got '" + std::string(parts[2]) + "'");
  size_t i = 3;
  if (i < parts.size() && parts[i].starts_with("g")) {
    if (q.granularity == Granularity::Tensor) bad(s, "a per-tensor spec takes no group size");
    const std::string_view g = parts[i].substr(1);
    int64_t gs = 0;
    if (!parse_int(g, gs)) {
      // "int4-asym-channel-g-32" splits into "g" and "32": a negative group size.
      if (g.empty() && i + 1 < parts.size()) bad(s, "the group size must be >= 0, got -" + std::string(parts[i + 1]));
      bad(s, "the group size must be a non-negative integer, got '" + std::string(g) + "'");
    }
    q.group_size = gs;
    ++i;
  }
  if (i < parts.size() && (parts[i] == "fp32" || parts[i] == "fp16")) {
    q.scale_dtype = parts[i] == "fp32" ? ScaleDtype::F32 : ScaleDtype::F16;
    ++i;
  }
  if (i != parts.size()) bad(s, "unexpected '" + std::string(parts[i]) + "'");
  return q;
}

std::string QuantSpec::to_string() const {
  switch (format) {
    case Format::BF16:
      return "bf16";
    case Format::Fp8Tile:
      return "fp8-e4m3-tile" + std::to_string(group_size) +
             (rule == ScaleRule::Fp32            ? "-fp32"
              : rule == ScaleRule::Pow2AmaxFloor ? "-pow2-amaxfloor"
              : scale_dtype == ScaleDtype::UE8M0 ? "-pow2-ue8m0"
                                                 : "-pow2");
    case Format::Fp8Tensor:
      return rule == ScaleRule::Unit ? "fp8-e4m3-tensor-s1" : "fp8-e4m3-tensor";
    case Format::MxFp8:
      return "mxfp8";
    case Format::MxFp4:
      return rule == ScaleRule::Ue8m0Ceil ? "mxfp4-ceil" : rule == ScaleRule::Ue8m0Round ? "mxfp4-rn" : "mxfp4";
    case Format::IntTile:
      return "int4-sym-g32-e4m3";
    case Format::NvFp4:
      return "nvfp4";
    case Format::Q8_0:
      return "q8_0";
    case Format::Q4_0:
      return "q4_0";
    case Format::Q4_1:
      return "q4_1";
    case Format::Fp4Tile:
      return rule == ScaleRule::Reciprocal ? "fp4-e2m1-tile16-e4m3-rcp" : "fp4-e2m1-tile16-e4m3";
    case Format::TurboQuant:
      return "tq" + std::to_string(bits) + (rule == ScaleRule::NormCorrected ? "-nc" : "");
    case Format::LloydMax:
      return "lm" + std::to_string(bits) + (granularity == Granularity::Tensor ? "-tensor" : "-channel") +
             (group_size > 0 ? "-g" + std::to_string(group_size) : "");
    case Format::TransformCoding: {
      std::string r = "tc" + std::to_string(rate_milli / 1000);
      if (int f = rate_milli % 1000; f != 0) {
        std::string d = std::to_string(1000 + f).substr(1);  // three digits, then no trailing zero
        while (d.back() == '0') d.pop_back();
        r += "." + d;
      }
      return r + (rule == ScaleRule::GaussianCodebook ? "-lm" : "");
    }
    case Format::Preset:
      return kPresets[preset].name;
    case Format::Int:
      break;
    case Format::Count:
      throw std::invalid_argument("to_string: Format::Count is not a format");
  }
  std::string s =
      "int" + std::to_string(bits) + "-" + latentq::to_string(scheme) + "-" + latentq::to_string(granularity);
  if (granularity != Granularity::Tensor && group_size > 0) s += "-g" + std::to_string(group_size);
  if (scale_dtype == ScaleDtype::F32) s += "-fp32";
  return s;
}

QuantSpec QuantSpec::stored_for(Target target) const {
  if (format != Format::Preset) return *this;
  if (preset >= std::size(kPresets)) throw std::invalid_argument("invalid preset index " + std::to_string(preset));
  if (!is_latent_target(target))
    throw std::invalid_argument(std::string("engine preset '") + kPresets[preset].name + "' stores c_kv and k_pe; " +
                                latentq::to_string(target) + " takes a plain format");
  return parse(target == Target::CKV ? kPresets[preset].ckv : kPresets[preset].kpe);
}

namespace {

// Why the stored (non-preset) format `s` cannot take rows of D > 0 elements, or "": what the `shapes` of its kFormats
// row state. The one rule of why_not_applicable() and layout().
std::string refusal(const QuantSpec& s, int64_t D) {
  switch (s.format) {
    case Format::Q8_0:
    case Format::Q4_0:
    case Format::Q4_1:  // ggml's blocks never straddle rows
      return D % 32 == 0 ? "" : "ggml blocks need a row length that is a multiple of 32, got " + std::to_string(D);
    case Format::TurboQuant:
      try {  // its rotation: transform.h's automatic Hadamard block, one rule for both
        (void)hadamard_block(D, 0);
        return "";
      } catch (const std::invalid_argument&) {  // D > 0 here: only the block rule refuses it
        return "TurboQuant rotates rows of D = " + std::to_string(D) + " by a Hadamard block, a power of two >= " +
               std::to_string(kMinAutoHadamardBlock) + " dividing D, and D has none";
      }
    case Format::TransformCoding:  // floor: the rate is never exceeded
      return static_cast<int64_t>(s.rate_milli) * D / 8000 > 0
                 ? ""
                 : "it stores floor(R·D/8) = 0 code bytes per token for rows of D = " + std::to_string(D) +
                       "; it needs R·D >= 8 bits";
    default:
      return "";
  }
}

}  // namespace

std::string why_not_applicable(const QuantSpec& spec, Target target, int64_t D) {
  if (D <= 0) throw std::invalid_argument("why_not_applicable: the row length must be > 0, got " + std::to_string(D));
  if (spec.format == Format::Preset && !is_latent_target(target))
    return std::string("an engine record holds c_kv and k_pe, not ") + to_string(target);
  return refusal(spec.stored_for(target), D);
}

Layout layout(const QuantSpec& s, int64_t D) {
  if (D <= 0)
    throw std::invalid_argument("layout of '" + s.to_string() + "': the row length must be > 0, got " +
                                std::to_string(D));
  if (const std::string why = refusal(s, D); !why.empty())
    throw std::invalid_argument("'" + s.to_string() + "': " + why);
  Layout L;
  L.code_bits = s.bits;
  L.row_code_bytes = qmath::packed_row_bytes(D, s.bits);
  auto blocks = [&](int64_t block, ScaleDtype sd, bool offsets) {
    L.block = std::min(block, D);
    L.blocks_per_row = (D + L.block - 1) / L.block;  // no overflow: L.block ≤ D
    L.sd = sd;
    L.scale_bytes = qmath::scale_dtype_bytes(sd);
    L.offsets = offsets;
  };
  auto block_format = [&](qmath::BlockKind k, int64_t block, bool has_scale, bool has_offset) {
    L.block_format = true;
    if (has_scale)
      blocks(block, s.scale_dtype, has_offset);
    else
      L.sd = ScaleDtype::F32;
    L.desc = {k, static_cast<int>(has_scale ? L.block : D), s.bits, s.scale_dtype, has_scale, has_offset};
  };
  switch (s.format) {
    case Format::Int: {
      const int64_t sb = qmath::scale_dtype_bytes(s.scale_dtype);
      const bool asym = s.scheme == Scheme::Asym;
      L.sd = s.scale_dtype;
      switch (s.granularity) {
        case Granularity::Tensor:
          L.tensor_bytes = sb * (asym ? 2 : 1);
          break;
        case Granularity::Channel:
          L.channel = true;
          L.scale_bytes = static_cast<int>(sb);
          L.offsets = asym;
          break;
        case Granularity::Token:
          blocks(s.group_size > 0 ? s.group_size : D, s.scale_dtype, asym);
          break;
      }
      return L;
    }
    case Format::BF16:
      return L;
    case Format::Fp8Tile:
      block_format(s.rule == ScaleRule::Fp32            ? qmath::BlockKind::Fp8Fp32
                   : s.rule == ScaleRule::Pow2AmaxFloor ? qmath::BlockKind::Fp8Pow2AmaxFloor
                                                        : qmath::BlockKind::Fp8Pow2,
                   s.group_size, true, false);
      return L;
    case Format::Fp8Tensor:
      block_format(qmath::BlockKind::Fp8Tensor, D, false, false);
      L.tensor_bytes = 4;
      return L;
    case Format::MxFp8:
      block_format(qmath::BlockKind::MxFp8, 32, true, false);
      return L;
    case Format::MxFp4:
      block_format(s.rule == ScaleRule::Ue8m0Ceil    ? qmath::BlockKind::MxFp4Ceil
                   : s.rule == ScaleRule::Ue8m0Round ? qmath::BlockKind::MxFp4Round
                                                     : qmath::BlockKind::MxFp4,
                   32, true, false);
      return L;
    case Format::IntTile:
      block_format(qmath::BlockKind::Int4E4m3, 32, true, false);
      return L;
    case Format::Fp4Tile:
      block_format(s.rule == ScaleRule::Reciprocal ? qmath::BlockKind::Fp4TileRcp : qmath::BlockKind::Fp4Tile, 16, true,
                   false);
      return L;
    case Format::TurboQuant:  // a width with a Hadamard block (refusal())
      L.block = D;  // one fp16 row norm per token
      L.blocks_per_row = 1;
      L.sd = ScaleDtype::F16;
      L.scale_bytes = 2;
      return L;
    case Format::LloydMax: {
      L.codebook_width = s.granularity == Granularity::Tensor ? D : std::min(D, s.group_size > 0 ? s.group_size : 1);
      L.codebooks = (D + L.codebook_width - 1) / L.codebook_width;
      L.sd = ScaleDtype::F16;
      L.tensor_bytes = L.codebooks * (int64_t{1} << s.bits) * 2;  // fp16 centroids [codebooks, 2^b]
      return L;
    }
    case Format::TransformCoding: {
      L.code_bits = 0;  // 0..8 per component, fixed per matrix by the record
      L.row_code_bytes = static_cast<int64_t>(s.rate_milli) * D / 8000;  // floor: > 0 (refusal())
      L.code_budget_bits = 8 * L.row_code_bytes;
      L.sd = ScaleDtype::F32;
      // per matrix: width byte, fp32 scale and fp32 offset per component; -lm: the fp16 unit codebooks of widths
      // 1..8, (2 + 4 + ... + 256)·2 = 1020 bytes (latentq/transform_coding.h)
      L.tensor_bytes = 9 * D + (s.rule == ScaleRule::GaussianCodebook ? 1020 : 0);
      return L;
    }
    case Format::NvFp4:
      block_format(qmath::BlockKind::NvFp4, 16, true, false);
      L.tensor_bytes = 4;
      return L;
    case Format::Q8_0:
    case Format::Q4_0:
    case Format::Q4_1:  // D a multiple of 32 (refusal())
      block_format(s.format == Format::Q8_0   ? qmath::BlockKind::Q8_0
                   : s.format == Format::Q4_0 ? qmath::BlockKind::Q4_0
                                              : qmath::BlockKind::Q4_1,
                   32, true, s.format == Format::Q4_1);
      return L;
    case Format::Preset:
      break;
    case Format::Count:
      throw std::invalid_argument("layout(): Format::Count is not a format");
  }
  throw std::invalid_argument("layout(): '" + s.to_string() + "' is a preset; use stored_for(target) first");
}

int64_t record_bytes(const QuantSpec& p, int64_t D_ckv, int64_t D_kpe) {
  const int64_t b = layout(p.stored_for(Target::CKV), D_ckv).bytes_per_token() +
                    layout(p.stored_for(Target::KPE), D_kpe).bytes_per_token();
  return p.format == Format::Preset ? b + record_pad_bytes(kPresets[p.preset].order, b) : b;  // the record's zero pad
}

const char* to_string(Scheme s) { return s == Scheme::Sym ? "sym" : "asym"; }
const char* to_string(Granularity g) {
  switch (g) {
    case Granularity::Tensor:
      return "tensor";
    case Granularity::Channel:
      return "channel";
    case Granularity::Token:
      return "token";
  }
  return "?";
}
const char* to_string(Target t) {
  const auto i = static_cast<size_t>(t);
  if (i >= kTargetCount) throw std::logic_error("invalid Target " + std::to_string(i));
  return kTargets[i].name;
}
const char* to_string(ScaleDtype d) {
  switch (d) {
    case ScaleDtype::F16:
      return "fp16";
    case ScaleDtype::F32:
      return "fp32";
    case ScaleDtype::UE8M0:
      return "ue8m0";
    case ScaleDtype::E4M3:
      return "e4m3";
  }
  return "?";
}

const char* family_of(const QuantSpec& s) { return traits(s.format).family; }
const char* scheme_of(const QuantSpec& s) {
  const char* t = traits(s.format).scheme;
  return t ? t : to_string(s.scheme);
}
const char* granularity_of(const QuantSpec& s) {
  const char* t = traits(s.format).granularity;
  return t ? t : to_string(s.granularity);
}
const char* scale_dtype_of(const QuantSpec& s) {
  if (s.format == Format::BF16) return "none";
  return to_string(s.scale_dtype);
}

std::vector<std::string> format_examples() {
  std::vector<std::string> out;
  for (const FormatTraits& t : kFormats) out.insert(out.end(), t.examples.begin(), t.examples.end());
  for (const PresetTraits& p : kPresets) out.emplace_back(p.name);
  return out;
}

std::string engine_of(const QuantSpec& spec) {
  const char* e = spec.format == Format::Preset ? kPresets[spec.preset].engine : traits(spec.format).engine;
  return e ? e : "";
}

bool is_engine_format(const QuantSpec& spec) { return !engine_of(spec).empty(); }

std::vector<FormatRow> format_rows() {
  std::vector<FormatRow> rows;
  for (const std::string& name : format_examples()) {
    const QuantSpec q = QuantSpec::parse(name);
    const bool preset = q.format == Format::Preset;
    const FormatTraits& t = traits(preset ? q.stored_for(Target::CKV).format : q.format);
    FormatRow r;
    r.name = name;
    r.family = preset ? "preset" : t.family;
    r.engine = engine_of(q);
    try {
      r.record_bytes = record_bytes(q, 512, 64);
    } catch (const std::invalid_argument&) {
      r.record_bytes = -1;  // a width of 512 or 64 the format refuses
    }
    r.bits_per_element = r.record_bytes < 0 ? -1.0 : static_cast<double>(r.record_bytes) * 8.0 / 576.0;
    r.causal = decode_scale_is_causal(q);
    r.shapes = preset ? traits(Format::Preset).shapes : t.shapes;
    r.source = preset ? kPresets[q.preset].source : t.source;
    r.reference = preset ? kPresets[q.preset].reference : t.reference;
    rows.push_back(std::move(r));
  }
  return rows;
}

Target parse_target(std::string_view s) {
  std::string names;
  for (const TargetTraits& t : kTargets) {
    if (s == t.name) return t.target;
    names += std::string(names.empty() ? "" : ", ") + t.name;
  }
  throw std::invalid_argument("unknown target '" + std::string(s) + "', available: " + names);
}

}  // namespace latentq
