"""Tests of latentq.report (`latentq report`): synthetic latentq-results/1 files of chosen values, written by
the results file's own writers (results_fixture: the study's C++ writer, the e2e step's write_groups) with the
columns they declare, `python -m latentq.report` run as a subprocess; figures checked as PNGs, report.md
checked for figures, tables, the lines about missing groups and the plain tables of the groups it has no
figure for; bad inputs give exit code 2 and a one-line message, never a traceback."""

import math
import os
import re
import struct
import subprocess
import sys

import h5py
import numpy as np
import pandas as pd
import pytest

from latentq import report as R
from results_fixture import write_results

SEED = 1234

ALL_FIGURES = [
    "frontier_c_kv.png",
    "frontier_model_bytes.png",
    "per_layer.png",
    "svd.png",
    "cross_layer.png",
    "cross_layer_sharing.png",
    "e2e.png",
    "error_vs_position.png",
]


# ---------------------------------------------------------------------------------------------
# Synthetic results files

L, D, DR = 6, 128, 32  # layers, kv_lora_rank, qk_rope_head_dim


def quantizer_list():
    qs = []
    for b in (8, 4, 2):
        for s in ("sym", "asym"):
            qs.append(f"int{b}-{s}-tensor")
            for g in ("channel", "token"):
                for gs in (0, 32, 128):
                    qs.append(f"int{b}-{s}-{g}" + (f"-g{gs}" if gs else ""))
    return qs + ["bf16", "flashmla-v32-fp8"]


_INT = re.compile(r"^int(\d+)-(sym|asym)-(tensor|channel|token)(?:-g(\d+))?(?:-(fp32))?$")

# Transformed quantizers ("<transform>,<spec>", latentq/transform.h) that make_results adds on request,
# with their transform strings: each at 0.85 times its spec's error, so they make the Pareto fronts.
TRANSFORMED = {
    "had,int4-asym-channel-g32": "had",
    "klt,int2-asym-channel-g32": "klt",
    "had64-s9,int4-asym-token": "had64-s9",
    "rot,int8-sym-channel-g128": "rot",
    "had,int8-asym-channel-g32": "had",
    "had,flashmla-v32-fp8": "had",
}


def split_transform(q):
    """(transform, spec) of a synthetic quantizer name: ("", q) without a transform."""
    return (TRANSFORMED[q], q.split(",", 1)[1]) if q in TRANSFORMED else ("", q)


def spec_fields(q):
    """The spec columns latentq writes to /latent_error for the quantizers of these synthetic files (c_kv)."""
    q = split_transform(q)[1]
    m = _INT.match(q)
    if m:
        return dict(
            kind="int",
            bits=int(m[1]),
            scheme=m[2],
            granularity=m[3],
            group_size=int(m[4] or 0),
            scale_dtype=m[5] or "fp16",
        )
    if q == "bf16":
        return dict(kind="bf16", bits=16, scheme="none", granularity="element", group_size=0, scale_dtype="none")
    assert q == "flashmla-v32-fp8", q
    return dict(kind="fp8", bits=8, scheme="sym", granularity="tile", group_size=128, scale_dtype="fp32")


def bits_per_element(q, dim):
    p = spec_fields(q)
    if p["kind"] == "bf16":
        return 16.0
    if p["kind"] == "fp8":
        return 8.0 + 32.0 / 128 if dim == D else 16.0  # fp8 on k_pe stores bf16
    meta = 16.0 * (2 if p["scheme"] == "asym" else 1)
    if p["granularity"] == "tensor":
        return p["bits"] + meta / (512 * dim)
    if p["granularity"] == "channel":
        return p["bits"] + meta / (p["group_size"] or 512)
    return p["bits"] + meta / (p["group_size"] or dim)


def rel_fro(q, layer, rng, target):
    p = spec_fields(q)
    if split_transform(q)[0]:
        return 0.85 * rel_fro(split_transform(q)[1], layer, rng, target)
    if p["kind"] == "bf16":
        base = 2.0e-3
    elif p["kind"] == "fp8":
        base = 3.0e-2 if target == "c_kv" else 2.0e-3
    else:
        gfac = {"tensor": 3.0, "channel": 1.0, "token": 1.4}[p["granularity"]]
        gsf = {0: 1.5, 32: 0.8, 128: 1.0}[p["group_size"]] if p["granularity"] != "tensor" else 1.0
        base = 2.0 ** (-(p["bits"] - 1)) * gfac * gsf * (0.8 if p["scheme"] == "asym" else 1.0)
    return base * (1 + 0.1 * layer) * (1 + 0.05 * rng.standard_normal())


