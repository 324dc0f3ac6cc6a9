"""MLA variants beyond DeepSeek-V2/V3, captured, dumped (in memory and streamed) and injected, offline.

Tiny random-init models of four transformers 5.24 families, built from their config classes and saved
with ``save_pretrained`` (safetensors, sharded with a small ``max_shard_size`` so that a decoder layer
straddles two shards), a few hundred KB each:
- ``deepseek_v32`` (DeepSeek-V3.2): a DSA indexer inside the attention calls ``apply_rotary_pos_emb``
  on its own query / key (index_n_heads = num_heads, so that a capture taking the indexer's call for the
  attention's would not even fail on shapes); index_topk >= the window, so the attention is dense;
- ``glm_moe_dsa`` (GLM-5): the same, its indexer calling ``apply_rotary_pos_emb_interleave``, the very
  function the attention calls; layer 1 a "shared" DSA layer, which reuses layer 0's top-k (handed on
  by the model's forward: the streamed run must carry it);
- ``longcat_flash`` (LongCat-Flash): two MLA sublayers per decoder layer (layer_idx 2 i + j), c_kv
  scaled by mla_scale_kv_lora = sqrt(hidden / kv_lora_rank) after kv_a_layernorm and the query by
  mla_scale_q_lora = sqrt(hidden / q_lora_rank); saved in the checkpoint with transformers' names;
- ``kimi_linear`` (Kimi-Linear): KDA layers 0 and 2, NoPE MLA layers 1 and 3; saved by transformers
  as Moonshot ships it (``q_conv1d`` / ``k_conv1d`` / ``v_conv1d``, ``block_sparse_moe.experts.N.w1``
  ..., which transformers' conversion table merges on load).

Each is dumped by ``python -m latentq.dump`` streamed and in memory (the two files equal bit for bit),
and checked against code we did not write or that does not use latentq: c_kv, k_pe, q_nope and q_pe
recomputed by hand (float64) from the float32 model's weights and the attention's input hidden states
(taken by a plain forward pre-hook on the model that transformers' from_pretrained loads), within 1e-5
relative; attn_out against dump_checks' loop-based absorbed recomputation, within 1e-5 relative.
"""

import math
import os
import subprocess

import h5py
import numpy as np
import pytest
import torch

from dump_checks import check_schema, checkpoint_layout, reference_attn_out, rel
from latentq import dump as dump_latents
from latentq.capture import LatentCapture
from latentq.inject import LatentInjector
from replicas import KINDS, LAYERS, build

SEQ_LEN, NUM_SEQS, Q_ROWS = 24, 2, 8


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("mla-variants")
    torch.set_num_threads(1)
    paths = {}
    for kind in KINDS:
        d = str(root / kind)
        build(kind).save_pretrained(d, max_shard_size="200KB")
        paths[kind] = d
    text = root / "text.txt"
    text.write_bytes(bytes(np.random.default_rng(5).integers(0, 256, SEQ_LEN * NUM_SEQS + 5, dtype=np.uint8)))
    return paths, str(text)


def _dump(checkpoints, tmp_path, kind, stream):
    paths, text = checkpoints
    out = str(tmp_path / f"{kind}-{stream}.h5")
    argv = ["--model", paths[kind], "--text", text, "--seq-len", str(SEQ_LEN), "--num-seqs", str(NUM_SEQS)]
    argv += ["--q-rows", str(Q_ROWS), "--out", out, "--threads", "1", "--stream", stream, "--quiet"]
    assert dump_latents.main(argv) == 0, argv
    return out


# ---- the reference: the model's math by hand, float64 ---------------------------------------------


def _rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rope_interleave(x, pos, theta):
    """transformers' apply_rotary_pos_emb_interleave by hand: pairs (2i, 2i+1) rotated by pos * theta^(-2i/d),
    the output laid out as [first of each pair..., second of each pair...]. x [T, ..., d], pos [T]."""
    d = x.shape[-1]
    ang = pos.double()[:, None] * theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [T, d/2]
    ang = ang.view(ang.shape[0], *([1] * (x.dim() - 2)), ang.shape[1])
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.cat([a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin()], dim=-1)


