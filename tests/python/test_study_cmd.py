"""`latentq study --model DIR --text FILE --out OUTDIR`: the one command from a checkpoint to a decision, on the
shipped tiny-mla checkpoint with a small config. It writes the dump, the results with /e2e (the dumped text,
recorded with its sha256) and a report that begins with the decision summary; a rerun reuses every stage; a
killed run resumes from its checkpoint; the e2e step refuses a text other than the dumped one."""

import hashlib
import os
import subprocess
import sys

import h5py
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
MODEL = os.path.join(ROOT, "data", "tiny-mla")
CONFIG = """[quantizers]
bits = [4]
schemes = ["asym"]
granularities = ["channel", "token"]
group_sizes = [32]
extra = ["bf16", "q4_0"]
[svd]
enabled = false
[cross_layer]
enabled = false
"""

assert os.access(LQ, os.X_OK), f"the latentq CLI is not built ({LQ}; set LATENTQ_BIN or build build/latentq)"


def study(out, cfg, text, *extra, env=None):
    args = [LQ, "study", "--model", MODEL, "--text", str(text), "--out", str(out), "--config", str(cfg)]
    args += ["--seq-len", "64", "--num-seqs", "2", "--q-rows", "16", "--threads", "1", *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture
def inputs(tmp_path):
    text = tmp_path / "text.txt"
    text.write_bytes(b"And God said, Let there be light: and there was light. And God saw the light. " * 8)
    cfg = tmp_path / "small.toml"
    cfg.write_text(CONFIG)
    return text, cfg


def test_one_command_writes_everything_and_a_rerun_reuses_it(tmp_path, inputs):
    text, cfg = inputs
    out = tmp_path / "out"
    r = study(out, cfg, text)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["dump.h5", "dump.h5.inputs", "report", "results.h5"]
    sha = hashlib.sha256(text.read_bytes()).hexdigest()
    with h5py.File(out / "dump.h5", "r") as f:
        assert f.attrs["text_sha256"] == sha and int(f.attrs["seq_len"]) == 64 and int(f.attrs["num_seqs"]) == 2
    with h5py.File(out / "results.h5", "r") as f:
        e = f["e2e"].attrs
        assert e["text"] == str(text) and e["text_sha256"] == sha and int(e["text_offset_bytes"]) == 0
        assert e["device"] == "cpu" and e["dtype"] == "float32" and e["model"] == MODEL
        assert "decision" in f
        choice = [x.decode() for x in f["decision/choice"][:]]
        quant = [x.decode() for x in f["decision/quantizer"][:]]
        # the e2e KL's interval over the 2 sequences and its per-token tail, beside the mean
        lo, kl, hi = (f["decision"][k][()] for k in ("kl_ci_lo", "kl_mean", "kl_ci_hi"))
        p999, src = f["decision/kl_p999"][()], [x.decode() for x in f["decision/source"][:]]
        e2e_rows = [i for i, s in enumerate(src) if s == "e2e"]
        assert e2e_rows and all(lo[i] <= kl[i] <= hi[i] and p999[i] >= kl[i] for i in e2e_rows), (lo, kl, hi, p999)
    # the summary names a format at the budgets where one fits (3/8 and 1/2 of bf16 for int4 on tiny-mla)
    named = [q for c, q in zip(choice, quant) if c == "uniform" and q != "-"]
    assert named and all(
        q in ("int4-asym-channel-g32", "int4-asym-token", "int4-asym-token-g32", "q4_0") for q in named
    )
    assert "decision (bytes: whole model" in r.stdout and "uniform  int4" in r.stdout
    assert "], p99.9 " in r.stdout, r.stdout[-2000:]
    compact(r.stdout)
    md = (out / "report" / "report.md").read_text().splitlines()
    assert md[2] == "## Decision"
    # a rerun: every stage reused, the files unchanged
    before = {n: (out / n).read_bytes() for n in ("dump.h5", "results.h5")}
    r2 = study(out, cfg, text)
    assert r2.returncode == 0, r2.stderr
    for line in ("dump: reusing", "study: reusing", "e2e: reusing"):
        assert line in r2.stdout, r2.stdout
    assert (out / "dump.h5").read_bytes() == before["dump.h5"]
    # another text: the dump is made again (its inputs changed), so is the study
    text.write_bytes(text.read_bytes() + b"And the evening and the morning were the first day. " * 4)
    r3 = study(out, cfg, text)
    assert r3.returncode == 0, r3.stderr
    assert "dump: reusing" not in r3.stdout and "study: reusing" not in r3.stdout
    with h5py.File(out / "results.h5", "r") as f:
        assert f["e2e"].attrs["text_sha256"] == hashlib.sha256(text.read_bytes()).hexdigest()


E2E_RUN_LINE = " prefill-at-once      KL "  # the e2e step's line per run (latentq.e2e Runner.record)


def compact(stdout: str) -> None:
    """The default terminal output: the stages' lines, the decision summary and where the tables are; none
    of the tables of `latentq run`, no line per e2e run, no JSON summary of the dump."""
    assert "tables in" in stdout and "--verbose prints them" in stdout, stdout
    assert E2E_RUN_LINE not in stdout and '"num_layers"' not in stdout, stdout
    assert len(stdout.splitlines()) < 60, f"{len(stdout.splitlines())} lines:\n{stdout}"


def test_verbose_prints_the_tables(tmp_path, inputs):
    text, cfg = inputs
    r = study(tmp_path / "out", cfg, text, "--verbose")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert E2E_RUN_LINE in r.stdout and '"num_layers"' in r.stdout and "--verbose prints them" not in r.stdout
    assert "decision (bytes: whole model" in r.stdout
    assert len(r.stdout.splitlines()) > 60, r.stdout


def test_a_killed_study_resumes(tmp_path, inputs):
    text, cfg = inputs
    out = tmp_path / "out"
    env = dict(os.environ, LATENTQ_TEST_KILL_AFTER_CELLS="5")
    r = study(out, cfg, text, "--no-e2e", env=env)
    assert r.returncode == -9, (r.returncode, r.stderr)
    assert (out / "results.h5.partial").exists() and not (out / "results.h5").exists()
    r2 = study(out, cfg, text, "--no-e2e")
    assert r2.returncode == 0, r2.stderr
    assert "dump: reusing" in r2.stdout and "5 resumed from" in r2.stdout, r2.stdout
    assert not (out / "results.h5.partial").exists()


def test_the_e2e_step_refuses_another_text(tmp_path, inputs):
    text, cfg = inputs
    out = tmp_path / "out"
    assert study(out, cfg, text, "--no-e2e").returncode == 0
    other = tmp_path / "other.txt"
    other.write_bytes(b"In the beginning God created the heaven and the earth. " * 8)
    path = [os.path.join(ROOT, "python"), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    args = ["-m", "latentq.e2e", "--results", str(out / "results.h5"), "--model", MODEL, "--text", str(other)]
    args += ["--offset-bytes", "0", "--seq-len", "64", "--num-seqs", "2", "--threads", "1"]
    args += ["--dump-text-sha256", hashlib.sha256(text.read_bytes()).hexdigest()]
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 2
    assert "is not the dumped text" in r.stderr, r.stderr


def test_bad_arguments_write_nothing(tmp_path, inputs):
    text, cfg = inputs
    r = subprocess.run(
        [LQ, "study", "--model", str(tmp_path), "--text", str(text), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "no config.json" in r.stderr
    r = subprocess.run(
        [LQ, "study", "--model", MODEL, "--text", str(tmp_path / "none"), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "no such file" in r.stderr
    assert not (tmp_path / "o").exists()


def test_one_command_on_an_fp8_sharded_deepseek_v3_checkpoint(tmp_path, inputs):
    """The FP8 checkpoint as DeepSeek ships it (e4m3 weights with 128 x 128 weight_scale_inv blocks, per-expert
    2-D weights, 3 shards with a layer across two, first_k_dense_replace 1, an MTP layer) on a CPU: the dump
    streams it (FP8), the e2e step loads it dequantized, and the report names a format per budget."""
    import torch

    from latentq.random_checkpoint import deepseek_tensors, random_model, write_checkpoint

    torch.set_num_threads(1)
    cfg = dict(hidden_size=192, intermediate_size=160, moe_intermediate_size=48, q_lora_rank=96)
    m = random_model("v3", seed=21, num_hidden_layers=4, **cfg)
    ckpt = tmp_path / "v3-fp8"
    write_checkpoint(
        deepseek_tensors(m, fp8_block=(128, 128), mtp_layers=1, seed=21),
        m.config,
        str(ckpt),
        shards=3,
        fp8_block=(128, 128),
    )
    text, _ = inputs
    small = tmp_path / "fp8.toml"  # k_pe is 16 wide here: no ggml format (blocks of 32)
    small.write_text(CONFIG.replace('"q4_0"', '"fp8-e4m3-tensor"'))
    out = tmp_path / "out"
    args = [LQ, "study", "--model", str(ckpt), "--text", str(text), "--out", str(out), "--config", str(small)]
    args += ["--seq-len", "32", "--num-seqs", "2", "--q-rows", "8", "--threads", "1"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=900, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "e2e: skipped" not in r.stdout, r.stdout[-2000:]
    with h5py.File(out / "dump.h5", "r") as f:
        assert f.attrs["original_dtype"] == "float8_e4m3fn" and int(f.attrs["num_layers"]) == 4
    with h5py.File(out / "results.h5", "r") as f:
        assert len(f["e2e/quantizer"]) > 0
        assert f["e2e"].attrs["text_sha256"] == hashlib.sha256(text.read_bytes()).hexdigest()
        named = [x.decode() for c, x in zip(f["decision/choice"][:], f["decision/quantizer"][:]) if x != b"-"]
    assert named, "no format named at any budget"
    assert (out / "report" / "report.md").read_text().splitlines()[2] == "## Decision"
