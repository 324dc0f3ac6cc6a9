"""Per-token statistics of the e2e step (latentq.e2e): what a quantized latent cache does to the model's
next-token distributions, over every scored token, with 95% intervals by a paired bootstrap over sequences.

Definitions follow llama.cpp's KL-divergence mode (``llama-perplexity --kl-divergence``), file
tools/perplexity/perplexity.cpp of github.com/ggml-org/llama.cpp at commit
050fc7f32de16858ac667d775b43a51ed8976e6f: the per-token values come from its
``log_softmax(n_vocab, logits, base_log_prob, tok, kld)`` (called per token by the ``process_logits`` that fills
``kld_values`` and ``p_diff_values``), the summaries from ``kl_divergence(ctx, params)``:

  KL_t        = Σ_v p_ref(v) · (ln p_ref(v) − ln p_q(v)) at position t ("KL Divergence"; p_ref: the "base"
                model, here the model with exact latents; p_q: the run with quantized latents);
  Δp_t        = p_q(y_t) − p_ref(y_t), y_t the true next token ("p_diff = p - p_base", "Δp");
  RMS Δp      = sqrt(mean_t Δp_t²) ("RMS Δp");
  ln ppl ratio = mean_t nll_q(t) − mean_t nll_ref(t) ("Mean ln(PPL(Q)/PPL(base))");
  percentiles of KL_t: its ``percentile`` lambda, linear interpolation at fraction · (n − 1) of the sorted
                values (numpy's default "linear"; its median, the mean of the two middle values, is the 50th),
                the maximum its "Maximum KLD";
  top-1       = the fraction of positions whose argmax is unchanged ("Same top p").

Where this differs from llama.cpp: every position of each window is scored (llama.cpp scores the second half of
each chunk), KL_t and top-1 at all T positions of a window (Δp and NLL at the T − 1 positions that have a next
token), in float64 from the logits (llama.cpp stores the base log-probabilities as uint16 steps and drops
ln p_base < −16 from the KL sum), and intervals by a bootstrap over sequences instead of its ± (the standard
error of a mean over tokens, which treats the tokens of a window as independent).

Intervals (``interval_columns``, ``paired_difference``): the percentile bootstrap (Efron & Tibshirani, "An
Introduction to the Bootstrap", 1993, ch. 13): the sequence indices are resampled with replacement
(``bootstrap_counts``: RESAMPLES draws of num_seqs indices from a numpy PCG64 generator seeded with SEED), the
metric is recomputed over the pooled tokens of each resample, and the interval is the 2.5th and 97.5th
percentiles (numpy "linear") of the recomputed values. Every run of a step uses the same draws, so two runs'
intervals, and their ``paired_difference``, are paired. With one sequence there is nothing to resample: NaN.
With few sequences the percentile interval is too narrow (the resampled means spread by sqrt((n − 1)/n) of the
mean's standard error, and no t quantile widens it): on per-sequence means drawn from a normal distribution, 4
sequences (the step's default) hold the true mean in ~78% of replications, 40 in ~94%
(tests/python/test_e2e_stats.py). Read a 4-sequence interval as a lower bound on the uncertainty.
Each metric is a function of per-sequence sums (``Metric``), so a resample costs a [RESAMPLES, num_seqs]
matrix product, not a pass over the tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from latentq.result_groups import Column

SEED = 0  # numpy default_rng seed of the bootstrap draws (recorded as /e2e's bootstrap_seed)
RESAMPLES = 2000  # bootstrap resamples (recorded as /e2e's bootstrap_resamples)
LEVEL = 0.95  # the intervals' nominal coverage
KL_PERCENTILES = {"kl_median": 50.0, "kl_p90": 90.0, "kl_p99": 99.0, "kl_p999": 99.9}


@dataclass
class TokenStats:
    """The per-token values of one run against the reference, on the same [B, T] token windows (B sequences
    of T tokens): kl [B, T] float64 nats (KL_t); top1 [B, T] float64 0/1; nll_ref, nll_quant [B, T − 1] float64
    nats (−ln p(y_t) of the next true token y_t = ids[:, t + 1]); delta_p [B, T − 1] float64, p_q(y_t) − p_ref(y_t).
    Bounded: 5 · B · T float64 per run, no vocabulary axis."""

    kl: np.ndarray
    top1: np.ndarray
    nll_ref: np.ndarray
    nll_quant: np.ndarray
    delta_p: np.ndarray

    @property
    def num_seqs(self) -> int:
        return self.kl.shape[0]


def token_stats(ref: torch.Tensor, q: torch.Tensor, ids: torch.Tensor) -> TokenStats:
    """TokenStats of the logits ref, q [B, T, V] (any float dtype; softmax over the vocabulary in float64, one
    sequence at a time, so at most 4 · T · V float64 are held) and the token ids [B, T] int64 (T >= 2).
    top-1 compares the argmax of the logits as given. No finiteness check: the caller checks first
    (latentq.e2e.require_finite_logits)."""
    B, T, _ = ref.shape
    assert q.shape == ref.shape and tuple(ids.shape) == (B, T) and T >= 2, (ref.shape, q.shape, ids.shape)
    kl, top1 = np.empty((B, T)), np.empty((B, T))
    nll_ref, nll_q, dp = np.empty((B, T - 1)), np.empty((B, T - 1)), np.empty((B, T - 1))
    ids = ids.to("cpu", torch.int64)
    for b in range(B):
        lr = F.log_softmax(ref[b].double(), -1)
        lq = F.log_softmax(q[b].double(), -1)
        kl[b] = (lr.exp() * (lr - lq)).sum(-1).cpu().numpy()
        top1[b] = (ref[b].argmax(-1) == q[b].argmax(-1)).double().cpu().numpy()
        y = ids[b, 1:, None].to(lr.device)
        yr, yq = lr[:-1].gather(-1, y)[:, 0], lq[:-1].gather(-1, y)[:, 0]
        nll_ref[b], nll_q[b] = (-yr).cpu().numpy(), (-yq).cpu().numpy()
        dp[b] = (yq.exp() - yr.exp()).cpu().numpy()
    return TokenStats(kl, top1, nll_ref, nll_q, dp)


class Metric(NamedTuple):
    """A metric as f(Σ_seq num / Σ_seq den) of per-sequence sums: sums(s) -> (num [B], den [B]); finish maps the
    pooled ratio to the metric (identity, or sqrt for an RMS)."""

    sums: Callable[[TokenStats], tuple[np.ndarray, np.ndarray]]
    finish: Callable[[np.ndarray], np.ndarray]


def _per_seq(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return x.sum(1), np.full(x.shape[0], float(x.shape[1]))


# The metrics with intervals (interval_columns, paired_difference), each over the pooled tokens of a resample.
METRICS: dict[str, Metric] = {
    "kl_mean": Metric(lambda s: _per_seq(s.kl), lambda r: r),
    "top1_agree": Metric(lambda s: _per_seq(s.top1), lambda r: r),
    "ln_ppl_ratio": Metric(lambda s: _per_seq(s.nll_quant - s.nll_ref), lambda r: r),
    "delta_p_rms": Metric(lambda s: _per_seq(s.delta_p**2), np.sqrt),
}


def run_metrics(s: TokenStats) -> dict[str, float]:
    """The /e2e values of one run (every position of every sequence; module docstring for the definitions):
    kl_mean, top1_agree, nll_ref, nll_quant, ppl_ref, ppl_quant; kl_median, kl_p90, kl_p99, kl_p999 (numpy
    linear percentiles of KL_t), kl_max; delta_p_mean, delta_p_rms; ln_ppl_ratio = nll_quant − nll_ref."""
    nll_ref, nll_q = float(s.nll_ref.mean()), float(s.nll_quant.mean())
    kl = s.kl.ravel()
    out = {
        "kl_mean": float(kl.mean()),
        "top1_agree": float(s.top1.mean()),
        "nll_ref": nll_ref,
        "nll_quant": nll_q,
        "ppl_ref": float(np.exp(nll_ref)),
        "ppl_quant": float(np.exp(nll_q)),
    }
    out |= _spread(kl, s.delta_p.ravel(), s.nll_quant.ravel() - s.nll_ref.ravel())
    return out


def _spread(kl: np.ndarray, dp: np.ndarray, dnll: np.ndarray) -> dict[str, float]:
    """The percentiles and maximum of KL_t, mean and RMS of Δp and the ln ppl ratio of these tokens (NaN for an
    empty set)."""
    nan = float("nan")
    pct = np.percentile(kl, list(KL_PERCENTILES.values())) if kl.size else [nan] * len(KL_PERCENTILES)
    return {
        **{k: float(v) for k, v in zip(KL_PERCENTILES, pct)},
        "kl_max": float(kl.max()) if kl.size else nan,
        "delta_p_mean": float(dp.mean()) if dp.size else nan,
        "delta_p_rms": float(np.sqrt((dp**2).mean())) if dp.size else nan,
        "ln_ppl_ratio": float(dnll.mean()) if dnll.size else nan,
    }


def position_metrics(s: TokenStats, start: int, end: int) -> dict[str, float]:
    """kl_mean, top1_agree and the _spread values of the query positions [start, end) of every sequence
    (/e2e_position): KL_t and top-1 at those positions, Δp and the NLL at those of them that have a next
    token (t < T − 1; none: NaN)."""
    kl = s.kl[:, start:end].ravel()
    return {
        "kl_mean": float(kl.mean()),
        "top1_agree": float(s.top1[:, start:end].mean()),
        **_spread(kl, s.delta_p[:, start:end].ravel(), (s.nll_quant - s.nll_ref)[:, start:end].ravel()),
    }


def bootstrap_counts(num_seqs: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """[resamples, num_seqs] int64: row r counts how often each sequence is drawn in resample r (num_seqs
    indices drawn uniformly with replacement by numpy.random.default_rng(seed).integers)."""
    assert num_seqs >= 1 and resamples >= 1, (num_seqs, resamples)
    idx = np.random.default_rng(seed).integers(0, num_seqs, size=(resamples, num_seqs))
    flat = (idx + num_seqs * np.arange(resamples)[:, None]).ravel()
    return np.bincount(flat, minlength=resamples * num_seqs).reshape(resamples, num_seqs)


def _resampled(s: TokenStats, metric: str, counts: np.ndarray) -> np.ndarray:
    """The metric over the pooled tokens of each resample: [resamples] float64."""
    m = METRICS[metric]
    num, den = m.sums(s)
    return m.finish((counts @ num) / (counts @ den))


def _bounds(values: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(values, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    return float(lo), float(hi)


def interval(s: TokenStats, metric: str, counts: np.ndarray | None = None) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval (lo, hi) of `metric` (a key of METRICS) over sequences, for the
    draws `counts` (bootstrap_counts(num_seqs) when None); (NaN, NaN) with one sequence."""
    if s.num_seqs < 2:
        return float("nan"), float("nan")
    counts = bootstrap_counts(s.num_seqs) if counts is None else counts
    assert counts.shape[1] == s.num_seqs, (counts.shape, s.num_seqs)
    return _bounds(_resampled(s, metric, counts))


