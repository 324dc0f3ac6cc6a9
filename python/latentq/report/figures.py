"""The report's figures (matplotlib, imported lazily; PNG files written through a temporary file and a
rename). Each ``fig_*`` function returns (filename, caption, ...) or None when its groups lack the
columns it needs; the figures and their sources are listed in latentq.report.markdown.
"""

from __future__ import annotations

import math
import os

from latentq.report.load import (
    PREFILL_AT_ONCE,
    _attention_key,
    _int_attr,
    _position_modes,
    attention_by_quantizer,
    cross_layer_matrices,
    e2e_rows,
    flags,
    numbers,
    parse_spec,
    position_curves,
    strings,
    svd_mean_by_rank,
)
from latentq.report.plot import (
    GRAN_STYLE,
    TRANSFORMED_MARKER,
    _frontier_panel,
    _label_frontier,
    _legend_handles,
    _mpl,
    _save,
    line_styles,
    place_labels,
    plot_point,
)

FIGURES = (
    "frontier_c_kv.png",
    "frontier_model_bytes.png",
    "per_layer.png",
    "svd.png",
    "cross_layer.png",
    "cross_layer_sharing.png",
    "e2e.png",
    "error_vs_position.png",
)


def _svd_rank_line(ax, err, D):
    """The SVD probe's ranks on a frontier panel: err {rank: rel_fro} at 16·r/D bits per element, dashed."""
    r = sorted(err)
    ax.plot(
        [16.0 * k / D for k in r],
        [err[k] for k in r],
        color=GRAN_STYLE["svd"][0],
        marker="P",
        ms=5,
        lw=1,
        ls="--",
        zorder=2,
    )


def _label_svd_ranks(ax, err, D):
    """Labels r=... of _svd_rank_line's points (the first and last always), once the layout is final."""
    r = sorted(err)
    place_labels(
        ax,
        [16.0 * k / D for k in r],
        [err[k] for k in r],
        [f"r={k}" for k in r],
        force=[k in (r[0], r[-1]) for k in r],
        fontsize=6.5,
        color=GRAN_STYLE["svd"][0],
    )


def _transformed(Q, names):
    """Whether any of the quantizers `names` is transformed (their figure's key shows TRANSFORMED_MARKER)."""
    return any(Q[q].get("transform") for q in names)


def _marker_key(transformed):
    """The caption's key to the scatter markers (point_style)."""
    return "marker: sym (circle) / asym (square)" + (
        f", {TRANSFORMED_MARKER} a transformed quantizer (`<transform>,<spec>`, labelled with its transform)"
        if transformed
        else ""
    )


def _frontier_caption(akey, extra, hid, transformed):
    """The caption of frontier_c_kv.png: the axes, the attention panel (akey), the SVD notes, hidden names."""
    cap = (
        "c_kv rel_fro = ‖ĉ_kv − c_kv‖_F / ‖c_kv‖_F (unitless), mean over layers, against the c_kv bits per element "
        f"including the scale/offset metadata. Color: granularity; {_marker_key(transformed)}; "
        "the line is the lower-left Pareto front; labels: the baselines and the points of the front where "
        "there is room (the whole front is listed at the top of this report)."
    )
    if akey is not None:
        cap += (
            f" Right: rel_fro of the absorbed attention output (before o_proj) with {akey} quantized "
            "(/attention_error), mean over layers."
        )
    if extra:
        cap += " " + "; ".join(extra) + "."
    if hid:
        cap += f" Not shown on the log axis (error 0 or missing): {', '.join(hid)}."
    return cap


