"""The e2e step on DeepSeek-V4 (latentq.e2e_v4, latentq.inject_v4) on the tiny random-init V4 of test_dump_v4 (a
sliding, a CSA and an HCA layer; 2 sequences of 40 tokens, CSA: 10 entries, top-3; HCA: 5 entries): exact when
nothing is quantized, a quantized window equals the model run with the window replaced by an independent hook, a
quantized index_k changes the CSA selection to the top-k of the quantized keys, decode order equals prefill order
where it must and differs where it must, presets split at the rope slice, the bytes as the V4 plan defines them,
and the CLI writes /e2e, /e2e_seq, /e2e_position with the caches named."""

import dataclasses
import json
import sys

import h5py
import numpy as np
import pytest
import torch
import transformers

import latentq
import latentq._core  # noqa: F401  (the compiled module: its absence is an error)
from latentq import e2e, e2e_v4
from latentq.deepseek_v4 import (
    V4Capture,
    find_v4_layers,
    index_scores_v4,
    indexer_selection,
    recompute_attention,
    rel_error,
)
from latentq.e2e_stats import token_stats
from latentq.inject_v4 import V4CacheInjector, entry_read, stacked_reads
from latentq.model import run_model
from latentq.sparse_mla import same_up_to_ties, select_topk
from test_deepseek_v4 import CONFIG
from test_dump_v4 import TEXT, make_model

T, B, ROPE, TOPK, CSA_RATE = 40, 2, 8, 3, 4
ALL = {"window_kv": "int4-sym-token", "compressed_kv": "int4-sym-token", "index_k": "int4-sym-token"}
PREFILL = "prefill-at-once"
ENTRY = ("window_kv", "compressed_kv")


def ids_of(seed: int = 0, n: int = B) -> torch.Tensor:
    return torch.randint(0, 128, (n, T), generator=torch.Generator().manual_seed(seed))


def fns(model, assignment, mode=PREFILL, layers=None):
    rope = {d["layer"]: d["d_rope"] for d in e2e_v4.layer_info(model)}
    return e2e_v4.make_fns(latentq, assignment, mode, layers, rope)


def run(model, ids, assignment=None, mode=PREFILL, record=False):
    """Logits [B, T, V] float32 of the model with `assignment`'s caches quantized (None: its own), and the CSA
    selection {layer: [B, T, k]} when record."""
    with torch.no_grad():
        if assignment is None:
            return run_model(model, ids).float(), None
        with V4CacheInjector(model, **fns(model, assignment, mode), record=record) as inj:
            return run_model(model, ids).float(), inj.selected


def kl(ref, q, ids) -> float:
    return float(token_stats(ref, q, ids).kl.mean())


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def model_bf16():
    return make_model().to(torch.bfloat16)


def test_dims(model):
    info = e2e_v4.layer_info(model)
    assert [(d["rate"], d["csa"], d["D"], d["d_rope"], d["index_dim"], d["window"]) for d in info] == [
        (0, False, 32, ROPE, 16, 8),
        (CSA_RATE, True, 32, ROPE, 16, 8),
        (8, False, 32, ROPE, 16, 8),
    ]


def test_bf16_model_exact(model_bf16):
    """In a bfloat16 model every cache is bf16 already: bf16 on all three caches, and decode order with an open
    window of the whole sequence (every row read in bf16), give the model's logits bit for bit (KL 0 exactly); a
    quantized window does not."""
    ids = ids_of()
    ref, _ = run(model_bf16, ids)
    bf16 = dict.fromkeys(ALL, "bf16")
    same, _ = run(model_bf16, ids, bf16)
    opened, _ = run(model_bf16, ids, ALL, f"decode-r{T}-s0-p0")
    quant, _ = run(model_bf16, ids, {"window_kv": "int4-sym-token"})
    k = [kl(ref, x, ids) for x in (same, opened, quant)]
    print(f"bf16 model: KL bf16 {k[0]}, decode-r{T} {k[1]}, int4 {k[2]:.3e}")
    assert torch.equal(same, ref) and torch.equal(opened, ref)
    assert kl(ref, same, ids) == 0.0 and kl(ref, quant, ids) > 1e-6


