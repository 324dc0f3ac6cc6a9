"""/retrieval: retrieval at range with a quantized latent cache — a needle test built from the scored text.

For each (context length, depth) of the step's settings, ``latentq.needle.needle_samples`` cuts contexts from the
scored text (the e2e step's text, tokenized as the step tokenizes it), inserts a needle (a span of the same text) at
the depth and appends its first ``cue`` tokens; a sample is retrieved when the greedy continuation of that prompt
reproduces the needle's remaining ``span − cue`` tokens. The design is the needle-in-a-haystack test (G. Kamradt,
2023, github.com/gkamradt/LLMTest_NeedleInAHaystack: a fact at a depth of a context of a length, then asked for)
and the passkey test (Mohtashami & Jaggi, 2023, arXiv:2305.16300), with the haystack and the needle taken from the
user's own text, so it needs no instruction-following: the cue asks the model to copy.

Greedy reproduction is decided by one teacher-forced forward of prompt + answer[:-1] per sample: by causality the
greedy continuation equals the answer iff the argmax at every answer position is the answer's token
(``latentq.needle.teacher_forced_success``); the forward is the e2e step's own (``latentq.e2e.Runner.forward``,
the same hooks as /e2e), so a run's quantized cache is the one its /e2e row measured:

  prefill-at-once  every key of the prompt and the answer is read quantized;
  decode-r<R>-s<S>-p<P>  the run's sink S and residual window R, with the prompt as the prefill (P = the prompt's
                   length: the prompt's queries read bf16 keys, as an engine's prefill attention does; every answer
                   token is a decode step reading the cache as latentq/decode_order.h builds it).

A format whose scale spans the sequence (``scale_causal`` 0: per-tensor and per-channel-g0 scales) has no causal
decode order; its teacher-forced forward sees the answer's keys in that scale (as its /e2e row does), so for it the
equivalence with free-running greedy decoding is approximate, and the row says so through ``scale_causal``.

Rows: one per (run, length, depth) with the run's successes and the reference's (the exact model on the same
samples), and ``lost`` / ``gained`` (samples the reference retrieves and the run does not, and the converse: the
paired counts of McNemar's test). Accuracy intervals: Wilson's score interval at 95% (E. B. Wilson, 1927, "Probable
inference, the law of succession, and statistical inference", JASA 22:209–212) over the samples of the row.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from latentq import needle
from latentq.progress import say
from latentq.result_groups import Column

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval (lo, hi) of a proportion successes / n at the normal quantile z (95%: Z95);
    (NaN, NaN) when n is 0. Wilson (1927); the form of Agresti & Coull (1998), "Approximate is better than
    'exact' for interval estimation of binomial proportions", eq. 2."""
    if n <= 0:
        return math.nan, math.nan
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def retrieval_mode(latentq, mode: str, prompt_len: int) -> str:
    """The cache mode a run's retrieval forward uses: prefill-at-once as is; a decode mode with its residual and
    sink and the prompt as the prefill (P = prompt_len). Raises ValueError for a malformed label."""
    from latentq.e2e_decode import PREFILL_AT_ONCE, mode_rsp

    if mode == PREFILL_AT_ONCE:
        return mode
    R, S, _ = mode_rsp(latentq, mode)
    return f"decode-r{R}-s{S}-p{prompt_len}"


RETRIEVAL_COLUMNS = (
    Column("quantizer", "string", "", "the run's quantizer, as its /e2e row"),
    Column("targets", "string", "", "the caches quantized, as its /e2e row"),
    Column("cache_mode", "string", "", "the run's /e2e cache mode (the retrieval forward takes P = the prompt)"),
    Column("scale_causal", "int64", "", "1 when the spec's scales see no later token (decode_scale_is_causal)"),
    Column("context_len", "int64", "token", "the context's length, the needle inside it (the cue after it)"),
    Column("depth", "float64", "1", "where the needle starts, as a fraction of context_len − span"),
    Column("samples", "int64", "", "needle samples at this (context_len, depth)"),
    Column("successes", "int64", "", "samples whose greedy continuation reproduces the needle with this run"),
    Column("ref_successes", "int64", "", "the same with the exact latents (the reference)"),
    Column("lost", "int64", "", "samples the reference retrieves and this run does not"),
    Column("gained", "int64", "", "samples this run retrieves and the reference does not"),
    Column("accuracy", "float64", "1", "successes / samples"),
    Column("accuracy_ci_lo", "float64", "1", "the lower end of accuracy's 95% Wilson score interval"),
    Column("accuracy_ci_hi", "float64", "1", "the upper end of the same interval"),
    Column("ref_accuracy", "float64", "1", "ref_successes / samples"),
)


