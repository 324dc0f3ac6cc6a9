"""The calibration of the DeepSeek-V2-Lite stand-in (docs/latents.md, "The calibrated stand-in").

Writes a `latentq synth --preset deepseek-v2-lite` dump (default 4 layers x 4 sequences x 1,024
tokens, seed 0), runs study/config/standin_calibration.toml on it with `latentq run --no-e2e`, and
prints the calibration rows (latentq's own c_kv numbers against the real V2-Lite measurements of a
public technical report, means over its 27 layers) with their ratio and the stand-in parameter each
row was fitted to ("-": not fitted, a check out of sample), then three ratios of those rows with the
value uniform quantization gives in the high-resolution limit, and the adjacent-layer mean |Pearson|
against what independent channels give.

    .venv/bin/python bench/standin_calibration.py [--build-dir build] [--work DIR] [--check]

--check exits 1 when a row is outside +-20% of its target, when asymmetric INT4 does not beat symmetric
INT4 (int4-asym-channel-g32 below int4-sym-channel-g32, as on the real model), or when the adjacent layers
are more correlated than independent channels; 2 for a usage or input error (a missing binary, a failed
command); 77 when numpy, pandas or h5py is missing (ctest: skipped).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile

# (row, target, fitted to): the real DeepSeek-V2-Lite c_kv, means over its 27 layers (the max: over them).
# "joint fit": spike_scale, spike_gain_hi and spike_offset_sigma were set together, by least squares on the
# log ratios of the four rows so marked; sink_layer_gain was fitted to the max and kept; "-": no parameter was
# fitted to the row (a check out of sample). burst_rate and burst_magnitude come from no row of this table:
# from the ratios below, for the distribution of a burst channel alone (--distribution; docs/latents.md).
TARGETS = (
    ("int8-sym-tensor rel_fro, mean over layers", 0.298, "joint fit"),
    ("int8-sym-tensor rel_fro, max over layers", 0.783, "sink_layer_gain"),
    ("int8-sym-channel-g32 rel_fro, mean over layers", 0.0109, "joint fit"),
    ("SVD rank 256 of 512, held-out rel_fro, mean over layers", 0.40, "joint fit"),
    ("int4-sym-channel-g32 rel_fro, mean over layers", 0.112, "joint fit"),
    ("int4-asym-channel-g32 rel_fro, mean over layers", 0.079, "-"),
    ("int2-asym-channel-g32 rel_fro, mean over layers", 0.496, "-"),
)
TOLERANCE = 0.20
# The quantizer of each per-channel row of TARGETS, by index.
CHANNEL_ROWS = {
    2: "int8-sym-channel-g32",
    4: "int4-sym-channel-g32",
    5: "int4-asym-channel-g32",
    6: "int2-asym-channel-g32",
}
# (ratio, numerator row, denominator row, high-resolution limit, its expression): uniform quantization with a
# step much finer than the spread of the values errs by step/sqrt(12) whatever their distribution, and the
# step is the range over the levels: symmetric 8 -> 4 bits multiplies it by 127/7, asymmetric 4 -> 2 bits by
# 15/3; symmetric over asymmetric INT4 is (15/7)*absmax/(max - min), 15/14 for a range symmetric about 0.
RATIOS = (
    ("int4-sym / int8-sym", 4, 2, 127 / 7, "127/7"),
    ("int2-asym / int4-asym", 6, 5, 15 / 3, "15/3"),
    ("int4-sym / int4-asym", 4, 5, 15 / 14, "15/14"),
)


def measured(results: str) -> tuple[list[float], float, float]:
    """The calibration values of a results file (TARGETS order: floats), the largest adjacent-layer mean
    |Pearson| (NaN with one layer), and the mean |Pearson| that independent channels give on as many
    tokens. Raises SystemExit naming the file when a row the calibration needs is missing.

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
    svd = tables["svd"]
    svd = svd[svd["rank"] == 256]["heldout_rel_fro"].to_numpy(dtype=float)
    if len(svd) == 0:
        raise SystemExit(f"standin_calibration: {results}: no /svd rows at rank 256")
    cl = tables["cross_layer"]["mean_abs_pearson"].to_numpy(dtype=float)
    T = int(svd_tokens(tables))
    rho = 0.8
    independent = math.sqrt(2 / math.pi) * math.sqrt((1 + rho * rho) / ((1 - rho * rho) * T))
    vals = [float(tensor.mean()), float(tensor.max()), 0.0, float(np.mean(svd))] + [0.0] * (len(TARGETS) - 4)
    for i, q in CHANNEL_ROWS.items():
        vals[i] = float(per_layer(q).mean())
    return vals, float(cl.max()) if len(cl) else float("nan"), independent


def svd_tokens(tables) -> int:
    """All tokens of the dump (fit + held-out split of /svd)."""
    s = tables["svd"]
    return int(s["fit_tokens"].iloc[0] + s["heldout_tokens"].iloc[0])


