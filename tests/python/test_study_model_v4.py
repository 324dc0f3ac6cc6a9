"""`latentq study --model DIR` end to end on a random-init DeepSeek-V4 checkpoint as DeepSeek ships it
(latentq.random_checkpoint_v4: DeepSeek's tensor names, FP8 e4m3 with one e8m0 `.scale` byte per 128 x 128 block,
MXFP4 routed experts, 3 shards with layer 1 split across two, an MTP block; one sliding, one CSA and one HCA layer,
index_topk 3 below the CSA layer's 10 entries per sequence), in memory (--stream off) and streamed (--stream on),
offline: the dump's own check passes (the dump step exits 2 otherwise), the results hold /latent_error rows of
window_kv (every layer), compressed_kv (CSA, HCA) and index_k (CSA), /attention_error rows of every layer type,
/e2e rows, and the report; the streamed study's tables equal the in-memory one's (the same weights and arithmetic)."""

import os
import subprocess

import h5py
import numpy as np
import pytest

from latentq import random_checkpoint_v4 as rc4

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
SEQ_LEN, NUM_SEQS, Q_ROWS = 40, 2, 16

CONFIG = """
[quantizers]
bits = [4]
schemes = ["sym"]
granularities = ["token"]
group_sizes = [0]
extra = ["bf16", "mxfp4"]
[indexer]
quantizers = ["bf16", "int4-sym-token"]
"""


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    root = tmp_path_factory.mktemp("v4model")
    model = rc4.random_v4_model(seed=0, std=0.2, **rc4.PRESETS["tiny"])
    rc4.write_v4_checkpoint(rc4.v4_tensors(model, mtp_layers=1), model.config, str(root / "ckpt"), shards=3)
    (root / "small.toml").write_text(CONFIG)
    out = {}
    for stream in ("off", "on"):
        args = [LQ, "study", "--model", str(root / "ckpt"), "--text", os.path.join(ROOT, "README.md"), "--out"]
        args += [str(root / stream), "--config", str(root / "small.toml"), "--tokenizer", "bytes", "--threads", "1"]
        args += ["--seq-len", str(SEQ_LEN), "--num-seqs", str(NUM_SEQS), "--q-rows", str(Q_ROWS), "--stream", stream]
        r = subprocess.run(args, capture_output=True, text=True, timeout=900, env=ENV)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        out[stream] = (root / stream, r)
    return out


def table(path, group):
    with h5py.File(path, "r") as f:
        g = f[group]
        return {k: (g[k][()].astype(str) if g[k].dtype.kind in "OS" else g[k][()]) for k in g}


@pytest.mark.parametrize("stream", ["off", "on"])
def test_study_runs_end_to_end(studies, stream):
    d, r = studies[stream]
    assert ("layer streaming" if stream == "on" else "in memory (--stream off)") in r.stderr, r.stderr[-2000:]
    with h5py.File(d / "dump.h5", "r") as f:
        assert f.attrs["cache_family"] in ("deepseek_v4", b"deepseek_v4")
        kinds = {int(k): f["layers"][k].attrs["layer_type"] for k in f["layers"]}
    kinds = {i: (v.decode() if isinstance(v, bytes) else v) for i, v in kinds.items()}
    assert kinds == {0: "sliding", 1: "csa", 2: "hca"}
    le = table(d / "results.h5", "latent_error")
    held = {(int(layer), t) for layer, t in zip(le["layer"], le["target"])}
    want = {(0, "window_kv"), (1, "window_kv"), (2, "window_kv"), (1, "compressed_kv"), (2, "compressed_kv")}
    assert want | {(1, "index_k")} <= held, sorted(held)
    assert not any(t in ("c_kv", "k_pe") for _, t in held)
    ae = table(d / "results.h5", "attention_error")
    assert {"sliding", "csa", "hca"} <= set(ae["layer_type"]), sorted(set(ae["layer_type"]))
    e2e = table(d / "results.h5", "e2e")
    assert len(e2e["quantizer"]) > 0
    kl = dict(zip(e2e["caches"], e2e["kl_mean"]))
    want_runs = {f"window_kv={q},compressed_kv={q}" for q in ("bf16", "int4-sym-token", "mxfp4")}
    want_runs |= {"index_k=bf16", "index_k=int4-sym-token"}
    assert want_runs <= set(kl), sorted(kl)
    # the model computes in float32: bf16 window and compressed entries are a (small) quantization; bf16 index keys
    # select the same top-k here, so that run is the reference itself
    assert kl["index_k=bf16"] == 0.0, kl
    bf16 = kl["window_kv=bf16,compressed_kv=bf16"]
    assert 0 < bf16 < 1e-3 and bf16 * 100 < kl["window_kv=int4-sym-token,compressed_kv=int4-sym-token"], kl
    assert kl["index_k=int4-sym-token"] > 0, kl
    assert (d / "report" / "report.md").is_file()


def test_streamed_study_equals_in_memory(studies):
    a, b = studies["off"][0] / "results.h5", studies["on"][0] / "results.h5"
    for group, col in (("latent_error", "rel_fro"), ("attention_error", "out_rel_fro"), ("e2e", "kl_mean")):
        x, y = table(a, group)[col], table(b, group)[col]
        assert x.shape == y.shape, (group, x.shape, y.shape)
        worst = float(np.max(np.abs(x - y) / np.maximum(np.abs(x), 1e-30), initial=0.0))
        print(f"{group}.{col}: max relative difference streamed vs in memory {worst:.3g}")
        assert worst <= 1e-5, (group, worst)
