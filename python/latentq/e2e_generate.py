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
rows, the attention in the absorbed form (absorbed_mixed_attention), plus per step, layer, quantized target and
run one decode_order_latents call: on the rows since the last complete token group for a causal spec
(IncrementalCache), on the whole history for a non-causal one. tiny-mla, the default study's 28 runs, 4 prompts
of 64 + 32 tokens: 30.7 s on one thread of a loaded 2-core VM, 12.4 s of it in decode_order_latents (the lm / tc
refits of the non-causal runs).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from latentq.capture import find_mla_layers
from latentq.e2e_decode import PREFILL_AT_ONCE, spec_at
from latentq.fitted_basis import needs_basis, transform_of
from latentq.inject import DecodeOrderAttention, absorbed_mixed_attention
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
    k's); capacity: the longest history (prompt + new tokens; buffers of that length are allocated once per layer);
    layers: the layers a run quantizes (None: every MLA layer); bases(layer, target, transform): the basis of a
    'klt,' / 'sklt,' spec (latentq.fitted_basis.StudyBases). Called with the new rows c_kv [K·n, Tq, r],
    k_pe [K·n, Tq, d_r]; returns (c_kv quantized, c_kv bf16, read_c [K·n, 1, Tq, L], k_pe quantized, k_pe bf16,
    read_kpe [K·n, 1, Tq, L]) over the history of length L (views of the buffers, valid until the next call).

    A causal spec's rows are quantized once: the buffers hold the history's reads up to the start a of its last
    incomplete token group (a = S + G·floor((L - S) / G): the sink rows [0, S) and every complete group of G tokens
    aligned at S), and only rows [a, L) are quantized at the next call, as their own sequences ('prefill-at-once'
    on rows past the sink: per-token values, and groups aligned at a, are those of decode_order_latents on the
    whole history). A non-causal spec is quantized on the whole history at every call (module docstring).
    Raises ValueError as latentq.decode_order_latents (a spec the quantizers refuse, non-finite latents) and when
    the history would exceed capacity."""

    def __init__(self, latentq, runs: list, n: int, capacity: int, layers=None, bases=None):
        self.latentq, self.runs, self.n, self.capacity = latentq, runs, n, capacity
        self.layers, self.bases = layers, bases
        self.length: dict[int, int] = {}  # layer -> L
        self._buf: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # (x, q, b)
        self._done: dict[tuple[int, int, str], int] = {}  # (run, layer, target) -> rows [0, a) stored for good
        self._masks: dict[tuple[str, int, int], torch.Tensor] = {}
        self._is_causal: dict[str, bool] = {}

    def _spec(self, run, layer: int, name: str) -> str | None:
        if run is None or name not in run.targets or (self.layers is not None and layer not in self.layers):
            return None
        return spec_at(run.spec, layer, name)

    def _mask(self, mode: str, L: int, G: int) -> torch.Tensor:
        key = (mode, L, G)
        if key not in self._masks:
            self._masks[key] = torch.from_numpy(self.latentq.decode_order_mask(mode, L, G))
        return self._masks[key]

    def _causal(self, s: str) -> bool:
        if s not in self._is_causal:
            self._is_causal[s] = bool(self.latentq.decode_scale_is_causal(s))
        return self._is_causal[s]

    def _latents(self, x: torch.Tensor, s: str, mode: str, name: str, basis) -> tuple[torch.Tensor, torch.Tensor]:
        """decode_order_latents of x [n, L, D] (each row one sequence), as tensors of x's dtype and device."""
        n, L, D = x.shape
        flat = x.detach().to("cpu", torch.float32).reshape(n * L, D).contiguous().numpy()
        q, b = self.latentq.decode_order_latents(flat, s, mode, name, [i * L for i in range(n + 1)], basis)
        as_x = lambda a: torch.from_numpy(a).reshape(n, L, D).to(device=x.device, dtype=x.dtype)
        return as_x(q), as_x(b)

    def _update(self, k: int, run, layer: int, name: str, L0: int, L: int) -> torch.Tensor:
        """Write run k's reads of rows [., L) into the buffers of (layer, name); its read mask [Tq, L]."""
        x, qb, bb = self._buf[(layer, name)]
        rows = slice(k * self.n, (k + 1) * self.n)
        s = self._spec(run, layer, name)
        if s is None:  # read exactly: both reads are the latents
            qb[rows, L0:L] = x[rows, L0:L]
            bb[rows, L0:L] = x[rows, L0:L]
            return torch.zeros(L - L0, L, dtype=torch.bool)
        basis = self.bases(layer, name, transform_of(s)) if needs_basis(s) else None
        G = self.latentq.decode_token_group(s)
        S = self.latentq.decode_order(run.mode)[1]
        a = self._done.get((k, layer, name), 0) if self._causal(s) else 0
        if a < S:  # the sink is not complete yet (or a non-causal spec): the whole history in the run's mode
            a = 0
        q, b = self._latents(x[rows, a:L], s, run.mode if a == 0 else PREFILL_AT_ONCE, name, basis)
        qb[rows, a:L], bb[rows, a:L] = q, b
        self._done[(k, layer, name)] = L if L < S else S + G * ((L - S) // G)
        return self._mask(run.mode, L, G)[L0:]

    def __call__(self, layer: int, c_kv: torch.Tensor, k_pe: torch.Tensor):
        L0 = self.length.get(layer, 0)
        Tq = c_kv.shape[1]
        L = L0 + Tq
        if L > self.capacity:
            raise ValueError(f"IncrementalCache: layer {layer}: {L} positions exceed the capacity {self.capacity}")
        out = []
        for name, new in (("c_kv", c_kv), ("k_pe", k_pe)):
            if (layer, name) not in self._buf:
                shape = (new.shape[0], self.capacity, new.shape[2])
                self._buf[(layer, name)] = tuple(new.new_zeros(shape) for _ in range(3))
            x, qb, bb = self._buf[(layer, name)]
            x[:, L0:L] = new.detach()
            masks = [self._update(k, run, layer, name, L0, L) for k, run in enumerate(self.runs)]
            m = torch.stack(masks).to(x.device).repeat_interleave(self.n, 0)[:, None]  # [K·n, 1, Tq, L]
            out += [qb[:, :L], bb[:, :L], m]
        self.length[layer] = L
        return tuple(out)


class IncrementalDecodeAttention(DecodeOrderAttention):
    """DecodeOrderAttention whose queries are the last Tq positions of the layer's stored history
    (IncrementalCache as cache_fn): every MLA layer's attention output is replaced, never the model's own kept (its
    attention sees only the new tokens). The mask an eager attention function receives covers the new tokens only
    and is not recorded (dense MLA: the history's causal order is the mask). The attention is computed in the
    absorbed form (absorbed_mixed_attention)."""

    attention = staticmethod(absorbed_mixed_attention)

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
    cache = IncrementalCache(latentq, runs, n, P + N, layers, bases)
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
