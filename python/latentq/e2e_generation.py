"""The e2e step's /generation group: free-running greedy generation of each /e2e run against the reference's.

``python -m latentq.e2e --generation`` cuts --gen-prompts prompts of --gen-prompt-len tokens from the step's text
(consecutive windows from --offset-bytes on, latentq.e2e_shared.load_tokens), lets the reference (exact latents)
and every run of /e2e (its quantizer, targets and cache mode) continue each prompt by --gen-new-tokens N greedy
tokens with the incremental decoder (latentq.e2e_generate.greedy_continue: prefill, then one token per step, the
latent cache read in decode order), and compares, per prompt i and run:

  first divergence  d_i = the first position (0-based, of the N generated) where the run's token differs from the
                    reference's; N when none. Free-running greedy decoding amplifies one changed token into a
                    different continuation: the failures serving engines reported with quantized KV caches show
                    up there, e.g. GSM8K accuracy lost over long generations (TensorRT-LLM pull request 16916)
                    and multi-turn conversations degrading (vLLM issue 38652), cited as motivation only.
  identical         a_i = the fraction of the N positions where the run's token equals the reference's.
  KL along the reference trajectory  k_i = mean over the N positions of KL(p_ref || p_q) (nats), both teacher-
                    forced on the reference's tokens through the same incremental path (p_q: the run's cache),
                    so the KL measures the cache at the contexts the reference visits, not after a divergence.

The row's values are the means over prompts of d_i, a_i and k_i, each with a 95% percentile-bootstrap interval
over prompts (latentq.e2e_stats.bootstrap_counts, seed and resamples as /e2e's; the same draws for every row;
NaN with one prompt). bytes_per_token is latentq.e2e_decode.cache_bytes_per_token of the run's cache holding the
prompt and the N tokens (P + N per sequence, the prompts as its sequences). scale_causal 0 flags a spec whose scale
or codebook spans the sequence: latentq.e2e_generate recomputes it on the history at each step.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from latentq.e2e_decode import cache_bytes_per_token
from latentq.e2e_generate import CacheRun, greedy_continue, unsupported_reason
from latentq.e2e_shared import load_tokens
from latentq.e2e_stats import RESAMPLES, SEED, _bounds, bootstrap_counts
from latentq.progress import say
from latentq.result_groups import Column

# torch threads of the decodes: their steps are small GEMMs (one token of 2 x 8 x 4 rows); on the 2-core VM with
# other jobs running, 10 of the default study's runs took 37.6 s on two threads and 6.9 s on one.
GENERATION_THREADS = 1
# Runs per batch of the decodes (each batch: its runs free-running and forced on the reference, 2 x K x prompts rows).
RUNS_PER_BATCH = 8

_CI = "95% percentile-bootstrap interval over prompts, {}: the {} end (NaN with one prompt)"
GENERATION_COLUMNS = (
    Column("quantizer", "string", "", "the quantizer spec of the /e2e run (or its mixed assignment's name)"),
    Column("targets", "string", "", "the cached tensors it quantizes: c_kv, k_pe or c_kv+k_pe"),
    Column("cache_mode", "string", "", "prefill-at-once or decode-r<R>-s<S>-p<P> (latentq/decode_order.h)"),
    Column(
        "first_divergence_mean",
        "float64",
        "token",
        "mean over prompts of the first generated position (0-based) where the run's greedy token differs from "
        "the reference's; new_tokens when none",
    ),
    Column("first_divergence_ci_lo", "float64", "token", _CI.format("first_divergence_mean", "lower")),
    Column("first_divergence_ci_hi", "float64", "token", _CI.format("first_divergence_mean", "upper")),
    Column(
        "identical_fraction",
        "float64",
        "1",
        "fraction of the new_tokens positions of every prompt where the run's greedy token equals the reference's",
    ),
    Column("identical_fraction_ci_lo", "float64", "1", _CI.format("identical_fraction", "lower")),
    Column("identical_fraction_ci_hi", "float64", "1", _CI.format("identical_fraction", "upper")),
    Column(
        "kl_mean",
        "float64",
        "nat",
        "mean over prompts and generated positions of KL(p_ref || p_q), both teacher-forced on the reference's "
        "greedy tokens",
    ),
    Column("kl_mean_ci_lo", "float64", "nat", _CI.format("kl_mean", "lower")),
    Column("kl_mean_ci_hi", "float64", "nat", _CI.format("kl_mean", "upper")),
    Column(
        "bytes_per_token",
        "float64",
        "byte/token",
        "the run's latent cache per token per layer once prompt and new tokens are decoded, mean over the layers",
    ),
    Column(
        "scale_causal",
        "int64",
        "",
        "1 when the spec's quantized values depend on past tokens only; 0: its scale or codebook is recomputed on "
        "the history at every step",
    ),
)


def divergence(ref: torch.Tensor, run: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(first divergence int64 [n], identical fraction float64 [n]) of greedy tokens run vs ref, int [n, N]:
    first[i] = min{j : run[i, j] != ref[i, j]}, N when the rows are equal; identical[i] = mean_j [run == ref]."""
    if ref.shape != run.shape or ref.dim() != 2:
        raise ValueError(f"divergence: token arrays of shapes {tuple(ref.shape)} and {tuple(run.shape)}; need [n, N]")
    diff = (ref != run).cpu().numpy()
    N = diff.shape[1]
    first = np.where(diff.any(1), diff.argmax(1), N).astype(np.int64)
    return first, 1.0 - diff.mean(1)


