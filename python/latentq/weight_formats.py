"""Weight formats of quantized checkpoints: how a checkpoint says which one it uses, which stored
tensors make one model weight ``<module>.weight``, and the decoder that gives that weight back in the
compute dtype (computed in float32, then cast: a float32 run gets float32 weights, never bf16).

    q = detect("DIR", config)                    # None for an unquantized checkpoint
    plan = q.plan(stored_names)                  # {"<module>.weight": Part(decoder, args, {suffix: name})}
    w = plan[name].decode({suffix: tensor}, torch.float32)

The table (``DECODERS``; ``detect`` reads config.json's ``quantization_config`` and
``hf_quant_config.json``):

- ``deepseek-fp8``: ``quant_method: fp8`` with ``weight_block_size``; per module ``weight``
  float8_e4m3fn and ``weight_scale_inv`` f32 per block; w = fp8 · scale_inv of its block
  (DeepSeek-V3 ``inference/kernel.py`` ``weight_dequant``).
- ``deepseek-v4-fp8``: the same with ``scale_fmt: ue8m0`` (DeepSeek-V4); per module ``weight``
  float8_e4m3fn and ``scale`` e8m0 (one byte b per block, 2^(b − 127)); w = fp8 · 2^(b − 127).
- ``deepseek-v4-mxfp4``: DeepSeek-V4's routed experts with ``expert_dtype: fp4`` (in the
  quantization_config, or at the config's top level as DeepSeek-V4-Flash ships it): ``weight`` int8
  [M, N / 2] (two e2m1, element 2i in the low nibble), ``scale`` e8m0 [M, N / 32]; w = e2m1 · 2^(b − 127)
  (OCP MX v1.0 MXFP4). The same byte layout transformers 5.24 dequantizes on a CPU
  (``integrations/finegrained_fp8.py`` ``Fp8Dequantize._dequantize_one``), which the tests compare with.
- ``ct-pack-quantized``: ``quant_method: compressed-tensors``, format ``pack-quantized``; per module
  ``weight_packed`` int32, ``weight_scale``, ``weight_shape`` and, asymmetric, ``weight_zero_point``;
  w = (q − zp) · scale (compressed-tensors 0.20.0, ``compressors/pack_quantized/base.py`` and
  ``helpers.py``, ``quantization/lifecycle/forward_helpers.py`` ``_dequantize``).
- ``ct-float-quantized``: the same, format ``float-quantized``; ``weight`` float8_e4m3fn and
  ``weight_scale`` (tensor, channel, group or block strategy); w = fp8 · scale
  (compressed-tensors 0.20.0 ``compressors/naive_quantized/base.py``).
- ``modelopt-nvfp4``: ``hf_quant_config.json`` or ``quant_method: modelopt``, ``quant_algo: NVFP4``;
  ``weight`` uint8 (two e2m1, element 2i in the low nibble), ``weight_scale`` e4m3 per 16,
  ``weight_scale_2`` f32, ``input_scale`` (not a weight's); w = e2m1 · (f32(weight_scale) ·
  weight_scale_2) (NVIDIA/Model-Optimizer ``modelopt/torch/quantization/qtensor/nvfp4_tensor.py``
  ``NVFP4QTensor.dequantize``, commit c601044e6d9d50389e60b36290944a2b2d755344).
- ``modelopt-fp8``: the same, ``quant_algo: FP8``; ``weight`` float8_e4m3fn, ``weight_scale`` f32 per
  tensor, ``input_scale``; w = fp8 · weight_scale.

Which modules are quantized: those that store the format's marker tensor (``weight_scale_inv``,
``scale``, ``weight_packed``, ``weight_scale``, ``weight_scale_2``); the others are read as stored. The
config's module lists are honoured: a compressed-tensors module takes the weights arguments of the
first config group whose ``targets`` match it (a name, a ``re:`` pattern matched from the start of
the name as compressed-tensors' ``match_name`` does, or a class name such as ``Linear``, which every
quantized weight is); a module in ``ignore`` (compressed-tensors) or ``exclude_modules`` (ModelOpt,
fnmatch patterns) that stores quantized tensors is an error, as is one no group targets.

Written here rather than calling compressed-tensors' decompressors: those compute in the scale's
dtype (bf16 for Kimi-K2's experts: a float32 run would get bf16-rounded weights) and the package
takes seconds to import; tests/python/test_weight_formats.py compares these decoders with them.

For INT4 and INT8 (the widths that divide 32) the dense packing of compressed-tensors 0.20.0 and the
per-word packing of earlier releases are the same bytes: element i of a row at bits
``num_bits · (i mod 32 / num_bits)`` of word ``i · num_bits // 32``, stored as q + 2^(num_bits-1);
asymmetric zero points are packed the same way along the output dimension.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

HF_QUANT_NAME = "hf_quant_config.json"
# |e2m1| by its three magnitude bits (ModelOpt nvfp4_tensor.py e2m1_values; bit 3 is the sign)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e4m3_table() -> torch.Tensor:
    """float32 value of each of the 256 float8_e4m3fn codes (torch's own conversion, NaN codes
    included). Decoding a weight through it (torch.take) gives the same numbers as
    ``weight.to(torch.float32)`` at a quarter of the time on a CPU."""
    global _E4M3
    if _E4M3 is None:
        _E4M3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
    return _E4M3


_E4M3 = None


def _as_float32(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.float8_e4m3fn:
        return torch.take(_e4m3_table(), x.view(torch.uint8).long())
    return x.to(torch.float32)


def dequantize_fp8_blocks(
    weight: torch.Tensor, scale_inv: torch.Tensor, block_size=(128, 128), dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Block-wise dequantization, DeepSeek's ``weight_dequant`` formula (DeepSeek-V3
    inference/kernel.py): out[i, j] = float32(weight[i, j]) * scale_inv[i // bm, j // bn], computed in
    float32 and stored in ``dtype``.

    weight: [M, N] float8 (e4m3fn as DeepSeek ships it; any dtype that converts to float32);
    scale_inv: [ceil(M / bm), ceil(N / bn)] float (DeepSeek: float32), one per block of
    block_size = (bm, bn); the last block row / column may be partial (M or N not a multiple of
    the block), it takes its block's scale like any other. Returns a new [M, N] CPU tensor of
    ``dtype`` (float32: the exact float32 product). Works one block row at a time: transient memory
    is one [bm, N] float32 row (and its int64 codes) on top of the output.
    Raises ValueError if weight is not 2-D or the scale grid does not have that shape.
    """
    if weight.dim() != 2:
        raise ValueError(f"FP8 weight must be 2-D, got shape {tuple(weight.shape)}")
    bm, bn = (int(b) for b in block_size)
    M, N = weight.shape
    grid = (math.ceil(M / bm), math.ceil(N / bn))
    if tuple(scale_inv.shape) != grid:
        raise ValueError(
            f"FP8 weight [{M}, {N}] with {bm}x{bn} blocks needs a weight_scale_inv of shape {grid}, "
            f"got {tuple(scale_inv.shape)}"
        )
    s = scale_inv.to(torch.float32)
    out = torch.empty((M, N), dtype=dtype)
    for r in range(grid[0]):
        rows = slice(r * bm, min(M, (r + 1) * bm))
        col_scale = s[r].repeat_interleave(bn)[:N]  # [N]: the scale of each column's block
        out[rows] = (_as_float32(weight[rows]) * col_scale).to(dtype)
    return out


