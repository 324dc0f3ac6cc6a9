"""latentq's TurboQuant (spec tq<b>[-nc], presets vllm-turboquant-*) against vLLM's MLA TurboQuant store,
restated here from vLLM's published code (github.com/vllm-project/vllm) in torch and numpy:

  codebook  vllm/model_executor/layers/quantization/turboquant/centroids.py (06d0369d) solve_lloyd_max:
            Lloyd iterations on N(0, 1/d), trapezoid rule on 200 panels, outer edges +-10.5 sigma
  rotation  vllm/v1/attention/backends/turboquant_attn.py (0135d081) _build_hadamard: the Sylvester
            Hadamard / sqrt(d), no signs, float32
  store     vllm/v1/attention/ops/triton_turboquant_store.py (b40f4cc9) _mla_fused_store_mse:
            `norms = kv_c_f.norm(dim=1)`, `x_hat = kv_c_f / (norms.unsqueeze(1) + 1e-8)`, `y = x_hat @ PiT`;
            the Triton kernel counts the float32 midpoints <= y (ties up), packs the indices LSB-first
            (`(idx_pairs & 0xF) << shifts_4`, `packed_24 = sum((idx_grp & 0x7) << shifts_3)`), stores the
            norm as fp16 after the index bytes; k_pe follows as raw bf16 (triton_mla_tq.py docstring)
  decode    vllm/v1/attention/ops/triton_turboquant_mla_decode.py (b40f4cc9) _tq_mla_dequant_mse:
            bf16 centroids, `inv_norm = 1.0 / sqrt(c_norm_sq + 1e-8)` (the `_nc` presets), `y_hat * vec_norm`
            to bf16, then `@ Pi_bf16`

torch's float32 GEMM (y = x_hat @ H) sums in an order latentq's fast Walsh-Hadamard does not follow, so an
index may differ where y lies within float32 rounding of a midpoint: the tests require identical bytes
everywhere else and count those ties (none occurred on these inputs when written).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import latentq
import latentq._core  # noqa: F401  (the compiled module: its absence is an error)


def lloyd_max_gaussian(d: int, bits: int) -> list[float]:
    """Centroids of vLLM's solve_lloyd_max(d, bits), float64 (see the module docstring)."""
    levels = 2**bits
    var = 1.0 / d
    sd = math.sqrt(var)

    def density(x):
        return (1.0 / math.sqrt(2 * math.pi * var)) * math.exp(-x * x / (2 * var))

    def integral(f, a, b, n=200):
        step = (b - a) / n
        acc = 0.5 * (f(a) + f(b))
        for k in range(1, n):
            acc += f(a + k * step)
        return acc * step

    low, high = -3.5 * sd, 3.5 * sd
    cents = [low + (high - low) * (k + 0.5) / levels for k in range(levels)]
    for _ in range(200):
        cuts = [low * 3] + [(cents[k] + cents[k + 1]) / 2.0 for k in range(levels - 1)] + [high * 3]
        upd = []
        for k in range(levels):
            den = integral(density, cuts[k], cuts[k + 1])
            num = integral(lambda v: v * density(v), cuts[k], cuts[k + 1])
            upd.append(num / den if den > 1e-15 else cents[k])
        if max(abs(u - c) for u, c in zip(upd, cents)) < 1e-10:
            break
        cents = upd
    return cents