def test_window_kv_equals_independent_hook(model):
    """int4-sym-token on window_kv: the logits equal, bit for bit, those of the model whose RoPE output on the
    kv_norm output (the window entries, post-RoPE) is replaced by the module's quantize-dequantize through this
    test's own patch of the modeling module's apply_rotary_pos_emb; and they move (KL > 0)."""
    ids, spec = ids_of(1), "int4-sym-token"
    ref, _ = run(model, ids)
    mine, _ = run(model, ids, {"window_kv": spec})
    pymod = sys.modules[type(find_v4_layers(model)[0]).__module__]
    orig, latest, replaced = pymod.apply_rotary_pos_emb, [None], []  # the last kv_norm output's storage

    def rope(x, cos, sin, *args, **kwargs):
        y = orig(x, cos, sin, *args, **kwargs)
        if x.data_ptr() != latest[0]:  # the next RoPE call after kv_norm is the layer's on its output
            return y
        latest[0] = None
        replaced.append(y.shape)
        b, _, t, d = y.shape  # [B, 1, T, D]
        flat = y.detach().reshape(b * t, d).contiguous().numpy()
        qd = latentq.quantize_dequantize(flat, spec, "c_kv", [i * t for i in range(b + 1)])
        return torch.from_numpy(qd).reshape(y.shape).to(y.dtype)

    def kv_norm_hook(mod, args, out):
        latest[0] = out.data_ptr()

    handles = [a.kv_norm.register_forward_hook(kv_norm_hook) for a in find_v4_layers(model)]
    pymod.apply_rotary_pos_emb = rope
    try:
        with torch.no_grad():
            theirs = run_model(model, ids).float()
    finally:
        pymod.apply_rotary_pos_emb = orig
        for h in handles:
            h.remove()
    print(f"window_kv {spec}: KL {kl(ref, mine, ids):.4e}, max |Δlogit| to the own hook {(mine - theirs).abs().max()}")
    assert replaced == [(B, 1, T, 32)] * 3 and torch.equal(mine, theirs) and kl(ref, mine, ids) > 1e-6


def test_index_k_changes_the_selection(model):
    """int2-sym-token on index_k (one sequence, V4Capture inside the injection): the keys the scorer reads are the
    quantize-dequantize of the model's own, the selection is the top-3 of the scores recomputed from them (up to
    ties) and differs from the unquantized model's on some rows; window and compressed entries are the model's."""
    ids, spec = ids_of(2, 1), "int2-sym-token"
    with torch.no_grad(), V4Capture(model) as cap:
        run_model(model, ids)
    ref = cap.records[1]
    with torch.no_grad(), V4CacheInjector(model, **fns(model, {"index_k": spec}), record=True) as inj:
        with V4Capture(model) as cap:
            run_model(model, ids)
    got = cap.records[1]
    want = latentq.quantize_dequantize(ref.index_k.numpy(), spec, "c_kv", [0, ref.index_k.shape[0]])
    assert np.array_equal(got.index_k.numpy(), want) and torch.equal(got.window_kv, ref.window_kv)
    assert torch.equal(inj.selected[1][0], got.index_selected)
    mine = indexer_selection(got)
    sel = got.index_selected  # [T, k], -1: no entry
    n = mine.shape[1]
    picked = torch.zeros(T, n + 1, dtype=torch.bool).scatter_(1, torch.where(sel < 0, n, sel), True)[:, :n]
    assert same_up_to_ties(index_scores_v4(got), mine, picked)
    changed = int((indexer_selection(ref) != mine).any(1).sum())
    print(f"index_k {spec}: {changed} of {T} rows read other CSA entries")
    assert changed > 0