# ---- DeepSeek-V4: e8m0 block scales, MXFP4 experts --------------------------------------------


def e8m0_to_float32(scale: torch.Tensor) -> torch.Tensor:
    """float32 2^(b − 127) of e8m0 scale bytes b (OCP MX v1.0 E8M0: no sign, no mantissa; b = 255 is NaN), stored
    as float8_e8m0fnu (DeepSeek-V4's ``F8_E8M0``) or uint8. Any other dtype raises ValueError."""
    if scale.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise ValueError(f"e8m0 scale must be float8_e8m0fnu or uint8, got {scale.dtype}")
    b = scale.view(torch.uint8).to(torch.int32)
    out = torch.ldexp(torch.ones(b.shape, dtype=torch.float32), b - 127)
    return torch.where(b == 255, torch.full_like(out, float("nan")), out)


def decode_fp8_e8m0(parts: dict, args: dict, dtype: torch.dtype) -> torch.Tensor:
    """DeepSeek-V4 FP8 (``quant_method: fp8``, ``scale_fmt: ue8m0``): ``weight`` float8_e4m3fn [M, N] and ``scale``
    e8m0 [ceil(M / bm), ceil(N / bn)] (``weight_block_size``, edge blocks partial); w = float32(fp8) · 2^(b − 127)
    of its block (exact in float32), cast to dtype: DeepSeek-V3's ``weight_dequant`` with e8m0 scales, as transformers
    5.24 ``integrations/finegrained_fp8.py`` ``Fp8Dequantize._dequantize_one`` reads them (uint8 / e8m0 bytes)."""
    return dequantize_fp8_blocks(parts["weight"], e8m0_to_float32(parts["scale"]), args["block"], dtype)


