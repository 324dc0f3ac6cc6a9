"""Hooks and dumper on small HF transformers DeepseekV2 / DeepseekV3 models built offline from configs.

V2: q_proj path (q_lora_rank=None), YaRN rope scaling with mscale != mscale_all_dim, so HF's
DeepseekV2RotaryEmbedding.attention_scaling != 1 multiplies freqs_cis (post-RoPE q_pe/k_pe carry it)
and the softmax scale carries mscale(mscale_all_dim)^2.
V3: q_lora_rank path (q_a_proj -> q_a_layernorm -> q_b_proj), rope_interleave=True (interleaved
input pairs, output in the rotate_half layout) and rope_interleave=False (plain rotate_half).
"""

import math
import sys

import numpy as np
import pytest
import torch
import transformers
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

from dump_checks import check_schema, reference_attn_out, rel
from latentq import capture
from latentq import dump as dump_latents
from latentq.capture import LatentCapture
from latentq.inject import LatentInjector

NOPE, ROPE, V, R, H = 32, 16, 32, 64, 4
QK = NOPE + ROPE
YARN = {"type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.707, "original_max_position_embeddings": 64}
COMMON = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=H,
    num_key_value_heads=H,
    kv_lora_rank=R,
    qk_rope_head_dim=ROPE,
    qk_nope_head_dim=NOPE,
    v_head_dim=V,
    max_position_embeddings=256,
    first_k_dense_replace=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    attn_implementation="eager",
)
SEQ_LENS = [40, 40]
Q_ROWS = 16


def test_transformers_version():
    print(f"\ntransformers {transformers.__version__}, torch {torch.__version__}")
    assert transformers.__version__.split(".")[0] == "5"


def _build(kind):
    torch.manual_seed(5)
    if kind == "v2-yarn":
        m = DeepseekV2ForCausalLM(DeepseekV2Config(q_lora_rank=None, rope_scaling=dict(YARN), **COMMON))
    else:
        m = DeepseekV3ForCausalLM(
            DeepseekV3Config(
                q_lora_rank=48, rope_interleave=(kind == "v3-interleave"), n_group=2, topk_group=1, **COMMON
            )
        )
    for n, p in m.named_parameters():
        if p.dim() == 2 and "norm" not in n:
            torch.nn.init.normal_(p, std=0.2)  # sharp attention, random init
    return m.eval()


KINDS = ["v2-yarn", "v3-interleave", "v3-half"]


@pytest.fixture(scope="module", params=KINDS)
def case(request, tmp_path_factory):
    """Build the model, record pre-RoPE tensors and the applied scale with the test's own hooks, dump."""
    kind = request.param
    m = _build(kind)
    pymod = sys.modules[type(m.model.layers[0].self_attn).__module__]
    g = torch.Generator().manual_seed(6)
    seqs = [torch.randint(0, 320, (n,), generator=g).numpy() for n in SEQ_LENS]
    # independent observation of what the model does: pre-RoPE q/k and the scaling argument at call time
    seen = {"scaling": [], "q": {}, "k": {}}
    orig_eager = pymod.eager_attention_forward

    def spy(module, query, key, value, attention_mask, scaling, **kw):
        seen["scaling"].append(scaling)
        return orig_eager(module, query, key, value, attention_mask, scaling, **kw)

    hs = []
    for i, layer in enumerate(m.model.layers):
        a = layer.self_attn
        qmod = a.q_proj if a.q_proj is not None else a.q_b_proj
        hs.append(
            qmod.register_forward_hook(lambda mod, i_, o, i=i: seen["q"].setdefault(i, []).append(o[0].view(-1, H, QK)))
        )
        hs.append(
            a.kv_a_proj_with_mqa.register_forward_hook(
                lambda mod, i_, o, i=i: seen["k"].setdefault(i, []).append(o[0, :, R:])
            )
        )
    pymod.eager_attention_forward = spy
    try:
        with torch.no_grad():
            for s in seqs:
                m(input_ids=torch.as_tensor(s)[None], use_cache=False)
    finally:
        pymod.eager_attention_forward = orig_eager
        for h in hs:
            h.remove()
    sd_before = {k: v.clone() for k, v in m.state_dict().items()}
    globals_before = {n: getattr(pymod, n) for n in dir(pymod) if callable(getattr(pymod, n))}
    sdpa_before = torch.nn.functional.scaled_dot_product_attention
    out = str(tmp_path_factory.mktemp(kind) / "dump.h5")
    # check_tol=inf: the assertions below, not the dumper's own self-check, judge the dump
    summary = dump_latents.dump(m, m.config.to_dict(), seqs, Q_ROWS, out, model_name=kind, check_tol=float("inf"))
    return dict(
        kind=kind,
        model=m,
        seqs=seqs,
        seen=seen,
        out=out,
        summary=summary,
        sd_before=sd_before,
        chk=check_schema(out),
        pymod=pymod,
        globals_before=globals_before,
        sdpa_before=sdpa_before,
    )


