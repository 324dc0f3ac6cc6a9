"""Independent Python references for the engines' DSA indexer key caches of sparse MLA (DeepSeek-V3.2, GLM-5):
latentq's kIndexerPresets (quant/include/latentq/spec.h) checked byte for byte against them in
test_engine_formats.py. The element conventions are engine_refs.py's; every formula names its public source
(repository, file, function, commit) and quotes the line it follows."""

from __future__ import annotations

import numpy as np

from engine_refs import (
    E4M3_MAX,
    VLLM_INDEXER_AMAX_FLOOR,
    _expand,
    _f32,
    _tile_amax,
    e4m3_bits,
    e8m0_value,
    fp8_tile_pow2_amax_floor,
    sglang_mxfp4,
)

# ---------------------------------------------------------------------------------------------------
# The DSA indexer key cache (spec.h kIndexerPresets)
# ---------------------------------------------------------------------------------------------------


def vllm_indexer_k_quant(k, ue8m0: bool = True):
    """vLLM csrc/cache_kernels.cu indexer_k_quant_and_cache_kernel (as carried by local-inference-lab/vllm at
    28be48fa), per token and block of quant_block_size = 128 dims (deepseek_v2.py Indexer: `self.scale_fmt =
    "ue8m0"`, `self.quant_block_size = 128`):
      `float scale = fmaxf(amax, 1e-4) / kFp8ScaleDivisor;`      (kFp8ScaleDivisor = 448.f on CUDA)
      `if (use_ue8m0) { scale = exp2f(ceilf(log2f(scale))); }`
      `kv_cache[dst_offset + i] = fp8::scaled_convert<cache_t, scalar_t, kv_dt>(k_val_ptr[i], scale);`
    i.e. e4m3(x / s), RNE, saturating. ceil(log2(v)) is taken in exact math on the float32 v (as
    flashmla_pow2_exponent). Returns (codes uint8 [T, D], scales float32 [T, D / 128])."""
    k = _f32(k)
    T, D = k.shape
    assert D % 128 == 0, "the indexer kernel needs head_dim % quant_block_size == 0"
    if ue8m0:  # engine_refs.fp8_tile_pow2_amax_floor: the same lines at any tile width
        q = fp8_tile_pow2_amax_floor(k, 128)
        return q.codes, q.scales.reshape(T, -1)
    with np.errstate(over="ignore", invalid="ignore"):
        v = (np.maximum(_tile_amax(k, 128), VLLM_INDEXER_AMAX_FLOOR) / E4M3_MAX).astype(np.float32)
    codes = e4m3_bits((k / _expand(v, 128, D)).astype(np.float32))
    return codes, v


