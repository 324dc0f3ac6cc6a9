"""Layer streaming: run an HF MLA (or DeepSeek-V4) checkpoint larger than memory, one decoder layer at a time.

The model is built on the meta device (accelerate's ``init_empty_weights``: parameters on meta,
buffers such as the rotary ``inv_freq`` real), so it costs no memory. Its decoder layers then run
layer-major: every input (a sequence, or a batch of them) goes through layer i before layer i+1,
and layer i's weights are read from the safetensors shards (through ``model.safetensors.index.json``;
a layer may span shards) right before it runs and put back on meta right after
(accelerate's ``set_module_tensor_to_device``). Between layers the hidden states live on the host:
in memory, or in a temporary file when they and the largest layer do not fit in the memory budget.

    sm = LayerStreamer("DIR", torch.float32)         # meta model, nothing loaded
    sm.run([ids0, ids1], before=..., after=..., on_logits=...)
    model = LayerStreamer("DIR", torch.float32).materialize()   # every weight loaded: in memory

The inputs of layer 0 (hidden states, attention mask, position embeddings, position ids ...) are
taken from the model's own forward: it runs up to the first decoder layer, whose forward pre-hook
records its arguments and stops the pass, so the layers see exactly what the model's forward would
give them (hybrid models, whose forward picks a layer's inputs by ``config.layer_types[i]``, e.g.
Kimi-Linear's causal mask for its MLA layers and none for its KDA layers: once per layer type, with
that type set for layer 0 during the call: ``LayerStreamer._layer_kinds``), and the streamed
outputs equal the in-memory model's bit for bit (same modules, same arithmetic, one input per call
as before).

What it reads:
  - bf16 / fp16 / fp32 tensors, cast to the compute dtype (or kept in float32 where the model keeps
    them there: parameters the model creates in float32, such as DeepSeek-V3's router, and its
    ``_keep_in_fp32_modules_strict``, as transformers' ``from_pretrained`` does);
  - quantized weights, decoded on load to the compute dtype by latentq.weight_formats (its table:
    DeepSeek FP8 with a float32 ``<name>_scale_inv`` per block of ``weight_block_size``, DeepSeek-V4's
    FP8 with an e8m0 ``<module>.scale`` per block and its MXFP4 routed experts, compressed-tensors
    ``pack-quantized`` INT4 / INT8 and ``float-quantized`` FP8, ModelOpt NVFP4 and FP8): a quantized
    module's stored tensors are read together as its ``weight``;
  - per-expert weights as DeepSeek ships them (``mlp.experts.N.{gate,up,down}_proj.weight``, 2-D),
    placed into transformers' fused expert parameters (``experts.gate_up_proj`` [E, 2I, H] = gate
    rows then up rows per expert, ``experts.down_proj`` [E, H, I]) when the model has them, as
    transformers' own conversion (MergeModulelist + Concatenate) does, or by name when it keeps
    one module per expert (remote code);
  - checkpoints named as their family ships them, where transformers renames or merges tensors on
    load: its conversion table for the model (``get_model_conversion_mapping``) renames the
    checkpoint's names and maps per-expert and row-concatenated tensors into the model's fused ones
    (``LayerStreamer._rename_checkpoint``; Kimi-Linear: ``block_sparse_moe.experts.N.w1`` ->
    ``mlp.experts.gate_up_proj``, ``q_conv1d`` / ``k_conv1d`` / ``v_conv1d`` -> ``conv1d``; DeepSeek-V4:
    ``layers.N.attn.wq_a`` -> ``model.layers.N.self_attn.q_a_proj``, the base model's prefix added as
    from_pretrained adds it, ``mtp.K.`` blocks never read);
  - DeepSeek-V4's layer layout (``model_type`` deepseek_v4): its ``DeepseekV4Attention`` layers, the
    ``hc_mult`` residual streams between layers ([B, L, hc_mult, hidden] on the host) and the final
    ``norm(hc_head(h))`` before the head (``DeepseekV4Model.forward``);
  - outputs a decoder layer hands to the next one through the model's forward (``CARRIED_OUTPUTS``:
    GLM-5's ``prev_topk_indices`` for its "shared" DSA layers) are kept per input on the host and
    passed on, as the forward does;
  - MoE and dense layers alike (``first_k_dense_replace`` is the model's own business: whatever
    module a layer has is what gets loaded); checkpoint layers past ``num_hidden_layers`` (DeepSeek-V3's
    multi-token-prediction layer 61) are never read (``skipped_layers``).

Written here rather than taken from a library: transformers' ``from_pretrained`` loads the whole
model; its CPU fallback for FP8 checkpoints (``dequantize=True``, to bfloat16) derives the block size
as (rows // scale rows, cols // scale cols), which is wrong for partial edge blocks: it refuses
DeepSeek-V3's kv_a_proj_with_mqa ([576, 7168], a 5 × 56 scale grid) and silently misplaces the
scales of a [160, 192] weight (a 2 × 2 grid read as 80 × 96 blocks; transformers 5.24.0).
accelerate's big-model inference (``dispatch_model`` with offload) streams weights per module but
runs each forward input through all layers before the next input, reads no FP8 scales and does not
fuse per-expert tensors. The pieces that exist are used: ``init_empty_weights``,
``set_module_tensor_to_device``, ``safetensors.safe_open``.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

from latentq.progress import say
from latentq.stream_host import HostStates, _trim_host_heap  # noqa: F401  (HostStates re-exported)
from latentq.weight_formats import Part, Quantization, detect
from latentq.weight_formats import dequantize_fp8_blocks as dequantize_fp8_blocks  # re-exported

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
SCALE_SUFFIX = "_scale_inv"
_EXPERT_KEY = re.compile(r"^(?P<base>.+\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
_LAYER_KEY = re.compile(r"^(?P<prefix>(?P<list>.+\.layers)\.(?P<i>\d+))\.")
# Decoder-layer outputs the model's forward hands to the next layer under a keyword: name -> index of the
# output. GLM-5 (glm_moe_dsa): a "shared" DSA layer reuses the top-k of the last "full" one, passed as
# prev_topk_indices=<the previous layer's output[1]> (GlmMoeDsaModel.forward, modeling_glm_moe_dsa.py).
CARRIED_OUTPUTS = {"prev_topk_indices": 1}
_FLOAT8 = {"F8_E4M3": torch.float8_e4m3fn}
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4}
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be streamed (no safetensors, unknown quantization, a weight
    the model has no place for, a model weight the checkpoint lacks ...). The message names the
    directory and the tensor."""