def test_decode_order_against_prefill(model):
    """Decode order (every cache, float32 model): a causal per-token format with no bf16 rows (decode-r0-s0-p0)
    equals prefill order bit for bit, and so does a whole-axis per-channel scale (int4-sym-channel: a static scale in
    decode order, latentq/decode_order.h); per-channel groups of 8 rows (read quantized only once complete, in bf16
    until then) and an open window of 4 rows in bf16 differ from it; an open window of the whole sequence equals the
    prefill run with bf16 on every cache (the engine-precision read) bit for bit."""
    ids = ids_of(3)
    ref, _ = run(model, ids)
    pre, _ = run(model, ids, ALL)
    r0, _ = run(model, ids, ALL, "decode-r0-s0-p0")
    r4, _ = run(model, ids, ALL, "decode-r4-s0-p0")
    static = dict.fromkeys(ALL, "int4-sym-channel")
    static_pre, _ = run(model, ids, static)
    static_dec, _ = run(model, ids, static, "decode-r0-s0-p0")
    chan = dict.fromkeys(ALL, "int4-sym-channel-g8")
    chan_pre, _ = run(model, ids, chan)
    chan_dec, _ = run(model, ids, chan, "decode-r0-s0-p0")
    opened, _ = run(model, ids, ALL, f"decode-r{T}-s0-p0")
    bf16, _ = run(model, ids, dict.fromkeys(ALL, "bf16"))
    k = {n: kl(ref, x, ids) for n, x in (("pre", pre), ("r4", r4), ("chan_pre", chan_pre), ("chan_dec", chan_dec))}
    print(f"KL by run: { {n: f'{v:.4e}' for n, v in k.items()} }")
    assert torch.equal(r0, pre) and torch.equal(opened, bf16) and torch.equal(static_dec, static_pre)
    assert k["r4"] < k["pre"] and not torch.equal(r4, pre)
    assert not torch.equal(chan_dec, chan_pre) and abs(k["chan_dec"] - k["chan_pre"]) > 1e-9


def reads_per_query(rec, spec: str, mode: str, t: int):
    """The record with the window / compressed entries query t reads in decode order, by the cache model's own rule
    written out: window row j quantized iff decode_order_mask(mode, T, 1)[t, j]; compressed entry w quantized iff the
    entry mask's row n - 1 says so, n = (t + 1) // compress_rate the entries written by t."""

    def two(x):
        q, b = latentq.decode_order_latents(x.numpy(), spec, mode, "c_kv", [0, x.shape[0]])
        return torch.from_numpy(q), torch.from_numpy(b), torch.from_numpy(latentq.decode_order_mask(mode, len(x), 1))

    wq, wb, wm = two(rec.window_kv)
    win = torch.where(wm[t][:, None], wq, wb)
    comp, n = rec.compressed_kv, (t + 1) // rec.compress_rate if rec.compress_rate else 0
    if comp.shape[0]:
        cq, cb, cm = two(comp)
        comp = torch.where(cm[n - 1][:, None], cq, cb) if n >= 1 else cb
    return dataclasses.replace(rec, window_kv=win, compressed_kv=comp)


def test_decode_order_is_per_query_reads(model):
    """decode-r2-s1-p0 with int4-sym-token on window_kv and compressed_kv (one sequence, V4Capture inside): each
    layer's attention output (sliding, CSA, HCA) at every query equals the float64 recomputation from the layer's
    captured q, sinks and selection with the entries that query reads (reads_per_query) to 1e-5, and not the
    recomputation with every entry quantized (prefill order's reads)."""
    spec, mode, ids = "int4-sym-token", "decode-r2-s1-p0", ids_of(4, 1)
    with torch.no_grad(), V4CacheInjector(model, **fns(model, dict.fromkeys(ENTRY, spec), mode)):
        with V4Capture(model) as cap:
            run_model(model, ids)
    for rec in cap.records:
        mine = torch.stack([recompute_attention(reads_per_query(rec, spec, mode, t))[t] for t in range(T)])
        quant = dataclasses.replace(rec, window_kv=reads_per_query(rec, spec, PREFILL, T - 1).window_kv)
        if rec.compress_rate:
            quant.compressed_kv = reads_per_query(rec, spec, PREFILL, T - 1).compressed_kv
        err, other = rel_error(mine, rec.attn_out), rel_error(recompute_attention(quant), rec.attn_out)
        print(f"layer {rec.layer} ({rec.layer_type}): per-query reads rel. error {err:.2e}, all quantized {other:.2e}")
        assert err < 1e-5 and other > 1e-3


