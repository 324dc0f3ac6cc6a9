"""Decode order end to end (latentq.e2e, latentq.inject.DecodeOrderAttention).

The claim: one causal forward whose MLA attention reads key j quantized or in bf16 per (query t, key j)
(latentq.decode_order_mask) is token-by-token decode with a quantized latent cache, exactly. Checked
against a literal decode loop written here, independently of the hooks: one token per step, the new
latent appended to the cache, every token group quantized (latentq.quantize_dequantize of its rows) the
first time a query reads it quantized, the rest read in bf16, the attention computed in the expanded
(per-head K/V) form. On a random-init tiny-mla (its own modules stepped by hand) and on random-init HF
DeepseekV2 / DeepseekV3 (their own decode with the HF cache, expand_kv wrapped to read the cache per
the rule). Also: identity injection = the reference, injection = a patched expand_kv forward, the e2e
script on an HF checkpoint directory, and `latentq run` with [e2e] naming that directory.
"""

import os
import subprocess

import h5py
import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import latentq  # noqa: E402
import latentq._core  # noqa: E402, F401  (the compiled module: its absence is an error)
from latentq import e2e as e2e_inject  # noqa: E402
from latentq import tiny_mla  # noqa: E402
from latentq.inject import DecodeOrderAttention, LatentInjector  # noqa: E402

# (spec, mode, sink) cases: per-channel groups with a sink and a residual, per-token with a prefill,
# R = 0 (the engines' order), a transformed per-token spec, and the asymmetric G = R KIVI key rule.
CASES = [
    ("int2-asym-channel-g8", "decode-r8-s3-p0", 3),
    ("int4-sym-token", "decode-r4-s0-p10", 0),
    ("int2-asym-token", "decode-r0-s0-p0", 0),
    ("had,int4-asym-token", "decode-r16-s4-p0", 4),
    ("int4-asym-channel-g4", "decode-r1-s0-p0", 0),
]


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


class QuantizedLatentCache:
    """The literal cache of one layer and target: read(hist [B, t+1, D], t) -> [B, t+1, D] as the query at
    step t reads it. The groups of G tokens aligned at the sink are quantized once, the first time a
    query reads one of their keys quantized (then stored); the other keys are read in bf16."""

    def __init__(self, spec, mode, target, sink):
        self.spec, self.mode, self.target, self.sink = spec, mode, target, sink
        self.G = latentq.decode_token_group(spec)
        self.store = {}

    def read(self, hist, t):
        B, n, D = hist.shape
        assert n == t + 1
        row = latentq.decode_order_mask(self.mode, t + 1, self.G)[t]
        out = bf16(hist.float())
        for j in np.nonzero(row)[0]:
            g0 = self.sink + ((j - self.sink) // self.G) * self.G
            if g0 not in self.store:
                assert g0 + self.G <= t + 1, "a group is read quantized before it is complete"
                rows = hist[:, g0 : g0 + self.G].float().reshape(B * self.G, D).contiguous().numpy()
                offs = [b * self.G for b in range(B + 1)]
                self.store[g0] = torch.from_numpy(
                    latentq.quantize_dequantize(rows, self.spec, self.target, offs)
                ).reshape(B, self.G, D)
            out[:, j] = self.store[g0][:, j - g0]
        return out.to(hist.dtype)


def one_pass(model, ids, spec, mode, run):
    fn = e2e_inject.make_decode_cache(latentq, spec, ("c_kv", "k_pe"), None, mode)
    with torch.no_grad(), DecodeOrderAttention(model, fn):
        return run(model, ids)


# ---- tiny-mla ------------------------------------------------------------------------------------


def small_tiny():
    torch.manual_seed(11)
    cfg = tiny_mla.TinyMLAConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        max_position_embeddings=128,
    )
    m = tiny_mla.TinyMLAForCausalLM(cfg)
    for n, p in m.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.25)  # sharp attention
    # float64: the loop and the one pass round the same latents to bf16 and to the quantizer's grid (a
    # float32 run's 1e-7 differences flip a bf16 rounding now and then: 1e-3 on a logit)
    return m.eval().double()