def test_schema(case):
    A = case["chk"]["attrs"]
    assert (
        A["num_layers"],
        A["num_heads"],
        A["kv_lora_rank"],
        A["qk_rope_head_dim"],
        A["qk_nope_head_dim"],
        A["v_head_dim"],
    ) == (2, H, R, ROPE, NOPE, V)
    assert A["source"] == "hf-hooks" and A["revision"].startswith("sha256-state-dict:")
    assert A["seq_len"] == 40 and A["num_seqs"] == 2


def test_absorbed_recomputation(case):
    chk = case["chk"]
    for i, d in chk["layers"].items():
        ref = reference_attn_out(d, chk["root"]["seq_offsets"], chk["attrs"]["softmax_scale"])
        assert rel(ref, d["attn_out"]) <= 1e-5, f"{case['kind']} layer {i}: {rel(ref, d['attn_out'])}"


def test_softmax_scale_is_the_applied_one(case):
    scale = case["chk"]["attrs"]["softmax_scale"]
    applied = set(case["seen"]["scaling"])
    assert len(applied) == 1 and len(case["seen"]["scaling"]) == 2 * len(SEQ_LENS)
    assert scale == applied.pop()
    base = QK**-0.5
    if case["kind"] == "v2-yarn":
        mscale = 0.1 * YARN["mscale_all_dim"] * math.log(YARN["factor"]) + 1.0
        assert abs(scale / base - mscale**2) < 1e-12
        assert scale / base > 1.2
    else:
        assert scale == base
    assert case["summary"]["softmax_scale_config"] == pytest.approx(scale, rel=1e-12)


def _rope_inputs(case, i):
    """(positions [T], pre-RoPE k [T, dr], pre-RoPE q [T, H, dr]) over all sequences of layer i."""
    pos = torch.cat([torch.arange(n) for n in SEQ_LENS])
    return pos, torch.cat(case["seen"]["k"][i]), torch.cat(case["seen"]["q"][i])[..., NOPE:]


def test_rope_layout(case):
    """Post-RoPE k_pe/q_pe = the model's own pre-RoPE tensors rotated by the recorded layout."""
    m, chk, kind = case["model"], case["chk"], case["kind"]
    layout = chk["attrs"]["rope_layout"]
    assert layout == {"v2-yarn": "interleaved", "v3-interleave": "half", "v3-half": "half"}[kind]
    rot = m.model.rotary_emb
    inv_freq, s = rot.inv_freq.float(), float(rot.attention_scaling)
    if kind == "v2-yarn":
        assert abs(s - 1.0) > 0.01  # HF multiplies freqs_cis by attention_scaling under YaRN
    perm = torch.cat([torch.arange(0, ROPE, 2), torch.arange(1, ROPE, 2)])
    for i, d in chk["layers"].items():
        pos, k_pre, q_pre = _rope_inputs(case, i)
        if kind == "v3-interleave":  # interleaved weights: de-interleave, then rotate_half
            k_pre, q_pre = k_pre[..., perm], q_pre[..., perm]
        rows = torch.as_tensor(d["q_rows"]).long()
        k_ref = capture.rotate(k_pre, pos, inv_freq, layout, s)
        q_ref = capture.rotate(q_pre[rows], pos[rows], inv_freq, layout, s)
        assert rel(d["k_pe"], k_ref) < 1e-5 and rel(d["q_pe"], q_ref) < 1e-5
        # q_pe . k_pe dot products (the score term) from the pre-RoPE tensors
        dots = np.einsum("qhd,td->qht", d["q_pe"], d["k_pe"])
        dots_ref = torch.einsum("qhd,td->qht", q_ref, k_ref).numpy()
        assert rel(dots, dots_ref) < 1e-5
        # the check discriminates: the other layout, or ignoring attention_scaling, does not fit
        other = "half" if layout == "interleaved" else "interleaved"
        assert rel(d["k_pe"], capture.rotate(k_pre, pos, inv_freq, other, s)) > 1e-2
        if kind == "v2-yarn":
            assert rel(d["k_pe"], capture.rotate(k_pre, pos, inv_freq, layout, 1.0)) > 1e-2


def test_q_nope_and_weights(case):
    m, chk = case["model"], case["chk"]
    for i, d in chk["layers"].items():
        rows = torch.as_tensor(d["q_rows"]).long()
        np.testing.assert_array_equal(d["q_nope"], torch.cat(case["seen"]["q"][i])[rows][..., :NOPE].numpy())
        w = m.model.layers[i].self_attn.kv_b_proj.weight.detach().view(H, NOPE + V, R)
        np.testing.assert_array_equal(d["w_uk"], w[:, :NOPE].numpy())
        np.testing.assert_array_equal(d["w_uv"], w[:, NOPE:].numpy())


def test_state_dict_unchanged_and_hooks_gone(case):
    m = case["model"]
    sd = m.state_dict()
    assert sd.keys() == case["sd_before"].keys()
    assert all(torch.equal(sd[k], case["sd_before"][k]) for k in sd)
    assert all(not x._forward_hooks and not x._forward_pre_hooks for x in m.modules())
    pymod = case["pymod"]
    for n in ("apply_rotary_emb", "apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave", "eager_attention_forward"):
        assert getattr(pymod, n, None) is case["globals_before"].get(n), n
    assert {n: getattr(pymod, n) for n in case["globals_before"]} == case["globals_before"]
    assert torch.nn.functional.scaled_dot_product_attention is case["sdpa_before"]


