"""``python -m latentq.report RESULTS.h5 --out DIR [--quantizers SPEC ...]``: what `latentq report` runs."""

from __future__ import annotations

import argparse
import os
import sys

from latentq.progress import say
from latentq.report.load import ReportError, load_results
from latentq.report.markdown import subset_warning, write_report

PROG = "latentq report"


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Figures (PNG) and report.md from a latentq-results/1 file.",
        epilog="Exit codes: 0 done, 2 input error (nothing written), 1 internal error.",
    )
    ap.add_argument("results", metavar="RESULTS.h5", help="results file of `latentq run` (schema latentq-results/1)")
    ap.add_argument("--out", required=True, metavar="DIR", help="output directory (created; files in it are replaced)")
    ap.add_argument(
        "--quantizers",
        nargs="+",
        metavar="SPEC",
        help="quantizers of the per-layer figure: spec strings or '*' globs, e.g. 'int4-*-channel-g32' "
        "(default: the best channel and token quantizer at each bit width + bf16/fp8)",
    )
    a = ap.parse_args(argv)
    path = a.results
    try:
        # validate the input before creating anything
        loaded = load_results(path)
        if os.path.exists(a.out) and not os.path.isdir(a.out):
            say("report", "error", f"{a.out}: --out exists and is not a directory")
            return 2
        try:
            os.makedirs(a.out, exist_ok=True)
        except OSError as e:
            say("report", "error", f"{a.out}: cannot create the output directory ({e.strerror or e})")
            return 2
        files, missing, warnings = write_report(path, loaded, a.out, a.quantizers)
    except ReportError as e:
        say("report", "error", f"{path}: {e}")
        return 2
    except Exception as e:  # noqa: BLE001 - no traceback for users; LATENTQ_DEBUG=1 shows it
        if os.environ.get("LATENTQ_DEBUG"):
            raise
        say(
            "report",
            "error",
            f"{path}: internal error: {type(e).__name__}: {e} (set LATENTQ_DEBUG=1 for the traceback)",
        )
        return 1
    subset = subset_warning(loaded[0])
    if subset:
        say("report", "warning", f"{path}: {subset}")
    for w in warnings:
        say("report", "warning", w)
    for m in missing:
        print(m)
    for f in files:
        print(f"wrote {os.path.join(a.out, f)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
