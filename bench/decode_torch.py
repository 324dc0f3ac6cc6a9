"""The absorbed MLA decode step in PyTorch on the GPU: the library baseline of the fused decode kernel.

One decode step of one layer, the shapes of latentq_bench's `gpu/fused_decode/<spec>/B:/H:/L:` rows
(kv_lora_rank Dc = 512, qk_rope_head_dim Dr = 64, softmax scale 192^-1/2; DeepSeek-V3 inference/model.py's
absorbed form): a bf16 cache [B, L, Dc + Dr] (c_kv then k_pe), queries [B, H, Dc + Dr] (q_lat then q_pe), and
    scores = scale · q · cacheᵀ   [B, H, L],  p = softmax(scores),  o_lat = p · c_kv   [B, H, Dc].
Two torch implementations, each timed with CUDA events (median of --iters after --warmup):
    matmul  torch.bmm (cuBLAS) for both products, the softmax in float32 between them;
    sdpa    torch.nn.functional.scaled_dot_product_attention over one shared key head (enable_gqa), which
            picks its own backend (the flash kernels need equal q/v head dims, so the math or efficient path).
The bytes read are the cache's, B·L·(Dc + Dr)·2, and the ratio is to a device-to-device copy of as many bytes
(torch .copy_, read + written), measured in the same run, as latentq_bench's rows are.

    python3 bench/decode_torch.py [--shapes B:1/H:16/L:32768,B:64/H:128/L:32768] [--out decode_torch.json]

Prints a Markdown table (spec bf16, B, H, L, implementation, us per step, cache GB/s, vs D2D). Without CUDA it
runs --dry-run shapes on the CPU (a check of the arithmetic against a float64 reference, no timing) and exits
77; exit 2 for a bad --shapes.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

import torch
import torch.nn.functional as F

DC, DR = 512, 64
SCALE = 1.0 / math.sqrt(192.0)
SHAPE = re.compile(r"B:(\d+)/H:(\d+)/L:(\d+)")


def decode_matmul(q: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """o_lat [B, H, Dc] (float32) of q [B, H, Dc + Dr] and cache [B, L, Dc + Dr] (bf16): two cuBLAS bmm."""
    s = torch.bmm(q, cache.transpose(1, 2)).float() * SCALE  # [B, H, L]
    p = torch.softmax(s, dim=-1).to(cache.dtype)
    return torch.bmm(p, cache[:, :, :DC]).float()


def decode_sdpa(q: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """The same through scaled_dot_product_attention: one key head shared by the H query heads."""
    k = cache[:, None]  # [B, 1, L, Dc + Dr]
    v = cache[:, None, :, :DC]  # [B, 1, L, Dc]
    o = F.scaled_dot_product_attention(q[:, :, None], k, v, scale=SCALE, enable_gqa=True)  # [B, H, 1, Dc]
    return o[:, :, 0].float()


def reference(q: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """float64 o_lat of the same bf16 inputs."""
    q64, c64 = q.double(), cache.double()
    p = torch.softmax(torch.einsum("bhd,bld->bhl", q64, c64) * SCALE, dim=-1)
    return torch.einsum("bhl,bld->bhd", p, c64[:, :, :DC])


def inputs(B: int, H: int, L: int, device: str, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    cache = torch.randn(B, L, DC + DR, generator=g).to(device=device, dtype=torch.bfloat16)
    q = torch.randn(B, H, DC + DR, generator=g).to(device=device, dtype=torch.bfloat16)
    return q, cache


def timed_us(fn, warmup: int, iters: int) -> float:
    """Median microseconds of fn() over iters CUDA-event-timed calls after warmup calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2]


def measure(B: int, H: int, L: int, impls: dict, warmup: int, iters: int) -> list[dict]:
    """The rows of one shape (printed as they come): each implementation's median time, the cache's GB/s and
    their ratio to a D2D copy of the cache's bytes measured just before; its max error against float64 on the
    first sequence and two heads."""
    q, cache = inputs(B, H, L, "cuda")
    nbytes = cache.numel() * cache.element_size()
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_gbs = 2 * nbytes / timed_us(lambda: dst.copy_(src), warmup, iters) / 1e3  # read + written
    ref = reference(q[:1, :2], cache[:1]).float()
    rows = []
    for name, fn in impls.items():
        try:
            err = (fn(q[:1, :2], cache[:1]) - ref).abs().max().item()
            us = timed_us(lambda fn=fn: fn(q, cache), warmup, iters)
        except RuntimeError as e:  # a backend that refuses the shape (or memory): the row says so
            print(f"| bf16 | {B} | {H} | {L} | torch {name} | refused: {str(e).splitlines()[0][:80]} | | |")
            continue
        gbs = nbytes / us / 1e3
        rows.append(dict(B=B, H=H, L=L, impl=name, us=us, gbps=gbs, vs_d2d=gbs / copy_gbs, max_err=err))
        print(f"| bf16 | {B} | {H} | {L} | torch {name} | {us:.1f} | {gbs:.0f} | {gbs / copy_gbs:.2f} |")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="B:1/H:16/L:32768,B:1/H:128/L:32768,B:64/H:16/L:32768,B:64/H:128/L:32768")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", help="JSON of the rows")
    a = ap.parse_args(argv)
    shapes = []
    for s in a.shapes.split(","):
        m = SHAPE.fullmatch(s.strip())
        if not m or min(int(x) for x in m.groups()) < 1:
            print(f"decode_torch: --shapes {s!r}: expected B:<n>/H:<n>/L:<n>, each >= 1", file=sys.stderr)
            return 2
        shapes.append(tuple(int(x) for x in m.groups()))
    impls = {"matmul": decode_matmul, "sdpa": decode_sdpa}
    if not torch.cuda.is_available():
        for name, fn in impls.items():  # the arithmetic, on the CPU at small shapes
            q, cache = inputs(2, 3, 40, "cpu")
            err = (fn(q, cache).double() - reference(q, cache)).abs().max().item()
            print(f"decode_torch: dry run {name}: max |o_lat - float64| = {err:.2e} (B 2, H 3, L 40)")
            if not err < 5e-2:
                return 1
        print("decode_torch: no CUDA device: nothing timed")
        return 77
    rows = []
    print("| spec | B | H | L | implementation | us/step | cache GB/s | vs D2D |")
    print("|---|---|---|---|---|---|---|---|")
    for B, H, L in shapes:
        rows += measure(B, H, L, impls, a.warmup, a.iters)
        torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
