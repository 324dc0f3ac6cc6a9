"""Train copy-mla, a small MLA byte-level model that retrieves needles, on a synthetic copy task (CPU, seeded).

    .venv/bin/python data/train_copy_mla.py --out data/copy-mla

The task is the repeated-random-sequence task of the induction-head literature (C. Olsson et al., "In-context
Learning and Induction Heads", Transformer Circuits Thread, 2022: sequences of random tokens in which spans repeat,
where only copying predicts the repeats), with spans and distances drawn at random so that no fixed attention
offset can stand in for copying. A training row (:func:`copy_sequences`) is ``length`` i.i.d. uniform bytes over
which spans are copied, each from an earlier place; sources and destinations do not overlap, so every copy stays
exact. The loss is the mean cross-entropy over the predictable positions only: the bytes of each copy from its
third on (two bytes single out the source among the row's random bytes); the other bytes carry no loss. Each step
draws one ``length`` and takes ``--tokens // length`` rows, in three phases:
  1. steps 1..--short-steps: rows of --short-lengths (32-64 bytes), one copy of 8..length/2 bytes each (at init the
     attention is spread over every key: short rows let the copy circuit form, within ~450 steps);
  2. to step --long-steps: rows of --lengths (96-576 bytes), one copy of 8..length/2 bytes each;
  3. then: rows of --lengths with length // 40 copies of 16-40 bytes each (needle-like).

Retrieval is checked on needle samples (latentq.needle) of :func:`needle_text`, a uniform random byte text: the
validation text (seed ``--val-seed``) every ``--eval-every`` steps, where training stops once the success reaches
``--stop-at`` at every length of RETRIEVAL_LENGTHS; the reported figure is on another text (``--eval-seed``).

Writes into --out: model.safetensors, config.json, train_log.tsv (step, row length, loss in nats/byte over the
predictable positions, lr, elapsed seconds, the validation success at the evaluation steps) and heldout.json: the
retrieval accuracy of the trained model per (length, depth), per length and overall, on ``--eval-samples``
samples per (length, depth) of needle_text(65536, --eval-seed), with the validation history.
Budget: <= 30 minutes on one core (--threads 1); data/README.md has the measured run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from latentq.needle import (
    DEFAULT_CUE,
    DEFAULT_DEPTHS,
    DEFAULT_LENGTHS,
    DEFAULT_SPAN,
    needle_samples,
    teacher_forced_success,
)
from latentq.tiny_mla import TinyMLAConfig, TinyMLAForCausalLM

#: copy-mla's shape: 3 layers, hidden 128, 8 heads, kv_lora_rank 128, qk_rope_head_dim 16 (--heads overrides the heads)
COPY_MLA_CONFIG = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=3,
    num_attention_heads=8,
    kv_lora_rank=128,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=32,
    max_position_embeddings=1024,
)
#: the context lengths (tokens) the shipped model retrieves at (the needle grid of its checks)
RETRIEVAL_LENGTHS: tuple[int, ...] = DEFAULT_LENGTHS
#: the seeds of the validation needle text (--val-seed) and of the reported one and its samples (--eval-seed)
VAL_SEED, EVAL_SEED = 4, 5
#: bytes of a copy before its predictable part (two bytes single out the source among the sequence's bytes)
COPY_LEAD = 2


def needle_text(n: int, seed: int) -> np.ndarray:
    """n i.i.d. uniform bytes (int64 [n]) from numpy's default_rng(seed): a text only copying predicts."""
    return np.random.default_rng(seed).integers(0, 256, n).astype(np.int64)


