"""The layer-streamed e2e step (latentq.e2e --stream on) against the in-memory one (--stream off) on
the same runs: random-init checkpoints written as DeepSeek ships them (latentq.random_checkpoint), a
DeepseekV3 in FP8 e4m3 with 128 x 128 weight_scale_inv blocks (3 shards, a layer across two, per-expert
2-D weights, first_k_dense_replace 1, an MTP layer the model does not have) and a DeepseekV2 in bf16.

Both ways run the same modules on the same inputs with the same chunks of runs (the reference and the
prefill-at-once runs batched, the decode-order runs alone), and the in-memory model holds the weights
the streamer loads (latentq.stream's FP8 dequantization in both), so every column of /e2e and
/e2e_position must be equal bit for bit; only the /e2e attribute ``execution`` differs.
"""

import os

import h5py
import numpy as np
import pytest
import transformers  # noqa: F401  (latentq.random_checkpoint builds HF models: its absence is an error)

import latentq._core  # noqa: F401  (the compiled module: its absence is an error)
from latentq import e2e as e2e_inject
from latentq.random_checkpoint import deepseek_tensors, random_model, write_checkpoint

STR = h5py.string_dtype("utf-8")
# (quantizer, target) rows of /latent_error on every layer: k_pe is 16 wide (no 32-blocks)
LATENT_ROWS = [
    ("int4-asym-channel-g8", "c_kv"),
    ("int4-asym-channel-g8", "k_pe"),
    ("had,int4-asym-token", "c_kv"),
    ("int2-sym-token", "k_pe"),
    ("fp8-e4m3-tensor", "c_kv"),
    ("fp8-e4m3-tensor", "k_pe"),
]


def make_results(path, layers: int):
    with h5py.File(path, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        f.attrs["layers"] = ",".join(map(str, range(layers)))
        f.attrs["decode_order_modes"] = np.array(["prefill-at-once", "decode-r8-s2-p0"], dtype=object)
        f.attrs["decode_order_quantizers"] = np.array(["int4-asym-channel-g8"], dtype=object)
        f.attrs["decode_order_position_bucket"] = np.int64(8)
        rows = [(l, q, t) for l in range(layers) for q, t in LATENT_ROWS]
        g = f.create_group("latent_error")
        g.create_dataset("layer", data=np.array([r[0] for r in rows], dtype=np.int64))
        g.create_dataset("quantizer", data=np.array([r[1] for r in rows], dtype=object), dtype=STR)
        g.create_dataset("target", data=np.array([r[2] for r in rows], dtype=object), dtype=STR)
        g.create_dataset("stored", data=np.array([r[1] for r in rows], dtype=object), dtype=STR)


def run_e2e(tmp_path, ckpt, stream: str, text, extra=()):
    res = tmp_path / f"{os.path.basename(ckpt)}-{stream}.h5"
    make_results(res, 4)
    argv = ["--results", str(res), "--model", str(ckpt), "--text", str(text), "--offset-bytes", "0"]
    argv += ["--seq-len", "24", "--num-seqs", "2", "--threads", "1", "--batch-runs", "3", "--stream", stream]
    assert e2e_inject.main(argv + list(extra)) == 0, (ckpt, stream)
    with h5py.File(res, "r") as f:
        tables = {n: {c: v[:] for c, v in f[n].items()} for n in ("e2e", "e2e_position")}
        return tables, dict(f["e2e"].attrs)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("ckpt")
    v3 = random_model("v3", seed=31, num_hidden_layers=4, hidden_size=160, intermediate_size=144, q_lora_rank=96)
    write_checkpoint(
        deepseek_tensors(v3, fp8_block=(128, 128), mtp_layers=1, seed=31),
        v3.config,
        str(d / "v3-fp8"),
        shards=3,
        fp8_block=(128, 128),
    )
    v2 = random_model("v2", seed=32, num_hidden_layers=4)
    write_checkpoint(deepseek_tensors(v2), v2.config, str(d / "v2-bf16"), shards=3)
    text = d / "text.txt"
    text.write_bytes(bytes((7 * i + 3) % 251 for i in range(4096)))  # byte tokens (no tokenizer files)
    return d / "v3-fp8", d / "v2-bf16", text


@pytest.mark.parametrize("which", [0, 1], ids=["v3-fp8-3-shards", "v2-bf16"])
def test_streamed_e2e_equals_in_memory(tmp_path, checkpoints, which):
    ckpt, text = checkpoints[which], checkpoints[2]
    (mem, mem_attrs), (streamed, st_attrs) = (run_e2e(tmp_path, ckpt, s, text) for s in ("off", "on"))
    assert mem_attrs["execution"] == "in memory"
    assert st_attrs["execution"] == "layer streaming (hidden states in memory)"
    for name in ("e2e", "e2e_position"):
        a, b = mem[name], streamed[name]
        assert sorted(a) == sorted(b), name
        # 4 prefill-at-once quantizers + 1 decode-order run; 24 positions in buckets of 8
        assert len(a["kl_mean"]) == (5 if name == "e2e" else 5 * 3), (name, len(a["kl_mean"]))
        for col in a:
            assert np.array_equal(a[col], b[col]), (ckpt.name, name, col, a[col], b[col])
    kl = dict(zip([q.decode() for q in mem["e2e"]["quantizer"]], mem["e2e"]["kl_mean"]))
    assert 0 < kl["fp8-e4m3-tensor"] < kl["int2-sym-token"], kl  # the runs differ: the hooks switched per input


def test_streamed_e2e_spills_hidden_states_under_a_small_budget(tmp_path, checkpoints, capsys):
    """A memory budget below one layer + the hidden states puts the states in a temporary file beside the
    results (removed after); the rows stay those of the in-memory run."""
    ckpt, text = checkpoints[1], checkpoints[2]
    mem, _ = run_e2e(tmp_path, ckpt, "off", text)
    spilled, attrs = run_e2e(tmp_path, ckpt, "on", text, ["--memory-budget", "64K"])
    assert attrs["execution"] == "layer streaming (hidden states in a file)"
    for col, v in mem["e2e"].items():
        assert np.array_equal(v, spilled["e2e"][col]), col
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{ckpt.name}-off.h5", f"{ckpt.name}-on.h5"]), (
        "a temporary file of hidden states was left behind"
    )


