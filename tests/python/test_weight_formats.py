"""Quantized weight formats (latentq.weight_formats), decoded on load by latentq.stream, in memory and
streamed, offline.

The decoders against code we did not write, at block edges and partial words:
- compressed-tensors ``pack-quantized`` (INT4 / INT8, symmetric and asymmetric, group and channel)
  and ``float-quantized`` (FP8 tensor, channel, block with partial edge blocks): the package's own
  compressors write the tensors and its own decompressors are the reference, bit for bit (given a
  float32 scale the library computes in float32; given a bf16 scale it computes in bf16, which our
  float32 product cast to bf16 equals: one rounding of the same exact product);
- ModelOpt NVFP4: an independent numpy decoder of the bytes (ml_dtypes' float4_e2m1fn for the
  nibbles, the float32 product order of ModelOpt's ``NVFP4QTensor.dequantize``), and
  compressed-tensors' ``unpack_fp4_from_uint8`` for the nibble order; ModelOpt FP8: the library's
  float-quantized decompressor with a tensor / channel scale.

Three random-init DeepSeek-V3-architecture replicas (latentq.random_checkpoint; hidden 192, 3
layers, 4 routed + 1 shared expert) written as each family ships, in 3 safetensors shards with a
layer split across two:
- ``kimi``: Kimi-K2-Thinking: the routed experts INT4 pack-quantized, symmetric, group 32, bf16
  scales (compressed-tensors' compressor), everything else bf16, the ignore list as shipped;
- ``mistral``: Mistral-Large-3: every decoder-layer projection float-quantized FP8 with 128 × 128
  blocks (partial edge blocks: 192 = 1.5 blocks) and a bf16 ``weight_scale``;
- ``nvfp4``: DeepSeek-R1-FP4: the MLP weights NVFP4 (ModelOpt's recipe: ``weight_scale_2`` =
  amax / (6 · 448), e4m3 ``weight_scale`` per 16, ``input_scale``), the attention excluded,
  recognised from ``hf_quant_config.json``.
Each has a float32 reference checkpoint of the dequantized weights (compressed-tensors'
decompressor with a float32 scale, the numpy NVFP4 decoder), loaded by transformers'
from_pretrained. latentq's load equals it bit for bit (state dicts, float32 and bf16), and
``python -m latentq.dump`` in memory and streamed gives c_kv and k_pe within 1e-5 relative of the
reference's dump (the same weights and arithmetic: measured 0).
"""

import json
import os

import numpy as np
import pytest
import torch
from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs
from compressed_tensors.utils.match import match_name

from dump_checks import check_schema, checkpoint_layout, rel
from latentq import dump as dump_latents
from latentq import stream
from latentq import weight_formats as wf
from replicas import (
    KIMI_QC,
    MISTRAL_QC,
    NUM_SEQS,
    NVFP4_HQ,
    Q_ROWS,
    SEQ_LEN,
    build_replicas,
    ct_decompress,
    ct_float,
    ct_pack,
    numpy_nvfp4,
    nvfp4_quantize,
)