def build_samples(
    tokens: np.ndarray, lengths, depths, span: int, cue: int, samples: int, seed: int, max_pos: int | None
):
    """The needle samples by context length: {length: [NeedleSample, ...]} (latentq.needle.needle_samples, one call
    per length so a length's samples share one forward). Raises ValueError naming a length whose prompt and answer
    exceed the model's max_position_embeddings, or what needle_samples raises."""
    out = {}
    for L in lengths:
        if max_pos is not None and L + span - 1 > max_pos:
            raise ValueError(
                f"--needle-lengths {L}: a sample is {L + span - 1} tokens (context {L} + span {span} − 1), over the "
                f"model's max_position_embeddings {max_pos}"
            )
        out[L] = needle.needle_samples(tokens, [L], list(depths), span, cue, samples, seed)
    return out


def _ids(group) -> tuple[torch.Tensor, np.ndarray]:
    """(ids [n, P + A − 1] int64: prompt + answer[:-1], answers [n, A]) of samples of one length."""
    ids = np.stack([np.concatenate([s.prompt, s.answer[:-1]]) for s in group])
    return torch.from_numpy(ids.astype(np.int64)), np.stack([s.answer for s in group])


def retrieval_rows(runner, runs, by_length: dict, batch: int, causal_of, progress=None):
    """The /retrieval rows of `runs` ((quantizer, targets, cache_mode) as the e2e step's) on the samples
    `by_length` (build_samples): per length one forward of the reference and forwards of `batch` runs at a time
    through a latentq.e2e.Runner like `runner` (the step's hooks, its model, plan and dims, on the samples' ids),
    success by latentq.needle.teacher_forced_success.
    causal_of(run) -> 0/1: the run's scale_causal. progress: a latentq.progress.Progress counted in runs × lengths,
    or None. Raises ValueError as Runner.forward (a refused spec, non-finite logits)."""
    from latentq.e2e_shared import REF, require_finite_logits

    Runner = type(runner)  # latentq.e2e.Runner (not imported: latentq.e2e imports this module)

    rows = []
    for L, group in by_length.items():
        ids, answers = _ids(group)
        ids = ids.to(runner.a.device)
        P = ids.shape[1] - answers.shape[1] + 1
        on_ids = Runner(runner.latentq, runner.a, runner.model, ids, runner.plan, runner.dims)
        latentq = runner.latentq
        with torch.no_grad():
            ref = on_ids.forward([REF])[0]
            require_finite_logits(ref, f"the retrieval reference at context {L}")
            ref_ok = needle.teacher_forced_success(ref.numpy(), answers)
            adapted = [(q, t, retrieval_mode(latentq, m, P)) for q, t, m in runs]
            for i in range(0, len(runs), batch):
                chunk = adapted[i : i + batch]
                for run, own, logits in zip(runs[i : i + batch], chunk, on_ids.forward(chunk)):
                    require_finite_logits(logits, f"the retrieval run {run[0]} ({own[2]}) at context {L}")
                    ok = needle.teacher_forced_success(logits.numpy(), answers)
                    rows += _cells(run, causal_of(run), L, group, ok, ref_ok)
                if progress is not None:
                    progress.update(len(chunk))
    return rows


def _cells(run, causal: int, L: int, group, ok: np.ndarray, ref_ok: np.ndarray) -> list[dict]:
    """One row per depth of one run at context length L."""
    depth = np.array([s.depth for s in group])
    out = []
    for d in sorted(set(depth.tolist())):
        m = depth == d
        n, k, kr = int(m.sum()), int(ok[m].sum()), int(ref_ok[m].sum())
        lo, hi = wilson_interval(k, n)
        out.append(
            {
                "quantizer": run[0],
                "targets": "+".join(run[1]),
                "cache_mode": run[2],
                "scale_causal": np.int64(causal),
                "context_len": np.int64(L),
                "depth": float(d),
                "samples": np.int64(n),
                "successes": np.int64(k),
                "ref_successes": np.int64(kr),
                "lost": np.int64(int((ref_ok[m] & ~ok[m]).sum())),
                "gained": np.int64(int((ok[m] & ~ref_ok[m]).sum())),
                "accuracy": k / n,
                "accuracy_ci_lo": lo,
                "accuracy_ci_hi": hi,
                "ref_accuracy": kr / n,
            }
        )
    return out


_PER_RUN = ("quantizer", "targets", "cache_mode", "scale_causal")
_COUNTS = ("samples", "successes", "ref_successes", "lost", "gained")
SUMMARY_COLUMNS = tuple(c for c in RETRIEVAL_COLUMNS if c.name in _PER_RUN + _COUNTS) + tuple(
    c._replace(definition=c.definition.replace("the row's", "the run's"))
    for c in RETRIEVAL_COLUMNS
    if c.name in ("accuracy", "accuracy_ci_lo", "accuracy_ci_hi", "ref_accuracy")
)