def kl_per_position(ref: torch.Tensor, q: torch.Tensor) -> np.ndarray:
    """KL(p_ref || p_q) float64 [n, N] (nats) of logits ref, q [n, N, V] (softmax over V in float64)."""
    lr, lq = torch.log_softmax(ref.double(), -1), torch.log_softmax(q.double(), -1)
    return (lr.exp() * (lr - lq)).sum(-1).clamp_min(0.0).numpy()


def mean_and_interval(x: np.ndarray, counts: np.ndarray) -> tuple[float, float, float]:
    """(mean, lo, hi) of per-prompt values x [n]: lo, hi the 95% percentile bounds of the resampled means
    (counts [resamples, n]: latentq.e2e_stats.bootstrap_counts); NaN bounds with one prompt."""
    m = float(x.mean())
    if len(x) < 2:
        return m, float("nan"), float("nan")
    lo, hi = _bounds(counts @ x / len(x))
    return m, lo, hi


def generation_values(first: np.ndarray, identical: np.ndarray, kl: np.ndarray, counts: np.ndarray) -> dict:
    """The metric columns of one row from the per-prompt values first [n], identical [n], kl [n, N]."""
    f = mean_and_interval(first.astype(np.float64), counts)
    a = mean_and_interval(identical, counts)
    k = mean_and_interval(kl.mean(1), counts)
    out = dict(zip(("first_divergence_mean", "first_divergence_ci_lo", "first_divergence_ci_hi"), f))
    out |= dict(zip(("identical_fraction", "identical_fraction_ci_lo", "identical_fraction_ci_hi"), a))
    out |= dict(zip(("kl_mean", "kl_mean_ci_lo", "kl_mean_ci_hi"), k))
    return out


def generation_table(runner, runs: list, prompts: torch.Tensor, new_tokens: int, runs_per_batch: int) -> dict:
    """{column: values} of /generation: one row per run of `runs` ((quantizer, targets, cache_mode), /e2e's), the
    reference's greedy continuation first (exact latents), then the runs `runs_per_batch` at a time, each batch's
    free-running and reference-forced decodes in one batch of rows. runner: the e2e step's Runner (its model,
    latentq module, layers, bases, dims and resolve). Raises ValueError as greedy_continue and for non-finite
    logits."""
    latentq, model, layers, bases = runner.latentq, runner.model, runner.layer_set, runner.bases
    n, P = prompts.shape
    ref_tok, ref_logits = greedy_continue(
        model, latentq, [None], prompts, new_tokens, layers=layers, bases=bases, return_logits=True
    )
    ref_tok, ref_logits = ref_tok[0], ref_logits[0]
    if not torch.isfinite(ref_logits).all():
        raise ValueError("the reference's generation (exact latents) has non-finite logits")
    counts = bootstrap_counts(n, RESAMPLES, SEED)
    cols: dict[str, list] = {c.name: [] for c in GENERATION_COLUMNS}
    memo: dict = {}
    for i in range(0, len(runs), runs_per_batch):
        chunk = runs[i : i + runs_per_batch]
        cache_runs = [CacheRun(runner.resolve(q), t, m) for q, t, m in chunk]
        K = len(cache_runs)
        forced = [None] * K + [ref_tok] * K
        tok, logits = greedy_continue(
            model,
            latentq,
            cache_runs + cache_runs,
            prompts,
            new_tokens,
            forced=forced,
            layers=layers,
            bases=bases,
            return_logits=True,
        )
        for k, ((q, t, mode), run) in enumerate(zip(chunk, cache_runs)):
            lq = logits[K + k]
            if not torch.isfinite(lq).all():
                raise ValueError(f"the generation with {q} latents ({'+'.join(t)}, {mode}) has non-finite logits")
            first, identical = divergence(ref_tok, tok[k])
            values = generation_values(first, identical, kl_per_position(ref_logits, lq), counts)
            specs = [run.spec] if isinstance(run.spec, str) else sorted(set(run.spec.values()))
            bpt = cache_bytes_per_token(
                latentq, run.spec, t, sorted(layers), mode, runner.dims, P + new_tokens, n, memo
            )
            row = {
                "quantizer": q,
                "targets": "+".join(t),
                "cache_mode": mode,
                **values,
                "bytes_per_token": bpt,
                "scale_causal": int(all(latentq.decode_scale_is_causal(s) for s in specs)),
            }
            for c, v in row.items():
                cols[c].append(v)
    types = {"string": object, "float64": np.float64, "int64": np.int64}
    return {c.name: np.array(cols[c.name], dtype=types[c.dtype]) for c in GENERATION_COLUMNS}


