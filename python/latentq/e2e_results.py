"""What the e2e step (latentq.e2e) reads of a latentq-results/1 file: the study's layers, its quantizers and
their targets, a mixed assignment's stored specs (a [[mixed]] rule's, or a planner's run of /plan_runs), the
decode-order settings the C++ study writes, and the (quantizer, target) pairs whose format cannot take the width
(/not_applicable). Every function raises ValueError naming the file (missing, unreadable, another schema, a
malformed attribute) instead of h5py's errno text."""

from __future__ import annotations

import os

import h5py
import numpy as np

from latentq.e2e_decode import DECODE_TARGETS
from latentq.progress import say


def open_results(results_path: str) -> h5py.File:
    """Open a results file read-only. Raises ValueError naming the path when it is missing or not a
    readable HDF5 file (instead of h5py's errno text)."""
    if not os.path.isfile(results_path):
        raise ValueError(f"{results_path}: results file not found")
    try:
        return h5py.File(results_path, "r")
    except OSError:
        raise ValueError(f"{results_path}: cannot read the results file (unreadable or not HDF5)") from None


def study_layers(results_path: str) -> list[int] | None:
    """Layers the study ran: the root attribute `layers` ("0,1,2"), else the distinct values of the
    /latent_error `layer` column (ascending); None when neither is present. Raises ValueError on a
    malformed attribute."""
    with open_results(results_path) as f:
        if "layers" in f.attrs:
            v = f.attrs["layers"]
            v = v.decode() if isinstance(v, bytes) else str(v)
            try:
                return [int(x) for x in v.split(",") if x.strip()]
            except ValueError:
                raise ValueError(
                    f"{results_path}: root attribute layers = '{v}', expected comma-separated layer indices"
                ) from None
        if "latent_error" in f and "layer" in f["latent_error"]:
            return sorted({int(x) for x in f["latent_error/layer"][:]})
    return None


def study_quantizers(results_path: str) -> list[tuple[str, tuple[str, ...]]]:
    """(quantizer, targets) pairs of /latent_error's latent rows (c_kv, k_pe) in first-seen order; the index_k rows
    of a sparse MLA study (the indexer key cache, run apart: study_indexer_quantizers) are left out. Raises
    ValueError on a file that is missing, unreadable, not latentq-results/1 or has no /latent_error."""
    with open_results(results_path) as f:
        schema = f.attrs.get("schema", b"")
        schema = schema.decode() if isinstance(schema, bytes) else str(schema)
        if schema != "latentq-results/1":
            raise ValueError(f"{results_path}: schema '{schema}', expected 'latentq-results/1'")
        if "latent_error" not in f:
            raise ValueError(f"{results_path}: no /latent_error group (run `latentq run` first)")
        g = f["latent_error"]
        qs = [q.decode() if isinstance(q, bytes) else str(q) for q in g["quantizer"][:]]
        ts = [t.decode() if isinstance(t, bytes) else str(t) for t in g["target"][:]]
    order: dict[str, list[str]] = {}
    for q, t in zip(qs, ts):
        if t not in ("c_kv", "k_pe"):
            continue
        lst = order.setdefault(q, [])
        if t not in lst:
            lst.append(t)
    return [(q, tuple(t)) for q, t in order.items()]


def study_indexer_quantizers(results_path: str) -> list[str]:
    """The formats of the DSA indexer key cache the study measured (/indexer_error's quantizer column, first-seen
    order; the study's [indexer] quantizers): [] for a study without /indexer_error (a dense MLA dump)."""
    with open_results(results_path) as f:
        if "indexer_error" not in f:
            return []
        qs = [q.decode() if isinstance(q, bytes) else str(q) for q in f["indexer_error"]["quantizer"][:]]
    return list(dict.fromkeys(qs))


def study_v4_quantizers(results_path: str) -> tuple[list[tuple[str, tuple[str, ...]]], list[str]]:
    """A DeepSeek-V4 study's formats (cache_family deepseek_v4): ((quantizer, entry caches) pairs of /latent_error's
    window_kv / compressed_kv rows, in first-seen order, the caches in that order; the formats of its index_k rows
    and of /indexer_error, first-seen order), each run apart by the e2e step as the MLA latents and the indexer keys
    are. Raises ValueError as study_quantizers for a file that is missing, unreadable or not latentq-results/1; a
    file without /latent_error gives ([], [])."""
    dec = lambda v: v.decode() if isinstance(v, bytes) else str(v)
    with open_results(results_path) as f:
        schema = dec(f.attrs.get("schema", b""))
        if schema != "latentq-results/1":
            raise ValueError(f"{results_path}: schema '{schema}', expected 'latentq-results/1'")
        rows = []
        if "latent_error" in f:
            g = f["latent_error"]
            rows = [(dec(q), dec(t)) for q, t in zip(g["quantizer"][:], g["target"][:])]
    order: dict[str, list[str]] = {}
    for q, t in rows:
        if t in ("window_kv", "compressed_kv"):
            order.setdefault(q, [])
            if t not in order[q]:
                order[q].append(t)
    entry = [(q, tuple(sorted(t, key=("window_kv", "compressed_kv").index))) for q, t in order.items()]
    index = [q for q, t in rows if t == "index_k"] + study_indexer_quantizers(results_path)
    return entry, list(dict.fromkeys(index))


