"""DeepSeek-V4 checkpoints as DeepSeek ships them (latentq.random_checkpoint_v4), read by latentq's loader
(latentq.weight_formats, latentq.stream) in memory and streamed, offline.

- The decoders against independent numpy decoders written here: FP8 e4m3 from its bits (sign, 4-bit exponent of
  bias 7, 3-bit mantissa, subnormals) times an e8m0 block scale 2^(b - 127), partial edge blocks included; MXFP4
  from the e2m1 table (0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign), element 2i in the low nibble, one e8m0 scale per
  32 inputs; and hand-computed bytes.
- A random-init transformers 5.24 DeepseekV4ForCausalLM (a sliding, a CSA and an HCA layer, index_topk 3 below the
  10 CSA entries of a 40-token sequence, a hash-routed first layer, 8 heads so that wq_b holds two FP8 blocks)
  written with DeepSeek's names, FP8 + ``.scale`` and MXFP4 experts, in 3 shards with layer 1 split across two
  (between a weight and its scale) and an MTP block the model does not have.
- transformers' own loader (from_pretrained, which dequantizes FP8 and MXFP4 on a CPU) gives the same float32
  weights as latentq's, bit for bit, and the same logits; so does the streamed model.
- ``python -m latentq.dump`` in memory and ``--stream on``: the dump's own check passes and both files hold the same
  datasets with the same values (measured: identical), equal to the dump of transformers' model.
"""

import json
import os
import struct

import h5py
import numpy as np
import pytest
import torch
import transformers

from latentq import dump as dump_mod
from latentq import random_checkpoint_v4 as rc
from latentq import weight_formats as wf
from latentq.stream import CheckpointError, LayerStreamer
from test_deepseek_v4 import CONFIG

SEQ_LEN, NUM_SEQS, Q_ROWS = 40, 2, 16
TEXT = b"In the beginning God created the heaven and the earth. And the earth was without form, and void. " * 2
V4 = rc.PRESETS["tiny"]  # test_deepseek_v4's CONFIG with 8 heads and a hash-routed first layer

# ---- independent numpy decoders -------------------------------------------------------------------------------


def numpy_e4m3(codes: np.ndarray) -> np.ndarray:
    """float64 values of float8_e4m3fn bytes from their bits (OCP FP8 E4M3: bias 7, no infinities, S.1111.111 NaN)."""
    b = codes.astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e, m = (b >> 3) & 0xF, b & 0x7
    val = np.where(e == 0, m / 8.0 * 2.0**-6, (1 + m / 8.0) * np.exp2(e - 7.0))
    return np.where((b & 0x7F) == 0x7F, np.nan, sign * val)