def generation_group(
    a, runner, prompts: torch.Tensor, runs_per_batch: int = RUNS_PER_BATCH
) -> tuple[tuple, dict, dict, float]:
    """(record, values, attrs, seconds) of write_groups' /generation entry for the /e2e runs of `runner` (its
    rows' order): module docstring. a: the step's namespace (gen_prompts, gen_prompt_len, gen_new_tokens,
    offset_bytes)."""
    t0 = time.time()
    runs = [(r["quantizer"], tuple(r["targets"].split("+")), r["cache_mode"]) for r in runner.rows]
    threads = torch.get_num_threads()
    torch.set_num_threads(GENERATION_THREADS)
    try:
        values = generation_table(runner, runs, prompts, a.gen_new_tokens, runs_per_batch)
    finally:
        torch.set_num_threads(threads)
    seconds = time.time() - t0
    attrs = {
        "num_prompts": np.int64(prompts.shape[0]),
        "prompt_len": np.int64(prompts.shape[1]),
        "new_tokens": np.int64(a.gen_new_tokens),
        "prompt_source": f"consecutive windows of prompt_len tokens of the step's text from byte {a.offset_bytes}",
        "layers": ",".join(map(str, runner.plan.layers)),
        "decoding": "greedy (argmax, first maximum on ties), no stop token; prefill of the prompt in one forward, "
        "then one token per step over the stored latent history read in decode order (latentq.e2e_generate)",
        "definition": "first_divergence: first generated position where the run's token differs from the "
        "reference's (new_tokens when none), motivated by the long-generation and multi-turn failures reported "
        "with quantized KV caches (TensorRT-LLM pull request 16916, vLLM issue 38652); identical_fraction: "
        "positions with the reference's token; kl_mean: KL(p_ref||p_q) per generated position, teacher-forced on "
        "the reference's tokens; scale_causal 0: the scale or codebook is recomputed on the history at every "
        "step (latentq.e2e_generate)",
        "bootstrap_seed": np.int64(SEED),
        "bootstrap_resamples": np.int64(RESAMPLES),
        "bootstrap_interval": "95% percentile bootstrap over the prompts, the same draws for every row; NaN with "
        "one prompt",
        "runs_per_batch": np.int64(runs_per_batch),
        "threads": np.int64(GENERATION_THREADS),
        "seconds": float(seconds),
    }
    return GENERATION_COLUMNS, values, attrs, seconds


def prepare(a, text: bytes, model, tokenizer, streamer) -> torch.Tensor | None:
    """From the scored text (bytes, as read by latentq.e2e_shared.read_text): the prompts int64
    [gen_prompts, gen_prompt_len] on the model's device when --generation is given and the
    model can run it; None (and one note line saying why) for a streamed model or one latentq.e2e_generate cannot
    decode (sparse MLA, hybrid layers). Checked before the step's runs. Raises ValueError naming the flag when
    prompt + new tokens exceed the model's max_position_embeddings or the text is too short; with
    ``--generation auto`` those give a note and None instead."""
    if not a.generation:
        return None
    why = "the model runs layer by layer (streamed)" if streamer is not None else unsupported_reason(model)
    if why is not None:
        say("e2e", "note", f"--generation: no /generation group: {why}")
        return None
    P, N = a.gen_prompt_len, a.gen_new_tokens
    try:
        return _prompts(a, text, model, tokenizer, P, N)
    except ValueError as e:
        if a.generation != "auto":
            raise
        say("e2e", "note", f"--generation: no /generation group: {e}")
        return None


def _prompts(a, text: bytes, model, tokenizer, P: int, N: int) -> torch.Tensor:
    """prepare's prompts; raises its ValueErrors."""
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos is not None and P + N > max_pos:
        raise ValueError(
            f"--gen-prompt-len {P} + --gen-new-tokens {N} exceeds max_position_embeddings {max_pos} of {a.model}"
        )
    vocab = getattr(model.config, "vocab_size", None) or model.get_output_embeddings().weight.shape[0]
    try:
        ids = load_tokens(text, a.offset_bytes, tokenizer, P, a.gen_prompts, vocab)
    except ValueError as e:
        raise ValueError(f"--generation prompts ({a.gen_prompts} x {P}): {e}") from None
    return ids.to(next(model.parameters()).device)
