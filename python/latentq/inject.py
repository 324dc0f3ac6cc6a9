"""Inject quantized latents into an MLA model: replace c_kv / k_pe, or read the cache in decode order.

The hook points, the RoPE and softmax-scale capture and the model requirements are those of
latentq.capture (``LatentHooks``); this module holds the two ways the study changes what a layer
reads.

Injection: ``fn(layer_idx, name, tensor) -> tensor`` with name ``"c_kv"`` ([B, T, kv_lora_rank]) or
``"k_pe"`` ([B, T, qk_rope_head_dim], post-RoPE); the returned tensor must have the same shape and is
cast to the model's dtype/device. The replacement is what the rest of the layer (kv_b_proj, the
cache, the attention) sees. c_kv is the latent the cache stores: for a model that scales it after
kv_a_layernorm (LongCat-Flash's ``mla_scale_kv_lora``) the scaled latent, replaced exactly (the hook
applies the scale and the module's own factor is 1.0 meanwhile: latentq.capture, "Latent scales");
an identity ``fn`` leaves the model's output bit for bit unchanged. For a NoPE layer (Kimi-Linear's
MLA layers; rope_layout "none") k_pe is the unrotated last qk_rope_head_dim columns of
``kv_a_proj_with_mqa``'s output, replaced there.

Decode order (``DecodeOrderAttention``): the attention of every query t reads key j from one of two
versions of the latent cache (quantized / bf16) per a [T, T] mask, which is token-by-token decode with
a quantized cache done in one causal forward (latentq/decode_order.h; the e2e step builds the two
versions and the mask with the ``latentq`` module). The model's own attention output, the input of
``o_proj``, is replaced by ``mixed_latent_attention`` (one SDPA over the keys of both reads, masked
per (t, j)) of the captured q_nope, q_pe, c_kv and k_pe; the model's own SDPA call is skipped there.

``mixed_latent_attention`` is a reference implementation in torch, kept for the e2e step and the
tests, and ``absorbed_mixed_attention`` the same result in DeepSeek-V3's absorbed form (the one
latentq.e2e_generate decodes with: one new query over a long history); the product is the C++
absorbed-attention engine (attention/, header latentq/attention/attention.h), which the study's
/attention_error and /attention_position cells run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from latentq.capture import InjectFn, LatentHooks


class LatentInjector(LatentHooks):
    """``with LatentInjector(model, fn): model(ids)`` replaces c_kv / post-RoPE k_pe by ``fn``'s result.
    With ``capture=True`` the capture sees the injected tensors."""

    def __init__(self, model: nn.Module, fn: InjectFn, capture: bool = False, q_rows=None):
        if not callable(fn):
            raise TypeError("fn must be callable: fn(layer_idx, name, tensor) -> tensor")
        super().__init__(model, capture=capture, inject=fn, q_rows=q_rows)


# ---- decode order: a quantized cache read per (query, key) in one causal forward ------------------


# cache_fn(layer_idx, c_kv [B, T, r], k_pe [B, T, d_r]) -> None (the layer reads its exact latents) or
# (c_kv_quantized, c_kv_bf16, c_kv_read_quantized, k_pe_quantized, k_pe_bf16, k_pe_read_quantized[, rows]):
# the read masks bool [T, T] (every batch row) or [B, 1, T, T] (one per batch row); `rows` bool [B], optional:
# the batch rows whose attention output is replaced (the others keep the model's own output, as for None).
def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 for a float64 tensor, else float32 (the decode-order attention's arithmetic)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


DecodeCacheFn = Callable[[int, torch.Tensor, torch.Tensor], "tuple | None"]

# The unwrapped SDPA (LatentHooks patches torch.nn.functional's while installed): mixed_latent_attention runs
# inside a hooked layer and must neither record a scale nor be skipped as the model's own attention.
_SDPA = torch.nn.functional.scaled_dot_product_attention


def _read_masks(name: str, Tq: int, T: int, dev, read_c, read_kpe, visible=None):
    """The masks of both attention forms below: (causal, read_c, read_kpe), bool [1 or B, 1, Tq, T] on `dev`, the
    queries at the last Tq of T positions (query t sees key j <= t + T - Tq; ∩ `visible` when given), each read
    mask cut to the keys its query sees. Raises ValueError naming `name` when Tq > T."""
    if Tq > T:
        raise ValueError(f"{name}: {Tq} queries over {T} keys (the queries are the last positions)")
    as4 = lambda m: m.to(device=dev, dtype=torch.bool).reshape(-1, 1, Tq, T)  # [1 or B, 1, Tq, T]
    causal = as4(torch.ones(Tq, T, dtype=torch.bool, device=dev).tril(T - Tq))
    if visible is not None:
        causal = as4(visible) & causal
    return causal, as4(read_c) & causal, as4(read_kpe) & causal


def mixed_latent_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    c_q: torch.Tensor,
    c_b: torch.Tensor,
    read_c: torch.Tensor,
    kpe_q: torch.Tensor,
    kpe_b: torch.Tensor,
    read_kpe: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    softmax_scale: float,
    visible: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal MLA attention over a latent cache read two ways, chosen per (query t, key j).

    A Python reference of the absorbed MLA attention (the e2e step's decode-order runs and the tests use it);
    the product is the C++ engine (attention/, header latentq/attention/attention.h), which the study's
    attention cells run.

    q_nope [B, Tq, H, d_n], q_pe [B, Tq, H, d_r] (post-RoPE): the queries at the last Tq of the T key
    positions, T - Tq .. T - 1 (Tq = T: every position; Tq < T: incremental decode over a stored history,
    latentq.e2e_generate); c_q / c_b [B, T, r]: c_kv as read from the
    quantized cache / in bf16; kpe_q / kpe_b [B, T, d_r]: post-RoPE k_pe, same; read_c, read_kpe bool
    [Tq, T], or [B, 1, Tq, T] for a mask per batch row: True where query t reads key j of c_kv / k_pe
    quantized (entries j > t are ignored: the attention is causal); w_uk [H, d_n, r], w_uv [H, d_v, r]
    (kv_b_proj.weight.view(H, d_n + d_v, r) split, DeepSeek-V3 inference/model.py); softmax_scale: the
    model's applied scale; visible: optional bool [B, Tq, T] or [Tq, T], the keys each query reads (sparse MLA:
    causal ∩ top-k, the mask the model's attention received: LatentHooks' ``visible``), the others masked as the
    causal future is.
        s[t, h, j]  = scale · (q_nope W_UK · c[j] + q_pe · k_pe[j]),  each read per its mask at (t, j)
        out[t, h]   = W_UV (Σ_j softmax_j(s)[t, h, j] · c[j])         (c read per read_c, as the score)
    Computed in the expanded form (per head k_nope = W_UK·c and v = W_UV·c of each read of c_kv, as the
    model's own attention; the absorbed form's products, reassociated) by one
    torch.nn.functional.scaled_dot_product_attention over the keys of every (c_kv read, k_pe read) pair
    that some (t, j) uses, stacked along the key axis (T keys per pair: 2·T when the two masks are equal
    or one is constant, 3·T when one is inside the other, at most 4·T), with a boolean mask that admits
    key j of pair (X, Y) for query t iff j ≤ t, read_c[t, j] picks X and read_kpe[t, j] picks Y: each
    causal key once, so every row has its key t.
    v is padded with zero columns to q's head dim (torch's CPU flash kernel needs equal head dims; the
    columns change no output). float32 (float64 when q_nope is float64), on the inputs' device.
    Returns [B, Tq, H, d_v] in that dtype. Raises ValueError when Tq > T.
    """
    dt = _compute_dtype(q_nope)
    q_nope, q_pe, c_q, c_b, kpe_q, kpe_b, w_uk, w_uv = (
        x.to(dt) for x in (q_nope, q_pe, c_q, c_b, kpe_q, kpe_b, w_uk, w_uv)
    )
    B, Tq, H, d_n = q_nope.shape
    T = c_q.shape[1]  # keys; the queries are the last Tq positions (Tq = T but in incremental decode)
    d_r, d_v, dev = q_pe.shape[-1], w_uv.shape[1], c_q.device
    E = d_n + d_r
    causal, read_c, read_kpe = _read_masks("mixed_latent_attention", Tq, T, dev, read_c, read_kpe, visible)
    expand = lambda c, w: torch.einsum("btc,hdc->bhtd", c, w)  # [B, H, T, d]
    k_nope = {"q": expand(c_q, w_uk), "b": expand(c_b, w_uk)}
    v = {"q": expand(c_q, w_uv), "b": expand(c_b, w_uv)}
    kpe = {"q": kpe_q[:, None].expand(B, H, T, d_r), "b": kpe_b[:, None].expand(B, H, T, d_r)}
    keys, vals, masks = [], [], []
    for x, mc in (("q", read_c), ("b", causal & ~read_c)):
        for y, mk in (("q", read_kpe), ("b", causal & ~read_kpe)):
            m = mc & mk
            if not bool(m.any()):
                continue
            keys.append(torch.cat([k_nope[x], kpe[y]], dim=-1))
            vals.append(v[x])
            masks.append(m)  # [1 or B, 1, Tq, T]: the same leading dim for every pair
    qs = torch.cat([q_nope, q_pe], dim=-1).transpose(1, 2)  # [B, H, Tq, E]
    vv = torch.cat(vals, dim=2)
    if d_v < E:
        vv = torch.nn.functional.pad(vv, [0, E - d_v])
    o = _SDPA(qs, torch.cat(keys, dim=2), vv, attn_mask=torch.cat(masks, dim=-1), scale=softmax_scale)
    return o[..., :d_v].transpose(1, 2)  # [B, Tq, H, d_v]


