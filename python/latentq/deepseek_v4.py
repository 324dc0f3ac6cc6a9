"""Capture and recompute DeepSeek-V4 attention: shared K=V window entries, compressed entries, indexer, sinks.

Written from transformers 5.24.0 ``models/deepseek_v4/modeling_deepseek_v4.py`` (``DeepseekV4Attention.forward``,
``eager_attention_forward``, ``DeepseekV4CSACompressor.forward``, ``DeepseekV4HCACompressor.forward``,
``DeepseekV4Indexer.forward``, ``DeepseekV4IndexerScorer.forward``, ``apply_rotary_pos_emb``, ``rotate_half``) and
``masking_utils.py`` (``sliding_window_overlay``). The model code is never edited: PyTorch forward hooks only, all
removed on exit.

What a V4 layer attends to (one KV head shared by all H query heads; the same 512-wide vector is key and value):

* window entries: ``kv_norm(kv_proj(x))`` with RoPE on its LAST ``rope_dim`` columns (``qk_rope_head_dim``, 64 in
  V4-Flash), interleaved: pair (2i, 2i+1) of the rope slice rotated by angle ``pos · inv_freq[i]`` (``rotate_half``
  takes x[0::2], x[1::2]; cos / sin are ``repeat_interleave(2)``-ed). Query t reads window entries j with
  ``t - sliding_window < j <= t`` (``sliding_window_overlay`` on the causal mask).
* compressed entries (``compressed_sparse_attention`` "CSA", rate m = ``compress_rates[...]`` = 4, and
  ``heavily_compressed_attention`` "HCA", m = 128): one per complete window of m tokens, a softmax-gated pooling
  (gate + ``position_bias``) over its tokens, then ``kv_norm`` and RoPE at position ``w · m`` (the window's FIRST
  token). CSA overlaps: entry w pools window w's second half of ``kv_proj`` (Cb) and window w-1's first half (Ca), so
  it summarizes tokens [max(0, (w-1)·m), (w+1)·m); HCA entry w summarizes [w·m, (w+1)·m). Tokens after the last
  complete window are in no entry yet. Query t may see entry w iff ``w < (t + 1) // m`` (its last token <= t).
  HCA: every such entry is read. CSA: only the indexer's top-k of them.
* indexer (CSA only): its own compressor at ``index_head_dim`` (same windows, same overlap) gives index keys
  ``index_k`` [N, c]; its queries ``index_q`` [T, n_h, c] (``q_b_proj(q_residual)``, RoPE at the query position,
  "compress" rope); ``index_w = weights_proj(x) · n_h^-0.5``; score ``s[t, w] = Σ_h index_w[t, h] · relu(index_q[t,
  h] · index_k[w]) · c^-0.5`` (the latentq.sparse_mla formula), -inf for entries t may not see; query t reads the
  ``index_topk`` best visible entries (all of them when fewer are visible).
* sinks: one logit per head appended to every softmax row and dropped after it (``eager_attention_forward``).
* output: ``o = softmax([q·K^T · head_dim^-0.5 + mask, sink]) [:-1] @ K`` (V = K), then the rope slice of o is
  rotated back by ``-pos_t · inv_freq`` (``apply_rotary_pos_emb(o, cos, -sin)``) before the grouped output
  projection ``o_a_proj`` / ``o_b_proj``.

Sliding layers use the "main" rope (``rope_theta``), CSA / HCA layers the "compress" rope (``compress_rope_theta``,
maybe YaRN) for their query, window entries, compressed entries and indexer alike.

``V4Capture(model)`` records one :class:`V4LayerRecord` per decoder layer of one forward of a
``DeepseekV4ForCausalLM`` / ``DeepseekV4Model`` (eager attention). Hook points, per layer ``attn =
model.layers[i].self_attn``:

=========================  ==============================================================  =====================
field                      where it is read                                                shape, dtype
=========================  ==============================================================  =====================
``positions``              ``position_ids`` kwarg of ``attn`` (forward pre-hook)           [T] int64
``rope_cos`` / ``rope_sin``  ``position_embeddings[attn.rope_layer_type]`` kwarg, one value  [T, rope_dim/2] f32
                           per pair (as the model passes them; attention_scaling applied)
``q``                      output of ``attn.q_b_norm`` [1, H, T, D] + the module's own     [T, H, D] float32
                           ``apply_rotary_pos_emb`` with rope_cos / rope_sin
``window_kv``              output of ``attn.kv_norm`` [1, T, D] + the same RoPE             [T, D] float32
``compressed_kv``          first output of ``attn.compressor`` (forward hook)              [N, D] float32
``compressed_span``        [first token, end) each entry summarizes (see above)            [N, 2] int64
``compressed_rope_position``  w · m, the RoPE position of entry w                          [N] int64
``index_q`` / ``index_k``  inputs q, compressed_kv of ``attn.compressor.indexer.scorer``   [T, n_h, c], [N, c]
``index_w``                output of ``scorer.weights_proj`` · ``scorer.weights_scaling``  [T, n_h] float32
``index_selected``         output of ``attn.compressor.indexer`` (-1: invalid pick)        [T, k] int64
``sinks``                  ``attn.sinks``                                                  [H] float32
``attn_out``               input of ``attn.o_a_proj`` (forward pre-hook), after the        [T, H, D] float32
                           rope slice is rotated back; heads in order (group g = heads
                           g·H/o_groups ...)
=========================  ==============================================================  =====================

D = ``head_dim`` (512 in V4), all tensors row-major detached CPU float32 copies (int64 for indices), N = 0 and the
index fields None on sliding layers, index fields None on HCA layers. Scalars: ``softmax_scale`` (D^-0.5),
``index_softmax_scale`` (c^-0.5), ``index_topk``, ``sliding_window``, ``compress_rate`` (0 on sliding layers).

Scope (refused with ValueError, naming the layer and the value): batch size 1; one forward from position 0
(``position_ids`` = 0..T-1, an empty or no cache), so the window entries are this forward's own and the compressed
entries start at window 0; eager attention with a tensor mask. The last is not cosmetic: ``DeepseekV4Attention``
appends the compressor's ``block_bias`` (causality and top-k of the compressed entries) only to a *tensor*
``attention_mask``; with ``attention_mask=None`` it drops it, and every query would read every compressed entry,
future ones included. Post-RoPE window entries and queries are no module's output: the capture applies
transformers' ``apply_rotary_pos_emb`` itself to the outputs of ``kv_norm`` / ``q_b_norm`` with the cos / sin
the layer received, the very call the attention makes on the very tensors, so they are bit for bit what it reads.

``recompute_attention(record)`` gives the attention output from the record alone in float64;
``indexer_selection(record)`` the CSA top-k (ties to the lower entry index, latentq.sparse_mla.select_topk).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from transformers.models.deepseek_v4.configuration_deepseek_v4 import DEEPSEEK_V4_LAYER_TYPES as LAYER_TYPES

from latentq.sparse_mla import select_topk

SLIDING, CSA, HCA = LAYER_TYPES  # ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")


@dataclass
class V4LayerRecord:
    """One DeepSeek-V4 attention layer of one forward (fields: see the module docstring)."""

    layer: int
    layer_type: str
    sliding_window: int
    compress_rate: int
    softmax_scale: float
    positions: torch.Tensor
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    q: torch.Tensor
    window_kv: torch.Tensor
    sinks: torch.Tensor
    attn_out: torch.Tensor
    compressed_kv: torch.Tensor
    compressed_span: torch.Tensor
    compressed_rope_position: torch.Tensor
    index_q: torch.Tensor | None = None
    index_k: torch.Tensor | None = None
    index_w: torch.Tensor | None = None
    index_selected: torch.Tensor | None = None
    index_softmax_scale: float | None = None
    index_topk: int | None = None


def compressed_spans(n_entries: int, rate: int, overlap: bool, first_entry: int = 0) -> torch.Tensor:
    """[n_entries, 2] int64: [first token, end) that compressed entry ``first_entry + i`` summarizes. ``overlap``
    (CSA): window w's Cb and window w-1's Ca -> [max(0, (w-1)·rate), (w+1)·rate); else (HCA) [w·rate, (w+1)·rate)
    (``DeepseekV4CSACompressor.forward`` / ``DeepseekV4HCACompressor.forward``)."""
    if rate < 1:
        raise ValueError(f"compress rate must be >= 1, got {rate}")
    w = torch.arange(first_entry, first_entry + n_entries, dtype=torch.long)
    first = ((w - 1) * rate).clamp_min(0) if overlap else w * rate
    return torch.stack([first, (w + 1) * rate], dim=1)


def compressed_visible(positions, n_entries: int, rate: int) -> torch.Tensor:
    """[T, n_entries] bool: query at position t may see compressed entry w iff w < (t + 1) // rate, i.e. the
    entry's window is complete at t (``causal_threshold`` in the compressors and ``DeepseekV4Indexer.forward``)."""
    pos = torch.as_tensor(np.asarray(positions), dtype=torch.long)
    return torch.arange(n_entries)[None, :] < ((pos + 1) // rate)[:, None]


def window_visible(positions, sliding_window: int) -> torch.Tensor:
    """[T, T] bool: query at position t reads the window entry of position j iff t - sliding_window < j <= t
    (causal mask + ``sliding_window_overlay``); the record's rows are positions 0..T-1."""
    pos = torch.as_tensor(np.asarray(positions), dtype=torch.long)
    d = pos[:, None] - pos[None, :]
    return (d >= 0) & (d < sliding_window)


def _f64(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).to(torch.float64)


def index_scores_v4(rec: V4LayerRecord) -> torch.Tensor:
    """[T, N] float64: the CSA indexer's score of each compressed entry for each query, -inf where not visible."""
    q, w, k = _f64(rec.index_q), _f64(rec.index_w), _f64(rec.index_k)
    per_head = torch.relu(torch.einsum("thc,nc->thn", q, k)) * rec.index_softmax_scale
    s = torch.einsum("th,thn->tn", w, per_head)
    vis = compressed_visible(rec.positions, k.shape[0], rec.compress_rate)
    return s.masked_fill(~vis, float("-inf"))


def indexer_selection(rec: V4LayerRecord) -> torch.Tensor:
    """[T, N] bool: the compressed entries each query of a CSA layer reads: the index_topk highest visible scores
    (all visible entries when fewer), ties to the lower entry index."""
    if rec.layer_type != CSA:
        raise ValueError(f"layer {rec.layer} is {rec.layer_type}: only {CSA} layers have an indexer")
    if rec.compressed_kv.shape[0] == 0:
        return torch.zeros(rec.q.shape[0], 0, dtype=torch.bool)
    return select_topk(index_scores_v4(rec), rec.index_topk)


def compressed_read(rec: V4LayerRecord) -> torch.Tensor:
    """[T, N] bool: the compressed entries each query reads (CSA: indexer_selection; HCA: all visible)."""
    n = rec.compressed_kv.shape[0]
    if rec.layer_type == CSA:
        return indexer_selection(rec)
    if rec.layer_type == HCA:
        return compressed_visible(rec.positions, n, rec.compress_rate)
    return torch.zeros(rec.q.shape[0], 0, dtype=torch.bool)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the last 2·cos.shape[-1] columns of x [T, ..., D] pairwise (2i, 2i+1) by the angle of (cos, sin)
    [T, rope_dim/2] (``apply_rotary_pos_emb``: x·cos + rotate_half(x)·sin); pass -sin to rotate back."""
    r = 2 * cos.shape[-1]
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    c, s = cos.reshape(shape), sin.reshape(shape)
    nope, rope = x[..., :-r], x[..., -r:]
    a, b = rope[..., 0::2], rope[..., 1::2]
    rot = torch.stack([a * c - b * s, b * c + a * s], dim=-1).flatten(-2)
    return torch.cat([nope, rot], dim=-1)


def recompute_attention(rec: V4LayerRecord) -> torch.Tensor:
    """[T, H, D] float64: the layer's attention output before o_a_proj, from the record alone: keys = values =
    [window_kv; compressed_kv], the window / compressed visibility above, one sink logit per head, softmax scale
    D^-0.5, then the output's rope slice rotated back by the query's angle."""
    q, win, comp = _f64(rec.q), _f64(rec.window_kv), _f64(rec.compressed_kv)
    kv = torch.cat([win, comp], dim=0)  # [T + N, D]
    mask = torch.cat([window_visible(rec.positions, rec.sliding_window), compressed_read(rec)], dim=1)
    logits = torch.einsum("thd,kd->thk", q, kv) * rec.softmax_scale
    logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
    sinks = _f64(rec.sinks)[None, :, None].expand(q.shape[0], -1, 1)
    p = torch.softmax(torch.cat([logits, sinks], dim=-1), dim=-1)[..., :-1]
    out = torch.einsum("thk,kd->thd", p, kv)
    return rotate_pairs(out, _f64(rec.rope_cos), -_f64(rec.rope_sin))


def rel_error(a, b) -> float:
    """||a - b||_F / ||b||_F in float64."""
    a, b = _f64(a), _f64(b)
    return float(torch.linalg.norm((a - b).flatten()) / torch.linalg.norm(b.flatten()).clamp_min(1e-300))


def find_v4_layers(model: nn.Module) -> list[nn.Module]:
    """The ``DeepseekV4Attention`` modules of a DeepSeek-V4 model, in layer order (ValueError when none)."""
    attns = [m for m in model.modules() if type(m).__name__ == "DeepseekV4Attention"]
    if not attns:
        raise ValueError(f"{type(model).__name__}: no DeepseekV4Attention module (not a DeepSeek-V4 model)")
    return sorted(attns, key=lambda m: m.layer_idx)


def _cpu(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to("cpu").clone()


class V4Capture:
    """Context manager: ``with V4Capture(model) as cap: model(input_ids)``; then ``cap.records`` is one
    :class:`V4LayerRecord` per layer (module docstring: fields, hook points, scope).

    ``V4Capture(model, on_layer=fn)`` instead calls ``fn(record)`` from each layer's forward hook, once the
    layer's record is complete, and keeps nothing (a dump writes the layer and drops it before the next runs)."""

    def __init__(self, model: nn.Module, on_layer=None):
        self.model = model
        self.on_layer = on_layer
        self.attns = find_v4_layers(model)
        self.records: list[V4LayerRecord] = []
        self._handles: list = []
        self._state: dict[int, dict] = {}

    def __enter__(self) -> V4Capture:
        for attn in self.attns:
            self._hook(attn)
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, attn: nn.Module) -> None:
        idx = attn.layer_idx
        rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        add = self._handles.append

        def pre(mod, args, kwargs):
            pid = kwargs.get("position_ids")
            hs = args[0] if args else kwargs["hidden_states"]
            where = f"layer {idx} ({attn.layer_type})"
            if hs.shape[0] != 1:
                raise ValueError(f"{where}: V4Capture takes batch size 1, got hidden_states {tuple(hs.shape)}")
            T = hs.shape[1]
            if pid is None or not torch.equal(pid.reshape(-1).cpu(), torch.arange(T)):
                raise ValueError(f"{where}: V4Capture takes one forward from position 0 (position_ids 0..{T - 1})")
            cache = kwargs.get("cache")
            if cache is not None and cache.get_seq_length(idx) > 0:
                raise ValueError(f"{where}: the cache already holds {cache.get_seq_length(idx)} tokens; expected none")
            if not isinstance(kwargs.get("attention_mask"), torch.Tensor):
                raise ValueError(
                    f"{where}: attention_mask is not a tensor (attn_implementation "
                    f"{mod.config._attn_implementation!r}); the compressed entries' mask would be dropped: use eager"
                )
            cos, sin = kwargs["position_embeddings"][mod.rope_layer_type]
            self._state[idx] = dict(cos=cos, sin=sin, positions=_cpu(pid.reshape(-1)))

        def q_hook(mod, args, out):  # q_b_norm: [1, H, T, D] before RoPE
            st = self._state[idx]
            st["q"] = _cpu(rope(out, st["cos"], st["sin"])[0].transpose(0, 1))

        def kv_hook(mod, args, out):  # kv_norm: [1, T, D] before RoPE
            st = self._state[idx]
            st["window_kv"] = _cpu(rope(out.unsqueeze(1), st["cos"], st["sin"])[0, 0])

        def o_pre(mod, args):  # o_a_proj input [1, T, g, H·D/g]
            x = args[0]
            self._state[idx]["attn_out"] = _cpu(x.reshape(x.shape[1], attn.num_heads, attn.head_dim))

        def post(mod, args, kwargs, out):
            st = self._state.pop(idx)
            comp = mod.compressor
            rate = comp.compress_rate if comp is not None else 0
            ckv = st.get("compressed_kv", torch.zeros(0, mod.head_dim))
            n = ckv.shape[0]
            rec = V4LayerRecord(
                layer=idx,
                layer_type=mod.layer_type,
                sliding_window=mod.sliding_window,
                compress_rate=rate,
                softmax_scale=float(mod.scaling),
                positions=st["positions"],
                rope_cos=_cpu(st["cos"][0]),
                rope_sin=_cpu(st["sin"][0]),
                q=st["q"],
                window_kv=st["window_kv"],
                sinks=_cpu(mod.sinks.float()),
                attn_out=st["attn_out"],
                compressed_kv=ckv,
                compressed_span=compressed_spans(n, rate, mod.layer_type == CSA)
                if rate
                else torch.zeros(0, 2, dtype=torch.long),
                compressed_rope_position=torch.arange(n, dtype=torch.long) * rate,
            )
            if mod.layer_type == CSA:
                ix = comp.indexer
                rec.index_q, rec.index_k = st["index_q"], st["index_k"]
                rec.index_w, rec.index_selected = st["index_w"], st["index_selected"]
                rec.index_softmax_scale, rec.index_topk = float(ix.scorer.softmax_scale), int(ix.index_topk)
                if rec.index_k.shape[0] != n:
                    raise AssertionError(f"layer {idx}: {rec.index_k.shape[0]} index keys for {n} entries")
            if self.on_layer is not None:
                self.on_layer(rec)
            else:
                self.records.append(rec)

        add(attn.register_forward_pre_hook(pre, with_kwargs=True))
        add(attn.register_forward_hook(post, with_kwargs=True))
        add(attn.q_b_norm.register_forward_hook(q_hook))
        add(attn.kv_norm.register_forward_hook(kv_hook))
        add(attn.o_a_proj.register_forward_pre_hook(o_pre))
        if attn.compressor is None:
            return

        def comp_post(mod, args, out):  # (compressed_kv [1, 1, N, D], block_bias)
            self._state[idx]["compressed_kv"] = _cpu(out[0][0, 0])

        add(attn.compressor.register_forward_hook(comp_post))
        if attn.layer_type != CSA:
            return
        ix = attn.compressor.indexer

        def scorer_pre(mod, args):  # (q [1, T, n_h, c] after RoPE, index keys [1, N, c], hidden_states)
            self._state[idx]["index_q"] = _cpu(args[0][0])
            self._state[idx]["index_k"] = _cpu(args[1][0])

        def w_hook(mod, args, out):  # weights_proj: [1, T, n_h]
            self._state[idx]["index_w"] = _cpu(out[0].float() * ix.scorer.weights_scaling)

        def ix_post(mod, args, out):  # top-k entry indices [1, T, k], -1 = invalid
            self._state[idx]["index_selected"] = _cpu(out[0])

        add(ix.scorer.register_forward_pre_hook(scorer_pre))
        add(ix.scorer.weights_proj.register_forward_hook(w_hook))
        add(ix.register_forward_hook(ix_post))