@torch.no_grad()
def tiny_decode_loop(model, ids, spec, mode, sink):
    """tiny-mla decoded one token at a time from its modules, latents cached and read per the rule;
    expanded attention (k_nope, v from kv_b_proj of the cache as read). Returns logits [B, T, V]."""
    cfg = model.config
    B, T = ids.shape
    H, nope, rope, vd = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, rope, 2, dtype=torch.float32) / rope))
    caches = {
        (i, n): QuantizedLatentCache(spec, mode, n, sink)
        for i in range(cfg.num_hidden_layers)
        for n in ("c_kv", "k_pe")
    }
    hist = {k: [] for k in caches}
    out = []
    for t in range(T):
        freqs = torch.full((B, 1), float(t))[..., None] * inv
        fc = torch.polar(torch.ones_like(freqs), freqs)  # [B, 1, rope/2]
        h = model.model.embed_tokens(ids[:, t : t + 1])
        for i, layer in enumerate(model.model.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_proj(x).view(B, 1, H, nope + rope).transpose(1, 2)  # [B, H, 1, nope+rope]
            q_nope, q_pe = q[..., :nope], q[..., nope:]
            c, kpe = torch.split(a.kv_a_proj_with_mqa(x), [cfg.kv_lora_rank, rope], dim=-1)
            c = a.kv_a_layernorm(c)
            q_pe, kpe = tiny_mla.apply_rotary_emb(q_pe, kpe.view(B, 1, 1, rope), fc)
            hist[(i, "c_kv")].append(c[:, 0])
            hist[(i, "k_pe")].append(kpe[:, 0, 0])
            C = caches[(i, "c_kv")].read(torch.stack(hist[(i, "c_kv")], 1), t)  # [B, t+1, r]
            K = caches[(i, "k_pe")].read(torch.stack(hist[(i, "k_pe")], 1), t)  # [B, t+1, rope]
            kv = a.kv_b_proj(C).view(B, t + 1, H, nope + vd).transpose(1, 2)
            k = torch.cat([kv[..., :nope], K[:, None].expand(-1, H, -1, -1)], -1)
            s = torch.cat([q_nope, q_pe], -1) @ k.transpose(-1, -2) * cfg.softmax_scale
            o = torch.softmax(s, -1) @ kv[..., nope:]  # [B, H, 1, v]
            h = h + a.o_proj(o.transpose(1, 2).reshape(B, 1, H * vd))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        out.append(model.lm_head(model.model.norm(h)))
    return torch.cat(out, 1)


@pytest.mark.parametrize("spec,mode,sink", CASES)
def test_tiny_mla_one_pass_equals_token_by_token_decode(spec, mode, sink):
    m = small_tiny()
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(3))
    loop = tiny_decode_loop(m, ids, spec, mode, sink)
    one = one_pass(m, ids, spec, mode, lambda mm, x: mm(x))
    with torch.no_grad():
        ref = m(ids)
    err = float((loop - one).abs().max())
    moved = float((loop - ref).abs().max())
    print(f"\n{spec} {mode}: max |loop - one pass| {err:.2e}, max |loop - exact| {moved:.2e}")
    assert err < 1e-6 * float(ref.abs().max()), err
    assert moved > 100 * err  # the quantized cache moves the logits far more than the two paths differ


def test_prefill_at_once_one_pass_equals_injection():
    """The mixed attention with every key read quantized (prefill-at-once) is the injection path's run."""
    m = small_tiny()
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(4))
    spec = "int4-asym-channel-g8"
    one = one_pass(m, ids, spec, "prefill-at-once", lambda mm, x: mm(x))
    with torch.no_grad(), LatentInjector(m, e2e_inject.make_inject(latentq, spec, ("c_kv", "k_pe"))):
        inj = m(ids)
    assert float((one - inj).abs().max()) < 1e-4 * float(inj.abs().max())