def absorbed_mixed_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    c_q: torch.Tensor,
    c_b: torch.Tensor,
    read_c: torch.Tensor,
    kpe_q: torch.Tensor,
    kpe_b: torch.Tensor,
    read_kpe: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    softmax_scale: float,
    visible: torch.Tensor | None = None,
) -> torch.Tensor:
    """mixed_latent_attention's result (same arguments, shapes and dtype; Tq <= T queries at the
    last positions; `visible` must be None: dense MLA) in the absorbed form of DeepSeek-V3 inference/model.py
    (attn_impl "absorb"), the form latentq.e2e_generate decodes with (tests/python/test_inject_forms.py holds the
    two forms equal): q_lat = q_nope W_UK [B, Tq, H, r] once, then per (t, j) the score
        s[t, h, j] = scale · (q_lat[t, h] · c[j] + q_pe[t, h] · k_pe[j]),  c and k_pe each read per its mask,
    softmax over the causal keys j <= t + T - Tq, o_lat = Σ_j p · c[j] (c read per read_c), out = W_UV o_lat.
    The same products reassociated: for one new query over L keys it costs B·H·L·r multiply-adds per read instead
    of the expanded form's B·H·L·r·(d_n + d_v) to rebuild every key and value. Raises ValueError as
    mixed_latent_attention (Tq > T) and for a ``visible`` mask."""
    if visible is not None:
        raise ValueError("absorbed_mixed_attention: dense MLA only (no visible mask)")
    dt = _compute_dtype(q_nope)
    q_nope, q_pe, c_q, c_b, kpe_q, kpe_b, w_uk, w_uv = (
        x.to(dt) for x in (q_nope, q_pe, c_q, c_b, kpe_q, kpe_b, w_uk, w_uv)
    )
    Tq, T = q_nope.shape[1], c_q.shape[1]
    causal, rc, rk = _read_masks("absorbed_mixed_attention", Tq, T, c_q.device, read_c, read_kpe)
    q_lat = torch.einsum("bthd,hdc->bhtc", q_nope, w_uk)  # [B, H, Tq, r]
    qp = q_pe.transpose(1, 2)  # [B, H, Tq, d_r]
    score = lambda q, k: torch.einsum("bhtc,bjc->bhtj", q, k)
    s = torch.where(rc, score(q_lat, c_q), score(q_lat, c_b)) + torch.where(rk, score(qp, kpe_q), score(qp, kpe_b))
    p = torch.softmax((s * softmax_scale).masked_fill(~causal, float("-inf")), dim=-1)
    o_lat = torch.einsum("bhtj,bjc->bhtc", p * rc, c_q) + torch.einsum("bhtj,bjc->bhtc", p * ~rc, c_b)
    return torch.einsum("bhtc,hdc->bthd", o_lat, w_uv)  # [B, Tq, H, d_v]