def _indexer_pages(codes: np.ndarray, scale_bytes: np.ndarray, block_size: int) -> np.ndarray:
    """uint8 [num_pages, block_size * bytes per token], as both indexer caches page: the code bytes of the page's
    tokens (token-major), then their scale bytes (token-major). Slots past T stay zero."""
    pages = -(-codes.shape[0] // block_size)
    pad = [np.pad(a, ((0, pages * block_size - len(a)), (0, 0))).reshape(pages, -1) for a in (codes, scale_bytes)]
    return np.concatenate(pad, axis=1)


def vllm_indexer_k_cache(k, block_size: int) -> np.ndarray:
    """The pages of vLLM's DeepseekV32IndexerCache (uint8 [num_pages, block_size * 132] at D = 128) holding the
    keys of tokens 0..T-1 in slots 0..T-1: per page, `dst_offset = block_idx * cache_block_size * cache_stride +
    block_offset * head_dim + head_dim_idx` (the codes of its block_size tokens, token-major), then the fp32
    scales at `cache_block_size * head_dim + (block_offset * head_dim + head_dim_idx) * 4 / quant_block_size`
    bytes. Slots past T stay zero."""
    codes, scales = vllm_indexer_k_quant(k)
    return _indexer_pages(codes, scales.astype("<f4").view(np.uint8), block_size)


def indexer_pow2_same(amax) -> np.ndarray:
    """Where fp8-e4m3-tile128-pow2 (FlashMLA: 2^ceil(log2(max(fl(amax/448), 1e-4)))) and vLLM's indexer rule
    (2^ceil(log2(fl(max(amax, 1e-4)/448)))) give the same scale: fl32(amax/448) > 2^-14, i.e. amax above 7/256
    (both are then 2^ceil(log2(fl(amax/448))), and 1e-4 lies in (2^-14, 2^-13]). Below it the format's scale is
    2^-13 and vLLM's 2^-14 or less."""
    with np.errstate(over="ignore", invalid="ignore"):
        return (_f32(amax) / E4M3_MAX).astype(np.float32) > np.float32(2.0**-14)


# SGLang's MXFP4 index-K cache: sgl-project/sglang python/sglang/srt/layers/attention/dsv4/fp4_indexer.py at 301bcf08
# (PR 26209, DeepSeek-V4), which the DSA (V3.2 / GLM-5) port --enable-dsa-fp4-indexer (PR 30546, closed) reuses as is.


def sglang_mxfp4_index_k_quant(k):
    """sglang_mxfp4 of [T, 128] index keys (BLOCK_N = 128) as the cache stores them: (codes uint8 [T, 64], scale
    bytes uint8 [T, 4], group 0 first as `packed_sf = exp0 | (exp1 << 8) | (exp2 << 16) | (exp3 << 24)` stores
    them)."""
    assert np.shape(k)[1:] == (128,), f"SGLang's FP4 indexer needs [T, 128] keys, got {np.shape(k)}"
    q = sglang_mxfp4(k)
    return q.codes, q.scales.reshape(-1, 4)


def sglang_mxfp4_index_k_cache(k, page_size: int) -> np.ndarray:
    """SGLang store_fp4_index_k_cache (_store_fp4_index_k_cache_kernel, BLOCK = 64) of tokens 0..T-1 at slots
    0..T-1: a page holds `page_size * (64 + 4)` bytes, slot s's codes at `page_offset * BLOCK`, its four scale
    bytes at `page_size * BLOCK + page_offset * 4`. uint8 [num_pages, page_size * 68]; slots past T stay zero."""
    return _indexer_pages(*sglang_mxfp4_index_k_quant(k), page_size)


def sglang_mxfp4_same(k) -> np.ndarray:
    """Groups [T, 4] on which mxfp4 (OCP floor scale 2^(floor(log2 amax) - 2), RNE) stores SGLang's bytes: the two
    exponents agree (amax >= 2^-11, significand <= 1.5) and no x / scale is +-0.75, 1.75, 3.5 (ties: SGLang rounds
    down, RNE to even) or a negative at most 0.25 (SGLang stores +0, the format -0: code 8)."""
    _, e = sglang_mxfp4_index_k_quant(k)
    g = _f32(k).reshape(-1, 4, 32)
    floor_byte = np.clip((np.abs(g).max(axis=2).view(np.uint32) >> np.uint32(23)).astype(np.int64) - 129, -127, 127)
    v = np.abs(g) / e8m0_value(e)[..., None]
    off = np.isin(v, np.float32([0.75, 1.75, 3.5])) | (np.signbit(g) & (v <= np.float32(0.25)))
    return (e == floor_byte + 127) & ~off.any(axis=2)


INDEXER = {
    # kIndexerPresets row: (reference, spec, width, bytes per token, the keys [T, width] -> bool [T, scale blocks]:
    # the blocks on which spec gives the engine's bytes, the row's exact_when)
    "vllm-dsa-indexer-fp8": (
        vllm_indexer_k_cache,
        "fp8-e4m3-tile128-pow2-amaxfloor",
        128,
        132,
        lambda k: np.ones((len(k), 1), dtype=bool),
    ),
    "sglang-dsa-indexer-mxfp4": (
        sglang_mxfp4_index_k_cache,
        "mxfp4-ceil",
        128,
        68,
        lambda k: np.ones((len(k), 4), dtype=bool),
    ),
}
