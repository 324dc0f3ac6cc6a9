"""End-to-end check: run an MLA model (tiny-mla, or an HF DeepseekV2 / DeepseekV3 / GLM-4 MoE Lite /
MiniCPM3 checkpoint) on held-out text with each quantizer in its latent cache, and measure what
reaches the logits.

    .venv/bin/python -m latentq.e2e --results results/default.h5 [--model DIR]
        [--device cpu|cuda] [--dtype float32|bfloat16|float16] [--text FILE]
        [--cache-modes prefill-at-once decode-r32-s4-p0 ...] [--decode-quantizers SPEC ...]
        [--e2e frontier|all] [--budgets 1/16,1/8,1/4,3/8,1/2]

Cache modes (latentq/decode_order.h, through the `latentq` Python module; the rule is not restated
here):
  prefill-at-once  for the quantizers of the study in RESULTS.h5 (the `quantizer` column of
    /latent_error, in order; or --quantizers) that can win (--e2e frontier, the default: the decision's
    best or runner-up at some budget of --budgets by the cheap probes' ranking with a margin, and every
    engine format, mixed assignment and bf16: latentq.e2e_frontier; the others are listed in group
    /e2e_not_run with the format that dominates them; --e2e all: every one): c_kv is replaced at the
    output of `kv_a_layernorm` and k_pe after RoPE (latentq.inject.LatentInjector) by its quantize-dequantize through
    the C++ quantizers, each window's whole prefill at once (per-channel groups and per-tensor
    scales see later tokens of the window): the study's rows.
  decode-r<R>-s<S>-p<P>  the cache as a serving engine builds it token by token: the query at t
    reads key j from the quantized cache iff latentq.decode_order_mask(mode, L, G)[t, j]
    (G = latentq.decode_token_group(spec)), else in bf16; the two reads are
    latentq.decode_order_latents(x, spec, mode, target, seq_offsets). A token's hidden state at
    every layer is computed when that token is processed, so one causal forward whose attention
    mixes the two reads per (t, j) (latentq.inject.DecodeOrderAttention) is token-by-token decode
    with a quantized cache, exactly (tests/python/test_e2e_decode.py checks it against a literal
    decode loop). Run for the quantizers × modes of the root attributes decode_order_quantizers ×
    decode_order_modes that the C++ study writes from its [decode_order] section, else of
    --decode-quantizers × --cache-modes (flags win; --decode-quantizers defaults to the
    prefill-at-once quantizers), on each target set of the root attribute decode_order_targets
    ("c_kv", "k_pe", "c_kv+k_pe": the /attention_position rows' targets; absent: the targets the study
    ran that quantizer on). Under --e2e frontier the decode-order runs of a format the frontier leaves out
    are left out with it and listed in /e2e_not_run (the decision reads no decode-order row), unless
    --decode-quantizers names them.
Quantized layers: the MLA layers the study ran (the root attribute `layers` of RESULTS.h5, else the
`layer` column of /latent_error; recorded in the /e2e attribute `layers`), for the targets the study
ran that quantizer on (c_kv+k_pe for a spec the study did not run, with a warning); a run that would
quantize a target its format cannot take (the study's /not_applicable, e.g. q8_0 on a k_pe of 16
elements) is left out, with one note per target, width and reason. A transformed
quantizer ('had,int4-asym-token', 'rot,mxfp4') quantizes the rotated rows and reads them
un-rotated (latentq/transform.h); a 'klt,...' quantizer rotates by the KLT basis the study fitted, refitted
from the study's dump (the root attributes input_path / input_sha256; latentq.fitted_basis), an 'sklt,...' one
by the score-metric KLT likewise; both are left out with a note when that dump is not there.

Group /e2e: one row per (quantizer, targets, cache_mode), its columns E2E_COLUMNS (their units and
definitions, stored in the group's column record: latentq.result_groups): the means, the spread of the
per-token values (KL percentiles and maximum, Δp mean and RMS, ln ppl ratio, as llama.cpp's KL-divergence mode
defines them) and 95% intervals of kl_mean, top1_agree, ln_ppl_ratio and delta_p_rms by a bootstrap over
sequences, the same draws for every row (latentq.e2e_stats; the attributes bootstrap_seed and
bootstrap_resamples). bytes_per_token counts the bf16 tokens of the decode order at 2 bytes/element, the
quantized ones at the format's bytes per token (QuantizedTensor.bytes_per_token), a target not quantized at 2
bytes/element. Group /e2e_position: the same runs by query position, W = the root attribute
decode_order_position_bucket (else --position-bucket, default 64), its columns E2E_POSITION_COLUMNS (the means
and the spread, no intervals); they follow the C++ /attention_position group where the two share a meaning.
Groups /e2e_seq and /e2e_bootstrap: each run's KL summed per sequence and the shared draws, for paired
comparisons of two runs (latentq.e2e_stats.paired_groups; the decision's best vs runner-up).
The reference is the model's own run with exact latents; no metric is computed from non-finite
logits. Forwards: --batch-runs K runs share one forward of K × num_seqs sequences (the ids repeated
K times), run k's quantizer on rows k·num_seqs .. (k+1)·num_seqs - 1 with its own per-sequence offsets
(batch_inject, batch_decode_cache), the reference with the first prefill-at-once runs; the default
(auto) batches the prefill-at-once runs under a memory bound (auto_batch_runs) and runs the
decode-order runs one per forward. The tables do not depend on K beyond float32 rounding
(tests/python/test_e2e_batch.py); a run that fails inside a batch is replayed alone, for the error of
an unbatched run. The file is updated through a temporary copy and a rename, so an interrupted run leaves
the previous file intact; user errors exit 2 with one line and write nothing.

Models larger than memory (``--stream auto|on|off``, ``--memory-budget``; the rule of latentq.dump,
latentq.model.stream_decision: auto streams when the weights in the compute dtype exceed the budget): the checkpoint
runs layer by layer (latentq.stream.LayerStreamer: the model on the meta device, each decoder layer read
from the shards right before it runs and freed after), every forward of the step (the reference and each batch
of runs, the same chunks as in memory) through layer i before layer i+1, the hidden states on the host
(a temporary file beside RESULTS.h5 when they exceed the budget). The rows are those of the in-memory
step on the same runs (tests/python/test_e2e_stream.py); the progress then counts layers, and the
attribute ``execution`` of /e2e records which way it ran ("in memory", "layer streaming (hidden states
in memory)" or "... in a file)").

Group /generation (--generation; --gen-prompts, --gen-prompt-len, --gen-new-tokens): free-running greedy
continuations of prompts cut from the text under every /e2e run's cache against the reference's, by the
incremental decoder latentq.e2e_generate (the cache read in decode order, one token per step); its columns and
definitions: latentq.e2e_generation. Dense MLA in memory only: a streamed, sparse MLA or hybrid model gets one note
line and no group (a DeepSeek-V4 one too).

Groups /retrieval and /retrieval_summary (--retrieval; --needle-lengths, --needle-depths, --needle-span,
--needle-cue, --needle-samples): needles cut from the text (latentq.needle), reproduced or not by every /e2e run's
greedy continuation, decided by one teacher-forced forward through this step's own hooks; the reference's successes
on the same samples beside each run's; latentq.e2e_retrieval. The same models as /generation.

DeepSeek-V4 (a checkpoint whose config.json has model_type deepseek_v4): the step hands over to latentq.e2e_v4 (its
window, compressed and indexer-key caches, any subset, prefill and decode order; --caches for an assignment per run).

Text: by default the held-out split of the KJV text (latentq.kjv_text); tokens from byte
`--offset-bytes` on (the shipped dump reads the first 4 × 512 bytes, so the default 2048 keeps the
two apart): the bytes for tiny-mla, the checkpoint's tokenizer for an HF model that has one (no
special tokens; else the bytes), `--num-seqs` windows of `--seq-len` tokens.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

import numpy as np
import torch

from latentq import e2e_args, e2e_frontier, e2e_generation, e2e_retrieval
from latentq.capture import find_mla_layers, mla_dims
from latentq.e2e_args import ROOT  # noqa: F401  (re-exported)
from latentq.e2e_decode import (  # noqa: F401  (re-exported: the tests and bench/e2e_rate.py use latentq.e2e.*)
    DECODE_TARGETS,
    PREFILL_AT_ONCE,
    batch_decode_cache,
    cache_bytes_per_token,
    make_decode_cache,
    mode_rsp,
    spec_at,
)
from latentq.e2e_results import (  # noqa: F401  (re-exported: the tests use latentq.e2e.*)
    applicable_only,
    canonical_specs,
    decode_settings,
    mixed_specs,
    open_results,
    planned_runs,
    study_indexer_quantizers,
    study_layers,
    study_quantizers,
)
from latentq.e2e_shared import (  # noqa: F401  (re-exported: the tests and latentq.e2e_v4's users read latentq.e2e.*)
    E2E_COLUMNS,
    E2E_POSITION_COLUMNS,
    REF,
    execution_attrs,
    load_tokens,
    position_rows,
    read_text,
    require_finite_logits,
)
from latentq.e2e_stats import (
    RESAMPLES,
    SEED,
    bootstrap_counts,
    interval_columns,
    paired_groups,
    run_metrics,
    token_stats,
)
from latentq.fitted_basis import StudyBases, needs_basis, transform_of
from latentq.inject import DecodeOrderAttention, LatentInjector
from latentq.model import DTYPES, device_error, load_model, load_tokenizer, run_model, stream_plan
from latentq.progress import Progress, message, say
from latentq.result_groups import write_groups

V4_MODEL_TYPE = "deepseek_v4"  # latentq.e2e_v4.MODEL_TYPE, whose module is imported only for such a checkpoint


def checkpoint_model_type(path: str) -> str | None:
    """The model_type of a checkpoint directory's config.json; None when it is unreadable or names none. main
    asks it before importing latentq.e2e_v4, whose model code imports transformers (2-4 s on 2 cores)."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            t = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return t if isinstance(t, str) else None