def mixed_specs(results_path: str, quantizer: str) -> dict[tuple[int, str], str]:
    """{(layer, target): stored spec} of the /latent_error rows of `quantizer`: what a mixed
    assignment ([[mixed]] in the study config, a name that is no spec) stores on each layer, behind
    its transform ("<transform>,<spec>") where the row's transform column is not "none"; for a name that
    /latent_error lacks, the same of its /plan_runs rows (a planner's run: planned_runs)."""
    dec = lambda v: v.decode() if isinstance(v, bytes) else str(v)
    with open_results(results_path) as f:
        for group in ("latent_error", PLAN_RUNS):
            if group not in f:
                continue
            g = f[group]
            names = g["run" if group == PLAN_RUNS else "quantizer"][:]
            tr = g["transform"][:] if "transform" in g else [b"none"] * len(g["layer"])
            out = {
                (int(l), dec(t)): dec(s) if dec(x) == "none" else f"{dec(x)},{dec(s)}"
                for l, t, q, s, x in zip(g["layer"][:], g["target"][:], names, g["stored"][:], tr)
                if dec(q) == quantizer
            }
            if out:
                return out
    return {}


PLAN_RUNS = "plan_runs"


def planned_runs(results_path: str) -> list[tuple[str, tuple[str, ...]]]:
    """The planner's assignments at the decision's budgets that the e2e step runs as mixed runs on c_kv + k_pe:
    (run name, ("c_kv", "k_pe")) of the /plan_runs rows in first-seen order (written by `latentq run`, `merge`,
    `study` and `decide` before the step: latentq/plan_runs.h); [] when the file has none. mixed_specs gives a
    run's spec per (layer, target)."""
    with open_results(results_path) as f:
        if PLAN_RUNS not in f:
            return []
        runs = [r.decode() if isinstance(r, bytes) else str(r) for r in f[PLAN_RUNS]["run"][:]]
    return [(r, ("c_kv", "k_pe")) for r in dict.fromkeys(runs)]


def decode_settings(results_path: str) -> tuple[list[str] | None, list[str] | None, int | None, list[str] | None]:
    """The root attributes the C++ study writes from its [decode_order] section: (decode_order_modes,
    decode_order_quantizers, decode_order_position_bucket, decode_order_targets), each None when absent.
    Raises ValueError naming the file for a target that is not "c_kv", "k_pe" or "c_kv+k_pe"."""
    dec = lambda v: v.decode() if isinstance(v, bytes) else str(v)
    with open_results(results_path) as f:
        A = f.attrs
        modes = [dec(v) for v in np.atleast_1d(A["decode_order_modes"])] if "decode_order_modes" in A else None
        qs = [dec(v) for v in np.atleast_1d(A["decode_order_quantizers"])] if "decode_order_quantizers" in A else None
        w = int(A["decode_order_position_bucket"]) if "decode_order_position_bucket" in A else None
        tg = [dec(v) for v in np.atleast_1d(A["decode_order_targets"])] if "decode_order_targets" in A else None
    for t in tg or []:
        if t not in DECODE_TARGETS:
            raise ValueError(f"{results_path}: decode_order_targets '{t}', expected one of {', '.join(DECODE_TARGETS)}")
    return modes, qs, w, tg


def not_applicable(results_path: str) -> list[tuple[str, str, int, str]]:
    """(quantizer, target, width, reason) of the /not_applicable rows: the pairs whose format cannot take the
    target's width (latentq/applicable.h, e.g. q8_0 on a k_pe of 16 elements); [] when the group is absent
    (every pair applies)."""
    dec = lambda v: v.decode() if isinstance(v, bytes) else str(v)
    with open_results(results_path) as f:
        if "not_applicable" not in f:
            return []
        g = f["not_applicable"]
        return [
            (dec(q), dec(t), int(w), dec(r))
            for q, t, w, r in zip(g["quantizer"][:], g["target"][:], g["width"][:], g["reason"][:])
        ]


Runs = list[tuple[str, tuple[str, ...]]]


def applicable_only(results_path: str, pairs: Runs, decode_pairs: Runs) -> tuple[Runs, Runs, list[str]]:
    """The (quantizer, targets) runs `pairs` and `decode_pairs` without those that quantize a target their
    quantizer's format cannot take (the /not_applicable rows of the results file), as the study leaves out such
    /attention_error rows; and the notes: one per target, width and reason, naming the quantizers of the runs
    listed there."""
    na = not_applicable(results_path)
    cannot = {(q, t) for q, t, _, _ in na}
    used = {q for q, _ in pairs + decode_pairs}
    keep = lambda runs: [(q, t) for q, t in runs if not any((q, x) in cannot for x in t)]
    by_reason: dict[tuple[str, int, str], list[str]] = {}
    for q, t, w, why in na:
        if q in used:
            by_reason.setdefault((t, w, why), []).append(q)
    notes = [
        f"not applicable, not run on {t} ({w} wide): {', '.join(q)}: {why}" for (t, w, why), q in by_reason.items()
    ]
    return keep(pairs), keep(decode_pairs), notes


def canonical_specs(latentq, specs: list[str], flag: str) -> list[str]:
    """``specs`` in their canonical spelling (latentq.canonical_spec), each once, in first-seen order: a spec
    given twice, under any spelling, runs once, with a note naming the spellings. Raises ValueError naming the
    flag and the spec the grammar refuses."""
    seen: dict[str, list[str]] = {}
    for q in specs:
        try:
            c = latentq.canonical_spec(q)
        except ValueError as e:
            raise ValueError(f"{flag} {q}: {str(e).splitlines()[0]}") from None
        seen.setdefault(c, []).append(q)
    for c, given in seen.items():
        if len(given) > 1:
            say("e2e", "note", f"{flag} names {c} {len(given)} times ({', '.join(given)}): it runs once")
    return list(seen)
