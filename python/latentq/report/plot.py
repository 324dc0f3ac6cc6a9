"""Plot helpers of the report's figures: matplotlib set-up (imported lazily, Agg backend), the one
definition of a quantizer's label, color and marker (point_style for the scatter figures: color by
granularity or format family; line_styles for one line per quantizer: a color of its own), the greedy
label placement, the frontier panel and the PNG writer (a temporary file, then a rename). A
transformed quantizer ("<transform>,<spec>") is drawn with TRANSFORMED_MARKER in every figure and
labelled with its transform (short_label).
"""

from __future__ import annotations

import math
import os
import tempfile

from latentq.files import publish
from latentq.report.load import is_baseline, pareto_front, short_label

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
# a quantizer behind a transform (rotated before quantizing, latentq/transform.h), whatever its format
TRANSFORMED_MARKER = "X"
TRANSFORMED_LEGEND = "<transform>,<spec>: transformed (X)"
# the markers of the lines of per_layer.png (none like TRANSFORMED_MARKER: it marks the transformed ones)
LINE_MARKERS = "osD^v<>*ph"
# engine and standard formats (the `format` column): a star, colored by family
FAMILY_STYLE = {
    "fp8": ("tab:red", "FP8 (FlashMLA, vLLM)"),
    "mx": ("tab:brown", "OCP MX"),
    "nvfp4": ("tab:pink", "NVFP4 / FP4"),
    "fp4": ("tab:pink", "NVFP4 / FP4"),
    "ggml": ("tab:olive", "ggml"),
    "turboquant": ("tab:cyan", "TurboQuant (vLLM)"),
    "lloyd-max": ("darkviolet", "Lloyd-Max (fitted)"),
    "transform-coding": ("saddlebrown", "transform coding (water-filling)"),
}


def _mpl():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "font.size": 9,
            "axes.titlesize": 10,
            "axes.labelsize": 9,
            "legend.fontsize": 8,
            "figure.dpi": 100,
            "savefig.dpi": 150,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "grid.linewidth": 0.5,
        }
    )
    return plt


def point_style(e):
    """ax.plot keywords (color, marker, ms, mec, mew) of a quantizer's point on a scatter figure, from its
    quantizer_table entry e: color by granularity (an engine / standard format: by family, a star), marker
    by scheme (sym circle, asym square; bf16 diamond, SVD plus); a transformed quantizer:
    TRANSFORMED_MARKER; baselines (is_baseline) edged in black."""
    if e["kind"] in FAMILY_STYLE:
        color, marker = FAMILY_STYLE[e["kind"]][0], "*"
    else:
        color = GRAN_STYLE.get(e["granularity"], GRAN_STYLE["?"])[0]
        marker = KIND_MARKER.get(e["kind"], SCHEME_MARKER.get(e["scheme"], "o"))
    if e.get("transform"):
        marker = TRANSFORMED_MARKER
    return dict(
        color=color,
        marker=marker,
        ms=9 if marker == "*" else 6.5 if marker == TRANSFORMED_MARKER else 5.5,
        mec="black" if is_baseline(e["quantizer"]) else color,
        mew=0.6,
    )


def plot_point(ax, e, x, y, **kw):
    """One quantizer's point (x, y) in its point_style (e: its quantizer_table entry)."""
    ax.plot(x, y, ls="", alpha=0.85, **point_style(e), **kw)


