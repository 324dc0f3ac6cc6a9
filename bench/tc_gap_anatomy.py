"""Where the gap to the rate-distortion bound goes, per fitted-transform cell (docs/findings.md, "Why the bound
is not reached"): for each layer of a study's results file and each quantizer given, the cell's reconstruction
(the e2e step's path: the study's fitted basis refitted from its dump, latentq.fitted_basis), its mse on the fit
split and on the held-out split against the study's own mse_bound (/latent_error bound_rel_fro: the Gaussian
bound at the cell's rate on the fit split's covariance), and how concentrated the held-out error is in a few
tokens.

    PYTHONPATH=$PWD/python:$PWD/build/python .venv/bin/python bench/tc_gap_anatomy.py RESULTS.h5 \\
        [--quantizers klt,tc2-lm klt,tc3 klt,tc4 sklt,tc3] [--target c_kv]

Columns (means over the layers; gap = 10·log10(mse / mse_bound), mse per element):
  gap all      the study's gap_db (every token; recomputed here, a check of the path)
  gap fit      the same on the fit split's tokens: what the quantizer leaves on the data it was fitted on
  gap held-out the same on the held-out tokens (what the study's rows mostly measure)
  top 1 %      the share of the held-out squared error in the 1 % of held-out tokens with the largest error
  top 10 %     the share in the 10 % with the largest error
Exit codes: 0 done; 2 a missing file, group or quantizer.
"""

from __future__ import annotations

import argparse
import math
import sys

import h5py
import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--quantizers", nargs="+", default=["klt,tc2-lm", "klt,tc3", "klt,tc4", "sklt,tc3"])
    ap.add_argument("--target", choices=("c_kv", "k_pe"), default="c_kv")
    a = ap.parse_args(argv)
    import latentq
    from latentq.fitted_basis import StudyBases, needs_basis, transform_of

    try:
        bases = StudyBases(latentq, a.results)
        with h5py.File(a.results, "r") as f:
            g = f["latent_error"]
            rows = {
                (int(l), t.decode(), q.decode()): float(b)
                for l, t, q, b in zip(g["layer"][:], g["target"][:], g["quantizer"][:], g["bound_rel_fro"][:])
            }
    except (OSError, KeyError, ValueError) as e:
        print(f"tc_gap_anatomy: {a.results}: {e}", file=sys.stderr)
        return 2
    if not bases.available:
        print(f"tc_gap_anatomy: {bases.why}", file=sys.stderr)
        return 2
    layers = sorted({l for l, t, _ in rows if t == a.target})
    print("| quantizer | layers | gap all dB | gap fit dB | gap held-out dB | top 1 % of held-out tokens | top 10 % |")
    print("|---|---|---|---|---|---|---|")
    with h5py.File(bases.path, "r") as dump:
        so = [int(v) for v in dump["seq_offsets"][:]]
        fit, held = latentq.token_split(so)
        idx = lambda ranges: np.concatenate([np.arange(b, e) for b, e in ranges])
        fi, hi = idx(fit), idx(held)
        for q in a.quantizers:
            stats = []
            for layer in layers:
                if (layer, a.target, q) not in rows:
                    print(f"tc_gap_anatomy: {q} has no {a.target} row of layer {layer} in {a.results}", file=sys.stderr)
                    return 2
                x = np.ascontiguousarray(dump[f"layers/{layer:03d}/{a.target}"][:], dtype=np.float32)
                basis = bases(layer, a.target, transform_of(q)) if needs_basis(q) else None
                e2 = ((latentq.quantize_dequantize(x, q, a.target, so, basis) - x).astype(np.float64) ** 2).sum(axis=1)
                d = x.shape[1]
                mse_bound = rows[(layer, a.target, q)] ** 2 * float((x.astype(np.float64) ** 2).sum()) / (len(x) * d)
                gap = lambda s: 10 * math.log10(s.sum() / (len(s) * d) / mse_bound)
                h = np.sort(e2[hi])[::-1]
                top = lambda frac: h[: max(1, round(len(h) * frac))].sum() / h.sum()
                stats.append((gap(e2), gap(e2[fi]), gap(e2[hi]), top(0.01), top(0.1)))
            m = np.mean(stats, axis=0)
            print(f"| {q} | {len(layers)} | {m[0]:.1f} | {m[1]:.1f} | {m[2]:.1f} | {m[3]:.0%} | {m[4]:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
