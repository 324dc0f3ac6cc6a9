"""Tests of the results file's column record as the report reads it (latentq/results.h, latentq.result_groups):
every group reads with the names, units and definitions its writer declared, and a group the report has no
figure for (a new probe's, a Python step's, /attention_check) gets a plain table in report.md. The files are
written by the results file's own writers (results_fixture)."""

import json
import re

import h5py
import numpy as np
import pytest

from latentq import report as R
from latentq.report.markdown import OTHER_MAX_ROWS
from latentq.result_groups import Column, write_groups
from test_report import assert_clean_stderr, assert_png, make_results, run_report  # the report tests' files

WIDGET_RECORD = (
    Column("layer", "int64", "", "the layer index"),
    Column("widget_ratio", "float64", "1", "how much of the widget is left, a made-up measure"),
    Column("mode", "string", "", "a made-up label"),
)


def section(md, title):
    """The body of the section '## title' of report.md."""
    return md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def legend_row(c):
    """The row of report.md's column legend for the record entry c."""
    cells = [f"`{c['name']}`", c["dtype"], c["unit"] or "–", c["definition"] or "–"]
    return "| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |"


def test_a_group_the_report_does_not_know_gets_its_table(tmp_path):
    """A new probe's group (a made-up name and columns, with its column record, through the C++ writer), a group
    of a Python step (write_groups) and /attention_check (the study's, with no figure) each get a section of
    report.md: the columns with dtype, unit and definition, then the rows; the known groups keep their figures
    and get no plain table."""
    res, out = tmp_path / "r.h5", tmp_path / "out"
    widget = {
        "layer": np.array([0, 1, 2]),
        "widget_ratio": np.array([0.5, float("nan"), 1.25e-7]),
        "mode": np.array(["a|b", "c", "d"]),
    }
    check = {"layer": np.array([0, 1]), "ref_vs_dump_rel_fro": np.array([5e-7, 6.5e-7]), "tq": np.array([6, 6])}
    make_results(
        res,
        groups=("latent_error", "summary"),
        extra={"widget_probe": (WIDGET_RECORD, widget), "attention_check": check},
    )
    step = (Column("quantizer", "string", "", "the quantizer"), Column("tokens", "int64", "", "the tokens scored"))
    write_groups(str(res), {"py_step": (step, {"tokens": np.array([7]), "quantizer": np.array(["bf16"])}, {})})
    p = run_report(res, "--out", out)
    assert p.returncode == 0, p.stderr
    assert_clean_stderr(p)
    md = (out / "report.md").read_text()
    sec = section(md, "/widget_probe")
    for c in WIDGET_RECORD:
        assert legend_row(c._asdict()) in sec, c
    assert "| `widget_ratio` | float64 | 1 | how much of the widget is left, a made-up measure |" in sec
    assert "The table (all 3 rows):" in sec
    assert "| layer | widget_ratio | mode |" in sec
    assert "| 0 | 0.5 | a\\|b |" in sec and "| 1 | – | c |" in sec and "| 2 | 1.25e-07 | d |" in sec
    # /attention_check: the study's units and definitions (its columns in the study's order), from the file
    with h5py.File(res) as f:
        rec = json.loads(f["attention_check"].attrs["columns"])
    assert [c["name"] for c in rec] == ["layer", "ref_vs_dump_rel_fro", "tq"]
    sec = section(md, "/attention_check")
    assert all(c["definition"] for c in rec)
    for c in rec:
        assert legend_row(c) in sec, c
    assert "| 0 | 5e-07 | 6 |" in sec and "| 1 | 6.5e-07 | 6 |" in sec
    sec = section(md, "/py_step")
    assert (
        "| `quantizer` | string | – | the quantizer |" in sec and "| `tokens` | int64 | – | the tokens scored |" in sec
    )
    assert "| quantizer | tokens |" in sec and "| bf16 | 7 |" in sec
    for g in ("latent_error", "summary"):
        assert f"## /{g}\n" not in md, g
    assert_png(out / "frontier_c_kv.png")


def test_a_long_unknown_group_shows_its_first_rows(tmp_path):
    res, out = tmp_path / "r.h5", tmp_path / "out"
    n = OTHER_MAX_ROWS + 7
    widget = {"layer": np.arange(n), "widget_ratio": np.arange(n) / 8.0, "mode": np.array(["m"] * n)}
    make_results(res, groups=("summary",), extra={"widget_probe": (WIDGET_RECORD, widget)})
    p = run_report(res, "--out", out)
    assert p.returncode == 0, p.stderr
    sec = section((out / "report.md").read_text(), "/widget_probe")
    assert f"The table (the first {OTHER_MAX_ROWS} of its {n} rows):" in sec
    assert f"| {OTHER_MAX_ROWS - 1} | {(OTHER_MAX_ROWS - 1) / 8:.4g} | m |" in sec
    assert f"| {OTHER_MAX_ROWS} | " not in sec


def test_load_results_gives_each_table_its_column_record(tmp_path):
    """Each DataFrame carries the record its writer stored (C++: /latent_error; Python: /e2e), the columns in the
    record's order; numbers() reads only a recorded name."""
    res = tmp_path / "r.h5"
    make_results(res, groups=("latent_error", "e2e"))
    attrs, tables, notes = R.load_results(str(res))
    with h5py.File(res) as f:
        for g in ("latent_error", "e2e"):
            rec = json.loads(f[g].attrs["columns"])
            assert tables[g].attrs["columns"] == rec, g
            assert list(tables[g].columns) == [c["name"] for c in rec] == list(f[g].keys()), g
            assert all(c["definition"] for c in rec), g
    assert R.column_record(tables["e2e"])[0]["name"] == "kl_mean"  # /e2e lists its datasets by name
    assert R.numbers(tables["latent_error"], "rel_fro") is not None
    assert R.numbers(tables["latent_error"], "rel") is None  # no substring lookup
    assert not [n for n in notes if "column record" in n]


def test_groups_without_a_column_record_read_by_their_datasets(tmp_path):
    """A file of an older latentq (the attribute columns holds the comma-separated names, or is absent): the report
    reads the datasets by name, says which groups have no record, and shows no units or definitions."""
    res, out = tmp_path / "r.h5", tmp_path / "out"
    make_results(res, groups=("latent_error", "summary"), extra={"widget_probe": (WIDGET_RECORD, {"layer": [3]})})
    with h5py.File(res, "a") as f:
        f["summary"].attrs["columns"] = ",".join(f["summary"].keys())
        del f["widget_probe"].attrs["columns"]
    p = run_report(res, "--out", out)
    assert p.returncode == 0, p.stderr
    md = (out / "report.md").read_text()
    assert "no column record (attribute 'columns': a file of an older latentq" in md
    assert "/summary, /widget_probe; their units and definitions are unknown" in md
    assert "| `layer` | int64 | – | – |" in section(md, "/widget_probe")
    assert_png(out / "frontier_model_bytes.png")  # /summary's columns, read by their names


def test_write_groups_refuses_a_column_it_does_not_declare(tmp_path):
    res = tmp_path / "r.h5"
    make_results(res, groups=("summary",))
    before = res.read_bytes()
    step = (Column("tokens", "int64", "", "the tokens scored"),)
    for values, why in (
        ({"tokns": np.array([7])}, "'tokns' is not one of its columns (tokens)"),
        ({"tokens": np.array([7.5])}, "/py_step/tokens: float64, shape (1,); the column is 1-D int64"),
    ):
        with pytest.raises(ValueError, match=re.escape(why)):
            write_groups(str(res), {"py_step": (step, values, {})})
        assert res.read_bytes() == before
