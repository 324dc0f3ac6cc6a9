"""report.md: the figures with their captions, short tables, the groups the file lacks and the notes.

    .venv/bin/python -m latentq.report RESULTS.h5 --out DIR [--quantizers SPEC ...]

`latentq report RESULTS.h5 --out DIR` runs it with the project venv and passes its exit code through.
``write_report`` writes PNG figures into DIR (latentq.report.figures), then DIR/report.md (last), which
shows them with captions and short tables. Figures, each made only when its groups are in the file:

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
                           orders with residual R in {0, 32, 128} and sink S in {0, 4}; the e2e panel
                           of a format whose decode-order runs the e2e step's frontier left out says
                           "not run (--e2e frontier)" with its /e2e_not_run reason, and the caption
                           lists those formats

Tables without a figure: the top quantizers by c_kv error at each bit width, and "Score-space error and
attention" (/score_vs_attention: Spearman's rho across quantizers of score_mse and of mse with attention KL,
per layer and target; the lowest c_kv score_mse at each bit width with its gap_db and score_gap_db).
report.md also has a "Findings" section (latentq.report.findings): the source the results stand on
(tiny-mla, the V2-Lite stand-in or a real checkpoint, from the model attribute and the input path) and
each verdict of docs/findings.md with its outcome and numbers.
Every other group of the file (one the report has no figure for: /attention_check, a new probe's) gets a
section of its own: its columns with dtype, unit and definition from the group's column record (the
attribute `columns`, latentq/results.h) and its rows (the first 50). Columns are read by their exact names.
A group that is missing gives no figure and one line saying so (stdout and report.md).
Exit codes (latentq.report.__main__): 0 done; 2 input error (missing file, not HDF5, wrong schema, no
result tables, bad --out), with "latentq report: error: <file>: <what>" on stderr and nothing written; 1
internal error.
"""

from __future__ import annotations

import fnmatch
import math
import os
import tempfile

from latentq.files import publish
from latentq.report.figures import (
    FIGURES,
    fig_cross_layer,
    fig_e2e,
    fig_frontier,
    fig_model_bytes,
    fig_per_layer,
    fig_position,
    fig_sharing,
    fig_svd,
)
from latentq.report.load import (
    INDEX_GROUPS,
    _attention_key,
    _int_attr,
    _nanmean,
    attention_by_quantizer,
    column_record,
    e2e_rows,
    flags,
    has_column,
    numbers,
    parse_spec,
    quantizer_table,
    select_quantizers,
    strings,
)
from latentq.report.tables import md_table


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


def table_top_by_bits(Q, att, e2e, k=3):
    """Top k quantizers by mean c_kv rel_fro at each bit width (integer bits; baselines separately)."""
    akey = _attention_key(att)
    kl = {r["quantizer"]: r["kl"] for r in e2e}
    header = [
        "bits",
        "rank",
        "quantizer",
        "c_kv bits/elem",
        "bytes/token (model)",
        "c_kv rel_fro mean",
        "c_kv rel_fro max",
        "k_pe rel_fro mean",
    ]
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
            r = [
                b,
                i,
                f"`{q}`",
                fmt(e["bpe"], "g"),
                fmt(e["bytes_model"], "f1"),
                fmt(e["err_c_kv"], "e"),
                fmt(e["err_c_kv_max"], "e"),
                fmt(e["err_k_pe"], "e"),
            ]
            if akey:
                r.append(fmt(att[akey].get(q, math.nan), "e"))
            if kl:
                r.append(fmt(kl.get(q, math.nan), "e"))
            rows.append(r)
    return md_table(header, rows) if rows else ""


# The /svd energy-rank columns and the energy fraction of each.
ENERGY_RANKS = {"rank_90": "90%", "rank_99": "99%", "rank_999": "99.9%"}


