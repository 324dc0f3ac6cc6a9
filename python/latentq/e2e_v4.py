"""The e2e step on a DeepSeek-V4 model (``model_type`` deepseek_v4): ``python -m latentq.e2e --results RESULTS.h5
--model DIR`` hands over here (latentq.e2e.main), with the same flags, text, statistics and groups.

The model runs through transformers 5.24's ``modeling_deepseek_v4.py`` (eager attention; in memory, or layer by
layer from its shards with --stream as the dense step: latentq.stream.LayerStreamer, the same rows) on num_seqs
windows of seq_len tokens, once with its own caches (the reference) and once per run with some of its caches
(latentq.inject_v4.V4_CACHES: window_kv, compressed_kv, index_k) quantize-dequantized through the C++ quantizers
(the ``latentq`` module), on the study's layers (the root attribute ``layers``, else every layer):

* runs: each format of the study's /latent_error rows on window_kv / compressed_kv runs on the caches the study ran
  it on (e.g. targets ``window_kv+compressed_kv``); each format of its index_k rows (or /indexer_error) on index_k
  alone (the CSA indexer's keys: the top-k each query reads is the one the model computes from the quantized keys);
  ``--quantizers SPEC ...``: each spec on window_kv+compressed_kv; ``--indexer-quantizers SPEC ...``: each on
  index_k; ``--caches window_kv=A,compressed_kv=B,index_k=C ...``: one run per assignment, any subset, each cache
  its own spec. Every run goes through every cache mode (--cache-modes, else the root attribute decode_order_modes,
  else prefill-at-once). Runs whose format the study found not applicable to a cache (/not_applicable), a preset
  whose record cannot hold the entry row, or a klt / sklt quantizer (no fitted basis for V4's caches here) are left
  out with a note.
* an entry cache's row (window_kv, compressed_kv: head_dim wide, the rope slice its last d_r columns): a plain
  format quantizes the whole row; an engine record preset (e.g. flashmla-model1-fp8: 448 e4m3 + 64 bf16 + 7 ue8m0
  scales + pad = 584 B) its "c_kv" part the first head_dim - d_r columns and its "k_pe" part the last d_r, each
  through the module with that target (the module has no V4 targets yet: the two part formats are applied to the
  two column slices here). index_k takes plain formats (a preset's c_kv part, as the MLA indexer runs do).
* cache modes: prefill-at-once (each window's whole cache at once) and decode-r<R>-s<S>-p<P>
  (latentq/decode_order.h) over each cache's own rows: tokens for window_kv, entries for compressed_kv and index_k
  (the compressor emits entry w once token (w+1)·m - 1 is processed; an entry is quantized when written, its
  scale groups complete as latentq.decode_order_latents has them; the R most recent rows and the first S are read in
  bf16, the engine's precision, and so is every row for a query whose step is before P; R, S and P count the cache's
  own rows and steps). latentq.inject_v4 says how one forward reads them.

Group /e2e: the dense step's columns (latentq.e2e.E2E_COLUMNS: KL mean and percentiles, top-1, NLL, ln ppl ratio,
Δp, bootstrap intervals; latentq.e2e_stats), ``targets`` the caches quantized ("window_kv+compressed_kv"),
``caches`` which format each took ("window_kv=SPEC,compressed_kv=SPEC"), and the bytes as the V4 plan defines them
(V4_BYTES, V4_WINDOW_BYTES): per stored row from the one accounting (latentq.decode_order_cache_bytes, a preset as
its two parts, its record's pad with the first); per token at long context compressed_kv and index_k amortized by
their rate (1/compress_rate rows per token), mean over the model's layers (a sliding layer stores none); the window
is bounded (sliding_window rows per sequence) and reported per sequence. /e2e_position, /e2e_seq, /e2e_bootstrap as
the dense step; /e2e attribute ``cache_family`` = "deepseek_v4". Every run goes through its own forward (no
--batch-runs), and every format of the study runs (no frontier: --e2e and --budgets are not read). User errors:
ValueError (exit 2, nothing written).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import torch

from latentq.deepseek_v4 import CSA, find_v4_layers
from latentq.e2e_decode import PREFILL_AT_ONCE, mode_rsp
from latentq.e2e_frontier import not_run_group
from latentq.e2e_results import applicable_only, canonical_specs, study_layers, study_v4_quantizers
from latentq.e2e_shared import (
    E2E_COLUMNS,
    E2E_POSITION_COLUMNS,
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
from latentq.fitted_basis import needs_basis
from latentq.inject_v4 import ENTRY_CACHES, V4_CACHES, V4CacheInjector
from latentq.model import DTYPES, device_error, load_model, run_model
from latentq.progress import say
from latentq.result_groups import Column, write_groups

MODEL_TYPE = "deepseek_v4"


def is_v4_checkpoint(path: str) -> bool:
    """Whether the checkpoint directory's config.json names model_type deepseek_v4 (False when unreadable)."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            return json.load(f).get("model_type") == MODEL_TYPE
    except (OSError, ValueError):
        return False


