"""What both e2e paths share (latentq.e2e for MLA models, latentq.e2e_v4 for DeepSeek-V4): the scored text and its
token windows, the rule that no metric comes from non-finite logits, the rows by query position, the /e2e attribute
saying how the step ran, and the columns of /e2e and /e2e_position (their units and definitions: latentq.e2e's
docstring says what they measure). latentq.e2e re-exports every name."""

from __future__ import annotations

import hashlib

import torch

from latentq.e2e_stats import CI_COLUMNS, SPREAD_COLUMNS, TokenStats, position_metrics
from latentq.result_groups import Column


def require_finite_logits(x: torch.Tensor, what: str) -> None:
    """Raise ValueError naming `what` and the count when the logits x (any shape) hold NaN/Inf: no
    metric is computed from them (a NaN reference would give NaN or, for top-1, arbitrary numbers)."""
    bad = int((~torch.isfinite(x)).sum())
    if bad:
        raise ValueError(
            f"{what}: {bad} of {x.numel()} logits are NaN/Inf; no metric is computed from non-finite logits"
        )


#: the reference run (exact latents) in a chunk of runs of latentq.e2e.Runner.forward, beside the
#: (quantizer, targets, cache_mode) runs; here so that latentq.e2e_retrieval names the same one
REF = None


def position_rows(stats: TokenStats, width: int) -> list[dict]:
    """The statistics of one run by query position: one dict(pos_start, pos_end, tokens, kl_mean, top1_agree,
    and latentq.e2e_stats.position_metrics' others) per bucket [b·width, min((b+1)·width, T)) of the positions
    of its TokenStats; tokens = B × positions in the bucket."""
    B, T = stats.kl.shape
    return [
        {"pos_start": a, "pos_end": min(a + width, T), "tokens": B * (min(a + width, T) - a)}
        | position_metrics(stats, a, min(a + width, T))
        for a in range(0, T, width)
    ]


def text_ids(text: bytes, tokenizer) -> list[int]:
    """The token ids of `text`: its bytes (tokenizer None), or the checkpoint's tokenizer on its UTF-8 decoding
    (invalid bytes replaced, no special tokens)."""
    if tokenizer is None:
        return list(text)
    return tokenizer(text.decode("utf-8", errors="replace"), add_special_tokens=False)["input_ids"]


def load_tokens(
    text: bytes, offset_bytes: int, tokenizer, seq_len: int, num_seqs: int, vocab_size: int
) -> torch.Tensor:
    """[num_seqs, seq_len] int64 token windows of text[offset_bytes:]: its bytes, or the checkpoint's
    tokenizer (no special tokens). Raises ValueError when there are too few tokens or an id is
    outside the model's vocabulary."""
    ids, what = text_ids(text[offset_bytes:], tokenizer), "bytes" if tokenizer is None else "tokens"
    need = seq_len * num_seqs
    if len(ids) < need:
        raise ValueError(
            f"text has {len(ids)} {what} after --offset-bytes {offset_bytes}; {need} needed for {num_seqs} x {seq_len}"
        )
    t = torch.tensor(ids[:need], dtype=torch.int64).reshape(num_seqs, seq_len)
    if int(t.max()) >= vocab_size:
        raise ValueError(f"token id {int(t.max())} is outside the model's vocabulary ({vocab_size})")
    return t


def read_text(a) -> bytes:
    """The bytes of --text (default: the KJV held-out split); sets a.text_sha256. Raises ValueError for a file that
    cannot be read or, with --dump-text-sha256, a text that is not the dumped one."""
    if a.text:
        try:
            with open(a.text, "rb") as f:
                text = f.read()
        except OSError as e:
            raise ValueError(f"--text {a.text}: cannot read ({e.strerror or type(e).__name__})") from None
    else:
        from latentq.kjv_text import load_kjv, split_kjv

        text = split_kjv(load_kjv())[1]
    a.text_sha256 = hashlib.sha256(text).hexdigest()
    if a.dump_text_sha256 and a.dump_text_sha256 != a.text_sha256:
        raise ValueError(
            f"the scored text {a.text or '(the KJV held-out split)'} (sha256 {a.text_sha256[:16]}...) is not the "
            f"dumped text (the dump's text_sha256 {a.dump_text_sha256[:16]}...): score the text the latents came from"
        )
    return text


def execution_attrs(streamer) -> dict:
    """The /e2e attributes saying how the step ran: ``execution`` ("in memory", or "layer streaming
    (hidden states in memory)" / "... in a file)"), and for a streamed run (a LayerStreamer after its
    ``run``) ``load_seconds`` and ``compute_seconds``."""
    if streamer is None:
        return {"execution": "in memory"}
    where = "in memory" if streamer.states_in_memory else "in a file"
    return {
        "execution": f"layer streaming (hidden states {where})",
        "load_seconds": streamer.load_seconds,
        "compute_seconds": streamer.compute_seconds,
    }


# The columns of /e2e and /e2e_position (their column records; the module docstring says more).
_RUN = (
    Column("quantizer", "string", "", "the quantizer: a spec string or a [[mixed]] assignment's name"),
    Column(
        "targets", "string", "", "the caches quantized: c_kv, k_pe, c_kv+k_pe, or index_k (a DSA indexer key alone)"
    ),
    Column("cache_mode", "string", "", "prefill-at-once or decode-r<R>-s<S>-p<P> (latentq/decode_order.h)"),
)
_BYTES = Column("bytes_per_token", "float64", "byte/token", "the cache at the sequence end per token and layer, "
                "mean over the quantized layers, c_kv + k_pe (an index_k run: the latents in bf16, the "
                "indexer key cache not counted)")  # fmt: skip
_CAUSAL = Column("scale_causal", "int64", "", "1 when the spec's scales see no later token (decode_scale_is_causal)")
_KL = Column("kl_mean", "float64", "nat", "mean over tokens of KL(p_ref ‖ p_quant) of the next-token distributions")
_TOP1 = Column("top1_agree", "float64", "1", "the fraction of tokens whose argmax logit is unchanged")
E2E_COLUMNS = (
    *_RUN, _KL, _TOP1,
    Column("nll_ref", "float64", "nat", "mean next-token NLL with exact latents"),
    Column("nll_quant", "float64", "nat", "mean next-token NLL with quantized latents"),
    Column("ppl_ref", "float64", "1", "exp(nll_ref)"),
    Column("ppl_quant", "float64", "1", "exp(nll_quant)"),
    _BYTES, _CAUSAL,
    Column("num_tokens", "int64", "", "the tokens scored: num_seqs × seq_len"),
    *SPREAD_COLUMNS, *CI_COLUMNS,
)  # fmt: skip
E2E_POSITION_COLUMNS = (
    *_RUN,
    Column("residual", "int64", "", "R of the cache mode (0 for prefill-at-once)"),
    Column("sink", "int64", "", "S of the cache mode"),
    Column("prefill", "int64", "", "P of the cache mode"),
    _CAUSAL,
    Column("pos_start", "int64", "", "the bucket's first query position within its window"),
    Column("pos_end", "int64", "", "the bucket's end (exclusive)"),
    Column("tokens", "int64", "", "the tokens in the bucket: windows × positions"),
    _KL, _TOP1, _BYTES, *SPREAD_COLUMNS,
)  # fmt: skip
