"""Free-running greedy generation with a quantized latent cache (latentq.e2e_generate) and the e2e step's
/generation group (latentq.e2e_generation).

The claim of the engine: prefill + one token per step, each MLA layer attending over its stored latent history
read per the decode-order model, is the teacher-forced decode-order forward (latentq.inject.DecodeOrderAttention,
one causal forward over prompt + continuation) when the same tokens are fed, for every causal spec. Checked on the
trained tiny-mla in float64: in float32 the latents of one token computed in a single-token forward and in the
full forward differ by GEMM rounding (~1e-7 relative), which can move a value across a rounding boundary of the
quantizer (one fp8 code: 6e-4 in the logits); in float64 both paths give the same float32 latents.
"""

import hashlib
import json
import os
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "data", "tiny-mla")

import latentq  # noqa: E402
import latentq._core  # noqa: E402, F401  (the compiled module: its absence is an error)
from latentq import e2e as e2e_step  # noqa: E402
from latentq import tiny_mla  # noqa: E402
from latentq.e2e_decode import make_decode_cache  # noqa: E402
from latentq.e2e_generate import CacheRun, greedy_continue, teacher_forced_logits  # noqa: E402
from latentq.e2e_generation import (  # noqa: E402
    GENERATION_COLUMNS,
    divergence,
    generation_table,
    kl_per_position,
    mean_and_interval,
)
from latentq.inject import DecodeOrderAttention  # noqa: E402
from latentq.model import run_model  # noqa: E402

P, N, NP = 20, 12, 3  # prompt length, new tokens, prompts
TEXT = (b"And God said, Let there be light: and there was light. And God saw the light, that it was good. " * 4)[
    : NP * P
]


@pytest.fixture(scope="module")
def model64():
    torch.manual_seed(0)
    return tiny_mla.TinyMLAForCausalLM.from_pretrained(MODEL).double()


def prompts():
    return torch.tensor(list(TEXT), dtype=torch.int64).reshape(NP, P)


def teacher_forced(model, spec, mode, ids):
    """Logits [n, T, V] of the one-forward decode-order run over ids [n, T] (the e2e step's path)."""
    with torch.no_grad(), DecodeOrderAttention(model, make_decode_cache(latentq, spec, ("c_kv", "k_pe"), None, mode)):
        return run_model(model, ids).float()


# causal specs: per-channel token groups with a sink and a residual (prompt = the prefill P), per-token integer,
# the fp8 engine presets (FlashMLA's V3.2 record, vLLM's fp8_ds_mla), an fp8 tile format behind a rotation,
# TurboQuant's per-token codebook, ggml's q4_0 read quantized at once, a sink longer than the prompt
CAUSAL = [
    ("int4-asym-channel-g32", f"decode-r8-s2-p{P}"),
    ("int4-asym-channel-g4", "decode-r1-s0-p0"),
    ("int8-sym-token", "decode-r0-s0-p0"),
    ("flashmla-v32-fp8", f"decode-r0-s0-p{P}"),
    ("vllm-fp8-ds-mla", "decode-r0-s0-p0"),
    ("had,fp8-e4m3-tile64-pow2", "decode-r4-s1-p0"),
    ("tq3-nc", "decode-r0-s0-p0"),
    ("q4_0", "prefill-at-once"),
    ("int4-asym-channel-g8", "decode-r1-s26-p0"),
]


@pytest.mark.parametrize("spec,mode", CAUSAL)
def test_incremental_equals_teacher_forced(model64, spec, mode):
    """Free-running greedy under the spec, then its own tokens fed back (forced) and, separately, the exact
    reference's tokens forced: each time the per-step logits are those of the teacher-forced forward over
    prompt + those tokens at positions P-1 .. P+N-2, to float tolerance, and the free run's tokens are the
    argmax of its own teacher-forced logits."""
    assert latentq.decode_scale_is_causal(spec.split(",")[-1])
    run = CacheRun(spec, ("c_kv", "k_pe"), mode)
    ids = prompts()
    toks, logits = greedy_continue(model64, latentq, [None, run], ids, N, return_logits=True)
    assert toks.shape == (2, NP, N) and logits.shape == (2, NP, N, 256)
    for k, spec_k in ((0, None), (1, spec)):
        full = torch.cat([ids, toks[k]], 1)
        if spec_k is None:
            with torch.no_grad():
                tf = model64(full).float()
        else:
            tf = teacher_forced(model64, spec, mode, full)
        tf = tf[:, P - 1 : P - 1 + N]
        err = (logits[k] - tf).abs().max().item()
        print(f"{spec} {mode} run {k}: max |logit diff| {err:.3g}, shape {tuple(tf.shape)}")
        assert err < 1e-5, (spec, mode, k, err)
        assert torch.equal(tf.argmax(-1), toks[k])
    forced = teacher_forced_logits(model64, latentq, [run], ids, toks[0])[0]
    tf = teacher_forced(model64, spec, mode, torch.cat([ids, toks[0]], 1))[:, P - 1 : P - 1 + N]
    assert (forced - tf).abs().max().item() < 1e-5


