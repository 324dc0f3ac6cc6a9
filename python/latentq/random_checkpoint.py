"""Random-init DeepSeek-architecture checkpoints, written offline as DeepSeek ships them: sharded
safetensors with ``model.safetensors.index.json``, per-expert 2-D weights
(``mlp.experts.N.{gate,up,down}_proj.weight``) and, optionally, block-wise FP8 e4m3 weights with a
float32 ``weight_scale_inv`` per block and a ``quantization_config`` (DeepSeek-V3's format). For the
tests and benchmarks of layer streaming (latentq.stream) and for trying the suite on a model of a
real shape without its weights.

    model = random_model("v3", num_hidden_layers=4, hidden_size=192, ...)   # HF DeepseekV3ForCausalLM
    tensors = deepseek_tensors(model, fp8_block=(128, 128), mtp_layers=1)  # name -> tensor
    write_checkpoint(tensors, model.config, "DIR", shards=3, fp8_block=(128, 128))

The FP8 quantization is the inverse of the dequantization latentq.stream reads (DeepSeek-V3
inference/kernel.py ``weight_dequant``): per block, scale = max|w| / 448 (e4m3's largest finite
value; 1 for an all-zero block), fp8 = float8_e4m3fn(w / scale), ``weight_scale_inv`` = scale.
Quantized: the 2-D ``*_proj.weight`` and ``kv_a_proj_with_mqa.weight`` tensors of the decoder
layers (attention projections, dense MLP, shared and routed experts); the router
(``mlp.gate.weight``), the norms, the embedding and the head stay in ``dtype`` (bfloat16) and
``e_score_correction_bias`` in float32, as in DeepSeek-V3's shards.
"""

from __future__ import annotations

import json
import math
import os
import re

import torch

