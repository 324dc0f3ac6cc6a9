"""Peak host memory of the layer-streamed dump (``python -m latentq.dump --stream on``) against depth.

    .venv/bin/python bench/dump_stream_rss.py [--layers 4 16] [--work DIR] [--in-memory] [--threads 1]

For each layer count, writes a random-init DeepseekV3-architecture checkpoint of one fixed width as
DeepSeek ships V3 (latentq.random_checkpoint: 3 safetensors shards, per-expert 2-D FP8 e4m3 weights
with 128 × 128 weight_scale_inv blocks, quantization_config): hidden 1024, 8 heads, kv_lora_rank 512,
qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128, q_lora_rank 384, 16 routed experts of
moe_intermediate_size 512 (2 per token) + 1 shared, first_k_dense_replace 1 (dense intermediate
2048), vocab 4096: 30.4 M parameters per MoE layer, 122 MB in float32. Then runs the dump on it in
a child process under ``/usr/bin/time -v`` (4 sequences × 512 tokens of random bytes, 64 query
rows, float32) and reads "Maximum resident set size". ``--in-memory`` also runs ``--stream off``
(the whole dequantized model in memory) for contrast. Prints one line per run and the ratio of the
deepest to the shallowest streamed peak; exits 1 if it exceeds 1.3 (the peak must be flat in depth).

Needs GNU time at /usr/bin/time (Debian package ``time``). The checkpoints (≈ 0.5 GB at 16 layers)
go to --work (default: a temporary directory, removed after).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

WIDTH = dict(
    vocab_size=4096,
    hidden_size=1024,
    intermediate_size=2048,
    moe_intermediate_size=512,
    num_attention_heads=8,
    num_key_value_heads=8,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    q_lora_rank=384,
    n_routed_experts=16,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=4,
    topk_group=2,
    first_k_dense_replace=1,
    max_position_embeddings=1024,
)
SEQ_LEN, NUM_SEQS, Q_ROWS = 512, 4, 64


def make_checkpoint(path: str, layers: int) -> None:
    """The FP8 checkpoint of WIDTH at ``layers`` layers, in a child process (its memory is not ours)."""
    code = (
        "import sys, torch; torch.set_num_threads(1)\n"
        "from latentq.random_checkpoint import random_model, deepseek_tensors, write_checkpoint\n"
        f"m = random_model('v3', seed=1, std=0.05, num_hidden_layers={layers}, **{WIDTH!r})\n"
        "cfg = m.config; t = deepseek_tensors(m, fp8_block=(128, 128)); del m\n"
        f"write_checkpoint(t, cfg, {path!r}, shards=3, fp8_block=(128, 128))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def peak_rss_kb(argv: list[str]) -> tuple[int, float, str]:
    """(max RSS in kB from /usr/bin/time -v, wall seconds, stdout) of a child process (also for
    bench/stream_v2lite.py). Exits with a message naming the command when it fails."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-2000:] + p.stderr[-4000:])
        raise SystemExit(f"{os.path.basename(sys.argv[0])}: {' '.join(argv)} failed with exit {p.returncode}")
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    if not m:
        raise SystemExit("no 'Maximum resident set size' in the output of /usr/bin/time -v")
    return int(m.group(1)), wall, p.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--work", help="directory for the checkpoints and dumps (default: a temporary one)")
    ap.add_argument("--in-memory", action="store_true", help="also measure --stream off")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    if not os.access("/usr/bin/time", os.X_OK):
        print("dump_stream_rss: /usr/bin/time is missing (apt-get install time)", file=sys.stderr)
        return 2
    work = a.work or tempfile.mkdtemp(prefix="dump-stream-rss-")
    os.makedirs(work, exist_ok=True)
    text = os.path.join(work, "text.bin")
    with open(text, "wb") as f:
        f.write(np.random.default_rng(0).integers(0, 256, SEQ_LEN * NUM_SEQS, dtype=np.uint8).tobytes())
    streamed = {}
    try:
        for n in a.layers:
            ck = os.path.join(work, f"v3-fp8-{n}")
            if not os.path.isfile(os.path.join(ck, "model.safetensors.index.json")):
                make_checkpoint(ck, n)
            size = sum(os.path.getsize(os.path.join(ck, x)) for x in os.listdir(ck))
            for mode in ("on", "off") if a.in_memory else ("on",):
                argv = [sys.executable, "-m", "latentq.dump", "--model", ck, "--text", text]
                argv += ["--seq-len", str(SEQ_LEN), "--num-seqs", str(NUM_SEQS), "--q-rows", str(Q_ROWS)]
                argv += ["--out", os.path.join(work, f"dump-{n}-{mode}.h5"), "--force", "--threads", str(a.threads)]
                kb, wall, _ = peak_rss_kb(argv + ["--stream", mode])
                if mode == "on":
                    streamed[n] = kb
                print(
                    f"{n:3d} layers, checkpoint {size / 2**20:7.1f} MiB, --stream {mode:3s}: "
                    f"peak RSS {kb:,} kB ({kb / 1024:.0f} MiB), {wall:.1f} s",
                    flush=True,
                )
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    lo, hi = min(a.layers), max(a.layers)
    ratio = streamed[hi] / streamed[lo]
    print(f"streamed peak RSS {hi} layers / {lo} layers = {ratio:.3f} (limit 1.3)")
    return 0 if ratio <= 1.3 else 1


if __name__ == "__main__":
    sys.exit(main())
