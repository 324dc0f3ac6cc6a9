"""Edges of the Python steps: one spec under several spellings runs once in the e2e step (with a note), the e2e
step refuses a window of one token (no next-token metric), and the dump refuses an --out that is its --text."""

import os

import h5py
import numpy as np

import latentq
from latentq import dump as dump_latents
from latentq import e2e as e2e_inject

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "data", "tiny-mla")
ALIAS, CANON = "int4-asym-channel-g16-fp16", "int4-asym-channel-g16"


def make_results(path):
    with h5py.File(path, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        g = f.create_group("latent_error")
        str_t = h5py.string_dtype("utf-8")
        g.create_dataset("quantizer", data=np.array([CANON, CANON], dtype=object), dtype=str_t)
        g.create_dataset("target", data=np.array(["c_kv", "k_pe"], dtype=object), dtype=str_t)
        g.create_dataset("rel_fro", data=np.array([0.01, 0.01]))


def text_file(tmp_path):
    text = tmp_path / "text.txt"
    text.write_bytes((b"And God said, Let there be light: and there was light. " * 40)[:2048])
    return text


def run_e2e(res, text, *extra):
    args = ["--results", str(res), "--model", MODEL, "--text", str(text), "--offset-bytes", "0"]
    return e2e_inject.main([*args, "--num-seqs", "2", "--threads", "1", *extra])


def test_a_spec_under_several_spellings_runs_once(tmp_path, capsys):
    assert latentq.canonical_spec(ALIAS) == CANON
    res = tmp_path / "r.h5"
    make_results(res)
    assert run_e2e(res, text_file(tmp_path), "--seq-len", "64", "--quantizers", ALIAS, CANON, CANON) == 0
    with h5py.File(res, "r") as f:
        q = [x.decode() for x in f["e2e/quantizer"][:]]
    assert q == [CANON], q
    err = capsys.readouterr().err
    assert f"--quantizers names {CANON} 3 times ({ALIAS}, {CANON}, {CANON}): it runs once" in err, err


def test_a_window_of_one_token_is_refused(tmp_path, capsys):
    res = tmp_path / "r.h5"
    make_results(res)
    before = res.read_bytes()
    assert run_e2e(res, text_file(tmp_path), "--seq-len", "1") == 2
    err = capsys.readouterr().err
    assert "--seq-len 1: at least 2 tokens per sequence for a next-token metric" in err, err
    assert res.read_bytes() == before


def test_the_dump_refuses_an_out_that_is_its_text(tmp_path, capsys):
    text = text_file(tmp_path)
    before = text.read_bytes()
    link = tmp_path / "link.txt"
    os.link(text, link)
    for out in (text, link):
        rc = dump_latents.main(["--model", MODEL, "--text", str(text), "--out", str(out), "--force", "--seq-len", "8"])
        assert rc == 2
        err = capsys.readouterr().err
        assert f"the dump --out {out} is the text --text {text}" in err, err
        assert text.read_bytes() == before
    rc = dump_latents.main(["--model", MODEL, "--text", str(text), "--out", os.path.join(MODEL, "d.h5")])
    assert rc == 2 and "lies inside the checkpoint directory --model" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(MODEL, "d.h5"))


def test_the_study_refuses_a_window_of_one_token(tmp_path):
    import subprocess

    lq = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
    out = tmp_path / "out"
    args = [lq, "study", "--model", MODEL, "--text", str(text_file(tmp_path)), "--out", str(out), "--seq-len", "1"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "at least 2 tokens per sequence for a next-token metric" in r.stderr, r.stderr
    assert not out.exists()


def test_a_target_the_format_cannot_take_is_not_run(tmp_path, capsys):
    """The study's /not_applicable pairs never run: q4_0 listed on k_pe (as on a model whose k_pe is 16 wide)
    runs on c_kv alone, its decode-order run on c_kv+k_pe is left out, and one note names it."""
    reason = "ggml blocks need a row length that is a multiple of 32, got 16"
    res = tmp_path / "r.h5"
    str_t = h5py.string_dtype("utf-8")
    with h5py.File(res, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        f.attrs["decode_order_modes"] = ["decode-r0-s0-p0"]
        f.attrs["decode_order_quantizers"] = ["q4_0"]
        f.attrs["decode_order_targets"] = ["c_kv", "c_kv+k_pe"]
        columns = {
            "latent_error": {"quantizer": ["q4_0", CANON, CANON], "target": ["c_kv", "c_kv", "k_pe"]},
            "not_applicable": {"quantizer": ["q4_0"], "target": ["k_pe"], "reason": [reason]},
        }
        for group, cols in columns.items():
            for name, values in cols.items():
                f.create_dataset(f"{group}/{name}", data=np.array(values, dtype=object), dtype=str_t)
        f["latent_error/rel_fro"] = np.array([0.01, 0.01, 0.01])
        f["not_applicable/width"] = np.array([16], dtype=np.int64)
    assert run_e2e(res, text_file(tmp_path), "--seq-len", "32") == 0
    with h5py.File(res, "r") as f:
        runs = {tuple(f[f"e2e/{c}"][i].decode() for c in ("quantizer", "targets", "cache_mode")) for i in range(3)}
        assert len(f["e2e/quantizer"]) == 3
    assert runs == {
        ("q4_0", "c_kv", "prefill-at-once"),
        (CANON, "c_kv+k_pe", "prefill-at-once"),
        ("q4_0", "c_kv", "decode-r0-s0-p0"),
    }, runs
    err = capsys.readouterr().err
    assert err.count("not applicable") == 1, err
    assert f"latentq e2e: note: not applicable, not run on k_pe (16 wide): q4_0: {reason}" in err, err