def summary_rows(rows: list[dict]) -> list[dict]:
    """/retrieval_summary: per run, the counts of its /retrieval rows summed over (length, depth), its accuracy
    with Wilson's 95% interval over all its samples, and the reference's accuracy on the same samples."""
    runs: dict[tuple, dict] = {}
    for r in rows:
        key = tuple(r[k] for k in _PER_RUN)
        acc = runs.setdefault(key, {k: r[k] for k in _PER_RUN} | {k: 0 for k in _COUNTS})
        for k in _COUNTS:
            acc[k] += int(r[k])
    out = []
    for acc in runs.values():
        n, k = acc["samples"], acc["successes"]
        lo, hi = wilson_interval(k, n)
        counts = {c: np.int64(acc[c]) for c in _COUNTS}
        out.append(acc | counts | {"accuracy": k / n, "accuracy_ci_lo": lo, "accuracy_ci_hi": hi,
                                   "ref_accuracy": acc["ref_successes"] / n})  # fmt: skip
    return out


def _values(columns, rows: list[dict]) -> dict:
    return {c.name: np.array([r[c.name] for r in rows]) for c in columns} if rows else {}


def retrieval_groups(rows: list[dict], settings: dict) -> dict:
    """{"retrieval": ..., "retrieval_summary": ...}: (columns, values, attributes) of each for
    latentq.result_groups.write_groups."""
    cols = _values(RETRIEVAL_COLUMNS, rows)
    ref = {}
    for r in rows:  # the reference's successes per (length, depth), the same for every run
        ref[(int(r["context_len"]), r["depth"])] = (int(r["ref_successes"]), int(r["samples"]))
    k, n = sum(v[0] for v in ref.values()), sum(v[1] for v in ref.values())
    attrs = {
        **settings,
        "reference_accuracy": k / n if n else math.nan,
        "definition": "a sample is retrieved when the greedy continuation of context + cue reproduces the needle's "
        "remaining tokens, decided by one teacher-forced forward (latentq.e2e_retrieval); needle samples: "
        "latentq.needle; intervals: Wilson's score interval at 95% over the row's samples",
    }
    summary_attrs = {**attrs, "definition": "per run: its /retrieval rows summed over (context_len, depth); "
                     "accuracy's interval: Wilson's score interval at 95% over the run's samples"}  # fmt: skip
    return {
        "retrieval": (RETRIEVAL_COLUMNS, cols, attrs),
        "retrieval_summary": (SUMMARY_COLUMNS, _values(SUMMARY_COLUMNS, summary_rows(rows)), summary_attrs),
    }


SEED = 0  # needle_samples' seed (recorded as /retrieval's needle_seed)


def add_args(ap) -> None:
    """The step's retrieval flags (latentq.e2e_args.parse_args)."""
    ap.add_argument(
        "--retrieval",
        action="store_true",
        help="also write /retrieval and /retrieval_summary: needles cut from the text, reproduced or not by each "
        "/e2e run's greedy continuation (latentq.e2e_retrieval)",
    )
    ap.add_argument(
        "--needle-lengths",
        type=int,
        nargs="+",
        default=None,
        help=f"context lengths in tokens (default {' '.join(map(str, needle.DEFAULT_LENGTHS))}, those the model's "
        "max_position_embeddings holds)",
    )
    ap.add_argument(
        "--needle-depths",
        type=float,
        nargs="+",
        default=list(needle.DEFAULT_DEPTHS),
        help=f"needle depths, fractions of context - span (default {' '.join(map(str, needle.DEFAULT_DEPTHS))})",
    )
    ap.add_argument("--needle-span", type=int, default=needle.DEFAULT_SPAN, help="needle tokens, cue included")
    ap.add_argument("--needle-cue", type=int, default=needle.DEFAULT_CUE, help="the needle's first tokens, the cue")
    ap.add_argument("--needle-samples", type=int, default=1, help="samples per (length, depth) (default 1)")


def check_args(a) -> str | None:
    """The error line of a bad retrieval flag value, or None."""
    if a.needle_span < 2 or not 1 <= a.needle_cue < a.needle_span:
        return f"--needle-span {a.needle_span} / --needle-cue {a.needle_cue}: need 1 <= cue < span"
    if a.needle_samples < 1:
        return f"--needle-samples {a.needle_samples}: must be >= 1"
    if bad := [L for L in a.needle_lengths or () if L < a.needle_span]:
        return f"--needle-lengths {bad[0]}: shorter than --needle-span {a.needle_span}"
    if bad := [d for d in a.needle_depths if not 0.0 <= d <= 1.0]:
        return f"--needle-depths {bad[0]}: expected a fraction in [0, 1]"
    return None


