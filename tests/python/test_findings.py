"""Tests of latentq.report.findings: latentq-results/1 files of chosen values (written by the study's writer with
its columns: results_fixture) whose values fix each verdict's numbers and outcome; the side-by-side table and its
transfers column; the CLI's exit codes; the report's Findings section."""

import math
import re
import subprocess
import sys
import unittest.mock

import pytest

from latentq.report import findings as F
from latentq.report.load import load_results
from results_fixture import write_results

# c_kv rel_fro and gap_db per layer (2 layers), bytes per token (whole model), attention KL (c_kv+k_pe) per
# layer. k_pe rows get rel_fro 9 and gap 0 dB: a verdict that read them would move.
CELLS = {
    # quantizer: (rel_fro [l0, l1], gap_db [l0, l1], bytes, kl [l0, l1])
    "int8-sym-tensor": ([0.2, 0.4], [60, 60], 320, [5e-4, 5e-4]),
    "int8-sym-channel-g32": ([0.01, 0.02], [21, 23], 340, [1e-5, 1e-5]),
    "int4-sym-channel-g32": ([0.10, 0.10], [60, 60], 240, [0.05, 0.05]),
    "int4-asym-channel-g32": ([0.05, 0.05], [24, 26], 240, [0.01, 0.03]),
    "int4-sym-token": ([0.204, 0.204], [60, 60], 196, [0.2, 0.2]),
    "int4-asym-token": ([0.2, 0.2], [60, 60], 200, [0.2, 0.2]),
    "had,int4-asym-token": ([0.08, 0.08], [5, 5], 200, [0.04, 0.04]),
    "klt,int4-asym-token": ([0.3, 0.3], [60, 60], 200, [0.5, 0.5]),
    "int2-asym-channel-g32": ([0.3, 0.3], [30, 40], 120, [0.4, 0.8]),
    "int2-sym-tensor": ([0.9, 0.9], [50, math.inf], 96, [2.0, 2.0]),
    "flashmla-v32-fp8": ([0.03, 0.03], [70, 70], 330, [1e-4, 1e-4]),
    "klt,tc2-lm": ([0.02, 0.02], [10, 12], 150, [1e-3, 1e-3]),
    "lm3-channel": ([0.1, 0.1], [30, 30], 200, [0.05, 0.05]),
}
# c_kv bits_per_element, score_gap_db [l0, l1] and attention top-1 with c_kv alone of the cells that set the
# score_gap and two_bits verdicts; every other cell: bits + 0.25, gap_db + 10 dB, top-1 0.
SCORE = {
    "klt,tc2-lm": (2.07, [20, 22], 0.95),
    "lm3-channel": (3.06, [40, 44], 0.5),
}
_INT = re.compile(r"^(?:(had|klt),)?int(\d)-(sym|asym)-(tensor|channel|token)(?:-g(\d+))?$")


def spec_columns(q):
    m = _INT.match(q)
    if m:
        return dict(
            format="int",
            bits=int(m[2]),
            scheme=m[3],
            granularity=m[4],
            group_size=int(m[5] or 0),
            scale_dtype="fp16",
            transform=m[1] or "none",
            stored=q.split(",")[-1],
        )
    if q in ("klt,tc2-lm", "lm3-channel"):
        fmt = "transform-coding" if q.startswith("klt,") else "lloyd-max"
        return dict(
            format=fmt, bits=int(q.split(",")[-1][2]), scheme="none", granularity="block", group_size=0,
            scale_dtype="fp16", transform=q.split(",")[0] if "," in q else "none", stored=q.split(",")[-1],
        )  # fmt: skip
    assert q == "flashmla-v32-fp8"
    return dict(
        format="fp8", bits=8, scheme="none", granularity="block", group_size=128, scale_dtype="fp32", transform="none",
        stored=q,
    )  # fmt: skip


def table(rows):
    """{column: list} of a list of dicts with the same keys."""
    return {k: [r[k] for r in rows] for k in rows[0]}


DECISION = [
    # budget fraction, uniform quantizer, uniform objective, plan objective
    (0.25, "int2-asym-channel-g32", 2.0, 0.1),
    (0.375, "int4-asym-channel-g32", 0.3, 0.15),
    (0.5, "int4-asym-channel-g32", 0.1, 0.1),
]


