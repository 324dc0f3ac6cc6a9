"""Frontier-first e2e: which of the study's quantizers the e2e step runs by default (``python -m latentq.e2e
--e2e frontier``), from the cheap probes already in the results file, and which it leaves out, with why.

What can win. The decision (study/gate/decision.cpp, latentq/decision.h) takes at each budget B = f · bf16 of
its ladder (f: the fractions of ``--budgets``, by default 1/16, 1/8, 1/4, 3/8, 1/2; bf16: the whole-model
bf16 cache, num_layers · (kv_lora_rank + qk_rope_head_dim) · 2 bytes per token) the uniform formats whose
/summary ``bytes_per_token_model`` <= B · (1 + 1e-13) and whose /e2e row (prefill-at-once, c_kv+k_pe) exists,
and names the one of the lowest e2e KL, the runner-up (the next-lowest) and the best engine format. A format the
step does not run changes that only when it would have been the best or the runner-up at some budget.

The probe score of a format: its attention KL (/attention_error, targets c_kv+k_pe, ``kl_mean`` averaged over
layers: the decision's own KL when /e2e is absent), or, when the study has no /attention_error, its score-space
error (/latent_error ``score_mse`` of c_kv plus that of k_pe, averaged over layers).

The frontier at budget B: the KEEP_BEST formats of the lowest score among those that fit B, and every format whose
score is within WITHIN × the lowest there. A prefill-at-once run is made when its quantizer is on the frontier at
some budget, or is
- an engine format (the format table's engine field, ``latentq.format_rows()``, untransformed): the decision's
  engine row reads them all;
- a mixed assignment (a [[mixed]] name, no spec): the decision's plan row reads it;
- bf16: the check that the injection is exact (its KL is float32 rounding);
- one the frontier cannot rank: no finite probe score, a target set other than c_kv+k_pe, no /summary row.
The formats named with ``--quantizers`` (``[e2e] quantizers``) all run: there is no frontier then. Every other
format is left out and listed in /e2e_not_run (NOT_RUN_COLUMNS): "dominated by X at the probes" (X: the lowest
score at the tightest budget it fits), or "over every budget" (more bytes than the largest budget). ``--e2e all``
runs every quantizer, as before the frontier.

The decode-order runs (the study's [decode_order] quantizers × cache modes × target sets, or the prefill-at-once
quantizers when the study has none) of a format left out are left out with it (leave_out_decode), for the same
reason, one /e2e_not_run row per run (its targets and cache_mode): the decision reads only the prefill-at-once
c_kv+k_pe rows of /e2e, /e2e_seq and /e2e_bootstrap (study/gate/decision.cpp: measured_kl, per_sequence), so no
decode-order row can change its summary. The report's error-vs-position figure draws the decode-order /e2e_position
rows that ran (every [decode_order] quantizer stays in its /attention_position row). Decode-order quantizers named
with ``--decode-quantizers`` all run.

The margin, measured (every run made, ``--e2e all``; where the decision's best and runner-up at each budget
rank by the probe score): tiny-mla's default study, the runner-up at 3/8 and 1/2 is 3rd by attention KL, at
9.7 × the lowest; on random-init DeepSeek checkpoints (latentq.random_checkpoint: V2 2 layers, V3 3 layers in
bf16 and in FP8 blocks, 4 × 128 KJV bytes), the best is at most 5th by attention KL within 1.22 × the lowest,
and the runner-up at most 25th, at 2.69 ×. KEEP_BEST = 4 and WITHIN = 4 keep every one of them, by rank (3rd
<= 4) or by factor (<= 2.69 × < 4 ×), with a rank and 1.5 × of the factor to spare (docs/e2e.md gives the
table); tests/python/test_e2e_frontier.py checks on the default study that the decision is that of ``--e2e all``.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from latentq.e2e_results import open_results
from latentq.result_groups import Column

SELECTIONS = ("frontier", "all")
# study/gate/decision.cpp default_budget_fractions(); latentq/plan.h kPlanBudgetSlack; latentq/applicable.h
# kNotApplicableAccounting (a /summary accounting that keeps the format out of the decision)
DEFAULT_BUDGETS = (1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2)
BUDGET_SLACK = 1e-13
NOT_APPLICABLE = "not applicable (bf16 counted)"
KEEP_BEST = 4  # formats of the lowest probe score kept at each budget
WITHIN = 4.0  # and every format whose probe score is within this factor of the lowest there
WHOLE_CACHE = ("c_kv", "k_pe")
PREFILL_AT_ONCE = "prefill-at-once"  # latentq.e2e_decode.PREFILL_AT_ONCE


def parse_budgets(text: str) -> list[float]:
    """The fractions of ``--budgets`` ("1/16,1/8,0.25"): each a/b or a decimal in (0, 1], as the C++
    parse_budget_fractions reads them. Raises ValueError naming the part and what was expected."""
    out = []
    for part in text.split(","):
        try:
            v = float(Fraction(part.strip()))
        except (ValueError, ZeroDivisionError):
            v = math.nan
        if not 0 < v <= 1:
            raise ValueError(
                f"--budgets {text}: budget '{part}': expected a fraction of the bf16 cache in (0, 1], "
                "as a/b or a decimal"
            )
        out.append(v)
    return out


def fraction_label(f: float) -> str:
    """A budget fraction as the decision prints it: "1/16", "3/8", "all", else 4 significant digits."""
    for den in (2, 4, 8, 16, 32, 64):
        num = round(f * den)
        if 1 <= num <= den and abs(f * den - num) < 1e-12:
            return "all" if num == den else str(Fraction(num, den))
    return f"{f:.4g}"


class NotRun(NamedTuple):
    """A run the frontier leaves out: its quantizer, why ("dominated by X at the probes" or "over every budget"),
    X ("" for the latter), the budget it was compared at (its tightest; NaN when over every budget), its probe
    score and X's there, its bytes per token (whole model), and the run's targets and cache mode (a decode-order
    run is left out with its format's prefill-at-once run, for its reason)."""

    quantizer: str
    reason: str
    dominated_by: str
    budget_fraction: float
    probe_score: float
    best_score: float
    bytes_per_token_model: float
    targets: str = "+".join(WHOLE_CACHE)
    cache_mode: str = PREFILL_AT_ONCE


_WHY = (
    "'dominated by X at the probes' or 'over every budget' (latentq.e2e_frontier); a decode-order run has its "
    "format's reason (the decision reads prefill-at-once rows only)"
)
NOT_RUN_COLUMNS = (
    Column("quantizer", "string", "", "a quantizer of the study the e2e step did not run (--e2e frontier)"),
    Column("targets", "string", "", "the latents the run would have quantized (c_kv+k_pe, c_kv, k_pe)"),
    Column("cache_mode", "string", "", "the run's cache mode: prefill-at-once or decode-r<R>-s<S>-p<P> "
           "(latentq/decode_order.h)"),
    Column("reason", "string", "", _WHY),
    Column("dominated_by", "string", "", "X: the lowest probe score at that budget (empty: over every budget)"),
    Column("budget_fraction", "float64", "1", "that budget, the tightest of --budgets it fits, as a fraction of the "
           "bf16 cache (NaN when over every budget)"),
    Column("probe_score", "float64", "", "its probe score: attention KL (nat) or score_mse (score unit²), as the "
           "group's attribute probe_metric says"),
    Column("best_score", "float64", "", "X's probe score, same unit (NaN when over every budget)"),
    Column("bytes_per_token_model", "float64", "byte/token", "its cache: whole model, c_kv + k_pe, metadata "
           "included (/summary)"),
)  # fmt: skip


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def probe_scores(results: str) -> tuple[str, dict[str, float]]:
    """(metric, {quantizer: score}) of the module docstring: metric "attention KL" (nat) from /attention_error,
    else "score_mse" (score unit²) from /latent_error; ("none", {}) when neither has rows. A quantizer lacking
    a layer's value gets the mean of those it has; one with a non-finite value gets NaN."""
    with open_results(results) as f:
        if "attention_error" in f and "kl_mean" in f["attention_error"]:
            g = f["attention_error"]
            acc: dict[str, list[float]] = {}
            for q, t, kl in zip(g["quantizer"][:], g["targets"][:], g["kl_mean"][:]):
                if _str(t) == "c_kv+k_pe":
                    acc.setdefault(_str(q), []).append(float(kl))
            return "attention KL", {q: float(np.mean(v)) for q, v in acc.items()}
        if "latent_error" in f and "score_mse" in f["latent_error"]:
            g = f["latent_error"]
            per: dict[str, dict[int, dict[str, float]]] = {}
            for q, layer, t, s in zip(g["quantizer"][:], g["layer"][:], g["target"][:], g["score_mse"][:]):
                per.setdefault(_str(q), {}).setdefault(int(layer), {})[_str(t)] = float(s)
            out = {}
            for q, layers in per.items():
                sums = [d["c_kv"] + d["k_pe"] for d in layers.values() if set(WHOLE_CACHE) <= set(d)]
                if sums:
                    out[q] = float(np.mean(sums))
            return "score_mse", out
    return "none", {}


def whole_model_bf16(results: str) -> float | None:
    """The whole-model bf16 cache in bytes per token (the decision's ``bf16_bytes_per_token``): num_layers ·
    (kv_lora_rank + qk_rope_head_dim) · 2 from the root attributes; None when one is missing."""
    keys = ("num_layers", "kv_lora_rank", "qk_rope_head_dim")
    with open_results(results) as f:
        if not all(k in f.attrs for k in keys):
            return None
        n, r, p = (int(f.attrs[k]) for k in keys)
    return float(n * (r + p) * 2)


def summary_bytes(results: str) -> dict[str, tuple[float, bool]]:
    """{quantizer: (bytes_per_token_model, applicable)} of /summary; applicable is False when an accounting
    column says the format cannot take a target ({} without /summary)."""
    with open_results(results) as f:
        if "summary" not in f:
            return {}
        g = f["summary"]
        acc = [[_str(v) for v in g[c][:]] for c in ("c_kv_accounting", "k_pe_accounting") if c in g]
        return {
            _str(q): (float(b), not any(a[i] == NOT_APPLICABLE for a in acc))
            for i, (q, b) in enumerate(zip(g["quantizer"][:], g["bytes_per_token_model"][:]))
        }


class Frontier(NamedTuple):
    """What select() decided: the quantizers to run (a set), the others (NotRun, in the study's order), the
    probe metric and the frontier's parameters; the decode-order runs left out with them (NotRun, in the runs'
    order) and how many decode-order runs there were (leave_out_decode)."""

    run: set
    not_run: list
    metric: str
    budgets: list
    keep_best: int
    within: float
    decode_not_run: tuple = ()
    decode_total: int = 0


def select(results: str, latentq, pairs: list, budgets, keep_best: int = KEEP_BEST, within: float = WITHIN) -> Frontier:
    """The frontier of the module docstring over `pairs` ([(quantizer, targets)], the study's prefill-at-once
    runs) at the budget fractions `budgets`. latentq: the package with its compiled part (canonical_spec,
    format_rows). A file without /summary or the root attributes of the budgets (not written by `latentq run`):
    nothing can be ranked, every quantizer runs. Raises ValueError naming the file (unreadable)."""
    metric, score = probe_scores(results)
    summ, bf16 = summary_bytes(results), whole_model_bf16(results)
    if not summ or bf16 is None:
        return Frontier({q for q, _ in pairs}, [], "none", sorted(budgets), keep_best, within)
    engine = {latentq.canonical_spec(r["name"]) for r in latentq.format_rows() if r["engine"]}
    limits = sorted(f * bf16 * (1 + BUDGET_SLACK) for f in budgets)
    fractions = sorted(budgets)
    run, left = set(), []  # left: the candidates to leave out unless the frontier takes them
    scored = {}  # every scored whole-cache format of `pairs` competes for the frontier, the always-run ones too
    for q, targets in pairs:
        try:
            latentq.canonical_spec(q)
        except ValueError:  # a mixed assignment
            run.add(q)
            continue
        s, (nbytes, applicable) = score.get(q, math.nan), summ.get(q, (math.nan, True))
        whole = sorted(targets) == list(WHOLE_CACHE) and q in summ and applicable
        if whole and math.isfinite(s):
            scored[q] = s
        if q in engine or q == "bf16" or not whole or (nbytes <= limits[-1] and not math.isfinite(s)):
            run.add(q)  # always run, or a format the frontier cannot rank
        else:
            left.append(q)
    best_at: list[tuple[str, float] | None] = []
    for lim in limits:
        fit = sorted((q for q in scored if summ[q][0] <= lim), key=lambda q: (scored[q], q))
        best_at.append((fit[0], scored[fit[0]]) if fit else None)
        run.update(fit[:keep_best])
        run.update(q for q in fit if scored[q] <= within * scored[fit[0]])
    not_run = []
    for q in left:
        if q in run:
            continue
        nbytes = summ[q][0]
        if nbytes > limits[-1]:
            not_run.append(NotRun(q, "over every budget", "", math.nan, score.get(q, math.nan), math.nan, nbytes))
            continue
        i = next(i for i, lim in enumerate(limits) if nbytes <= lim)
        x, xs = best_at[i]
        not_run.append(NotRun(q, f"dominated by {x} at the probes", x, fractions[i], scored[q], xs, nbytes))
    return Frontier(run, not_run, metric, fractions, keep_best, within)


def leave_out_decode(fr: Frontier, decode_runs: list) -> tuple[Frontier, list]:
    """The decode-order runs [(quantizer, targets, cache_mode)] (targets a tuple of names) without those of the
    formats fr leaves out, and fr with them as ``decode_not_run`` (each with its format's NotRun fields, its
    targets and cache mode; the module docstring says why) and ``decode_total``."""
    off = {n.quantizer: n for n in fr.not_run}
    keep, left = [], []
    for q, targets, mode in decode_runs:
        if q in off:
            left.append(off[q]._replace(targets="+".join(targets), cache_mode=mode))
        else:
            keep.append((q, targets, mode))
    return fr._replace(decode_not_run=tuple(left), decode_total=len(decode_runs)), keep


def rule(fr: Frontier) -> str:
    """The frontier's rule in words, for the step's note and /e2e_not_run's attribute ``rule``."""
    if fr.metric == "none":
        return "no probe score, /summary or budget attributes in the results file: nothing to rank, every one runs"
    return (
        f"the best {fr.keep_best} by {fr.metric} at each budget ({', '.join(map(fraction_label, fr.budgets))} of "
        f"bf16) and every format within {fr.within:g}x of the best there; engine formats, mixed assignments and "
        "bf16 always"
    )


def not_run_lines(fr: Frontier, total: int) -> list[str]:
    """The step's output about the frontier: a summary line, then one line per format left out."""
    dec = fr.decode_not_run
    also = f", with {len(dec)} of the {fr.decode_total} decode-order runs (theirs)" if fr.decode_total else ""
    lines = [
        f"e2e: frontier: {total - len(fr.not_run)} of {total} prefill-at-once quantizers run ({rule(fr)}); "
        f"{len(fr.not_run)} not run{also}; listed in /e2e_not_run (--e2e all runs every one)"
    ]
    for n in fr.not_run:
        if n.dominated_by:
            why = (
                f"{n.reason} ({fr.metric} {n.probe_score:.3g} vs {n.best_score:.3g} at "
                f"{fraction_label(n.budget_fraction)} of bf16)"
            )
        else:
            top = fraction_label(fr.budgets[-1])
            why = f"over every budget ({n.bytes_per_token_model:.6g} B/token > {top} of bf16)"
        lines.append(f"  not run  {n.quantizer:28s} {why}")
    by_format: dict[str, list[NotRun]] = {}
    for n in dec:
        by_format.setdefault(n.quantizer, []).append(n)
    for q, ns in by_format.items():
        tg = ", ".join(dict.fromkeys(n.targets for n in ns))
        lines.append(f"  not run  {q:28s} in {len(ns)} decode-order runs ({tg}): with its prefill-at-once run")
    return lines


def not_run_group(fr: Frontier | None, selection: str) -> tuple:
    """/e2e_not_run for latentq.result_groups.write_groups: (NOT_RUN_COLUMNS, values, attrs); no rows under
    --e2e all or explicit --quantizers (fr None), so that a rerun replaces an earlier file's list."""
    rows = [*fr.not_run, *fr.decode_not_run] if fr is not None else []
    values = {
        **{c: np.array([getattr(n, c) for n in rows], dtype=object)
           for c in ("quantizer", "targets", "cache_mode", "reason", "dominated_by")},
        **{c: np.array([getattr(n, c) for n in rows], dtype=np.float64)
           for c in ("budget_fraction", "probe_score", "best_score", "bytes_per_token_model")},
    }  # fmt: skip
    attrs = {
        "selection": selection,
        "probe_metric": fr.metric if fr is not None else "",
        "rule": rule(fr) if fr is not None else "every quantizer ran (--e2e all or --quantizers)",
        "budgets": ",".join(map(fraction_label, fr.budgets)) if fr is not None else "",
        "definition": "the runs of the study's quantizers the e2e step left out because the cheap probes show they "
        "cannot be the decision's best or runner-up at any budget, a format's decode-order runs with its "
        "prefill-at-once run (latentq.e2e_frontier); --e2e all runs them",
    }
    return NOT_RUN_COLUMNS, values, attrs
