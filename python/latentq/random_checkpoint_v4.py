"""Random-init DeepSeek-V4 checkpoints written offline as DeepSeek ships DeepSeek-V4-Flash: DeepSeek's own tensor
names (``layers.N.attn.wq_a.weight``, ``layers.N.ffn.experts.E.w1.weight``, ``embed.weight``, ``head.weight`` ...),
FP8 e4m3 weights with one e8m0 scale byte per 128 x 128 block in ``<module>.scale``, routed experts in MXFP4, the
rest in bf16 / float32, sharded safetensors with ``model.safetensors.index.json`` and a config.json whose
``quantization_config`` is V4-Flash's (``quant_method: fp8``, ``fmt: e4m3``, ``scale_fmt: ue8m0``,
``weight_block_size: [128, 128]``) beside its top-level ``expert_dtype: fp4``. For the tests of latentq's loader
(latentq.weight_formats, latentq.stream) and of the V4 dump on a checkpoint as DeepSeek publishes one.

    model = random_v4_model(seed=0, **config)                 # transformers' DeepseekV4ForCausalLM, float32
    tensors = v4_tensors(model)                               # DeepSeek name -> tensor, quantized
    write_v4_checkpoint(tensors, model.config, "DIR", shards=3, split_layer=1)

Names: the inverse of transformers 5.24's conversion table for ``deepseek_v4`` (``conversion_mapping.py``,
``_build_checkpoint_conversion_mapping()["deepseek_v4"]``: ``attn`` -> ``self_attn``, ``ffn`` -> ``mlp``, ``wq_a``
-> ``q_a_proj``, ``attn_sink`` -> ``sinks``, ``ape`` -> ``position_bias``, ``indexer.compressor`` ->
``compressor.indexer``, the per-expert ``w1`` / ``w3`` merged into ``gate_up_proj`` and ``w2`` into ``down_proj``
...), which from_pretrained applies on load (``_V4_NAMES`` below, checked against that table by the tests).

Stored dtypes (DeepSeek-V4-Flash's shards, as its index and safetensors headers list them):

- FP8 e4m3 + ``.scale`` (F8_E8M0, [ceil(M / 128), ceil(N / 128)]): the attention projections ``wq_a``, ``wq_b``,
  ``wkv``, ``wo_a``, ``wo_b``, the indexer's ``wq_b`` and the shared expert's ``w1`` / ``w2`` / ``w3``;
  per block scale = 2^ceil(log2(max|w| / 448)) (the power of two at or above e4m3's range; 1 for a zero block),
  weight = float8_e4m3fn(w / scale) (round to nearest even);
- MXFP4 (I8 [M, N / 2]: two e2m1 codes per byte, element 2i in the low nibble, 2i + 1 in the high one; ``.scale``
  F8_E8M0 [M, N / 32], one per 32 inputs of a row): the routed experts ``ffn.experts.E.w{1,2,3}``; per group scale =
  2^ceil(log2(max|w| / 6)) (e2m1's largest value 6: no element clips), codes = w / scale rounded to the nearest
  e2m1 value, ties to the even code;
- F32: ``attn_sink``, the compressors' ``ape``, the router's ``gate.bias``, the mHC parameters ``hc_attn_*``,
  ``hc_ffn_*``, ``hc_head_*``; I64: ``ffn.gate.tid2eid`` (hash-routed layers);
- BF16: everything else: ``embed``, ``head``, the norms, the router ``gate.weight``, the compressors' and the
  indexer's ``wkv`` / ``wgate`` / ``weights_proj``.

The dequantized weights are what latentq.weight_formats decodes (and transformers' own loader, which dequantizes
FP8 and MXFP4 on a CPU: ``integrations/finegrained_fp8.py`` ``Fp8Dequantize``); ``dequantized_state_dict`` gives
them in the model's names, the reference of the loader tests.
"""

from __future__ import annotations

import json
import math
import os
import re

import torch

from latentq.random_checkpoint import E4M3_MAX
from latentq.weight_formats import E2M1_VALUES, e8m0_to_float32