def table(rows):
    """{column: numpy array} of a list of dicts with the same keys (the columns a test gives a group)."""
    return {k: np.array([r[k] for r in rows]) for k in rows[0]}


def latent_error_columns(qs, rng):
    """/latent_error: every quantizer on every layer and target, rel_fro drawn by rel_fro()."""
    rows = []
    for layer in range(L):
        for t, dim in (("c_kv", D), ("k_pe", DR)):
            for q in qs:
                p = spec_fields(q)
                tr, spec = split_transform(q)
                bpe = bits_per_element(q, dim)
                e = rel_fro(q, layer, rng, t)
                rows.append(
                    dict(
                        layer=layer,
                        target=t,
                        quantizer=q,
                        format=p["kind"],
                        bits=p["bits"],
                        scheme=p["scheme"],
                        granularity=p["granularity"],
                        group_size=p["group_size"],
                        scale_dtype=p["scale_dtype"],
                        bits_per_element=bpe,
                        bytes_per_token_layer=bpe * dim / 8,
                        rel_fro=e,
                        mse=e * e,
                        sqnr_db=-20 * math.log10(e),
                        max_abs_err=4 * e,
                        cos_mean=1 - e * e / 2,
                        stored="bf16" if p["kind"] == "fp8" and t == "k_pe" else spec,
                        transform=tr or "none",
                        # score space: a layer-dependent metric, a bound falling with the bits
                        gap_db=10 * math.log10(e * e / 2.0 ** (-2 * bpe)),
                        score_mse=100 * (1 + layer) * e * e,
                        score_bound_mse=(1 + layer) * 2.0 ** (-2 * bpe),
                        score_gap_db=10 * math.log10(100 * e * e / 2.0 ** (-2 * bpe)),
                    )
                )
    return table(rows)


def summary_columns(le, qs):
    """/summary from the /latent_error columns."""
    rows = []
    for q in qs:
        mc, mk = (le["quantizer"] == q) & (le["target"] == "c_kv"), (le["quantizer"] == q) & (le["target"] == "k_pe")
        byt = L * (le["bytes_per_token_layer"][mc].mean() + le["bytes_per_token_layer"][mk].mean())
        rows.append(
            dict(
                quantizer=q,
                mean_rel_fro_c_kv=le["rel_fro"][mc].mean(),
                max_rel_fro_c_kv=le["rel_fro"][mc].max(),
                mean_rel_fro_k_pe=le["rel_fro"][mk].mean(),
                max_rel_fro_k_pe=le["rel_fro"][mk].max(),
                bits_per_element=le["bits_per_element"][mc].mean(),
                bytes_per_token_model=byt,
                ratio_vs_bf16=byt / (L * (D + DR) * 2),
            )
        )
    return table(rows)


def attention_error_columns(qs, mean_c):
    """/attention_error: the quantizers on c_kv, four on k_pe, SVD ranks; error growing with the layer."""
    out = []
    for layer in range(L):
        rows = [(q, "c_kv", 0.7 * mean_c[q]) for q in qs] + [(q, "k_pe", 0.2 * mean_c[q]) for q in qs[:4]]
        rows += [(f"svd-rank{r}", "c_kv", 0.5 * (1 - r / D) + 1e-3) for r in (8, 16, 32, 64, 96, 128)]
        for q, t, e in rows:
            e *= 1 + 0.1 * layer
            out.append(
                dict(
                    layer=layer,
                    quantizer=q,
                    targets=t,
                    out_rel_fro=e,
                    cos_mean=1 - e * e / 2,
                    kl_mean=e * e,
                    top1_agree=1 - e,
                    top8_agree=1 - e / 2,
                )
            )
    return table(out)


def score_vs_attention_columns(qs):
    """/score_vs_attention: per target the layers, then -1 (and on c_kv a band of 4 bits); rho rising (score_mse)
    and falling (mse) with the layer."""
    rows = []
    for t, n in (("c_kv", len(qs)), ("k_pe", 4)):
        for layer, band in [(x, -1) for x in range(L)] + [(-1, -1)] + ([(-1, 4)] if t == "c_kv" else []):
            rows.append(
                dict(
                    layer=layer,
                    target=t,
                    bits_band=band,
                    n_quantizers=n if band < 0 else 3,
                    spearman_score_mse=0.95 if layer < 0 else 0.9 + 0.01 * layer,
                    spearman_mse=0.45 if layer < 0 else 0.5 - 0.01 * layer,
                )
            )
    return table(rows)


