"""Figures and a Markdown report from a latentq results file (schema latentq-results/1).

    .venv/bin/python experiments/report.py RESULTS.h5 --out DIR [--quantizers SPEC ...]

`latentq report RESULTS.h5 --out DIR` runs this script with the project venv and passes its exit
code through. It writes PNG figures into DIR, then DIR/report.md (last), which shows them with
captions and short tables. Figures, each made only when its groups are in the file:

  frontier_c_kv.png        c_kv rel_fro (mean over layers) against bits per element including the
                           scale/offset metadata, Pareto front drawn; with /attention_error a second
                           panel: attention-output rel_fro against the same axis (/latent_error)
  frontier_model_bytes.png c_kv and k_pe rel_fro against bytes per token for the whole model
                           (all layers, c_kv + k_pe), from /summary
  per_layer.png            rel_fro against layer for a set of quantizers (--quantizers; default: the
                           best channel and token quantizer at each bit width + bf16 and fp8)
  svd.png                  normalized singular values of c_kv per layer (/svd_spectrum) and the
                           held-out / fit rel_fro of the rank-r reconstruction (/svd)
  cross_layer.png          linear CKA and mean |Pearson| between the c_kv of two layers (/cross_layer)
  cross_layer_sharing.png  shared-basis vs per-layer SVD error over windows of layers (/cross_layer_sharing)
  e2e.png                  logit KL and perplexity of the model with quantized latents against
                           bytes per token for the whole model (/e2e joined with /summary)
  error_vs_position.png    KL against query position for the decode-order quantizers, one panel per
                           quantizer: e2e logit KL (/e2e_position) and, when present, attention KL
                           (/attention_position, mean over layers); prefill-at-once and the decode
                           orders with residual R in {0, 32, 128} and sink S in {0, 4}

A group that is missing gives no figure and one line saying so (stdout and report.md).
Exit codes: 0 done; 2 input error (missing file, not HDF5, wrong schema, no result tables, bad
--out), with "latentq report: <file>: <what>" on stderr and nothing written; 1 internal error.
Columns are looked up defensively (exact name first, then a name containing the expected words), so a
missing or renamed column removes a curve or a table column, not the report.
"""
from __future__ import annotations

import argparse
import fnmatch
import math
import os
import re
import sys
import tempfile

SCHEMA = "latentq-results/1"
KNOWN_GROUPS = ("latent_error", "summary", "attention_error", "svd", "svd_spectrum", "cross_layer",
                "cross_layer_sharing", "e2e", "e2e_position", "attention_position")
PROG = "latentq report"
FIGURES = ("frontier_c_kv.png", "frontier_model_bytes.png", "per_layer.png", "svd.png", "cross_layer.png",
           "cross_layer_sharing.png", "e2e.png", "error_vs_position.png")


class ReportError(Exception):
    """A user/input error: reported as 'latentq report: <file>: <message>', exit code 2."""


# ----------------------------------------------------------------------------------------------
# Reading


class Table:
    """One results group: column name -> 1-D numpy array (strings decoded to str), all of length n."""

    def __init__(self, name, cols, n):
        self.name, self.cols, self.n = name, cols, n

    def find(self, *names, contains=(), exclude=()):
        """The first of `names` that is a column; else the first column whose name contains every
        word of `contains` and none of `exclude`; else None."""
        for c in names:
            if c in self.cols:
                return c
        if contains:
            for c in self.cols:
                if all(w in c for w in contains) and not any(w in c for w in exclude):
                    return c
        return None

    def num(self, *names, contains=(), exclude=()):
        """Float64 array of the column found by find(), or None (missing or not numeric)."""
        import numpy as np
        c = self.find(*names, contains=contains, exclude=exclude)
        if c is None:
            return None
        v = self.cols[c]
        if v.dtype.kind in "biuf":
            return v.astype(np.float64)
        try:
            return np.array([float(x) for x in v], dtype=np.float64)
        except (TypeError, ValueError):
            return None

    def str(self, *names, contains=(), exclude=()):
        """Str array of the column found by find(), or None."""
        import numpy as np
        c = self.find(*names, contains=contains, exclude=exclude)
        if c is None:
            return None
        return np.array([str(x) for x in self.cols[c]], dtype=object)

    def bool(self, *names, contains=()):
        import numpy as np
        c = self.find(*names, contains=contains)
        if c is None:
            return None
        v = self.cols[c]
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


def load_results(path):
    """(root attrs as str dict, {group: Table}, notes) of a latentq-results/1 file.
    Raises ReportError for a missing / non-HDF5 file, a wrong schema or a file without result tables."""
    import h5py
    if not os.path.exists(path):
        raise ReportError("no such file")
    if os.path.isdir(path):
        raise ReportError("is a directory, expected a latentq-results/1 file")
    try:
        is_h5 = h5py.is_hdf5(path)
    except OSError as e:
        raise ReportError(f"cannot read ({e})")
    if not is_h5:
        size = os.path.getsize(path)
        raise ReportError("empty file (expected a latentq-results/1 file)" if size == 0
                          else f"not an HDF5 file (expected a {SCHEMA} file)")
    notes = []
    try:
        with h5py.File(path, "r") as f:
            if "schema" not in f.attrs:
                raise ReportError(f"not a {SCHEMA} file (no root attribute 'schema')")
            schema = _attr_str(f.attrs["schema"])
            if schema != SCHEMA:
                raise ReportError(f"not a {SCHEMA} file (schema = \"{schema}\"); "
                                  f"this report reads {SCHEMA} only")
            attrs = {k: _attr_str(v) for k, v in f.attrs.items()}
            tables = {}
            for g in KNOWN_GROUPS:
                if g not in f:
                    continue
                if not isinstance(f[g], h5py.Group):
                    notes.append(f"/{g} is not a group; ignored")
                    continue
                cols, lens = {}, set()
                for k, ds in f[g].items():
                    if not isinstance(ds, h5py.Dataset) or ds.ndim != 1:
                        notes.append(f"/{g}/{k} is not a 1-D dataset; column ignored")
                        continue
                    cols[k] = _decode(ds[()])
                    lens.add(len(cols[k]))
                if not cols:
                    notes.append(f"/{g} has no columns; ignored")
                    continue
                if len(lens) != 1:
                    notes.append(f"/{g}: columns differ in length ({sorted(lens)}); group ignored")
                    continue
                n = lens.pop()
                if n == 0:
                    notes.append(f"/{g} has no rows; ignored")
                    continue
                tables[g] = Table(g, cols, n)
    except ReportError:
        raise
    except (OSError, KeyError, ValueError) as e:
        raise ReportError(f"cannot read the results file ({e})")
    if not tables:
        raise ReportError("no result tables (expected groups such as /latent_error and /summary; "
                          "run `latentq run` first)")
    register_specs(tables.get("latent_error"))
    return attrs, tables, notes


# ----------------------------------------------------------------------------------------------
# Quantizer specs and per-quantizer aggregates

_SVD_RE = re.compile(r"^svd-rank(\d+)$")
# Spec fields by quantizer name, from the columns /latent_error stores for each cell (the C++ format
# descriptor wrote them: format, bits, scheme, granularity, group_size, scale_dtype), c_kv rows first.
# The report never re-parses quantizer spec strings.
_SPEC_FIELDS = {}
_FIELD_COLS = ("format", "bits", "scheme", "granularity", "group_size", "scale_dtype")


def register_specs(le):
    """Fill the spec-field table from a /latent_error Table (None or missing columns: nothing)."""
    _SPEC_FIELDS.clear()
    if le is None or not all(c in le.cols for c in _FIELD_COLS + ("quantizer", "target")):
        return
    for want in ("c_kv", "k_pe"):
        for i in range(le.n):
            q = str(le.cols["quantizer"][i])
            if str(le.cols["target"][i]) != want or q in _SPEC_FIELDS:
                continue
            _SPEC_FIELDS[q] = dict(kind=str(le.cols["format"][i]), bits=int(le.cols["bits"][i]),
                                   scheme=str(le.cols["scheme"][i]), granularity=str(le.cols["granularity"][i]),
                                   group_size=int(le.cols["group_size"][i]), scale_dtype=str(le.cols["scale_dtype"][i]))


def parse_spec(q):
    """Family fields of a quantizer: dict(kind, bits, scheme, granularity, group_size, scale_dtype),
    as /latent_error stores them (register_specs). kind is the format family ("int", "bf16", "fp8",
    "mx", "nvfp4", "fp4", "ggml"), "svd" for the SVD probe's rank rows, or "other" for a name the
    results do not describe."""
    if q in _SPEC_FIELDS:
        return _SPEC_FIELDS[q]
    m = _SVD_RE.match(q)
    if m:
        return dict(kind="svd", bits=None, scheme="none", granularity="svd", group_size=int(m[1]), scale_dtype="none")
    return dict(kind="other", bits=None, scheme="?", granularity="?", group_size=0, scale_dtype="?")