def fig_frontier(out, tables, attrs, Q):
    plt = _mpl()

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
    front, hidden = _frontier_panel(
        axes[0], Q, names, x, y, xlabel, "c_kv rel_fro, mean over layers (log)", "Latent error: c_kv"
    )
    extra = []
    if svd:
        _svd_rank_line(axes[0], svd, D)
        extra.append(
            "SVD rank r (dashed purple, /svd held-out rel_fro) is placed at 16·r/kv_lora_rank bits per "
            "element (r bf16 coefficients per token; the basis is not counted; r = kv_lora_rank left out)"
        )
    ahidden, afront, sr = [], [], {}
    if akey is not None:
        anames = [q for q in names if q in att[akey]]
        ax_ = [Q[q]["bpe"] for q in anames]
        ay = [att[akey][q] for q in anames]
        afront, ahidden = _frontier_panel(
            axes[1],
            Q,
            anames,
            ax_,
            ay,
            xlabel,
            "attention output rel_fro, mean over layers (log)",
            f"Attention output error, quantized {akey}",
        )
        sr = {
            int(parse_spec(q)["group_size"]): v
            for q, v in att[akey].items()
            if parse_spec(q)["kind"] == "svd" and D and parse_spec(q)["group_size"] < D
        }
        if sr and D:
            _svd_rank_line(axes[1], sr, D)
    handles = _legend_handles(_transformed(Q, names))
    if svd:
        from matplotlib.lines import Line2D

        handles.append(
            Line2D([], [], ls="--", marker="P", color=GRAN_STYLE["svd"][0], label="SVD rank r (bf16 coeff.)")
        )
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    if svd:
        _label_svd_ranks(axes[0], svd, D)
    if akey is not None and sr and D:
        _label_svd_ranks(axes[1], sr, D)
    _label_frontier(axes[0], Q, names, x, y, front)
    if akey is not None:
        _label_frontier(axes[1], Q, anames, ax_, ay, afront)
    fn = "frontier_c_kv.png"
    _save(fig, os.path.join(out, fn))
    return fn, _frontier_caption(akey, extra, sorted(set(hidden) | set(ahidden)), _transformed(Q, names)), front


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
    fig.legend(handles=_legend_handles(_transformed(Q, names)), loc="lower center", ncol=4, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    notes = []
    for (ax, y, front, hid), (k, _, _) in zip(res, panels):
        _label_frontier(ax, Q, names, x, y, front)
        target = "c_kv" if k == "err_c_kv" else "k_pe"
        zero = sorted(q for q in hid if math.isfinite(Q[q][k]))
        nan = [q for q in hid if not math.isfinite(Q[q][k])]
        if nan:
            notes.append(
                f"{target} panel: {len(nan)} of {len(names)} quantizers have no {target} error "
                f"(not run on {target}) and are not shown"
            )
        if zero:
            notes.append(f"{target} panel: error 0, not shown on the log axis: {', '.join(zero)}")
    fn = "frontier_model_bytes.png"
    _save(fig, os.path.join(out, fn))
    cap = (
        f"Mean rel_fro over layers against the latent cache size of the whole model in bytes per token "
        f"(all {L} layers, c_kv + k_pe, metadata included; a target that did not run a quantizer counts as bf16), "
        f"from /summary. Color: granularity; {_marker_key(_transformed(Q, names))}. Line: Pareto front."
    )
    if ratios:
        cap += " Top axis: the same size as a fraction of the bf16 cache."
    if notes:
        cap += " " + "; ".join(notes) + "."
    return fn, cap


def fig_per_layer(out, tables, attrs, Q, selected, user_selected=False):
    plt = _mpl()
    import numpy as np

    le = tables["latent_error"]
    lay, qs, tg, rf = numbers(le, "layer"), strings(le, "quantizer"), strings(le, "target"), numbers(le, "rel_fro")
    if lay is None or qs is None or rf is None:
        return None
    if tg is None:
        tg = np.array(["c_kv"] * len(le), dtype=object)
    panels = [t for t in ("c_kv", "k_pe") if np.any((tg == t) & np.isin(qs, selected))]
    at = tables.get("attention_error")
    att_panel = None
    if at is not None:
        aq, al = strings(at, "quantizer"), numbers(at, "layer")
        ae = numbers(at, "out_rel_fro")
        atg = strings(at, "targets")
        if aq is not None and al is not None and ae is not None:
            if atg is None:
                atg = np.array(["c_kv"] * len(at), dtype=object)
            key = _attention_key({t: 1 for t in dict.fromkeys(atg)})
            m = (atg == key) & np.isin(aq, selected)
            if m.any():
                att_panel = (key, aq[m], al[m], ae[m])
    n = len(panels) + (att_panel is not None)
    if n == 0:
        return None
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.8), squeeze=False)
    axes = list(axes[0])
    styles = line_styles(Q, selected)
    hidden = set()

    def draw(ax, layers, errs, q):
        o = np.argsort(layers)
        l, e = layers[o], errs[o]
        ok = np.isfinite(e) & (e > 0)
        if not ok.any():
            hidden.add(q)
            return
        ax.plot(l[ok], e[ok], **styles[q])

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
    cap = (
        "rel_fro (unitless, log scale) per layer for the selected quantizers"
        + (
            " (given by --quantizers)"
            if user_selected
            else " (default: the best channel and token quantizer at each bit width by mean c_kv rel_fro, "
            "and the bf16 / fp8 baselines)"
        )
        + ". Color: one per quantizer; line style: solid per-channel, dashed per-token, dotted per-tensor, "
        "dash-dot any other format (bf16, fp8, ...)"
        + (
            f"; marker {TRANSFORMED_MARKER}: a transformed quantizer (`<transform>,<spec>`)."
            if _transformed(Q, [q for q in selected if q in Q])
            else "."
        )
    )
    if att_panel is not None:
        cap += f" Right: attention output rel_fro with {att_panel[0]} quantized (/attention_error)."
    if hidden:
        cap += f" Not shown on the log axis (error 0 or missing): {', '.join(sorted(hidden))}."
    return fn, cap


