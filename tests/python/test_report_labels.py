"""The report's labels, markers and colours (latentq.report.plot / figures): labels keep the transform prefix,
transformed formats get their own marker, per_layer.png gives each quantizer its own colour; the figures are built
in-process and their legends and markers read back. The synthetic results files come from test_report.py."""

import os

import numpy as np
import pandas as pd
import pytest

from latentq import report as R
from test_report import TRANSFORMED, make_results, split_transform  # the report tests' synthetic results files


@pytest.fixture()
def labelled(tmp_path, monkeypatch):
    """(tables, attrs, Q, figs) of a results file with TRANSFORMED quantizers; the fig_* functions
    keep their figures in figs ({filename: Figure}) instead of writing PNGs."""
    from latentq.report import figures, load

    path = tmp_path / "res.h5"
    make_results(path, transformed=True)
    attrs, tables, _ = R.load_results(str(path))
    figs = {}
    monkeypatch.setattr(figures, "_save", lambda fig, p: figs.__setitem__(os.path.basename(p), fig))
    yield tables, attrs, load.quantizer_table(tables), figs
    import matplotlib.pyplot as plt

    for fig in figs.values():
        plt.close(fig)


def quantizer_points(ax, coords):
    """{quantizer: Line2D} of the one-point markers of a scatter panel, each found by its (x, y) in coords
    ({quantizer: (x, y)}; unique in these files)."""
    by_xy = {}
    for q, xy in coords.items():
        by_xy.setdefault(xy, []).append(q)
    out = {}
    for line in ax.lines:
        xs, ys = line.get_xdata(), line.get_ydata()
        if len(xs) != 1 or line.get_marker() in ("", "None", None):
            continue
        qs = by_xy.get((float(xs[0]), float(ys[0])), [])
        assert len(qs) == 1, (xs, ys, qs)
        out[qs[0]] = line
    return out


def legend_of(fig):
    legs = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert len(legs) == 1, len(legs)
    return legs[0]


def check_scatter_panel(ax, coords, transformed_marker):
    """Transformed quantizers (and only they) drawn with the transformed marker; every label of a point
    is that quantizer's label, its transform prefix kept; no two labels overlap. Returns the labels."""
    from matplotlib.text import Text

    points = quantizer_points(ax, coords)
    assert set(TRANSFORMED) & set(points), sorted(points)
    for q, line in points.items():
        assert (line.get_marker() == transformed_marker) == (q in TRANSFORMED), (q, line.get_marker())
    xy_of = {coords[q]: q for q in points}
    labels, boxes = {}, []
    r = ax.figure.canvas.get_renderer()
    for t in ax.texts:
        if not hasattr(t, "xy") or t.xycoords != "data" or t.get_text().startswith("r="):
            continue  # not a point's label (the reference perplexity, an SVD rank)
        q = xy_of[(float(t.xy[0]), float(t.xy[1]))]
        tr, spec = split_transform(q)
        assert (t.get_text().split(",")[0] == tr) if tr else ("," not in t.get_text()), (q, t.get_text())
        labels[q] = t.get_text()
        t.update_positions(r)
        boxes.append((t.get_text(), Text.get_window_extent(t, r)))
    for i, (a, ba) in enumerate(boxes):  # the greedy placement found every label a free place
        for b, bb in boxes[:i]:
            assert not ba.overlaps(bb), (a, b)
    return labels