def build_hf(kind: str):
    """A random-init HF DeepseekV2 (eager attention) or DeepseekV3 (sdpa, q_lora, interleaved RoPE) in float64,
    dense MLP, as tests/python/test_e2e_decode.py builds them."""
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

    common = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        max_position_embeddings=640,
        first_k_dense_replace=2,
    )
    torch.manual_seed(7)
    if kind == "v2":
        m = DeepseekV2ForCausalLM(DeepseekV2Config(q_lora_rank=None, attn_implementation="eager", **common))
    else:
        m = DeepseekV3ForCausalLM(
            DeepseekV3Config(q_lora_rank=24, rope_interleave=True, attn_implementation="sdpa", **common)
        )
    for n, p in m.named_parameters():
        if p.dim() == 2 and "norm" not in n:
            torch.nn.init.normal_(p, std=0.25)
    return m.eval().double()


@pytest.mark.parametrize("kind", ["v2", "v3"])
def test_incremental_equals_teacher_forced_hf(kind):
    """The same claim on HF checkpoints' own modules: position_ids give RoPE at the true positions (no HF cache).
    Relative tolerance: the exact run's teacher-forced reference is HF's own eager attention, whose softmax runs in
    float32 (3e-7 of the largest logit here); the quantized runs compare two float64 paths."""
    model = build_hf(kind)
    spec, mode = "int4-asym-channel-g8", "decode-r4-s1-p0"
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(3))
    run = CacheRun(spec, ("c_kv", "k_pe"), mode)
    toks, logits = greedy_continue(model, latentq, [None, run], ids, 10, return_logits=True)
    for k in (0, 1):
        full = torch.cat([ids, toks[k]], 1)
        if k == 0:
            with torch.no_grad():
                tf = run_model(model, full).float()
        else:
            tf = teacher_forced(model, spec, mode, full)
        tf = tf[:, 11:21]
        err = ((logits[k] - tf).abs().max() / tf.abs().max()).item()
        print(f"HF {kind} run {k}: max |logit diff| / max |logit| {err:.3g}, shape {tuple(tf.shape)}")
        assert err < 1e-6 and torch.equal(tf.argmax(-1), toks[k])


def test_non_causal_recomputed_on_history(model64):
    """A per-tensor scale is recomputed on the history at every step: the first generated position (the prefill's
    last query) sees the scale of the prompt alone, so its logits are the teacher-forced run over the prompt; the
    teacher-forced run over prompt + continuation (its scale spanning the whole sequence) differs from the
    incremental logits there by more than float tolerance."""
    spec, mode = "int4-sym-tensor", "decode-r0-s0-p0"
    assert not latentq.decode_scale_is_causal(spec)
    ids = prompts()
    toks, logits = greedy_continue(model64, latentq, [CacheRun(spec, ("c_kv",), mode)], ids, N, return_logits=True)
    with torch.no_grad(), DecodeOrderAttention(model64, make_decode_cache(latentq, spec, ("c_kv",), None, mode)):
        prompt_only = model64(ids).float()[:, -1]
        whole = model64(torch.cat([ids, toks[0]], 1)).float()[:, P - 1]
    err, diff = (logits[0, :, 0] - prompt_only).abs().max().item(), (logits[0, :, 0] - whole).abs().max().item()
    print(f"{spec}: prefill's last logits vs the prompt's run {err:.3g}, vs the whole sequence's {diff:.3g}")
    assert err < 1e-5 and diff > 1e-3


