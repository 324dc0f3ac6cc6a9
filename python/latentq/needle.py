"""Needle (copy) samples built from a text: the one definition the retrieval checks use (latentq.e2e_retrieval, the
copy model's validation in data/train_copy_mla.py and its tests).

A needle sample is a context of ``length`` tokens cut from the text, with a *needle* of ``span`` tokens
(cut from elsewhere in the same text, not overlapping the context) written over the context at token
``needle_at = round(depth * (length - span))``, followed by a *cue*: the needle's first ``cue`` tokens.
The model succeeds when its greedy continuation of the prompt (context + cue) reproduces the needle's
remaining ``span - cue`` tokens (the *answer*). The cue occurs exactly once in the context, so the
answer is determined by the context and cannot be told apart from the text by any other occurrence.

This is the needle-in-a-haystack test (G. Kamradt, 2023, github.com/gkamradt/LLMTest_NeedleInAHaystack:
a fact inserted at a set of depths in contexts of a set of lengths, then asked for) with the haystack and
the needle both cut from the user's own text, and the passkey retrieval test (A. Mohtashami and M. Jaggi,
"Landmark Attention: Random-Access Infinite Context Length for Transformers", 2023, arXiv:2305.16300:
the model continues a cue with the item hidden in the context) in its exact-match form.

Since the model is causal, its greedy continuation equals the answer iff at every answer position the
argmax of the logits of one teacher-forced forward of ``prompt + answer[:-1]`` equals the answer token
(induction on the answer position: while the greedy tokens so far equal the answer, the greedy input is
the teacher-forced input). :func:`teacher_forced_success` evaluates that from one forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: context lengths (tokens) of the default needle grid
DEFAULT_LENGTHS: tuple[int, ...] = (128, 256, 512)
#: depths (fraction of ``length - span``) at which the needle is inserted
DEFAULT_DEPTHS: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
#: needle length in tokens (cue + answer)
DEFAULT_SPAN = 24
#: cue length in tokens (the needle's first tokens, appended to the context)
DEFAULT_CUE = 8
#: needles drawn per sample before giving up on one whose cue is unique in the context
MAX_TRIES = 100


@dataclass(frozen=True)
class NeedleSample:
    """One needle sample.

    prompt: int64 ``[length + cue]`` — the context (needle written over it at ``needle_at``), then the cue.
    answer: int64 ``[span - cue]`` — the needle's tokens after the cue, which a retrieving model continues with.
    length: context length in tokens; depth: the requested depth in [0, 1];
    needle_at: token index of the needle's first token in the context, ``round(depth * (length - span))`` (Python's
    round: half to even, 0.5 * 7 -> 4, 0.25 * 10 -> 2).
    """

    prompt: np.ndarray
    answer: np.ndarray
    length: int
    depth: float
    needle_at: int


def _count(context: np.ndarray, cue: np.ndarray) -> int:
    """Occurrences of ``cue`` (any overlap) in ``context``; both 1-D int64."""
    if len(cue) > len(context):
        return 0
    win = np.lib.stride_tricks.sliding_window_view(context, len(cue))
    return int(np.all(win == cue, axis=1).sum())


def _sample(tokens: np.ndarray, length: int, depth: float, span: int, cue: int, rng: np.random.Generator):
    n = len(tokens)
    c0 = int(rng.integers(0, n - length + 1))
    at = int(round(depth * (length - span)))
    # needle starts n0 with [n0, n0 + span) disjoint from [c0, c0 + length): n0 <= c0 - span or n0 >= c0 + length
    before = max(0, c0 - span + 1)
    after = max(0, n - span + 1 - (c0 + length))
    for _ in range(MAX_TRIES):
        r = int(rng.integers(0, before + after))
        n0 = r if r < before else c0 + length + (r - before)
        needle = tokens[n0 : n0 + span]
        context = tokens[c0 : c0 + length].copy()
        context[at : at + span] = needle
        if _count(context, needle[:cue]) == 1:
            prompt = np.concatenate([context, needle[:cue]])
            return NeedleSample(prompt, needle[cue:].copy(), length, depth, at)
    raise ValueError(
        f"needle_samples: no needle of {span} tokens whose first {cue} tokens occur exactly once in the "
        f"context of length {length} at depth {depth} after {MAX_TRIES} draws (text of {n} tokens); "
        f"expected a text with less repetition or a longer cue"
    )


def needle_samples(
    tokens: np.ndarray,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    depths: Sequence[float] = DEFAULT_DEPTHS,
    span: int = DEFAULT_SPAN,
    cue: int = DEFAULT_CUE,
    samples: int = 1,
    seed: int = 0,
) -> list[NeedleSample]:
    """Needle samples for every (length, depth) pair, ``samples`` of each.

    tokens: the text as token ids, 1-D integer array (int64 or any integer dtype; bytes for a byte-level model).
    lengths: context lengths in tokens, each >= span; depths: fractions in [0, 1];
    span: needle length in tokens, > cue; cue: cue length in tokens, >= 1; samples: per pair, >= 1.
    Returns a list ordered by length, then depth, then sample index (``len(lengths) * len(depths) * samples``).

    Each sample draws from its own generator seeded by (seed, length, depth, index), so a sample does not
    change when other lengths, depths or counts are asked for. The context offset is drawn uniformly; the
    needle's offset is drawn uniformly among those whose span does not overlap the context, and redrawn
    (up to MAX_TRIES times, deterministically) until its cue occurs exactly once in the context.
    Raises ValueError naming the offending argument when the arguments are out of range or the text is
    shorter than ``length + 2 * span`` tokens, and naming the length and depth when no needle qualifies.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"needle_samples: tokens has shape {tokens.shape} dtype {tokens.dtype}; expected 1-D integer")
    tokens = tokens.astype(np.int64, copy=False)
    if not 1 <= cue < span:
        raise ValueError(f"needle_samples: cue={cue}, span={span}; expected 1 <= cue < span")
    if samples < 1:
        raise ValueError(f"needle_samples: samples={samples}; expected >= 1")
    for length in lengths:
        if length < span:
            raise ValueError(f"needle_samples: length {length} is shorter than span {span}")
        if len(tokens) < length + 2 * span:
            raise ValueError(
                f"needle_samples: text of {len(tokens)} tokens; length {length} needs >= {length + 2 * span} "
                f"(a context, and room for a needle outside it wherever the context falls)"
            )
    for depth in depths:
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"needle_samples: depth {depth}; expected a fraction in [0, 1]")
    out = []
    for length in lengths:
        for depth in depths:
            for i in range(samples):
                rng = np.random.default_rng([seed, int(length), int(round(depth * 1_000_000)), i])
                out.append(_sample(tokens, int(length), float(depth), span, cue, rng))
    return out


