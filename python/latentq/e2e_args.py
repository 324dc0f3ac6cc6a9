"""The command line of ``python -m latentq.e2e`` (its options; what they do: latentq.e2e's docstring, and
latentq.e2e_frontier for --e2e and --budgets)."""

from __future__ import annotations

import os

from latentq import e2e_retrieval
from latentq.e2e_frontier import DEFAULT_BUDGETS, SELECTIONS, parse_budgets
from latentq.model import DTYPES
from latentq.progress import StepParser, say

# The repository (python/latentq/e2e_args.py is two levels below it): the default --model data/tiny-mla.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None, description: str | None = None):
    """The command line of python -m latentq.e2e (`description`: its help text, latentq.e2e's docstring). Returns
    the namespace, or 2 after printing one error line when a number is out of range or --budgets is malformed."""
    ap = StepParser("e2e", prog="python -m latentq.e2e", description=description)
    ap.add_argument("--results", required=True, help="latentq-results/1 file of `latentq run` (updated in place)")
    ap.add_argument(
        "--model",
        default=os.path.join(ROOT, "data", "tiny-mla"),
        help="tiny-mla directory or HF MLA checkpoint directory (DeepseekV2/V3, GLM-4 MoE Lite, MiniCPM3)",
    )
    ap.add_argument("--device", default="cpu", help="torch device of the model (cpu, cuda, cuda:1)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="compute dtype of the model")
    ap.add_argument("--trust-remote-code", action="store_true", help="for a remote-code checkpoint")
    ap.add_argument(
        "--tokenizer",
        choices=("auto", "bytes"),
        default="auto",
        help="auto: the checkpoint's tokenizer (bytes only when it has none); bytes: the text's bytes (as dump)",
    )
    ap.add_argument("--text", help="text file; default: the KJV held-out split")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per window")
    ap.add_argument("--num-seqs", type=int, default=4)
    ap.add_argument("--offset-bytes", type=int, default=2048)
    ap.add_argument(
        "--quantizers", nargs="*", help="prefill-at-once spec strings (default: every quantizer of the study)"
    )
    ap.add_argument(
        "--indexer-quantizers",
        nargs="*",
        help="formats of a sparse MLA model's DSA indexer key cache, each run alone (targets index_k, the latents "
        "exact; default: the study's [indexer] quantizers, /indexer_error; none for a dense study)",
    )
    ap.add_argument(
        "--caches",
        nargs="*",
        help="DeepSeek-V4 only: one run per assignment window_kv=SPEC,compressed_kv=SPEC,index_k=SPEC (any subset, "
        "each cache its own format; latentq.e2e_v4)",
    )
    ap.add_argument(
        "--cache-modes",
        nargs="*",
        help="cache-mode labels (default: the root attribute decode_order_modes, "
        "else prefill-at-once); the prefill-at-once rows run unless this flag leaves that label out",
    )
    ap.add_argument(
        "--decode-quantizers",
        nargs="*",
        help="specs run in the decode modes (default: the root attribute "
        "decode_order_quantizers, else the prefill-at-once quantizers)",
    )
    ap.add_argument(
        "--position-bucket",
        type=int,
        help="W of /e2e_position (default: the root attribute decode_order_position_bucket, else 64)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quiet", action="store_true", help="no line per run (the progress and the last line remain)")
    ap.add_argument(
        "--stream",
        choices=("auto", "on", "off"),
        default="auto",
        help="run the model layer by layer from its safetensors shards, every forward of the step through "
        "layer i before layer i+1 (auto: weights over the memory budget; as latentq.dump)",
    )
    ap.add_argument(
        "--memory-budget",
        default=None,
        help="host memory for weights + hidden states when streaming, e.g. 24G (default: half the physical memory)",
    )
    ap.add_argument(
        "--dump-text-sha256",
        default="",
        help="the dump's text_sha256: refuse to score another text (latentq study passes it)",
    )
    ap.add_argument(
        "--batch-runs",
        type=int,
        default=0,
        help="runs per forward pass: K runs (and the reference) share one forward of K x num-seqs "
        "sequences, each run's quantizer on its own rows; 0 (default) = auto: prefill-at-once runs as "
        "many as keep the activations under 768 MiB (auto_batch_runs; 4 for tiny-mla at 4 x 512), "
        "decode-order runs one per forward (batching them gained nothing); 1 = one run per forward",
    )
    ap.add_argument(
        "--step-key",
        default="",
        help="what `latentq study` keys the reuse of /e2e on (a JSON object): recorded as /e2e's attribute "
        "step_key, not interpreted",
    )
    ap.add_argument(
        "--e2e",
        dest="selection",
        choices=SELECTIONS,
        default="frontier",
        help="frontier (default): of the study's prefill-at-once quantizers, run those the cheap probes leave in "
        "reach of the decision at some budget (latentq.e2e_frontier), list the others in /e2e_not_run; all: run "
        "every quantizer of the study",
    )
    ap.add_argument(
        "--budgets",
        default="",
        help="the decision's budgets the frontier is taken at, as fractions of the bf16 cache, e.g. 1/16,1/4,0.5 "
        "(default: the decision's, 1/16,1/8,1/4,3/8,1/2; `latentq run --budgets` passes its own)",
    )
    ap.add_argument(
        "--generation",
        nargs="?",
        const="on",
        choices=("on", "auto"),
        help="also write /generation: free-running greedy continuations of prompts cut from the text under each "
        "/e2e run's cache against the reference's (latentq.e2e_generation); `--generation auto` (what `latentq "
        "study` passes unless its config sets generation): a text or model too short for the prompts gives a note "
        "and no group instead of an error",
    )
    ap.add_argument("--gen-prompts", type=int, default=4, help="prompts of --generation (default 4)")
    ap.add_argument("--gen-prompt-len", type=int, default=64, help="tokens per prompt of --generation (default 64)")
    ap.add_argument(
        "--gen-new-tokens", type=int, default=32, help="greedy tokens generated per prompt by --generation (default 32)"
    )
    e2e_retrieval.add_args(ap)
    a = ap.parse_args(argv)
    if why := e2e_retrieval.check_args(a):
        say("e2e", "error", why)
        return 2
    if a.seq_len is not None and a.seq_len < 2:
        say("e2e", "error", f"--seq-len {a.seq_len}: at least 2 tokens per sequence for a next-token metric")
        return 2
    for flag, v, lo in (
        ("--num-seqs", a.num_seqs, 1),
        ("--offset-bytes", a.offset_bytes, 0),
        ("--threads", a.threads, 1),
        ("--position-bucket", a.position_bucket, 1),
        ("--batch-runs", a.batch_runs, 0),
        ("--gen-prompts", a.gen_prompts, 1),
        ("--gen-prompt-len", a.gen_prompt_len, 1),
        ("--gen-new-tokens", a.gen_new_tokens, 1),
    ):
        if v is not None and v < lo:
            say("e2e", "error", f"{flag} {v}: must be >= {lo}")
            return 2
    try:
        a.budget_fractions = parse_budgets(a.budgets) if a.budgets else list(DEFAULT_BUDGETS)
    except ValueError as e:
        say("e2e", "error", str(e))
        return 2
    return a
