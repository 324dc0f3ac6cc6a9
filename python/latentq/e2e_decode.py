"""The decode-order side of the e2e step (latentq.e2e): cache modes, the two reads of the latent cache
per layer for DecodeOrderAttention (latentq.inject), their batched form, and the cache's bytes per token.

A cache mode is 'prefill-at-once' or 'decode-r<R>-s<S>-p<P>' (latentq/decode_order.h, through the
compiled latentq module; the rule is not restated here). Every function that takes ``latentq`` takes the
package with its compiled part (latentq.e2e.import_latentq).
"""

from __future__ import annotations

import torch

from latentq.fitted_basis import needs_basis, transform_of

PREFILL_AT_ONCE = "prefill-at-once"


def mode_rsp(latentq, mode: str) -> tuple[int, int, int]:
    """(residual, sink, prefill) of a cache-mode label ('prefill-at-once': (0, 0, 0)), parsed by the module
    (latentq.decode_order: DecodeOrder::parse). Raises ValueError naming a malformed label."""
    try:
        return tuple(latentq.decode_order(mode))
    except ValueError as e:
        raise ValueError(str(e) if str(e).startswith(f"cache mode '{mode}'") else f"cache mode '{mode}': {e}") from None


DECODE_TARGETS = ("c_kv", "k_pe", "c_kv+k_pe")


def spec_at(spec, layer: int, target: str) -> str | None:
    """The spec of (layer, target): `spec` itself (a string), or its entry in a mixed assignment dict."""
    return spec if isinstance(spec, str) else spec.get((layer, target))


def make_decode_cache(latentq, spec, targets: tuple[str, ...], layers, mode: str, bases=None):
    """cache_fn for latentq.inject.DecodeOrderAttention: per layer in `layers` (None: every layer),
    c_kv / k_pe [B, T, D] (one sequence per batch row) -> (quantized, bf16, read_quantized [T, T])
    for each, from latentq.decode_order_latents and latentq.decode_order_mask(mode, T, G) with
    G = latentq.decode_token_group of the target's spec. A target the quantizer does not cover is read
    exact on both sides (mask all False); a layer with no covered target returns None (model's own).
    `bases(layer, target, transform)`: the basis of a 'klt,' / 'sklt,' spec (latentq.fitted_basis.StudyBases)."""
    masks: dict[tuple[int, int], torch.Tensor] = {}

    def fn(layer: int, c_kv: torch.Tensor, k_pe: torch.Tensor):
        if layers is not None and layer not in layers:
            return None
        out, covered = [], False
        for name, x in (("c_kv", c_kv), ("k_pe", k_pe)):
            s = spec_at(spec, layer, name) if name in targets else None
            B, T, D = x.shape
            if s is None:
                out += [x, x, torch.zeros(T, T, dtype=torch.bool)]
                continue
            flat = x.detach().to("cpu", torch.float32).reshape(B * T, D).contiguous().numpy()
            basis = bases(layer, name, transform_of(s)) if needs_basis(s) else None
            q, b = latentq.decode_order_latents(flat, s, mode, name, [i * T for i in range(B + 1)], basis)
            G = latentq.decode_token_group(s)
            if (G, T) not in masks:
                masks[(G, T)] = torch.from_numpy(latentq.decode_order_mask(mode, T, G))
            out += [torch.from_numpy(q).reshape(B, T, D), torch.from_numpy(b).reshape(B, T, D), masks[(G, T)]]
            covered = True
        return tuple(out) if covered else None

    return fn


def batch_decode_cache(fns: list, n: int):
    """cache_fn (DecodeOrderAttention) for K decode-order runs in one forward, rows as batch_inject:
    run k's cache_fn fns[k] (make_decode_cache) sees its n rows of c_kv / k_pe [K·n, T, D]; the read
    masks become [K·n, 1, T, T] (run k's [T, T] mask on its rows), and a run whose cache_fn returns None
    for the layer keeps the model's own attention output on its rows (the 7th element, rows [K·n])."""

    def fn(layer: int, c_kv: torch.Tensor, k_pe: torch.Tensor):
        res = [
            None if f is None else f(layer, c_kv[k * n : (k + 1) * n], k_pe[k * n : (k + 1) * n])
            for k, f in enumerate(fns)
        ]
        if all(r is None for r in res):
            return None
        T, out = c_kv.shape[1], []
        for i, x in ((0, c_kv), (3, k_pe)):
            q, b, m = [], [], []
            for k, r in enumerate(res):
                xs = x[k * n : (k + 1) * n]
                if r is None:
                    q.append(xs)
                    b.append(xs)
                    m.append(torch.zeros(n, 1, T, T, dtype=torch.bool, device=x.device))
                else:
                    q.append(torch.as_tensor(r[i]).to(device=x.device, dtype=x.dtype))
                    b.append(torch.as_tensor(r[i + 1]).to(device=x.device, dtype=x.dtype))
                    m.append(torch.as_tensor(r[i + 2]).to(device=x.device, dtype=torch.bool).expand(n, 1, T, T))
            out += [torch.cat(q), torch.cat(b), torch.cat(m)]
        rows = torch.tensor([r is not None for r in res], dtype=torch.bool).repeat_interleave(n)
        return tuple(out) + (rows,)

    return fn


def cache_bytes_per_token(
    latentq,
    spec,
    targets: tuple[str, ...],
    layers: list[int],
    mode: str,
    dims: dict,
    L: int,
    num_seqs: int,
    memo: dict | None = None,
) -> float:
    """Bytes per token per layer of the latent cache once L tokens are decoded, mean over `layers`:
    per target (c_kv: kv_lora_rank, k_pe: qk_rope_head_dim columns), latentq.decode_order_cache_bytes of
    num_seqs sequences of L tokens (the one decode-order accounting, C++ decode_order.h, that
    /attention_position uses: the sink, the residual window and the incomplete group in bf16 at 2 bytes per
    element, the complete groups with their metadata, a per-tensor scale once) / (num_seqs * L).
    A target the spec does not cover counts at 2 bytes/element. Raises ValueError as quantize().
    `memo`: a dict shared across calls (e.g. every run of one e2e step); the bytes of one (spec, target)
    depend only on (spec, target, mode, L, num_seqs, width)."""
    widths = {"c_kv": dims["kv_lora_rank"], "k_pe": dims["qk_rope_head_dim"]}
    memo = {} if memo is None else memo
    offsets = [i * L for i in range(num_seqs + 1)]
    total = 0.0
    for layer in layers:
        for name, D in widths.items():
            s = spec_at(spec, layer, name) if name in targets else None
            if s is None:
                total += 2.0 * D
                continue
            key = (s, name, mode, L, num_seqs, D)
            if key not in memo:
                memo[key] = latentq.decode_order_cache_bytes(s, name, D, offsets, mode, widths["k_pe"]) / (num_seqs * L)
            total += memo[key]
    return total / len(layers)