def interval_columns(s: TokenStats, counts: np.ndarray | None = None) -> dict[str, float]:
    """{<metric>_ci_lo, <metric>_ci_hi} of every metric of METRICS (interval)."""
    out = {}
    for k in METRICS:
        out[f"{k}_ci_lo"], out[f"{k}_ci_hi"] = interval(s, k, counts)
    return out


def point(s: TokenStats, metric: str) -> float:
    """`metric` (a key of METRICS) over all tokens: the value of run_metrics."""
    m = METRICS[metric]
    num, den = m.sums(s)
    return float(m.finish(num.sum() / den.sum()))


def paired_difference(
    run_a: TokenStats, run_b: TokenStats, metric: str, resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float, float]:
    """(delta, lo, hi): delta = metric(run_a) − metric(run_b) over all tokens, and its 95% percentile-bootstrap
    interval over sequences, both runs recomputed on the same resampled sequences (the pairing: what the two
    runs share, e.g. a hard window, cancels). The runs must be scored on the same token windows (equal
    shapes; ValueError otherwise). (delta, NaN, NaN) with one sequence."""
    if run_a.kl.shape != run_b.kl.shape:
        raise ValueError(
            f"paired_difference: runs on different tokens (KL shapes {run_a.kl.shape} and {run_b.kl.shape})"
        )
    delta = point(run_a, metric) - point(run_b, metric)
    if run_a.num_seqs < 2:
        return delta, float("nan"), float("nan")
    counts = bootstrap_counts(run_a.num_seqs, resamples, seed)
    lo, hi = _bounds(_resampled(run_a, metric, counts) - _resampled(run_b, metric, counts))
    return delta, lo, hi


