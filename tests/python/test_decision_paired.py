"""The decision's paired comparison of the best uniform format and the runner-up at a budget (latentq/decision.h
paired_kl_difference, paired_verdict) on a real study of a synthetic dump, whose /e2e, /e2e_seq and
/e2e_bootstrap are written by the e2e step's own writers (latentq.e2e_stats.paired_groups, write_groups) from
chosen per-token KL values: the ΔKL and its interval are checked against a numpy recomputation here (the draws
of numpy.random.default_rng(0), percentiles 2.5 / 97.5) and against e2e_stats.paired_difference."""

import os
import subprocess

import h5py
import numpy as np
import pytest

from latentq.e2e import E2E_COLUMNS
from latentq.e2e_stats import (
    TokenStats,
    bootstrap_counts,
    interval_columns,
    paired_difference,
    paired_groups,
    run_metrics,
)
from latentq.result_groups import write_groups

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
CONFIG = """[input]
dump = "dump.h5"
[quantizers]
bits = [8, 4, 2]
schemes = ["asym"]
granularities = ["token"]
group_sizes = [0]
extra = ["bf16"]
[svd]
enabled = false
[cross_layer]
enabled = false
[attention]
enabled = true
"""


def lq(*args):
    p = subprocess.run([LQ, *map(str, args)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout


def stats(kl):
    """TokenStats with per-token KL `kl` [B, T] (the other values fixed: they do not enter the comparison)."""
    B, T = kl.shape
    z = np.zeros((B, T - 1))
    return TokenStats(kl, np.ones((B, T)), z + 1.0, z + 1.0, z)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A study of 4 uniform quantizers on a 2-layer tiny-mla dump (bf16 = 640 B/token), its /e2e rows chosen."""
    d = tmp_path_factory.mktemp("paired")
    lq("synth", "--preset", "tiny-mla", "--layers", 2, "--seqs", 1, "--seq-len", 32, "--query-rows", 4,
       "--out", d / "dump.h5")  # fmt: skip
    (d / "s.toml").write_text(CONFIG)
    lq("run", d / "s.toml", "--out", d / "r.h5", "--threads", 1, "--no-e2e")
    return d


def write_e2e(path, runs):
    """/e2e (the rows the decision reads), /e2e_seq and /e2e_bootstrap of runs {quantizer: TokenStats}."""
    B = next(iter(runs.values())).num_seqs
    draws = bootstrap_counts(B)
    rows = [run_metrics(s) | interval_columns(s, draws) for s in runs.values()]
    cols = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    cols |= {
        "quantizer": np.array(list(runs)),
        "targets": np.array(["c_kv+k_pe"] * len(runs)),
        "cache_mode": np.array(["prefill-at-once"] * len(runs)),
    }
    keyed = {(q, ("c_kv", "k_pe"), "prefill-at-once"): s for q, s in runs.items()}
    write_groups(str(path), {"e2e": (E2E_COLUMNS, cols, {}), **paired_groups(keyed, draws)})


def decide(path, budgets):
    out = lq("decide", path, "--budgets", budgets)
    with h5py.File(path, "r") as f:
        g = f["decision"]
        t = {k: g[k][:] for k in g}
    t = {k: [x.decode() for x in v] if v.dtype.kind in "OS" else v for k, v in t.items()}
    i = t["choice"].index("uniform")
    return out, {k: v[i] for k, v in t.items()}


def numpy_paired(kl_a, kl_b):
    """kl_mean(a) − kl_mean(b) and its 95% percentile bootstrap over sequences, recomputed here: the draws of
    numpy.random.default_rng(0).integers (2000 × B), each draw's pooled token means."""
    B = kl_a.shape[0]
    idx = np.random.default_rng(0).integers(0, B, size=(2000, B))
    d = np.array([kl_a[i].mean() - kl_b[i].mean() for i in idx])  # equal windows: pooled mean = mean of rows
    lo, hi = np.percentile(d, [2.5, 97.5])
    return kl_a.mean() - kl_b.mean(), lo, hi


def test_clear_win_matches_numpy(study):
    rng = np.random.default_rng(7)
    B, T = 5, 16
    base = rng.exponential(0.01, (B, T))
    runs = {  # int4 beats int2 clearly; int8 and bf16 are above 1/4 of bf16 (160 B/token)
        "int8-asym-token": stats(base * 0.1),
        "int4-asym-token": stats(base),
        "int2-asym-token": stats(base * 3 + rng.exponential(0.001, (B, T))),
        "bf16": stats(base * 0.0),
    }
    write_e2e(study / "r.h5", runs)
    out, row = decide(study / "r.h5", "1/2")
    assert row["quantizer"] == "int4-asym-token" and row["runner_up"] == "int2-asym-token"
    a, b = runs["int2-asym-token"].kl, runs["int4-asym-token"].kl
    delta, lo, hi = numpy_paired(a, b)
    assert row["delta_kl"] == pytest.approx(delta, rel=1e-12)
    assert row["delta_kl_lo"] == pytest.approx(lo, rel=1e-12) and row["delta_kl_hi"] == pytest.approx(hi, rel=1e-12)
    assert (row["delta_kl"], row["delta_kl_lo"], row["delta_kl_hi"]) == pytest.approx(
        paired_difference(runs["int2-asym-token"], runs["int4-asym-token"], "kl_mean"), rel=1e-12
    )
    assert lo > 0
    verdict = f"int4-asym-token beats int2-asym-token: ΔKL = {delta:.4g} [{lo:.4g}, {hi:.4g}]"
    assert row["verdict"] == verdict
    assert row["runner_up_p999"] == pytest.approx(np.percentile(a, 99.9), rel=1e-12)
    tails = f"(p99.9 {np.percentile(b, 99.9):.4g} vs {np.percentile(a, 99.9):.4g})"
    assert f"  vs next  {verdict} {tails}" in out
    # report.md: the same verdict under the decision table (bf16: 2 layers x (128 + 32) x 2 = 640 B/token)
    lq("report", study / "r.h5", "--out", study / "rep")
    md = (study / "rep" / "report.md").read_text().splitlines()
    assert f"- 320 (1/2): {verdict} {tails}" in md, [line for line in md if "beats" in line]


def test_tie_names_the_cheaper(study):
    rng = np.random.default_rng(3)
    B, T = 6, 16
    # int2 and int4 differ by noise only: per-sequence means that cross; int4 (176 B/token) lower on the mean
    base = rng.exponential(0.01, (B, T))
    noise = rng.normal(0, 0.002, (B, T))
    runs = {
        "int8-asym-token": stats(base * 0.1),
        "int4-asym-token": stats(base),
        "int2-asym-token": stats(np.abs(base + noise) + 1e-4 * (np.arange(B) % 2 == 0)[:, None] - 2e-4),
        "bf16": stats(base * 0.0),
    }
    runs["int2-asym-token"].kl[runs["int2-asym-token"].kl < 0] = 0
    a, b = runs["int2-asym-token"].kl, runs["int4-asym-token"].kl
    delta, lo, hi = numpy_paired(a, b)
    assert delta > 0 and lo < 0 < hi, (delta, lo, hi)  # the case this test is about
    write_e2e(study / "r.h5", runs)
    _, row = decide(study / "r.h5", "1/2")
    assert row["quantizer"] == "int4-asym-token" and row["runner_up"] == "int2-asym-token"
    n = B * T
    assert row["verdict"] == (
        f"int4-asym-token and int2-asym-token are indistinguishable on {n} tokens; the cheaper is int2-asym-token "
        f"(ΔKL = {delta:.4g} [{lo:.4g}, {hi:.4g}])"
    )


def test_one_sequence_has_no_interval(study):
    base = np.random.default_rng(1).exponential(0.01, (1, 16))
    runs = {q: stats(base * s) for q, s in (("int4-asym-token", 1.0), ("int2-asym-token", 2.0), ("bf16", 0.0))}
    write_e2e(study / "r.h5", runs)
    _, row = decide(study / "r.h5", "1/2")
    assert np.isnan(row["delta_kl_lo"]) and np.isnan(row["delta_kl_hi"])
    assert row["verdict"] == (
        f"int4-asym-token vs int2-asym-token: ΔKL = {base.mean():.4g}, no interval: 1 sequence (the bootstrap over "
        "sequences needs two or more)"
    )
