"""`latentq study --model DIR --text FILE --out OUT` on the MLA variants (tests/python/replicas.py): DeepSeek-V3.2
and GLM-5 with index_topk below the window (sparse; a GLM-5 shared layer), LongCat-Flash and Kimi-Linear as
transformers saves them, and DeepSeek-V3.2 as DeepSeek ships it (FP8, sparse), in memory (--stream off) and
streamed (--stream on), offline. The quantized and bf16 checkpoint families are test_study_checkpoints.py."""

import os
import subprocess

import h5py
import numpy as np
import pytest

from dump_checks import rel
from latentq import dump as dump_latents
from replicas import KINDS, NUM_SEQS, Q_ROWS, SEQ_LEN, STUDY_CONFIG, build, build_v32_fp8

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
CONFIG = STUDY_CONFIG
ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")

assert os.access(LQ, os.X_OK), f"the latentq CLI is not built ({LQ}; set LATENTQ_BIN or build build/latentq)"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """(_, the text, the small config, _): a random byte text of SEQ_LEN x NUM_SEQS + 7 bytes (as replicas'
    build_replicas writes it) and the one-format study config."""
    root = tmp_path_factory.mktemp("variant-inputs")
    text = root / "text.txt"
    text.write_bytes(bytes(np.random.default_rng(5).integers(0, 256, SEQ_LEN * NUM_SEQS + 7, dtype=np.uint8)))
    cfg = root / "small.toml"
    cfg.write_text(CONFIG)
    return None, str(text), str(cfg), None


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """The MLA variants of replicas.KINDS saved by transformers (float32, 200 kB shards): the DSA models sparse
    (index_topk 5 < SEQ_LEN)."""
    root = tmp_path_factory.mktemp("variants")
    paths = {}
    for kind in KINDS:
        d = str(root / kind)
        over = {"index_topk": 5} if kind in ("deepseek_v32", "glm_moe_dsa") else {}
        build(kind, seed=2, **over).save_pretrained(d, max_shard_size="200KB")
        paths[kind] = d
    return paths


