"""Layer streaming of the dumper (latentq.stream, ``python -m latentq.dump --stream``) on checkpoints
made here, offline:

- ``fp8``: a random-init DeepseekV3 (4 layers, first_k_dense_replace 1, 4 routed + 1 shared expert,
  hidden 192) written as DeepSeek ships V3: 3 safetensors shards with an index, layers straddling
  shards, per-expert 2-D weights, FP8 e4m3 matrices with 128 × 128 weight_scale_inv blocks (192 =
  1.5 blocks, 80 / 160 / 48 rows: partial edge blocks), a quantization_config and one
  multi-token-prediction layer (model.layers.4) that must never be read;
- ``ref``: the same model dequantized by an independent numpy reference (ml_dtypes' e4m3 decoding
  times the block's scale, element by element), float32, loaded in memory by transformers'
  from_pretrained (its own per-expert -> fused conversion);
- ``v2``: a random-init DeepseekV2 (MoE, first_k_dense_replace 1, no q_lora) in bfloat16, 3 shards,
  per-expert weights, loaded in memory by from_pretrained.

The streamed dump equals the in-memory dump bit for bit: every dataset (values, dtype, shape,
chunks) and every attribute but ``created``. The layers run the same modules on the same inputs in
the same dtype as the model's own forward, one sequence per call either way, and the dequantized
weights are the same float32 numbers (w = fp8 · scale is exact in float32: a 4-bit significand
times a float32), so no tolerance is needed, in float32 or bfloat16.
"""

import json
import os
import re

import h5py
import ml_dtypes
import numpy as np
import pytest
import torch

from dump_checks import checkpoint_layout
from latentq import dump as dump_latents
from latentq import stream
from latentq.model import weights_revision
from latentq.random_checkpoint import deepseek_tensors, quantize_fp8_blocks, random_model, write_checkpoint

BLOCK = (128, 128)
V3 = dict(hidden_size=192, intermediate_size=160, moe_intermediate_size=48, q_lora_rank=96, num_hidden_layers=4)
V2 = dict(hidden_size=96, intermediate_size=128, moe_intermediate_size=48, num_hidden_layers=4)
SEQ_LEN, NUM_SEQS, Q_ROWS = 40, 3, 12


