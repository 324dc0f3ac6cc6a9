"""Free-running greedy decoding of an MLA model with a quantized latent cache in decode order, one token per step.

The e2e step's decode-order runs (latentq.inject.DecodeOrderAttention) are teacher-forced: every position of a
fixed text in one causal forward. Serving failures show up in free-running generation, where a token the
quantized cache changes changes every later input. This module is the incremental decoder:

  prefill   one forward of the prompts [n, P] (positions 0 .. P-1); each MLA layer stores its latents
            c_kv [., P, r] and post-RoPE k_pe [., P, d_r] as its history;
  step i    one forward of one token per batch row at position P + i (the position ids given to the model, so
            RoPE is applied at the true position: tiny-mla's ``forward(input_ids, position_ids)``, HF's
            ``position_ids`` with ``use_cache=False``); each MLA layer appends the new token's latents to its
            history and its attention output (the input of ``o_proj``) is replaced by
            latentq.inject.mixed_latent_attention of the new query over the whole history, key j read from the
            quantized cache iff latentq.decode_order_mask(mode, L, G)[t, j] (L = the history's length, t = the
            query's position, G = latentq.decode_token_group(spec)), else in bf16; the two reads are
            latentq.decode_order_latents of the history (latentq/decode_order.h).
  token     the argmax of the last position's logits (the first maximum on ties), or the forced token
            (teacher forcing through the same path).

Every batch row of one forward holds one (run, prompt) pair: B = K runs × n prompts, run k on rows
k·n .. (k+1)·n - 1, each with its own spec and cache mode. The reference (exact latents: run None) reads its
history exactly, through the same attention.

What the cache holds per spec (``decode_order_latents`` is called on the history at every step):
  causal specs (latentq.decode_scale_is_causal true: per-token formats, per-channel token groups of G, fp8 tiles,
    the engine presets; also behind a had/rot/klt/sklt rotation, whose basis is fixed): a key's quantized value
    depends only on its own token (G = 1) or its complete token group, which the decode order reads quantized only
    once complete, so recomputing on the history gives the values a serving engine stores once: the logits equal
    those of the teacher-forced DecodeOrderAttention forward over prompt + tokens in the same mode
    (tests/python/test_e2e_generate.py, float tolerance).
  non-causal specs (per-tensor and per-channel-g0 integer scales, fp8-e4m3-tensor, nvfp4's per-tensor scale,
    and the fitted codebooks lm*, tc*, which decode_order_latents fits on the fit split of its input): their
    scale or codebook spans the quantized part of every sequence of the call. The teacher-forced run fits it on
    the whole text, future tokens included; here it is recomputed at every step on the history so far (the
    run's n prompts together, as the e2e step's call takes its n sequences together), and a token's hidden
    states are those computed at its own step (under the scale of that step's history): the cache a
    dynamic-scale engine would hold, not the teacher-forced run (the first generated position equals the
    teacher-forced run over the prompt alone; the /generation rows flag these specs with scale_causal = 0).
  prefill-at-once: every key is read quantized, the whole history quantized at once at every step (per-channel
    groups and per-tensor scales see the tokens so far, the incomplete group included).

Dense MLA only: every decoder layer must be an MLA layer (a hybrid model's other layers, e.g. Kimi-Linear's
linear attention, would need their own recurrent state) and no layer may have a DSA indexer (sparse MLA: its
top-k selection is not replayed here). Cost: the prefill, then new_tokens - 1 single-token forwards of the K·n
rows plus, per step, layer and quantized target, one decode_order_latents call per run on its history.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from latentq.capture import find_mla_layers
from latentq.e2e_decode import spec_at
from latentq.fitted_basis import needs_basis, transform_of
from latentq.inject import DecodeOrderAttention
from latentq.model import _is_hf


class CacheRun(NamedTuple):
    """One run of the engine: spec, a spec string or a mixed assignment {(layer, target): spec}; targets, the
    cached tensors it quantizes ("c_kv", "k_pe"); mode, its cache mode ('prefill-at-once' or
    'decode-r<R>-s<S>-p<P>'). ``None`` in a list of runs: the exact latents (the reference)."""

    spec: str | dict
    targets: tuple[str, ...]
    mode: str


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the engine cannot decode `model` incrementally (None: it can): a layer with a DSA indexer (sparse MLA),
    or decoder layers that are not MLA layers (config.num_hidden_layers > the MLA layers found)."""
    mla = find_mla_layers(model)
    if any(getattr(attn, "indexer", None) is not None for _, _, attn in mla):
        return "sparse MLA (a DSA indexer's top-k selection is not replayed by the incremental decoder)"
    layers = getattr(model.config, "num_hidden_layers", None)
    if layers is not None and int(layers) > len(mla):
        return (
            f"{int(layers) - len(mla)} of {int(layers)} decoder layers are not MLA layers (their own cache state "
            "is not kept by the incremental decoder)"
        )
    return None