def test_stream_on_refuses_a_checkpoint_it_cannot_stream(tmp_path, capsys):
    """tiny-mla is a single-file checkpoint that always fits: --stream on is a user error (exit 2, the file
    left as it was)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    model = os.path.join(root, "data", "tiny-mla")
    res = tmp_path / "r.h5"
    make_results(res, 1)
    before = res.read_bytes()
    rc = e2e_inject.main(["--results", str(res), "--model", model, "--stream", "on", "--seq-len", "16"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "latentq e2e: error:" in err, err
    assert res.read_bytes() == before


@pytest.mark.parametrize("device", ["bogus", "meta"])
def test_a_device_that_cannot_run_the_model_is_one_error_line(tmp_path, checkpoints, capsys, device):
    """--device that is no torch device, or a device type other than cpu/cuda: exit 2 with one line naming
    the value, in the e2e step (results file unchanged) and in the dump (no output file)."""
    from latentq import dump as dump_latents

    ckpt, text = checkpoints[1], checkpoints[2]
    res = tmp_path / "r.h5"
    make_results(res, 4)
    before = res.read_bytes()
    assert e2e_inject.main(["--results", str(res), "--model", str(ckpt), "--device", device]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith(f"latentq e2e: error: --device {device}: "), err
    assert res.read_bytes() == before
    out = tmp_path / "d.h5"
    argv = ["--model", str(ckpt), "--text", str(text), "--out", str(out), "--device", device, "--seq-len", "16"]
    assert dump_latents.main(argv) == 2
    err = capsys.readouterr().err
    assert f"latentq dump: error: --device {device}: " in err and "Traceback" not in err, err
    assert not out.exists()


def test_a_spill_file_that_cannot_be_written_is_one_error_line(tmp_path, checkpoints, capsys, monkeypatch):
    """The hidden states spilled under a small budget, their file's writes failing (a full disk): exit 2
    with one line naming the error, the results file unchanged, no temporary file left."""
    import errno

    import latentq.stream

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    ckpt, text = checkpoints[1], checkpoints[2]
    res = tmp_path / "r.h5"
    make_results(res, 4)
    before = res.read_bytes()
    monkeypatch.setattr(latentq.stream.os, "pwrite", full)
    argv = ["--results", str(res), "--model", str(ckpt), "--text", str(text), "--offset-bytes", "0"]
    argv += ["--seq-len", "24", "--num-seqs", "2", "--threads", "1", "--stream", "on", "--memory-budget", "64K"]
    assert e2e_inject.main(argv) == 2
    err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("latentq e2e: error:")]
    assert len(err) == 1 and "No space left on device" in err[0], err
    assert res.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5"]
