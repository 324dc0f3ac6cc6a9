"""Independent Python references for the production MLA cache formats latentq reproduces.

Each function takes x: float32 [T, D] (one cached matrix: c_kv or k_pe of one layer) and returns the
bytes in the layout the C++ module exposes (see `Quant`). Every formula names its public source
(repository, file, function) and quotes the line it follows. Where the engine's float32 expression and
exact math can differ, the reference follows exact math and says so (see `flashmla_torch_pow2_scale`).

Conventions shared with the C++ module (latentq.quantize):
  codes   uint8 [T, code_row_bytes]
            e4m3   : one byte per element, raw float8_e4m3fn bits (sign kept: -0 is 0x80)
            e2m1   : two per byte, element 2k in the LOW nibble of byte k (torchao pack_uint4, FlashMLA
                     V4.1 FP4) -- NOT ggml's in-block order
            q8_0   : int8 two's complement per element
            q4_0/1 : ggml in-block nibble order: byte j of each 16-byte block = element j (low nibble)
                     | element j+16 (high nibble); codes are the unsigned nibbles
  scales  1-D [T * blocks_per_row], row-major (token, then block):
            float32 for fp32 scales, uint8 raw bits for UE8M0/E8M0 and e4m3 block scales, float16 for
            ggml d
  offsets float16 [T * blocks_per_row] for q4_1 (ggml m = the block min); empty otherwise
  global_scale float32 array of 0 or 1 element (nvfp4 per-tensor scale, fp8-e4m3-tensor scale)

Element conversions are implemented here at the bit level (numpy) and checked against ml_dtypes in
test_engine_formats.py; nothing below calls ml_dtypes or torch to produce a code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

F32 = np.float32
FLT_MIN = np.float32(np.finfo(np.float32).tiny)  # 2^-126, CUDA's FLT_MIN
E4M3_MAX = np.float32(448.0)
E2M1_MAX = np.float32(6.0)


# ---------------------------------------------------------------------------------------------------
# Element conversions (bit level)
# ---------------------------------------------------------------------------------------------------


def _f32(x) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


def e4m3_bits(x, saturate: bool = True) -> np.ndarray:
    """float32 -> float8_e4m3fn bits, round to nearest even, one rounding from float32.
    saturate=True is PTX cvt.rn.satfinite.e4m3x2.f32 / __nv_cvt_float_to_fp8(.., __NV_SATFINITE, E4M3)
    (vLLM csrc/quantization/w8a8/fp8/nvidia/quant_utils.cuh, scaled_vec_conversion<uint8_t, float>:
    `__nv_cvt_float_to_fp8(a / scale, __NV_SATFINITE, fp8_type)`): finite overflow and +-Inf give
    +-448. saturate=False is the ml_dtypes / OCP 'no saturation' cast: overflow gives NaN (0x7F|sign).
    NaN -> 0x7F|sign either way."""
    x = _f32(x)
    b = x.view(np.uint32)
    sign = ((b >> np.uint32(24)) & np.uint32(0x80)).astype(np.uint8)
    a = b & np.uint32(0x7FFFFFFF)
    af = a.view(np.float32)
    # e4m3 subnormals: k * 2^-9, k = 0..7; |x| * 512 is exact, np.rint is round-half-even; k = 8 is
    # the code of the smallest normal 2^-6, so the integer is the code directly.
    with np.errstate(over="ignore", invalid="ignore"):
        q_sub = np.rint(af * np.float32(512.0))
    q_sub = np.where(af < np.float32(2.0**-6), q_sub, 0).astype(np.int64)
    # normals: round the float32 mantissa to 3 bits, half to even, on the bit pattern; the exponent
    # rebias 127 -> 7 is a subtraction of (120 << 3) on the (exponent, mantissa) field.
    r = ((a + np.uint32(0x7FFFF) + ((a >> np.uint32(20)) & np.uint32(1))) >> np.uint32(20)).astype(np.int64)
    q = np.where(af < np.float32(2.0**-6), q_sub, r - 960)
    q = np.where(q > 126, 126 if saturate else 127, q)
    q = np.where(np.isnan(af), 127, q)
    return q.astype(np.uint8) | sign


def e4m3_value(bits) -> np.ndarray:
    """float8_e4m3fn bits -> float32 (exact)."""
    b = np.asarray(bits, dtype=np.uint8).astype(np.int64)
    s = np.where(b & 0x80, -1.0, 1.0)
    e = (b >> 3) & 0xF
    m = b & 7
    v = np.where(e == 0, m * 2.0**-9, (8 + m) * np.ldexp(1.0, e - 7 - 3))
    v = np.where((b & 0x7F) == 0x7F, np.nan, v)
    return (s * v).astype(np.float32)


def e2m1_bits(x) -> np.ndarray:
    """float32 -> fp4 e2m1 4-bit code (uint8 0..15), round to nearest even, saturating to +-6 (PTX
    cvt.rn.satfinite.e2m1x2.f32; torchao custom_fp_utils._f32_to_floatx_unpacked; FlashMLA
    tests/quant.py _quantize_to_e2m1 'ties to even, saturating to +-6'). Bit 3 = sign (kept for -0)."""
    x = _f32(x)
    b = x.view(np.uint32)
    sign = ((b >> np.uint32(28)) & np.uint32(0x8)).astype(np.uint8)
    a = b & np.uint32(0x7FFFFFFF)
    af = a.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        q_sub = np.rint(af * np.float32(2.0))  # subnormals 0, 0.5; 2 -> 1.0 (code 2)
    q_sub = np.where(af < np.float32(1.0), q_sub, 0).astype(np.int64)
    r = ((a + np.uint32(0x1FFFFF) + ((a >> np.uint32(22)) & np.uint32(1))) >> np.uint32(22)).astype(np.int64)
    q = np.where(af < np.float32(1.0), q_sub, r - 252)  # rebias 127 -> 1: (126 << 1)
    q = np.minimum(q, 7)
    return q.astype(np.uint8) | sign


_E2M1_MAG = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def e2m1_value(codes) -> np.ndarray:
    c = np.asarray(codes, dtype=np.uint8)
    v = _E2M1_MAG[c & 7]
    return np.where(c & 8, -v, v).astype(np.float32)


def e8m0_value(bits) -> np.ndarray:
    """E8M0 / UE8M0 byte -> 2^(b-127) as float32 (b = 0 gives the float32 subnormal 2^-127; 255 NaN)."""
    b = np.asarray(bits, dtype=np.uint8).astype(np.int64)
    v = np.ldexp(1.0, b - 127)
    return np.where(b == 255, np.nan, v).astype(np.float32)


def pow2_exponent_to_e8m0(k) -> np.ndarray:
    """Unbiased exponent k (2^k the scale) -> biased UE8M0 byte k + 127 (valid for -127 <= k <= 127)."""
    k = np.asarray(k, dtype=np.int64)
    assert np.all((k >= -127) & (k <= 127)), "exponent outside the E8M0 range"
    return (k + 127).astype(np.uint8)


def bf16_bits(x) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even (torch .to(torch.bfloat16))."""
    x = _f32(x)
    b = x.view(np.uint32)
    r = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    r = np.where(np.isnan(x), (b >> np.uint32(16)) | np.uint32(0x40), r)
    return r.astype(np.uint16)


