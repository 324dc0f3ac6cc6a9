"""Write results/thresholds.toml (the regression gate of `latentq regress`) from a measured run.

    build/latentq run --e2e all --out /tmp/default.h5  # the embedded default study, every format end to end
    .venv/bin/python -m latentq.thresholds /tmp/default.h5 > results/thresholds.toml

Each threshold's bound is the measured value with a margin of `--margin` (default 1.25) on the error
amplitude, rounded outward to 2 significant digits:
  rel_fro, out_rel_fro, kl_mean, heldout_rel_fro   bound = measured * margin, rounded up   (value <= bound)
  cos_mean, top1_agree                             bound = 1 - (1 - measured) * margin, rounded down
                                                                                    (direction min: value >= bound)
  ppl_quant                                        bound = ppl_ref + |ppl_quant - ppl_ref| * margin, rounded up
                                                   at the second significant digit of that slack (value <= bound)
The groups: /latent_error (c_kv, k_pe), /attention_error (c_kv+k_pe, and svd-rank64 on c_kv),
/attention_position and /e2e_position (the decode-order quantizers of the run), /e2e (prefill-at-once and
decode orders), /svd (held-out error by rank). The measured value and the margin are written as a comment
above each entry. Exit 2 with one line when the file is not a latentq-results/1 file or lacks a group or
a row the gate needs. Only h5py and numpy.
"""

from __future__ import annotations

import math
import sys

import h5py
import numpy as np

from latentq.progress import StepParser, say

# The key quantizers of the gate: every bit width and scheme at the three granularities that
# matter (per-channel KIVI groups of 32, per-token whole row, per-tensor), plus the baselines.
KEY = [f"int{b}-{s}-{g}" for b in (8, 4, 2) for s in ("asym", "sym") for g in ("channel-g32", "token", "tensor")]
KEY += [
    "bf16",
    "flashmla-v32-fp8",
    "vllm-fp8-ds-mla",
    "flashmla-v41-fp8",
    "fp8-e4m3-tensor",
    "mxfp8",
    "mxfp4",
    "nvfp4",
    "q8_0",
    "q4_0",
    "q4_1",
]
# Transformed quantizers: the rotation stage in front of the per-channel, per-token and ggml
# formats (a change of the FWHT, the signs or the KLT fit moves these).
KEY += [
    "had,int4-asym-channel-g32",
    "klt,int4-asym-channel-g32",
    "had,int4-asym-token",
    "klt,int4-asym-token",
    "had,int2-asym-channel-g32",
    "had,q4_0",
    "had,mxfp4",
]
# The non-uniform and transform-coding families (a change of a codebook, a fit or the water-filling moves these),
# and vLLM's TurboQuant MLA preset.
KEY += ["tq3-nc", "vllm-turboquant-3bit-nc", "lm3-channel", "klt,tc3", "klt,tc2-lm", "sklt,tc3", "sklt,tc2-lm"]
MEAN_REL_FRO = [
    "int8-asym-channel-g32",
    "int4-asym-channel-g32",
    "int2-asym-channel-g32",
    "int4-sym-token",
    "flashmla-v32-fp8",
    "mxfp4",
    "nvfp4",
    "q4_0",
]
COS_MIN = [
    "int8-asym-channel-g32",
    "int4-asym-channel-g32",
    "int4-asym-token",
    "int2-asym-channel-g32",
    "flashmla-v32-fp8",
    "q4_0",
]


# /attention_error (targets c_kv+k_pe) and /e2e (prefill-at-once): the quantizers of the latent gate whose
# attention and end-to-end error matter most.
ATTENTION = [
    "int8-asym-channel-g32",
    "int4-asym-channel-g32",
    "had,int4-asym-channel-g32",
    "int4-asym-token",
    "int2-asym-channel-g32",
    "flashmla-v32-fp8",
    "q4_0",
    "nvfp4",
    "mxfp4",
    "tq3-nc",
    "vllm-turboquant-3bit-nc",
    "lm3-channel",
    "klt,tc3",
    "klt,tc2-lm",
    "sklt,tc3",
    "sklt,tc2-lm",
]
TOP1_MIN = ["int4-asym-channel-g32", "had,int4-asym-channel-g32", "int4-asym-token"]
# Decode orders gated on /attention_position (p95 over layers and position buckets) and /e2e.
POSITION_MODES = ["decode-r0-s0-p0", "decode-r32-s4-p0", "decode-r128-s4-p0"]
E2E_MODES = ["decode-r32-s4-p0", "decode-r128-s4-p0"]
SVD_RANKS = [32, 64, 128]


class MissingRows(Exception):
    """A group or a row the gate needs is not in the results file."""


