"""tiny-mla: a small DeepSeek-V2-style Multi-head Latent Attention language model.

The module and parameter names are those of HuggingFace transformers' ``DeepseekV2ForCausalLM``
(``model.layers.{i}.self_attn.q_proj / kv_a_proj_with_mqa / kv_a_layernorm / kv_b_proj / o_proj``,
``input_layernorm``, ``post_attention_layernorm``, ``mlp.{gate,up,down}_proj``,
``model.embed_tokens``, ``model.norm``, ``lm_head``) so that the same hooks work on this model and
on real DeepSeek-V2/V3 checkpoints. Differences from the HF class: dense SwiGLU MLP in every layer,
no KV cache, byte-level vocabulary (256), no rope scaling.

Attention follows DeepSeek-V2 (arXiv 2405.04434, section 2.1):
  q = q_proj(h)                         -> [B, T, H, qk_nope_head_dim + qk_rope_head_dim]
  c, k_pe = split(kv_a_proj_with_mqa(h)) -> [B, T, kv_lora_rank], [B, T, qk_rope_head_dim]
  c_kv = kv_a_layernorm(c)              (RMSNorm on the kv_lora_rank part only; k_pe is never normalized)
  k_nope, v = split(kv_b_proj(c_kv))    -> per head [qk_nope_head_dim], [v_head_dim]
  q_pe, k_pe = apply_rotary_emb(q_pe, k_pe, freqs_cis)   (interleaved complex pairs (2i, 2i+1),
                                                          as DeepSeek's reference code and HF V2)
  softmax_scale = (qk_nope_head_dim + qk_rope_head_dim) ** -0.5
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class TinyMLAConfig:
    """Model shape. Serialized as an HF-style ``config.json`` (``model_type = "deepseek_v2"``)."""

    vocab_size: int = 256
    hidden_size: int = 384
    intermediate_size: int = 1024
    num_hidden_layers: int = 6
    num_attention_heads: int = 6
    kv_lora_rank: int = 128
    q_lora_rank: int | None = None
    qk_rope_head_dim: int = 32
    qk_nope_head_dim: int = 64
    v_head_dim: int = 64
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        return self.qk_head_dim**-0.5

    def to_hf_dict(self) -> dict:
        d = asdict(self)
        d.update(
            model_type="deepseek_v2",
            architectures=["TinyMLAForCausalLM"],
            num_key_value_heads=self.num_attention_heads,
            first_k_dense_replace=self.num_hidden_layers,
            moe_intermediate_size=self.intermediate_size,
            n_routed_experts=None,
            n_shared_experts=None,
            hidden_act="silu",
            attention_bias=False,
            rope_scaling=None,
            torch_dtype="float32",
            bos_token_id=None,
            eos_token_id=None,
        )
        return d

    @classmethod
    def from_json_file(cls, path: str) -> TinyMLAConfig:
        with open(path) as f:
            d = json.load(f)
        names = {f.name for f in cls.__dataclass_fields__.values()}
        return cls(**{k: v for k, v in d.items() if k in names})


class DeepseekV2RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    """Interleaved RoPE on complex pairs (2i, 2i+1), the signature of HF ``deepseek_v2``.

    xq: [B, H, T, qk_rope_head_dim], xk: [B, 1, T, qk_rope_head_dim], freqs_cis: [B, T, dim/2].
    Looked up at call time from this module, so a hook can wrap it to capture post-RoPE tensors.
    """
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.unsqueeze(1)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3).type_as(xk)
    return xq_out, xk_out


class DeepseekV2Attention(nn.Module):
    def __init__(self, cfg: TinyMLAConfig, layer_idx: int):
        super().__init__()
        self.config = cfg
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_attention_heads
        self.kv_lora_rank = cfg.kv_lora_rank
        self.qk_rope_head_dim = cfg.qk_rope_head_dim
        self.qk_nope_head_dim = cfg.qk_nope_head_dim
        self.v_head_dim = cfg.v_head_dim
        self.qk_head_dim = cfg.qk_head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = DeepseekV2RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(
            cfg.kv_lora_rank, self.num_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False
        )
        self.o_proj = nn.Linear(self.num_heads * cfg.v_head_dim, cfg.hidden_size, bias=False)
        self.scaling = cfg.softmax_scale

    def forward(self, h: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        B, T, _ = h.shape
        q = self.q_proj(h).view(B, T, self.num_heads, self.qk_head_dim).transpose(1, 2)
        q_nope, q_pe = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        ckv = self.kv_a_proj_with_mqa(h)
        c, k_pe = torch.split(ckv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        c_kv = self.kv_a_layernorm(c)  # [B, T, kv_lora_rank]
        k_pe = k_pe.view(B, 1, T, self.qk_rope_head_dim)
        q_pe, k_pe = apply_rotary_emb(q_pe, k_pe, freqs_cis)
        kv = self.kv_b_proj(c_kv).view(B, T, self.num_heads, self.qk_nope_head_dim + self.v_head_dim).transpose(1, 2)
        k_nope, v = torch.split(kv, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, self.num_heads, -1, -1)], dim=-1)
        qs = torch.cat([q_nope, q_pe], dim=-1)
        # v padded with zero columns to q's head dim: torch's CPU flash kernel of SDPA needs equal head dims and
        # otherwise falls back to the math path (2.3x slower at 16 x 512 tokens, [B, H, T, T] materialized); the
        # zero columns change no output (transformers pads v so for MLA models, integrations/flash_attention.py).
        if self.v_head_dim < self.qk_head_dim:
            v = F.pad(v, [0, self.qk_head_dim - self.v_head_dim])
        o = F.scaled_dot_product_attention(qs, k, v, is_causal=True, scale=self.scaling)[..., : self.v_head_dim]
        o = o.transpose(1, 2).reshape(B, T, self.num_heads * self.v_head_dim)
        return self.o_proj(o)


class DeepseekV2MLP(nn.Module):
    def __init__(self, cfg: TinyMLAConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DeepseekV2DecoderLayer(nn.Module):
    def __init__(self, cfg: TinyMLAConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DeepseekV2Attention(cfg, layer_idx)
        self.mlp = DeepseekV2MLP(cfg)
        self.input_layernorm = DeepseekV2RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = DeepseekV2RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, freqs_cis):
        h = h + self.self_attn(self.input_layernorm(h), freqs_cis)
        return h + self.mlp(self.post_attention_layernorm(h))


class DeepseekV2Model(nn.Module):
    def __init__(self, cfg: TinyMLAConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DeepseekV2DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = DeepseekV2RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class TinyMLAForCausalLM(nn.Module):
    """Byte-level causal LM. ``forward(input_ids [B, T] int64) -> logits [B, T, 256] float32``."""

    def __init__(self, cfg: TinyMLAConfig):
        super().__init__()
        self.config = cfg
        self.model = DeepseekV2Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        cfg = self.config
        inv = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, cfg.qk_rope_head_dim, 2, dtype=torch.float32) / cfg.qk_rope_head_dim)
        )
        freqs = position_ids.float()[..., None] * inv
        freqs_cis = torch.polar(torch.ones_like(freqs), freqs)  # [B, T, rope/2]
        h = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            h = layer(h, freqs_cis)
        return self.lm_head(self.model.norm(h)).float()

    # --- I/O ---------------------------------------------------------------------------------
    def save_pretrained(self, out_dir: str) -> None:
        from safetensors.torch import save_file

        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(self.config.to_hf_dict(), f, indent=2, sort_keys=True)
            f.write("\n")
        save_file(
            {k: v.contiguous() for k, v in self.state_dict().items()},
            os.path.join(out_dir, "model.safetensors"),
            metadata={"format": "pt"},
        )

    @classmethod
    def from_pretrained(cls, model_dir: str) -> TinyMLAForCausalLM:
        from safetensors.torch import load_file

        cfg_path = os.path.join(model_dir, "config.json")
        if not os.path.exists(cfg_path):
            raise FileNotFoundError(f"{cfg_path}: no config.json (expected a tiny-mla model directory)")
        model = cls(TinyMLAConfig.from_json_file(cfg_path))
        model.load_state_dict(load_file(os.path.join(model_dir, "model.safetensors")), strict=True)
        return model.eval()