def decode_mxfp4(parts: dict, args: dict, dtype: torch.dtype) -> torch.Tensor:
    """DeepSeek-V4's routed experts (``expert_dtype: fp4``; OCP MX v1.0 MXFP4): ``weight`` int8 / uint8 /
    float4_e2m1fn_x2 [M, N / 2], two e2m1 codes per byte, element 2i in the low nibble, 2i + 1 in the high one,
    each sign (bit 3) and magnitude (E2M1_VALUES[bits 0-2]); ``scale`` e8m0 [M, N / 32], one per 32 inputs of a row.
    w = e2m1 · 2^(b − 127) (exact in float32), cast to dtype. Raises ValueError for another weight dtype or a scale
    of another shape."""
    b = parts["weight"]
    g = int(args.get("group_size", 32))
    if b.dtype not in (torch.int8, torch.uint8, torch.float4_e2m1fn_x2) or b.dim() != 2:
        raise ValueError(f"MXFP4 weight must be int8 [rows, cols / 2], got {b.dtype} {tuple(b.shape)}")
    M, N = b.shape[0], 2 * b.shape[1]
    s = parts["scale"]
    if N % g or tuple(s.shape) != (M, N // g):
        raise ValueError(f"MXFP4 weight [{M}, {N}] needs a scale of shape ({M}, {N // g}), got {tuple(s.shape)}")
    u = b.view(torch.uint8)
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32)
    codes = torch.stack((u & 0x0F, u >> 4), dim=-1).reshape(M, N).long()
    return (table[codes].reshape(M, N // g, g) * e8m0_to_float32(s).unsqueeze(-1)).reshape(M, N).to(dtype)


# ---- compressed-tensors ------------------------------------------------------------------------


def unpack_int32(packed: torch.Tensor, num_bits: int, n: int) -> torch.Tensor:
    """The signed values of an int32 [R, W] row packing (compressed-tensors ``unpack_from_int32``,
    packed_dim 1): element i of a row sits at bits ``num_bits * (i % k)`` of word ``i // k`` (k =
    32 / num_bits), stored as q + 2^(num_bits-1). Returns int16 [R, n] (n <= W * k: the row length;
    the last word may be partly used). num_bits: 2, 4 or 8."""
    if num_bits not in (2, 4, 8) or packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"expected an int32 [rows, words] packing of 2, 4 or 8 bits, got {packed.dtype} {num_bits}")
    k = 32 // num_bits
    if packed.shape[1] != math.ceil(n / k):
        raise ValueError(
            f"{n} values of {num_bits} bits need {math.ceil(n / k)} int32 words a row, got {packed.shape[1]}"
        )
    shifts = torch.arange(k, dtype=torch.int32) * num_bits
    vals = (packed.unsqueeze(-1) >> shifts) & ((1 << num_bits) - 1)  # [R, W, k], bits of each element
    return vals.reshape(packed.shape[0], -1)[:, :n].to(torch.int16) - (1 << (num_bits - 1))


def _expand(s: torch.Tensor, shape: tuple[int, int], args: dict, what: str) -> torch.Tensor:
    """A per-weight tensor (scale or zero point) broadcast to every element of a [M, N] weight, by
    the strategy of ``args`` (compressed-tensors QuantizationArgs as a dict): tensor [1] or [],
    channel [M, 1], group [M, N / group_size], block [ceil(M / bm), ceil(N / bn)]."""
    M, N = shape
    strategy = args.get("strategy")
    if strategy == "tensor":
        want = (1,)
        ok = s.numel() == 1
    elif strategy == "channel":
        want = (M, 1)
        ok = s.numel() == M
        s = s.reshape(M, 1)
    elif strategy == "group":
        g = int(args["group_size"])
        if N % g:
            raise ValueError(f"{N} columns are not a multiple of group_size {g} (compressed-tensors needs it)")
        want = (M, N // g)
        ok = tuple(s.shape) == want
        s = s.repeat_interleave(g, dim=1) if ok else s
    elif strategy == "block":
        bm, bn = (int(b) for b in args["block_structure"])
        want = (math.ceil(M / bm), math.ceil(N / bn))
        ok = tuple(s.shape) == want
        s = s.repeat_interleave(bm, dim=0)[:M].repeat_interleave(bn, dim=1)[:, :N] if ok else s
    else:
        raise ValueError(f"weights strategy {strategy!r} (expected tensor, channel, group or block)")
    if not ok:
        raise ValueError(
            f"a [{M}, {N}] weight with strategy {strategy} needs a {what} of shape {want}, got {tuple(s.shape)}"
        )
    return s.reshape(()) if strategy == "tensor" else s


def decode_ct_pack_quantized(parts: dict, args: dict, dtype: torch.dtype) -> torch.Tensor:
    """compressed-tensors ``pack-quantized`` (PackedQuantizationCompressor.decompress): parts
    ``weight_packed`` int32 [M, ceil(N · bits / 32)], ``weight_shape`` [M, N], ``weight_scale`` (by
    strategy, see _expand), for asymmetric args ``weight_zero_point`` int32 packed along dim 0
    ([ceil(rows · bits / 32), cols] of the scale's shape). w = (q − zp) · scale in float32 (the
    library computes in the scale's dtype: the same numbers, one rounding either way), cast to dtype."""
    bits = int(args["num_bits"])
    M, N = (int(v) for v in parts["weight_shape"].reshape(-1).tolist())
    q = unpack_int32(parts["weight_packed"], bits, N)
    if q.shape[0] != M:
        raise ValueError(f"weight_packed has {q.shape[0]} rows, weight_shape says {M}")
    s = parts["weight_scale"].to(torch.float32)
    x = q.to(torch.float32)
    if not args.get("symmetric", True):
        zp = parts.get("weight_zero_point")
        if zp is None:
            raise ValueError("asymmetric weights without a weight_zero_point")
        if args.get("strategy") in ("group", "channel"):
            rows = s.shape[0] if s.dim() == 2 else M
            zp = unpack_int32(zp.T.contiguous(), bits, rows).T
        x = x - _expand(zp.to(torch.float32).reshape(s.shape), (M, N), args, "weight_zero_point")
    return (x * _expand(s, (M, N), args, "weight_scale")).to(dtype)


def decode_ct_float_quantized(parts: dict, args: dict, dtype: torch.dtype) -> torch.Tensor:
    """compressed-tensors ``float-quantized`` (FloatQuantizationCompressor.decompress): ``weight``
    float8_e4m3fn [M, N] and ``weight_scale`` by strategy (block: [ceil(M / bm), ceil(N / bn)], edge
    blocks partial). w = float32(fp8) · scale in float32 (exact: 4 × 8-or-24 significant bits), cast
    to dtype."""
    w = parts["weight"]
    if w.dim() != 2:
        raise ValueError(f"weight must be 2-D, got {tuple(w.shape)}")
    if args.get("strategy") == "block":
        return dequantize_fp8_blocks(w, parts["weight_scale"], args["block_structure"], dtype)
    s = _expand(parts["weight_scale"].to(torch.float32), tuple(w.shape), args, "weight_scale")
    return (_as_float32(w) * s).to(dtype)


# ---- ModelOpt ------------------------------------------------------------------------------------


def decode_nvfp4(parts: dict, args: dict, dtype: torch.dtype) -> torch.Tensor:
    """ModelOpt NVFP4 (NVFP4QTensor.dequantize): ``weight`` uint8 [M, N / 2], element 2i in the low
    nibble and 2i + 1 in the high one, each sign (bit 3) and magnitude (E2M1_VALUES[bits 0-2]);
    ``weight_scale`` float8_e4m3fn [M, N / group]; ``weight_scale_2`` float32 scalar.
    w = e2m1 · (float32(weight_scale) · weight_scale_2), both products in float32 as ModelOpt
    computes them, cast to dtype."""
    b = parts["weight"]
    g = int(args.get("group_size", 16))
    if b.dtype != torch.uint8 or b.dim() != 2:
        raise ValueError(f"NVFP4 weight must be uint8 [rows, cols / 2], got {b.dtype} {tuple(b.shape)}")
    M, N = b.shape[0], 2 * b.shape[1]
    s = parts["weight_scale"]
    if N % g or tuple(s.shape) != (M, N // g):
        raise ValueError(
            f"NVFP4 weight [{M}, {N}] needs a weight_scale of shape ({M}, {N // g}) (group {g}), got {tuple(s.shape)}"
        )
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32)
    codes = torch.stack((b & 0x0F, b >> 4), dim=-1).reshape(M, N).long()
    per_block = _as_float32(s) * parts["weight_scale_2"].to(torch.float32).reshape(())
    return (table[codes].reshape(M, N // g, g) * per_block.unsqueeze(-1)).reshape(M, N).to(dtype)


def decode_modelopt_fp8(parts: dict, args: dict, dtype: torch.dtype) -> torch.Tensor:
    """ModelOpt FP8: ``weight`` float8_e4m3fn [M, N], ``weight_scale`` float32 per tensor ([] or [1])
    or per output channel ([M] or [M, 1]). w = float32(fp8) · weight_scale, cast to dtype."""
    w = parts["weight"]
    s = parts["weight_scale"].to(torch.float32)
    strategy = "tensor" if s.numel() == 1 else "channel"
    return (_as_float32(w) * _expand(s, tuple(w.shape), {"strategy": strategy}, "weight_scale")).to(dtype)


def _fp8_decoder(parts: dict, args: dict, dtype: torch.dtype) -> torch.Tensor:
    return dequantize_fp8_blocks(parts["weight"], parts["weight_scale_inv"], args["block"], dtype)


@dataclass(frozen=True)
class Decoder:
    """One row of the table. marker: the stored suffix that makes a module quantized; needs: the
    suffixes the decoder reads (marker included); optional: read when stored; hidden: stored with
    the module, not read (activation scales); expand: logical elements per stored element of the
    first ``needs`` tensor (header sizes); decode(parts by suffix, args, dtype) -> [M, N] weight."""

    key: str
    marker: str
    needs: tuple[str, ...]
    decode: Callable[[dict, dict, torch.dtype], torch.Tensor]
    source: str
    optional: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    expand: Callable[[dict], int] = lambda args: 1


_ACT = ("input_scale", "input_zero_point", "input_global_scale", "weight_global_scale")
DECODERS = {
    d.key: d
    for d in (
        Decoder(
            "deepseek-fp8",
            "weight_scale_inv",
            ("weight", "weight_scale_inv"),
            _fp8_decoder,
            "DeepSeek-V3 inference/kernel.py weight_dequant",
        ),
        Decoder(
            "deepseek-v4-fp8",
            "scale",
            ("weight", "scale"),
            decode_fp8_e8m0,
            "DeepSeek-V3 weight_dequant with e8m0 scales (transformers 5.24 Fp8Dequantize)",
        ),
        Decoder(
            "deepseek-v4-mxfp4",
            "scale",
            ("weight", "scale"),
            decode_mxfp4,
            "OCP MX v1.0 MXFP4 (DeepSeek-V4 expert_dtype fp4)",
            expand=lambda args: 2,
        ),
        Decoder(
            "ct-pack-quantized",
            "weight_packed",
            ("weight_packed", "weight_scale", "weight_shape"),
            decode_ct_pack_quantized,
            "compressed-tensors 0.20.0 compressors/pack_quantized/{base,helpers}.py",
            optional=("weight_zero_point",),
            hidden=_ACT,
            expand=lambda args: 32 // int(args["num_bits"]),
        ),
        Decoder(
            "ct-float-quantized",
            "weight_scale",
            ("weight", "weight_scale"),
            decode_ct_float_quantized,
            "compressed-tensors 0.20.0 compressors/naive_quantized/base.py",
            hidden=_ACT,
        ),
        Decoder(
            "modelopt-nvfp4",
            "weight_scale_2",
            ("weight", "weight_scale", "weight_scale_2"),
            decode_nvfp4,
            "ModelOpt qtensor/nvfp4_tensor.py (NVIDIA/Model-Optimizer c601044e)",
            hidden=("input_scale",),
            expand=lambda args: 2,
        ),
        Decoder(
            "modelopt-fp8",
            "weight_scale",
            ("weight", "weight_scale"),
            decode_modelopt_fp8,
            "ModelOpt FP8 export: w = fp8 * weight_scale",
            hidden=("input_scale",),
        ),
    )
}


@dataclass(frozen=True)
class Part:
    """One model weight of a quantized module: its decoder, the weights arguments and the stored
    tensors it is made of (suffix -> stored name)."""

    decoder: Decoder
    args: dict
    stored: dict[str, str]

    def decode(self, tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return self.decoder.decode(tensors, self.args, dtype)


@dataclass
class Rule:
    """A decoder with its arguments for the modules ``match`` accepts."""

    decoder: Decoder
    args: dict
    match: Callable[[str], bool] = lambda m: True


@dataclass
class Quantization:
    """A checkpoint's weight quantization: rules (first match wins), ignored(module) (the config's
    ignore / exclude list), label (for messages), original_dtype (the dump attribute)."""

    label: str
    original_dtype: str
    rules: list[Rule]
    ignored: Callable[[str], bool] = lambda m: False
    keys: tuple[str, ...] = field(default=())

    def plan(self, names) -> dict[str, Part]:
        """``<module>.weight`` -> Part for every module of ``names`` (stored tensor names) that
        stores a rule's marker and its first needed tensor (a module with scales but no weight
        tensor is left as stored: the loader then names the model weight it lacks). Raises
        ValueError naming the module: quantized but ignored, no rule for it, or another needed
        tensor missing."""
        by_module: dict[str, set[str]] = {}
        suffixes = {s for r in self.rules for s in (r.decoder.needs + r.decoder.optional + r.decoder.hidden)}
        for n in names:
            mod, _, suf = n.rpartition(".")
            if suf in suffixes:
                by_module.setdefault(mod, set()).add(suf)
        out = {}
        markers = {r.decoder.marker for r in self.rules}
        for mod, have in by_module.items():
            if not have & markers:
                continue
            if self.ignored(mod):
                raise ValueError(
                    f"{mod} stores quantized tensors ({sorted(have)}) but the {self.label} config ignores it"
                )
            rule = next((r for r in self.rules if r.decoder.marker in have and r.match(mod)), None)
            if rule is None:
                raise ValueError(f"{mod} stores {sorted(have)} but no {self.label} config group targets it")
            d = rule.decoder
            if d.needs[0] not in have:  # no weight at all: left as stored, the loader names the missing weight
                continue
            lack = [s for s in d.needs if s not in have]
            if lack:
                raise ValueError(f"{self.label} module {mod} has no {', '.join(mod + '.' + s for s in lack)}")
            stored = {s: f"{mod}.{s}" for s in d.needs + d.optional + d.hidden if s in have}
            out[f"{mod}.weight"] = Part(d, rule.args, stored)
        return out


# ---- recognising a checkpoint's format -------------------------------------------------------


def _ct_match(name: str, target: str) -> bool:
    """compressed-tensors' match_name, plus class-name targets ("Linear": every quantized weight)."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name or (target[:1].isupper() and "." not in target)


def _compressed_tensors(qc: dict) -> Quantization:
    fmt = qc.get("format")
    groups = qc.get("config_groups") or {}
    if not groups:
        raise ValueError("compressed-tensors quantization_config without config_groups")
    rules, bits = [], set()
    for gname, g in groups.items():
        w = g.get("weights") or {}
        gfmt = g.get("format") or fmt
        key = {"pack-quantized": "ct-pack-quantized", "float-quantized": "ct-float-quantized"}.get(gfmt)
        if key is None:
            raise ValueError(
                f"compressed-tensors format {gfmt!r} (config group {gname}) is not supported "
                "(pack-quantized, float-quantized)"
            )
        kind, nb = w.get("type"), int(w.get("num_bits") or 0)
        if key == "ct-pack-quantized" and not (kind == "int" and nb in (4, 8)):
            raise ValueError(f"pack-quantized config group {gname}: {kind} {nb} bits (int 4 or 8 are supported)")
        if key == "ct-float-quantized" and not (kind == "float" and nb == 8):
            raise ValueError(f"float-quantized config group {gname}: {kind} {nb} bits (float 8 is supported)")
        if w.get("strategy") not in ("tensor", "channel", "group", "block"):
            raise ValueError(f"config group {gname}: weights strategy {w.get('strategy')!r} is not supported")
        targets = list(g.get("targets") or [])
        rules.append(Rule(DECODERS[key], dict(w), lambda m, t=targets: any(_ct_match(m, x) for x in t)))
        bits.add(f"int{nb}" if kind == "int" else "float8_e4m3fn")
    ignore = list(qc.get("ignore") or [])
    return Quantization(
        "compressed-tensors",
        "+".join(sorted(bits)),
        rules,
        lambda m: any(_ct_match(m, x) for x in ignore),
        tuple(r.decoder.key for r in rules),
    )


def _modelopt(q: dict, where: str) -> Quantization:
    algo = str(q.get("quant_algo") or "").upper()
    exclude = list(q.get("exclude_modules") or q.get("ignore") or [])

    def ignored(m: str) -> bool:
        return any(fnmatch.fnmatchcase(m, p) for p in exclude)

    if algo == "NVFP4":
        args = {"group_size": int(q.get("group_size") or 16)}
        return Quantization(
            "ModelOpt NVFP4", "nvfp4", [Rule(DECODERS["modelopt-nvfp4"], args)], ignored, ("modelopt-nvfp4",)
        )
    if algo == "FP8":
        return Quantization(
            "ModelOpt FP8", "float8_e4m3fn", [Rule(DECODERS["modelopt-fp8"], {})], ignored, ("modelopt-fp8",)
        )
    raise ValueError(f"{where}: ModelOpt quant_algo {q.get('quant_algo')!r} is not supported (NVFP4, FP8)")


# DeepSeek-V4's routed experts, by stored module name (``layers.N.ffn.experts.E.w{1,2,3}``, ``mtp.K.`` alike)
V4_ROUTED_EXPERT = re.compile(r"(^|\.)ffn\.experts\.\d+\.w[123]$")


def _deepseek_fp8(qc: dict, config: dict) -> Quantization:
    """DeepSeek's FP8 (``quant_method: fp8``): V3's float32 ``weight_scale_inv`` per block, or, with ``scale_fmt:
    ue8m0``, V4's e8m0 ``scale`` per block and, with ``expert_dtype: fp4`` (in the quantization_config or, as
    DeepSeek-V4-Flash ships it, at the config's top level), MXFP4 routed experts."""
    if qc.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"quantization_config.fmt {qc.get('fmt')!r}: only e4m3 is supported")
    block = qc.get("weight_block_size")
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(int(b) > 0 for b in block)):
        raise ValueError(
            f"quantization_config.weight_block_size {block!r}: expected [rows, cols] (DeepSeek: [128, 128])"
        )
    args = {"block": (int(block[0]), int(block[1]))}
    scale_fmt = qc.get("scale_fmt") or "float"
    if scale_fmt not in ("float", "ue8m0"):
        raise ValueError(f"quantization_config.scale_fmt {scale_fmt!r}: expected float (DeepSeek-V3) or ue8m0 (V4)")
    if scale_fmt == "float":
        rule = Rule(DECODERS["deepseek-fp8"], args)
        return Quantization("DeepSeek FP8", "float8_e4m3fn", [rule], keys=("deepseek-fp8",))
    experts = qc.get("expert_dtype") or config.get("expert_dtype") or "fp8"
    if experts not in ("fp8", "fp4"):
        raise ValueError(f"expert_dtype {experts!r}: expected fp8 or fp4 (DeepSeek-V4)")
    rules = [Rule(DECODERS["deepseek-v4-fp8"], args)]
    if experts == "fp4":
        mx = Rule(DECODERS["deepseek-v4-mxfp4"], {"group_size": 32}, lambda m: V4_ROUTED_EXPERT.search(m) is not None)
        rules.insert(0, mx)
    label = "DeepSeek-V4 FP8" + (" + MXFP4 experts" if experts == "fp4" else "")
    return Quantization(label, "float8_e4m3fn" + ("+mxfp4" if experts == "fp4" else ""), rules,
                        keys=tuple(r.decoder.key for r in rules))  # fmt: skip


def detect(path: str, config: dict) -> Quantization | None:
    """The weight quantization of the checkpoint directory ``path`` (its config.json as ``config``):
    from ``quantization_config`` (quant_method fp8, compressed-tensors or modelopt) or, without one,
    from ``hf_quant_config.json`` (ModelOpt's export); None when neither says the weights are
    quantized. Raises ValueError naming what is not supported (a quant_method, a format, a width)."""
    qc = config.get("quantization_config")
    if qc:
        method = qc.get("quant_method")
        if method == "fp8":
            return _deepseek_fp8(qc, config)
        if method == "compressed-tensors":
            return _compressed_tensors(qc)
        if method == "modelopt":
            return _modelopt(qc, "quantization_config")
        raise ValueError(
            f"quantization_config.quant_method {method!r} is not supported "
            "(fp8 as DeepSeek ships it, compressed-tensors pack-quantized / float-quantized, modelopt NVFP4 / FP8, "
            "or an unquantized checkpoint)"
        )
    hq = os.path.join(path, HF_QUANT_NAME)
    if os.path.isfile(hq):
        with open(hq) as f:
            q = json.load(f).get("quantization") or {}
        if q.get("quant_algo"):
            return _modelopt(q, HF_QUANT_NAME)
    return None