def groups(cells=CELLS, decision=DECISION, objective="kl", sharing_ratio=(4.0, 1.0)):
    le, at, sm = [], [], []
    for q, (rf, gap, by, kl) in cells.items():
        cols = spec_columns(q)
        bpe, sgap, top1_c = SCORE.get(q, (cols["bits"] + 0.25, [g + 10 for g in gap], 0.0))
        for layer in (0, 1):
            for t in ("c_kv", "k_pe"):
                c = t == "c_kv"
                le.append(
                    dict(layer=layer, target=t, quantizer=q, **cols, rel_fro=rf[layer] if c else 9.0,
                         gap_db=gap[layer] if c else 0.0, bits_per_element=bpe if c else 1.0,
                         score_gap_db=sgap[layer] if c else 0.0)
                )  # fmt: skip
            at.append(
                dict(layer=layer, quantizer=q, targets="c_kv+k_pe", kl_mean=kl[layer], top1_agree=0.9, out_rel_fro=0.1)
            )
            at.append(dict(layer=layer, quantizer=q, targets="c_kv", kl_mean=99.0, top1_agree=top1_c, out_rel_fro=9.0))
        sm.append(dict(quantizer=q, bytes_per_token_model=float(by)))
    svd = [
        dict(layer=0, rank=64, centered=1, heldout_rel_fro=0.02),
        dict(layer=1, rank=64, centered=1, heldout_rel_fro=0.04),
        dict(layer=0, rank=32, centered=1, heldout_rel_fro=0.5),
        dict(layer=1, rank=64, centered=0, heldout_rel_fro=0.9),
    ]
    share = [
        dict(window_start=0, window=2, rank=k, shared_heldout_rel_fro=0.1, per_layer_heldout_rel_fro=0.1 * r)
        for k, r in zip((32, 64), sharing_ratio)
    ]
    cross = [dict(layer_a=0, layer_b=1, mean_abs_pearson=0.2, cka=0.6)]
    dec = []
    for frac, uq, uo, po in decision:
        for choice, q, o in (("uniform", uq, uo), ("engine", "-", math.nan), ("plan", "mixed: x", po)):
            dec.append(
                dict(budget_fraction=frac, budget_bytes=frac * 640, choice=choice, quantizer=q,
                     bytes_per_token_model=frac * 600, kl_mean=math.nan, top1_agree=math.nan, delta_ppl=math.nan,
                     source="predicted" if choice == "plan" else "attention", plan_objective=o, objective=objective)
            )  # fmt: skip
    return dict(
        latent_error=table(le),
        attention_error=table(at),
        summary=table(sm),
        svd=table(svd),
        cross_layer_sharing=table(share),
        cross_layer=table(cross),
        decision=table(dec),
    )


def write(path, model="tiny-mla", drop=(), drop_columns=(), **kw):
    """A results file of groups(**kw) without the groups in drop and the (group, column) pairs in drop_columns,
    written by the study's writer (results_fixture); returns its path."""
    attrs = dict(
        model=model,
        input_path="/somewhere/latents/dump.h5",
        input_sha256="cd" * 32,
        kv_lora_rank=128,
        num_layers=2,
        git_commit="0123456789abcdef",
        created="2026-12-02T00:00:00Z",
    )
    tables = {name: cols for name, cols in groups(**kw).items() if name not in drop}
    for g, c in drop_columns:
        del tables[g][c]
    write_results(path, attrs, tables)
    return str(path)


def by_key(path):
    attrs, tables, _ = load_results(path)
    return {v.key: v for v in F.verdicts(attrs, tables)}


