"""The layout of the Python package, read from its source (no import): no import circle among the modules of
python/latentq, and the layout limits of docs/development.md (no file over 900 lines, no function over 150)."""

import ast
import os

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python", "latentq")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 900, 150
COMPILED = {"latentq._core"}  # modules of the package built elsewhere (python/src/core.cpp): no source here


def modules() -> dict[str, str]:
    """{dotted module name: path} of every .py file under python/latentq (a package is its __init__.py)."""
    out = {}
    for d, _, files in os.walk(PKG):
        for f in sorted(files):
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), os.path.dirname(PKG))[: -len(".py")].split(os.sep)
                out[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = os.path.join(d, f)
    return out


def imports(name: str, path: str, known: set[str]) -> set[str]:
    """The package's modules that module `name` imports, at its top or inside a function: ``import a.b``,
    ``from a.b import c`` (a.b.c when that is a module, else a.b), relative forms resolved. Modules outside the
    package and the compiled ones (COMPILED) are left out. The parents a submodule import runs implicitly are not
    counted (a package's __init__ importing its own submodules is no circle)."""
    is_pkg = path.endswith("__init__.py")
    out = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_pkg else name.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known | COMPILED else base for a in node.names}
    return {m for m in out if m in known and m != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle [a, b, ..., a] of `graph`, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state and (c := visit(n)):
                return c
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_the_cycle_finder_finds_a_circle_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_the_import_graph_resolves_every_form(tmp_path):
    (tmp_path / "m.py").write_text(
        "import latentq.a\nfrom latentq import b\nfrom latentq.c import f\nfrom . import d\nfrom .e import g\n"
        "import os\ndef h():\n    from latentq.q import x\n    from latentq import _core\n"
    )
    known = {"latentq", "latentq.a", "latentq.b", "latentq.c", "latentq.d", "latentq.e", "latentq.q", "latentq.m"}
    got = imports("latentq.m", str(tmp_path / "m.py"), known)
    assert got == {"latentq.a", "latentq.b", "latentq.c", "latentq.d", "latentq.e", "latentq.q"}, got
    (tmp_path / "n.py").write_text("import latentq\nfrom latentq import no_module\n")
    assert imports("latentq.n", str(tmp_path / "n.py"), known) == {"latentq"}


def test_no_import_circle_in_the_package():
    mods = modules()
    assert {"latentq", "latentq.dump", "latentq.model", "latentq.report.markdown"} <= set(mods), sorted(mods)
    graph = {m: imports(m, p, set(mods)) for m, p in mods.items()}
    assert "latentq.model" in graph["latentq.dump"] and "latentq.model" in graph["latentq.e2e"]
    assert "latentq.dump" not in graph["latentq.e2e"], "e2e loads its model through latentq.model"
    assert find_cycle(graph) is None, f"import circle: {' -> '.join(find_cycle(graph))}"


def test_layout_limits():
    too_long = []
    for m, path in modules().items():
        src = open(path, encoding="utf-8").read()
        if src.count("\n") > MAX_FILE_LINES:
            too_long.append(f"{path}: {src.count(chr(10))} lines")
        for node in ast.walk(ast.parse(src, path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    too_long.append(f"{path}:{node.lineno}: {m}.{node.name} has {n} lines")
    assert not too_long, "\n".join(too_long)