def test_forced_shapes_and_errors(model64):
    ids = prompts()
    with pytest.raises(ValueError, match="expected \\[3, 4\\]"):
        greedy_continue(model64, latentq, [None], ids, 4, forced=torch.zeros(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="new_tokens 0"):
        greedy_continue(model64, latentq, [None], ids, 0)
    forced = torch.arange(NP * 4).reshape(NP, 4) % 256
    toks = greedy_continue(model64, latentq, [None, None], ids, 4, forced=[None, forced])
    assert torch.equal(toks[1], forced)
    free = greedy_continue(model64, latentq, [None], ids, 4)
    assert torch.equal(toks[0], free[0])  # the free row is unchanged by the forced one beside it


# ---- the /generation statistics and the e2e step's group -----------------------------------------------------


def test_divergence_by_hand():
    """first divergence and identical fraction of hand-built token arrays, and their bootstrap bounds."""
    ref = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [5, 5, 5, 5]])
    run = torch.tensor([[1, 2, 9, 4], [1, 2, 3, 4], [6, 5, 5, 5]])
    first, identical = divergence(ref, run)
    assert first.tolist() == [2, 4, 0]  # position 2; none: N = 4; position 0
    assert identical.tolist() == [0.75, 1.0, 0.75]
    counts = np.array([[3, 0, 0], [0, 3, 0], [1, 1, 1]])  # resampled means 2, 4, 2
    m, lo, hi = mean_and_interval(first.astype(np.float64), counts)
    assert m == 2.0 and lo == 2.0 and hi == pytest.approx(3.9)  # numpy linear percentiles of [2, 2, 4]
    m1, lo1, hi1 = mean_and_interval(np.array([3.0]), counts[:, :1])
    assert m1 == 3.0 and np.isnan(lo1) and np.isnan(hi1)  # one prompt: no interval
    with pytest.raises(ValueError, match="shapes"):
        divergence(ref, run[:2])


def test_kl_by_hand():
    """KL(p||q) of p = (1/2, 1/2), q = (1/4, 3/4): ½ ln(4/3); 0 for equal logits."""
    ref = torch.zeros(1, 2, 2)
    q = torch.tensor([[[0.0, np.log(3.0)], [0.0, 0.0]]])
    kl = kl_per_position(ref, q)
    assert kl.shape == (1, 2)
    assert kl[0, 0] == pytest.approx(0.5 * np.log(4 / 3), rel=1e-12) and kl[0, 1] == 0.0


def test_reference_row_has_no_divergence(model64):
    """A run whose cache holds every target exactly (targets ()) is the reference itself: first divergence N,
    identical fraction 1, KL 0 (float tolerance: its rows share a batch with the forced rows), in the table's
    own path (generation_table)."""
    runner = SimpleNamespace(
        latentq=latentq,
        model=model64,
        layer_set=frozenset(range(6)),
        bases=None,
        dims={"kv_lora_rank": 128, "qk_rope_head_dim": 32},
        resolve=lambda q: q,
    )
    runs = [("bf16", (), "prefill-at-once"), ("int2-sym-token", ("c_kv", "k_pe"), "decode-r0-s0-p0")]
    t = generation_table(runner, runs, prompts(), N, 2)
    print({k: v.tolist() for k, v in t.items()})
    assert t["first_divergence_mean"][0] == N and t["identical_fraction"][0] == 1.0
    assert 0.0 <= t["kl_mean"][0] < 1e-9
    assert t["first_divergence_ci_lo"][0] == N and t["identical_fraction_ci_hi"][0] == 1.0
    assert t["bytes_per_token"][0] == 2 * (128 + 32)  # nothing quantized: bf16 both targets
    assert t["kl_mean"][1] > 1e-3 and t["identical_fraction"][1] < 1.0  # int2 on both targets moves the tokens