def short_label(q):
    """A compact label: int4-asym-channel-g32 -> int4 asym ch g32 (fp16 scales implied)."""
    p = parse_spec(q)
    if p["kind"] != "int":
        return q
    g = {"tensor": "tensor", "channel": "ch", "token": "tok"}[p["granularity"]]
    s = f"int{p['bits']} {p['scheme']} {g}"
    if p["granularity"] != "tensor":
        s += f" g{p['group_size']}" if p["group_size"] else " all"
    if p["scale_dtype"] != "fp16":
        s += f" {p['scale_dtype']}"
    return s


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
            Q[q] = dict(quantizer=q, kind=p["kind"], bits=p["bits"], scheme=p["scheme"],
                        granularity=p["granularity"], group_size=p["group_size"], scale_dtype=p["scale_dtype"],
                        bpe=math.nan, err_c_kv=math.nan, err_c_kv_max=math.nan, err_k_pe=math.nan,
                        err_k_pe_max=math.nan, bytes_model=math.nan, ratio=math.nan)
        return Q[q]

    le = tables.get("latent_error")
    if le is not None:
        qs, tg = le.str("quantizer"), le.str("target")
        rf, bpe = le.num("rel_fro"), le.num("bits_per_element", contains=("bits_per",))
        bits = le.num("bits")
        gran, scheme = le.str("granularity"), le.str("scheme")
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
        qs = sm.str("quantizer")
        cols = dict(err_c_kv=sm.num("mean_rel_fro_c_kv", contains=("mean", "c_kv")),
                    err_c_kv_max=sm.num("max_rel_fro_c_kv", contains=("max", "c_kv")),
                    err_k_pe=sm.num("mean_rel_fro_k_pe", contains=("mean", "k_pe")),
                    err_k_pe_max=sm.num("max_rel_fro_k_pe", contains=("max", "k_pe")),
                    bpe=sm.num("bits_per_element", contains=("bits_per",)),
                    bytes_model=sm.num("bytes_per_token_model", contains=("bytes", "model")),
                    ratio=sm.num("ratio_vs_bf16", contains=("ratio",)))
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
    pts = sorted((float(x[i]), float(y[i]), i) for i in range(len(x))
                 if math.isfinite(float(x[i])) and math.isfinite(float(y[i])))
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
            cand = [q for q in names if Q[q]["kind"] == "int" and Q[q]["bits"] == b and Q[q]["granularity"] == g
                    and math.isfinite(Q[q]["err_c_kv"])]
            if cand:
                out.append(min(cand, key=lambda q: Q[q]["err_c_kv"]))
    out += [q for q in names if is_baseline(q)]
    if not out:  # unknown families: the first few
        out = names[:6]
    return out


# ----------------------------------------------------------------------------------------------
# Plot helpers (matplotlib imported lazily)

GRAN_STYLE = {  # color, label
    "tensor": ("tab:green", "per-tensor"),
    "channel": ("tab:blue", "per-channel"),
    "token": ("tab:orange", "per-token"),
    "tile": ("tab:red", "fp8 e4m3 tile"),
    "element": ("black", "bf16"),
    "svd": ("tab:purple", "SVD rank r"),
    "?": ("tab:gray", "other"),
}
SCHEME_MARKER = {"sym": "o", "asym": "s"}
KIND_MARKER = {"bf16": "D", "svd": "P"}
# engine and standard formats (the `format` column): a star, colored by family
FAMILY_STYLE = {"fp8": ("tab:red", "FP8 (FlashMLA, vLLM)"), "mx": ("tab:brown", "OCP MX"),
                "nvfp4": ("tab:pink", "NVFP4 / FP4"), "fp4": ("tab:pink", "NVFP4 / FP4"), "ggml": ("tab:olive", "ggml")}


def _mpl():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8,
                         "figure.dpi": 100, "savefig.dpi": 150, "axes.grid": True, "grid.alpha": 0.3,
                         "grid.linewidth": 0.5})
    return plt


def _style(e):
    if e["kind"] in FAMILY_STYLE:
        return FAMILY_STYLE[e["kind"]][0], "*"
    color, _ = GRAN_STYLE.get(e["granularity"], GRAN_STYLE["?"])
    marker = KIND_MARKER.get(e["kind"], SCHEME_MARKER.get(e["scheme"], "o"))
    return color, marker


def _legend_handles():
    from matplotlib.lines import Line2D
    h = [Line2D([], [], ls="", marker="o", color=GRAN_STYLE[g][0], label=GRAN_STYLE[g][1])
         for g in ("tensor", "channel", "token")]
    seen = []
    for color, label in FAMILY_STYLE.values():
        if label not in seen:
            seen.append(label)
            h.append(Line2D([], [], ls="", marker="*", ms=9, color=color, mec="black", mew=0.6, label=label))
    h += [Line2D([], [], ls="", marker="D", color="black", label="bf16"),
          Line2D([], [], ls="", marker="o", mfc="white", color="0.3", label="sym (circle)"),
          Line2D([], [], ls="", marker="s", mfc="white", color="0.3", label="asym (square)"),
          Line2D([], [], ls="-", color="0.2", lw=1, label="Pareto front")]
    return h


def place_labels(ax, xs, ys, labels, force=None, fontsize=7, color="black"):
    """Annotate points with labels by a greedy placement in display space: each label tries offsets
    around its point and takes the first where it overlaps no marker, no text already on the axes and
    no earlier label, inside the axes. A label with no free place is left out unless force[i].
    Call after the figure layout is final (the offsets are in points). Returns the indices labelled."""
    fig = ax.figure
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ax_bb = ax.get_window_extent(r)
    from matplotlib.transforms import Bbox
    placed = []
    for line in ax.lines + ax.collections:
        try:
            offs = line.get_offsets() if hasattr(line, "get_offsets") else line.get_xydata()
        except Exception:  # noqa: BLE001 - artists without data
            continue
        if offs is None or len(offs) == 0 or len(offs) > 500:
            continue
        if getattr(line, "get_marker", lambda: "o")() in ("", "None", None):
            continue  # a plain line (Pareto step): labels may cross it
        for px, py in ax.transData.transform(offs):
            if math.isfinite(px) and math.isfinite(py):
                placed.append(Bbox.from_extents(px - 4, py - 4, px + 4, py + 4))
    placed += [t.get_window_extent(r) for t in ax.texts]
    cands = [(5, 2, "left", "bottom"), (5, -2, "left", "top"), (-5, 2, "right", "bottom"), (-5, -2, "right", "top"),
             (8, 0, "left", "center"), (-8, 0, "right", "center"),
             (8, 12, "left", "bottom"), (8, -12, "left", "top"), (-8, 12, "right", "bottom"), (-8, -12, "right", "top"),
             (14, 24, "left", "bottom"), (14, -24, "left", "top"), (-14, 24, "right", "bottom"),
             (-14, -24, "right", "top")]
    force = force or [False] * len(xs)
    done = []
    # forced labels first, then left to right
    for i in sorted(range(len(xs)), key=lambda i: (not force[i], xs[i], ys[i])):
        ok = False
        for dx, dy, ha, va in cands:
            far = abs(dx) > 10 or abs(dy) > 10
            ann = ax.annotate(labels[i], (xs[i], ys[i]), xytext=(dx, dy), textcoords="offset points",
                              fontsize=fontsize, ha=ha, va=va, color=color,
                              arrowprops=dict(arrowstyle="-", lw=0.5, color="0.5", shrinkA=0, shrinkB=3) if far else None)
            bb = ann.get_window_extent(r)
            inside = bb.x0 >= ax_bb.x0 + 1 and bb.x1 <= ax_bb.x1 - 1 and bb.y0 >= ax_bb.y0 + 1 and bb.y1 <= ax_bb.y1 - 1
            if inside and not any(bb.overlaps(p) for p in placed):
                placed.append(bb)
                ok = True
                break
            ann.remove()
        if not ok and force[i]:
            ann = ax.annotate(labels[i], (xs[i], ys[i]), xytext=(5, 2), textcoords="offset points",
                              fontsize=fontsize, ha="left", va="bottom", color=color)
            placed.append(ann.get_window_extent(r))
            ok = True
        if ok:
            done.append(i)
    return sorted(done)


def _publish(tmp, path):
    """Rename tmp over path with the permissions of a normally created file (mkstemp makes 0600)."""
    um = os.umask(0)
    os.umask(um)
    os.chmod(tmp, 0o666 & ~um)
    os.replace(tmp, path)


