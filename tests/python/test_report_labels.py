"""The report's labels, markers and colours (latentq.report.plot / figures): labels keep the transform prefix,
transformed formats get their own marker, per_layer.png gives each quantizer its own colour; the figures are built
in-process and their legends and markers read back. The synthetic results files come from test_report.py."""

import os

import numpy as np
import pandas as pd
import pytest

from latentq import report as R
from test_report import (  # the report tests' synthetic results files
    POSITION_KL,
    TRANSFORMED,
    make_results,
    position_columns,
    run_report,
    split_transform,
)


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


INT2, INT4 = "int2-asym-channel-g32", "int4-asym-channel-g32"
NOT_RUN_WHY = "dominated by had,int4-asym-channel-g32 at the probes"


def position_file(path, not_run):
    """A results file whose /e2e_position lacks INT4's rows (INT2's as POSITION_KL) and whose /attention_position
    has both; with not_run, /e2e_not_run as the e2e step writes it (latentq.e2e_frontier) for a frontier that left
    out INT4 (its decode-order runs with it: two on c_kv+k_pe, one on c_kv alone) and int3-asym-token (over every
    budget, prefill-at-once only)."""
    from latentq.e2e_frontier import Frontier, NotRun, leave_out_decode, not_run_group
    from latentq.result_groups import write_groups

    ran = {k: v for k, v in POSITION_KL.items() if k[0] != INT4}
    groups = ("latent_error", "summary", "e2e", "attention_position")
    make_results(path, groups=groups, extra={"e2e_position": position_columns(ran)})
    if not_run:
        nan = float("nan")
        left = [
            NotRun(INT4, NOT_RUN_WHY, "had,int4-asym-channel-g32", 0.25, 0.02, 0.01, 1216.0),
            NotRun("int3-asym-token", "over every budget", "", nan, 0.5, nan, 3000.0),
        ]
        fr = Frontier(set(), left, "attention KL", [0.25, 0.5], 4, 4.0)
        whole = ("c_kv", "k_pe")
        decode = [
            (INT2, whole, "decode-r0-s0-p0"),
            (INT4, whole, "decode-r0-s0-p0"),
            (INT4, whole, "decode-r32-s4-p0"),
            (INT4, ("c_kv",), "decode-r128-s4-p0"),
        ]
        fr, kept = leave_out_decode(fr, decode)
        assert kept == [(INT2, whole, "decode-r0-s0-p0")]
        write_groups(str(path), {"e2e_not_run": not_run_group(fr, "frontier")})
    return R.load_results(str(path))[1]


def test_position_panels_of_formats_not_run(tmp_path, monkeypatch):
    """error_vs_position.png: INT4 (attention rows, /e2e_not_run rows, no /e2e_position rows) gets the note with
    its reason in its e2e panel and the caption names it; INT2 (with /e2e_position rows) is drawn as in the file
    without /e2e_not_run; report.md has the caption's sentence under the figure."""
    from latentq.report import figures

    figs = {}
    monkeypatch.setattr(figures, "_save", lambda fig, p: figs.__setitem__(os.path.basename(p), fig))
    tables = position_file(tmp_path / "not_run.h5", True)
    # INT4's decode-order rows of c_kv+k_pe (the set the curves draw); its prefill-at-once and c_kv rows and
    # int3-asym-token's row stay out
    assert figures.decode_not_run(tables["e2e_not_run"]) == {
        INT4: {NOT_RUN_WHY: ["decode-r0-s0-p0", "decode-r32-s4-p0"]}
    }
    fn, cap, drawn = figures.fig_position(str(tmp_path), tables)
    fig = figs.pop(fn)
    _, base_cap, base_drawn = figures.fig_position(str(tmp_path), position_file(tmp_path / "ran.h5", False))
    base = figs.pop(fn)
    import matplotlib.pyplot as plt

    try:
        sentence = f" Decode-order runs not run (--e2e frontier), no e2e curves (/e2e_not_run): {INT4} ({NOT_RUN_WHY})."
        assert cap == base_cap + sentence
        assert drawn["shown"] == base_drawn["shown"] == [INT2, INT4]
        e_int2, e_int4, a_int2, a_int4 = fig.axes  # row 1 e2e, row 2 attention; a column per quantizer
        assert [ax.get_title() for ax in fig.axes] == [INT2, INT4, INT2, INT4]
        note = [t.get_text() for t in e_int4.texts]
        assert len(note) == 1 and not e_int4.lines, (note, e_int4.lines)
        head, *why = note[0].split("\n")
        assert head == "not run (--e2e frontier):" and " ".join(why) == NOT_RUN_WHY, note
        assert len(a_int4.lines) == 1  # its attention curve (decode-r0-s0-p0)
        assert [ax.get_title() for ax in base.axes] == [INT2, INT4, INT2, INT4] and not base.axes[1].texts
        for ax, ref in zip((e_int2, a_int2, a_int4), (base.axes[0], base.axes[2], base.axes[3])):
            assert not ax.texts
            assert [
                (ln.get_label(), ln.get_color(), list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.lines
            ] == [(ln.get_label(), ln.get_color(), list(ln.get_xdata()), list(ln.get_ydata())) for ln in ref.lines]
        assert len(e_int2.lines) == 4  # prefill-at-once and R=0/32/128 (decode-r64 is no drawn mode)
    finally:
        plt.close(fig)
        plt.close(base)
    p = run_report(tmp_path / "not_run.h5", "--out", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    md = (tmp_path / "out" / "report.md").read_text()
    section = md.split("## Error against position (decode order)")[1].split("\n## ")[0]
    assert sentence in section, section
