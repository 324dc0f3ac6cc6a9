"""The C++ DeepSeek-V4 attention engine (latentq/attention/v4.h, ``latentq._core.v4_attention``) on a dump of the tiny
random-init V4 of test_dump_v4 (a sliding, a CSA and an HCA layer; two sequences of 40 tokens, 16 query rows): per
layer type, its float32 output equals the model's ``attn_out`` and the float64 recomputation
``latentq.dump_v4.recompute_rows`` (max|Δ| / max|attn_out| <= 1e-4), its float64 output equals recompute_rows to
float64 rounding; its probabilities (window keys, visible entries, sink) sum to 1; on the CSA layer the top-k it
recomputes from index_q / index_w / index_k is the dump's selection, and a quantized index_k moves it exactly as
the Python indexer (latentq.dump_v4.index_scores_rows + latentq.sparse_mla.select_topk) moves it. ``latentq run`` on the
dump writes /attention_check per layer and /attention_error per (layer, cache set, quantizer), each row the engine's
error recomputed here from the caches quantized by ``latentq.quantize_dequantize``."""

import os
import subprocess

import h5py
import numpy as np
import pytest
import torch

import latentq
from latentq import dump as dump_mod
from latentq import dump_v4
from latentq.sparse_mla import select_topk
from test_dump_v4 import TEXT, cli_args, make_model

TOL = 1e-4  # the dump check's float32 tolerance (data/README.md, "DeepSeek-V4 caches")


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    d = tmp_path_factory.mktemp("v4_attention")
    make_model().save_pretrained(str(d / "ckpt"))
    (d / "text.txt").write_bytes(TEXT)
    out = d / "v4.h5"
    assert dump_mod.main(cli_args(d / "ckpt", d / "text.txt", out)) == 0
    with h5py.File(out) as f:
        root = {k: f[k][()] for k in ("positions", "seq_offsets")}
        layers = {int(n): ({k: g[k][()] for k in g}, dict(g.attrs)) for n, g in f["layers"].items()}
    return root, layers, out


POSITIONAL = ("q", "q_rows", "positions", "seq_offsets", "window_kv", "sinks", "rope_cos", "rope_sin")


def engine(root, ds, attrs, float64=False, **over):
    """v4_attention on one layer's datasets; ``over``: other positional arrays, or keyword arrays (index_k: the
    selection recomputed from it instead of index_selected)."""
    kind = str(attrs["layer_type"])
    args = [over.get(k, ds[k] if k in ds else root.get(k)) for k in POSITIONAL]
    kw = {k: v for k, v in over.items() if k not in POSITIONAL}
    if kind != "sliding":
        kw = {**{k: ds[k] for k in ("compressed_kv", "compressed_span", "compressed_offsets")}, **kw}
    if kind == "csa" and "index_k" not in kw:
        kw = {"index_selected": ds["index_selected"], **kw}
    scale, window = float(attrs["softmax_scale"]), int(attrs["sliding_window"])
    return latentq._core.v4_attention(kind, *args, scale, window, float64=float64, **kw)


@pytest.mark.parametrize("kind", ["sliding", "csa", "hca"])
def test_engine_is_the_model_and_the_float64_recomputation(dumped, kind):
    root, layers, _ = dumped
    (i,) = [i for i, (_, a) in layers.items() if a["layer_type"] == kind]
    ds, attrs = layers[i]
    ref = dump_v4.recompute_rows(ds, attrs, root["seq_offsets"], root["positions"]).numpy()
    out, nkeys, probs = engine(root, ds, attrs)
    assert out.dtype == np.float32 and out.shape == ds["attn_out"].shape
    rel = dump_mod.rel_err  # max|a - b| / max|b|
    vs_dump, vs_ref = rel(out, ds["attn_out"]), rel(out, ref)
    out64, _, probs64 = engine(root, ds, attrs, float64=True)
    vs_ref64 = rel(out64, ref)
    print(
        f"layer {i} ({kind}): engine float32 vs attn_out {vs_dump:.3g}, vs recompute_rows {vs_ref:.3g}; "
        f"float64 vs recompute_rows {vs_ref64:.3g}"
    )
    assert vs_dump <= TOL and vs_ref <= TOL and vs_ref64 <= 1e-12
    # probabilities: per (row, head) the window keys, the visible entries and the sink, summing to 1
    H = ds["q"].shape[1]
    assert probs.size == H * nkeys.sum()
    starts = np.concatenate([[0], np.cumsum(np.repeat(nkeys, H))[:-1]])
    sums = np.add.reduceat(probs64, starts)
    np.testing.assert_allclose(sums, 1.0, atol=1e-12)
    pos = root["positions"][ds["q_rows"]]
    window = np.minimum(pos + 1, int(attrs["sliding_window"]))
    if kind == "sliding":
        np.testing.assert_array_equal(nkeys, window + 1)
    else:
        co, ends = ds["compressed_offsets"], ds["compressed_span"][:, 1]
        seq = np.searchsorted(root["seq_offsets"], ds["q_rows"], side="right") - 1
        visible = [int((ends[co[s] : co[s + 1]] <= p + 1).sum()) for s, p in zip(seq, pos)]
        np.testing.assert_array_equal(nkeys, window + np.array(visible) + 1)


