"""DeepSeek Sparse Attention (DSA): the lightning indexer's selection of the tokens each query reads.

Sparse MLA (DeepSeek-V3.2, GLM-5, Mistral-Large-4) caches the MLA latent (c_kv, k_pe) as dense MLA does, plus
one indexer key per token; each query attends only to the top-k tokens of its causal window by the index score.
Written from transformers 5.24.0 ``models/deepseek_v32/modeling_deepseek_v32.py`` (``DeepseekV32Indexer.forward``
and ``DeepseekV32Attention.forward``) and ``models/glm_moe_dsa/modeling_glm_moe_dsa.py`` (the same arithmetic;
GLM rotates the indexer's RoPE part interleaved, V3.2 as rotate_half), on the tensors an indexer cache holds:

    index score s[q, t] = Σ_h w[q, h] · relu(scale · index_q[q, h, :] · index_k[t, :])
    w[q, h]             = weights_proj(x_q)[h] · n_h^-0.5          (``index_w`` as dumped: the factor applied)
    scale               = index_head_dim^-0.5                      (``index_softmax_scale``)
    selected(q)         = the top-k tokens t of q's causal window (its sequence, t <= q) by s[q, t]

with index_q and index_k after the indexer's RoPE (on their first qk_rope_head_dim columns). transformers takes
``topk`` of scores masked with -inf outside the window and then masks the attention causally, so a query whose
window holds no more than k tokens reads all of them: the same set as here. The official code adds a Hadamard
rotation and FP8 to the indexer's q and k; transformers (the reference here) skips both, and so does this.

All tensors float32 (numpy or torch in, torch out); q_rows are indices into the T token rows; seq_offsets [S+1]
bound the sequences (latentq-dump/1, data/README.md).
"""

from __future__ import annotations

import numpy as np
import torch


def _t(x) -> torch.Tensor:
    return (x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))).float()


def causal_window(q_rows, seq_offsets, T: int) -> torch.Tensor:
    """[Tq, T] bool: token t is in query row q's causal window (same sequence, t <= q_rows[q])."""
    q_rows = torch.as_tensor(np.asarray(q_rows), dtype=torch.long)
    off = torch.as_tensor(np.asarray(seq_offsets), dtype=torch.long)
    start = off[torch.searchsorted(off, q_rows, right=True) - 1]
    keys = torch.arange(T)
    return (keys[None, :] >= start[:, None]) & (keys[None, :] <= q_rows[:, None])


def index_scores(index_q, index_w, index_k, q_rows, seq_offsets, softmax_scale: float) -> torch.Tensor:
    """The indexer's score of every token for every query row: [Tq, T] float32, -inf outside the causal window.

    index_q [Tq, n_h, d], index_w [Tq, n_h] (n_h^-0.5 applied), index_k [T, d]; softmax_scale = d^-0.5."""
    q, w, k = _t(index_q), _t(index_w), _t(index_k)
    if q.dim() != 3 or w.shape != q.shape[:2] or k.dim() != 2 or k.shape[1] != q.shape[2]:
        raise ValueError(
            f"index_q {tuple(q.shape)}, index_w {tuple(w.shape)}, index_k {tuple(k.shape)}: expected "
            "[Tq, n_h, d], [Tq, n_h], [T, d]"
        )
    per_head = torch.relu(torch.einsum("qhd,td->qht", q, k) * softmax_scale)  # [Tq, n_h, T]
    s = torch.einsum("qh,qht->qt", w, per_head)
    return s.masked_fill(~causal_window(q_rows, seq_offsets, k.shape[0]), float("-inf"))


def select_topk(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """The tokens each query row reads: [Tq, T] bool, the topk highest finite scores of each row (all of its
    window when it holds no more than topk). Ties at the k-th score go to the lower key index (a stable sort,
    as the C++ probe /indexer_error breaks them; relu makes exact ties at 0 common under a coarse format);
    transformers' torch.topk breaks them its own way (the dump's check allows for it: same_up_to_ties)."""
    if topk < 1:
        raise ValueError(f"index_topk must be >= 1, got {topk}")
    k = min(topk, scores.shape[-1])
    idx = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    chosen = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, idx, True)
    return chosen & torch.isfinite(scores)


def topk_recall(reference: torch.Tensor, other: torch.Tensor) -> float:
    """Mean over query rows of |reference ∩ other| / |reference| (both [Tq, T] bool selections): the fraction of
    the tokens the reference indexer selects that another (e.g. a quantized indexer cache) still selects."""
    if reference.shape != other.shape:
        raise ValueError(f"selections of shapes {tuple(reference.shape)} and {tuple(other.shape)}")
    n = reference.sum(-1).clamp_min(1).double()
    return float(((reference & other).sum(-1).double() / n).mean())


def same_up_to_ties(scores: torch.Tensor, a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-5) -> bool:
    """Whether two selections ([Tq, T] bool) of the same scores ([Tq, T], -inf outside the window) differ only
    in keys whose score is within rtol · max|score| of the row's lowest selected score in ``a`` (ties that the
    rounding of another summation order may break either way)."""
    diff = a ^ b
    if not bool(diff.any()):
        return True
    fin = torch.where(torch.isfinite(scores), scores, torch.zeros_like(scores))
    tol = rtol * fin.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    kth = torch.where(a, scores, torch.full_like(scores, float("inf"))).amin(-1, keepdim=True)
    return bool(((scores - kth).abs() <= tol)[diff].all())