class DecodeOrderAttention(LatentHooks):
    """``with DecodeOrderAttention(model, cache_fn): model(ids)`` runs the model with each MLA layer's
    attention reading its latent cache per (query, key) as ``cache_fn`` says (DecodeCacheFn): the exact decode order
    of a quantized cache (latentq/decode_order.h) in one causal forward, since a token's hidden state
    at every layer is computed when that token is processed.

    Per layer, the model's attention output (the input of ``o_proj``) is replaced by
    ``mixed_latent_attention`` of the captured q_nope, post-RoPE q_pe and the two reads of c_kv and k_pe
    ``cache_fn(layer, c_kv, k_pe)`` returns (called once per layer and forward), with the softmax scale
    captured at call time (LatentHooks; attribute fallback). The model's own attention is not computed
    where it is replaced: its ``scaled_dot_product_attention`` call (tiny-mla, HF's sdpa path) returns
    zeros of its output's shape instead, once ``cache_fn`` has returned a cache for the layer (an eager
    attention function still runs). A layer for which ``cache_fn`` returns None keeps the model's own
    output; a 7th element ``rows`` (bool [B]) keeps it for the batch rows it marks False (latentq.e2e
    batches several runs, some of which leave a layer exact; the model's attention then runs). Input ids
    [B, T]: every batch row is one sequence at positions 0..T-1 without padding (the masks are [T, T],
    shared by the rows, or [B, 1, T, T], one per row).
    The captured tensors stay on the model's device (float32; float64 for a float64 model).
    Raises as LatentHooks.
    """

    _NO_CACHE = object()
    # the attention of the captured tensors and the cache's reads (mixed_latent_attention's signature); a subclass
    # may give another form of the same arithmetic (latentq.e2e_generate's absorbed form for incremental decode)
    attention = staticmethod(mixed_latent_attention)

    def __init__(self, model: nn.Module, cache_fn: DecodeCacheFn):
        if not callable(cache_fn):
            raise TypeError("cache_fn must be callable: cache_fn(layer_idx, c_kv, k_pe) -> tuple | None")
        super().__init__(model, capture=True, inject=None)
        self.cache_fn = cache_fn

    def _store(self, layer: int, name: str, x: torch.Tensor) -> None:
        self.layers.setdefault(layer, {})[name] = x.detach().to(_compute_dtype(x))

    def _cache(self, idx: int):
        """cache_fn of this forward of layer idx, called once (at the SDPA call or at o_proj) and kept in
        the record until o_proj has used it."""
        rec = self.layers[idx]
        if "_decode_cache" not in rec:
            c = self.cache_fn(idx, rec["c_kv"], rec["k_pe"])
            rec["_decode_cache"] = self._NO_CACHE if c is None else c
        c = rec["_decode_cache"]
        return None if c is self._NO_CACHE else c

    def _sdpa_call(self, fn, query, *args, **kwargs):
        idx = self._current
        rec = self.layers.get(idx, {}) if idx is not None else {}
        if "c_kv" in rec and "k_pe" in rec:
            cache = self._cache(idx)
            if cache is not None and (len(cache) <= 6 or bool(torch.as_tensor(cache[6]).all())):
                key = args[0] if args else kwargs["key"]
                value = args[1] if len(args) > 1 else kwargs["value"]
                batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
                return query.new_zeros(*batch, query.shape[-2], value.shape[-1])  # SDPA's output shape
        return fn(query, *args, **kwargs)

    def _hook_layer(self, idx: int, attn: nn.Module) -> None:
        super()._hook_layer(idx, attn)
        dims = self.dims[idx]
        H, nope, vd, r = dims["num_heads"], dims["qk_nope_head_dim"], dims["v_head_dim"], dims["kv_lora_rank"]

        def pre(mod, args):
            self.layers.get(idx, {}).pop("_decode_cache", None)

        self._handles.append(attn.register_forward_pre_hook(pre))

        def o_pre(mod, args):
            rec = self.layers[idx]
            cache = self._cache(idx)
            rec.pop("_decode_cache", None)
            if cache is None:
                return None
            scale = rec.get("softmax_scale")
            if scale is None:
                scale = next(
                    (
                        float(getattr(attn, a))
                        for a in ("scaling", "softmax_scale")
                        if isinstance(getattr(attn, a, None), (int, float))
                    ),
                    None,
                )
                if scale is None:
                    raise RuntimeError(f"layer {idx}: no softmax scale captured and no scaling attribute")
            wkv_b = attn.kv_b_proj.weight.detach().to(_compute_dtype(rec["q_nope"])).view(H, nope + vd, r)
            dev = rec["q_nope"].device
            c_q, c_b, read_c, kpe_q, kpe_b, read_kpe = (torch.as_tensor(x).to(dev) for x in cache[:6])
            out = self.attention(
                rec["q_nope"],
                rec["q_pe"],
                c_q,
                c_b,
                read_c,
                kpe_q,
                kpe_b,
                read_kpe,
                wkv_b[:, :nope],
                wkv_b[:, nope:],
                scale,
                rec.get("visible"),  # sparse MLA: the keys the model's own attention read
            )
            x = args[0]
            out = out.reshape(x.shape).to(x.dtype)
            if len(cache) > 6:  # rows marked False keep the model's own output, bit for bit
                rows = torch.as_tensor(cache[6], dtype=torch.bool, device=x.device)
                out = torch.where(rows.view(-1, *([1] * (x.dim() - 1))), out, x)
            return (out,) + tuple(args[1:])

        self._handles.append(attn.o_proj.register_forward_pre_hook(o_pre))