def _save(fig, path):
    """Save to a temporary file in the same directory, then rename."""
    plt = _mpl()
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", bbox_inches="tight", pad_inches=0.08)
        _publish(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)


def _positive(x, y):
    import numpy as np
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    return np.isfinite(x) & np.isfinite(y) & (y > 0)


def _frontier_panel(ax, Q, names, x, y, xlabel, ylabel, title):
    """Scatter of quantizers (color: granularity, marker: scheme), Pareto front, labels for the front
    and the baselines. Returns (pareto names, names not shown because y <= 0 / NaN)."""
    import numpy as np
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = _positive(x, y)
    hidden = [names[i] for i in range(len(names)) if not ok[i]]
    for i in np.flatnonzero(ok):
        color, marker = _style(Q[names[i]])
        ax.plot(x[i], y[i], ls="", marker=marker, color=color, ms=9 if marker == "*" else 5.5, mec="black" if is_baseline(names[i]) else color,
                mew=0.6, alpha=0.85, zorder=3)
    idx = np.flatnonzero(ok)
    front = [idx[k] for k in pareto_front(x[idx], y[idx])]
    if len(front) > 1:
        ax.step(x[front], y[front], where="post", color="0.2", lw=1, zorder=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return [names[i] for i in front], hidden


def _label_frontier(ax, Q, names, x, y, front):
    import numpy as np
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    lab = [i for i, q in enumerate(names) if (q in front or is_baseline(q)) and _positive(x[i:i + 1], y[i:i + 1])[0]]
    done = place_labels(ax, [x[i] for i in lab], [y[i] for i in lab], [short_label(names[i]) for i in lab],
                        force=[is_baseline(names[i]) for i in lab])
    return [names[lab[k]] for k in done]


# ----------------------------------------------------------------------------------------------
# Figures. Each returns (filename, caption) or None, and may add tables to `md`.


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
    qs, err = at.str("quantizer"), at.num("out_rel_fro", contains=("out", "rel_fro"))
    tg = at.str("targets", "target", contains=("target",))
    if qs is None or err is None:
        return {}
    if tg is None:
        tg = np.array(["c_kv"] * at.n, dtype=object)
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
    rank = sv.num("rank")
    err = sv.num(col, contains=(col.split("_")[0], "rel_fro"))
    if rank is None or err is None:
        return {}
    m = np.ones(sv.n, dtype=bool)
    cen = sv.bool("centered")
    if cen is not None and cen.any() and not cen.all():
        m = cen
    out = {}
    for r in sorted(set(rank[m][np.isfinite(rank[m])])):
        out[int(r)] = _nanmean(err[m & (rank == r)])
    return out


def fig_frontier(out, tables, attrs, Q):
    plt = _mpl()
    import numpy as np
    names = [q for q in Q if Q[q]["kind"] != "svd" and math.isfinite(Q[q]["bpe"])]
    if not names:
        return None
    att = attention_by_quantizer(tables)
    akey = _attention_key(att)
    D = _int_attr(attrs, "kv_lora_rank")
    # the full rank r = kv_lora_rank is exact up to rounding: left out (it would only stretch the log axis)
    svd = {r: v for r, v in svd_mean_by_rank(tables).items() if r < D} if D else {}
    npanel = 2 if akey is not None else 1
    fig, axes = plt.subplots(1, npanel, figsize=(6.4 * npanel, 5.2), squeeze=False)
    axes = axes[0]
    x = [Q[q]["bpe"] for q in names]
    y = [Q[q]["err_c_kv"] for q in names]
    xlabel = "c_kv bits per element, scale/offset metadata included"
    front, hidden = _frontier_panel(axes[0], Q, names, x, y, xlabel, "c_kv rel_fro, mean over layers (log)",
                                    "Latent error: c_kv")
    extra = []
    if svd:
        r = sorted(svd)
        axes[0].plot([16.0 * k / D for k in r], [svd[k] for k in r], color=GRAN_STYLE["svd"][0], marker="P",
                     ms=5, lw=1, ls="--", zorder=2)
        extra.append("SVD rank r (dashed purple, /svd held-out rel_fro) is placed at 16·r/kv_lora_rank bits per "
                     "element (r bf16 coefficients per token; the basis is not counted; r = kv_lora_rank left out)")
    ahidden, afront, sr = [], [], {}
    if akey is not None:
        anames = [q for q in names if q in att[akey]]
        ax_ = [Q[q]["bpe"] for q in anames]
        ay = [att[akey][q] for q in anames]
        afront, ahidden = _frontier_panel(axes[1], Q, anames, ax_, ay, xlabel,
                                          "attention output rel_fro, mean over layers (log)",
                                          f"Attention output error, quantized {akey}")
        sr = {int(parse_spec(q)["group_size"]): v for q, v in att[akey].items()
              if parse_spec(q)["kind"] == "svd" and D and parse_spec(q)["group_size"] < D}
        if sr and D:
            r = sorted(sr)
            axes[1].plot([16.0 * k / D for k in r], [sr[k] for k in r], color=GRAN_STYLE["svd"][0], marker="P",
                         ms=5, lw=1, ls="--", zorder=2)
    handles = _legend_handles()
    if svd:
        from matplotlib.lines import Line2D
        handles.append(Line2D([], [], ls="--", marker="P", color=GRAN_STYLE["svd"][0], label="SVD rank r (bf16 coeff.)"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    if svd:
        r = sorted(svd)
        place_labels(axes[0], [16.0 * k / D for k in r], [svd[k] for k in r], [f"r={k}" for k in r],
                     force=[k in (r[0], r[-1]) for k in r], fontsize=6.5, color=GRAN_STYLE["svd"][0])
    if akey is not None and sr and D:
        r = sorted(sr)
        place_labels(axes[1], [16.0 * k / D for k in r], [sr[k] for k in r], [f"r={k}" for k in r],
                     force=[k in (r[0], r[-1]) for k in r], fontsize=6.5, color=GRAN_STYLE["svd"][0])
    _label_frontier(axes[0], Q, names, x, y, front)
    if akey is not None:
        _label_frontier(axes[1], Q, anames, ax_, ay, afront)
    fn = "frontier_c_kv.png"
    _save(fig, os.path.join(out, fn))
    cap = ("c_kv rel_fro = ‖ĉ_kv − c_kv‖_F / ‖c_kv‖_F (unitless), mean over layers, against the c_kv bits per element "
           "including the scale/offset metadata. Color: granularity; marker: sym (circle) / asym (square); "
           "the line is the lower-left Pareto front; labels: the baselines and the points of the front where "
           "there is room (the whole front is listed at the top of this report).")
    if akey is not None:
        cap += (f" Right: rel_fro of the absorbed attention output (before o_proj) with {akey} quantized "
                "(/attention_error), mean over layers.")
    if extra:
        cap += " " + "; ".join(extra) + "."
    hid = sorted(set(hidden) | set(ahidden))
    if hid:
        cap += f" Not shown on the log axis (error 0 or missing): {', '.join(hid)}."
    return fn, cap, front


def fig_model_bytes(out, tables, attrs, Q):
    plt = _mpl()
    names = [q for q in Q if Q[q]["kind"] != "svd" and math.isfinite(Q[q]["bytes_model"])]
    if not names:
        return None
    has_k = any(math.isfinite(Q[q]["err_k_pe"]) and Q[q]["err_k_pe"] > 0 for q in names)
    n = 2 if has_k else 1
    fig, axes = plt.subplots(1, n, figsize=(6.4 * n, 5.2), squeeze=False)
    axes = axes[0]
    x = [Q[q]["bytes_model"] for q in names]
    L = attrs.get("num_layers", "?")
    xlabel = f"cache bytes per token, whole model ({L} layers, c_kv + k_pe)"
    panels = [("err_c_kv", "c_kv rel_fro, mean over layers (log)", "c_kv error vs model cache size")]
    if has_k:
        panels.append(("err_k_pe", "k_pe rel_fro, mean over layers (log)", "k_pe error vs model cache size"))
    res = []
    for ax, (k, yl, t) in zip(axes, panels):
        y = [Q[q][k] for q in names]
        res.append((ax, y) + _frontier_panel(ax, Q, names, x, y, xlabel, yl, t))
    # a top axis with the ratio to bf16 when /summary gives it
    ratios = [(Q[q]["bytes_model"], Q[q]["ratio"]) for q in names if math.isfinite(Q[q]["ratio"]) and Q[q]["ratio"] > 0]
    if ratios:
        bf16_bytes = ratios[0][0] / ratios[0][1]
        for ax in axes:
            sec = ax.secondary_xaxis("top", functions=(lambda b, s=bf16_bytes: b / s, lambda r, s=bf16_bytes: r * s))
            sec.set_xlabel("fraction of the bf16 cache")
    fig.legend(handles=_legend_handles(), loc="lower center", ncol=4, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    notes = []
    for (ax, y, front, hid), (k, _, _) in zip(res, panels):
        _label_frontier(ax, Q, names, x, y, front)
        target = "c_kv" if k == "err_c_kv" else "k_pe"
        zero = sorted(q for q in hid if math.isfinite(Q[q][k]))
        nan = [q for q in hid if not math.isfinite(Q[q][k])]
        if nan:
            notes.append(f"{target} panel: {len(nan)} of {len(names)} quantizers have no {target} error "
                         f"(not run on {target}) and are not shown")
        if zero:
            notes.append(f"{target} panel: error 0, not shown on the log axis: {', '.join(zero)}")
    fn = "frontier_model_bytes.png"
    _save(fig, os.path.join(out, fn))
    cap = (f"Mean rel_fro over layers against the latent cache size of the whole model in bytes per token "
           f"(all {L} layers, c_kv + k_pe, metadata included; a target that did not run a quantizer counts as bf16), "
           "from /summary. Line: Pareto front.")
    if ratios:
        cap += " Top axis: the same size as a fraction of the bf16 cache."
    if notes:
        cap += " " + "; ".join(notes) + "."
    return fn, cap


def fig_per_layer(out, tables, attrs, Q, selected, user_selected=False):
    plt = _mpl()
    import numpy as np
    le = tables["latent_error"]
    lay, qs, tg, rf = le.num("layer"), le.str("quantizer"), le.str("target"), le.num("rel_fro")
    if lay is None or qs is None or rf is None:
        return None
    if tg is None:
        tg = np.array(["c_kv"] * le.n, dtype=object)
    panels = [t for t in ("c_kv", "k_pe") if np.any((tg == t) & np.isin(qs, selected))]
    at = tables.get("attention_error")
    att_panel = None
    if at is not None:
        aq, al = at.str("quantizer"), at.num("layer")
        ae = at.num("out_rel_fro", contains=("out", "rel_fro"))
        atg = at.str("targets", "target", contains=("target",))
        if aq is not None and al is not None and ae is not None:
            if atg is None:
                atg = np.array(["c_kv"] * at.n, dtype=object)
            key = _attention_key({t: 1 for t in dict.fromkeys(atg)})
            m = (atg == key) & np.isin(aq, selected)
            if m.any():
                att_panel = (key, aq[m], al[m], ae[m])
    n = len(panels) + (att_panel is not None)
    if n == 0:
        return None
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.8), squeeze=False)
    axes = list(axes[0])
    cmap = plt.get_cmap("tab10")
    styles = {}
    # color by bit width (line style by granularity) when that tells the selected quantizers apart
    family = [(Q.get(q, {}).get("kind"), Q.get(q, {}).get("bits"), Q.get(q, {}).get("granularity")) for q in selected]
    by_bits = len(set(family)) == len(family)
    bit_color = {2: "tab:red", 3: "tab:orange", 4: "tab:blue", 5: "tab:cyan", 6: "tab:olive", 8: "tab:green"}
    for i, q in enumerate(selected):
        kind, bits, g = family[i]
        ls = {"channel": "-", "token": "--", "tensor": ":"}.get(g, "-.")
        if kind == "bf16":
            color = "black"
        elif kind == "fp8":
            color = "tab:purple"
        elif by_bits and bits in bit_color:
            color = bit_color[bits]
        else:
            color = cmap(i % 10)
        styles[q] = dict(color=color, ls=ls, marker="osD^v<>*PX"[i % 10], ms=4, lw=1.3)
    hidden = set()

    def draw(ax, layers, errs, q):
        o = np.argsort(layers)
        l, e = layers[o], errs[o]
        ok = np.isfinite(e) & (e > 0)
        if not ok.any():
            hidden.add(q)
            return
        ax.plot(l[ok], e[ok], label=short_label(q), **styles[q])

    for ax, t in zip(axes, panels):
        for q in selected:
            m = (qs == q) & (tg == t)
            if m.any():
                draw(ax, lay[m], rf[m], q)
        ax.set_title(f"{t} error per layer")
        ax.set_ylabel(f"{t} rel_fro (log)")
    if att_panel is not None:
        key, aq, al, ae = att_panel
        ax = axes[len(panels)]
        for q in selected:
            m = aq == q
            if m.any():
                draw(ax, al[m], ae[m], q)
        ax.set_title(f"Attention output error per layer ({key} quantized)")
        ax.set_ylabel("attention output rel_fro (log)")
    all_layers = sorted(set(int(v) for v in lay[np.isfinite(lay)]))
    for ax in axes:
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        if len(all_layers) <= 12:
            ax.set_xticks(all_layers)
        else:
            from matplotlib.ticker import MaxNLocator
            ax.xaxis.set_major_locator(MaxNLocator(nbins=10, integer=True))
    h, lab = [], []
    for ax in axes:
        for hh, ll in zip(*ax.get_legend_handles_labels()):
            if ll not in lab:
                h.append(hh)
                lab.append(ll)
    ncol = min(4, max(1, len(lab)))
    fig.legend(h, lab, loc="lower center", ncol=ncol, frameon=False)
    rows = math.ceil(len(lab) / ncol)
    fig.tight_layout(rect=(0, min(0.4, 0.05 + 0.05 * rows), 1, 1))
    fn = "per_layer.png"
    _save(fig, os.path.join(out, fn))
    cap = ("rel_fro (unitless, log scale) per layer for the selected quantizers"
           + (" (given by --quantizers)" if user_selected else
              " (default: the best channel and token quantizer at each bit width by mean c_kv rel_fro, "
              "and the bf16 / fp8 baselines)")
           + ". Line style: solid per-channel, dashed per-token, dotted per-tensor, dash-dot bf16 / fp8"
           + ("; color: bit width." if by_bits else "."))
    if att_panel is not None:
        cap += f" Right: attention output rel_fro with {att_panel[0]} quantized (/attention_error)."
    if hidden:
        cap += f" Not shown on the log axis (error 0 or missing): {', '.join(sorted(hidden))}."
    return fn, cap


def fig_svd(out, tables, attrs):
    plt = _mpl()
    import numpy as np
    sp, sv = tables.get("svd_spectrum"), tables.get("svd")
    panels = []
    if sp is not None and sp.num("layer") is not None and sp.num("singular_value", contains=("singular",)) is not None:
        panels.append("spectrum")
    if sv is not None and sv.num("layer") is not None and sv.num("rank") is not None and \
            sv.num("heldout_rel_fro", contains=("heldout",)) is not None:
        panels.append("rank")
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 4.8), squeeze=False)
    axes = list(axes[0])
    from matplotlib.colors import ListedColormap, Normalize
    cmap = ListedColormap(plt.get_cmap("viridis")(np.linspace(0, 0.9, 256)))  # no pale yellow end
    notes = []
    many = 10  # more layers than this: a colorbar instead of one legend entry per layer
    all_layers = set()
    for t in (sp, sv):
        if t is not None and t.num("layer") is not None:
            all_layers |= {int(v) for v in t.num("layer") if np.isfinite(v)}
    norm = Normalize(min(all_layers, default=0), max(max(all_layers, default=1), min(all_layers, default=0) + 1))

    def colors(layers):
        return {l: cmap(norm(l)) for l in layers}

    ai = 0
    if "spectrum" in panels:
        ax = axes[ai]
        ai += 1
        lay = sp.num("layer")
        s = sp.num("singular_value", contains=("singular",))
        idx = sp.num("index", contains=("index",))
        layers = sorted(set(int(v) for v in lay[np.isfinite(lay)]))
        col = colors(layers)
        for l in layers:
            m = lay == l
            sl = s[m]
            il = idx[m] if idx is not None else np.arange(m.sum())
            o = np.argsort(il)
            sl, il = sl[o], il[o]
            s0 = np.nanmax(sl) if sl.size else 0
            if not s0 > 0:
                continue
            ok = sl > 0
            ax.plot(il[ok], sl[ok] / s0, color=col[l], lw=1.2, label=f"layer {l}")
        ax.set_yscale("log")
        ax.set_xlabel("singular value index i (0 = largest)")
        ax.set_ylabel(r"normalized singular value $\sigma_i/\sigma_0$ (log)")
        ax.set_title("c_kv spectrum per layer")
        if len(layers) <= many:
            ax.legend(fontsize=7)
    if "rank" in panels:
        ax = axes[ai]
        lay, rank = sv.num("layer"), sv.num("rank")
        ho = sv.num("heldout_rel_fro", contains=("heldout",))
        fit = sv.num("fit_rel_fro", contains=("fit", "rel_fro"))
        cen = sv.bool("centered")
        m0 = np.ones(sv.n, dtype=bool)
        if cen is not None and cen.any() and not cen.all():
            m0 = cen
            notes.append("centered fits shown (the file also has uncentered ones)")
        elif cen is not None:
            notes.append("centered fits" if cen.all() else "uncentered fits")
        D = _int_attr(attrs, "kv_lora_rank")
        if D and np.any(m0 & (rank >= D)):
            # the full rank is exact up to rounding; it would only stretch the log axis
            m0 = m0 & (rank < D)
            notes.append("r = kv_lora_rank (exact up to rounding) left out")
        layers = sorted(set(int(v) for v in lay[m0 & np.isfinite(lay)]))
        col = colors(layers)
        for l in layers:
            m = m0 & (lay == l)
            o = np.argsort(rank[m])
            r = rank[m][o]
            e = ho[m][o]
            ok = np.isfinite(e) & (e > 0)
            ax.plot(r[ok], e[ok], color=col[l], lw=1.3, marker="o", ms=3, label=f"layer {l} held-out")
            if fit is not None:
                f = fit[m][o]
                okf = np.isfinite(f) & (f > 0)
                ax.plot(r[okf], f[okf], color=col[l], lw=0.9, ls="--", alpha=0.7)
        from matplotlib.lines import Line2D
        h, lab = ax.get_legend_handles_labels()
        h = [Line2D([], [], color=hh.get_color(), lw=1.3) for hh in h]
        lab = [x.replace(" held-out", "") for x in lab]
        if len(layers) > many:
            h, lab = [], []
        h += [Line2D([], [], color="0.3", lw=1.3, marker="o", ms=3), Line2D([], [], color="0.3", lw=0.9, ls="--")]
        lab += ["held-out split", "fit split"]
        ax.legend(h, lab, fontsize=7)
        ax.set_yscale("log")
        ax.set_xlabel("rank r (coefficients per token)" + (f", of kv_lora_rank = {D}" if D else ""))
        ax.set_ylabel("c_kv rel_fro of the rank-r reconstruction (log)")
        ax.set_title("SVD pruning error per layer")
    fig.tight_layout()
    if len(all_layers) > many:
        from matplotlib.cm import ScalarMappable
        cb = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, fraction=0.025, pad=0.01)
        cb.set_label("layer")
    fn = "svd.png"
    _save(fig, os.path.join(out, fn))
    cap = []
    if "spectrum" in panels:
        cap.append("Left: singular values of c_kv normalized by the largest, σ_i/σ_0 (log), one line per layer (/svd_spectrum).")
    if "rank" in panels:
        cap.append("Right: rel_fro of the rank-r reconstruction of c_kv per layer, solid on the held-out split, "
                   "dashed on the fit split (/svd)" + "".join(f"; {n}" for n in notes) + ".")
    return fn, " ".join(cap)


