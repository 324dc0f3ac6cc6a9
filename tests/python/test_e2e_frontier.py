"""Frontier-first e2e (latentq.e2e_frontier, python -m latentq.e2e --e2e frontier|all): which quantizers the
step runs, on a hand-built results file whose answer is worked out below; `latentq run --e2e` reaching the step
and /e2e_not_run; and on the default study (tiny-mla, the embedded config) the decision summary of the frontier
equal, line for line, to that of every run (--e2e all)."""

import math
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

import latentq
from latentq import e2e_frontier as ef

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
MODEL = os.path.join(ROOT, "data", "tiny-mla")
DUMP = os.path.join(ROOT, "data", "latents", "tiny-mla.h5")
assert os.access(LQ, os.X_OK), f"the latentq CLI is not built ({LQ}; set LATENTQ_BIN or build build/latentq)"

# The hand-built study: 1 layer, kv_lora_rank 64 + rope 16 -> bf16 = 160 B/token; budgets 1/4 (40 B) and 1/2
# (80 B); keep_best 2, within 2x. quantizer: (bytes_per_token_model, attention KL mean over the 2 layers).
STUDY = {
    "int2-asym-channel-g32": (30.0, 0.10),
    "int2-sym-token": (35.0, 0.15),
    "int2-asym-token": (30.0, 0.30),
    "int2-sym-channel": (38.0, 0.50),
    "int4-asym-channel-g32": (60.0, 0.01),
    "int4-asym-token": (70.0, 0.05),
    "int4-sym-token": (70.0, 0.07),
    "q4_0": (72.0, 0.90),  # an engine format (llama.cpp)
    "int8-sym-tensor": (100.0, 0.001),  # over every budget
    "int2-sym-tensor": (32.0, math.nan),  # no score: cannot be ranked
    "bf16": (160.0, 0.0),
}
MIX = "my-mix"  # a mixed assignment: a name that is no spec


def write_study(path, attention=True):
    """The groups e2e_frontier reads, for STUDY and MIX: /summary, /attention_error (layer 0 at half the KL,
    layer 1 at 1.5x: the mean is STUDY's) or, without attention, /latent_error's score_mse."""
    qs = list(STUDY) + [MIX]
    s = lambda xs: np.array(xs, dtype=h5py.string_dtype())
    with h5py.File(path, "w") as f:
        f.attrs.update(schema="latentq-results/1", num_layers=1, kv_lora_rank=64, qk_rope_head_dim=16)
        g = f.create_group("summary")
        g["quantizer"] = s(qs)
        g["bytes_per_token_model"] = np.array([STUDY.get(q, (50.0,))[0] for q in qs])
        g["c_kv_accounting"] = g["k_pe_accounting"] = s(["measured"] * len(qs))
        if attention:
            a = f.create_group("attention_error")
            rows = [(layer, q, STUDY.get(q, (0, 0.2))[1] * w) for q in qs for layer, w in ((0, 0.5), (1, 1.5))]
            a["layer"] = np.array([r[0] for r in rows])
            a["quantizer"] = s([r[1] for r in rows])
            a["targets"] = s(["c_kv+k_pe"] * len(rows))
            a["kl_mean"] = np.array([r[2] for r in rows])
        else:  # score_mse: c_kv 3/4 and k_pe 1/4 of STUDY's value on layer 0, twice that on layer 1 -> mean 1.5x
            le = f.create_group("latent_error")
            rows = [
                (layer, t, q, STUDY.get(q, (0, 0.2))[1] * w * m)
                for q in qs
                for layer, m in ((0, 1.0), (1, 2.0))
                for t, w in (("c_kv", 0.75), ("k_pe", 0.25))
            ]
            le["layer"] = np.array([r[0] for r in rows])
            le["target"] = s([r[1] for r in rows])
            le["quantizer"] = s([r[2] for r in rows])
            le["score_mse"] = np.array([r[3] for r in rows])
    return [(q, ("c_kv", "k_pe")) for q in qs]


