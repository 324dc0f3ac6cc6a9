"""Capture the latent KV cache of Multi-head Latent Attention (MLA) models with hooks.

Works on any model whose attention modules have a ``kv_a_proj_with_mqa`` submodule (HF transformers
``DeepseekV2``/``DeepseekV3`` and relatives, DeepSeek remote code, tiny-mla: latentq.tiny_mla). The
model code is never edited: everything is done with PyTorch forward hooks plus temporary wrappers of
module-level functions, all removed on exit (the state dict is never touched). ``LatentHooks`` holds
the hook machinery for both directions: capture (``LatentCapture``, here) and the replacement of
c_kv / k_pe by an ``inject`` callback (``LatentInjector`` and ``DecodeOrderAttention``:
latentq.inject).

Hook points, per MLA layer ``attn`` (``model.layers[i].self_attn``):

==============  ====================================================  ==============================
name            where it is read                                      shape (per forward, batch B)
==============  ====================================================  ==============================
``c_kv``        output of ``attn.kv_a_layernorm`` (forward hook)      [B, T, kv_lora_rank]
``k_pe_pre``    last qk_rope_head_dim columns of the output of        [B, T, qk_rope_head_dim]
                ``attn.kv_a_proj_with_mqa`` (before RoPE)
``k_pe``        key returned by the module-level RoPE function        [B, T, qk_rope_head_dim]
                (after RoPE; shared by all heads)
``q_nope``      output of ``attn.q_proj`` / ``attn.q_b_proj``, viewed  [B, Tq, H, qk_nope_head_dim]
                [B, T, H, nope + rope], first nope columns
``q_pe_pre``    same, last rope columns (before RoPE)                 [B, Tq, H, qk_rope_head_dim]
``q_pe``        query returned by the RoPE function (after RoPE)      [B, Tq, H, qk_rope_head_dim]
``attn_out``    input of ``attn.o_proj`` (forward pre-hook)            [B, Tq, H, v_head_dim]
==============  ====================================================  ==============================

Tq = T, or len(q_rows) when the capture was given ``q_rows`` (positions along T to keep, to bound
memory on big models). All captured tensors are detached float32 CPU copies, row-major.

Post-RoPE tensors are no module's output. The RoPE function is looked up at call time in the python
module that defines the attention class (``sys.modules[type(attn).__module__]``), so it is wrapped
there: ``apply_rotary_emb`` (HF deepseek_v2, tiny-mla; complex pairs (2i, 2i+1) -> layout
``interleaved``), ``apply_rotary_pos_emb`` (rotate_half on pairs (i, i + d/2) -> layout ``half``;
DeepSeek remote code permutes its input to [0, 2, 4, ..., 1, 3, 5, ...] first, the output is still
``half``) and ``apply_rotary_pos_emb_interleave`` (HF deepseek_v3 with ``rope_interleave=True``:
input pairs (2i, 2i+1), output laid out as [even..., odd...] -> layout ``half``). ``rope_layout``
always describes the post-RoPE tensors (c.f. data/README.md). The layout implied by the function
name is verified on every call from the rotation invariant: each output pair's squared norm equals
attention_scaling^2 times the input pair's, for the same frequency index.

The module-level function is shared by all layers, so a forward pre-hook on every attention module
records which layer is executing; a forward hook clears it.

Only the attention's own calls count. A RoPE (or attention) function called while a child module of
the attention is executing belongs to that child, not to the layer: DeepSeek-V3.2's DSA indexer
(``DeepseekV32Indexer``, inside ``DeepseekV32Attention``) calls ``apply_rotary_pos_emb`` on its own
query / key, GLM-5's (``GlmMoeDsaIndexer``) ``apply_rotary_pos_emb_interleave`` (transformers 5.24
modeling_deepseek_v32.py, modeling_glm_moe_dsa.py). The rule: every direct child of the attention
module other than the projections and norms named in ``MLA_LEAVES`` (plain Linear / RMSNorm leaves,
which call no module-level function) gets a forward pre-hook and a forward hook that count the
children executing; the wrappers pass a call through untouched while that count is > 0. A call
from a grandchild happens while its child is executing, so it is excluded too. A model whose RoPE
is applied inside a child module is therefore not captured: it fails loudly ("no known RoPE
function was called"), never silently. The DSA models' attention is sparse (each query reads its
indexer's top-k keys); the capture is exact whatever index_topk is, but the dense absorbed
recomputation (latentq.dump) equals the model only when index_topk >= the sequence length, where
every causal key is selected.

NoPE layers: a python module that defines none of the RoPE functions applies no RoPE (transformers'
``KimiLinearAttention``, Kimi-Linear's MLA layers: its k_rot is the unrotated last qk_rope_head_dim
columns of ``kv_a_proj_with_mqa``, its query's last qk_rope_head_dim columns enter the scores as
they are). Its layers get ``k_pe`` = ``k_pe_pre``, ``q_pe`` = ``q_pe_pre``, ``rope_layout`` and
``rope_function`` ``"none"``; a model that rotates through a function of another name would be
taken as NoPE, and the absorbed self-check of latentq.dump then fails.

Latent scales: an attention module with float attributes named ``mla_scale_<x>`` multiplies its
latents after the projections (transformers' ``LongcatFlashMLA``: k_pass = kv_a_layernorm(kv) *
mla_scale_kv_lora, q_pass and q_rot * mla_scale_q_lora, modeling_longcat_flash.py). ``<x>``
starting with ``kv`` scales c_kv, with ``q`` both query parts (``latent_scales``); any other name is
refused. The captured ``c_kv`` is the scaled latent the cache stores (kv_a_layernorm's output times
the scale, the model's own product, bit for bit) and ``q_nope`` the scaled query (the q scale
applied to the q_proj / q_b_proj output, as the model does; ``q_pe`` is post-RoPE, already
scaled), so the absorbed recomputation with W_UK / W_UV = kv_b_proj's weight equals the model.
``q_pe_pre`` stays unscaled (it is the projection's output). While the hooks are installed the
module's c_kv scale attribute is set to 1.0 and the kv_a_layernorm hook returns the scaled latent
(``inject`` sees and replaces the scaled c_kv; the model's own multiplication by 1.0 is exact), so
an identity injection leaves the model bit for bit unchanged. Records carry ``c_kv_scale`` and
``q_scale`` (1.0 without such attributes).

The softmax scale is captured at call time: the ``scaling`` argument of the attention module's
module-level ``eager_attention_forward`` and the ``scale`` argument of
``torch.nn.functional.scaled_dot_product_attention`` (HF's sdpa path and tiny-mla) are wrapped while
a layer executes; the first call inside a layer wins. If neither is called (e.g. flash attention),
the scale falls back to ``attn.scaling`` / ``attn.softmax_scale`` and ``softmax_scale_source`` says so.

The ``inject`` callback of LatentHooks: ``fn(layer_idx, name, tensor) -> tensor`` with name ``"c_kv"``
([B, T, kv_lora_rank]) or ``"k_pe"`` ([B, T, qk_rope_head_dim], post-RoPE); latentq.inject says more.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import torch
from torch import nn

# Module-level RoPE functions and the layout of the tensors they return.
ROPE_FUNCTION_LAYOUTS = {
    "apply_rotary_emb": "interleaved",
    "apply_rotary_pos_emb": "half",
    "apply_rotary_pos_emb_interleave": "half",
}
MLA_MARKER = "kv_a_proj_with_mqa"
EAGER_ATTENTION_NAMES = ("eager_attention_forward",)
# What a DSA indexer adds to a layer's record (LatentHooks._hook_indexer), and its intermediates.
INDEXER_RECORD = ("index_k", "index_q", "index_w", "index_rope_function", "index_k_pre", "index_q_pre")
INJECTABLE = ("c_kv", "k_pe")
# The attention's own projections and norms: leaves that call no module-level function. Every other
# direct child (DSA indexer, rotary embedding module ...) is tracked: a RoPE call inside it is not the
# attention's (module docstring).
MLA_LEAVES = (
    "q_proj",
    "q_a_proj",
    "q_a_layernorm",
    "q_b_proj",
    MLA_MARKER,
    "kv_a_layernorm",
    "kv_b_proj",
    "o_proj",
)
NOPE = "none"  # rope_layout / rope_function of a layer without RoPE
SCALE_PREFIX = "mla_scale_"

InjectFn = Callable[[int, str, torch.Tensor], torch.Tensor]
LayerFn = Callable[[int, dict], None]


class MLAModuleNotFoundError(ValueError):
    """Raised when a model has no attention module with a ``kv_a_proj_with_mqa`` submodule."""


def find_mla_layers(model: nn.Module) -> list[tuple[int, str, nn.Module]]:
    """Return ``[(layer_idx, qualified_name, attn_module), ...]`` for every module that has a
    ``kv_a_proj_with_mqa`` submodule, in module order. ``layer_idx`` is ``attn.layer_idx`` when the
    module has it, else the running count.

    Raises MLAModuleNotFoundError if there is none, or if layer indices repeat.
    """
    found = []
    for name, mod in model.named_modules():
        if isinstance(getattr(mod, MLA_MARKER, None), nn.Module):
            idx = getattr(mod, "layer_idx", None)
            found.append((len(found) if idx is None else int(idx), name, mod))
    if not found:
        raise MLAModuleNotFoundError(
            f"no MLA attention module found in {type(model).__name__}: looked for modules with a "
            f"'{MLA_MARKER}' submodule (HF DeepseekV2/V3-style Multi-head Latent Attention)"
        )
    idxs = [i for i, _, _ in found]
    if len(set(idxs)) != len(idxs):
        raise MLAModuleNotFoundError(f"MLA modules have repeated layer_idx values: {idxs}")
    return found


def mla_dims(attn: nn.Module) -> dict:
    """Shapes of one MLA module, read from its weights (and its qk_nope_head_dim / v_head_dim
    attributes or config). Returns dict with num_heads, kv_lora_rank, qk_rope_head_dim,
    qk_nope_head_dim, v_head_dim."""
    r = attn.kv_a_layernorm.weight.shape[0]
    rope = attn.kv_a_proj_with_mqa.weight.shape[0] - r
    cfg = getattr(attn, "config", None)

    def get(name):
        v = getattr(attn, name, None)
        if v is None and cfg is not None:
            v = getattr(cfg, name, None)
        if v is None:
            raise ValueError(f"{type(attn).__name__} has no '{name}' attribute or config entry")
        return int(v)

    nope, vdim = get("qk_nope_head_dim"), get("v_head_dim")
    h = attn.kv_b_proj.weight.shape[0] // (nope + vdim)
    if h * (nope + vdim) != attn.kv_b_proj.weight.shape[0]:
        raise ValueError("kv_b_proj rows are not a multiple of qk_nope_head_dim + v_head_dim")
    return dict(num_heads=h, kv_lora_rank=r, qk_rope_head_dim=rope, qk_nope_head_dim=nope, v_head_dim=vdim)


def latent_scales(attn: nn.Module) -> dict:
    """The latent scales of one MLA module, from its float attributes named ``mla_scale_<x>`` (module
    docstring): ``{"c_kv": (attribute name or None, factor), "q": (name or None, factor)}``, factor 1.0
    without an attribute. Raises RuntimeError naming the module's class and attribute for a name that
    is neither ``mla_scale_kv*`` nor ``mla_scale_q*``, or two attributes for one latent."""
    out = {"c_kv": (None, 1.0), "q": (None, 1.0)}
    for name, v in sorted(vars(attn).items()):
        if not name.startswith(SCALE_PREFIX) or not isinstance(v, (int, float)):
            continue
        rest = name[len(SCALE_PREFIX) :]
        key = "c_kv" if rest.startswith("kv") else "q" if rest.startswith("q") else None
        if key is None:
            raise RuntimeError(
                f"{type(attn).__name__}.{name}: unknown latent scale (expected {SCALE_PREFIX}kv* for c_kv "
                f"or {SCALE_PREFIX}q* for the query)"
            )
        if out[key][0] is not None:
            raise RuntimeError(f"{type(attn).__name__}: two {key} scales, {out[key][0]} and {name}")
        out[key] = (name, float(v))
    return out


def _pairs(x: torch.Tensor, layout: str) -> torch.Tensor:
    """Squared norms of the rotation pairs along the last dim: [..., d] -> [..., d/2] (float64)."""
    x = x.double()
    d = x.shape[-1]
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : d // 2], x[..., d // 2 :]
    return a * a + b * b


def rope_pairings(x_in: torch.Tensor, x_out: torch.Tensor, tol: float = 1e-3) -> list[tuple[str, str]]:
    """All (input_pairing, output_layout) combinations, each "interleaved" or "half", under which
    every output pair's squared norm is one common factor s^2 times the input pair's of the same
    frequency index, as a rotation by RoPE (times HF's attention_scaling s) guarantees.

    x_in, x_out: [..., d] (same shape, d even). ``tol`` is relative to the largest pair norm. A
    correct RoPE output fits exactly one output layout unless every rotation angle is 0 (position 0
    only), where the identity pairings both fit.
    """
    if x_in.shape != x_out.shape or x_in.shape[-1] % 2:
        return []
    fits = []
    for lin in ("interleaved", "half"):
        for lout in ("interleaved", "half"):
            n_in, n_out = _pairs(x_in, lin), _pairs(x_out, lout)
            s2 = n_out.sum() / n_in.sum().clamp_min(1e-300)
            err = (n_out - s2 * n_in).abs().max()
            if err <= tol * n_out.abs().max().clamp_min(1e-300):
                fits.append((lin, lout))
    return fits


def rotate(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, layout: str, attention_scaling: float = 1.0
) -> torch.Tensor:
    """Apply RoPE in a given layout (reference implementation, float64 math, float32 result).

    x: [T, ..., d] (any middle dims), positions: [T] int, inv_freq: [d/2].
    ``interleaved`` rotates pairs (2i, 2i+1) by positions*inv_freq[i]; ``half`` rotates pairs
    (i, i + d/2). The result is multiplied by ``attention_scaling`` (HF YaRN scales cos/sin).
    """
    ang = positions.double()[:, None] * inv_freq.double()[None, :]  # [T, d/2]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (ang.shape[-1],)
    cos, sin = ang.cos().view(shape) * attention_scaling, ang.sin().view(shape) * attention_scaling
    xd = x.double()
    d = x.shape[-1]
    if layout == "interleaved":
        a, b = xd[..., 0::2], xd[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    elif layout == "half":
        a, b = xd[..., : d // 2], xd[..., d // 2 :]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    else:
        raise ValueError(f"unknown rope layout {layout!r}")
    return out.float()


class LatentHooks:
    """Context manager that installs the capture and/or injection hooks on every MLA layer.

    ``capture``: keep the tensors listed in the module docstring in ``self.layers[layer_idx]``
    (a dict name -> tensor, overwritten by each forward pass; ``clear()`` empties it), plus
    ``self.layers[i]["softmax_scale"]`` (float), ``["softmax_scale_source"]``, ``["rope_layout"]``,
    ``["rope_function"]``, and ``["visible"]`` ([B, Tq, T] bool: the keys each query row may read, from the
    mask the eager attention function receives; causal, or causal ∩ top-k under DeepSeek Sparse Attention;
    absent when the attention is not the eager function).
    ``inject``: ``fn(layer_idx, name, tensor) -> tensor`` replacing c_kv and/or post-RoPE k_pe.
    ``q_rows``: optional 1-D int tensor/list of positions along T; per-query tensors are kept only
    at those rows (settable between forward passes).
    ``on_layer``: optional ``fn(layer_idx, record) -> None`` (capture only), called from the layer's
    forward hook (``self_attn`` output), when that layer's record is complete: c_kv, k_pe (and the
    pre-RoPE copies), q_nope, q_pe, attn_out (the ``o_proj`` pre-hook ran inside the layer) and the
    softmax scale, layout and function. The record is removed from ``self.layers`` before the call,
    so with ``on_layer`` at most the running layer's tensors are held (streaming: latentq.dump);
    without it, records stay in ``self.layers`` as above. An exception raised by ``fn`` propagates
    out of the forward pass.

    Raises MLAModuleNotFoundError (a ValueError) on a model without MLA modules, RuntimeError if a
    layer ran without calling a known RoPE function, or if the RoPE output fails the layout check.
    """

    def __init__(
        self,
        model: nn.Module,
        capture: bool = True,
        inject: InjectFn | None = None,
        q_rows=None,
        on_layer: LayerFn | None = None,
    ):
        if on_layer is not None and not capture:
            raise ValueError("on_layer needs capture=True")
        self.model = model
        self.capture = capture
        self.on_layer = on_layer
        self.inject = inject
        self.q_rows = q_rows
        self.mla = find_mla_layers(model)
        self.dims = {idx: mla_dims(attn) for idx, _, attn in self.mla}
        self.scales = {idx: latent_scales(attn) for idx, _, attn in self.mla}
        self.nope: dict[int, bool] = {}  # layer -> applies no RoPE (its python module defines no RoPE function)
        self.layers: dict[int, dict] = {}
        self._handles: list = []
        self._patches: list[tuple[object, str, object]] = []
        self._current: int | None = None
        self._in_child = 0  # children of the running attention module executing now (module docstring)
        self._indexer_running = False  # the running attention's DSA indexer is executing (its RoPE call is its own)
        self._index_k_norm = None  # the running indexer's k_norm output (injection writes its columns r: in place)
        self._index_rope_width: dict[int, int] = {}  # layer -> the indexer's qk_rope_head_dim
        self._rope_called = False
        self._active = False

    # ---- helpers -----------------------------------------------------------------------------
    def clear(self) -> None:
        """Forget everything captured so far."""
        self.layers = {}

    def _rows(self, x: torch.Tensor, t_axis: int) -> torch.Tensor:
        if self.q_rows is None:
            return x
        idx = torch.as_tensor(self.q_rows, dtype=torch.long, device=x.device)
        return x.index_select(t_axis, idx)

    def _store(self, layer: int, name: str, x: torch.Tensor) -> None:
        if self.capture:
            self.layers.setdefault(layer, {})[name] = x.detach().to("cpu", torch.float32).clone()

    def _replace(self, layer: int, name: str, x: torch.Tensor) -> torch.Tensor:
        new = self.inject(layer, name, x)
        if not isinstance(new, torch.Tensor) or tuple(new.shape) != tuple(x.shape):
            raise ValueError(
                f"inject fn returned {getattr(new, 'shape', type(new))} for layer {layer} "
                f"{name}; expected a tensor of shape {tuple(x.shape)}"
            )
        return new.to(dtype=x.dtype, device=x.device)

    # ---- install / remove --------------------------------------------------------------------
    def __enter__(self) -> LatentHooks:
        if self._active:
            raise RuntimeError("hooks already installed")
        self._active = True
        try:
            self._install()
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._remove()

    def _patch(self, obj, name: str, new) -> None:
        self._patches.append((obj, name, getattr(obj, name)))
        setattr(obj, name, new)

    def _remove(self) -> None:
        for h in reversed(self._handles):
            h.remove()
        self._handles = []
        for obj, name, old in reversed(self._patches):
            setattr(obj, name, old)
        self._patches = []
        self._current = None
        self._in_child = 0
        self._active = False

    def _install(self) -> None:
        pymods = {}
        for _, _, attn in self.mla:
            pymods.setdefault(type(attn).__module__, sys.modules[type(attn).__module__])
        rope_names = {
            name: [n for n in ROPE_FUNCTION_LAYOUTS if callable(getattr(pymod, n, None))]
            for name, pymod in pymods.items()
        }
        for idx, _, attn in self.mla:
            self.nope[idx] = not rope_names[type(attn).__module__]
            self._hook_layer(idx, attn)
        for name, pymod in pymods.items():
            for n in rope_names[name]:
                self._patch(pymod, n, self._rope_wrapper(getattr(pymod, n), n))
            if self.capture:
                for n in EAGER_ATTENTION_NAMES:
                    if callable(getattr(pymod, n, None)):
                        self._patch(pymod, n, self._eager_wrapper(getattr(pymod, n), n))
        if self.capture:
            import torch.nn.functional as F

            self._patch(F, "scaled_dot_product_attention", self._sdpa_wrapper(F.scaled_dot_product_attention))

    def _hook_layer(self, idx: int, attn: nn.Module) -> None:
        dims = self.dims[idx]
        H, nope, rope = dims["num_heads"], dims["qk_nope_head_dim"], dims["qk_rope_head_dim"]
        no_rope = self.nope[idx]
        (ckv_attr, ckv_scale), (_, q_scale) = self.scales[idx]["c_kv"], self.scales[idx]["q"]
        if ckv_attr is not None:  # the hook applies the c_kv scale (module docstring)
            self._patch(attn, ckv_attr, 1.0)

        def pre(mod, args):
            self._current = idx
            self._in_child = 0
            self._rope_called = False
            if self.capture:
                rec = self.layers.setdefault(idx, {})
                for k in (
                    "softmax_scale",
                    "softmax_scale_source",
                    "rope_layout",
                    "rope_function",
                    "k_pe",
                    "q_pe",
                    "visible",
                    *INDEXER_RECORD,
                ):
                    rec.pop(k, None)
                rec["c_kv_scale"], rec["q_scale"] = ckv_scale, q_scale

        def post(mod, args, out):
            self._current = None
            self._in_child = 0
            if not self._rope_called and not no_rope:
                raise RuntimeError(
                    f"layer {idx}: no known RoPE function ({sorted(ROPE_FUNCTION_LAYOUTS)}) "
                    f"was called from {type(mod).__module__}; post-RoPE k_pe/q_pe unavailable"
                )
            if self.capture:
                rec = self.layers.setdefault(idx, {})
                if "softmax_scale" not in rec:
                    for a in ("scaling", "softmax_scale"):
                        if isinstance(getattr(mod, a, None), (int, float)):
                            rec["softmax_scale"] = float(getattr(mod, a))
                            rec["softmax_scale_source"] = f"attribute:{a}"
                            break
                if self.on_layer is not None:
                    self.on_layer(idx, self.layers.pop(idx))

        self._handles.append(attn.register_forward_pre_hook(pre))
        self._handles.append(attn.register_forward_hook(post))

        def child_pre(mod, args):
            self._in_child += 1

        def child_post(mod, args, out):
            self._in_child -= 1

        for name, child in attn.named_children():
            if name not in MLA_LEAVES:
                self._handles.append(child.register_forward_pre_hook(child_pre))
                self._handles.append(child.register_forward_hook(child_post))
        ix = getattr(attn, "indexer", None)
        if (self.capture or self.inject is not None) and isinstance(ix, nn.Module):
            self._hook_indexer(idx, ix)

        def ckv_hook(mod, args, out):
            if ckv_attr is not None:
                out = out * ckv_scale  # the model's own product (its attribute is 1.0 meanwhile)
            if self.inject is not None:
                out = self._replace(idx, "c_kv", out)
            self._store(idx, "c_kv", out)
            return out if self.inject is not None or ckv_attr is not None else None

        self._handles.append(attn.kv_a_layernorm.register_forward_hook(ckv_hook))

        if self.capture or (no_rope and self.inject is not None):

            def kv_a_hook(mod, args, out):
                k = out[..., -rope:]  # [B, T, rope]: k_rot before RoPE (NoPE: as the model uses it)
                self._store(idx, "k_pe_pre", k)
                if not no_rope:
                    return None
                if self.inject is not None:
                    k = self._replace(idx, "k_pe", k)
                    out = torch.cat([out[..., :-rope], k], dim=-1)
                if self.capture:
                    rec = self.layers.setdefault(idx, {})
                    rec["rope_layout"] = rec["rope_function"] = NOPE
                    self._store(idx, "k_pe", k)
                return out if self.inject is not None else None

            self._handles.append(attn.kv_a_proj_with_mqa.register_forward_hook(kv_a_hook))

        if self.capture:
            qmod = getattr(attn, "q_b_proj", None) if getattr(attn, "q_proj", None) is None else attn.q_proj
            if qmod is None:
                raise RuntimeError(f"layer {idx}: neither q_proj nor q_b_proj found")

            def q_hook(mod, args, out):
                q = out.view(*out.shape[:-1], H, nope + rope)  # [B, T, H, nope + rope]
                q = self._rows(q, q.dim() - 3)
                q_nope = q[..., :nope] if q_scale == 1.0 else q[..., :nope] * q_scale  # the model's product
                self._store(idx, "q_nope", q_nope)
                self._store(idx, "q_pe_pre", q[..., nope:])
                if no_rope:
                    self._store(idx, "q_pe", q[..., nope:] if q_scale == 1.0 else q[..., nope:] * q_scale)

            self._handles.append(qmod.register_forward_hook(q_hook))

            def o_pre(mod, args):
                x = args[0]
                x = x.view(*x.shape[:-1], H, dims["v_head_dim"])  # [B, T, H, v]
                self._store(idx, "attn_out", self._rows(x, x.dim() - 3))

            self._handles.append(attn.o_proj.register_forward_pre_hook(o_pre))

    def _hook_indexer(self, idx: int, ix: nn.Module) -> None:
        """DeepSeek Sparse Attention's indexer (transformers 5.24 DeepseekV32Indexer / GlmMoeDsaIndexer:
        wq_b, wk + k_norm, weights_proj, RoPE on the first qk_rope_head_dim columns of its query and key through a
        module-level RoPE function): the record gains ``index_k`` [B, T, d] (the key its cache stores, after
        k_norm and RoPE), ``index_q`` [B, Tq, n_h, d] (after RoPE), ``index_w`` [B, Tq, n_h] (weights_proj ·
        n_h^-0.5) and ``index_rope_function``: what latentq.sparse_mla scores the tokens from. With an inject
        fn, the key the indexer scores (after k_norm and RoPE) is replaced by ``fn(layer, "index_k", k)``
        (_inject_index_k), and the record, when capturing, holds the replaced key."""
        n_h, d, r = int(ix.n_heads), int(ix.head_dim), int(ix.qk_rope_head_dim)
        self._index_rope_width[idx] = r

        def put(name, x):
            if self.capture:
                self.layers.setdefault(idx, {})[name] = x.detach().to("cpu", torch.float32).clone()

        def pre(mod, args):
            self._indexer_running = True

        def norm_hook(mod, args, out):
            self._index_k_norm = out  # the live k_norm output: its columns r: are the key's unrotated part
            put("index_k_pre", out)

        def post(mod, args, out):
            self._indexer_running = False
            self._index_k_norm = None
            if not self.capture:
                return
            rec = self.layers.setdefault(idx, {})
            if "index_k_rot" not in rec:
                raise RuntimeError(
                    f"layer {idx}: the indexer called no known RoPE function {sorted(ROPE_FUNCTION_LAYOUTS)}"
                )
            rec["index_k"] = torch.cat([rec.pop("index_k_rot"), rec.pop("index_k_pre")[..., r:]], dim=-1)
            rec["index_q"] = torch.cat([rec.pop("index_q_rot"), rec.pop("index_q_pre")[..., r:]], dim=-1)

        def q_hook(mod, args, out):
            put("index_q_pre", self._rows(out.view(*out.shape[:-1], n_h, d), 1))

        def w_hook(mod, args, out):
            put("index_w", self._rows(out.float() * n_h**-0.5, 1))

        self._handles.append(ix.register_forward_pre_hook(pre))
        self._handles.append(ix.register_forward_hook(post))
        self._handles.append(ix.k_norm.register_forward_hook(norm_hook))
        self._handles.append(ix.wq_b.register_forward_hook(q_hook))
        self._handles.append(ix.weights_proj.register_forward_hook(w_hook))

    def _inject_index_k(self, k_out: torch.Tensor) -> torch.Tensor:
        """The indexer's RoPE call returned its key's rotated part k_out [B, S, 1, r]; the unrotated part is the
        k_norm output's columns r: (the view the indexer concatenates next, transformers 5.24
        DeepseekV32Indexer / GlmMoeDsaIndexer.forward). The whole key [B, S, d] goes through the inject fn as
        ``index_k``; its columns r: are written back into the k_norm output in place (so the view the indexer
        concatenates reads them), its columns :r returned in k_out's shape."""
        idx, live = self._current, self._index_k_norm
        r = self._index_rope_width[idx]
        if live is None or live.dim() != 3 or live.shape[-1] <= r:
            raise RuntimeError(f"layer {idx}: the indexer's k_norm output was not seen before its RoPE call")
        full = torch.cat([_as_btd(k_out), live[..., r:]], dim=-1)
        new = self._replace(idx, "index_k", full)
        if new is not full:
            live[..., r:] = new[..., r:]
            if self.capture:  # the record's unrotated part is the replaced one too
                self.layers.setdefault(idx, {})["index_k_pre"] = new.detach().to("cpu", torch.float32).clone()
        return new[..., :r].reshape(k_out.shape)

    def _indexer_rope(self, fname: str, q_out: torch.Tensor, k_out: torch.Tensor) -> None:
        """The indexer's RoPE call (q [B, S, n_h, r], k [B, S, 1, r]): its rotated parts, kept for _hook_indexer."""
        rec = self.layers.setdefault(self._current, {})
        rec["index_q_rot"] = self._rows(q_out.detach(), 1).to("cpu", torch.float32).clone()
        rec["index_k_rot"] = _as_btd(k_out.detach()).to("cpu", torch.float32).clone()
        rec["index_rope_function"] = fname

    # ---- wrappers of module-level functions --------------------------------------------------
    def _rope_wrapper(self, fn, fname: str):
        layout = ROPE_FUNCTION_LAYOUTS[fname]

        def wrapper(*args, **kwargs):
            q_out, k_out = fn(*args, **kwargs)[:2]
            idx = self._current
            if idx is not None and self._indexer_running:
                if self.inject is not None:
                    k_out = self._inject_index_k(k_out)
                if self.capture:
                    self._indexer_rope(fname, q_out, k_out)
                return q_out, k_out
            if idx is None or self._in_child:  # not the attention's own call (module docstring)
                return q_out, k_out
            self._rope_called = True
            k_in = args[1] if len(args) > 1 else kwargs.get("k", kwargs.get("xk"))
            H = self.dims[idx]["num_heads"]
            if self.capture:
                if k_in is None:
                    raise RuntimeError(f"layer {idx}: cannot find the key argument of {fname}")
                fits = rope_pairings(k_in, k_out, tol=1e-3 if k_out.dtype == torch.float32 else 3e-2)
                if not any(lout == layout for _, lout in fits):
                    raise RuntimeError(
                        f"layer {idx}: {fname} output does not have the expected '{layout}' "
                        f"RoPE layout (pair-norm check fits: {fits})"
                    )
            k3 = _as_btd(k_out)  # [B, T, rope]
            if self.inject is not None:
                new = self._replace(idx, "k_pe", k3)
                k_out = new.reshape(k_out.shape) if k_out.dim() == 3 else _from_btd(new, k_out)
                k3 = new
            if self.capture:
                rec = self.layers.setdefault(idx, {})
                rec["rope_layout"], rec["rope_function"] = layout, fname
                self._store(idx, "k_pe", k3)
                qb = _as_bthd(q_out, H)  # [B, T, H, rope]
                self._store(idx, "q_pe", self._rows(qb, 1))
            return q_out, k_out

        wrapper.__wrapped__ = fn
        return wrapper

    def _record_scale(self, scale, source: str) -> None:
        idx = self._current
        if idx is None or self._in_child or not self.capture:
            return
        rec = self.layers.setdefault(idx, {})
        if "softmax_scale" not in rec:
            rec["softmax_scale"] = float(scale)
            rec["softmax_scale_source"] = source

    def _sdpa_call(self, fn, query, *args, **kwargs):
        """The model's SDPA call inside a hooked layer (DecodeOrderAttention skips the ones it replaces)."""
        return fn(query, *args, **kwargs)

    def _record_visible(self, mask) -> None:
        """The keys the running layer's query rows may read, from the additive (or boolean) attention mask the
        attention function receives ([B, 1, S, T]; -inf or the dtype's min where masked): ``visible`` [B, Tq, T]
        bool. Under DeepSeek Sparse Attention that mask is causal ∩ top-k (transformers' DeepseekV32Attention /
        GlmMoeDsaAttention fold the indexer's selection into it), so ``visible`` is what each row read."""
        idx = self._current
        if idx is None or self._in_child or not self.capture or not isinstance(mask, torch.Tensor) or mask.dim() != 4:
            return
        m = mask[:, 0]
        vis = m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2
        self._store_bool(idx, "visible", self._rows(vis, 1))

    def _store_bool(self, layer: int, name: str, x: torch.Tensor) -> None:
        self.layers.setdefault(layer, {})[name] = x.detach().to("cpu").clone()

    def _eager_wrapper(self, fn, fname: str):
        def wrapper(*args, **kwargs):
            scale = kwargs["scaling"] if "scaling" in kwargs else (args[5] if len(args) > 5 else None)
            if scale is not None:
                self._record_scale(scale, f"captured:{fname}")
            self._record_visible(
                kwargs["attention_mask"] if "attention_mask" in kwargs else (args[4] if len(args) > 4 else None)
            )
            return fn(*args, **kwargs)

        wrapper.__wrapped__ = fn
        return wrapper

    def _sdpa_wrapper(self, fn):
        def wrapper(query, *args, **kwargs):
            if self._in_child:  # a child's attention (module docstring): neither recorded nor replaced
                return fn(query, *args, **kwargs)
            scale = kwargs.get("scale", args[5] if len(args) > 5 else None)
            if scale is None:
                scale = query.shape[-1] ** -0.5  # SDPA's own default
            self._record_scale(scale, "captured:scaled_dot_product_attention")
            return self._sdpa_call(fn, query, *args, **kwargs)

        wrapper.__wrapped__ = fn
        return wrapper