def cross_layer_matrices(tables):
    """(layers, {"CKA": M, "mean |Pearson|": M}) from /cross_layer, or None."""
    cl = tables.get("cross_layer")
    if cl is None:
        return None
    a, b = cl.num("layer_a", "a", "layer_i", "layer_x"), cl.num("layer_b", "b", "layer_j", "layer_y")
    cka = cl.num("cka", "cka_linear", contains=("cka",))
    pe = cl.num("mean_abs_pearson", "pearson_mean_abs", contains=("pearson",), exclude=("channels",))
    if a is None or b is None or (cka is None and pe is None):
        return None
    out, layers = {}, None
    for name, v in (("CKA (linear)", cka), ("mean |Pearson|", pe)):
        if v is not None:
            layers, M = symmetric_matrix(a, b, v)
            out[name] = M
    return layers, out


def fig_cross_layer(out, tables, attrs):
    plt = _mpl()
    import numpy as np
    r = cross_layer_matrices(tables)
    if r is None:
        return None
    layers, mats = r
    n = len(layers)
    k = len(mats)
    side = min(7.0, max(3.6, 0.45 * n + 1.8))
    fig, axes = plt.subplots(1, k, figsize=(side * k + 1.0, side), squeeze=False)
    axes = list(axes[0])
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_bad("0.85")
    im = None
    for ax, (name, M) in zip(axes, mats.items()):
        im = ax.imshow(np.ma.masked_invalid(M), vmin=0, vmax=1, cmap=cmap, origin="upper")
        ax.set_title(f"{name} of c_kv between layers")
        step = max(1, math.ceil(n / 24))
        ax.set_xticks(range(0, n, step))
        ax.set_xticklabels([layers[i] for i in range(0, n, step)])
        ax.set_yticks(range(0, n, step))
        ax.set_yticklabels([layers[i] for i in range(0, n, step)])
        ax.set_xlabel("layer")
        ax.set_ylabel("layer")
        ax.grid(False)
        if n <= 16:
            fs = 8 if n <= 8 else 6
            for i in range(n):
                for j in range(n):
                    v = M[i, j]
                    if np.isfinite(v):
                        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=fs,
                                color="black" if v > 0.6 else "white")
    fig.tight_layout(rect=(0, 0, 0.92, 1))
    cax = fig.add_axes((0.93, 0.15, 0.015, 0.7))
    cb = fig.colorbar(im, cax=cax)
    cb.set_label("similarity (0 … 1, unitless)")
    fn = "cross_layer.png"
    _save(fig, os.path.join(out, fn))
    cap = ("Similarity of the c_kv latents of two layers over the same tokens (/cross_layer): linear CKA "
           "(invariant to rotations of the latent space) and the mean over latent dimensions of |Pearson| between "
           "the same dimension of the two layers; same color scale 0…1, diagonal = 1, gray = pair not measured.")
    return fn, cap, layers, mats