def round_up(x: float, digits: int = 2) -> float:
    if x <= 0:
        return 0.0
    e = math.floor(math.log10(x)) - (digits - 1)
    return math.ceil(x / 10**e - 1e-9) * 10**e


def round_up_at(x: float, slack: float, digits: int = 2) -> float:
    """x rounded up at the `digits`-th significant digit of `slack` (> 0)."""
    e = math.floor(math.log10(slack)) - (digits - 1)
    return math.ceil(x / 10**e - 1e-9) * 10**e


def fmt(x: float) -> str:
    return f"{x:.10g}"


def read_tables(path: str) -> tuple[dict, dict]:
    """The gate's groups of a results file as {group: {column: numpy array}} (strings decoded), and
    its root attributes."""
    groups = ("latent_error", "attention_error", "attention_position", "e2e", "e2e_position", "svd")
    with h5py.File(path, "r") as f:
        if f.attrs.get("schema") != "latentq-results/1":
            raise MissingRows(f"{path} is not a latentq-results/1 file")
        missing = [g for g in groups if g not in f]
        if missing:
            raise MissingRows(
                f"{path} has no group {', '.join('/' + g for g in missing)} (run the default study with the "
                "e2e step: the latentq_py module built and the project venv)"
            )
        tables = {
            g: {k: (v.asstr()[:] if h5py.check_string_dtype(v.dtype) else v[:]) for k, v in f[g].items()}
            for g in groups
        }
        attrs = dict(f.attrs)
    return tables, attrs


def main(argv=None) -> int:
    ap = StepParser("thresholds", prog="python -m latentq.thresholds", description=__doc__)
    ap.add_argument("results", help="a latentq-results/1 file of the default study")
    ap.add_argument("--margin", type=float, default=1.25, help="error-amplitude margin (default 1.25)")
    a = ap.parse_args(argv)
    try:
        text = thresholds_text(a.results, a.margin)
    except MissingRows as e:
        say("thresholds", "error", str(e))
        return 2
    print(text)
    return 0