def parse_size(text: str | int) -> int:
    """Bytes from "24G", "512M", "1.5T", "64K" (binary units, optional trailing "B" / "iB") or a
    plain integer. Raises ValueError naming the text on anything else or a size <= 0."""
    if isinstance(text, int):
        n = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B)?\s*", str(text), re.IGNORECASE)
        if not m:
            raise ValueError(f"memory size {text!r}: expected a number of bytes or e.g. 512M, 24G, 1.5T")
        n = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if n <= 0:
        raise ValueError(f"memory size {text!r}: must be > 0")
    return n


def default_memory_budget() -> int:
    """Half of the machine's physical memory, in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


class Checkpoint:
    """A local safetensors checkpoint directory: its config.json, the index
    (``model.safetensors.index.json``, or a single ``model.safetensors``) and its weight quantization
    (latentq.weight_formats: DeepSeek FP8, compressed-tensors pack- / float-quantized, ModelOpt NVFP4
    / FP8), seen through model weight names: a quantized module's stored tensors (``weight_packed``,
    ``weight_scale``, ``weight_scale_inv`` ...) appear as its one ``<module>.weight``, read decoded.

    Attributes: path, config (dict), stored_map (stored tensor name -> shard file name, as the
    index says), weight_map (model weight name -> shard file name: stored_map with each quantized
    module's tensors replaced by ``<module>.weight``, in the shard of its first tensor; after
    ``rename``, keyed by the new names), files (the shard names, sorted), quantization
    (latentq.weight_formats.Quantization or None), parts (``<module>.weight`` -> weight_formats.Part
    of each quantized weight, by stored name), fp8_block ((bm, bn) for a DeepSeek FP8 checkpoint,
    else None), source_of (renamed weight name -> the name before ``rename``, for renamed ones).
    Raises CheckpointError: no config.json, no safetensors index or file, an unsupported
    quantization, a quantized module the config ignores or lacks a tensor of, an index naming a
    missing shard."""

    def __init__(self, path: str):
        self.path = path
        cfg_path = os.path.join(path, "config.json")
        try:
            with open(cfg_path) as f:
                self.config = json.load(f)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{path}: cannot read config.json ({e})") from None
        index = os.path.join(path, INDEX_NAME)
        if os.path.isfile(index):
            with open(index) as f:
                self.stored_map = dict(json.load(f)["weight_map"])
        elif os.path.isfile(os.path.join(path, SINGLE_NAME)):
            from safetensors import safe_open

            with safe_open(os.path.join(path, SINGLE_NAME), framework="pt") as f:
                self.stored_map = dict.fromkeys(f.keys(), SINGLE_NAME)
        else:
            raise CheckpointError(f"{path}: no {INDEX_NAME} and no {SINGLE_NAME} (streaming reads safetensors only)")
        self.files = sorted(set(self.stored_map.values()))
        for fn in self.files:
            if not os.path.isfile(os.path.join(path, fn)):
                raise CheckpointError(f"{path}: {INDEX_NAME} names the shard {fn}, which does not exist")
        try:
            self.quantization: Quantization | None = detect(path, self.config)
            self.parts: dict[str, Part] = self.quantization.plan(self.stored_map) if self.quantization else {}
        except ValueError as e:
            raise CheckpointError(f"{path}: {e}") from None
        self.fp8_block = None
        if self.quantization is not None and self.quantization.keys == ("deepseek-fp8",):
            self.fp8_block = self.quantization.rules[0].args["block"]
        folded = {s for p in self.parts.values() for s in p.stored.values()}
        self.weight_map = {k: fn for k, fn in self.stored_map.items() if k not in folded}
        for name, p in self.parts.items():
            self.weight_map[name] = self.stored_map[p.stored[p.decoder.needs[0]]]
        self.source_of: dict[str, str] = {}  # renamed weight name -> its name in the checkpoint (rename)
        self._index_layers()

    def _index_layers(self) -> None:
        self._by_layer: dict[str, list[str]] = {}
        for k in self.weight_map:
            m = _LAYER_KEY.match(k)
            if m:
                self._by_layer.setdefault(m["prefix"], []).append(k)

    def rename(self, new_name: Callable[[str], str]) -> None:
        """See the checkpoint's weights under other names: ``weight_map`` is re-keyed by
        ``new_name(name)``, and ``read`` of a new name reads the tensor stored under the old one (a
        quantized weight's tensors included). Raises CheckpointError when two weights get one name."""
        wm, src = {}, {}
        for k, fn in self.weight_map.items():
            n = new_name(k)
            if n in wm:
                raise CheckpointError(f"{self.path}: {src[n]} and {k} both map to the model weight {n}")
            wm[n], src[n] = fn, self.source_of.get(k, k)
        self.weight_map, self.source_of = wm, {n: k for n, k in src.items() if n != k}
        self._index_layers()

    def names_under(self, prefix: str) -> list[str]:
        """Model weight names under ``prefix + "."`` (in index order; quantized weights last)."""
        if prefix in self._by_layer:
            return list(self._by_layer[prefix])
        return [k for k in self.weight_map if k.startswith(prefix + ".")]

    def layer_indices(self, layers_name: str) -> list[int]:
        """The indices i of the ``<layers_name>.<i>`` prefixes of the checkpoint, sorted."""
        out = []
        for p in self._by_layer:
            head, _, i = p.rpartition(".")
            if head == layers_name:
                out.append(int(i))
        return sorted(out)

    def header_bytes(self, dtype: torch.dtype, skip=lambda name: False) -> int:
        """Bytes the checkpoint's model weights take in ``dtype`` (floating and decoded quantized
        weights; scales excluded; integer tensors at their stored size), from the shards' headers
        (nothing is read; a packed weight counts its stored elements times the values per element,
        an upper bound by less than one int32 word a row). ``skip(name)`` leaves weights out."""
        from safetensors import safe_open

        elem = torch.empty((), dtype=dtype).element_size()
        total = 0
        by_file: dict[str, list[tuple[str, int]]] = {}
        for k in self.weight_map:
            if k.endswith(SCALE_SUFFIX) or skip(k):
                continue
            k = self.source_of.get(k, k)
            p = self.parts.get(k)
            stored = k if p is None else p.stored[p.decoder.needs[0]]
            by_file.setdefault(self.stored_map[stored], []).append(
                (stored, 1 if p is None else p.decoder.expand(p.args))
            )
        for fn, names in by_file.items():
            with safe_open(os.path.join(self.path, fn), framework="pt") as f:
                for k, times in names:
                    sl = f.get_slice(k)
                    n = math.prod(sl.get_shape()) * times
                    st = sl.get_dtype()
                    total += n * (elem if times > 1 or st.startswith(("F", "BF")) else _SAFETENSORS_BYTES.get(st, 8))
        return total

    def read(self, names: list[str], dtype_of: Callable[[str], torch.dtype]) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, tensor) for each model weight name, shard by shard (each shard opened once,
        closed after; a quantized weight's scales are read from their own shards): quantized weights
        decoded to dtype_of(name) (latentq.weight_formats, in float32 then cast), floating tensors
        cast to it, others as stored. Raises CheckpointError: a name not in the checkpoint, a decoder
        refusing its tensors (shapes), an FP8 tensor in a checkpoint that does not say how to scale it."""
        from safetensors import safe_open

        by_file: dict[str, list[str]] = {}
        for k in names:
            if k not in self.weight_map:
                raise CheckpointError(f"{self.path}: tensor {k} is not in the checkpoint")
            by_file.setdefault(self.weight_map[k], []).append(k)
        for fn in sorted(by_file):
            with safe_open(os.path.join(self.path, fn), framework="pt") as f:
                for k in by_file[fn]:
                    src = self.source_of.get(k, k)
                    p = self.parts.get(src)
                    if p is not None:
                        yield k, self._decode(src, p, f, fn, dtype_of(k))
                        continue
                    t = f.get_tensor(src)
                    yield k, self._convert(src, t, dtype_of(k))
                    del t

    def _decode(self, k: str, p: Part, f, fn: str, dtype: torch.dtype) -> torch.Tensor:
        from safetensors import safe_open

        tensors = {}
        for suffix, name in p.stored.items():
            if suffix in p.decoder.hidden:
                continue
            if self.stored_map[name] == fn:
                tensors[suffix] = f.get_tensor(name)
            else:
                with safe_open(os.path.join(self.path, self.stored_map[name]), framework="pt") as g:
                    tensors[suffix] = g.get_tensor(name)
        try:
            return p.decode(tensors, dtype)
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{self.path}: {k} ({p.decoder.key}): {e}") from None

    def _convert(self, k: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if t.dtype in _FLOAT8.values():
            raise CheckpointError(
                f"{self.path}: {k} is {t.dtype} but the checkpoint has no scale for it "
                "(no fp8 quantization_config with weight_block_size and a weight_scale_inv, "
                "or another format's scale tensors)"
            )
        if t.is_floating_point():
            return t.to(dtype)
        return t


class _Stop(Exception):
    """Raised by the layer-0 pre-hook once it has recorded the layer's inputs."""


def _to(x, device):
    """x on device (a tensor), or x (None)."""
    return x.detach().to(device) if isinstance(x, torch.Tensor) else x


def _same(a, b) -> bool:
    """Structural equality of captured layer arguments (tensors bit for bit)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and a.device == b.device
            and bool(torch.equal(a, b))
        )
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a is b or (type(a) is type(b) and a == b)


def _persistent_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers of module, by qualified name."""
    out = {}
    for mname, m in module.named_modules():
        mp = mname + "." if mname else ""
        for n, p in m._parameters.items():
            if p is not None:
                out[mp + n] = p
        for n, b in m._buffers.items():
            if b is not None and n not in m._non_persistent_buffers_set:
                out[mp + n] = b
    return out


class LayerStreamer:
    """An HF causal-LM checkpoint directory on the meta device, run layer by layer (module docstring).

    path: a local directory with config.json and safetensors shards. dtype: the compute dtype.
    device: where each layer runs ("cpu" or "cuda"; hidden states go back to the host between
    layers). memory_budget: bytes (default ``default_memory_budget()``): the hidden states stay in
    memory when they and the largest decoder layer (in the compute dtype) fit in it, else they go to
    a temporary file in ``spill_dir`` (default: the system's temporary directory).
    trust_remote_code: for remote-code checkpoints (their decoder layers must be the entries of one
    ``...layers`` ModuleList holding the MLA modules, directly or deeper: LongCat-Flash's
    ``model.layers.i.self_attn.j``).

    Attributes: model (the meta model: install hooks on it, e.g. latentq.capture.LatentCapture),
    config (its PretrainedConfig), checkpoint (Checkpoint), layers_name ("model.layers"), layers (the
    ModuleList), skipped_layers (checkpoint layer indices >= num_hidden_layers, never read),
    states_in_memory, load_seconds, compute_seconds (after ``run``: whether the hidden states were
    kept in memory; the seconds of the layers' loads and of their runs).

    Raises CheckpointError (see Checkpoint; a model layer missing from the checkpoint),
    latentq.capture.MLAModuleNotFoundError (no MLA module, and not DeepSeek-V4).
    """

    def __init__(
        self,
        path: str,
        dtype: torch.dtype = torch.float32,
        *,
        device: str | torch.device = "cpu",
        memory_budget: int | None = None,
        spill_dir: str | None = None,
        trust_remote_code: bool = False,
        attn_implementation: str = "eager",
    ):
        from accelerate import init_empty_weights
        from transformers import AutoModelForCausalLM

        from latentq.model_class import hf_config_and_class

        self.checkpoint = Checkpoint(path)
        self.path, self.dtype, self.device = path, dtype, torch.device(device)
        self.memory_budget = default_memory_budget() if memory_budget is None else int(memory_budget)
        self.spill_dir = spill_dir
        config, cls, note = hf_config_and_class(path, trust_remote_code)
        if note is not None:
            say("stream", "note", note)
        with init_empty_weights(include_buffers=False):
            if cls is None:
                model = AutoModelForCausalLM.from_config(
                    config, dtype=dtype, attn_implementation=attn_implementation, trust_remote_code=trust_remote_code
                )
            else:
                model = cls._from_config(config, dtype=dtype, attn_implementation=attn_implementation)
        self.model = model.eval()
        self.config = self.model.config
        self._names = {id(m): n for n, m in self.model.named_modules()}
        self._concat = self._rename_checkpoint()
        attns = self._attention_modules()
        # "model.layers.3.self_attn" and LongCat-Flash's "model.layers.3.self_attn.1" -> "model.layers"
        parents = {m["list"] if (m := _LAYER_KEY.match(n + ".")) else n for n in attns}
        if len(parents) != 1:
            raise CheckpointError(f"{path}: attention modules under several layer lists {sorted(parents)}")
        self.layers_name = parents.pop()
        self.layers = self.model.get_submodule(self.layers_name)
        if not isinstance(self.layers, nn.ModuleList):
            raise CheckpointError(f"{path}: {self.layers_name} is a {type(self.layers).__name__}, not a ModuleList")
        have = self.checkpoint.layer_indices(self.layers_name)
        n = len(self.layers)
        missing = sorted(set(range(n)) - set(have))
        if missing:
            raise CheckpointError(
                f"{path}: the model has {n} decoder layers; the checkpoint has no tensors of layers {missing}"
            )
        self.skipped_layers = [i for i in have if i >= n]
        self._fp32 = self._fp32_patterns()
        head = self.model.get_output_embeddings()
        base = getattr(self.model, self.model.base_model_prefix, None)
        norm = getattr(base, "norm", None)
        if head is None or norm is None:
            raise CheckpointError(
                f"{path}: {type(self.model).__name__} has no final norm (<base>.norm) or output embeddings"
            )
        self.norm_name, self.head_name = self._names[id(norm)], self._names[id(head)]
        # DeepSeek-V4 collapses its hc_mult residual streams before the norm: norm(hc_head(h)) (DeepseekV4Model)
        hc_head = getattr(base, "hc_head", None)
        self.final_names = ([self._names[id(hc_head)]] if isinstance(hc_head, nn.Module) else []) + [self.norm_name]
        self._tensors = _persistent_tensors(self.model)
        self.states_in_memory: bool | None = None
        # after ``run``: wall seconds spent reading + converting decoder-layer weights (load_layer) and
        # running the decoder layers on the inputs (callbacks included): is a run read- or compute-bound
        self.load_seconds = 0.0
        self.compute_seconds = 0.0
        for i in range(n):  # every tensor has its place before anything is read (names only)
            p = f"{self.layers_name}.{i}"
            self._placements(self._under(p), self.checkpoint.names_under(p))
        rest = [t for t in self._tensors if not t.startswith(self.layers_name + ".")]
        self._placements(rest, [k for k in rest if k in self.checkpoint.weight_map])

    # ---- what lives where ---------------------------------------------------------------------
    def _attention_modules(self) -> list[str]:
        """Qualified names of the attention modules whose caches latentq reads: the MLA modules
        (latentq.capture.find_mla_layers) or, in a DeepSeek-V4 model (``model_type`` deepseek_v4), its
        ``DeepseekV4Attention`` modules (latentq.deepseek_v4.find_v4_layers). Raises
        latentq.capture.MLAModuleNotFoundError for a model with neither."""
        from latentq.capture import MLAModuleNotFoundError, find_mla_layers

        try:
            return [n for _, n, _ in find_mla_layers(self.model)]
        except MLAModuleNotFoundError:
            if getattr(self.config, "model_type", None) != "deepseek_v4":
                raise
        from latentq.deepseek_v4 import find_v4_layers

        return [self._names[id(a)] for a in find_v4_layers(self.model)]

    def _rename_checkpoint(self) -> dict[str, tuple[str, int, int]]:
        """Name the checkpoint's weights as the model does, with transformers' own conversion table for
        the model (``transformers.conversion_mapping.get_model_conversion_mapping``, what from_pretrained
        applies): every ``WeightRenaming`` in turn (Kimi-Linear: ``block_sparse_moe`` -> ``mlp``,
        ``self_attn.A_log`` -> ``self_attn.forget_gate.A_log`` ...), then the first matching
        ``WeightConverter`` of the two kinds read here:
          - MergeModulelist(0) [+ Concatenate(1)] into a fused expert tensor: the per-expert weight is
            named ``<...experts>.<e>.{gate,up,down}_proj.weight`` (the j-th source of a gate_up_proj
            target is gate for j = 0, up for j = 1), which ``_placements`` places (DeepSeek's names
            stay as they are; Kimi-Linear's ``w1`` / ``w3`` / ``w2`` become gate / up / down);
          - Concatenate(0) of n sources into one tensor (Kimi-Linear's ``q_conv1d``, ``k_conv1d``,
            ``v_conv1d`` -> ``conv1d``): the j-th source fills rows [j R / n, (j + 1) R / n) of the
            target's R rows; returned as {renamed name: (target, j, n)}.
        A converter of another kind leaves the name as it is (the model then lacks that tensor:
        CheckpointError from _placements). As from_pretrained does (``rename_source_key``), the base model's
        prefix (``model.``) is added or stripped where that gives a name the model has (DeepSeek-V4's
        ``layers.N....``, ``embed.weight`` -> ``model.embed_tokens.weight``), and a checkpoint name the model
        has is kept when the renaming would lose it (transformers' own V4 save writes ``model.norm.weight``,
        which the rule ``.norm.`` -> ``.kv_norm.`` meant for the compressors would rename). Nothing changes when
        transformers has no table for the model."""
        try:
            from transformers.conversion_mapping import get_model_conversion_mapping
            from transformers.core_model_loading import (
                Concatenate,
                MergeModulelist,
                WeightConverter,
                WeightRenaming,
                apply_renamings,
            )

            transforms = get_model_conversion_mapping(self.model)
        except (ImportError, AttributeError):  # a transformers without the table
            return {}
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        concat: dict[str, tuple[str, int, int]] = {}
        known, p = set(_persistent_tensors(self.model)), self.model.base_model_prefix + "."

        def converted(r: str) -> tuple:
            """(converter, target, source pattern) of the first converter matching r, else (None, r, None)."""
            for c in converters:
                target, pattern = c.rename_source_key(r)
                if pattern is not None:
                    return c, target, pattern
            return None, r, None

        def reprefix(r: str) -> str:
            """r with the base model's prefix stripped or added when that makes its model name (its converter's
            target) one the model has: ``rename_source_key`` in transformers' core_model_loading.py."""
            name = converted(r)[1]
            if p != "." and name.startswith(p) and name[len(p) :] in known:
                return r[len(p) :]
            return p + r if p != "." and p + name in known else r

        def new_name(k: str) -> str:
            r = reprefix(apply_renamings(k, renamings))
            c, target, pattern = converted(r)
            if target not in known and reprefix(k) in known:  # a name the renaming lost is kept (from_pretrained)
                return reprefix(k)
            if c is not None:
                ops, j, n = c.operations, c.source_patterns.index(pattern), len(c.source_patterns)
                kinds = [(type(o), getattr(o, "dim", None)) for o in ops]
                expert = re.search(r"\.experts\.(\d+)\.", r)
                base = target.rsplit(".", 1)[0]
                if expert and kinds in ([(MergeModulelist, 0), (Concatenate, 1)], [(MergeModulelist, 0)]):
                    proj = target.rsplit(".", 1)[1]
                    if proj == "gate_up_proj" and n == 2:
                        return f"{base}.{expert[1]}.{('gate_proj', 'up_proj')[j]}.weight"
                    if proj == "down_proj" and n == 1:
                        return f"{base}.{expert[1]}.down_proj.weight"
                elif kinds == [(Concatenate, 0)] and n > 1:
                    concat[r] = (target, j, n)
            return r

        self.checkpoint.rename(new_name)
        return concat

    def decoder_layer_of(self, module_name: str) -> int:
        """The index i of the decoder layer ``<layers_name>.<i>`` holding the module of that qualified
        name ("model.layers.3.self_attn.1" -> 3). Raises ValueError for a module outside the layers."""
        head = self.layers_name + "."
        if not module_name.startswith(head) or not module_name[len(head) :].split(".")[0].isdigit():
            raise ValueError(f"{module_name} is not inside a decoder layer of {self.layers_name}")
        return int(module_name[len(head) :].split(".")[0])

    def _fp32_patterns(self):
        plan = self.model._get_dtype_plan(self.dtype) if hasattr(self.model, "_get_dtype_plan") else {}
        pats = [p.replace("*", ".*") for p, d in plan.items() if d == torch.float32]
        return re.compile("|".join(pats)) if pats else None

    def _target_dtype(self, name: str, meta: torch.Tensor) -> torch.dtype:
        """The dtype a tensor gets, as transformers' from_pretrained gives it: float32 for the model's
        keep-in-fp32 patterns, else the dtype the model created it in (the compute dtype, or float32
        where a module asks for it, e.g. DeepSeek-V3's router weight)."""
        if not meta.is_floating_point():
            return meta.dtype
        if self._fp32 is not None and self._fp32.search(name):
            return torch.float32
        return meta.dtype

    def _under(self, prefix: str) -> list[str]:
        return [n for n in self._tensors if n.startswith(prefix + ".")]

    def layer_bytes(self, i: int) -> int:
        """Bytes of decoder layer i's tensors once loaded (compute dtype, float32 where kept)."""
        tot = 0
        for n in self._under(f"{self.layers_name}.{i}"):
            t = self._tensors[n]
            tot += t.numel() * torch.empty((), dtype=self._target_dtype(n, t)).element_size()
        return tot

    def weight_bytes(self) -> int:
        """Bytes of the whole model's tensors once loaded (as layer_bytes)."""
        return sum(
            t.numel() * torch.empty((), dtype=self._target_dtype(n, t)).element_size() for n, t in self._tensors.items()
        )

    # ---- loading and freeing ------------------------------------------------------------------
    def _placements(self, targets: list[str], scope: list[str]):
        """(checkpoint name, target name, index) for every target: index None (the whole tensor) or
        (expert, row slice) of a fused expert tensor. scope: the checkpoint names that may hold
        them. Returns (placements, unused checkpoint names). Raises CheckpointError when a target
        gets no tensor or one twice."""
        tset = set(targets)
        places, unused = [], []
        got: dict[str, set] = {t: set() for t in targets}
        for k in scope:
            if k.endswith(SCALE_SUFFIX):
                continue
            if k in tset:
                places.append((k, k, None))
                got[k].add(None)
                continue
            if k in self._concat and self._concat[k][0] in tset:  # row block j of n (_rename_checkpoint)
                t, j, n = self._concat[k]
                rows = self._tensors[t].shape[0] // n
                if ("rows", j) in got[t]:
                    raise CheckpointError(f"{self.path}: {k} given twice")
                got[t].add(("rows", j))
                places.append((k, t, (slice(j * rows, (j + 1) * rows),)))
                continue
            m = _EXPERT_KEY.match(k)
            fused = m and f"{m['base']}.{'down_proj' if m['proj'] == 'down_proj' else 'gate_up_proj'}"
            if fused and fused in tset:
                e = int(m["e"])
                shape = self._tensors[fused].shape
                if m["proj"] == "down_proj":
                    idx = (e, slice(None))
                else:
                    half = shape[1] // 2
                    idx = (e, slice(0, half) if m["proj"] == "gate_proj" else slice(half, 2 * half))
                if e >= shape[0]:
                    raise CheckpointError(f"{self.path}: {k}: expert {e} but {fused} has {shape[0]} experts")
                if (e, m["proj"]) in got[fused]:
                    raise CheckpointError(f"{self.path}: {k} given twice")
                got[fused].add((e, m["proj"]))
                places.append((k, fused, idx))
            else:
                unused.append(k)
        tied = self._tied_sources()
        for t in targets:
            t_shape = self._tensors[t].shape
            if t.endswith(".gate_up_proj") and got[t] and None not in got[t]:
                want = {(e, p) for e in range(t_shape[0]) for p in ("gate_proj", "up_proj")}
            elif t.endswith(".down_proj") and got[t] and None not in got[t]:
                want = {(e, "down_proj") for e in range(t_shape[0])}
            elif any(isinstance(g, tuple) and g[0] == "rows" for g in got[t]):
                want = {("rows", j) for j in range(next(n for _, (tt, _, n) in self._concat.items() if tt == t))}
            else:
                want = {None}
            if not got[t] and t in tied and tied[t] in self.checkpoint.weight_map:
                places.append((tied[t], t, None))
                continue
            if got[t] != want:
                lack = sorted(want - got[t], key=str)[:4]
                raise CheckpointError(
                    f"{self.path}: the model's {t} {tuple(t_shape)} has no checkpoint tensor"
                    + (f" (missing {lack})" if lack != [None] else "")
                )
        return places, unused

    def _tied_sources(self) -> dict[str, str]:
        if not getattr(self.config, "tie_word_embeddings", False):
            return {}
        tied = getattr(self.model, "_tied_weights_keys", None)
        return dict(tied) if isinstance(tied, dict) else {}

    def _load(self, targets: list[str], scope: list[str], what: str) -> None:
        from accelerate.utils import set_module_tensor_to_device

        places, unused = self._placements(targets, scope)
        if unused:
            say("stream", "warning", f"{what}: checkpoint tensors not used: {unused[:6]}")
        dtype_of = {}
        for k, t, _ in places:
            dtype_of[k] = self._target_dtype(t, self._tensors[t])
        fused = {t: torch.empty(self._tensors[t].shape, dtype=dtype_of[k]) for k, t, idx in places if idx is not None}
        where: dict[str, list] = {}
        for k, t, idx in places:  # a tied head reads the embedding's tensor: one name, two targets
            where.setdefault(k, []).append((t, idx))
        for k, x in self.checkpoint.read(list(where), dtype_of.__getitem__):
            for t, idx in where[k]:
                want = tuple(self._tensors[t].shape) if idx is None else tuple(fused[t][idx].shape)
                if tuple(x.shape) != want:
                    raise CheckpointError(f"{self.path}: {k} has shape {tuple(x.shape)}; the model's {t} needs {want}")
                if idx is None:
                    set_module_tensor_to_device(self.model, t, self.device, value=x, dtype=x.dtype, clear_cache=False)
                else:
                    fused[t][idx].copy_(x)
            del x
        for t, x in fused.items():
            set_module_tensor_to_device(self.model, t, self.device, value=x, dtype=x.dtype, clear_cache=False)
        fused.clear()

    def _free(self, targets: list[str]) -> None:
        from accelerate.utils import set_module_tensor_to_device

        for t in targets:
            set_module_tensor_to_device(self.model, t, "meta", clear_cache=False)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        _trim_host_heap()

    def load_layer(self, i: int) -> None:
        """Read decoder layer i's weights from the checkpoint onto the device."""
        p = f"{self.layers_name}.{i}"
        self._load(self._under(p), self.checkpoint.names_under(p), f"layer {i}")

    def free_layer(self, i: int) -> None:
        """Put decoder layer i's weights back on the meta device (their memory is released)."""
        self._free(self._under(f"{self.layers_name}.{i}"))

    def _outside(self) -> list[str]:
        """The model's tensors outside the decoder layers, the final norm and the head: the embedding
        and anything else that runs before layer 0."""
        skip = [self.layers_name, *self.final_names, self.head_name]
        return [n for n in self._tensors if not any(n == s or n.startswith(s + ".") for s in skip)]

    def materialize(self) -> nn.Module:
        """Load every weight (the in-memory path; the same loader, dtypes and placements as the
        streamed one) and return the model, in eval mode on ``device``."""
        ts = [n for n in self._tensors if not n.startswith(self.layers_name + ".")]
        self._load(ts, [k for k in ts if k in self.checkpoint.weight_map], "embedding, norm and head")
        for i in range(len(self.layers)):
            self.load_layer(i)
        return self.model

    # ---- running ------------------------------------------------------------------------------
    def _layer_kinds(self) -> list:
        """Per decoder layer, the key that selects its inputs: ``config.layer_types[i]`` when the config
        has one entry per layer (transformers' hybrid models pick each layer's attention mask by it:
        Kimi-Linear's ``causal_mask_mapping[config.layer_types[i]]``, a causal mask for
        "full_attention", none for "linear_attention", modeling_kimi_linear.py), else None for all."""
        types = getattr(self.config, "layer_types", None)
        if isinstance(types, (list, tuple)) and len(types) >= len(self.layers):
            return [types[i] for i in range(len(self.layers))]
        return [None] * len(self.layers)

    def _capture_inputs(self, ids: torch.Tensor, kind=None):
        """(hidden states, args after the hidden states, kwargs) with which the model's forward calls
        decoder layer 0 for input_ids ids [B, L]; with ``kind`` (a value of config.layer_types), those
        it gives a layer of that kind: the forward runs with config.layer_types[0] set to kind for the
        duration of the call, so that layer 0 is handed that kind's inputs (``_layer_kinds``)."""
        box = {}

        def hook(mod, args, kwargs):
            box["args"], box["kwargs"] = args, kwargs
            raise _Stop

        types = getattr(self.config, "layer_types", None)
        swap = kind is not None and types[0] != kind
        h = self.layers[0].register_forward_pre_hook(hook, with_kwargs=True)
        try:
            if swap:
                self.config.layer_types = [kind, *types[1:]]
            self.model(input_ids=ids, use_cache=False)
        except _Stop:
            pass
        finally:
            h.remove()
            if swap:
                self.config.layer_types = types
        if "args" not in box:
            raise RuntimeError(f"{self.path}: the model's forward never called decoder layer 0")
        args, kwargs = box["args"], dict(box["kwargs"])
        if args:
            return args[0], tuple(args[1:]), kwargs
        return kwargs.pop("hidden_states"), (), kwargs

    @torch.no_grad()
    def run(
        self,
        inputs: list,
        *,
        before: Callable[[int, int], None] | None = None,
        loaded: Callable[[int], None] | None = None,
        after: Callable[[int], None] | None = None,
        on_logits: Callable[[int, torch.Tensor], None] | None = None,
    ) -> None:
        """Run every input through every decoder layer, layer-major.

        inputs: token ids, each [L] or [B, L] (int; one forward call each, as the in-memory model
        would get them). Callbacks, all optional: ``loaded(i)`` once layer i's weights are loaded,
        ``before(i, n)`` before layer i runs input n, ``after(i)`` once layer i has run every input
        (its weights still loaded), ``on_logits(n, logits [B, L, V])`` after the last layer, with the
        final norm and head loaded (``on_logits`` absent: they are never read).
        Sets load_seconds / compute_seconds (seconds reading the decoder layers' weights / running
        the layers with the callbacks). Peak memory: the embedding while the inputs of layer 0 are
        taken, then one decoder layer's weights + the hidden states of all inputs (in memory, or a
        temporary file: class docstring) + one input's activations in that layer.
        """
        ids = [torch.as_tensor(np.asarray(x), dtype=torch.long) for x in inputs]
        ids = [x[None, :] if x.dim() == 1 else x for x in ids]
        # per input [B, L, hidden]; DeepSeek-V4 keeps hc_mult residual streams: [B, L, hc_mult, hidden]
        tail = (int(self.config.hidden_size),)
        if getattr(self.config, "model_type", None) == "deepseek_v4":
            tail = (int(self.config.hc_mult),) + tail
        shapes = [tuple(x.shape) + tail for x in ids]
        elem = torch.empty((), dtype=self.dtype).element_size()
        states_bytes = sum(math.prod(s) for s in shapes) * elem
        biggest = max(self.layer_bytes(i) for i in range(len(self.layers)))
        self.states_in_memory = states_bytes + biggest <= self.memory_budget
        states = HostStates(shapes, self.dtype, self.states_in_memory, self.spill_dir)
        pro = self._outside()
        try:
            self._load(pro, [k for k in pro if k in self.checkpoint.weight_map], "embedding")
            kinds = self._layer_kinds()
            # per layer kind and input: index into shared (args, kwargs), deduplicated
            args_of: dict = {kind: [] for kind in kinds}
            shared = []
            for n, x in enumerate(ids):
                for kind in args_of:
                    h, args, kwargs = self._capture_inputs(x.to(self.device), kind)
                    if kind == kinds[0]:
                        states.put(n, h)
                    del h
                    for j, (a, k) in enumerate(shared):
                        if _same(a, args) and _same(k, kwargs):
                            args_of[kind].append(j)
                            break
                    else:
                        shared.append((args, kwargs))
                        args_of[kind].append(len(shared) - 1)
            self._free(pro)
            # outputs the model's forward passes on to the next layer (CARRIED_OUTPUTS), per input, on the host
            params = inspect.signature(type(self.layers[0]).forward).parameters
            carry = [k for k in CARRIED_OUTPUTS if k in params]
            carried: list[dict] = [{} for _ in ids]
            self.load_seconds = self.compute_seconds = 0.0
            for i, layer in enumerate(self.layers):
                t0 = time.perf_counter()
                self.load_layer(i)
                t1 = time.perf_counter()
                self.load_seconds += t1 - t0
                try:
                    if loaded is not None:
                        loaded(i)
                    for n in range(len(ids)):
                        if before is not None:
                            before(i, n)
                        args, kwargs = shared[args_of[kinds[i]][n]]
                        if carried[n]:
                            kwargs = {**kwargs, **{k: _to(v, self.device) for k, v in carried[n].items()}}
                        out = layer(states.get(n).to(self.device), *args, **kwargs)
                        states.put(n, out[0] if isinstance(out, tuple) else out)
                        if carry and isinstance(out, tuple):
                            carried[n] = {k: _to(out[CARRIED_OUTPUTS[k]], "cpu") for k in carry}
                        del out
                    if after is not None:
                        after(i)
                finally:
                    self.free_layer(i)
                    self.compute_seconds += time.perf_counter() - t1
            if on_logits is not None:
                head = [t for n in self.final_names + [self.head_name] for t in self._under(n)]
                self._load(head, [k for k in head if k in self.checkpoint.weight_map], "head")
                try:
                    final = [self.model.get_submodule(n) for n in self.final_names + [self.head_name]]
                    for n in range(len(ids)):
                        h = states.get(n).to(self.device)
                        for mod in final:  # [hc_head,] norm, lm_head
                            h = mod(h)
                        on_logits(n, h)
                finally:
                    self._free(head)
        finally:
            states.close()