def fig_sharing(out, tables, attrs):
    plt = _mpl()
    import numpy as np
    t = tables.get("cross_layer_sharing")
    if t is None:
        return None
    ws = t.num("window_start", "first_layer", contains=("start",))
    w = t.num("window", "window_size", "w")
    rank = t.num("rank", "total_rank", "k")
    sh = t.num("shared_heldout_rel_fro", contains=("shared", "heldout"))
    pl = t.num("per_layer_heldout_rel_fro", contains=("per_layer", "heldout"))
    if rank is None or (sh is None and pl is None):
        return None
    if ws is None:
        ws = np.zeros(t.n)
    if w is None:
        w = np.zeros(t.n)
    keys = sorted(set(zip(w.tolist(), ws.tolist())))
    fig, ax = plt.subplots(figsize=(7.0, 4.8))
    cmap = plt.get_cmap("tab10")
    for i, (wi, si) in enumerate(keys):
        m = (w == wi) & (ws == si)
        o = np.argsort(rank[m])
        r = rank[m][o]
        lab = f"layers {int(si)}–{int(si + wi - 1)}" if wi > 0 else f"window {i}"
        for v, ls, suffix in ((sh, "-", "shared"), (pl, "--", "per layer")):
            if v is None:
                continue
            e = v[m][o]
            ok = np.isfinite(e) & (e > 0)
            ax.plot(r[ok], e[ok], color=cmap(i % 10), ls=ls, marker="o", ms=3, lw=1.2,
                    label=f"{lab}, {suffix}")
    ax.set_yscale("log")
    ax.set_xlabel("total rank k of the window (coefficients per token for all its layers)")
    ax.set_ylabel("c_kv held-out rel_fro (log)")
    ax.set_title("Cross-layer shared basis vs per-layer bases")
    ax.legend(fontsize=7, ncol=2 if len(keys) > 4 else 1)
    fig.tight_layout()
    fn = "cross_layer_sharing.png"
    _save(fig, os.path.join(out, fn))
    cap = ("Held-out c_kv rel_fro of one SVD basis shared by a window of adjacent layers (solid) against "
           "separate per-layer bases with the same total rank k, k/w per layer (dashed) (/cross_layer_sharing).")
    return fn, cap