def thresholds_text(path: str, m: float) -> str:
    """The thresholds file for the results file `path` with margin `m` (see the module docstring)."""
    tables, attrs = read_tables(path)
    out = []
    w = out.append
    w("# results/thresholds.toml: the regression gate of `latentq regress` (see latentq/regress.h),")
    w("# checked by the ctest test study.default_study_and_gate on the embedded default study.")
    w(f"# Generated by python -m latentq.thresholds from a run of the default study on {attrs['model']}")
    w(f"# ({int(attrs['num_layers'])} layers; input sha256 {attrs['input_sha256']}; latentq git {attrs['git_commit']};")
    w(f"# {attrs['created']}). Margin {m:g} on the error amplitude, rounded outward to 2 significant digits:")
    w("#   rel_fro, out_rel_fro, kl_mean, heldout_rel_fro: bound = measured x margin (value <= bound);")
    w('#   cos_mean, top1_agree: bound = 1 - (1 - measured) x margin, direction = "min" (value >= bound);')
    w("#   ppl_quant: bound = ppl_ref + |ppl_quant - ppl_ref| x margin, rounded up at the second significant")
    w("#   digit of that slack (value <= bound).")
    w("# The study is deterministic (the e2e step too: float32 on the CPU): a change in these numbers means the")
    w("# quantizers, the dump or the model changed. Regenerate after an intended change:")
    w("#   build/latentq run --e2e all --out /tmp/default.h5")
    w("#   .venv/bin/python -m latentq.thresholds /tmp/default.h5 > results/thresholds.toml")

    def entry(metric, stat, bound, comment, direction=None, group=None, **filters):
        w("")
        w(f"# {comment}")
        w("[[threshold]]")
        if group:
            w(f'group = "{group}"')
        for key in ("quantizer", "target", "cache_mode", "rank"):
            if key in filters:
                v = filters[key]
                w(f'{key} = "{v}"' if isinstance(v, str) else f"{key} = {v}")
        w(f'metric = "{metric}"')
        w(f'statistic = "{stat}"')
        if direction:
            w(f'direction = "{direction}"')
        w(f"bound = {fmt(bound)}")

    def values(group, metric, **filters):
        t = tables[group]
        sel = None
        for key, v in filters.items():
            col = "targets" if key == "target" and "target" not in t else key
            s = t[col] == v
            sel = s if sel is None else sel & s
        if not sel.any():
            what = ", ".join(f"{k} {v}" for k, v in filters.items())
            raise MissingRows(f"no row of /{group} in {path} has {what}")
        return t[metric][sel]

    def upper(group, metric, stat, v, **filters):  # lower is better: bound = measured x margin
        entry(
            metric, stat, round_up(v * m), f"measured {stat} {metric} = {v:.6g}, margin {m:g}", None, group, **filters
        )

    def lower(group, metric, stat, v, **filters):  # higher is better: 1 - bound = (1 - measured) x margin
        entry(
            metric,
            stat,
            1.0 - round_up((1.0 - v) * m),
            f"measured {stat} {metric} = {v:.6g}, margin {m:g}",
            "min",
            group,
            **filters,
        )

    lt = "latent_error"
    for target in ("c_kv", "k_pe"):
        w("")
        w(f"# ---- {target}: max rel_fro over layers ----")
        for quant in KEY:
            v = float(values(lt, "rel_fro", quantizer=quant, target=target).max())
            upper(None, "rel_fro", "max", v, quantizer=quant, target=target)
        w("")
        w(f"# ---- {target}: mean rel_fro over layers ----")
        for quant in MEAN_REL_FRO:
            v = float(values(lt, "rel_fro", quantizer=quant, target=target).mean())
            upper(None, "rel_fro", "mean", v, quantizer=quant, target=target)
        w("")
        w(f"# ---- {target}: worst layer's mean cosine similarity ----")
        for quant in COS_MIN:
            v = float(values(lt, "cos_mean", quantizer=quant, target=target).min())
            lower(None, "cos_mean", "min", v, quantizer=quant, target=target)

    w("")
    w("# ---- /attention_error, c_kv+k_pe quantized: worst layer's KL and output error ----")
    ae = "attention_error"
    for quant in ATTENTION:
        for metric in ("kl_mean", "out_rel_fro"):
            v = float(values(ae, metric, quantizer=quant, target="c_kv+k_pe").max())
            upper(ae, metric, "max", v, quantizer=quant, target="c_kv+k_pe")
    v = float(values(ae, "kl_mean", quantizer="svd-rank64", target="c_kv").max())
    upper(ae, "kl_mean", "max", v, quantizer="svd-rank64", target="c_kv")

    decode = [str(q) for q in attrs.get("decode_order_quantizers", [])]
    w("")
    w("# ---- /attention_position: p95 of the KL over layers and query-position buckets, by decode order ----")
    for quant in decode:
        for mode in POSITION_MODES:
            f = dict(quantizer=quant, target="c_kv+k_pe", cache_mode=mode)
            v = float(np.quantile(values("attention_position", "kl_mean", **f), 0.95))
            upper("attention_position", "kl_mean", "p95", v, **f)

    w("")
    w("# ---- /e2e, prefill-at-once: KL of the next-byte distribution, perplexity, top-1 agreement ----")
    for quant in ATTENTION:
        f = dict(quantizer=quant, target="c_kv+k_pe", cache_mode="prefill-at-once")
        upper("e2e", "kl_mean", "max", float(values("e2e", "kl_mean", **f).max()), **f)
        quant_ppl = float(values("e2e", "ppl_quant", **f).max())
        ref_ppl = float(values("e2e", "ppl_ref", **f).max())
        slack = round_up(abs(quant_ppl - ref_ppl) * m)
        entry(
            "ppl_quant",
            "max",
            round_up_at(ref_ppl + slack, slack),
            f"measured ppl_quant = {quant_ppl:.6g} (ppl_ref {ref_ppl:.6g}, excess {quant_ppl - ref_ppl:+.3g}), "
            f"margin {m:g}",
            None,
            "e2e",
            **f,
        )
        if quant in TOP1_MIN:
            lower("e2e", "top1_agree", "min", float(values("e2e", "top1_agree", **f).min()), **f)
    w("")
    w("# ---- /e2e in decode order: KL ----")
    for quant in decode:
        for mode in E2E_MODES:
            f = dict(quantizer=quant, target="c_kv+k_pe", cache_mode=mode)
            upper("e2e", "kl_mean", "max", float(values("e2e", "kl_mean", **f).max()), **f)
    w("")
    w(f"# ---- /e2e_position, {E2E_MODES[0]}: p95 of the KL over query-position buckets ----")
    for quant in decode:
        f = dict(quantizer=quant, target="c_kv+k_pe", cache_mode=E2E_MODES[0])
        v = float(np.quantile(values("e2e_position", "kl_mean", **f), 0.95))
        upper("e2e_position", "kl_mean", "p95", v, **f)

    w("")
    w("# ---- /svd: worst layer's held-out error of the rank-r c_kv basis ----")
    for rank in SVD_RANKS:
        v = float(values("svd", "heldout_rel_fro", rank=rank).max())
        upper("svd", "heldout_rel_fro", "max", v, rank=rank)
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
