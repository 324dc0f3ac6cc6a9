"""Dump DeepSeek-V4's caches to HDF5 (``latentq-dump/1``, root attribute ``cache_family = "deepseek_v4"``).

``python -m latentq.dump --model DIR ...`` takes this path when the checkpoint's ``model_type`` is
``deepseek_v4`` (latentq.dump.dump hands over; same CLI, same token windows, same query-row rule). What a V4
layer caches and reads is in latentq.deepseek_v4's docstring (written from transformers 5.24.0
``models/deepseek_v4/modeling_deepseek_v4.py``); the datasets are in data/README.md, "DeepSeek-V4 caches".
Per layer ``/layers/NNN`` (NNN = ``layer_idx``):

* every token: ``window_kv`` [T, D] (the shared K = V window entry after RoPE);
* CSA / HCA layers, every compressed entry: ``compressed_kv`` [N, D] (after RoPE), ``compressed_span`` [N, 2]
  and ``compressed_rope_position`` [N] (token positions within the sequence), ``compressed_offsets`` [S+1]
  (sequence s owns entries ``compressed_offsets[s] .. compressed_offsets[s+1]``); CSA also ``index_k`` [N, c];
* ``sinks`` [H];
* the query rows (latentq.dump.select_q_rows): ``q_rows`` [Tq] int32, ``q`` [Tq, H, D] (after RoPE),
  ``attn_out`` [Tq, H, D] (the input of ``o_a_proj``: rope slice rotated back), ``rope_cos`` / ``rope_sin``
  [Tq, d_r/2] (what the layer's RoPE multiplied with, one value per pair); CSA also ``index_q`` [Tq, n_h, c],
  ``index_w`` [Tq, n_h], ``index_selected`` [Tq, index_topk] int64 (-1 = no entry).

Each sequence runs as its own forward (batch 1, positions from 0, eager attention: latentq.deepseek_v4.V4Capture's
scope), each layer's record written and dropped from the capture's hook (``V4Capture(on_layer=...)``), so host
memory holds one layer's record of one sequence beside the model's forward. Streamed (``--stream on``: the model a
latentq.stream.LayerStreamer of a V4 checkpoint), the layers run layer-major, every sequence through layer i before
layer i + 1 with layer i's weights loaded only then; the capture's hooks sit on the meta model's modules and see
the same calls, so the file is the same (tests/python/test_v4_checkpoint.py: identical datasets). The file is a
temporary file in the output directory, renamed at the end; any failure removes it.

The dump's own check (``check_file``), once every sequence has run, from the stored datasets alone (read back
from the file, not from the capture): per layer ``recompute_rows`` (float64) against ``attn_out``, max|Δ| /
max|attn_out| over the whole layer <= check_tol (1e-4 in float32, 2e-2 in another compute dtype, as the MLA
dump's); on CSA layers the top-``index_topk`` recomputed from ``index_q`` / ``index_w`` / ``index_k`` equals
``index_selected`` up to ties (latentq.sparse_mla.select_topk / same_up_to_ties); the stored spans and rope
positions are the compressors' rule. A failure raises :class:`V4CheckError` (the CLI: exit 2, nothing written).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from latentq.deepseek_v4 import CSA, HCA, SLIDING, V4Capture, V4LayerRecord, compressed_spans, find_v4_layers
from latentq.dump_format import (
    DumpError,
    chunk_shape,
    common_root_attrs,
    compression_kw,
    put_index,
    put_token_arrays,
    rel_err,
    select_q_rows,
    temp_output,
    write_root_attrs,
)
from latentq.files import publish
from latentq.model import run_model, state_dict_sha256, weights_revision
from latentq.progress import Progress
from latentq.sparse_mla import same_up_to_ties, select_topk

CACHE_FAMILY = "deepseek_v4"
LAYER_TYPE_NAMES = {SLIDING: "sliding", CSA: "csa", HCA: "hca"}
CHECK_BLOCK_ELEMS = 1 << 22  # check: query rows per block so that one [rows, H, keys] float64 tensor is <= 32 MiB


class V4CheckError(DumpError):
    """The dump's own check failed: the stored datasets do not give the model's attention output (or the CSA
    indexer's selection); nothing is written."""


def _plan_layers(model) -> list[dict]:
    """One dict per DeepseekV4Attention, in layer order: idx, module (qualified name), attn, type (sliding / csa
    / hca), rate (0 on sliding layers)."""
    names = {id(m): n for n, m in model.named_modules()}
    out = []
    for attn in find_v4_layers(model):
        rate = int(attn.compressor.compress_rate) if attn.compressor is not None else 0
        out.append(dict(idx=int(attn.layer_idx), module=names[id(attn)], attn=attn, type=attn.layer_type, rate=rate))
    return out


class _Writer:
    """The on_layer callback of the capture: writes layer rec.layer's datasets of the running sequence ``seq``
    into the open file f at the sequence's offsets (created at their final shape on the layer's first record),
    then the record is dropped. ``ran[i]``: the sequences layer i wrote."""

    def __init__(self, f, layers: list[dict], seq_lens: list[int], local_rows: list[np.ndarray], kw: dict):
        self.f, self.kw = f, kw
        self.layers = {d["idx"]: d for d in layers}
        self.local_rows = local_rows
        self.offsets = np.concatenate([[0], np.cumsum(seq_lens)]).astype(np.int64)
        self.q_offsets = np.concatenate([[0], np.cumsum([len(r) for r in local_rows])]).astype(np.int64)
        self.c_offsets = {}
        for i, d in self.layers.items():  # entries per sequence: one per complete window of `rate` tokens
            n = [L // d["rate"] if d["rate"] else 0 for L in seq_lens]
            self.c_offsets[i] = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
        self.seq = 0
        self.ran = {i: set() for i in self.layers}

    def _dataset(self, gl, name: str, rows: int, row_shape: tuple, dtype: str):
        """/layers/NNN/name of shape [rows, *row_shape], created on first use (chunks: dump.chunk_shape)."""
        if name not in gl:
            shape = (rows,) + tuple(int(x) for x in row_shape)
            chunks = chunk_shape(shape) if rows > 0 else None
            gl.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks, **(self.kw if rows > 0 else {}))
        return gl[name]

    def _put(self, gl, name: str, lo: int, hi: int, total: int, x: torch.Tensor, dtype: str = "<f4") -> None:
        where = f"layer {gl.attrs['layer']}, sequence {self.seq}, {name}"
        a = np.ascontiguousarray(x.to(torch.float32 if dtype == "<f4" else torch.int64).numpy(), dtype=np.dtype(dtype))
        if a.shape[0] != hi - lo:
            raise RuntimeError(f"{where}: captured {a.shape[0]} rows, expected {hi - lo}")
        ds = self._dataset(gl, name, total, a.shape[1:], dtype)
        if ds.shape[1:] != a.shape[1:]:
            raise RuntimeError(f"{where}: captured rows of shape {a.shape[1:]}, earlier sequences {ds.shape[1:]}")
        if hi > lo:
            ds[lo:hi] = a

    def __call__(self, rec: V4LayerRecord) -> None:
        i, s = rec.layer, self.seq
        d = self.layers[i]
        gl = self.f["layers"][f"{i:03d}"]
        a, b = int(self.offsets[s]), int(self.offsets[s + 1])
        qa, qb = int(self.q_offsets[s]), int(self.q_offsets[s + 1])
        T, Tq = int(self.offsets[-1]), int(self.q_offsets[-1])
        rows = torch.as_tensor(self.local_rows[s])
        self._attrs(gl, rec)
        self._put(gl, "window_kv", a, b, T, rec.window_kv)
        for name in ("q", "attn_out", "rope_cos", "rope_sin"):
            self._put(gl, name, qa, qb, Tq, getattr(rec, name)[rows])
        sinks = np.asarray(rec.sinks.float().numpy(), dtype=np.float32)
        if "sinks" not in gl:
            gl.create_dataset("sinks", data=sinks)
        elif not np.array_equal(gl["sinks"][()], sinks):
            raise RuntimeError(f"layer {i}, sequence {s}: sinks differ from sequence 0's")
        if d["rate"]:
            co = self.c_offsets[i]
            ca, cb, N = int(co[s]), int(co[s + 1]), int(co[-1])
            if rec.compressed_kv.shape[0] != cb - ca:
                raise RuntimeError(
                    f"layer {i}, sequence {s}: {rec.compressed_kv.shape[0]} compressed entries, expected "
                    f"{b - a} // {d['rate']} = {cb - ca}"
                )
            self._put(gl, "compressed_kv", ca, cb, N, rec.compressed_kv)
            self._put(gl, "compressed_span", ca, cb, N, rec.compressed_span, "<i8")
            self._put(gl, "compressed_rope_position", ca, cb, N, rec.compressed_rope_position, "<i8")
            if "compressed_offsets" not in gl:
                gl.create_dataset("compressed_offsets", data=co)
        if d["type"] == CSA:
            self._put(gl, "index_k", ca, cb, N, rec.index_k)
            self._put(gl, "index_q", qa, qb, Tq, rec.index_q[rows])
            self._put(gl, "index_w", qa, qb, Tq, rec.index_w[rows])
            sel = torch.full((len(rows), rec.index_topk), -1, dtype=torch.long)
            picks = rec.index_selected[rows]  # [k, min(index_topk, entries)]
            sel[:, : picks.shape[1]] = picks
            self._put(gl, "index_selected", qa, qb, Tq, sel, "<i8")
        self.ran[i].add(s)

    def _attrs(self, gl, rec: V4LayerRecord) -> None:
        """The layer's attributes, set by sequence 0 and checked equal by the others."""
        rope_dim = 2 * int(rec.rope_cos.shape[-1])
        attrs = {
            "layer_type": LAYER_TYPE_NAMES[rec.layer_type],
            "compress_rate": np.int64(rec.compress_rate),
            "sliding_window": np.int64(rec.sliding_window),
            "softmax_scale": np.float64(rec.softmax_scale),
            "rope_dims": f"last {rope_dim}, interleaved pairs",
            "rope_layer_type": str(self.layers[rec.layer]["attn"].rope_layer_type),
        }
        if rec.layer_type == CSA:
            attrs["index_topk"] = np.int64(rec.index_topk)
            attrs["index_softmax_scale"] = np.float64(rec.index_softmax_scale)
        for k, v in attrs.items():
            if k not in gl.attrs:
                gl.attrs[k] = v
            elif gl.attrs[k] != v:
                raise RuntimeError(f"layer {rec.layer}, sequence {self.seq}: {k} {v!r}, sequence 0 had {gl.attrs[k]!r}")


def recompute_rows(ds: dict, attrs: dict, seq_offsets, positions) -> torch.Tensor:
    """[Tq, H, D] float64: one layer's attention output at its stored query rows, from the stored arrays alone.

    ds: the layer's datasets as arrays, ``q_rows`` [Tq] (indices into the T tokens), ``q`` [Tq, H, D],
    ``rope_cos`` / ``rope_sin`` [Tq, d_r/2], ``window_kv`` [T, D], ``sinks`` [H], and on CSA / HCA layers
    ``compressed_kv`` [N, D], ``compressed_span`` [N, 2], ``compressed_offsets`` [S+1], on CSA layers
    ``index_selected`` [Tq, k]. attrs: ``layer_type`` (sliding / csa / hca), ``sliding_window``,
    ``softmax_scale``. seq_offsets [S+1], positions [T] (the root datasets).

    Query row t of sequence s (position p) reads, as keys and values alike: the window entries of positions
    p - sliding_window < j <= p of its sequence; on HCA layers every compressed entry of its sequence whose span
    ends by p + 1 (its window complete); on CSA layers the entries its ``index_selected`` names (-1: none).
    Logits q·K · softmax_scale, one sink logit per head in the softmax (dropped after it), output = p·K, then the
    last d_r columns rotated back pairwise (2i, 2i+1) by (cos, -sin) (transformers 5.24 modeling_deepseek_v4.py:
    ``eager_attention_forward``, ``DeepseekV4Attention.forward``)."""
    f64 = lambda x: torch.as_tensor(np.asarray(x)).to(torch.float64)  # noqa: E731
    off = np.asarray(seq_offsets, dtype=np.int64)
    q_rows, pos = np.asarray(ds["q_rows"], dtype=np.int64), np.asarray(positions, dtype=np.int64)
    q, cos, sin, win = f64(ds["q"]), f64(ds["rope_cos"]), f64(ds["rope_sin"]), f64(ds["window_kv"])
    sinks = f64(ds["sinks"])
    kind, W, scale = str(attrs["layer_type"]), int(attrs["sliding_window"]), float(attrs["softmax_scale"])
    if kind not in ("sliding", "csa", "hca"):
        raise V4CheckError(f"layer_type {kind!r}: expected sliding, csa or hca")
    Tq, H, D = q.shape
    out = torch.empty(Tq, H, D, dtype=torch.float64)
    seq_of = np.searchsorted(off, q_rows, side="right") - 1
    for s in range(len(off) - 1):
        idx = np.flatnonzero(seq_of == s)
        if len(idx) == 0:
            continue
        a, b = int(off[s]), int(off[s + 1])
        t = torch.as_tensor(pos[q_rows[idx]])
        j = torch.as_tensor(pos[a:b])
        vis = (t[:, None] - j[None, :] >= 0) & (t[:, None] - j[None, :] < W)
        kv = win[a:b]
        if kind != "sliding":
            co = np.asarray(ds["compressed_offsets"], dtype=np.int64)
            ca, cb = int(co[s]), int(co[s + 1])
            kv = torch.cat([kv, f64(ds["compressed_kv"][ca:cb])], dim=0)
            if kind == "hca":
                ends = torch.as_tensor(np.asarray(ds["compressed_span"][ca:cb, 1], dtype=np.int64))
                read = ends[None, :] <= t[:, None] + 1
            else:
                read = selection_mask(np.asarray(ds["index_selected"])[idx], cb - ca)
            vis = torch.cat([vis, read], dim=1)
        block = max(1, CHECK_BLOCK_ELEMS // (H * kv.shape[0]))
        for r0 in range(0, len(idx), block):
            r = idx[r0 : r0 + block]
            logits = torch.einsum("thd,kd->thk", q[r], kv) * scale
            logits = logits.masked_fill(~vis[r0 : r0 + block, None, :], float("-inf"))
            sink = sinks[None, :, None].expand(len(r), -1, 1)
            p = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
            o = torch.einsum("thk,kd->thd", p, kv)
            out[r] = _rotate_back(o, cos[r], sin[r])
    return out


def _rotate_back(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [Tq, H, D] with its last 2·cos.shape[-1] columns rotated pairwise (2i, 2i+1) by (cos, -sin) [Tq, d_r/2]
    (``apply_rotary_pos_emb(o, cos, -sin)``)."""
    r = 2 * cos.shape[-1]
    c, s = cos[:, None, :], -sin[:, None, :]
    ev, od = x[..., -r:][..., 0::2], x[..., -r:][..., 1::2]
    rot = torch.stack([ev * c - od * s, od * c + ev * s], dim=-1).flatten(-2)
    return torch.cat([x[..., :-r], rot], dim=-1)


def selection_mask(selected: np.ndarray, n_entries: int) -> torch.Tensor:
    """[k, n_entries] bool from entry indices [k, topk] (-1 = none). Raises V4CheckError for an index >= n_entries."""
    sel = torch.as_tensor(np.asarray(selected, dtype=np.int64))
    if bool((sel >= n_entries).any()) or bool((sel < -1).any()):
        raise V4CheckError(f"index_selected holds {sel.min()}..{sel.max()}: expected -1 or 0..{n_entries - 1}")
    mask = torch.zeros(sel.shape[0], n_entries + 1, dtype=torch.bool)
    mask.scatter_(1, torch.where(sel < 0, n_entries, sel), True)
    return mask[:, :n_entries]


def index_scores_rows(index_q, index_w, index_k, visible, softmax_scale: float) -> torch.Tensor:
    """[k, N] float64: s[t, w] = Σ_h index_w[t, h] · relu(index_q[t, h] · index_k[w]) · softmax_scale, -inf where
    ``visible`` [k, N] is False (``DeepseekV4IndexerScorer.forward`` + the causal threshold of
    ``DeepseekV4Indexer.forward``). index_q [k, n_h, c], index_w [k, n_h], index_k [N, c]."""
    f64 = lambda x: torch.as_tensor(np.asarray(x)).to(torch.float64)  # noqa: E731
    per_head = torch.relu(torch.einsum("thc,nc->thn", f64(index_q), f64(index_k))) * softmax_scale
    s = torch.einsum("th,thn->tn", f64(index_w), per_head)
    return s.masked_fill(~visible, float("-inf"))


def _check_spans_and_selection(i: int, ds: dict, attrs: dict, seq_offsets, positions) -> None:
    """The stored spans / rope positions are the compressors' rule (latentq.deepseek_v4.compressed_spans,
    relative to the sequence), and on a CSA layer the stored selection is the top-index_topk of the stored
    indexer tensors, each pick visible, up to ties. Raises V4CheckError naming the layer and sequence."""
    kind, rate = str(attrs["layer_type"]), int(attrs["compress_rate"])
    co = np.asarray(ds["compressed_offsets"], dtype=np.int64)
    off = np.asarray(seq_offsets, dtype=np.int64)
    q_rows, pos = np.asarray(ds["q_rows"], dtype=np.int64), np.asarray(positions, dtype=np.int64)
    seq_of = np.searchsorted(off, q_rows, side="right") - 1
    for s in range(len(off) - 1):
        ca, cb = int(co[s]), int(co[s + 1])
        spans = compressed_spans(cb - ca, rate, overlap=kind == "csa").numpy()
        if not np.array_equal(ds["compressed_span"][ca:cb], spans) or not np.array_equal(
            ds["compressed_rope_position"][ca:cb], np.arange(cb - ca) * rate
        ):
            raise V4CheckError(f"layer {i}, sequence {s}: compressed_span / compressed_rope_position are not the rule")
        if kind != "csa":
            continue
        idx = np.flatnonzero(seq_of == s)
        t = torch.as_tensor(pos[q_rows[idx]])
        ends = torch.as_tensor(spans[:, 1])
        visible = ends[None, :] <= t[:, None] + 1
        theirs = selection_mask(np.asarray(ds["index_selected"])[idx], cb - ca)
        if bool((theirs & ~visible).any()):
            raise V4CheckError(f"layer {i}, sequence {s}: index_selected names an entry its query row cannot see")
        if cb == ca:
            continue
        scores = index_scores_rows(
            ds["index_q"][idx], ds["index_w"][idx], ds["index_k"][ca:cb], visible, float(attrs["index_softmax_scale"])
        )
        mine = select_topk(scores, int(attrs["index_topk"]))
        if not same_up_to_ties(scores, theirs, mine):
            bad = int((mine != theirs).any(-1).sum())
            raise V4CheckError(
                f"layer {i}, sequence {s}: the top-{int(attrs['index_topk'])} recomputed from index_q / index_w / "
                f"index_k differs from index_selected in {bad} of {len(idx)} query rows (beyond ties)"
            )


def check_file(f, check_tol: float) -> dict[int, float]:
    """The dump's own check on the open file f (module docstring): per layer, ``recompute_rows`` from the stored
    datasets against ``attn_out`` (max|Δ| / max|attn_out|, latentq.dump.rel_err), after
    ``_check_spans_and_selection`` (the stored selection is the one the recomputation reads). Returns {layer:
    relative error}; raises V4CheckError for a layer over check_tol (NaN included) or a failed span / selection
    check."""
    off, pos = f["seq_offsets"][()], f["positions"][()]
    errs = {}
    for name, gl in f["layers"].items():
        i = int(name)
        ds = {k: gl[k][()] for k in gl}
        attrs = dict(gl.attrs)
        if attrs["layer_type"] != "sliding":
            _check_spans_and_selection(i, ds, attrs, off, pos)
        err = rel_err(recompute_rows(ds, attrs, off, pos), ds["attn_out"])
        if not err <= check_tol:
            raise V4CheckError(
                f"layer {i} ({attrs['layer_type']}): the attention recomputed from the dumped datasets differs from "
                f"attn_out by {err:.3g} (relative) > {check_tol:g}; the captured tensors are inconsistent"
            )
        errs[i] = err
    return errs


def _root_attrs(f, layers, seqs, config_dict: dict, meta: dict, extra_attrs: dict | None) -> None:
    """The root attributes (data/README.md: those of every dump, dump_format.common_root_attrs, the MLA shapes
    replaced by V4's)."""
    g0 = f["layers"][f"{layers[0]['idx']:03d}"]
    scales = {float(f["layers"][f"{d['idx']:03d}"].attrs["softmax_scale"]) for d in layers}
    if len(scales) != 1:
        raise RuntimeError(f"layers disagree on the softmax scale: {sorted(scales)}")
    lens = [len(s) for s in seqs]
    attn = layers[0]["attn"]
    attrs = common_root_attrs(
        meta, config_dict, num_layers=len(layers), num_heads=attn.num_heads, softmax_scale=next(iter(scales)),
        seq_lens=lens,
    )  # fmt: skip
    attrs.update(
        cache_family=CACHE_FAMILY,
        head_dim=np.int64(attn.head_dim),
        qk_rope_head_dim=np.int64(g0["rope_cos"].shape[1] * 2),
        softmax_scale_source="attribute:scaling",
        rope_layout="interleaved",
        rope_function="apply_rotary_pos_emb",
    )
    write_root_attrs(f, attrs, extra_attrs)


def _create(f, layers, seqs, local_rows, kw) -> None:
    """tokens, positions, seq_offsets (root) and per layer its group, ``module``, ``layer``, ``q_rows``."""
    lens = [len(s) for s in seqs]
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)

    put_token_arrays(f, np.concatenate(seqs), np.concatenate([np.arange(n) for n in lens]), offsets, kw)
    q_rows = np.concatenate([o + r for o, r in zip(offsets[:-1], local_rows)]).astype(np.int32)
    g = f.create_group("layers")
    for d in layers:
        gl = g.create_group(f"{d['idx']:03d}")
        gl.attrs["module"] = d["module"]
        gl.attrs["layer"] = np.int64(d["idx"])
        put_index(gl, "q_rows", q_rows, kw)


def _run_in_memory(model, seqs: list[np.ndarray], writer: _Writer) -> None:
    """Each sequence through the whole model (one forward each, batch 1), the capture's hooks writing every layer's
    record as it completes. Raises RuntimeError when a layer did not run for a sequence."""
    device = next(model.parameters()).device
    with Progress(len(seqs), "dump", "sequences") as progress:
        for s, seq in enumerate(seqs):
            writer.seq = s
            run_model(model, torch.as_tensor(seq, device=device)[None, :])
            missing = sorted(i for i in writer.ran if s not in writer.ran[i])
            if missing:
                raise RuntimeError(f"sequence {s}: DeepSeek-V4 layers {missing} did not run")
            progress.update()


def _run_streamed(streamer, seqs: list[np.ndarray], writer: _Writer) -> None:
    """Layer-major (latentq.stream.LayerStreamer.run): decoder layer i's weights loaded, every sequence through it
    (the capture writing its record of sequence n; ``before`` sets the writer's sequence), then freed. The layers run
    the modules and inputs of the model's own forward, so the records are the in-memory ones. Raises RuntimeError
    when a layer did not run for every sequence (decoder layer i holds the attention of layer_idx i)."""
    with Progress(len(streamer.layers), "dump", "layers") as progress:

        def before(i: int, n: int) -> None:
            writer.seq = n

        def after(i: int) -> None:
            if writer.ran.get(i) != set(range(len(seqs))):
                raise RuntimeError(f"DeepSeek-V4 layer {i} did not run for every sequence")
            progress.update()

        streamer.run([torch.as_tensor(s)[None, :] for s in seqs], before=before, after=after)


@torch.no_grad()
def dump_v4(
    model,
    config_dict: dict,
    token_ids_per_seq,
    q_rows: int,
    out_path: str,
    *,
    model_name: str = "",
    revision: str | None = None,
    source: str = "hf-hooks",
    original_dtype: str | None = None,
    text_sha256: str = "",
    force: bool = False,
    compression: str | None = None,
    check_tol: float | None = None,
    extra_attrs: dict | None = None,
) -> dict:
    """Run a DeepSeek-V4 model (``DeepseekV4ForCausalLM``, eager attention: in memory, or a
    latentq.stream.LayerStreamer of a V4 checkpoint, layer by layer) on each sequence and write its caches to
    ``out_path`` (module docstring; the arguments are latentq.dump.dump's). Returns a summary dict (path, bytes,
    cache_family, max_rel_err per layer, num_layers, softmax_scale, layer_types). Both ways write the same file.

    Raises DumpError (existing output without force, bad q_rows, empty input), V4CheckError (the dump's own
    check; a DumpError), ValueError (latentq.deepseek_v4's scope: not a V4 model, non-eager attention),
    RuntimeError (a layer that did not run, records that disagree across sequences); input errors are raised
    before any file is created, and no failure leaves a file."""
    import h5py

    from latentq.stream import LayerStreamer

    if os.path.exists(out_path) and not force:
        raise DumpError(f"{out_path} exists; pass force=True (--force) to overwrite")
    streamer = model if isinstance(model, LayerStreamer) else None
    module = streamer.model if streamer is not None else model
    seqs = [np.asarray(s, dtype=np.int64).reshape(-1) for s in token_ids_per_seq]
    if not seqs or any(len(s) == 0 for s in seqs):
        raise DumpError("need at least one non-empty sequence")
    local_rows = select_q_rows([len(s) for s in seqs], q_rows)
    layers = _plan_layers(module)
    compute_dtype = streamer.dtype if streamer is not None else next(model.parameters()).dtype
    if check_tol is None:
        check_tol = 1e-4 if compute_dtype == torch.float32 else 2e-2
    if revision is None:
        revision = (
            weights_revision(streamer.path) if streamer is not None else "sha256-state-dict:" + state_dict_sha256(model)
        )
    if original_dtype is None:
        original_dtype = str(config_dict.get("torch_dtype") or config_dict.get("dtype") or compute_dtype)
    kw = compression_kw(compression)
    tmp = temp_output(out_path)
    was_training = module.training
    try:
        module.eval()
        with h5py.File(tmp, "w") as f:
            _create(f, layers, seqs, local_rows, kw)
            writer = _Writer(f, layers, [len(s) for s in seqs], local_rows, kw)
            with V4Capture(module, on_layer=writer):
                if streamer is not None:
                    _run_streamed(streamer, seqs, writer)
                else:
                    _run_in_memory(model, seqs, writer)
            errs = check_file(f, check_tol)
            meta = {
                "model": model_name,
                "revision": revision,
                "source": source,
                "original_dtype": original_dtype.replace("torch.", ""),
                "compute_dtype": str(compute_dtype).replace("torch.", ""),
                "text_sha256": text_sha256,
            }
            _root_attrs(f, layers, seqs, config_dict, meta, extra_attrs)
            scale = float(f.attrs["softmax_scale"])
        publish(tmp, out_path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    finally:
        module.train(was_training)
    return {
        "path": out_path,
        "bytes": os.path.getsize(out_path),
        "cache_family": CACHE_FAMILY,
        "softmax_scale": scale,
        "layer_types": {d["idx"]: LAYER_TYPE_NAMES[d["type"]] for d in layers},
        "max_rel_err": errs,
        "num_layers": len(layers),
    }