def test_decode_order_index_k_per_query(model):
    """decode-r2-s0-p0 with int2-sym-token on index_k (one sequence): the CSA selection of every query is the top-3
    of the scores recomputed with the keys it reads (entry w quantized iff the entry mask's row n - 1 says so), up to
    ties, and differs on some row from the top-3 of all-quantized keys (prefill order's reads)."""
    spec, mode, ids = "int2-sym-token", "decode-r2-s0-p0", ids_of(5, 1)
    with torch.no_grad(), V4CacheInjector(model, **fns(model, {"index_k": spec}, mode), record=True) as inj:
        with V4Capture(model) as cap:
            run_model(model, ids)
    rec = cap.records[1]
    k = rec.index_k.numpy()
    kq, kb = (torch.from_numpy(x) for x in latentq.decode_order_latents(k, spec, mode, "c_kv", [0, len(k)]))
    km = torch.from_numpy(latentq.decode_order_mask(mode, len(k), 1))
    rows, quant = [], dataclasses.replace(rec, index_k=kq)
    for t in range(T):
        n = (t + 1) // CSA_RATE
        keys = torch.where(km[n - 1][:, None], kq, kb) if n >= 1 else kb
        rows.append(index_scores_v4(dataclasses.replace(rec, index_k=keys))[t])
    scores = torch.stack(rows)
    sel = inj.selected[1][0]
    n_e = k.shape[0]
    picked = torch.zeros(T, n_e + 1, dtype=torch.bool).scatter_(1, torch.where(sel < 0, n_e, sel), True)[:, :n_e]
    mine = select_topk(scores, TOPK)
    differ = int((indexer_selection(quant) != picked).any(1).sum())
    print(f"index_k {spec} {mode}: {differ} of {T} rows read other entries than with every key quantized")
    assert same_up_to_ties(scores, mine, picked) and differ > 0


def test_study_layers_only(model):
    """The study's layers: int4-sym-token on compressed_kv of layer 0 only (a sliding layer: no compressed entry)
    leaves the logits bit for bit; window_kv on layer 2 only moves them, less than on every layer."""
    ids = ids_of(7)
    ref, _ = run(model, ids)
    rope = {d["layer"]: d["d_rope"] for d in e2e_v4.layer_info(model)}

    def on(layers, assignment):
        with torch.no_grad(), V4CacheInjector(model, **e2e_v4.make_fns(latentq, assignment, PREFILL, layers, rope)):
            return run_model(model, ids).float()

    assert torch.equal(on([0], {"compressed_kv": "int4-sym-token"}), ref)
    last, every = on([2], {"window_kv": "int4-sym-token"}), on(None, {"window_kv": "int4-sym-token"})
    print(f"window_kv int4-sym-token: KL layer 2 only {kl(ref, last, ids):.3e}, every layer {kl(ref, every, ids):.3e}")
    assert 0 < kl(ref, last, ids) < kl(ref, every, ids)


def test_entry_read():
    """Entry-time mask -> query rows: a query at position t reads entry w as row (t + 1) // 4 - 1 of the entry mask;
    before its first entry, none."""
    read = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 1]], dtype=torch.bool)  # e.g. r1: the latest entry in bf16
    got = entry_read(read, torch.arange(13), 4)
    want = torch.zeros(13, 3, dtype=torch.bool)
    want[3:7], want[7:11], want[11:] = read[0], read[1], read[2]
    assert torch.equal(got, want)


