"""`latentq study` reuses a step only when everything it read is unchanged (latentq/provenance.h): a tensor doubled
inside one shard of a 5-shard checkpoint (its index and config.json unchanged), a file only touched, the code of
latentq; a --verbose rerun prints the tables; and a spec named twice in [e2e] quantizers runs once. The checkpoint is
a random-init DeepSeek-V2 model written as DeepSeek ships one (latentq.random_checkpoint), bf16, no tokenizer."""

import os
import shutil
import subprocess

import h5py
import numpy as np
import torch
from safetensors.torch import load_file, save_file

from latentq.random_checkpoint import deepseek_tensors, random_model, write_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
assert os.path.exists(LQ), f"no latentq binary at {LQ} (build the project first)"
CONFIG = """[quantizers]
extra = ["int4-asym-channel-g16", "bf16"]
[svd]
enabled = false
[cross_layer]
enabled = false
[e2e]
quantizers = ["int4-asym-channel-g16-fp16", "int4-asym-channel-g16", "int4-asym-channel-g16"]
"""
# the layer-0 kv projection: changing it changes c_kv and k_pe of every token
TENSOR = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"


def study(model, out, cfg, text, *extra, env=None):
    args = [LQ, "study", "--model", str(model), "--text", str(text), "--out", str(out), "--config", str(cfg)]
    args += ["--seq-len", "32", "--num-seqs", "2", "--q-rows", "8", "--threads", "1", *extra]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


def make_inputs(tmp_path):
    m = random_model("v2", seed=5, num_hidden_layers=2)
    model = tmp_path / "model"
    weight_map = write_checkpoint(deepseek_tensors(m, dtype=torch.bfloat16), m.config, str(model), shards=5)
    assert len(set(weight_map.values())) == 5, sorted(set(weight_map.values()))
    text = tmp_path / "text.txt"
    text.write_bytes(b"And God said, Let there be light: and there was light. " * 8)
    cfg = tmp_path / "study.toml"
    cfg.write_text(CONFIG)
    return model, weight_map[TENSOR], text, cfg


def c_kv(dump):
    with h5py.File(dump, "r") as f:
        return f["layers/000/c_kv"][:]


def test_a_changed_shard_redoes_every_step_and_says_which_file(tmp_path):
    model, shard, text, cfg = make_inputs(tmp_path)
    out = tmp_path / "out"
    first = study(model, out, cfg, text)
    with h5py.File(out / "results.h5", "r") as f:
        runs = [q.decode() for q in f["e2e/quantizer"][:]]
        key = f["e2e"].attrs["step_key"]
    # three spellings of one spec: one run, and a warning naming them
    assert runs.count("int4-asym-channel-g16") == 1, runs
    assert "names int4-asym-channel-g16 3 times" in first, first
    assert f'"model file {shard}"' in key, key
    before = c_kv(out / "dump.h5")

    # a touched shard (new mtime and ctime, same bytes) is hashed again and found unchanged; a --verbose rerun
    # that reuses every step prints the tables of `latentq run` (the latent summary, the e2e table)
    os.utime(model / shard)
    again = study(model, out, cfg, text, "--verbose")
    for step in ("dump: reusing", "study: reusing", "e2e: reusing"):
        assert step in again, again
    assert "bytes/token (whole model)" in again and "c_kv mean" in again, again
    assert "End to end (model logits with quantized latents" in again, again

    # one tensor doubled inside the shard; the index and config.json stay as they were
    tensors = load_file(str(model / shard))
    tensors[TENSOR] = tensors[TENSOR] * 2
    save_file(tensors, str(model / shard), metadata={"format": "pt"})
    changed = study(model, out, cfg, text)
    assert f"dump: redoing {out / 'dump.h5'}: model file {shard} changed" in changed, changed
    assert "study: redoing" in changed and "dump sha256 changed" in changed, changed
    for step in ("dump: reusing", "study: reusing", "e2e: reusing"):
        assert step not in changed, changed
    assert not np.array_equal(c_kv(out / "dump.h5"), before)


def test_changed_code_redoes_the_steps_it_ran(tmp_path):
    """The Python package is part of the key of the dump and e2e steps: a copy of the sources, edited between two
    runs (LATENTQ_SOURCE_DIR points latentq at it), redoes them and says so."""
    model, _, text, cfg = make_inputs(tmp_path)
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "python"), src / "python", ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, LATENTQ_SOURCE_DIR=str(src))
    out = tmp_path / "out"
    study(model, out, cfg, text, "--no-e2e", env=env)
    with open(src / "python" / "latentq" / "dump.py", "a") as f:
        f.write("\n# an edit\n")
    r = study(model, out, cfg, text, "--no-e2e", env=env)
    assert "dump: redoing" in r and "latentq code changed" in r, r


def test_an_output_over_an_input_is_refused(tmp_path):
    model, _, text, cfg = make_inputs(tmp_path)
    r = subprocess.run(
        [LQ, "study", "--model", str(model), "--text", str(text), "--out", str(model / "out")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 2 and "lies inside the checkpoint directory --model" in r.stderr, r.stderr
    assert not (model / "out").exists()
    (tmp_path / "o").mkdir()
    shutil.copy(text, tmp_path / "o" / "results.h5")
    r = subprocess.run(
        [
            LQ,
            "study",
            "--model",
            str(model),
            "--text",
            str(tmp_path / "o" / "results.h5"),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 2 and "is the text --text" in r.stderr, r.stderr
    assert (tmp_path / "o" / "results.h5").read_bytes() == text.read_bytes()
    assert sorted(os.listdir(tmp_path / "o")) == ["results.h5"]