# ---- the quantizers on one cache's rows ------------------------------------------------------------------------
_PRESETS: set[str] = set()


def is_preset(latentq, spec: str) -> bool:
    """Whether spec is an engine record preset (the format table's family "preset")."""
    if not _PRESETS:
        _PRESETS.update(r["name"] for r in latentq.format_rows() if r["family"] == "preset")
    return latentq.canonical_spec(spec) in _PRESETS


def parts(latentq, spec: str, cache: str, D: int, d_rope: int) -> list[tuple[slice, str]]:
    """The column slices of a row of `cache` (D wide) and the module target each is quantized as: a preset on an entry
    cache: [first D - d_rope columns as "c_kv", last d_rope as "k_pe"]; else the whole row as "c_kv"."""
    if cache in ENTRY_CACHES and is_preset(latentq, spec):
        return [(slice(0, D - d_rope), "c_kv"), (slice(D - d_rope, D), "k_pe")]
    return [(slice(0, D), "c_kv")]


def preset_refusal(latentq, spec: str, D: int, d_rope: int) -> str:
    """Why an engine record preset cannot hold an entry row of D columns with a rope slice of d_rope ('' when it
    can, or spec is no preset): the module's pack_record on a zero row split as parts() splits it (a preset's record
    holds its native widths: flashmla-model1-fp8 448 + 64)."""
    if not is_preset(latentq, spec):
        return ""
    try:
        a = latentq.quantize(np.zeros((1, D - d_rope), np.float32), spec, "c_kv")
        b = latentq.quantize(np.zeros((1, d_rope), np.float32), spec, "k_pe")
        latentq.pack_record(a, b, spec)
    except ValueError as e:
        return str(e).splitlines()[0]
    return ""


def rows_of(x: torch.Tensor) -> tuple[np.ndarray, list[int]]:
    """x [B, R, D] -> (float32 [B·R, D] C-contiguous, sequence offsets [B+1]: one sequence per batch row)."""
    B, R, D = x.shape
    return x.detach().to("cpu", torch.float32).reshape(B * R, D).contiguous().numpy(), [b * R for b in range(B + 1)]


def quantize_rows(latentq, x: torch.Tensor, spec: str, cache: str, d_rope: int) -> torch.Tensor:
    """Quantize-dequantize a cache's rows x [B, R, D] (one sequence per batch row) in `spec` (parts()): float32."""
    flat, offs = rows_of(x)
    out = np.empty_like(flat)
    for cols, target in parts(latentq, spec, cache, flat.shape[1], d_rope):
        out[:, cols] = latentq.quantize_dequantize(np.ascontiguousarray(flat[:, cols]), spec, target, offs, None)
    return torch.from_numpy(out).reshape(x.shape)


