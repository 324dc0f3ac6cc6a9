"""The two forms of the mixed-read MLA attention in latentq.inject give one result: mixed_latent_attention (the
expanded form: keys and values rebuilt per head, one scaled_dot_product_attention) and absorbed_mixed_attention
(DeepSeek-V3 inference/model.py's "absorb" form, which latentq.e2e_generate decodes with), in float64 on random
inputs: every query position (Tq = T) and the last ones (Tq < T, incremental decode), a read mask shared by the
batch or one per batch row, c_kv and k_pe read differently. And one case by hand."""

import math

import pytest
import torch

from latentq.inject import absorbed_mixed_attention, mixed_latent_attention

B, H, DN, DR, DV, R, T = 2, 3, 8, 4, 6, 10, 12


def _inputs(seed: int, tq: int, per_row: bool):
    g = torch.Generator().manual_seed(seed)
    n = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    mask = (
        (lambda: torch.rand(B, 1, tq, T, generator=g) < 0.5)
        if per_row
        else (lambda: torch.rand(tq, T, generator=g) < 0.5)
    )
    return dict(
        q_nope=n(B, tq, H, DN), q_pe=n(B, tq, H, DR), c_q=n(B, T, R), c_b=n(B, T, R), read_c=mask(),
        kpe_q=n(B, T, DR), kpe_b=n(B, T, DR), read_kpe=mask(), w_uk=n(H, DN, R), w_uv=n(H, DV, R),
        softmax_scale=(DN + DR) ** -0.5,
    )  # fmt: skip


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("tq", [T, 5, 1])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_absorbed_form_is_the_expanded_form(seed, tq, per_row):
    x = _inputs(seed, tq, per_row)
    a, b = mixed_latent_attention(**x), absorbed_mixed_attention(**x)
    assert a.shape == b.shape == (B, tq, H, DV) and a.dtype == b.dtype == torch.float64
    err = float((a - b).abs().max())
    assert err < 1e-12, f"seed {seed} Tq {tq} per_row {per_row} B {B} H {H} T {T} r {R}: max |diff| {err}"


def test_one_head_by_hand():
    """B = H = 1, r = 1, d_n = d_r = d_v = 1, T = 2, the last query only (Tq = 1), W_UK = W_UV = 1, scale 1.
    c_kv = [1, 2] quantized, [1.5, 2.5] in bf16; k_pe = [0, 1] / [0.5, 1.5]; q_nope = 1, q_pe = 2. Query 1 reads key 0
    of c_kv quantized and key 1 in bf16, both k_pe keys quantized: s0 = 1·1 + 2·0 = 1, s1 = 1·2.5 + 2·1 = 4.5;
    out = (e^1 · 1 + e^4.5 · 2.5) / (e^1 + e^4.5)."""
    t = lambda *v: torch.tensor(v, dtype=torch.float64)
    x = dict(
        q_nope=t(1.0).view(1, 1, 1, 1), q_pe=t(2.0).view(1, 1, 1, 1),
        c_q=t(1.0, 2.0).view(1, 2, 1), c_b=t(1.5, 2.5).view(1, 2, 1), read_c=torch.tensor([[True, False]]),
        kpe_q=t(0.0, 1.0).view(1, 2, 1), kpe_b=t(0.5, 1.5).view(1, 2, 1), read_kpe=torch.tensor([[True, True]]),
        w_uk=t(1.0).view(1, 1, 1), w_uv=t(1.0).view(1, 1, 1), softmax_scale=1.0,
    )  # fmt: skip
    want = (math.exp(1) * 1 + math.exp(4.5) * 2.5) / (math.exp(1) + math.exp(4.5))
    for f in (mixed_latent_attention, absorbed_mixed_attention):
        assert float(f(**x).flatten()[0]) == pytest.approx(want, abs=1e-14), f.__name__


def test_the_absorbed_form_refuses_a_sparse_mask_and_more_queries_than_keys():
    x = _inputs(0, T, False)
    with pytest.raises(ValueError, match="dense MLA only"):
        absorbed_mixed_attention(**x, visible=torch.ones(T, T, dtype=torch.bool))
    x = _inputs(0, T, False)
    x.update(c_q=x["c_q"][:, :5], c_b=x["c_b"][:, :5], kpe_q=x["kpe_q"][:, :5], kpe_b=x["kpe_b"][:, :5])
    for f in (mixed_latent_attention, absorbed_mixed_attention):
        with pytest.raises(ValueError, match=f"{T} queries over 5 keys"):
            f(**x)