@pytest.mark.parametrize("attention", [True, False])
def test_the_frontier_of_a_hand_built_study(tmp_path, attention):
    pairs = write_study(str(tmp_path / "r.h5"), attention)
    fr = ef.select(str(tmp_path / "r.h5"), latentq, pairs, [0.5, 0.25], keep_best=2, within=2.0)
    # at 1/4 (40 B): int2-asym-channel-g32 0.10, int2-sym-token 0.15 (the best 2; within 0.20: no other),
    # int2-asym-token 0.30, int2-sym-channel 0.50 left; at 1/2 (80 B): int4-asym-channel-g32 0.01,
    # int4-asym-token 0.05 (within 0.02: no other); int4-sym-token 0.07 left (it fits 1/2 first)
    assert fr.run == {
        "int2-asym-channel-g32", "int2-sym-token", "int4-asym-channel-g32", "int4-asym-token",
        "q4_0", "int2-sym-tensor", "bf16", MIX,
    }, sorted(fr.run)  # fmt: skip
    scale = 1.0 if attention else 1.5  # score_mse: (0.75 + 0.25) x the mean of 1 and 2
    got = {n.quantizer: n for n in fr.not_run}
    assert [n.quantizer for n in fr.not_run] == [
        "int2-asym-token",
        "int2-sym-channel",
        "int4-sym-token",
        "int8-sym-tensor",
    ]
    for q, best, frac in (
        ("int2-asym-token", "int2-asym-channel-g32", 0.25),
        ("int2-sym-channel", "int2-asym-channel-g32", 0.25),
        ("int4-sym-token", "int4-asym-channel-g32", 0.5),
    ):
        n = got[q]
        assert (n.reason, n.dominated_by, n.budget_fraction) == (f"dominated by {best} at the probes", best, frac)
        assert n.probe_score == pytest.approx(STUDY[q][1] * scale, rel=1e-12)
        assert n.best_score == pytest.approx(STUDY[best][1] * scale, rel=1e-12)
        assert n.bytes_per_token_model == STUDY[q][0]
    over = got["int8-sym-tensor"]
    assert (over.reason, over.dominated_by, over.bytes_per_token_model) == ("over every budget", "", 100.0)
    assert math.isnan(over.budget_fraction) and math.isnan(over.best_score)
    assert fr.metric == ("attention KL" if attention else "score_mse") and fr.budgets == [0.25, 0.5]
    lines = ef.not_run_lines(fr, len(pairs))
    assert lines[0].startswith("e2e: frontier: 8 of 12 prefill-at-once quantizers run (the best 2 by ")
    assert lines[1].split()[:3] == ["not", "run", "int2-asym-token"] and "at 1/4 of bf16" in lines[1]
    assert "over every budget (100 B/token > 1/2 of bf16)" in lines[4]
    # keep_best 3 takes int2-asym-token at 1/4 and int4-sym-token at 1/2; within 6x takes int2-sym-channel too
    fr3 = ef.select(str(tmp_path / "r.h5"), latentq, pairs, [0.25, 0.5], keep_best=3, within=6.0)
    assert [n.quantizer for n in fr3.not_run] == ["int8-sym-tensor"]