def svd_columns():
    """/svd: centered fits at six ranks per layer."""
    rows = []
    for layer in range(L):
        for r in (8, 16, 32, 64, 96, 128):
            ho = max(0.6 * math.exp(-r / (25 + 5 * layer)), 1e-7) if r < D else 1e-7
            rows.append(
                dict(
                    layer=layer,
                    rank=r,
                    centered=1,
                    fit_rel_fro=0.9 * ho,
                    heldout_rel_fro=ho,
                    rank_90=20 + layer,
                    rank_99=60 + 2 * layer,
                    rank_999=100 + 3 * layer,
                )
            )
    return table(rows)


def svd_spectrum_columns():
    rows = [
        dict(layer=layer, index=i, singular_value=50.0 * math.exp(-i / (15 + 4 * layer)))
        for layer in range(L)
        for i in range(D)
    ]
    return table(rows)


def cross_layer_columns():
    rows = [  # a < b only: the report must symmetrize
        dict(layer_a=a_, layer_b=b_, mean_abs_pearson=0.1 + 0.5 / (b_ - a_), cka=0.3 + 0.6 / (b_ - a_))
        for a_ in range(L)
        for b_ in range(a_ + 1, L)
    ]
    return table(rows)


def sharing_columns():
    rows = [
        dict(
            window_start=ws,
            window=2,
            rank=r,
            shared_heldout_rel_fro=0.5 * math.exp(-r / (60 + 10 * ws)),
            per_layer_heldout_rel_fro=0.55 * math.exp(-r / (70 + 10 * ws)),
        )
        for ws in (0, 2, 4)
        for r in (16, 32, 64, 128, 192)
    ]
    return table(rows)


def e2e_columns(qs, mean_c):
    rows = []
    for q in qs:
        kl = mean_c[q] ** 2
        rows.append(
            dict(
                quantizer=q,
                targets="c_kv+k_pe",
                kl_mean=kl,
                top1_agree=max(0.0, 1 - mean_c[q]),
                nll_ref=1.5,
                nll_quant=1.5 + kl,
                ppl_ref=math.exp(1.5),
                ppl_quant=math.exp(1.5 + kl),
                num_tokens=2048,
            )
        )
    return table(rows)


def attention_position_columns():
    c = position_columns(POSITION_KL, count="queries")
    n = len(c["quantizer"])
    for k in list(c):  # two layers at 2x and 4x the KL: the figure draws their mean (3x)
        c[k] = c[k] + c[k]
    c["layer"] = [0] * n + [1] * n
    c["kl_mean"] = [v * 2.0 for v in c["kl_mean"][:n]] + [v * 4.0 for v in c["kl_mean"][n:]]
    c["targets"] = ["c_kv+k_pe"] * (2 * n)
    return c


def make_results(
    path,
    groups=(
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
    ),
    schema="latentq-results/1",
    transformed=False,
    extra=None,
    attrs=None,
):
    """A synthetic results file, written by the results file's own writers (results_fixture: the column
    records are theirs); returns the per-quantizer mean c_kv rel_fro (dict) for checks. transformed: the
    TRANSFORMED quantizers too; extra: more groups for results_fixture.write_results; attrs: more root
    attributes; schema: another root attribute schema, written over the writer's."""
    rng = np.random.default_rng(SEED)
    qs = quantizer_list() + (list(TRANSFORMED) if transformed else [])
    le = latent_error_columns(qs, rng)
    mean_c = {q: float(le["rel_fro"][(le["quantizer"] == q) & (le["target"] == "c_kv")].mean()) for q in qs}
    columns = {
        "latent_error": lambda: le,
        "summary": lambda: summary_columns(le, qs),
        "attention_error": lambda: attention_error_columns(qs, mean_c),
        "score_vs_attention": lambda: score_vs_attention_columns(qs),
        "svd": svd_columns,
        "svd_spectrum": svd_spectrum_columns,
        "cross_layer": cross_layer_columns,
        "cross_layer_sharing": sharing_columns,
        "e2e": lambda: e2e_columns(qs, mean_c),
        "e2e_position": lambda: position_columns(POSITION_KL),
        "attention_position": attention_position_columns,
    }
    root = dict(
        model="tiny-mla",
        input_path="/data/latents/tiny-mla.h5",
        input_sha256="ab" * 32,
        num_layers=L,
        kv_lora_rank=D,
        qk_rope_head_dim=DR,
        latentq_version="0.1.0",
        git_commit="0123456789abcdef",
    )
    made = {name: make() for name, make in columns.items() if name in groups}
    write_results(path, {**root, **(attrs or {})}, {**made, **(extra or {})})
    if schema != "latentq-results/1":
        with h5py.File(path, "a") as f:
            f.attrs["schema"] = schema
    return mean_c