def test_injection(case):
    m = case["model"]
    ids = torch.as_tensor(case["seqs"][0])[None]
    with torch.no_grad():
        ref = m(input_ids=ids, use_cache=False).logits
        with LatentCapture(m) as cap:
            m(input_ids=ids, use_cache=False)
        same = LatentInjector(m, lambda l, n, t: cap.layers[l][n].clone())
        with same:
            out = m(input_ids=ids, use_cache=False).logits
        assert torch.equal(out, ref)
        with LatentInjector(m, lambda l, n, t: t * 0.5 if (l, n) == (0, "c_kv") else t):
            out2 = m(input_ids=ids, use_cache=False).logits
        assert (out2 - ref).abs().max() > 1e-3


def test_sdpa_scale_captured():
    """With attn_implementation="sdpa" the scale comes from F.scaled_dot_product_attention's argument."""
    m = _build("v2-yarn")
    m.set_attn_implementation("sdpa")
    with torch.no_grad(), LatentCapture(m) as cap:
        m(input_ids=torch.arange(12)[None], use_cache=False)
    rec = cap.layers[0]
    assert rec["softmax_scale_source"] == "captured:scaled_dot_product_attention"
    assert rec["softmax_scale"] == m.model.layers[0].self_attn.scaling != QK**-0.5


@pytest.mark.parametrize("family", ["minicpm3", "glm4_moe_lite"])
def test_other_mla_families(family, tmp_path):
    """MiniCPM3 and GLM-4.7-Flash (glm4_moe_lite) reuse the MLA module names: the same hooks dump them."""
    if family == "minicpm3":
        cfg_cls, model_cls, extra = "MiniCPM3Config", "MiniCPM3ForCausalLM", dict(q_lora_rank=48)
    else:
        cfg_cls, model_cls, extra = (
            "Glm4MoeLiteConfig",
            "Glm4MoeLiteForCausalLM",
            dict(
                q_lora_rank=48,
                first_k_dense_replace=2,
                n_routed_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                n_group=1,
                topk_group=1,
            ),
        )
    assert hasattr(transformers, model_cls), f"transformers {transformers.__version__} has no {model_cls}"
    keys = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
        "max_position_embeddings",
        "attn_implementation",
    )
    torch.manual_seed(7)
    m = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**{k: COMMON[k] for k in keys}, **extra)).eval()
    seqs = [torch.randint(0, 320, (24,), generator=torch.Generator().manual_seed(8)).numpy()]
    out = str(tmp_path / "d.h5")
    dump_latents.dump(m, m.config.to_dict(), seqs, 6, out, check_tol=float("inf"))
    chk = check_schema(out)
    assert chk["attrs"]["rope_layout"] == "half"
    assert chk["attrs"]["softmax_scale"] == m.model.layers[0].self_attn.scaling == QK**-0.5
    for d in chk["layers"].values():
        assert (
            rel(reference_attn_out(d, chk["root"]["seq_offsets"], chk["attrs"]["softmax_scale"]), d["attn_out"]) <= 1e-5
        )


def _rel_fro(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("transform", ["had", "rot-s3"])
def test_rotation_fold_is_exact(case, transform):
    """The rotation fold on random-init HF DeepseekV2/V3: with c_kv' = R c_kv, W_UK' = W_UK R^T, W_UV' = W_UV R^T and
    k_pe' = R_pe k_pe, q_pe' = R_pe q_pe (R from the C++ latentq.rotation_matrix; had: blocks of 64 for
    kv_lora_rank 64 and 16 for qk_rope_head_dim 16) the absorbed attention (float32) equals the unrotated one
    to 1e-5 relative (Frobenius); the cache rotated but W_UV left alone fails by orders of magnitude."""
    import latentq
    import latentq._core  # noqa: F401  (the compiled module: its absence is an error)

    chk = case["chk"]
    offs, scale = chk["root"]["seq_offsets"], chk["attrs"]["softmax_scale"]
    rc, rk = latentq.rotation_matrix(transform, R), latentq.rotation_matrix(transform, ROPE)
    for i, d in chk["layers"].items():
        ref = reference_attn_out(d, offs, scale)
        rot = dict(
            d,
            c_kv=d["c_kv"] @ rc.T,
            k_pe=d["k_pe"] @ rk.T,
            w_uk=d["w_uk"] @ rc.T,
            w_uv=d["w_uv"] @ rc.T,
            q_pe=d["q_pe"] @ rk.T,
        )
        err = _rel_fro(reference_attn_out(rot, offs, scale), ref)
        print(f"{case['kind']} layer {i} {transform}: fold rel_fro {err:.2e}")
        assert err <= 1e-5, f"{case['kind']} layer {i} {transform}: {err}"
        broken = _rel_fro(reference_attn_out(dict(rot, w_uv=d["w_uv"]), offs, scale), ref)
        assert broken > 1e-2, f"{case['kind']} layer {i}: a fold without W_UV passed ({broken})"