def direct_mixed_attention(q_nope, q_pe, c_q, c_b, read_c, kpe_q, kpe_b, read_kpe, w_uk, w_uv, scale):
    """The absorbed formula of mixed_latent_attention's docstring, written key by key in float64 from
    [B, T, T] masks: s = scale·(q_nope W_UK·c_X[j] + q_pe·k_pe_Y[j]), causal softmax, out = W_UV Σ p c_X[j]."""
    B, T, H, _ = q_nope.shape
    q_lat = torch.einsum("bthd,hdc->bthc", q_nope, w_uk)  # [B, T, H, r]
    out = torch.zeros(B, T, H, w_uv.shape[1], dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            rc, rk = read_c[b, t, : t + 1, None], read_kpe[b, t, : t + 1, None]  # [t+1, 1]
            c = torch.where(rc, c_q[b, : t + 1], c_b[b, : t + 1])  # [t+1, r]
            k = torch.where(rk, kpe_q[b, : t + 1], kpe_b[b, : t + 1])  # [t+1, d_r]
            p = torch.softmax((q_lat[b, t] @ c.T + q_pe[b, t] @ k.T) * scale, -1)  # [H, t+1]
            out[b, t] = torch.einsum("hc,hdc->hd", p @ c, w_uv)
    return out


@pytest.mark.parametrize("case", ["equal", "kpe-constant", "nested", "crossing", "per-row"])
def test_mixed_latent_attention_equals_the_direct_formula(case):
    """The stacked-key SDPA of mixed_latent_attention against the formula key by key, for masks that are
    equal (2·T keys), one constant (2·T), nested (3·T: a per-channel c_kv group inside a per-token k_pe
    residual), crossing (4·T) and one per batch row ([B, 1, T, T], 4·T); seed 21, B 2, T 24, H 3, r 16,
    d_n 8, d_r 4, d_v 6."""
    from latentq.inject import mixed_latent_attention

    g = torch.Generator().manual_seed(21)
    B, T, H, r, dn, dr, dv = 2, 24, 3, 16, 8, 4, 6
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)
    q_nope, q_pe, c_q, c_b = rnd(B, T, H, dn), rnd(B, T, H, dr), rnd(B, T, r), rnd(B, T, r)
    kpe_q, kpe_b, w_uk, w_uv = rnd(B, T, dr), rnd(B, T, dr), rnd(H, dn, r), rnd(H, dv, r)
    t, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    a = (j >= 2) & (j < ((t - 4) // 8) * 8)  # sink 2, residual 4, groups of 8
    k = j < t - 3  # residual 3, G = 1
    rand = torch.rand(B, 1, T, T, generator=g) < 0.5
    read_c, read_kpe = {
        "equal": (a, a),
        "kpe-constant": (a, torch.zeros(T, T, dtype=torch.bool)),
        "nested": (a, k),
        "crossing": (a, j >= t - 3),
        "per-row": (rand, rand.flip(0)),
    }[case]
    got = mixed_latent_attention(q_nope, q_pe, c_q, c_b, read_c, kpe_q, kpe_b, read_kpe, w_uk, w_uv, 0.3)
    full = lambda m: m.reshape(-1, T, T).expand(B, T, T)
    want = direct_mixed_attention(q_nope, q_pe, c_q, c_b, full(read_c), kpe_q, kpe_b, full(read_kpe), w_uk, w_uv, 0.3)
    assert got.shape == (B, T, H, dv) and got.dtype == torch.float64
    err = float((got - want).abs().max())
    assert err < 1e-12 * float(want.abs().max()), (case, err)


def test_decode_order_skips_the_models_own_attention():
    """Where the mixed attention replaces a layer's output on every row, the model's SDPA call is not run
    (zeros returned); with a `rows` element that keeps some rows, it runs; the logits do not change."""
    import torch.nn.functional as F

    m = small_tiny()
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(5))
    fn = e2e_inject.make_decode_cache(latentq, "int4-asym-channel-g8", ("c_kv", "k_pe"), None, "decode-r8-s0-p0")
    calls = []
    real = F.scaled_dot_product_attention

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    orig = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = counting
    try:
        with torch.no_grad(), DecodeOrderAttention(m, fn):
            skipped = m(ids)
        n_skipped = len(calls)
        calls.clear()
        keep = lambda layer, c, k: (
            fn(layer, c, k) + (torch.ones(c.shape[0], dtype=torch.bool),)
            if layer
            else fn(layer, c, k) + (torch.tensor([True, False]),)
        )
        with torch.no_grad(), DecodeOrderAttention(m, keep):
            kept = m(ids)
        n_kept = len(calls)
    finally:
        F.scaled_dot_product_attention = orig
    layers = m.config.num_hidden_layers
    assert n_skipped == 0 and n_kept == 1, (n_skipped, n_kept, layers)
    with torch.no_grad():
        ref = m(ids)
    assert torch.equal(skipped[0], kept[0])  # row 0 reads the mixed cache in both runs
    assert float((kept[1] - ref[1]).abs().max()) < float((skipped[1] - ref[1]).abs().max())


# ---- HF DeepseekV2 / V3 --------------------------------------------------------------------------

from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM  # noqa: E402

HF_COMMON = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=16,
    v_head_dim=16,
    max_position_embeddings=640,
    first_k_dense_replace=2,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
)