def test_csa_selection_from_the_indexer_and_a_quantized_index_k(dumped):
    root, layers, _ = dumped
    (i,) = [i for i, (_, a) in layers.items() if a["layer_type"] == "csa"]
    ds, attrs = layers[i]
    idx = dict(
        index_q=ds["index_q"],
        index_w=ds["index_w"],
        index_topk=int(attrs["index_topk"]),
        index_softmax_scale=float(attrs["index_softmax_scale"]),
    )
    picked, _, _ = engine(root, ds, attrs)
    recomputed, _, _ = engine(root, ds, attrs, index_k=ds["index_k"], **idx)
    np.testing.assert_array_equal(recomputed, picked)  # no ties in random floats: the same selection, bit for bit
    # a coarse index_k: the Python indexer's top-k on it, and the engine's attention over that selection
    off, pos = root["seq_offsets"], root["positions"]
    co = ds["compressed_offsets"]
    kq = latentq.quantize_dequantize(ds["index_k"], "int2-sym-token", "index_k", co.tolist())
    seq = np.searchsorted(off, ds["q_rows"], side="right") - 1
    sel = np.full_like(ds["index_selected"], -1)
    for s in range(len(off) - 1):
        rows = np.flatnonzero(seq == s)
        ends = torch.as_tensor(ds["compressed_span"][co[s] : co[s + 1], 1])
        vis = ends[None, :] <= torch.as_tensor(pos[ds["q_rows"][rows]])[:, None] + 1
        scores = dump_v4.index_scores_rows(
            ds["index_q"][rows], ds["index_w"][rows], kq[co[s] : co[s + 1]], vis, idx["index_softmax_scale"]
        )
        mine = select_topk(scores, idx["index_topk"])  # [rows, entries] bool
        for r, m in zip(rows, mine.numpy()):
            e = np.flatnonzero(m)
            sel[r, : len(e)] = e
    moved = int((np.sort(sel, 1) != np.sort(ds["index_selected"], 1)).any(1).sum())
    print(f"int2-sym-token index_k: the selection of {moved} of {len(sel)} query rows moves")
    assert moved > 0
    quantized, _, _ = engine(root, ds, attrs, index_k=kq, **idx)
    ref = dump_v4.recompute_rows({**ds, "index_selected": sel}, attrs, off, pos).numpy()
    assert dump_mod.rel_err(quantized, ref) <= TOL
    assert dump_mod.rel_err(quantized, ds["attn_out"]) > 10 * TOL


def test_bad_inputs_are_value_errors(dumped):
    root, layers, _ = dumped
    ds, attrs = next(v for v in layers.values() if v[1]["layer_type"] == "csa")
    with pytest.raises(ValueError, match="index_selected"):
        engine(root, ds, attrs, index_selected=np.full_like(ds["index_selected"], 10**6))
    with pytest.raises(ValueError, match="window_kv has"):
        engine(root, ds, attrs, window_kv=ds["window_kv"][:-1])
    with pytest.raises(ValueError, match="layer_type 'dense'"):
        engine(root, ds, {**attrs, "layer_type": "dense"})