@pytest.mark.parametrize("stream", ["off", "on"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_study_runs_on_the_mla_variants(replicas, variants, tmp_path, kind, stream):
    """Every step completes; the dump passed its own check (sparse attention over the dumped keys for the DSA
    models); the study's /attention_check (the C++ engine on exact latents vs attn_out) is within 1e-5."""
    _, text, cfg, _ = replicas
    out = tmp_path / "out"
    args = [LQ, "study", "--model", variants[kind], "--text", text, "--out", str(out), "--config", cfg]
    args += ["--seq-len", str(SEQ_LEN), "--num-seqs", str(NUM_SEQS), "--q-rows", str(Q_ROWS), "--threads", "1"]
    r = subprocess.run([*args, "--stream", stream], capture_output=True, text=True, timeout=900, env=ENV)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with h5py.File(out / "dump.h5", "r") as f:
        family = f.attrs.get("cache_family", "dense_mla")
        family = family.decode() if isinstance(family, bytes) else family
    assert family == ("sparse_mla" if kind in ("deepseek_v32", "glm_moe_dsa") else "dense_mla")
    with h5py.File(out / "results.h5", "r") as f:
        assert int(f.attrs["complete"]) == 1 and len(f["e2e/quantizer"]) > 0 and "decision" in f
        # the results keep the family and the indexer's width (what /summary and /not_applicable are derived from)
        attrs = {k: f.attrs[k] for k in ("cache_family", "index_head_dim") if k in f.attrs}
        with h5py.File(out / "dump.h5", "r") as d:
            widths = {g["index_k"].shape[1] for g in d["layers"].values() if "index_k" in g}
        width = widths.pop() if len(widths) == 1 else len(widths)  # one width, or 0 without an indexer
        check = f["attention_check/ref_vs_dump_rel_fro"][()]
        e2e = {k: [v.decode() if isinstance(v, bytes) else v for v in f["e2e"][k][()]] for k in f["e2e"]}
        indexer = sorted({q.decode() for q in f["indexer_error/quantizer"][()]}) if "indexer_error" in f else []
        le_index = sorted({q.decode() for q, t in zip(f["latent_error/quantizer"][()], f["latent_error/target"][()])
                           if t == b"index_k"})  # fmt: skip
    want = {"cache_family": "sparse_mla", "index_head_dim": width} if family == "sparse_mla" else {}
    got = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
    assert got == want and (width > 0) == (family == "sparse_mla"), (kind, got, want)
    # /latent_error holds the indexer key's rows (each [indexer] format) on a sparse study, none on a dense one
    assert le_index == indexer, (kind, le_index, indexer)
    # a sparse study's e2e also runs each [indexer] format on the indexer key cache alone (the latents exact)
    runs = {q: kl for q, t, kl in zip(e2e["quantizer"], e2e["targets"], e2e["kl_mean"]) if t == "index_k"}
    assert sorted(runs) == indexer and bool(indexer) == (family == "sparse_mla"), (kind, runs, indexer)
    if runs:  # bf16 keeps the top-5 of 32 (almost) everywhere; mxfp4's key moves some selections
        assert 0 <= runs["bf16"] < runs["mxfp4"], (kind, stream, runs)
    assert len(check) > 0 and float(check.max()) < 1e-5, (kind, stream, check)
    assert (out / "report" / "report.md").is_file()


@pytest.mark.parametrize("stream", ["off", "on"])
def test_study_runs_on_deepseek_v32_fp8(replicas, tmp_path_factory, tmp_path, stream, capsys):
    """DeepSeek-V3.2 as DeepSeek ships it (FP8 blocks, the indexer's wq_b / wk FP8, kv_a_proj_with_mqa a partial
    block; sparse: index_topk 5 of 32): the study completes, and the dump (its selection included) equals a dump of
    the float32 reference of the dequantized weights: c_kv and k_pe within 1e-5, the same keys read."""
    _, text, cfg, _ = replicas
    paths = build_v32_fp8(tmp_path_factory.mktemp("v32fp8"))
    ref = str(tmp_path / "ref.h5")
    argv = ["--model", paths["v32fp8-ref"], "--text", text, "--seq-len", str(SEQ_LEN), "--out", ref]
    argv += ["--num-seqs", str(NUM_SEQS), "--q-rows", str(Q_ROWS), "--threads", "1", "--stream", "off"]
    assert dump_latents.main(argv) == 0
    out = tmp_path / "out"
    args = [LQ, "study", "--model", paths["v32fp8"], "--text", text, "--out", str(out), "--config", cfg]
    args += ["--seq-len", str(SEQ_LEN), "--num-seqs", str(NUM_SEQS), "--q-rows", str(Q_ROWS), "--threads", "1"]
    r = subprocess.run([*args, "--stream", stream], capture_output=True, text=True, timeout=900, env=ENV)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with h5py.File(out / "dump.h5", "r") as f, h5py.File(ref, "r") as g:
        assert f.attrs["cache_family"] == g.attrs["cache_family"] == "sparse_mla"
        assert f.attrs["original_dtype"] == "float8_e4m3fn"
        worst = 0.0
        for n in g["layers"]:
            for k in ("c_kv", "k_pe"):
                worst = max(worst, rel(f["layers"][n][k][()], g["layers"][n][k][()]))
            for k in ("topk_offsets", "topk_keys"):
                np.testing.assert_array_equal(f["layers"][n][k][()], g["layers"][n][k][()], err_msg=f"{n}/{k}")
    with capsys.disabled():
        print(f"\nDeepSeek-V3.2 FP8 --stream {stream}: c_kv / k_pe vs the float32 reference {worst:.3g}")
    assert worst <= 1e-5, worst
    with h5py.File(out / "results.h5", "r") as f:
        assert int(f.attrs["complete"]) == 1 and len(f["e2e/quantizer"]) > 0 and len(f["indexer_error/layer"]) > 0