def build_hf(kind, attn="eager"):
    torch.manual_seed(7)
    if kind == "v2":
        m = DeepseekV2ForCausalLM(DeepseekV2Config(q_lora_rank=None, attn_implementation=attn, **HF_COMMON))
    else:
        m = DeepseekV3ForCausalLM(
            DeepseekV3Config(
                q_lora_rank=24, rope_interleave=True, n_group=2, topk_group=1, attn_implementation=attn, **HF_COMMON
            )
        )
    for n, p in m.named_parameters():
        if p.dim() == 2 and "norm" not in n:
            torch.nn.init.normal_(p, std=0.25)
    return m.eval().double()


def hf_run(m, ids):
    return m(input_ids=ids, use_cache=False).logits


class ReadPerRule:
    """Wraps every layer's expand_kv (HF 5.x MLA attention: the latents after the cache update) so that
    the latents are read through `read(layer, name, x [B, T, D], t)` before the per-head expansion."""

    def __init__(self, model, read):
        self.model, self.read = model, read

    def __enter__(self):
        self.saved = []
        for i, layer in enumerate(self.model.model.layers):
            a = layer.self_attn
            orig = a.expand_kv

            def wrapped(kv_nope, k_rot, i=i, orig=orig):
                t = kv_nope.shape[2] - 1
                c = self.read(i, "c_kv", kv_nope[:, 0], t)[:, None].to(kv_nope.dtype)
                k = self.read(i, "k_pe", k_rot[:, 0], t)[:, None].to(k_rot.dtype)
                return orig(c, k)

            a.expand_kv = wrapped
            self.saved.append(a)
        return self

    def __exit__(self, *exc):
        for a in self.saved:
            del a.expand_kv


@torch.no_grad()
def hf_decode_loop(m, ids, spec, mode, sink):
    """HF's own decode, one token per step with its cache (which stores the exact latents); each step's
    attention reads the cache per the rule through QuantizedLatentCache."""
    from transformers import DynamicCache

    caches = {}

    def read(i, name, x, t):
        c = caches.setdefault((i, name), QuantizedLatentCache(spec, mode, name, sink))
        return c.read(x, t)

    past = DynamicCache(config=m.config)
    out = []
    with ReadPerRule(m, read):
        for t in range(ids.shape[1]):
            r = m(input_ids=ids[:, t : t + 1], past_key_values=past, use_cache=True)
            past = r.past_key_values
            out.append(r.logits)
    return torch.cat(out, 1)


@pytest.mark.parametrize("kind", ["v2", "v3"])
@pytest.mark.parametrize("spec,mode,sink", [CASES[0], CASES[3]])
def test_hf_one_pass_equals_token_by_token_decode(kind, spec, mode, sink):
    m = build_hf(kind)
    ids = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(9))
    loop = hf_decode_loop(m, ids, spec, mode, sink)
    one = one_pass(m, ids, spec, mode, hf_run)
    with torch.no_grad():
        ref = hf_run(m, ids)
    err, moved = float((loop - one).abs().max()), float((loop - ref).abs().max())
    print(f"\n{kind} {spec} {mode}: max |loop - one pass| {err:.2e}, max |loop - exact| {moved:.2e}")
    # HF's eager attention takes its softmax in float32 (the loop), the one pass in float64: float32 level
    assert err < 1e-5 * float(ref.abs().max()), err
    assert moved > 100 * err


@pytest.mark.parametrize("kind", ["v2", "v3"])
def test_hf_sdpa_model_skips_its_attention_and_matches_eager(kind):
    """An HF model on its sdpa attention path: DecodeOrderAttention skips the model's SDPA call on every
    replaced layer (none reaches torch) and gives the eager model's logits (same weights, float64)."""
    import torch.nn.functional as F

    eager, sdpa = build_hf(kind), build_hf(kind, "sdpa")
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(12))
    fn = e2e_inject.make_decode_cache(latentq, "int4-asym-channel-g8", ("c_kv", "k_pe"), None, "decode-r8-s2-p0")
    calls, real = [], F.scaled_dot_product_attention

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    F.scaled_dot_product_attention = counting
    try:
        with torch.no_grad(), DecodeOrderAttention(sdpa, fn):
            got = hf_run(sdpa, ids)
        with torch.no_grad():
            plain = hf_run(sdpa, ids)  # the sdpa path is really taken: it calls SDPA per layer
    finally:
        F.scaled_dot_product_attention = real
    with torch.no_grad(), DecodeOrderAttention(eager, fn):
        want = hf_run(eager, ids)
    assert len(calls) == sdpa.config.num_hidden_layers, len(calls)  # all from the plain run
    assert float((got - want).abs().max()) < 1e-9 * float(want.abs().max())
    assert float((plain - want).abs().max()) > 1e-6 * float(want.abs().max())  # the cache mode changed them