def test_each_verdict_has_the_hand_computed_numbers_and_outcome(tmp_path):
    v = by_key(write(tmp_path / "a.h5"))
    assert [x.key for x in F.verdicts(*load_results(write(tmp_path / "b.h5"))[:2])] == list(v)
    # per-channel: mean(0.2, 0.4) / mean(0.01, 0.02) = 0.3 / 0.015 = 20 >= 10
    assert v["per_channel"].numbers["ratio"] == pytest.approx(20.0)
    assert v["per_channel"].outcome == "decisive"
    # asym vs sym at 4 bits: channel-g32 0.10 / 0.05 = 2 (asym wins), token 0.204 / 0.2 = 1.02 (a tie)
    n = v["asym_vs_sym"].numbers
    assert n["sym/asym channel-g32"] == pytest.approx(2.0) and n["sym/asym token"] == pytest.approx(1.02)
    assert n["sym/asym attention KL channel-g32"] == pytest.approx(0.05 / 0.02)
    assert v["asym_vs_sym"].outcome == "asym"
    # int4: the lowest attention KL among plain int4 cells: int4-asym-channel-g32, mean(0.01, 0.03) = 0.02
    # (had,int4-asym-token's 0.04 is rotated; the c_kv-only rows' 99 are not read)
    assert v["int4"].numbers["kl"] == pytest.approx(0.02) and "`int4-asym-channel-g32`" in v["int4"].text
    assert v["int4"].outcome == "usable"
    assert v["int2"].numbers["kl"] == pytest.approx(0.6) and v["int2"].outcome == "collapses"
    # SVD at rank 128/2 = 64, centered rows: mean(0.02, 0.04)
    assert v["svd_half_rank"].numbers["heldout_rel_fro"] == pytest.approx(0.03)
    assert v["svd_half_rank"].outcome == "viable"
    # sharing: geometric mean of per-layer / shared = sqrt(4 * 1) = 2
    assert v["sharing"].numbers["per_layer_over_shared"] == pytest.approx(2.0)
    assert v["sharing"].numbers["pearson"] == pytest.approx(0.2) and v["sharing"].outcome == "helps"
    # rotations: had 0.08 / 0.2 = 0.4 (klt 1.5); KL 0.04 / 0.2 = 0.2; had,int4-asym-token on the bytes-KL front
    n = v["rotations"].numbers
    assert n["rel_fro_ratio"] == pytest.approx(0.4) and n["kl_ratio"] == pytest.approx(0.2)
    assert n["pairs"] == 2 and n["on_front"] == 1 and v["rotations"].outcome == "helps"
    # gap: 2 bits int2-asym-channel-g32 35 (int2-sym-tensor: 50, its inf left out), 4 bits 25 (the rotated
    # cell's 5 dB is not a format), 8 bits int8-sym-channel-g32 22 (fp8 70); min 22 >= 20
    n = v["rd_gap"].numbers
    assert (n["gap_db_2"], n["gap_db_4"], n["gap_db_8"]) == pytest.approx((35.0, 25.0, 22.0))
    assert v["rd_gap"].outcome == "far"
    # fp8 at 330 B: the integer cells at <= 330 B; the best, int8-sym-tensor (5e-4), loses to fp8's 1e-4
    # (int8-sym-channel-g32's 1e-5 is at 340 B)
    assert v["fp8"].numbers["kl_int"] == pytest.approx(5e-4) and v["fp8"].outcome == "fp8"
    # planner: 2.0 / 0.1 = 20, 0.3 / 0.15 = 2, 0.1 / 0.1 = 1
    assert [v[k].numbers["gain"] for k in ("planner_1/4", "planner_3/8", "planner_1/2")] == pytest.approx([20, 2, 1])
    assert [v[k].outcome for k in ("planner_1/4", "planner_3/8", "planner_1/2")] == ["large", "modest", "none"]
    # score gap, best cell per band of c_kv bits/elem: [2, 3) klt,tc2-lm mean(20, 22) = 21 (int2-asym-channel-g32:
    # 45, int2-sym-tensor: its inf left out, 60); [3, 4) lm3-channel 42; [4, 5) had,int4-asym-token 15 (any
    # family, a rotated one too); worst 42 >= 20: far
    n = v["score_gap"].numbers
    assert (n["score_gap_db_2"], n["score_gap_db_3"], n["score_gap_db_4"]) == pytest.approx((21.0, 42.0, 15.0))
    assert v["score_gap"].outcome == "far" and "`klt,tc2-lm`, 2.07 b/e; mse gap 11.0" in v["score_gap"].text
    # two bits: the cells at <= 2.5 b/e are the int2 ones (top-1 0 with c_kv alone) and klt,tc2-lm (0.95): holds
    n = v["two_bits"].numbers
    assert (n["top1"], n["top1_both"], n["bits_per_element"]) == pytest.approx((0.95, 0.9, 2.07))
    assert v["two_bits"].outcome == "holds" and "`klt,tc2-lm`" in v["two_bits"].text


