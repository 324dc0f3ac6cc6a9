"""Production MLA cache formats: (1) engine_refs.py against the independent packages (ml_dtypes, gguf,
torchao, torch; all pinned in requirements.txt); (2) the C++ module `latentq` against engine_refs.py, byte
for byte, for every row of the format table (latentq.formats()) whose reference is engine_refs: each spec
through engine_refs.quantize, each preset through its record in engine_refs.RECORDS; (3) the table complete:
every row names a reference that exists (an engine_refs function, a test of test_turboquant_vllm, or
hand-computed tests for latentq's own families), so a row without one fails here."""

import re
from pathlib import Path

import gguf.quants as gq
import ml_dtypes
import numpy as np
import pytest
import torch
import torchao.prototype.mx_formats.kernels as mx_kernels
import torchao.prototype.mx_formats.mx_tensor as mxt
import torchao.prototype.mx_formats.nvfp4_tensor as nv
from gguf import GGMLQuantizationType as G
from torchao.prototype.mx_formats.config import ScaleCalculationMode

import engine_refs as R
import engine_refs_indexer as RI
import latentq
import latentq._core  # noqa: F401  (the compiled module: its absence is an error, not a skip)

# ---------------------------------------------------------------------------------------------------
# The format table: what this file checks comes from it, not from lists of its own
# ---------------------------------------------------------------------------------------------------

TABLE = latentq.formats()
OWN_FAMILIES = {"int", "lloyd-max", "transform-coding"}  # latentq's own formats: no engine's code to match


def _ref_name(reference: str) -> str:
    """'engine_refs.fp8_tile_pow2 / ... (..)' -> 'engine_refs.fp8_tile_pow2'."""
    return reference.split()[0]


# the non-preset formats engine_refs.quantize reproduces (bf16: its element conversion only, checked below)
SPECS = [
    n
    for n, f, r in zip(TABLE.name, TABLE.family, TABLE.reference)
    if f not in ("preset", "bf16") and r.startswith("engine_refs.")
]
# the presets whose record engine_refs writes out
PRESETS = [
    n for n, f, r in zip(TABLE.name, TABLE.family, TABLE.reference) if f == "preset" and r.startswith("engine_refs.")
]


def test_every_row_of_the_table_has_an_independent_reference():
    import test_turboquant_vllm as tq

    missing = []
    for name, family, engine, ref in zip(TABLE.name, TABLE.family, TABLE.engine, TABLE.reference):
        mod, _, fn = _ref_name(ref).partition(".")
        if ref.startswith("hand-computed:"):
            ok = family in OWN_FAMILIES and engine == ""  # an engine's format needs the engine's code
        elif mod == "engine_refs":
            ok = hasattr(R, fn) and (name in R.RECORDS if family == "preset" else True)
        elif mod == "test_turboquant_vllm":
            ok = callable(getattr(tq, fn, None))
        else:
            ok = False
        if not ok:
            missing.append(f"{name} ({family}): {ref!r}")
    assert not missing, "rows without an independent reference:\n  " + "\n  ".join(missing)
    assert len(SPECS) >= 15 and len(PRESETS) >= 7, (SPECS, PRESETS)


def test_engine_refs_quantizes_every_spec_the_table_gives_it():
    x = random_matrix(4, 64, 0)
    for spec in SPECS:
        assert R.quantize(x, spec).codes.shape[0] == 4, spec


# ---------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------


def _e4m3_grid_midpoints():
    """Exact midpoints between adjacent positive e4m3 values (round-half-even ties), up to 448."""
    v = np.unique(R.e4m3_value(np.arange(0, 127, dtype=np.uint8)))
    return ((v[:-1].astype(np.float64) + v[1:]) / 2).astype(np.float32)


E4M3_TIES = _e4m3_grid_midpoints()  # all exact in float32
E2M1_TIES = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)