@pytest.mark.parametrize("kind", ["v2", "v3"])
def test_hf_identity_and_patched_forward(kind):
    """Identity injection gives the reference logits; the mixed attention reading the exact latents on
    both sides gives them to float32 rounding; bf16 latents move them little; the injection of a
    quantizer equals a forward whose expand_kv reads the quantize-dequantized latents (written here)."""
    m = build_hf(kind)
    ids = torch.randint(0, 300, (2, 48), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        ref = hf_run(m, ids)
        with LatentInjector(m, lambda layer, name, x: x):
            same = hf_run(m, ids)
        T = ids.shape[1]
        allq = torch.ones(T, T, dtype=torch.bool)
        with DecodeOrderAttention(m, lambda layer, c, k: (c, c, allq, k, k, allq)):
            mixed = hf_run(m, ids)
        with LatentInjector(m, e2e_inject.make_inject(latentq, "bf16", ("c_kv", "k_pe"))):
            b = hf_run(m, ids)
        spec = "int4-asym-channel-g8"
        with LatentInjector(m, e2e_inject.make_inject(latentq, spec, ("c_kv", "k_pe"))):
            inj = hf_run(m, ids)

        def qdq(i, name, x, t):
            B, n, D = x.shape
            y = latentq.quantize_dequantize(
                x.float().reshape(B * n, D).contiguous().numpy(), spec, name, [k * n for k in range(B + 1)]
            )
            return torch.from_numpy(y).reshape(B, n, D)

        with ReadPerRule(m, qdq):
            patched = hf_run(m, ids)
    scale = float(ref.abs().max())
    assert torch.equal(same, ref)
    assert float((mixed - ref).abs().max()) < 1e-5 * scale
    kl_b = e2e_inject.logit_metrics(ref, b, ids)["kl_mean"]
    assert 0 < kl_b < 1e-3, kl_b
    assert float((inj - patched).abs().max()) < 1e-5 * scale
    assert float((inj - ref).abs().max()) > 1e-2 * scale


# ---- the script and the CLI on an HF checkpoint directory ----------------------------------------


@pytest.fixture(scope="module")
def v3_checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("v3ckpt")
    m = build_hf("v3")
    m.save_pretrained(str(d / "model"))
    return d / "model"


def results_file(path, quantizers=("int4-asym-channel-g8", "bf16"), attrs=None):
    str_t = h5py.string_dtype("utf-8")
    with h5py.File(path, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        for k, v in (attrs or {}).items():
            f.attrs[k] = v
        g = f.create_group("latent_error")
        qs = [q for q in quantizers for _ in (0, 1)]
        g.create_dataset("quantizer", data=np.array(qs, dtype=object), dtype=str_t)
        g.create_dataset("target", data=np.array(["c_kv", "k_pe"] * len(quantizers), dtype=object), dtype=str_t)


def test_script_on_hf_checkpoint_decode_modes(v3_checkpoint, tmp_path):
    """latentq.e2e on an HF DeepseekV3 directory (byte tokens: it has no tokenizer), the decode modes
    and quantizers from the root attributes: /e2e gains cache_mode rows, /e2e_position buckets them."""
    res = tmp_path / "r.h5"
    modes = ["prefill-at-once", "decode-r0-s0-p0", "decode-r16-s4-p0"]
    results_file(
        res,
        attrs={
            "decode_order_modes": np.array(modes, dtype=object),
            "decode_order_quantizers": np.array(["int2-asym-channel-g8"], dtype=object),
            "decode_order_position_bucket": np.int64(16),
        },
    )
    text = tmp_path / "t.txt"
    text.write_bytes((b"In the beginning God created the heaven and the earth. " * 8)[:400])
    rc = e2e_inject.main(
        [
            "--results",
            str(res),
            "--model",
            str(v3_checkpoint),
            "--text",
            str(text),
            "--offset-bytes",
            "0",
            "--seq-len",
            "48",
            "--num-seqs",
            "2",
            "--threads",
            "1",
            "--device",
            "cpu",
            "--dtype",
            "float32",
        ]
    )
    assert rc == 0
    with h5py.File(res, "r") as f:
        e = {k: v[:] for k, v in f["e2e"].items()}
        p = {k: v[:] for k, v in f["e2e_position"].items()}
        assert f["e2e_position"].attrs["position_bucket"] == 16
    dec = lambda a: [x.decode() if isinstance(x, bytes) else x for x in a]
    rows = list(zip(dec(e["quantizer"]), dec(e["cache_mode"])))
    assert rows == [
        ("int4-asym-channel-g8", "prefill-at-once"),
        ("bf16", "prefill-at-once"),
        ("int2-asym-channel-g8", "decode-r0-s0-p0"),
        ("int2-asym-channel-g8", "decode-r16-s4-p0"),
    ]
    kl = e["kl_mean"]
    assert kl[3] < kl[2]  # a residual and a sink recover part of int2's error
    # Bytes per token per layer: bf16 = 2 bytes x (32 + 16); the decode rows hold sink + residual +
    # the incomplete group in bf16 at the end of 48 tokens (R=0: 48 = 6 groups of 8, all quantized).
    assert e["bytes_per_token"][1] == pytest.approx(96.0)
    assert e["bytes_per_token"][3] > e["bytes_per_token"][2]
    assert list(e["scale_causal"]) == [1, 1, 1, 1]
    assert len(p["quantizer"]) == 4 * 3 and list(p["pos_start"][:3]) == [0, 16, 32]
    assert list(p["pos_end"][:3]) == [16, 32, 48] and list(p["tokens"][:3]) == [32, 32, 32]
    assert list(p["residual"][-3:]) == [16] * 3 and list(p["sink"][-3:]) == [4] * 3
    # The bucket means average to the run's mean (equal buckets).
    for r in range(4):
        assert np.mean(p["kl_mean"][3 * r : 3 * r + 3]) == pytest.approx(kl[r], rel=1e-9)
    # R=16, S=4: positions < 16 read every key in bf16 -> the first bucket's KL is the bf16 level.
    assert p["kl_mean"][9] < 0.1 * p["kl_mean"][6]


def test_script_runs_the_decode_order_targets(v3_checkpoint, tmp_path, capsys):
    """The root attribute decode_order_targets (the study's [decode_order].targets) gives one decode run per
    quantizer, target set and mode, as /attention_position; a target set outside the three is refused."""
    res = tmp_path / "r.h5"
    results_file(
        res,
        attrs={
            "decode_order_modes": np.array(["decode-r8-s0-p0"], dtype=object),
            "decode_order_quantizers": np.array(["int2-asym-token"], dtype=object),
            "decode_order_targets": np.array(["c_kv", "k_pe", "c_kv+k_pe"], dtype=object),
        },
    )
    text = tmp_path / "t.txt"
    text.write_bytes(b"In the beginning God created the heaven and the earth. " * 4)
    base = [
        "--results",
        str(res),
        "--model",
        str(v3_checkpoint),
        "--text",
        str(text),
        "--offset-bytes",
        "0",
        "--seq-len",
        "32",
        "--num-seqs",
        "2",
        "--threads",
        "1",
    ]
    assert e2e_inject.main(base) == 0
    with h5py.File(res, "r") as f:
        e = {k: [x.decode() if isinstance(x, bytes) else x for x in v[:]] for k, v in f["e2e"].items()}
        p = {k: [x.decode() if isinstance(x, bytes) else x for x in v[:]] for k, v in f["e2e_position"].items()}
    rows = [(q, t) for q, t, m in zip(e["quantizer"], e["targets"], e["cache_mode"]) if m != "prefill-at-once"]
    assert rows == [("int2-asym-token", "c_kv"), ("int2-asym-token", "k_pe"), ("int2-asym-token", "c_kv+k_pe")]
    # /e2e_position tells the three runs apart too (one bucket of 64 >= 32 positions each)
    prow = [(t, m) for t, m in zip(p["targets"], p["cache_mode"]) if m != "prefill-at-once"]
    assert prow == [("c_kv", "decode-r8-s0-p0"), ("k_pe", "decode-r8-s0-p0"), ("c_kv+k_pe", "decode-r8-s0-p0")]
    bpt = e["bytes_per_token"][-3:]
    # 8 bf16 tokens x 2 B x (32 + 16); the other 24 at int2 + fp16 scale and offset per row on the quantized
    # target(s): c_kv 32/4 + 4 = 12 B, k_pe 16/4 + 4 = 8 B, bf16 otherwise (64 and 32 B)
    assert bpt == pytest.approx(
        [(8 * 96 + 24 * (12 + 32)) / 32, (8 * 96 + 24 * (64 + 8)) / 32, (8 * 96 + 24 * (12 + 8)) / 32]
    )
    kl = e["kl_mean"][-3:]
    assert kl[2] > max(kl[0], kl[1]) > 0  # both targets quantized move the logits most
    with h5py.File(res, "a") as f:
        f.attrs["decode_order_targets"] = np.array(["q_pe"], dtype=object)
    assert e2e_inject.main(base) == 2
    err = capsys.readouterr().err
    assert "decode_order_targets 'q_pe'" in err and str(res) in err


def test_script_flags_and_errors(v3_checkpoint, tmp_path, capsys):
    res = tmp_path / "r.h5"
    results_file(res)
    text = tmp_path / "t.txt"
    text.write_bytes(b"x" * 200)
    base = [
        "--results",
        str(res),
        "--model",
        str(v3_checkpoint),
        "--text",
        str(text),
        "--offset-bytes",
        "0",
        "--seq-len",
        "32",
        "--num-seqs",
        "2",
        "--threads",
        "1",
    ]
    assert e2e_inject.main(base + ["--cache-modes", "decode-r1-x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "decode-r1-x" in err[0], err
    assert e2e_inject.main(base + ["--position-bucket", "0"]) == 2
    assert e2e_inject.main(base + ["--seq-len", "1000"]) == 2
    assert "max_position_embeddings 640" in capsys.readouterr().err
    with h5py.File(res, "r") as f:
        assert "e2e" not in f
    assert (
        e2e_inject.main(
            base + ["--cache-modes", "decode-r8-s0-p0", "--decode-quantizers", "int4-sym-token", "int8-asym-tensor"]
        )
        == 0
    )
    with h5py.File(res, "r") as f:
        assert [x.decode() for x in f["e2e/cache_mode"][:]] == ["decode-r8-s0-p0"] * 2
        assert f["e2e_position/pos_end"][-1] == 32
        # a per-tensor scale spans the sequence: no causal decode order, flagged
        assert list(f["e2e/scale_causal"][:]) == [1, 0]
        # 8 bf16 tokens x 2 B x (32 + 16) and 24 tokens at int4 + an fp16 scale per row: 32/2+2 + 16/2+2 = 28 B
        assert f["e2e/bytes_per_token"][0] == pytest.approx((8 * 96 + 24 * 28) / 32)


def test_e2e_bytes_are_the_decode_order_accounting(v3_checkpoint, tmp_path):
    """/e2e and /e2e_position count a decode-order cache as /attention_position does (C++
    decode_order_cache_bytes): the incomplete token group is held in bf16 and charged no metadata. The values
    are the hand-computed ones of DecodeOrder.BytesOfTheIncompleteGroupAreBf16Only (tests/attention): 2 x 40
    tokens, c_kv 32 + k_pe 16 columns, int4-asym-channel-g16 -> 48 / 72 / 48 B/token/layer for
    r0-s0 / r16-s4 / r0-s4."""
    res = tmp_path / "r.h5"
    results_file(res)
    text = tmp_path / "t.txt"
    text.write_bytes(b"In the beginning God created the heaven and the earth. " * 8)
    modes = ["decode-r0-s0-p0", "decode-r16-s4-p0", "decode-r0-s4-p0"]
    args = ["--results", str(res), "--model", str(v3_checkpoint), "--text", str(text), "--offset-bytes", "0"]
    args += ["--seq-len", "40", "--num-seqs", "2", "--threads", "1", "--cache-modes", *modes]
    assert e2e_inject.main(args + ["--decode-quantizers", "int4-asym-channel-g16"]) == 0
    dec = lambda a: [x.decode() if isinstance(x, bytes) else x for x in a]
    with h5py.File(res, "r") as f:
        e = {k: dec(v[:]) for k, v in f["e2e"].items()}
        p = {k: dec(v[:]) for k, v in f["e2e_position"].items()}
    expected = {"decode-r0-s0-p0": 48.0, "decode-r16-s4-p0": 72.0, "decode-r0-s4-p0": 48.0}
    got = {m: b for q, m, b in zip(e["quantizer"], e["cache_mode"], e["bytes_per_token"]) if m in expected}
    assert got == expected
    for q, m, b in zip(p["quantizer"], p["cache_mode"], p["bytes_per_token"]):
        if m in expected:
            assert b == expected[m], (q, m)
    # the function itself, per target and for the whole matrix (prefill-at-once quantizes the incomplete group)
    offsets = [0, 40, 80]
    assert latentq.decode_order_cache_bytes("int4-asym-channel-g16", "c_kv", 32, offsets, "decode-r16-s4-p0") == 3840
    assert latentq.decode_order_cache_bytes("had,int4-asym-channel-g16", "k_pe", 16, offsets, "prefill-at-once") == 1024
    with pytest.raises(ValueError, match="decode-r1"):
        latentq.decode_order_cache_bytes("int4-asym-token", "c_kv", 32, offsets, "decode-r1")


def test_latentq_run_with_e2e_on_an_hf_checkpoint(v3_checkpoint, tmp_path):
    """`latentq run` on a dump of a random-init HF DeepseekV3 directory,
    [e2e] model = that directory -> /e2e and /e2e_position in the results (default text and windows)."""
    lq = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
    assert os.path.isfile(lq), f"the latentq CLI is not built ({lq}; set LATENTQ_BIN or build build/latentq)"
    text = tmp_path / "dump.txt"
    text.write_bytes((b"And God said, Let there be light: and there was light. " * 12)[:640])
    dump = tmp_path / "dump.h5"
    from latentq import dump as dump_latents

    assert (
        dump_latents.main(
            [
                "--model",
                str(v3_checkpoint),
                "--text",
                str(text),
                "--seq-len",
                "64",
                "--num-seqs",
                "4",
                "--q-rows",
                "16",
                "--out",
                str(dump),
                "--threads",
                "1",
            ]
        )
        == 0
    )
    cfg = tmp_path / "study.toml"
    cfg.write_text(
        f'[input]\ndump = "{dump}"\n\n[quantizers]\nbits = [4]\nschemes = ["asym"]\n'
        f'granularities = ["channel"]\ngroup_sizes = [32]\nextra = ["bf16", "klt,int4-asym-channel-g32"]\n\n'
        f"[svd]\nenabled = false\n\n[cross_layer]\nenabled = false\n\n"
        f'[e2e]\nenabled = true\nmodel = "{v3_checkpoint}"\n'
    )
    out = tmp_path / "res.h5"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run(
        [lq, "run", str(cfg), "--out", str(out), "--threads", "1"], capture_output=True, text=True, env=env, timeout=600
    )
    print(r.stdout[-3000:], r.stderr[-3000:])
    assert r.returncode == 0
    assert "e2e: skipped" not in r.stdout
    # the klt quantizer runs behind the basis the study fitted, refitted from the dump (latentq.fitted_basis)
    assert "not injected" not in r.stderr, r.stderr
    with h5py.File(out, "r") as f:
        assert "e2e" in f and "e2e_position" in f
        q = [x.decode() for x in f["e2e/quantizer"][:]]
        # the study's formats, then the planner's assignments at the budgets something fits (/plan_runs)
        assert q == ["int4-asym-channel-g32", "bf16", "klt,int4-asym-channel-g32", "plan-3/8", "plan-1/2"], q
        kl = f["e2e/kl_mean"][:]
        assert 0 <= kl[1] < kl[0] and 0 <= kl[1] < kl[2] and np.isfinite(kl[2])
        assert f["e2e"].attrs["model"] == str(v3_checkpoint)
    # The tiny-mla directory as [e2e] model of this HF dump: skipped with one line, no /e2e.
    cfg.write_text(cfg.read_text().replace(str(v3_checkpoint), os.path.join(ROOT, "data", "tiny-mla")))
    out2 = tmp_path / "res2.h5"
    r = subprocess.run(
        [lq, "run", str(cfg), "--out", str(out2), "--threads", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert "e2e: skipped: the dump's model is 'model' but the [e2e] model " in r.stdout
    assert "is a tiny-mla directory: set [e2e] model to the dump's checkpoint directory" in r.stdout
    with h5py.File(out2, "r") as f:
        assert "e2e" not in f