E2M1_MAX = 6.0
BLOCK = (128, 128)
MX_GROUP = 32
# DeepSeek-V4-Flash's quantization_config (config.json) and its top-level expert_dtype
QUANTIZATION_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128],
}
# model name -> DeepSeek name, applied in order (the inverse of transformers' deepseek_v4 conversion table)
_V4_NAMES = [
    (r"^model\.embed_tokens\.weight$", "embed.weight"),
    (r"^lm_head\.weight$", "head.weight"),
    (r"^model\.norm\.weight$", "norm.weight"),
    (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
    (r"^model\.layers\.", "layers."),
    (r"\.self_attn\.compressor\.indexer\.scorer\.weights_proj\.", ".self_attn.indexer.weights_proj."),
    (r"\.self_attn\.compressor\.indexer\.q_b_proj\.", ".self_attn.indexer.wq_b."),
    (r"\.self_attn\.compressor\.indexer\.", ".self_attn.indexer.compressor."),
    (r"\.self_attn\.", ".attn."),
    (r"\.mlp\.", ".ffn."),
    (r"\.compressor\.kv_norm\.", ".compressor.norm."),
    (r"\.compressor\.gate_proj\.", ".compressor.wgate."),
    (r"\.position_bias$", ".ape"),
    (r"\.sinks$", ".attn_sink"),
    (r"\.q_a_proj\.", ".wq_a."),
    (r"\.attn\.q_b_proj\.", ".attn.wq_b."),
    (r"\.kv_proj\.", ".wkv."),
    (r"\.o_a_proj\.", ".wo_a."),
    (r"\.o_b_proj\.", ".wo_b."),
    (r"\.q_a_norm\.", ".q_norm."),
    (r"\.gate\.e_score_correction_bias$", ".gate.bias"),
    (r"\.shared_experts\.gate_proj\.", ".shared_experts.w1."),
    (r"\.shared_experts\.down_proj\.", ".shared_experts.w2."),
    (r"\.shared_experts\.up_proj\.", ".shared_experts.w3."),
    (r"\.input_layernorm\.", ".attn_norm."),
    (r"\.post_attention_layernorm\.", ".ffn_norm."),
    (r"\.attn_hc\.(fn|base|scale)$", r".hc_attn_\1"),
    (r"\.ffn_hc\.(fn|base|scale)$", r".hc_ffn_\1"),
]
SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
# DeepseekV4Config arguments of the checkpoints main() writes
PRESETS = {
    # the tests' shape: one layer of each type, index_topk 3 below the 10 CSA entries of 40 tokens, a hash-routed
    # first layer, 8 heads so that wq_b holds two FP8 blocks, every FP8 weight whole 128 x 128 blocks or less
    "tiny": dict(
        vocab_size=128,
        hidden_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=32,
        q_lora_rank=32,
        partial_rotary_factor=0.25,
        num_experts_per_tok=2,
        n_routed_experts=4,
        layer_types=[SLIDING, CSA, HCA],
        mlp_layer_types=["hash_moe", "moe", "moe"],
        compress_rates={CSA: 4, HCA: 8},
        hc_mult=2,
        sliding_window=8,
        o_groups=2,
        o_lora_rank=16,
        index_n_heads=4,
        index_head_dim=16,
        index_topk=3,
        max_position_embeddings=256,
    ),
    # DeepSeek-V4-Flash's cache widths (head_dim 512 = 448 + 64 rope, index_head_dim 128, sliding_window 128, CSA 4,
    # HCA 128) on a narrow model: 8 heads, hidden 512, 8 experts of 256, index_topk 64
    "flash-caches": dict(
        vocab_size=4096,
        hidden_size=512,
        moe_intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=512,
        q_lora_rank=256,
        partial_rotary_factor=0.125,
        num_experts_per_tok=2,
        n_routed_experts=8,
        layer_types=[SLIDING, CSA, HCA, CSA],
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        compress_rates={CSA: 4, HCA: 128},
        hc_mult=4,
        sliding_window=128,
        o_groups=2,
        o_lora_rank=256,
        index_n_heads=8,
        index_head_dim=128,
        index_topk=64,
        max_position_embeddings=8192,
    ),
}
_FUSED = re.compile(r"^(?P<base>.+\.ffn\.experts)\.(?P<kind>gate_up_proj|down_proj)$")
FP8_WEIGHT = re.compile(
    r"^layers\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b)|attn\.indexer\.wq_b|ffn\.shared_experts\.w[123])\.weight$"
)
MXFP4_WEIGHT = re.compile(r"^layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$")
_FLOAT32 = re.compile(r"(\.attn_sink|\.ape|\.gate\.bias|\.hc_(attn|ffn)_(fn|base|scale)|^hc_head_(fn|base|scale))$")
_LAYER = re.compile(r"^layers\.(\d+)\.")


def deepseek_name(name: str) -> str:
    """DeepSeek's checkpoint name of a transformers DeepseekV4ForCausalLM tensor (``_V4_NAMES``); fused expert
    tensors are split by ``v4_tensors``, not here."""
    for pat, rep in _V4_NAMES:
        name = re.sub(pat, rep, name)
    return name


def random_v4_model(*, seed: int = 0, std: float = 0.2, **config):
    """A random-init transformers ``DeepseekV4ForCausalLM`` (float32, eval, eager attention) of ``config``
    (DeepseekV4Config arguments). Every matrix N(0, std), norm gains 1 + N(0, 0.1), sinks, compressor position
    biases and the mHC parameters N(0, 1) · 0.5 (the init zeroes several: random values make a tensor the loader
    failed to read show), router biases U(0, 0.1), hash-routing tables ``tid2eid`` uniform expert ids."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.DeepseekV4ForCausalLM(
        transformers.DeepseekV4Config(**{"attn_implementation": "eager", **config})
    ).eval()
    g = torch.Generator().manual_seed(seed + 1)
    E = model.config.n_routed_experts
    with torch.no_grad():
        for n, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "inv_freq" in n:
                continue
            if n.endswith("tid2eid"):
                p.copy_(torch.randint(0, E, p.shape, generator=g))
            elif n.endswith("e_score_correction_bias"):
                p.copy_(torch.rand(p.shape, generator=g) * 0.1)
            elif n.endswith(("sinks", "position_bias")) or "_hc." in n or ".hc_head." in n:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "norm" in n:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.is_floating_point() and p.dim() >= 2:
                p.copy_(std * torch.randn(p.shape, generator=g))
    return model


def _e8m0(exponent: torch.Tensor) -> torch.Tensor:
    """float8_e8m0fnu scales 2^exponent (exponent: integer tensor in -127..127)."""
    return (exponent.to(torch.int32) + 127).clamp(0, 254).to(torch.uint8).view(torch.float8_e8m0fnu)


def _pow2_at_or_above(x: torch.Tensor) -> torch.Tensor:
    """The integer exponent e of the smallest power of two 2^e >= x (x > 0; 0 for x = 0)."""
    e = torch.ceil(torch.log2(x.double().clamp_min(2.0**-126)))
    return torch.where(x > 0, e, torch.zeros_like(e)).to(torch.int32)


def quantize_fp8_e8m0(w: torch.Tensor, block=BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn [M, N], float8_e8m0fnu [ceil(M / bm), ceil(N / bn)]) of a 2-D w: per block (partial edge
    blocks included) scale = 2^ceil(log2(max|w| / 448)), weight = e4m3(w / scale) (module docstring)."""
    bm, bn = block
    M, N = w.shape
    w = w.float()
    gm, gn = math.ceil(M / bm), math.ceil(N / bn)
    pad = torch.zeros(gm * bm, gn * bn)
    pad[:M, :N] = w.abs()
    amax = pad.reshape(gm, bm, gn, bn).amax(dim=(1, 3))
    exp = _pow2_at_or_above(amax / E4M3_MAX)
    full = torch.ldexp(torch.ones(gm, gn), exp.float()).repeat_interleave(bm, 0)[:M].repeat_interleave(bn, 1)[:, :N]
    q = (w / full).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, _e8m0(exp)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes (bit 3 sign, bits 0-2 the index into E2M1_VALUES) of x (|x| <= 6): the nearest value, ties
    to the even code (IEEE round to nearest even; e.g. 0.25 -> 0, 0.75 -> 1.0, 3.5 -> 4.0)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    d = (x.abs().float().unsqueeze(-1) - table).abs()
    odd = (torch.arange(8) % 2).float()
    best = d.min(dim=-1, keepdim=True).values
    # among the nearest values the even code (a tie has two: one even, one odd)
    code = torch.argmin(torch.where(d == best, odd, torch.full_like(d, 2.0)), dim=-1).to(torch.uint8)
    return code | ((x < 0).to(torch.uint8) << 3)


def quantize_mxfp4(w: torch.Tensor, group: int = MX_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [M, N / 2], float8_e8m0fnu [M, N / group]) of a 2-D w (N a multiple of group): per group of ``group``
    inputs of a row scale = 2^ceil(log2(max|w| / 6)), codes = e2m1_codes(w / scale), two per byte, element 2i in
    the low nibble. Raises ValueError when N is not a multiple of group."""
    M, N = w.shape
    if N % group:
        raise ValueError(f"MXFP4 weight [{M}, {N}]: {N} inputs are not a multiple of the group {group}")
    g = w.float().reshape(M, N // group, group)
    exp = _pow2_at_or_above(g.abs().amax(dim=-1) / E2M1_MAX)
    codes = e2m1_codes(g / torch.ldexp(torch.ones(()), exp.float()).unsqueeze(-1)).reshape(M, N)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.view(torch.int8), _e8m0(exp)


def v4_tensors(
    model, *, block=BLOCK, dtype: torch.dtype = torch.bfloat16, mtp_layers: int = 0
) -> dict[str, torch.Tensor]:
    """The model's state dict as DeepSeek ships V4-Flash (module docstring): DeepSeek's names, the fused experts
    split per expert (``gate_up_proj[e]`` = [w1 rows; w3 rows], ``down_proj[e]`` = w2), FP8 + e8m0 ``.scale`` and
    MXFP4 + e8m0 ``.scale`` where V4-Flash has them, float32 and int64 tensors kept, the rest in ``dtype``.
    mtp_layers: that many ``mtp.K.`` blocks under DeepSeek's multi-token-prediction prefix (here a copy of the last
    layer's stored tensors; DeepSeek's MTP block has more), which the model does not have: transformers skips them
    (``_keys_to_ignore_on_load_unexpected``), and so must latentq's reader."""
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        ds = deepseek_name(name)
        m = _FUSED.match(ds)
        if m is None:
            out[ds] = t
            continue
        for e in range(t.shape[0]):
            if m["kind"] == "down_proj":
                out[f"{m['base']}.{e}.w2.weight"] = t[e]
            else:
                half = t.shape[1] // 2
                out[f"{m['base']}.{e}.w1.weight"], out[f"{m['base']}.{e}.w3.weight"] = t[e, :half], t[e, half:]
    final = {}
    for name, t in out.items():
        t = t.detach().contiguous()
        stem = name[: -len(".weight")]
        if FP8_WEIGHT.match(name):
            final[name], final[stem + ".scale"] = quantize_fp8_e8m0(t, block)
        elif MXFP4_WEIGHT.match(name):
            final[name], final[stem + ".scale"] = quantize_mxfp4(t)
        elif not t.is_floating_point():
            final[name] = t.clone()
        elif _FLOAT32.search(name):
            final[name] = t.float().clone()
        else:
            final[name] = t.to(dtype).clone()
    last = f"layers.{model.config.num_hidden_layers - 1}."
    for k in range(mtp_layers):
        final.update({f"mtp.{k}." + n[len(last) :]: t.clone() for n, t in list(final.items()) if n.startswith(last)})
    return final