def reference_dequant(q: torch.Tensor, s: torch.Tensor, block) -> np.ndarray:
    """w[i, j] = float32(e4m3 q[i, j]) * s[i // bm, j // bn], element by element (ml_dtypes decoding)."""
    x = q.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    sc = s.numpy().astype(np.float32)
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = np.float32(x[i, j]) * sc[i // block[0], j // block[1]]
    return out


def random_fp8(shape, seed):
    """Random float8_e4m3fn values over every finite code (0x7f / 0xff are NaN in e4m3fn)."""
    g = np.random.default_rng(seed)
    codes = g.integers(0, 255, size=shape, dtype=np.uint8)
    codes[codes == 0x7F] = 0x7E
    return torch.from_numpy(codes).view(torch.float8_e4m3fn)


@pytest.mark.parametrize(
    "shape,block", [((300, 200), (128, 128)), ((128, 256), (128, 128)), ((5, 3), (128, 128)), ((70, 45), (32, 16))]
)
def test_fp8_dequant_equals_numpy_reference(shape, block):
    seed = shape[0] * 1000 + shape[1]
    q = random_fp8(shape, seed)
    grid = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    s = torch.from_numpy(np.random.default_rng(seed + 1).uniform(1e-4, 2.0, size=grid).astype(np.float32))
    ref = reference_dequant(q, s, block)
    got = stream.dequantize_fp8_blocks(q, s, block, torch.float32)
    assert got.dtype == torch.float32 and got.shape == shape
    np.testing.assert_array_equal(got.numpy(), ref, err_msg=f"shape {shape} block {block} seed {seed}")
    # bfloat16: the float32 product rounded once (ml_dtypes' round-to-nearest-even)
    got16 = stream.dequantize_fp8_blocks(q, s, block, torch.bfloat16)
    np.testing.assert_array_equal(got16.float().numpy(), ref.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_fp8_dequant_block_edges():
    """All-ones weight [300, 200]: each element is its block's scale; blocks end at 127 / 255 rows and 127
    columns, the last block row (256..299) and column (128..199) are partial."""
    s = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    q = torch.ones((300, 200)).to(torch.float8_e4m3fn)
    w = stream.dequantize_fp8_blocks(q, s, (128, 128))
    want = {(0, 0): 1, (127, 127): 1, (127, 128): 2, (128, 127): 3, (255, 199): 4, (256, 0): 5, (299, 127): 5}
    want.update({(256, 128): 6, (299, 199): 6})
    assert {k: float(w[k]) for k in want} == want
    assert float(w.sum()) == 128 * 128 * (1 + 3) + 128 * 72 * (2 + 4) + 44 * 128 * 5 + 44 * 72 * 6
    with pytest.raises(ValueError, match=r"needs a weight_scale_inv of shape \(3, 2\), got \(2, 2\)"):
        stream.dequantize_fp8_blocks(q, s[:2], (128, 128))


def test_fp8_quantize_round_trip():
    """The checkpoint writer's quantizer: scale = max|w| / 448 per block, w / scale exact in e4m3 for
    the block maxima (±448), so dequantization returns them exactly."""
    w = torch.randn((130, 129), generator=torch.Generator().manual_seed(3))
    q, s = quantize_fp8_blocks(w, (128, 128))
    assert q.dtype == torch.float8_e4m3fn and s.shape == (2, 2)
    assert torch.equal(s[1, 1], w[128:, 128:].abs().max() / 448)
    back = stream.dequantize_fp8_blocks(q, s, (128, 128))
    i = w[:128, :128].abs().argmax()
    assert back[:128, :128].reshape(-1)[i] == w[:128, :128].reshape(-1)[i]
    assert float(((back - w).abs() / w.abs().clamp_min(1e-3)).median()) < 0.04  # 3-bit mantissa


# ---- the checkpoints --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    torch.set_num_threads(1)
    m3 = random_model("v3", seed=11, **V3)
    fp8 = deepseek_tensors(m3, fp8_block=BLOCK, mtp_layers=1, seed=11)
    paths = {"fp8": str(root / "fp8" / "ckpt"), "ref": str(root / "ref" / "ckpt"), "v2": str(root / "v2" / "ckpt")}
    write_checkpoint(fp8, m3.config, paths["fp8"], shards=3, fp8_block=BLOCK)
    ref = {}
    for k, t in fp8.items():
        if k.endswith(stream.SCALE_SUFFIX) or k.startswith("model.layers.4."):
            continue
        if t.dtype == torch.float8_e4m3fn:
            ref[k] = torch.from_numpy(reference_dequant(t, fp8[k + stream.SCALE_SUFFIX], BLOCK))
        else:
            ref[k] = t.float()
    write_checkpoint(ref, m3.config, paths["ref"], shards=2, torch_dtype="float32")
    m2 = random_model("v2", seed=12, **V2)
    write_checkpoint(deepseek_tensors(m2, dtype=torch.bfloat16), m2.config, paths["v2"], shards=3)
    text = root / "text.txt"
    text.write_bytes(bytes(np.random.default_rng(5).integers(0, 256, SEQ_LEN * NUM_SEQS + 7, dtype=np.uint8)))
    return paths, str(text)


def test_fp8_checkpoint_is_shipped_as_deepseek_does(ckpts):
    """The premises of the FP8 tests: >= 3 shards, a layer split across two, per-expert 2-D FP8 weights
    with partial 128 x 128 blocks, a quantization_config, an MTP layer past num_hidden_layers."""
    paths, _ = ckpts
    wm, layers = checkpoint_layout(paths["fp8"])
    assert len(set(wm.values())) >= 3 and any(len(v) == 2 for v in layers.values()), layers
    assert sorted(layers) == [0, 1, 2, 3, 4]
    ck = stream.Checkpoint(paths["fp8"])
    assert ck.fp8_block == BLOCK and ck.config["num_hidden_layers"] == 4
    from safetensors import safe_open

    k = "model.layers.2.mlp.experts.3.up_proj.weight"
    with safe_open(os.path.join(paths["fp8"], wm[k]), "pt") as f:
        w = f.get_tensor(k)
    with safe_open(os.path.join(paths["fp8"], wm[k + "_scale_inv"]), "pt") as f:
        s = f.get_tensor(k + "_scale_inv")
    assert w.dtype == torch.float8_e4m3fn and tuple(w.shape) == (48, 192) and tuple(s.shape) == (1, 2)
    assert "model.layers.0.mlp.gate_proj.weight_scale_inv" in wm  # dense layer 0
    assert "model.layers.1.mlp.gate.weight" in wm and "model.layers.1.mlp.gate.weight_scale_inv" not in wm
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv" in wm  # [80, 192]: partial blocks


def _dump(ckpts, tmp_path, which, name, *extra):
    """python -m latentq.dump on checkpoint ``which`` (in-process), 1 thread; returns the output path."""
    paths, text = ckpts
    out = str(tmp_path / f"{name}.h5")
    argv = ["--model", paths[which], "--text", text, "--seq-len", str(SEQ_LEN), "--num-seqs", str(NUM_SEQS)]
    argv += ["--q-rows", str(Q_ROWS), "--out", out, "--threads", "1", *extra]
    assert dump_latents.main(argv) == 0, argv
    return out


def _attr(v):
    return v.decode() if isinstance(v, bytes) else v


def assert_same_dump(a_path, b_path, skip_attrs=("created",), what=""):
    """Every dataset equal (values bit for bit, dtype, shape, chunks, compression) and every attribute
    but skip_attrs equal (value and type)."""
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        assert set(a.attrs) == set(b.attrs), what
        for k in a.attrs:
            if k in skip_attrs:
                continue
            x, y = _attr(a.attrs[k]), _attr(b.attrs[k])
            assert type(x) is type(y) and np.array_equal(x, y), (what, k, x, y)
        names = []
        a.visit(names.append)
        other = []
        b.visit(other.append)
        assert names == other, what
        n = 0
        for k in names:
            if isinstance(a[k], h5py.Dataset):
                x, y = a[k], b[k]
                assert (x.dtype, x.shape, x.chunks, x.compression) == (y.dtype, y.shape, y.chunks, y.compression), k
                np.testing.assert_array_equal(x[()], y[()], err_msg=f"{what}: {k}")
                n += 1
        assert n == 3 + 8 * a.attrs["num_layers"], what


def test_fp8_streamed_equals_in_memory(ckpts, tmp_path, capsys):
    """The FP8 checkpoint, --stream on and --stream off (the whole dequantized model in memory): the same
    file. --stream auto decides by size, not by format: this small FP8 checkpoint fits the default budget and
    loads in memory (the same file again), and under a budget below its decoded size it streams."""
    paths, _ = ckpts
    on = _dump(ckpts, tmp_path, "fp8", "on", "--stream", "on")
    assert "layer streaming (--stream on)" in capsys.readouterr().err
    off = _dump(ckpts, tmp_path, "fp8", "off", "--stream", "off")
    out = capsys.readouterr()
    assert "in memory (--stream off)" in out.err and '"execution": "in memory"' in out.out
    assert_same_dump(on, off, what="fp8 on/off")
    auto = _dump(ckpts, tmp_path, "fp8", "auto")
    err = capsys.readouterr().err
    assert "in memory (weights " in err and "fit the budget" in err, err
    assert_same_dump(on, auto, what="fp8 on/auto")
    small = _dump(ckpts, tmp_path, "fp8", "small", "--memory-budget", "64K")
    err = capsys.readouterr().err
    assert "layer streaming (weights " in err and "> budget" in err, err
    assert_same_dump(on, small, what="fp8 on/auto under a small budget")
    with h5py.File(on) as f:
        assert _attr(f.attrs["original_dtype"]) == "float8_e4m3fn" and f.attrs["num_layers"] == 4
        assert json.loads(_attr(f.attrs["config_json"]))["quantization_config"]["weight_block_size"] == [128, 128]
        assert _attr(f.attrs["revision"]) == weights_revision(paths["fp8"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_loader_equals_transformers_on_reference(ckpts, dtype):
    """latentq.stream's whole-model load of the FP8 checkpoint equals transformers' from_pretrained of
    the numpy-dequantized float32 checkpoint: the same state dict (names, dtypes, values bit for bit),
    so the per-expert fusion and the dtypes agree: in bfloat16 the router weight and
    e_score_correction_bias stay float32, everything else is the float32 value rounded once."""
    from transformers import AutoModelForCausalLM

    paths, _ = ckpts
    mine = stream.LayerStreamer(paths["fp8"], dtype).materialize().state_dict()
    ref = AutoModelForCausalLM.from_pretrained(paths["ref"], dtype=dtype, attn_implementation="eager").state_dict()
    assert sorted(mine) == sorted(ref)
    for k in ref:
        assert mine[k].dtype == ref[k].dtype and torch.equal(mine[k], ref[k]), (k, mine[k].dtype, ref[k].dtype)
    if dtype == torch.bfloat16:
        assert ref["model.layers.1.mlp.gate.weight"].dtype == torch.float32
        assert ref["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
        assert ref["model.layers.1.mlp.experts.gate_up_proj"].dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fp8_streamed_equals_reference_model(ckpts, tmp_path, dtype):
    """The streamed FP8 dump against transformers' in-memory float32 model of the numpy-dequantized
    weights (its own loader and expert fusion): every dataset bit for bit; the attributes that describe
    the checkpoint itself (revision: other files; original_dtype; config_json: its quantization_config
    and _name_or_path) differ by construction, the rest are equal."""
    paths, _ = ckpts
    streamed = _dump(ckpts, tmp_path, "fp8", "streamed", "--stream", "on", "--dtype", dtype)
    ref = _dump(ckpts, tmp_path, "ref", "ref", "--stream", "off", "--dtype", dtype)
    assert_same_dump(streamed, ref, skip_attrs=("created", "revision", "original_dtype", "config_json"), what="ref")
    with h5py.File(streamed) as a, h5py.File(ref) as b:
        ca, cb = (json.loads(_attr(f.attrs["config_json"])) for f in (a, b))
        assert ca.pop("quantization_config")["quant_method"] == "fp8" and "quantization_config" not in cb
        assert (ca.pop("_name_or_path"), cb.pop("_name_or_path")) == (paths["fp8"], paths["ref"])
        assert ca == cb
        assert _attr(b.attrs["original_dtype"]) == "float32"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_v2_bf16_streamed_equals_in_memory(ckpts, tmp_path, dtype):
    """The bf16 DeepseekV2 checkpoint: streamed vs transformers' from_pretrained, in float32 and in
    bfloat16 compute (router kept in float32 by both, as the model asks)."""
    paths, _ = ckpts
    on = _dump(ckpts, tmp_path, "v2", "on", "--stream", "on", "--dtype", dtype)
    off = _dump(ckpts, tmp_path, "v2", "off", "--dtype", dtype)  # auto: fits the default budget
    assert_same_dump(on, off, what=f"v2 {dtype}")
    with h5py.File(on) as f:
        assert (_attr(f.attrs["original_dtype"]), _attr(f.attrs["compute_dtype"])) == ("bfloat16", dtype)


def test_hidden_states_spill_to_a_file(ckpts, tmp_path, capsys):
    """A budget below the largest layer: the hidden states go to a temporary file (removed after), the
    dump is the same; auto streams a bf16 checkpoint whose weights exceed the budget."""
    paths, _ = ckpts
    ref = _dump(ckpts, tmp_path, "v2", "ref", "--stream", "off")
    capsys.readouterr()
    spilled = _dump(ckpts, tmp_path, "v2", "spill", "--memory-budget", "64K")
    out = capsys.readouterr()
    assert re.search(r"layer streaming \(weights \d+\.\d\d MiB in float32 > budget 0\.06 MiB\)", out.err), out.err
    assert '"hidden_states": "temporary file"' in out.out
    assert_same_dump(spilled, ref, what="spill")
    assert sorted(os.listdir(tmp_path)) == ["ref.h5", "spill.h5"]


def test_host_states_file_round_trip(tmp_path):
    shapes = [(1, 5, 7), (2, 3, 7)]
    for dtype in (torch.float32, torch.bfloat16):
        st = stream.HostStates(shapes, dtype, in_memory=False, directory=str(tmp_path))
        xs = [torch.randn(s).to(dtype) for s in shapes]
        for n in (1, 0):
            st.put(n, xs[n])
        assert st.nbytes == (35 + 42) * xs[0].element_size()
        assert all(torch.equal(st.get(n), xs[n]) for n in range(2))
        with pytest.raises(RuntimeError, match=r"expected \(1, 5, 7\)"):
            st.put(0, xs[1])
        st.close()
    assert os.listdir(tmp_path) == []


def test_one_layer_loaded_at_a_time(ckpts):
    """While layer i runs, only layer i's weights are off the meta device (the embedding is freed
    after the inputs of layer 0 are taken), inputs run layer-major, the MTP layer is never read,
    and the streamed logits (the seam for the e2e step: batched inputs, final norm and head) equal
    the in-memory model's bit for bit."""
    paths, _ = ckpts
    sm = stream.LayerStreamer(paths["fp8"], torch.float32)
    assert sm.skipped_layers == [4] and sm.layers_name == "model.layers" and len(sm.layers) == 4
    read = []
    orig = sm.checkpoint.read

    def spy(names, dtype_of):
        read.extend(names)
        return orig(names, dtype_of)

    sm.checkpoint.read = spy
    order, resident = [], []

    def on_device(module):
        return any(t.device.type != "meta" for t in module.parameters())

    def before(i, n):
        order.append((i, n))
        resident.append(([j for j, layer in enumerate(sm.layers) if on_device(layer)], on_device(sm.model.model)))

    g = torch.Generator().manual_seed(2)
    inputs = [torch.randint(0, 320, (2, 24), generator=g), torch.randint(0, 320, (17,), generator=g)]
    logits = {}
    sm.run(inputs, before=before, on_logits=lambda n, x: logits.__setitem__(n, x))
    assert order == [(i, n) for i in range(4) for n in range(2)]
    embed_on = on_device(sm.model.model.embed_tokens)
    assert [r[0] for r in resident] == [[i] for i in range(4) for _ in range(2)] and not embed_on
    assert not any(k.startswith("model.layers.4.") for k in read) and "lm_head.weight" in read
    assert not any(t.device.type != "meta" for t in sm.model.parameters())
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(paths["ref"], dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for n, x in enumerate(inputs):
            want = ref(input_ids=x if x.dim() == 2 else x[None], use_cache=False).logits
            assert torch.equal(logits[n], want), n


def test_refused_requests(ckpts, tmp_path, capsys):
    """Exit 2, one line naming the problem, no output: a checkpoint missing a tensor (streamed), an
    unsupported quantization method, --stream on for tiny-mla, a bad --memory-budget."""
    paths, text = ckpts
    m = random_model("v3", seed=3, num_hidden_layers=2)
    ts = deepseek_tensors(m, fp8_block=BLOCK)
    del ts["model.layers.1.mlp.experts.2.down_proj.weight"]
    write_checkpoint(ts, m.config, str(tmp_path / "missing"), shards=2, fp8_block=BLOCK)
    write_checkpoint(deepseek_tensors(m), m.config, str(tmp_path / "awq"), shards=1)
    cfg = json.loads((tmp_path / "awq" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (tmp_path / "awq" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps({"architectures": ["TinyMLAForCausalLM"]}))
    cases = [
        (
            ["--model", str(tmp_path / "missing")],
            r"model.layers.1.mlp.experts.down_proj \(4, 64, 32\) has no checkpoint",
        ),
        (["--model", str(tmp_path / "awq"), "--stream", "on"], r"quant_method 'awq' is not supported"),
        (["--model", str(tmp_path / "tiny"), "--stream", "on"], r"tiny-mla is not streamed"),
        (["--model", paths["v2"], "--memory-budget", "lots"], r"--memory-budget: memory size 'lots'"),
    ]
    out = tmp_path / "out" / "d.h5"
    for argv, msg in cases:
        rc = dump_latents.main(argv + ["--text", text, "--seq-len", "8", "--num-seqs", "1", "--out", str(out)])
        err = capsys.readouterr().err
        assert rc == 2, argv
        lines = [x for x in err.splitlines() if x.startswith("latentq dump: error:")]
        assert len(lines) == 1 and re.search(msg, lines[0]), (argv, err)
        assert not out.parent.exists() or os.listdir(out.parent) == [], argv


def test_a_checkpoint_that_cannot_stream_and_does_not_fit_is_refused_before_loading(tmp_path, capsys):
    """A local checkpoint of .bin weights (not streamable: no safetensors) whose weight files alone exceed
    --memory-budget: exit 2 before any weight is read, naming its size, the budget and why it cannot stream;
    nothing written. Under a budget it fits, auto loads it in memory (the decision only, stream_plan)."""
    from latentq.model import stream_plan

    ck = tmp_path / "bin-ckpt"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", "num_hidden_layers": 2}))
    (ck / "pytorch_model.bin").write_bytes(bytes(3 << 20))  # 3 MiB of weights, never parsed
    (ck / "text.txt").write_text("In the beginning God created the heaven and the earth.\n" * 20)
    out = tmp_path / "d.h5"
    argv = ["--model", str(ck), "--text", str(ck / "text.txt"), "--out", str(out), "--memory-budget", "1M"]
    assert dump_latents.main(argv) == 2
    err = capsys.readouterr().err
    assert f"--model {ck}: its weight files are 3.00 MiB, over the memory budget 1.00 MiB" in err, err
    assert "cannot stream layer by layer" in err and "safetensors" in err, err
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["bin-ckpt"]
    stream_it, why, _ = stream_plan("auto", "8M", str(ck), torch.float32)
    assert not stream_it and why.startswith("not streamable (") and "fit the budget 8.00 MiB" in why, why


def test_a_tokenizer_that_fails_to_load_is_an_error_not_bytes(ckpts, tmp_path, capsys):
    """A checkpoint whose tokenizer is there but does not load (tokenizer_config.json naming a class no one
    ships): exit 2 naming the class and --tokenizer bytes, nothing written; with --tokenizer bytes the dump
    runs on the text's bytes and records "bytes"; with no tokenizer files at all auto warns and uses bytes."""
    import shutil

    paths, _ = ckpts
    ck = tmp_path / "v2-tok"
    shutil.copytree(paths["v2"], ck)
    assert not any(n.startswith(("tokenizer", "vocab")) for n in os.listdir(ck))
    (ck / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "NoSuchTokenizerFast"}))
    paths2 = ({**paths, "v2tok": str(ck)}, ckpts[1])
    out = tmp_path / "bad.h5"
    argv = ["--model", str(ck), "--text", ckpts[1], "--seq-len", str(SEQ_LEN), "--num-seqs", str(NUM_SEQS)]
    assert dump_latents.main([*argv, "--out", str(out), "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "its tokenizer NoSuchTokenizerFast does not load" in err and "--tokenizer bytes" in err, err
    assert not out.exists()
    got = _dump(paths2, tmp_path, "v2tok", "bytes", "--tokenizer", "bytes")
    with h5py.File(got) as f:
        assert _attr(f.attrs["tokenizer"]) == "bytes"
    os.remove(ck / "tokenizer_config.json")
    _dump(paths2, tmp_path, "v2tok", "auto")
    assert "no tokenizer in" in capsys.readouterr().err
