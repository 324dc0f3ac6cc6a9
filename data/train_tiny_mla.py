"""Train tiny-mla on the KJV training split, CPU only, fixed seed.

    .venv/bin/python data/train_tiny_mla.py --out data/tiny-mla

Writes into --out: model.safetensors, config.json, train_log.tsv (step, loss in nats/byte, lr,
elapsed seconds) and heldout.json (held-out loss in nats/byte next to the unigram baseline of the
same text, the text sha256s and the training settings). Budget: <= 60 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F

from latentq.kjv_text import load_kjv, sha256, split_kjv
from latentq.tiny_mla import TinyMLAConfig, TinyMLAForCausalLM


def unigram_nats_per_byte(train: bytes, heldout: bytes) -> float:
    """Cross-entropy of the held-out bytes under the add-one-smoothed byte unigram of the train split."""
    counts = torch.bincount(torch.frombuffer(bytearray(train), dtype=torch.uint8).long(), minlength=256).double() + 1
    logp = torch.log(counts / counts.sum())
    h = torch.frombuffer(bytearray(heldout), dtype=torch.uint8).long()
    return float(-logp[h].mean())


@torch.no_grad()
def heldout_nats_per_byte(model, heldout: bytes, seq_len: int, batch: int = 8) -> float:
    """Mean next-byte loss over non-overlapping windows of seq_len + 1 bytes covering the held-out text."""
    data = torch.frombuffer(bytearray(heldout), dtype=torch.uint8).long()
    n = (len(data) - 1) // seq_len
    x = data[: n * seq_len + 1]
    inp = x[:-1].view(n, seq_len)
    tgt = x[1:].view(n, seq_len)
    tot, cnt = 0.0, 0
    for i in range(0, n, batch):
        logits = model(inp[i : i + batch])
        tot += float(F.cross_entropy(logits.reshape(-1, 256), tgt[i : i + batch].reshape(-1), reduction="sum"))
        cnt += tgt[i : i + batch].numel()
    return tot / cnt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/tiny-mla")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=25,
        help="save model, optimizer and sampler state to OUT/checkpoint.pt every N steps",
    )
    ap.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt (same settings)")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    text = load_kjv()
    train, heldout = split_kjv(text)
    cfg = TinyMLAConfig()
    model = TinyMLAForCausalLM(cfg)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.data.mul_(1.0 / math.sqrt(2 * cfg.num_hidden_layers))
    decay = [p for p in model.parameters() if p.dim() == 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95)
    )
    data = torch.frombuffer(bytearray(train), dtype=torch.uint8).long()
    gen = torch.Generator().manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    log_path = os.path.join(a.out, "train_log.tsv")
    ckpt_path = os.path.join(a.out, "checkpoint.pt")
    start, elapsed0 = 1, 0.0
    if a.resume and os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, weights_only=False)
        if ck["settings"] != {k: v for k, v in vars(a).items() if k != "resume"}:
            raise SystemExit(f"{ckpt_path} was written with other settings: {ck['settings']}")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        torch.set_rng_state(ck["rng"])
        start, elapsed0 = ck["step"] + 1, ck["elapsed"]
        with open(log_path + ".tmp", "w") as log:
            log.write(ck["log"])
        print(f"resumed at step {start}", flush=True)
    else:
        with open(log_path + ".tmp", "w") as log:
            log.write("step\tloss_nats_per_byte\tlr\telapsed_s\n")
    t0 = time.time() - elapsed0
    with open(log_path + ".tmp", "a") as log:
        for step in range(start, a.steps + 1):
            if step <= a.warmup:
                lr = a.lr * step / a.warmup
            else:
                prog = (step - a.warmup) / max(1, a.steps - a.warmup)
                lr = 0.1 * a.lr + 0.9 * a.lr * 0.5 * (1 + math.cos(math.pi * prog))
            for g in opt.param_groups:
                g["lr"] = lr
            starts = torch.randint(0, len(data) - a.seq_len - 1, (a.batch,), generator=gen)
            xb = torch.stack([data[s : s + a.seq_len + 1] for s in starts.tolist()])
            logits = model(xb[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 256), xb[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            log.write(f"{step}\t{loss.item():.5f}\t{lr:.6g}\t{time.time() - t0:.1f}\n")
            log.flush()
            if step % 25 == 0 or step == 1:
                print(f"step {step}/{a.steps} loss {loss.item():.4f} lr {lr:.2e} {time.time() - t0:.0f}s", flush=True)
            if a.checkpoint_every and step % a.checkpoint_every == 0 and step < a.steps:
                with open(log_path + ".tmp") as lf:
                    logtext = lf.read()
                torch.save(
                    {
                        "model": model.state_dict(),
                        "opt": opt.state_dict(),
                        "gen": gen.get_state(),
                        "rng": torch.get_rng_state(),
                        "step": step,
                        "elapsed": time.time() - t0,
                        "log": logtext,
                        "settings": {k: v for k, v in vars(a).items() if k != "resume"},
                    },
                    ckpt_path + ".tmp",
                )
                os.replace(ckpt_path + ".tmp", ckpt_path)
    os.replace(log_path + ".tmp", log_path)
    if os.path.exists(ckpt_path):
        os.unlink(ckpt_path)
    train_s = time.time() - t0
    model.eval()
    ho = heldout_nats_per_byte(model, heldout, a.seq_len)
    uni = unigram_nats_per_byte(train, heldout)
    model.save_pretrained(a.out)
    summary = {
        "heldout_loss_nats_per_byte": round(ho, 5),
        "unigram_baseline_nats_per_byte": round(uni, 5),
        "heldout_bytes": len(heldout),
        "train_bytes": len(train),
        "text_sha256": sha256(text),
        "heldout_sha256": sha256(heldout),
        "text_source": 'Debian bible-kjv: bible "Gen1:1-Rev22:21"',
        "train_seconds": round(train_s, 1),
        "train_seconds_note": "wall time on the training machine, other jobs included; see train_log.tsv elapsed_s",
        "tokens_seen": a.steps * a.batch * a.seq_len,
        "settings": vars(a),
        "torch": torch.__version__,
        "num_parameters": sum(p.numel() for p in model.parameters()),
    }
    with open(os.path.join(a.out, "heldout.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