def table_svd_ranks(tables):
    """Per layer: energy ranks (rank_90 ...) and the held-out error at each rank."""
    import numpy as np

    sv = tables.get("svd")
    if sv is None or numbers(sv, "layer") is None:
        return ""
    lay = numbers(sv, "layer")
    ecols = [c for c in ENERGY_RANKS if has_column(sv, c)]
    layers = sorted(set(int(v) for v in lay[np.isfinite(lay)]))
    header = ["layer"] + [f"rank for {ENERGY_RANKS[c]} energy" for c in ecols]
    rank, ho = numbers(sv, "rank"), numbers(sv, "heldout_rel_fro")
    cen = flags(sv, "centered")
    m0 = np.ones(len(sv), dtype=bool)
    if cen is not None and cen.any() and not cen.all():
        m0 = cen
    ranks = sorted(set(int(r) for r in rank[m0][np.isfinite(rank[m0])])) if rank is not None and ho is not None else []
    if len(ranks) > 8:
        ranks = ranks[:: math.ceil(len(ranks) / 8)]
    header += [f"held-out rel_fro r={r}" for r in ranks]
    rows = []
    for l in layers:
        m = lay == l
        r = [l] + [fmt(numbers(sv, c)[m][0], "g") for c in ecols]
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
            kl = fmt(r["kl"], "e")
            if math.isfinite(r.get("kl_ci_lo", math.nan)):
                kl += f" [{fmt(r['kl_ci_lo'], 'e')}, {fmt(r['kl_ci_hi'], 'e')}]"
            out.append(
                [
                    g,
                    f"`{r['quantizer']}`",
                    r["targets"] or "–",
                    fmt(r["bytes_model"], "f1"),
                    kl,
                    fmt(r["top1"], "f4"),
                    fmt(r["ppl_ref"], "f4"),
                    fmt(r["ppl_quant"], "f4"),
                    (f"{d:+.3g}%" if math.isfinite(d) else "–"),
                ]
            )
    note = (
        f"The {k} quantizers with the lowest KL at each integer bit width, then the baselines "
        f"({len(out)} of the {len(rows)} rows of /e2e). KL in nats per token; Δppl = ppl quant / ppl ref − 1."
    )
    ci = [r for r in rows if "kl_ci_lo" in r]
    if any(math.isfinite(r["kl_ci_lo"]) for r in ci):
        note += (
            " [lo, hi]: the KL's 95% interval, a bootstrap over the scored sequences (/e2e kl_mean_ci_lo/hi); "
            "with few sequences (the e2e step's default is 4) it is narrower than its nominal coverage "
            "(latentq.e2e_stats)."
        )
    elif ci:
        note += (
            " No 95% intervals: /e2e scored one sequence, and the bootstrap over sequences that gives them needs "
            "two or more (its kl_mean_ci_lo/hi are NaN; run the e2e step with --num-seqs 2 or more)."
        )
    return (
        note
        + "\n\n"
        + md_table(
            [
                "bits",
                "quantizer",
                "targets",
                "bytes/token (model)",
                "KL (nats)",
                "top-1 agree",
                "ppl ref",
                "ppl quant",
                "Δppl",
            ],
            out,
        )
    )


def table_position(tables, drawn):
    """The table of the error-vs-position figure (fig_position's `drawn`): per drawn (quantizer, cache
    mode) the bytes per token of its /e2e row (the target set the curves drew), the KL of the first and
    the last position bucket and the mean over the buckets; "" when no row is drawn."""
    import numpy as np

    src, qs, shown, drawn_modes = drawn["curves"], drawn["quantizers"], drawn["shown"], drawn["modes"]
    # Table: e2e KL first/last bucket and bytes per token of each drawn (quantizer, mode)
    rows = []
    bpt = {}
    t = tables.get("e2e")
    if t is not None and strings(t, "cache_mode") is not None and numbers(t, "bytes_per_token") is not None:
        ttg = strings(t, "targets")  # the target set the curves drew (position_curves): c_kv+k_pe when run
        pick = None if ttg is None else ("c_kv+k_pe" if "c_kv+k_pe" in set(ttg) else ttg[0])
        bpt = {
            (q, m): v
            for q, m, v, tg in zip(
                strings(t, "quantizer"),
                strings(t, "cache_mode"),
                numbers(t, "bytes_per_token"),
                ttg if ttg is not None else [None] * len(t),
            )
            if tg == pick
        }
    for (q, mode), (r, s, p, x, y) in sorted(
        src.items(), key=lambda kv: (qs.index(kv[0][0]) if kv[0][0] in qs else 99, kv[1][:3])
    ):
        if q not in shown or mode not in drawn_modes or not len(y):
            continue
        rows.append(
            [
                f"`{q}`",
                mode,
                fmt(bpt.get((q, mode), math.nan), "f1"),
                fmt(float(y[0]), "e"),
                fmt(float(y[-1]), "e"),
                fmt(float(np.mean(y)), "e"),
            ]
        )
    return (
        md_table(
            ["quantizer", "cache mode", "B/token/layer", "KL first bucket", "KL last bucket", "KL mean of buckets"],
            rows,
        )
        if rows
        else ""
    )