def roundf(v) -> np.ndarray:
    """C roundf (half away from zero), exact for every float32: trunc plus the exact fraction test."""
    v = _f32(v)
    a = np.abs(v)
    t = np.trunc(a)
    r = t + (a - t >= np.float32(0.5))  # a - t is exact
    return np.copysign(r, v).astype(np.float32)


def pack_nibbles_even_low(q) -> np.ndarray:
    """[T, D] 4-bit codes -> [T, ceil(D/2)] bytes, element 2k low nibble, 2k+1 high (a missing last
    element packs as 0). torchao prototype/mx_formats/kernels.py pack_uint4:
    `return (uint8_data[::2] | uint8_data[1::2] << 4)`; FlashMLA tests/quant.py V41_FP4:
    'Element i of a row is in byte i//2, even elements in the low nibble'."""
    q = np.asarray(q, dtype=np.uint8)
    T, D = q.shape
    if D % 2:
        q = np.concatenate([q, np.zeros((T, 1), np.uint8)], axis=1)
    return (q[:, 0::2] | (q[:, 1::2] << np.uint8(4))).astype(np.uint8)


def unpack_nibbles_even_low(p, D) -> np.ndarray:
    p = np.asarray(p, dtype=np.uint8)
    out = np.empty((p.shape[0], 2 * p.shape[1]), np.uint8)
    out[:, 0::2] = p & 0xF
    out[:, 1::2] = p >> 4
    return out[:, :D]


