"""Shared checks for latentq-dump/1 files (used by test_dump, test_hf_hooks, test_shipped_dump) and the
shard layout of the test checkpoints (test_dump_layers, test_weight_formats).

Independent of latentq.dump on purpose: the reference recomputation below loops over query
rows and never calls the dumper's own ``absorbed_attention``.
"""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import torch

ROOT_ATTRS_STR = (
    "schema",
    "model",
    "revision",
    "source",
    "created",
    "config_json",
    "rope_layout",
    "original_dtype",
    "text_sha256",
)
ROOT_ATTRS_INT = (
    "num_layers",
    "num_heads",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "num_seqs",
    "seq_len",
)
LAYER_DATASETS = ("c_kv", "k_pe", "q_rows", "q_nope", "q_pe", "w_uk", "w_uv", "attn_out")
SPARSE_DATASETS = ("topk_offsets", "topk_keys")  # root attribute cache_family "sparse_mla" (DSA)
INDEXER_DATASETS = ("index_k", "index_q", "index_w")  # a sparse layer with its own indexer (index_source = itself)


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def check_schema(path: str, layer_ids=None, rope_layouts=("interleaved", "half")) -> dict:
    """Assert every attr/dataset of latentq-dump/1 is present with the right dtype and shape.
    layer_ids: the layer indices the file must hold (default 0..num_layers-1); rope_layouts: the
    accepted rope_layout values (add "none" for NoPE models).
    Returns {"attrs": {...}, "root": {name: array}, "layers": {idx: {name: array}}}."""
    out = {"attrs": {}, "root": {}, "layers": {}}
    with h5py.File(path, "r") as f:
        a = f.attrs
        for k in ROOT_ATTRS_STR:
            assert k in a, f"missing root attr {k}"
            assert isinstance(_s(a[k]), str), f"attr {k} is not a string: {a[k]!r}"
            out["attrs"][k] = _s(a[k])
        for k in ROOT_ATTRS_INT:
            assert k in a, f"missing root attr {k}"
            assert np.asarray(a[k]).dtype.kind in "iu", f"attr {k} is not an integer"
            out["attrs"][k] = int(a[k])
        assert "softmax_scale" in a and np.asarray(a["softmax_scale"]).dtype == np.float64
        out["attrs"]["softmax_scale"] = float(a["softmax_scale"])
        A = out["attrs"]
        assert A["schema"] == "latentq-dump/1"
        assert A["source"] in ("tiny-mla", "hf-hooks")
        assert A["rope_layout"] in rope_layouts
        assert A["created"].endswith("Z") and "T" in A["created"]
        cfg = json.loads(A["config_json"])
        assert int(cfg["kv_lora_rank"]) == A["kv_lora_rank"]
        assert 0 < A["softmax_scale"] < 1

        tokens, positions, offsets = f["tokens"][()], f["positions"][()], f["seq_offsets"][()]
        assert f["tokens"].dtype == np.int32 and tokens.ndim == 1
        assert f["positions"].dtype == np.int32 and positions.shape == tokens.shape
        assert f["seq_offsets"].dtype == np.int64 and offsets.shape == (A["num_seqs"] + 1,)
        T = tokens.shape[0]
        assert offsets[0] == 0 and offsets[-1] == T and np.all(np.diff(offsets) > 0)
        for s in range(A["num_seqs"]):
            np.testing.assert_array_equal(
                positions[offsets[s] : offsets[s + 1]], np.arange(offsets[s + 1] - offsets[s])
            )
        if A["seq_len"] > 0:
            assert np.all(np.diff(offsets) == A["seq_len"])
        out["root"] = {"tokens": tokens, "positions": positions, "seq_offsets": offsets}

        H, r, dr, dn, dv = (
            A[k] for k in ("num_heads", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
        )
        names = sorted(f["layers"].keys())
        assert len(names) == A["num_layers"]
        want_ids = range(A["num_layers"]) if layer_ids is None else sorted(layer_ids)
        assert names == [f"{i:03d}" for i in want_ids]
        for n in names:
            g = f["layers"][n]
            sparse = _s(a.get("cache_family", "dense_mla")) == "sparse_mla"
            own_indexer = sparse and int(g.attrs["index_source"]) == int(n)  # a GLM-5 shared layer has none
            want_sets = set(LAYER_DATASETS) | (set(SPARSE_DATASETS) if sparse else set())
            want_sets |= set(INDEXER_DATASETS) if own_indexer else set()
            assert set(g.keys()) == want_sets, f"layer {n}: {sorted(g.keys())}"
            Tq = g["q_rows"].shape[0]
            want = {
                "c_kv": (np.float32, (T, r)),
                "k_pe": (np.float32, (T, dr)),
                "q_rows": (np.int32, (Tq,)),
                "q_nope": (np.float32, (Tq, H, dn)),
                "q_pe": (np.float32, (Tq, H, dr)),
                "w_uk": (np.float32, (H, dn, r)),
                "w_uv": (np.float32, (H, dv, r)),
                "attn_out": (np.float32, (Tq, H, dv)),
            }
            d = {}
            for k, (dt, shape) in want.items():
                assert g[k].dtype == dt, f"layer {n} {k}: dtype {g[k].dtype}"
                assert g[k].shape == shape, f"layer {n} {k}: shape {g[k].shape} != {shape}"
                d[k] = g[k][()]
                if dt == np.float32:
                    assert np.all(np.isfinite(d[k])), f"layer {n} {k}: non-finite values"
            assert np.all((d["q_rows"] >= 0) & (d["q_rows"] < T)) and np.all(np.diff(d["q_rows"]) > 0)
            if sparse:  # CSR by query row: at least one key per row, ascending, in its causal window
                off, keys = g["topk_offsets"][()], g["topk_keys"][()]
                assert off.dtype == np.int64 and off.shape == (Tq + 1,) and keys.dtype == np.int32
                assert off[0] == 0 and off[-1] == len(keys) and np.all(np.diff(off) > 0)
                for i, t in enumerate(d["q_rows"]):
                    j = keys[off[i] : off[i + 1]]
                    s0 = offsets[np.searchsorted(offsets, t, side="right") - 1]
                    assert np.all(np.diff(j) > 0) and j[0] >= 0 and j[-1] <= t - s0, f"layer {n} row {i}: {j}"
                d["topk_offsets"], d["topk_keys"] = off, keys
                d["index_source"] = int(g.attrs["index_source"])
            if own_indexer:
                ik, iq, iw = g["index_k"], g["index_q"], g["index_w"]
                assert (
                    ik.shape[0] == T and iq.shape[0] == Tq and iw.shape == iq.shape[:2] and ik.shape[1] == iq.shape[2]
                )
                for k in INDEXER_DATASETS:
                    d[k] = g[k][()]
                    assert d[k].dtype == np.float32 and np.all(np.isfinite(d[k])), f"layer {n} {k}"
                d["index_topk"] = int(g.attrs["index_topk"])
                d["index_softmax_scale"] = float(g.attrs["index_softmax_scale"])
            out["layers"][int(n)] = d
    return out


def reference_attn_out(d: dict, offsets: np.ndarray, scale: float) -> np.ndarray:
    """Absorbed MLA attention recomputed from one dumped layer, one sequence at a time (fp32 softmax):
    for query row t of sequence s, scores = scale * (q_nope W_UK c_kv^T + q_pe k_pe^T) over the keys
    offsets[s]..t (of a sparse layer: only the keys topk_keys lists for the row), out = W_UV (p c_kv).
    Returns [Tq, H, v_head_dim] float32."""
    c = torch.from_numpy(d["c_kv"])
    kpe = torch.from_numpy(d["k_pe"])
    w_uk, w_uv = torch.from_numpy(d["w_uk"]), torch.from_numpy(d["w_uv"])
    rows = np.asarray(d["q_rows"], dtype=np.int64)
    out = np.zeros(d["attn_out"].shape, dtype=np.float32)
    for s in range(len(offsets) - 1):
        lo, hi = int(offsets[s]), int(offsets[s + 1])
        sel = np.nonzero((rows >= lo) & (rows < hi))[0]
        if len(sel) == 0:
            continue
        qn = torch.from_numpy(d["q_nope"][sel]).transpose(0, 1)  # [H, n, dn]
        qp = torch.from_numpy(d["q_pe"][sel]).transpose(0, 1)  # [H, n, dr]
        ck, kp = c[lo:hi], kpe[lo:hi]  # [L, r], [L, dr]
        q_lat = torch.bmm(qn, w_uk)  # [H, n, r]
        scores = (q_lat @ ck.T + qp @ kp.T) * scale  # [H, n, L]
        visible = torch.arange(lo, hi)[None, :] <= torch.from_numpy(rows[sel])[:, None]  # [n, L]
        if "topk_offsets" in d:
            read = torch.zeros_like(visible)
            for a, i in enumerate(sel):
                read[a, d["topk_keys"][d["topk_offsets"][i] : d["topk_offsets"][i + 1]]] = True
            visible = visible & read
        scores = scores.masked_fill(~visible, float("-inf"))
        p = torch.softmax(scores.float(), dim=-1)
        o_lat = p @ ck  # [H, n, r]
        out[sel] = torch.bmm(o_lat, w_uv.transpose(1, 2)).transpose(0, 1).numpy()  # [n, H, dv]
    return out


def rel(a, b) -> float:
    """max |a - b| / max |b|."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def checkpoint_layout(path):
    """(weight_map, {layer index: the set of shard files holding its tensors}) of a sharded safetensors
    checkpoint directory, from its model.safetensors.index.json."""
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    layers = {}
    for k, fn in wm.items():
        if k.startswith("model.layers."):
            layers.setdefault(int(k.split(".")[2]), set()).add(fn)
    return wm, layers
