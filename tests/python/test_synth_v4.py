"""``latentq synth --preset deepseek-v4-flash`` (latentq/synth_v4.h) checked from outside the C++ that wrote it: the
file's attn_out against latentq.dump_v4.recompute_rows (float64, the attention of data/README.md "DeepSeek-V4
caches", written from transformers 5.24's DeepseekV4Attention; no code shared with the V4 engine that produced it),
the CSA picks against the index score recomputed in numpy, the dump's own check (latentq.dump_v4.check_file), and
``latentq run --no-e2e --input`` on it. The preset's shapes against the config are tests/study/test_synth_v4.cpp's.

The dump: layers 0-3 of V4-Flash's schedule (sliding, sliding, CSA rate 4, HCA rate 128), H = 64 heads of
head_dim 512 (last 64 rotated), two sequences of 256 tokens (CSA 64 entries each, HCA 2), 8 query rows, index_topk
16 (below the CSA entries the later rows see)."""

import os
import subprocess

import h5py
import numpy as np
import pytest

from latentq.dump_v4 import check_file, recompute_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
SEED, TOPK = 5, 16


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth_v4")
    cmd = [LQ, "synth", "--preset", "deepseek-v4-flash", "--layers", "4", "--seqs", "2", "--seq-len", "256"]
    cmd += ["--query-rows", "8", "--index-topk", str(TOPK), "--seed", str(SEED), "--out", str(d / "v4.h5")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "shape-faithful only" in r.stdout
    return d


def layer(f, i):
    g = f["layers"][f"{i:03d}"]
    return {k: g[k][()] for k in g}, dict(g.attrs)


def test_attn_out_equals_an_independent_recomputation(dump):
    with h5py.File(dump / "v4.h5") as f:
        off, pos = f["seq_offsets"][()], f["positions"][()]
        assert [f["layers"][n].attrs["layer_type"] for n in sorted(f["layers"])] == ["sliding", "sliding", "csa", "hca"]
        for i in range(4):
            ds, attrs = layer(f, i)
            ref = recompute_rows(ds, attrs, off, pos).numpy()
            err = np.abs(ref - ds["attn_out"]).max() / np.abs(ref).max()
            print(f"seed {SEED}, layer {i} ({attrs['layer_type']}), attn_out {ds['attn_out'].shape}: rel {err:.3g}")
            assert err <= 1e-4
            assert err > 0  # float32 storage: a recomputation that read attn_out back would give exactly 0


def test_csa_picks_are_the_top_k_of_the_index_score(dump):
    """s[i, w] = Σ_h index_w[i, h] · relu(index_q[i, h] · index_k[w]) · 128^-1/2 over the entries visible at the
    row's position p ((w + 1)·4 <= p + 1), highest first, -1 after the visible ones (DeepseekV4Indexer.forward)."""
    with h5py.File(dump / "v4.h5") as f:
        off, pos = f["seq_offsets"][()], f["positions"][()]
        ds, attrs = layer(f, 2)
    assert attrs["index_topk"] == TOPK and attrs["index_softmax_scale"] == 128**-0.5  # the model's index_head_dim**-0.5
    iq, iw, ik = (ds[k].astype(np.float64) for k in ("index_q", "index_w", "index_k"))
    co = ds["compressed_offsets"]
    full = 0
    for i, t in enumerate(ds["q_rows"]):
        s = int(np.searchsorted(off, t, side="right") - 1)
        p = int(pos[t])
        nvis = min(int(co[s + 1] - co[s]), (p + 1) // 4)
        keys = ik[co[s] : co[s] + nvis]
        score = (iw[i][:, None] * np.maximum(iq[i] @ keys.T, 0) * 128**-0.5).sum(0)
        want = np.full(TOPK, -1)
        top = np.argsort(-score, kind="stable")[:TOPK]
        want[: len(top)] = top
        np.testing.assert_array_equal(ds["index_selected"][i], want, err_msg=f"row {i}, position {p}")
        full += nvis > TOPK
    assert full >= 4, full


def test_rope_is_transformers_main_and_compress_rope(dump):
    """rope_cos / rope_sin of the query rows are transformers 5.24's DeepseekV4RotaryEmbedding at their positions: the
    "main" rope (rope_theta 1e4) on sliding layers, the "compress" rope (compress_rope_theta 1.6e5 with V4-Flash's
    config.json YaRN: factor 16, original_max_position_embeddings 65536, beta_fast 32, beta_slow 1) on CSA / HCA."""
    import torch
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

    yarn = dict(rope_type="yarn", factor=16, original_max_position_embeddings=65536, beta_fast=32, beta_slow=1)
    rope = DeepseekV4RotaryEmbedding(DeepseekV4Config(num_hidden_layers=4, rope_parameters=yarn))
    with h5py.File(dump / "v4.h5") as f:
        pos = f["positions"][()]
        for i, kind in enumerate(["main", "main", "compress", "compress"]):
            ds, attrs = layer(f, i)
            p = torch.as_tensor(pos[ds["q_rows"]].astype(np.int64))[None]
            cos, sin = rope(torch.zeros(1, 1, 1), p, layer_type=kind)
            assert attrs["rope_layer_type"] == kind and cos.shape[-1] == ds["rope_cos"].shape[1] == 32
            # float32 angles in transformers (position · inv_freq), float64 in latentq: |Δ| <= 512 · 2^-24 rad
            np.testing.assert_allclose(ds["rope_cos"], cos[0].numpy(), atol=5e-5, rtol=0)
            np.testing.assert_allclose(ds["rope_sin"], sin[0].numpy(), atol=5e-5, rtol=0)
    slow = rope.compress_inv_freq[31].item() * 160000 ** (62 / 64)
    assert abs(slow - 1 / 16) < 1e-6  # the slowest compress pair is interpolated: its frequency / 16


def test_the_dumps_own_check_passes(dump):
    """latentq.dump_v4.check_file: the spans / RoPE positions are the compressors' rule, the picks the top-k up to
    ties, attn_out the recomputation within 1e-4."""
    with h5py.File(dump / "v4.h5") as f:
        errs = check_file(f, 1e-4)
    print(errs)
    assert sorted(errs) == [0, 1, 2, 3] and max(errs.values()) < 1e-6


def test_the_study_runs_on_it(dump):
    """``latentq run --no-e2e --input``: the default config, whatever of it applies to DeepSeek-V4: /latent_error
    holds window_kv on every layer, compressed_kv on the CSA / HCA layers, index_k on the CSA layer; where the study
    checks the attention against the dump (/attention_check), it agrees to float32 rounding."""
    r = subprocess.run(
        [LQ, "run", "--no-e2e", "--input", str(dump / "v4.h5"), "--out", str(dump / "r.h5"), "--threads", "2"],
        capture_output=True,
        text=True,
    )
    print(r.stdout[-2000:], r.stderr[-2000:])
    assert r.returncode == 0, r.stderr
    assert "attention check: layer" not in r.stdout + r.stderr
    with h5py.File(dump / "r.h5") as f:
        le = f["latent_error"]
        rows = set(zip(le["layer"][()].tolist(), le["target"][()].astype(str).tolist()))
        assert {t: sorted(i for i, x in rows if x == t) for t in ("window_kv", "compressed_kv", "index_k")} == {
            "window_kv": [0, 1, 2, 3],
            "compressed_kv": [2, 3],
            "index_k": [2],
        }
        if "attention_check" in f:
            rel = f["attention_check"]["ref_vs_dump_rel_fro"][()]
            print("attention_check rel_fro", rel)
            assert len(rel) == 4 and rel.max() < 1e-5
