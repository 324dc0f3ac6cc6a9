"""No Python test skips for a reason other than a missing GPU (ctest counts a skipped pytest as passed).

Every call of pytest's skip functions (``pytest.skip``, ``pytest.importorskip``, ``pytest.mark.skip``,
``pytest.mark.skipif``, unittest's ``skipTest``, by any spelling that ends in those names) and every bare
``@pytest.mark.skip`` in tests/python/*.py must carry a string that says GPU or CUDA. Pinned packages are
imported plainly, the compiled module and the CLI are required, tracked files are asserted: their absence
is a failure."""

import ast
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP_NAMES = {"skip", "skipif", "importorskip", "skipTest"}
GPU_WORD = re.compile(r"\b(gpu|cuda)\b", re.IGNORECASE)


def _name(node) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _strings(node) -> str:
    """The text of every string literal (f-strings' literal parts too) under `node`."""
    return " ".join(n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def non_gpu_skips(source: str, filename: str) -> list[str]:
    """'file:line: code' for each skip in `source` whose strings name neither GPU nor CUDA."""
    tree = ast.parse(source, filename)
    seen, bad = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in SKIP_NAMES:
            seen.add(id(node.func))
            if not GPU_WORD.search(_strings(node)):
                bad.append(f"{filename}:{node.lineno}: {ast.get_source_segment(source, node)}")
    for node in ast.walk(tree):  # a bare @pytest.mark.skip (no call, hence no reason)
        if isinstance(node, ast.Attribute) and node.attr in SKIP_NAMES and id(node) not in seen:
            if isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
                bad.append(f"{filename}:{node.lineno}: {ast.get_source_segment(source, node)}")
    return bad


def test_the_scan_flags_non_gpu_skips_and_passes_gpu_ones():
    src = (
        "import pytest\n"
        "np = pytest.importorskip('numpy')\n"
        "pytest.skip('the data file is absent', allow_module_level=True)\n"
        "need = pytest.mark.skipif(True, reason=f'no binary at {X}')\n"
        "@pytest.mark.skip\n"
        "def test_a(): pass\n"
        "gpu = pytest.mark.skipif(True, reason='no CUDA device')\n"
        "def test_b():\n"
        "    pytest.skip(f'no GPU: {why}')\n"
        "def test_c():\n"
        "    skip('data missing')\n"
    )
    bad = non_gpu_skips(src, "x.py")
    assert [b.split(":")[1] for b in bad] == ["2", "3", "4", "11", "5"], bad


def test_no_python_test_skips_except_for_a_missing_gpu():
    names = sorted(f for f in os.listdir(HERE) if f.endswith(".py"))
    assert "test_engine_formats.py" in names and "conftest.py" in names, names
    bad = []
    for f in names:
        with open(os.path.join(HERE, f), encoding="utf-8") as fh:
            bad += non_gpu_skips(fh.read(), f)
    assert not bad, "skips whose reason is not a missing GPU (a required package, file or build is an error):\n" + (
        "\n".join(bad)
    )