def _palette(n):
    """n distinct colors: tab10, the light shades of tab20, tab20b, tab20c, then evenly spaced hues."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cols = []
    for name, idx in (("tab10", range(10)), ("tab20", range(1, 20, 2)), ("tab20b", range(20)), ("tab20c", range(20))):
        for i in idx:
            c = to_hex(colormaps[name](i))
            if c not in cols and c != "#000000":
                cols.append(c)
    k = 0
    while len(cols) < n:
        c = to_hex(colormaps["hsv"]((k * 0.618034) % 1.0))
        if c not in cols:
            cols.append(c)
        k += 1
    return cols[:n]


def line_styles(Q, names):
    """{q: ax.plot keywords} of one line per quantizer (per_layer.png): label short_label(q); a color
    of its own (bf16 black, the others _palette's in order); line style by granularity (solid
    per-channel, dashed per-token, dotted per-tensor, dash-dot any other); marker TRANSFORMED_MARKER for
    a transformed quantizer, else LINE_MARKERS in turn."""
    colors = iter(_palette(sum(Q.get(q, {}).get("kind") != "bf16" for q in names)))
    out, k = {}, 0
    for q in names:
        e = Q.get(q, {})
        if e.get("transform"):
            marker = TRANSFORMED_MARKER
        else:
            marker, k = LINE_MARKERS[k % len(LINE_MARKERS)], k + 1
        out[q] = dict(
            label=short_label(q),
            color="black" if e.get("kind") == "bf16" else next(colors),
            ls={"channel": "-", "token": "--", "tensor": ":"}.get(e.get("granularity"), "-."),
            marker=marker,
            ms=5 if marker == TRANSFORMED_MARKER else 4,
            lw=1.3,
        )
    return out


def _legend_handles(transformed=False):
    """The key of the scatter figures' colors and markers; transformed: with TRANSFORMED_MARKER's entry."""
    from matplotlib.lines import Line2D

    h = [
        Line2D([], [], ls="", marker="o", color=GRAN_STYLE[g][0], label=GRAN_STYLE[g][1])
        for g in ("tensor", "channel", "token")
    ]
    seen = []
    for color, label in FAMILY_STYLE.values():
        if label not in seen:
            seen.append(label)
            h.append(Line2D([], [], ls="", marker="*", ms=9, color=color, mec="black", mew=0.6, label=label))
    h += [
        Line2D([], [], ls="", marker="D", color="black", label="bf16"),
        Line2D([], [], ls="", marker="o", mfc="white", color="0.3", label="sym (circle)"),
        Line2D([], [], ls="", marker="s", mfc="white", color="0.3", label="asym (square)"),
    ]
    if transformed:
        h.append(Line2D([], [], ls="", marker=TRANSFORMED_MARKER, mfc="white", color="0.3", label=TRANSFORMED_LEGEND))
    h.append(Line2D([], [], ls="-", color="0.2", lw=1, label="Pareto front"))
    return h


def place_labels(ax, xs, ys, labels, force=None, fontsize=7, color="black"):
    """Annotate points with labels by a greedy placement in display space: each label tries offsets
    around its point and takes the first where it overlaps no marker, no text already on the axes and
    no earlier label, inside the axes (the text's box: the leader line of a far offset may cross
    markers). A label with no free place is left out unless force[i] (then it overlaps).
    Call after the figure layout is final (the offsets are in points). Returns the indices labelled."""
    fig = ax.figure
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ax_bb = ax.get_window_extent(r)
    from matplotlib.text import Text
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
    cands = [
        (5, 2, "left", "bottom"),
        (5, -2, "left", "top"),
        (-5, 2, "right", "bottom"),
        (-5, -2, "right", "top"),
        (8, 0, "left", "center"),
        (-8, 0, "right", "center"),
        (8, 12, "left", "bottom"),
        (8, -12, "left", "top"),
        (-8, 12, "right", "bottom"),
        (-8, -12, "right", "top"),
        (14, 24, "left", "bottom"),
        (14, -24, "left", "top"),
        (-14, 24, "right", "bottom"),
        (-14, -24, "right", "top"),
    ]
    force = force or [False] * len(xs)
    done = []
    # forced labels first, then left to right
    for i in sorted(range(len(xs)), key=lambda i: (not force[i], xs[i], ys[i])):
        ok = False
        for dx, dy, ha, va in cands:
            far = abs(dx) > 10 or abs(dy) > 10
            ann = ax.annotate(
                labels[i],
                (xs[i], ys[i]),
                xytext=(dx, dy),
                textcoords="offset points",
                fontsize=fontsize,
                ha=ha,
                va=va,
                color=color,
                arrowprops=dict(arrowstyle="-", lw=0.5, color="0.5", shrinkA=0, shrinkB=3) if far else None,
            )
            ann.update_positions(r)
            bb = Text.get_window_extent(ann, r)  # the text alone: its leader line may cross its own marker
            inside = bb.x0 >= ax_bb.x0 + 1 and bb.x1 <= ax_bb.x1 - 1 and bb.y0 >= ax_bb.y0 + 1 and bb.y1 <= ax_bb.y1 - 1
            if inside and not any(bb.overlaps(p) for p in placed):
                placed.append(bb)
                ok = True
                break
            ann.remove()
        if not ok and force[i]:
            ann = ax.annotate(
                labels[i],
                (xs[i], ys[i]),
                xytext=(5, 2),
                textcoords="offset points",
                fontsize=fontsize,
                ha="left",
                va="bottom",
                color=color,
            )
            placed.append(ann.get_window_extent(r))
            ok = True
        if ok:
            done.append(i)
    return sorted(done)


def _save(fig, path):
    """Save to a temporary file in the same directory, then rename."""
    plt = _mpl()
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", bbox_inches="tight", pad_inches=0.08)
        publish(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)


def _positive(x, y):
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    return np.isfinite(x) & np.isfinite(y) & (y > 0)


def _frontier_panel(ax, Q, names, x, y, xlabel, ylabel, title):
    """Scatter of quantizers (point_style) and the Pareto front (_label_frontier labels it, once the layout
    is final). Returns (pareto names, names not shown because y <= 0 / NaN)."""
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = _positive(x, y)
    hidden = [names[i] for i in range(len(names)) if not ok[i]]
    for i in np.flatnonzero(ok):
        plot_point(ax, Q[names[i]], x[i], y[i], zorder=3)
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
    """Labels (short_label) of the points of the front and of the baselines, where there is room; the
    baselines without a transform are labelled even where there is none. Returns the names labelled."""
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    lab = [
        i for i, q in enumerate(names) if (q in front or is_baseline(q)) and _positive(x[i : i + 1], y[i : i + 1])[0]
    ]
    done = place_labels(
        ax,
        [x[i] for i in lab],
        [y[i] for i in lab],
        [short_label(names[i]) for i in lab],
        force=[is_baseline(names[i]) and not Q[names[i]].get("transform") for i in lab],
    )
    return [names[lab[k]] for k in done]