def text_tokens(text: bytes, tokenizer) -> np.ndarray:
    """The whole scored text as int64 token ids, tokenized as latentq.e2e_shared.load_tokens tokenizes a window."""
    from latentq.e2e_shared import text_ids

    return np.asarray(text_ids(text, tokenizer), dtype=np.int64)


def prepare(a, text: bytes, model, tokenizer, streamer) -> dict | None:
    """From the scored text (bytes, as read by latentq.e2e_shared.read_text): the needle samples by context
    length (build_samples) when --retrieval is given and the model can run it;
    None (and one note line saying why) for a streamed model, one the step cannot inject into token by token
    (latentq.e2e_generate.unsupported_reason: sparse MLA, hybrid layers) or a text that cannot give the samples
    (shorter than a context and two needles, or no needle whose cue is unique in its context: needle_samples'
    error). Raises ValueError naming --needle-lengths for a length the model cannot hold."""
    if not a.retrieval:
        return None
    from latentq.e2e_generate import unsupported_reason

    why = "the model runs layer by layer (streamed)" if streamer is not None else unsupported_reason(model)
    if why is not None:
        say("e2e", "note", f"--retrieval: no /retrieval group: {why}")
        return None
    tokens = text_tokens(text, tokenizer)
    max_pos = getattr(model.config, "max_position_embeddings", None)
    lengths = a.needle_lengths
    if lengths is None:  # the defaults the model and the text hold (a length given by flag that does not fit: error)
        span = a.needle_span
        fits = lambda L: (max_pos is None or L + span - 1 <= max_pos) and len(tokens) >= L + 2 * span  # noqa: E731
        lengths = [L for L in needle.DEFAULT_LENGTHS if fits(L)]
        if dropped := [L for L in needle.DEFAULT_LENGTHS if not fits(L)]:
            say("e2e", "note", f"--retrieval: context lengths {dropped} not run: over the model's "
                f"max_position_embeddings ({max_pos}) or the text's {len(tokens)} tokens")  # fmt: skip
        if not lengths:
            return None
    try:
        return build_samples(
            tokens, lengths, a.needle_depths, a.needle_span, a.needle_cue, a.needle_samples, SEED, max_pos
        )
    except ValueError as e:  # the text cannot give the samples (too short, too repetitive): the other groups stand
        if str(e).startswith("--needle-lengths"):  # a length the flag named that the model cannot hold
            raise
        say("e2e", "note", f"--retrieval: no /retrieval group: {e}")
        return None


def retrieval_step(a, runner, by_length: dict, auto_batch_runs) -> tuple[dict, float]:
    """({group: write_groups entry} of /retrieval and /retrieval_summary, seconds) for the /e2e runs of `runner`
    (its rows' order): the prefill-at-once runs `auto_batch_runs(config, seq_len, num_seqs)` (latentq.e2e's) at a
    time, the decode-order ones one at a time (as the step batches them)."""
    from latentq.e2e_decode import PREFILL_AT_ONCE
    from latentq.progress import Progress

    t0 = time.time()
    runs = [(r["quantizer"], tuple(r["targets"].split("+")), r["cache_mode"]) for r in runner.rows]
    causal = {(r["quantizer"], r["targets"], r["cache_mode"]): int(r["scale_causal"]) for r in runner.rows}
    longest = max(by_length) + a.needle_span
    K = a.batch_runs or auto_batch_runs(runner.model.config, longest, max(len(g) for g in by_length.values()))
    pre = [r for r in runs if r[2] == PREFILL_AT_ONCE]
    dec = [r for r in runs if r[2] != PREFILL_AT_ONCE]
    rows = []
    with Progress(len(runs) * len(by_length), "e2e", "retrieval forwards") as progress:
        for group, batch in ((pre, K), (dec, a.batch_runs or 1)):
            if group:
                rows += retrieval_rows(
                    runner, group, by_length, batch, lambda r: causal[(r[0], "+".join(r[1]), r[2])], progress
                )
    order = {r: i for i, r in enumerate(runs)}  # the rows in /e2e's order, then by length and depth
    rows.sort(key=lambda r: (order[(r["quantizer"], tuple(r["targets"].split("+")), r["cache_mode"])],
                             int(r["context_len"]), r["depth"]))  # fmt: skip
    seconds = time.time() - t0
    settings = {
        "needle_lengths": ",".join(map(str, by_length)),
        "needle_depths": ",".join(f"{d:g}" for d in a.needle_depths),
        "needle_span": np.int64(a.needle_span),
        "needle_cue": np.int64(a.needle_cue),
        "needle_samples": np.int64(a.needle_samples),
        "needle_seed": np.int64(SEED),
        "text_sha256": a.text_sha256,
        "layers": ",".join(map(str, runner.plan.layers)),
        "seconds": float(seconds),
    }
    return retrieval_groups(rows, settings), seconds