def subset_warning(attrs):
    """One line when the file holds only part of the study's cells (a shard, or a checkpoint with
    root attribute complete = 0), else None. Files without these attributes count as complete."""
    parts = []
    count, index = _int_attr(attrs, "shard_count"), _int_attr(attrs, "shard_index")
    cells, total = _int_attr(attrs, "cells"), _int_attr(attrs, "cells_total")
    if count is not None and count > 1:
        of = f" ({cells} of the {total} cells)" if cells is not None and total is not None else ""
        parts.append(
            f"shard {index if index is not None else '?'}/{count}: means over a subset of cells{of}; "
            "merge the shards with `latentq merge` for the study's numbers"
        )
    if _int_attr(attrs, "complete") == 0:
        want = _int_attr(attrs, "shard_cells")
        want = want if want is not None else total
        parts.append(
            f"incomplete run: {cells if cells is not None else '?'} of {want if want is not None else '?'} "
            "cells (a checkpoint); means over the finished cells only"
        )
    return "; ".join(parts) or None


class _Report:
    """report.md being assembled: its sections (title, figure filename or None, caption, tables markdown),
    the lines about groups the file lacks, the warnings (the loader's notes first) and the figure count."""

    def __init__(self, have, notes):
        self.have = have
        self.sections, self.missing, self.warnings = [], [], list(notes)
        self.figno = 0

    def miss(self, groups, what):
        """One line for the groups of `groups` the file lacks and what is not drawn without them."""
        absent = [g for g in groups if g not in self.have]
        self.missing.append(f"/{' and /'.join(absent)} not in the results file: no {what}.")

    def add(self, title, res, tables_md=""):
        """A figure section from a fig_* result (filename, caption, ...), numbered in order."""
        self.figno += 1
        fn, cap = res[0], res[1]
        self.sections.append((title, fn, f"Figure {self.figno}. {cap}", tables_md))


def _frontier_sections(rep, out, tables, attrs, Q, att, e2e):
    """1. The frontier figures and the top-quantizer table. Returns the c_kv Pareto front (names)."""
    have, front = rep.have, []
    if "latent_error" in have or "summary" in have:
        r = fig_frontier(out, tables, attrs, Q)
        if r:
            front = r[2]
            rep.add("Error against bits per element", r, "")
        else:
            rep.warnings.append("no quantizer with bits per element and c_kv rel_fro: no frontier figure")
        if "attention_error" not in have:
            rep.miss(["attention_error"], "attention-output panel in the frontier figure")
    else:
        rep.miss(["latent_error", "summary"], "frontier figure")
    if "summary" in have:
        r = fig_model_bytes(out, tables, attrs, Q)
        if r:
            rep.add("Error against the model's cache bytes per token", r)
        else:
            rep.warnings.append("/summary has no bytes_per_token_model column: no model-bytes figure")
    else:
        rep.miss(["summary"], "frontier against bytes per token of the whole model")
    top = table_top_by_bits(Q, att, e2e)
    if top:
        rep.sections.append(
            (
                "Top quantizers by c_kv error at each bit width",
                None,
                "The 3 quantizers with the lowest mean c_kv rel_fro at each integer bit width, then fp8 "
                "and bf16. bits/elem includes scale/offset metadata; bytes/token is for the whole model "
                "(c_kv + k_pe, all layers).",
                top,
            )
        )
    return front