def copy_text(n: int, seed: int, row: int = 512) -> np.ndarray:
    """A text of the training task's kind, int64 [n // row * row]: rows of ``row`` uniform random bytes, each with
    ``row // 40`` spans of 16-40 bytes copied from earlier in the row (copy_sequences with numpy's
    default_rng(seed)), one after the other. Scored in windows of ``row`` bytes from offset 0, each window holds its
    copies' sources: the text on which copy-mla's next-byte predictions, and their KL under a quantized cache, mean
    something (on uniform random bytes every prediction is the uniform one)."""
    x, _ = copy_sequences(np.random.default_rng(seed), n // row, row, 16, 40, row // 40)
    return x.reshape(-1)


def copy_sequences(
    rng: np.random.Generator, batch: int, length: int, min_span: int, max_span: int, copies: int
) -> tuple[np.ndarray, np.ndarray]:
    """Training sequences of the copy task.

    Returns (x int64 [batch, length], mask bool [batch, length - 1]): ``mask[b, p]`` is True where ``x[b, p + 1]``
    is a copied byte at index >= COPY_LEAD of its copy (the loss positions). Each row is uniform random bytes with
    up to ``copies`` spans of ``min_span..max_span`` bytes (uniform, per span) copied from an earlier place (uniform
    among those that fit); no two spans (source or destination) overlap, so every copy is exact in the final row.
    """
    x = rng.integers(0, 256, (batch, length))
    mask = np.zeros((batch, length - 1), dtype=bool)
    for b in range(batch):
        taken = np.zeros(length, dtype=bool)
        placed = 0
        for _ in range(8 * copies):
            if placed == copies:
                break
            m = int(rng.integers(min_span, max_span + 1))
            if 2 * m > length:
                break
            d = int(rng.integers(m, length - m + 1))
            s = int(rng.integers(0, d - m + 1))
            if taken[d : d + m].any() or taken[s : s + m].any():
                continue
            taken[d : d + m] = taken[s : s + m] = True
            x[b, d : d + m] = x[b, s : s + m]
            mask[b, d + COPY_LEAD - 1 : d + m - 1] = True
            placed += 1
    return x, mask


@torch.no_grad()
def retrieval_accuracy(model, tokens: np.ndarray, lengths, samples: int, seed: int) -> dict:
    """Teacher-forced needle success of ``model`` per "length,depth", per length and overall (span 24, cue 8)."""
    per_pair, per_len, hits, n = {}, {}, 0, 0
    for length in lengths:
        s = needle_samples(tokens, [length], DEFAULT_DEPTHS, DEFAULT_SPAN, DEFAULT_CUE, samples, seed)
        x = torch.from_numpy(np.stack([np.concatenate([t.prompt, t.answer[:-1]]) for t in s]))
        ok = teacher_forced_success(model(x), np.stack([t.answer for t in s]))
        for i, depth in enumerate(DEFAULT_DEPTHS):
            per_pair[f"{length},{depth}"] = round(float(ok[i * samples : (i + 1) * samples].mean()), 4)
        per_len[str(length)] = round(float(ok.mean()), 4)
        hits += int(ok.sum())
        n += len(s)
    return {"per_length_depth": per_pair, "per_length": per_len, "overall": round(hits / n, 4), "samples": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/copy-mla")
    ap.add_argument("--steps", type=int, default=4000, help="most steps (training stops earlier at --stop-at)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[96, 192, 320, 448, 576])
    ap.add_argument("--long-steps", type=int, default=2000, help="first steps with one long copy per row")
    ap.add_argument("--short-steps", type=int, default=600, help="first steps on short rows (--short-lengths)")
    ap.add_argument("--short-lengths", type=int, nargs="+", default=[32, 48, 64])
    ap.add_argument("--tokens", type=int, default=4608, help="tokens per step (sequences = tokens // length)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--schedule", choices=["constant", "cosine"], default="constant", help="lr after the warmup")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heads", type=int, default=8, help="attention heads (each qk_nope 32 + qk_rope 16, v 32)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--stop-at", type=float, default=0.97, help="validation success at every length that stops")
    ap.add_argument("--val-seed", type=int, default=VAL_SEED, help="seed of the validation needle text")
    ap.add_argument("--eval-seed", type=int, default=EVAL_SEED, help="seed of the reported needle text and its samples")
    ap.add_argument("--eval-samples", type=int, default=8, help="needle samples per (length, depth)")
    a = ap.parse_args()

    torch.manual_seed(a.seed)  # the initialization; the data from numpy's default_rng(seed)
    torch.set_num_threads(a.threads)
    cfg = TinyMLAConfig(**{**COPY_MLA_CONFIG, "num_attention_heads": a.heads})
    model = TinyMLAForCausalLM(cfg)
    for p in model.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(a.seed)
    val_text = needle_text(65536, a.val_seed)
    os.makedirs(a.out, exist_ok=True)
    log_path = os.path.join(a.out, "train_log.tsv")
    history = []
    step = 0
    t0 = time.time()
    with open(log_path + ".tmp", "w") as log:
        log.write("step\tlength\tloss_nats_per_byte\tlr\telapsed_s\tval_retrieval\n")
        for step in range(1, a.steps + 1):
            if step <= a.warmup:
                lr = a.lr * step / a.warmup
            elif a.schedule == "constant":
                lr = a.lr
            else:
                prog = (step - a.warmup) / max(1, a.steps - a.warmup)
                lr = 0.1 * a.lr + 0.9 * a.lr * 0.5 * (1 + math.cos(math.pi * prog))
            for g in opt.param_groups:
                g["lr"] = lr
            length = int(rng.choice(a.short_lengths if step <= a.short_steps else a.lengths))
            if step <= a.long_steps:  # one long copy per row: its distance differs from row to row
                x, mask = copy_sequences(rng, max(1, a.tokens // length), length, 8, length // 2, 1)
            else:  # needle-like: several short copies per row
                x, mask = copy_sequences(rng, max(1, a.tokens // length), length, 16, 40, max(1, length // 40))
            xb, mb = torch.from_numpy(x), torch.from_numpy(mask)
            logits = model(xb[:, :-1])
            ce = F.cross_entropy(logits.reshape(-1, 256), xb[:, 1:].reshape(-1), reduction="none").view(mb.shape)
            loss = ce[mb].mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            val = ""
            done = False
            if step % a.eval_every == 0:
                model.eval()
                acc = retrieval_accuracy(model, val_text, RETRIEVAL_LENGTHS, a.eval_samples, a.val_seed)
                model.train()
                history.append({"step": step, **acc["per_length"]})
                val = f"{acc['overall']:.4f}"
                done = min(acc["per_length"].values()) >= a.stop_at
                print(f"validation at step {step}: {acc['per_length']} overall {acc['overall']}", flush=True)
            log.write(f"{step}\t{length}\t{float(loss.detach()):.5f}\t{lr:.6g}\t{time.time() - t0:.1f}\t{val}\n")
            log.flush()
            if step % 50 == 0 or step == 1:
                elapsed = time.time() - t0
                eta = elapsed / step * (a.steps - step)  # at most: --stop-at may end it sooner
                print(
                    f"step {step}/{a.steps} L {length} loss {float(loss.detach()):.4f} lr {lr:.2e} {elapsed:.0f}s "
                    f"(ETA <= {eta:.0f}s)",
                    flush=True,
                )
            if done:
                break
    os.replace(log_path + ".tmp", log_path)
    train_s = time.time() - t0
    model.eval()
    acc = retrieval_accuracy(model, needle_text(65536, a.eval_seed), RETRIEVAL_LENGTHS, a.eval_samples, a.eval_seed)
    model.save_pretrained(a.out)
    summary = {
        "retrieval_accuracy": acc,
        "retrieval_note": (
            f"latentq.needle.teacher_forced_success on needle_samples(needle_text(65536, {a.eval_seed}), "
            f"{list(RETRIEVAL_LENGTHS)}, DEFAULT_DEPTHS, span={DEFAULT_SPAN}, cue={DEFAULT_CUE}, "
            f"samples={a.eval_samples}, seed={a.eval_seed}), float32 CPU forward"
        ),
        "validation_history": history,
        "steps_run": step,
        "train_seconds": round(train_s, 1),
        "train_seconds_note": "wall time on the training machine, other jobs included; see train_log.tsv elapsed_s",
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