def hand_latents(kind: str, attn, x: torch.Tensor, pos: torch.Tensor, cfg) -> dict:
    """c_kv [T, r], k_pe [T, d_r], q_nope [T, H, d_n], q_pe [T, H, d_r] of one MLA module from its input
    hidden states x [T, hidden] (float64), as the family's modeling code computes them: LongCat-Flash's
    scales from the config's dims (sqrt(hidden / rank)), Kimi-Linear without RoPE."""
    W = lambda m: m.weight.detach().double()  # noqa: E731
    r, dr, dn, H = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.num_attention_heads
    kv = x @ W(attn.kv_a_proj_with_mqa).T
    c = _rms(kv[:, :r], W(attn.kv_a_layernorm), attn.kv_a_layernorm.variance_epsilon)
    k_rot = kv[:, r:]
    if cfg.q_lora_rank is None:
        q = x @ W(attn.q_proj).T
    else:
        q = (
            _rms(x @ W(attn.q_a_proj).T, W(attn.q_a_layernorm), attn.q_a_layernorm.variance_epsilon)
            @ W(attn.q_b_proj).T
        )
    q = q.view(-1, H, dn + dr)
    q_nope, q_rot = q[..., :dn], q[..., dn:]
    if kind == "longcat_flash":
        c = c * math.sqrt(cfg.hidden_size / cfg.kv_lora_rank)
        q_nope, q_rot = (
            q_nope * math.sqrt(cfg.hidden_size / cfg.q_lora_rank),
            q_rot * math.sqrt(cfg.hidden_size / cfg.q_lora_rank),
        )
    if kind != "kimi_linear":
        theta = float(cfg.rope_parameters["rope_theta"])
        k_rot, q_rot = _rope_interleave(k_rot, pos, theta), _rope_interleave(q_rot, pos, theta)
    return {"c_kv": c, "k_pe": k_rot, "q_nope": q_nope, "q_pe": q_rot}


def reference(model, kind: str, tokens: np.ndarray, offsets: np.ndarray) -> dict:
    """{layer: hand_latents over all tokens (sequences concatenated)} of the model run on each sequence;
    the attention's input hidden states taken by plain forward pre-hooks (no latentq)."""
    mods = {i: model.get_submodule(n) for i, n in LAYERS[kind].items()}
    seen = {}
    hooks = [
        m.register_forward_pre_hook(
            lambda mod, args, kwargs, i=i: seen.__setitem__(i, (args[0] if args else kwargs["hidden_states"])[0]),
            with_kwargs=True,
        )
        for i, m in mods.items()
    ]
    out = {i: [] for i in mods}
    try:
        with torch.no_grad():
            for s in range(len(offsets) - 1):
                ids = torch.as_tensor(tokens[offsets[s] : offsets[s + 1]], dtype=torch.long)[None]
                model(ids, use_cache=False)
                pos = torch.arange(ids.shape[1])
                for i, m in mods.items():
                    out[i].append(hand_latents(kind, m, seen[i].double(), pos, model.config))
    finally:
        for h in hooks:
            h.remove()
    return {i: {k: torch.cat([p[k] for p in parts]) for k in parts[0]} for i, parts in out.items()}