E4M3_MAX = 448.0
_FUSED = re.compile(r"^(?P<base>.+\.experts)\.(?P<kind>gate_up_proj|down_proj)$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_QUANTIZED = re.compile(r"_proj(_with_mqa)?\.weight$")
_KW = {
    "v2": dict(q_lora_rank=None),
    "v3": dict(q_lora_rank=48, n_group=2, topk_group=1, rope_interleave=True),
}


def random_model(kind: str = "v3", *, seed: int = 0, std: float = 0.2, **config):
    """A random-init HF ``DeepseekV2ForCausalLM`` (kind "v2") or ``DeepseekV3ForCausalLM`` ("v3"),
    float32, eval mode. config: DeepseekV{2,3}Config arguments over small defaults (hidden 64, 4 heads,
    kv_lora_rank 64, rope 16, nope 32, v 32, 4 layers with first_k_dense_replace 1, 4 routed experts
    of which 2 per token, 1 shared). Weights: every matrix (and fused expert tensor) N(0, std) (sharp
    attention, as the hook tests use), norm gains 1 + N(0, 0.1), router biases U(0, 0.1), so that a
    tensor the loader failed to read shows."""
    import transformers

    base = dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=64,
        qk_rope_head_dim=16,
        qk_nope_head_dim=32,
        v_head_dim=32,
        max_position_embeddings=512,
        first_k_dense_replace=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        attn_implementation="eager",
    )
    base.update(_KW[kind])
    base.update(config)
    cls = {"v2": "DeepseekV2", "v3": "DeepseekV3"}[kind]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cls + "Config")(**base)
    model = getattr(transformers, cls + "ForCausalLM")(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point() or "inv_freq" in n:
                continue
            if n.endswith("e_score_correction_bias"):
                p.copy_(torch.rand(p.shape, generator=g) * 0.1)
            elif "norm" in n:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                p.copy_(std * torch.randn(p.shape, generator=g))
    return model.eval()


def quantize_fp8_blocks(w: torch.Tensor, block=(128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 [M, N] float8_e4m3fn, weight_scale_inv [ceil(M/bm), ceil(N/bn)] float32) of a 2-D w, per
    block scale = max|w| / 448 (1 for an all-zero block; partial edge blocks included)."""
    bm, bn = block
    M, N = w.shape
    w = w.float()
    s = torch.empty((math.ceil(M / bm), math.ceil(N / bn)), dtype=torch.float32)
    q = torch.empty((M, N), dtype=torch.float8_e4m3fn)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = w[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn]
            amax = float(blk.abs().max())
            s[i, j] = amax / E4M3_MAX if amax > 0 else 1.0
            q[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn] = (blk / s[i, j]).clamp(-E4M3_MAX, E4M3_MAX).to(q.dtype)
    return q, s


def deepseek_tensors(
    model, *, fp8_block=None, dtype: torch.dtype = torch.bfloat16, mtp_layers: int = 0, seed: int = 0
) -> dict[str, torch.Tensor]:
    """The model's state dict in DeepSeek's checkpoint layout: fused expert tensors split into per-expert
    2-D ``experts.N.{gate,up,down}_proj.weight`` (gate_up_proj[e] = [gate rows; up rows]), floating
    tensors in ``dtype`` (``e_score_correction_bias`` float32); with fp8_block (bm, bn) the decoder
    layers' ``*_proj.weight`` matrices as FP8 e4m3 + ``weight_scale_inv`` (module docstring).
    mtp_layers: that many extra layers ``model.layers.<num_hidden_layers + k>`` (a copy of the last
    layer's tensors plus DeepSeek-V3's ``eh_proj``, ``enorm``, ``hnorm`` and ``shared_head.norm``,
    random), which the model does not have: a reader must skip them."""
    out: dict[str, torch.Tensor] = {}
    sd = model.state_dict()
    for name, t in sd.items():
        m = _FUSED.match(name)
        if m:
            for e in range(t.shape[0]):
                if m["kind"] == "down_proj":
                    out[f"{m['base']}.{e}.down_proj.weight"] = t[e]
                else:
                    half = t.shape[1] // 2
                    out[f"{m['base']}.{e}.gate_proj.weight"] = t[e, :half]
                    out[f"{m['base']}.{e}.up_proj.weight"] = t[e, half:]
        else:
            out[name] = t
    n = model.config.num_hidden_layers
    if mtp_layers:
        g = torch.Generator().manual_seed(seed + 7)
        last = {k[len(f"model.layers.{n - 1}.") :]: v for k, v in out.items() if k.startswith(f"model.layers.{n - 1}.")}
        H = model.config.hidden_size
        for k in range(mtp_layers):
            p = f"model.layers.{n + k}."
            for rel, v in last.items():
                out[p + rel] = v.clone()
            out[p + "eh_proj.weight"] = 0.02 * torch.randn((H, 2 * H), generator=g)
            for nm in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
                out[p + nm] = torch.ones(H)
    final = {}
    for name, t in out.items():
        t = t.detach().contiguous()
        if fp8_block is not None and _LAYER.match(name) and _QUANTIZED.search(name) and t.dim() == 2:
            final[name], final[name + "_scale_inv"] = quantize_fp8_blocks(t, fp8_block)
        elif name.endswith("e_score_correction_bias"):
            final[name] = t.float().clone()
        elif t.is_floating_point():
            final[name] = t.to(dtype).clone()
        else:
            final[name] = t.clone()
    return final


def write_checkpoint(
    tensors: dict[str, torch.Tensor],
    config,
    out_dir: str,
    *,
    shards: int = 3,
    fp8_block=None,
    torch_dtype: str = "bfloat16",
) -> dict[str, str]:
    """Write tensors as ``shards`` safetensors files ``model-0000k-of-0000n.safetensors`` (in name order
    grouped by layer: the embedding, layer 0, 1, ..., then the rest; cut at equal byte counts, so
    layers straddle shards) with ``model.safetensors.index.json``, and config.json (config: a
    PretrainedConfig or dict; ``torch_dtype``/``dtype`` set, ``quantization_config`` = DeepSeek-V3's
    with fp8_block, removed without). Returns the weight map (name -> shard file)."""
    from safetensors.torch import save_file

    def order(name: str):
        m = _LAYER.match(name)
        return (0 if "embed" in name else 2 if m is None else 1, int(m.group(1)) if m else 0, name)

    names = sorted(tensors, key=order)
    sizes = [tensors[n].numel() * tensors[n].element_size() for n in names]
    total = sum(sizes)
    groups: list[list[str]] = [[] for _ in range(shards)]
    acc = 0
    for n, b in zip(names, sizes):
        groups[min(shards - 1, acc * shards // max(total, 1))].append(n)
        acc += b
    groups = [g for g in groups if g]
    os.makedirs(out_dir, exist_ok=True)
    weight_map = {}
    for k, g in enumerate(groups):
        fn = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n] for n in g}, os.path.join(out_dir, fn), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(g, fn))
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    cfg["torch_dtype"] = cfg["dtype"] = torch_dtype
    cfg.pop("quantization_config", None)
    if fp8_block is not None:
        cfg["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [int(fp8_block[0]), int(fp8_block[1])],
        }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    return weight_map


def main(argv=None) -> int:
    """``python -m latentq.random_checkpoint --out DIR [--layers 2] [--hidden 1024] [--fp8] [--seed 0]``: a
    random-init DeepSeek-V3-architecture checkpoint with DeepSeek-V2-Lite's attention shape (16 heads,
    kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128; q_lora_rank 384, 8 routed
    experts of width 256, 2 per token, 1 shared, vocabulary 4096), in 2 shards; with --fp8 as DeepSeek ships
    V3 (e4m3 with 128 x 128 weight_scale_inv blocks). For trying ``latentq study --model`` where no weights
    can be downloaded (kernels/gpu_check.sh). Prints the directory and its size in bytes."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m latentq.random_checkpoint", description=main.__doc__)
    p.add_argument("--out", required=True, help="the checkpoint directory (created)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2; the first dense)")
    p.add_argument("--hidden", type=int, default=1024, help="hidden_size (default 1024)")
    p.add_argument("--fp8", action="store_true", help="DeepSeek FP8 128 x 128 blocks (default: bf16)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.layers < 1 or a.hidden < 64 or a.hidden % 64:
        p.error(f"--layers {a.layers} --hidden {a.hidden}: expected layers >= 1 and hidden a multiple of 64")
    model = random_model(
        "v3",
        seed=a.seed,
        std=0.02,
        vocab_size=4096,
        hidden_size=a.hidden,
        intermediate_size=2 * a.hidden,
        moe_intermediate_size=256,
        num_hidden_layers=a.layers,
        num_attention_heads=16,
        num_key_value_heads=16,
        q_lora_rank=384,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        max_position_embeddings=4096,
    )
    block = (128, 128) if a.fp8 else None
    write_checkpoint(deepseek_tensors(model, fp8_block=block), model.config, a.out, shards=2, fp8_block=block)
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"{a.out}: {size} bytes ({'FP8 blocks' if a.fp8 else 'bf16'}, {a.layers} layers, hidden {a.hidden})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
