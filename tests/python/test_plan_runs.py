"""The planner's runs end to end (latentq/plan_runs.h, /plan_runs, latentq.e2e_results.planned_runs): `latentq run`
with its e2e step on the default study (the embedded config on the shipped tiny-mla dump) leaves no predicted
plan line, each plan row measured by the e2e step with its interval and its paired comparison with the best uniform
format, the run's /e2e bytes those of the plan; and on a small study run with --no-e2e, `decide` says predicted and
prints the command that measures it, which does."""

import math
import os
import shlex
import subprocess

import h5py
import numpy as np
import pandas as pd

from latentq.report.markdown import _verdict_lines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
MODEL = os.path.join(ROOT, "data", "tiny-mla")
DUMP = os.path.join(ROOT, "data", "latents", "tiny-mla.h5")
HEADER = "decision (bytes: whole model, c_kv + k_pe, metadata included, per token):"
SMALL = """[quantizers]
bits = [8, 4]
schemes = ["asym"]
granularities = ["channel", "token"]
group_sizes = [32]
extra = ["bf16"]
[svd]
enabled = false
[cross_layer]
enabled = false
[attention]
targets = ["c_kv", "k_pe", "c_kv+k_pe"]
[e2e]
enabled = true
model = "{model}"
"""


def run(*args):
    r = subprocess.run([LQ, *args], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def decision_lines(text):
    lines = text.splitlines()
    return lines[lines.index(HEADER) :]


def plan_rows(path):
    """/decision's plan rows with an assignment (quantizer not "-"), each a dict of its columns."""
    with h5py.File(path, "r") as f:
        d = f["decision"]
        cols = {k: (d[k].asstr()[:] if h5py.check_string_dtype(d[k].dtype) else d[k][:]) for k in d}
    n = len(cols["choice"])
    return [
        {k: v[i] for k, v in cols.items()}
        for i in range(n)
        if cols["choice"][i] == "plan" and cols["quantizer"][i] != "-"
    ]


def plan_run_bytes(path):
    """{run: (bytes_per_token_model of /plan_runs, its /e2e prefill-at-once bytes_per_token x num_layers)}."""
    with h5py.File(path, "r") as f:
        p = f["plan_runs"]
        planned = dict(zip(p["run"].asstr()[:], p["bytes_per_token_model"][:]))
        e = f["e2e"]
        L = int(f.attrs["num_layers"])
        ran = {
            q: b * L
            for q, m, b in zip(e["quantizer"].asstr()[:], e["cache_mode"].asstr()[:], e["bytes_per_token"][:])
            if m == "prefill-at-once"
        }
    return {r: (b, ran.get(r, math.nan)) for r, b in planned.items()}


def assert_measured(path, text):
    """Every plan row of `path` is measured end to end, with its interval and its comparison to the best uniform
    format; the runs' /e2e bytes are the plan's. Returns the plan rows."""
    lines = decision_lines(text)
    assert not [x for x in lines if "predicted" in x], "\n".join(lines)
    rows = plan_rows(path)
    runs = plan_run_bytes(path)
    print("\n" + "\n".join(lines))
    print(f"/plan_runs: {runs}")
    assert rows
    for r in rows:
        assert r["source"] == "measured-e2e", r
        assert r["kl_ci_lo"] <= r["kl_mean"] <= r["kl_ci_hi"], r
        assert np.isfinite(r["delta_kl"]) and r["delta_kl_lo"] <= r["delta_kl"] <= r["delta_kl_hi"], r
        assert "the plan (plan-" in r["verdict"], r["verdict"]
        assert any(math.isclose(r["bytes_per_token_model"], b, rel_tol=1e-12) for b, _ in runs.values()), (r, runs)
    for run_name, (planned, ran) in runs.items():
        assert math.isclose(planned, ran, rel_tol=1e-12), (run_name, planned, ran)
    assert sum(" (measured-e2e)" in x and x.lstrip().startswith("plan ") for x in lines) == len(rows)
    return rows


def test_the_default_study_runs_its_plan_end_to_end(tmp_path):
    res = tmp_path / "default.h5"
    text = run("run", "--out", str(res), "--threads", "2")
    rows = assert_measured(res, text)
    with h5py.File(res, "r") as f:
        runs = list(dict.fromkeys(f["plan_runs/run"].asstr()[:]))
    assert f"plan runs: {', '.join(runs)} (/plan_runs" in text
    assert len(rows) == len(runs)  # tiny-mla: a distinct assignment at each budget that has one
    # report.md lists each plan's verdict under the decision table, as the uniform rows'
    with h5py.File(res, "r") as f:
        d = pd.DataFrame(
            {k: (v.asstr()[:] if h5py.check_string_dtype(v.dtype) else v[:]) for k, v in f["decision"].items()}
        )
    listed = "\n".join(_verdict_lines(d))
    for r in rows:
        assert f"): {r['verdict']} (p99.9 {r['kl_p999']:.4g} vs {r['runner_up_p999']:.4g})" in listed, listed


def test_decide_without_the_e2e_step_prints_the_command_that_measures_the_plan(tmp_path):
    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL.format(model=MODEL))
    res = tmp_path / "small.h5"
    run("run", str(cfg), "--input", DUMP, "--out", str(res), "--threads", "2", "--no-e2e", "--budgets", "3/8,1/2")
    text = run("decide", str(res), "--budgets", "3/8,1/2")
    lines = decision_lines(text)
    print("\n" + "\n".join(lines))
    rows = plan_rows(res)
    assert rows and all(r["source"] == "predicted" and math.isnan(r["kl_mean"]) for r in rows), rows
    at = lines.index(next(x for x in lines if x.startswith("plan: predicted at ")))
    assert lines[at].startswith("plan: predicted at 3/8, 1/2 of bf16 (not run end to end)"), lines[at]
    command, again = lines[at + 1].strip(), lines[at + 2].strip()
    assert f" -m latentq.e2e --results {res} --model {MODEL}" in command, command
    assert again == f"latentq decide {res} --budgets 3/8,1/2", again
    r = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert_measured(res, run("decide", str(res), "--budgets", "3/8,1/2"))