def test_frontier_labels_keep_the_transform(labelled):
    """frontier_c_kv.png / frontier_model_bytes.png / e2e.png: a transformed point is labelled with its
    transform ("had,int4 asym ch g32", not "int4 asym ch g32") and drawn with the transformed marker,
    which the legend explains; the front's transformed points are labelled."""
    from latentq.report import figures, load, plot

    tables, attrs, Q, figs = labelled
    figures.fig_frontier("unused", tables, attrs, Q)
    figures.fig_model_bytes("unused", tables, attrs, Q)
    figures.fig_e2e("unused", tables, attrs, Q)
    X = plot.TRANSFORMED_MARKER
    assert X not in ("o", "s", "D", "P", "*")  # the sym / asym / bf16 / SVD / engine-format markers
    labels = {}
    ax0, ax1 = figs["frontier_c_kv.png"].axes
    labels.update(check_scatter_panel(ax0, {q: (Q[q]["bpe"], Q[q]["err_c_kv"]) for q in Q}, X))
    att = load.attention_by_quantizer(tables)["c_kv"]
    check_scatter_panel(ax1, {q: (Q[q]["bpe"], att[q]) for q in att if q in Q}, X)
    for ax, k in zip(figs["frontier_model_bytes.png"].axes, ("err_c_kv", "err_k_pe")):
        labels.update(check_scatter_panel(ax, {q: (Q[q]["bytes_model"], Q[q][k]) for q in Q}, X))
    rows = R.e2e_rows(tables, Q)
    kl_ax, ppl_ax = figs["e2e.png"].axes[:2]
    labels.update(check_scatter_panel(kl_ax, {r["quantizer"]: (r["bytes_model"], r["kl"]) for r in rows}, X))
    check_scatter_panel(ppl_ax, {r["quantizer"]: (r["bytes_model"], r["ppl_quant"]) for r in rows}, X)
    # hand-picked: these transformed points are on a front and labelled, with their transform
    assert labels["had,int4-asym-channel-g32"] == "had,int4 asym ch g32"
    assert labels["had,flashmla-v32-fp8"] == "had,flashmla-v32-fp8"  # a baseline, not compacted
    for fn in ("frontier_c_kv.png", "frontier_model_bytes.png", "e2e.png"):
        leg = legend_of(figs[fn])
        texts = [t.get_text() for t in leg.get_texts()]
        assert len(set(texts)) == len(texts), (fn, texts)
        hx = [(h, t) for h, t in zip(leg.legend_handles, texts) if h.get_marker() == X]
        assert len(hx) == 1 and "transform" in hx[0][1], (fn, texts)


PER_LAYER_SELECTED = {  # quantizer: its label in per_layer.png's legend (12 lines, more than one color cycle)
    "int4-asym-channel-g32": "int4 asym ch g32",
    "had,int4-asym-channel-g32": "had,int4 asym ch g32",
    "klt,int2-asym-channel-g32": "klt,int2 asym ch g32",
    "had64-s9,int4-asym-token": "had64-s9,int4 asym tok all",
    "rot,int8-sym-channel-g128": "rot,int8 sym ch g128",
    "int8-sym-token": "int8 sym tok all",
    "bf16": "bf16",
    "flashmla-v32-fp8": "flashmla-v32-fp8",
    "had,flashmla-v32-fp8": "had,flashmla-v32-fp8",
    "int2-asym-channel-g32": "int2 asym ch g32",
    "int2-sym-tensor": "int2 sym tensor",
    "int4-sym-token-g128": "int4 sym tok g128",
}


@pytest.mark.parametrize("selection", ["given", "default"])
def test_per_layer_legend_labels_colors_markers(labelled, selection):
    """per_layer.png's legend: one entry per quantizer, the transform prefix kept, labels unique,
    colors unique per quantizer, the transformed marker on exactly the transformed quantizers."""
    from matplotlib.colors import to_rgba

    from latentq.report import figures, plot

    tables, attrs, Q, figs = labelled
    if selection == "given":
        sel = list(PER_LAYER_SELECTED)
    else:
        sel = R.select_quantizers(Q, None, lambda w: pytest.fail(w))
        assert {"had,int4-asym-channel-g32", "had,flashmla-v32-fp8", "flashmla-v32-fp8"} <= set(sel), sel
    figures.fig_per_layer("unused", tables, attrs, Q, sel)
    leg = legend_of(figs["per_layer.png"])
    texts = [t.get_text() for t in leg.get_texts()]
    if selection == "given":
        assert texts == list(PER_LAYER_SELECTED.values())
    assert len(texts) == len(sel) and len(set(texts)) == len(texts), texts
    handles = leg.legend_handles
    colors = [to_rgba(h.get_color()) for h in handles]
    assert len(set(colors)) == len(colors), list(zip(texts, colors))
    for q, text, h in zip(sel, texts, handles):
        tr = split_transform(q)[0]
        assert text.startswith(tr + ",") if tr else "," not in text, (q, text)
        assert (h.get_marker() == plot.TRANSFORMED_MARKER) == bool(tr), (q, h.get_marker())
    # the lines of every panel carry their quantizer's legend style
    style = {t: (c, h.get_marker()) for t, c, h in zip(texts, colors, handles)}
    for ax in figs["per_layer.png"].axes:
        for line in ax.lines:
            assert style[line.get_label()] == (to_rgba(line.get_color()), line.get_marker()), line.get_label()