# ---- the tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_checkpoint_is_sharded_across_a_layer(checkpoints, kind):
    """save_pretrained's shards: a decoder layer split across two, a few hundred KB in all; Kimi-Linear's
    as Moonshot names its tensors (transformers reverts its conversions on save)."""
    paths, _ = checkpoints
    wm, layers = checkpoint_layout(paths[kind])
    assert len(set(wm.values())) >= 2 and any(len(v) >= 2 for v in layers.values()), layers
    size = sum(os.path.getsize(os.path.join(paths[kind], fn)) for fn in set(wm.values()))
    assert size < 2 << 20, size
    if kind == "kimi_linear":
        assert "model.layers.0.self_attn.q_conv1d.weight" in wm and "model.layers.0.self_attn.conv1d.weight" not in wm
        assert "model.layers.1.block_sparse_moe.experts.0.w1.weight" in wm


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_dump_matches_the_model(checkpoints, tmp_path, kind, capsys):
    """The streamed and the in-memory dump are equal bit for bit (datasets and layer attributes), hold
    the family's MLA layers under their layer_idx with their module path, and match the model: c_kv,
    k_pe, q_nope, q_pe within 1e-5 relative of the hand recomputation, attn_out within 1e-5 of the
    absorbed recomputation from the dumped tensors."""
    from transformers import AutoModelForCausalLM

    paths, _ = checkpoints
    on, off = _dump(checkpoints, tmp_path, kind, "on"), _dump(checkpoints, tmp_path, kind, "off")
    ids = sorted(LAYERS[kind])
    layout = "none" if kind == "kimi_linear" else "half"
    chk = check_schema(off, layer_ids=ids, rope_layouts=(layout,))
    A = chk["attrs"]
    assert A["num_layers"] == len(ids) and A["rope_layout"] == layout
    with h5py.File(on, "r") as a, h5py.File(off, "r") as b:
        assert sorted(a["layers"]) == sorted(b["layers"]) == [f"{i:03d}" for i in ids]
        for n in b["layers"]:
            ga, gb = a["layers"][n], b["layers"][n]
            assert dict(ga.attrs) == dict(gb.attrs), n
            for k in gb:
                np.testing.assert_array_equal(ga[k][()], gb[k][()], err_msg=f"{kind} {n} {k}")
        attrs = {int(n): dict(b["layers"][n].attrs) for n in b["layers"]}
    model = AutoModelForCausalLM.from_pretrained(paths[kind], dtype=torch.float32, attn_implementation="eager").eval()
    ref = reference(model, kind, chk["root"]["tokens"], chk["root"]["seq_offsets"])
    s_kv = math.sqrt(64 / 32) if kind == "longcat_flash" else 1.0
    s_q = math.sqrt(64 / 48) if kind == "longcat_flash" else 1.0
    worst = {}
    for i, d in chk["layers"].items():
        assert attrs[i]["module"] == LAYERS[kind][i]
        assert attrs[i]["c_kv_scale"] == s_kv and attrs[i]["q_scale"] == s_q
        rows = d["q_rows"].astype(np.int64)
        for k in ("c_kv", "k_pe", "q_nope", "q_pe"):
            want = ref[i][k] if k in ("c_kv", "k_pe") else ref[i][k][rows]
            worst[k] = max(worst.get(k, 0.0), rel(d[k], want.numpy()))
        worst["attn_out"] = max(
            worst.get("attn_out", 0.0),
            rel(reference_attn_out(d, chk["root"]["seq_offsets"], A["softmax_scale"]), d["attn_out"]),
        )
    with capsys.disabled():
        print(
            f"\n{kind}: max relative error vs the hand recomputation: "
            + ", ".join(f"{k} {v:.2g}" for k, v in worst.items())
        )
    assert all(v <= 1e-5 for v in worst.values()), (kind, worst)
    if kind == "longcat_flash":  # the dumped c_kv is the scaled latent: unscaled it would be off by sqrt(2)
        assert rel(chk["layers"][0]["c_kv"] / s_kv, ref[0]["c_kv"].numpy()) > 0.1