def decode_rows(latentq, x: torch.Tensor, spec: str, mode: str, cache: str, d_rope: int):
    """The decode-order reads of a cache's rows x [B, R, D]: (quantized, bf16 [B, R, D] float32, read [R, R] bool)
    (latentq.decode_order_latents per part; read = decode_order_mask(mode, R, decode_token_group(spec)))."""
    flat, offs = rows_of(x)
    q, b = np.empty_like(flat), np.empty_like(flat)
    for cols, target in parts(latentq, spec, cache, flat.shape[1], d_rope):
        q[:, cols], b[:, cols] = latentq.decode_order_latents(
            np.ascontiguousarray(flat[:, cols]), spec, mode, target, offs, None
        )
    read = latentq.decode_order_mask(mode, x.shape[1], latentq.decode_token_group(spec))
    return torch.from_numpy(q).reshape(x.shape), torch.from_numpy(b).reshape(x.shape), torch.from_numpy(read)


def make_fns(latentq, assignment: dict[str, str], mode: str, layers, rope: dict[int, int]):
    """The V4CacheInjector callback of one run: inject= (prefill-at-once) or decode= (a decode mode), quantizing
    cache c of layer l in assignment[c] where l is in `layers` (None: every layer); rope {layer: d_r}."""

    def spec_of(layer: int, cache: str):
        return None if (layers is not None and layer not in layers) else assignment.get(cache)

    def inject(layer, cache, x):
        s = spec_of(layer, cache)
        return x if s is None else quantize_rows(latentq, x, s, cache, rope[layer])

    def decode(layer, cache, x):
        s = spec_of(layer, cache)
        return None if s is None else decode_rows(latentq, x, s, mode, cache, rope[layer])

    return {"inject": inject} if mode == PREFILL_AT_ONCE else {"decode": decode}


# ---- bytes (the V4 plan's definitions) -------------------------------------------------------------------------
def cache_bytes(latentq, spec: str | None, cache: str, D: int, d_rope: int, rows: int, num_seqs: int, mode: str):
    """Bytes of num_seqs sequences of `rows` rows of one cache (D wide) under `mode`, per row: the one accounting
    (latentq.decode_order_cache_bytes: bf16 rows at 2·D, complete groups with their metadata, a preset's record pad
    with its c_kv part), summed over parts(); spec None: bf16, 2·D. rows 0 counts one row."""
    if spec is None:
        return 2.0 * D
    rows = max(rows, 1)
    offs = [i * rows for i in range(num_seqs + 1)]
    pre = is_preset(latentq, spec)
    total = 0
    for cols, target in parts(latentq, spec, cache, D, d_rope):
        w = cols.stop - cols.start
        total += latentq.decode_order_cache_bytes(spec, target, w, offs, mode, d_rope if pre else 0)
    return total / (num_seqs * rows)


def v4_bytes(latentq, assignment: dict, mode: str, info: list[dict], layers, L: int, num_seqs: int):
    """(bytes_per_token, window_bytes_per_seq) of one run (V4_BYTES, V4_WINDOW_BYTES): per layer of `info` (dicts
    layer, rate, csa, D, d_rope, index_dim, window), mean over the model's layers; a layer outside `layers` (not
    None) counts its caches in bf16."""
    per_tok, per_seq = 0.0, 0.0
    for d in info:
        quantized = layers is None or d["layer"] in layers
        spec = {c: assignment.get(c) if quantized else None for c in V4_CACHES}.get
        W = min(d["window"], L)
        per_seq += W * cache_bytes(latentq, spec("window_kv"), "window_kv", d["D"], d["d_rope"], W, num_seqs, mode)
        if d["rate"]:
            n = L // d["rate"]
            b = cache_bytes(latentq, spec("compressed_kv"), "compressed_kv", d["D"], d["d_rope"], n, num_seqs, mode)
            if d["csa"]:
                b += cache_bytes(latentq, spec("index_k"), "index_k", d["index_dim"], 0, n, num_seqs, mode)
            per_tok += b / d["rate"]
    return per_tok / len(info), per_seq / len(info)


