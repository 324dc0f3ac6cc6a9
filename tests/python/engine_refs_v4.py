"""Independent Python references for DeepSeek-V4's cache-entry records that latentq reproduces (kPresets rows
sglang-dsv4-mxfp4, sglang-dsv4-int4, b12x-dsv4-nvfp4, trtllm-dsv4-nvfp4-cold; the formats mxfp4-rn and
int4-sym-g32-e4m3).

A DeepSeek-V4 attention entry is one 512-wide row (K = V): 448 NoPE columns, then 64 RoPE columns. latentq's
presets take the first 448 as their "c_kv" part and the last 64 as their "k_pe" part. The element conventions are
engine_refs.py's (codes uint8 [T, code bytes], element 2k in the low nibble; scales 1-D, token then block); every
formula names its public source (repository, file, function, commit) and quotes the line it follows. Imported by
engine_refs (its quantize() table and RECORDS), after engine_refs has defined its helpers.
"""

from __future__ import annotations

import numpy as np

from engine_refs import (
    E4M3_MAX,
    FLT_MIN,
    Quant,
    _expand,
    _f32,
    _le_bytes,
    _tile_amax,
    bf16_bits,
    e2m1_bits,
    e4m3_bits,
    e4m3_value,
    e8m0_value,
    pack_nibbles_even_low,
)

# ---------------------------------------------------------------------------------------------------
# SGLang's DeepSeek-V4 MXFP4 KV cache (mxfp4-rn; preset sglang-dsv4-mxfp4)
# sgl-project/sglang python/sglang/srt/layers/attention/dsv4/mxfp4_k_cache.py at 07619bc2 (PRs 32741, 37136-37138)
# ---------------------------------------------------------------------------------------------------

SGLANG_MX_AMAX_FLOOR = np.float32(1e-40)  # `tl.maximum(amax, 1e-40)` (a float32 subnormal)
SGLANG_LOG2_6 = np.float32(2.584962500721156)  # `- 2.584962500721156  # log₂6`, a float32 in the kernel
# _e2m1_rne_scaled_triton: code = the number of these comparisons `magnitude {>, >=} denominator * t` that hold
SGLANG_E2M1_MIDPOINTS = ((">", 0.25), (">=", 0.75), (">", 1.25), (">=", 1.75), (">", 2.5), (">=", 3.5), (">", 5.0))


def sglang_mx_round_byte_exact(amax) -> np.ndarray:
    """The UE8M0 byte of mxfp4_k_cache.py in exact math: clamp(round(log2(max(amax, 1e-40) / 6)) + 127, 0, 255)
    (`scale_byte_raw = tl.math.floor(log2_ratio + 0.5).to(tl.int32) + 127`, then `tl.minimum(tl.maximum(·, 0),
    255)`). log2 in float64 of the float32 amax: its error (~1e-16) is far below the distance of any float32 amax
    from the tie 6·2^(k+1/2) that decides it. int64 [same shape]."""
    a = np.maximum(_f32(amax), SGLANG_MX_AMAX_FLOOR).astype(np.float64)
    return np.clip(np.floor(np.log2(a / 6.0) + 0.5).astype(np.int64) + 127, 0, 255)


def sglang_mx_round_byte_engine(amax) -> np.ndarray:
    """The same byte as the kernel's float32 expression writes it: log2 of the float32 amax, minus the float32
    log2(6), plus 0.5, floored, in float32 (numpy's float32 log2 standing in for Triton's tl.math.log2)."""
    a = np.maximum(_f32(amax), SGLANG_MX_AMAX_FLOOR)
    with np.errstate(divide="ignore"):
        r = (np.log2(a).astype(np.float32) - SGLANG_LOG2_6).astype(np.float32)
    return np.clip(np.floor((r + np.float32(0.5)).astype(np.float32)).astype(np.int64) + 127, 0, 255)