def test_short_label_keeps_the_transform_and_names_mixed_rows(tmp_path):
    """short_label: "<transform>,<compact spec>" from the /latent_error columns; a row whose name is not
    its stored spec (a mixed assignment) is labelled by its name."""
    from latentq.report import load

    make_results(tmp_path / "r.h5", groups=("latent_error",), transformed=True)
    R.load_results(str(tmp_path / "r.h5"))
    assert R.short_label("had,int4-asym-channel-g32") == "had,int4 asym ch g32"
    assert R.short_label("had64-s9,int4-asym-token") == "had64-s9,int4 asym tok all"
    assert R.short_label("klt,int2-asym-channel-g32") == "klt,int2 asym ch g32"
    assert R.short_label("had,flashmla-v32-fp8") == "had,flashmla-v32-fp8"
    assert R.short_label("int4-asym-channel-g32") == "int4 asym ch g32"
    assert R.is_transformed("rot,int8-sym-channel-g128") and not R.is_transformed("int8-sym-channel-g128")
    le = pd.DataFrame(
        {
            "quantizer": np.array(["mixed", "mixed", "int4-asym-token"], dtype=object),
            "target": np.array(["c_kv"] * 3, dtype=object),
            "layer": np.array([0, 1, 0]),
            "format": np.array(["int"] * 3, dtype=object),
            "bits": np.array([4, 2, 4]),
            "scheme": np.array(["asym"] * 3, dtype=object),
            "granularity": np.array(["token"] * 3, dtype=object),
            "group_size": np.array([0, 0, 0]),
            "scale_dtype": np.array(["fp16"] * 3, dtype=object),
            "stored": np.array(["int4-asym-token", "int2-asym-token", "int4-asym-token"], dtype=object),
            "transform": np.array(["had", "none", "none"], dtype=object),
        }
    )
    load.register_specs(le)
    assert R.short_label("mixed") == "mixed"
    assert R.short_label("int4-asym-token") == "int4 asym tok all"


def test_forced_labels_of_a_cluster_get_free_places():
    """place_labels: five forced labels on points a few pixels apart (the engine formats at 8.25 bits
    on the frontier) all get a place of their own, with leader lines, not one on top of another."""
    from matplotlib.text import Text

    from latentq.report import plot

    plt = plot._mpl()
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    xs, ys = [8.0, 8.1, 8.2, 8.25, 8.3], [0.026, 0.025, 0.027, 0.026, 0.024]
    for x, y in zip(xs, ys):
        ax.plot(x, y, ls="", marker="*", ms=9)
    ax.set_xlim(0, 17)
    ax.set_yscale("log")
    ax.set_ylim(1e-3, 1)
    labels = [f"engine-format-{i}" for i in range(5)]
    try:
        assert plot.place_labels(ax, xs, ys, labels, force=[True] * 5) == [0, 1, 2, 3, 4]
        r = fig.canvas.get_renderer()
        boxes = []
        for t in ax.texts:
            t.update_positions(r)
            boxes.append((t.get_text(), Text.get_window_extent(t, r)))
        assert sorted(b[0] for b in boxes) == labels
        for i, (a, ba) in enumerate(boxes):
            for b, bb in boxes[:i]:
                assert not ba.overlaps(bb), (a, b)
    finally:
        plt.close(fig)