# (quantizer, cache_mode, R, S, P) -> KL per bucket of 64 positions (4 buckets): int2 grows with position,
# a residual and a sink lower it; decode-r64-s0-p0 is drawn by no curve (R not in {0, 32, 128}).
POSITION_KL = {
    ("int2-asym-channel-g32", "prefill-at-once", 0, 0, 0): [0.05, 0.06, 0.07, 0.08],
    ("int2-asym-channel-g32", "decode-r0-s0-p0", 0, 0, 0): [0.04, 0.06, 0.08, 0.10],
    ("int2-asym-channel-g32", "decode-r32-s4-p0", 32, 4, 0): [0.001, 0.02, 0.03, 0.04],
    ("int2-asym-channel-g32", "decode-r128-s4-p0", 128, 4, 0): [1e-4, 2e-4, 0.01, 0.02],
    ("int2-asym-channel-g32", "decode-r64-s0-p0", 64, 0, 0): [1e-4, 0.01, 0.02, 0.03],
    ("int4-asym-channel-g32", "decode-r0-s0-p0", 0, 0, 0): [0.004, 0.005, 0.006, 0.007],
}


def position_columns(table, count="tokens"):
    c = {
        k: []
        for k in ("quantizer", "cache_mode", "residual", "sink", "prefill", "pos_start", "pos_end", count, "kl_mean")
    }
    for (q, m, r, s_, p), kls in table.items():
        for b, kl in enumerate(kls):
            for k, v in (
                ("quantizer", q),
                ("cache_mode", m),
                ("residual", r),
                ("sink", s_),
                ("prefill", p),
                ("pos_start", 64 * b),
                ("pos_end", 64 * b + 64),
                (count, 128),
                ("kl_mean", kl),
            ):
                c[k].append(v)
    return c


def run_report(*args):
    env = dict(os.environ, MPLBACKEND="Agg")
    env.pop("LATENTQ_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "latentq.report", *map(str, args)], capture_output=True, text=True, env=env, timeout=600
    )


def assert_png(path):
    assert os.path.isfile(path), f"{path} missing"
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG"
    assert data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    assert w >= 400 and h >= 300, f"{path}: {w}x{h}"
    assert len(data) > 15000, f"{path}: only {len(data)} bytes"


def assert_clean_stderr(p):
    assert "Traceback" not in p.stderr, p.stderr


# ---------------------------------------------------------------------------------------------
# Full and partial files


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    d = tmp_path_factory.mktemp("full")
    mean_c = make_results(d / "res.h5")
    p = run_report(d / "res.h5", "--out", d / "out")
    return d / "out", p, mean_c


def test_full_report_writes_every_figure(full):
    out, p, _ = full
    assert p.returncode == 0, p.stderr
    assert_clean_stderr(p)
    for fn in ALL_FIGURES:
        assert_png(out / fn)
    md = (out / "report.md").read_text()
    for fn in ALL_FIGURES:
        assert f"]({fn})" in md, fn
    assert md.startswith("# latentq report: tiny-mla")
    assert "/data/latents/tiny-mla.h5" in md
    assert "not in the results file" not in md and "not in the results file" not in p.stdout
    subset = f"latentq report: warning: {out.parent / 'res.h5'}: "  # the shard / incomplete-run warning
    assert "WARNING" not in md and subset not in p.stderr  # no shard/complete attributes: complete
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]


def test_full_report_tables(full):
    out, p, mean_c = full
    md = (out / "report.md").read_text()
    # top table: the best quantizer at each integer bit width (by mean c_kv rel_fro) ranks first
    for b in (2, 4, 8):
        cand = {q: e for q, e in mean_c.items() if q.startswith(f"int{b}-")}
        best = min(cand, key=cand.get)
        line = next(l for l in md.splitlines() if l.startswith(f"| {b} | 1 | "))
        assert f"`{best}`" in line, (b, best, line)
        assert f"{cand[best]:.2e}" in line
    # adjacent layers (the file has a<b pairs only): CKA then Pearson, 3 decimals
    for a in range(L - 1):
        assert f"| {a} | {a + 1} | {0.3 + 0.6:.3f} | {0.1 + 0.5:.3f} |" in md
    # SVD energy ranks per layer
    for layer in range(L):
        assert f"| {layer} | {20 + layer} | {60 + 2 * layer} | {100 + 3 * layer} |" in md
    # e2e: the lowest KL at 4 bits first in its group, baselines present; a '|' in a header is escaped
    kl4 = {q: e * e for q, e in mean_c.items() if q.startswith("int4-")}
    best = min(kl4, key=kl4.get)
    line = next(l for l in md.splitlines() if l.startswith("| 4 | `") and "c_kv+k_pe" in l)
    assert f"`{best}`" in line and f"{kl4[best]:.2e}" in line, line
    assert md.count("| bf16 | `bf16` | c_kv+k_pe |") == 1
    assert "mean \\|Pearson\\|" in md
    # the Pareto front line names only quantizers of the file
    front = next(l for l in md.splitlines() if l.startswith("Pareto front"))
    assert "`bf16`" in front or "`int8" in front