def test_family_gaps_table(tmp_path):
    _, tables, _ = load_results(write(tmp_path / "a.h5"))
    assert F.family("int", "none") == "uniform" and F.family("int", "had") == "transformed uniform"
    assert F.family("fp8", "none") == "engine" and F.family("bf16", "none") is None
    rows = {r.split(" | ")[0].lstrip("| "): r for r in F.family_gaps(tables)[0].splitlines()[2:]}
    assert list(rows) == list(F.FAMILIES)
    assert (
        rows["uniform"] == "| uniform | `int2-asym-channel-g32` 45.0 / 35.0 | – | `int4-asym-channel-g32` 35.0 / 25.0 |"
    )
    assert rows["transformed uniform"] == "| transformed uniform | – | – | `had,int4-asym-token` 15.0 / 5.0 |"
    assert rows["transform coding"].startswith("| transform coding | `klt,tc2-lm` 21.0 / 11.0 | – | – |")
    assert rows["Lloyd-Max"] == "| Lloyd-Max | – | `lm3-channel` 42.0 / 30.0 | – |"
    assert rows["TurboQuant"] == "| TurboQuant | – | – | – |" and rows["engine"] == "| engine | – | – | – |"


def test_thresholds_flip_the_outcomes(tmp_path):
    cells = dict(CELLS)
    cells["int8-sym-tensor"] = ([0.02, 0.04], [60, 60], 320, [5e-4, 5e-4])  # ratio 2: modest
    cells["int4-asym-channel-g32"] = ([0.2, 0.2], [24, 26], 240, [1e-4, 1e-4])  # sym wins channel-g32 (0.5)
    cells["int4-asym-token"] = ([0.1, 0.1], [60, 60], 200, [0.2, 0.2])  # asym wins token (2.04): mixed
    cells["int8-sym-channel-g32"] = ([0.01, 0.02], [5, 6], 340, [1e-5, 1e-5])  # min gap 5.5: near
    SCORE_NEAR = {"klt,tc2-lm": (2.07, [2, 3], 0.8), "lm3-channel": (3.06, [1, 1], 0.5)}  # 2.5, 1, and 4 bits:
    cells["had,int4-asym-token"] = ([0.095, 0.095], [-7, -7], 200, [0.3, 0.3])  # score gap 3 (rotations: no)
    with unittest.mock.patch.dict(SCORE, SCORE_NEAR):
        v = by_key(write(tmp_path / "a.h5", cells=cells, sharing_ratio=(1.0, 1.0)))
    assert v["score_gap"].outcome == "near" and v["score_gap"].numbers["score_gap_db_4"] == pytest.approx(3.0)
    assert v["two_bits"].outcome == "fails"  # top-1 0.8 with c_kv alone
    assert v["per_channel"].outcome == "modest"
    assert v["asym_vs_sym"].outcome == "mixed"
    assert v["int4"].outcome == "lossless"  # int4-asym-channel-g32's KL 1e-4
    assert v["rotations"].outcome == "no" and v["rotations"].numbers["rel_fro_ratio"] == pytest.approx(0.95)
    assert v["rd_gap"].outcome == "near"
    assert v["sharing"].outcome == "fails"
    # a band without a cell: n/a naming it, not an outcome of the other two
    with unittest.mock.patch.dict(SCORE, {"lm3-channel": (4.06, [1, 1], 0.5)}):
        v = by_key(write(tmp_path / "b.h5", cells=cells))
    assert v["score_gap"].outcome == F.NA and "at 3–4 bits per element" in v["score_gap"].text