LQ = os.environ.get("LATENTQ_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "latentq"))
CACHES = {
    "sliding": ["window_kv"],
    "csa": ["window_kv", "compressed_kv", "index_k"],
    "hca": ["window_kv", "compressed_kv"],
}


RECORDS = {"flashmla-v32-fp8"}  # the engine presets among the specs below


def quantized(ds, root, cache, spec, rope):
    """The cache as the study quantizes it: each sequence's rows apart; an engine record's c_kv part on the first
    D - d_r columns of an entry row, its k_pe part on the last d_r."""
    x = ds[cache]
    off = (root["seq_offsets"] if cache == "window_kv" else ds["compressed_offsets"]).tolist()
    if spec not in RECORDS:
        return latentq.quantize_dequantize(x, spec, cache, off)
    d = x.shape[1] - rope
    a = latentq.quantize_dequantize(np.ascontiguousarray(x[:, :d]), spec, "c_kv", off)
    return np.concatenate([a, latentq.quantize_dequantize(np.ascontiguousarray(x[:, d:]), spec, "k_pe", off)], 1)


def metrics(ref, test, H):
    """out_rel_fro, kl_mean (floor 1e-30), top1_agree of two engine results (out, nkeys, probs) in float64."""
    (o, nk, p), (o2, _, p2) = ref, test
    rel = np.linalg.norm((o2 - o).astype(np.float64)) / np.linalg.norm(o.astype(np.float64))
    starts = np.concatenate([[0], np.cumsum(np.repeat(nk, H))])
    kl, top1 = [], []
    for a, b in zip(starts[:-1], starts[1:]):
        pr, pt = p[a:b].astype(np.float64), p2[a:b].astype(np.float64)
        m = pr > 0
        kl.append(np.sum(pr[m] * np.log(pr[m] / np.maximum(pt[m], 1e-30))))
        top1.append(np.argmax(pr) == np.argmax(pt))
    return rel, np.mean(kl), np.mean(top1)


def test_study_attention_rows(dumped, tmp_path):
    """``latentq run`` on the dump, [indexer] quantizers int2-sym-token (moves the CSA selection) and mxfp4: the
    /attention_check and /attention_error rows, each recomputed here."""
    root, layers, path = dumped
    cfg, out = tmp_path / "study.toml", tmp_path / "results.h5"
    assert subprocess.run([LQ, "init", str(cfg)], capture_output=True).returncode == 0
    with open(cfg, "a") as f:
        f.write('\n[indexer]\nquantizers = ["int2-sym-token", "mxfp4"]\n')
    args = [LQ, "run", str(cfg), "--input", str(path), "--out", str(out), "--no-e2e"]
    run = subprocess.run(args, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    with h5py.File(out) as f:
        check = {k: f["attention_check"][k][()] for k in f["attention_check"]}
        err = {k: f["attention_error"][k][()] for k in f["attention_error"]}
    for k in ("quantizer", "targets", "layer_type"):
        err[k] = err[k].astype(str)
    rope = int(next(iter(layers.values()))[0]["rope_cos"].shape[1]) * 2
    print("attention_check ref_vs_dump_rel_fro:", dict(zip(check["layer"].tolist(), check["ref_vs_dump_rel_fro"])))
    assert sorted(check["layer"].tolist()) == sorted(layers) and (check["ref_vs_dump_rel_fro"] < 1e-5).all()
    rows = {(int(a), b, c): i for i, (a, b, c) in enumerate(zip(err["layer"], err["targets"], err["quantizer"]))}
    # (spec, the cache sets it runs on: None = every set of the layer)
    cases = [("mxfp4", None), ("int4-asym-token-g32", "window_kv"), ("flashmla-v32-fp8", "window_kv")]
    cases += [("int2-sym-token", "index_k"), ("int2-sym-token", "window_kv+compressed_kv+index_k")]
    for i, (ds, attrs) in layers.items():
        kind, H = str(attrs["layer_type"]), ds["q"].shape[1]
        caches = CACHES[kind]
        sets = {"+".join(c) for c in [[x] for x in caches] + [caches]}
        got = {t for (l, t, q) in rows if l == i and q == "mxfp4"}
        assert got == sets, (i, kind, got)
        assert set(err["layer_type"][err["layer"] == i]) == {kind}
        ref = engine(root, ds, attrs)
        for spec, only in cases:
            for ts in [only] if only else sorted(sets):
                if (i, ts, spec) not in rows:  # a cache the layer does not hold
                    assert ts not in sets, (i, ts, spec)
                    continue
                over = {c: quantized(ds, root, c, spec, rope) for c in ts.split("+")}
                if "index_k" in over:
                    over.update(
                        index_q=ds["index_q"],
                        index_w=ds["index_w"],
                        index_topk=int(attrs["index_topk"]),
                        index_softmax_scale=float(attrs["index_softmax_scale"]),
                    )
                rel, kl, top1 = metrics(ref, engine(root, ds, attrs, **over), H)
                r = rows[(i, ts, spec)]
                print(
                    f"layer {i} ({kind}) {ts} {spec}: out_rel_fro {rel:.4g} (row {err['out_rel_fro'][r]:.4g}), "
                    f"kl {kl:.4g} (row {err['kl_mean'][r]:.4g}), top1 {top1:.4g}"
                )
                np.testing.assert_allclose(
                    [err["out_rel_fro"][r], err["kl_mean"][r], err["top1_agree"][r]],
                    [rel, kl, top1],
                    rtol=1e-6,
                    atol=1e-12,
                )
                recall = err["topk_recall"][r]  # the model's selection kept: < 1 only where int2 index_k moves it
                if kind != "csa":
                    assert np.isnan(recall)
                else:
                    assert (recall < 0.9) if (spec == "int2-sym-token") else (recall == 1.0), (ts, spec, recall)