def _svd_spectrum_panel(ax, sp, colors, many):
    """Left panel of svd.png: σ_i/σ_0 per layer from /svd_spectrum (a legend up to `many` layers)."""
    import numpy as np

    lay = numbers(sp, "layer")
    s = numbers(sp, "singular_value")
    idx = numbers(sp, "index")
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


def _svd_rank_panel(ax, sv, attrs, colors, many, notes):
    """Right panel of svd.png: held-out (solid) and fit (dashed) rel_fro against the rank per layer from
    /svd; the notes for the caption (centered fits, r = kv_lora_rank left out) are appended to `notes`."""
    import numpy as np

    lay, rank = numbers(sv, "layer"), numbers(sv, "rank")
    ho = numbers(sv, "heldout_rel_fro")
    fit = numbers(sv, "fit_rel_fro")
    cen = flags(sv, "centered")
    m0 = np.ones(len(sv), dtype=bool)
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


def fig_svd(out, tables, attrs):
    plt = _mpl()
    import numpy as np

    sp, sv = tables.get("svd_spectrum"), tables.get("svd")
    panels = []
    if sp is not None and numbers(sp, "layer") is not None and numbers(sp, "singular_value") is not None:
        panels.append("spectrum")
    if (
        sv is not None
        and numbers(sv, "layer") is not None
        and numbers(sv, "rank") is not None
        and numbers(sv, "heldout_rel_fro") is not None
    ):
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
        if t is not None and numbers(t, "layer") is not None:
            all_layers |= {int(v) for v in numbers(t, "layer") if np.isfinite(v)}
    norm = Normalize(min(all_layers, default=0), max(max(all_layers, default=1), min(all_layers, default=0) + 1))

    def colors(layers):
        return {l: cmap(norm(l)) for l in layers}

    if "spectrum" in panels:
        _svd_spectrum_panel(axes[0], sp, colors, many)
    if "rank" in panels:
        _svd_rank_panel(axes[len(panels) - 1], sv, attrs, colors, many, notes)
    fig.tight_layout()
    if len(all_layers) > many:
        from matplotlib.cm import ScalarMappable

        cb = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, fraction=0.025, pad=0.01)
        cb.set_label("layer")
    fn = "svd.png"
    _save(fig, os.path.join(out, fn))
    cap = []
    if "spectrum" in panels:
        cap.append(
            "Left: singular values of c_kv normalized by the largest, σ_i/σ_0 (log), "
            "one line per layer (/svd_spectrum)."
        )
    if "rank" in panels:
        cap.append(
            "Right: rel_fro of the rank-r reconstruction of c_kv per layer, solid on the held-out split, "
            "dashed on the fit split (/svd)" + "".join(f"; {n}" for n in notes) + "."
        )
    return fn, " ".join(cap)


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
                        ax.text(
                            j,
                            i,
                            f"{v:.2f}",
                            ha="center",
                            va="center",
                            fontsize=fs,
                            color="black" if v > 0.6 else "white",
                        )
    fig.tight_layout(rect=(0, 0, 0.92, 1))
    cax = fig.add_axes((0.93, 0.15, 0.015, 0.7))
    cb = fig.colorbar(im, cax=cax)
    cb.set_label("similarity (0 … 1, unitless)")
    fn = "cross_layer.png"
    _save(fig, os.path.join(out, fn))
    cap = (
        "Similarity of the c_kv latents of two layers over the same tokens (/cross_layer): linear CKA "
        "(invariant to rotations of the latent space) and the mean over latent dimensions of |Pearson| between "
        "the same dimension of the two layers; same color scale 0…1, diagonal = 1, gray = pair not measured."
    )
    return fn, cap, layers, mats