def table_score_vs_attention(tables):
    """/score_vs_attention as a table: per target and layer (layer -1: the layer means; a bits band: only the
    quantizers of mean bits per element in [k, k + 1)), Spearman's rho across quantizers of score_mse and of
    mse against attention KL. "" without the group or its columns."""
    import numpy as np

    sv = tables.get("score_vs_attention")
    if sv is None:
        return ""
    layer, n = numbers(sv, "layer"), numbers(sv, "n_quantizers")
    tg = strings(sv, "target")
    rs, rm = numbers(sv, "spearman_score_mse"), numbers(sv, "spearman_mse")
    if any(x is None for x in (layer, n, tg, rs, rm)):
        return ""
    band = numbers(sv, "bits_band")
    if band is None:
        band = np.full(len(sv), -1.0)
    rows = [
        [
            "mean over layers" if lay < 0 else int(lay),
            t,
            "all" if b < 0 else f"[{int(b)}, {int(b) + 1})",
            int(k),
            fmt(float(a), "f3"),
            fmt(float(m), "f3"),
        ]
        for lay, t, b, k, a, m in zip(layer, tg, band, n, rs, rm)
    ]
    header = ["layer", "target", "bits/elem", "quantizers", "ρ(score_mse, KL)", "ρ(mse, KL)"]
    return md_table(header, rows) if rows else ""


def table_score_gap(tables, Q, k=3):
    """The k quantizers with the lowest mean c_kv score_mse at each bit width (integer bits, then fp8 and the
    rest), with their mean gap_db and score_gap_db (c_kv; k_pe) and the attention KL with c_kv alone
    quantized. "" without the score columns."""
    import numpy as np

    le = tables.get("latent_error")
    if le is None:
        return ""
    q, tg = strings(le, "quantizer"), strings(le, "target")
    smse, sgap, gap = numbers(le, "score_mse"), numbers(le, "score_gap_db"), numbers(le, "gap_db")
    if any(x is None for x in (q, tg, smse, sgap)):
        return ""
    if gap is None:
        gap = np.full(len(le), math.nan)

    def means(target, col):
        m = tg == target
        return {name: _nanmean(col[m & (q == name)]) for name in dict.fromkeys(q[m])}

    score_c, sgap_c, gap_c, sgap_k = means("c_kv", smse), means("c_kv", sgap), means("c_kv", gap), means("k_pe", sgap)
    kl = {}
    at = tables.get("attention_error")
    if at is not None:
        aq, at_tg, akl = strings(at, "quantizer"), strings(at, "targets"), numbers(at, "kl_mean")
        if aq is not None and at_tg is not None and akl is not None:
            m = at_tg == "c_kv"
            kl = {name: _nanmean(akl[m & (aq == name)]) for name in dict.fromkeys(aq[m])}
    groups = {}
    for name, v in score_c.items():
        if math.isfinite(v):
            groups.setdefault(_bits_group(name, Q), []).append(name)
    rows = []
    for b in _group_order(groups):
        for i, name in enumerate(sorted(groups[b], key=lambda x: score_c[x])[:k], 1):
            bpe = Q[name]["bpe"] if name in Q else math.nan
            rows.append(
                [
                    b,
                    i,
                    f"`{name}`",
                    fmt(bpe, "g"),
                    fmt(score_c[name], "e"),
                    fmt(gap_c.get(name, math.nan), "f1"),
                    fmt(sgap_c[name], "f1"),
                    fmt(sgap_k.get(name, math.nan), "f1"),
                    fmt(kl.get(name, math.nan), "e"),
                ]
            )
    header = [
        "bits",
        "rank",
        "quantizer",
        "c_kv bits/elem",
        "c_kv score_mse",
        "c_kv gap_db",
        "c_kv score_gap_db",
        "k_pe score_gap_db",
        "attention KL (c_kv)",
    ]
    return md_table(header, rows) if rows else ""


