"""Quantized caches in a DeepSeek-V4 model: the window entries, the compressed entries and the CSA indexer's keys.

What a V4 layer caches and reads is in latentq.deepseek_v4's docstring (written from transformers 5.24.0
``models/deepseek_v4/modeling_deepseek_v4.py``). The model code is never edited: forward hooks and a wrapper of the
module-level ``eager_attention_forward`` of that python module (the name ``DeepseekV4Attention.forward`` passes to
``ALL_ATTENTION_FUNCTIONS.get_interface`` under eager attention, looked up at call time), all removed on exit.

The caches (``V4_CACHES``), each a matrix of rows [B, R, width] per layer and forward (one sequence per batch row):

===================  ==========================================================  =========================
``window_kv``        the shared K = V entry of every token: ``kv_norm(kv_proj(x))``  [B, T, head_dim]
                     after RoPE (rope slice = the LAST d_r columns, interleaved)
``compressed_kv``    the CSA / HCA compressor's entries (after RoPE), one per        [B, N, head_dim]
                     complete window of ``compress_rate`` tokens
``index_k``          the CSA indexer's compressed keys (after RoPE), one per entry  [B, N, index_head_dim]
===================  ==========================================================  =========================

Where they are replaced. The attention receives key = value = cat(window entries, compressed entries) along the key
axis (``DeepseekV4Attention.forward``); the wrapper of ``eager_attention_forward`` splits it at T = the query length
(one forward from position 0, no cache: the window entries are this forward's own, refused otherwise) and passes
the attention the replaced entries as key and value alike, so the model's own attention code runs on them. The
indexer's keys are replaced at the input of ``DeepseekV4IndexerScorer`` (forward pre-hook), so the top-k each query
reads, and with it the compressor's ``block_bias``, is the one the model computes from the quantized keys, as in an
engine that stores them quantized.

Prefill order (``V4CacheInjector(model, inject=fn)``): ``fn(layer, cache, x [B, R, width]) -> x'`` (same shape; cast
to x's dtype), each forward's whole cache at once.

Decode order (``V4CacheInjector(model, decode=fn)``): ``fn(layer, cache, x) -> None`` (the layer reads its own) or
(quantized [B, R, w], engine-precision [B, R, w], read [R, R] bool): row r of the cache is read from ``quantized`` by
the cache's time step s iff read[s, r] (latentq.decode_order_mask over the cache's own rows: tokens for window_kv,
entries for compressed_kv and index_k). A query at position t is at time step t of the window and at step
n_t - 1 of the compressed caches, n_t = (t + 1) // compress_rate the entries written by then (the compressor emits
entry w once token (w + 1)·m - 1 is processed; a query with n_t = 0 reads none). The model's attention then runs
on both reads stacked along the key axis, the mask admitting each (query, key) pair in the read it gets and
excluding it (-inf) in the other (``stacked_reads``); the indexer scores each (query, entry) with the key read it
gets (the scorer run on both reads, picked per pair). A token's hidden state at every layer is computed when the
token is processed, so one causal forward with these reads is token-by-token decode of such a cache (as
latentq.inject.DecodeOrderAttention does for MLA). Where every (query, key) pair the attention mask admits reads the
same version (all engine-precision, or all quantized: a causal per-token format with no bf16 rows), the model's own
attention runs on that version, so such a run equals the prefill-at-once one bit for bit; so does one whose two
reads are the same values (bf16 in a bfloat16 model).

``record=True`` keeps each CSA layer's selection (the indexer's output, [B, T, k] int64, -1 = none) in
``selected[layer]``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import nn

from latentq.deepseek_v4 import CSA, find_v4_layers

V4_CACHES = ("window_kv", "compressed_kv", "index_k")
ENTRY_CACHES = ("window_kv", "compressed_kv")  # head_dim-wide rows: nope part, then the rope slice
EAGER = "eager_attention_forward"

InjectFn = Callable[[int, str, torch.Tensor], torch.Tensor]
DecodeFn = Callable[[int, str, torch.Tensor], "tuple | None"]


def entry_read(read: torch.Tensor, positions: torch.Tensor, rate: int) -> torch.Tensor:
    """[T, N] bool: whether the query at each position reads compressed entry w quantized, from the entry-time mask
    read [N, N] (decode_order_mask over the entries): row n_t - 1 with n_t = (position + 1) // rate, no entry for
    n_t = 0 (and entries w >= n_t are not yet written: False)."""
    n = read.shape[0]
    step = (positions.to(torch.long) + 1) // rate - 1  # [T]
    out = torch.zeros(positions.shape[0], n, dtype=torch.bool, device=read.device)
    ok = step >= 0
    if n and bool(ok.any()):
        out[ok] = read[step[ok].clamp(max=n - 1)]
    return out


def stacked_reads(kq: torch.Tensor, kb: torch.Tensor, read: torch.Tensor, mask: torch.Tensor):
    """The shared key = value read two ways per (query, key), as one attention input: kq / kb [B, 1, K, D] the
    quantized / engine-precision reads, read bool [T, K] (True: the quantized read), mask [B, 1, T, K] the additive
    mask the attention received (causal, sliding window, block_bias). Returns (key [B, 1, 2K, D] = [kq; kb], mask
    [B, 1, T, 2K]): key j of kq admitted for query t where read[t, j], of kb where not, each with the mask's own
    value, the other -inf. The attention over them (any of its code: sinks, softmax, p·v) is the attention over the
    keys each query reads: an excluded key gets probability 0 and adds 0 to the output."""
    inf = torch.tensor(float("-inf"), dtype=mask.dtype, device=mask.device)
    return torch.cat([kq, kb], dim=2), torch.cat([torch.where(read, mask, inf), torch.where(read, inf, mask)], dim=-1)


class V4CacheInjector:
    """``with V4CacheInjector(model, inject=fn): model(ids, use_cache=False)`` (or ``decode=fn``): the V4 caches
    replaced as the module docstring says. Raises ValueError (entering: no DeepseekV4Attention; in the forward: a
    cache that already holds tokens, a non-tensor attention mask, i.e. not eager attention)."""

    def __init__(self, model: nn.Module, inject: InjectFn | None = None, decode: DecodeFn | None = None, record=False):
        if (inject is None) == (decode is None):
            raise TypeError("V4CacheInjector takes one of inject= (prefill order) and decode= (decode order)")
        self.model, self.inject, self.decode, self.record = model, inject, decode, record
        self.attns = find_v4_layers(model)
        self._ids = {id(a) for a in self.attns}
        self.selected: dict[int, torch.Tensor] = {}
        self._handles: list = []
        self._patches: list = []
        self._positions: dict[int, torch.Tensor] = {}

    def __enter__(self) -> V4CacheInjector:
        try:
            for attn in self.attns:
                self._hook(attn)
            for name in {type(a).__module__ for a in self.attns}:
                pymod = sys.modules[name]
                old = getattr(pymod, EAGER)
                self._patches.append((pymod, old))
                setattr(pymod, EAGER, self._eager_wrapper(old))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for h in reversed(self._handles):
            h.remove()
        self._handles.clear()
        for pymod, old in reversed(self._patches):
            setattr(pymod, EAGER, old)
        self._patches.clear()

    def _hook(self, attn: nn.Module) -> None:
        idx = attn.layer_idx

        def pre(mod, args, kwargs):
            where = f"layer {idx} ({mod.layer_type})"
            cache = kwargs.get("cache")
            if cache is not None and cache.get_seq_length(idx) > 0:
                raise ValueError(f"{where}: the cache already holds {cache.get_seq_length(idx)} tokens; the V4 cache "
                                 "injection takes one forward from position 0 (use_cache=False)")  # fmt: skip
            if not isinstance(kwargs.get("attention_mask"), torch.Tensor):
                raise ValueError(
                    f"{where}: attention_mask is not a tensor (attn_implementation "
                    f"{mod.config._attn_implementation!r}); the compressed entries' mask would be dropped: use eager"
                )
            self._positions[idx] = kwargs["position_ids"].reshape(-1, kwargs["position_ids"].shape[-1])[0]

        self._handles.append(attn.register_forward_pre_hook(pre, with_kwargs=True))
        if attn.layer_type != CSA:
            return
        ix = attn.compressor.indexer
        if self.inject is not None:

            def scorer_pre(mod, args):  # (q [B, T, n_h, c], index keys [B, N, c], hidden_states)
                if args[1].shape[1] == 0:
                    return None
                k = self.inject(idx, "index_k", args[1])
                return (args[0], k.to(device=args[1].device, dtype=args[1].dtype), *args[2:])

            self._handles.append(ix.scorer.register_forward_pre_hook(scorer_pre))
        else:
            rate = int(ix.compress_rate)

            def scorer_post(mod, args, out):  # out: [B, T, N] scores
                q, k, hs = args[:3]
                got = self.decode(idx, "index_k", k) if k.shape[1] else None
                if got is None:
                    return None
                kq, kb, read = (torch.as_tensor(x).to(k.device) for x in got)
                kq, kb = kq.to(k.dtype), kb.to(k.dtype)
                rd = entry_read(read.to(torch.bool), self._positions[idx].to(k.device), rate)
                sb = type(mod).forward(mod, q, kb, hs)
                if not bool(rd.any()):
                    return sb
                return torch.where(rd, type(mod).forward(mod, q, kq, hs), sb)

            self._handles.append(ix.scorer.register_forward_hook(scorer_post))
        if self.record:

            def ix_post(mod, args, out):
                self.selected[idx] = out.detach().to("cpu").clone()

            self._handles.append(ix.register_forward_hook(ix_post))

    def _eager_wrapper(self, fn):
        def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
            if id(module) not in self._ids or key is not value:
                return fn(module, query, key, value, attention_mask, *args, **kwargs)
            T, idx = query.shape[2], module.layer_idx
            win, comp = key[:, 0, :T], key[:, 0, T:]
            if self.inject is not None:
                parts = [self.inject(idx, "window_kv", win)]
                parts.append(self.inject(idx, "compressed_kv", comp) if comp.shape[1] else comp)
                kv = torch.cat([p.to(device=key.device, dtype=key.dtype) for p in parts], dim=1)[:, None]
                return fn(module, query, kv, kv, attention_mask, *args, **kwargs)
            return self._decode_attention(fn, module, query, key, attention_mask, args, kwargs)

        wrapper.__wrapped__ = fn
        return wrapper

    def _decode_attention(self, fn, module, query, key, attention_mask, args, kwargs):
        T, idx, dev = query.shape[2], module.layer_idx, key.device
        pos = self._positions[idx].to(dev)
        reads, kqs, kbs = [], [], []
        for name, x in (("window_kv", key[:, 0, :T]), ("compressed_kv", key[:, 0, T:])):
            got = self.decode(idx, name, x) if x.shape[1] else None
            if got is None:
                kqs.append(x)
                kbs.append(x)
                reads.append(torch.zeros(T, x.shape[1], dtype=torch.bool, device=dev))
                continue
            xq, xb, read = (torch.as_tensor(v).to(dev) for v in got)
            kqs.append(xq.to(key.dtype))
            kbs.append(xb.to(key.dtype))
            read = read.to(torch.bool)
            reads.append(read if name == "window_kv" else entry_read(read, pos, module.compressor.compress_rate))
        kq, kb, read = torch.cat(kqs, 1)[:, None], torch.cat(kbs, 1)[:, None], torch.cat(reads, 1)
        m = attention_mask
        visible = m > torch.finfo(m.dtype).min / 2 if m.dtype != torch.bool else m  # [B, 1, T, K]
        if not bool((read & visible).any()):  # every pair the mask admits reads one version: the model's own
            return fn(module, query, kb, kb, attention_mask, *args, **kwargs)  # attention on it
        if bool((read | ~visible).all()):
            return fn(module, query, kq, kq, attention_mask, *args, **kwargs)
        if torch.equal(kq, kb):  # the two reads are the same rows (e.g. bf16 in a bfloat16 model)
            return fn(module, query, kb, kb, attention_mask, *args, **kwargs)
        key, mask = stacked_reads(kq, kb, read, attention_mask)
        return fn(module, query, key, key, mask, *args, **kwargs)