def layer_info(model) -> list[dict]:
    """One dict per DeepseekV4Attention: layer, rate (0: sliding), csa, D (head_dim), d_rope, index_dim, window."""
    cfg, rotary = model.config, getattr(model, "model", model).rotary_emb
    out = []
    for attn in find_v4_layers(model):
        d_rope = 2 * getattr(rotary, f"{attn.rope_layer_type}_inv_freq").numel()  # one angle per rotated pair
        rate = int(attn.compressor.compress_rate) if attn.compressor is not None else 0
        out.append(
            dict(layer=int(attn.layer_idx), rate=rate, csa=attn.layer_type == CSA, D=int(attn.head_dim),
                 d_rope=d_rope, index_dim=int(cfg.index_head_dim), window=int(attn.sliding_window))
        )  # fmt: skip
    return out


# ---- the runs ---------------------------------------------------------------------------------------------------
def parse_assignment(latentq, text: str) -> dict[str, str]:
    """'window_kv=SPEC,compressed_kv=SPEC,index_k=SPEC' (any non-empty subset) -> {cache: canonical spec}. Raises
    ValueError naming --caches and what is wrong (an unknown cache, a cache twice, a spec the grammar refuses)."""
    out: dict[str, str] = {}
    for item in text.split(","):
        cache, eq, spec = item.partition("=")
        cache = cache.strip()
        if not eq or cache not in V4_CACHES or cache in out:
            why = "twice" if cache in out else f"expected <cache>=<spec> with cache one of {', '.join(V4_CACHES)}"
            raise ValueError(f"--caches {text}: '{item}': {why}")
        out[cache] = canonical_specs(latentq, [spec.strip()], "--caches")[0]
    return {c: out[c] for c in V4_CACHES if c in out}


def run_label(assignment: dict[str, str]) -> tuple[str, str, str]:
    """(quantizer, targets, caches) columns of an assignment: the spec when every cache takes the same one, else
    the assignment; the caches joined by '+'; 'cache=spec' joined by ','."""
    specs = set(assignment.values())
    caches = ",".join(f"{c}={s}" for c, s in assignment.items())
    return (specs.pop() if len(specs) == 1 else caches), "+".join(assignment), caches


def applicable_presets(latentq, runs: list[tuple[dict, str]], info: list[dict]) -> list[tuple[dict, str]]:
    """The runs without those whose assignment puts an engine record preset on an entry cache (window_kv,
    compressed_kv) whose rows it cannot hold (preset_refusal at the model's head_dim and rope slice), with one note
    per preset saying why (the V4 plan: a preset applies when its native widths are the entry's)."""
    D, d_rope = info[0]["D"], info[0]["d_rope"]
    why = {s: preset_refusal(latentq, s, D, d_rope) for r, _ in runs for c, s in r.items() if c in ENTRY_CACHES}
    for s, w in why.items():
        if w:
            say("e2e", "note", f"not applicable, not run on window_kv / compressed_kv ({D} wide, rope {d_rope}): {w}")
    return [(r, m) for r, m in runs if not any(why.get(s) for c, s in r.items() if c in ENTRY_CACHES)]


def _decode_attrs(results: str) -> tuple[list[str] | None, int | None]:
    """The root attributes decode_order_modes and decode_order_position_bucket the C++ study writes (None: absent)."""
    from latentq.e2e_results import open_results

    with open_results(results) as f:
        v, w = f.attrs.get("decode_order_modes"), f.attrs.get("decode_order_position_bucket")
    modes = None if v is None else [x.decode() if isinstance(x, bytes) else str(x) for x in np.atleast_1d(v)]
    return modes, None if w is None else int(w)