def _score_sections(rep, tables, Q):
    """The score-space bound: the /score_vs_attention correlations and the best formats' score_gap_db."""
    corr, gaps = table_score_vs_attention(tables), table_score_gap(tables, Q)
    if corr or gaps:
        rep.sections.append(
            (
                "Score-space error and attention",
                None,
                "score_mse = the mean over tokens of eᵀMe, the squared (unscaled) attention-score error of a "
                "latent error e under M = the mean over heads and query rows of q_lat q_latᵀ (c_kv: q_lat = "
                "W_UKᵀ q_nope; k_pe: q_pe); score_gap_db = 10·log10(score_mse / score_bound_mse), its distance "
                "to the Gaussian rate–distortion bound in that metric at the cell's rate (study/README.md). "
                "ρ: Spearman's rank correlation across quantizers with the attention KL of the same layer "
                "and target quantized alone (/score_vs_attention); the second table: the lowest c_kv "
                "score_mse at each bit width, means over layers.",
                "\n\n".join(t for t in (corr, gaps) if t),
            )
        )
    if "latent_error" in rep.have and "attention_error" in rep.have and "score_vs_attention" not in rep.have:
        rep.miss(["score_vs_attention"], "score-vs-attention table (results of an older latentq)")


def _layer_and_svd_sections(rep, out, tables, attrs, Q, patterns):
    """2. The per-layer figure (the quantizers of --quantizers or the default selection); 3. the SVD figure
    and its table."""
    have = rep.have
    if "latent_error" in have:
        sel = select_quantizers(Q, patterns, rep.warnings.append)
        user = bool(patterns) and any(q == p or fnmatch.fnmatchcase(q, p) for p in patterns for q in Q)
        r = fig_per_layer(out, tables, attrs, Q, sel, user_selected=user)
        if r:
            rep.add("Error per layer", r)
        else:
            rep.warnings.append("/latent_error lacks layer/quantizer/rel_fro columns: no per-layer figure")
    else:
        rep.miss(["latent_error"], "per-layer figure")
    if "svd" in have or "svd_spectrum" in have:
        r = fig_svd(out, tables, attrs)
        if r:
            rep.add("SVD of c_kv", r, table_svd_ranks(tables))
        else:
            rep.warnings.append(
                "/svd and /svd_spectrum lack layer/rank/heldout_rel_fro/singular_value columns: no SVD figure"
            )
            t = table_svd_ranks(tables)
            if t:
                rep.sections.append(("SVD of c_kv", None, "", t))
        for g in ("svd_spectrum", "svd"):
            if g not in have:
                rep.miss([g], "spectrum panel" if g == "svd_spectrum" else "error-against-rank panel")
    else:
        rep.miss(["svd", "svd_spectrum"], "SVD figure")


def _cross_layer_sections(rep, out, tables, attrs):
    """4. The cross-layer similarity heatmap with its adjacent-layer table, and the shared-basis figure."""
    have = rep.have
    if "cross_layer" in have:
        r = fig_cross_layer(out, tables, attrs)
        if r:
            rep.add("Cross-layer similarity", r, "Adjacent layers:\n\n" + table_adjacent(r[2], r[3]))
        else:
            rep.warnings.append("/cross_layer lacks layer_a/layer_b/cka/pearson columns: no cross-layer figure")
    else:
        rep.miss(["cross_layer"], "cross-layer heatmap")
    if "cross_layer_sharing" in have:
        r = fig_sharing(out, tables, attrs)
        if r:
            rep.add("Cross-layer shared basis", r)
        else:
            rep.warnings.append(
                "/cross_layer_sharing lacks rank/shared_heldout_rel_fro/per_layer_heldout_rel_fro "
                "columns: no sharing figure"
            )
    else:
        rep.miss(["cross_layer_sharing"], "cross-layer sharing figure")


