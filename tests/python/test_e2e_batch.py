"""Batched e2e forwards (latentq.e2e --batch-runs K): K runs share one forward of K x num_seqs
sequences, each run's quantizer applied to its own rows. The /e2e and /e2e_position tables equal those of
K = 1 (one forward per run) on tiny-mla: the strings, integer columns and bytes_per_token exactly, the float
metrics to a float32 tolerance (the batched GEMMs may sum in another order; the quantized values are the
same bit for bit, checked directly below)."""

import os

import h5py
import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "data", "tiny-mla")
assert os.path.exists(os.path.join(MODEL, "model.safetensors")), "data/tiny-mla/model.safetensors (tracked) is absent"

import latentq._core  # noqa: E402, F401  (the compiled module: its absence is an error)
from latentq import e2e as e2e_inject  # noqa: E402

STR = h5py.string_dtype("utf-8")
# (quantizer, target, stored) rows of /latent_error on layer 0 (the study's layers come from the root
# attribute): c_kv+k_pe, k_pe only, a transformed spec, a per-tensor scale, and a mixed assignment that
# leaves layers 2..5 exact.
LATENT_ROWS = (
    [("int4-asym-channel-g8", t, "int4-asym-channel-g8") for t in ("c_kv", "k_pe")]
    + [("int2-sym-token", "k_pe", "int2-sym-token")]
    + [("had,int4-asym-token", t, "had,int4-asym-token") for t in ("c_kv", "k_pe")]
    + [("int4-sym-tensor", t, "int4-sym-tensor") for t in ("c_kv", "k_pe")]
    + [("bf16", t, "bf16") for t in ("c_kv", "k_pe")]
)
MIXED = [(0, "c_kv", "int2-asym-channel-g8"), (1, "k_pe", "int4-sym-token")]