def plan_runs(a, latentq) -> list[tuple[dict, str]]:
    """(assignment, cache_mode) of every run, in the rows' order (module docstring); sets a.position_bucket (the flag,
    else the root attribute decode_order_position_bucket, else 64). Raises ValueError naming the flag or file."""
    entry, index = study_v4_quantizers(a.results)
    if a.quantizers:
        entry = [(q, ENTRY_CACHES) for q in canonical_specs(latentq, a.quantizers, "--quantizers")]
    if a.indexer_quantizers is not None:
        index = canonical_specs(latentq, a.indexer_quantizers, "--indexer-quantizers")
    pairs = entry + [(q, ("index_k",)) for q in index]
    pairs, _, notes = applicable_only(a.results, pairs, [])
    for n in notes:
        say("e2e", "note", n)
    runs = [{c: q for c in t} for q, t in pairs] + [parse_assignment(latentq, c) for c in a.caches or []]
    fitted = sorted({s for r in runs for s in r.values() if needs_basis(s)})
    if fitted:  # the step fits no basis on V4's caches (latentq.fitted_basis reads MLA dumps)
        say("e2e", "note", f"{len(fitted)} klt/sklt quantizer(s) not injected on DeepSeek-V4 (no fitted basis for its "
                           f"caches in the e2e step): {', '.join(fitted)}")  # fmt: skip
        runs = [r for r in runs if not any(needs_basis(s) for s in r.values())]
    attr_modes, attr_width = _decode_attrs(a.results)
    modes = a.cache_modes if a.cache_modes is not None else (attr_modes or [PREFILL_AT_ONCE])
    a.position_bucket = a.position_bucket or attr_width or 64  # W of /e2e_position, as the dense step's
    if a.position_bucket < 1:
        raise ValueError(f"{a.results}: decode_order_position_bucket {a.position_bucket}: must be >= 1")
    for m in modes:
        mode_rsp(latentq, m)  # a malformed label: ValueError naming it
    if not runs:
        raise ValueError(
            f"{a.results}: no window_kv / compressed_kv / index_k format to run (its /latent_error has none); "
            "name them with --quantizers, --indexer-quantizers or --caches"
        )
    return [(r, m) for m in dict.fromkeys(modes) for r in runs]


# ---- the groups -------------------------------------------------------------------------------------------------
V4_TARGETS = Column("targets", "string", "", "the caches quantized: window_kv, compressed_kv, index_k joined by '+'")
V4_BYTES = Column("bytes_per_token", "float64", "byte/token", "per token and layer at long context: the compressed_kv "
                  "and index_k rows amortized by their rate (1/compress_rate rows per token: CSA 1/4, HCA 1/128), per "
                  "row by latentq.decode_order_cache_bytes at this run's rows, mean over the model's layers (a sliding "
                  "layer stores none); a cache not quantized at 2 bytes/element; the window apart "
                  "(window_bytes_per_seq)")  # fmt: skip
V4_WINDOW_BYTES = Column("window_bytes_per_seq", "float64", "byte/sequence", "the window_kv cache of one sequence per "
                         "layer: min(sliding_window, seq_len) rows, bounded whatever the context, mean over the "
                         "model's layers")  # fmt: skip
CACHES_COLUMN = Column("caches", "string", "", "the format each quantized cache took: cache=spec joined by ','")


def _v4_columns(columns: tuple) -> tuple:
    swap = {"targets": V4_TARGETS, "bytes_per_token": V4_BYTES}
    return tuple(swap.get(c.name, c) for c in columns) + (CACHES_COLUMN, V4_WINDOW_BYTES)