def _results(path):
    """A results file with bf16 and int8-sym-token studied on c_kv and k_pe (as tests/python/test_e2e.py)."""
    with h5py.File(path, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        g = f.create_group("latent_error")
        s = h5py.string_dtype("utf-8")
        q = ["bf16", "bf16", "int2-sym-token", "int2-sym-token"]
        g.create_dataset("quantizer", data=np.array(q, dtype=object), dtype=s)
        g.create_dataset("target", data=np.array(["c_kv", "k_pe"] * 2, dtype=object), dtype=s)
        g.create_dataset("rel_fro", data=np.array([0.001, 0.001, 0.3, 0.3]))


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _step_args(res, text):
    return ["--results", str(res), "--text", str(text), "--offset-bytes", "0", "--seq-len", "64"]


def test_cli_writes_generation(tmp_path):
    """python -m latentq.e2e --generation: /generation has one row per /e2e run in its order, the column record,
    the prompt attributes, and the values of the engine run here on the same prompts (the bf16 row recomputed by
    hand from greedy_continue)."""
    from latentq import e2e as e2e_step

    text = tmp_path / "text.txt"
    text.write_bytes((b"In the beginning God created the heaven and the earth. " * 20)[:1024])
    res = tmp_path / "r.h5"
    _results(res)
    n, p, new = 2, 16, 6
    argv = _step_args(res, text) + ["--num-seqs", "2", "--threads", "1", "--quiet", "--cache-modes"]
    argv += ["prefill-at-once", "decode-r0-s0-p16", "--generation", "--gen-prompts", str(n)]
    argv += ["--gen-prompt-len", str(p), "--gen-new-tokens", str(new)]
    assert e2e_step.main(argv) == 0
    with h5py.File(res, "r") as f:
        e2e = [
            (q.decode(), t.decode(), m.decode())
            for q, t, m in zip(*(f["e2e"][c][:] for c in ("quantizer", "targets", "cache_mode")))
        ]
        g = f["generation"]
        rows = [
            (q.decode(), t.decode(), m.decode())
            for q, t, m in zip(*(g[c][:] for c in ("quantizer", "targets", "cache_mode")))
        ]
        vals = {c: g[c][:] for c in g}
        attrs = dict(g.attrs)
    print(rows, {k: v.tolist() for k, v in vals.items() if k not in ("quantizer", "targets", "cache_mode")})
    assert rows == e2e and len(rows) == 4
    assert [c["name"] for c in json.loads(attrs["columns"])] == sorted(c.name for c in GENERATION_COLUMNS)
    assert (attrs["num_prompts"], attrs["prompt_len"], attrs["new_tokens"]) == (n, p, new)
    assert attrs["bootstrap_resamples"] == 2000 and "16916" in attrs["definition"]
    # the bf16 prefill-at-once row, recomputed: prompts = the text's first n windows of p bytes
    model = tiny_mla.TinyMLAForCausalLM.from_pretrained(MODEL)
    ids = torch.tensor(list(text.read_bytes()[: n * p])).reshape(n, p)
    ref_tok, ref_lg = greedy_continue(model, latentq, [None], ids, new, return_logits=True)
    run = CacheRun("bf16", ("c_kv", "k_pe"), "prefill-at-once")
    tok = greedy_continue(model, latentq, [run], ids, new)[0]
    lq = greedy_continue(model, latentq, [run], ids, new, forced=ref_tok[0], return_logits=True)[1][0]
    first, identical = divergence(ref_tok[0], tok)
    i = rows.index(("bf16", "c_kv+k_pe", "prefill-at-once"))
    assert vals["first_divergence_mean"][i] == first.mean() and vals["identical_fraction"][i] == identical.mean()
    assert vals["kl_mean"][i] == pytest.approx(kl_per_position(ref_lg[0], lq).mean(), rel=1e-3, abs=1e-9)
    for c in ("first_divergence", "identical_fraction", "kl_mean"):
        mean = vals[c + ("_mean" if c == "first_divergence" else "")]
        assert np.all(vals[c + "_ci_lo"] <= mean + 1e-12) and np.all(mean <= vals[c + "_ci_hi"] + 1e-12)
    assert np.all((vals["first_divergence_mean"] >= 0) & (vals["first_divergence_mean"] <= new))
    assert vals["scale_causal"].tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--gen-new-tokens", "0"], "--gen-new-tokens 0: must be >= 1"),
        (["--gen-prompts", "0"], "--gen-prompts 0: must be >= 1"),
        (["--gen-prompt-len", "1000", "--gen-new-tokens", "100"], "exceeds max_position_embeddings 1024"),
        (["--gen-prompts", "40", "--gen-prompt-len", "64"], "--generation prompts (40 x 64)"),
    ],
)
def test_cli_bad_generation_flags(tmp_path, capsys, flags, needle):
    """A bad --gen-* value: exit 2 with one error line naming it, the results file unchanged."""
    text = tmp_path / "text.txt"
    text.write_bytes((b"In the beginning God created the heaven and the earth. " * 20)[:1024])
    res = tmp_path / "r.h5"
    _results(res)
    before = _sha(res)
    assert e2e_step.main(_step_args(res, text) + ["--num-seqs", "2", "--generation"] + flags) == 2
    err = capsys.readouterr().err
    print(err)
    assert needle in err and "latentq e2e: error:" in err
    assert _sha(res) == before


def test_generation_auto_notes_what_it_cannot_run(tmp_path, capsys):
    """`--generation auto` (what `latentq study` passes unless its config sets generation): prompts the text cannot
    hold give one note and no /generation group, and /e2e is written; the same with plain --generation: exit 2."""
    text = tmp_path / "text.txt"
    text.write_bytes((b"In the beginning God created the heaven and the earth. " * 20)[:1024])
    res = tmp_path / "r.h5"
    _results(res)
    flags = ["--gen-prompts", "40", "--gen-prompt-len", "64"]
    argv = _step_args(res, text) + ["--num-seqs", "2", "--quiet", "--cache-modes", "prefill-at-once"]
    assert e2e_step.main(argv + ["--generation", "auto"] + flags) == 0
    err = capsys.readouterr().err
    assert "latentq e2e: note: --generation: no /generation group: --generation prompts (40 x 64)" in err, err
    with h5py.File(res, "r") as f:
        assert "e2e" in f and "generation" not in f
    assert e2e_step.main(argv + ["--generation"] + flags) == 2
