"""Reading a latentq results file (schema latentq-results/1) for the report, and the aggregates the
figures and tables share.

``load_results(path)`` gives (root attributes as str, {group: pandas DataFrame}, notes): one DataFrame
per group of the file, in the file's order, one column per 1-D dataset (strings decoded to str), and the
group's column record in ``df.attrs["columns"]``: a list of {name, dtype, unit, definition}, one per
column, as the writer stored it in the group attribute ``columns`` (latentq/results.h; a file of an older
latentq, without the record: the datasets' names and dtypes, no units or definitions, and a note).
Columns are looked up by their exact recorded names: ``numbers``, ``strings`` and ``flags`` give a column
as a float64, str or bool numpy array [rows], or None when the table has no such column (that removes a
curve or a table column, not the report).
Quantizer spec fields come from the /latent_error columns the C++ format descriptor writes
(``register_specs``, ``parse_spec``); the report never re-parses spec strings.
numpy, h5py and pandas are imported inside the functions, so ``--help`` stays fast.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import re

SCHEMA = "latentq-results/1"
RECORD_FIELDS = ("name", "dtype", "unit", "definition")


class ReportError(Exception):
    """A user/input error: reported as 'latentq report: <file>: <message>', exit code 2."""


# ----------------------------------------------------------------------------------------------
# Columns of a results table (a DataFrame with one column per 1-D dataset of the group)


def column_record(df):
    """The column record of a table: a list of dict(name, dtype, unit, definition), one per column in order
    (df.attrs["columns"] as load_results set it; a DataFrame built without one: its columns, no units)."""
    rec = df.attrs.get("columns")
    if rec is not None:
        return rec
    return [dict(name=c, dtype=str(df[c].dtype), unit="", definition="") for c in df.columns]


def has_column(df, name):
    """Whether the table's column record lists `name` (an exact name)."""
    return name in df.columns and any(c["name"] == name for c in column_record(df))


def numbers(df, name):
    """Float64 array [len(df)] of the column `name`, or None (not a column of the table, or not numeric)."""
    import numpy as np

    if not has_column(df, name):
        return None
    v = df[name].to_numpy()
    if v.dtype.kind in "biuf":
        return v.astype(np.float64)
    try:
        return np.array([float(x) for x in v], dtype=np.float64)
    except (TypeError, ValueError):
        return None


def strings(df, name):
    """Object array of str [len(df)] of the column `name`, or None."""
    import numpy as np

    if not has_column(df, name):
        return None
    return np.array([str(x) for x in df[name].to_numpy()], dtype=object)


def flags(df, name):
    """Bool array [len(df)] of the column `name` (nonzero numbers; strings "1", "true", "yes", "y"), or None."""
    import numpy as np

    if not has_column(df, name):
        return None
    v = df[name].to_numpy()
    if v.dtype.kind in "biuf":
        return v != 0
    return np.array([str(x).strip().lower() in ("1", "true", "yes", "y") for x in v])


def _decode(v):
    import numpy as np

    if v.dtype.kind == "O" or v.dtype.kind == "S":
        return np.array([x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in v], dtype=object)
    if v.dtype.kind == "U":
        return v.astype(object)
    return v


