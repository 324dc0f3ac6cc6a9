#!/usr/bin/env python3
"""Assemble the seed corpora of the fuzz harnesses from the repository's tests and shipped files.

usage: fuzz/make_corpus.py BUILD_DIR

Writes BUILD_DIR/fuzz/seeds/<harness>/ (one file per seed, named by its SHA-1), replacing what was there:
  spec        spec strings: the string literals of the C++ tests that look like specs, and the specs of
              the shipped configs and thresholds
  config      the shipped configs (study/config/*.toml, tests/study/data/*study*.toml,
              tests/slurm/*.toml) and the TOML text literals of the study tests
  thresholds  results/thresholds.toml, tests/study/data/*thresholds*.toml and the [[threshold]] literals
              of the study tests
  dump        small dumps written by BUILD_DIR/fuzz/fuzz_dump_seeds (the tests' synthetic dump)
  dump_schema a few inputs for the schema writer (its empty input is already a valid dump)
Standard library only; needs fuzz_dump_seeds built (ninja -C BUILD_DIR fuzz/all).
"""

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A C++ string literal or a raw string literal; adjacent literals are joined below.
LITERAL = re.compile(r'R"([^(\s]*)\((.*?)\)\1"|"((?:[^"\\\n]|\\.)*)"', re.S)
ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'", "0": "\0", "r": "\r"}
SPEC_WORDS = ("int", "fp8", "fp4", "mxfp", "nvfp", "q4_", "q8_", "bf16", "had", "rot", "klt", "flashmla", "vllm")
SPEC_CHARS = re.compile(r"^[a-z0-9_.,+*-]{2,80}$")


def unescape(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            n = s[i + 1]
            if n == "x":
                m = re.match(r"[0-9a-fA-F]{1,2}", s[i + 2 :])
                if m:
                    out.append(chr(int(m.group(0), 16)))
                    i += 2 + len(m.group(0))
                    continue
            out.append(ESCAPES.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def cpp_literals(path: Path) -> list[str]:
    """The string literals of a C++ file, adjacent ones joined ("a" "b" -> "ab")."""
    text = path.read_text(encoding="utf-8", errors="replace")
    out, last_end = [], None
    for m in LITERAL.finditer(text):
        value = m.group(2) if m.group(2) is not None else unescape(m.group(3))
        if last_end is not None and text[last_end : m.start()].strip() == "" and out:
            out[-1] += value
        else:
            out.append(value)
        last_end = m.end()
    return out


def write_seeds(dirpath: Path, seeds) -> int:
    if dirpath.exists():
        shutil.rmtree(dirpath)
    dirpath.mkdir(parents=True)
    names = set()
    for s in seeds:
        b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
        name = hashlib.sha1(b).hexdigest()
        if name not in names:
            names.add(name)
            (dirpath / name).write_bytes(b)
    return len(names)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    build = Path(sys.argv[1]).resolve()
    seeds_dir = build / "fuzz" / "seeds"
    cpp_tests = sorted((ROOT / "tests").glob("*/*.cpp")) + sorted((ROOT / "tests").glob("*/*.h"))
    literals = [s for p in cpp_tests for s in cpp_literals(p)]

    configs = sorted((ROOT / "study" / "config").glob("*.toml"))
    configs += sorted((ROOT / "tests" / "study" / "data").glob("*study*.toml"))
    configs += sorted((ROOT / "tests" / "slurm").glob("*.toml"))
    thresholds = [ROOT / "results" / "thresholds.toml"]
    thresholds += sorted((ROOT / "tests" / "study" / "data").glob("*thresholds*.toml"))
    shipped = [p.read_text(encoding="utf-8") for p in configs + thresholds]

    # spec strings: literals that look like one, and the quoted strings of the shipped TOML files
    toml_strings = [m.group(1) for t in shipped for m in re.finditer(r'"([^"\n]*)"', t)]
    specs = [s for s in literals + toml_strings if SPEC_CHARS.match(s) and any(w in s for w in SPEC_WORDS)]
    toml_literals = [s for s in literals if "=" in s and ("[" in s or "\n" in s)]

    counts = {
        "spec": write_seeds(seeds_dir / "spec", specs),
        "config": write_seeds(
            seeds_dir / "config", shipped[: len(configs)] + [s for s in toml_literals if "threshold" not in s]
        ),
        "thresholds": write_seeds(
            seeds_dir / "thresholds", shipped[len(configs) :] + [s for s in toml_literals if "threshold" in s]
        ),
        "dump_schema": write_seeds(
            seeds_dir / "dump_schema", [b"", bytes(64), bytes(512), b"\xff" * 64, bytes(range(256))]
        ),
    }
    dump_dir = seeds_dir / "dump"
    if dump_dir.exists():
        shutil.rmtree(dump_dir)
    writer = build / "fuzz" / "fuzz_dump_seeds"
    subprocess.run([str(writer), str(dump_dir)], check=True, stdout=subprocess.DEVNULL)
    counts["dump"] = len(list(dump_dir.iterdir()))
    for name, n in counts.items():
        size = sum(p.stat().st_size for p in (seeds_dir / name).iterdir())
        print(f"{name:12s} {n:4d} seeds, {size:8d} bytes  {seeds_dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
