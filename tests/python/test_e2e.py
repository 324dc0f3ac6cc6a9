"""End-to-end injection (latentq.e2e) on the trained tiny-mla: bf16 latents barely move
the logits, int2-sym-tensor latents move them a lot; the /e2e group is added without losing others."""

import os
import stat

import h5py
import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "data", "tiny-mla")
assert os.path.exists(os.path.join(MODEL, "model.safetensors")), "data/tiny-mla/model.safetensors (tracked) is absent"

import latentq._core  # noqa: E402, F401  (the compiled module: its absence is an error)
from latentq import e2e as e2e_inject  # noqa: E402


def make_results(path):
    with h5py.File(path, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        g = f.create_group("latent_error")
        str_t = h5py.string_dtype("utf-8")
        g.create_dataset(
            "quantizer",
            data=np.array(["bf16", "bf16", "int2-sym-tensor", "int2-sym-tensor"], dtype=object),
            dtype=str_t,
        )
        g.create_dataset("target", data=np.array(["c_kv", "k_pe", "c_kv", "k_pe"], dtype=object), dtype=str_t)
        g.create_dataset("rel_fro", data=np.array([0.001, 0.001, 0.5, 0.5]))
        f.create_group("keepme").create_dataset("x", data=np.arange(3))


def test_bf16_tiny_kl_int2_large(tmp_path):
    text = tmp_path / "text.txt"
    text.write_bytes((b"And God said, Let there be light: and there was light. " * 40)[:2048])
    res = tmp_path / "r.h5"
    make_results(res)
    rc = e2e_inject.main(
        [
            "--results",
            str(res),
            "--text",
            str(text),
            "--offset-bytes",
            "0",
            "--seq-len",
            "256",
            "--num-seqs",
            "2",
            "--threads",
            "1",
        ]
    )
    assert rc == 0
    with h5py.File(res, "r") as f:
        assert "keepme" in f and list(f["keepme/x"][:]) == [0, 1, 2]
        e = {k: v[:] for k, v in f["e2e"].items()}
    q = [x.decode() if isinstance(x, bytes) else x for x in e["quantizer"]]
    assert q == ["bf16", "int2-sym-tensor"]
    kl = dict(zip(q, e["kl_mean"]))
    top1 = dict(zip(q, e["top1_agree"]))
    assert 0 <= kl["bf16"] < 1e-3, kl
    assert kl["int2-sym-tensor"] > 0.1, kl
    assert top1["bf16"] > 0.98 and top1["int2-sym-tensor"] < top1["bf16"]
    ppl_ref = e["ppl_ref"]
    assert np.all(ppl_ref == ppl_ref[0]) and 1.0 < ppl_ref[0] < 10.0
    assert e["ppl_quant"][1] > e["ppl_quant"][0]


def test_errors(tmp_path):
    bad = tmp_path / "bad.h5"
    with h5py.File(bad, "w") as f:
        f.attrs["schema"] = "something-else/9"
    assert e2e_inject.main(["--results", str(bad)]) == 2
    res = tmp_path / "r.h5"
    make_results(res)
    short = tmp_path / "short.txt"
    short.write_bytes(b"too short")
    assert e2e_inject.main(["--results", str(res), "--text", str(short)]) == 2
    with h5py.File(res, "r") as f:
        assert "e2e" not in f


def _err_line(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [l for l in err.strip().splitlines() if l]
    assert len(lines) == 1 and lines[0].startswith("latentq e2e: error: "), err
    return lines[0]


def test_bad_sizes_and_missing_files(tmp_path, capsys):
    res = tmp_path / "r.h5"
    make_results(res)
    for flag, v in (("--seq-len", "0"), ("--num-seqs", "0"), ("--offset-bytes", "-1")):
        assert e2e_inject.main(["--results", str(res), flag, v]) == 2
        line = _err_line(capsys)
        assert flag in line and v in line, line
    # Longer than the model's max_position_embeddings (1024): both numbers named.
    text = tmp_path / "t.txt"
    text.write_bytes(b"a" * 4096)
    assert (
        e2e_inject.main(
            ["--results", str(res), "--text", str(text), "--offset-bytes", "0", "--seq-len", "2000", "--num-seqs", "1"]
        )
        == 2
    )
    line = _err_line(capsys)
    assert "2000" in line and "max_position_embeddings 1024" in line, line
    # A missing or non-HDF5 results file: the path is named, not h5py's errno text.
    missing = tmp_path / "missing.h5"
    assert e2e_inject.main(["--results", str(missing)]) == 2
    line = _err_line(capsys)
    assert str(missing) in line and "errno" not in line.lower(), line
    garbage = tmp_path / "garbage.h5"
    garbage.write_bytes(b"not hdf5")
    assert e2e_inject.main(["--results", str(garbage)]) == 2
    line = _err_line(capsys)
    assert str(garbage) in line and "errno" not in line.lower(), line
    assert e2e_inject.main(["--results", str(res), "--text", str(tmp_path / "no.txt")]) == 2
    assert str(tmp_path / "no.txt") in _err_line(capsys)
    with h5py.File(res, "r") as f:
        assert "e2e" not in f


def test_only_the_study_layers_are_injected(tmp_path, capsys):
    """A study of layers 1 and 3: the injection touches only those (the callback sees layer_idx), the
    /e2e attrs record them, a note says the rest stay unquantized; an unknown --quantizers spec warns."""
    res = tmp_path / "r.h5"
    make_results(res)
    with h5py.File(res, "r+") as f:
        f.attrs["layers"] = "1,3"
    assert e2e_inject.study_layers(str(res)) == [1, 3]
    text = tmp_path / "text.txt"
    text.write_bytes((b"In the beginning God created the heaven and the earth. " * 20)[:512])
    rc = e2e_inject.main(
        [
            "--results",
            str(res),
            "--text",
            str(text),
            "--offset-bytes",
            "0",
            "--seq-len",
            "128",
            "--num-seqs",
            "2",
            "--threads",
            "1",
            "--quantizers",
            "int2-sym-tensor",
            "int4-sym-token",
        ]
    )
    assert rc == 0
    err = capsys.readouterr().err
    assert "layers 1,3 only" in err and "4 of 6 layers stay unquantized" in err, err
    assert "int4-sym-token is not in the study" in err and "c_kv+k_pe" in err, err
    assert "int2-sym-tensor is not in the study" not in err
    with h5py.File(res, "r") as f:
        assert f["e2e"].attrs["layers"] == "1,3"
        kl_2layers = float(f["e2e/kl_mean"][0])
    # The callback: layers outside the set pass through unchanged.
    import latentq

    fn = e2e_inject.make_inject(latentq, "int2-sym-tensor", ("c_kv",), frozenset({1, 3}))
    x = torch.randn(2, 8, 16)
    assert fn(0, "c_kv", x) is x and fn(1, "k_pe", x) is x
    assert not torch.equal(fn(1, "c_kv", x), x)
    # Without the attribute, every layer: int2 on all 6 layers moves the logits more than on 2.
    with h5py.File(res, "r+") as f:
        del f.attrs["layers"]
    assert (
        e2e_inject.main(
            [
                "--results",
                str(res),
                "--text",
                str(text),
                "--offset-bytes",
                "0",
                "--seq-len",
                "128",
                "--num-seqs",
                "2",
                "--threads",
                "1",
                "--quantizers",
                "int2-sym-tensor",
            ]
        )
        == 0
    )
    with h5py.File(res, "r") as f:
        assert f["e2e"].attrs["layers"] == "0,1,2,3,4,5"
        assert float(f["e2e/kl_mean"][0]) > kl_2layers


def test_non_finite_logits_are_an_error(tmp_path, capsys, monkeypatch):
    """No metric from a non-finite reference (the edge-input kind): NaN reference logits used to give
    NaN KL and an arbitrary top-1; now exit 2 naming the run, and the results file is left unchanged."""
    ids = torch.zeros(1, 4, dtype=torch.int64)
    good = torch.zeros(1, 4, 256)
    bad = good.clone()
    bad[0, 1, 7] = float("nan")
    assert e2e_inject.logit_metrics(good, good, ids)["kl_mean"] == 0.0
    with pytest.raises(
        ValueError,
        match=r"^the reference run \(exact latents\): 1 of 1024 logits are NaN/Inf; no "
        r"metric is computed from non-finite logits$",
    ):
        e2e_inject.logit_metrics(bad, good, ids)
    with pytest.raises(ValueError, match=r"^int4: 1 of 1024 logits are NaN/Inf"):
        e2e_inject.logit_metrics(good, bad, ids, "int4")
    # The whole script: a model whose logits are NaN. Exit 2, one error line, no /e2e written.
    from latentq import tiny_mla

    forward = tiny_mla.TinyMLAForCausalLM.forward
    monkeypatch.setattr(
        tiny_mla.TinyMLAForCausalLM, "forward", lambda self, *a, **k: forward(self, *a, **k) * float("nan")
    )
    res = tmp_path / "r.h5"
    make_results(res)
    before = res.read_bytes()
    text = tmp_path / "text.txt"
    text.write_bytes(b"In the beginning God created the heaven and the earth. " * 4)
    assert (
        e2e_inject.main(
            [
                "--results",
                str(res),
                "--text",
                str(text),
                "--offset-bytes",
                "0",
                "--seq-len",
                "64",
                "--num-seqs",
                "1",
                "--threads",
                "1",
            ]
        )
        == 2
    )
    line = _err_line(capsys)
    assert "the reference run (exact latents) of " in line and "logits are NaN/Inf" in line, line
    assert "is left unchanged" in line, line
    assert res.read_bytes() == before


def test_mixed_assignment_uses_each_layers_stored_spec(tmp_path):
    """A mixed row (a name that is no spec): the injection quantizes each (layer, target) with the
    `stored` spec of its /latent_error row, bit for bit the spec's own callback on that layer."""
    res = tmp_path / "r.h5"
    str_t = h5py.string_dtype("utf-8")
    with h5py.File(res, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        g = f.create_group("latent_error")
        g.create_dataset("layer", data=np.array([0, 0, 1, 1], dtype=np.int64))
        g.create_dataset("target", data=np.array(["c_kv", "k_pe"] * 2, dtype=object), dtype=str_t)
        g.create_dataset("quantizer", data=np.array(["mixed"] * 4, dtype=object), dtype=str_t)
        g.create_dataset(
            "stored",
            data=np.array(["int8-asym-channel-g32", "bf16", "int2-asym-channel-g32", "int4-sym-token"], dtype=object),
            dtype=str_t,
        )
    specs = e2e_inject.mixed_specs(str(res), "mixed")
    assert specs == {
        (0, "c_kv"): "int8-asym-channel-g32",
        (0, "k_pe"): "bf16",
        (1, "c_kv"): "int2-asym-channel-g32",
        (1, "k_pe"): "int4-sym-token",
    }
    import latentq

    fn = e2e_inject.make_inject(latentq, specs, ("c_kv", "k_pe"))
    x = torch.randn(2, 64, 16)
    for (layer, target), spec in specs.items():
        one = e2e_inject.make_inject(latentq, spec, ("c_kv", "k_pe"))
        assert torch.equal(fn(layer, target, x), one(layer, target, x)), (layer, target)
    assert fn(5, "c_kv", x) is x  # a layer the assignment does not cover stays exact


def test_mixed_assignment_keeps_each_layers_transform(tmp_path):
    """A mixed row whose rule is transformed ("had,int4-asym-token" in [[mixed]]): the /latent_error
    transform column puts the transform back in front of the stored spec, so the injection rotates that
    layer like the transformed quantizer's own callback; "none" leaves the spec alone."""
    res = tmp_path / "r.h5"
    str_t = h5py.string_dtype("utf-8")
    with h5py.File(res, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        g = f.create_group("latent_error")
        g.create_dataset("layer", data=np.array([0, 0], dtype=np.int64))
        g.create_dataset("target", data=np.array(["c_kv", "k_pe"], dtype=object), dtype=str_t)
        g.create_dataset("quantizer", data=np.array(["mixed"] * 2, dtype=object), dtype=str_t)
        g.create_dataset("stored", data=np.array(["int4-asym-token", "int8-asym-token"], dtype=object), dtype=str_t)
        g.create_dataset("transform", data=np.array(["had", "none"], dtype=object), dtype=str_t)
    specs = e2e_inject.mixed_specs(str(res), "mixed")
    assert specs == {(0, "c_kv"): "had,int4-asym-token", (0, "k_pe"): "int8-asym-token"}
    import latentq

    fn = e2e_inject.make_inject(latentq, specs, ("c_kv", "k_pe"))
    x = torch.randn(2, 64, 16)
    one = e2e_inject.make_inject(latentq, "had,int4-asym-token", ("c_kv",))
    assert torch.equal(fn(0, "c_kv", x), one(0, "c_kv", x))
    plain = e2e_inject.make_inject(latentq, "int4-asym-token", ("c_kv",))
    assert not torch.equal(fn(0, "c_kv", x), plain(0, "c_kv", x))


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_results_written_by_the_e2e_step_respect_the_umask(tmp_path, umask):
    """write_groups (every /e2e and /e2e_position write) renames a mkstemp file over the results; its mode
    is 0666 & ~umask like every other output, not mkstemp's 0600."""
    res = tmp_path / "r.h5"
    with h5py.File(res, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
    old = os.umask(umask)
    try:
        e2e_inject.write_groups(
            str(res), {"e2e": (e2e_inject.E2E_COLUMNS, {"kl_mean": np.array([1.0])}, {"note": "x"})}
        )
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(res).st_mode) == 0o666 & ~umask
    with h5py.File(res, "r") as f:
        assert f["e2e"]["kl_mean"][0] == 1.0 and f["e2e"].attrs["note"] == "x"
