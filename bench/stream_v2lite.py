"""Wall time and peak RSS of the layer-streamed dump and e2e step on a DeepSeek-V2-Lite-shaped checkpoint,
and what they imply for the real DeepSeek-V2-Lite on a 24 GB CPU-only machine and DeepSeek-V3 on one H200.

    .venv/bin/python bench/stream_v2lite.py [--work DIR] [--threads 2] [--seq-len 512 --num-seqs 4]
        [--e2e-seqs 2] [--moe-intermediate 176] [--intermediate 1368] [--vocab 8192]

The checkpoint (latentq.random_checkpoint, random init, bf16, 4 safetensors shards with layers across
shards, per-expert 2-D weights as DeepSeek ships them) has V2-Lite's attention and routing shape: 27 layers,
hidden 2048, 16 heads, kv_lora_rank 512 + qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128, no
q_lora, 64 routed experts (6 per token) + 2 shared, first_k_dense_replace 1. Reduced to fit this machine's
disk and time (stated in every line it prints): the expert width moe_intermediate_size (V2-Lite: 1408),
the dense layer's intermediate_size (10944) and the vocabulary (102400). Then, each in a child process
under ``/usr/bin/time -v`` (wall clock, "Maximum resident set size"):

  dump  python -m latentq.dump --stream on (num_seqs x seq_len byte tokens, float32)
  e2e   python -m latentq.e2e --stream on on a results file naming bf16, int4-asym-channel-g32 and
        flashmla-v32-fp8 (every layer, c_kv + k_pe; e2e_seqs windows of seq_len)

The streamer's own split of the time (LayerStreamer.load_seconds: reading and converting the layers'
weights; compute_seconds: running them) comes from the dump's JSON summary and /e2e's attributes. The
estimates scale the measured parts by the same per-layer formulas (``layer_counts``) applied to the real
configurations (the public config.json of deepseek-ai/DeepSeek-V2-Lite and deepseek-ai/DeepSeek-V3):
load time by the stored bytes of the decoder layers, compute time by the matmul FLOPs per token, peak RSS
by the largest decoder layer in the compute dtype plus the embedding, head and logits; every factor is
printed. The GPU estimate takes the H200's bf16 dense peak (989 TFLOP/s, NVIDIA's datasheet) at an
assumed 20 % efficiency and the host's measured read rate for the FP8 shards; it is arithmetic, not a
measurement.

Needs GNU time at /usr/bin/time (Debian package ``time``) and ~5 GB in --work (default: a temporary
directory, removed after).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from dump_stream_rss import peak_rss_kb  # bench/ is this script's directory, first on sys.path

# deepseek-ai/DeepSeek-V2-Lite and deepseek-ai/DeepSeek-V3 config.json (the fields the formulas use)
V2_LITE = dict(
    vocab_size=102400,
    hidden_size=2048,
    intermediate_size=10944,
    moe_intermediate_size=1408,
    num_hidden_layers=27,
    num_attention_heads=16,
    kv_lora_rank=512,
    q_lora_rank=None,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    n_routed_experts=64,
    n_shared_experts=2,
    num_experts_per_tok=6,
    first_k_dense_replace=1,
)
V3 = dict(
    V2_LITE,
    vocab_size=129280,
    hidden_size=7168,
    intermediate_size=18432,
    moe_intermediate_size=2048,
    num_hidden_layers=61,
    num_attention_heads=128,
    q_lora_rank=1536,
    n_routed_experts=256,
    n_shared_experts=1,
    num_experts_per_tok=8,
    first_k_dense_replace=3,
)
H200_BF16_FLOPS = 989e12  # dense bf16 peak (NVIDIA H200 datasheet)
GPU_EFFICIENCY = 0.20  # assumed fraction of that peak for a small-batch MoE layer
QUANTIZERS = ("bf16", "int4-asym-channel-g32", "flashmla-v32-fp8")


def layer_counts(c: dict) -> dict:
    """Per decoder layer of config c: stored parameters of the largest (MoE) layer and of all layers, and
    matmul parameters touched per token (mean over layers); embedding + head parameters."""
    h, H = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v, r = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    q = H * (nope + rope) * h if not c["q_lora_rank"] else c["q_lora_rank"] * (h + H * (nope + rope))
    attn = q + (r + rope) * h + H * (nope + v) * r + h * H * v
    expert = 3 * h * c["moe_intermediate_size"]
    moe_stored = attn + (c["n_routed_experts"] + c["n_shared_experts"]) * expert + c["n_routed_experts"] * h
    moe_active = attn + (c["num_experts_per_tok"] + c["n_shared_experts"]) * expert + c["n_routed_experts"] * h
    dense = attn + 3 * h * c["intermediate_size"]
    L, k = c["num_hidden_layers"], c["first_k_dense_replace"]
    return dict(
        largest=max(moe_stored, dense),
        stored=k * dense + (L - k) * moe_stored,
        active_per_token=(k * dense + (L - k) * moe_active) / L,
        embed_head=2 * c["vocab_size"] * h,
        layers=L,
    )


def make_checkpoint(path: str, cfg: dict) -> None:
    """The bf16 checkpoint of cfg, in a child process (its memory is not ours)."""
    kw = {k: v for k, v in cfg.items() if k != "q_lora_rank"}
    kw["num_key_value_heads"] = cfg["num_attention_heads"]  # as V2-Lite's config: every head has its own k/v
    code = (
        "import torch; torch.set_num_threads(2)\n"
        "from latentq.progress import quiet_import_noise; quiet_import_noise()\n"
        "from latentq.random_checkpoint import random_model, deepseek_tensors, write_checkpoint\n"
        f"m = random_model('v2', seed=3, std=0.02, max_position_embeddings=4096, **{kw!r})\n"
        "cfg = m.config; t = deepseek_tensors(m); del m\n"
        f"write_checkpoint(t, cfg, {path!r}, shards=4)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def make_results(path: str, layers: int) -> None:
    """A results file whose /latent_error names QUANTIZERS on c_kv and k_pe of every layer."""
    import h5py

    s = h5py.string_dtype("utf-8")
    rows = [(l, q, t) for l in range(layers) for q in QUANTIZERS for t in ("c_kv", "k_pe")]
    with h5py.File(path, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        f.attrs["layers"] = ",".join(map(str, range(layers)))
        g = f.create_group("latent_error")
        g.create_dataset("layer", data=np.array([r[0] for r in rows], dtype=np.int64))
        for i, k in ((1, "quantizer"), (2, "target"), (1, "stored")):
            g.create_dataset(k, data=np.array([r[i] for r in rows], dtype=object), dtype=s)


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def estimate(name: str, meas: dict, red: dict, real: dict, tokens: int, logit_sets: int, out) -> None:
    """Print the CPU estimate of one step (dump or e2e) for the real V2-Lite, showing the arithmetic."""
    f_load = real["stored"] / red["stored"]
    f_flop = real["active_per_token"] * real["layers"] / (red["active_per_token"] * red["layers"])
    load, comp = meas["load_s"] * f_load, meas["compute_s"] * f_flop
    d_layer = 4 * (real["largest"] - red["largest"])  # float32 compute dtype
    # the embedding is freed before layer 0 runs (the dump's peak is a layer's); the e2e step loads the head
    # after the last layer, with the logits of the reference and of one batch of runs: counted on top
    # (an upper bound: the two phases do not overlap)
    d_head = 2 * (real["embed_head"] - red["embed_head"]) if name == "e2e" else 0
    d_logits = 4 * tokens * logit_sets * (V2_LITE["vocab_size"] - meas["vocab"]) if name == "e2e" else 0
    rss = meas["rss_kb"] * 1024 + d_layer + d_head + d_logits
    print(
        f"  {name}: load {meas['load_s']:.1f} s x {f_load:.2f} (stored decoder bytes) = {load:.0f} s; "
        f"compute {meas['compute_s']:.1f} s x {f_flop:.2f} (matmul FLOPs per token) = {comp:.0f} s; "
        f"wall ~ {load + comp + meas['other_s']:.0f} s (+ {meas['other_s']:.0f} s outside the layers)",
        file=out,
    )
    print(
        f"  {name}: peak RSS {gib(meas['rss_kb'] * 1024)} + largest layer {gib(d_layer)}"
        + (f" + head {gib(d_head)} + logits {gib(d_logits)}" if name == "e2e" else "")
        + f" = {gib(rss)} "
        f"({'fits' if rss < 24 * 2**30 else 'does not fit'} in 24 GB)",
        file=out,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", help="directory for the checkpoint and outputs (default: a temporary one)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--num-seqs", type=int, default=4, help="windows of the dump")
    ap.add_argument("--e2e-seqs", type=int, default=2, help="windows of the e2e step")
    ap.add_argument("--moe-intermediate", type=int, default=176, help="expert width (V2-Lite: 1408)")
    ap.add_argument("--intermediate", type=int, default=1368, help="dense layer width (V2-Lite: 10944)")
    ap.add_argument("--vocab", type=int, default=8192, help="vocabulary (V2-Lite: 102400)")
    a = ap.parse_args()
    if not os.access("/usr/bin/time", os.X_OK):
        print("stream_v2lite: /usr/bin/time is missing (apt-get install time)", file=sys.stderr)
        return 2
    cfg = dict(V2_LITE, moe_intermediate_size=a.moe_intermediate, intermediate_size=a.intermediate, vocab_size=a.vocab)
    red, real = layer_counts(cfg), layer_counts(V2_LITE)
    work = a.work or tempfile.mkdtemp(prefix="stream-v2lite-")
    os.makedirs(work, exist_ok=True)
    ck = os.path.join(work, "v2lite-shaped")
    text = os.path.join(work, "text.bin")
    with open(text, "wb") as f:
        f.write(np.random.default_rng(0).integers(0, 256, a.seq_len * a.num_seqs, dtype=np.uint8).tobytes())
    out = sys.stdout
    try:
        t0 = time.perf_counter()
        if not os.path.isfile(os.path.join(ck, "model.safetensors.index.json")):
            make_checkpoint(ck, cfg)
        size = sum(os.path.getsize(os.path.join(ck, x)) for x in os.listdir(ck))
        print(
            f"checkpoint: V2-Lite shape, 27 layers, 16 heads, 512 + 64, 64 routed experts; reduced: "
            f"moe_intermediate {a.moe_intermediate} (1408), intermediate {a.intermediate} (10944), vocab {a.vocab} "
            f"(102400); {size / 2**30:.2f} GiB bf16 in 4 shards ({time.perf_counter() - t0:.0f} s to write)",
            file=out,
        )
        py = [sys.executable, "-m"]
        dump = os.path.join(work, "dump.h5")
        argv = py + ["latentq.dump", "--model", ck, "--text", text, "--seq-len", str(a.seq_len)]
        argv += ["--num-seqs", str(a.num_seqs), "--q-rows", "64", "--out", dump, "--force", "--stream", "on"]
        kb, wall, stdout = peak_rss_kb(argv + ["--threads", str(a.threads)])
        s = json.loads(stdout[stdout.index("{") :])
        dm = dict(rss_kb=kb, load_s=s["load_seconds"], compute_s=s["compute_seconds"], vocab=a.vocab)
        dm["other_s"] = wall - dm["load_s"] - dm["compute_s"]
        print(
            f"dump ({a.num_seqs} x {a.seq_len} tokens, {a.threads} threads): {wall:.1f} s wall "
            f"(load {dm['load_s']:.1f} s, compute {dm['compute_s']:.1f} s), peak RSS {kb / 1024:.0f} MiB",
            file=out,
        )
        res = os.path.join(work, "results.h5")
        make_results(res, cfg["num_hidden_layers"])
        argv = py + ["latentq.e2e", "--results", res, "--model", ck, "--text", text, "--offset-bytes", "0"]
        argv += ["--seq-len", str(a.seq_len), "--num-seqs", str(a.e2e_seqs), "--stream", "on", "--quiet"]
        kb, wall, _ = peak_rss_kb(argv + ["--threads", str(a.threads)])
        import h5py

        with h5py.File(res, "r") as f:
            at = dict(f["e2e"].attrs)
            kl = dict(zip([q.decode() for q in f["e2e/quantizer"][:]], f["e2e/kl_mean"][:]))
        em = dict(rss_kb=kb, load_s=float(at["load_seconds"]), compute_s=float(at["compute_seconds"]), vocab=a.vocab)
        em["other_s"] = wall - em["load_s"] - em["compute_s"]
        print(
            f"e2e ({len(QUANTIZERS)} runs + the reference, {a.e2e_seqs} x {a.seq_len} tokens, batch_runs "
            f"{int(at['batch_runs'])}): {wall:.1f} s wall (load {em['load_s']:.1f} s, "
            f"compute {em['compute_s']:.1f} s), "
            f"peak RSS {kb / 1024:.0f} MiB; KL " + ", ".join(f"{q} {v:.3g}" for q, v in kl.items()),
            file=out,
        )
        print("estimate: the real DeepSeek-V2-Lite (bf16, 31 GB) on a 24 GB CPU-only machine, same tokens:", file=out)
        estimate("dump", dm, red, real, a.num_seqs * a.seq_len, 0, out)
        estimate("e2e", em, red, real, a.e2e_seqs * a.seq_len, 1 + int(at["batch_runs"]), out)
        v3 = layer_counts(V3)
        fp8_bytes = v3["stored"]  # one byte per weight (FP8 e4m3), the scales are 1/16384 of that
        # bytes of bf16 shards read, converted to float32 and placed per second here: the dump's (the first
        # read of the shards) and the e2e step's (the second, page cache warm)
        rates = (red["stored"] * 2 / dm["load_s"], red["stored"] * 2 / em["load_s"])
        rate = max(rates)
        nvme = 3e9  # an assumed NVMe read rate, for a host whose conversion keeps up with it
        tokens = a.num_seqs * a.seq_len
        flop = 2 * v3["active_per_token"] * v3["layers"] * tokens
        gpu = flop / (H200_BF16_FLOPS * GPU_EFFICIENCY)
        print(
            f"estimate: DeepSeek-V3 (FP8, {fp8_bytes / 1e9:.0f} GB of decoder weights) on one H200, {tokens} tokens: "
            f"read {fp8_bytes / 1e9:.0f} GB at this host's load rate ({rates[0] / 1e9:.2f} GB/s in the dump, "
            f"{rates[1] / 1e9:.2f} GB/s in the e2e step) = {fp8_bytes / rate:.0f} s, or at {nvme / 1e9:.0f} GB/s "
            f"(an NVMe drive, if the conversion keeps up) = {fp8_bytes / nvme:.0f} s, once per pass (a streamed "
            f"pass reads each layer once for every forward of the step); compute 2 x "
            f"{v3['active_per_token'] / 1e9:.2f} G params x {v3['layers']} layers x {tokens} tokens = "
            f"{flop / 1e12:.0f} TFLOP per forward at {GPU_EFFICIENCY:.0%} of 989 TFLOP/s = {gpu:.1f} s; largest layer "
            f"{gib(2 * v3['largest'])} in bf16 on the device (of 141 GB)",
            file=out,
        )
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
