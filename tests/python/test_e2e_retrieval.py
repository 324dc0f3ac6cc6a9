"""/retrieval's pieces (latentq.e2e_retrieval): Wilson's interval against published values, the cache mode a run's
retrieval forward takes, and the per-run summary of hand-built rows.

Published values: R. G. Newcombe, "Two-sided confidence intervals for the single proportion: comparison of seven
methods", Statistics in Medicine 17 (1998) 857–872, Table II, method 3 (Wilson's score interval without continuity
correction) at 95%: 81/263 -> 0.2553–0.3662, 15/148 -> 0.0624–0.1605, 0/20 -> 0–0.1611, 1/29 -> 0.0061–0.1718.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from latentq.e2e_retrieval import RETRIEVAL_COLUMNS, SUMMARY_COLUMNS, retrieval_groups, summary_rows, wilson_interval


@pytest.mark.parametrize(
    "k, n, lo, hi",
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_wilson_matches_newcombe(k, n, lo, hi):
    got = wilson_interval(k, n)
    assert got[0] == pytest.approx(lo, abs=5e-5), (k, n, got)
    assert got[1] == pytest.approx(hi, abs=5e-5), (k, n, got)


def test_wilson_by_hand_and_edges():
    # 8 of 10 at z = 1.96 by hand: centre (0.8 + 0.19208) / 1.38416 = 0.716738, half 0.313624 / 1.38416 = 0.226582
    lo, hi = wilson_interval(8, 10, z=1.96)
    assert lo == pytest.approx(0.716738 - 0.226582, abs=1e-6)
    assert hi == pytest.approx(0.716738 + 0.226582, abs=1e-6)
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0, abs=1e-12)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


class _Modes:
    """The compiled module's decode_order parser, as the e2e step calls it (latentq.e2e_decode.mode_rsp)."""

    @staticmethod
    def decode_order(mode):
        r, s, p = (int(x[1:]) for x in mode.removeprefix("decode-").split("-"))
        return (r, s, p)


def test_retrieval_mode_takes_the_prompt_as_prefill():
    from latentq.e2e_retrieval import retrieval_mode

    assert retrieval_mode(_Modes, "prefill-at-once", 530) == "prefill-at-once"
    assert retrieval_mode(_Modes, "decode-r16-s4-p0", 530) == "decode-r16-s4-p530"
    assert retrieval_mode(_Modes, "decode-r0-s0-p64", 136) == "decode-r0-s0-p136"


def _row(q, L, depth, n, k, kr, lost, gained):
    return {
        "quantizer": q,
        "targets": "c_kv+k_pe",
        "cache_mode": "prefill-at-once",
        "scale_causal": np.int64(1),
        "context_len": np.int64(L),
        "depth": depth,
        "samples": np.int64(n),
        "successes": np.int64(k),
        "ref_successes": np.int64(kr),
        "lost": np.int64(lost),
        "gained": np.int64(gained),
        "accuracy": k / n,
        "accuracy_ci_lo": wilson_interval(k, n)[0],
        "accuracy_ci_hi": wilson_interval(k, n)[1],
        "ref_accuracy": kr / n,
    }