def parse_args(argv=None):
    """The command line (latentq.e2e_args, this docstring as its help): the namespace, or 2 after one error line."""
    return e2e_args.parse_args(argv, __doc__)


def import_latentq():
    """The `latentq` package with its compiled part latentq._core (the C++ quantizers). Raises
    SystemExit saying how to build it when _core does not import."""
    import latentq

    try:
        importlib.import_module("latentq._core")
    except ImportError as e:
        raise SystemExit(
            message(
                "e2e",
                "error",
                f"cannot import the compiled latentq Python module latentq._core ({e}); {latentq.BUILD_HINT}",
            )
        ) from None
    return latentq


def make_inject(latentq, spec, targets: tuple[str, ...], layers=None, bases=None):
    """Injection callback: quantize-dequantize c_kv / k_pe / a DSA indexer's key index_k [B, T, D] per layer,
    one sequence per batch row (index_k: the spec's c_kv format, as the C++ [indexer] probe stores it); only
    the layers in `layers` (None: every layer). `spec` is a spec string, or a dict {(layer, target): spec}
    for a mixed assignment (mixed_specs()): a layer it lacks is left exact.
    `bases(layer, target, transform)`: the basis of a 'klt,' / 'sklt,' spec (latentq.fitted_basis.StudyBases)."""

    def fn(layer: int, name: str, x: torch.Tensor) -> torch.Tensor:
        if name not in targets or (layers is not None and layer not in layers):
            return x
        s = spec if isinstance(spec, str) else spec.get((layer, name))
        if s is None:
            return x
        B, T, D = x.shape
        flat = x.detach().to("cpu", torch.float32).reshape(B * T, D).contiguous().numpy()
        offs = [b * T for b in range(B + 1)]
        if name == "index_k":  # the DSA indexer key: one format (a preset's c_kv part), no fitted basis
            if needs_basis(s):
                raise ValueError(f"{s}: the indexer key cache (index_k) takes no fitted transform (klt, sklt)")
            return torch.from_numpy(latentq.quantize_dequantize(flat, s, "c_kv", offs, None)).reshape(B, T, D)
        basis = bases(layer, name, transform_of(s)) if needs_basis(s) else None
        y = latentq.quantize_dequantize(flat, s, name, offs, basis)
        return torch.from_numpy(y).reshape(B, T, D)

    return fn


