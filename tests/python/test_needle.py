"""latentq.needle: needle samples and teacher-forced retrieval success.

The needle-sample tests run on hand-built token arrays; the greedy-decoding test loads the shipped tiny-mla
(data/tiny-mla) and the held-out KJV split (Debian's bible-kjv; its absence is a failure).
"""

import os

import numpy as np
import pytest
import torch

from latentq.needle import (
    MAX_TRIES,
    NeedleSample,
    needle_samples,
    teacher_forced_success,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_MLA = os.path.join(REPO, "data", "tiny-mla")


def _check_layout(tokens: np.ndarray, s: NeedleSample, length: int, span: int, cue: int) -> None:
    """On a text of distinct tokens (token == its offset), recover the context and needle offsets and check them."""
    at = s.needle_at
    assert s.prompt.dtype == np.int64 and s.answer.dtype == np.int64
    assert s.prompt.shape == (length + cue,) and s.answer.shape == (span - cue,)
    ctx = s.prompt[:length]
    n0 = int(ctx[at])
    np.testing.assert_array_equal(ctx[at : at + span], tokens[n0 : n0 + span])
    np.testing.assert_array_equal(s.prompt[length:], tokens[n0 : n0 + cue])
    np.testing.assert_array_equal(s.answer, tokens[n0 + cue : n0 + span])
    c0 = int(ctx[0]) if at > 0 else int(ctx[-1]) - (length - 1)
    outside = np.r_[0:at, at + span : length]
    np.testing.assert_array_equal(ctx[outside], tokens[c0 + outside])
    assert n0 + span <= c0 or n0 >= c0 + length, (c0, n0)  # the needle is not cut from the context


def test_needle_positions_by_hand():
    tokens = np.arange(1000, dtype=np.int64)
    # needle_at = round(depth * (length - span)), Python's round (half to even): 0.5 * 7 = 3.5 -> 4,
    # 0.25 * 10 = 2.5 -> 2, 0.1 * 7 = 0.7 -> 1, 0 -> 0, 1 -> length - span
    cases = [(11, 4, 1, 0.5, 4), (14, 4, 2, 0.25, 2), (11, 4, 3, 0.1, 1), (20, 6, 2, 0.0, 0), (20, 6, 2, 1.0, 14)]
    for length, span, cue, depth, at in cases:
        (s,) = needle_samples(tokens, [length], [depth], span=span, cue=cue, samples=1, seed=7)
        assert (s.length, s.depth, s.needle_at) == (length, depth, at)
        _check_layout(tokens, s, length, span, cue)


def test_needle_grid_order_and_layout():
    tokens = np.arange(5000, dtype=np.int64)
    out = needle_samples(tokens, [64, 128], [0.0, 0.5, 1.0], span=12, cue=4, samples=3, seed=1)
    assert len(out) == 2 * 3 * 3
    assert [(s.length, s.depth) for s in out[:4]] == [(64, 0.0)] * 3 + [(64, 0.5)]
    assert [s.needle_at for s in out[::3]] == [0, 26, 52, 0, 58, 116]
    for s in out:
        _check_layout(tokens, s, s.length, 12, 4)


def test_needle_cue_unique_on_repetitive_text():
    # a text of 8-token periods (every 3-token window repeats) with a distinct token every 40: most needles' cues
    # recur in the context and must be redrawn; the survivors' cues occur exactly once
    seed = 3
    tokens = np.tile(np.arange(8), 500)
    tokens[::40] = 100 + np.arange(len(tokens[::40]))
    out = needle_samples(tokens, [96, 200], [0.2, 0.8], span=10, cue=3, samples=8, seed=seed)
    for s in out:
        ctx, cue = s.prompt[: s.length], s.prompt[s.length :]
        win = np.lib.stride_tricks.sliding_window_view(ctx, 3)
        assert int(np.all(win == cue, axis=1).sum()) == 1, (seed, s.length, s.depth, ctx.shape)
        # the unique cue holds one of the distinct tokens (a cue of the periodic part recurs every 8 tokens)
        assert cue.max() >= 100, (seed, cue)


def test_needle_seeds_reproducible_and_independent():
    tokens = np.random.default_rng(0).integers(0, 50, 3000)
    a = needle_samples(tokens, [100, 300], [0.3, 0.7], span=16, cue=6, samples=4, seed=11)
    b = needle_samples(tokens, [100, 300], [0.3, 0.7], span=16, cue=6, samples=4, seed=11)
    c = needle_samples(tokens, [100, 300], [0.3, 0.7], span=16, cue=6, samples=4, seed=12)
    only = needle_samples(tokens, [300], [0.7], span=16, cue=6, samples=2, seed=11)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.prompt, y.prompt)
        np.testing.assert_array_equal(x.answer, y.answer)
    assert sum(not np.array_equal(x.prompt, y.prompt) for x, y in zip(a, c)) == len(a)
    # a sample depends on (seed, length, depth, index) only: the same with fewer pairs and samples asked for
    for x, y in zip(a[12:14], only):
        np.testing.assert_array_equal(x.prompt, y.prompt)