def test_decode_order_runs_leave_with_their_format(tmp_path):
    """The hand-built study's frontier (as above: int2-asym-token and int4-sym-token left out) over 2 decode-order
    quantizers x 2 modes: int2-asym-token's 2 runs leave with its format, with its reason; int4-asym-token's stay,
    in their order; /e2e_not_run gets one row per run left out, its targets and cache mode."""
    pairs = write_study(str(tmp_path / "r.h5"))
    fr = ef.select(str(tmp_path / "r.h5"), latentq, pairs, [0.25, 0.5], keep_best=2, within=2.0)
    modes = ("decode-r0-s0-p0", "decode-r32-s4-p0")
    two = (("int2-asym-token", ("c_kv", "k_pe")), ("int4-asym-token", ("c_kv",)))
    dec = [(q, tg, m) for m in modes for q, tg in two]
    fr2, kept = ef.leave_out_decode(fr, dec)
    assert kept == [("int4-asym-token", ("c_kv",), m) for m in modes]
    assert fr2.not_run == fr.not_run and fr2.decode_total == 4
    assert [(n.quantizer, n.targets, n.cache_mode, n.reason) for n in fr2.decode_not_run] == [
        ("int2-asym-token", "c_kv+k_pe", m, "dominated by int2-asym-channel-g32 at the probes") for m in modes
    ]
    assert fr2.decode_not_run[0].probe_score == pytest.approx(0.30, rel=1e-12)
    lines = ef.not_run_lines(fr2, len(pairs))
    assert lines[0].endswith("; 4 not run, with 2 of the 4 decode-order runs (theirs); listed in /e2e_not_run "
                             "(--e2e all runs every one)"), lines[0]  # fmt: skip
    want = "not run int2-asym-token in 2 decode-order runs (c_kv+k_pe): with its prefill-at-once run"
    assert lines[-1].split() == want.split(), lines[-1]
    cols, values, attrs = ef.not_run_group(fr2, "frontier")
    assert [c.name for c in cols] == list(values)
    assert list(values["quantizer"]) == [n.quantizer for n in fr.not_run] + ["int2-asym-token"] * 2
    assert list(values["cache_mode"]) == ["prefill-at-once"] * 4 + list(modes)
    assert set(values["targets"]) == {"c_kv+k_pe"}
    # no decode-order run: the first line is that of the prefill-at-once quantizers alone
    alone = ef.not_run_lines(ef.leave_out_decode(fr, [])[0], len(pairs))[0]
    assert alone.endswith("; 4 not run; listed in /e2e_not_run (--e2e all runs every one)"), alone