def test_summary_sums_a_runs_cells():
    rows = [
        _row("int4-asym-channel-g32", 128, 0.1, 2, 2, 2, 0, 0),
        _row("int4-asym-channel-g32", 128, 0.9, 2, 1, 2, 1, 0),
        _row("int4-asym-channel-g32", 256, 0.1, 2, 0, 1, 1, 0),
        _row("int2-asym-token", 128, 0.1, 2, 0, 2, 2, 0),
    ]
    s = {r["quantizer"]: r for r in summary_rows(rows)}
    a = s["int4-asym-channel-g32"]
    assert (a["samples"], a["successes"], a["ref_successes"], a["lost"], a["gained"]) == (6, 3, 5, 2, 0)
    assert a["accuracy"] == 0.5 and a["ref_accuracy"] == pytest.approx(5 / 6)
    assert (a["accuracy_ci_lo"], a["accuracy_ci_hi"]) == wilson_interval(3, 6)
    assert s["int2-asym-token"]["accuracy"] == 0.0
    groups = retrieval_groups(rows, {"needle_span": np.int64(24)})
    cols, values, attrs = groups["retrieval"]
    assert cols == RETRIEVAL_COLUMNS and len(values["quantizer"]) == 4
    # the reference's accuracy over the distinct (length, depth) cells: (2 + 2 + 1) of 6
    assert attrs["reference_accuracy"] == pytest.approx(5 / 6)
    scols, svalues, _ = groups["retrieval_summary"]
    assert scols == SUMMARY_COLUMNS and list(svalues["successes"]) == [3, 0]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--needle-cue", "24"], "--needle-span 24 / --needle-cue 24: need 1 <= cue < span"),
        (["--needle-samples", "0"], "--needle-samples 0: must be >= 1"),
        (["--needle-lengths", "128", "16"], "--needle-lengths 16: shorter than --needle-span 24"),
        (["--needle-depths", "0.5", "1.5"], "--needle-depths 1.5: expected a fraction in [0, 1]"),
    ],
)
def test_bad_retrieval_flags_exit_2_before_reading_anything(flags, message, capsys):
    from latentq.e2e_args import parse_args

    assert parse_args(["--results", "/nonexistent/r.h5", "--retrieval", *flags]) == 2
    assert capsys.readouterr().err.strip() == f"latentq e2e: error: {message}"


def test_step_writes_retrieval_and_a_rerun_without_it_removes_it(tmp_path):
    """python -m latentq.e2e --retrieval on tiny-mla (the KJV held-out text): one /retrieval row per (run, length,
    depth) in /e2e's order, the summary's counts their sums; the step rerun without --retrieval leaves no
    /retrieval behind (the decision would join a stale one to the new /e2e)."""
    import h5py

    from latentq import e2e as e2e_step
    from test_e2e_generate import _results  # the bf16 / int2-sym-token results file of the step's tests

    res = tmp_path / "r.h5"
    _results(res)
    argv = ["--results", str(res), "--seq-len", "64", "--num-seqs", "2", "--threads", "1", "--quiet"]
    argv += ["--cache-modes", "prefill-at-once", "--retrieval", "--needle-lengths", "96", "160"]
    argv += ["--needle-depths", "0.2", "0.8"]
    assert e2e_step.main(argv) == 0
    with h5py.File(res, "r") as f:
        runs = [(q, m) for q, m in zip(f["e2e"]["quantizer"].asstr()[:], f["e2e"]["cache_mode"].asstr()[:])]
        r = {c: f["retrieval"][c][()] for c in f["retrieval"]}
        s = {c: f["retrieval_summary"][c][()] for c in f["retrieval_summary"]}
        attrs = dict(f["retrieval"].attrs)
    assert len(runs) == 2 and len(r["quantizer"]) == 2 * 2 * 2, r
    got = [(q.decode(), int(L), float(d)) for q, L, d in zip(r["quantizer"], r["context_len"], r["depth"])]
    assert got == [(q, L, d) for q, _ in runs for L in (96, 160) for d in (0.2, 0.8)]
    assert np.all(r["samples"] == 1) and np.all(r["ref_successes"] == r["ref_successes"][:4].tolist() * 2)
    assert list(s["samples"]) == [4, 4] and list(s["successes"]) == [r["successes"][:4].sum(), r["successes"][4:].sum()]
    assert (attrs["needle_lengths"], attrs["needle_span"], attrs["needle_cue"]) == ("96,160", 24, 8)
    assert e2e_step.main(argv[: argv.index("--retrieval")]) == 0
    with h5py.File(res, "r") as f:
        assert "e2e" in f and "retrieval" not in f and "retrieval_summary" not in f
