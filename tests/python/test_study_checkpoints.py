"""`latentq study --model DIR --text FILE --out OUT`, the front door, on replicas of the checkpoints users download
(tests/python/replicas.py: Kimi-K2-Thinking INT4 with its config as shipped, Mistral-Large-3 FP8 blocks,
DeepSeek-R1-FP4 NVFP4, Kimi-K2-Instruct DeepSeek FP8 with its own tokenizer code, GLM-4.7-Flash and MiniCPM3 in
bf16 as transformers saves them; the MLA variants and DeepSeek-V3.2 are test_study_variants.py), in memory
(--stream off) and streamed (--stream on), offline: every step runs (dump, cells, e2e, decision, report), and the
dump's c_kv and k_pe equal those of a dump of the float32 reference within 1e-5 relative (the same weights and
arithmetic: the maximum is printed). A tokenizer that is the checkpoint's own code loads with --trust-remote-code
and stops the study with exit 2, naming the class and the flag, without it."""

import os
import subprocess

import h5py
import pytest

from dump_checks import check_schema, rel
from latentq import dump as dump_latents
from replicas import FAMILIES, NUM_SEQS, Q_ROWS, SEQ_LEN, STUDY_CONFIG, build_native_replicas, build_replicas

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
CONFIG = STUDY_CONFIG
ALL = (*FAMILIES, "glm", "minicpm3")
MODEL_CLASS = {"glm": "Glm4MoeLiteForCausalLM", "minicpm3": "MiniCPM3ForCausalLM"}
ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")

assert os.access(LQ, os.X_OK), f"the latentq CLI is not built ({LQ}; set LATENTQ_BIN or build build/latentq)"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    root = tmp_path_factory.mktemp("front")
    paths, text = build_replicas(root)
    paths.update(build_native_replicas(root))
    cfg = root / "small.toml"
    cfg.write_text(CONFIG)
    refs = {}
    for name in ALL:  # the reference's dump: transformers' from_pretrained of the float32 weights
        out = str(root / f"{name}-ref.h5")
        argv = ["--model", paths[name + "-ref"], "--text", text, "--seq-len", str(SEQ_LEN), "--out", out]
        argv += ["--num-seqs", str(NUM_SEQS), "--q-rows", str(Q_ROWS), "--threads", "1", "--stream", "off"]
        argv += ["--trust-remote-code"] if name == "instruct" else []
        assert dump_latents.main(argv) == 0, argv
        refs[name] = check_schema(out)
    return paths, text, str(cfg), refs


def study(replicas, out, name, *extra):
    paths, text, cfg, _ = replicas
    args = [LQ, "study", "--model", paths[name], "--text", text, "--out", str(out), "--config", cfg]
    args += ["--seq-len", str(SEQ_LEN), "--num-seqs", str(NUM_SEQS), "--q-rows", str(Q_ROWS), "--threads", "1"]
    return subprocess.run([*args, *extra], capture_output=True, text=True, timeout=900, env=ENV)


@pytest.mark.parametrize("stream", ["off", "on"])
@pytest.mark.parametrize("name", ALL)
def test_study_runs_on_the_checkpoint_as_shipped(replicas, tmp_path, name, stream, capsys):
    out = tmp_path / "out"
    extra = ["--stream", stream] + (["--trust-remote-code"] if name == "instruct" else [])
    r = study(replicas, out, name, *extra)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert ("layer streaming" if stream == "on" else "in memory (--stream off)") in r.stderr, r.stderr[-2000:]
    got, ref = check_schema(str(out / "dump.h5")), replicas[3][name]
    assert sorted(got["layers"]) == sorted(ref["layers"]) == [0, 1, 2]
    worst = max(rel(got["layers"][i][k], ref["layers"][i][k]) for i in ref["layers"] for k in ("c_kv", "k_pe"))
    with capsys.disabled():
        print(f"\n{name} --stream {stream}: max rel. difference of c_kv / k_pe to the float32 reference {worst:.3g}")
    assert worst <= 1e-5, (name, stream, worst)
    with h5py.File(out / "dump.h5", "r") as f:
        a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    assert a["model_class"] == MODEL_CLASS.get(name, "DeepseekV3ForCausalLM") and a["compute_dtype"] == "float32"
    assert a["tokenizer"] == ("TikTokenTokenizer" if name == "instruct" else "bytes")
    if name == "kimi":  # model_type kimi_k2 with auto_map: transformers' own class, said once and recorded
        assert "model_type 'kimi_k2'" in a["model_class_note"] and "DeepseekV3ForCausalLM" in a["model_class_note"]
        assert "(the checkpoint's model code is not run)" in r.stderr
    else:
        assert a["model_class_note"] == ""
    with h5py.File(out / "results.h5", "r") as f:
        assert int(f.attrs["complete"]) == 1 and len(f["e2e/quantizer"]) > 0 and "decision" in f
    assert (out / "report" / "report.md").is_file()


def test_a_tokenizer_that_is_remote_code_needs_the_flag(replicas, tmp_path):
    """Kimi-K2-Instruct without --trust-remote-code: exit 2 naming the tokenizer class and the flag; no byte
    tokens in silence, and no output directory left behind."""
    out = tmp_path / "out"
    r = study(replicas, out, "instruct", "--stream", "off")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "its tokenizer TikTokenTokenizer does not load" in r.stderr, r.stderr[-2000:]
    assert "pass --trust-remote-code if you trust it" in r.stderr
    assert not out.exists()
