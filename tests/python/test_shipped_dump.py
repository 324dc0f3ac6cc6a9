"""The shipped dump data/latents/tiny-mla.h5 against the shipped weights data/tiny-mla.

Created by the lead with:
    .venv/bin/python -m latentq.kjv_text --split heldout --out /tmp/heldout.txt
    .venv/bin/python -m latentq.dump --model data/tiny-mla --text /tmp/heldout.txt \\
        --seq-len 512 --num-seqs 4 --q-rows 256 --out data/latents/tiny-mla.h5
"""

import hashlib
import os

import h5py
import numpy as np

from dump_checks import LAYER_DATASETS, check_schema, reference_attn_out, rel

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WEIGHTS = os.path.join(REPO, "data", "tiny-mla", "model.safetensors")
DUMP = os.path.join(REPO, "data", "latents", "tiny-mla.h5")
VOLATILE_ATTRS = {"created", "torch_version", "transformers_version"}


def test_shipped_dump_schema_and_recomputation():
    assert os.path.getsize(DUMP) <= 32 * 1024 * 1024
    chk = check_schema(DUMP)
    A = chk["attrs"]
    assert A["source"] == "tiny-mla" and A["rope_layout"] == "interleaved"
    assert (A["num_seqs"], A["seq_len"], A["num_layers"]) == (4, 512, 6)
    assert (A["num_heads"], A["kv_lora_rank"], A["qk_rope_head_dim"], A["qk_nope_head_dim"], A["v_head_dim"]) == (
        6,
        128,
        32,
        64,
        64,
    )
    assert A["softmax_scale"] == 96**-0.5
    for i, d in chk["layers"].items():
        assert d["q_rows"].shape == (256,)
        assert rel(reference_attn_out(d, chk["root"]["seq_offsets"], A["softmax_scale"]), d["attn_out"]) <= 1e-5, i


def test_redump_reproduces_shipped(tmp_path):
    from latentq import dump as dump_latents
    from latentq.model import DTYPES, load_model

    with h5py.File(DUMP, "r") as f:
        attrs = {k: f.attrs[k] for k in f.attrs}
        tokens, offsets = f["tokens"][()], f["seq_offsets"][()]
        n_q = f["layers/000/q_rows"].shape[0]
    with open(WEIGHTS, "rb") as fh:
        assert attrs["revision"] == "sha256:" + hashlib.sha256(fh.read()).hexdigest(), "dump made from other weights"
    model_dir = os.path.dirname(WEIGHTS)
    model, cfg, source, rev, orig, _ = load_model(model_dir, DTYPES["float32"])
    seqs = [tokens[offsets[s] : offsets[s + 1]] for s in range(len(offsets) - 1)]
    out = str(tmp_path / "redump.h5")
    dump_latents.dump(
        model,
        cfg,
        seqs,
        n_q,
        out,
        model_name=str(attrs["model"]),
        revision=rev,
        source=source,
        original_dtype=orig,
        text_sha256=str(attrs["text_sha256"]),
        extra_attrs={"tokenizer": str(attrs.get("tokenizer", "bytes"))},
    )
    with h5py.File(DUMP, "r") as a, h5py.File(out, "r") as b:
        assert set(a.attrs) == set(b.attrs)
        for k in set(a.attrs) - VOLATILE_ATTRS:
            assert np.all(a.attrs[k] == b.attrs[k]), k
        for k in ("tokens", "positions", "seq_offsets"):
            np.testing.assert_array_equal(a[k][()], b[k][()])
        assert sorted(a["layers"]) == sorted(b["layers"])
        for n in a["layers"]:
            for k in LAYER_DATASETS:
                x, y = a[f"layers/{n}/{k}"][()], b[f"layers/{n}/{k}"][()]
                assert x.dtype == y.dtype and x.shape == y.shape, (n, k)
                if k == "q_rows":
                    np.testing.assert_array_equal(x, y)
                else:
                    assert rel(y, x) <= 1e-5, (n, k, rel(y, x))


def test_shipped_tokens_are_the_heldout_text():
    from latentq.kjv_text import load_kjv, sha256, split_kjv

    _, heldout = split_kjv(load_kjv())
    with h5py.File(DUMP, "r") as f:
        tokens = f["tokens"][()]
        assert f.attrs["text_sha256"] == sha256(heldout)
        assert f.attrs["tokenizer"] == "bytes"
    np.testing.assert_array_equal(tokens, np.frombuffer(heldout[: len(tokens)], dtype=np.uint8))