def e2e_rows(tables, Q):
    """Per prefill-at-once /e2e row (all rows of a file without a cache_mode column): dict(quantizer,
    targets, kl, top1, ppl_ref, ppl_quant, bytes_model)."""
    e = tables.get("e2e")
    if e is None:
        return []
    qs = e.str("quantizer")
    if qs is None:
        return []
    tg = e.str("targets", "target", contains=("target",))
    modes = e.str("cache_mode")
    cols = dict(kl=e.num("kl_mean", contains=("kl",)), top1=e.num("top1_agree", contains=("top1",)),
                ppl_ref=e.num("ppl_ref", contains=("ppl", "ref")), ppl_quant=e.num("ppl_quant", contains=("ppl", "quant")),
                nll_ref=e.num("nll_ref"), nll_quant=e.num("nll_quant"), num_tokens=e.num("num_tokens", contains=("tokens",)))
    rows = []
    for i, q in enumerate(qs):
        if modes is not None and modes[i] != PREFILL_AT_ONCE:
            continue  # decode-order rows: the error-vs-position figure
        r = dict(quantizer=q, targets=tg[i] if tg is not None else "",
                 bytes_model=Q[q]["bytes_model"] if q in Q else math.nan)
        for k, v in cols.items():
            r[k] = float(v[i]) if v is not None else math.nan
        rows.append(r)
    return rows


