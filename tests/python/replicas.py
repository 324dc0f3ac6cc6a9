"""Replicas of the MLA checkpoints users download, written offline as each family ships them, each beside a
float32 reference checkpoint of the same (dequantized) weights; shared by test_weight_formats (the decoders and
latentq.dump) and test_study_checkpoints (`latentq study --model`).

Four random-init DeepSeek-V3-architecture replicas (latentq.random_checkpoint; hidden 192, 3 layers, 4 routed +
1 shared expert) in 3 safetensors shards with a layer split across two:
- ``kimi``: Kimi-K2-Thinking: the routed experts INT4 compressed-tensors ``pack-quantized``, symmetric, group 32,
  bf16 scales (compressed-tensors' own compressor), everything else bf16, the ignore list as shipped; the config
  as shipped: model_type ``kimi_k2``, ``auto_map`` naming the checkpoint's own code, architectures
  ``DeepseekV3ForCausalLM`` (a class transformers ships);
- ``mistral``: Mistral-Large-3: every decoder-layer projection compressed-tensors ``float-quantized`` FP8 with
  128 × 128 blocks (partial edge blocks: 192 = 1.5 blocks) and a bf16 ``weight_scale``;
- ``nvfp4``: DeepSeek-R1-FP4: the MLP weights NVFP4 (ModelOpt's recipe: ``weight_scale_2`` = amax / (6 · 448),
  e4m3 ``weight_scale`` per 16, ``input_scale``), the attention excluded, recognised from
  ``hf_quant_config.json``;
- ``instruct``: Kimi-K2-Instruct: DeepSeek FP8 (e4m3 with 128 × 128 ``weight_scale_inv`` blocks) and a tokenizer
  that is the checkpoint's own code (``tokenization_kimi.TikTokenTokenizer`` in tokenizer_config.json's
  ``auto_map``; here a byte-level stand-in of that class, written into the directory as remote code is).
The references (``<name>-ref``): the dequantized weights in float32 (compressed-tensors' decompressor with a
float32 scale, an independent numpy NVFP4 decoder, the FP8 product code × weight_scale_inv written out here),
config plain deepseek_v3, loaded by transformers' from_pretrained.
"""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import torch
from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.utils import calculate_qparams

from latentq import weight_formats as wf
from latentq.random_checkpoint import deepseek_tensors, random_model, write_checkpoint

V3 = dict(hidden_size=192, intermediate_size=160, moe_intermediate_size=64, q_lora_rank=96, num_hidden_layers=3)
SEQ_LEN, NUM_SEQS, Q_ROWS = 32, 2, 8
E4M3_MAX, E2M1_MAX = 448.0, 6.0
FAMILIES = ("kimi", "mistral", "nvfp4", "instruct")
# The one-format study config of the front-door tests (test_study_checkpoints, test_study_variants).
STUDY_CONFIG = """[quantizers]
bits = [8]
schemes = ["sym"]
granularities = ["token"]
group_sizes = [32]
extra = ["bf16"]
[svd]
enabled = false
[cross_layer]
enabled = false
"""


# ---- quantizing as the formats' own code does -------------------------------------------------


