"""The `latentq` Python module: its storage follows the documented layout, and its dequantization
is the C++ one bit for bit (checked against an independent numpy decode of the stored bytes)."""

import numpy as np
import pytest

import latentq
import latentq._core  # noqa: F401  (the compiled module: its absence is an error)


def numpy_decode(q, seq_offsets):
    """Decode a QuantizedTensor from its stored arrays only, following latentq/quantize.h and qmath.h
    (float32 arithmetic, one rounding per operation)."""
    spec = q.spec
    T, D = q.rows, q.cols
    codes = q.codes
    if spec == "bf16":
        return (codes.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(T, D)
    bits = int(spec[3])
    per = 8 // bits
    u = np.zeros((T, D), np.uint8)
    for i in range(D):
        u[:, i] = (codes[:, i // per] >> (bits * (i % per))) & ((1 << bits) - 1)
    sc = q.scales.astype(np.float32)
    of = q.offsets.astype(np.float32) if len(q.offsets) else None
    gran = spec.split("-")[2]
    if gran == "tensor":
        s = np.full((T, D), sc[0], np.float32)
        o = np.full((T, D), of[0], np.float32) if of is not None else None
    elif gran == "channel":
        gb = q.group_bounds
        s = np.empty((T, D), np.float32)
        o = np.empty((T, D), np.float32) if of is not None else None
        for g in range(len(gb) - 1):
            s[gb[g] : gb[g + 1]] = sc[g * D : (g + 1) * D]
            if o is not None:
                o[gb[g] : gb[g + 1]] = of[g * D : (g + 1) * D]
    else:
        parts = spec.split("-")
        gs = next((int(p[1:]) for p in parts if p.startswith("g")), 0) or D
        gs = min(gs, D)
        nt = (D + gs - 1) // gs
        idx = np.arange(D) // gs
        s = sc.reshape(T, nt)[:, idx]
        o = of.reshape(T, nt)[:, idx] if of is not None else None
    if spec.split("-")[1] == "sym":
        qv = u.astype(np.int32) - (1 << (bits - 1))
        return (s * qv.astype(np.float32)).astype(np.float32)
    return (o + (s * u.astype(np.float32)).astype(np.float32)).astype(np.float32)


# every integer example of the format table (latentq.formats()) and bf16
TABLE = latentq.formats()
SPECS = [n for n, f in zip(TABLE.name, TABLE.family) if f in ("int", "bf16")]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("seed", [0, 7])
def test_dequantize_bit_identical_to_numpy_decode(spec, seed):
    rng = np.random.default_rng(seed)
    T, D = 97, 33
    x = (rng.standard_normal((T, D)) * rng.uniform(0.1, 5, D)).astype(np.float32)
    offs = [0, 40, 97]
    q = latentq.quantize(x, spec, "c_kv", offs)
    y = latentq.dequantize(q)
    ref = numpy_decode(q, offs)
    assert y.dtype == np.float32 and y.shape == (T, D)
    np.testing.assert_array_equal(
        y.view(np.uint32), ref.view(np.uint32), err_msg=f"spec={spec} seed={seed} shape={T}x{D}"
    )
    # quantize_dequantize is the same function
    np.testing.assert_array_equal(latentq.quantize_dequantize(x, spec, "c_kv", offs), y)
    # error bound: bf16 half-ulp; else half a scale plus what rounding scale and offset to fp16
    # can add (a relative 2^-11 of the group range and of the offset, each)
    amax = float(np.abs(x).max())
    bound = amax * 2**-8 if spec == "bf16" else 0.5 * float(q.scales.astype(np.float32).max()) + amax * 2**-9
    assert np.abs(y - x).max() <= bound


def test_storage_layout_and_accounting():
    x = np.arange(64 * 128, dtype=np.float32).reshape(64, 128) / 100.0
    q = latentq.quantize(x, "int4-asym-channel-g32", "c_kv", [0, 64])
    assert q.codes.shape == (64, 64) and q.codes.dtype == np.uint8
    assert q.scales.dtype == np.float16 and q.scales.shape == (2 * 128,)
    assert q.offsets.shape == (2 * 128,)
    assert q.storage_bytes == 64 * 64 + 2 * 128 * 2 * 2
    assert q.bytes_per_token == pytest.approx((64 * 64 + 1024) / 64)
    assert q.bits_per_element == pytest.approx(8 * (64 * 64 + 1024) / (64 * 128))
    # the FlashMLA V3.2 preset stores bf16 on k_pe: 2 bytes per element
    k = latentq.quantize(x[:, :64].copy(), "flashmla-v32-fp8", "k_pe")
    assert k.spec == "bf16" and k.bytes_per_token == 128


def test_errors_are_value_errors():
    x = np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="int5"):
        latentq.quantize(x, "int5-asym-token")
    with pytest.raises(ValueError, match="target"):
        latentq.quantize(x, "int4-asym-token", "v")
    bad = x.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="1 NaN/Inf"):
        latentq.quantize(bad, "int4-asym-token")
    with pytest.raises(ValueError, match="2-D"):
        latentq.quantize(np.ones(4, np.float32), "int4-asym-token")
    assert latentq.canonical_spec("int4-asym-channel-g0-fp16") == "int4-asym-channel"


def test_every_compiled_name_is_a_package_name_and_no_other():
    """The C++ names are written once (python/src/core.cpp): each public one is latentq.<name>, the same object,
    and a name neither side defines is an AttributeError."""
    names = [n for n in dir(latentq._core) if not n.startswith("_")]
    assert {"quantize", "decode_order_mask", "decode_order"} <= set(names), names
    for n in names:
        assert getattr(latentq, n) is getattr(latentq._core, n), n
    with pytest.raises(AttributeError, match="no_such_name"):
        latentq.no_such_name  # noqa: B018


def test_decode_order_parses_the_cache_mode_grammar():
    """latentq.decode_order: (R, S, P) of a label by the C++ grammar (DecodeOrder::parse), canonical labels only."""
    assert latentq.decode_order("prefill-at-once") == (0, 0, 0)
    assert latentq.decode_order("decode-r32-s4-p0") == (32, 4, 0)
    assert latentq.decode_order("decode-r0-s0-p512") == (0, 0, 512)
    for bad, why in (("decode-r1-x", "expected 'prefill-at-once'"), ("decode-r08-s0-p0", "not canonical"), ("", "")):
        with pytest.raises(ValueError, match=f"cache mode '{bad}'.*{why}"):
            latentq.decode_order(bad)
