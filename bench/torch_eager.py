"""latentq's Python module against torch eager fake-quantization on the same float32 [T, D] tensor.

    .venv/bin/python bench/torch_eager.py [--build BUILD] [--tokens 65536] [--dim 512] [--repeats 5]
                                          [--torch-threads 2]

For each spec, the median wall time (of --repeats runs, after one warm-up) of
  latentq: latentq.quantize_dequantize(x, spec)       (the C++ CPU reference, x float32 [T, D]), on one
           thread and on --latentq-threads (latentq.set_cpu_threads; default: torch's thread count)
  torch:   the same quantizer written as torch eager ops (min/max, fp16 scale/offset, RNE round, clamp,
           decode), per latentq's conventions (README "integer conventions"),
and the ratios torch / latentq (> 1: latentq is faster; the second at equal thread counts). Each row also
prints max|latentq − torch|: the torch formulas follow the same IEEE operations one by one, so it is 0
unless noted.
Prints the machine (CPU count, torch threads). Exit 2 if the module is not built.
The `latentq` package comes from the venv (scripts/setup.sh's latentq.pth) or PYTHONPATH; --build BUILD
checks that its compiled part is BUILD's (PYTHONPATH=<repo>/python:BUILD/python selects it).
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch


def load_latentq(build):
    """The latentq package with its compiled part (with `build`: the one in build/python/latentq)."""
    import latentq

    if latentq._core is None:
        sys.exit(f"torch_eager.py: cannot import latentq._core; {latentq.BUILD_HINT}")
    have = os.path.dirname(os.path.realpath(latentq._core.__file__))
    if build is not None and have != os.path.realpath(os.path.join(build, "python", "latentq")):
        sys.exit(
            f"torch_eager.py: latentq._core is the one in {have}, not {build}'s: run with "
            f"PYTHONPATH=<repo>/python:{build}/python"
        )
    return latentq


def _f16(t):
    """Round float32 to fp16 storage and back (RNE), as latentq stores -fp16 scales and offsets."""
    return t.to(torch.float16).to(torch.float32)


def _asym(x, bits, dim):
    """Asymmetric fake-quant with groups reduced over `dim` of x (a view)."""
    qmax = float(2**bits - 1)
    mn = x.amin(dim=dim, keepdim=True)
    mx = x.amax(dim=dim, keepdim=True)
    scale = _f16((mx - mn) / qmax)
    off = _f16(mn)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.where(scale > 0, ((x - off) / safe).clamp(0.0, qmax).round(), torch.zeros_like(x))
    return off + scale * q


def _sym(x, bits, dim):
    qmax = float(2 ** (bits - 1) - 1)
    amax = x.abs().amax(dim=dim, keepdim=True) if dim is not None else x.abs().amax()
    scale = _f16(amax / qmax)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.where(scale > 0, (x / safe).clamp(-qmax, qmax).round(), torch.zeros_like(x))
    return scale * q


def torch_fake_quant(x, spec):
    """The torch eager version of `spec` on x float32 [T, D] (one sequence)."""
    T, D = x.shape
    if spec == "int8-asym-token":
        return _asym(x, 8, 1)
    if spec == "int4-asym-token-g32":
        return _asym(x.view(T, D // 32, 32), 4, 2).view(T, D)
    if spec == "int4-asym-channel-g32":
        return _asym(x.view(T // 32, 32, D), 4, 1).view(T, D)
    if spec == "int2-asym-channel-g32":
        return _asym(x.view(T // 32, 32, D), 2, 1).view(T, D)
    if spec == "int8-sym-tensor":
        return _sym(x, 8, None)
    if spec == "fp8-e4m3-tensor":  # vLLM kv_cache_dtype=fp8 with the calibrated scale amax/448
        s = x.abs().amax() / 448.0
        return (x / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32) * s
    raise ValueError(spec)


SPECS = [
    "int8-asym-token",
    "int4-asym-token-g32",
    "int4-asym-channel-g32",
    "int2-asym-channel-g32",
    "int8-sym-tensor",
    "fp8-e4m3-tensor",
]


def median_time(fn, repeats):
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", help="check that latentq._core is this build directory's (default: any)")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument(
        "--latentq-threads",
        type=int,
        help="latentq.set_cpu_threads for the second latentq column "
        "(default: --torch-threads, so that the ratio compares equal thread counts)",
    )
    a = ap.parse_args()
    n_lq = a.latentq_threads or a.torch_threads
    if a.tokens % 32 or a.dim % 32:
        ap.error("--tokens and --dim must be multiples of 32 (the g32 groups)")
    lq = load_latentq(a.build)
    torch.set_num_threads(a.torch_threads)
    rng = np.random.default_rng(0)
    scale = np.exp(0.7 * rng.standard_normal(a.dim)).astype(np.float32)
    x_np = (rng.standard_normal((a.tokens, a.dim)).astype(np.float32) * scale).astype(np.float32)
    x_t = torch.from_numpy(x_np)
    print(
        f"x float32 [{a.tokens}, {a.dim}] ({x_np.nbytes / 1e6:.0f} MB); cpus {os.cpu_count()}, "
        f"torch {torch.__version__} threads {torch.get_num_threads()}; latentq 1 and {n_lq} threads "
        f"(latentq.set_cpu_threads); median of {a.repeats}"
    )
    print(
        f"{'spec':<24} {'latentq 1t ms':>13} {f'latentq {n_lq}t ms':>13} {'torch ms':>9} "
        f"{'torch/latentq 1t':>16} {f'torch/latentq {n_lq}t':>16} {'max|diff|':>10}"
    )
    for spec in SPECS:
        lq.set_cpu_threads(1)
        t_lq1 = median_time(lambda: lq.quantize_dequantize(x_np, spec), a.repeats)
        lq.set_cpu_threads(n_lq)
        t_lq = median_time(lambda: lq.quantize_dequantize(x_np, spec), a.repeats)
        t_th = median_time(lambda: torch_fake_quant(x_t, spec), a.repeats)
        diff = float(np.max(np.abs(lq.quantize_dequantize(x_np, spec) - torch_fake_quant(x_t, spec).numpy())))
        lq.set_cpu_threads(1)
        print(
            f"{spec:<24} {1e3 * t_lq1:>13.1f} {1e3 * t_lq:>13.1f} {1e3 * t_th:>9.1f} {t_th / t_lq1:>16.2f} "
            f"{t_th / t_lq:>16.2f} {diff:>10.3g}"
        )


if __name__ == "__main__":
    main()