def test_budgets_parse_as_the_decision_reads_them(tmp_path, capsys):
    assert ef.parse_budgets("1/16,0.25, 3/8,1") == [0.0625, 0.25, 0.375, 1.0]
    for bad in ("0", "1.5", "a/b", "1/0", "", "1/4,"):
        with pytest.raises(ValueError, match="expected a fraction of the bf16 cache in"):
            ef.parse_budgets(bad)
    assert [ef.fraction_label(f) for f in (1 / 16, 3 / 8, 1.0, 0.3)] == ["1/16", "3/8", "all", "0.3"]
    # the step: exit 2 with one line naming the flag, before the results file is read
    from latentq import e2e

    assert e2e.main(["--results", str(tmp_path / "none.h5"), "--budgets", "1/8,3/2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "latentq e2e: error: --budgets 1/8,3/2: budget '3/2': expected a fraction of the bf16 cache in (0, 1], "
        "as a/b or a decimal"
    ], err


def test_the_step_imports_no_transformers_for_an_mla_model(tmp_path):
    """checkpoint_model_type on config.json files written here; and the step on tiny-mla, stopped by a missing
    results file right after it has told V4 from MLA, has not imported transformers (latentq.e2e_v4's model code
    does: 2-4 s of the default study's e2e step on 2 cores), in a fresh interpreter."""
    from latentq import e2e

    for name, text, want in (
        ("v4", '{"model_type": "deepseek_v4"}', "deepseek_v4"),
        ("v3", '{"model_type": "deepseek_v3", "x": 1}', "deepseek_v3"),
        ("list", "[1, 2]", None),
        ("bad", "{", None),
        ("number", '{"model_type": 4}', None),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(text)
        assert e2e.checkpoint_model_type(str(tmp_path / name)) == want, name
    assert e2e.checkpoint_model_type(str(tmp_path / "absent")) is None
    code = (
        "import sys; from latentq import e2e; "
        f"rc = e2e.main(['--results', {str(tmp_path / 'none.h5')!r}, '--model', {MODEL!r}]); "
        "print(rc, 'transformers' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.stdout.split() == ["2", "False"], r.stdout + r.stderr[-2000:]
    assert "none.h5" in r.stderr, r.stderr


SMALL = """[quantizers]
bits = [4, 2]
schemes = ["asym"]
granularities = ["channel", "token"]
group_sizes = [32]
extra = ["int2-sym-tensor", "bf16"]
[svd]
enabled = false
[cross_layer]
enabled = false
[attention]
targets = ["c_kv+k_pe"]
[e2e]
enabled = true
model = "{model}"
"""


def run(*args):
    r = subprocess.run([LQ, *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def decision_lines(text):
    """The decision summary of a `latentq run` / `decide` output: from its header line to the end."""
    lines = text.splitlines()
    return lines[lines.index("decision (bytes: whole model, c_kv + k_pe, metadata included, per token):") :]


def test_latentq_run_passes_e2e_and_budgets_to_the_step(tmp_path):
    """`latentq run --budgets 3/8` on the shipped tiny-mla dump: 5 formats besides bf16 fit 3/8, so the frontier
    (the best 4 by attention KL and those within 4x) leaves out the fifth, int2-sym-tensor (its attention KL is
    the worst, over 4x int4-asym-channel-g32's); --e2e all runs it. The decision at 3/8 is the same."""
    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL.format(model=MODEL))
    outs = {}
    for sel in ("frontier", "all"):
        text = run("run", str(cfg), "--input", DUMP, "--out", str(tmp_path / f"{sel}.h5"), "--threads", "2",
                   "--budgets", "3/8", "--e2e", sel)  # fmt: skip
        with h5py.File(tmp_path / f"{sel}.h5", "r") as f:
            ran = set(f["e2e/quantizer"].asstr()[:])
            left = list(f["e2e_not_run/quantizer"].asstr()[:])
            assert f["e2e_not_run"].attrs["selection"] == sel and f["e2e"].attrs["selection"] == sel
            reasons = list(f["e2e_not_run/reason"].asstr()[:])
            print(f"\n--e2e {sel}: ran {sorted(ran)}; not run {left} {reasons}")
        outs[sel] = (ran, left, text, reasons)
    (ran_f, left_f, text_f, _), (ran_a, left_a, text_a, _) = outs["frontier"], outs["all"]
    assert left_a == [] and ran_a == ran_f | set(left_f) and not ran_f & set(left_f)
    assert left_f == ["int2-sym-tensor"], left_f
    assert outs["frontier"][3] == ["dominated by int4-asym-channel-g32 at the probes"], outs["frontier"][3]
    assert "bf16" in ran_f and "e2e: frontier: " in text_f and "--e2e frontier --budgets 3/8" in text_f
    assert decision_lines(text_f) == decision_lines(text_a)


def probes_vs_e2e(path):
    """Per budget of the decision: the lowest attention KL and the lowest e2e KL among the uniform formats the
    decision considers (from /decision's quantizer and the file's /attention_error): (fraction, probe best,
    e2e best)."""
    with h5py.File(path, "r") as f:
        d = f["decision"]
        rows = [
            (fr, q)
            for fr, c, q in zip(d["budget_fraction"][:], d["choice"].asstr()[:], d["quantizer"].asstr()[:])
            if c == "uniform"
        ]
        a = f["attention_error"]
        kl: dict[str, list[float]] = {}
        for q, t, k in zip(a["quantizer"].asstr()[:], a["targets"].asstr()[:], a["kl_mean"][:]):
            if t == "c_kv+k_pe":
                kl.setdefault(q, []).append(k)
        s = f["summary"]
        nbytes = dict(zip(s["quantizer"].asstr()[:], s["bytes_per_token_model"][:]))
        bf16 = int(f.attrs["num_layers"]) * (int(f.attrs["kv_lora_rank"]) + int(f.attrs["qk_rope_head_dim"])) * 2
    out = []
    for fr, q in rows:
        fit = [x for x in kl if latentq_spec(x) and nbytes.get(x, math.inf) <= fr * bf16 * (1 + 1e-13)]
        out.append((fr, min(fit, key=lambda x: np.mean(kl[x])) if fit else "-", q))
    return out


def latentq_spec(q):
    try:
        latentq.canonical_spec(q)
        return True
    except ValueError:
        return False


def e2e_rows(path):
    """{(quantizer, targets, cache_mode): kl_mean} of a file's /e2e, and {the same: reason} of /e2e_not_run."""
    with h5py.File(path, "r") as f:
        e, n = f["e2e"], f["e2e_not_run"]
        key = lambda g: zip(g["quantizer"].asstr()[:], g["targets"].asstr()[:], g["cache_mode"].asstr()[:])
        return dict(zip(key(e), e["kl_mean"][:])), dict(zip(key(n), n["reason"].asstr()[:]))


def test_the_default_study_decides_the_same_with_the_frontier(tmp_path):
    """The default study (the embedded config on the shipped tiny-mla dump; its e2e step as `latentq run`
    starts it) with --e2e frontier and --e2e all: the same decision summary, line for line. The frontier's
    runs are those of --e2e all less those /e2e_not_run lists, its decode-order runs those of the formats it runs
    (the same KL as under --e2e all: one run per forward either way), and it leaves some decode-order runs out."""
    base = tmp_path / "base.h5"
    run("run", "--out", str(base), "--threads", "2", "--no-e2e")
    py = [sys.executable, "-m", "latentq.e2e", "--model", MODEL, "--threads", "2", "--quiet"]
    summaries, counts = {}, {}
    for sel in ("all", "frontier"):
        res = tmp_path / f"{sel}.h5"
        shutil.copyfile(base, res)
        r = subprocess.run([*py, "--results", str(res), "--e2e", sel], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        summaries[sel] = decision_lines(run("decide", str(res)))
        with h5py.File(res, "r") as f:
            counts[sel] = (len(f["e2e/quantizer"]), len(f["e2e_not_run/quantizer"]))
    print(f"\n/e2e rows, /e2e_not_run rows: --e2e all {counts['all']}, --e2e frontier {counts['frontier']}")
    print("\n".join(summaries["frontier"]))
    assert counts["all"][1] == 0 and counts["frontier"][1] > 0
    assert counts["all"][0] - counts["frontier"][0] == counts["frontier"][1]
    assert summaries["frontier"] == summaries["all"]
    (ran_a, left_a), (ran_f, left_f) = e2e_rows(tmp_path / "all.h5"), e2e_rows(tmp_path / "frontier.h5")
    assert not left_a and set(ran_a) == set(ran_f) | set(left_f) and not set(ran_f) & set(left_f)
    pre_left = {q for q, _, m in left_f if m == "prefill-at-once"}
    dec_all = [r for r in ran_a if r[2] != "prefill-at-once"]
    dec_left = [r for r in left_f if r[2] != "prefill-at-once"]
    print(f"decode-order runs: {len(dec_all)} under --e2e all, {len(dec_left)} left out by the frontier")
    assert sorted(dec_left) == sorted(r for r in dec_all if r[0] in pre_left) and dec_left, dec_left
    for r in dec_left:
        assert left_f[r] == left_f[(r[0], "c_kv+k_pe", "prefill-at-once")], (r, left_f[r])
    for r in (r for r in dec_all if r not in left_f):
        assert ran_f[r] == pytest.approx(ran_a[r], rel=1e-6), r
    differ = [(f, p, e) for f, p, e in probes_vs_e2e(tmp_path / "all.h5") if p != e]
    print(f"budgets where the probes' best uniform format is not the e2e's: {differ or 'none'}")