def test_cpp_reader_takes_non_contiguous_nope_layers(checkpoints, tmp_path):
    """``latentq inspect`` (the C++ reader, study/io/dump.cpp) reads the streamed Kimi-Linear dump: its
    layers 1 and 3 (sorted groups counted against num_layers), rope_layout "none"."""
    lq = os.environ.get("LATENTQ_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "latentq"))
    assert os.path.isfile(lq), f"the latentq CLI is not built ({lq}; set LATENTQ_BIN or build build/latentq)"
    r = subprocess.run(
        [lq, "inspect", _dump(checkpoints, tmp_path, "kimi_linear", "on")], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "layers          2 [1, 3]" in r.stdout and "rope_layout     none" in r.stdout, r.stdout


@pytest.mark.parametrize("kind", ["deepseek_v32", "glm_moe_dsa"])
def test_sparse_dsa_capture_is_the_attentions(kind):
    """index_topk 4 < the window: the capture still takes the attention's own tensors, not the indexer's
    (c_kv, k_pe, q_pe equal the hand recomputation), while the dense absorbed recomputation no longer
    equals the model's attention output: each query reads only its indexer's top 4 keys."""
    model = build(kind, seed=3, index_topk=4)
    ids = torch.randint(0, 320, (SEQ_LEN,), generator=torch.Generator().manual_seed(9)).numpy()
    ref = reference(model, kind, ids, np.array([0, SEQ_LEN]))
    with torch.no_grad(), LatentCapture(model) as cap:
        model(torch.as_tensor(ids)[None], use_cache=False)
    for i, rec in cap.layers.items():
        assert rec["rope_function"] == ("apply_rotary_pos_emb_interleave") and rec["rope_layout"] == "half"
        for k in ("c_kv", "k_pe", "q_nope", "q_pe"):
            assert rel(rec[k][0], ref[i][k].numpy()) <= 1e-5, (kind, i, k)
        w = model.get_submodule(LAYERS[kind][i]).kv_b_proj.weight.detach().view(4, 64, 32)
        dense = dump_latents.absorbed_attention(
            rec["c_kv"][0], rec["k_pe"][0], rec["q_nope"][0], rec["q_pe"][0], w[:, :32], w[:, 32:],
            np.arange(SEQ_LEN), np.array([0, SEQ_LEN]), rec["softmax_scale"],
        )  # fmt: skip
        assert rel(dense, rec["attn_out"][0]) > 1e-2, (kind, i)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def test_longcat_injection_replaces_the_scaled_latent():
    """LatentInjector on LongCat-Flash: the inject callback sees the scaled c_kv (kv_a_layernorm's output
    times mla_scale_kv_lora, taken by a plain hook); returning it unchanged leaves the logits bit for bit;
    returning zeros, or twice the latent, for layer 2 gives the logits of a forward whose kv_a_layernorm
    output of that layer is replaced by zeros / doubled by a plain hook (0 · s = 0 and (2x) · s = 2 (x s)
    exactly); a k_pe replacement acts on the post-RoPE key."""
    model = build("longcat_flash", seed=4)
    ids = torch.randint(0, 320, (1, SEQ_LEN), generator=torch.Generator().manual_seed(10))
    base = _logits(model, ids)
    attn = model.get_submodule(LAYERS["longcat_flash"][2])
    s = attn.mla_scale_kv_lora
    normed = {}
    h = attn.kv_a_layernorm.register_forward_hook(lambda m, a, o: normed.__setitem__("x", o.detach().clone()))
    seen = {}

    def ident(i, name, t):
        seen[(i, name)] = t.detach().clone()
        return t

    with LatentInjector(model, ident):
        same = _logits(model, ids)
    h.remove()
    assert torch.equal(same, base)
    assert torch.equal(seen[(2, "c_kv")], normed["x"] * s) and sorted({i for i, _ in seen}) == [0, 1, 2, 3]
    assert attn.mla_scale_kv_lora == s  # restored on exit
    for fn, plain in (
        (lambda t: torch.zeros_like(t), lambda o: torch.zeros_like(o)),
        (lambda t: t * 2, lambda o: o * 2),
    ):
        with LatentInjector(model, lambda i, name, t, fn=fn: fn(t) if (i, name) == (2, "c_kv") else t):
            got = _logits(model, ids)
        h = attn.kv_a_layernorm.register_forward_hook(lambda m, a, o, plain=plain: plain(o))
        want = _logits(model, ids)
        h.remove()
        assert torch.equal(got, want) and not torch.equal(got, base)
    with LatentInjector(model, lambda i, name, t: torch.zeros_like(t) if (i, name) == (1, "k_pe") else t):
        no_kpe = _logits(model, ids)
    assert not torch.equal(no_kpe, base)


def test_kimi_nope_injection_replaces_the_unrotated_key():
    """Kimi-Linear's NoPE layers: k_pe is the last qk_rope_head_dim columns of kv_a_proj_with_mqa's output;
    injecting twice it for layer 3 equals a plain hook that doubles those columns, bit for bit; identity
    leaves the logits unchanged; the KDA layers are not touched (only layers 1 and 3 are seen)."""
    model = build("kimi_linear", seed=5)
    ids = torch.randint(0, 320, (1, SEQ_LEN), generator=torch.Generator().manual_seed(11))
    base = _logits(model, ids)
    seen = set()
    with LatentInjector(model, lambda i, name, t: seen.add((i, name)) or t):
        assert torch.equal(_logits(model, ids), base)
    assert seen == {(1, "c_kv"), (1, "k_pe"), (3, "c_kv"), (3, "k_pe")}
    with LatentInjector(model, lambda i, name, t: t * 2 if (i, name) == (3, "k_pe") else t):
        got = _logits(model, ids)
    kv_a = model.get_submodule(LAYERS["kimi_linear"][3]).kv_a_proj_with_mqa
    h = kv_a.register_forward_hook(lambda m, a, o: torch.cat([o[..., :-16], o[..., -16:] * 2], dim=-1))
    want = _logits(model, ids)
    h.remove()
    assert torch.equal(got, want) and not torch.equal(got, base)


@pytest.mark.parametrize("kind", ["longcat_flash", "kimi_linear", "glm_moe_dsa", "deepseek_v32-sparse"])
def test_decode_order_attention_on_the_variants(kind):
    """DecodeOrderAttention (the e2e step's attention from the captured latents) with both reads of the
    cache exact: the model's logits within 1e-5 relative (LongCat-Flash: the scaled c_kv and q; Kimi-Linear:
    the unrotated k_pe / q_pe; GLM-5: its indexer's RoPE and SDPA calls left alone; DeepSeek-V3.2 with
    index_topk 5 of 24: the attention reads only the selected keys, as the model's); a cache whose c_kv
    is zero at every key changes them."""
    from latentq.inject import DecodeOrderAttention

    sparse = kind.endswith("-sparse")
    kind = kind.removesuffix("-sparse")
    model = build(kind, seed=6, **({"index_topk": 5} if sparse else {}))
    ids = torch.randint(0, 320, (1, SEQ_LEN), generator=torch.Generator().manual_seed(12))
    base = _logits(model, ids)
    read = torch.ones(SEQ_LEN, SEQ_LEN, dtype=torch.bool)
    layers = set()

    def exact(i, c, k):
        layers.add(i)
        return c, c, read, k, k, read

    with DecodeOrderAttention(model, exact):
        got = _logits(model, ids)
    assert layers == set(LAYERS[kind]) and rel(got, base) <= 1e-5, (kind, rel(got, base))
    with DecodeOrderAttention(model, lambda i, c, k: (c * 0, c * 0, read, k, k, read)):
        assert rel(_logits(model, ids), base) > 1e-3


@pytest.mark.parametrize("kind", ["deepseek_v32", "glm_moe_dsa"])
def test_sparse_dsa_dump(tmp_path, kind, capsys):
    """index_topk 5 < the window (24): python -m latentq.dump in memory and streamed (bit for bit the same) writes
    each layer's selection (topk_offsets, topk_keys; cache_family sparse_mla) and passes its own sparse check;
    the loop recomputation of dump_checks over the dumped keys equals attn_out; the selection of every full DSA
    layer has min(t + 1, 5) keys per row (t: the row's position); GLM-5's shared layer 1 holds layer 0's; the C++
    reader's attention check (`latentq run`: the absorbed attention over those keys vs attn_out) is < 1e-5."""
    d = str(tmp_path / kind)
    build(kind, seed=4, index_topk=5).save_pretrained(d, max_shard_size="200KB")
    text = tmp_path / "text.txt"
    text.write_bytes(bytes(np.random.default_rng(6).integers(0, 256, SEQ_LEN * NUM_SEQS + 5, dtype=np.uint8)))
    files = _dump(({kind: d}, str(text)), tmp_path, kind, "on"), _dump(({kind: d}, str(text)), tmp_path, kind, "off")
    dumps = [check_schema(f, layer_ids=sorted(LAYERS[kind]), rope_layouts=("half",)) for f in files]
    with h5py.File(files[0], "r") as a, h5py.File(files[1], "r") as b:
        assert a.attrs["cache_family"] == b.attrs["cache_family"] == "sparse_mla"
        for n in a["layers"]:
            for k in a["layers"][n]:
                np.testing.assert_array_equal(a["layers"][n][k][()], b["layers"][n][k][()], err_msg=f"{n}/{k}")
    chk = dumps[0]
    offs = chk["root"]["seq_offsets"]
    worst = 0.0
    for i, L in chk["layers"].items():
        counts = np.diff(L["topk_offsets"])
        pos = L["q_rows"] - offs[np.searchsorted(offs, L["q_rows"], side="right") - 1]
        np.testing.assert_array_equal(counts, np.minimum(pos + 1, 5), err_msg=f"layer {i}")
        worst = max(worst, rel(reference_attn_out(L, offs, chk["attrs"]["softmax_scale"]), L["attn_out"]))
    if kind == "glm_moe_dsa":  # layer 1 is "shared": it read layer 0's selection, and has no indexer cache
        np.testing.assert_array_equal(chk["layers"][1]["topk_keys"], chk["layers"][0]["topk_keys"])
        assert chk["layers"][1]["index_source"] == 0 and "index_k" not in chk["layers"][1]
    # the indexer's cache and queries: latentq.sparse_mla's selection from them is the dumped one
    from latentq.sparse_mla import index_scores, same_up_to_ties, select_topk

    for i, L in chk["layers"].items():
        if "index_k" not in L:
            continue
        assert L["index_source"] == i and L["index_k"].shape == (len(chk["root"]["tokens"]), 32)
        for s in range(len(offs) - 1):
            rows = np.flatnonzero((L["q_rows"] >= offs[s]) & (L["q_rows"] < offs[s + 1]))
            local = L["q_rows"][rows] - offs[s]
            sc = index_scores(L["index_q"][rows], L["index_w"][rows], L["index_k"][offs[s] : offs[s + 1]], local,
                              [0, offs[s + 1] - offs[s]], L["index_softmax_scale"])  # fmt: skip
            dumped = torch.zeros(sc.shape, dtype=torch.bool)
            for a, q in enumerate(rows):
                dumped[a, L["topk_keys"][L["topk_offsets"][q] : L["topk_offsets"][q + 1]]] = True
            assert same_up_to_ties(sc, dumped, select_topk(sc, L["index_topk"]), rtol=1e-6), (i, s)
    with capsys.disabled():
        print(f"\n{kind} sparse (top-5 of 24): loop recomputation over the dumped keys vs attn_out {worst:.2g}")
    assert worst <= 1e-5, (kind, worst)
    lq = os.environ.get("LATENTQ_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "latentq"))
    cfg = tmp_path / "att.toml"
    cfg.write_text('[quantizers]\nbits = [8]\nschemes = ["sym"]\ngranularities = ["token"]\nextra = []\n'
                   "[svd]\nenabled = false\n[cross_layer]\nenabled = false\n[e2e]\nenabled = false\n"
                   '[indexer]\nlatent = ["exact", "int8-sym-token"]\n')  # fmt: skip
    out = tmp_path / "r.h5"
    r = subprocess.run([lq, "run", str(cfg), "--input", files[0], "--out", str(out), "--threads", "1"],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with h5py.File(out, "r") as f:
        rel_fro = f["attention_check/ref_vs_dump_rel_fro"][()]
        ix = {k: f["indexer_error"][k][()] for k in f["indexer_error"]}
        ae = {k: f["attention_error"][k][()] for k in f["attention_error"]}
        le = {k: f["latent_error"][k][()] for k in f["latent_error"]}
        summary_q = [v.decode() for v in f["summary/quantizer"][()]]
    assert len(rel_fro) == len(chk["layers"]) and np.all(rel_fro < 1e-5), rel_fro
    # /indexer_error: per layer with its own indexer and format, topk_recall as latentq.sparse_mla recomputes it
    # from index_k quantized by the same format (latentq._core); bf16 keeps (nearly) every key
    import latentq._core as core
    from latentq.sparse_mla import index_scores, select_topk, topk_recall

    own = [i for i, L in chk["layers"].items() if "index_k" in L]
    text = lambda col: [v.decode() if isinstance(v, bytes) else v for v in col]  # noqa: E731
    quantizers, latents = text(ix["quantizer"]), text(ix["latent"])
    # 4 index_k formats ([indexer]'s defaults: bf16, the engines' FP8 and MXFP4 caches, OCP mxfp4) x 2 latent
    # formats per layer with its own indexer
    assert list(dict.fromkeys(quantizers)) == ["bf16", "fp8-e4m3-tile128-pow2-amaxfloor", "mxfp4-ceil", "mxfp4"], (
        quantizers
    )
    assert sorted(set(ix["layer"].tolist())) == own and len(quantizers) == 8 * len(own), quantizers
    assert latents == ["exact", "int8-sym-token"] * (4 * len(own)), latents
    # the latent's error alone (the model's selection) is the attention probe's c_kv+k_pe row of that format (float32
    # engine there, float64 here); exact latents: the selection's error alone; bytes from the one accounting
    ae_q, ae_t = text(ae["quantizer"]), text(ae["targets"])
    for i, (layer, lat) in enumerate(zip(ix["layer"], latents)):
        if lat == "exact":
            assert ix["kl_latent"][i] == 0 and ix["kl_mean"][i] == ix["kl_selection"][i], i
            assert ix["latent_bytes_per_token"][i] == 2 * (
                chk["attrs"]["kv_lora_rank"] + chk["attrs"]["qk_rope_head_dim"]
            ), i
            continue
        j = next(k for k in range(len(ae_q)) if ae["layer"][k] == layer and ae_q[k] == lat and ae_t[k] == "c_kv+k_pe")
        # 1e-2: the float32 engine's KL near 1e-5 carries ~1e-3 of rounding (1.5e-3 seen on GLM-5's layer 0)
        assert abs(ix["kl_latent"][i] - ae["kl_mean"][j]) <= 1e-2 * ae["kl_mean"][j] + 1e-9, (i, ix["kl_latent"][i])
        assert ix["latent_bytes_per_token"][i] == ae["bytes_per_token_layer"][j], i
        assert ix["kl_latent"][i] > 0 and ix["kl_selection"][i] == ix["kl_selection"][i - 1], i

    def recall_of(L, kq):  # topk_recall of the selection recomputed from the index keys kq (latentq.sparse_mla)
        got = []
        for s in range(len(offs) - 1):
            rows = np.flatnonzero((L["q_rows"] >= offs[s]) & (L["q_rows"] < offs[s + 1]))
            local, span = L["q_rows"][rows] - offs[s], [0, offs[s + 1] - offs[s]]
            sc = index_scores(L["index_q"][rows], L["index_w"][rows], kq[offs[s] : offs[s + 1]], local, span,
                              L["index_softmax_scale"])  # fmt: skip
            mine = select_topk(sc, L["index_topk"])
            ref = np.zeros(mine.shape, dtype=bool)
            for a, r in enumerate(rows):
                ref[a, L["topk_keys"][L["topk_offsets"][r] : L["topk_offsets"][r + 1]]] = True
            got.append(topk_recall(torch.as_tensor(ref), mine) * len(rows))
        return sum(got) / len(L["q_rows"])

    for i, (layer, q, recall, kl) in enumerate(zip(ix["layer"], quantizers, ix["topk_recall"], ix["kl_selection"])):
        L = chk["layers"][int(layer)]
        kq = core.quantize_dequantize(L["index_k"], q, "index_k", [int(x) for x in offs])
        rf = np.linalg.norm(kq.astype(np.float64) - L["index_k"]) / np.linalg.norm(L["index_k"].astype(np.float64))
        got_rf = ix["index_rel_fro"][i]
        assert abs(got_rf - rf) <= 1e-9 * max(rf, 1e-30) + 1e-15, (layer, q, got_rf, rf)
        assert (q == "bf16") == (rf < 4e-3), (layer, q, rf)  # bf16: 8 mantissa bits, the others coarser
        assert abs(recall_of(L, kq) - recall) < 1e-6, (layer, q, recall_of(L, kq), recall)
        assert (recall == 1.0) == (kl < 1e-12) or q != "bf16", (layer, q, recall, kl)
    # /attention_error: every row reads the model's selection (topk_recall 1) but c_kv+k_pe+index_k's, one per
    # layer with its own indexer and quantizer: the recall of the selection from index_k in the quantizer's format,
    # its bytes those of the c_kv+k_pe row plus the indexer cache's
    with_ix = [k for k in range(len(ae_q)) if ae_t[k] == "c_kv+k_pe+index_k"]
    assert sorted(int(ae["layer"][k]) for k in with_ix) == own, with_ix
    for k in range(len(ae_q)):
        if ae_t[k] != "c_kv+k_pe+index_k":
            assert ae["topk_recall"][k] == 1.0, k
            continue
        L = chk["layers"][int(ae["layer"][k])]
        kq = core.quantize_dequantize(L["index_k"], ae_q[k], "index_k", [int(x) for x in offs])
        assert abs(recall_of(L, kq) - ae["topk_recall"][k]) < 1e-6, (k, recall_of(L, kq), ae["topk_recall"][k])
        j = next(i for i in range(len(ae_q)) if ae["layer"][i] == ae["layer"][k] and ae_q[i] == ae_q[k]
                 and ae_t[i] == "c_kv+k_pe")  # fmt: skip
        assert ae["bytes_per_token_layer"][k] > ae["bytes_per_token_layer"][j], k
    bf16 = [r for q, r in zip(quantizers, ix["topk_recall"]) if q == "bf16"]
    assert min(bf16) >= 0.95, bf16
    # /latent_error: an index_k row per (layer with its own indexer, [indexer] format), none on GLM-5's shared layer;
    # its rel_fro and bytes are /indexer_error's (one quantize, one accounting); /summary counts c_kv + k_pe only
    le_t, le_q = text(le["target"]), text(le["quantizer"])
    rows = [k for k in range(len(le_t)) if le_t[k] == "index_k"]
    assert [(int(le["layer"][k]), le_q[k]) for k in rows] == [
        (i, q)
        for i in own
        for q in dict.fromkeys(quantizers)  # [indexer]'s formats, in /indexer_error's order
    ], [(int(le["layer"][k]), le_q[k]) for k in rows]
    for k in rows:
        i = next(j for j in range(len(quantizers)) if ix["layer"][j] == le["layer"][k] and quantizers[j] == le_q[k])
        assert le["rel_fro"][k] == ix["index_rel_fro"][i], (k, le["rel_fro"][k], ix["index_rel_fro"][i])
        assert le["bytes_per_token_layer"][k] == ix["index_bytes_per_token"][i], k
    assert summary_q == ["int8-sym-token"], summary_q


@pytest.mark.parametrize("kind", ["deepseek_v32", "glm_moe_dsa"])
def test_indexer_key_injection_changes_the_selection_as_recomputed(kind):
    """The DSA indexer's key cache injected (LatentInjector, name "index_k"; index_topk 5 of 32): an identity fn
    that still writes the key back leaves the logits bit for bit; int2-sym-token-g32 on index_k puts exactly the
    quantized key into the indexer (the first layer's captured index_k equals latentq.quantize_dequantize of the
    exact one, its c_kv / k_pe unchanged), each row of every layer then reads the causal top-5 of the index
    scores over that key (latentq.sparse_mla, up to ties), which differs from the exact selection on some row."""
    import latentq._core as core
    from latentq.e2e import make_inject
    from latentq.sparse_mla import index_scores, same_up_to_ties, select_topk

    model = build(kind, seed=6, index_topk=5)
    ids = torch.randint(0, 320, (1, SEQ_LEN), generator=torch.Generator().manual_seed(11))
    with torch.no_grad(), LatentCapture(model) as cap:
        ref = model(ids, use_cache=False).logits
    clone = lambda layer, name, x: x.clone() if name == "index_k" else x  # noqa: E731
    with torch.no_grad(), LatentInjector(model, clone):
        same = model(ids, use_cache=False).logits
    assert torch.equal(same, ref), kind
    fn = make_inject(core, "int2-sym-token-g32", ("index_k",))
    with torch.no_grad(), LatentInjector(model, fn, capture=True) as inj:
        out = model(ids, use_cache=False).logits
    assert not torch.equal(out, ref), kind
    changed = 0
    rows, offs = np.arange(SEQ_LEN), [0, SEQ_LEN]
    first = min(inj.layers)  # the later layers' inputs differ: the first layer's selection changed
    for i, rec in inj.layers.items():
        exact = cap.layers[i]
        if i == first:
            assert torch.equal(rec["c_kv"], exact["c_kv"]) and torch.equal(rec["k_pe"], exact["k_pe"]), kind
            want = core.quantize_dequantize(exact["index_k"][0].numpy(), "int2-sym-token-g32", "c_kv", offs)
            assert np.array_equal(rec["index_k"][0].numpy(), want), (kind, i)
        if "index_k" not in exact:  # GLM-5's shared layer: no indexer of its own
            continue
        sc = index_scores(rec["index_q"][0], rec["index_w"][0], rec["index_k"][0], rows, offs,
                          model.get_submodule(LAYERS[kind][i]).indexer.softmax_scale)  # fmt: skip
        assert same_up_to_ties(sc, rec["visible"][0], select_topk(sc, 5), rtol=1e-6), (kind, i)
        changed += int((rec["visible"][0] != exact["visible"][0]).any(dim=1).sum())
    assert changed > 0, kind