def fig_e2e(out, tables, attrs, Q):
    plt = _mpl()
    import numpy as np
    rows = e2e_rows(tables, Q)
    rows = [r for r in rows if math.isfinite(r["bytes_model"])]
    if not rows:
        return None
    has_ppl = any(math.isfinite(r["ppl_quant"]) for r in rows)
    n = 2 if has_ppl else 1
    fig, axes = plt.subplots(1, n, figsize=(6.4 * n, 5.2), squeeze=False)
    axes = list(axes[0])
    names = [r["quantizer"] for r in rows]
    # Q entries for quantizers only in /e2e
    for q in names:
        if q not in Q:
            p = parse_spec(q)
            Q[q] = dict(quantizer=q, kind=p["kind"], scheme=p["scheme"], granularity=p["granularity"])
    x = np.array([r["bytes_model"] for r in rows])
    kl = np.array([r["kl"] for r in rows])
    L = attrs.get("num_layers", "?")
    xlabel = f"cache bytes per token, whole model ({L} layers, c_kv + k_pe)"
    front, hidden = _frontier_panel(axes[0], Q, names, x, kl, xlabel, "logit KL(p_ref ‖ p_quant), nats per token (log)",
                                    "End to end: logit KL")
    if has_ppl:
        pq = np.array([r["ppl_quant"] for r in rows])
        pref = [r["ppl_ref"] for r in rows if math.isfinite(r["ppl_ref"])]
        ax = axes[1]
        for i in range(len(rows)):
            if math.isfinite(pq[i]):
                color, marker = _style(Q[names[i]])
                ax.plot(x[i], pq[i], ls="", marker=marker, color=color, ms=9 if marker == "*" else 5.5, alpha=0.85,
                        mec="black" if is_baseline(names[i]) else color, mew=0.6)
        if pref:
            ax.axhline(float(np.median(pref)), color="0.2", ls="--", lw=1)
            ax.annotate(f"reference ppl {np.median(pref):.4g}", (1.0, float(np.median(pref))),
                        xycoords=("axes fraction", "data"), xytext=(-4, 3), textcoords="offset points",
                        ha="right", fontsize=7.5)
        ok = np.isfinite(pq)
        if ok.any() and pref and (np.nanmax(pq) / max(min(pref), 1e-12)) > 10:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("perplexity per token with quantized latents")
        ax.set_title("End to end: perplexity")
    fig.legend(handles=_legend_handles(), loc="lower center", ncol=4, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    _label_frontier(axes[0], Q, names, x, kl, front)
    fn = "e2e.png"
    _save(fig, os.path.join(out, fn))
    cap = ("The model run with quantized latents on held-out text (/e2e), against the cache bytes per token of the "
           "whole model (/summary). Left: mean over tokens of KL(p_ref ‖ p_quant) of the next-token distributions, "
           "nats (log), Pareto front drawn. Right: perplexity; dashed: the reference model.")
    if hidden:
        cap += f" Not shown on the log axis (KL 0 or missing): {', '.join(sorted(hidden))}."
    return fn, cap


PREFILL_AT_ONCE = "prefill-at-once"
POSITION_RESIDUALS = (0, 32, 128)   # R of the error-vs-position curves
POSITION_SINKS = (0, 4)             # S of the error-vs-position curves
POSITION_MAX_PANELS = 4


def position_curves(table, count_col):
    """{(quantizer, cache_mode): (residual, sink, prefill, x [n], kl [n])} from an /e2e_position or
    /attention_position table: per position bucket [pos_start, pos_end) the KL mean weighted by
    `count_col` (tokens / queries) over the rows of the bucket (the layers of /attention_position;
    its targets 'c_kv+k_pe' when present, else its first targets); x = the bucket's midpoint.
    None when a needed column is missing."""
    import numpy as np
    if table is None:
        return None
    q, m = table.str("quantizer"), table.str("cache_mode")
    a, b, kl = table.num("pos_start"), table.num("pos_end"), table.num("kl_mean")
    if any(v is None for v in (q, m, a, b, kl)):
        return None
    w = table.num(count_col)
    w = np.ones(table.n) if w is None else w
    R, S, P = (table.num(c) for c in ("residual", "sink", "prefill"))
    tg = table.str("targets")
    keep = np.ones(table.n, dtype=bool)
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


def fig_position(out, tables):
    """error_vs_position.png (see the module docstring); returns (filename, caption, table markdown) or
    None when neither /e2e_position nor /attention_position has a decode-order row with the columns."""
    import numpy as np
    e = position_curves(tables.get("e2e_position"), "tokens")
    a = position_curves(tables.get("attention_position"), "queries")
    sources = [(n, c) for n, c in (("e2e logit KL", e), ("attention KL (mean over layers)", a)) if c]
    qs = []
    for _, c in sources:
        for (q, mode) in c:
            if mode != PREFILL_AT_ONCE and q not in qs:
                qs.append(q)
    if not qs:
        return None
    shown, dropped = qs[:POSITION_MAX_PANELS], qs[POSITION_MAX_PANELS:]
    plt = _mpl()
    fig, axes = plt.subplots(len(sources), len(shown), figsize=(4.6 * len(shown), 3.8 * len(sources)),
                             squeeze=False)
    colors = {0: "tab:red", 32: "tab:orange", 128: "tab:green"}
    drawn_modes = set()
    for row, (what, curves) in enumerate(sources):
        modes = _position_modes(curves)
        for col, q in enumerate(shown):
            ax = axes[row][col]
            for (qq, mode), (r, s, p, x, y) in sorted(curves.items(), key=lambda kv: kv[1][:3]):
                if qq != q or mode not in modes:
                    continue
                ok = y > 0
                if mode == PREFILL_AT_ONCE:
                    ax.plot(x[ok], y[ok], color="black", ls=":", lw=1.4, label="prefill-at-once")
                else:
                    ax.plot(x[ok], y[ok], color=colors[r], ls="-" if s == 0 else "--", marker="o", ms=3, lw=1.2,
                            label=f"R={r}, S={s}" + (f", P={p}" if p else ""))
                drawn_modes.add(mode)
            ax.set_yscale("log")
            ax.set_title(q, fontsize=9)
            ax.set_xlabel("query position (bucket midpoint)")
            if col == 0:
                ax.set_ylabel(f"{what}, nats")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fn = "error_vs_position.png"
    _save(fig, os.path.join(out, fn))
    cap = ("KL against query position, by decode-order cache mode (latentq/decode_order.h): color = residual R "
           "(most recent keys read in bf16: red 0, orange 32, green 128), solid S = 0, dashed S = 4 sink tokens in "
           "bf16; dotted black: the whole window quantized at once (the study's rows). "
           + " ".join(f"Row {i + 1}: {w}." for i, (w, _) in enumerate(sources)))
    if dropped:
        cap += f" Not drawn (first {POSITION_MAX_PANELS} quantizers only): {', '.join(dropped)}."
    # Table: e2e KL first/last bucket and bytes per token of each drawn (quantizer, mode)
    rows = []
    src = e or a
    bpt = {}
    t = tables.get("e2e")
    if t is not None and t.str("cache_mode") is not None and t.num("bytes_per_token") is not None:
        ttg = t.str("targets")  # the target set the curves drew (position_curves): c_kv+k_pe when run
        pick = None if ttg is None else ("c_kv+k_pe" if "c_kv+k_pe" in set(ttg) else ttg[0])
        bpt = {(q, m): v for q, m, v, tg in zip(t.str("quantizer"), t.str("cache_mode"), t.num("bytes_per_token"),
                                                ttg if ttg is not None else [None] * t.n) if tg == pick}
    for (q, mode), (r, s, p, x, y) in sorted(src.items(), key=lambda kv: (qs.index(kv[0][0]) if kv[0][0] in qs else 99,
                                                                            kv[1][:3])):
        if q not in shown or mode not in drawn_modes or not len(y):
            continue
        rows.append([f"`{q}`", mode, fmt(bpt.get((q, mode), math.nan), "f1"), fmt(float(y[0]), "e"),
                     fmt(float(y[-1]), "e"), fmt(float(np.mean(y)), "e")])
    tmd = md_table(["quantizer", "cache mode", "B/token/layer", "KL first bucket", "KL last bucket", "KL mean of buckets"],
                   rows) if rows else ""
    return fn, cap, tmd


def _int_attr(attrs, k):
    try:
        return int(float(attrs.get(k, "")))
    except ValueError:
        return None


# ----------------------------------------------------------------------------------------------
# Markdown


def fmt(v, kind="g"):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if kind == "g":
        return f"{v:.3g}"
    if kind == "e":
        return f"{v:.2e}"
    if kind == "f1":
        return f"{v:.1f}"
    if kind == "f3":
        return f"{v:.3f}"
    if kind == "f4":
        return f"{v:.4f}"
    return str(v)


def md_table(header, rows):
    """A Markdown table; '|' inside a cell is escaped."""
    def cell(c):
        return str(c).replace("|", "\\|")
    out = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def table_top_by_bits(Q, att, e2e, k=3):
    """Top k quantizers by mean c_kv rel_fro at each bit width (integer bits; baselines separately)."""
    akey = _attention_key(att)
    kl = {r["quantizer"]: r["kl"] for r in e2e}
    header = ["bits", "rank", "quantizer", "c_kv bits/elem", "bytes/token (model)", "c_kv rel_fro mean",
              "c_kv rel_fro max", "k_pe rel_fro mean"]
    if akey:
        header.append(f"attn out rel_fro ({akey})")
    if kl:
        header.append("e2e KL (nats)")
    rows = []
    groups = {}
    for q, e in Q.items():
        if e["kind"] == "svd" or not math.isfinite(e.get("err_c_kv", math.nan)):
            continue
        groups.setdefault(_bits_group(q, Q), []).append(q)
    for b in _group_order(groups):
        qs = sorted(groups[b], key=lambda q: Q[q]["err_c_kv"])[:k]
        for i, q in enumerate(qs, 1):
            e = Q[q]
            r = [b, i, f"`{q}`", fmt(e["bpe"], "g"), fmt(e["bytes_model"], "f1"), fmt(e["err_c_kv"], "e"),
                 fmt(e["err_c_kv_max"], "e"), fmt(e["err_k_pe"], "e")]
            if akey:
                r.append(fmt(att[akey].get(q, math.nan), "e"))
            if kl:
                r.append(fmt(kl.get(q, math.nan), "e"))
            rows.append(r)
    return md_table(header, rows) if rows else ""


def table_svd_ranks(tables):
    """Per layer: energy ranks (rank_90 ...) and the held-out error at each rank."""
    import numpy as np
    sv = tables.get("svd")
    if sv is None or sv.num("layer") is None:
        return ""
    lay = sv.num("layer")
    ecols = [c for c in sv.cols if re.match(r"^(energy_)?rank_\d+$", c)]
    ecols.sort(key=lambda c: float("0." + c.split("_")[-1]))
    layers = sorted(set(int(v) for v in lay[np.isfinite(lay)]))
    header = ["layer"] + [f"rank for {float('0.' + c.split('_')[-1]) * 100:g}% energy" for c in ecols]
    rank, ho = sv.num("rank"), sv.num("heldout_rel_fro", contains=("heldout",))
    cen = sv.bool("centered")
    m0 = np.ones(sv.n, dtype=bool)
    if cen is not None and cen.any() and not cen.all():
        m0 = cen
    ranks = sorted(set(int(r) for r in rank[m0][np.isfinite(rank[m0])])) if rank is not None and ho is not None else []
    if len(ranks) > 8:
        ranks = ranks[:: math.ceil(len(ranks) / 8)]
    header += [f"held-out rel_fro r={r}" for r in ranks]
    rows = []
    for l in layers:
        m = lay == l
        r = [l] + [fmt(sv.num(c)[m][0], "g") for c in ecols]
        for k in ranks:
            mm = m & m0 & (rank == k)
            r.append(fmt(float(ho[mm][0]), "e") if mm.any() else "–")
        rows.append(r)
    return md_table(header, rows) if rows and len(header) > 1 else ""


def table_adjacent(layers, mats):
    rows = []
    names = list(mats)
    for i in range(len(layers) - 1):
        r = [layers[i], layers[i + 1]]
        for n in names:
            r.append(fmt(float(mats[n][i, i + 1]), "f3"))
        rows.append(r)
    return md_table(["layer a", "layer b"] + names, rows) if rows else ""


def _bits_group(q, Q=None):
    """Table group of a quantizer: its integer bit width, "fp8", "bf16" or "other"."""
    p = parse_spec(q)
    if p["kind"] == "int":
        return p["bits"]
    if p["kind"] in ("fp8", "bf16"):
        return p["kind"]
    e = (Q or {}).get(q)
    return e["bits"] if e and isinstance(e.get("bits"), int) else "other"


def _group_order(groups):
    return sorted(g for g in groups if isinstance(g, int)) + [g for g in ("fp8", "bf16", "other") if g in groups]


def table_e2e(rows, Q, k=3):
    """The k rows with the lowest KL at each integer bit width, then fp8 / bf16 / others."""
    if not rows:
        return ""
    groups = {}
    for r in rows:
        groups.setdefault(_bits_group(r["quantizer"], Q), []).append(r)
    out = []
    for g in _group_order(groups):
        rs = sorted(groups[g], key=lambda r: r["kl"] if math.isfinite(r["kl"]) else math.inf)
        for r in rs[:k] if isinstance(g, int) else rs:
            d = (r["ppl_quant"] / r["ppl_ref"] - 1) * 100 if r["ppl_ref"] and math.isfinite(r["ppl_ref"]) else math.nan
            out.append([g, f"`{r['quantizer']}`", r["targets"] or "–", fmt(r["bytes_model"], "f1"), fmt(r["kl"], "e"),
                        fmt(r["top1"], "f4"), fmt(r["ppl_ref"], "f4"), fmt(r["ppl_quant"], "f4"),
                        (f"{d:+.3g}%" if math.isfinite(d) else "–")])
    note = (f"The {k} quantizers with the lowest KL at each integer bit width, then the baselines "
            f"({len(out)} of the {len(rows)} rows of /e2e). KL in nats per token; Δppl = ppl quant / ppl ref − 1.")
    return note + "\n\n" + md_table(["bits", "quantizer", "targets", "bytes/token (model)", "KL (nats)",
                                        "top-1 agree", "ppl ref", "ppl quant", "Δppl"], out)


# ----------------------------------------------------------------------------------------------
# Main


def subset_warning(attrs):
    """One line when the file holds only part of the study's cells (a shard, or a checkpoint with
    root attribute complete = 0), else None. Files without these attributes count as complete."""
    parts = []
    count, index = _int_attr(attrs, "shard_count"), _int_attr(attrs, "shard_index")
    cells, total = _int_attr(attrs, "cells"), _int_attr(attrs, "cells_total")
    if count is not None and count > 1:
        of = f" ({cells} of the {total} cells)" if cells is not None and total is not None else ""
        parts.append(f"shard {index if index is not None else '?'}/{count}: means over a subset of cells{of}; "
                     "merge the shards with `latentq merge` for the study's numbers")
    if _int_attr(attrs, "complete") == 0:
        want = _int_attr(attrs, "shard_cells")
        want = want if want is not None else total
        parts.append(f"incomplete run: {cells if cells is not None else '?'} of {want if want is not None else '?'} "
                     "cells (a checkpoint); means over the finished cells only")
    return "; ".join(parts) or None


def write_report(path, loaded, out, patterns):
    """Make the figures and report.md from loaded = load_results(path).
    Returns (written files, missing lines, warnings)."""
    attrs, tables, notes = loaded
    warnings = list(notes)
    Q = quantizer_table(tables)
    have = set(tables)
    missing = []

    def miss(groups, what):
        absent = [g for g in groups if g not in have]
        missing.append(f"/{' and /'.join(absent)} not in the results file: no {what}.")

    sections = []  # (title, fig filename or None, caption, tables markdown)
    figno = [0]

    def add(title, res, tables_md=""):
        figno[0] += 1
        fn, cap = res[0], res[1]
        sections.append((title, fn, f"Figure {figno[0]}. {cap}", tables_md))

    att = attention_by_quantizer(tables)
    e2e = e2e_rows(tables, Q)

    # 1. frontier
    front = []
    if "latent_error" in have or "summary" in have:
        r = fig_frontier(out, tables, attrs, Q)
        if r:
            front = r[2]
            add("Error against bits per element", r, "")
        else:
            warnings.append("no quantizer with bits per element and c_kv rel_fro: no frontier figure")
        if "attention_error" not in have:
            miss(["attention_error"], "attention-output panel in the frontier figure")
    else:
        miss(["latent_error", "summary"], "frontier figure")
    if "summary" in have:
        r = fig_model_bytes(out, tables, attrs, Q)
        if r:
            add("Error against the model's cache bytes per token", r)
        else:
            warnings.append("/summary has no bytes_per_token_model column: no model-bytes figure")
    else:
        miss(["summary"], "frontier against bytes per token of the whole model")
    top = table_top_by_bits(Q, att, e2e)
    if top:
        sections.append(("Top quantizers by c_kv error at each bit width", None,
                         "The 3 quantizers with the lowest mean c_kv rel_fro at each integer bit width, then fp8 and "
                         "bf16. bits/elem includes scale/offset metadata; bytes/token is for the whole model "
                         "(c_kv + k_pe, all layers).", top))
    # 2. per layer
    if "latent_error" in have:
        sel = select_quantizers(Q, patterns, warnings.append)
        user = bool(patterns) and any(q == p or fnmatch.fnmatchcase(q, p) for p in patterns for q in Q)
        r = fig_per_layer(out, tables, attrs, Q, sel, user_selected=user)
        if r:
            add("Error per layer", r)
        else:
            warnings.append("/latent_error lacks layer/quantizer/rel_fro columns: no per-layer figure")
    else:
        miss(["latent_error"], "per-layer figure")
    # 3. SVD
    if "svd" in have or "svd_spectrum" in have:
        r = fig_svd(out, tables, attrs)
        if r:
            add("SVD of c_kv", r, table_svd_ranks(tables))
        else:
            warnings.append("/svd and /svd_spectrum lack layer/rank/heldout_rel_fro/singular_value columns: no SVD figure")
            t = table_svd_ranks(tables)
            if t:
                sections.append(("SVD of c_kv", None, "", t))
        for g in ("svd_spectrum", "svd"):
            if g not in have:
                miss([g], "spectrum panel" if g == "svd_spectrum" else "error-against-rank panel")
    else:
        miss(["svd", "svd_spectrum"], "SVD figure")
    # 4. cross-layer
    if "cross_layer" in have:
        r = fig_cross_layer(out, tables, attrs)
        if r:
            add("Cross-layer similarity", r, "Adjacent layers:\n\n" + table_adjacent(r[2], r[3]))
        else:
            warnings.append("/cross_layer lacks layer_a/layer_b/cka/pearson columns: no cross-layer figure")
    else:
        miss(["cross_layer"], "cross-layer heatmap")
    if "cross_layer_sharing" in have:
        r = fig_sharing(out, tables, attrs)
        if r:
            add("Cross-layer shared basis", r)
        else:
            warnings.append("/cross_layer_sharing lacks rank/shared_heldout_rel_fro/per_layer_heldout_rel_fro "
                            "columns: no sharing figure")
    else:
        miss(["cross_layer_sharing"], "cross-layer sharing figure")
    # 5. end to end
    if "e2e" in have:
        r = fig_e2e(out, tables, attrs, Q) if "summary" in have else None
        if r:
            add("End to end", r, table_e2e(e2e, Q))
        elif "summary" in have:
            warnings.append("no /e2e row has a quantizer with bytes_per_token_model in /summary (or /e2e lacks a "
                            "quantizer column): no end-to-end figure")
            if table_e2e(e2e, Q):
                sections.append(("End to end", None, "", table_e2e(e2e, Q)))
        else:
            missing.append("/summary not in the results file: the /e2e rows cannot be placed on bytes per token; "
                           "e2e table only.")
            sections.append(("End to end", None, "", table_e2e(e2e, Q)))
    else:
        miss(["e2e"], "end-to-end figure (run experiments/e2e_inject.py)")
    # 6. error against position (decode order)
    if "e2e_position" in have or "attention_position" in have:
        r = fig_position(out, tables)
        if r:
            add("Error against position (decode order)", r, r[2])
        else:
            warnings.append("/e2e_position and /attention_position hold no decode-order row with quantizer, "
                            "cache_mode, pos_start, pos_end and kl_mean: no error-vs-position figure")
    elif "e2e" in have:
        miss(["e2e_position", "attention_position"], "error-vs-position figure (a [decode_order] section in the "
             "study, or experiments/e2e_inject.py --cache-modes)")

    # report.md
    model = attrs.get("model", "?")
    L = [f"# latentq report: {model}", ""]
    subset = subset_warning(attrs)
    if subset:
        L += [f"> **WARNING: {subset}.**", ""]
    meta = [("results", os.path.abspath(path)), ("input", attrs.get("input_path", "?")),
            ("input sha256", attrs.get("input_sha256", "?")[:16]), ("created", attrs.get("created", "?")),
            ("latentq", f"{attrs.get('latentq_version', '?')} ({attrs.get('git_commit', '?')[:12]})"),
            ("model", f"{model}: {attrs.get('num_layers', '?')} layers, kv_lora_rank {attrs.get('kv_lora_rank', '?')}, "
                      f"qk_rope_head_dim {attrs.get('qk_rope_head_dim', '?')}")]
    L += [f"- **{k}**: {v}" for k, v in meta]
    L.append("")
    L.append("rel_fro = ‖X̂ − X‖_F / ‖X‖_F (unitless). Bits per element and bytes per token include the "
             "scale/offset metadata.")
    L.append("")
    if front:
        L.append("Pareto front (c_kv rel_fro against c_kv bits per element): "
                 + ", ".join(f"`{q}` ({fmt(Q[q]['bpe'], 'g')} bits, {fmt(Q[q]['err_c_kv'], 'e')})" for q in front) + ".")
        L.append("")
    for title, fn, cap, tmd in sections:
        L += [f"## {title}", ""]
        if fn:
            L += [f"![{title}]({fn})", "", f"*{cap}*", ""]
        elif cap:
            L += [cap, ""]
        if tmd:
            L += [tmd, ""]
    if missing:
        L += ["## Not in this results file", ""] + [f"- {m}" for m in missing] + [""]
    if warnings:
        L += ["## Notes", ""] + [f"- {w}" for w in warnings] + [""]
    md_path = os.path.join(out, "report.md")
    fd, tmp = tempfile.mkstemp(prefix=".report.md.", suffix=".tmp", dir=out)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(L) + "\n")
        _publish(tmp, md_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    files = [s[1] for s in sections if s[1]] + ["report.md"]
    # figures of an earlier report into the same DIR that this one did not make would look current
    for fn in FIGURES:
        if fn not in files and os.path.isfile(os.path.join(out, fn)):
            os.remove(os.path.join(out, fn))
    return files, missing, warnings


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog=PROG, description="Figures (PNG) and report.md from a latentq-results/1 file.",
        epilog="Exit codes: 0 done, 2 input error (nothing written), 1 internal error.")
    ap.add_argument("results", metavar="RESULTS.h5", help="results file of `latentq run` (schema latentq-results/1)")
    ap.add_argument("--out", required=True, metavar="DIR", help="output directory (created; files in it are replaced)")
    ap.add_argument("--quantizers", nargs="+", metavar="SPEC",
                    help="quantizers of the per-layer figure: spec strings or '*' globs, e.g. 'int4-*-channel-g32' "
                         "(default: the best channel and token quantizer at each bit width + bf16/fp8)")
    a = ap.parse_args(argv)
    path = a.results
    try:
        # validate the input before creating anything
        loaded = load_results(path)
        if os.path.exists(a.out) and not os.path.isdir(a.out):
            print(f"{PROG}: {a.out}: --out exists and is not a directory", file=sys.stderr)
            return 2
        try:
            os.makedirs(a.out, exist_ok=True)
        except OSError as e:
            print(f"{PROG}: {a.out}: cannot create the output directory ({e.strerror or e})", file=sys.stderr)
            return 2
        files, missing, warnings = write_report(path, loaded, a.out, a.quantizers)
    except ReportError as e:
        print(f"{PROG}: {path}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - no traceback for users; LATENTQ_DEBUG=1 shows it
        if os.environ.get("LATENTQ_DEBUG"):
            raise
        print(f"{PROG}: {path}: internal error: {type(e).__name__}: {e} (set LATENTQ_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1
    subset = subset_warning(loaded[0])
    if subset:
        print(f"WARNING: {path}: {subset}")
    for w in warnings:
        print(f"{PROG}: warning: {w}", file=sys.stderr)
    for m in missing:
        print(m)
    for f in files:
        print(f"wrote {os.path.join(a.out, f)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