# The /e2e columns of the spread of the per-token values (llama.cpp tools/perplexity/perplexity.cpp, commit
# 050fc7f32de16858ac667d775b43a51ed8976e6f, kl_divergence(): its percentile lambda, "Maximum KLD", "Δp",
# "RMS Δp", "ln(PPL(Q)/PPL(base))"); Δp and NLL at the positions that have a next token.
_LLAMA = "as llama.cpp perplexity.cpp kl_divergence()"
SPREAD_COLUMNS = (
    *(
        Column(k, "float64", "nat", f"the {p:g}th percentile of the per-token KL (numpy linear; {_LLAMA})")
        for k, p in KL_PERCENTILES.items()
    ),
    Column("kl_max", "float64", "nat", f"the largest per-token KL ({_LLAMA}: Maximum KLD)"),
    Column(
        "delta_p_mean",
        "float64",
        "1",
        f"mean over the positions with a next token y of Δp = p_quant(y) − p_ref(y) ({_LLAMA}: Mean Δp)",
    ),
    Column(
        "delta_p_rms",
        "float64",
        "1",
        f"sqrt of the mean of Δp² over the positions with a next token ({_LLAMA}: RMS Δp)",
    ),
    Column(
        "ln_ppl_ratio",
        "float64",
        "nat",
        f"mean next-token NLL quantized − mean NLL exact, ln(ppl_quant / ppl_ref) ({_LLAMA}: ln(PPL(Q)/PPL(base)))",
    ),
)
CI_COLUMNS = tuple(
    Column(
        f"{k}_ci_{end}",
        "float64",
        unit,
        f"the {side} end of the 95% interval of {k}: percentile bootstrap over "
        "sequences (the group's bootstrap_resamples draws, seed bootstrap_seed); NaN with one sequence",
    )
    for k, unit in (("kl_mean", "nat"), ("top1_agree", "1"), ("ln_ppl_ratio", "nat"), ("delta_p_rms", "1"))
    for end, side in (("lo", "lower"), ("hi", "upper"))
)
assert {c.name[: -len("_ci_lo")] for c in CI_COLUMNS} == set(METRICS)  # one interval per bootstrapped metric