def fig_sharing(out, tables, attrs):
    plt = _mpl()
    import numpy as np

    t = tables.get("cross_layer_sharing")
    if t is None:
        return None
    ws = numbers(t, "window_start")
    w = numbers(t, "window")
    rank = numbers(t, "rank")
    sh = numbers(t, "shared_heldout_rel_fro")
    pl = numbers(t, "per_layer_heldout_rel_fro")
    if rank is None or (sh is None and pl is None):
        return None
    if ws is None:
        ws = np.zeros(len(t))
    if w is None:
        w = np.zeros(len(t))
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
            ax.plot(r[ok], e[ok], color=cmap(i % 10), ls=ls, marker="o", ms=3, lw=1.2, label=f"{lab}, {suffix}")
    ax.set_yscale("log")
    ax.set_xlabel("total rank k of the window (coefficients per token for all its layers)")
    ax.set_ylabel("c_kv held-out rel_fro (log)")
    ax.set_title("Cross-layer shared basis vs per-layer bases")
    ax.legend(fontsize=7, ncol=2 if len(keys) > 4 else 1)
    fig.tight_layout()
    fn = "cross_layer_sharing.png"
    _save(fig, os.path.join(out, fn))
    cap = (
        "Held-out c_kv rel_fro of one SVD basis shared by a window of adjacent layers (solid) against "
        "separate per-layer bases with the same total rank k, k/w per layer (dashed) (/cross_layer_sharing)."
    )
    return fn, cap


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
            Q[q] = dict(
                quantizer=q, kind=p["kind"], scheme=p["scheme"], granularity=p["granularity"], transform=p["transform"]
            )
    x = np.array([r["bytes_model"] for r in rows])
    kl = np.array([r["kl"] for r in rows])
    L = attrs.get("num_layers", "?")
    xlabel = f"cache bytes per token, whole model ({L} layers, c_kv + k_pe)"
    front, hidden = _frontier_panel(
        axes[0], Q, names, x, kl, xlabel, "logit KL(p_ref ‖ p_quant), nats per token (log)", "End to end: logit KL"
    )
    if has_ppl:
        pq = np.array([r["ppl_quant"] for r in rows])
        pref = [r["ppl_ref"] for r in rows if math.isfinite(r["ppl_ref"])]
        ax = axes[1]
        for i in range(len(rows)):
            if math.isfinite(pq[i]):
                plot_point(ax, Q[names[i]], x[i], pq[i])
        if pref:
            ax.axhline(float(np.median(pref)), color="0.2", ls="--", lw=1)
            ax.annotate(
                f"reference ppl {np.median(pref):.4g}",
                (1.0, float(np.median(pref))),
                xycoords=("axes fraction", "data"),
                xytext=(-4, 3),
                textcoords="offset points",
                ha="right",
                fontsize=7.5,
            )
        ok = np.isfinite(pq)
        if ok.any() and pref and (np.nanmax(pq) / max(min(pref), 1e-12)) > 10:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("perplexity per token with quantized latents")
        ax.set_title("End to end: perplexity")
    fig.legend(handles=_legend_handles(_transformed(Q, names)), loc="lower center", ncol=4, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    _label_frontier(axes[0], Q, names, x, kl, front)
    fn = "e2e.png"
    _save(fig, os.path.join(out, fn))
    cap = (
        "The model run with quantized latents on held-out text (/e2e), against the cache bytes per token of the "
        "whole model (/summary). Left: mean over tokens of KL(p_ref ‖ p_quant) of the next-token distributions, "
        f"nats (log), Pareto front drawn. Right: perplexity; dashed: the reference model. Color: granularity; "
        f"{_marker_key(_transformed(Q, names))}."
    )
    if hidden:
        cap += f" Not shown on the log axis (KL 0 or missing): {', '.join(sorted(hidden))}."
    return fn, cap


POSITION_MAX_PANELS = 4
NOT_RUN_NOTE = "not run (--e2e frontier)"


def decode_not_run(table):
    """{quantizer: {reason: [cache_mode]}} of the decode-order rows (cache_mode not prefill-at-once) of an
    /e2e_not_run table (latentq.e2e_frontier.NOT_RUN_COLUMNS: the runs the e2e step's frontier left out, each
    with its format's reason), in the table's order; rows of targets c_kv+k_pe when the table has any (the set
    position_curves draws), else all. {} without the table or its quantizer, cache_mode and reason columns."""
    if table is None:
        return {}
    q, m, tg = strings(table, "quantizer"), strings(table, "cache_mode"), strings(table, "targets")
    reason = strings(table, "reason")
    if q is None or m is None or reason is None:
        return {}
    whole = tg is not None and "c_kv+k_pe" in set(tg)
    out = {}
    for i in range(len(q)):
        if m[i] == PREFILL_AT_ONCE or (whole and tg[i] != "c_kv+k_pe"):
            continue
        modes = out.setdefault(q[i], {}).setdefault(reason[i], [])
        if m[i] not in modes:
            modes.append(m[i])
    return out


def _not_run_panel(ax, reasons):
    """An e2e panel of a format whose decode-order runs were not run: the note with its reason (per cache
    mode when they differ) in place of an empty axis."""
    import textwrap

    if len(reasons) == 1:
        lines = [f"{NOT_RUN_NOTE}:", textwrap.fill(next(iter(reasons)), 40)]
    else:
        lines = [f"{NOT_RUN_NOTE}:"] + [textwrap.fill(f"{', '.join(ms)}: {r}", 40) for r, ms in reasons.items()]
    ax.text(0.5, 0.5, "\n".join(lines), transform=ax.transAxes, ha="center", va="center", fontsize=8, color="0.3")
    ax.set_xticks([])
    ax.set_yticks([])


def _not_run_caption(not_run):
    """The caption's sentence on the decode-order runs /e2e_not_run lists: the formats by reason."""
    by_reason = {}
    for q, reasons in not_run.items():
        for r in reasons:
            by_reason.setdefault(r, []).append(q)
    parts = "; ".join(f"{', '.join(qs)} ({r})" for r, qs in by_reason.items())
    return f" Decode-order runs {NOT_RUN_NOTE}, no e2e curves (/e2e_not_run): {parts}."


def fig_position(out, tables):
    """error_vs_position.png (latentq.report.markdown's docstring); returns (filename, caption, drawn) or
    None when neither /e2e_position nor /attention_position has a decode-order row with the columns.
    drawn: the curves of the table (position_curves of /e2e_position, else /attention_position), the
    decode-order quantizers in order, those drawn (the first POSITION_MAX_PANELS) and the modes drawn;
    markdown.table_position makes the figure's table from it. An e2e panel without a curve of a format whose
    decode-order runs /e2e_not_run lists (the e2e step's frontier left them out) says so and why; the caption
    lists those formats."""
    e = position_curves(tables.get("e2e_position"), "tokens")
    a = position_curves(tables.get("attention_position"), "queries")
    not_run = decode_not_run(tables.get("e2e_not_run"))
    sources = [(n, c) for n, c in (("e2e logit KL", e), ("attention KL (mean over layers)", a)) if c]
    qs = []
    for _, c in sources:
        for q, mode in c:
            if mode != PREFILL_AT_ONCE and q not in qs:
                qs.append(q)
    if not qs:
        return None
    shown, dropped = qs[:POSITION_MAX_PANELS], qs[POSITION_MAX_PANELS:]
    plt = _mpl()
    fig, axes = plt.subplots(len(sources), len(shown), figsize=(4.6 * len(shown), 3.8 * len(sources)), squeeze=False)
    colors = {0: "tab:red", 32: "tab:orange", 128: "tab:green"}
    drawn_modes = set()
    for row, (what, curves) in enumerate(sources):
        modes = _position_modes(curves)
        for col, q in enumerate(shown):
            ax = axes[row][col]
            if curves is e and q in not_run and not any(qq == q and mode in modes for qq, mode in curves):
                _not_run_panel(ax, not_run[q])
                ax.set_title(q, fontsize=9)
                if col == 0:
                    ax.set_ylabel(f"{what}, nats")
                continue
            for (qq, mode), (r, s, p, x, y) in sorted(curves.items(), key=lambda kv: kv[1][:3]):
                if qq != q or mode not in modes:
                    continue
                ok = y > 0
                if mode == PREFILL_AT_ONCE:
                    ax.plot(x[ok], y[ok], color="black", ls=":", lw=1.4, label="prefill-at-once")
                else:
                    ax.plot(
                        x[ok],
                        y[ok],
                        color=colors[r],
                        ls="-" if s == 0 else "--",
                        marker="o",
                        ms=3,
                        lw=1.2,
                        label=f"R={r}, S={s}" + (f", P={p}" if p else ""),
                    )
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
    cap = (
        "KL against query position, by decode-order cache mode (latentq/decode_order.h): color = residual R "
        "(most recent keys read in bf16: red 0, orange 32, green 128), solid S = 0, dashed S = 4 sink tokens in "
        "bf16; dotted black: the whole window quantized at once (the study's rows). "
        + " ".join(f"Row {i + 1}: {w}." for i, (w, _) in enumerate(sources))
    )
    if dropped:
        cap += f" Not drawn (first {POSITION_MAX_PANELS} quantizers only): {', '.join(dropped)}."
    if not_run:
        cap += _not_run_caption(not_run)
    return fn, cap, dict(curves=e or a, quantizers=qs, shown=shown, modes=drawn_modes)