def forward_at(model: nn.Module, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of input_ids [B, T] at position_ids [B, T] (int64), without the model's own KV cache."""
    if _is_hf(model):
        return model(input_ids=ids, position_ids=positions, use_cache=False).logits
    return model(ids, position_ids=positions)


class IncrementalCache:
    """cache_fn of DecodeOrderAttention for incremental decode: per MLA layer, the history of c_kv and post-RoPE
    k_pe of every batch row (float32; float64 for a float64 model), extended by each forward's new positions, and
    the two reads of that history with the read masks of the new queries.

    runs: K entries, CacheRun or None (exact latents); n: prompts per run (batch rows k·n .. (k+1)·n - 1 are run
    k's); layers: the layers a run quantizes (None: every MLA layer); bases(layer, target, transform): the basis
    of a 'klt,' / 'sklt,' spec (latentq.fitted_basis.StudyBases). Called with the new rows c_kv [K·n, Tq, r],
    k_pe [K·n, Tq, d_r]; returns (c_kv quantized, c_kv bf16, read_c [K·n, 1, Tq, L], k_pe quantized, k_pe bf16,
    read_kpe [K·n, 1, Tq, L]) over the history of length L. Raises ValueError as latentq.decode_order_latents
    (a spec the quantizers refuse, non-finite latents)."""

    def __init__(self, latentq, runs: list, n: int, layers=None, bases=None):
        self.latentq, self.runs, self.n, self.layers, self.bases = latentq, runs, n, layers, bases
        self.history: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._masks: dict[tuple[str, int, int], torch.Tensor] = {}

    def _spec(self, run, layer: int, name: str) -> str | None:
        if run is None or name not in run.targets or (self.layers is not None and layer not in self.layers):
            return None
        return spec_at(run.spec, layer, name)

    def _mask(self, mode: str, L: int, G: int) -> torch.Tensor:
        key = (mode, L, G)
        if key not in self._masks:
            self._masks[key] = torch.from_numpy(self.latentq.decode_order_mask(mode, L, G))
        return self._masks[key]

    def _reads(self, run, layer: int, name: str, x: torch.Tensor, Tq: int):
        """(quantized, bf16, mask [Tq, L]) of one run's rows x [n, L, D]."""
        s = self._spec(run, layer, name)
        n, L, D = x.shape
        if s is None:
            return x, x, torch.zeros(Tq, L, dtype=torch.bool)
        flat = x.detach().to("cpu", torch.float32).reshape(n * L, D).contiguous().numpy()
        basis = self.bases(layer, name, transform_of(s)) if needs_basis(s) else None
        q, b = self.latentq.decode_order_latents(flat, s, run.mode, name, [i * L for i in range(n + 1)], basis)
        G = self.latentq.decode_token_group(s)
        as_x = lambda a: torch.from_numpy(a).reshape(n, L, D).to(device=x.device, dtype=x.dtype)
        return as_x(q), as_x(b), self._mask(run.mode, L, G)[L - Tq :]

    def __call__(self, layer: int, c_kv: torch.Tensor, k_pe: torch.Tensor):
        old = self.history.get(layer)
        if old is not None:
            c_kv, k_pe = torch.cat([old[0], c_kv.detach()], 1), torch.cat([old[1], k_pe.detach()], 1)
        Tq = c_kv.shape[1] if old is None else c_kv.shape[1] - old[0].shape[1]
        self.history[layer] = (c_kv.detach(), k_pe.detach())
        L, n, out = c_kv.shape[1], self.n, []
        for name, x in (("c_kv", c_kv), ("k_pe", k_pe)):
            q, b, m = [], [], []
            for k, run in enumerate(self.runs):
                rq, rb, rm = self._reads(run, layer, name, x[k * n : (k + 1) * n], Tq)
                q.append(rq)
                b.append(rb)
                m.append(rm.to(x.device).expand(n, 1, Tq, L))
            out += [torch.cat(q), torch.cat(b), torch.cat(m)]
        return tuple(out)


class IncrementalDecodeAttention(DecodeOrderAttention):
    """DecodeOrderAttention whose queries are the last Tq positions of the layer's stored history
    (IncrementalCache as cache_fn): every MLA layer's attention output is replaced, never the model's own kept (its
    attention sees only the new tokens). The mask an eager attention function receives covers the new tokens only
    and is not recorded (dense MLA: the history's causal order is the mask)."""

    def _record_visible(self, mask) -> None:
        return None


def _forced_rows(forced, K: int, n: int, N: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [K·n, N] int64, is_forced [K·n] bool) of greedy_continue's `forced`."""
    tok = torch.zeros(K * n, N, dtype=torch.int64, device=device)
    on = torch.zeros(K * n, dtype=torch.bool, device=device)
    if forced is None:
        return tok, on
    if isinstance(forced, torch.Tensor):
        forced = [forced[k] for k in range(K)] if forced.dim() == 3 else [forced] * K
    if len(forced) != K:
        raise ValueError(f"forced: {len(forced)} entries for {K} runs")
    for k, f in enumerate(forced):
        if f is None:
            continue
        if tuple(f.shape) != (n, N):
            raise ValueError(f"forced tokens of run {k}: shape {tuple(f.shape)}, expected [{n}, {N}]")
        tok[k * n : (k + 1) * n] = f.to(device=device, dtype=torch.int64)
        on[k * n : (k + 1) * n] = True
    return tok, on


def greedy_continue(
    model: nn.Module,
    latentq,
    runs: list,
    prompts: torch.Tensor,
    new_tokens: int,
    *,
    forced=None,
    layers=None,
    bases=None,
    return_logits: bool = False,
):
    """Greedy continuation of every prompt under every run's latent cache (module docstring), all runs in one
    batch of K·n rows.

    model: tiny-mla or an HF dense MLA model (unsupported_reason None), in eval mode; latentq: the package with
    its compiled part; runs: K entries, CacheRun or None (exact latents); prompts: int64 [n, P] on the model's
    device (P >= 1, positions 0 .. P-1); new_tokens N >= 1; forced: teacher forcing through the same path, the
    token fed at each step instead of the argmax: None, int64 [n, N] (every run), [K, n, N], or a list of K
    entries None / [n, N] (per run); layers: the MLA layers a run quantizes (None: all); bases: as
    IncrementalCache. Returns tokens int64 [K, n, N] (CPU: the argmax, or the forced tokens), and with
    return_logits also logits float32 [K, n, N, V] (CPU): entry i is the distribution of token i, at position
    P - 1 + i. Raises ValueError for a bad shape or N < 1 and as IncrementalCache."""
    if prompts.dim() != 2 or prompts.shape[1] < 1 or new_tokens < 1 or not runs:
        raise ValueError(
            f"greedy_continue: prompts {tuple(prompts.shape)} (expected [n, P >= 1]), new_tokens {new_tokens} "
            f"(>= 1), {len(runs)} runs (>= 1)"
        )
    K, (n, P), N, dev = len(runs), prompts.shape, int(new_tokens), prompts.device
    forced_tok, is_forced = _forced_rows(forced, K, n, N, dev)
    cache = IncrementalCache(latentq, runs, n, layers, bases)
    tokens = torch.empty(K * n, N, dtype=torch.int64, device=dev)
    logits = [] if return_logits else None
    pos = torch.arange(P, device=dev).expand(K * n, P)
    with torch.no_grad(), IncrementalDecodeAttention(model, cache):
        out = forward_at(model, prompts.repeat(K, 1), pos)[:, -1]
        for i in range(N):
            if logits is not None:
                logits.append(out.float().cpu())
            tokens[:, i] = torch.where(is_forced, forced_tok[:, i], out.argmax(-1))
            if i + 1 < N:
                step_pos = torch.full((K * n, 1), P + i, dtype=torch.int64, device=dev)
                out = forward_at(model, tokens[:, i : i + 1], step_pos)[:, -1]
    tokens = tokens.cpu().reshape(K, n, N)
    if logits is None:
        return tokens
    return tokens, torch.stack(logits, 1).reshape(K, n, N, -1)


def teacher_forced_logits(
    model: nn.Module, latentq, runs: list, prompts: torch.Tensor, tokens: torch.Tensor, *, layers=None, bases=None
) -> torch.Tensor:
    """Logits float32 [K, n, N, V] (CPU) of every run along fixed continuations tokens int64 [n, N] or [K, n, N]:
    greedy_continue with forced=tokens (entry i: the distribution of token i given the prompt and tokens < i)."""
    return greedy_continue(
        model, latentq, runs, prompts, tokens.shape[-1], forced=tokens, layers=layers, bases=bases, return_logits=True
    )[1]