@pytest.mark.parametrize("seed", [0, 1])
def test_stacked_reads_are_per_query_keys(seed):
    """The modeling module's eager_attention_forward on stacked_reads (random q, two reads, a random read mask,
    a random mask with -inf, sinks) equals it run once per query on that query's keys picked by its read row."""
    g = torch.Generator().manual_seed(seed)
    Bq, H, Tq, K, D = 2, 3, 6, 9, 8
    q = torch.randn(Bq, H, Tq, D, generator=g)
    kq, kb = torch.randn(Bq, 1, K, D, generator=g), torch.randn(Bq, 1, K, D, generator=g)
    read = torch.rand(Tq, K, generator=g) < 0.5
    mask = torch.where(torch.rand(Bq, 1, Tq, K, generator=g) < 0.3, float("-inf"), 0.0)
    mask[..., 0] = 0.0  # every query has a key
    sinks = torch.randn(H, generator=g)
    pymod = sys.modules[type(find_v4_layers(make_model())[0]).__module__]
    mod = type("M", (torch.nn.Module,), {})()
    mod.num_key_value_groups, mod.sinks, mod.training = H, sinks, False
    key, m2 = stacked_reads(kq, kb, read, mask)
    out, _ = pymod.eager_attention_forward(mod, q, key, key, m2, D**-0.5)
    for t in range(Tq):
        k_t = torch.where(read[t][None, None, :, None], kq, kb)
        o_t, _ = pymod.eager_attention_forward(mod, q[:, :, t : t + 1], k_t, k_t, mask[:, :, t : t + 1], D**-0.5)
        torch.testing.assert_close(out[:, t : t + 1], o_t, rtol=1e-6, atol=1e-6)


def test_preset_parts_and_bytes():
    """flashmla-model1-fp8 on 512-wide entry rows: its c_kv part (fp8-e4m3-tile64-pow2-ue8m0) on the first 448
    columns, its k_pe part (bf16) on the last 64; 584 bytes per row (448 e4m3 + 7 ue8m0 + 1 pad + 64 bf16). On
    index_k a plain format takes the whole row. The plan's bytes on the tiny V4 by hand."""
    x = torch.randn(2, 5, 512, generator=torch.Generator().manual_seed(5))
    flat = x.reshape(10, 512).numpy()
    offs = [0, 5, 10]
    y = e2e_v4.quantize_rows(latentq, x, "flashmla-model1-fp8", "window_kv", 64).reshape(10, 512).numpy()
    nope = latentq.quantize_dequantize(np.ascontiguousarray(flat[:, :448]), "fp8-e4m3-tile64-pow2-ue8m0", "c_kv", offs)
    rope = latentq.quantize_dequantize(np.ascontiguousarray(flat[:, 448:]), "bf16", "k_pe", offs)
    assert np.array_equal(y[:, :448], nope) and np.array_equal(y[:, 448:], rope)
    whole = e2e_v4.quantize_rows(latentq, x, "fp8-e4m3-tile64-pow2-ue8m0", "compressed_kv", 64).reshape(10, 512)
    assert np.array_equal(whole.numpy(), latentq.quantize_dequantize(flat, "fp8-e4m3-tile64-pow2-ue8m0", "c_kv", offs))
    for cache in ("window_kv", "compressed_kv"):
        assert e2e_v4.cache_bytes(latentq, "flashmla-model1-fp8", cache, 512, 64, 5, 2, PREFILL) == 584.0
    assert e2e_v4.cache_bytes(latentq, None, "index_k", 128, 0, 5, 2, PREFILL) == 256.0
    # the tiny V4 (D 32, window 8, index 16; CSA m 4, HCA m 8), 40 tokens, bf16: per token (0 + (64 + 32) / 4 + 64 / 8)
    # / 3 layers; the window 8 rows x 64 B per sequence
    info = e2e_v4.layer_info(make_model())
    assert e2e_v4.v4_bytes(latentq, {}, PREFILL, info, None, T, B) == (32 / 3, 512.0)
    # int8-sym-token: D + 2 (fp16 scale) per row; only layer 1 quantized: its compressed 34 B and index 18 B per entry
    got = e2e_v4.v4_bytes(latentq, dict.fromkeys(ALL, "int8-sym-token"), PREFILL, info, [1], T, B)
    assert got == (((34 + 18) / 4 + 64 / 8) / 3, (512 * 2 + 8 * 34) / 3)


