"""The findings: each verdict of docs/findings.md computed from one results file, as numbers and a one-word
outcome, and the side-by-side table of several sources.

    .venv/bin/python -m latentq.report.findings A.h5 [B.h5 ...] [--labels tiny-mla,standin] [--check]

prints the Markdown table ``verdict | <label A> | <label B> ... | transfers?`` and the list of sources (the
results' model attribute, input path and sha256, commit, date). A verdict *transfers* when every source gives
the same outcome. ``latentq report`` puts the single-file form (``findings_markdown``) in report.md. This
module is the one definition of the verdicts; every threshold is a constant below.

The verdicts (``verdicts(attrs, tables)``, in this order; "mean" is over the file's layers, c_kv unless said;
"attention KL" is /attention_error's kl_mean with c_kv and k_pe quantized, nats, mean over layers;
"plain integer": format int, no transform):

- per_channel   mean rel_fro of int8-sym-tensor / int8-sym-channel-g32 (the report's per-tensor and
                "per-channel INT8 (32 blocks)"): decisive (>= 10x), modest (>= 1.25x), no.
- asym_vs_sym   at 4 bits, each granularity and group size run in both schemes (plain integer): the ratio
                sym / asym of mean rel_fro; a scheme wins a pair by 5% or more (TIE). asym / sym when it
                wins every pair that is not a tie, mixed when both win some, tie when none is won.
- int4, int2    the plain integer cell of that width with the lowest attention KL (its rel_fro and
                top-1 too): lossless (KL < 1e-3), usable (< 3e-2), degraded (< 0.5), collapses. Grounded
                on tiny-mla's e2e (docs/findings.md): attention KL 1.0e-2 is +0.7% perplexity, 0.26 is
                +20%, 0.56 (int2-asym-token) is perplexity x4-7.
- svd_half_rank held-out rel_fro of the rank kv_lora_rank/2 reconstruction (/svd, centered rows):
                refuted (>= 0.1: halving the rank loses 1% or more of the held-out energy, more than an
                int4 quantizer's error) or viable.
- sharing       /cross_layer_sharing: the geometric mean over its rows of per-layer / shared held-out
                rel_fro at the same k coefficients per token: helps (>= 1.1) or fails; with the mean
                adjacent-layer |Pearson| and CKA of /cross_layer.
- rotations     every rotated plain-integer int4 / int2 cell ("<transform>,<spec>") against its
                unrotated spec at the same bytes: the smallest ratio rotated / unrotated of mean rel_fro
                (and of attention KL): helps (<= 0.5), modest (<= 0.9), no; and how many rotated cells lie
                on the (bytes per token, attention KL) Pareto front of all cells.
- rd_gap        at 2, 4 and 8 bits the unrotated format (integer or engine, the bits column) with the
                smallest mean gap_db to the Gaussian rate-distortion bound (/latent_error; infinite gaps
                left out of the mean); outcome from the smallest of the three: far (>= 20 dB, more than
                3 bits per element of room at 6.02 dB per bit), moderate (>= 6 dB), near.
- fp8           flashmla-v32-fp8 against the plain integer cell with the lowest attention KL at no more
                bytes per token (whole model): integer or fp8 (lower attention KL).
- score_gap     at 2, 3 and 4 bits per element (c_kv bits_per_element, metadata included, in [b, b + 1)) the
                cell of any family with the smallest mean score_gap_db: the distance to the Gaussian bound in
                the metric the scores read (study/README.md, "score_gap_db"), and its gap_db; outcome from the
                largest of the three: near (<= 3 dB in every band, the target), moderate (< 20 dB), far;
                n/a when a band has no cell.
- two_bits      the cell at <= 2.5 bits per element on c_kv with the highest attention top-1 agreement with
                c_kv alone quantized (/attention_error targets "c_kv", k_pe exact, as vLLM's TurboQuant MLA
                backend keeps k_pe), with its top-1 when k_pe is quantized by the same spec: holds (top-1
                >= 0.9) or fails.
- planner_1/4, planner_3/8, planner_1/2
                /decision (latentq/decision.h) at that fraction of the bf16 cache: the best uniform row's
                plan_objective / the plan row's (the planner's objective, kl: the sum of single-target
                attention KL over (layer, target)): large (>= 10x), modest (>= 1.25x), none. The uniform
                row is /decision's: the lowest e2e KL when the e2e step ran, else attention KL (compare
                files run the same way). The three budgets are feasible on tiny-mla and the stand-in
                (int2 channel-g32 is 3/16 of bf16 on both).

A verdict whose inputs the file lacks has outcome "n/a" and says what is missing.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field

from latentq.progress import StepParser, say
from latentq.report.tables import md_table

NA = "n/a"
PER_CHANNEL_DECISIVE, PER_CHANNEL_MODEST = 10.0, 1.25
TIE = 1.05
KL_LOSSLESS, KL_USABLE, KL_DEGRADED = 1e-3, 3e-2, 0.5
SVD_REFUTED = 0.1
SHARING_HELPS = 1.1
ROTATION_HELPS, ROTATION_MODEST = 0.5, 0.9
GAP_FAR_DB, GAP_MODERATE_DB = 20.0, 6.0
SCORE_NEAR_DB = 3.0
BITS_BANDS = (2, 3, 4)
TWO_BITS_MAX_BPE, TWO_BITS_TOP1 = 2.5, 0.9
PLANNER_LARGE, PLANNER_MODEST = 10.0, 1.25
PLANNER_BUDGETS = (0.25, 0.375, 0.5)
BOTH = "c_kv+k_pe"
# the claim each verdict tests, in words (the first column of the tables)
CLAIMS = {
    "per_channel": "per-channel ≫ per-tensor (int8-sym-tensor / int8-sym-channel-g32 rel_fro)",
    "asym_vs_sym": "asymmetric beats symmetric (int4, each grouping)",
    "int4": "INT4 is usable (best int4 cell)",
    "int2": "INT2 collapses (best int2 cell)",
    "svd_half_rank": "halving the rank loses 40% (SVD rank kv_lora_rank/2, held-out rel_fro)",
    "sharing": "adjacent layers are uncorrelated, a shared basis fails (held-out, same coefficients)",
    "rotations": "rotations do not help (had/klt on int4/int2, same bytes)",
    "rd_gap": "the gap to the rate–distortion bound is 34–46 dB (best format at 2, 4, 8 bits)",
    "fp8": "FP8 (flashmla-v32-fp8) is the production answer (vs the best integer at ≤ bytes)",
    "score_gap": "a format within 3 dB of the score-space bound at 2, 3, 4 bits/elem (c_kv, best cell per band)",
    "two_bits": "two bits that hold: attention top-1 ≥ 0.9 at ≤ 2.5 bits/elem on c_kv",
    **{
        f"planner_{f}": f"planner's gain over the best uniform at {f} of bf16 (attention-KL objective)"
        for f in ("1/4", "3/8", "1/2")
    },
}
# synth presets that draw the calibrated stand-in (docs/latents.md); tiny-mla's preset draws its low-rank model
STANDIN_PRESETS = ("deepseek-v2-lite", "deepseek-v3", "glm-4.7-flash", "minicpm3-4b")


@dataclass(frozen=True)
class Verdict:
    """One verdict of one results file. key: stable id (module docstring); claim: what it asks, in words;
    outcome: one word, NA when the file lacks an input; text: the numbers in words (a table cell);
    numbers: {name: float} of the values behind it (NaN when absent)."""

    key: str
    claim: str
    outcome: str
    text: str
    numbers: dict = field(default_factory=dict)


def source(attrs):
    """(kind, description) of the latents a results file was measured on, from its root attributes model and
    input_path: kind is "tiny-mla", "V2-Lite stand-in" (`latentq synth --preset deepseek-v2-lite`),
    "stand-in" (another preset drawing the stand-in), "synthetic" (another synth preset) or "checkpoint"
    (a dump of a real model); description names the model attribute and the input file."""
    model = str(attrs.get("model", "?"))
    where = f"model `{model}`, input `{os.path.basename(str(attrs.get('input_path', '?')))}`"
    if model == "tiny-mla":
        return "tiny-mla", f"tiny-mla, the 10 M-parameter toy trained on KJV ({where})"
    if model.startswith("synthetic:"):
        preset = model.split(":", 1)[1]
        if preset == "deepseek-v2-lite":
            return "V2-Lite stand-in", f"the calibrated DeepSeek-V2-Lite stand-in, synthetic ({where})"
        if preset in STANDIN_PRESETS:
            return "stand-in", f"the stand-in's model with {preset}'s dims, uncalibrated for it ({where})"
        return "synthetic", f"synthetic latents of {preset}'s shape ({where})"
    return "checkpoint", f"a dump of a real checkpoint ({where})"


def _g(v):
    return f"{v:.3g}" if math.isfinite(v) else "–"


def _e(v):
    return f"{v:.1e}" if math.isfinite(v) else "–"


def _plain_int(le):
    """Rows of /latent_error for unrotated integer specs."""
    return le[(le["format"] == "int") & (le["transform"] == "none")]


def _c_kv_mean(le, col="rel_fro"):
    """{quantizer: mean of col over the c_kv rows of its layers} (finite values only)."""
    import numpy as np

    c = le[le["target"] == "c_kv"]
    v = c[col].astype(float).replace([np.inf, -np.inf], np.nan)
    return v.groupby(c["quantizer"], sort=False).mean().to_dict()


def _attention(tables, targets=BOTH, col="kl_mean"):
    """{quantizer: mean over layers of col} of the /attention_error rows with these targets ({} without)."""
    at = tables.get("attention_error")
    if at is None:
        return {}
    a = at[at["targets"] == targets]
    return a[col].astype(float).groupby(a["quantizer"], sort=False).mean().to_dict()


def _bytes(tables):
    """{quantizer: bytes_per_token_model} from /summary ({} without)."""
    sm = tables.get("summary")
    if sm is None:
        return {}
    return dict(zip(sm["quantizer"], sm["bytes_per_token_model"].astype(float)))


def _ratio_outcome(r, hi, lo, words):
    """words[0] when r >= hi, words[1] when r >= lo, else words[2]; NA for a non-finite r."""
    if not math.isfinite(r):
        return NA
    return words[0] if r >= hi else words[1] if r >= lo else words[2]


def _kl_outcome(kl):
    """The INT4 / INT2 outcome of an attention KL (nats); NA when not finite."""
    if not math.isfinite(kl):
        return NA
    for word, limit in (("lossless", KL_LOSSLESS), ("usable", KL_USABLE), ("degraded", KL_DEGRADED)):
        if kl < limit:
            return word
    return "collapses"


def _missing(key, what):
    """The n/a verdict of `key`: the results lack `what`."""
    return Verdict(key, CLAIMS[key], NA, f"not in the results: {what}", {})


def v_per_channel(attrs, tables):
    claim = CLAIMS["per_channel"]
    le = tables.get("latent_error")
    m = _c_kv_mean(le) if le is not None else {}
    t, c = m.get("int8-sym-tensor", math.nan), m.get("int8-sym-channel-g32", math.nan)
    if not (math.isfinite(t) and math.isfinite(c)):
        return _missing("per_channel", "c_kv rows of int8-sym-tensor and int8-sym-channel-g32")
    r = t / c if c > 0 else math.inf
    out = _ratio_outcome(r, PER_CHANNEL_DECISIVE, PER_CHANNEL_MODEST, ("decisive", "modest", "no"))
    return Verdict("per_channel", claim, out, f"{r:.3g}× ({_g(t)} / {_g(c)})", dict(tensor=t, channel_g32=c, ratio=r))


def _grouping(row):
    """ "tensor", "channel", "channel-g32", "token", ... of a /latent_error row."""
    g, s = row["granularity"], row["group_size"]
    return g if g == "tensor" else f"{g}-g{s}" if s else g


def v_asym_vs_sym(attrs, tables):
    claim = CLAIMS["asym_vs_sym"]
    le = tables.get("latent_error")
    if le is None:
        return _missing("asym_vs_sym", "/latent_error")
    p = _plain_int(le)
    p = p[(p["bits"] == 4) & (p["target"] == "c_kv")]
    rf = _c_kv_mean(p)
    kl = _attention(tables)
    by = {}
    for q, d in p.groupby("quantizer", sort=False):
        r0 = d.iloc[0]
        key = (_grouping(r0), str(r0["scale_dtype"]))
        by.setdefault(key, {})[str(r0["scheme"])] = q
    pairs = [(k, v["sym"], v["asym"]) for k, v in by.items() if "sym" in v and "asym" in v]
    if not pairs:
        return _missing("asym_vs_sym", "int4 specs in both schemes")
    ratios = {k[0]: rf[s] / rf[a] if rf[a] > 0 else math.inf for k, s, a in pairs}
    wins_asym = sum(r >= TIE for r in ratios.values())
    wins_sym = sum(r <= 1 / TIE for r in ratios.values())
    if wins_asym and wins_sym:
        out = "mixed"
    elif wins_asym or wins_sym:
        out = "asym" if wins_asym else "sym"
    else:
        out = "tie"
    nums = {f"sym/asym {g}": r for g, r in ratios.items()}
    txt = f"asym wins {wins_asym}, sym {wins_sym} of {len(pairs)} (sym/asym rel_fro: " + ", ".join(
        f"{g} {r:.3g}" for g, r in ratios.items()
    )
    ch = next(((s, a) for k, s, a in pairs if k[0] == "channel-g32"), None)
    if ch and ch[0] in kl and ch[1] in kl and kl[ch[1]] > 0:
        nums["sym/asym attention KL channel-g32"] = kl[ch[0]] / kl[ch[1]]
        txt += f"; attention KL at channel-g32 {kl[ch[0]] / kl[ch[1]]:.2g}"
    return Verdict("asym_vs_sym", claim, out, txt + ")", nums)


def v_int_width(attrs, tables, bits):
    key = f"int{bits}"
    claim = CLAIMS[key]
    le = tables.get("latent_error")
    kl = _attention(tables)
    if le is None or not kl:
        return _missing(key, "/latent_error and /attention_error rows with c_kv and k_pe quantized")
    p = _plain_int(le)
    qs = [q for q in dict.fromkeys(p[p["bits"] == bits]["quantizer"]) if math.isfinite(kl.get(q, math.nan))]
    if not qs:
        return _missing(key, f"int{bits} cells with an attention KL")
    best = min(qs, key=lambda q: kl[q])
    rf = _c_kv_mean(le).get(best, math.nan)
    top1 = _attention(tables, col="top1_agree").get(best, math.nan)
    return Verdict(
        key,
        claim,
        _kl_outcome(kl[best]),
        f"`{best}`: attention KL {_e(kl[best])}, top-1 {_g(top1)}, rel_fro {_g(rf)}",
        dict(kl=kl[best], top1=top1, rel_fro=rf),
    )


def v_svd_half_rank(attrs, tables):
    claim = CLAIMS["svd_half_rank"]
    sv = tables.get("svd")
    try:
        r = int(float(attrs.get("kv_lora_rank", "nan"))) // 2
    except ValueError:
        r = -1
    if sv is None or r <= 0:
        return _missing("svd_half_rank", "/svd or the kv_lora_rank attribute")
    s = sv[(sv["rank"] == r) & (sv["centered"] != 0)]
    if len(s) == 0:
        return _missing("svd_half_rank", f"/svd rows at rank {r}")
    v = s["heldout_rel_fro"].astype(float)
    mean, lo, hi = float(v.mean()), float(v.min()), float(v.max())
    out = "refuted" if mean >= SVD_REFUTED else "viable"
    return Verdict(
        "svd_half_rank",
        claim,
        out,
        f"rank {r}: {_g(mean)} (layers {_g(lo)}–{_g(hi)})",
        dict(rank=float(r), heldout_rel_fro=mean, min=lo, max=hi),
    )


def v_sharing(attrs, tables):
    import numpy as np

    claim = CLAIMS["sharing"]
    sh = tables.get("cross_layer_sharing")
    if sh is None:
        return _missing("sharing", "/cross_layer_sharing")
    ratio = sh["per_layer_heldout_rel_fro"].astype(float) / sh["shared_heldout_rel_fro"].astype(float)
    ratio = ratio[np.isfinite(ratio) & (ratio > 0)]
    if len(ratio) == 0:
        return _missing("sharing", "finite /cross_layer_sharing rows")
    gm = float(np.exp(np.log(ratio).mean()))
    nums = dict(per_layer_over_shared=gm, rows=float(len(ratio)), shared_wins=float((ratio > 1).sum()))
    txt = f"per-layer / shared {gm:.3g}× (shared lower in {int((ratio > 1).sum())} of {len(ratio)})"
    cl = tables.get("cross_layer")
    if cl is not None:
        adj = cl[(cl["layer_b"].astype(int) - cl["layer_a"].astype(int)) == 1]
        if len(adj):
            nums["pearson"], nums["cka"] = float(adj["mean_abs_pearson"].mean()), float(adj["cka"].mean())
            txt += f"; adjacent |Pearson| {nums['pearson']:.2g}, CKA {nums['cka']:.2g}"
    return Verdict("sharing", claim, "helps" if gm >= SHARING_HELPS else "fails", txt, nums)


def v_rotations(attrs, tables):
    from latentq.report.load import pareto_front

    claim = CLAIMS["rotations"]
    le = tables.get("latent_error")
    if le is None or "transform" not in le.columns:
        return _missing("rotations", "/latent_error with a transform column")
    rf, kl, by = _c_kv_mean(le), _attention(tables), _bytes(tables)
    c = le[(le["target"] == "c_kv") & (le["format"] == "int") & (le["transform"] != "none") & le["bits"].isin([2, 4])]
    pairs = []
    for q in dict.fromkeys(c["quantizer"]):
        base = q.split(",", 1)[1]
        if base in rf and (base not in by or q not in by or by[base] == by[q]):
            pairs.append((q, base))
    if not pairs:
        return _missing("rotations", "rotated int4/int2 cells with their unrotated spec")
    best = min(pairs, key=lambda p: rf[p[0]] / rf[p[1]])
    r = rf[best[0]] / rf[best[1]]
    out = "helps" if r <= ROTATION_HELPS else "modest" if r <= ROTATION_MODEST else "no"
    nums = dict(rel_fro_ratio=r, pairs=float(len(pairs)))
    txt = f"best `{best[0]}`: rel_fro ×{r:.2g}"
    kpairs = [p for p in pairs if p[0] in kl and p[1] in kl and kl[p[1]] > 0]
    if kpairs:
        kb = min(kpairs, key=lambda p: kl[p[0]] / kl[p[1]])
        nums["kl_ratio"] = kl[kb[0]] / kl[kb[1]]
        txt += f"; attention KL ×{nums['kl_ratio']:.2g} (`{kb[0]}`)"
        qs = [q for q in kl if q in by and math.isfinite(kl[q])]
        front = [qs[i] for i in pareto_front([by[q] for q in qs], [kl[q] for q in qs])]
        rotated = set(le["quantizer"][le["transform"] != "none"])
        rot = [q for q in front if q in rotated]
        nums["on_front"] = float(len(rot))
        txt += f"; {len(rot)} rotated on the bytes–KL front" + (f" ({', '.join(f'`{q}`' for q in rot)})" if rot else "")
    return Verdict("rotations", claim, out, f"{txt} ({len(pairs)} pairs)", nums)


def v_rd_gap(attrs, tables):
    claim = CLAIMS["rd_gap"]
    le = tables.get("latent_error")
    if le is None or "gap_db" not in le.columns:
        return _missing("rd_gap", "gap_db in /latent_error")
    u = le[(le["transform"] == "none") & le["bits"].isin([2, 4, 8])]
    gap = _c_kv_mean(u, "gap_db")
    bits = dict(zip(u["quantizer"], u["bits"].astype(int)))
    nums, parts = {}, []
    for b in (2, 4, 8):
        qs = [q for q, g in gap.items() if bits[q] == b and math.isfinite(g)]
        if qs:
            q = min(qs, key=gap.get)
            nums[f"gap_db_{b}"] = gap[q]
            parts.append(f"{b} bits {gap[q]:.1f} (`{q}`)")
    if not nums:
        return _missing("rd_gap", "finite gap_db at 2, 4 or 8 bits")
    lo = min(nums.values())
    out = "far" if lo >= GAP_FAR_DB else "moderate" if lo >= GAP_MODERATE_DB else "near"
    return Verdict("rd_gap", claim, out, "dB: " + ", ".join(parts), nums)


def _band_best(le, col, bands=BITS_BANDS):
    """{b: (quantizer, mean c_kv col)} of the cell with the smallest finite mean of col among the cells whose mean
    c_kv bits_per_element lies in [b, b + 1), for each band b that has one."""
    val, bpe = _c_kv_mean(le, col), _c_kv_mean(le, "bits_per_element")
    out = {}
    for b in bands:
        qs = [q for q, v in val.items() if b <= bpe.get(q, math.nan) < b + 1 and math.isfinite(v)]
        if qs:
            q = min(qs, key=val.get)
            out[b] = (q, val[q])
    return out


def v_score_gap(attrs, tables):
    le = tables.get("latent_error")
    if le is None or "score_gap_db" not in le.columns:
        return _missing("score_gap", "score_gap_db in /latent_error")
    best = _band_best(le, "score_gap_db")
    if not best:
        return _missing("score_gap", "finite score_gap_db at 2-5 bits per element ([attention] on)")
    missing = [b for b in BITS_BANDS if b not in best]
    if missing:
        return _missing(
            "score_gap", f"a cell with a finite score_gap_db at {missing[0]}–{missing[0] + 1} bits per element"
        )
    gap, bpe = _c_kv_mean(le, "gap_db"), _c_kv_mean(le, "bits_per_element")
    nums = {f"score_gap_db_{b}": g for b, (_, g) in best.items()}
    parts = [
        f"{b} bits {g:.1f} (`{q}`, {bpe[q]:.3g} b/e; mse gap {gap.get(q, math.nan):.1f})" for b, (q, g) in best.items()
    ]
    worst = max(nums.values())
    out = "near" if worst <= SCORE_NEAR_DB else "moderate" if worst < GAP_FAR_DB else "far"
    return Verdict("score_gap", CLAIMS["score_gap"], out, "dB: " + ", ".join(parts), nums)


def v_two_bits(attrs, tables):
    le = tables.get("latent_error")
    top1 = _attention(tables, "c_kv", "top1_agree")
    if le is None or not top1:
        return _missing("two_bits", "/attention_error rows with c_kv alone quantized")
    bpe = _c_kv_mean(le, "bits_per_element")
    qs = [q for q, t in top1.items() if bpe.get(q, math.inf) <= TWO_BITS_MAX_BPE and math.isfinite(t)]
    if not qs:
        return _missing("two_bits", f"a cell at <= {TWO_BITS_MAX_BPE} bits per element on c_kv")
    q = max(qs, key=top1.get)
    both = _attention(tables, BOTH, "top1_agree").get(q, math.nan)
    return Verdict(
        "two_bits",
        CLAIMS["two_bits"],
        "holds" if top1[q] >= TWO_BITS_TOP1 else "fails",
        f"`{q}` ({bpe[q]:.3g} b/e): top-1 {_g(top1[q])} with c_kv alone, {_g(both)} with k_pe too",
        dict(top1=top1[q], top1_both=both, bits_per_element=bpe[q]),
    )


FAMILIES = ("uniform", "transformed uniform", "engine", "Lloyd-Max", "TurboQuant", "transform coding")


def family(fmt: str, transform: str) -> str | None:
    """The family of a /latent_error row (its format and transform columns): one of FAMILIES, None for bf16."""
    if fmt == "bf16":
        return None
    named = {"turboquant": "TurboQuant", "lloyd-max": "Lloyd-Max", "transform-coding": "transform coding"}
    if fmt in named:
        return named[fmt]
    if fmt == "int":
        return "uniform" if transform == "none" else "transformed uniform"
    return "engine"


def family_gaps(tables):
    """The gap to both bounds per family and band (list of Markdown lines): for each family and b in BITS_BANDS,
    the cell with the smallest mean c_kv score_gap_db at bits_per_element in [b, b + 1), as
    "`spec` score_gap_db / gap_db"; "–" where the family has no cell in the band. [] without score_gap_db."""
    le = tables.get("latent_error")
    if le is None or "score_gap_db" not in le.columns:
        return []
    fam = [family(f, t) for f, t in zip(le["format"], le["transform"])]
    gap = _c_kv_mean(le, "gap_db")
    rows = []
    for name in FAMILIES:
        sub = le[[f == name for f in fam]]
        best = _band_best(sub, "score_gap_db") if len(sub) else {}
        cells = [f"`{best[b][0]}` {best[b][1]:.1f} / {gap[best[b][0]]:.1f}" if b in best else "–" for b in BITS_BANDS]
        rows.append([name] + cells)
    head = ["family"] + [f"{b}–{b + 1} bits/elem: score / mse gap dB" for b in BITS_BANDS]
    return [md_table(head, rows)]


def v_fp8(attrs, tables):
    claim = CLAIMS["fp8"]
    le, kl, by = tables.get("latent_error"), _attention(tables), _bytes(tables)
    f = "flashmla-v32-fp8"
    if le is None or f not in kl or f not in by:
        return _missing("fp8", f"{f} with an attention KL and /summary bytes")
    qs = [q for q in dict.fromkeys(_plain_int(le)["quantizer"]) if q in kl and q in by and by[q] <= by[f]]
    qs = [q for q in qs if math.isfinite(kl[q])]
    if not qs:
        return _missing("fp8", f"an integer cell at ≤ {by[f]:.6g} B/token")
    best = min(qs, key=kl.get)
    out = "integer" if kl[best] < kl[f] else "fp8"
    return Verdict(
        "fp8",
        claim,
        out,
        f"attention KL {_e(kl[f])} ({by[f]:.6g} B) vs `{best}` {_e(kl[best])} ({by[best]:.6g} B)",
        dict(kl_fp8=kl[f], kl_int=kl[best], bytes_fp8=by[f], bytes_int=by[best]),
    )


def _fraction(f):
    return {0.25: "1/4", 0.375: "3/8", 0.5: "1/2"}.get(f, f"{f:g}")


def v_planner(attrs, tables, fraction):
    key = f"planner_{_fraction(fraction)}"
    claim = CLAIMS[key]
    d = tables.get("decision")
    if d is None:
        return _missing(key, "/decision")
    d = d[(d["budget_fraction"].astype(float) - fraction).abs() < 1e-9]
    rows = {r["choice"]: r for _, r in d.iterrows()}
    if "uniform" not in rows or "plan" not in rows:
        return _missing(key, f"/decision rows at {_fraction(fraction)}")
    u, p = rows["uniform"], rows["plan"]
    if str(p["objective"]) != "kl":
        return _missing(key, f"a kl objective (the plan used {p['objective']}: no single-target attention rows)")
    uo, po = float(u["plan_objective"]), float(p["plan_objective"])
    if not (math.isfinite(uo) and math.isfinite(po)) or u["quantizer"] == "-":
        return _missing(key, f"a uniform format and a plan within {float(u['budget_bytes']):.6g} B/token")
    g = uo / po if po > 0 else math.inf
    out = _ratio_outcome(g, PLANNER_LARGE, PLANNER_MODEST, ("large", "modest", "none"))
    return Verdict(
        key,
        claim,
        out,
        f"{g:.3g}× ({_g(uo)} `{u['quantizer']}` → {_g(po)}, {float(u['budget_bytes']):.6g} B/token)",
        dict(gain=g, uniform_objective=uo, plan_objective=po, budget_bytes=float(u["budget_bytes"])),
    )


VERDICTS = (
    ("per_channel", v_per_channel),
    ("asym_vs_sym", v_asym_vs_sym),
    ("int4", lambda a, t: v_int_width(a, t, 4)),
    ("int2", lambda a, t: v_int_width(a, t, 2)),
    ("svd_half_rank", v_svd_half_rank),
    ("sharing", v_sharing),
    ("rotations", v_rotations),
    ("rd_gap", v_rd_gap),
    ("fp8", v_fp8),
    ("score_gap", v_score_gap),
    ("two_bits", v_two_bits),
) + tuple((f"planner_{_fraction(f)}", lambda a, t, f=f: v_planner(a, t, f)) for f in PLANNER_BUDGETS)


def verdicts(attrs, tables):
    """The verdicts of one results file (load_results: root attributes as str, {group: DataFrame}), in the
    order of the module docstring: a list of Verdict. A group without a column a verdict reads gives that
    verdict n/a naming the column (a file of an older schema), not an exception."""
    out = []
    for key, fn in VERDICTS:
        try:
            out.append(fn(attrs, tables))
        except KeyError as e:
            out.append(Verdict(key, CLAIMS[key], NA, f"not in the results: column {e}", {}))
    return out


def _cell(v):
    return f"**{v.outcome}**: {v.text}" if v.outcome != NA else f"n/a ({v.text})"


def transfers(outcomes):
    """ "yes" when every outcome is the same (and none is n/a), "no" when they differ, "–" with an n/a."""
    if any(o == NA for o in outcomes):
        return "–"
    return "yes" if len(set(outcomes)) == 1 else "no"


def source_line(label, path, attrs):
    """One line naming a source: label, description (source()), results file, input sha256, commit, date."""
    _, desc = source(attrs)
    sha = str(attrs.get("input_sha256", "?"))[:12]
    return (
        f"- **{label}**: {desc}; results `{os.path.basename(path)}`, input sha256 {sha}…, "
        f"commit {str(attrs.get('git_commit', '?'))[:12]}, created {attrs.get('created', '?')}"
    )


def findings_markdown(attrs, tables):
    """The "Findings" section of report.md for one results file: its source, then verdict | outcome | numbers
    (list of lines)."""
    _, desc = source(attrs)
    rows = [[v.claim, v.outcome, v.text] for v in verdicts(attrs, tables)]
    return [
        "## Findings",
        "",
        f"Measured on **{desc}**. These verdicts are about this source: docs/findings.md sets them side by side "
        "for tiny-mla and the V2-Lite stand-in and says which transfer (definitions and thresholds: "
        "`latentq.report.findings`).",
        "",
        md_table(["verdict", "outcome", "numbers"], rows),
        "",
    ]


def side_by_side(paths, labels, loaded):
    """The side-by-side table (lines): verdict | each label | transfers?, then the sources. loaded: the
    load_results() of each path."""
    per = [verdicts(a, t) for a, t, _ in loaded]
    rows = []
    for i, v in enumerate(per[0]):
        vs = [p[i] for p in per]
        rows.append([v.claim] + [_cell(x) for x in vs] + [transfers([x.outcome for x in vs])])
    L = [md_table(["verdict"] + list(labels) + ["transfers?"], rows), "", "Sources:", ""]
    L += [source_line(lb, p, a) for lb, p, (a, _, _) in zip(labels, paths, loaded)]
    return L, per


def main(argv=None):
    from latentq.report.load import ReportError, load_results

    ap = StepParser(
        "findings",
        prog="python -m latentq.report.findings",
        description="The findings' verdicts of one or more latentq results files, side by side (Markdown).",
        epilog="Exit codes: 0 done; 1 --check and a verdict is n/a; 2 input error.",
    )
    ap.add_argument("results", nargs="+", metavar="RESULTS.h5")
    ap.add_argument("--labels", help="comma-separated column labels, one per file (default: each source's kind)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a verdict of a file is n/a (naming it)")
    ap.add_argument(
        "--families",
        action="store_true",
        help="after the table, per file: the gap to the score-space and mse bounds per family and bits band",
    )
    a = ap.parse_args(argv)
    loaded = []
    for p in a.results:
        try:
            loaded.append(load_results(p))
        except ReportError as e:
            say("findings", "error", f"{p}: {e}")
            return 2
    labels = a.labels.split(",") if a.labels else [source(x[0])[0] for x in loaded]
    if len(labels) != len(a.results):
        say("findings", "error", f"--labels: {len(labels)} labels for {len(a.results)} files")
        return 2
    lines, per = side_by_side(a.results, labels, loaded)
    if a.families:
        for lb, (_, tables, _) in zip(labels, loaded):
            lines += [
                "",
                f"Gap to the bounds per family, {lb} (c_kv, mean over layers; the best cell by score gap):",
                "",
            ]
            lines += family_gaps(tables) or ["(no score_gap_db in this file)"]
    print("\n".join(lines))
    if a.check:
        bad = [(lb, v) for lb, vs in zip(labels, per) for v in vs if v.outcome == NA]
        for lb, v in bad:
            say("findings", "error", f"{lb}: {v.key} is n/a: {v.text}")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
