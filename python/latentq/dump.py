"""Dump the latent KV cache of an MLA model to HDF5 (format ``latentq-dump/1``, see data/README.md).

    .venv/bin/python -m latentq.dump --model data/tiny-mla --text /tmp/heldout.txt \\
        --seq-len 512 --num-seqs 4 --q-rows 256 --out data/latents/tiny-mla.h5 [--force]

--model is a tiny-mla directory (config.json with ``architectures == ["TinyMLAForCausalLM"]``) or any
HF DeepseekV2/V3-architecture checkpoint directory / hub id (loaded with AutoModelForCausalLM,
``attn_implementation="eager"``; ``--trust-remote-code`` for remote-code checkpoints).

MLA variants (transformers 5.24 modeling code; latentq.capture says how each is hooked):
  - DeepSeek-V3.2 / GLM-5 (DSA: an indexer picks index_topk keys per query; root attribute cache_family
    ``sparse_mla``): each layer also stores the keys each query row read (topk_offsets, topk_keys: the
    mask the eager attention received, causal ∩ top-k), and the self-check recomputes the attention over
    those keys; GLM-5's "shared" layers store the selection they reused.
  - LongCat-Flash: two MLA sublayers per decoder layer, dumped as layers 2i and 2i + 1 (their
    layer_idx). Its latents are scaled after the projections (``mla_scale_kv_lora``,
    ``mla_scale_q_lora``): the dump stores the scaled c_kv (what the cache stores) and the scaled
    q_nope / q_pe (the query the model uses), W_UK / W_UV unchanged (kv_b_proj's weight), so the
    absorbed recomputation is the same formula for every model; the scales are the layer
    attributes ``c_kv_scale`` / ``q_scale`` (1.0 elsewhere).
  - Kimi-Linear: only its MLA layers (``full_attention``) are dumped, under their model layer index
    (non-contiguous, e.g. 1 and 3); they are NoPE: k_pe / q_pe unrotated, ``rope_layout`` "none".
Each layer group records the qualified name of its module (attribute ``module``).
DeepSeek-V4 (``model_type`` deepseek_v4) caches no MLA latent: latentq.dump_v4 writes its own datasets
(root attribute cache_family ``deepseek_v4``), in memory or streamed, with its own check.

Models larger than memory: ``--stream on`` runs a local safetensors checkpoint layer by layer
(latentq.stream.LayerStreamer: the model on the meta device, each decoder layer read from the shards
right before it runs and freed after, every sequence through layer i before layer i+1, the hidden
states on the host; in a temporary file in the output directory when they and the largest layer
exceed ``--memory-budget``, default half the physical memory). ``--stream auto`` (the default)
decides by size, not format: it streams checkpoints whose weights in the compute dtype exceed the budget,
and refuses before loading a local one that cannot stream (.bin weights) whose weight files exceed it;
tiny-mla and hub ids load in memory; ``--stream off`` never streams. DeepSeek's block-wise
FP8 e4m3 checkpoints are dequantized on load to the compute dtype by latentq.stream in either mode
(``original_dtype`` = float8_e4m3fn). Both modes write the same file (datasets and attributes, bit
for bit); the JSON summary says which ran (``execution``).

Tokens: the text's bytes for tiny-mla (byte-level vocabulary); for HF models the checkpoint's
AutoTokenizer when it has one (no special tokens added), else the bytes. The dump covers
``--num-seqs`` consecutive non-overlapping windows of ``--seq-len`` tokens from the start of the
text; each window is run as its own sequence (positions 0..seq_len-1, causal attention).

Query rows: per sequence k = q_rows // num_seqs rows (the first q_rows % num_seqs sequences get one
more), evenly spaced and ending at the last position: positions floor((j + 1) * L / k) - 1 for
j = 0..k-1 (L = sequence length). For L = 512, k = 64: 7, 15, ..., 511.

The model runs in float32 (``--dtype``) with a fixed thread count and no randomness. The file is
streamed: each layer's rows of a sequence are written (chunked datasets, ~1 MiB chunks) as the
forward pass produces them and dropped before the next layer runs, so host memory holds about one
layer's tensors of one sequence, not the dump (see ``dump``). The absorbed recomputation of
attn_out from the dumped tensors is checked per (sequence, layer) against the model's own
attention output (max abs error / max abs value over the whole layer <= 1e-4 in float32); a
mismatch is an error. The file is written to a temporary file in the output directory, then
renamed: an interrupted dump never leaves a partial file. An existing output is refused unless --force.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
import torch

from latentq.capture import (
    LatentCapture,
    MLAModuleNotFoundError,
    config_softmax_scale,
    find_mla_layers,
    latent_scales,
    mla_dims,
)
from latentq.dump_format import (  # noqa: F401  (re-exported: latentq.dump.X stays valid)
    CHUNK_BYTES,
    INDEX_CHUNK,
    Q_ROWS_RULE,
    SCHEMA,
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
from latentq.files import publish, refuse_output_over_input
from latentq.model import (
    DTYPES,
    ModelError,
    device_error,
    load_model,
    run_model,
    state_dict_sha256,
    stream_plan,
    weights_revision,
)
from latentq.model_class import native_class_note
from latentq.progress import Progress, StepParser, say
from latentq.sparse_mla import causal_window, index_scores, same_up_to_ties, select_topk


def windows(tokens: list[int] | np.ndarray, seq_len: int, num_seqs: int) -> list[np.ndarray]:
    """num_seqs consecutive non-overlapping windows of seq_len tokens from the start.
    Raises DumpError if there are fewer than seq_len * num_seqs tokens."""
    need = seq_len * num_seqs
    if seq_len < 1 or num_seqs < 1:
        raise DumpError("seq_len and num_seqs must be >= 1")
    if len(tokens) < need:
        raise DumpError(f"text too short: {len(tokens)} tokens, need seq_len*num_seqs = {seq_len}*{num_seqs} = {need}")
    t = np.asarray(tokens, dtype=np.int64)
    return [t[i * seq_len : (i + 1) * seq_len] for i in range(num_seqs)]


def absorbed_attention(c_kv, k_pe, q_nope, q_pe, w_uk, w_uv, q_rows, seq_offsets, softmax_scale, visible=None):
    """Recompute the attention output from the latent cache with absorbed weights.

    A Python reference of the absorbed MLA attention, for the dumper's self-check and the tests; the
    product is the C++ engine (attention/, header latentq/attention/attention.h).

    c_kv [T, r], k_pe [T, d_r], q_nope [Tq, H, d_n], q_pe [Tq, H, d_r], w_uk [H, d_n, r],
    w_uv [H, d_v, r], q_rows [Tq] (indices into T), seq_offsets [S+1]. Any float dtype
    (numpy or torch); computed in float32 with an fp32 softmax, causal within each sequence:
    scores = scale * (q_nope W_UK c_kv^T + q_pe k_pe^T), out = W_UV (softmax(scores) c_kv).
    visible: optional [Tq, T] bool, the keys each query row reads (sparse MLA: causal ∩ top-k); the others are
    masked as the causal future is. Returns [Tq, H, d_v] float32 torch tensor.
    """
    f = lambda x: torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).float()
    c_kv, k_pe, q_nope, q_pe, w_uk, w_uv = map(f, (c_kv, k_pe, q_nope, q_pe, w_uk, w_uv))
    allowed = causal_window(q_rows, seq_offsets, c_kv.shape[0])  # [Tq, T]
    if visible is not None:
        allowed = allowed & torch.as_tensor(np.asarray(visible), dtype=torch.bool)
    q_lat = torch.einsum("qhd,hdc->qhc", q_nope, w_uk)  # [Tq, H, r]
    scores = torch.einsum("qhc,tc->qht", q_lat, c_kv) + torch.einsum("qhd,td->qht", q_pe, k_pe)
    scores = scores * softmax_scale
    scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1, dtype=torch.float32)
    o_lat = torch.einsum("qht,tc->qhc", p, c_kv)  # [Tq, H, r]
    return torch.einsum("qhc,hdc->qhd", o_lat, w_uv)


CHECK_BLOCK_ELEMS = 1 << 24  # self-check: query rows per block so that one [rows, H, L] fp32 tensor is <= 64 MiB


def _seq_check(rec: dict, w_uk, w_uv, local_rows: np.ndarray, softmax_scale: float) -> tuple[float, float]:
    """(max |rec - attn_out|, max |attn_out|) over one sequence's query rows of one layer, float64.

    rec: one layer's LatentCapture record of one sequence (c_kv [1, L, r], k_pe [1, L, d_r], q_nope
    [1, k, H, d_n], q_pe [1, k, H, d_r], attn_out [1, k, H, d_v]); local_rows [k] positions in the
    sequence; a sparse layer's record also has ``visible`` [1, k, L] (the keys each row read). The absorbed
    recomputation is ``absorbed_attention`` with offsets [0, L] (and that selection), run over blocks
    of query rows (each [rows, H, L] score tensor <= CHECK_BLOCK_ELEMS elements). The maxima over all
    (sequence, block) pieces of a layer give exactly max|a - b| and max|b| of the whole layer, so
    max_diff / max_ref is ``rel_err`` on the whole layer (up to float32 rounding of the recomputation,
    whose matmuls have another key count)."""
    c_kv, k_pe = rec["c_kv"][0], rec["k_pe"][0]
    L = c_kv.shape[0]
    H = rec["q_nope"].shape[2]
    block = max(1, CHECK_BLOCK_ELEMS // (H * L))
    off = np.array([0, L], dtype=np.int64)
    max_diff = max_ref = 0.0
    for a in range(0, len(local_rows), block):
        sl = slice(a, a + block)
        vis = rec["visible"][0, sl] if "visible" in rec else None
        out = absorbed_attention(
            c_kv, k_pe, rec["q_nope"][0, sl], rec["q_pe"][0, sl], w_uk, w_uv, local_rows[sl], off, softmax_scale, vis
        ).double()
        ref = rec["attn_out"][0, sl].double()
        # np.maximum propagates NaN (a NaN anywhere must fail the check, as rel_err's NaN does)
        max_diff = float(np.maximum(max_diff, float((out - ref).abs().max())))
        max_ref = float(np.maximum(max_ref, float(ref.abs().max())))
    return max_diff, max_ref


class _Plan:
    """What dump() writes, fixed before the first forward pass: the sequences, the MLA layers and
    dims, the query rows, the row offsets and every dataset's final shape."""

    def __init__(self, model, config_dict: dict, token_ids_per_seq, q_rows: int):
        """Raises DumpError (empty input, bad q_rows), MLAModuleNotFoundError (no MLA module),
        RuntimeError (config and weights disagree)."""
        self.seqs = [np.asarray(s, dtype=np.int64).reshape(-1) for s in token_ids_per_seq]
        if not self.seqs or any(len(s) == 0 for s in self.seqs):
            raise DumpError("need at least one non-empty sequence")
        mla = find_mla_layers(model)
        self.layer_ids = sorted(i for i, _, _ in mla)
        self.attn_of = {i: a for i, _, a in mla}
        self.module_of = {i: n for i, n, _ in mla}
        self.scales_of = {i: latent_scales(a) for i, _, a in mla}
        self.dims = dims = mla_dims(mla[0][2])
        for key, cfg_key in (
            ("num_heads", "num_attention_heads"),
            ("kv_lora_rank", "kv_lora_rank"),
            ("qk_rope_head_dim", "qk_rope_head_dim"),
            ("qk_nope_head_dim", "qk_nope_head_dim"),
            ("v_head_dim", "v_head_dim"),
        ):
            if cfg_key in config_dict and int(config_dict[cfg_key]) != dims[key]:
                raise RuntimeError(f"config {cfg_key}={config_dict[cfg_key]} but the weights give {dims[key]}")
        # The cache family: DeepSeek Sparse Attention (an index_topk in the config: DeepSeek-V3.2, GLM-5) stores
        # the keys each query row read (topk_offsets, topk_keys) beside the dense MLA datasets.
        self.cache_family = "sparse_mla" if config_dict.get("index_topk") else "dense_mla"
        # DSA layers with their own indexer (a GLM-5 "shared" layer has none: it reuses the last one's top-k)
        self.indexer_of = {i: getattr(a, "indexer", None) for i, _, a in mla}
        self.index_source = {}
        last = None
        for i in self.layer_ids:
            last = i if isinstance(self.indexer_of[i], torch.nn.Module) else last
            self.index_source[i] = last
        self.seq_lens = seq_lens = [len(s) for s in self.seqs]
        self.local_rows = select_q_rows(seq_lens, q_rows)
        self.offsets = np.concatenate([[0], np.cumsum(seq_lens)]).astype(np.int64)
        self.q_offsets = np.concatenate([[0], np.cumsum([len(r) for r in self.local_rows])]).astype(np.int64)
        self.tokens = np.concatenate(self.seqs)
        self.positions = np.concatenate([np.arange(n) for n in seq_lens])
        self.q_rows_global = np.concatenate([off + r for off, r in zip(self.offsets[:-1], self.local_rows)])
        H, nope, vd, r = dims["num_heads"], dims["qk_nope_head_dim"], dims["v_head_dim"], dims["kv_lora_rank"]
        rope = dims["qk_rope_head_dim"]
        T, Tq = int(self.offsets[-1]), int(self.q_offsets[-1])
        self.shapes = {
            "c_kv": (T, r),
            "k_pe": (T, rope),
            "q_rows": (Tq,),
            "q_nope": (Tq, H, nope),
            "q_pe": (Tq, H, rope),
            "w_uk": (H, nope, r),
            "w_uv": (H, vd, r),
            "attn_out": (Tq, H, vd),
        }
        ix = next((x for x in self.indexer_of.values() if isinstance(x, torch.nn.Module)), None)
        if self.cache_family == "sparse_mla" and ix is not None:  # the indexer's cache and what scores it
            n_h, d = int(ix.n_heads), int(ix.head_dim)
            self.shapes.update(index_k=(T, d), index_q=(Tq, n_h, d), index_w=(Tq, n_h))

    def w_uk_uv(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK [H, d_n, r], W_UV [H, d_v, r] of layer i (float32 CPU; views of kv_b_proj.weight when it is)."""
        d = self.dims
        H, nope, vd, r = d["num_heads"], d["qk_nope_head_dim"], d["v_head_dim"], d["kv_lora_rank"]
        wkv_b = self.attn_of[i].kv_b_proj.weight.detach().float().cpu().view(H, nope + vd, r)
        return wkv_b[:, :nope], wkv_b[:, nope:]


def _create_datasets(f, plan: _Plan, kw: dict, weights: bool = True) -> None:
    """Every dataset of the file at its final shape (dump's docstring): tokens, positions, seq_offsets and,
    per layer, q_rows written whole; W_UK and W_UV written whole when ``weights`` (the model's weights are
    loaded), else left for ``_write_w_uk_uv`` (a streamed model loads layer i only when it runs); c_kv,
    k_pe, q_nope, q_pe and attn_out empty, chunked with chunk_shape. kw: the compression arguments of
    every dataset."""

    put_token_arrays(f, plan.tokens, plan.positions, plan.offsets, kw)
    g = f.create_group("layers")
    for i in plan.layer_ids:
        gl = g.create_group(f"{i:03d}")
        gl.attrs["module"] = plan.module_of[i]
        gl.attrs["c_kv_scale"] = np.float64(plan.scales_of[i]["c_kv"][1])
        gl.attrs["q_scale"] = np.float64(plan.scales_of[i]["q"][1])
        for k in ("c_kv", "k_pe", "q_rows", "q_nope", "q_pe", "w_uk", "w_uv", "attn_out"):
            if k == "q_rows":
                put_index(gl, k, plan.q_rows_global.astype(np.int32), kw)
            elif k in ("w_uk", "w_uv"):  # one head per chunk
                gl.create_dataset(k, shape=plan.shapes[k], dtype="<f4", chunks=(1,) + plan.shapes[k][1:], **kw)
            else:
                gl.create_dataset(k, shape=plan.shapes[k], dtype="<f4", chunks=chunk_shape(plan.shapes[k]), **kw)
        if plan.cache_family == "sparse_mla":  # CSR by query row, filled sequence by sequence (_LayerWriter)
            Tq = plan.shapes["q_rows"][0]
            gl.create_dataset(
                "topk_offsets", data=np.zeros(Tq + 1, dtype=np.int64), chunks=(min(Tq + 1, INDEX_CHUNK),), **kw
            )
            gl.create_dataset("topk_keys", shape=(0,), maxshape=(None,), dtype="<i4", chunks=(INDEX_CHUNK,), **kw)
            src = plan.index_source[i]
            gl.attrs["index_source"] = np.int64(-1 if src is None else src)
            ix = plan.indexer_of[i]
            if isinstance(ix, torch.nn.Module):
                gl.attrs["index_topk"] = np.int64(ix.index_topk)
                gl.attrs["index_softmax_scale"] = np.float64(ix.softmax_scale)
                for k in ("index_k", "index_q", "index_w"):
                    shape = plan.shapes[k]
                    gl.create_dataset(k, shape=shape, dtype="<f4", chunks=chunk_shape(shape), **kw)
        if weights:
            _write_w_uk_uv(f, plan, i)


def _write_w_uk_uv(f, plan: _Plan, i: int) -> None:
    """Write /layers/NNN/w_uk and w_uv of layer i from its kv_b_proj weight (which must be loaded)."""
    w_uk, w_uv = plan.w_uk_uv(i)
    gl = f["layers"][f"{i:03d}"]
    gl["w_uk"][...] = np.ascontiguousarray(w_uk.numpy())
    gl["w_uv"][...] = np.ascontiguousarray(w_uv.numpy())


class _LayerWriter:
    """The on_layer callback of dump()'s capture: writes layer i's rows of the running sequence ``seq``
    into the open file f, self-checks them (_seq_check) and keeps the per-layer maxima, the sequences
    each layer ran (``ran[i]``) and the softmax scales, rope layouts, functions and scale sources seen;
    the record is dropped after the call."""

    def __init__(self, f, plan: _Plan):
        self.f, self.plan = f, plan
        self.seq = 0
        self.ran = {i: set() for i in plan.layer_ids}
        self.scales, self.layouts, self.functions, self.sources = set(), set(), set(), set()
        self.max_diff = {i: 0.0 for i in plan.layer_ids}
        self.max_ref = {i: 0.0 for i in plan.layer_ids}

    def __call__(self, i: int, rec: dict) -> None:
        p, s = self.plan, self.seq
        a, b = int(p.offsets[s]), int(p.offsets[s + 1])
        qa, qb = int(p.q_offsets[s]), int(p.q_offsets[s + 1])
        gl = self.f["layers"][f"{i:03d}"]
        for k, (lo, hi) in (
            ("c_kv", (a, b)),
            ("k_pe", (a, b)),
            ("q_nope", (qa, qb)),
            ("q_pe", (qa, qb)),
            ("attn_out", (qa, qb)),
        ):
            x = np.ascontiguousarray(rec[k][0].numpy(), dtype=np.float32)
            if x.shape != (hi - lo,) + p.shapes[k][1:]:
                raise RuntimeError(
                    f"layer {i}, sequence {s}: captured {k} has shape {x.shape}, expected "
                    f"{(hi - lo,) + p.shapes[k][1:]}"
                )
            gl[k][lo:hi] = x  # the Dataset object (and its chunk cache) closes here
        if p.cache_family == "sparse_mla":
            self._write_selection(gl, i, s, rec, qa, qb)
        self.scales.add(rec["softmax_scale"])
        self.layouts.add(rec["rope_layout"])
        self.functions.add(rec["rope_function"])
        self.sources.add(rec["softmax_scale_source"])
        d, m = _seq_check(rec, *p.w_uk_uv(i), p.local_rows[s], rec["softmax_scale"])
        self.max_diff[i] = float(np.maximum(self.max_diff[i], d))
        self.max_ref[i] = float(np.maximum(self.max_ref[i], m))
        self.ran[i].add(s)

    def _write_selection(self, gl, i: int, s: int, rec: dict, qa: int, qb: int) -> None:
        """Sparse MLA: append the keys each of sequence s's query rows read (``visible``, within its causal
        window, ascending) to topk_keys and their offsets to topk_offsets[qa + 1 .. qb]. Sequences come in order
        for every layer, in memory and streamed, so the offsets run on from the previous sequence's."""
        if "visible" not in rec:
            raise RuntimeError(
                f"layer {i}: no attention mask captured (the eager attention function was not called); a sparse "
                "MLA layer's selection is read from it"
            )
        rows = self.plan.local_rows[s]
        vis = rec["visible"][0].numpy()  # [k, L]
        counts, keys = [], []
        for a, t in enumerate(rows):
            j = np.flatnonzero(vis[a, : t + 1]).astype(np.int32)
            if len(j) == 0 or vis[a, t + 1 :].any():
                raise RuntimeError(f"layer {i}, sequence {s}, row {t}: the mask selects no key, or one past the row")
            counts.append(len(j))
            keys.append(j)
        if isinstance(self.plan.indexer_of[i], torch.nn.Module):
            self._write_indexer(gl, i, s, rec, vis)
        n0 = int(gl["topk_offsets"][qa])
        gl["topk_offsets"][qa + 1 : qb + 1] = n0 + np.cumsum(counts)
        ds = gl["topk_keys"]
        ds.resize((n0 + sum(counts),))
        ds[n0:] = np.concatenate(keys)

    def _write_indexer(self, gl, i: int, s: int, rec: dict, vis: np.ndarray) -> None:
        """A DSA layer's own indexer: write index_k (sequence s's tokens), index_q and index_w (its query rows),
        and check that latentq.sparse_mla's selection from them is the model's (``vis``, up to ties)."""
        p = self.plan
        a, b = int(p.offsets[s]), int(p.offsets[s + 1])
        qa, qb = int(p.q_offsets[s]), int(p.q_offsets[s + 1])
        missing = [k for k in ("index_k", "index_q", "index_w") if k not in rec]
        if missing:
            raise RuntimeError(f"layer {i}, sequence {s}: the indexer's {missing} were not captured")
        for k, (lo, hi) in (("index_k", (a, b)), ("index_q", (qa, qb)), ("index_w", (qa, qb))):
            x = np.ascontiguousarray(rec[k][0].numpy(), dtype=np.float32)
            if x.shape != (hi - lo,) + p.shapes[k][1:]:
                raise RuntimeError(f"layer {i}, sequence {s}: captured {k} has shape {x.shape}")
            gl[k][lo:hi] = x
        ix = p.indexer_of[i]
        rows, L = p.local_rows[s], b - a
        scores = index_scores(rec["index_q"][0], rec["index_w"][0], rec["index_k"][0], rows, [0, L], ix.softmax_scale)
        mine, theirs = select_topk(scores, int(ix.index_topk)), torch.as_tensor(vis)
        if not same_up_to_ties(scores, theirs, mine):
            bad = int((mine != theirs).any(-1).sum())
            raise RuntimeError(
                f"layer {i}, sequence {s}: the top-{ix.index_topk} recomputed from the dumped indexer tensors "
                f"differs from the model's selection in {bad} of {len(rows)} query rows (beyond ties)"
            )

    def rel_err(self, i: int) -> float:
        """max|Δ| / max|attn_out| of layer i over the sequences run so far."""
        return self.max_diff[i] / max(self.max_ref[i], 1e-300)


def _check_consistent(writer: _LayerWriter) -> None:
    """The softmax scales and rope layouts seen so far agree across layers, else RuntimeError."""
    if len(writer.scales) != 1 or len(writer.layouts) != 1:
        raise RuntimeError(
            f"layers disagree: softmax scales {sorted(writer.scales)}, rope layouts {sorted(writer.layouts)}"
        )


def _check_layer(writer: _LayerWriter, i: int, check_tol: float, seen: str) -> None:
    """Layer i's absorbed recomputation is within check_tol of attn_out over the sequences run so far
    (``seen`` names them in the message), else RuntimeError."""
    err = writer.rel_err(i)
    if not err <= check_tol:
        raise RuntimeError(
            f"layer {i}: absorbed recomputation differs from the model's attn_out by "
            f"{err:.3g} (relative) > {check_tol:g}; the captured tensors or scale are inconsistent ({seen})"
        )


def _run_sequences(model, plan: _Plan, writer: _LayerWriter, check_tol: float) -> None:
    """One forward pass per sequence under LatentCapture(on_layer=writer), with the checks after each
    pass (dump's docstring). Raises RuntimeError: a layer that did not run, layers that disagree on the
    softmax scale or rope layout, a layer over check_tol."""
    device = next(model.parameters()).device
    model.eval()
    with LatentCapture(model, on_layer=writer) as cap, Progress(len(plan.seqs), "dump", "sequences") as progress:
        for s, (seq, rows) in enumerate(zip(plan.seqs, plan.local_rows)):
            writer.seq = s
            cap.clear()
            cap.q_rows = torch.as_tensor(rows)
            run_model(model, torch.as_tensor(seq, device=device)[None, :])
            missing = sorted(i for i in plan.layer_ids if s not in writer.ran[i])
            if missing:
                raise RuntimeError(f"sequence {s}: MLA layers {missing} did not run in the forward pass")
            _check_consistent(writer)
            for i in plan.layer_ids:
                _check_layer(writer, i, check_tol, f"sequences 0..{s} of {len(plan.seqs)}")
            progress.update()


def _run_streamed(streamer, f, plan: _Plan, writer: _LayerWriter, check_tol: float) -> None:
    """The same captures and checks as _run_sequences, layer-major (latentq.stream.LayerStreamer.run):
    decoder layer i is loaded, the W_UK / W_UV of the MLA layers inside it (none, one, or LongCat-Flash's
    two: LayerStreamer.decoder_layer_of of each module name) written, every sequence run through it
    (each layer record written as it comes), those MLA layers checked over all sequences, then freed.
    Raises RuntimeError as _run_sequences (a sequence the layer did not run, disagreeing layers, a
    layer over check_tol)."""
    S = len(plan.seqs)
    progress = Progress(len(streamer.layers), "dump", "layers (streamed)")
    # decoder layer -> the MLA layers it holds (LongCat-Flash: two; Kimi-Linear: none or one)
    inside: dict[int, list[int]] = {}
    for j in plan.layer_ids:
        inside.setdefault(streamer.decoder_layer_of(plan.module_of[j]), []).append(j)
    with LatentCapture(streamer.model, on_layer=writer) as cap, progress:

        def loaded(i: int) -> None:
            for j in inside.get(i, []):
                _write_w_uk_uv(f, plan, j)

        def before(i: int, s: int) -> None:
            writer.seq = s
            cap.clear()
            cap.q_rows = torch.as_tensor(plan.local_rows[s])

        def after(i: int) -> None:
            progress.update()
            for j in inside.get(i, []):
                missing = sorted(set(range(S)) - writer.ran[j])
                if missing:
                    raise RuntimeError(f"layer {j}: sequences {missing} did not run its MLA module")
                _check_consistent(writer)
                _check_layer(writer, j, check_tol, f"all {S} sequences")

        streamer.run(plan.seqs, before=before, loaded=loaded, after=after)


def _write_root_attrs(
    f, plan: _Plan, writer: _LayerWriter, config_dict: dict, meta: dict, extra_attrs: dict | None
) -> None:
    """The root attributes of the file (data/README.md), once every sequence has run, then extra_attrs.
    meta: model, revision, source, original_dtype, compute_dtype, text_sha256 (dump_format.common_root_attrs)."""
    d = plan.dims
    attrs = common_root_attrs(
        meta,
        config_dict,
        num_layers=len(plan.layer_ids),
        num_heads=d["num_heads"],
        softmax_scale=next(iter(writer.scales)),
        seq_lens=plan.seq_lens,
    )
    attrs.update(
        kv_lora_rank=np.int64(d["kv_lora_rank"]),
        qk_rope_head_dim=np.int64(d["qk_rope_head_dim"]),
        qk_nope_head_dim=np.int64(d["qk_nope_head_dim"]),
        v_head_dim=np.int64(d["v_head_dim"]),
        softmax_scale_source=",".join(sorted(writer.sources)),
        rope_layout=next(iter(writer.layouts)),
        rope_function=",".join(sorted(writer.functions)),
    )
    if plan.cache_family != "dense_mla":  # absent: dense MLA (the dumps written before the attribute)
        attrs["cache_family"] = plan.cache_family
    write_root_attrs(f, attrs, extra_attrs)


@torch.no_grad()
def dump(
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
    """Run ``model`` on each sequence and write a ``latentq-dump/1`` HDF5 file to ``out_path``, streaming.

    model: an MLA model in eval mode (tiny-mla or HF), already in the compute dtype; or a
    ``latentq.stream.LayerStreamer`` (a checkpoint on the meta device, run layer by layer: see
    "Layer streaming" below).
    config_dict: the model config as a dict (stored as ``config_json``; must hold qk_nope_head_dim,
    qk_rope_head_dim, v_head_dim, kv_lora_rank, num_attention_heads).
    token_ids_per_seq: list of 1-D int sequences (each run separately, positions from 0).
    q_rows: total number of query rows to dump per layer (see ``select_q_rows``).
    revision: stored as ``revision``; default sha256 of the state dict (LayerStreamer: of the
    checkpoint's weight files, as the CLI's, ``weights_revision``).
    compression: None (uncompressed) or "gzip" (level 4, shuffle).
    check_tol: max relative error allowed between the absorbed recomputation and the model's
    attn_out (default 1e-4 in float32, 2e-2 otherwise).
    Returns a summary dict (path, bytes, softmax_scale, rope_layout, max_rel_err per layer).
    A config whose model_type is deepseek_v4 goes to latentq.dump_v4.dump_v4 with the same arguments.

    Streaming: the file (a temporary file in the output directory) is created before the first
    forward pass with every dataset at its final shape (T, Tq and the dims are known from the
    sequence lengths, ``select_q_rows`` and the weights), chunked along the first axis with
    ``chunk_shape`` (whole rows, ~1 MiB per chunk: c_kv [T, r] -> (min(T, 2**18 // r), r); q_nope
    [Tq, H, d_n] -> (min(Tq, 2**18 // (H d_n)), H, d_n)); w_uk/w_uv [H, d, r] -> (1, d, r), one head per
    chunk; tokens, positions, seq_offsets, q_rows -> min(n, 65536) elements (the chunking of
    ``latentq synth``). W_UK/W_UV and q_rows are written at creation. During the forward of
    sequence s, each layer's forward hook
    (``LatentCapture(on_layer=...)``) hands over that layer's record, whose c_kv, k_pe rows are
    written at rows seq_offsets[s].. and q_nope, q_pe, attn_out at the sequence's query-row offset
    of /layers/NNN/...; the record is then dropped, before the next layer runs. Peak host memory is
    about one layer's tensors of one sequence (c_kv + k_pe [L, r + d_r], q_nope/q_pe/attn_out of its
    query rows, pre-RoPE copies, the self-check's [rows, H, L] blocks of <= 64 MiB) on top of the
    model and its own forward activations for one sequence, whatever the number of layers or
    sequences. The root attributes are written after the last pass,
    then the file is renamed to ``out_path``; any failure removes the temporary file. The file
    layout (datasets, names, dtypes, shapes, attributes) is the same as with the whole-file writer
    it replaces, and so are the values; only the storage is chunked instead of contiguous.

    Every /layers/NNN group (NNN = the MLA module's layer_idx, not necessarily contiguous) has the
    attributes ``module`` (its qualified name), ``c_kv_scale`` and ``q_scale`` (float64; the latent
    scales already applied to c_kv and q_nope / q_pe: latentq.capture.latent_scales).

    Self-check, per (sequence, layer) while streaming: the absorbed recomputation of that
    sequence's query rows (``absorbed_attention``, offsets [0, L]) against the model's attn_out; the
    per-layer maxima of |rec - attn_out| and |attn_out| over all sequences give ``rel_err``
    (max|Δ| / max|attn_out|) of the whole layer. After each forward pass the softmax scales and
    rope layouts of all layers must agree, and a layer over ``check_tol`` (its error over the
    sequences run so far already exceeds it, and can only grow) is an error.

    Layer streaming (model a LayerStreamer): the same file, written layer-major. Layer i's weights
    are loaded, its W_UK / W_UV written, every sequence run through it (hidden states of all
    sequences kept on the host between layers: LayerStreamer.run), each record written and checked
    as above, then the layer is checked over all sequences and its weights freed. The layers run the
    same modules on the same inputs as the model's own forward, so the datasets and attributes equal
    those of the in-memory model bit for bit (tests/python/test_dump_layers.py). Peak host memory:
    the largest decoder layer's weights + the hidden states of all sequences (or none, when they
    are spilled to a file) + one layer's tensors of one sequence, flat in the number of layers.

    Raises DumpError (existing output without force, bad q_rows, empty input), MLAModuleNotFoundError
    (no MLA module), RuntimeError (config/weights disagree, inconsistent scale/layout across layers, a
    layer that did not run, failed self-check); input errors are raised before any file is created.
    """
    import h5py

    if config_dict.get("model_type") == "deepseek_v4":  # its own cache family and writer (latentq.dump_v4)
        from latentq.dump_v4 import dump_v4

        kw = dict(model_name=model_name, revision=revision, source=source, original_dtype=original_dtype)
        kw.update(text_sha256=text_sha256, force=force, compression=compression, check_tol=check_tol)
        return dump_v4(model, config_dict, token_ids_per_seq, q_rows, out_path, extra_attrs=extra_attrs, **kw)
    if os.path.exists(out_path) and not force:
        raise DumpError(f"{out_path} exists; pass force=True (--force) to overwrite")
    from latentq.stream import LayerStreamer

    streamer = model if isinstance(model, LayerStreamer) else None
    module = streamer.model if streamer is not None else model
    plan = _Plan(module, config_dict, token_ids_per_seq, q_rows)
    compute_dtype = streamer.dtype if streamer is not None else next(model.parameters()).dtype
    if check_tol is None:
        check_tol = 1e-4 if compute_dtype == torch.float32 else 2e-2
    if revision is None:
        revision = (
            weights_revision(streamer.path) if streamer is not None else "sha256-state-dict:" + state_dict_sha256(model)
        )
    if original_dtype is None:
        original_dtype = str(config_dict.get("torch_dtype") or config_dict.get("dtype") or compute_dtype).replace(
            "torch.", ""
        )
    kw = compression_kw(compression)
    tmp = temp_output(out_path)
    was_training = module.training
    try:
        with h5py.File(tmp, "w") as f:
            _create_datasets(f, plan, kw, weights=streamer is None)
            writer = _LayerWriter(f, plan)
            if streamer is not None:
                _run_streamed(streamer, f, plan, writer, check_tol)
            else:
                _run_sequences(model, plan, writer, check_tol)
            meta = {
                "model": model_name,
                "revision": revision,
                "source": source,
                "original_dtype": original_dtype,
                "compute_dtype": str(compute_dtype).replace("torch.", ""),
                "text_sha256": text_sha256,
            }
            _write_root_attrs(f, plan, writer, config_dict, meta, extra_attrs)
        publish(tmp, out_path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    finally:
        module.train(was_training)
    errs = {i: writer.rel_err(i) for i in plan.layer_ids}
    return {
        "path": out_path,
        "bytes": os.path.getsize(out_path),
        "softmax_scale": next(iter(writer.scales)),
        "softmax_scale_config": config_softmax_scale(config_dict) if "qk_nope_head_dim" in config_dict else None,
        "rope_layout": next(iter(writer.layouts)),
        "cache_family": plan.cache_family,
        "max_rel_err": errs,
        "num_layers": len(plan.layer_ids),
    }


def main(argv=None) -> int:
    """CLI entry point (see the module docstring). Returns 0 on success, 2 on a refused request
    (existing output without --force, missing/unreadable --text, a --model directory without a
    readable config.json, text too short, bad --q-rows, no MLA module, a bad --memory-budget, a
    checkpoint that cannot be streamed under --stream on), with one line "latentq dump: error: ..."
    on stderr."""
    ap = StepParser("dump", prog="python -m latentq.dump", description=__doc__)
    ap.add_argument("--model", required=True, help="tiny-mla directory or HF model directory / id")
    ap.add_argument("--text", required=True, help="text file (its bytes are tokenized)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--num-seqs", type=int, default=4)
    ap.add_argument("--q-rows", type=int, default=256, help="query rows per layer, over all sequences")
    ap.add_argument("--out", required=True)
    ap.add_argument("--force", action="store_true", help="overwrite an existing --out")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="compute dtype (stored data is float32)")
    ap.add_argument("--gzip", action="store_true", help="gzip-compress the datasets (default: uncompressed)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="torch device the model runs on (cpu, cuda, cuda:1)")
    ap.add_argument("--quiet", action="store_true", help="one line at the end instead of the JSON summary")
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument(
        "--tokenizer",
        choices=("auto", "bytes"),
        default="auto",
        help="auto: the checkpoint's tokenizer (byte tokens only when it has none; one that fails to load is an "
        "error); bytes: the text's bytes are the tokens. The dump's tokenizer attribute records which",
    )
    ap.add_argument(
        "--stream",
        choices=("auto", "on", "off"),
        default="auto",
        help="run layer by layer from the safetensors shards (auto: when the weights exceed the memory budget)",
    )
    ap.add_argument(
        "--memory-budget",
        default=None,
        help="host memory for weights + hidden states, e.g. 24G (default: half the physical memory)",
    )
    a = ap.parse_args(argv)
    from latentq.progress import quiet_import_noise

    quiet_import_noise()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    def fail(msg: str) -> int:
        say("dump", "error", msg)
        return 2

    try:
        refuse_output_over_input(
            [
                ("the checkpoint directory --model", a.model if os.path.isdir(a.model) else ""),
                ("the text --text", a.text),
            ],
            [("the dump --out", a.out)],
        )
    except ValueError as e:
        return fail(str(e))
    if os.path.exists(a.out) and not a.force:
        return fail(f"{a.out} exists; pass --force to overwrite")
    try:
        with open(a.text, "rb") as f:
            text = f.read()
    except OSError as e:
        return fail(f"--text {a.text}: cannot read ({e.strerror or type(e).__name__})")
    if os.path.isdir(a.model):
        cfg_path = os.path.join(a.model, "config.json")
        if not os.path.isfile(cfg_path):
            return fail(
                f"--model {a.model}: no config.json in the directory (expected a tiny-mla or HF model directory)"
            )
        try:
            with open(cfg_path) as f:
                json.load(f)
        except (OSError, ValueError) as e:
            return fail(f"--model {a.model}: cannot read {cfg_path} as JSON ({e})")
    if why_not := device_error(a.device):
        return fail(why_not)
    from latentq.stream import CheckpointError

    try:
        stream, why, budget = stream_plan(a.stream, a.memory_budget, a.model, DTYPES[a.dtype])
    except ModelError as e:
        return fail(str(e))
    say("dump", "note", f"{'layer streaming' if stream else 'in memory'} ({why})")
    out_dir = os.path.dirname(os.path.abspath(a.out))
    try:
        model, cfg, source, rev, orig, tok = load_model(
            a.model,
            DTYPES[a.dtype],
            a.trust_remote_code,
            stream=stream,
            device=a.device,
            memory_budget=budget,
            spill_dir=out_dir if os.path.isdir(out_dir) else None,
            tokenizer=a.tokenizer,
        )
    except (CheckpointError, ModelError, MLAModuleNotFoundError) as e:
        return fail(str(e))
    if tok is not None:
        ids = tok(text.decode("utf-8", errors="replace"), add_special_tokens=False)["input_ids"]
        tokenizer = type(tok).__name__
    else:
        ids = list(text)
        tokenizer = "bytes"
    try:
        seqs = windows(ids, a.seq_len, a.num_seqs)
        summary = dump(
            model,
            cfg,
            seqs,
            a.q_rows,
            a.out,
            model_name=os.path.basename(os.path.normpath(a.model)),
            revision=rev,
            source=source,
            original_dtype=orig,
            text_sha256=hashlib.sha256(text).hexdigest(),
            force=a.force,
            compression="gzip" if a.gzip else None,
            extra_attrs={
                "tokenizer": tokenizer,
                "model_class": type(model.model if stream else model).__name__,
                "model_class_note": native_class_note(a.model) or "",
            },
        )
    except (DumpError, MLAModuleNotFoundError, CheckpointError) as e:
        return fail(str(e))
    summary["execution"] = "layer streaming" if stream else "in memory"
    if stream:
        summary["hidden_states"] = "memory" if model.states_in_memory else "temporary file"
        summary["load_seconds"] = round(model.load_seconds, 3)
        summary["compute_seconds"] = round(model.compute_seconds, 3)
    if a.quiet:
        print(
            f"dump: wrote {a.out} ({summary.get('num_layers', '?')} layers, {len(seqs)} x {a.seq_len} tokens, "
            f"{summary['execution']}, {a.device})"
        )
    else:
        print(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