def test_needle_errors_name_the_value():
    periodic = np.tile(np.arange(3), 400)
    with pytest.raises(ValueError, match=rf"context of length 64 at depth 0.5 after {MAX_TRIES} draws"):
        needle_samples(periodic, [64], [0.5], span=8, cue=2, samples=1, seed=0)
    tokens = np.arange(100)
    with pytest.raises(ValueError, match=r"text of 100 tokens; length 90 needs >= 106"):
        needle_samples(tokens, [90], [0.5], span=8, cue=2)
    with pytest.raises(ValueError, match=r"length 4 is shorter than span 8"):
        needle_samples(tokens, [4], [0.5], span=8, cue=2)
    with pytest.raises(ValueError, match=r"cue=8, span=8; expected 1 <= cue < span"):
        needle_samples(tokens, [16], [0.5], span=8, cue=8)
    with pytest.raises(ValueError, match=r"depth 1.5; expected a fraction in \[0, 1\]"):
        needle_samples(tokens, [16], [1.5], span=8, cue=2)
    with pytest.raises(ValueError, match=r"tokens has shape \(2, 50\) dtype int64; expected 1-D integer"):
        needle_samples(np.zeros((2, 50), np.int64), [16], [0.5], span=8, cue=2)


def test_teacher_forced_success_by_hand():
    # B = 3, P = 2, A = 2 -> logits over P + A - 1 = 3 positions; the answer is read at positions 1 and 2
    logits = np.zeros((3, 3, 4), np.float32)
    logits[:, 0, 3] = 9.0  # position 0 (a prompt position) is ignored
    logits[0, 1, 2], logits[0, 2, 1] = 1.0, 1.0  # argmax 2, 1
    logits[1, 1, 2], logits[1, 2, 0] = 1.0, 1.0  # argmax 2, 0
    logits[2, 1, 0], logits[2, 2, 1] = -1.0, 1.0  # argmax 1 (first of the tied zeros), 1
    answers = np.array([[2, 1], [2, 1], [1, 1]])
    np.testing.assert_array_equal(teacher_forced_success(logits, answers), [True, False, True])
    np.testing.assert_array_equal(
        teacher_forced_success(torch.from_numpy(logits), torch.from_numpy(answers)), [True, False, True]
    )
    with pytest.raises(ValueError, match=r"5 answer tokens for logits of 3 positions"):
        teacher_forced_success(logits, np.zeros((3, 5), np.int64))
    with pytest.raises(ValueError, match=r"expected \[B, P \+ A - 1, V\] and \[B, A\]"):
        teacher_forced_success(logits, np.zeros((2, 2), np.int64))


@pytest.fixture(scope="module")
def tiny_mla():
    from latentq.tiny_mla import TinyMLAForCausalLM

    return TinyMLAForCausalLM.from_pretrained(TINY_MLA)


@pytest.fixture(scope="module")
def heldout_tokens():
    from latentq.kjv_text import load_kjv, split_kjv

    return np.frombuffer(split_kjv(load_kjv())[1], dtype=np.uint8).astype(np.int64)


def _first_miss(pred: np.ndarray, answer: np.ndarray) -> int:
    miss = np.flatnonzero(pred != answer)
    return int(miss[0]) if len(miss) else len(answer)


@torch.no_grad()
def test_teacher_forced_matches_greedy_loop(tiny_mla, heldout_tokens):
    """teacher_forced_success against naive greedy decoding (a full forward per token) on the shipped tiny-mla.

    Three answers per sample: the sample's own answer (the model's success varies), the greedy continuation itself
    (success by construction) and that continuation with byte k changed (failure at k exactly). For each, success
    and the first mismatching position must agree between the greedy loop and one teacher-forced forward."""
    seed = 5
    samples = needle_samples(heldout_tokens, [128, 512], [0.1, 0.9], samples=1, seed=seed)
    n_true = 0
    for i, s in enumerate(samples):
        seq = torch.from_numpy(s.prompt)[None]
        greedy = []
        for _ in range(len(s.answer)):
            nxt = tiny_mla(seq)[0, -1].argmax()
            greedy.append(int(nxt))
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
        greedy = np.array(greedy)
        k = (3 * i + 2) % len(greedy)
        changed = greedy.copy()
        changed[k] = (changed[k] + 1) % 256
        for ans in (s.answer, greedy, changed):
            x = torch.from_numpy(np.concatenate([s.prompt, ans[:-1]]))[None]
            logits = tiny_mla(x)
            tf = bool(teacher_forced_success(logits, ans[None])[0])
            pred_tf = logits[0, len(s.prompt) - 1 :].argmax(-1).numpy()
            assert tf == np.array_equal(greedy, ans), (seed, s.length, s.depth, greedy, ans)
            assert _first_miss(greedy, ans) == _first_miss(pred_tf, ans), (seed, s.length, s.depth, greedy, pred_tf)
            n_true += tf
        assert _first_miss(greedy, changed) == k
    assert n_true >= len(samples)  # every greedy continuation at least
