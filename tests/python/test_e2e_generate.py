"""Free-running greedy generation with a quantized latent cache (latentq.e2e_generate) and the e2e step's
/generation group (latentq.e2e_generation).

The claim of the engine: prefill + one token per step, each MLA layer attending over its stored latent history
read per the decode-order model, is the teacher-forced decode-order forward (latentq.inject.DecodeOrderAttention,
one causal forward over prompt + continuation) when the same tokens are fed, for every causal spec. Checked on the
trained tiny-mla in float64: in float32 the latents of one token computed in a single-token forward and in the
full forward differ by GEMM rounding (~1e-7 relative), which can move a value across a rounding boundary of the
quantizer (one fp8 code: 6e-4 in the logits); in float64 both paths give the same float32 latents.
"""

import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "data", "tiny-mla")

import latentq  # noqa: E402
import latentq._core  # noqa: E402, F401  (the compiled module: its absence is an error)
from latentq import tiny_mla  # noqa: E402
from latentq.e2e_decode import make_decode_cache  # noqa: E402
from latentq.e2e_generate import CacheRun, greedy_continue, teacher_forced_logits  # noqa: E402
from latentq.inject import DecodeOrderAttention  # noqa: E402

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
        return model(ids).float()


# causal specs: per-channel token groups with a sink and a residual (prompt = the prefill P), per-token integer,
# the fp8 engine presets (FlashMLA's V3.2 record, vLLM's fp8_ds_mla), an fp8 tile format behind a rotation
CAUSAL = [
    ("int4-asym-channel-g32", f"decode-r8-s2-p{P}"),
    ("int4-asym-channel-g4", "decode-r1-s0-p0"),
    ("int8-sym-token", "decode-r0-s0-p0"),
    ("flashmla-v32-fp8", f"decode-r0-s0-p{P}"),
    ("vllm-fp8-ds-mla", "decode-r0-s0-p0"),
    ("had,fp8-e4m3-tile64-pow2", "decode-r4-s1-p0"),
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
