"""Peak host memory of latentq.dump.dump() on a random-init HF DeepseekV3-shaped model.

    /usr/bin/time -v .venv/bin/python bench/dump_rss.py --out /tmp/rss.h5 [--layers 8] [--seq-len 8192]
        [--num-seqs 1] [--q-rows 256] [--dumper-dir DIR] [--threads 2]

The model (built offline from a config, no download): DeepseekV3ForCausalLM with --layers dense
layers, hidden 256, 4 heads, kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128,
v_head_dim 128, q_lora_rank 128, vocab 1024, sdpa attention (no [H, T, T] score tensor on the host
when the CPU flash kernel runs, so the dumped tensors, not the attention, dominate the peak). Tokens:
a fixed-seed random sequence. The dumper is this checkout's latentq.dump; ``--dumper-dir DIR`` loads
DIR/dump_latents.py instead (which imports its latent_hooks.py from DIR), an older revision extracted
with ``git show REV:data/dump_latents.py`` and ``git show REV:data/latent_hooks.py``, to compare two
dumpers in the same run conditions.

Prints the dumped bytes (c_kv + k_pe + q/attn_out rows over all layers, float32), the size of the
file, the model's parameter bytes and the in-process peak RSS (getrusage ru_maxrss); read
"Maximum resident set size" of /usr/bin/time -v for the figure of record.
"""

import argparse
import importlib.util
import os
import resource
import sys
import time

import torch


def load_dumper(directory):
    """latentq.dump, or the module DIR/dump_latents.py of an older revision (directory given)."""
    if directory is None:
        from latentq import dump

        return dump
    path = os.path.join(os.path.abspath(directory), "dump_latents.py")
    spec = importlib.util.spec_from_file_location("dump_latents", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["dump_latents"] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--num-seqs", type=int, default=1)
    ap.add_argument("--q-rows", type=int, default=256)
    ap.add_argument("--dumper-dir", help="a directory with an older dump_latents.py (default: latentq.dump)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dump_latents = load_dumper(a.dumper_dir)
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    cfg = DeepseekV3Config(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=a.layers,
        first_k_dense_replace=a.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        q_lora_rank=128,
        max_position_embeddings=max(8192, a.seq_len),
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        attn_implementation="sdpa",
    )
    model = DeepseekV3ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 1024, (a.seq_len,), generator=g).numpy() for _ in range(a.num_seqs)]
    t0 = time.perf_counter()
    summary = dump_latents.dump(
        model, model.config.to_dict(), seqs, a.q_rows, a.out, force=True, model_name="rss-bench"
    )
    dt = time.perf_counter() - t0
    T = a.seq_len * a.num_seqs
    H = 4
    dumped = a.layers * 4 * (T * (512 + 64) + a.q_rows * H * (128 + 64 + 128))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    where = os.path.dirname(os.path.abspath(dump_latents.__file__))
    print(f"dumper {where}: {a.layers} layers, {a.num_seqs} x {a.seq_len} tokens, {a.q_rows} q rows, {dt:.1f} s")
    print(
        f"dumped tensors {dumped / 2**20:.1f} MiB, file {summary['bytes'] / 2**20:.1f} MiB, "
        f"model parameters {params / 2**20:.1f} MiB, max rel_err {max(summary['max_rel_err'].values()):.2e}"
    )
    print(f"ru_maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