def distribution(rate: float, magnitude: float, rho: float = 0.8, seqs: int = 64, seq_len: int = 1024) -> None:
    """Prints the channel-g32 rows and their RATIOS for one channel's distribution alone (no generator, no
    mixture): z AR(1) over the tokens (coefficient rho, N(0, 1) stationary, as the stand-in's bulk) plus,
    with probability `rate` per token, a burst of +-`magnitude` (random sign); for rate 0 (the Gaussian
    bulk) and a grid around (rate, magnitude). The quantizers are latentq's (latentq.quantize_dequantize
    on 64 channels of seqs x seq_len tokens, seed 0); the real model's ratios are printed for comparison."""
    import numpy as np

    import latentq

    rng = np.random.default_rng(0)
    T, C = seqs * seq_len, 64
    offsets = [i * seq_len for i in range(seqs + 1)]
    e = rng.standard_normal((T, C))
    z = np.empty_like(e)
    for s in range(seqs):
        a = s * seq_len
        z[a] = e[a]
        for t in range(a + 1, a + seq_len):
            z[t] = rho * z[t - 1] + math.sqrt(1 - rho * rho) * e[t]
    u, v = rng.random((T, C)), rng.random((T, C))
    real = [TARGETS[n][1] / TARGETS[d][1] for _, n, d, _, _ in RATIOS]
    names = [q.replace("-channel-g32", "") for q in CHANNEL_ROWS.values()]
    print(f"one channel: AR(1) rho {rho} + a burst of +-A w.p. p; channel-g32 rel_fro ({seqs} x {seq_len} tokens)")
    print(f"{'p':>7} {'A':>5} " + "".join(f"{n:>10}" for n in names) + "".join(f"{n:>22}" for n, *_ in RATIOS))
    print(
        f"{'real model':>13} "
        + "".join(f"{TARGETS[i][1]:>10.4g}" for i in CHANNEL_ROWS)
        + "".join(f"{r:>22.3g}" for r in real)
    )
    grid = [(0.0, 0.0)] + [(rate * f, magnitude * g) for f in (0.5, 1, 2) for g in (0.8, 1, 1.2)]
    for p, A in grid:
        x = (z + np.where(u < p, np.where(v < 0.5, -A, A), 0.0)).astype(np.float32)
        norm = float(np.linalg.norm(x))
        err = {
            q: float(np.linalg.norm(latentq.quantize_dequantize(x, q, "c_kv", offsets) - x)) / norm
            for q in CHANNEL_ROWS.values()
        }
        row = dict(zip(CHANNEL_ROWS, err.values()))
        ratios = [row[n] / row[d] for _, n, d, _, _ in RATIOS]
        print(
            f"{p:>7.4g} {A:>5.3g} "
            + "".join(f"{x:>10.4g}" for x in row.values())
            + "".join(f"{r:>22.3g}" for r in ratios)
        )


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
    ap.add_argument("--check", action="store_true", help="exit 1 when a check fails (see above)")
    ap.add_argument(
        "--distribution",
        metavar="RATE,MAGNITUDE",
        help="print the rows and ratios of one burst channel's distribution alone (the stand-in: 0.0625,10)",
    )
    a = ap.parse_args(argv)
    try:
        import h5py  # noqa: F401
        import numpy  # noqa: F401
        import pandas  # noqa: F401
    except ImportError as e:
        print(f"standin_calibration: skipped: {e}", file=sys.stderr)
        return 77
    if a.distribution:
        try:
            rate, magnitude = (float(x) for x in a.distribution.split(","))
        except ValueError:
            rate = magnitude = float("nan")
        if not (0 <= rate <= 1 and 0 <= magnitude < math.inf):
            print(
                f"standin_calibration: --distribution {a.distribution!r}: expected RATE,MAGNITUDE with RATE in [0, 1] "
                "and MAGNITUDE >= 0",
                file=sys.stderr,
            )
            return 2
        distribution(rate, magnitude)
        return 0

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
    print(f"{'c_kv':<58} {'target':>8} {'measured':>9} {'ratio':>6}  fitted to")
    ok = True
    for (row, target, fitted), v in zip(TARGETS, vals):
        ratio = v / target
        inside = abs(ratio - 1) <= TOLERANCE
        ok = ok and inside
        print(f"{row:<58} {target:>8.4g} {v:>#9.4g} {ratio:>6.2f}  {fitted}{'' if inside else '  outside +-20%'}")
    print(f"{'channel-g32 ratio (high-resolution limit)':<58} {'real':>8} {'measured':>9} {'ratio':>6}")
    for name, num, den, limit, expr in RATIOS:
        real, v = TARGETS[num][1] / TARGETS[den][1], vals[num] / vals[den]
        print(f"{f'{name} ({expr} = {limit:.3g})':<58} {real:>8.3g} {v:>9.3g} {v / real:>6.2f}")
    asym = vals[5] < vals[4]
    ok = ok and asym
    if not asym:
        print("int4-asym-channel-g32 does not beat int4-sym-channel-g32 (the real model: 0.079 against 0.112)")
    inside = math.isnan(pearson) or pearson <= independent  # NaN: one layer, no pair
    ok = ok and inside
    print(
        f"{'adjacent layers: largest mean |Pearson| (independent: ' + f'{independent:.4f})':<58} {'<= ind.':>8} "
        f"{pearson:>9.4f} {pearson / independent:>6.2f}{'' if inside else '  above independent'}"
    )
    return 1 if a.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