def make_results(path):
    with h5py.File(path, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        f.attrs["layers"] = "0,1,2,3,4,5"
        f.attrs["decode_order_modes"] = np.array(
            ["prefill-at-once", "decode-r8-s0-p0", "decode-r0-s2-p0"], dtype=object
        )
        f.attrs["decode_order_quantizers"] = np.array(
            ["int4-asym-channel-g8", "int2-sym-token", "int4-sym-tensor"], dtype=object
        )
        f.attrs["decode_order_position_bucket"] = np.int64(16)
        rows = [(0, q, t, s) for q, t, s in LATENT_ROWS] + [(l, "mixed", t, s) for l, t, s in MIXED]
        g = f.create_group("latent_error")
        g.create_dataset("layer", data=np.array([r[0] for r in rows], dtype=np.int64))
        for i, k in enumerate(("quantizer", "target", "stored"), 1):
            g.create_dataset(k, data=np.array([r[i] for r in rows], dtype=object), dtype=STR)


def run_script(tmp_path, k):
    res = tmp_path / f"r{k}.h5"
    make_results(res)
    text = tmp_path / "t.txt"
    text.write_bytes((b"In the beginning God created the heaven and the earth. " * 12)[:600])
    rc = e2e_inject.main(
        [
            "--results",
            str(res),
            "--model",
            MODEL,
            "--text",
            str(text),
            "--offset-bytes",
            "0",
            "--seq-len",
            "48",
            "--num-seqs",
            "3",
            "--threads",
            "1",
            "--batch-runs",
            str(k),
        ]
    )
    assert rc == 0, k
    with h5py.File(res, "r") as f:
        # 0 = auto: the prefill-at-once runs by the memory bound (16 at 3 x 48 tokens), decode-order runs alone
        assert (int(f["e2e"].attrs["batch_runs"]), int(f["e2e"].attrs["batch_runs_decode"])) == (
            (k, k) if k else (16, 1)
        )
        return {n: {c: v[:] for c, v in f[n].items()} for n in ("e2e", "e2e_position")}


# Float metrics: an absolute float32-level bound. KL of two logit sets that agree to ~1e-6 relative
# moves by ~1e-9 nats; ppl/nll by ~1e-6 relative; top-1 can flip only on an argmax tie (none here: exact),
# so its interval is exact too (the same bootstrap draws); Δp, a probability difference, by ~1e-7.
KL_COLS = ("kl_mean", "kl_median", "kl_p90", "kl_p99", "kl_p999", "kl_max", "kl_mean_ci_lo", "kl_mean_ci_hi")
ATOL = {
    **dict.fromkeys(KL_COLS, 1e-8),
    **dict.fromkeys(("nll_ref", "nll_quant", "ppl_ref", "ppl_quant"), 1e-5),
    **dict.fromkeys(("ln_ppl_ratio", "ln_ppl_ratio_ci_lo", "ln_ppl_ratio_ci_hi"), 1e-5),
    **dict.fromkeys(("delta_p_mean", "delta_p_rms", "delta_p_rms_ci_lo", "delta_p_rms_ci_hi"), 1e-6),
}


def test_batched_tables_equal_one_run_per_forward(tmp_path):
    one = run_script(tmp_path, 1)
    # 3: ragged chunks (the reference + 6 prefill runs = 7; 6 decode runs); 16: one chunk per kind; 0: auto
    for k in (3, 16, 0):
        many = run_script(tmp_path, k)
        for name in ("e2e", "e2e_position"):
            a, b = one[name], many[name]
            assert sorted(a) == sorted(b), name
            assert len(a["kl_mean"]) == (12 if name == "e2e" else 3 * 12), name
            for col in a:
                if a[col].dtype.kind in "fc" and col in ATOL:
                    np.testing.assert_allclose(b[col], a[col], rtol=0, atol=ATOL[col], err_msg=f"K={k} {name}/{col}")
                else:  # strings, counts, R/S/P, scale_causal, bytes_per_token (no forward involved), top-1
                    assert np.array_equal(a[col], b[col]), (k, name, col, a[col], b[col])
    kl = dict(
        zip(
            [(q.decode(), m.decode()) for q, m in zip(one["e2e"]["quantizer"], one["e2e"]["cache_mode"])],
            one["e2e"]["kl_mean"],
        )
    )
    assert kl[("bf16", "prefill-at-once")] < 1e-3 < kl[("int2-sym-token", "prefill-at-once")]  # the runs differ
    assert kl[("mixed", "prefill-at-once")] > 0


def test_batch_hooks_give_each_run_its_own_values():
    """The batched callbacks hand run k's rows to run k's quantizer: the same quantized values bit for bit
    as alone (prefill), and per-row masks / the model's own output on rows a run leaves exact (decode)."""
    import latentq
    from latentq.inject import DecodeOrderAttention
    from latentq.model import load_model, run_model

    torch.manual_seed(0)
    x = torch.randn(6, 40, 16)  # 3 runs x 2 sequences
    mixed = {(0, "c_kv"): "int2-asym-channel-g8"}
    specs = ["int4-asym-channel-g8", mixed, "int4-sym-tensor"]
    fns = [e2e_inject.make_inject(latentq, s, ("c_kv", "k_pe")) for s in specs]
    out = e2e_inject.batch_inject(fns, 2)(0, "c_kv", x)
    for k, f in enumerate(fns):
        assert torch.equal(out[2 * k : 2 * k + 2], f(0, "c_kv", x[2 * k : 2 * k + 2])), k
    # rows 0-1: the reference (exact); 2-3: int4 quantizes layer 3; 4-5: the mixed assignment leaves it exact
    out = e2e_inject.batch_inject([None] + fns[:2], 2)(3, "k_pe", x)
    assert torch.equal(out[:2], x[:2]) and torch.equal(out[4:], x[4:]) and not torch.equal(out[2:4], x[2:4])

    # float64: float32 GEMMs of another batch size differ by ~1e-7, which flips a bf16 rounding of a later
    # layer's c_kv now and then (1e-3 on a logit); in float64 the rows must agree to rounding
    model = load_model(MODEL, torch.float32, False)[0].double()
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    mode = "decode-r8-s0-p0"
    caches = [e2e_inject.make_decode_cache(latentq, s, ("c_kv", "k_pe"), None, mode) for s in specs]
    with torch.no_grad():
        alone = []
        for c in caches:
            with DecodeOrderAttention(model, c):
                alone.append(run_model(model, ids))
        with DecodeOrderAttention(model, e2e_inject.batch_decode_cache(caches, 2)):
            batched = run_model(model, ids.repeat(3, 1)).split(2)
    for k in range(3):  # GEMMs of another batch size: equal to float64 rounding, not bit for bit
        assert float((batched[k] - alone[k]).abs().max()) < 1e-9 * float(alone[k].abs().max()), k
    assert float((alone[0] - alone[2]).abs().max()) > 1e-2  # the runs are told apart


def test_a_refused_spec_gives_the_unbatched_error(tmp_path, capsys, monkeypatch):
    """A quantizer that raises inside a batched forward: the batch is replayed run by run, so the output
    lines and the error (naming the spec) are those of K = 1, and the results file is left unchanged."""
    make = e2e_inject.make_inject

    def refusing(latentq, spec, targets, layers=None, bases=None):
        fn = make(latentq, spec, targets, layers, bases)
        if spec != "int4-sym-tensor":
            return fn

        def bad(layer, name, x):
            raise ValueError("int4-sym-tensor: refused by the test")

        return bad

    monkeypatch.setattr(e2e_inject, "make_inject", refusing)
    text = tmp_path / "t.txt"
    text.write_bytes((b"In the beginning God created the heaven and the earth. " * 4)[:200])
    outs = []
    for k in (1, 16):
        res = tmp_path / f"r{k}.h5"
        make_results(res)
        before = res.read_bytes()
        assert (
            e2e_inject.main(
                [
                    "--results",
                    str(res),
                    "--model",
                    MODEL,
                    "--text",
                    str(text),
                    "--offset-bytes",
                    "0",
                    "--seq-len",
                    "32",
                    "--num-seqs",
                    "2",
                    "--threads",
                    "1",
                    "--batch-runs",
                    str(k),
                ]
            )
            == 2
        )
        assert res.read_bytes() == before
        cap = capsys.readouterr()
        outs.append((cap.out, cap.err.replace(str(res), "RES")))
    assert outs[0] == outs[1]
    lines = outs[0][0].splitlines()
    assert [l.split()[0] for l in lines] == ["int4-asym-channel-g8", "int2-sym-token", "had,int4-asym-token"], lines
    assert outs[0][1].strip() == "latentq e2e: error: int4-sym-tensor: refused by the test; RES is left unchanged"