def hadamard(d: int) -> torch.Tensor:
    h = torch.tensor([[1.0]])
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def pack_lsb_first(idx: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [T, ceil(D*bits/8)]: element i at bits [i*bits, i*bits + bits) of the row (vLLM's store)."""
    T, D = idx.shape
    nbytes = -(-D * bits // 8)
    bitplane = ((idx[:, :, None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(T, D * bits)
    bitplane = np.pad(bitplane, ((0, 0), (0, nbytes * 8 - D * bits)))
    return np.packbits(bitplane.reshape(T, nbytes, 8), axis=2, bitorder="little").reshape(T, nbytes)


def vllm_store(kv_c: np.ndarray, bits: int):
    """(indices [T, D] int, packed codes, fp16 norms [T], y [T, D] float64) as vLLM's MLA store computes them."""
    x = torch.from_numpy(kv_c)
    D = x.shape[1]
    norms = x.norm(dim=1)
    y = (x / (norms.unsqueeze(1) + 1e-8)) @ hadamard(D)
    c = torch.tensor(lloyd_max_gaussian(D, bits), dtype=torch.float32)
    mid = (c[:-1] + c[1:]) / 2
    idx = torch.bucketize(y, mid, right=True).numpy().astype(np.int64)
    y64 = (x.double() / (norms.double().unsqueeze(1) + 1e-8)) @ hadamard(D).double()
    return idx, pack_lsb_first(idx, bits), norms.to(torch.float16).numpy(), y64.numpy(), mid.numpy()


def unpack(codes: np.ndarray, D: int, bits: int) -> np.ndarray:
    T = codes.shape[0]
    plane = np.unpackbits(codes, axis=1, bitorder="little")[:, : D * bits].reshape(T, D, bits).astype(np.int64)
    return (plane << np.arange(bits)).sum(axis=2)


def gaussian_latent(T: int, D: int, seed: int) -> np.ndarray:
    """A c_kv-like matrix: channel scales spread over two decades (outlier channels), per-row gain."""
    rng = np.random.default_rng(seed)
    ch = np.exp(rng.normal(0.0, 1.0, D))
    return (rng.standard_normal((T, D)) * ch * rng.uniform(0.5, 2.0, (T, 1))).astype(np.float32)


def test_codebook_bits_are_vllms():
    for d, bits in [(512, 2), (512, 3), (512, 4), (128, 3), (64, 4)]:
        want = np.array(lloyd_max_gaussian(d, bits), np.float32)
        got = np.array(latentq.tq_codebook(d, bits), np.float32)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"d={d} bits={bits}")


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("D", [512, 128, 64])
def test_store_matches_vllm(bits, D):
    seed = 100 * bits + D
    x = gaussian_latent(700, D, seed)
    idx, codes, norms16, y64, mid = vllm_store(x, bits)
    q = latentq.quantize(x, f"tq{bits}-nc", "c_kv")
    np.testing.assert_array_equal(np.asarray(q.scales).view(np.uint16), norms16.view(np.uint16), err_msg="fp16 norms")
    got = unpack(np.asarray(q.codes), D, bits)
    margin = np.abs(y64[:, :, None] - mid.astype(np.float64)).min(axis=2)
    differ = got != idx
    near_tie = margin < 4e-7 * np.maximum(np.abs(y64), 1e-3)  # within float32 rounding of a midpoint
    assert not (differ & ~near_tie).any(), (
        f"seed {seed}, [700, {D}], {bits} bits: {int((differ & ~near_tie).sum())} indices differ away from a tie"
    )
    if not differ.any():  # then the packed bytes are vLLM's byte for byte
        np.testing.assert_array_equal(np.asarray(q.codes), codes)


@pytest.mark.parametrize(
    "preset,bits,nbytes", [("vllm-turboquant-3bit-nc", 3, 322), ("vllm-turboquant-4bit-nc", 4, 386)]
)
def test_record_matches_vllm_at_deepseek_v2_lite_dims(preset, bits, nbytes):
    x = gaussian_latent(300, 576, 7 + bits)
    ckv, kpe = np.ascontiguousarray(x[:, :512]), np.ascontiguousarray(x[:, 512:])
    _, codes, norms16, _, _ = vllm_store(ckv, bits)
    kpe_bf16 = torch.from_numpy(kpe).to(torch.bfloat16).view(torch.uint16).numpy()
    want = np.concatenate(
        [codes, norms16.view(np.uint8).reshape(300, 2), kpe_bf16.view(np.uint8).reshape(300, 128)], axis=1
    )
    q_ckv, q_kpe = latentq.quantize(ckv, preset, "c_kv"), latentq.quantize(kpe, preset, "k_pe")
    rec = np.asarray(latentq.pack_record(q_ckv, q_kpe, preset))
    assert rec.shape == (300, nbytes) == want.shape
    np.testing.assert_array_equal(rec, want)


@pytest.mark.parametrize("spec", ["tq3", "tq3-nc", "tq4-nc"])
def test_decode_matches_vllm_up_to_its_bf16_rounding(spec):
    """vLLM rounds the scaled codeword to bf16 and multiplies by a bf16 Hadamard; latentq stays float32."""
    bits, nc = int(spec[2]), spec.endswith("-nc")
    D = 512
    x = gaussian_latent(200, D, 3)
    q = latentq.quantize(x, spec, "c_kv")
    got = np.asarray(latentq.dequantize(q), np.float32)
    c = torch.tensor(lloyd_max_gaussian(D, bits), dtype=torch.float32).to(torch.bfloat16).float()
    chat = c[torch.from_numpy(unpack(np.asarray(q.codes), D, bits))]
    if nc:
        chat = chat * (1.0 / torch.sqrt((chat * chat).sum(dim=1, keepdim=True) + 1e-8))
    n = torch.from_numpy(np.asarray(q.scales).astype(np.float32)).unsqueeze(1)
    ref = ((chat * n).to(torch.bfloat16) @ hadamard(D).to(torch.bfloat16)).float().numpy()
    rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert rel.max() < 6e-3, f"{spec}: row error against vLLM's bf16 decode {rel.max():.2e}"
    err = np.linalg.norm(got - x) / np.linalg.norm(x)
    assert err < {3: 0.25, 4: 0.13}[bits], f"{spec}: rel_fro {err:.3f}"
