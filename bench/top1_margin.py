"""Can any code at a given rate keep attention top-1 agreement? (docs/findings.md, "The targets".)

For every dumped query row and head of a study's dump: the attention logits scale·(q_lat·c_kv + q_pe·k_pe)
over its causal keys (q_lat = W_UKᵀ·q_nope, DeepSeek-V3 inference/model.py's absorbed form; float64 here, a
reference, not the engine), and the margin between the largest and the second largest. A code that quantizes
c_kv alone moves each key's logit by scale·(q_lat·e); at the Gaussian rate-distortion bound in score space
the mean square of that move is score_bound_mse (/latent_error, the cell's rate; study/README.md), so the
margin of two keys' difference moves with standard deviation ≈ sqrt(2·score_bound_mse)·scale. Treating the
moves as Gaussian and independent per key, P(the runner-up does not overtake) = Φ(margin / (√2·σ)); its mean
over (query, head) is an upper estimate of the top-1 agreement that any code at that rate keeps (other keys
than the runner-up can overtake too). The same with the cell's measured score_mse.

    PYTHONPATH=$PWD/python:$PWD/build/python .venv/bin/python bench/top1_margin.py RESULTS.h5 \\
        [--quantizers sklt,tc2-lm lm2-channel]

Prints per quantizer: the median logit margin, σ at the bound and measured, the share of (query, head) whose
margin is below √2·σ, and the top-1 estimate at the bound and at the measured error. Exit codes: 0 done;
2 a missing file, group, dataset or quantizer.
"""

from __future__ import annotations

import argparse
import sys

import h5py
import numpy as np
import torch


def margins(dump: h5py.File, layer: int) -> np.ndarray:
    """The top-1 minus top-2 logit margin of every (query row, head) of one layer with at least two keys."""
    g = dump[f"layers/{layer:03d}"]
    so = dump["seq_offsets"][:]
    scale = float(dump.attrs["softmax_scale"])
    c, kp = g["c_kv"][:].astype(np.float64), g["k_pe"][:].astype(np.float64)
    q_lat = np.einsum("thd,hdc->thc", g["q_nope"][:].astype(np.float64), g["w_uk"][:].astype(np.float64))
    q_pe = g["q_pe"][:].astype(np.float64)
    out = []
    for i, t in enumerate(g["q_rows"][:]):
        b = so[np.searchsorted(so, t, side="right") - 1]
        if t - b < 1:
            continue
        s = scale * (q_lat[i] @ c[b : t + 1].T + q_pe[i] @ kp[b : t + 1].T)  # [H, keys]
        top = np.sort(s, axis=1)[:, -2:]
        out.append(top[:, 1] - top[:, 0])
    return np.concatenate(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--quantizers", nargs="+", default=["sklt,tc2-lm", "lm2-channel"])
    a = ap.parse_args(argv)
    try:
        with h5py.File(a.results, "r") as f:
            path = f.attrs["input_path"]
            g = f["latent_error"]
            cols = {k: g[k][:] for k in ("layer", "target", "quantizer", "score_mse", "score_bound_mse")}
        dump = h5py.File(path.decode() if isinstance(path, bytes) else path, "r")
    except (OSError, KeyError) as e:
        print(f"top1_margin: {a.results}: {e}", file=sys.stderr)
        return 2
    dec = lambda v: v.decode() if isinstance(v, bytes) else str(v)
    phi = lambda x: torch.distributions.Normal(0.0, 1.0).cdf(torch.from_numpy(x)).numpy()
    scale = float(dump.attrs["softmax_scale"])
    layers = sorted({int(v) for v in cols["layer"]})
    m = {layer: margins(dump, layer) for layer in layers}
    allm = np.concatenate(list(m.values()))
    print(
        "| quantizer | median margin (logits) | σ at the bound | σ measured | margin < √2·σ_bound "
        "| top-1 at the bound | top-1 at the measured error |"
    )
    print("|---|---|---|---|---|---|---|")
    for q in a.quantizers:
        sel = [
            i for i in range(len(cols["layer"])) if dec(cols["target"][i]) == "c_kv" and dec(cols["quantizer"][i]) == q
        ]
        if len(sel) != len(layers):
            print(f"top1_margin: {q}: no c_kv row for every layer of {a.results}", file=sys.stderr)
            return 2
        sb = {int(cols["layer"][i]): scale * np.sqrt(2 * cols["score_bound_mse"][i]) for i in sel}
        sm = {int(cols["layer"][i]): scale * np.sqrt(2 * cols["score_mse"][i]) for i in sel}
        below = np.mean(np.concatenate([m[l] < sb[l] for l in layers]))
        at_bound = np.mean(np.concatenate([phi(m[l] / sb[l]) for l in layers]))
        at_meas = np.mean(np.concatenate([phi(m[l] / sm[l]) for l in layers]))
        print(
            f"| {q} | {np.median(allm):.3f} | {np.mean(list(sb.values())) / np.sqrt(2):.3f} | "
            f"{np.mean(list(sm.values())) / np.sqrt(2):.3f} | {below:.2f} | {at_bound:.3f} | {at_meas:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
