"""copy-mla (data/copy-mla, trained by data/train_copy_mla.py): the model that retrieves, and the e2e step's
/generation and /retrieval run on it by `latentq study`.

- The shipped weights retrieve: the reference's teacher-forced success on the needle grid of its needle text is
  recomputed here (not read from heldout.json) and must be >= 0.90, the bar the retrieval test needs.
- One teacher-forced forward decides what step-by-step greedy decoding gives (latentq.needle's claim), on samples
  the model retrieves and on samples it does not.
- `latentq study --model data/copy-mla` writes /generation and /retrieval (its reference retrieving >= 0.90 on the
  same samples through the step's own forwards; bf16 keeping them, 2 bits per element losing them), measures its
  plan (no "predicted" row) and prints both under the decision, the line being /decision's free_running column in
  the terminal and in report.md. (A dump of a TinyMLA directory not named tiny-mla: the e2e step takes the
  directory as the dump's model, by the results' input_source.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from latentq.needle import DEFAULT_CUE, DEFAULT_DEPTHS, DEFAULT_SPAN, needle_samples, teacher_forced_success
from latentq.tiny_mla import TinyMLAForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "data"))
from train_copy_mla import (  # noqa: E402
    COPY_LEAD,
    EVAL_SEED,  # the needle text and the samples of heldout.json's figure
    RETRIEVAL_LENGTHS,
    copy_sequences,
    copy_text,
    needle_text,
)

MODEL = os.path.join(ROOT, "data", "copy-mla")
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield TinyMLAForCausalLM.from_pretrained(MODEL).eval()
    torch.set_num_threads(threads)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_copy_sequences_copies_exactly_and_masks_the_predictable_bytes(seed):
    """Every loss position (mask) predicts a byte that equals the byte at the same offset of an earlier copy source
    and lies at index >= COPY_LEAD of a copied span; spans do not overlap; copy_text is the rows one after another."""
    rng = np.random.default_rng(seed)
    x, mask = copy_sequences(rng, 4, 320, 16, 40, 8)
    assert x.shape == (4, 320) and mask.shape == (4, 319) and x.dtype == np.int64
    for b in range(4):
        runs = np.flatnonzero(np.diff(np.concatenate([[0], mask[b].astype(int), [0]])))  # [start, end) pairs
        spans = list(zip(runs[::2], runs[1::2]))
        assert 1 <= len(spans) <= 8, (seed, b, spans)
        for p0, p1 in spans:  # targets p0 + 1 .. p1, the copy's bytes from COPY_LEAD on
            d, m = p0 + 1 - COPY_LEAD, p1 - p0 + COPY_LEAD  # the span's destination and length
            assert 16 <= m <= 40, (seed, b, d, m)
            src = [s for s in range(0, d - m + 1) if np.array_equal(x[b, s : s + m], x[b, d : d + m])]
            assert src, f"seed {seed} row {b}: the span at {d} of {m} bytes copies nothing earlier"
    text = copy_text(2048, seed, row=512)
    rows, _ = copy_sequences(np.random.default_rng(seed), 4, 512, 16, 40, 512 // 40)
    assert np.array_equal(text, rows.reshape(-1))


def test_the_shipped_model_retrieves(model):
    text = needle_text(65536, EVAL_SEED)
    ok = []
    for L in RETRIEVAL_LENGTHS:
        s = needle_samples(text, [L], DEFAULT_DEPTHS, DEFAULT_SPAN, DEFAULT_CUE, 8, EVAL_SEED)
        x = torch.from_numpy(np.stack([np.concatenate([t.prompt, t.answer[:-1]]) for t in s]))
        with torch.no_grad():
            ok.append(teacher_forced_success(model(x), np.stack([t.answer for t in s])))
        print(f"length {L}: {ok[-1].mean():.3f}")
    assert np.concatenate(ok).mean() >= 0.90, [float(o.mean()) for o in ok]


def test_one_forward_decides_greedy_decoding(model):
    """Greedy decoding step by step (a full forward per token) against teacher_forced_success, on 6 samples of the
    needle text and the same samples with their answer's 5th token changed (which greedy decoding cannot produce
    if it produced the true one): the two agree on every sample."""
    text = needle_text(65536, EVAL_SEED)
    s = needle_samples(text, [64, 128], [0.2, 0.5, 0.8], DEFAULT_SPAN, DEFAULT_CUE, 1, 11)
    for t in s:
        for answer in (t.answer, np.concatenate([t.answer[:4], [(t.answer[4] + 1) % 256], t.answer[5:]])):
            ids = torch.from_numpy(t.prompt)[None]
            greedy = []
            with torch.no_grad():
                for _ in range(len(answer)):
                    nxt = int(model(ids)[0, -1].argmax())
                    greedy.append(nxt)
                    ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
                x = torch.from_numpy(np.concatenate([t.prompt, answer[:-1]]))[None]
                one = bool(teacher_forced_success(model(x), answer[None])[0])
            assert one == (greedy == answer.tolist()), (t.length, t.depth, greedy, answer.tolist())


CONFIG = """[quantizers]
bits = [8, 2]
schemes = ["asym"]
granularities = ["token"]
group_sizes = [0]
extra = ["bf16", "q4_0"]
[svd]
enabled = false
[cross_layer]
enabled = false
[e2e]
needle_lengths = [64, 128, 256]
needle_samples = 2
"""


def test_study_of_copy_mla_writes_generation_and_retrieval(tmp_path):
    text = tmp_path / "needles.bin"
    text.write_bytes(needle_text(65536, EVAL_SEED).astype(np.uint8).tobytes())
    cfg = tmp_path / "small.toml"
    cfg.write_text(CONFIG)
    out = tmp_path / "out"
    args = [LQ, "study", "--model", MODEL, "--text", str(text), "--out", str(out), "--config", str(cfg)]
    args += ["--seq-len", "128", "--num-seqs", "4", "--q-rows", "16", "--threads", "1"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with h5py.File(out / "results.h5", "r") as f:
        assert "generation" in f and "retrieval" in f and "retrieval_summary" in f
        s = {c: f["retrieval_summary"][c][()] for c in f["retrieval_summary"]}
        assert float(f["retrieval"].attrs["reference_accuracy"]) >= 0.90
        d = {c: f["decision"][c][()] for c in f["decision"]}
    q = [x.decode() + "/" + t.decode() for x, t in zip(s["quantizer"], s["targets"])]
    acc = dict(zip(q, s["accuracy"]))
    print(acc)
    assert np.all(s["samples"] == 3 * 5 * 2)
    # the grid tells formats apart: bf16 keeps every needle the reference retrieves, 2 bits per element lose them
    assert acc["bf16/c_kv+k_pe"] >= 0.90 and acc["int2-asym-token/c_kv+k_pe"] <= 0.2, acc
    assert b"predicted" not in set(d["source"])  # the plan at each budget is measured end to end
    assert "retrieval: " in r.stdout and "generation: first divergence" in r.stdout, r.stdout[-3000:]
    # the line under each choice is /decision's free_running column, printed as stored by the terminal and the report
    lines = [x.decode() for x in d["free_running"] if x]
    assert lines and all(x.startswith("generation: first divergence at ") and "; retrieval: " in x for x in lines)
    md = (out / "report" / "report.md").read_text()
    for x in lines:
        assert f"  {' ' * 8} {x}\n" in r.stdout and f"`: {x}\n" in md, x
    # the embedded default study names tiny-mla as its [e2e] model: on this dump its e2e step is skipped, not run
    # with another model's weights
    r = subprocess.run([LQ, "run", "--input", str(out / "dump.h5"), "--out", str(tmp_path / "default.h5")],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "e2e: skipped: the dump's model is 'copy-mla' but the [e2e] model " in r.stdout, r.stdout[-2000:]
    assert "is another TinyMLA directory" in r.stdout
    with h5py.File(tmp_path / "default.h5", "r") as f:
        assert "e2e" not in f