def ct_pack(w: torch.Tensor, args: QuantizationArgs) -> dict:
    """compressed-tensors' PackedQuantizationCompressor.compress of w with min/max qparams
    (calculate_qparams, per group / channel), as its observers give them."""
    M, N = w.shape
    g = args.group_size if args.strategy == "group" else N
    blocks = w.reshape(M, N // g, g)
    scale, zp = calculate_qparams(blocks.amin(-1), blocks.amax(-1), args)
    sd = {"weight": w, "weight_scale": scale}
    if not args.symmetric:
        sd["weight_zero_point"] = zp
    return PackedQuantizationCompressor.compress(sd, QuantizationScheme(targets=["Linear"], weights=args))


def fp8_scale(w: torch.Tensor, args: QuantizationArgs, dtype) -> torch.Tensor:
    """amax / 448 per tensor ([1]), row ([M, 1]) or block ([ceil(M/bm), ceil(N/bn)])."""
    a = w.float().abs()
    if args.strategy == "tensor":
        s = a.max().reshape(1)
    elif args.strategy == "channel":
        s = a.amax(1, keepdim=True)
    else:
        bm, bn = args.block_structure
        M, N = w.shape
        s = torch.stack(
            [torch.stack([a[i : i + bm, j : j + bn].max() for j in range(0, N, bn)]) for i in range(0, M, bm)]
        )
    return (s / E4M3_MAX).to(dtype)


def ct_float(w: torch.Tensor, args: QuantizationArgs, scale_dtype) -> dict:
    sd = {"weight": w, "weight_scale": fp8_scale(w, args, scale_dtype)}
    return FloatQuantizationCompressor.compress(sd, QuantizationScheme(targets=["Linear"], weights=args))


def ct_decompress(cls, parts: dict, args: QuantizationArgs, scale_dtype=torch.float32) -> torch.Tensor:
    """The library's decompressor, the scale given in scale_dtype (it computes in that dtype)."""
    sd = dict(parts, weight_scale=parts["weight_scale"].to(scale_dtype))
    return cls.decompress(sd, QuantizationScheme(targets=["Linear"], weights=args))["weight"]


def nvfp4_quantize(w: torch.Tensor) -> dict:
    """ModelOpt's NVFP4 recipe (nvfp4_tensor.py quantize): weight_scale_2 = amax / (6 · 448), per 16
    weight_scale = e4m3(block amax / (6 · weight_scale_2)), codes = e2m1(w / (scale · scale_2))
    (rounded by ml_dtypes), two per byte, element 2i in the low nibble."""
    x = w.float().numpy()
    M, N = x.shape
    s2 = np.float32(np.abs(x).max() / (E2M1_MAX * E4M3_MAX))
    blocks = x.reshape(M, N // 16, 16)
    s = (np.abs(blocks).max(-1) / (E2M1_MAX * s2)).astype(ml_dtypes.float8_e4m3fn)
    per_block = s.astype(np.float32) * s2
    scaled = blocks / np.where(per_block == 0, 1, per_block)[..., None]
    codes = scaled.reshape(M, N).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return {
        "weight": torch.from_numpy(np.ascontiguousarray(packed, dtype=np.uint8)),
        "weight_scale": torch.from_numpy(s.view(np.uint8).copy()).view(torch.float8_e4m3fn),
        "weight_scale_2": torch.tensor(s2),
        "input_scale": torch.tensor(np.float32(0.02)),
    }


def numpy_nvfp4(parts: dict, group: int = 16) -> np.ndarray:
    """Independent NVFP4 decoder: nibble 2i low, 2i + 1 high, e2m1 by ml_dtypes, times
    float32(e4m3 scale) · scale_2 (float32, the product first, as ModelOpt)."""
    b = parts["weight"].numpy()
    M, N = b.shape[0], 2 * b.shape[1]
    codes = np.empty((M, N), dtype=np.uint8)
    codes[:, 0::2], codes[:, 1::2] = b & 0x0F, b >> 4
    e2m1 = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    s = parts["weight_scale"].view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    per_block = s * np.float32(parts["weight_scale_2"].item())
    return (e2m1.reshape(M, N // group, group) * per_block[..., None]).reshape(M, N)


KIMI_QC = {
    "config_groups": {
        "group_0": {
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None,
                "block_structure": None,
                "dynamic": False,
                "group_size": 32,
                "num_bits": 4,
                "observer": "minmax",
                "observer_kwargs": {},
                "strategy": "group",
                "symmetric": True,
                "type": "int",
            },
        }
    },
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}
MISTRAL_QC = {
    "config_groups": {
        "FP8_BLOCK": {
            "format": "float-quantized",
            "input_activations": {
                "dynamic": True,
                "group_size": 128,
                "num_bits": 8,
                "strategy": "group",
                "type": "float",
            },
            "targets": ["Linear"],
            "weights": {
                "block_structure": [128, 128],
                "dynamic": False,
                "num_bits": 8,
                "observer": "static_minmax",
                "strategy": "block",
                "symmetric": True,
                "type": "float",
            },
        }
    },
    "format": "float-quantized",
    "ignore": ["lm_head", r"re:.*mlp\.gate$"],
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}
NVFP4_HQ = {
    "producer": {"name": "modelopt", "version": "0.23.0"},
    "quantization": {
        "quant_algo": "NVFP4",
        "kv_cache_quant_algo": None,
        "group_size": 16,
        "exclude_modules": ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"],
    },
}


# Kimi-K2's config.json as shipped names its own code (configuration_deepseek.py, modeling_deepseek.py)
KIMI_AUTO_MAP = {
    "AutoConfig": "configuration_deepseek.DeepseekV3Config",
    "AutoModel": "modeling_deepseek.DeepseekV3Model",
    "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
}

# A byte-level stand-in of Kimi-K2's tiktoken tokenizer class, written into the checkpoint as remote code is:
# transformers imports it only with trust_remote_code.
TOKENIZER_CODE = """from transformers import PreTrainedTokenizer


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "tiktoken.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file=None, **kwargs):
        super().__init__(**kwargs)

    @property
    def vocab_size(self):
        return 256

    def get_vocab(self):
        return {f"{i:02x}": i for i in range(256)}

    def _tokenize(self, text, **kwargs):
        return [f"{b:02x}" for b in text.encode("utf-8")]

    def _convert_token_to_id(self, token):
        return int(token, 16)

    def _convert_id_to_token(self, index):
        return f"{index:02x}"

    def convert_tokens_to_string(self, tokens):
        return bytes(int(t, 16) for t in tokens).decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory, filename_prefix=None):
        return ()
"""
TOKENIZER_CONFIG = {
    "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
    "tokenizer_class": "TikTokenTokenizer",
    "model_max_length": 1048576,
}


def write_remote_tokenizer(d: str) -> None:
    """Kimi-K2-Instruct's tokenizer files: tokenizer_config.json naming tokenization_kimi.TikTokenTokenizer
    in its auto_map, the class's code, and its vocabulary file."""
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(TOKENIZER_CONFIG, f, indent=2)
    with open(os.path.join(d, "tokenization_kimi.py"), "w") as f:
        f.write(TOKENIZER_CODE)
    with open(os.path.join(d, "tiktoken.model"), "w") as f:
        f.write("# the stand-in tokenizer reads no vocabulary\n")


def fp8_dequantize(q: torch.Tensor, scale_inv: torch.Tensor, block=(128, 128)) -> torch.Tensor:
    """DeepSeek FP8 written out: float32(e4m3 code) × weight_scale_inv of its (row, column) block, edge
    blocks partial (DeepSeek-V3 inference/kernel.py weight_dequant)."""
    bm, bn = block
    s = scale_inv.float().repeat_interleave(bm, 0).repeat_interleave(bn, 1)[: q.shape[0], : q.shape[1]]
    return q.float() * s


# ---- the replicas -----------------------------------------------------------------------------------


def ct_args(qc: dict) -> QuantizationArgs:
    w = next(iter(qc["config_groups"].values()))["weights"]
    return QuantizationArgs(**{k: v for k, v in w.items() if k in QuantizationArgs.model_fields})


def is_proj(name: str) -> bool:
    return name.startswith("model.layers.") and name.endswith(("_proj.weight", "_proj_with_mqa.weight"))


def quantize_tensors(tensors: dict, which, quantize, decompress) -> tuple[dict, dict]:
    """(checkpoint tensors, float32 reference tensors): every name ``which`` picks replaced by the
    module's stored tensors (quantize(w) -> {suffix: tensor}) and, in the reference, by
    decompress(parts) (float32)."""
    out, ref = {}, {}
    for k, t in tensors.items():
        if which(k):
            mod = k[: -len(".weight")]
            parts = quantize(t)
            out.update({f"{mod}.{s}": v.contiguous() for s, v in parts.items()})
            ref[k] = decompress(parts).float().contiguous()
        else:
            out[k] = t
            ref[k] = t.float() if t.is_floating_point() else t
    return out, ref


def build_replicas(root) -> tuple[dict[str, str], str]:
    """Write every replica of FAMILIES and its float32 reference under root (a directory). Returns
    ({name: dir, name + "-ref": dir}, the path of a random byte text of SEQ_LEN × NUM_SEQS + 7 bytes)."""
    root = str(root)
    torch.set_num_threads(1)
    model = random_model("v3", seed=21, std=0.1, **V3)
    base = deepseek_tensors(model, dtype=torch.bfloat16)
    kimi_args, mistral_args = ct_args(KIMI_QC), ct_args(MISTRAL_QC)
    kinds = {
        "kimi": (
            lambda k: ".mlp.experts." in k,
            lambda w: ct_pack(w, kimi_args),
            lambda p: ct_decompress(PackedQuantizationCompressor, p, kimi_args),
        ),
        "mistral": (
            lambda k: is_proj(k),
            lambda w: ct_float(w, mistral_args, torch.bfloat16),
            lambda p: ct_decompress(FloatQuantizationCompressor, p, mistral_args),
        ),
        "nvfp4": (
            lambda k: is_proj(k) and ".mlp." in k,
            nvfp4_quantize,
            lambda p: torch.from_numpy(numpy_nvfp4(p)),
        ),
    }
    paths = {}
    for name, (which, quantize, decompress) in kinds.items():
        ts, ref = quantize_tensors(base, which, quantize, decompress)
        d, r = os.path.join(root, name, "ckpt"), os.path.join(root, name, "ref")
        write_checkpoint(ts, model.config, d, shards=3)
        write_checkpoint(ref, model.config, r, shards=2, torch_dtype="float32")
        cfg = json.loads(open(os.path.join(d, "config.json")).read())
        if name == "nvfp4":
            with open(os.path.join(d, wf.HF_QUANT_NAME), "w") as f:
                json.dump(NVFP4_HQ, f, indent=2)
        else:
            cfg["quantization_config"] = KIMI_QC if name == "kimi" else MISTRAL_QC
        if name == "kimi":
            cfg.update(model_type="kimi_k2", auto_map=KIMI_AUTO_MAP, architectures=["DeepseekV3ForCausalLM"])
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        paths[name], paths[name + "-ref"] = d, r
    # Kimi-K2-Instruct: DeepSeek FP8 and its own tokenizer code; the reference dequantized as written out here
    fp8 = deepseek_tensors(model, fp8_block=(128, 128), dtype=torch.bfloat16)
    ref = {}
    for k, t in fp8.items():
        if k.endswith("_scale_inv"):
            continue
        ref[k] = fp8_dequantize(t, fp8[k + "_scale_inv"]) if k + "_scale_inv" in fp8 else t.float()
    d, r = os.path.join(root, "instruct", "ckpt"), os.path.join(root, "instruct", "ref")
    write_checkpoint(fp8, model.config, d, shards=3, fp8_block=(128, 128))
    write_checkpoint(ref, model.config, r, shards=2, torch_dtype="float32")
    write_remote_tokenizer(d)
    write_remote_tokenizer(r)
    paths["instruct"], paths["instruct-ref"] = d, r
    text = os.path.join(root, "text.txt")
    with open(text, "wb") as f:
        f.write(bytes(np.random.default_rng(5).integers(0, 256, SEQ_LEN * NUM_SEQS + 7, dtype=np.uint8)))
    return paths, text


# ---- bf16 checkpoints of other MLA families, as transformers writes them --------------------------------

NATIVE = {
    # GLM-4.7-Flash: glm4_moe_lite (MoE after two dense layers); MiniCPM3: dense MLA with q_lora
    "glm": (
        "Glm4MoeLite",
        dict(
            first_k_dense_replace=2,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_group=1,
            topk_group=1,
            num_hidden_layers=3,
        ),
    ),
    "minicpm3": ("MiniCPM3", dict(num_hidden_layers=3)),
}
NATIVE_COMMON = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=48,
    kv_lora_rank=64,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=32,
    max_position_embeddings=512,
)


def build_native_replicas(root) -> dict[str, str]:
    """GLM-4.7-Flash and MiniCPM3 replicas: random-init transformers models (weights N(0, 0.1), norm gains
    1 + N(0, 0.1)) saved by save_pretrained in bf16 in shards of 100 kB (a layer across two), and their float32
    references (the same bf16 values, widened). Returns {name: dir, name + "-ref": dir}."""
    import transformers

    paths = {}
    for k, (name, extra) in enumerate(NATIVE.items()):
        cls, kw = extra
        torch.manual_seed(30 + k)
        cfg = getattr(transformers, cls + "Config")(**NATIVE_COMMON, **kw)
        model = getattr(transformers, cls + "ForCausalLM")(cfg).eval()
        g = torch.Generator().manual_seed(40 + k)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" in n:
                    p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
                elif p.dim() >= 2:
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
        d, r = os.path.join(str(root), name, "ckpt"), os.path.join(str(root), name, "ref")
        model.to(torch.bfloat16).save_pretrained(d, max_shard_size="100KB")
        model.to(torch.float32).save_pretrained(r)
        paths[name], paths[name + "-ref"] = d, r
    return paths


# ---- MLA variants (transformers 5.24's deepseek_v32, glm_moe_dsa, longcat_flash, kimi_linear) ---------------------
# Tiny random-init models of each family's config class (test_mla_variants says what each variant is).

VARIANT_COMMON = dict(
    vocab_size=320,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=32,
    max_position_embeddings=256,
    attn_implementation="eager",
)
DSA = dict(
    q_lora_rank=48,
    num_hidden_layers=2,
    intermediate_size=96,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    index_topk=64,  # >= SEQ_LEN: every causal key selected, the attention is dense
    index_head_dim=32,
    index_n_heads=4,
)
KINDS = {
    "deepseek_v32": ("DeepseekV32", dict(DSA)),
    "glm_moe_dsa": ("GlmMoeDsa", dict(DSA, num_hidden_layers=3, indexer_types=["full", "shared", "full"])),
    "longcat_flash": (
        "LongcatFlash",
        dict(
            q_lora_rank=48,
            num_layers=2,
            head_dim=16,
            ffn_hidden_size=96,
            n_routed_experts=4,
            zero_expert_num=2,
            moe_topk=2,
            expert_ffn_hidden_size=32,
        ),
    ),
    "kimi_linear": (
        "KimiLinear",
        dict(
            q_lora_rank=None,
            num_hidden_layers=4,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            linear_head_dim=16,
            linear_num_heads=4,
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
        ),
    ),
}
LAYERS = {  # MLA layer index -> its module, as transformers numbers and names them
    "deepseek_v32": {i: f"model.layers.{i}.self_attn" for i in (0, 1)},
    "glm_moe_dsa": {i: f"model.layers.{i}.self_attn" for i in (0, 1, 2)},
    "longcat_flash": {i: f"model.layers.{i // 2}.self_attn.{i % 2}" for i in range(4)},
    "kimi_linear": {i: f"model.layers.{i}.self_attn" for i in (1, 3)},
}


def build(kind: str, seed: int = 0, **over):
    """A random-init float32 model of the family, eval mode: transformers' init, then every matrix
    N(0, 0.15) and every norm gain 1 + N(0, 0.1) (sharp attention, so that a wrong tensor shows)."""
    import transformers

    cls, kw = KINDS[kind]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cls + "Config")(**{**VARIANT_COMMON, **kw, **over})
    model = getattr(transformers, cls + "ForCausalLM")(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("e_score_correction_bias"):
                p.copy_(torch.rand(p.shape, generator=g) * 0.1)
            elif "norm" in n and p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    return model.eval()


def build_v32_fp8(root, index_topk: int = 5) -> dict[str, str]:
    """DeepSeek-V3.2 as DeepSeek ships it: FP8 e4m3 with 128 x 128 weight_scale_inv blocks for the decoder layers'
    projections and the indexer's wq_b and wk (DeepSeek-V3.2-Exp inference/model.py builds them as the model's
    FP8 Linear; weights_proj in the default dtype), kv_a_proj_with_mqa's rows a partial block (48 of 128), 3
    shards with a layer split across two; index_topk below the window (sparse). The float32 reference holds the
    dequantized weights (fp8_dequantize). Returns {"v32fp8": dir, "v32fp8-ref": dir}."""
    from latentq.random_checkpoint import quantize_fp8_blocks

    torch.set_num_threads(1)
    model = build("deepseek_v32", seed=5, index_topk=index_topk)
    tensors = deepseek_tensors(model, fp8_block=(128, 128), dtype=torch.bfloat16)
    for k in [k for k in tensors if k.endswith((".indexer.wq_b.weight", ".indexer.wk.weight"))]:
        tensors[k], tensors[k + "_scale_inv"] = quantize_fp8_blocks(tensors[k].float(), (128, 128))
    weights_proj = [k for k in tensors if k.endswith(".indexer.weights_proj.weight_scale_inv")]
    for k in weights_proj:  # the default dtype in DeepSeek's code: undo the FP8 the _proj.weight rule gave it
        w = k[: -len("_scale_inv")]
        tensors[w] = fp8_dequantize(tensors[w], tensors.pop(k)).to(torch.bfloat16)
    ref = {}
    for k, t in tensors.items():
        if k.endswith("_scale_inv"):
            continue
        ref[k] = fp8_dequantize(t, tensors[k + "_scale_inv"]) if k + "_scale_inv" in tensors else t.float()
    d, r = os.path.join(str(root), "v32fp8", "ckpt"), os.path.join(str(root), "v32fp8", "ref")
    write_checkpoint(tensors, model.config, d, shards=3, fp8_block=(128, 128))
    write_checkpoint(ref, model.config, r, shards=2, torch_dtype="float32")
    return {"v32fp8": d, "v32fp8-ref": r}