# The per-sequence values a paired comparison of two /e2e runs needs (the C++ decision's best vs runner-up,
# latentq/decision.h): group /e2e_seq, one row per (run, sequence); group /e2e_bootstrap, the draws every run's
# intervals used (bootstrap_counts), one row per (draw, sequence). kl_mean of a resample is
# Σ_s count[r, s] · kl_sum[s] / Σ_s count[r, s] · tokens[s], as METRICS["kl_mean"].
SEQ_COLUMNS = (
    Column("quantizer", "string", "", "the /e2e row's quantizer"),
    Column("targets", "string", "", "the /e2e row's targets"),
    Column("cache_mode", "string", "", "the /e2e row's cache_mode"),
    Column("seq", "int64", "", "the sequence (window) index, 0-based"),
    Column("kl_sum", "float64", "nat", "Σ over the window's tokens of the per-token KL(p_ref ‖ p_quant)"),
    Column("tokens", "int64", "", "the tokens of the window that kl_sum sums"),
)
BOOTSTRAP_COLUMNS = (
    Column("draw", "int64", "", "the bootstrap resample, 0 .. bootstrap_resamples − 1"),
    Column("seq", "int64", "", "the sequence index"),
    Column("count", "int64", "", "how often the resample drew that sequence (bootstrap_counts)"),
)


def paired_groups(run_stats: dict, counts: np.ndarray) -> dict:
    """The write_groups entries of /e2e_seq and /e2e_bootstrap: run_stats {(quantizer, targets, cache_mode):
    TokenStats} (targets a tuple of names), counts [resamples, num_seqs] int64 (bootstrap_counts)."""
    rows = {c.name: [] for c in SEQ_COLUMNS}
    for (q, targets, mode), s in run_stats.items():
        num, den = METRICS["kl_mean"].sums(s)
        for b in range(s.num_seqs):
            for k, v in zip(rows, (q, "+".join(targets), mode, b, num[b], den[b])):
                rows[k].append(v)
    seq = {k: np.array(v) for k, v in rows.items()}
    seq["seq"], seq["tokens"] = seq["seq"].astype(np.int64), seq["tokens"].astype(np.int64)
    R, B = counts.shape
    boot = {
        "draw": np.repeat(np.arange(R, dtype=np.int64), B),
        "seq": np.tile(np.arange(B, dtype=np.int64), R),
        "count": counts.astype(np.int64).ravel(),
    }
    attrs = {"bootstrap_seed": np.int64(SEED), "bootstrap_resamples": np.int64(R)}
    return {"e2e_seq": (SEQ_COLUMNS, seq, attrs), "e2e_bootstrap": (BOOTSTRAP_COLUMNS, boot, attrs)}