def _attr_str(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    try:
        import numpy as np

        if isinstance(v, np.ndarray) and v.size == 1:
            v = v.reshape(()).item()
            if isinstance(v, bytes):
                return v.decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - attributes of any type; fall through to str()
        pass
    return str(v)


def _dtype_name(v):
    """The record's dtype of a column read back: int64, float64 or string."""
    return {"i": "int64", "u": "int64", "b": "int64", "f": "float64"}.get(v.dtype.kind, "string")


def _read_record(g, cols):
    """The column record of the group g (h5py) whose 1-D columns were read into cols: the parsed attribute
    ``columns`` when it is a JSON list of {name, dtype, unit, definition} naming exactly those columns in
    order, else None (no record: a file of an older latentq; or one that does not match its datasets)."""
    raw = g.attrs.get("columns")
    text = _attr_str(raw) if raw is not None else ""
    if not text.startswith("["):
        return None
    try:
        rec = json.loads(text)
    except ValueError:
        return None
    ok = (
        isinstance(rec, list)
        and all(isinstance(c, dict) and all(isinstance(c.get(k), str) for k in RECORD_FIELDS) for c in rec)
        and [c["name"] for c in rec] == list(cols)
    )
    return [{k: c[k] for k in RECORD_FIELDS} for c in rec] if ok else None


def _read_group(f, g, notes, unrecorded):
    """The DataFrame of /g with its column record in .attrs["columns"], or None (a note says why)."""
    import h5py
    import pandas as pd

    if not isinstance(f[g], h5py.Group):
        notes.append(f"/{g} is not a group; ignored")
        return None
    cols, lens = {}, set()
    for k, ds in f[g].items():
        if not isinstance(ds, h5py.Dataset) or ds.ndim != 1:
            notes.append(f"/{g}/{k} is not a 1-D dataset; column ignored")
            continue
        cols[k] = _decode(ds[()])
        lens.add(len(cols[k]))
    if not cols:
        notes.append(f"/{g} has no columns; ignored")
        return None
    if len(lens) != 1:
        notes.append(f"/{g}: columns differ in length ({sorted(lens)}); group ignored")
        return None
    if lens.pop() == 0:
        notes.append(f"/{g} has no rows; ignored")
        return None
    rec = _read_record(f[g], cols)
    if rec is None:
        unrecorded.append(g)
        rec = [dict(name=k, dtype=_dtype_name(v), unit="", definition="") for k, v in cols.items()]
    df = pd.DataFrame(cols)
    df.attrs["columns"] = rec
    return df


def load_results(path):
    """(root attrs as str dict, {group: pandas DataFrame}, notes) of a latentq-results/1 file: one
    DataFrame per group of the file, in the file's order, one column per 1-D dataset (strings decoded to
    str), its column record in .attrs["columns"]; a group that is not a group, has no 1-D columns, columns of
    unequal lengths or no rows is left out with a note (a group without a column record: a note too).
    Raises ReportError for a missing / non-HDF5 file, a wrong schema or a file without result tables."""
    import h5py

    if not os.path.exists(path):
        raise ReportError("no such file")
    if os.path.isdir(path):
        raise ReportError("is a directory, expected a latentq-results/1 file")
    try:
        is_h5 = h5py.is_hdf5(path)
    except OSError as e:
        raise ReportError(f"cannot read ({e})") from e
    if not is_h5:
        size = os.path.getsize(path)
        raise ReportError(
            "empty file (expected a latentq-results/1 file)"
            if size == 0
            else f"not an HDF5 file (expected a {SCHEMA} file)"
        )
    notes, unrecorded = [], []
    try:
        with h5py.File(path, "r") as f:
            if "schema" not in f.attrs:
                raise ReportError(f"not a {SCHEMA} file (no root attribute 'schema')")
            schema = _attr_str(f.attrs["schema"])
            if schema != SCHEMA:
                raise ReportError(f'not a {SCHEMA} file (schema = "{schema}"); this report reads {SCHEMA} only')
            attrs = {k: _attr_str(v) for k, v in f.attrs.items()}
            tables = {}
            for g in f:
                df = _read_group(f, g, notes, unrecorded)
                if df is not None:
                    tables[g] = df
    except ReportError:
        raise
    except (OSError, KeyError, ValueError) as e:
        raise ReportError(f"cannot read the results file ({e})") from e
    if not [g for g in tables if g not in INDEX_GROUPS]:
        raise ReportError(
            "no result tables (expected groups such as /latent_error and /summary; run `latentq run` first)"
        )
    if unrecorded:
        notes.append(
            "no column record (attribute 'columns': a file of an older latentq, or one that does not list the "
            f"group's datasets): {', '.join('/' + g for g in unrecorded)}; their units and definitions are unknown"
        )
    register_specs(tables.get("latent_error"))
    return attrs, tables, notes


# The group of the cell index (latentq/batch.h): where each cell's rows are, not a result.
INDEX_GROUPS = ("cells",)


_SVD_RE = re.compile(r"^svd-rank(\d+)$")
# Spec fields by quantizer name, from the columns /latent_error stores for each cell (the C++ format
# descriptor wrote them: format, bits, scheme, granularity, group_size, scale_dtype; transform and
# stored), c_kv rows first. The report never re-parses quantizer spec strings.
_SPEC_FIELDS = {}
_FIELD_COLS = ("format", "bits", "scheme", "granularity", "group_size", "scale_dtype")


def register_specs(le):
    """Fill the spec-field table from a /latent_error DataFrame (None or missing columns: nothing).
    A file without a transform column (written before transforms existed) has no transformed rows;
    one without a stored column gives spec=None."""
    _SPEC_FIELDS.clear()
    if le is None or not all(has_column(le, c) for c in _FIELD_COLS + ("quantizer", "target")):
        return
    cols = {c: le[c].to_numpy() for c in _FIELD_COLS + ("quantizer", "target")}
    transform = le["transform"].to_numpy() if has_column(le, "transform") else None
    stored = le["stored"].to_numpy() if has_column(le, "stored") else None
    for want in ("c_kv", "k_pe"):
        for i in range(len(le)):
            q = str(cols["quantizer"][i])
            if str(cols["target"][i]) != want or q in _SPEC_FIELDS:
                continue
            tr = "" if transform is None or str(transform[i]) == "none" else str(transform[i])
            _SPEC_FIELDS[q] = dict(
                kind=str(cols["format"][i]),
                bits=int(cols["bits"][i]),
                scheme=str(cols["scheme"][i]),
                granularity=str(cols["granularity"][i]),
                group_size=int(cols["group_size"][i]),
                scale_dtype=str(cols["scale_dtype"][i]),
                transform=tr,
                spec=None if stored is None else (f"{tr},{stored[i]}" if tr else str(stored[i])),
            )


def parse_spec(q):
    """Family fields of a quantizer: dict(kind, bits, scheme, granularity, group_size, scale_dtype,
    transform, spec), as /latent_error stores them (register_specs) for its first c_kv row (else k_pe).
    kind is the format family ("int", "bf16", "fp8", "mx", "nvfp4", "fp4", "ggml", "turboquant", "lloyd-max",
    "transform-coding"), "svd" for the SVD probe's rank rows, or "other" for a name the results do not
    describe. transform is the canonical transform string of latentq/transform.h ("had", "had64-s9", "rot",
    "klt"; "" for none); spec is "<transform>,<stored>" (or the stored spec alone), which differs from q
    for a mixed assignment (None when the file has no stored column or does not describe q)."""
    if q in _SPEC_FIELDS:
        return _SPEC_FIELDS[q]
    m = _SVD_RE.match(q)
    if m:
        return dict(
            kind="svd",
            bits=None,
            scheme="none",
            granularity="svd",
            group_size=int(m[1]),
            scale_dtype="none",
            transform="",
            spec=None,
        )
    return dict(
        kind="other", bits=None, scheme="?", granularity="?", group_size=0, scale_dtype="?", transform="", spec=None
    )


def is_transformed(q):
    """Whether /latent_error ran q behind a transform ("<transform>,<spec>": rotated before quantizing)."""
    return parse_spec(q)["transform"] != ""


def short_label(q):
    """The label of q in the figures: an integer spec compacted, its transform prefix kept
    (int4-asym-channel-g32 -> "int4 asym ch g32", had,int4-asym-token -> "had,int4 asym tok all"; fp16
    scales implied); any other quantizer, and a row whose name is not its stored spec (a mixed
    assignment), by its name."""
    p = parse_spec(q)
    if p["kind"] != "int" or (p["spec"] is not None and p["spec"] != q):
        return q
    g = {"tensor": "tensor", "channel": "ch", "token": "tok"}[p["granularity"]]
    s = f"int{p['bits']} {p['scheme']} {g}"
    if p["granularity"] != "tensor":
        s += f" g{p['group_size']}" if p["group_size"] else " all"
    if p["scale_dtype"] != "fp16":
        s += f" {p['scale_dtype']}"
    return f"{p['transform']},{s}" if p["transform"] else s


def is_baseline(q):
    """bf16 and the engine / standard formats (anything but our integer quantizers and SVD rows): marked
    on the frontier figure."""
    return parse_spec(q)["kind"] not in ("int", "svd", "other")


def _nanmean(a):
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else math.nan


def _nanmax(a):
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(a.max()) if a.size else math.nan


def quantizer_table(tables):
    """Ordered {quantizer: dict} with bits, scheme, granularity, group_size, bpe (c_kv bits per
    element incl. metadata), err_c_kv / err_c_kv_max / err_k_pe (rel_fro over layers), bytes_model,
    ratio. From /latent_error, completed by /summary and by the spec string."""
    import numpy as np

    Q = {}

    def entry(q):
        if q not in Q:
            p = parse_spec(q)
            Q[q] = dict(
                quantizer=q,
                kind=p["kind"],
                bits=p["bits"],
                scheme=p["scheme"],
                granularity=p["granularity"],
                group_size=p["group_size"],
                scale_dtype=p["scale_dtype"],
                transform=p["transform"],
                bpe=math.nan,
                err_c_kv=math.nan,
                err_c_kv_max=math.nan,
                err_k_pe=math.nan,
                err_k_pe_max=math.nan,
                bytes_model=math.nan,
                ratio=math.nan,
            )
        return Q[q]

    le = tables.get("latent_error")
    if le is not None:
        qs, tg = strings(le, "quantizer"), strings(le, "target")
        rf, bpe = numbers(le, "rel_fro"), numbers(le, "bits_per_element")
        bits = numbers(le, "bits")
        gran, scheme = strings(le, "granularity"), strings(le, "scheme")
        if qs is not None:
            for q in dict.fromkeys(qs):
                e = entry(q)
                m = qs == q
                mc = m & (tg == "c_kv") if tg is not None else m
                mk = m & (tg == "k_pe") if tg is not None else np.zeros_like(m)
                if rf is not None:
                    e["err_c_kv"], e["err_c_kv_max"] = _nanmean(rf[mc]), _nanmax(rf[mc])
                    e["err_k_pe"], e["err_k_pe_max"] = _nanmean(rf[mk]), _nanmax(rf[mk])
                if bpe is not None:
                    e["bpe"] = _nanmean(bpe[mc])
                # Spec-derived family fields win (the row columns describe the *stored* format, e.g.
                # bf16 for fp8 on k_pe); the columns fill in only what the spec string cannot say.
                if e["bits"] is None and bits is not None and mc.any():
                    e["bits"] = int(bits[mc][0]) if np.isfinite(bits[mc][0]) else None
                if e["kind"] == "other" and gran is not None and mc.any():
                    e["granularity"] = gran[mc][0]
                    if scheme is not None:
                        e["scheme"] = scheme[mc][0]
    sm = tables.get("summary")
    if sm is not None:
        qs = strings(sm, "quantizer")
        cols = dict(
            err_c_kv=numbers(sm, "mean_rel_fro_c_kv"),
            err_c_kv_max=numbers(sm, "max_rel_fro_c_kv"),
            err_k_pe=numbers(sm, "mean_rel_fro_k_pe"),
            err_k_pe_max=numbers(sm, "max_rel_fro_k_pe"),
            bpe=numbers(sm, "bits_per_element"),
            bytes_model=numbers(sm, "bytes_per_token_model"),
            ratio=numbers(sm, "ratio_vs_bf16"),
        )
        if qs is not None:
            for i, q in enumerate(qs):
                e = entry(q)
                for k, v in cols.items():
                    # latent_error is the primary source of errors; summary fills what is missing.
                    if v is not None and (k in ("bytes_model", "ratio") or not math.isfinite(e[k])):
                        e[k] = float(v[i])
    return Q


def pareto_front(x, y):
    """Indices of the lower-left Pareto front of points (x, y): no other point has x' <= x and
    y' <= y with one strict. Non-finite points are ignored. Sorted by x ascending."""
    pts = sorted(
        (float(x[i]), float(y[i]), i)
        for i in range(len(x))
        if math.isfinite(float(x[i])) and math.isfinite(float(y[i]))
    )
    front, best = [], math.inf
    k = 0
    while k < len(pts):
        # all points with the same x: only the lowest y can be on the front
        j = k
        while j < len(pts) and pts[j][0] == pts[k][0]:
            j += 1
        xk, yk, ik = pts[k]
        if yk < best:
            front.append(ik)
            best = yk
        k = j
    return front


def symmetric_matrix(a, b, v):
    """(layers, M): M[i, j] = v of the pair (layers[i], layers[j]) given as (a, b) or (b, a); 1 on the
    diagonal where no pair gives it; NaN where neither order is present."""
    import numpy as np

    layers = sorted(set(int(t) for t in a) | set(int(t) for t in b))
    idx = {l: i for i, l in enumerate(layers)}
    n = len(layers)
    M = np.full((n, n), np.nan)
    for ai, bi, vi in zip(a, b, v):
        M[idx[int(ai)], idx[int(bi)]] = vi
    for i in range(n):
        for j in range(n):
            if np.isnan(M[i, j]) and not np.isnan(M[j, i]):
                M[i, j] = M[j, i]
        if np.isnan(M[i, i]):
            M[i, i] = 1.0
    return layers, M


def select_quantizers(Q, patterns, warn):
    """--quantizers: spec strings or '*' globs, in the given order. Default: at each integer bit
    width the channel and the token quantizer with the lowest mean c_kv rel_fro, then bf16 / fp8."""
    names = [q for q in Q if Q[q]["kind"] != "svd"]
    if patterns:
        out = []
        for p in patterns:
            hit = [q for q in names if q == p or fnmatch.fnmatchcase(q, p)]
            if not hit:
                warn(f"--quantizers: '{p}' matches no quantizer of the results file")
            out += [q for q in hit if q not in out]
        if out:
            return out
        warn("--quantizers matched nothing; using the default selection")
    out = []
    bits = sorted({Q[q]["bits"] for q in names if Q[q]["kind"] == "int" and Q[q]["bits"] is not None})
    for b in bits:
        for g in ("channel", "token"):
            cand = [
                q
                for q in names
                if Q[q]["kind"] == "int"
                and Q[q]["bits"] == b
                and Q[q]["granularity"] == g
                and math.isfinite(Q[q]["err_c_kv"])
            ]
            if cand:
                out.append(min(cand, key=lambda q: Q[q]["err_c_kv"]))
    out += [q for q in names if is_baseline(q)]
    if not out:  # unknown families: the first few
        out = names[:6]
    return out


def _mean_by(keys, values):
    """Ordered {key: mean of finite values}."""
    import numpy as np

    out = {}
    for k in dict.fromkeys(keys):
        out[k] = _nanmean(np.asarray(values)[keys == k])
    return out


def attention_by_quantizer(tables):
    """{targets: {quantizer: mean out_rel_fro over layers}} from /attention_error (or {})."""
    import numpy as np

    at = tables.get("attention_error")
    if at is None:
        return {}
    qs, err = strings(at, "quantizer"), numbers(at, "out_rel_fro")
    tg = strings(at, "targets")
    if qs is None or err is None:
        return {}
    if tg is None:
        tg = np.array(["c_kv"] * len(at), dtype=object)
    out = {}
    for t in dict.fromkeys(tg):
        m = tg == t
        out[t] = _mean_by(qs[m], err[m])
    return out


def _attention_key(att):
    """The targets value to plot against c_kv bits: c_kv if present, else c_kv+k_pe, else the first."""
    for t in ("c_kv", "c_kv+k_pe"):
        if t in att:
            return t
    return next(iter(att), None)


def svd_mean_by_rank(tables, col="heldout_rel_fro"):
    """{rank: mean over layers of col} from /svd (centered rows when both kinds are present)."""
    import numpy as np

    sv = tables.get("svd")
    if sv is None:
        return {}
    rank = numbers(sv, "rank")
    err = numbers(sv, col)
    if rank is None or err is None:
        return {}
    m = np.ones(len(sv), dtype=bool)
    cen = flags(sv, "centered")
    if cen is not None and cen.any() and not cen.all():
        m = cen
    out = {}
    for r in sorted(set(rank[m][np.isfinite(rank[m])])):
        out[int(r)] = _nanmean(err[m & (rank == r)])
    return out


def cross_layer_matrices(tables):
    """(layers, {"CKA": M, "mean |Pearson|": M}) from /cross_layer, or None."""
    cl = tables.get("cross_layer")
    if cl is None:
        return None
    a, b = numbers(cl, "layer_a"), numbers(cl, "layer_b")
    cka = numbers(cl, "cka")
    pe = numbers(cl, "mean_abs_pearson")
    if a is None or b is None or (cka is None and pe is None):
        return None
    out, layers = {}, None
    for name, v in (("CKA (linear)", cka), ("mean |Pearson|", pe)):
        if v is not None:
            layers, M = symmetric_matrix(a, b, v)
            out[name] = M
    return layers, out


def e2e_rows(tables, Q):
    """Per prefill-at-once /e2e row (all rows of a file without a cache_mode column): dict(quantizer,
    targets, kl, top1, ppl_ref, ppl_quant, bytes_model), and kl_ci_lo, kl_ci_hi (the 95% interval of kl;
    NaN with one sequence) where the file has kl_mean_ci_lo / kl_mean_ci_hi."""
    e = tables.get("e2e")
    if e is None:
        return []
    qs = strings(e, "quantizer")
    if qs is None:
        return []
    tg = strings(e, "targets")
    modes = strings(e, "cache_mode")
    cols = dict(
        kl=numbers(e, "kl_mean"),
        top1=numbers(e, "top1_agree"),
        ppl_ref=numbers(e, "ppl_ref"),
        ppl_quant=numbers(e, "ppl_quant"),
        nll_ref=numbers(e, "nll_ref"),
        nll_quant=numbers(e, "nll_quant"),
        num_tokens=numbers(e, "num_tokens"),
    )
    if has_column(e, "kl_mean_ci_lo") and has_column(e, "kl_mean_ci_hi"):
        cols.update(kl_ci_lo=numbers(e, "kl_mean_ci_lo"), kl_ci_hi=numbers(e, "kl_mean_ci_hi"))
    rows = []
    for i, q in enumerate(qs):
        if modes is not None and modes[i] != PREFILL_AT_ONCE:
            continue  # decode-order rows: the error-vs-position figure
        r = dict(
            quantizer=q,
            targets=tg[i] if tg is not None else "",
            bytes_model=Q[q]["bytes_model"] if q in Q else math.nan,
        )
        for k, v in cols.items():
            r[k] = float(v[i]) if v is not None else math.nan
        rows.append(r)
    return rows


PREFILL_AT_ONCE = "prefill-at-once"
POSITION_RESIDUALS = (0, 32, 128)  # R of the error-vs-position curves
POSITION_SINKS = (0, 4)  # S of the error-vs-position curves


def position_curves(table, count_col):
    """{(quantizer, cache_mode): (residual, sink, prefill, x [n], kl [n])} from an /e2e_position or
    /attention_position table: per position bucket [pos_start, pos_end) the KL mean weighted by
    `count_col` (tokens / queries) over the rows of the bucket (the layers of /attention_position;
    its targets 'c_kv+k_pe' when present, else its first targets); x = the bucket's midpoint.
    None when a needed column is missing."""
    import numpy as np

    if table is None:
        return None
    q, m = strings(table, "quantizer"), strings(table, "cache_mode")
    a, b, kl = numbers(table, "pos_start"), numbers(table, "pos_end"), numbers(table, "kl_mean")
    if any(v is None for v in (q, m, a, b, kl)):
        return None
    w = numbers(table, count_col)
    w = np.ones(len(table)) if w is None else w
    R, S, P = (numbers(table, c) for c in ("residual", "sink", "prefill"))
    tg = strings(table, "targets")
    keep = np.ones(len(table), dtype=bool)
    if tg is not None:
        pick = "c_kv+k_pe" if "c_kv+k_pe" in set(tg) else tg[0]
        keep = tg == pick
    acc = {}
    for i in np.nonzero(keep & np.isfinite(kl))[0]:
        key = (q[i], m[i])
        d = acc.setdefault(key, {"rsp": tuple(int(v[i]) if v is not None else 0 for v in (R, S, P)), "b": {}})
        s = d["b"].setdefault((a[i], b[i]), [0.0, 0.0])
        s[0] += w[i] * kl[i]
        s[1] += w[i]
    out = {}
    for key, d in acc.items():
        bs = sorted(k for k, v in d["b"].items() if v[1] > 0)
        x = np.array([(lo + hi) / 2 for lo, hi in bs])
        y = np.array([d["b"][k][0] / d["b"][k][1] for k in bs])
        out[key] = (*d["rsp"], x, y)
    return out


def _position_modes(curves):
    """Cache modes drawn: prefill-at-once, and per (R, S) with R in POSITION_RESIDUALS and S in
    POSITION_SINKS the decode mode with the smallest prefill."""
    best = {}
    for (_, mode), (r, s, p, _x, _y) in curves.items():
        if mode == PREFILL_AT_ONCE:
            best[("at-once",)] = (mode, -1)
        elif r in POSITION_RESIDUALS and s in POSITION_SINKS and (best.get((r, s)) is None or p < best[(r, s)][1]):
            best[(r, s)] = (mode, p)
    return {v[0] for v in best.values()}


def _int_attr(attrs, k):
    try:
        return int(float(attrs.get(k, "")))
    except ValueError:
        return None