def load_v4(a):
    """(model, tokenizer or None, ids [num_seqs, seq_len] on --device, the LayerStreamer or None). Streaming
    (--stream, latentq.model.stream_plan as the dense step decides it): the model is the streamer's meta model,
    nothing loaded yet; else the model on --device. Raises ValueError (no CUDA, unreadable --text, a checkpoint that
    cannot be streamed, windows the model or text cannot hold)."""
    from latentq.model import load_tokenizer, stream_plan
    from latentq.stream import CheckpointError, LayerStreamer

    if why_not := device_error(a.device):
        raise ValueError(why_not)
    text = read_text(a)
    stream, why, budget = stream_plan(a.stream, a.memory_budget, a.model, DTYPES[a.dtype])
    streamer = None
    try:
        if stream:
            say("e2e", "note", f"layer streaming ({why})")
            spill = os.path.dirname(os.path.abspath(a.results))
            streamer = LayerStreamer(a.model, DTYPES[a.dtype], device=a.device, memory_budget=budget,
                                     spill_dir=spill if os.path.isdir(spill) else None,
                                     trust_remote_code=a.trust_remote_code)  # fmt: skip
            model, tokenizer = streamer.model, load_tokenizer(a.model, a.trust_remote_code, a.tokenizer)
        else:
            model, _cfg, _src, _rev, _orig, tokenizer = load_model(a.model, DTYPES[a.dtype], a.trust_remote_code,
                                                                   tokenizer=a.tokenizer)  # fmt: skip
            model = model.to(a.device).eval()
    except CheckpointError as e:
        raise ValueError(str(e)) from None
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos is not None and a.seq_len > max_pos:
        raise ValueError(f"--seq-len {a.seq_len} exceeds max_position_embeddings {max_pos} of the model {a.model}")
    ids = load_tokens(text, a.offset_bytes, tokenizer, a.seq_len, a.num_seqs, model.config.vocab_size)
    return model, tokenizer, ids.to(a.device), streamer


class _Rows:
    """The rows of the step from each forward's logits, in the runs' order: ``record(n, logits)`` with n = 0 the
    reference (exact caches), n = k + 1 run k of ``runs`` (assignment, cache_mode)."""

    def __init__(self, a, latentq, runs, info, layers, ids):
        self.a, self.latentq, self.runs, self.info, self.layers, self.ids = a, latentq, runs, info, layers, ids.cpu()
        self.rows, self.pos_rows, self.run_stats, self.draws, self.ref = [], [], {}, None, None

    def record(self, n: int, logits: torch.Tensor) -> None:
        a, latentq, q = self.a, self.latentq, logits.float().cpu()
        if n == 0:
            require_finite_logits(q, f"the reference run (exact caches) of {a.model}")
            self.ref = q
            return
        assignment, mode = self.runs[n - 1]
        quantizer, targets, caches = run_label(assignment)
        require_finite_logits(q, f"the run with {caches} ({mode})")
        stats = token_stats(self.ref, q, self.ids)
        self.draws = bootstrap_counts(stats.num_seqs, RESAMPLES, SEED) if self.draws is None else self.draws
        self.run_stats[(quantizer, tuple(assignment), mode)] = stats
        m = run_metrics(stats) | interval_columns(stats, self.draws)
        bpt, wps = v4_bytes(latentq, assignment, mode, self.info, self.layers, a.seq_len, a.num_seqs)
        causal = np.int64(all(latentq.decode_scale_is_causal(s) for s in assignment.values()))
        key = {"quantizer": quantizer, "targets": targets, "cache_mode": mode}
        extra = {"bytes_per_token": bpt, "caches": caches, "window_bytes_per_seq": wps, "scale_causal": causal}
        self.rows.append(key | m | extra)
        R, S, P = mode_rsp(latentq, mode)
        for r in position_rows(stats, a.position_bucket):
            self.pos_rows.append(key | {"residual": R, "sink": S, "prefill": P} | r | extra)
        if not a.quiet:
            print(f"  {caches:48s} {mode:20s} KL {m['kl_mean']:.3e}  top1 {m['top1_agree']:.4f}  "
                  f"{bpt:.1f} B/token  window {wps:.0f} B/seq", flush=True)  # fmt: skip


def run_forwards(model, ids, hooks: list, rows: _Rows, streamer=None) -> None:
    """The reference and every run (hooks[k]: run k's V4CacheInjector), each one forward of the num_seqs windows,
    their logits recorded in order. Streamed (a LayerStreamer): layer-major, every forward through layer i before
    layer i+1, run k's hooks installed while layer i runs its input."""
    if streamer is None:
        with torch.no_grad():
            rows.record(0, run_model(model, ids))
            for k, h in enumerate(hooks):
                with h:
                    logits = run_model(model, ids)
                rows.record(k + 1, logits)
        return
    active: list = [None]

    def use(h) -> None:
        if active[0] is not h:
            if active[0] is not None:
                active[0].__exit__(None, None, None)
            if h is not None:
                h.__enter__()
            active[0] = h

    def on_logits(n: int, logits: torch.Tensor) -> None:
        use(None)
        rows.record(n, logits)

    try:
        streamer.run(
            [ids] * (len(hooks) + 1), before=lambda i, n: use(hooks[n - 1] if n else None), on_logits=on_logits
        )
    finally:
        use(None)