def _sglang_e2m1_by_midpoints(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """_e2m1_rne_scaled_triton: `magnitude = tl.abs(x)`, code = Σ (magnitude {>, >=} denominator · t), `sign =
    ((x.to(tl.uint32, bitcast=True) >> 31).to(tl.uint8)) << 3` (the sign bit: -0.0 gives 0x8). denominator · t is
    exact for a power-of-two denominator, so this is RNE of |x| / denominator saturated at 6."""
    mag = np.abs(x)
    code = np.zeros(x.shape, np.uint8)
    for op, t in SGLANG_E2M1_MIDPOINTS:
        m = (scale * np.float32(t)).astype(np.float32)
        code += (mag > m if op == ">" else mag >= m).astype(np.uint8)
    return code | (np.signbit(x).astype(np.uint8) << np.uint8(3))


def sglang_mxfp4_rn(x, byte_rule=sglang_mx_round_byte_exact) -> Quant:
    """_quantize_mxfp4_k_cache_into_kernel (GROUP_SIZE = 32) at any width, a last partial group keeping its own
    scale (latentq's mxfp4-rn): per group `amax = tl.max(tl.abs(x), axis=1)`, the byte of byte_rule, `scale_float =
    tl.math.exp2(scale_byte - 127)`, codes _sglang_e2m1_by_midpoints(x, scale_float), packed `low | (high << 4)`
    (element 2k low). byte_rule: exact math (the format) or the kernel's float32 expression (the record)."""
    x = _f32(x)
    T, D = x.shape
    b = byte_rule(_tile_amax(x, 32))
    codes = _sglang_e2m1_by_midpoints(x, _expand(e8m0_value(b), 32, D))
    return Quant("mxfp4-rn", T, D, pack_nibbles_even_low(codes), b.astype(np.uint8).reshape(-1), block=32)


def sglang_dsv4_mxfp4_record(ckv, kpe) -> np.ndarray:
    """SGLang's DeepSeek-V4 MXFP4 entry (--kv-cache-dtype fp4_e2m1, PR 37138), 368 B: `[224 B packed E2M1 | 14 B
    E8M0 + 2 B pad | 128 B BF16 RoPE]` (MXFP4_PACKED_NOPE_BYTES = 224, MXFP4_SCALE_BYTES = 14 + 2, the rope rows
    `rows[:, -MXFP4_ROPE_BYTES:].view(torch.bfloat16)`, `k_rope.to(torch.bfloat16)`); the kernel never writes the
    two pad bytes (the pool is zero-initialised: 0 here). The byte by the kernel's float32 expression: on bf16 and
    fp16 rows it is the exact rule (test_sglang_mx_round_byte_is_exact_on_half_amax)."""
    ckv, kpe = _f32(ckv), _f32(kpe)
    assert ckv.shape[1] == 448 and kpe.shape[1] == 64 and ckv.shape[0] == kpe.shape[0]
    q = sglang_mxfp4_rn(ckv, byte_rule=sglang_mx_round_byte_engine)
    T = ckv.shape[0]
    pad = np.zeros((T, 2), np.uint8)
    return np.concatenate([q.codes, q.scales.reshape(T, 14), pad, _le_bytes(bf16_bits(kpe), "<u2")], axis=1)


# ---------------------------------------------------------------------------------------------------
# SGLang's DeepSeek-V4 Direct INT4 KV cache (int4-sym-g32-e4m3; preset sglang-dsv4-int4)
# sgl-project/sglang python/sglang/srt/mem_cache/kvbit_dsv4_codec.py and kvbit_dsv4_layout_constants.py at
# 2754fe74 (PR 38301)
# ---------------------------------------------------------------------------------------------------

SGLANG_INT4_QMAX = np.float32(7.0)


def sglang_int4_e4m3(x) -> Quant:
    """encode_dsv4_int4_reference, per group of GROUP_SIZE = 32 at any width (a last partial group keeps its own
    step):
      `stored_step = (max_abs / 7.0).clamp_max(torch.finfo(torch.float8_e4m3fn).max)`, `.to(torch.float8_e4m3fn)`
      `codes = torch.round(nope / safe_step.unsqueeze(-1)).clamp_(-7, 7).to(torch.int8)` (round half to even)
      `codes = torch.where(has_step.unsqueeze(-1), codes, torch.zeros_like(codes))` (a zero step: codes 0)
      `unsigned_codes = codes.to(torch.uint8) & 0x0F`; `unsigned_codes[..., 0::2] | (unsigned_codes[..., 1::2] << 4)`
    Scales: the e4m3 step bytes."""
    x = _f32(x)
    T, D = x.shape
    sb = e4m3_bits(np.minimum((_tile_amax(x, 32) / SGLANG_INT4_QMAX).astype(np.float32), E4M3_MAX))
    step = e4m3_value(sb)
    safe = np.where(step > 0, step, np.float32(1)).astype(np.float32)
    q = np.clip(np.round((x / _expand(safe, 32, D)).astype(np.float32)), -7, 7)
    q = np.where(_expand(step, 32, D) > 0, q, 0).astype(np.int8)
    return Quant("int4-sym-g32-e4m3", T, D, pack_nibbles_even_low(q.view(np.uint8) & 0x0F), sb.reshape(-1), block=32)


def sglang_int4_e4m3_decode(q: Quant) -> np.ndarray:
    """decode_dsv4_int4_reference's NoPE part in float32 (before its .to(bfloat16)): `codes = torch.where(codes >=
    8, codes - 16, codes).float()`, `codes * steps.unsqueeze(-1)`."""
    T, D = q.rows, q.cols
    u = np.empty((T, 2 * q.codes.shape[1]), np.int64)
    u[:, 0::2], u[:, 1::2] = q.codes & 0xF, q.codes >> 4
    c = np.where(u >= 8, u - 16, u)[:, :D].astype(np.float32)
    return (c * _expand(e4m3_value(q.scales).reshape(T, -1), 32, D)).astype(np.float32)


def sglang_dsv4_int4_record(ckv, kpe) -> np.ndarray:
    """SGLang's aos_368 row (kvbit_dsv4_layout_constants.py: CODE_BYTES = 224, HEADER_OFFSET = 224, HEADER_BYTES =
    16, ROPE_OFFSET = 240, ROPE_BYTES = 128, COMPACT_ROW_BYTES = 368): `packed = torch.zeros(...)`, the codes at
    [0, 224), the 14 steps at `[header_offset, header_offset + num_groups)`, zeros at [238, 240), `rows[:,
    layout.nope_dim:].to(torch.bfloat16)` at [240, 368)."""
    ckv, kpe = _f32(ckv), _f32(kpe)
    assert ckv.shape[1] == 448 and kpe.shape[1] == 64 and ckv.shape[0] == kpe.shape[0]
    q = sglang_int4_e4m3(ckv)
    T = ckv.shape[0]
    pad = np.zeros((T, 2), np.uint8)
    return np.concatenate([q.codes, q.scales.reshape(T, 14), pad, _le_bytes(bf16_bits(kpe), "<u2")], axis=1)


# ---------------------------------------------------------------------------------------------------
# The DeepSeek-V4 NVFP4 432 B record (local-inference-lab/vllm PR 632, b12x PR 304; preset b12x-dsv4-nvfp4)
# tpurtell/ds4fv-vllm-28-sm12x overlay/vllm/models/deepseek_v4/common/ops/nvfp4_ds_mla.py at 6407692e
# ---------------------------------------------------------------------------------------------------

B12X_RCP6 = np.float32(1.0) / np.float32(6.0)  # `max_abs * (1.0 / 6.0)`: fl32(1/6)


def b12x_dsv4_nvfp4_record(ckv, kpe) -> np.ndarray:
    """_store_nvfp4_latent of one entry `output` (the 512 columns, rope rotated, `.to(tl.bfloat16).to(tl.float32)`:
    pass bf16 rows), 432 B:
      `quant_3d = tl.reshape(output, (32, 8, 2))`: 32 groups of 16 consecutive columns (448 NoPE, then 64 RoPE)
      `raw_scale = tl.maximum(max_abs * (1.0 / 6.0), 1.1754943508222875e-38)`; `scale_fp8 = raw_scale.to(tl.float8e4nv)`
      `inv_scale = 1.0 / decoded_scale`; `_fp32x2_to_fp4x2(lo * inv_scale, hi * inv_scale)` (cvt.rn.satfinite.e2m1x2)
      bytes [0, 256) codes, [256, 288) `scale_fp8`, [288, 304) 0, [304, 432) the 64 rope columns as bf16.
    1/s is IEEE here (the kernel's Triton `/`, not measured on a GPU). A group whose e4m3 scale is 0 (max_abs/6
    below 2^-10) has inv_scale = inf: its nonzero elements saturate to ±6 and its zeros are cvt(NaN), which this
    reference does not define (code 0 here; b12x_dsv4_nvfp4_exact_rows leaves those rows out)."""
    ckv, kpe = _f32(ckv), _f32(kpe)
    assert ckv.shape[1] == 448 and kpe.shape[1] == 64 and ckv.shape[0] == kpe.shape[0]
    x = np.concatenate([ckv, kpe], axis=1)
    T = x.shape[0]
    sb = e4m3_bits(np.maximum((_tile_amax(x, 16) * B12X_RCP6).astype(np.float32), FLT_MIN))
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = (np.float32(1) / e4m3_value(sb)).astype(np.float32)
        y = (x * _expand(inv, 16, 512)).astype(np.float32)
    codes = np.where(np.isnan(y), np.uint8(0), e2m1_bits(np.nan_to_num(y, nan=0.0)))
    pad = np.zeros((T, 16), np.uint8)
    return np.concatenate([pack_nibbles_even_low(codes), sb.reshape(T, 32), pad, _le_bytes(bf16_bits(kpe), "<u2")], 1)


def b12x_dsv4_nvfp4_exact_rows(ckv, kpe) -> np.ndarray:
    """Rows on which the -rcp format gives the record's bytes: every group's e4m3 scale nonzero (-rcp takes 1/s := 0
    for a zero scale, every code 0; the kernel's 1/0 = inf). bool [T]."""
    x = np.concatenate([_f32(ckv), _f32(kpe)], axis=1)
    return (e4m3_bits((_tile_amax(x, 16) * B12X_RCP6).astype(np.float32)) != 0).all(axis=1)


# ---------------------------------------------------------------------------------------------------
# TensorRT-LLM's NVFP4 cold pages of DeepSeek-V4's CSA entries (preset trtllm-dsv4-nvfp4-cold)
# NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/nvfp4ColdPageKernels.cu at 2d7f402e (PRs 18783, 19317)
# ---------------------------------------------------------------------------------------------------


def trtllm_dsv4_nvfp4_cold_record(ckv, kpe) -> np.ndarray:
    """One CSA entry of a TensorRT-LLM NVFP4 cold page, 380 B, in latentq's record order (codes | scales | rope).
    nvfp4_quantization.py _build_deepseek_v4_layer_layouts: the CSA `deepseek_v4_compress` rows are 512 wide, with
    skip_rope_quantization the quantized range is the 448 NoPE elements and the 64 RoPE elements are a lossless
    suffix; the global scale is `_IDENTITY_NVFP4_SCALE = (1.0, 1.0)` unless ModelOpt KV scales are loaded.
    offloadFrom16BitTiledKernel (BF16 runtime page): per 16 NoPE elements `cvt_warp_fp16_to_fp4<T, 16, false>(input,
    params.nvfp4ScaleOrigQuant, scale)`, TensorRT-LLM's copy of the rule of engine_refs.vllm_nvfp4_ds_mla_scale_bits
    (`SFValue = SFScaleVal * (vecMax * reciprocal_approximate_ftz(6.0f))`, e4m3; `outputScale = vecMax != 0 ?
    reciprocal_approximate_ftz(SFValue * reciprocal_approximate_ftz(SFScaleVal)) : 0`; cvt.rn.satfinite.e2m1x2).
    The page holds its entries' codes (224 B each), then their scales (28 B each, coldScaleOffset), then their RoPE
    bytes (coldLosslessSuffixOffset = scales + rows · 448 / 16). Reciprocals IEEE here (the kernel's are
    rcp.approx.ftz). A group with 0 < amax and a zero e4m3 scale (amax/6 below 2^-10) gets 1/0 = inf there: ±6 codes,
    and cvt of NaN for its zeros (code 0 here, not defined); latentq's -rcp stores 0
    (trtllm_dsv4_nvfp4_cold_exact_rows)."""
    ckv, kpe = _f32(ckv), _f32(kpe)
    assert ckv.shape[1] == 448 and kpe.shape[1] == 64 and ckv.shape[0] == kpe.shape[0]
    T = ckv.shape[0]
    amax = _tile_amax(ckv, 16)
    sb = e4m3_bits((amax * B12X_RCP6).astype(np.float32))
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(amax != 0, np.float32(1) / e4m3_value(sb), np.float32(0)).astype(np.float32)
        y = (ckv * _expand(inv, 16, 448)).astype(np.float32)
    codes = np.where(np.isnan(y), np.uint8(0), e2m1_bits(np.nan_to_num(y, nan=0.0)))  # cvt(NaN): not defined here
    return np.concatenate([pack_nibbles_even_low(codes), sb.reshape(T, 28), _le_bytes(bf16_bits(kpe), "<u2")], 1)


def trtllm_dsv4_nvfp4_cold_exact_rows(ckv, kpe) -> np.ndarray:
    """Rows where no NoPE group has 0 < amax with a zero e4m3 scale (there the kernel's codes saturate). bool [T]."""
    amax = _tile_amax(_f32(ckv), 16)
    return ~((amax > 0) & (e4m3_bits((amax * B12X_RCP6).astype(np.float32)) == 0)).any(axis=1)


# ---------------------------------------------------------------------------------------------------
# vLLM's DeepSeek-V4 CSA indexer keys, FP8 (kIndexerPresets vllm-dsa-indexer-fp8 at V4's index_head_dim 128)
# vllm-project/vllm vllm/v1/attention/ops/deepseek_v4_ops/fused_compress_quant_cache.py at 43860973
# ---------------------------------------------------------------------------------------------------

VLLM_V4_INV_FP8_MAX = np.float32(1.0 / 448.0)  # `INV_FP8_MAX: tl.constexpr = 1.0 / FP8_MAX`, used as a float32


def _ceil_log2_f32(v: np.ndarray) -> np.ndarray:
    """ceil(log2(v)) of positive normal float32 v, exact: the exponent, plus 1 if any significand bit is set."""
    b = _f32(v).view(np.uint32)
    return (b >> np.uint32(23)).astype(np.int64) - 127 + ((b & np.uint32(0x7FFFFF)) != 0)


def vllm_v4_indexer_fp8(k):
    """_fused_kv_compress_norm_rope_insert_indexer_attn's quantization of one compressed indexer key (head 128, one
    block), on the bf16 key it forms (`result_bf16 = result.to(tl.bfloat16).to(tl.float32)`):
      `absmax = tl.maximum(absmax, 1e-4)`; `raw_scale = absmax * INV_FP8_MAX` (a multiply by fl(1/448));
      `exponent = tl.ceil(tl.log2(raw_scale))` (exact math here); `x_scaled = result_bf16 * tl.exp2(-exponent)`;
      `tl.clamp(x_scaled, -FP8_MAX, FP8_MAX).to(tl.float8e4nv)`; the float32 scale `tl.exp2(exponent)`.
    The page: [0, bs·128) codes, then bs float32 scales (the layout of vllm-dsa-indexer-fp8). Returns (codes uint8
    [T, 128], scales float32 [T, 1])."""
    k = _f32(k)
    assert k.shape[1:] == (128,), k.shape
    absmax = np.maximum(np.abs(k).max(axis=1, keepdims=True), np.float32(1e-4))
    e = _ceil_log2_f32((absmax * VLLM_V4_INV_FP8_MAX).astype(np.float32))
    y = np.clip((k * np.ldexp(np.float32(1), -e).astype(np.float32)).astype(np.float32), -E4M3_MAX, E4M3_MAX)
    return e4m3_bits(y), np.ldexp(np.float32(1), e).astype(np.float32)


V4_RECORDS = {
    # preset: (reference, c_kv width, k_pe width, c_kv spec, k_pe spec, record bytes)
    "sglang-dsv4-mxfp4": (sglang_dsv4_mxfp4_record, 448, 64, "mxfp4-rn", "bf16", 368),
    "sglang-dsv4-int4": (sglang_dsv4_int4_record, 448, 64, "int4-sym-g32-e4m3", "bf16", 368),
    "b12x-dsv4-nvfp4": (b12x_dsv4_nvfp4_record, 448, 64, "fp4-e2m1-tile16-e4m3-rcp", "bf16", 432),
    "trtllm-dsv4-nvfp4-cold": (trtllm_dsv4_nvfp4_cold_record, 448, 64, "fp4-e2m1-tile16-e4m3-rcp", "bf16", 380),
}
# the engines read bf16 entries: the MXFP4 byte's float32 expression and the NVFP4 kernels' amax · fl(1/6) are
# latentq's exact rules on bf16 rows only
V4_HALF_INPUT_RECORDS = {"sglang-dsv4-mxfp4", "b12x-dsv4-nvfp4", "trtllm-dsv4-nvfp4-cold"}
# records whose bytes latentq gives on a subset of rows only: preset -> (ckv, kpe) -> bool [T]
V4_RECORD_EXACT_ROWS = {
    "b12x-dsv4-nvfp4": b12x_dsv4_nvfp4_exact_rows,
    "trtllm-dsv4-nvfp4-cold": trtllm_dsv4_nvfp4_cold_exact_rows,
}