def numpy_e8m0(codes: np.ndarray) -> np.ndarray:
    return np.where(codes == 255, np.nan, np.ldexp(1.0, codes.astype(np.int64) - 127))


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def numpy_mxfp4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[M, 2K] float64 from packed bytes [M, K] (element 2i low nibble, 2i + 1 high) and e8m0 scales [M, 2K / 32]."""
    u = packed.astype(np.uint8)
    out = np.empty((u.shape[0], 2 * u.shape[1]))
    for j, nib in ((0, u & 0xF), (1, u >> 4)):
        out[:, j::2] = np.where(nib & 8, -1.0, 1.0) * E2M1[nib & 7]
    return out * np.repeat(numpy_e8m0(scales), 32, axis=1)


def test_fp8_e8m0_blocks_equal_numpy():
    """[200, 300] with 128 x 128 blocks: a 2 x 3 scale grid whose last row and column are partial blocks."""
    seed = 5
    g = np.random.default_rng(seed)
    codes = g.integers(0, 256, (200, 300), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x11  # no NaN codes
    scales = g.integers(110, 140, (2, 3), dtype=np.uint8)
    parts = {"weight": torch.from_numpy(codes).view(torch.float8_e4m3fn), "scale": torch.from_numpy(scales)}
    got = wf.decode_fp8_e8m0(parts, {"block": (128, 128)}, torch.float32).double().numpy()
    want = numpy_e4m3(codes) * np.repeat(np.repeat(numpy_e8m0(scales), 128, 0), 128, 1)[:200, :300]
    print(f"seed {seed}, [200, 300]: max |got - numpy| = {np.abs(got - want).max()}")
    np.testing.assert_array_equal(got, want)
    assert got[130, 260] == numpy_e4m3(codes[130:131, 260:261])[0, 0] * 2.0 ** (int(scales[1, 2]) - 127)
    e8 = torch.from_numpy(scales).view(torch.float8_e8m0fnu)  # the dtype DeepSeek's shards store
    np.testing.assert_array_equal(wf.decode_fp8_e8m0({**parts, "scale": e8}, {"block": (128, 128)}, torch.float32), got)
    with pytest.raises(ValueError, match=r"needs a weight_scale_inv of shape \(2, 3\)"):
        wf.decode_fp8_e8m0({**parts, "scale": torch.from_numpy(scales[:1])}, {"block": (128, 128)}, torch.float32)


def test_e8m0_values():
    b = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8)
    got = wf.e8m0_to_float32(b)
    assert got[:6].tolist() == [2.0**-127, 2.0**-126, 0.5, 1.0, 2.0, 2.0**127] and torch.isnan(got[6])
    with pytest.raises(ValueError, match="float8_e8m0fnu or uint8"):
        wf.e8m0_to_float32(b.float())


def test_mxfp4_equals_numpy_and_hand_values():
    seed = 7
    g = np.random.default_rng(seed)
    packed = g.integers(0, 256, (24, 48), dtype=np.uint8)  # [24, 96] logical, 3 scales per row
    scales = g.integers(118, 136, (24, 3), dtype=np.uint8)
    parts = {"weight": torch.from_numpy(packed).view(torch.int8), "scale": torch.from_numpy(scales)}
    got = wf.decode_mxfp4(parts, {"group_size": 32}, torch.float32).double().numpy()
    print(f"seed {seed}, [24, 96]: max |got - numpy| = {np.abs(got - numpy_mxfp4(packed, scales)).max()}")
    np.testing.assert_array_equal(got, numpy_mxfp4(packed, scales))
    # by hand: byte 0x2F = low nibble 0xF (-6), high nibble 0x2 (+1.0); byte 0xD5 = +3.0, -3.0 (0xD = 8 | 5)
    row = np.zeros((1, 16), dtype=np.uint8)
    row[0, :2] = [0x2F, 0xD5]
    one = {"weight": torch.from_numpy(row).view(torch.int8), "scale": torch.tensor([[126]], dtype=torch.uint8)}
    assert wf.decode_mxfp4(one, {}, torch.float32)[0, :4].tolist() == [-3.0, 0.5, 1.5, -1.5]
    with pytest.raises(ValueError, match=r"needs a scale of shape \(24, 3\)"):
        wf.decode_mxfp4({**parts, "scale": parts["scale"][:, :2]}, {}, torch.float32)
    with pytest.raises(ValueError, match="MXFP4 weight must be int8"):
        wf.decode_mxfp4({**parts, "weight": torch.zeros(24, 48)}, {}, torch.float32)


def test_quantizers_invert_the_decoders():
    """The writer's quantizers: power-of-two scales, no clipping, e2m1 ties to the even code, and the decoded weight
    within half a step of the original."""
    assert rc.e2m1_codes(torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, 6.0])).tolist() == [
        0, 2, 2, 4, 4, 6, 6, 10, 7
    ]  # fmt: skip
    seed = 3
    w = torch.randn(150, 96, generator=torch.Generator().manual_seed(seed)) * 0.3
    q, s = rc.quantize_fp8_e8m0(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu and tuple(s.shape) == (2, 1)
    amax = [float(w[:128].abs().max()), float(w[128:].abs().max())]
    scale = wf.e8m0_to_float32(s)[:, 0].tolist()
    assert all(a / 448 <= sc < 2 * a / 448 for a, sc in zip(amax, scale)), (amax, scale)
    dq = wf.decode_fp8_e8m0({"weight": q, "scale": s}, {"block": (128, 128)}, torch.float32)
    rel = ((dq - w).abs() / w.abs().clamp_min(2.0**-6 * max(scale))).max()
    print(f"seed {seed}: FP8 round trip, max relative error {float(rel):.4f} (e4m3 half ulp 2^-4)")
    assert rel <= 2.0**-4
    p, s4 = rc.quantize_mxfp4(w)
    assert p.dtype == torch.int8 and tuple(p.shape) == (150, 48) and tuple(s4.shape) == (150, 3)
    dq4 = wf.decode_mxfp4({"weight": p, "scale": s4}, {}, torch.float32)
    step = wf.e8m0_to_float32(s4).repeat_interleave(32, 1)  # e2m1's widest gap is 2 (4 to 6): half of it is 1
    print(f"seed {seed}: MXFP4 round trip, max |Δ| / scale {float(((dq4 - w).abs() / step).max()):.3f}")
    assert bool(((dq4 - w).abs() <= step).all()) and bool((dq4.abs() <= 6 * step).all())


# ---- the checkpoint -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("v4ckpt")
    model = rc.random_v4_model(seed=0, **V4)
    tensors = rc.v4_tensors(model, mtp_layers=1)
    wmap = rc.write_v4_checkpoint(tensors, model.config, str(d / "ckpt"), shards=3, split_layer=1)
    (d / "text.txt").write_bytes(TEXT)
    return dict(dir=d, path=str(d / "ckpt"), model=model, tensors=tensors, wmap=wmap)


def _headers(path: str) -> dict:
    out = {}
    for fn in sorted(os.listdir(path)):
        if fn.endswith(".safetensors"):
            with open(os.path.join(path, fn), "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                out.update({k: v for k, v in json.loads(f.read(n)).items() if k != "__metadata__"})
    return out


def test_checkpoint_is_shipped_as_deepseek_does(ckpt):
    path, wmap = ckpt["path"], ckpt["wmap"]
    hdr = _headers(path)
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        assert json.load(f)["weight_map"] == wmap and set(wmap) == set(hdr)
    assert sorted(set(wmap.values())) == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert len({wmap[k] for k in wmap if k.startswith("layers.1.")}) == 2  # layer 1 spans two shards ...
    split = [k for k in wmap if k.endswith(".scale") and wmap[k] != wmap[k[:-5] + "weight"]]
    assert any(k.startswith("layers.1.") for k in split)  # ... between a weight and its scale
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["quantization_config"] == rc.QUANTIZATION_CONFIG and cfg["expert_dtype"] == "fp4"
    assert cfg["model_type"] == "deepseek_v4" and cfg["index_topk"] == 3 and cfg["layer_types"] == CONFIG["layer_types"]
    expect = {  # DeepSeek-V4-Flash's names and safetensors dtypes
        "embed.weight": ("BF16", [128, 64]),
        "head.weight": ("BF16", [128, 64]),
        "norm.weight": ("BF16", [64]),
        "hc_head_fn": ("F32", [2, 128]),
        "layers.0.ffn.gate.tid2eid": ("I64", [128, 2]),
        "layers.1.attn.wq_b.weight": ("F8_E4M3", [256, 32]),
        "layers.1.attn.wq_b.scale": ("F8_E8M0", [2, 1]),
        "layers.1.attn.wo_a.weight": ("F8_E4M3", [32, 128]),
        "layers.1.attn.indexer.wq_b.scale": ("F8_E8M0", [1, 1]),
        "layers.1.attn.attn_sink": ("F32", [8]),
        "layers.1.attn.q_norm.weight": ("BF16", [32]),
        "layers.1.attn.compressor.ape": ("F32", [4, 64]),
        "layers.1.attn.compressor.wkv.weight": ("BF16", [64, 64]),
        "layers.1.attn.indexer.compressor.wgate.weight": ("BF16", [32, 64]),
        "layers.1.attn.indexer.compressor.norm.weight": ("BF16", [16]),
        "layers.1.attn.indexer.weights_proj.weight": ("BF16", [4, 64]),
        "layers.1.ffn.gate.weight": ("BF16", [4, 64]),
        "layers.1.ffn.gate.bias": ("F32", [4]),
        "layers.1.ffn.experts.3.w1.weight": ("I8", [32, 32]),
        "layers.1.ffn.experts.3.w1.scale": ("F8_E8M0", [32, 2]),
        "layers.1.ffn.experts.3.w2.weight": ("I8", [64, 16]),
        "layers.1.ffn.experts.3.w2.scale": ("F8_E8M0", [64, 1]),
        "layers.1.ffn.shared_experts.w2.weight": ("F8_E4M3", [64, 32]),
        "layers.2.hc_ffn_scale": ("F32", [3]),
        "mtp.0.attn.wkv.scale": ("F8_E8M0", [1, 1]),
    }
    assert {k: (hdr[k]["dtype"], hdr[k]["shape"]) for k in expect} == expect
    kinds = {}
    for k, v in hdr.items():
        kinds.setdefault(v["dtype"], set()).add(k)
    assert all(rc.FP8_WEIGHT.match(k) or k.startswith("mtp.") for k in kinds["F8_E4M3"])
    assert {k[:-6] for k in kinds["F8_E8M0"]} == {k[:-7] for k in kinds["F8_E4M3"] | kinds["I8"]}
    assert len(kinds["I8"]) == 4 * 4 * 3  # (3 layers + MTP) x 4 experts x w1, w2, w3


def test_names_are_transformers_conversion_inverse(ckpt):
    """Every stored name but the scales, through transformers' own conversion table for deepseek_v4 (renamings,
    the base model's prefix, the expert converters' targets), is one of the model's tensors, and every model tensor
    is reached; the MTP block maps outside the model."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, apply_renamings

    model = ckpt["model"]
    conv = get_model_conversion_mapping(model)
    ren = [c for c in conv if isinstance(c, WeightRenaming)]
    converters = [c for c in conv if isinstance(c, WeightConverter)]
    reached = set()
    for name in ckpt["tensors"]:
        if name.endswith(".scale") or name.startswith("mtp."):
            continue
        r = apply_renamings(name, ren)
        r = r if r.startswith("lm_head.") else "model." + r
        for c in converters:
            target, pattern = c.rename_source_key(r)
            if pattern is not None:
                r = target
                break
        reached.add(r)
    assert reached == set(model.state_dict())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loaders_agree_with_transformers(ckpt, dtype):
    """transformers' from_pretrained (a CPU: FP8 and MXFP4 dequantized on load), latentq's in-memory loader and the
    plain-torch decode of the stored tensors give the same weights bit for bit, and the same logits."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt["path"], dtype=dtype, attn_implementation="eager")
    ours = LayerStreamer(ckpt["path"], dtype).materialize()
    a, b = hf.state_dict(), ours.state_dict()
    ref = rc.dequantized_state_dict(ckpt["model"], ckpt["tensors"])
    assert set(a) == set(b) == set(ref)
    for k in ref:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        want = ref[k].to(a[k].dtype) if ref[k].is_floating_point() else ref[k]
        assert torch.equal(a[k], want), k
    assert a["model.layers.1.mlp.experts.gate_up_proj"].abs().max() > 0
    ids = torch.as_tensor(np.frombuffer(TEXT[:SEQ_LEN], dtype=np.uint8).astype(np.int64))[None]
    with torch.no_grad():
        la, lb = hf(ids, use_cache=False).logits, ours(ids, use_cache=False).logits
    streamed = {}
    LayerStreamer(ckpt["path"], dtype).run([ids], on_logits=lambda n, x: streamed.setdefault(n, x))
    print(f"{dtype}: max |logits| {float(la.abs().max()):.3f}; ours - transformers {float((lb - la).abs().max())}")
    assert torch.equal(la, lb) and torch.equal(streamed[0], la)


def _dump(ckpt, name, *extra):
    out = ckpt["dir"] / f"{name}.h5"
    sizes = ["--seq-len", str(SEQ_LEN), "--num-seqs", str(NUM_SEQS), "--q-rows", str(Q_ROWS)]
    args = ["--model", ckpt["path"], "--text", str(ckpt["dir"] / "text.txt"), *sizes, "--out", str(out)]
    assert dump_mod.main([*args, "--tokenizer", "bytes", *extra]) == 0
    return out


def _datasets(path) -> dict:
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
        attrs = {k: f.attrs[k] for k in f.attrs if k != "created"}
    return out, attrs


def test_dump_in_memory_and_streamed(ckpt, capsys):
    mem = _dump(ckpt, "mem", "--stream", "off")
    mem_summary = json.loads(capsys.readouterr().out)
    streamed = _dump(ckpt, "streamed", "--stream", "on")
    st_summary = json.loads(capsys.readouterr().out)
    assert (mem_summary["execution"], st_summary["execution"]) == ("in memory", "layer streaming")
    assert st_summary["layer_types"] == {"0": "sliding", "1": "csa", "2": "hca"}
    for s in (mem_summary, st_summary):
        errs = s["max_rel_err"].values()
        assert s["cache_family"] == "deepseek_v4" and 0 < max(errs) < 1e-5
    a, a_attrs = _datasets(mem)
    b, b_attrs = _datasets(streamed)
    assert a.keys() == b.keys() and a_attrs.keys() == b_attrs.keys()
    assert {k for k in a_attrs if str(a_attrs[k]) != str(b_attrs[k])} == set()
    worst = 0.0
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        if a[k].dtype.kind == "f" and a[k].size:
            worst = max(worst, float(np.abs(a[k].astype(np.float64) - b[k]).max()))
        else:
            np.testing.assert_array_equal(a[k], b[k], k)
    print(f"dump check (in memory) {mem_summary['max_rel_err']}; streamed - in memory, max |Δ| = {worst}")
    assert worst <= 1e-6
    assert a_attrs["original_dtype"] == "float8_e4m3fn+mxfp4" and a_attrs["model_class"] == "DeepseekV4ForCausalLM"
    assert (a["layers/001/index_selected"] >= 0).sum(1).max() == 3 and a["layers/001/compressed_kv"].shape[0] == 20
    # the same dump from transformers' own model
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        ckpt["path"], dtype=torch.float32, attn_implementation="eager"
    )
    seqs = [np.frombuffer(TEXT[i * SEQ_LEN : (i + 1) * SEQ_LEN], dtype=np.uint8) for i in range(NUM_SEQS)]
    dump_mod.dump(hf, hf.config.to_dict(), seqs, Q_ROWS, str(ckpt["dir"] / "hf.h5"))
    c, _ = _datasets(ckpt["dir"] / "hf.h5")
    for k in a:
        np.testing.assert_array_equal(a[k], c[k], k)


def test_tiny_preset_is_the_test_shape_and_main_writes_it(tmp_path, capsys):
    assert {**V4, "num_attention_heads": 4, "mlp_layer_types": ["moe"] * 3, "attn_implementation": "eager"} == CONFIG
    assert rc.main(["--out", str(tmp_path / "ck")]) == 0
    line = capsys.readouterr().out
    assert "DeepSeek-V4 tiny: layers sliding,csa,hca" in line
    with open(tmp_path / "ck" / "model.safetensors.index.json") as f:
        wmap = json.load(f)["weight_map"]
    assert len(set(wmap.values())) == 3 and "mtp.0.attn.wq_a.scale" in wmap and "layers.2.attn.compressor.ape" in wmap
    with pytest.raises(SystemExit) as e:  # an existing non-empty --out is refused, nothing written
        rc.main(["--out", str(tmp_path / "ck")])
    assert e.value.code == 2 and "not empty" in capsys.readouterr().err


def test_broken_scales_are_refused(ckpt, tmp_path):
    """A scale grid of the wrong shape names the tensor; an unknown scale_fmt or expert_dtype names the value."""
    tensors = dict(ckpt["tensors"])
    tensors["layers.2.attn.wq_b.scale"] = tensors["layers.2.attn.wq_b.scale"][:1]
    rc.write_v4_checkpoint(tensors, ckpt["model"].config, str(tmp_path / "bad"), shards=2)
    sm = LayerStreamer(str(tmp_path / "bad"), torch.float32)
    with pytest.raises(CheckpointError, match=r"layers\.2\.attn\.wq_b\.weight \(deepseek-v4-fp8\).*shape \(2, 1\)"):
        sm.load_layer(2)
    cfg = {"quantization_config": {**rc.QUANTIZATION_CONFIG, "scale_fmt": "e5m3"}}
    with pytest.raises(ValueError, match="scale_fmt 'e5m3'"):
        wf.detect(str(tmp_path), cfg)
    with pytest.raises(ValueError, match="expert_dtype 'fp6'"):
        wf.detect(str(tmp_path), {"quantization_config": rc.QUANTIZATION_CONFIG, "expert_dtype": "fp6"})
