"""The calibration of the DeepSeek-V2-Lite stand-in (docs/latents.md, "The calibrated stand-in").

Writes a `latentq synth --preset deepseek-v2-lite` dump (default 4 layers x 4 sequences x 1,024
tokens, seed 0), runs study/config/standin_calibration.toml on it with `latentq run --no-e2e`, and
prints the four calibration rows (latentq's own c_kv numbers against the real V2-Lite measurements of
a public technical report, means over its 27 layers) with their ratio, plus the adjacent-layer mean
|Pearson| against what independent channels give.

    .venv/bin/python bench/standin_calibration.py [--build-dir build] [--work DIR] [--check]

--check exits 1 when a row is outside +-20% of its target or the adjacent layers are more correlated
than independent channels; 2 for a usage or input error (a missing binary, a failed command); 77 when
numpy, pandas or h5py is missing (ctest: skipped).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile

# (row, target): the real DeepSeek-V2-Lite c_kv, means over its 27 layers (the max: over them)
TARGETS = (
    ("int8-sym-tensor rel_fro, mean over layers", 0.298),
    ("int8-sym-tensor rel_fro, max over layers", 0.783),
    ("int8-sym-channel-g32 rel_fro, mean over layers", 0.0109),
    ("SVD rank 256 of 512, held-out rel_fro, mean over layers", 0.40),
)
TOLERANCE = 0.20


def measured(results: str) -> tuple[list[float], float, float]:
    """The four calibration values of a results file (TARGETS order: floats), the largest adjacent-layer
    mean |Pearson| (NaN with one layer), and the mean |Pearson| that independent channels give on as
    many tokens. Raises SystemExit naming the file when a row the calibration needs is missing.

    The independent reference: two independent AR(1) series with coefficient rho (the stand-in's
    token correlation) have a sample Pearson of variance (1 + rho^2) / ((1 - rho^2) * T); its mean
    absolute value is sqrt(2 / pi) times the standard deviation."""
    import numpy as np

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
    if root not in sys.path:
        sys.path.insert(0, root)
    from latentq.report.load import load_results

    _, tables, _ = load_results(results)
    le = tables["latent_error"]
    le = le[le["target"] == "c_kv"]

    def per_layer(q):
        v = le[le["quantizer"] == q]["rel_fro"].to_numpy(dtype=float)
        if len(v) == 0:
            raise SystemExit(f"standin_calibration: {results}: no c_kv rows for {q}")
        return v

    tensor = per_layer("int8-sym-tensor")
    channel = per_layer("int8-sym-channel-g32")
    svd = tables["svd"]
    svd = svd[svd["rank"] == 256]["heldout_rel_fro"].to_numpy(dtype=float)
    if len(svd) == 0:
        raise SystemExit(f"standin_calibration: {results}: no /svd rows at rank 256")
    cl = tables["cross_layer"]["mean_abs_pearson"].to_numpy(dtype=float)
    T = int(svd_tokens(tables))
    rho = 0.8
    independent = math.sqrt(2 / math.pi) * math.sqrt((1 + rho * rho) / ((1 - rho * rho) * T))
    vals = [float(tensor.mean()), float(tensor.max()), float(channel.mean()), float(np.mean(svd))]
    return vals, float(cl.max()) if len(cl) else float("nan"), independent


def svd_tokens(tables) -> int:
    """All tokens of the dump (fit + held-out split of /svd)."""
    s = tables["svd"]
    return int(s["fit_tokens"].iloc[0] + s["heldout_tokens"].iloc[0])


def run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout)
        raise SystemExit(2)


def main(argv=None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(here, "..", "build"), help="where latentq is (build)")
    ap.add_argument("--work", help="directory for the dump and the results (default: a temporary one, removed)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--results", help="read this results file instead of writing a dump and running the study")
    ap.add_argument("--check", action="store_true", help="exit 1 when a row is outside +-20%% of its target")
    a = ap.parse_args(argv)
    try:
        import h5py  # noqa: F401
        import numpy  # noqa: F401
        import pandas  # noqa: F401
    except ImportError as e:
        print(f"standin_calibration: skipped: {e}", file=sys.stderr)
        return 77

    with tempfile.TemporaryDirectory(prefix="latentq-standin-") as tmp:
        results = a.results
        if results is None:
            work = a.work or tmp
            os.makedirs(work, exist_ok=True)
            lq = os.path.join(a.build_dir, "latentq")
            if not os.access(lq, os.X_OK):
                print(f"standin_calibration: {lq} is not an executable (build latentq first)", file=sys.stderr)
                return 2
            dump = os.path.join(work, "standin.h5")
            results = os.path.join(work, "standin_results.h5")
            config = os.path.join(here, "..", "study", "config", "standin_calibration.toml")
            # query rows: 8 (the study does not read the attention data; attn_out costs Tq x H x T x r)
            run(
                [
                    lq,
                    "synth",
                    "--preset",
                    "deepseek-v2-lite",
                    "--layers",
                    str(a.layers),
                    "--seqs",
                    str(a.seqs),
                    "--seq-len",
                    str(a.seq_len),
                    "--query-rows",
                    "8",
                    "--seed",
                    str(a.seed),
                    "--out",
                    dump,
                ]
            )
            run([lq, "run", config, "--input", dump, "--out", results, "--threads", str(a.threads), "--no-e2e"])
        vals, pearson, independent = measured(results)

    print(f"deepseek-v2-lite stand-in: {a.layers} layers x {a.seqs} x {a.seq_len} tokens, seed {a.seed}")
    print(f"{'c_kv':<58} {'target':>8} {'measured':>9} {'ratio':>6}")
    ok = True
    for (row, target), v in zip(TARGETS, vals):
        ratio = v / target
        inside = abs(ratio - 1) <= TOLERANCE
        ok = ok and inside
        print(f"{row:<58} {target:>8.4g} {v:>#9.4g} {ratio:>6.2f}{'' if inside else '  outside +-20%'}")
    inside = math.isnan(pearson) or pearson <= independent  # NaN: one layer, no pair
    ok = ok and inside
    print(
        f"{'adjacent layers: largest mean |Pearson| (independent: ' + f'{independent:.4f})':<58} {'<= ind.':>8} "
        f"{pearson:>9.4f} {pearson / independent:>6.2f}{'' if inside else '  above independent'}"
    )
    return 1 if a.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