def logit_metrics(ref: torch.Tensor, q: torch.Tensor, ids: torch.Tensor, what: str = "the quantized run") -> dict:
    """ref, q: [B, T, V] float32 logits; ids [B, T] int64. The /e2e values of latentq.e2e_stats.run_metrics
    (KL and top-1 over all B·T positions, NLL and Δp on next-token targets, positions 0..T-2). Raises
    ValueError when ref or q has NaN/Inf (require_finite_logits; `what` names the run of q)."""
    require_finite_logits(ref, "the reference run (exact latents)")
    require_finite_logits(q, what)
    return run_metrics(token_stats(ref, q, ids))


def batch_inject(fns: list, n: int):
    """Injection callback for K runs in one forward (LatentInjector): the batch [K·n, T, D] holds run k's
    n sequences at rows k·n .. (k+1)·n - 1 (the ids repeated K times), and run k's callback fns[k]
    (make_inject; None: the exact latents, the reference run) sees only those rows. Each run's
    quantizer therefore gets the same [n, T, D] rows and sequence offsets as when it runs alone: the
    same quantized values, bit for bit (make_inject's offsets are per sequence, never across rows)."""

    def fn(layer: int, name: str, x: torch.Tensor) -> torch.Tensor:
        parts = []
        for k, f in enumerate(fns):
            xs = x[k * n : (k + 1) * n]
            parts.append(xs if f is None else f(layer, name, xs).to(dtype=x.dtype, device=x.device))
        return torch.cat(parts)

    return fn


# Memory bound of --batch-runs 0 (auto): the activations of one forward of K runs stay under this.
BATCH_BYTES = 768 << 20