def teacher_forced_success(logits, answers) -> np.ndarray:
    """Whether greedy decoding of each prompt would reproduce its answer, from one teacher-forced forward.

    logits: ``[B, P + A - 1, V]`` float (numpy or CPU torch), the model's logits on ``prompt + answer[:-1]``
    (P prompt tokens, A answer tokens); answers: ``[B, A]`` integer.
    Returns bool ``[B]``: True where ``argmax(logits[b, P - 1 + k]) == answers[b, k]`` for every k < A.
    Raises ValueError if the shapes do not fit (3-D logits, 2-D answers, equal B, A <= logits' length).
    Ties break to the lowest token id (numpy's argmax, as torch.argmax on CPU).
    """
    logits = logits.detach().cpu().numpy() if hasattr(logits, "detach") else np.asarray(logits)
    answers = answers.detach().cpu().numpy() if hasattr(answers, "detach") else np.asarray(answers)
    if logits.ndim != 3 or answers.ndim != 2 or logits.shape[0] != answers.shape[0]:
        raise ValueError(
            f"teacher_forced_success: logits {logits.shape}, answers {answers.shape}; expected [B, P + A - 1, V] "
            f"and [B, A]"
        )
    a = answers.shape[1]
    if a < 1 or a > logits.shape[1]:
        raise ValueError(f"teacher_forced_success: {a} answer tokens for logits of {logits.shape[1]} positions")
    pred = logits[:, logits.shape[1] - a :].argmax(-1)
    return np.all(pred == answers, axis=1)