def adversarial_matrix(T: int, D: int, seed: int, bf16: bool = False, ggml: bool = False) -> np.ndarray:
    """T rows: the adversarial rows below, then random rows (normal x per-dim lognormal spread).
    Every 16-dim block (hence every 32/64/128 tile) of a 'pow2' row has its amax set exactly.
    Magnitudes stay below 3e4 (ggml's fp16 d and m cannot overflow). ggml=True leaves out the rows
    whose block amax is below ~1e-36: there ggml's id = 1/d overflows to inf and the C reference
    converts inf/NaN to int8 (undefined behaviour)."""
    rng = np.random.default_rng(seed)
    rows = []
    nb16 = -(-D // 16)

    def blockwise_amax(row, amax):
        for j in range(nb16):
            lo, hi = 16 * j, min(D, 16 * j + 16)
            row[lo] = amax if rng.random() < 0.5 else -amax
            row[lo + 1 : hi] = np.clip(row[lo + 1 : hi], -abs(amax), abs(amax))
        return row

    rows.append(np.zeros(D, np.float32))  # zero row
    r = rng.standard_normal(D).astype(np.float32)
    r[: min(D, 128)] = 0  # zero tiles
    r[D // 2 : D // 2 + 32] = 0
    rows.append(r)
    for k in range(-14, 7, 2):  # amax = 448 * 2^k exactly
        base = np.float32(448.0 * 2.0**k)
        rows.append(blockwise_amax((rng.uniform(-1, 1, D) * base).astype(np.float32), base))
        for j in (1, 2, 5):  # just above: the torch-log2 case
            a = np.float32(base * np.float32(1 + j * 2.0**-23))
            rows.append(blockwise_amax((rng.uniform(-1, 1, D) * base).astype(np.float32), a))
        rows.append(
            blockwise_amax((rng.uniform(-1, 1, D) * base).astype(np.float32), np.nextafter(base, np.float32(0)))
        )  # just below
        # e4m3 ties relative to s = 2^k (FlashMLA pow2 and MX e4m3 both give s = 2^k here)
        t = rng.choice(E4M3_TIES, D) * np.float32(2.0**k) * rng.choice([-1, 1], D)
        rows.append(blockwise_amax(t.astype(np.float32), base))
    for k in (-6, 0, 3):  # e2m1 ties: amax = 6 * 2^k
        base = np.float32(6.0 * 2.0**k)
        t = rng.choice(E2M1_TIES, D) * np.float32(2.0**k) * rng.choice([-1, 1], D)
        rows.append(blockwise_amax(t.astype(np.float32), base))
    # ggml ties: q8_0 block amax 127 -> d = 1: x = n + 0.5; q4_0 max -8 -> d = 1; q4_1 [0, 15] -> d = 1
    rows.append(blockwise_amax((rng.integers(-126, 126, D) + 0.5).astype(np.float32), np.float32(127)))
    rows.append(blockwise_amax((rng.integers(-8, 7, D) + 0.5).astype(np.float32), np.float32(-8)))
    t = (rng.integers(0, 14, D) + 0.5).astype(np.float32)
    t[0::16], t[1::16] = 0, 15
    rows.append(t)
    r = rng.standard_normal(D).astype(np.float32)  # +m and -m both at max
    r[0::16], r[5::16] = 3.0, -3.0
    rows.append(r)
    if not ggml:
        rows.append((rng.standard_normal(D) * 1e-41).astype(np.float32))  # float32 subnormals only
        rows.append((rng.standard_normal(D) * 2e-38).astype(np.float32))  # amax ~ 2^-125: MX byte 0
    r = rng.standard_normal(D).astype(np.float32) * np.float32(1e-3)
    r[1::3] = (rng.standard_normal(len(r[1::3])) * 1e-40).astype(np.float32)  # subnormals among normals
    rows.append(r)
    r = rng.standard_normal(D).astype(np.float32)  # e4m3-subnormal codes, -0
    r[2::4] = np.float32(-(2.0**-12))
    r[3::4] = np.float32(2.0**-10)  # tie between 0 and 2^-9
    rows.append(blockwise_amax(r, np.float32(448)))
    rows.append((rng.standard_normal(D) * 1e-30).astype(np.float32))  # tiny row
    rows.append((rng.standard_normal(D) * 3e3).astype(np.float32))  # large (fp16-safe for ggml)
    r = rng.standard_normal(D).astype(np.float32)
    r[rng.integers(0, D)] = 2.5e4  # one outlier
    rows.append(r)
    rows.append(np.full(D, 0.7, np.float32))  # constant row
    rows.append(np.full(D, -1e-3, np.float32))
    adv = np.stack(rows)[:T]
    n = T - adv.shape[0]
    spread = np.exp(rng.normal(0, 1.0, D)).astype(np.float32)
    rnd = (rng.standard_normal((n, D)) * spread).astype(np.float32)
    x = np.concatenate([adv, rnd]).astype(np.float32)
    if bf16:
        x = ((R.bf16_bits(x).astype(np.uint32)) << np.uint32(16)).view(np.float32)
    return np.ascontiguousarray(x)


def random_matrix(T, D, seed):
    rng = np.random.default_rng(1000 + seed)
    spread = np.exp(rng.normal(0, 1.0, D)).astype(np.float32)
    return np.ascontiguousarray((rng.standard_normal((T, D)) * spread).astype(np.float32))


def _float32_stress(n=1_000_000, seed=0):
    """n float32 values: random bit patterns over the e4m3/e2m1-relevant exponents, exact ties of both
    grids at many binades, float32 subnormals, the saturation region, +-0."""
    rng = np.random.default_rng(seed)
    parts = []
    e = rng.integers(127 - 24, 127 + 12, n // 2).astype(np.uint32)  # 2^-24 .. 2^11
    m = rng.integers(0, 1 << 23, n // 2).astype(np.uint32)
    s = rng.integers(0, 2, n // 2).astype(np.uint32) << np.uint32(31)
    parts.append((s | (e << np.uint32(23)) | m).view(np.float32))
    k = rng.integers(-12, 4, n // 8)
    parts.append((rng.choice(E4M3_TIES, n // 8) * np.ldexp(1.0, k)).astype(np.float32) * rng.choice([-1, 1], n // 8))
    parts.append((rng.choice(E2M1_TIES, n // 16) * np.ldexp(1.0, rng.integers(-3, 3, n // 16))).astype(np.float32))
    parts.append(rng.integers(1, 1 << 23, n // 16).astype(np.uint32).view(np.float32))  # subnormals
    parts.append(rng.uniform(440, 520, n // 16).astype(np.float32) * rng.choice([-1, 1], n // 16).astype(np.float32))
    parts.append(rng.uniform(5, 7, n // 16).astype(np.float32))
    x = np.concatenate(parts).astype(np.float32)
    x = np.concatenate([x, np.array([0.0, -0.0, 448, 464, 480, 1e30, 6, 7, 2.0**-10, -(2.0**-10)], np.float32)])
    return x[:n] if x.size > n else x


def _all_fp16_as_f32():
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    return h[~np.isnan(h)]


# ---------------------------------------------------------------------------------------------------
# Part 1: references vs independent packages
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["fp16_patterns", "stress"])
def test_e4m3_matches_ml_dtypes(source):
    x = _all_fp16_as_f32() if source == "fp16_patterns" else _float32_stress()
    x = x[np.isfinite(x)]
    ours = R.e4m3_bits(x, saturate=False)
    ref = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(ours, ref)
    ours_sat = R.e4m3_bits(x)
    ref_sat = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(ours_sat, ref_sat)
    # decode: every byte
    b = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(R.e4m3_value(b), b.view(ml_dtypes.float8_e4m3fn).astype(np.float32))


def test_e4m3_saturating_matches_torch_cast():
    """FlashMLA's `.to(torch.float8_e4m3fn)` (torch 2.13 eager: RNE, saturating)."""
    x = _float32_stress(200_000, seed=3)
    t = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(R.e4m3_bits(x), t)


@pytest.mark.parametrize("source", ["fp16_patterns", "stress"])
def test_e2m1_matches_ml_dtypes(source):
    x = _all_fp16_as_f32() if source == "fp16_patterns" else _float32_stress(seed=1)
    x = x[np.isfinite(x)]
    np.testing.assert_array_equal(R.e2m1_bits(x), x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8))
    c = np.arange(16, dtype=np.uint8)
    np.testing.assert_array_equal(R.e2m1_value(c), c.view(ml_dtypes.float4_e2m1fn).astype(np.float32))


def test_e2m1_matches_torchao():
    x = _float32_stress(300_000, seed=2)
    ref = mx_kernels.f32_to_f4_unpacked(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(R.e2m1_bits(x), ref)


def test_e8m0_matches_ml_dtypes():
    b = np.arange(255, dtype=np.uint8)
    np.testing.assert_array_equal(R.e8m0_value(b), b.view(ml_dtypes.float8_e8m0fnu).astype(np.float32))
    k = np.arange(-127, 128)
    p = np.ldexp(np.float32(1), k).astype(np.float32)
    np.testing.assert_array_equal(R.pow2_exponent_to_e8m0(k), p.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8))


def test_bf16_matches_ml_dtypes():
    x = np.concatenate([_float32_stress(seed=4), _all_fp16_as_f32()])
    np.testing.assert_array_equal(R.bf16_bits(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_roundf_is_c_roundf():
    x = _float32_stress(seed=5)
    x = x[np.abs(x) < 1e6]
    ref = np.array([np.float32(np.copysign(np.floor(abs(float(v)) + 0.5), v)) for v in x[:20000]], np.float32)
    np.testing.assert_array_equal(R.roundf(x[:20000]), ref)  # float64 floor(a+0.5) is exact here
    assert R.roundf(np.float32(0.49999997)) == 0 and R.roundf(np.float32(2.5)) == 3 and R.roundf(np.float32(-2.5)) == -3


@pytest.mark.parametrize("spec", ["q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("seed", [0, 1])
def test_ggml_formats_match_gguf(spec, seed):
    qt = {"q8_0": G.Q8_0, "q4_0": G.Q4_0, "q4_1": G.Q4_1}[spec]
    for D in (576, 160):
        for x in (adversarial_matrix(1000, D, seed, ggml=True), adversarial_matrix(300, D, seed, bf16=True, ggml=True)):
            ours = R.ggml_rows(R.quantize(x, spec))
            ref = gq.quantize(x, qt)
            np.testing.assert_array_equal(ours, ref, err_msg=f"{spec} D={D}")
            # and gguf's own decode of our bytes equals ours
            np.testing.assert_array_equal(gq.dequantize(ours, qt).reshape(x.shape), R.dequantize(R.quantize(x, spec)))


@pytest.mark.parametrize("elem", ["e4m3", "e2m1"])
@pytest.mark.parametrize("seed", [0, 1])
def test_mx_matches_torchao(elem, seed):
    dt = torch.float8_e4m3fn if elem == "e4m3" else torch.float4_e2m1fn_x2
    for D in (576, 160):
        x = adversarial_matrix(1000, D, seed)
        scale, data = mxt.to_mx(torch.from_numpy(x), dt, 32, ScaleCalculationMode.FLOOR)
        scale = scale.view(torch.uint8).numpy().reshape(-1)
        data = data.view(torch.uint8).numpy()
        q = R.mx(x, elem, torchao_min_scale=True)
        np.testing.assert_array_equal(q.scales, scale)
        np.testing.assert_array_equal(q.codes, data)
        # the OCP default differs from torchao only inside blocks whose scale byte is 0
        q2 = R.mx(x, elem)
        np.testing.assert_array_equal(q2.scales, scale)
        byte0 = np.repeat(scale.reshape(x.shape[0], -1) == 0, 32 if elem == "e4m3" else 16, axis=1)
        np.testing.assert_array_equal(q2.codes[~byte0], data[~byte0])
        assert (q2.codes[byte0] != data[byte0]).any()  # the subnormal row exercises it


@pytest.mark.parametrize("seed", [0, 1])
def test_nvfp4_matches_torchao(seed):
    for D in (576, 160):
        for x in (adversarial_matrix(1000, D, seed), random_matrix(1000, D, seed)):
            t = torch.from_numpy(x)
            g = nv.per_tensor_amax_to_scale(torch.max(torch.abs(t)))
            scales, data = nv.nvfp4_quantize(t, 16, g)
            q = R.nvfp4(x)
            assert q.global_scale[0] == g.item()
            np.testing.assert_array_equal(q.scales, scales.view(torch.uint8).numpy().reshape(-1))
            np.testing.assert_array_equal(q.codes, data.numpy())
            # torchao's decode of the same arrays
            nvt = nv.NVFP4Tensor(data, scales.view(torch.float8_e4m3fn), 16, torch.float32, g)
            np.testing.assert_array_equal(R.dequantize(q), nvt.dequantize(torch.float32).numpy())


def _flashmla_expr_torch(x, tile):
    """The FlashMLA tests/quant.py per-tile expression, evaluated with torch (bf16-exact input)."""
    t = torch.from_numpy(x)
    T, D = x.shape
    codes, scales = [], []
    for j in range(0, D, tile):
        part = t[:, j : j + tile]
        s = torch.pow(2, torch.clamp_min(part.abs().max(dim=-1).values.float() / 448.0, 1e-4).log2().ceil()).to(
            torch.float32
        )
        codes.append((part.float() / s.unsqueeze(-1)).to(torch.float8_e4m3fn).view(torch.uint8).numpy())
        scales.append(s.numpy())
    return np.concatenate(codes, axis=1), np.stack(scales, axis=1)


@pytest.mark.parametrize("tile", [128, 64, 32])
def test_flashmla_pow2_matches_torch_expression(tile):
    """Our exact-math reference == FlashMLA's torch float32 expression, except where float32 torch.log2
    rounds log2(v) down to an integer for v just above a power of two (excluded and counted)."""
    for x in (adversarial_matrix(1000, 576, 0, bf16=True), random_matrix(1000, 576, 0)):
        codes, s = _flashmla_expr_torch(x, tile)
        q = R.fp8_tile_pow2(x, tile)
        v = np.maximum((R._tile_amax(x, tile) / np.float32(448)).astype(np.float32), np.float32(1e-4))
        mant = v.view(np.uint32) & 0x7FFFFF
        edge = (mant >= 1) & (mant <= 8)  # within 8 ulps above 2^k
        ok = ~edge
        np.testing.assert_array_equal(q.scales.reshape(s.shape)[ok], s[ok])
        rows_ok = np.repeat(ok, tile, axis=1)[:, :576]
        np.testing.assert_array_equal(q.codes[rows_ok], codes[rows_ok])


def test_flashmla_torch_log2_edge_documented():
    """Where CPU torch's float32 log2 differs from exact ceil(log2): only v = 2^k (1 + j 2^-23), small j.
    Example from the report: amax = nextafter(7168, inf) -> v = 16.000002 -> exact 32, torch (CPU) 16."""
    bits = np.arange(np.float32(1e-4).view(np.uint32), np.float32(2.0**20).view(np.uint32), 97, dtype=np.uint32)
    v = bits.view(np.float32)
    edge_bits = []
    for k in range(-13, 20):
        p = np.float32(2.0**k).view(np.uint32)
        edge_bits.append(np.arange(p, p + 9, dtype=np.uint32))
    v = np.concatenate([v, np.concatenate(edge_bits).view(np.float32)])
    amax = (v.astype(np.float64) * 448).astype(np.float32)
    exact = np.ldexp(np.float32(1), R.flashmla_pow2_exponent(amax)).astype(np.float32)
    torch_s = R.flashmla_torch_pow2_scale(amax)
    vv = np.maximum((amax / np.float32(448)).astype(np.float32), np.float32(1e-4))
    diff = exact != torch_s
    assert np.all((vv.view(np.uint32)[diff] & 0x7FFFFF) <= 8), "torch differs from exact math away from 2^k"
    assert np.all(torch_s[diff] * 2 == exact[diff])


def test_flashmla_v41_fp4_scale_rule():
    """V4.1 FP4: clamp(amax/6, 2^-9, 448) -> e4m3; codes = e2m1(x / scale) -- checked with torch ops."""
    x = adversarial_matrix(500, 512, 3, bf16=True)
    t = torch.from_numpy(x).view(500, 32, 16)
    sc = torch.clamp(t.abs().amax(dim=-1) / 6.0, 2.0**-9, 448.0).to(torch.float8_e4m3fn)
    y = (t / sc.float().unsqueeze(-1)).reshape(500, 512).numpy()
    q = R.fp4_tile16_e4m3_flashmla(x)
    np.testing.assert_array_equal(q.scales, sc.view(torch.uint8).numpy().reshape(-1))
    np.testing.assert_array_equal(q.codes, R.pack_nibbles_even_low(y.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)))


def test_record_layouts():
    """Record byte positions decoded back with ml_dtypes views (independent of the packing code)."""
    x = adversarial_matrix(200, 576, 2, bf16=True)
    ckv, kpe = x[:, :512], x[:, 512:]
    for fn, q in (
        (R.flashmla_v32_record, R.fp8_tile_pow2(ckv, 128)),
        (R.vllm_fp8_ds_mla_record, R.fp8_tile_fp32(ckv, 128)),
    ):
        rec = fn(ckv, kpe)
        assert rec.shape == (200, 656) and rec.dtype == np.uint8
        np.testing.assert_array_equal(rec[:, :512], q.codes)
        np.testing.assert_array_equal(rec[:, 512:528].copy().view("<f4").reshape(-1), q.scales)
        np.testing.assert_array_equal(rec[:, 528:].copy().view(ml_dtypes.bfloat16).astype(np.float32), kpe)
    ckv, kpe = x[:, :448], x[:, 448:512]
    rec = R.flashmla_model1_record(ckv, kpe)
    assert rec.shape == (200, 584) and not rec[:, 583].any()
    y = rec[:, :448].view(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.repeat(
        rec[:, 576:583].view(ml_dtypes.float8_e8m0fnu).astype(np.float32), 64, axis=1
    )
    np.testing.assert_array_equal(y, R.dequantize(R.fp8_tile_pow2(ckv, 64, ue8m0=True)))
    np.testing.assert_array_equal(rec[:, 448:576].copy().view(ml_dtypes.bfloat16).astype(np.float32), kpe)
    blk = R.flashmla_model1_block(rec[:130], 64)
    assert blk.shape == (3, 65 * 576) and np.array_equal(blk[0, :576], rec[0, :576])
    assert np.array_equal(blk[0, 64 * 576 : 64 * 576 + 8], rec[0, 576:])
    rec = R.flashmla_v41_fp8_record(ckv, kpe)
    assert rec.shape == (200, 528)
    y = rec[:, :512].view(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.repeat(
        rec[:, 512:].view(ml_dtypes.float8_e8m0fnu).astype(np.float32), 32, axis=1
    )
    np.testing.assert_array_equal(y, R.dequantize(R.fp8_tile_pow2(x[:, :512], 32, ue8m0=True)))
    assert R.flashmla_v41_fp4_record(ckv, kpe).shape == (200, 288)


def test_reference_accounting_at_deepseek_dims():
    for spec, want in [("q8_0", 612), ("q4_0", 324), ("q4_1", 360), ("mxfp8", 594), ("mxfp4", 306)]:
        assert R.bytes_per_token(spec, 512) + R.bytes_per_token(spec, 64) == want
        assert (
            R.quantize(random_matrix(4, 512, 0), spec).bytes_per_token
            + R.quantize(random_matrix(4, 64, 0), spec).bytes_per_token
            == want
        )
    assert R.bytes_per_token("fp8-e4m3-tile128-pow2", 512) + 2 * 64 == 656
    assert R.bytes_per_token("fp8-e4m3-tile128-fp32", 512) + 2 * 64 == 656
    assert R.bytes_per_token("fp8-e4m3-tile64-pow2-ue8m0", 448) + 2 * 64 + 1 == 584
    assert (
        R.bytes_per_token("fp8-e4m3-tile32-pow2-ue8m0", 448) + R.bytes_per_token("fp8-e4m3-tile32-pow2-ue8m0", 64)
        == 528
    )


# ---------------------------------------------------------------------------------------------------
# Part 2: the C++ module against the references
# ---------------------------------------------------------------------------------------------------


def _need_spec(spec):
    """Fail (naming `spec`) unless the C++ side parses it: every spec of the table is a claim."""
    try:
        latentq.quantize(np.ones((2, 64), np.float32), spec, "c_kv")
    except ValueError as e:
        pytest.fail(f"latentq does not parse the spec {spec!r}: {str(e).splitlines()[0]}")


def _need_pack_record():
    assert hasattr(latentq, "pack_record"), "latentq has no pack_record (the records of engine_refs.RECORDS)"


def _assert_same(q, ref, what):
    codes = np.asarray(q.codes)
    assert codes.shape == ref.codes.shape, f"{what}: codes shape {codes.shape} != {ref.codes.shape}"
    np.testing.assert_array_equal(codes.view(np.uint8), ref.codes, err_msg=f"{what}: codes")
    sc = np.asarray(q.scales)
    assert sc.dtype == ref.scales.dtype, f"{what}: scales dtype {sc.dtype} != {ref.scales.dtype}"
    assert sc.shape == ref.scales.shape, f"{what}: scales shape {sc.shape} != {ref.scales.shape}"
    np.testing.assert_array_equal(sc.view(np.uint8), ref.scales.view(np.uint8), err_msg=f"{what}: scale bits")
    of = np.asarray(q.offsets)
    assert of.size == ref.offsets.size, f"{what}: offsets size {of.size} != {ref.offsets.size}"
    if ref.offsets.size:
        assert of.dtype == ref.offsets.dtype
        np.testing.assert_array_equal(of.view(np.uint8), ref.offsets.view(np.uint8), err_msg=f"{what}: offsets")
    g = np.asarray(q.global_scale, np.float32).reshape(-1)
    np.testing.assert_array_equal(g.view(np.uint32), ref.global_scale.view(np.uint32), err_msg=f"{what}: global_scale")


WIDTHS = [512, 64, 576, 128, 32, 160]  # 512 + 64 (DeepSeek), 128 + 32, and the concatenated rows


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cpp_quantize_matches_reference(spec, seed):
    _need_spec(spec)
    for D in WIDTHS:
        g = spec.startswith("q")
        for name, x in (
            ("adversarial", adversarial_matrix(1000, D, seed, ggml=g)),
            ("adversarial-bf16", adversarial_matrix(1000, D, seed, bf16=True, ggml=g)),
            ("random", random_matrix(1000, D, seed)),
        ):
            q = latentq.quantize(x, spec, "c_kv")
            _assert_same(q, R.quantize(x, spec), f"{spec} {name} T=1000 D={D} seed={seed}")


@pytest.mark.parametrize("spec", SPECS)
def test_cpp_dequantize_matches_reference(spec):
    """Decode order as the engines do it (see engine_refs.dequantize)."""
    _need_spec(spec)
    for D in (576, 160):
        x = adversarial_matrix(1000, D, 5, ggml=spec.startswith("q"))
        y = np.asarray(latentq.dequantize(latentq.quantize(x, spec, "c_kv")), np.float32)
        ref = R.dequantize(R.quantize(x, spec))
        np.testing.assert_array_equal(y.view(np.uint32), ref.view(np.uint32), err_msg=f"{spec} D={D}")


@pytest.mark.parametrize(
    "spec,want",
    [
        ("q8_0", 612),
        ("q4_0", 324),
        ("q4_1", 360),
        ("mxfp8", 594),
        ("mxfp4", 306),
        ("nvfp4", 324),
        ("fp8-e4m3-tensor", 576),
        ("fp8-e4m3-tensor-s1", 576),
    ],
)
def test_cpp_bytes_per_token_c_kv_plus_k_pe(spec, want):
    """c_kv [T, 512] and k_pe [T, 64] both in `spec`; per-tensor float32 scalars amortized over T."""
    _need_spec(spec)
    T = 1000
    a = latentq.quantize(random_matrix(T, 512, 0), spec, "c_kv")
    b = latentq.quantize(random_matrix(T, 64, 1), spec, "c_kv")
    extra = 8 / T if spec in ("nvfp4", "fp8-e4m3-tensor", "fp8-e4m3-tensor-s1") else 0
    assert a.bytes_per_token + b.bytes_per_token == pytest.approx(want + extra)
    assert a.bits_per_element == pytest.approx(8 * a.bytes_per_token / 512)


def _quant_pair(preset, ckv, kpe):
    _, _, _, s_ckv, s_kpe, _ = R.RECORDS[preset]
    _need_spec(s_ckv)
    if s_kpe != "bf16":
        _need_spec(s_kpe)
    q_ckv = latentq.quantize(ckv, s_ckv, "c_kv")
    q_kpe = latentq.quantize(kpe, s_kpe, "k_pe")
    if s_kpe != "bf16" and q_kpe.spec == "bf16":  # this spec keeps k_pe in bf16 for target k_pe
        q_kpe = latentq.quantize(kpe, s_kpe, "c_kv")
    return q_ckv, q_kpe


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cpp_pack_record_matches_reference(preset, seed):
    _need_pack_record()
    fn, dc, dr, _, _, nbytes = R.RECORDS[preset]
    for bf16 in (True,) if preset in R.HALF_INPUT_RECORDS else (True, False):
        x = adversarial_matrix(1000, dc + dr, seed, bf16=bf16)
        ckv, kpe = np.ascontiguousarray(x[:, :dc]), np.ascontiguousarray(x[:, dc:])
        q_ckv, q_kpe = _quant_pair(preset, ckv, kpe)
        rec = np.asarray(latentq.pack_record(q_ckv, q_kpe, preset))
        ref = fn(ckv, kpe)
        assert rec.dtype == np.uint8 and rec.shape == (1000, nbytes) == ref.shape
        rows = R.RECORD_EXACT_ROWS.get(preset, lambda c, k: np.ones(len(c), bool))(ckv, kpe)
        assert rows.mean() >= 0.5, f"{preset} seed={seed}: its exact rows are {rows.mean():.3f} of the input only"
        np.testing.assert_array_equal(rec[rows], ref[rows], err_msg=f"{preset} seed={seed} bf16_input={bf16}")


@pytest.mark.parametrize("preset", ["flashmla-model1-fp8", "flashmla-v41-fp8"])
def test_cpp_pack_record_rejects_deepseek_v3_dims(preset):
    """MODEL1 / V4.1 hold 448 nope + 64 rope dims: a 512-wide c_kv has no place in them."""
    _need_pack_record()
    _, _, _, s_ckv, s_kpe, _ = R.RECORDS[preset]
    _need_spec(s_ckv)
    q_ckv = latentq.quantize(random_matrix(10, 512, 0), s_ckv, "c_kv")
    q_kpe = latentq.quantize(random_matrix(10, 64, 0), s_kpe, "k_pe")
    with pytest.raises(ValueError):
        latentq.pack_record(q_ckv, q_kpe, preset)


# ---------------------------------------------------------------------------------------------------
# The vLLM fork's nvfp4_ds_mla record: its scale rule on the inputs its kernel takes
# ---------------------------------------------------------------------------------------------------


def test_vllm_nvfp4_scale_rule_is_the_division_rule_on_half_inputs():
    """cvt_warp_fp16_to_fp4 forms e4m3(amax * fl(1/6)); the -rcp format e4m3(amax / 6). The kernel reads bf16/fp16
    c_kv only: for every positive finite bf16 and fp16 amax the two scale bytes agree (which is why the preset
    stores c_kv as fp4-e2m1-tile16-e4m3-rcp); a float32 amax can split them (hence HALF_INPUT_RECORDS)."""
    bf16 = (np.arange(1, 0x7F80, dtype=np.uint32) << np.uint32(16)).view(np.float32)
    fp16 = np.arange(1, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)
    for amax in (bf16, fp16):
        div = R.e4m3_bits((amax / np.float32(6)).astype(np.float32))
        np.testing.assert_array_equal(R.vllm_nvfp4_ds_mla_scale_bits(amax), div)
    a = np.array([0.1113281175494194], np.float32)  # float32 only: amax/6 = 0.018554686, amax * fl(1/6) = 0.0185546875
    assert R.e4m3_bits((a / np.float32(6)).astype(np.float32))[0] == 9
    assert R.vllm_nvfp4_ds_mla_scale_bits(a)[0] == 10


@pytest.mark.parametrize("seed", [0, 1])
def test_vllm_nvfp4_ds_mla_record_is_the_rcp_format_bf16_rope_and_16_zero_bytes(seed):
    """The layout by the reference alone: [0, 256) the -rcp codes, [256, 288) its scale bytes, [288, 304) zero,
    [304, 432) bf16 k_pe, on bf16 rows (adversarial: ties, zero groups, saturation)."""
    x = adversarial_matrix(500, 576, seed, bf16=True)
    ckv, kpe = np.ascontiguousarray(x[:, :512]), np.ascontiguousarray(x[:, 512:])
    rec = R.vllm_nvfp4_ds_mla_record(ckv, kpe)
    q = R.fp4_tile16_e4m3_flashinfer(ckv)
    assert rec.shape == (500, 432)
    np.testing.assert_array_equal(rec[:, :256], q.codes)
    np.testing.assert_array_equal(rec[:, 256:288], q.scales.reshape(500, 32))
    assert not rec[:, 288:304].any()
    np.testing.assert_array_equal(rec[:, 304:].view("<u2"), R.bf16_bits(kpe))


# ---------------------------------------------------------------------------------------------------
# The DSA indexer key cache (spec.h kIndexerPresets; engine_refs.INDEXER)
# ---------------------------------------------------------------------------------------------------

_SPEC_CPP = Path(__file__).resolve().parents[2] / "quant" / "src" / "spec.cpp"


def _indexer_rows():
    """The rows of kIndexerPresets as spec.cpp writes them: (name, spec, width, stated bytes)."""
    text = _SPEC_CPP.read_text()
    block = text[text.index("kIndexerPresets[kIndexerPresetCount] = {") :]
    block = block[: block.index("\n};")]
    rows = re.findall(r'\{"([^"]+)", "([^"]+)", (\d+),.*?, (\d+), \{\d+, \d+, \d+, \d+\},', block, re.S)
    return [(n, s, int(w), int(b)) for n, s, w, b in rows]


def test_every_indexer_preset_has_an_engine_reference():
    rows = _indexer_rows()
    assert rows, "no kIndexerPresets rows found in spec.cpp"
    assert {r[0] for r in rows} == set(RI.INDEXER), (rows, list(RI.INDEXER))
    for name, spec, width, nbytes in rows:
        _, ref_spec, ref_width, ref_bytes, _ = RI.INDEXER[name]
        assert (spec, width, nbytes) == (ref_spec, ref_width, ref_bytes), name
        assert spec in list(TABLE.name), f"{name}: {spec} is not a format of the table"


def _indexer_keys(T, D, seed, lo):
    """bf16 keys (the indexer's k is bf16): normal rows times a per-token magnitude 10^U(lo, 1)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, D)) * 10.0 ** rng.uniform(lo, 1.0, (T, 1))
    return ((R.bf16_bits(x.astype(np.float32)).astype(np.uint32)) << np.uint32(16)).view(np.float32)


def _latentq_token_bytes(q, T):
    """latentq's stored bytes per token: (codes uint8 [T, code bytes], scales uint8 [T, scale bytes], little-endian
    for fp32 scales)."""
    sc = np.asarray(q.scales)
    sc = sc.astype("<f4").view(np.uint8) if sc.dtype.kind == "f" else sc.astype(np.uint8)
    return np.asarray(q.codes).view(np.uint8).reshape(T, -1), sc.reshape(T, -1)


def _paged(codes, scales, block_size):
    """Pages of block_size tokens as the indexer caches lay them out: the page's code bytes (token-major), then
    its scale bytes (token-major); slots past T are 0. Works on any dtype (the test pages owner ids too)."""
    T = codes.shape[0]
    pages = -(-T // block_size)
    out = []
    for a in (codes, scales):
        z = np.zeros((pages * block_size, a.shape[1]), a.dtype)
        z[:T] = a
        out.append(z.reshape(pages, block_size * a.shape[1]))
    return np.concatenate(out, axis=1)


@pytest.mark.parametrize("name", sorted(RI.INDEXER))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_indexer_presets_match_engine(name, seed):
    """Every kIndexerPresets row: latentq.quantize(spec) laid out as the engine's page equals the engine's page byte
    for byte on exactly the scale blocks where the row's exact_when holds (2000 bf16 keys, amax 0.03 to ~4e3, pages
    of 64: 31 full and a partial one): every byte of an exact block equal, some byte of every other block not."""
    fn, spec, D, nbytes, exact = RI.INDEXER[name]
    _need_spec(spec)
    T, B = 2000, 64
    x = _indexer_keys(T, D, seed, -1.5)
    msg = f"{name} seed={seed} shape={x.shape}"
    q = latentq.quantize(x, spec, "c_kv")
    assert q.bytes_per_token == pytest.approx(nbytes), msg
    page = fn(x, B)
    assert page.shape == (-(-T // B), B * nbytes), msg
    codes, scales = _latentq_token_bytes(q, T)
    assert codes.shape[1] + scales.shape[1] == nbytes, msg
    want = exact(x)  # bool [T, scale blocks]
    nb = want.shape[1]
    ids = np.arange(1, T * nb + 1, dtype=np.int64).reshape(T, nb)  # 0: an empty slot
    owner = _paged(np.repeat(ids, codes.shape[1] // nb, axis=1), np.repeat(ids, scales.shape[1] // nb, axis=1), B)
    differ = _paged(codes, scales, B) != page
    assert not differ[owner == 0].any(), msg
    exact_got = np.bincount(owner[differ], minlength=T * nb + 1)[1:].reshape(T, nb) == 0
    np.testing.assert_array_equal(exact_got, want, err_msg=msg)
    assert want.mean() >= 0.05, f"{msg}: exact_when holds on {want.mean():.3f} of the blocks only"


def test_indexer_fp8_scale_below_exact_when_by_hand():
    """Why vLLM's indexer cache is fp8-e4m3-tile128-pow2-amaxfloor and not FlashMLA's pow2, by hand: amax = 7/256
    gives fl(amax/448) = 2^-14; vLLM's scale is 2^ceil(log2(max(amax, 1e-4)/448)) = 2^-14, FlashMLA's pow2
    2^ceil(log2(max(2^-14, 1e-4))) = 2^-13 (1e-4 > 2^-14). An all-zero key: vLLM 2^ceil(log2(1e-4/448)) = 2^-22,
    pow2 2^-13. Above, amax = 0.03: both 2^-13. -amaxfloor gives vLLM's three."""
    _need_spec("fp8-e4m3-tile128-pow2")
    _need_spec("fp8-e4m3-tile128-pow2-amaxfloor")
    x = np.zeros((3, 128), np.float32)
    x[0, 0], x[2, 5] = np.float32(7 / 256), np.float32(0.03)
    _, vs = RI.vllm_indexer_k_quant(x)
    q = latentq.quantize(x, "fp8-e4m3-tile128-pow2", "c_kv")
    np.testing.assert_array_equal(vs.reshape(-1), np.float32([2.0**-14, 2.0**-22, 2.0**-13]))
    np.testing.assert_array_equal(np.asarray(q.scales, np.float32), np.float32([2.0**-13, 2.0**-13, 2.0**-13]))
    np.testing.assert_array_equal(RI.indexer_pow2_same(R._tile_amax(x, 128)), [[False], [False], [True]])
    q = latentq.quantize(x, "fp8-e4m3-tile128-pow2-amaxfloor", "index_k")
    np.testing.assert_array_equal(np.asarray(q.scales, np.float32), vs.reshape(-1))


def test_indexer_sglang_mxfp4_by_hand():
    """SGLang's MXFP4 index-K rule by hand, one key of four groups of 32 where mxfp4 differs and one where it agrees.
    Row 0: group 0 = (3, 0.5, -0.1, 0...): fl(3/6) = 2^-1 exactly, scale byte 126 in both; x/s = 6, 1, -0.2: codes
    7, 2, then +0 in SGLang (byte 0x27, 0x00) and -0 in the format (0x08). Group 1 = (7, 0...): SGLang
    2^ceil(log2(7/6)) = 2 (byte 128), 7/2 = 3.5 a tie rounded down to 3 (code 5); the format 2^(floor(log2 7) - 2) = 1
    (byte 127), 7 saturates to 6 (code 7). Group 2 = 0: SGLang 2^ceil(log2(1e-4)) = 2^-13 (byte 114), the format
    byte 0. Group 3 = (2, 0.375, 0...): both 2^-1; 2 / 0.5 = 4 (code 6), 0.375 / 0.5 = 0.75 a tie: SGLang 0.5 (code 1,
    byte 0x16), RNE 1.0 (code 2, byte 0x26). Row 1: every group (1, 0.5, 0...): both 2^-2 (byte 125), x/s = 4 and 2,
    codes 6 and 4: byte 0x46."""
    _need_spec("mxfp4")
    x = np.zeros((2, 128), np.float32)
    x[0, [0, 1, 2, 32, 96, 97]] = [3.0, 0.5, -0.1, 7.0, 2.0, 0.375]
    x[1, 0::32], x[1, 1::32] = 1.0, 0.5
    codes, e = RI.sglang_mxfp4_index_k_quant(x)
    np.testing.assert_array_equal(e, [[126, 128, 114, 126], [125, 125, 125, 125]])
    np.testing.assert_array_equal(codes[0, [0, 1, 16, 32, 48]], [0x27, 0x00, 0x05, 0x00, 0x16])
    np.testing.assert_array_equal(codes[1, 0::16], [0x46] * 4)
    assert not codes[1, np.arange(64) % 16 != 0].any()
    np.testing.assert_array_equal(RI.sglang_mxfp4_same(x), [[False] * 4, [True] * 4])
    q = latentq.quantize(x, "mxfp4", "c_kv")
    lc, ls = _latentq_token_bytes(q, 2)
    np.testing.assert_array_equal(ls, [[126, 127, 0, 126], [125, 125, 125, 125]])
    np.testing.assert_array_equal(lc[0, [0, 1, 16, 48]], [0x27, 0x08, 0x07, 0x26])
    np.testing.assert_array_equal(lc[1], codes[1])
    # mxfp4-ceil stores SGLang's bytes on both rows, the four differences included
    q = latentq.quantize(x, "mxfp4-ceil", "c_kv")
    lc, ls = _latentq_token_bytes(q, 2)
    np.testing.assert_array_equal(ls, e)
    np.testing.assert_array_equal(lc, codes)
