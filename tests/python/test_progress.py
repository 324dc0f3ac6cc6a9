"""latentq.progress: the lines mode (a line per new count at interval 0, counts, elapsed, ETA, a last line),
the bar mode (tqdm, the step's own lines above it), off, and a bad LATENTQ_PROGRESS."""

import io

import pytest

from latentq.progress import Progress


def test_lines_mode_counts_and_eta(capsys):
    s = io.StringIO()
    with Progress(3, "e2e", "runs", stream=s, mode="lines", interval=0) as p:
        p.write("  int4-asym-token   KL 1e-3")
        p.update()
        p.update()
        p.update()
    lines = s.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == ["e2e: 1/3 runs", "e2e: 2/3 runs", "e2e: 3/3 runs"]
    assert "ETA" in lines[0] and lines[-1].endswith("(done)")
    assert capsys.readouterr().out == "  int4-asym-token   KL 1e-3\n"  # the step's own lines go to stdout


def test_lines_mode_interval_and_off():
    s = io.StringIO()
    with Progress(100, "dump", "layers", stream=s, mode="lines", interval=3600) as p:
        for _ in range(99):
            p.update()
    assert s.getvalue() == ""  # a step shorter than the interval prints nothing
    q = io.StringIO()
    with Progress(5, "e2e", "runs", stream=q, mode="off") as p:
        p.update(5)
    assert q.getvalue() == ""


def test_bar_mode_and_environment(monkeypatch):
    s = io.StringIO()
    with Progress(2, "e2e", "runs", stream=s, mode="bar") as p:
        p.update(2)
    assert "2/2" in s.getvalue() and "e2e" in s.getvalue()
    monkeypatch.setenv("LATENTQ_PROGRESS", "loud")
    with pytest.raises(ValueError, match="LATENTQ_PROGRESS='loud': expected bar, lines or off"):
        Progress(1, "e2e", "runs", stream=io.StringIO())
    monkeypatch.setenv("LATENTQ_PROGRESS", "lines")
    monkeypatch.setenv("LATENTQ_PROGRESS_INTERVAL", "0")
    s = io.StringIO()
    with Progress(1, "e2e", "runs", stream=s) as p:
        p.update()
    assert s.getvalue() == "e2e: 1/1 runs, 0 s (done)\n"