def auto_batch_runs(config, seq_len: int, num_seqs: int, budget: int = BATCH_BYTES) -> int:
    """K of the prefill-at-once runs for --batch-runs 0: the largest K in 1..16 with
    K · num_seqs · (bytes per sequence) <= budget, where
    a sequence of T = seq_len tokens takes 4 · T · (8·hidden + 3·intermediate + 4·vocab) bytes (float32
    hidden states, MLP, logits and their copies) + 4 · 5 · H · T² (float32 [H, T, T] scores, probabilities
    and masked copies of an attention that materializes them: SDPA's math path, e.g. a model whose v head dim
    differs from q's; tiny-mla pads v so that the flash kernel runs); a rough upper estimate (tiny-mla,
    K = 4: the step's peak RSS 0.66 GB; 1.15 GB with the decode-order runs batched by 4 too). config: the
    model config (hidden_size, intermediate_size, vocab_size, num_attention_heads). tiny-mla, 4 x 512:
    46 MB per sequence, K = 4 (about 740 MB)."""
    g = lambda k, d=0: int(getattr(config, k, None) or d)
    inter = max(g("intermediate_size"), g("moe_intermediate_size") * max(1, g("num_experts_per_tok", 1)))
    per_seq = (
        4 * seq_len * (8 * g("hidden_size") + 3 * inter + 4 * g("vocab_size"))
        + 4 * 5 * g("num_attention_heads", 1) * seq_len * seq_len
    )
    return int(max(1, min(16, budget // max(1, num_seqs * per_seq))))


class Plan:
    """What the step runs, from RESULTS.h5 and the flags: the prefill-at-once (quantizer, targets) pairs,
    the decode-order ones, the cache modes (with their (R, S, P)), the /e2e_position bucket width and the
    study's layers (None: every MLA layer of the model)."""

    def __init__(self, a, latentq):
        """Raises ValueError naming the file or flag (a spec, mode or target the study cannot have)."""
        self.latentq = latentq
        self.pairs = study_quantizers(a.results) + planned_runs(a.results)  # the plan's mixed runs (/plan_runs)
        self.layers = study_layers(a.results)
        attr_modes, attr_qs, attr_w, attr_tg = decode_settings(a.results)
        known = dict(self.pairs)

        def with_targets(specs: list[str], flag: str, decode: bool = False) -> list[tuple[str, tuple[str, ...]]]:
            out = []
            for c in canonical_specs(latentq, specs, flag):
                if c not in known:  # decode runs with decode_order_targets take those targets (below)
                    tg = "those of decode_order_targets" if decode and attr_tg is not None else "c_kv+k_pe"
                    say(
                        "e2e",
                        "warning",
                        f"quantizer {c} is not in the study of {a.results}; its targets default to {tg}",
                    )
                out.append((c, known.get(c, ("c_kv", "k_pe"))))
            return out

        if a.quantizers:
            self.pairs = with_targets(a.quantizers, "--quantizers")
        # the DSA indexer key cache alone (prefill at once): the study's formats, or the flag's
        index = study_indexer_quantizers(a.results)
        if a.indexer_quantizers is not None:
            if a.indexer_quantizers and not index:
                raise ValueError(
                    f"--indexer-quantizers: {a.results} has no /indexer_error (a dense MLA study: no DSA indexer)"
                )
            index = canonical_specs(latentq, a.indexer_quantizers, "--indexer-quantizers")
        self.index_pairs = [(q, ("index_k",)) for q in index]
        self.modes = a.cache_modes if a.cache_modes is not None else (attr_modes or [PREFILL_AT_ONCE])
        self.rsp = {m: mode_rsp(latentq, m) for m in self.modes}
        self.decode_modes = [m for m in dict.fromkeys(self.modes) if m != PREFILL_AT_ONCE]
        if a.decode_quantizers is not None:
            self.decode_pairs = with_targets(a.decode_quantizers, "--decode-quantizers", decode=True)
        elif attr_qs is not None:
            self.decode_pairs = with_targets(attr_qs, f"{a.results}: decode_order_quantizers", decode=True)
        else:
            self.decode_pairs = list(self.pairs)
        self.decode_named = a.decode_quantizers is not None  # named by the flag: they all run, no frontier
        if attr_tg is not None:  # the study's [decode_order].targets: one run per quantizer, target set and mode
            self.decode_pairs = [(q, tuple(t.split("+"))) for q, _ in self.decode_pairs for t in attr_tg]
        self.pairs, self.decode_pairs, notes = applicable_only(a.results, self.pairs, self.decode_pairs)
        for n in notes:
            say("e2e", "note", n)
        self.width = a.position_bucket or attr_w or 64
        if self.width < 1:
            raise ValueError(f"{a.results}: decode_order_position_bucket {self.width}: must be >= 1")
        self.bases = StudyBases(latentq, a.results)  # the klt / sklt bases, fitted when first used
        self.uses_bases = False  # set by runs(): a run to make needs one

    def fitted_specs(self, a, quantizers: list[str]) -> list[str]:
        """The spec strings these quantizers quantize with: each itself, or a mixed assignment's stored specs."""
        out = []
        for q in quantizers:
            try:
                self.latentq.canonical_spec(q)
                out.append(q)
            except ValueError:  # a mixed assignment: the specs of its rows
                out += list(mixed_specs(a.results, q).values())
        return out

    def runs(self, a) -> list[tuple[str, tuple[str, ...], str]]:
        """(quantizer, targets, cache_mode) of every run, in the rows' order. The klt / sklt quantizers (and
        mixed rows with such a rule) run behind the study's bases (self.bases, refitted from the study's dump);
        where the dump cannot give one (gone, or no query rows for sklt) they are left out, a note saying why.
        --e2e frontier (without --quantizers): the prefill-at-once quantizers latentq.e2e_frontier.select leaves
        out do not run, nor their decode-order runs unless --decode-quantizers names them
        (latentq.e2e_frontier.leave_out_decode); self.frontier lists both."""
        why: dict[str, str] = {}  # quantizer -> why its basis cannot be fitted
        fitted = set()  # quantizers that run behind a fitted basis
        for q, _ in self.pairs + self.decode_pairs:
            for s in filter(needs_basis, self.fitted_specs(a, [q])):
                fitted.add(q)
                if reason := self.bases.why_not(transform_of(s), self.layers):
                    why[q] = reason
        for reason in dict.fromkeys(why.values()):
            qs = sorted(q for q, r in why.items() if r == reason)
            say(
                "e2e",
                "note",
                f"{len(qs)} klt/sklt quantizer(s) not injected ({reason}; their basis is "
                f"fitted on the dump's fit split): {', '.join(qs)}",
            )
        self.frontier, off = None, set()  # off: the prefill-at-once quantizers the frontier leaves out
        pre = [(q, t) for q, t in self.pairs if q not in why]
        if a.selection == "frontier" and not a.quantizers and pre:
            self.frontier = e2e_frontier.select(a.results, self.latentq, pre, a.budget_fractions)
            off = {n.quantizer for n in self.frontier.not_run}
        runs = [(q, t, PREFILL_AT_ONCE) for q, t in self.pairs if q not in why and q not in off]
        runs += [(q, t, PREFILL_AT_ONCE) for q, t in self.index_pairs if q not in why]
        if PREFILL_AT_ONCE not in self.modes and a.cache_modes is not None:
            runs = []
        dec = [(q, t, m) for m in self.decode_modes for q, t in self.decode_pairs if q not in why]
        if self.frontier is not None and not self.decode_named:  # the decision reads no decode-order row
            self.frontier, dec = e2e_frontier.leave_out_decode(self.frontier, dec)
        runs += dec
        self.uses_bases = any(r[0] in fitted for r in runs)  # main checks the dump before the first forward
        return runs


def load_inputs(a, plan: Plan, text: bytes):
    """From the scored text (latentq.e2e_shared.read_text's bytes, read by main before the model): (model on
    --device, its tokenizer or None, ids [num_seqs, seq_len] on the device, MLA dims, the
    model's MLA layers, the LayerStreamer or None); plan.layers defaults to the MLA layers. Streaming
    (--stream, decided by latentq.model.stream_plan as the dump decides it): the model is the
    streamer's meta model, nothing loaded yet. Raises ValueError (no CUDA, no
    config.json, a checkpoint that cannot be streamed, windows the model or text cannot hold, study
    layers the model lacks), OSError, RuntimeError."""
    if why_not := device_error(a.device):
        raise ValueError(why_not)
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        raise ValueError(f"--model {a.model}: no config.json (expected a tiny-mla or HF MLA checkpoint directory)")
    from latentq.stream import CheckpointError, LayerStreamer

    stream, why, budget = stream_plan(a.stream, a.memory_budget, a.model, DTYPES[a.dtype])  # ModelError: ValueError
    streamer = None
    if stream:  # in memory is the usual way: no line for it
        say("e2e", "note", f"layer streaming ({why})")
    try:
        if stream:
            spill = os.path.dirname(os.path.abspath(a.results))
            streamer = LayerStreamer(
                a.model,
                DTYPES[a.dtype],
                device=a.device,
                memory_budget=budget,
                spill_dir=spill if os.path.isdir(spill) else None,
                trust_remote_code=a.trust_remote_code,
            )
            model, tokenizer = streamer.model, load_tokenizer(a.model, a.trust_remote_code, a.tokenizer)
        else:
            model, _cfg, _src, _rev, _orig, tokenizer = load_model(
                a.model, DTYPES[a.dtype], a.trust_remote_code, tokenizer=a.tokenizer
            )
            model = model.to(a.device)
    except CheckpointError as e:
        raise ValueError(str(e)) from None
    mla = find_mla_layers(model)
    dims = mla_dims(mla[0][2])
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos is not None and a.seq_len > max_pos:
        raise ValueError(f"--seq-len {a.seq_len} exceeds max_position_embeddings {max_pos} of the model {a.model}")
    vocab = getattr(model.config, "vocab_size", None) or model.get_output_embeddings().weight.shape[0]
    ids = load_tokens(text, a.offset_bytes, tokenizer, a.seq_len, a.num_seqs, vocab).to(a.device)
    model_layers = sorted(i for i, _, _ in mla)
    if plan.layers is None:
        plan.layers = model_layers
    bad = [l for l in plan.layers if l not in model_layers]
    if bad:
        raise ValueError(
            f"{a.results}: study layer(s) {bad} not in the model {a.model} "
            f"(MLA layers {model_layers[0]}..{model_layers[-1]})"
        )
    return model, tokenizer, ids, dims, model_layers, streamer


class Runner:
    """The forwards of the step and the rows they give. ``forward(chunk)``: the logits of a chunk of runs
    (REF or (quantizer, targets, cache_mode)) sharing one forward; ``record(run, logits)`` turns a run's
    logits into its /e2e row and /e2e_position rows (the reference first); ``run_all(chunks)`` does both
    for every chunk, replaying a chunk run by run when a quantizer refuses its input."""

    def __init__(self, latentq, a, model, ids: torch.Tensor, plan: Plan, dims: dict):
        self.latentq, self.a, self.model, self.ids, self.plan, self.dims = latentq, a, model, ids, plan, dims
        self.layer_set, self.bases = frozenset(plan.layers), plan.bases
        self.rows, self.pos_rows = [], []
        self.ref = None
        self.bpt_memo: dict = {}
        # per run, its per-token values (latentq.e2e_stats.TokenStats: B x T float64 each, no vocabulary axis),
        # for paired comparisons of runs (e2e_stats.paired_difference); the bootstrap draws every run shares
        self.run_stats: dict = {}
        self.draws = None
        self.progress = None  # a latentq.progress.Progress over the runs (the reference not counted)
        self.counts_runs = True  # False: the progress counts something else (streamed: layers)

    def resolve(self, spec):
        """A spec string as is, or a mixed assignment's {(layer, target): spec} from /latent_error."""
        try:
            self.latentq.canonical_spec(spec)
            return spec
        except ValueError:  # a mixed assignment: its spec per (layer, target) from /latent_error
            return mixed_specs(self.a.results, spec)

    def hooks(self, chunk):
        """The hooks of one forward of `chunk` (None for the reference alone): a LatentInjector for
        prefill-at-once runs, a DecodeOrderAttention for decode-order runs, each run's quantizer on its
        own num_seqs rows of the batch (batch_inject, batch_decode_cache) when the chunk has several."""
        latentq, layer_set, n = self.latentq, self.layer_set, self.ids.shape[0]
        if len(chunk) == 1 and chunk[0] is REF:
            return None
        hows = [None if r is REF else self.resolve(r[0]) for r in chunk]
        if len(chunk) == 1:  # one run: the hooks of that run alone
            spec, targets, mode = chunk[0]
            if mode == PREFILL_AT_ONCE:
                return LatentInjector(self.model, make_inject(latentq, hows[0], targets, layer_set, self.bases))
            return DecodeOrderAttention(
                self.model, make_decode_cache(latentq, hows[0], targets, layer_set, mode, self.bases)
            )
        if chunk[-1][2] == PREFILL_AT_ONCE:
            fns = [
                None if r is REF else make_inject(latentq, h, r[1], layer_set, self.bases) for r, h in zip(chunk, hows)
            ]
            return LatentInjector(self.model, batch_inject(fns, n))
        caches = [make_decode_cache(latentq, h, r[1], layer_set, r[2], self.bases) for r, h in zip(chunk, hows)]
        return DecodeOrderAttention(self.model, batch_decode_cache(caches, n))

    def batch_ids(self, chunk) -> torch.Tensor:
        """The input ids of one forward of `chunk`: [len(chunk) · num_seqs, seq_len]."""
        return self.ids.repeat(len(chunk), 1) if len(chunk) > 1 else self.ids

    def forward(self, chunk) -> list[torch.Tensor]:
        """The logits [n, T, V] (float32, CPU) of each run of `chunk` (REF: the exact latents)."""
        hooks, n = self.hooks(chunk), self.ids.shape[0]
        if hooks is None:
            return [run_model(self.model, self.ids).float().cpu()]
        with hooks:
            out = run_model(self.model, self.batch_ids(chunk)).float().cpu()
        return list(out.split(n)) if len(chunk) > 1 else [out]

    def run_streamed(self, streamer, chunks, after=None) -> None:
        """forward + record for every chunk, layer-major (latentq.stream.LayerStreamer.run): each chunk's
        batch is one input of the streamer, so layer i's weights are loaded once and every forward of the
        step (the reference, each batch of runs) goes through layer i before layer i+1. Before layer i runs
        input n, the hooks of chunk n are installed (those of the previous input removed) and their
        records of other layers dropped, so at most one layer's captured tensors are held. The logits of
        each input, after the final norm and head, are split into its runs and recorded in the chunks'
        order, the reference first: the rows, and each run's arithmetic, are those of ``run_all`` with
        the same chunks. A run the quantizers refuse stops the step (ValueError) without the unbatched
        replay of ``run_all``: the error is the quantizer's, the rows before it are not written.
        ``after(i)``: called once layer i has run every input (progress)."""
        hooks = [self.hooks(c) for c in chunks]
        active: list = [None]

        def use(n: int | None) -> None:
            h = None if n is None else hooks[n]
            if active[0] is not h:
                if active[0] is not None:
                    active[0].__exit__(None, None, None)
                    active[0].clear()
                if h is not None:
                    h.__enter__()
                active[0] = h
            if h is not None:
                h.clear()  # the records of the layer before: not needed again

        def on_logits(n: int, logits: torch.Tensor) -> None:
            use(None)
            out = logits.float().cpu()
            for run, q in zip(chunks[n], out.split(self.ids.shape[0]) if len(chunks[n]) > 1 else [out]):
                self.record(run, q)

        try:
            with torch.no_grad():
                streamer.run(
                    [self.batch_ids(c) for c in chunks], before=lambda i, n: use(n), after=after, on_logits=on_logits
                )
        finally:
            use(None)

    def record(self, run, q: torch.Tensor) -> None:
        """The rows of one run from its logits q (the reference's logits are kept for the others)."""
        a, latentq, plan = self.a, self.latentq, self.plan
        if run is REF:
            require_finite_logits(q, f"the reference run (exact latents) of {a.model}")
            self.ref = q
            return
        spec, targets, mode = run
        how = self.resolve(spec)
        require_finite_logits(q, f"the run with {spec} latents ({'+'.join(targets)}, {mode})")
        stats = token_stats(self.ref, q, self.ids)
        if self.draws is None:  # the same draws for every run: their intervals are paired
            self.draws = bootstrap_counts(stats.num_seqs, RESAMPLES, SEED)
        self.run_stats[run] = stats
        m = run_metrics(stats) | interval_columns(stats, self.draws)
        specs = [how] if isinstance(how, str) else sorted(set(how.values()))
        causal = all(latentq.decode_scale_is_causal(s) for s in specs)
        bpt = cache_bytes_per_token(
            latentq, how, targets, plan.layers, mode, self.dims, a.seq_len, a.num_seqs, self.bpt_memo
        )
        self.rows.append(
            {
                "quantizer": spec,
                "targets": "+".join(targets),
                "cache_mode": mode,
                **m,
                "bytes_per_token": bpt,
                "scale_causal": np.int64(causal),
            }
        )
        R, S, P = plan.rsp.get(mode, (0, 0, 0))
        for r in position_rows(stats, plan.width):
            self.pos_rows.append(
                {
                    "quantizer": spec,
                    "targets": "+".join(targets),
                    "cache_mode": mode,
                    "residual": R,
                    "sink": S,
                    "prefill": P,
                    "scale_causal": np.int64(causal),
                    **r,
                    "bytes_per_token": bpt,
                }
            )
        line = (
            f"  {spec:28s} {mode:20s} KL {m['kl_mean']:.3e}  top1 {m['top1_agree']:.4f}  "
            f"ppl {m['ppl_ref']:.4f} -> {m['ppl_quant']:.4f}  {bpt:.1f} B/token"
        )
        if self.a.quiet:
            pass
        elif self.progress is None:
            print(line, flush=True)
        else:
            self.progress.write(line)
        if self.progress is not None and self.counts_runs:
            self.progress.update(1)

    def run_all(self, chunks) -> None:
        """forward + record for every chunk. Raises ValueError (non-finite logits, a spec the quantizers
        refuse: then as an unbatched run would, after the rows before it)."""
        with torch.no_grad():
            for chunk in chunks:
                try:
                    logits = self.forward(chunk)
                except ValueError:  # a spec the quantizers refuse: replay the runs one by one, so the
                    if len(chunk) == 1:  # error (and the lines before it) are those of unbatched runs
                        raise
                    logits = None
                if logits is None:
                    for run in chunk:
                        self.record(run, self.forward([run])[0])
                else:
                    for run, q in zip(chunk, logits):
                        self.record(run, q)


def write_tables(a, runner: Runner, tokenizer, K: int, K_dec: int, streamer=None, extra: dict | None = None) -> None:
    """/e2e and /e2e_position of the runner's rows into a.results (write_groups), with their column records
    (E2E_COLUMNS, E2E_POSITION_COLUMNS) and attributes (streamer: the LayerStreamer of a streamed step, else
    None); `extra`: more write_groups entries written with them (/generation)."""
    rows, pos_rows = runner.rows, runner.pos_rows
    cols = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    cols["num_tokens"] = np.full(len(rows), a.num_seqs * a.seq_len, dtype=np.int64)
    pcols = {k: np.array([r[k] for r in pos_rows]) for k in pos_rows[0]}
    common = {
        "model": os.path.abspath(a.model),
        "text_offset_bytes": a.offset_bytes,
        "seq_len": a.seq_len,
        "num_seqs": a.num_seqs,
        "layers": ",".join(map(str, runner.plan.layers)),
        "device": a.device,
        "dtype": a.dtype,
        "tokenizer": "bytes" if tokenizer is None else type(tokenizer).__name__,
        "text": os.path.abspath(a.text) if a.text else "kjv-heldout",
        "text_sha256": a.text_sha256,
        "batch_runs": np.int64(K),
        **execution_attrs(streamer),
        "batch_runs_decode": np.int64(K_dec),
        "step_key": a.step_key,
        "selection": "named" if a.quantizers else a.selection,
    }
    write_groups(
        a.results,
        {
            "e2e": (
                E2E_COLUMNS,
                cols,
                {
                    **common,
                    "definition": "KL(p_ref||p_q) mean over tokens (nats); top1 = argmax agreement; "
                    "ppl = exp(mean next-token NLL); bytes_per_token: cache at the sequence end, per layer; "
                    "cache_mode: latentq/decode_order.h; the spread and the intervals: latentq.e2e_stats",
                    "bootstrap_seed": np.int64(SEED),
                    "bootstrap_resamples": np.int64(RESAMPLES),
                    "bootstrap_interval": "95% percentile bootstrap over the num_seqs sequences, the same draws for "
                    "every row (paired); NaN with one sequence",
                },
            ),
            **paired_groups(runner.run_stats, runner.draws),
            "e2e_not_run": e2e_frontier.not_run_group(runner.plan.frontier, common["selection"]),
            "e2e_position": (
                E2E_POSITION_COLUMNS,
                pcols,
                {
                    **common,
                    "position_bucket": np.int64(runner.plan.width),
                    "definition": "KL and top-1 of the /e2e runs over query positions [pos_start, pos_end) "
                    "of each window",
                },
            ),
            **(extra or {}),
        },
    )


def main(argv=None) -> int:
    """The step (module docstring): 0 when /e2e and /e2e_position are written; 2 with one line
    "latentq e2e: error: ..." on stderr (a bad flag or results file, a model or text that does not fit,
    non-finite logits, a spec the quantizers refuse), the results file left unchanged."""
    a = parse_args(argv)
    if isinstance(a, int):
        return a
    latentq = import_latentq()
    from latentq.progress import quiet_import_noise

    quiet_import_noise()
    torch.set_num_threads(a.threads)
    if checkpoint_model_type(a.model) == V4_MODEL_TYPE:  # DeepSeek-V4: its own caches and hooks (latentq.e2e_v4)
        from latentq import e2e_v4

        for flag, on in (("--generation", a.generation), ("--retrieval", a.retrieval)):
            if on:
                say("e2e", "note", f"{flag}: not run on a DeepSeek-V4 model (dense MLA only for now)")

        return e2e_v4.main_v4(a, latentq)
    if a.caches:
        say("e2e", "error", f"--caches is for a DeepSeek-V4 model; {a.model} is not one (model_type deepseek_v4)")
        return 2
    try:
        plan = Plan(a, latentq)
        text = read_text(a)  # read once: the scored windows, the prompts and the needles are cut from it
        model, tokenizer, ids, dims, model_layers, streamer = load_inputs(a, plan, text)
        prompts = e2e_generation.prepare(a, text, model, tokenizer, streamer)  # None: no --generation, or a note
        needles = e2e_retrieval.prepare(a, text, model, tokenizer, streamer)  # None: no --retrieval, or a note
    except (ValueError, OSError, RuntimeError) as e:
        say("e2e", "error", str(e))
        return 2
    if len(plan.layers) < len(model_layers):
        say(
            "e2e",
            "note",
            f"the study ran layers {','.join(map(str, plan.layers))} only; the other "
            f"{len(model_layers) - len(plan.layers)} of {len(model_layers)} layers stay unquantized",
        )
    try:
        runs = plan.runs(a)
    except ValueError as e:  # the frontier's reading of the results file
        say("e2e", "error", str(e))
        return 2
    if plan.frontier is not None and plan.frontier.metric != "none":  # "none": nothing ranked, every one runs
        lines = e2e_frontier.not_run_lines(plan.frontier, len(plan.pairs))
        print("\n".join(lines[:1] if a.quiet else lines), flush=True)
    try:  # a run behind a fitted basis: the dump must be the study's, checked before the first forward
        if plan.uses_bases:
            plan.bases.check_dump()
    except (ValueError, OSError) as e:
        say("e2e", "error", f"{e}; {a.results} is left unchanged")
        return 2
    if not runs:
        say("e2e", "error", "no quantizer to run (only klt quantizers, or no cache mode)")
        return 2

    # Auto: the prefill-at-once runs K at a time (the memory bound); the decode-order runs one at a time,
    # since batching them gained nothing (README "End to end": tiny-mla's default step 41.7 s with them
    # one per forward, 43.2 s and 1.7x the peak RSS by 4: the masked SDPA of mixed_latent_attention over
    # 2·T keys grows with K as the runs' own work does).
    K = a.batch_runs or auto_batch_runs(model.config, a.seq_len, a.num_seqs)
    K_dec = a.batch_runs or 1
    # Runs in forwards of K: the reference with the first prefill-at-once runs (LatentInjector), the
    # decode-order runs apart (DecodeOrderAttention), in the order of `runs` (the rows' order).
    pre = [REF] + [r for r in runs if r[2] == PREFILL_AT_ONCE]
    dec = [r for r in runs if r[2] != PREFILL_AT_ONCE]
    chunks = [pre[i : i + K] for i in range(0, len(pre), K)] + [dec[i : i + K_dec] for i in range(0, len(dec), K_dec)]

    t0 = time.time()
    runner = Runner(latentq, a, model, ids, plan, dims)
    try:
        if streamer is None:
            with Progress(len(runs), "e2e", "runs") as runner.progress:
                runner.run_all(chunks)
        else:  # layer-major: the progress counts layers; each run's line comes at the end
            runner.counts_runs = False
            with Progress(len(streamer.layers), "e2e", f"layers (streamed, {len(chunks)} forwards)") as runner.progress:
                runner.run_streamed(streamer, chunks, after=lambda i: runner.progress.update(1))
        # a group this run does not compute is removed: no /generation or /retrieval of an earlier run stays beside
        # the new /e2e (the decision joins them to its rows)
        extra, gen_s = dict.fromkeys(("generation", "retrieval", "retrieval_summary")), None
        if prompts is not None:
            record, values, attrs, gen_s = e2e_generation.generation_group(a, runner, prompts)
            extra["generation"] = (record, values, attrs)
        ret_s = None
        if needles is not None:
            groups, ret_s = e2e_retrieval.retrieval_step(a, runner, needles, auto_batch_runs)
            extra.update(groups)
    except (ValueError, OSError) as e:  # non-finite logits, a refused spec, a spill file that cannot be written
        say("e2e", "error", f"{e}; {a.results} is left unchanged")
        return 2
    write_tables(a, runner, tokenizer, K, K_dec, streamer, extra)
    print(
        f"e2e: {len(runner.rows)} runs, {a.num_seqs}x{a.seq_len} tokens, {len(chunks)} forwards of <= {K} runs, "
        f"{time.time() - t0:.1f}s -> "
        f"{a.results}:/e2e, /e2e_position"
        + ("" if gen_s is None else f", /generation ({gen_s:.1f}s of it)")
        + ("" if ret_s is None else f", /retrieval ({ret_s:.1f}s of it)")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