def test_full_report_score_section(full):
    """The score-space section: the /score_vs_attention rows, and per bit width the lowest mean c_kv score_mse
    first with its mean score_gap_db."""
    import h5py

    out, _, _ = full
    md = (out / "report.md").read_text()
    assert "## Score-space error and attention" in md
    section = md.split("## Score-space error and attention")[1].split("\n## ")[0]
    assert f"| mean over layers | c_kv | all | {len(quantizer_list())} | 0.950 | 0.450 |" in md
    assert "| mean over layers | c_kv | [4, 5) | 3 | 0.950 | 0.450 |" in md
    assert "| 2 | k_pe | all | 4 | 0.920 | 0.480 |" in md
    with h5py.File(out.parent / "res.h5") as f:
        g = f["latent_error"]
        q, t = g["quantizer"].asstr()[:], g["target"].asstr()[:]
        smse, sgap = g["score_mse"][:], g["score_gap_db"][:]
    for b in (2, 4, 8):
        cand = {x: smse[(q == x) & (t == "c_kv")].mean() for x in set(q) if x.startswith(f"int{b}-")}
        best = min(cand, key=cand.get)
        gap = sgap[(q == best) & (t == "c_kv")].mean()
        line = next(l for l in section.splitlines() if l.startswith(f"| {b} | 1 | "))
        assert f"`{best}`" in line and f"{cand[best]:.2e}" in line and f"| {gap:.1f} |" in line, (b, best, line)