def dequantized_state_dict(model, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's state dict (float32, the model's names) holding the weights ``tensors`` (v4_tensors' output)
    decode to: FP8 · 2^(scale byte − 127) per block, e2m1 · 2^(scale byte − 127) per 32 inputs, bf16 widened,
    the fused experts reassembled. Decoded here with plain torch (the e2m1 table, ``e8m0_to_float32``) for the
    tests' reference checkpoint."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32)

    def decode(name: str) -> torch.Tensor:
        t = tensors[name]
        if FP8_WEIGHT.match(name) or MXFP4_WEIGHT.match(name):
            s = e8m0_to_float32(tensors[name[: -len(".weight")] + ".scale"])
            if t.dtype == torch.float8_e4m3fn:
                M, N = t.shape
                s = s.repeat_interleave(BLOCK[0], 0)[:M].repeat_interleave(BLOCK[1], 1)[:, :N]
                return t.float() * s
            b = t.view(torch.uint8)
            codes = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(b.shape[0], -1).long()
            return table[codes] * s.repeat_interleave(MX_GROUP, 1)
        return t.float() if t.is_floating_point() else t

    out = {}
    for name, ref in model.state_dict().items():
        m = _FUSED.match(deepseek_name(name))
        if m is None:
            out[name] = decode(deepseek_name(name)).to(ref.dtype if not ref.is_floating_point() else torch.float32)
            continue
        E = ref.shape[0]
        if m["kind"] == "down_proj":
            out[name] = torch.stack([decode(f"{m['base']}.{e}.w2.weight") for e in range(E)])
        else:
            parts = [torch.cat([decode(f"{m['base']}.{e}.w{k}.weight") for k in (1, 3)]) for e in range(E)]
            out[name] = torch.stack(parts)
    return out


def shard_groups(tensors: dict[str, torch.Tensor], shards: int, split_layer: int | None) -> list[list[str]]:
    """Tensor names in ``shards`` groups (shards >= 2): ordered embedding, layer 0, 1, ..., the rest, cut at equal
    byte counts; with ``split_layer`` the cut nearest that layer moves between the middle-most ``.scale`` of the
    layer and its ``.weight``, so the layer spans two shards and a quantized weight is read with a scale from
    another shard."""

    def order(name: str):
        m = _LAYER.match(name)
        return (0 if name.startswith("embed") else 2 if m is None else 1, int(m.group(1)) if m else 0, name)

    names = sorted(tensors, key=order)
    sizes = [tensors[n].numel() * tensors[n].element_size() for n in names]
    total, acc, cuts = sum(sizes), 0, []
    for i, b in enumerate(sizes):  # cut before name i once the bytes before it reach k / shards of the total
        if 0 < i and len(cuts) < shards - 1 and acc * shards >= (len(cuts) + 1) * total:
            cuts.append(i)
        acc += b
    if split_layer is not None:
        pairs = [
            i + 1
            for i, n in enumerate(names[:-1])
            if n.startswith(f"layers.{split_layer}.") and n.endswith(".scale") and names[i + 1] == n[:-5] + "weight"
        ]
        if not pairs:
            raise ValueError(f"layer {split_layer} has no quantized weight to split the shards at")
        at = pairs[len(pairs) // 2]
        if cuts:
            cuts.pop(min(range(len(cuts)), key=lambda k: abs(cuts[k] - at)))
        cuts = sorted({*cuts, at})
    bounds = [0, *cuts, len(names)]
    return [names[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def write_v4_checkpoint(
    tensors: dict[str, torch.Tensor], config, out_dir: str, *, shards: int = 3, split_layer: int | None = 1
) -> dict[str, str]:
    """Write ``tensors`` (v4_tensors) as ``model-0000k-of-0000n.safetensors`` (``shard_groups``) with
    ``model.safetensors.index.json`` and config.json: the config's fields (a DeepseekV4Config or dict, in
    transformers' keys: ``layer_types``, ``compress_rates``, ``mlp_layer_types``), ``torch_dtype`` bfloat16, V4-Flash's
    ``quantization_config`` and top-level ``expert_dtype: fp4``. Returns the weight map (name -> shard file)."""
    from safetensors.torch import save_file

    groups = shard_groups(tensors, shards, split_layer)
    os.makedirs(out_dir, exist_ok=True)
    weight_map = {}
    for k, g in enumerate(groups):
        fn = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n] for n in g}, os.path.join(out_dir, fn), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(g, fn))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    cfg.pop("quantization_config", None)
    cfg.update(torch_dtype="bfloat16", dtype="bfloat16", expert_dtype="fp4", quantization_config=QUANTIZATION_CONFIG)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    return weight_map


def main(argv=None) -> int:
    """``python -m latentq.random_checkpoint_v4 --out DIR [--preset tiny|flash-caches] [--seed 0] [--shards 3]``: a
    random-init DeepSeek-V4 checkpoint as DeepSeek ships V4-Flash (module docstring) of a PRESETS shape, with an
    MTP block; for trying ``latentq study --model DIR`` on V4 where no weights can be downloaded. Prints the
    directory, its size in bytes and the layer types. Exit 2 on an existing non-empty --out."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m latentq.random_checkpoint_v4", description=main.__doc__)
    p.add_argument("--out", required=True, help="the checkpoint directory (created; must be empty or absent)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shards", type=int, default=3, help="safetensors shards (>= 2; layer 1 spans two)")
    a = p.parse_args(argv)
    if a.shards < 2:
        p.error(f"--shards {a.shards}: expected >= 2")
    if os.path.isdir(a.out) and os.listdir(a.out):
        p.error(f"--out {a.out}: the directory exists and is not empty")
    model = random_v4_model(seed=a.seed, std=0.2 if a.preset == "tiny" else 0.05, **PRESETS[a.preset])
    write_v4_checkpoint(v4_tensors(model, mtp_layers=1), model.config, a.out, shards=a.shards, split_layer=1)
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    kinds = ",".join({SLIDING: "sliding", CSA: "csa", HCA: "hca"}[t] for t in model.config.layer_types)
    print(f"{a.out}: {size} bytes (DeepSeek-V4 {a.preset}: layers {kinds}; FP8 + e8m0 blocks, MXFP4 experts)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