def test_missing_inputs_give_na_naming_them(tmp_path):
    v = by_key(write(tmp_path / "a.h5", drop=("decision", "svd", "cross_layer_sharing")))
    for k in ("planner_1/4", "svd_half_rank", "sharing"):
        assert v[k].outcome == F.NA, k
    assert "/decision" in v["planner_1/4"].text and "/svd" in v["svd_half_rank"].text
    assert v["per_channel"].outcome == "decisive"  # the others stand
    # an mse plan (no single-target attention rows) and a budget nothing fits
    v = by_key(write(tmp_path / "b.h5", objective="mse"))
    assert v["planner_1/4"].outcome == F.NA and "kl objective" in v["planner_1/4"].text
    v = by_key(write(tmp_path / "c.h5", decision=[(0.25, "-", math.nan, math.nan)]))
    assert v["planner_1/4"].outcome == F.NA and v["planner_3/8"].outcome == F.NA
    # a column the verdict reads is missing: n/a naming it, not an exception
    v = by_key(write(tmp_path / "d.h5", drop_columns=[("svd", "centered")]))
    assert v["svd_half_rank"].outcome == F.NA and "centered" in v["svd_half_rank"].text


@pytest.mark.parametrize(
    "model,kind",
    [
        ("tiny-mla", "tiny-mla"),
        ("synthetic:deepseek-v2-lite", "V2-Lite stand-in"),
        ("synthetic:deepseek-v3", "stand-in"),
        ("synthetic:tiny-mla", "synthetic"),
        ("deepseek-ai/DeepSeek-V2-Lite", "checkpoint"),
    ],
)
def test_source_kind_from_the_model_attribute(model, kind):
    k, desc = F.source({"model": model, "input_path": "/x/y/dump.h5"})
    assert k == kind and f"`{model}`" in desc and "`dump.h5`" in desc


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "latentq.report.findings", *args], capture_output=True, text=True, timeout=120
    )


def test_side_by_side_says_which_transfer(tmp_path):
    a = write(tmp_path / "tiny.h5")
    cells = dict(CELLS)
    cells["int8-sym-tensor"] = ([0.02, 0.04], [60, 60], 320, [5e-4, 5e-4])
    b = write(tmp_path / "standin.h5", model="synthetic:deepseek-v2-lite", cells=cells)
    p = run_cli(a, b, "--labels", "tiny-mla,V2-Lite stand-in", "--check")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "| verdict | tiny-mla | V2-Lite stand-in | transfers? |"
    rows = {r.split(" | ")[0].lstrip("| "): r for r in lines if r.startswith("| ") and "---" not in r}
    pc = rows[F.CLAIMS["per_channel"]]
    assert "**decisive**: 20×" in pc and "**modest**: 2×" in pc and pc.endswith("| no |")
    assert rows[F.CLAIMS["int4"]].endswith("| yes |")
    assert sum(r.endswith("| yes |") for r in rows.values()) == len(F.VERDICTS) - 1
    assert "- **V2-Lite stand-in**: the calibrated DeepSeek-V2-Lite stand-in" in p.stdout
    assert "commit 0123456789ab" in p.stdout


def test_cli_check_and_input_errors(tmp_path):
    a = write(tmp_path / "a.h5", drop=("decision",))
    p = run_cli(a, "--check")
    assert p.returncode == 1 and "planner_1/4 is n/a" in p.stderr
    assert "| tiny-mla | transfers? |" in p.stdout.splitlines()[0]  # default label: the source's kind
    assert F.transfers(["usable", F.NA]) == "–"
    p = run_cli(str(tmp_path / "missing.h5"))
    assert p.returncode == 2 and "missing.h5" in p.stderr and "Traceback" not in p.stderr
    p = run_cli(a, a, "--labels", "one")
    assert p.returncode == 2 and "1 labels for 2 files" in p.stderr


def test_report_has_a_findings_section_with_its_source(tmp_path):
    path = write(tmp_path / "a.h5", model="synthetic:deepseek-v2-lite")
    out = tmp_path / "rep"
    p = subprocess.run(
        [sys.executable, "-m", "latentq.report", path, "--out", str(out)], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    md = (out / "report.md").read_text()
    sec = md.split("## Findings", 1)[1].split("\n## ", 1)[0]
    assert "Measured on **the calibrated DeepSeek-V2-Lite stand-in" in sec
    assert f"| {F.CLAIMS['per_channel']} | decisive | 20× (0.3 / 0.015) |" in sec
    assert sec.count("\n| ") == len(F.VERDICTS) + 1  # header + one row per verdict