def test_older_file_without_score_vs_attention(tmp_path):
    make_results(tmp_path / "res.h5", groups=("latent_error", "summary", "attention_error"))
    p = run_report(tmp_path / "res.h5", "--out", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    md = (tmp_path / "out" / "report.md").read_text()
    assert "/score_vs_attention not in the results file: no score-vs-attention table" in md
    assert "## Score-space error and attention" in md  # the score_gap_db table from /latent_error alone


def test_partial_file(tmp_path):
    make_results(tmp_path / "res.h5", groups=("latent_error", "summary"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "svd.png").write_bytes(b"stale figure of an earlier report")
    (tmp_path / "out" / "notes.txt").write_text("not ours")
    p = run_report(
        tmp_path / "res.h5", "--out", tmp_path / "out", "--quantizers", "int4-*-channel-g32", "nope-*", "bf16"
    )
    assert p.returncode == 0, p.stderr
    assert_clean_stderr(p)
    out = tmp_path / "out"
    for fn in ("frontier_c_kv.png", "frontier_model_bytes.png", "per_layer.png"):
        assert_png(out / fn)
    for fn in ("svd.png", "cross_layer.png", "cross_layer_sharing.png", "e2e.png"):
        assert not (out / fn).exists(), fn
    assert (out / "notes.txt").read_text() == "not ours"
    md = (out / "report.md").read_text()
    for g in ("/attention_error", "/svd and /svd_spectrum", "/cross_layer not", "/cross_layer_sharing", "/e2e"):
        assert sum(g in l and "not in the results file" in l for l in md.splitlines()) == 1, g
        assert sum(g in l and "not in the results file" in l for l in p.stdout.splitlines()) == 1, g
    assert "'nope-*' matches no quantizer" in p.stderr
    assert "given by --quantizers" in md


@pytest.mark.parametrize(
    "kind,attrs,expect",
    [
        (
            "shard",
            dict(shard="1/3", shard_index=1, shard_count=3, cells=40, cells_total=120, shard_cells=40, complete=1),
            "shard 1/3: means over a subset of cells (40 of the 120 cells)",
        ),
        (
            "checkpoint",
            dict(shard="0/1", shard_index=0, shard_count=1, cells=10, cells_total=120, shard_cells=120, complete=0),
            "incomplete run: 10 of 120 cells",
        ),
    ],
)
def test_shard_or_incomplete_file_warns(tmp_path, kind, attrs, expect):
    make_results(tmp_path / "res.h5", groups=("latent_error", "summary"), attrs=attrs)
    p = run_report(tmp_path / "res.h5", "--out", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    assert_clean_stderr(p)
    warn = [l for l in p.stderr.splitlines() if l.startswith(f"latentq report: warning: {tmp_path / 'res.h5'}: ")]
    assert len(warn) == 1 and expect in warn[0], p.stderr
    md = (tmp_path / "out" / "report.md").read_text().splitlines()
    assert md[0].startswith("# latentq report")
    top = next(l for l in md[1:] if l.strip())  # the first thing after the title
    assert top.startswith("> **WARNING:") and expect in top, top


def test_only_svd_groups(tmp_path):
    make_results(tmp_path / "res.h5", groups=("svd",))
    p = run_report(tmp_path / "res.h5", "--out", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    assert_png(tmp_path / "out" / "svd.png")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "/svd_spectrum not in the results file" in md
    assert "/latent_error and /summary not in the results file" in md


# ---------------------------------------------------------------------------------------------
# Bad inputs: exit 2, one message, nothing written


def _no_schema(p):
    with h5py.File(p, "w") as f:
        f.create_group("latent_error")


def _no_groups(p):
    with h5py.File(p, "w") as f:
        f.attrs["schema"] = "latentq-results/1"


def _empty_groups(p):
    with h5py.File(p, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        f.create_group("latent_error")
        f.create_group("summary")


@pytest.mark.parametrize(
    "kind,expect",
    [
        ("missing", "no such file"),
        ("empty", "empty file"),
        ("text", "not an HDF5 file"),
        ("no_schema", "no root attribute 'schema'"),
        ("wrong_schema", 'schema = "latentq-dump/1"'),
        ("no_groups", "no result tables"),
        ("empty_groups", "no result tables"),
    ],
)
def test_bad_input(tmp_path, kind, expect):
    p = tmp_path / "res.h5"
    if kind == "empty":
        p.write_bytes(b"")
    elif kind == "text":
        p.write_text("layer,rel_fro\n0,0.1\n")
    elif kind == "no_schema":
        _no_schema(p)
    elif kind == "wrong_schema":
        make_results(p, groups=("latent_error",), schema="latentq-dump/1")
    elif kind == "no_groups":
        _no_groups(p)
    elif kind == "empty_groups":
        _empty_groups(p)
    r = run_report(p, "--out", tmp_path / "out")
    assert r.returncode == 2, (kind, r.returncode, r.stderr)
    assert_clean_stderr(r)
    assert r.stderr.startswith(f"latentq report: error: {p}: "), r.stderr
    assert expect in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_out_is_a_file(tmp_path):
    make_results(tmp_path / "res.h5", groups=("latent_error",))
    (tmp_path / "out").write_text("x")
    r = run_report(tmp_path / "res.h5", "--out", tmp_path / "out")
    assert r.returncode == 2
    assert "not a directory" in r.stderr
    assert_clean_stderr(r)


def test_help_is_fast_and_lists_options():
    r = run_report("--help")
    assert r.returncode == 0
    assert "--quantizers" in r.stdout and "--out" in r.stdout


# ---------------------------------------------------------------------------------------------
# Pure helpers


def test_pareto_front_hand_computed():
    x = [1, 2, 3, 4, 2, 5]
    y = [5, 3, 4, 1, 3.5, float("nan")]
    # (1,5) (2,3) (4,1) are undominated; (3,4) dominated by (2,3); (2,3.5) same x, higher y; NaN ignored
    assert R.pareto_front(x, y) == [0, 1, 3]
    assert R.pareto_front([], []) == []


def test_symmetric_matrix_from_upper_triangle_and_full():
    layers, M = R.symmetric_matrix([0, 0, 1], [1, 2, 2], [0.5, 0.2, 0.7])
    assert layers == [0, 1, 2]
    np.testing.assert_array_equal(M, [[1, 0.5, 0.2], [0.5, 1, 0.7], [0.2, 0.7, 1]])
    # a full matrix with its own diagonal is kept as is; a missing pair stays NaN
    layers, M = R.symmetric_matrix([0, 1, 0, 1, 3], [0, 1, 1, 0, 3], [0.9, 0.8, 0.4, 0.45, 1.0])
    assert layers == [0, 1, 3]
    assert M[0, 0] == 0.9 and M[1, 1] == 0.8 and M[0, 1] == 0.4 and M[1, 0] == 0.45
    assert math.isnan(M[0, 2]) and math.isnan(M[2, 1]) and M[2, 2] == 1.0


def test_parse_spec_and_short_label(tmp_path):
    # the fields come from the /latent_error columns of the results file, not from the spec strings
    path = tmp_path / "r.h5"
    make_results(path)
    R.load_results(str(path))
    assert R.parse_spec("flashmla-v32-fp8")["kind"] == "fp8" and R.is_baseline("flashmla-v32-fp8")
    assert not R.is_baseline("int4-asym-channel-g32")
    assert R.parse_spec("q4_0")["kind"] == "other"  # not in these results
    assert R.parse_spec("int4-asym-channel-g32") == dict(
        kind="int",
        bits=4,
        scheme="asym",
        granularity="channel",
        group_size=32,
        scale_dtype="fp16",
        transform="",
        spec="int4-asym-channel-g32",
    )
    assert R.parse_spec("int2-sym-token")["scale_dtype"] == "fp16"
    assert R.parse_spec("flashmla-v32-fp8")["group_size"] == 128
    assert R.parse_spec("svd-rank16")["kind"] == "svd"
    assert R.short_label("int4-asym-channel-g32") == "int4 asym ch g32"
    assert R.short_label("int8-sym-token") == "int8 sym tok all"
    assert R.short_label("int2-sym-tensor") == "int2 sym tensor"
    assert R.short_label("int2-sym-tensor-fp32") == "int2-sym-tensor-fp32"  # not in these results: the name itself
    assert R.short_label("bf16") == "bf16"


def loaded(tmp_path, groups):
    """The tables of a results file of these groups (results_fixture.write_results), as load_results reads them."""
    write_results(tmp_path / "t.h5", {}, groups)
    return R.load_results(str(tmp_path / "t.h5"))[1]


def test_default_selection_and_missing_columns(tmp_path):
    cols = {
        "quantizer": np.array(["int4-sym-channel", "int4-asym-channel-g32", "int4-sym-token", "bf16"]),
        "mean_rel_fro_c_kv": np.array([0.2, 0.1, 0.3, 0.002]),
        "bytes_per_token_model": np.array([100.0, 110.0, 105.0, 1920.0]),
    }
    # the quantizers' spec fields come from their /latent_error rows (register_specs); here without errors
    rows = [dict(spec_fields(q), layer=0, target="c_kv", quantizer=q) for q in cols["quantizer"]]
    le = table([{"format" if k == "kind" else k: v for k, v in r.items()} for r in rows])
    Q = R.quantizer_table(loaded(tmp_path, {"latent_error": le, "summary": cols}))
    assert Q["int4-asym-channel-g32"]["err_c_kv"] == 0.1
    assert Q["bf16"]["bytes_model"] == 1920.0
    assert math.isnan(Q["bf16"]["ratio"])  # no ratio column: NaN, no crash
    warns = []
    assert R.select_quantizers(Q, None, warns.append) == ["int4-asym-channel-g32", "int4-sym-token", "bf16"]
    assert R.select_quantizers(Q, ["int4-*-channel*", "x"], warns.append) == [
        "int4-sym-channel",
        "int4-asym-channel-g32",
    ]
    assert warns == ["--quantizers: 'x' matches no quantizer of the results file"]


def test_cross_layer_matrices_read_the_recorded_columns(tmp_path):
    # /cross_layer also has pearson_channels, which must not be taken for the Pearson value
    cols = {
        "layer_a": np.array([0, 0, 1]),
        "layer_b": np.array([1, 2, 2]),
        "pearson_channels": np.array([128, 128, 128]),
        "mean_abs_pearson": np.array([0.5, 0.25, 0.75]),
        "cka": np.array([0.9, 0.8, 0.7]),
    }
    layers, mats = R.cross_layer_matrices(loaded(tmp_path, {"cross_layer": cols}))
    assert layers == [0, 1, 2]
    np.testing.assert_array_equal(mats["CKA (linear)"], [[1, 0.9, 0.8], [0.9, 1, 0.7], [0.8, 0.7, 1]])
    np.testing.assert_array_equal(mats["mean |Pearson|"], [[1, 0.5, 0.25], [0.5, 1, 0.75], [0.25, 0.75, 1]])


def test_error_vs_position_figure(tmp_path):
    """/e2e_position and /attention_position: one panel per decode-order quantizer, two rows; the curves
    are the R in {0, 32, 128} x S in {0, 4} modes and prefill-at-once; the table lists the drawn modes with
    their first and last bucket's KL; /e2e's decode rows stay out of the e2e figure's rows."""
    make_results(tmp_path / "res.h5", groups=("latent_error", "summary", "e2e", "e2e_position", "attention_position"))
    p = run_report(tmp_path / "res.h5", "--out", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    assert_clean_stderr(p)
    assert_png(tmp_path / "out" / "error_vs_position.png")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Error against position (decode order)" in md
    assert "Row 1: e2e logit KL. Row 2: attention KL (mean over layers)." in md
    assert "| `int2-asym-channel-g32` | decode-r32-s4-p0 | – | 1.00e-03 | 4.00e-02 |" in md
    assert "| `int2-asym-channel-g32` | prefill-at-once | – | 5.00e-02 | 8.00e-02 |" in md
    assert "decode-r64-s0-p0" not in md
    # the curves: bucket means weighted by tokens / queries; attention = mean over its two layers (3x)
    e = R.position_curves(R.load_results(str(tmp_path / "res.h5"))[1]["e2e_position"], "tokens")
    r, s, pf, x, y = e[("int2-asym-channel-g32", "decode-r128-s4-p0")]
    assert (r, s, pf) == (128, 4, 0) and list(x) == [32, 96, 160, 224] and list(y) == [1e-4, 2e-4, 0.01, 0.02]
    a = R.position_curves(R.load_results(str(tmp_path / "res.h5"))[1]["attention_position"], "queries")
    assert a[("int4-asym-channel-g32", "decode-r0-s0-p0")][4] == pytest.approx([0.012, 0.015, 0.018, 0.021])
    assert R._position_modes(e) == {"prefill-at-once", "decode-r0-s0-p0", "decode-r32-s4-p0", "decode-r128-s4-p0"}


def test_e2e_rows_are_the_prefill_at_once_rows():
    t = pd.DataFrame(
        {
            "quantizer": np.array(["a", "a", "b"], dtype=object),
            "cache_mode": np.array(["prefill-at-once", "decode-r0-s0-p0", "prefill-at-once"], dtype=object),
            "kl_mean": np.array([1.0, 2.0, 3.0]),
        }
    )
    rows = R.e2e_rows({"e2e": t}, {})
    assert [(r["quantizer"], r["kl"]) for r in rows] == [("a", 1.0), ("b", 3.0)]


def test_e2e_without_position_groups_says_so(tmp_path):
    make_results(tmp_path / "res.h5", groups=("latent_error", "summary", "e2e"))
    p = run_report(tmp_path / "res.h5", "--out", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    md = (tmp_path / "out" / "report.md").read_text()
    assert "/e2e_position and /attention_position not in the results file: no error-vs-position figure" in md
    assert not (tmp_path / "out" / "error_vs_position.png").exists()


# ---------------------------------------------------------------------------------------------
# Figure labels, markers and colours (the figure objects, built in-process)


def test_report_md_begins_with_the_decision(tmp_path):
    """/decision (written by the C++ study, latentq/decision.h) is report.md's first section, right after the
    title: one table row per (budget, choice), with the fraction of bf16, the measured KL and where it comes
    from, 'nothing measured fits' for an empty choice and the planner's objective for a predicted plan."""
    res = tmp_path / "r.h5"
    nan = float("nan")
    decision = {
        "budget_fraction": [0.125, 0.125, 0.125],
        "budget_bytes": [240.0, 240.0, 240.0],
        "choice": np.array(["uniform", "engine", "plan"]),
        "quantizer": np.array(["had,int4-asym-channel-g32", "-", "mixed: int4-asym-token x12"]),
        "bytes_per_token_model": [216.0, nan, 239.5],
        "kl_mean": [4.4e-3, nan, nan],
        "top1_agree": [0.97314, nan, nan],
        "delta_ppl": [0.0055, nan, nan],
        "source": np.array(["e2e", "none", "predicted"]),
        "plan_objective": [0.0123, nan, 0.00904],
        "objective": np.array(["kl", "kl", "kl"]),
    }
    make_results(res, groups=("latent_error", "summary"), extra={"decision": decision})
    out = tmp_path / "rep"
    p = run_report(res, "--out", out)
    assert p.returncode == 0, p.stderr
    md = (out / "report.md").read_text().splitlines()
    assert md[0] == "# latentq report: tiny-mla" and md[2] == "## Decision", md[:4]
    rows = [line for line in md if line.startswith("| 240 (1/8) |")]
    assert rows == [
        "| 240 (1/8) | uniform | `had,int4-asym-channel-g32` | 216 | 4.40e-03 | 0.9731 | +0.0055 | e2e |",
        "| 240 (1/8) | engine | nothing measured fits |  |  |  |  |  |",
        "| 240 (1/8) | plan | `mixed: int4-asym-token x12` | 239.5 |  |  |  | predicted (objective 0.00904) |",
    ]
    assert any("next-token KL with quantized latents (/e2e)" in line for line in md[:6])