def _e2e_sections(rep, out, tables, attrs, Q, e2e):
    """5. End to end (figure and table; the table alone without /summary); 6. error against position."""
    have = rep.have
    if "e2e" in have:
        r = fig_e2e(out, tables, attrs, Q) if "summary" in have else None
        if r:
            rep.add("End to end", r, table_e2e(e2e, Q))
        elif "summary" in have:
            rep.warnings.append(
                "no /e2e row has a quantizer with bytes_per_token_model in /summary (or /e2e lacks a "
                "quantizer column): no end-to-end figure"
            )
            if table_e2e(e2e, Q):
                rep.sections.append(("End to end", None, "", table_e2e(e2e, Q)))
        else:
            rep.missing.append(
                "/summary not in the results file: the /e2e rows cannot be placed on bytes per token; e2e table only."
            )
            rep.sections.append(("End to end", None, "", table_e2e(e2e, Q)))
    else:
        rep.miss(["e2e"], "end-to-end figure (run python -m latentq.e2e)")
    if "e2e_position" in have or "attention_position" in have:
        r = fig_position(out, tables)
        if r:
            rep.add("Error against position (decode order)", r, table_position(tables, r[2]))
        else:
            rep.warnings.append(
                "/e2e_position and /attention_position hold no decode-order row with quantizer, "
                "cache_mode, pos_start, pos_end and kl_mean: no error-vs-position figure"
            )
    elif "e2e" in have:
        rep.miss(
            ["e2e_position", "attention_position"],
            "error-vs-position figure (a [decode_order] section in the study, or python -m latentq.e2e --cache-modes)",
        )


# The groups report.md has a section or a figure for; every other group of the file (but the cell index,
# load.INDEX_GROUPS) is shown as a plain table (_other_sections).
REPORTED_GROUPS = (
    "decision",
    "latent_error",
    "summary",
    "attention_error",
    "score_vs_attention",
    "svd",
    "svd_spectrum",
    "cross_layer",
    "cross_layer_sharing",
    "e2e",
    "e2e_position",
    "attention_position",
    "e2e_seq",  # the per-sequence KL and the bootstrap draws: read by /decision's paired comparison, shown there
    "e2e_bootstrap",
)
OTHER_MAX_ROWS = 50  # rows of a plain table shown in report.md


def _cell(v):
    """A value of a plain table: ints as they are, floats to 4 significant digits ("–" for NaN), strings."""
    if isinstance(v, float) or (hasattr(v, "dtype") and v.dtype.kind == "f"):
        v = float(v)
        return "–" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def table_of_group(name, df, max_rows=OTHER_MAX_ROWS):
    """A group the report has no section for, as Markdown: its columns (name, dtype, unit, definition, from the
    group's column record) and its first max_rows rows."""
    rec = column_record(df)
    legend = md_table(
        ["column", "dtype", "unit", "definition"],
        [[f"`{c['name']}`", c["dtype"], c["unit"] or "–", c["definition"] or "–"] for c in rec],
    )
    names = [c["name"] for c in rec]
    rows = [[_cell(v) for v in r] for r in df[names].head(max_rows).itertuples(index=False)]
    shown = f"all {len(df)} rows" if len(df) <= max_rows else f"the first {max_rows} of its {len(df)} rows"
    return f"Columns of /{name}:\n\n{legend}\n\nThe table ({shown}):\n\n{md_table(names, rows)}"


def _other_sections(rep, tables):
    """A section per group that the report has no figure or table for (a new probe's, /attention_check):
    its column record and its rows, in the file's order."""
    for name, df in tables.items():
        if name in REPORTED_GROUPS or name in INDEX_GROUPS:
            continue
        rep.sections.append((f"/{name}", None, "", table_of_group(name, df)))


def _fraction_label(f):
    """'1/8' for a budget fraction that is k/2^n (n <= 6), else the decimal."""
    for den in (2, 4, 8, 16, 32, 64):
        num = f * den
        if abs(num - round(num)) < 1e-9:
            g = math.gcd(int(round(num)), den)
            return f"{int(round(num)) // g}/{den // g}"
    return f"{f:.4g}"