def pack_nibbles_ggml(q) -> np.ndarray:
    """[T, D] 4-bit codes, D % 32 == 0 -> [T, D/2]: in each 32-block, byte j = q[j] | q[j+16] << 4
    (ggml ggml/src/ggml-quants.c quantize_row_q4_0_ref: `y[i].qs[j] = xi0; y[i].qs[j] |= xi1 << 4;`
    with xi0 from x[i*qk + j] and xi1 from x[i*qk + qk/2 + j])."""
    q = np.asarray(q, dtype=np.uint8)
    T, D = q.shape
    assert D % 32 == 0
    b = q.reshape(T, D // 32, 2, 16)
    return (b[:, :, 0, :] | (b[:, :, 1, :] << np.uint8(4))).reshape(T, D // 2).astype(np.uint8)


def unpack_nibbles_ggml(p, D) -> np.ndarray:
    p = np.asarray(p, dtype=np.uint8).reshape(p.shape[0], D // 32, 16)
    return np.concatenate([p & 0xF, p >> 4], axis=2).reshape(p.shape[0], D)


# ---------------------------------------------------------------------------------------------------
# Result container and helpers
# ---------------------------------------------------------------------------------------------------


@dataclass
class Quant:
    spec: str
    rows: int
    cols: int
    codes: np.ndarray  # uint8 [T, code_row_bytes]
    scales: np.ndarray  # 1-D [T * blocks_per_row] (empty for per-tensor specs)
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float16))
    global_scale: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    block: int = 0  # dims per scale (0: per-tensor)

    @property
    def storage_bytes(self) -> int:
        return int(self.codes.nbytes + self.scales.nbytes + self.offsets.nbytes + self.global_scale.nbytes)

    @property
    def bytes_per_token(self) -> float:
        return self.storage_bytes / self.rows


def _tile_amax(x: np.ndarray, n: int) -> np.ndarray:
    """max |x| per tile of n consecutive dims of each row; a last partial tile uses its own dims
    (zero padding never changes a max of absolute values). float32, exact."""
    T, D = x.shape
    nt = -(-D // n)
    a = np.zeros((T, nt * n), np.float32)
    a[:, :D] = np.abs(x)
    return a.reshape(T, nt, n).max(axis=2)


def _expand(s: np.ndarray, n: int, D: int) -> np.ndarray:
    """[T, nt] per-tile values -> [T, D]."""
    return np.repeat(s, n, axis=1)[:, :D]


# ---------------------------------------------------------------------------------------------------
# 1. FlashMLA: fp8-e4m3-tile<N>-pow2 and -pow2-ue8m0
# ---------------------------------------------------------------------------------------------------

FLASHMLA_AMAX_MARGIN = np.float32(1e-4)  # float32(1e-4) = 9.99999974738e-05


def flashmla_pow2_exponent(amax: np.ndarray) -> np.ndarray:
    """k with s = 2^k = 2^ceil(log2(max(amax/448, 1e-4))), EXACT math on the float32 value
    v = fl32(amax / 448): k = exponent(v) + (mantissa(v) != 0).

    Source: deepseek-ai/FlashMLA tests/quant.py (commits 520fec6, 9a7d253):
      `cur_scale_factors_inv = torch.abs(input_k_cache[..., tile]).max(dim=-1).values.float() / 448.0`
      _cast_scale_inv_to_ue8m0: `torch.pow(2, torch.clamp_min(scales_inv, 1e-4).log2().ceil())`
    FlashMLA evaluates ceil(log2(v)) with torch.log2 in float32, which rounds log2(v) down to the
    integer k for v = 2^k * (1 + j*2^-23), j = 1..5, |k| >= 4 (CPU torch 2.13; see
    flashmla_torch_pow2_scale): there torch gives 2^k where exact math gives 2^(k+1). This reference
    follows exact math; e.g. amax = nextafter(7168, inf) = 7168.0005: v = 16.000002, exact s = 32,
    torch-CPU s = 16 (and the code of that element is 224 vs 448)."""
    amax = _f32(amax)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        v = (amax / E4M3_MAX).astype(np.float32)
    v = np.maximum(v, FLASHMLA_AMAX_MARGIN)  # torch.clamp_min(., 1e-4): v is now normal
    b = v.view(np.uint32)
    e = ((b >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int64) - 127
    return e + ((b & np.uint32(0x7FFFFF)) != 0)


def flashmla_torch_pow2_scale(amax: np.ndarray) -> np.ndarray:
    """The FlashMLA expression evaluated literally with torch on this machine (documentation/tests
    only; device- and library-dependent at the points named in flashmla_pow2_exponent)."""
    import torch

    t = torch.from_numpy(_f32(amax)).float() / 448.0
    return torch.pow(2, torch.clamp_min(t, 1e-4).log2().ceil()).to(torch.float32).numpy()


def fp8_tile_pow2(x, tile: int, ue8m0: bool = False) -> Quant:
    """FlashMLA's quantizer (V32_FP8Sparse: tile 128, fp32 scales; MODEL1/V4 FP8Sparse: tile 64, UE8M0;
    V41_FP8Sparse: tile 32, UE8M0). Per token and tile: s = 2^k (flashmla_pow2_exponent);
    code = e4m3(x / s): `(input_k_cache[..., tile].float() / cur_scale_factors_inv.float())
    .to(torch.float8_e4m3fn)` -- a true division by a power of two (exact), no clamp before the cast;
    the torch cast rounds to nearest even and (torch 2.13) saturates, and |x/s| <= 448*(1+2^-23) here,
    which rounds to 448 anyway. Stored: the float32 2^k (V32) or the UE8M0 byte k+127 (MODEL1, V4.1:
    `cur_scale_factors_inv.to(torch.float8_e8m0fnu)`)."""
    x = _f32(x)
    T, D = x.shape
    k = flashmla_pow2_exponent(_tile_amax(x, tile))
    s = np.ldexp(np.float32(1.0), k).astype(np.float32)
    codes = e4m3_bits((x / _expand(s, tile, D)).astype(np.float32))
    scales = pow2_exponent_to_e8m0(k).reshape(-1) if ue8m0 else s.reshape(-1)
    name = f"fp8-e4m3-tile{tile}-pow2" + ("-ue8m0" if ue8m0 else "")
    return Quant(name, T, D, codes, scales, block=tile)


VLLM_INDEXER_AMAX_FLOOR = np.float32(1e-4)  # `fmaxf(amax, 1e-4)`: the double 1e-4 as a float


def fp8_tile_pow2_amax_floor(x, tile: int) -> Quant:
    """vLLM csrc/cache_kernels.cu indexer_k_quant_and_cache_kernel with scale_fmt "ue8m0" (the DSA indexer key cache,
    as carried by local-inference-lab/vllm at 28be48fa), per token and block of `tile` dims:
      `float scale = fmaxf(amax, 1e-4) / kFp8ScaleDivisor;`      (kFp8ScaleDivisor = 448.f on CUDA)
      `if (use_ue8m0) { scale = exp2f(ceilf(log2f(scale))); }`
    then e4m3(x / s), RNE, saturating; the float32 s stored. ceil(log2(v)) in exact math on the float32 v (as
    flashmla_pow2_exponent). Spec fp8-e4m3-tile<N>-pow2-amaxfloor."""
    x = _f32(x)
    T, D = x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        v = (np.maximum(_tile_amax(x, tile), VLLM_INDEXER_AMAX_FLOOR) / E4M3_MAX).astype(np.float32)
    b = v.view(np.uint32)
    e = ((b >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int64) - 127 + ((b & np.uint32(0x7FFFFF)) != 0)
    s = np.ldexp(np.float32(1.0), e).astype(np.float32)
    codes = e4m3_bits((x / _expand(s, tile, D)).astype(np.float32))
    return Quant(f"fp8-e4m3-tile{tile}-pow2-amaxfloor", T, D, codes, s.reshape(-1), block=tile)


# ---------------------------------------------------------------------------------------------------
# 2. vLLM fp8_ds_mla: fp8-e4m3-tile<N>-fp32
# ---------------------------------------------------------------------------------------------------


def fp8_tile_fp32(x, tile: int) -> Quant:
    """vLLM csrc/cache_kernels.cu concat_and_cache_ds_mla_kernel (tile 128, 4 tiles of kv_c):
      `float tile_scale = max_abs / 448.f;  tile_scale = fmaxf(tile_scale, FLT_MIN);`
      code: fp8::scaled_convert<uint8_t, scalar_t, kFp8E4M3>(vals[i], tile_scale)
            = __nv_cvt_float_to_fp8(float(x) / tile_scale, __NV_SATFINITE, __NV_E4M3)
    i.e. an IEEE float32 division x / s (not x * (1/s)), then one RNE, saturating conversion. s is
    stored raw as float32 (not a power of two). x / s can exceed 448 by rounding (s = fl(amax/448)
    may be below amax/448); saturation maps it to 448."""
    x = _f32(x)
    T, D = x.shape
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s = np.maximum((_tile_amax(x, tile) / E4M3_MAX).astype(np.float32), FLT_MIN)
    codes = e4m3_bits((x / _expand(s, tile, D)).astype(np.float32))
    return Quant(f"fp8-e4m3-tile{tile}-fp32", T, D, codes, s.reshape(-1), block=tile)


# ---------------------------------------------------------------------------------------------------
# 3. vLLM kv_cache_dtype=fp8 on MLA: fp8-e4m3-tensor, fp8-e4m3-tensor-s1
# ---------------------------------------------------------------------------------------------------

VLLM_K_SCALE_CONSTANT = np.float32(200.0)  # vllm/envs.py: K_SCALE_CONSTANT default "200"


def vllm_calc_k_scale(c_kv) -> np.float32:
    """What vLLM stores as the layer's k_scale when calculate_kv_scales is on (MLAAttention
    calc_kv_scales: `kv_abs_max = torch.abs(kv_c_normed).max(); self._k_scale.copy_(kv_abs_max /
    k_range)` with k_range = K_SCALE_CONSTANT = 200): amax of c_kv ONLY (k_pe is not looked at), of
    the first batch the layer sees, divided by 200 (not 448). The same k_scale is then applied to
    k_pe. (Not a latentq spec; given for the report.)"""
    return np.float32(np.float32(np.abs(_f32(c_kv)).max()) / VLLM_K_SCALE_CONSTANT)


def fp8_tensor(x, scale=None) -> Quant:
    """vLLM concat_and_cache_mla_kernel with kv_dt = kFp8E4M3: `dst[dst_idx] =
    fp8::scaled_convert<cache_t, scalar_t, kv_dt>(src[src_idx], *scale)` = __nv_cvt_float_to_fp8(
    float(x) / scale, __NV_SATFINITE, __NV_E4M3), one scale for c_kv and k_pe of the layer (1.0
    unless calibrated or loaded). scale=None: latentq's fp8-e4m3-tensor, s = fl32(amax / 448) over
    the whole matrix (an all-zero matrix would give s = 0: left undefined here, asserted). The scale
    goes to global_scale; scales is empty."""
    x = _f32(x)
    T, D = x.shape
    if scale is None:
        amax = np.float32(np.abs(x).max())
        assert amax > 0, "fp8-e4m3-tensor of an all-zero matrix is not defined by the source"
        s = np.float32(amax / E4M3_MAX)
        name = "fp8-e4m3-tensor"
    else:
        s = np.float32(scale)
        name = "fp8-e4m3-tensor-s1" if s == 1.0 else "fp8-e4m3-tensor"
    codes = e4m3_bits((x / s).astype(np.float32))
    return Quant(name, T, D, codes, np.zeros(0, np.float32), global_scale=np.array([s], np.float32))


# ---------------------------------------------------------------------------------------------------
# 4. OCP MX v1.0: mxfp8 (e4m3), mxfp4 (e2m1); blocks of 32, E8M0 scale
# ---------------------------------------------------------------------------------------------------

_MX_EMAX = {"e4m3": 8, "e2m1": 2}  # torchao constants.py F8E4M3_MAX_POW2 = 8, F4_E2M1_MAX_POW2 = 2


def mx(x, elem: str, block: int = 32, torchao_min_scale: bool = False) -> Quant:
    """pytorch/ao torchao/prototype/mx_formats/mx_tensor.py to_mx, ScaleCalculationMode.FLOOR:
      max_abs = torch.amax(torch.abs(data_hp), -1)                                  (l.247)
      extracted_pow2 = ((max_abs_int32 >> 23) & 0xFF) - 127   [float32 exponent field] (l.312)
      scale_e8m0_unbiased = extracted_pow2 - target_max_pow2                         (l.317)
      clamp(scale_e8m0_unbiased, -127, 128); biased = unbiased + 127 -> uint8         (l.329)
      scale_fp32 = biased << 23 viewed as float32; clamp(scale_fp32, min=2^-126)      (l.359)
      data_lp = data_hp / scale_fp32 (l.362); fp8: clamp to +-448 (l.375), .to(float8_e4m3fn) (RNE);
      fp4: f32_to_f4_unpacked (RNE, saturating) then pack_uint4 (even element low nibble)  (l.396)
    = OCP MX v1.0 section 6.3: X = 2^(floor(log2(amax)) - emax_elem) for normal amax. amax = 0 or a
    float32-subnormal amax: exponent field 0 -> unbiased -127 - emax -> clamped -127 -> byte 0.
    torchao then DIVIDES by 2^-126 (its clamp to the smallest normal, l.359) although the byte means
    2^-127 (get_fp_scale decodes 2^-127): quantize and dequantize disagree by a factor 2 for byte-0
    blocks with a nonzero element (amax < 2^-118 for e4m3, < 2^-124 for e2m1). Default here: divide
    by the stored 2^-127 (OCP); torchao_min_scale=True reproduces torchao bit for bit."""
    x = _f32(x)
    T, D = x.shape
    emax = _MX_EMAX[elem]
    amax = _tile_amax(x, block)
    ef = ((amax.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int64)
    k = np.clip(ef - 127 - emax, -127, 127)  # finite input: the +128 (NaN) end is unused
    byte = pow2_exponent_to_e8m0(k)
    div = np.ldexp(np.float32(1.0), np.maximum(k, -126) if torchao_min_scale else k).astype(np.float32)
    y = (x / _expand(div, block, D)).astype(np.float32)
    if elem == "e4m3":
        codes = e4m3_bits(y)
        name = "mxfp8"
    else:
        codes = pack_nibbles_even_low(e2m1_bits(y))
        name = "mxfp4"
    return Quant(name, T, D, codes, byte.reshape(-1), block=block)


# SGLang's MXFP4 (mxfp4-ceil): sgl-project/sglang python/sglang/srt/layers/attention/dsv4/fp4_indexer.py at 301bcf08
# (PR 26209, the DeepSeek-V4 FP4 indexer cache; the DSA port --enable-dsa-fp4-indexer of PR 30546 reuses it as is).
SGLANG_FP4_SCALE_FLOOR = np.float32(1e-4)  # `tl.maximum(amax0 / 6.0, 1.0e-4)`: 1e-4 as a float32
SGLANG_E2M1_THRESHOLDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # _fp4_e2m1_code: `idx += (ax > t)`


def sglang_mxfp4(x) -> Quant:
    """SGLang quantize_fp4_indexer_tensor (_quantize_fp4_indexer_kernel, GROUP_N = 32), per token and group of 32
    (a last, partial group of a row keeps its own scale, as latentq's mxfp4-ceil):
    `sf0 = tl.maximum(amax0 / 6.0, 1.0e-4)`; `_ceil_ue8m0_exp`: the biased exponent of sf, plus 1 if any mantissa
    bit is set, clamped to [1, 254]; `v0 = x / scale0` (scale0 = 2^(exp0 - 127)); `_fp4_e2m1_code`:
    `ax = tl.minimum(tl.abs(x), 6.0)`, idx = the thresholds ax exceeds (ties toward zero), `sign = ((x < 0) &
    (idx != 0))`; `packed = (code0 & 0x0F) | ((code1 & 0x0F) << 4)` (element 2k low). Division in exact float32
    (the sources' `/`). Returns the Quant of spec mxfp4-ceil (scales: the UE8M0 bytes, token then group)."""
    x = _f32(x)
    T, D = x.shape
    sf = np.maximum((_tile_amax(x, 32) / E2M1_MAX).astype(np.float32), SGLANG_FP4_SCALE_FLOOR)
    b = sf.view(np.uint32)
    e = np.clip((b >> np.uint32(23)).astype(np.int64) + ((b & np.uint32(0x7FFFFF)) != 0), 1, 254)
    v = (x / _expand(e8m0_value(e), 32, D)).astype(np.float32)
    a = np.minimum(np.abs(v), E2M1_MAX)
    idx = sum((a > np.float32(t)).astype(np.uint8) for t in SGLANG_E2M1_THRESHOLDS)
    code = idx | (((v < 0) & (idx != 0)).astype(np.uint8) << np.uint8(3))
    return Quant("mxfp4-ceil", T, D, pack_nibbles_even_low(code), e.astype(np.uint8).reshape(-1), block=32)


# ---------------------------------------------------------------------------------------------------
# 5. NVFP4: e2m1 in blocks of 16, e4m3 block scale, fp32 per-tensor scale
# ---------------------------------------------------------------------------------------------------

E4M3_TINY = np.float32(2.0**-6)  # torch.finfo(torch.float8_e4m3fn).tiny (smallest NORMAL)


def nvfp4(x, per_tensor_scale=None) -> Quant:
    """pytorch/ao torchao/prototype/mx_formats/nvfp4_tensor.py, two-level path of nvfp4_quantize:
      per_tensor_amax_to_scale: `amax.to(torch.float32) / (F8E4M3_MAX * F4_E2M1_MAX)`  = amax/2688 (l.769)
      block_scale = max_abs / F4_E2M1_MAX                                                   (l.811)
      scaled_block_scales = block_scale_fp32 / per_tensor_scale                             (l.837)
      clamp(scaled_block_scales, min=E4M3_EPS (=finfo(e4m3).tiny = 2^-6), max=448) -> e4m3 (RNE) (l.839)
      reciprocal_scale = (1.0 / per_tensor_scale) / scaled_block_scales_fp32                (l.844)
      data_scaled = data_hp * reciprocal_scale; clamp +-6; f32_to_f4_unpacked (RNE); pack_uint4
    per_tensor_scale=None: from this matrix's amax (latentq's nvfp4: one global scale per layer
    matrix). An all-zero matrix gives per_tensor_scale 0 and NaN codes in torchao: not defined."""
    x = _f32(x)
    T, D = x.shape
    if per_tensor_scale is None:
        amax = np.float32(np.abs(x).max())
        assert amax > 0, "nvfp4 of an all-zero matrix is not defined by torchao (per_tensor_scale 0)"
        g = np.float32(amax / np.float32(448.0 * 6.0))
    else:
        g = np.float32(per_tensor_scale)
    bs = (_tile_amax(x, 16) / E2M1_MAX).astype(np.float32)
    sb = e4m3_bits(np.clip((bs / g).astype(np.float32), E4M3_TINY, E4M3_MAX))
    sbf = e4m3_value(sb)
    recip = ((np.float32(1.0) / g) / sbf).astype(np.float32)
    y = np.clip((x * _expand(recip, 16, D)).astype(np.float32), -E2M1_MAX, E2M1_MAX)
    codes = pack_nibbles_even_low(e2m1_bits(y))
    return Quant("nvfp4", T, D, codes, sb.reshape(-1), global_scale=np.array([g], np.float32), block=16)


# FlashMLA V4.1 FP4 (not a latentq spec yet; the 288-byte record below uses it)
def fp4_tile16_e4m3_flashmla(x) -> Quant:
    """deepseek-ai/FlashMLA tests/quant.py (9a7d253) V41_FP4Sparse: 'The scale is amax / 6 ... rounded
    to e4m3, without a per-tensor scale':
      `scale = torch.clamp(amax / 6.0, 2.0**-9, 448.0).to(torch.float8_e4m3fn)`   (min = 2^-9, the
       smallest e4m3 SUBNORMAL, unlike torchao's 2^-6)
      codes = _quantize_to_e2m1(x / scale.float())   (true division, RNE, saturating +-6)
      packed: codes[..., 0::2] | codes[..., 1::2] << 4."""
    x = _f32(x)
    T, D = x.shape
    sb = e4m3_bits(np.clip((_tile_amax(x, 16) / E2M1_MAX).astype(np.float32), np.float32(2.0**-9), E4M3_MAX))
    y = (x / _expand(e4m3_value(sb), 16, D)).astype(np.float32)
    return Quant("fp4-e2m1-tile16-e4m3", T, D, pack_nibbles_even_low(e2m1_bits(y)), sb.reshape(-1), block=16)


def fp4_tile16_e4m3_flashinfer(x) -> Quant:
    """flashinfer-ai/flashinfer include/flashinfer/attention/sparse_mla_sm120/common/nvfp4_quantization.cuh
    (3fe65b06, PR 4955) quantize_fp32_group16_to_nvfp4_regs, per group of 16:
      `scale_byte = float_to_e4m3_byte(amax / 6.f)`   (__nv_fp8_e4m3: RNE, saturating; NO lower clamp)
      `scale_inv = scale == 0.f ? 0.f : 1.f / scale`  (scale: the e4m3 value of that byte)
      `normalized[i] = values[i] * scale_inv`          then cvt.rn.satfinite.e2m1x2.f32 (RNE, +-6)
    packed with element 2j in the low nibble of byte j (fp32_vec_to_e2m1)."""
    x = _f32(x)
    T, D = x.shape
    sb = e4m3_bits((_tile_amax(x, 16) / E2M1_MAX).astype(np.float32))
    s = e4m3_value(sb).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(s == 0, np.float32(0), (np.float32(1) / s).astype(np.float32)).astype(np.float32)
    y = (x * _expand(inv, 16, D)).astype(np.float32)
    return Quant("fp4-e2m1-tile16-e4m3-rcp", T, D, pack_nibbles_even_low(e2m1_bits(y)), sb.reshape(-1), block=16)


# ---------------------------------------------------------------------------------------------------
# 6. ggml q8_0, q4_0, q4_1 (blocks of 32 along the row)
# ---------------------------------------------------------------------------------------------------


def _blocks32(x) -> np.ndarray:
    x = _f32(x)
    T, D = x.shape
    assert D % 32 == 0, "ggml block formats need D % 32 == 0"
    return x.reshape(T, D // 32, 32)


def q8_0(x) -> Quant:
    """ggml-org/llama.cpp ggml/src/ggml-quants.c quantize_row_q8_0_ref:
    `amax = MAX(amax, fabsf(v))`; `const float d = amax / ((1 << 7) - 1);`
    `const float id = d ? 1.0f/d : 0.0f;`  `y[i].qs[j] = roundf(x0);` with x0 = x*id (float32);
    `y[i].d = GGML_FP32_TO_FP16(d)` (RNE). roundf: half away from zero."""
    b = _blocks32(x)
    T, nb, _ = b.shape
    d = (np.abs(b).max(axis=2) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    q = roundf((b * idv[:, :, None]).astype(np.float32)).astype(np.int8)
    return Quant("q8_0", T, nb * 32, q.reshape(T, -1).view(np.uint8), d.astype(np.float16).reshape(-1), block=32)


def q4_0(x) -> Quant:
    """ggml quantize_row_q4_0_ref: max = the signed value of the FIRST element of largest |x|
    (`if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`); `const float d = max / -8;`
    `const float id = d ? 1.0f/d : 0.0f;` `xi = MIN(15, (int8_t)(x*id + 8.5f))` (two float32 roundings,
    truncation); nibbles j | j+16. Stored codes are the unsigned nibbles (value + 8)."""
    b = _blocks32(x)
    T, nb, _ = b.shape
    i = np.argmax(np.abs(b), axis=2)  # first occurrence, as the strict '<' loop
    mx_ = np.take_along_axis(b, i[:, :, None], axis=2)[:, :, 0]
    d = (mx_ / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    t = ((b * idv[:, :, None]).astype(np.float32) + np.float32(8.5)).astype(np.float32)
    q = np.minimum(np.trunc(t), 15).astype(np.uint8)
    return Quant("q4_0", T, nb * 32, pack_nibbles_ggml(q.reshape(T, -1)), d.astype(np.float16).reshape(-1), block=32)


def q4_1(x) -> Quant:
    """ggml quantize_row_q4_1_ref: min/max of the block; `const float d = (max - min) / ((1 << 4) - 1);`
    `id = d ? 1.0f/d : 0.0f;` `x0 = (x - min)*id; xi0 = MIN(15, (int8_t)(x0 + 0.5f));`
    `y[i].d = FP16(d); y[i].m = FP16(min)`. d -> scales, m -> offsets (both fp16)."""
    b = _blocks32(x)
    T, nb, _ = b.shape
    lo = b.min(axis=2)
    hi = b.max(axis=2)
    d = ((hi - lo) / np.float32(15)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    t = (((b - lo[:, :, None]).astype(np.float32) * idv[:, :, None]).astype(np.float32) + np.float32(0.5)).astype(
        np.float32
    )
    q = np.minimum(np.trunc(t), 15).astype(np.uint8)
    return Quant(
        "q4_1",
        T,
        nb * 32,
        pack_nibbles_ggml(q.reshape(T, -1)),
        d.astype(np.float16).reshape(-1),
        offsets=lo.astype(np.float16).reshape(-1),
        block=32,
    )


def ggml_rows(q: Quant) -> np.ndarray:
    """The ggml block_q8_0 / block_q4_0 / block_q4_1 bytes of each row (what gguf.quants.quantize
    returns): per 32-block [d fp16][m fp16 (q4_1)][qs]."""
    T, nb = q.rows, q.cols // 32
    d = q.scales.reshape(T, nb).view(np.uint8).reshape(T, nb, 2)
    per = 32 if q.spec == "q8_0" else 16
    qs = q.codes.reshape(T, nb, per)
    parts = [d]
    if q.spec == "q4_1":
        parts.append(q.offsets.reshape(T, nb).view(np.uint8).reshape(T, nb, 2))
    parts.append(qs)
    return np.concatenate(parts, axis=2).reshape(T, -1)


# ---------------------------------------------------------------------------------------------------
# Dispatcher, dequantization, accounting
# ---------------------------------------------------------------------------------------------------

_TILE_RE = re.compile(r"^fp8-e4m3-tile(\d+)-(pow2|pow2-ue8m0|pow2-amaxfloor|fp32)$")


def quantize(x, spec: str) -> Quant:
    m = _TILE_RE.match(spec)
    if m:
        n, kind = int(m.group(1)), m.group(2)
        if kind == "fp32":
            return fp8_tile_fp32(x, n)
        if kind == "pow2-amaxfloor":
            return fp8_tile_pow2_amax_floor(x, n)
        return fp8_tile_pow2(x, n, ue8m0=(kind == "pow2-ue8m0"))
    table = {
        "fp8-e4m3-tensor": lambda v: fp8_tensor(v),
        "fp8-e4m3-tensor-s1": lambda v: fp8_tensor(v, 1.0),
        "mxfp8": lambda v: mx(v, "e4m3"),
        "mxfp4": lambda v: mx(v, "e2m1"),
        "mxfp4-ceil": sglang_mxfp4,
        "mxfp4-rn": sglang_mxfp4_rn,  # engine_refs_v4
        "int4-sym-g32-e4m3": sglang_int4_e4m3,  # engine_refs_v4
        "nvfp4": nvfp4,
        "q8_0": q8_0,
        "q4_0": q4_0,
        "q4_1": q4_1,
        "fp4-e2m1-tile16-e4m3": fp4_tile16_e4m3_flashmla,
        "fp4-e2m1-tile16-e4m3-rcp": fp4_tile16_e4m3_flashinfer,
    }
    if spec not in table:
        raise ValueError(f"no reference for spec {spec!r}")
    return table[spec](x)


def dequantize(q: Quant) -> np.ndarray:
    """Decode with the engines' own dequant expressions (float32, one rounding per operation):
    FlashMLA/vLLM: e4m3 value * scale; MX (torchao to_dtype): value * 2^(b-127); NVFP4 (torchao
    dequantize): value * (per_tensor_scale * e4m3 block scale); ggml dequantize_row_*: q*d, q*d + m."""
    T, D = q.rows, q.cols
    s = q.spec
    if s.startswith("fp8-e4m3-tile"):
        n = q.block
        sc = e8m0_value(q.scales) if s.endswith("ue8m0") else q.scales.astype(np.float32)
        return (e4m3_value(q.codes) * _expand(sc.reshape(T, -1), n, D)).astype(np.float32)
    if s.startswith("fp8-e4m3-tensor"):
        return (e4m3_value(q.codes) * q.global_scale[0]).astype(np.float32)
    if s == "int4-sym-g32-e4m3":
        return sglang_int4_e4m3_decode(q)
    if s in ("mxfp8", "mxfp4", "mxfp4-ceil", "mxfp4-rn"):  # SGLang's dequant: the e2m1 value times 2^(b - 127)
        v = e4m3_value(q.codes) if s == "mxfp8" else e2m1_value(unpack_nibbles_even_low(q.codes, D))
        return (v * _expand(e8m0_value(q.scales).reshape(T, -1), 32, D)).astype(np.float32)
    if s == "nvfp4":
        bs = (q.global_scale[0] * e4m3_value(q.scales)).astype(np.float32).reshape(T, -1)
        return (e2m1_value(unpack_nibbles_even_low(q.codes, D)) * _expand(bs, 16, D)).astype(np.float32)
    if s in ("fp4-e2m1-tile16-e4m3", "fp4-e2m1-tile16-e4m3-rcp"):  # FlashInfer: values * scales (per 16)
        sc = e4m3_value(q.scales).astype(np.float32).reshape(T, -1)
        return (e2m1_value(unpack_nibbles_even_low(q.codes, D)) * _expand(sc, 16, D)).astype(np.float32)
    if s == "q8_0":
        d = q.scales.astype(np.float32).reshape(T, -1)
        return (q.codes.view(np.int8).astype(np.float32) * _expand(d, 32, D)).astype(np.float32)
    if s in ("q4_0", "q4_1"):
        u = unpack_nibbles_ggml(q.codes, D).astype(np.float32)
        d = _expand(q.scales.astype(np.float32).reshape(T, -1), 32, D)
        if s == "q4_0":
            return ((u - np.float32(8)) * d).astype(np.float32)
        m = _expand(q.offsets.astype(np.float32).reshape(T, -1), 32, D)
        return ((u * d).astype(np.float32) + m).astype(np.float32)
    raise ValueError(s)


def bytes_per_token(spec: str, D: int, T: int = 1) -> float:
    """Storage bytes per token of one [T, D] matrix (per-tensor scalars amortized over T)."""
    m = _TILE_RE.match(spec)
    if m:
        n, kind = int(m.group(1)), m.group(2)
        return D + -(-D // n) * (4 if kind != "pow2-ue8m0" else 1)
    if spec.startswith("fp8-e4m3-tensor"):
        return D + 4 / T
    if spec == "mxfp8":
        return D + -(-D // 32)
    if spec in ("mxfp4", "mxfp4-ceil", "mxfp4-rn", "int4-sym-g32-e4m3"):
        return -(-D // 2) + -(-D // 32)
    if spec == "nvfp4":
        return -(-D // 2) + -(-D // 16) + 4 / T
    per_block = {"q8_0": 34, "q4_0": 18, "q4_1": 20}[spec]
    return D // 32 * per_block


# ---------------------------------------------------------------------------------------------------
# Packed per-token engine records
# ---------------------------------------------------------------------------------------------------


def _le_bytes(a: np.ndarray, dtype: str) -> np.ndarray:
    a = np.ascontiguousarray(a.astype(dtype))
    return a.view(np.uint8).reshape(a.shape[0], -1)


def flashmla_v32_record(ckv, kpe) -> np.ndarray:
    """FlashMLA V32_FP8Sparse, 656 B per token (tests/quant.py quantize_k_cache; d=576, d_nope=512,
    d_rope=64, tile 128): bytes [0,512) e4m3 of c_kv in dim order; [512,528) 4 float32 scales
    (little-endian, tile 0..3) `result[..., d_nope: d_nope + num_tiles*4].view(torch.float32)`;
    [528,656) 64 bf16 k_pe `result[..., d_nope + num_tiles*4:].view(input_k_cache.dtype)` (the input
    is bf16 in FlashMLA; float32 k_pe is rounded to bf16, RNE). No padding inside a record."""
    ckv, kpe = _f32(ckv), _f32(kpe)
    assert ckv.shape[1] == 512 and kpe.shape[1] == 64 and ckv.shape[0] == kpe.shape[0]
    q = fp8_tile_pow2(ckv, 128)
    T = ckv.shape[0]
    return np.concatenate([q.codes, _le_bytes(q.scales.reshape(T, 4), "<f4"), _le_bytes(bf16_bits(kpe), "<u2")], axis=1)


def vllm_fp8_ds_mla_record(ckv, kpe) -> np.ndarray:
    """vLLM kv_cache_dtype=fp8_ds_mla (concat_and_cache_ds_mla_kernel), 656 B per token, the same
    byte layout as FlashMLA V32: NoPE bytes at dst_idx_start + threadIdx.x*8 (0..511); scales at
    float index `kv_lora_rank / 4 + tile_idx` (bytes 512..527); RoPE at 16-bit index
    `kv_lora_rank / 2 + 8 + pe_idx` (bytes 528..655, copied raw from the bf16 k_pe). Only the scale
    rule differs (fp8_tile_fp32)."""
    ckv, kpe = _f32(ckv), _f32(kpe)
    assert ckv.shape[1] == 512 and kpe.shape[1] == 64 and ckv.shape[0] == kpe.shape[0]
    q = fp8_tile_fp32(ckv, 128)
    T = ckv.shape[0]
    return np.concatenate([q.codes, _le_bytes(q.scales.reshape(T, 4), "<f4"), _le_bytes(bf16_bits(kpe), "<u2")], axis=1)


def flashmla_model1_record(ckv, kpe) -> np.ndarray:
    """FlashMLA MODEL1_FP8Sparse (renamed V4_FP8Sparse later), d = 512 = 448 nope + 64 rope, tile 64,
    7 UE8M0 scales. The logical 584-byte token: [0,448) e4m3 nope, [448,576) 64 bf16 rope,
    [576,583) 7 UE8M0 bytes (tile 0..6), [583] pad (0 here; torch.empty in FlashMLA). It needs
    c_kv of width 448: DeepSeek-V2/V3's 512 + 64 does not fit this layout. In FlashMLA's paged cache
    the parts are NOT contiguous per token: see flashmla_model1_block."""
    ckv, kpe = _f32(ckv), _f32(kpe)
    assert ckv.shape[1] == 448 and kpe.shape[1] == 64 and ckv.shape[0] == kpe.shape[0]
    q = fp8_tile_pow2(ckv, 64, ue8m0=True)
    T = ckv.shape[0]
    return np.concatenate(
        [q.codes, _le_bytes(bf16_bits(kpe), "<u2"), q.scales.reshape(T, 7), np.zeros((T, 1), np.uint8)], axis=1
    )


def flashmla_model1_block(records: np.ndarray, block_size: int) -> np.ndarray:
    """FlashMLA's MODEL1 paged block from per-token records: `result[:, :block_size*(d_nope+2*d_rope)]`
    holds the 576-byte nope+rope parts of the block's tokens back to back, then
    `result[:, block_size*(d_nope+2*d_rope):].view(num_blocks, block_size, 8)` the 8-byte scale groups
    (7 UE8M0 + 1 pad); each block is padded to a multiple of 576 bytes
    (`size_per_block_padded = (block_size*bytes_per_token + 576-1) // 576 * 576`). Missing tokens
    of a last block and the padding are zeros. -> uint8 [num_blocks, size_per_block_padded]."""
    T = records.shape[0]
    nb = -(-T // block_size)
    r = np.zeros((nb * block_size, 584), np.uint8)
    r[:T] = records
    r = r.reshape(nb, block_size, 584)
    body = np.concatenate([r[:, :, :576].reshape(nb, -1), r[:, :, 576:].reshape(nb, -1)], axis=1)
    padded = -(-(block_size * 584) // 576) * 576
    out = np.zeros((nb, padded), np.uint8)
    out[:, : body.shape[1]] = body
    return out


def flashmla_v41_fp8_record(ckv, kpe) -> np.ndarray:
    """FlashMLA V41_FP8Sparse, 528 B per token (csrc/cuda_kernels/kv_cache_format.h: 'Each V4.1 token
    stores [raw data, 1-byte scales], including the RoPE dims: FP8: 512 B e4m3 + 16 B ue8m0';
    tests/quant.py 9a7d253 'Token layout: [512 B fp8 data, 16 B ue8m0 scales]'): all 512 dims
    (448 nope + 64 rope) in e4m3 with tile 32 and the FlashMLA pow2 rule; [0,448) c_kv codes,
    [448,512) k_pe codes, [512,526) 14 c_kv scales, [526,528) 2 k_pe scales. Needs c_kv width 448."""
    ckv, kpe = _f32(ckv), _f32(kpe)
    assert ckv.shape[1] == 448 and kpe.shape[1] == 64 and ckv.shape[0] == kpe.shape[0]
    a = fp8_tile_pow2(ckv, 32, ue8m0=True)
    b = fp8_tile_pow2(kpe, 32, ue8m0=True)
    T = ckv.shape[0]
    return np.concatenate([a.codes, b.codes, a.scales.reshape(T, 14), b.scales.reshape(T, 2)], axis=1)


def flashmla_v41_fp4_record(ckv, kpe) -> np.ndarray:
    """FlashMLA V41_FP4Sparse, 288 B per token: [0,256) e2m1 of all 512 dims (448 nope then 64 rope),
    element 2k low nibble; [256,288) 32 e4m3 tile scales (28 nope, 4 rope); scale rule
    fp4_tile16_e4m3_flashmla. Needs c_kv width 448."""
    ckv, kpe = _f32(ckv), _f32(kpe)
    assert ckv.shape[1] == 448 and kpe.shape[1] == 64 and ckv.shape[0] == kpe.shape[0]
    q = fp4_tile16_e4m3_flashmla(np.concatenate([ckv, kpe], axis=1))
    T = ckv.shape[0]
    return np.concatenate([q.codes, q.scales.reshape(T, 32)], axis=1)


def flashinfer_nvfp4_mla_record(ckv, kpe) -> np.ndarray:
    """FlashInfer NVFP4 sparse MLA for DeepSeek-V4 (include/flashinfer/attention/sparse_mla_sm120/model/
    nvfp4_cache_traits.cuh, 3fe65b06, PR 4955), 384 B per token: a data row of 224 B packed e2m1 NoPE
    (448 dims, element 2j low nibble) then 128 B bf16 RoPE copied verbatim, and a scale row of 28 e4m3 group
    scales then 4 zero bytes. In a page of P tokens the engine stores the P data rows, then the P scale rows;
    this is one token's data row followed by its scale row (latentq's pack_record order)."""
    ckv, kpe = _f32(ckv), _f32(kpe)
    assert ckv.shape[1] == 448 and kpe.shape[1] == 64 and ckv.shape[0] == kpe.shape[0]
    q = fp4_tile16_e4m3_flashinfer(ckv)
    T = ckv.shape[0]
    pad = np.zeros((T, 4), np.uint8)
    return np.concatenate([q.codes, _le_bytes(bf16_bits(kpe), "<u2"), q.scales.reshape(T, 28), pad], axis=1)


VLLM_NVFP4_RCP6 = np.float32(1.0) / np.float32(6.0)  # get_reciprocal(FLOAT4_E2M1_MAX) = fl32(1/6) = 0x3E2AAAAB


def vllm_nvfp4_ds_mla_scale_bits(amax) -> np.ndarray:
    """The e4m3 scale byte of one group of 16 in the vLLM fork's nvfp4_ds_mla record: cvt_warp_fp16_to_fp4 with
    SFScaleVal = 1.0 (local-inference-lab/vllm csrc/libtorch_stable/quantization/fp4/nvfp4_utils.cuh at 28be48fa):
      `float SFValue = SFScaleVal * (vecMax * reciprocal_approximate_ftz(6.0f));`
      `__nv_fp8_e4m3 tmp = __nv_fp8_e4m3(SFValue);`            (RNE, saturating to 448, no floor)
    written as the engine's own reference writes it (vLLM tests/kernels/quantization/test_nvfp4_quant.py
    ref_nvfp4_quant: `scale = global_scale * (vec_max * get_reciprocal(FLOAT4_E2M1_MAX))`, 1/6 an IEEE
    division). For every bf16 and fp16 amax (the kernel reads bf16/fp16 c_kv only) this is e4m3(amax / 6), the
    -rcp format's rule (test_vllm_nvfp4_scale_rule_is_the_division_rule_on_half_inputs); for some float32 amax
    it is not (e.g. 0.11132812: amax / 6 rounds to the e4m3 code 9, amax * fl32(1/6) to 10)."""
    return e4m3_bits((_f32(amax) * VLLM_NVFP4_RCP6).astype(np.float32))


def vllm_nvfp4_ds_mla_record(ckv, kpe) -> np.ndarray:
    """local-inference-lab/vllm --kv-cache-dtype nvfp4_ds_mla (PR 82), 432 B per token:
    csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu concat_and_cache_nvfp4_mla_kernel (42d67f76):
      `kNopeBytes = 256; kScaleBytes = 32; kPadBytes = 16; kRopeOffset = kNopeBytes + kScaleBytes + kPadBytes`
      per group g of 16 kv_c dims: `cvt_warp_fp16_to_fp4<CudaType, kThreadsPerScale>(in_vec, 1.0f, scale_out)`
      (global scale 1.0: the op's `scale` argument is unused), codes at `token_dst + group * 8` as
      `(uint64_t(packed.hi) << 32) | uint64_t(packed.lo)` (little-endian: element 2j in the low nibble of byte j,
      from `cvt.rn.satfinite.e2m1x2.f32 b0, %3, %2` = (x[1], x[0])), the scale byte at `token_dst[kNopeBytes +
      group]`, 16 zero bytes, then the 64 k_pe values copied raw (bf16) at byte 304.
    Element rule (nvfp4_utils.cuh cvt_warp_fp16_to_fp4 at 28be48fa): s = vllm_nvfp4_ds_mla_scale_bits(amax);
      `outputScale = SFValue != 0.0f ? reciprocal_approximate_ftz(SFValue * reciprocal_approximate_ftz(SFScaleVal))
      : 0.0f`, `fp2Vals[i].x *= outputScale`, then cvt.rn.satfinite.e2m1x2.f32 (RNE, saturating to +-6).
    The kernel's reciprocals are rcp.approx.ftz.f32; this reference, like vLLM's ref_nvfp4_quant
    (`get_reciprocal(x) = 1.0 / x`), takes the IEEE reciprocal of the e4m3 value."""
    ckv, kpe = _f32(ckv), _f32(kpe)
    assert ckv.shape[1] == 512 and kpe.shape[1] == 64 and ckv.shape[0] == kpe.shape[0]
    T = ckv.shape[0]
    sb = vllm_nvfp4_ds_mla_scale_bits(_tile_amax(ckv, 16))
    s = e4m3_value(sb).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(s == 0, np.float32(0), (np.float32(1) / s).astype(np.float32)).astype(np.float32)
    codes = pack_nibbles_even_low(e2m1_bits((ckv * _expand(inv, 16, 512)).astype(np.float32)))
    pad = np.zeros((T, 16), np.uint8)
    return np.concatenate([codes, sb.reshape(T, 32), pad, _le_bytes(bf16_bits(kpe), "<u2")], axis=1)


def vllm_turboquant_k8v4_record(ckv, kpe) -> np.ndarray:
    """vLLM --kv-cache-dtype turboquant_k8v4 on MLA (vllm/v1/attention/backends/mla/triton_mla_tq.py, b40f4cc9,
    PR 41803; _tq_mla_fused_store_fp8_kernel): 640 B at 512 + 64: [0, 512) e4m3 of `kv_c * (1/k_scale)` clamped
    to +-448 (k_scale 1.0 uncalibrated), then 64 bf16 k_pe (raw bits, little-endian)."""
    ckv, kpe = _f32(ckv), _f32(kpe)
    assert ckv.shape[0] == kpe.shape[0]
    return np.concatenate([e4m3_bits(ckv), _le_bytes(bf16_bits(kpe), "<u2")], axis=1)


RECORDS = {
    # preset: (reference, c_kv width, k_pe width, c_kv spec, k_pe spec, record bytes)
    "flashmla-v32-fp8": (flashmla_v32_record, 512, 64, "fp8-e4m3-tile128-pow2", "bf16", 656),
    "vllm-fp8-ds-mla": (vllm_fp8_ds_mla_record, 512, 64, "fp8-e4m3-tile128-fp32", "bf16", 656),
    "flashmla-model1-fp8": (flashmla_model1_record, 448, 64, "fp8-e4m3-tile64-pow2-ue8m0", "bf16", 584),
    "flashmla-v41-fp8": (
        flashmla_v41_fp8_record,
        448,
        64,
        "fp8-e4m3-tile32-pow2-ue8m0",
        "fp8-e4m3-tile32-pow2-ue8m0",
        528,
    ),
    "flashmla-v41-fp4": (flashmla_v41_fp4_record, 448, 64, "fp4-e2m1-tile16-e4m3", "fp4-e2m1-tile16-e4m3", 288),
    "flashinfer-nvfp4-mla": (flashinfer_nvfp4_mla_record, 448, 64, "fp4-e2m1-tile16-e4m3-rcp", "bf16", 384),
    "vllm-turboquant-k8v4": (vllm_turboquant_k8v4_record, 512, 64, "fp8-e4m3-tensor-s1", "bf16", 640),
    "vllm-nvfp4-ds-mla": (vllm_nvfp4_ds_mla_record, 512, 64, "fp4-e2m1-tile16-e4m3-rcp", "bf16", 432),
}
# records whose engine reads c_kv as bf16/fp16 only and whose rule differs from latentq's on some float32 rows
# (vllm_nvfp4_ds_mla_scale_bits): compared on bf16 rows
HALF_INPUT_RECORDS = {"vllm-nvfp4-ds-mla"}

# DeepSeek-V4's entry records and their formats (engine_refs_v4 imports the helpers above)
from engine_refs_v4 import (  # noqa: E402
    V4_HALF_INPUT_RECORDS,
    V4_RECORD_EXACT_ROWS,
    V4_RECORDS,
    b12x_dsv4_nvfp4_record,  # noqa: F401  (named by kPresets' reference)
    sglang_dsv4_int4_record,  # noqa: F401
    sglang_dsv4_mxfp4_record,  # noqa: F401
    sglang_int4_e4m3,
    sglang_int4_e4m3_decode,
    sglang_mxfp4_rn,
    trtllm_dsv4_nvfp4_cold_record,  # noqa: F401
)

RECORDS.update(V4_RECORDS)
HALF_INPUT_RECORDS |= V4_HALF_INPUT_RECORDS
# records whose bytes latentq gives on a subset of rows only: preset -> (ckv, kpe) -> bool [T]
RECORD_EXACT_ROWS = dict(V4_RECORD_EXACT_ROWS)