def main_v4(a, latentq) -> int:
    """The step on a V4 checkpoint (module docstring): 0 when the groups are written, 2 after one error line."""
    try:
        runs = plan_runs(a, latentq)
        model, tokenizer, ids, streamer = load_v4(a)
        info = layer_info(model)
        layers = study_layers(a.results)
        known = {d["layer"] for d in info}
        if layers is not None and not set(layers) <= known:
            raise ValueError(f"{a.results}: study layer(s) {sorted(set(layers) - known)} not in the model {a.model}")
    except (ValueError, OSError, RuntimeError) as e:
        say("e2e", "error", str(e))
        return 2
    rope = {d["layer"]: d["d_rope"] for d in info}
    runs = applicable_presets(latentq, runs, info)
    if not runs:
        say("e2e", "error", f"no run left for {a.model} (every one named a preset its entries cannot hold)")
        return 2
    hooks = [V4CacheInjector(model, **make_fns(latentq, asg, mode, layers, rope)) for asg, mode in runs]
    rows = _Rows(a, latentq, runs, info, layers, ids)
    t0 = time.time()
    try:
        run_forwards(model, ids, hooks, rows, streamer)
    except (ValueError, OSError) as e:
        say("e2e", "error", f"{e}; {a.results} is left unchanged")
        return 2
    cols = {k: np.array([r[k] for r in rows.rows]) for k in rows.rows[0]}
    cols["num_tokens"] = np.full(len(rows.rows), a.num_seqs * a.seq_len, dtype=np.int64)
    pcols = {k: np.array([r[k] for r in rows.pos_rows]) for k in rows.pos_rows[0]}
    selection = "named" if (a.quantizers or a.caches or a.indexer_quantizers) else "all"
    common = {
        "model": os.path.abspath(a.model),
        "cache_family": MODEL_TYPE,
        "text_offset_bytes": a.offset_bytes,
        "seq_len": a.seq_len,
        "num_seqs": a.num_seqs,
        "layers": ",".join(str(d["layer"]) for d in info if layers is None or d["layer"] in layers),
        "device": a.device,
        "dtype": a.dtype,
        "tokenizer": "bytes" if tokenizer is None else type(tokenizer).__name__,
        "text": os.path.abspath(a.text) if a.text else "kjv-heldout",
        "text_sha256": a.text_sha256,
        **execution_attrs(streamer),
        "step_key": a.step_key,
        "selection": selection,
    }
    write_groups(
        a.results,
        {
            "e2e": (_v4_columns(E2E_COLUMNS), cols, {
                **common,
                "definition": "KL(p_ref||p_q) mean over tokens (nats) of DeepSeek-V4 with the caches of `caches` "
                "quantized (latentq.e2e_v4); bytes: the V4 plan's (bytes_per_token, window_bytes_per_seq)",
                "bootstrap_seed": np.int64(SEED),
                "bootstrap_resamples": np.int64(RESAMPLES),
            }),
            **paired_groups(rows.run_stats, rows.draws),
            "e2e_not_run": not_run_group(None, selection),
            "e2e_position": (_v4_columns(E2E_POSITION_COLUMNS), pcols,
                             {**common, "position_bucket": np.int64(a.position_bucket)}),
        },
    )  # fmt: skip
    print(f"e2e: {len(rows.rows)} runs (DeepSeek-V4), {a.num_seqs}x{a.seq_len} tokens, {time.time() - t0:.1f}s -> "
          f"{a.results}:/e2e, /e2e_position")  # fmt: skip
    return 0