def _kl_source(r, measured):
    if not measured:
        return ""
    return r.source if math.isfinite(r.kl_mean) else f"predicted (objective {r.plan_objective:.4g})"


def decision_lines(d):
    """The decision summary of /decision (written by the C++ study, latentq/decision.h: one row per budget and
    choice): a table of budget (whole-model bytes per token and fraction of bf16), choice, quantizer, bytes,
    KL, top-1, Δppl and where the KL comes from; [] without the group."""
    if d is None or len(d) == 0:
        return []
    rows = []
    for r in d.itertuples(index=False):
        measured = r.quantizer != "-"
        rows.append(
            [
                f"{r.budget_bytes:.6g} ({_fraction_label(r.budget_fraction)})",
                r.choice,
                f"`{r.quantizer}`" if measured else "nothing measured fits",
                f"{r.bytes_per_token_model:.6g}" if measured else "",
                fmt(r.kl_mean, "e") if math.isfinite(r.kl_mean) else "",
                f"{r.top1_agree:.4f}" if math.isfinite(r.top1_agree) else "",
                f"{r.delta_ppl:+.4g}" if math.isfinite(r.delta_ppl) else "",
                _kl_source(r, measured),
            ]
        )
    header = ["budget B/token (of bf16)", "choice", "quantizer", "B/token", "KL", "top-1", "Δppl", "KL from"]
    e2e = any(str(s).endswith("e2e") for s in d["source"])
    what = "the model's next-token KL with quantized latents (/e2e)" if e2e else "the attention KL (/attention_error)"
    return [
        "## Decision",
        "",
        "At each budget (whole-model bytes per token, c_kv + k_pe, metadata included): the best measured uniform "
        "format, the best engine format at no more bytes, and the planner's mixed assignment (`latentq plan`; "
        f"*predicted* until the e2e step runs it: `/plan_runs`). KL: {what}.",
        "",
        md_table(header, rows),
        "",
        *_verdict_lines(d),
        *_free_running_lines(d),
    ]


def _free_running_lines(d):
    """Per decision row, its free-running generation (/generation) and retrieval (/retrieval_summary) line, the
    /decision column ``free_running`` that ``latentq decide`` prints (latentq/decision.h free_running_line); [] when
    no row has one."""
    if "free_running" not in d.columns:
        return []
    out = [
        f"- {r.budget_bytes:.6g} ({_fraction_label(r.budget_fraction)}) {r.choice} `{r.quantizer}`: {r.free_running}"
        for r in d.itertuples(index=False)
        if r.free_running
    ]
    if not out:
        return []
    note = (
        "Free-running, the prefill-at-once cache of each choice: greedy tokens against the reference's own greedy "
        "continuation (/generation: mean over prompts, 95% bootstrap interval) and needles reproduced from the "
        "scored text (/retrieval_summary: Wilson 95% interval; the reference on the same samples)."
    )
    return [note, "", *out, ""]


def _verdict_lines(d):
    """Per budget, the best uniform format against the runner-up, and a measured plan against the best uniform format
    (/decision's verdict, latentq/decision.h paired_verdict) with both per-token p99.9 KL; [] for a file written
    before the column."""
    if "verdict" not in d.columns:
        return []
    out = []
    for r in d.itertuples(index=False):
        if r.choice not in ("uniform", "plan") or not r.verdict:
            continue
        tails = ""
        if math.isfinite(r.kl_p999) and math.isfinite(r.runner_up_p999):
            tails = f" (p99.9 {r.kl_p999:.4g} vs {r.runner_up_p999:.4g})"
        out.append(f"- {r.budget_bytes:.6g} ({_fraction_label(r.budget_fraction)}): {r.verdict}{tails}")
    if not out:
        return []
    note = (
        "Best uniform format against the runner-up at each budget (and a measured plan against the best uniform "
        "format): ΔKL = KL(runner-up) − KL(best) on the same tokens, with its 95% paired bootstrap interval over "
        "sequences; *beats* when the interval lies above 0. "
        "p99.9: the per-token KL tail of each."
    )
    return [note, "", *out, ""]


