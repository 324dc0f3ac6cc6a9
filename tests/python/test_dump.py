"""Dumper and hooks on a randomly initialised small tiny-mla (independent of the trained weights)."""

import os

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dump_checks import check_schema, reference_attn_out, rel
from latentq import capture, tiny_mla
from latentq import dump as dump_latents
from latentq.capture import LatentCapture, MLAModuleNotFoundError
from latentq.inject import LatentInjector
from latentq.tiny_mla import TinyMLAConfig, TinyMLAForCausalLM

CFG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
    max_position_embeddings=128,
)
SEQ_LEN, NUM_SEQS, Q_ROWS = 48, 3, 20


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(1)
    m = TinyMLAForCausalLM(TinyMLAConfig(**CFG)).eval()
    for p in m.parameters():  # larger weights: sharper attention than the default init
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.15)
    return m


@pytest.fixture(scope="module")
def seqs():
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, 256, (SEQ_LEN,), generator=g).numpy() for _ in range(NUM_SEQS)]


@pytest.fixture(scope="module")
def dumped(model, seqs, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("dump") / "tiny.h5")
    sd_before = {k: v.clone() for k, v in model.state_dict().items()}
    summary = dump_latents.dump(
        model,
        model.config.to_hf_dict(),
        seqs,
        Q_ROWS,
        out,
        model_name="tiny-test",
        source="tiny-mla",
        text_sha256="0" * 64,
    )
    return out, summary, sd_before


