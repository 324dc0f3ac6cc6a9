"""The vs_memcpy ratios of one latentq_bench run as a Markdown table (the README's performance table).

    build/bench/latentq_bench --benchmark_filter='^cpu.*/T:65536/' --benchmark_out=bench.json \
        --benchmark_out_format=json
    .venv/bin/python bench/summarize.py bench.json

One row per spec (T and D from the run): quantize and dequantize vs_memcpy for the default kernel
(`cpu`, one thread), the reference loops (`cpu-ref`) and two threads (`cpu-2t`), and quantize_into() a
reused tensor (`cpu-into`) where measured; "-" where a row was not run. With --benchmark_repetitions the
median of the repetitions is used. Also prints the run's context (CPUs, load), the cpu/memcpy row's bandwidth
and the range of the copies measured beside the rows (each ratio's own reference, bench_cpu.cpp).
"""

import json
import re
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: summarize.py BENCH.json")
    with open(sys.argv[1]) as f:
        run = json.load(f)
    ctx = run["context"]
    rows, order, memcpy, beside = {}, [], None, []
    for b in run["benchmarks"]:
        # with --benchmark_repetitions: the median of the repetitions (the other aggregates are skipped)
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        m = re.match(r"^(cpu[-\w]*)/(quantize|dequantize)/([^/]+)/T:(\d+)/D:(\d+)", b["name"])
        if b["name"].startswith("cpu/memcpy/"):
            memcpy = b["bytes_per_second"]
        if not m:
            continue
        dev, op, spec = m.group(1), m.group(2), m.group(3)
        if spec not in rows:
            rows[spec] = {}
            order.append(spec)
        rows[spec][(dev, op)] = b["vs_memcpy"]
        if b.get("memcpy_GBps"):
            beside.append(b["memcpy_GBps"])
    line = f"CPUs {ctx.get('num_cpus')} at {ctx.get('mhz_per_cpu')} MHz, load average {ctx.get('load_avg')}"
    if memcpy:
        line += f"; memcpy {memcpy / 1e9:.1f} GB/s (read + written)"
    if beside:  # each ratio's own copy, measured beside its row (bench_cpu.cpp memcpy_seconds)
        line += f"; the copies beside the rows {min(beside):.1f}-{max(beside):.1f} GB/s"
    print(line)
    cols = [
        ("cpu", "quantize"),
        ("cpu-into", "quantize"),
        ("cpu-ref", "quantize"),
        ("cpu-2t", "quantize"),
        ("cpu", "dequantize"),
        ("cpu-ref", "dequantize"),
        ("cpu-2t", "dequantize"),
    ]
    print(
        "| spec | quantize | quantize_into (reused tensor) | quantize (reference loops) | quantize (2 threads) | "
        "dequantize | dequantize (reference loops) | dequantize (2 threads) |"
    )
    print("|---" * 8 + "|")
    for spec in order:
        cells = [f"{rows[spec][c]:.2f}" if c in rows[spec] else "-" for c in cols]
        print(f"| {spec} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