def _markdown_lines(path, attrs, Q, front, rep, decision=None, findings=()):
    """The lines of report.md: title, subset warning, the decision summary (/decision), the file's metadata,
    the Pareto front, the findings (latentq.report.findings: lines), the sections, the missing groups and
    the notes."""
    model = attrs.get("model", "?")
    L = [f"# latentq report: {model}", ""]
    subset = subset_warning(attrs)
    if subset:
        L += [f"> **WARNING: {subset}.**", ""]
    L += decision_lines(decision)
    meta = [
        ("results", os.path.abspath(path)),
        ("input", attrs.get("input_path", "?")),
        ("input sha256", attrs.get("input_sha256", "?")[:16]),
        ("created", attrs.get("created", "?")),
        ("latentq", f"{attrs.get('latentq_version', '?')} ({attrs.get('git_commit', '?')[:12]})"),
        (
            "model",
            f"{model}: {attrs.get('num_layers', '?')} layers, kv_lora_rank {attrs.get('kv_lora_rank', '?')}, "
            f"qk_rope_head_dim {attrs.get('qk_rope_head_dim', '?')}",
        ),
    ]
    L += [f"- **{k}**: {v}" for k, v in meta]
    L.append("")
    L.append(
        "rel_fro = ‖X̂ − X‖_F / ‖X‖_F (unitless). Bits per element and bytes per token include the "
        "scale/offset metadata."
    )
    L.append("")
    if front:
        L.append(
            "Pareto front (c_kv rel_fro against c_kv bits per element): "
            + ", ".join(f"`{q}` ({fmt(Q[q]['bpe'], 'g')} bits, {fmt(Q[q]['err_c_kv'], 'e')})" for q in front)
            + "."
        )
        L.append("")
    L += list(findings)
    for title, fn, cap, tmd in rep.sections:
        L += [f"## {title}", ""]
        if fn:
            L += [f"![{title}]({fn})", "", f"*{cap}*", ""]
        elif cap:
            L += [cap, ""]
        if tmd:
            L += [tmd, ""]
    if rep.missing:
        L += ["## Not in this results file", ""] + [f"- {m}" for m in rep.missing] + [""]
    if rep.warnings:
        L += ["## Notes", ""] + [f"- {w}" for w in rep.warnings] + [""]
    return L


def write_report(path, loaded, out, patterns):
    """Make the figures and report.md in the directory `out` from loaded = load_results(path); patterns:
    --quantizers (None: the default selection). report.md is written last, through a temporary file and
    a rename; figures of an earlier report in `out` that this one did not make are removed.
    Returns (written files, missing lines, warnings)."""
    attrs, tables, notes = loaded
    Q = quantizer_table(tables)
    rep = _Report(set(tables), notes)
    att = attention_by_quantizer(tables)
    e2e = e2e_rows(tables, Q)
    front = _frontier_sections(rep, out, tables, attrs, Q, att, e2e)
    _score_sections(rep, tables, Q)
    _layer_and_svd_sections(rep, out, tables, attrs, Q, patterns)
    _cross_layer_sections(rep, out, tables, attrs)
    _e2e_sections(rep, out, tables, attrs, Q, e2e)
    _other_sections(rep, tables)
    # imported here: `python -m latentq.report.findings` imports the package (and this module) first
    from latentq.report.findings import findings_markdown

    L = _markdown_lines(path, attrs, Q, front, rep, tables.get("decision"), findings_markdown(attrs, tables))
    md_path = os.path.join(out, "report.md")
    fd, tmp = tempfile.mkstemp(prefix=".report.md.", suffix=".tmp", dir=out)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(L) + "\n")
        publish(tmp, md_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    files = [s[1] for s in rep.sections if s[1]] + ["report.md"]
    # figures of an earlier report into the same DIR that this one did not make would look current
    for fn in FIGURES:
        if fn not in files and os.path.isfile(os.path.join(out, fn)):
            os.remove(os.path.join(out, fn))
    return files, rep.missing, rep.warnings