def make_results(path, layers=None):
    """A latentq-results/1 file as a V4 study writes it: /latent_error rows of bf16 and int4-sym-token on the two
    entry caches, mxfp4 on index_k; a group the step must keep."""
    st = h5py.string_dtype("utf-8")
    rows = [("bf16", "window_kv"), ("bf16", "compressed_kv"), ("int4-sym-token", "window_kv")]
    rows += [("int4-sym-token", "compressed_kv"), ("mxfp4", "index_k")]
    with h5py.File(path, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        f.attrs["decode_order_position_bucket"] = 20  # /e2e_position's W when --position-bucket is not given
        if layers is not None:
            f.attrs["layers"] = layers
        g = f.create_group("latent_error")
        g.create_dataset("quantizer", data=np.array([q for q, _ in rows], dtype=object), dtype=st)
        g.create_dataset("target", data=np.array([t for _, t in rows], dtype=object), dtype=st)
        f.create_group("keepme").create_dataset("x", data=np.arange(3))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("v4e2e")
    make_model().save_pretrained(str(d / "ckpt"))
    (d / "text.txt").write_bytes(TEXT)
    return d


def cli(ckpt, results, *extra):
    sizes = ["--seq-len", str(T), "--num-seqs", str(B), "--offset-bytes", "0", "--threads", "1", "--quiet"]
    base = ["--results", str(results), "--model", str(ckpt / "ckpt"), "--text", str(ckpt / "text.txt")]
    return e2e.main([*base, *sizes, "--tokenizer", "bytes", *extra])


def test_cli_groups(ckpt, tmp_path):
    """python -m latentq.e2e on the V4 checkpoint (bfloat16): the study's three runs, plus one --caches assignment,
    in prefill order and decode-r4; bf16 exact; the groups, their columns and the caches named."""
    res = tmp_path / "r.h5"
    make_results(res)
    modes = ["--cache-modes", PREFILL, "decode-r4-s0-p0", "--position-bucket", "16"]
    assert cli(ckpt, res, "--dtype", "bfloat16", *modes, "--caches", "window_kv=bf16,index_k=int2-sym-token") == 0
    with h5py.File(res) as f:
        assert list(f["keepme/x"][()]) == [0, 1, 2]
        e = {k: f["e2e"][k][()] for k in f["e2e"]}
        dec = lambda c: [x.decode() for x in e[c]]  # noqa: E731
        assert f["e2e"].attrs["cache_family"] == "deepseek_v4" and f["e2e"].attrs["selection"] == "named"
        assert f["e2e"].attrs["rows"] == 8 and f["e2e_position"].attrs["rows"] == 8 * 3
        assert f["e2e_seq"].attrs["rows"] == 8 * B
        cols = [c["name"] for c in json.loads(f["e2e"].attrs["columns"])]
        pos_cols = {k for k in f["e2e_position"]}
    caches = ["window_kv=bf16,compressed_kv=bf16", "window_kv=int4-sym-token,compressed_kv=int4-sym-token"]
    caches += ["index_k=mxfp4", "window_kv=bf16,index_k=int2-sym-token"]
    assert dec("caches") == caches * 2 and dec("cache_mode") == [PREFILL] * 4 + ["decode-r4-s0-p0"] * 4
    assert dec("quantizer")[:4] == ["bf16", "int4-sym-token", "mxfp4", "window_kv=bf16,index_k=int2-sym-token"]
    assert dec("targets")[:4] == ["window_kv+compressed_kv"] * 2 + ["index_k", "window_kv+index_k"]
    print("KL by run:", dict(zip(dec("caches")[:4], e["kl_mean"][:4])), "p99.9:", e["kl_p999"][:4])
    assert e["kl_mean"][0] == 0.0 and e["kl_mean"][4] == 0.0 and (e["kl_mean"][1:4] > 0).all()
    assert (e["kl_p999"][1:4] >= e["kl_mean"][1:4]).all() and (e["top1_agree"] <= 1).all()
    for c in ("kl_mean", "kl_p999", "top1_agree", "ln_ppl_ratio", "bytes_per_token", "window_bytes_per_seq", "caches"):
        assert c in cols and c in e
    assert {"caches", "pos_start", "kl_mean", "window_bytes_per_seq"} <= pos_cols
    # bytes: bf16 32/3 B/token and 512 B/sequence (test_preset_parts_and_bytes); int4-sym-token rows D/2 + 2 B
    assert e["bytes_per_token"][0] == pytest.approx(32 / 3) and e["window_bytes_per_seq"][0] == 512.0
    assert e["bytes_per_token"][1] == pytest.approx((0 + (18 + 32) / 4 + 18 / 8) / 3)


def test_cli_errors(ckpt, tmp_path, capsys):
    """A --caches entry naming no V4 cache, a preset the tiny V4's 32-wide entries cannot hold (flashmla-model1-fp8:
    448 + 64) as the only run, and --caches on an MLA model: exit 2, the file unchanged; a klt quantizer is left out
    with a note (no fitted basis for V4's caches) and the other runs run."""
    res = tmp_path / "r.h5"
    make_results(res)
    before = res.read_bytes()
    assert cli(ckpt, res, "--caches", "c_kv=bf16") == 2
    assert "'c_kv=bf16': expected <cache>=<spec>" in capsys.readouterr().err
    bare = tmp_path / "bare.h5"  # a results file with no format of its own: --caches the only run
    with h5py.File(bare, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
    assert cli(ckpt, bare, "--caches", "window_kv=flashmla-model1-fp8") == 2
    err = capsys.readouterr().err
    assert "holds c_kv of 448 and k_pe of 64 dims, got 24 + 8" in err and "no run left" in err
    assert cli(ckpt, bare, "--quantizers", "klt,int4-sym-token", "--caches", "index_k=bf16") == 0
    assert "klt/sklt quantizer(s) not injected on DeepSeek-V4" in capsys.readouterr().err
    with h5py.File(bare) as f:
        assert [c.decode() for c in f["e2e/caches"][()]] == ["index_k=bf16"]
    tiny = ["--results", str(res), "--caches", "window_kv=bf16", "--threads", "1"]  # the default model: tiny-mla
    assert e2e.main(tiny) == 2 and "--caches is for a DeepSeek-V4 model" in capsys.readouterr().err
    assert res.read_bytes() == before


def test_streamed_equals_in_memory(tmp_path):
    """A V4 checkpoint as DeepSeek ships it (latentq.random_checkpoint_v4: FP8 blocks, MXFP4 experts, 3 shards, a
    layer split across two): the step streamed layer by layer (--stream on) writes the in-memory step's /e2e rows
    (prefill and decode order, float32) bit for bit; /e2e's execution attribute says which way it ran; /e2e_position
    takes its bucket width from the results file."""
    from latentq import random_checkpoint_v4 as rc
    from test_v4_checkpoint import V4

    m = rc.random_v4_model(seed=0, **V4)
    rc.write_v4_checkpoint(rc.v4_tensors(m), m.config, str(tmp_path / "ckpt"), shards=3, split_layer=1)
    (tmp_path / "text.txt").write_bytes(TEXT)
    got = {}
    for way in ("off", "on"):
        res = tmp_path / f"{way}.h5"
        make_results(res)
        modes = ["--cache-modes", PREFILL, "decode-r4-s0-p0", "--caches", "window_kv=int4-sym-token,index_k=mxfp4"]
        assert cli(tmp_path, res, "--stream", way, *modes) == 0
        with h5py.File(res) as f:
            got[way] = ({k: f["e2e"][k][()] for k in f["e2e"]}, f["e2e"].attrs["execution"])
            pos = f["e2e_position"]  # W = the root attribute decode_order_position_bucket (20): 2 buckets per run
            assert pos.attrs["position_bucket"] == 20 and pos["pos_start"][:2].tolist() == [0, 20]
    (mem, how_mem), (st, how_st) = got["off"], got["on"]
    print(f"{how_mem} vs {how_st}: KL {mem['kl_mean']}")
    assert how_mem == "in memory" and how_st.startswith("layer streaming")
    assert mem.keys() == st.keys() and len(mem["kl_mean"]) == 8 and (mem["kl_mean"][1:4] > 0).all()
    for k in mem:
        np.testing.assert_array_equal(mem[k], st[k], k)


def test_preset_on_512_wide_entries():
    """A tiny V4 with V4's entry width (head_dim 512, rope slice 64, indexer keys 128): flashmla-model1-fp8
    applies (preset_refusal ''), and with it on window_kv and compressed_kv each layer's attention output equals the
    float64 recomputation from the captured record with its entries replaced by the preset's two parts
    (quantize_rows) to 1e-5."""
    torch.manual_seed(0)
    cfg = {**CONFIG, "head_dim": 512, "partial_rotary_factor": 64 / 512, "index_head_dim": 128}
    m = transformers.DeepseekV4ForCausalLM(transformers.DeepseekV4Config(**cfg)).eval()
    with torch.no_grad():  # random sinks and position biases, as test_dump_v4.make_model
        for name, p in m.named_parameters():
            if name.endswith(("sinks", "position_bias")):
                p.copy_(torch.randn_like(p))
    spec, ids = "flashmla-model1-fp8", ids_of(6, 1)
    info = e2e_v4.layer_info(m)
    assert {(d["D"], d["d_rope"]) for d in info} == {(512, 64)} and e2e_v4.preset_refusal(latentq, spec, 512, 64) == ""
    with torch.no_grad(), V4CacheInjector(m, **fns(m, dict.fromkeys(ENTRY, spec))):
        with V4Capture(m) as cap:
            run_model(m, ids)
    for rec in cap.records:
        qd = lambda x: e2e_v4.quantize_rows(latentq, x[None], spec, "window_kv", 64)[0]  # noqa: E731
        comp = qd(rec.compressed_kv) if rec.compressed_kv.shape[0] else rec.compressed_kv
        mine = recompute_attention(dataclasses.replace(rec, window_kv=qd(rec.window_kv), compressed_kv=comp))
        err, exact = rel_error(mine, rec.attn_out), rel_error(recompute_attention(rec), rec.attn_out)
        print(f"layer {rec.layer}: {spec} entries rel. error {err:.2e}; unquantized entries {exact:.2e}")
        assert err < 1e-5 and exact > 1e-4


def test_every_preset_on_v4_entries():
    """Every engine record preset of the format table on a 512-wide entry row (rope 64): those whose record holds
    448 + 64 apply, and their bytes per row by the one accounting are their record's (record_bytes(p, 448, 64), plus
    a per-matrix scale amortized over the rows);
    the V4 records apply, an MLA record of 512 + 64 (vllm-nvfp4-ds-mla) does not."""
    presets = [r["name"] for r in latentq.format_rows() if r["family"] == "preset"]
    fits = {p for p in presets if e2e_v4.preset_refusal(latentq, p, 512, 64) == ""}
    for p in sorted(fits):
        got = e2e_v4.cache_bytes(latentq, p, "compressed_kv", 512, 64, 6, 2, PREFILL)
        print(f"{p}: {got} B per entry row")
        rec = latentq.record_bytes(p, 448, 64)  # per token; a per-matrix scale (k8v4's fp32) comes on top, over 12 rows
        assert rec <= got <= rec + 4 / 12, p
    v4 = {"flashmla-model1-fp8", "flashmla-v41-fp8", "flashmla-v41-fp4"}
    v4 |= {p for p in presets if "dsv4" in p}
    assert v4 <= fits and "vllm-nvfp4-ds-mla" not in fits