def test_schema_and_values(dumped, model, seqs):
    out, summary, _ = dumped
    chk = check_schema(out)
    A = chk["attrs"]
    c = model.config
    assert (
        A["num_layers"],
        A["num_heads"],
        A["kv_lora_rank"],
        A["qk_rope_head_dim"],
        A["qk_nope_head_dim"],
        A["v_head_dim"],
    ) == (2, 4, 32, 8, 16, 16)
    assert (A["num_seqs"], A["seq_len"]) == (NUM_SEQS, SEQ_LEN)
    assert A["source"] == "tiny-mla" and A["rope_layout"] == "interleaved" and A["original_dtype"] == "float32"
    assert A["softmax_scale"] == c.softmax_scale == (16 + 8) ** -0.5
    np.testing.assert_array_equal(chk["root"]["tokens"], np.concatenate(seqs))
    np.testing.assert_array_equal(chk["root"]["seq_offsets"], [0, 48, 96, 144])
    # q_rows: 7, 7, 6 rows per sequence, evenly spaced, ending at each sequence's last position
    want = np.concatenate(
        [
            [(j + 1) * 48 // 7 - 1 for j in range(7)],
            [48 + (j + 1) * 48 // 7 - 1 for j in range(7)],
            [96 + (j + 1) * 48 // 6 - 1 for j in range(6)],
        ]
    )
    for d in chk["layers"].values():
        np.testing.assert_array_equal(d["q_rows"], want)
    assert {47, 95, 143} <= set(want.tolist())
    with h5py.File(out) as f:
        assert f["layers/000/c_kv"].compression is None
    assert oct(os.stat(out).st_mode & 0o777) != oct(0o600)


def test_dump_matches_model_internals(dumped, model, seqs):
    """c_kv, k_pe, q_nope, attn_out and W_UK/W_UV equal what independent hooks/ops read from the model."""
    out, _, _ = dumped
    chk = check_schema(out)
    seen = {}
    hs = []
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        hs.append(
            a.kv_a_layernorm.register_forward_hook(lambda m, i_, o, i=i: seen.setdefault((i, "c"), []).append(o[0]))
        )
        hs.append(
            a.kv_a_proj_with_mqa.register_forward_hook(
                lambda m, i_, o, i=i: seen.setdefault((i, "kpe"), []).append(o[0, :, -8:])
            )
        )
        hs.append(
            a.q_proj.register_forward_hook(
                lambda m, i_, o, i=i: seen.setdefault((i, "q"), []).append(o[0].view(-1, 4, 24))
            )
        )
        hs.append(
            a.o_proj.register_forward_pre_hook(
                lambda m, args, i=i: seen.setdefault((i, "o"), []).append(args[0][0].view(-1, 4, 16))
            )
        )
    try:
        with torch.no_grad():
            for s in seqs:
                model(torch.as_tensor(s)[None])
    finally:
        for h in hs:
            h.remove()
    pos = torch.arange(SEQ_LEN)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    for i, d in chk["layers"].items():
        rows = torch.as_tensor(d["q_rows"]).long()
        np.testing.assert_array_equal(d["c_kv"], torch.cat(seen[(i, "c")]).numpy())
        q = torch.cat(seen[(i, "q")])[rows]
        np.testing.assert_array_equal(d["q_nope"], q[..., :16].numpy())
        np.testing.assert_array_equal(d["attn_out"], torch.cat(seen[(i, "o")])[rows].numpy())
        # post-RoPE: rotate the model's own pre-RoPE tensors with the interleaved layout
        k_ref = torch.cat([capture.rotate(k, pos, inv, "interleaved") for k in seen[(i, "kpe")]])
        assert rel(d["k_pe"], k_ref) < 1e-5
        assert rel(d["k_pe"], torch.cat([capture.rotate(k, pos, inv, "half") for k in seen[(i, "kpe")]])) > 1e-2
        allpos = pos.repeat(NUM_SEQS)
        q_ref = capture.rotate(q[..., 16:], allpos[rows], inv, "interleaved")
        assert rel(d["q_pe"], q_ref) < 1e-5
        wkv_b = model.model.layers[i].self_attn.kv_b_proj.weight.detach().view(4, 32, 32)
        np.testing.assert_array_equal(d["w_uk"], wkv_b[:, :16].numpy())
        np.testing.assert_array_equal(d["w_uv"], wkv_b[:, 16:].numpy())


def test_absorbed_recomputation(dumped):
    out, summary, _ = dumped
    chk = check_schema(out)
    scale = chk["attrs"]["softmax_scale"]
    for i, d in chk["layers"].items():
        ref = reference_attn_out(d, chk["root"]["seq_offsets"], scale)
        assert rel(ref, d["attn_out"]) <= 1e-5, f"layer {i}"
        # the check can fail: a wrong scale or a broken causal mask is detected
        assert rel(reference_attn_out(d, chk["root"]["seq_offsets"], scale * 1.5), d["attn_out"]) > 1e-3
        bad = dict(d, q_rows=d["q_rows"] - 1)  # rows shifted by one: wrong keys visible
        bad["q_rows"][0] = d["q_rows"][0]
        assert rel(reference_attn_out(bad, chk["root"]["seq_offsets"], scale), d["attn_out"]) > 1e-3
        assert summary["max_rel_err"][i] <= 1e-5


def test_state_dict_and_globals_unchanged(dumped, model):
    _, _, sd_before = dumped
    sd = model.state_dict()
    assert sd.keys() == sd_before.keys()
    for k in sd:
        assert torch.equal(sd[k], sd_before[k]), k
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks, type(m).__name__
    assert tiny_mla.apply_rotary_emb.__module__ == "latentq.tiny_mla" and not hasattr(
        tiny_mla.apply_rotary_emb, "__wrapped__"
    )
    assert not hasattr(F.scaled_dot_product_attention, "__wrapped__")


def test_hooks_removed_after_exception(model):
    ids = torch.randint(0, 256, (1, 8))
    with pytest.raises(ZeroDivisionError):
        with LatentCapture(model):
            1 / 0
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert not hasattr(tiny_mla.apply_rotary_emb, "__wrapped__")
    with pytest.raises(ValueError, match="expected a tensor of shape"):
        with torch.no_grad(), LatentInjector(model, lambda l, n, t: t[..., :-1]):
            model(ids)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_injection_roundtrip_exact(model, seqs):
    ids = torch.as_tensor(seqs[0])[None]
    with torch.no_grad():
        ref = model(ids)
        with LatentCapture(model) as cap:
            model(ids)
        captured = {i: {n: cap.layers[i][n].clone() for n in ("c_kv", "k_pe")} for i in cap.layers}
        calls = []

        def fn(layer, name, t):
            calls.append((layer, name, tuple(t.shape)))
            return captured[layer][name].clone()

        with LatentInjector(model, fn):
            out = model(ids)
    assert torch.equal(out, ref)
    assert sorted(calls) == [(i, n, (1, SEQ_LEN, 32 if n == "c_kv" else 8)) for i in (0, 1) for n in ("c_kv", "k_pe")]


@pytest.mark.parametrize("name", ["c_kv", "k_pe"])
def test_injection_modified_changes_logits(model, seqs, name):
    ids = torch.as_tensor(seqs[0])[None]
    g = torch.Generator().manual_seed(3)

    def fn(layer, n, t):
        if n != name or layer != 1:
            return t
        return t + 0.5 * torch.randn(t.shape, generator=g)

    with torch.no_grad():
        ref = model(ids)
        with LatentInjector(model, fn, capture=True) as inj:
            out = model(ids)
        with LatentCapture(model) as cap:
            model(ids)
    assert (out - ref).abs().max() > 1e-3
    # the capture inside the injector sees the injected tensor; layer 0 is untouched
    assert not torch.equal(inj.layers[1][name], cap.layers[1][name])
    assert torch.equal(inj.layers[0][name], cap.layers[0][name])
    assert torch.equal(model(ids), ref)  # nothing left behind


def test_no_mla_modules_error(tmp_path):
    plain = torch.nn.Sequential(torch.nn.Embedding(256, 8), torch.nn.Linear(8, 256))
    with pytest.raises(MLAModuleNotFoundError, match="kv_a_proj_with_mqa"):
        LatentCapture(plain)
    with pytest.raises(MLAModuleNotFoundError, match="kv_a_proj_with_mqa"):
        dump_latents.dump(plain, {}, [np.arange(8)], 2, str(tmp_path / "x.h5"))
    assert not os.path.exists(tmp_path / "x.h5")


@pytest.fixture(scope="module")
def saved_model_dir(model, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(str(d))
    return str(d)


def test_cli_text_too_short(saved_model_dir, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_bytes(b"x" * (SEQ_LEN * NUM_SEQS - 1))
    out = tmp_path / "o.h5"
    rc = dump_latents.main(
        [
            "--model",
            saved_model_dir,
            "--text",
            str(text),
            "--seq-len",
            str(SEQ_LEN),
            "--num-seqs",
            str(NUM_SEQS),
            "--q-rows",
            "6",
            "--out",
            str(out),
        ]
    )
    assert rc == 2 and "text too short" in capsys.readouterr().err
    assert not out.exists() and os.listdir(tmp_path) == ["t.txt"]
    with pytest.raises(dump_latents.DumpError, match="too short"):
        dump_latents.windows(list(range(10)), 4, 3)


def test_cli_refuses_existing_output(saved_model_dir, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(256)) * 2)
    out = tmp_path / "o.h5"
    out.write_bytes(b"keep me")
    args = [
        "--model",
        saved_model_dir,
        "--text",
        str(text),
        "--seq-len",
        "64",
        "--num-seqs",
        "2",
        "--q-rows",
        "6",
        "--out",
        str(out),
    ]
    assert dump_latents.main(args) == 2
    assert "--force" in capsys.readouterr().err and out.read_bytes() == b"keep me"
    assert dump_latents.main(args + ["--force"]) == 0
    chk = check_schema(str(out))
    assert chk["attrs"]["source"] == "tiny-mla" and chk["attrs"]["model"] == os.path.basename(saved_model_dir)
    assert chk["attrs"]["revision"].startswith("sha256:")
    np.testing.assert_array_equal(chk["root"]["tokens"], np.arange(128) % 256)
    assert sorted(os.listdir(tmp_path)) == ["o.h5", "t.txt"]  # no temp file left


def test_interrupted_write_leaves_nothing(model, seqs, tmp_path, monkeypatch):
    out = tmp_path / "o.h5"

    def boom(self, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(h5py.Group, "create_group", boom)
    with pytest.raises(KeyboardInterrupt):
        dump_latents.dump(model, model.config.to_hf_dict(), seqs, 6, str(out))
    assert os.listdir(tmp_path) == []


def test_q_rows_errors():
    with pytest.raises(dump_latents.DumpError):
        dump_latents.select_q_rows([4, 4], 9)
    with pytest.raises(dump_latents.DumpError):
        dump_latents.select_q_rows([4, 4], 0)
    rows = dump_latents.select_q_rows([512] * 4, 256)
    assert [r.tolist()[:2] + r.tolist()[-1:] for r in rows] == [[7, 15, 511]] * 4


def test_self_check_rejects_wrong_scale(model, seqs, tmp_path, monkeypatch):
    """dump() recomputes attn_out from what it is about to write; a wrong captured scale is an error."""
    orig = capture.LatentHooks._record_scale
    monkeypatch.setattr(capture.LatentHooks, "_record_scale", lambda self, s, src: orig(self, s * 1.25, src))
    with pytest.raises(RuntimeError, match="absorbed recomputation"):
        dump_latents.dump(model, model.config.to_hf_dict(), seqs, 6, str(tmp_path / "o.h5"))
    assert os.listdir(tmp_path) == []


def test_cli_missing_text_and_model_without_config(saved_model_dir, tmp_path, capsys):
    """A missing --text file or a --model directory without config.json: exit 2, one line naming the path."""
    out = tmp_path / "o.h5"
    missing = tmp_path / "nope.txt"
    rc = dump_latents.main(["--model", saved_model_dir, "--text", str(missing), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("latentq dump: error: ") and str(missing) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(256)) * 2)
    empty_dir = tmp_path / "empty-model"
    empty_dir.mkdir()
    rc = dump_latents.main(["--model", str(empty_dir), "--text", str(text), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("latentq dump: error: ") and str(empty_dir) in err and "config.json" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()
