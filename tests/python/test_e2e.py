"""End-to-end injection (experiments/e2e_inject.py) on the trained tiny-mla: bf16 latents barely move
the logits, int2-sym-tensor latents move them a lot; the /e2e group is added without losing others."""
import os
import sys

import h5py
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
sys.path.insert(0, os.environ.get("LATENTQ_PYMODULE_DIR", os.path.join(ROOT, "build", "python")))
pytest.importorskip("latentq", reason="the latentq Python module is not built")
MODEL = os.path.join(ROOT, "data", "tiny-mla")
if not os.path.exists(os.path.join(MODEL, "model.safetensors")):
    pytest.skip("data/tiny-mla/model.safetensors is absent", allow_module_level=True)

import e2e_inject  # noqa: E402


def make_results(path):
    with h5py.File(path, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        g = f.create_group("latent_error")
        str_t = h5py.string_dtype("utf-8")
        g.create_dataset("quantizer", data=np.array(["bf16", "bf16", "int2-sym-tensor", "int2-sym-tensor"], dtype=object), dtype=str_t)
        g.create_dataset("target", data=np.array(["c_kv", "k_pe", "c_kv", "k_pe"], dtype=object), dtype=str_t)
        g.create_dataset("rel_fro", data=np.array([0.001, 0.001, 0.5, 0.5]))
        f.create_group("keepme").create_dataset("x", data=np.arange(3))


def test_bf16_tiny_kl_int2_large(tmp_path):
    text = tmp_path / "text.txt"
    text.write_bytes((b"And God said, Let there be light: and there was light. " * 40)[:2048])
    res = tmp_path / "r.h5"
    make_results(res)
    rc = e2e_inject.main(["--results", str(res), "--text", str(text), "--offset-bytes", "0",
                          "--seq-len", "256", "--num-seqs", "2", "--threads", "1"])
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
