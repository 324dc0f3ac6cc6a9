"""``latentq run --no-e2e`` on a real DeepSeek-V4 dump: the tiny random-init V4 of test_dump_v4 (sliding, CSA with
rate 4, HCA with rate 8; head_dim 32, rope 8, index_head_dim 16) dumped over two sequences of 40 tokens, then studied
with a small config. /latent_error holds window_kv on every layer, compressed_kv on the CSA and HCA layers and index_k
on the CSA layer, with the bytes of the one accounting (hand-computed below) and, for int8-sym-token, the rel_fro of a
numpy recomputation of that format (docs/quantizers.md's integer conventions); an engine record whose native widths
(448 + 64) are not the entry's (24 + 8) is in /not_applicable; /v4_cache amortizes the compressed rows by their rate;
/summary, the decision and the probes say what does not apply."""

import os
import subprocess

import h5py
import numpy as np
import pytest

from latentq import dump as dump_mod
from test_dump_v4 import NUM_SEQS, Q_ROWS, SEQ_LEN, TEXT, make_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
D, ROPE, C = 32, 8, 16  # head_dim, qk_rope_head_dim, index_head_dim of the tiny V4
NA = "not applicable to deepseek_v4 (no c_kv + k_pe)"

CONFIG = """
[input]
dump = "v4.h5"
[quantizers]
bits = [8]
schemes = ["sym"]
granularities = ["token"]
group_sizes = [0]
extra = ["bf16", "flashmla-model1-fp8", "lm3-channel"]
[indexer]
quantizers = ["bf16", "int8-sym-token"]
[attention]
enabled = false  # /attention_error on V4 is the attention engine's (latentq/attention/v4.h), tested on its own
[output]
results = "r.h5"
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    d = tmp_path_factory.mktemp("v4study")
    m = make_model()
    ids = np.frombuffer(TEXT[: SEQ_LEN * NUM_SEQS], dtype=np.uint8).astype(np.int64)
    seqs = [ids[s * SEQ_LEN : (s + 1) * SEQ_LEN] for s in range(NUM_SEQS)]
    dump_mod.dump(m, m.config.to_dict(), seqs, Q_ROWS, str(d / "v4.h5"))
    (d / "study.toml").write_text(CONFIG)
    r = subprocess.run([LQ, "run", str(d / "study.toml"), "--no-e2e", "--threads", "2"], capture_output=True, text=True)
    print(r.stdout[-3000:], r.stderr[-2000:])
    assert r.returncode == 0, r.stderr
    return d, r.stdout


def table(f, group):
    g = f[group]
    return {k: (g[k][()].astype(str) if g[k].dtype.kind in "OS" else g[k][()]) for k in g}


def int8_sym_token_rel_fro(x: np.ndarray) -> float:
    """int8-sym-token of docs/quantizers.md: per row scale = fp16(absmax / 127) (float32 division, RNE), codes
    clamp(rne(x / scale), -127, 127), decode scale · code; ‖x̂ − x‖_F / ‖x‖_F in float64."""
    x = x.astype(np.float32)
    scale = (np.abs(x).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float16).astype(np.float32)
    q = np.clip(np.rint(x / scale), -127, 127)
    xh = (scale * q).astype(np.float32)
    return float(np.linalg.norm((xh - x).astype(np.float64)) / np.linalg.norm(x.astype(np.float64)))


def test_latent_error_rows_bytes_and_error(study):
    d, _ = study
    with h5py.File(d / "r.h5") as f, h5py.File(d / "v4.h5") as dump:
        le = table(f, "latent_error")
        rows = {}
        for i in range(len(le["layer"])):
            rows[(int(le["layer"][i]), le["target"][i], le["quantizer"][i])] = {k: v[i] for k, v in le.items()}
        have = lambda t: sorted({k[0] for k in rows if k[1] == t})  # noqa: E731
        assert (have("window_kv"), have("compressed_kv"), have("index_k")) == ([0, 1, 2], [1, 2], [1])
        # bytes per stored row: bf16 2·head_dim; int8-sym-token head_dim codes + one fp16 scale; index_k likewise
        assert rows[(0, "window_kv", "bf16")]["bytes_per_token_layer"] == 2 * D == 64
        assert rows[(2, "compressed_kv", "bf16")]["bytes_per_token_layer"] == 64
        assert rows[(1, "compressed_kv", "int8-sym-token")]["bytes_per_token_layer"] == D + 2 == 34
        assert rows[(1, "index_k", "int8-sym-token")]["bytes_per_token_layer"] == C + 2 == 18
        assert rows[(1, "index_k", "bf16")]["bytes_per_token_layer"] == 2 * C
        assert rows[(1, "compressed_kv", "lm3-channel")]["rel_fro"] < 0.5  # fitted on the fit split's entries
        for (layer, target, q), r in rows.items():
            if q != "int8-sym-token":
                continue
            x = dump[f"layers/{layer:03d}/{target}"][()]
            want = int8_sym_token_rel_fro(x)
            print(f"layer {layer} {target} [{x.shape[0]}, {x.shape[1]}]: rel_fro {r['rel_fro']:.9g}, numpy {want:.9g}")
            assert r["rel_fro"] == pytest.approx(want, rel=1e-9)
        assert not any(q == "flashmla-model1-fp8" for (_, _, q) in rows)
        na = table(f, "not_applicable")
        probes = {q: r for q, r in zip(na["quantizer"], na["reason"]) if q.startswith("[")}
        assert probes == {
            "[svd]": f"{NA}: the SVD of c_kv skipped",
            "[cross_layer]": f"{NA}: c_kv across layers skipped",
        }
        for t in ("window_kv", "compressed_kv"):
            i = [
                k
                for k in range(len(na["quantizer"]))
                if na["quantizer"][k] == "flashmla-model1-fp8" and na["target"][k] == t
            ]
            assert len(i) == 1 and na["width"][i[0]] == D
            assert "448 + 64" in na["reason"][i[0]] and "24 + 8" in na["reason"][i[0]]


def test_long_context_bytes_summary_and_decision(study):
    d, out = study
    with h5py.File(d / "r.h5") as f:
        v4 = table(f, "v4_cache")
        got = {
            (v4["quantizer"][i], v4["target"][i], v4["layer_type"][i]): (
                v4["bytes_per_row"][i],
                v4["bytes_per_token"][i],
                v4["bytes_per_sequence"][i],
            )
            for i in range(len(v4["quantizer"]))
        }
        # CSA 1/4 entry per token, HCA 1/8 (this model's rate); the window: 8 entries per sequence
        assert got[("int8-sym-token", "compressed_kv", "csa")][:2] == (34, 34 / 4)
        assert got[("int8-sym-token", "compressed_kv", "hca")][:2] == (34, 34 / 8)
        assert got[("int8-sym-token", "index_k", "csa")][:2] == (18, 18 / 4)
        row, tok, seq = got[("bf16", "window_kv", "sliding")]
        assert (row, seq) == (64, 8 * 64) and np.isnan(tok)
        s = table(f, "summary")
        assert set(s["c_kv_accounting"]) == {NA} and np.isnan(s["bytes_per_token_model"]).all()
        assert f.attrs["cache_family"] == "deepseek_v4" and f.attrs["head_dim"] == D
    assert f"decision: {NA}" in out
    for probe in ("svd: not applicable", "cross_layer: not applicable", "indexer: /indexer_error not applicable"):
        assert f"{probe} to deepseek_v4" in out
    # the decision and the planner budget the MLA latent cache: decide says so, plan refuses (exit 2, nothing written)
    r = subprocess.run([LQ, "decide", str(d / "r.h5")], capture_output=True, text=True)
    assert r.returncode == 0 and f"decision: {NA}" in r.stdout
    r = subprocess.run(
        [LQ, "plan", str(d / "r.h5"), "--budget", "100", "--out", str(d / "p.toml")], capture_output=True, text=True
    )
    print("plan:", r.returncode, r.stderr.strip())
    assert r.returncode == 2 and f"r.h5: the planner is {NA}" in r.stderr and not (d / "p.toml").exists()
