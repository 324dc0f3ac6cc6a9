"""What fraction of the fp32 GEMM rate the e2e step's forward passes reach (latentq.e2e).

    .venv/bin/python bench/e2e_rate.py [--build BUILD] [--model data/tiny-mla] [--seq-len 512]
        [--num-seqs 4] [--batch-runs 0] [--repeats 3] [--threads 2]

In one run, on the same machine (median of --repeats after one warm-up):
  gemm      the best of 5 calls of torch.nn.functional.linear, float32, at the model's largest linear shape,
            x [K·n·T, hidden] · Wᵀ, W [intermediate, hidden] (the MLP up/gate projection, called as the
            model calls it: most of the forward's FLOPs), 2·M·N·K FLOPs per call: the machine's GEMM rate
            at that shape (a median of torch.matmul with W [hidden, intermediate] came out below the
            forwards' own rate on a busy machine);
  forward   the model's forward on K·n sequences of T tokens (K = --batch-runs, 0 = latentq.e2e's auto
            choice; n = --num-seqs), no hooks;
  prefill   the same forward with K prefill-at-once runs injected (batch_inject of make_inject,
            int4-asym-channel-g32 on c_kv and k_pe, every layer): what latentq.e2e runs per batch;
  decode    the same with K decode-order runs (batch_decode_cache, int4-asym-channel-g32, decode-r32-s0-p0),
  and the same three at K = 1 (one run per forward, the step before --batch-runs).
FLOPs of a forward (useful work, counted once): 2 · (parameters of every nn.Linear, lm_head included)
· tokens + per MLA layer 2 · H · T(T+1)/2 · (qk_head_dim + v_head_dim) per sequence (the causal score
and value products). The injection's quantize-dequantize and the decode-order attention's extra work
are not counted: they are the e2e step's overhead, which the rate of the prefill / decode rows shows.
Prints per row: seconds, GFLOP/s and its ratio to the gemm rate. Exit 2 if the latentq module is not built.
The `latentq` package comes from the venv (scripts/setup.sh's latentq.pth) or PYTHONPATH; --build BUILD
checks that its compiled part is BUILD's (PYTHONPATH=<repo>/python:BUILD/python selects it).
"""

import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def times(fn, repeats: int) -> list[float]:
    """Seconds of `repeats` calls of fn after one warm-up call."""
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return ts


def median_time(fn, repeats: int) -> float:
    return statistics.median(times(fn, repeats))


def forward_flops(model, mla, seqs: int, T: int) -> float:
    """Useful FLOPs of one forward over `seqs` sequences of T tokens (module docstring)."""
    from latentq.capture import mla_dims

    lin = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    attn = 0.0
    for _, _, a in mla:
        d = mla_dims(a)
        qk = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
        attn += 2.0 * d["num_heads"] * (T * (T + 1) / 2) * (qk + d["v_head_dim"]) * seqs
    return 2.0 * lin * seqs * T + attn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", help="check that latentq._core is this build directory's (default: any)")
    ap.add_argument("--model", default=os.path.join(ROOT, "data", "tiny-mla"))
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--num-seqs", type=int, default=4)
    ap.add_argument("--batch-runs", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import latentq

    if latentq._core is None:
        print(f"e2e_rate.py: cannot import latentq._core; {latentq.BUILD_HINT}", file=sys.stderr)
        return 2
    have = os.path.dirname(os.path.realpath(latentq._core.__file__))
    if a.build is not None and have != os.path.realpath(os.path.join(a.build, "python", "latentq")):
        print(
            f"e2e_rate.py: latentq._core is the one in {have}, not {a.build}'s: run with "
            f"PYTHONPATH=<repo>/python:{a.build}/python",
            file=sys.stderr,
        )
        return 2
    from latentq import e2e as e2e_inject
    from latentq.capture import find_mla_layers
    from latentq.inject import DecodeOrderAttention, LatentInjector
    from latentq.model import load_model, run_model

    torch.set_num_threads(a.threads)
    model = load_model(a.model, torch.float32, False)[0]
    mla = find_mla_layers(model)
    cfg = model.config
    n, T = a.num_seqs, a.seq_len
    K = a.batch_runs or e2e_inject.auto_batch_runs(cfg, T, n)
    ids1 = torch.randint(0, cfg.vocab_size, (n, T), generator=torch.Generator().manual_seed(0))
    spec, mode = "int4-asym-channel-g32", "decode-r32-s0-p0"
    print(
        f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}; model "
        f"{a.model}; {n} x {T} tokens per run; K = {K}"
    )

    rows = []
    with torch.no_grad():
        x = torch.randn(K * n * T, cfg.hidden_size)
        w = torch.randn(cfg.intermediate_size, cfg.hidden_size)
        t = min(times(lambda: torch.nn.functional.linear(x, w), 5))
        gemm = 2.0 * x.shape[0] * w.shape[0] * w.shape[1] / t
        print(
            f"gemm linear [{x.shape[0]}, {w.shape[1]}] x [{w.shape[0]}, {w.shape[1]}]^T fp32: {t * 1e3:.1f} ms, "
            f"{gemm / 1e9:.1f} GFLOP/s"
        )
        for k in (1, K) if K > 1 else (1,):
            ids = ids1.repeat(k, 1)
            inj = e2e_inject.batch_inject([e2e_inject.make_inject(latentq, spec, ("c_kv", "k_pe"))] * k, n)
            dec = e2e_inject.batch_decode_cache(
                [e2e_inject.make_decode_cache(latentq, spec, ("c_kv", "k_pe"), None, mode)] * k, n
            )

            def with_hooks(h):
                def f():
                    with h(model):
                        run_model(model, ids)

                return f

            for name, fn in (
                ("forward", lambda: run_model(model, ids)),
                ("prefill", with_hooks(lambda m: LatentInjector(m, inj))),
                ("decode", with_hooks(lambda m: DecodeOrderAttention(m, dec))),
            ):
                t = median_time(fn, a.repeats)
                rate = forward_flops(model, mla, k * n, T) / t
                rows.append((name, k, t, rate))
                print(
                    f"{name:8s} K={k:2d}: {t:7.3f} s  ({t / k:6.3f} s per run)  {rate / 1e9:6.1f} GFLOP/s  "
                    f"= {rate / gemm:.2f} of the gemm rate",
                    flush=True,
                )
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