# ---- the decoders ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("strategy", ["group", "channel"])
def test_pack_quantized_equals_compressed_tensors(bits, symmetric, strategy):
    """13 rows (asymmetric zero points: 13 · bits / 32 words, the last partly used), 96 columns in
    groups of 32, or 37 channel-wise columns (the last int32 word of a row partly used)."""
    seed = bits * 10 + symmetric * 2 + (strategy == "group")
    g = torch.Generator().manual_seed(seed)
    N = 96 if strategy == "group" else 37
    w = (torch.randn(13, N, generator=g) * 0.1 + (0 if symmetric else 0.05)).to(torch.bfloat16)
    args = QuantizationArgs(
        num_bits=bits,
        type="int",
        symmetric=symmetric,
        strategy=strategy,
        group_size=32 if strategy == "group" else None,
    )
    parts = ct_pack(w, args)
    assert parts["weight_packed"].shape == (13, -(-N * bits // 32)), parts["weight_packed"].shape
    assert ("weight_zero_point" in parts) == (not symmetric)
    a = args.model_dump()
    mine = wf.decode_ct_pack_quantized(parts, a, torch.float32)
    ref = ct_decompress(PackedQuantizationCompressor, parts, args)
    assert ref.dtype == torch.float32 and torch.equal(mine, ref), (seed, bits, symmetric, strategy)
    ref16 = ct_decompress(PackedQuantizationCompressor, parts, args, torch.bfloat16)
    assert torch.equal(wf.decode_ct_pack_quantized(parts, a, torch.bfloat16), ref16), seed
    step = parts["weight_scale"].float().abs().max()
    assert float((mine - w.float()).abs().max()) <= float(step), seed  # within one step of the weight
    assert len(torch.unique(mine)) > 2 ** (bits - 1), seed  # the codes are spread


@pytest.mark.parametrize("strategy", ["tensor", "channel", "block"])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_float_quantized_equals_compressed_tensors(strategy, scale_dtype):
    """FP8 e4m3 [200, 300]: with 128 × 128 blocks the last block row (72) and column (44) are partial."""
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(200, 300, generator=g) * 0.05).to(torch.bfloat16)
    args = QuantizationArgs(
        num_bits=8, type="float", strategy=strategy, block_structure=[128, 128] if strategy == "block" else None
    )
    parts = ct_float(w, args, scale_dtype)
    assert parts["weight"].dtype == torch.float8_e4m3fn
    if strategy == "block":
        assert tuple(parts["weight_scale"].shape) == (2, 3)
    a = args.model_dump()
    for dt in (torch.float32, torch.bfloat16):
        mine = wf.decode_ct_float_quantized(parts, a, dt)
        ref = ct_decompress(FloatQuantizationCompressor, parts, args, scale_dtype if dt == torch.bfloat16 else dt)
        assert mine.dtype == dt and torch.equal(mine, ref.to(dt)), (strategy, scale_dtype, dt)
    assert rel(mine.float().numpy(), w.float().numpy()) < 0.07


def test_nvfp4_equals_numpy_decoder():
    """Every byte value (both nibbles over all 16 e2m1 codes), 5 groups of 16 a row, random e4m3
    scales and a float32 scale_2: our decoder equals the numpy one bit for bit, in float32 and
    rounded once to bf16; a scale grid of another shape and a column count that is not a multiple
    of the group are refused."""
    rng = np.random.default_rng(3)
    b = np.arange(7 * 40, dtype=np.int64).reshape(7, 40) % 256
    b = rng.permutation(b.reshape(-1)).reshape(7, 40).astype(np.uint8)
    sc = rng.integers(0x08, 0x7E, size=(7, 5), dtype=np.uint8)  # positive finite e4m3 codes
    parts = {
        "weight": torch.from_numpy(b),
        "weight_scale": torch.from_numpy(sc).view(torch.float8_e4m3fn),
        "weight_scale_2": torch.tensor(np.float32(rng.uniform(1e-4, 1e-2))),
    }
    want = numpy_nvfp4(parts)
    got = wf.decode_nvfp4(parts, {"group_size": 16}, torch.float32)
    np.testing.assert_array_equal(got.numpy(), want)
    assert torch.equal(wf.decode_nvfp4(parts, {"group_size": 16}, torch.bfloat16), torch.from_numpy(want).bfloat16())
    assert set(np.unique(b & 0x0F)) == set(np.unique(b >> 4)) == set(range(16))
    # the nibble order and e2m1 values against compressed-tensors' own unpacking (unit scales)
    ones = dict(parts, weight_scale=torch.ones(7, 5).to(torch.float8_e4m3fn), weight_scale_2=torch.tensor(1.0))
    ct_e2m1 = unpack_fp4_from_uint8(parts["weight"], 7, 80, dtype=torch.float32)
    assert torch.equal(wf.decode_nvfp4(ones, {"group_size": 16}, torch.float32), ct_e2m1)
    with pytest.raises(ValueError, match=r"needs a weight_scale of shape \(7, 5\)"):
        wf.decode_nvfp4(dict(parts, weight_scale=parts["weight_scale"][:, :4]), {"group_size": 16}, torch.float32)
    with pytest.raises(ValueError, match=r"needs a weight_scale"):
        wf.decode_nvfp4(dict(parts, weight=parts["weight"][:, :36]), {"group_size": 16}, torch.float32)


@pytest.mark.parametrize("per", ["tensor", "channel"])
def test_modelopt_fp8_equals_compressed_tensors(per):
    """ModelOpt FP8 (w = fp8 · weight_scale, per tensor as exported, or per output channel) is
    compressed-tensors' float-quantized arithmetic with that strategy: the library's decompressor
    with a float32 scale, bit for bit; a scalar ([]) per-tensor scale as ModelOpt writes it."""
    g = torch.Generator().manual_seed(9)
    w = (torch.randn(40, 72, generator=g) * 0.05).to(torch.bfloat16)
    args = QuantizationArgs(num_bits=8, type="float", strategy=per)
    parts = ct_float(w, args, torch.float32)
    ref = ct_decompress(FloatQuantizationCompressor, parts, args)
    scale = parts["weight_scale"].reshape(()) if per == "tensor" else parts["weight_scale"].reshape(-1)
    mine = wf.decode_modelopt_fp8({"weight": parts["weight"], "weight_scale": scale}, {}, torch.float32)
    assert torch.equal(mine, ref), per


def test_nvfp4_round_trip_of_modelopt_recipe():
    """The replica writer's NVFP4 bytes decode to within half an e2m1 step of the weight (relative to
    each block's scale): the recipe and the decoder agree on nibble order and scales."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(24, 64, generator=g) * 0.1
    parts = nvfp4_quantize(w)
    back = wf.decode_nvfp4(parts, {"group_size": 16}, torch.float32)
    per_block = parts["weight_scale"].float() * parts["weight_scale_2"]
    err = (back - w).abs().reshape(24, 4, 16) / per_block[..., None]
    assert float(err.max()) <= 1.0 + 1e-6 and rel(back.numpy(), w.numpy()) < 0.2


# ---- recognising the format ------------------------------------------------------------------------


def test_detect_and_plan(tmp_path):
    """The table's recognition: each config as shipped, the ignore / exclude lists (compressed-tensors'
    re: patterns as its own match_name reads them), the refusals naming what is not supported."""
    names = [
        "model.layers.1.self_attn.q_a_proj",
        "model.layers.1.mlp.experts.3.down_proj",
        "model.layers.1.mlp.shared_experts.up_proj",
        "model.layers.0.mlp.gate_proj",
        "model.layers.1.mlp.gate",
        "lm_head",
    ]
    q = wf.detect(str(tmp_path), {"quantization_config": KIMI_QC})
    assert q.keys == ("ct-pack-quantized",) and q.original_dtype == "int4"
    for n in names:
        assert q.ignored(n) == any(match_name(n, t) for t in KIMI_QC["ignore"]), n
    assert [q.ignored(n) for n in names] == [True, False, True, True, False, True]
    stored = ["model.layers.1.mlp.experts.3.down_proj." + s for s in ("weight_packed", "weight_scale", "weight_shape")]
    stored += ["model.layers.1.mlp.shared_experts.up_proj.weight"]
    plan = q.plan(stored)
    assert list(plan) == ["model.layers.1.mlp.experts.3.down_proj.weight"]
    assert plan["model.layers.1.mlp.experts.3.down_proj.weight"].args["group_size"] == 32
    with pytest.raises(ValueError, match=r"shared_experts.up_proj stores quantized tensors .* ignores it"):
        q.plan(["model.layers.1.mlp.shared_experts.up_proj.weight_packed"])
    with pytest.raises(ValueError, match=r"has no model.layers.1.mlp.experts.3.down_proj.weight_shape"):
        q.plan(stored[:2])
    m = wf.detect(str(tmp_path), {"quantization_config": MISTRAL_QC})
    assert (
        m.keys == ("ct-float-quantized",)
        and m.original_dtype == "float8_e4m3fn"
        and m.ignored("model.layers.2.mlp.gate")
    )
    assert wf.detect(str(tmp_path), {}) is None
    (tmp_path / wf.HF_QUANT_NAME).write_text(json.dumps(NVFP4_HQ))
    n = wf.detect(str(tmp_path), {})
    assert n.keys == ("modelopt-nvfp4",) and n.original_dtype == "nvfp4"
    assert n.ignored("model.layers.4.self_attn.kv_b_proj") and not n.ignored("model.layers.4.mlp.experts.1.up_proj")
    with pytest.raises(ValueError, match=r"self_attn.kv_b_proj stores quantized tensors"):
        n.plan(["model.layers.4.self_attn.kv_b_proj." + s for s in ("weight", "weight_scale", "weight_scale_2")])
    modelopt_qc = {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]}
    assert wf.detect(str(tmp_path), {"quantization_config": modelopt_qc}).keys == ("modelopt-fp8",)
    bad = [
        ({"quant_method": "awq", "bits": 4}, r"quant_method 'awq' is not supported"),
        (dict(KIMI_QC, format="marlin-24"), r"format 'marlin-24' .* not supported"),
        ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, r"quant_algo 'W4A8_AWQ' is not supported"),
    ]
    for qc, msg in bad:
        with pytest.raises(ValueError, match=msg):
            wf.detect(str(tmp_path), {"quantization_config": qc})


# ---- the replicas -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    return build_replicas(tmp_path_factory.mktemp("wf"))


FAMILIES = ["kimi", "mistral", "nvfp4"]  # the instruct replica (DeepSeek FP8) is test_study_checkpoints'
MARKERS = {"kimi": "weight_packed", "mistral": "weight_scale", "nvfp4": "weight_scale_2"}


@pytest.mark.parametrize("name", FAMILIES)
def test_replica_is_shipped_as_the_family_does(replicas, name):
    """3 shards, a layer split across two, the quantized tensors where the family has them, a few MB;
    the Checkpoint sees each quantized module as one ``weight``."""
    paths, _ = replicas
    d = paths[name]
    wm, layers = checkpoint_layout(d)
    assert len(set(wm.values())) == 3 and any(len(v) == 2 for v in layers.values()), layers
    size = sum(os.path.getsize(os.path.join(d, fn)) for fn in set(wm.values()))
    assert size < 4 << 20, size
    marked = {k.rsplit(".", 1)[0] for k in wm if k.endswith("." + MARKERS[name])}
    if name == "kimi":
        assert len(marked) == 2 * 4 * 3 and all(".mlp.experts." in m for m in marked)  # 2 MoE layers
    elif name == "mistral":
        assert "model.layers.0.self_attn.kv_a_proj_with_mqa" in marked and "model.layers.1.mlp.gate" not in marked
    else:
        assert not any("self_attn" in m for m in marked) and "model.layers.0.mlp.down_proj" in marked
    assert not any(k.endswith(".weight") and k.rsplit(".", 1)[0] in marked for k in wm if name == "kimi")
    ck = stream.Checkpoint(d)
    assert not any(k.endswith("." + MARKERS[name]) for k in ck.weight_map) and set(ck.parts) <= set(ck.weight_map)
    assert len(ck.parts) == len(marked)
    # sizes from the headers (the streaming decision): the decoded weights', as the float32 reference's
    assert ck.header_bytes(torch.float32) == stream.Checkpoint(paths[name + "-ref"]).header_bytes(torch.float32)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loaded_weights_equal_reference(replicas, name, dtype):
    """latentq's whole-model load (LayerStreamer.materialize: what load_model runs for a quantized
    checkpoint) equals transformers' from_pretrained of the float32 reference, state dict bit for bit:
    in float32 the decoded weights are float32 (never bf16), in bfloat16 the float32 values rounded once."""
    from transformers import AutoModelForCausalLM

    from latentq.model import load_model

    paths, _ = replicas
    mine = stream.LayerStreamer(paths[name], dtype).materialize().state_dict()
    ref = AutoModelForCausalLM.from_pretrained(paths[name + "-ref"], dtype=dtype, attn_implementation="eager")
    ref = ref.state_dict()
    assert sorted(mine) == sorted(ref)
    for k in ref:
        assert mine[k].dtype == ref[k].dtype and torch.equal(mine[k], ref[k]), (name, k, mine[k].dtype)
    if dtype == torch.float32:
        experts = mine["model.layers.1.mlp.experts.gate_up_proj"]
        assert experts.dtype == torch.float32 and not torch.equal(experts, experts.bfloat16().float()), name
        model, _, source, _, orig, _ = load_model(paths[name], dtype)
        assert source == "hf-hooks" and orig == {"kimi": "int4", "mistral": "float8_e4m3fn", "nvfp4": "nvfp4"}[name]
        assert torch.equal(model.state_dict()["model.layers.1.mlp.experts.gate_up_proj"], experts)


def _dump(replicas, tmp_path, which, tag, *extra):
    paths, text = replicas
    out = str(tmp_path / f"{which}-{tag}.h5")
    argv = ["--model", paths[which], "--text", text, "--seq-len", str(SEQ_LEN), "--num-seqs", str(NUM_SEQS)]
    argv += ["--q-rows", str(Q_ROWS), "--out", out, "--threads", "1", *extra]
    assert dump_latents.main(argv) == 0, argv
    return check_schema(out)


@pytest.mark.parametrize("name", FAMILIES)
def test_dump_equals_reference(replicas, tmp_path, name, capsys):
    """python -m latentq.dump (float32) streamed and in memory on the replica, and in memory on the
    float32 reference: c_kv and k_pe within 1e-5 relative of the reference (max relative difference
    printed), the streamed and in-memory dumps equal bit for bit."""
    ref = _dump(replicas, tmp_path, name + "-ref", "ref", "--stream", "off")
    on = _dump(replicas, tmp_path, name, "on", "--stream", "on")
    off = _dump(replicas, tmp_path, name, "off", "--stream", "off")
    assert sorted(on["layers"]) == sorted(ref["layers"]) == [0, 1, 2]
    worst = 0.0
    for i in ref["layers"]:
        for k in ("c_kv", "k_pe"):
            for got in (on, off):
                worst = max(worst, rel(got["layers"][i][k], ref["layers"][i][k]))
            np.testing.assert_array_equal(on["layers"][i][k], off["layers"][i][k], err_msg=f"{name} {i} {k}")
    with capsys.disabled():
        print(f"\n{name}: max relative difference of c_kv / k_pe to the float32 reference: {worst:.3g}")
    assert worst <= 1e-5, (name, worst)
    assert on["attrs"]["original_dtype"] == off["attrs"]["original_dtype"] != "bfloat16"


def test_modelopt_from_quantization_config(replicas, tmp_path):
    """The NVFP4 replica with ModelOpt's config in config.json (``quant_method: modelopt``) instead of
    hf_quant_config.json: the same weights; an excluded module that stores NVFP4 tensors is refused."""
    import shutil

    paths, _ = replicas
    d = tmp_path / "nvfp4-qc"
    shutil.copytree(paths["nvfp4"], d)
    (d / wf.HF_QUANT_NAME).unlink()
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = dict(NVFP4_HQ["quantization"], quant_method="modelopt")
    (d / "config.json").write_text(json.dumps(cfg))
    ref = stream.LayerStreamer(paths["nvfp4"], torch.float32).materialize().state_dict()
    mine = stream.LayerStreamer(str(d), torch.float32).materialize().state_dict()
    assert sorted(mine) == sorted(ref) and all(torch.equal(mine[k], ref[k]) for k in ref)
    cfg["quantization_config"]["exclude_modules"] = ["lm_head", "model.layers.*.mlp.experts.*"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(stream.CheckpointError, match=r"mlp.experts.\d+.\w+_proj stores quantized tensors"):
        stream.Checkpoint(str(d))