def _as_btd(k: torch.Tensor) -> torch.Tensor:
    """Shared post-RoPE key as [B, T, d]: accepts [B, 1, T, d], [B, T, 1, d] or [B, T, d]."""
    if k.dim() == 3:
        return k
    if k.dim() == 4 and k.shape[1] == 1:
        return k[:, 0]
    if k.dim() == 4 and k.shape[2] == 1:
        return k[:, :, 0]
    raise RuntimeError(f"unexpected post-RoPE key shape {tuple(k.shape)} (expected one shared head)")


def _from_btd(new: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if like.shape[1] == 1:
        return new.unsqueeze(1)
    return new.unsqueeze(2)


def _as_bthd(q: torch.Tensor, H: int) -> torch.Tensor:
    """Post-RoPE query as [B, T, H, d]: accepts [B, H, T, d] (HF) or [B, T, H, d]."""
    if q.dim() == 4 and q.shape[1] == H:
        return q.transpose(1, 2)
    if q.dim() == 4 and q.shape[2] == H:
        return q
    raise RuntimeError(f"unexpected post-RoPE query shape {tuple(q.shape)} for {H} heads")


class LatentCapture(LatentHooks):
    """``with LatentCapture(model) as cap: model(ids)`` -> ``cap.layers[i]["c_kv"]`` etc. (capture only).
    With ``on_layer=fn`` each layer's record is handed to ``fn(layer_idx, record)`` as soon as the
    layer has run, and not kept (see LatentHooks)."""

    def __init__(self, model: nn.Module, q_rows=None, on_layer: LayerFn | None = None):
        super().__init__(model, capture=True, inject=None, q_rows=q_rows, on_layer=on_layer)


def yarn_mscale(factor: float, mscale_all_dim: float) -> float:
    """DeepSeek's YaRN mscale: 0.1 * mscale_all_dim * ln(factor) + 1 (1 when factor <= 1)."""
    if factor <= 1:
        return 1.0
    return 0.1 * mscale_all_dim * math.log(factor) + 1.0


def config_softmax_scale(cfg: dict) -> float:
    """softmax scale implied by a config dict: (qk_nope + qk_rope)^-0.5 * mscale^2 under YaRN
    (``rope_scaling`` or ``rope_parameters`` with type/rope_type ``yarn`` and ``mscale_all_dim``)."""
    scale = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind not in (None, "default") and rs.get("mscale_all_dim"):
        m = yarn_mscale(float(rs["factor"]), float(rs["mscale_all_dim"]))
        scale *= m * m
    return scale
