"""The e2e step's per-token statistics and intervals (latentq.e2e_stats): the values against hand-computed ones
and a numpy recomputation on hand-built logits (KL, Δp and the percentiles as llama.cpp's
tools/perplexity/perplexity.cpp defines them), the bootstrap against a literal resampling of sequences, the
intervals' coverage on synthetic runs with a known answer, NaN with one sequence, the report's note; and the
/e2e and /e2e_position columns of a tiny-mla run (that one needs the compiled latentq._core)."""

import math
import os

import h5py
import numpy as np
import pandas as pd
import pytest
import torch

from latentq import e2e_stats as S

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "data", "tiny-mla")


def llama_percentile(values, fraction):
    """llama.cpp perplexity.cpp kl_divergence()'s `percentile` lambda, transcribed: sorted values, linear
    interpolation at fraction · (n − 1)."""
    v = sorted(values)
    if fraction <= 0:
        return v[0]
    if fraction >= 1:
        return v[-1]
    p = fraction * (len(v) - 1)
    ip = int(p)
    p -= ip
    return (1 - p) * v[ip] + p * v[min(ip + 1, len(v) - 1)]


def test_hand_computed_values():
    """Two tokens of a 2-word vocabulary. Position 0: ref uniform, quant (3/4, 1/4), next token 1: KL =
    ½ ln(½ / ¾) + ½ ln(½ / ¼) = ½ ln(4/3), Δp = ¼ − ½, NLL ln 2 → ln 4; argmax 0 for both (a tie goes to the
    first). Position 1 (no next token): ref (¾, ¼), quant uniform: KL = ¾ ln(3/2) + ¼ ln(1/2), argmax 0 vs 0.
    Float64 logits (ln 3 to rounding)."""
    ln3 = math.log(3.0)
    ref = torch.tensor([[[0.0, 0.0], [ln3, 0.0]]], dtype=torch.float64)
    q = torch.tensor([[[ln3, 0.0], [0.0, 0.0]]], dtype=torch.float64)
    ids = torch.tensor([[0, 1]])
    s = S.token_stats(ref, q, ids)
    kl = [0.5 * math.log(4 / 3), 0.75 * math.log(1.5) + 0.25 * math.log(0.5)]
    np.testing.assert_allclose(s.kl, [kl], rtol=1e-12)
    np.testing.assert_array_equal(s.top1, [[1.0, 1.0]])
    np.testing.assert_allclose(s.nll_ref, [[math.log(2)]], rtol=1e-12)
    np.testing.assert_allclose(s.nll_quant, [[math.log(4)]], rtol=1e-12)
    np.testing.assert_allclose(s.delta_p, [[-0.25]], rtol=1e-12)
    m = S.run_metrics(s)
    assert m["kl_max"] == pytest.approx(max(kl), rel=1e-12)
    assert m["kl_median"] == pytest.approx(sum(kl) / 2, rel=1e-12)  # even count: the two middle values' mean
    assert m["delta_p_mean"] == pytest.approx(-0.25) and m["delta_p_rms"] == pytest.approx(0.25)
    assert m["ln_ppl_ratio"] == pytest.approx(math.log(2), rel=1e-12)
    assert m["ppl_quant"] / m["ppl_ref"] == pytest.approx(2.0, rel=1e-12)


@pytest.fixture(scope="module")
def logits():
    """Hand-built logits: 3 sequences x 9 positions x 13 words, the quantized run a perturbation of the
    reference (a few argmax flips), float32 as the step hands them over."""
    g = torch.Generator().manual_seed(7)
    ref = 3 * torch.randn(3, 9, 13, generator=g)
    q = ref + 0.8 * torch.randn(3, 9, 13, generator=g)
    ids = torch.randint(0, 13, (3, 9), generator=g)
    return ref, q, ids


def numpy_reference(ref, q, ids):
    """The per-token values recomputed in numpy from the logits (float64 softmax)."""
    r, x = ref.double().numpy(), q.double().numpy()
    lr = r - r.max(-1, keepdims=True)
    lr -= np.log(np.exp(lr).sum(-1, keepdims=True))
    lq = x - x.max(-1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(-1, keepdims=True))
    kl = (np.exp(lr) * (lr - lq)).sum(-1)
    top1 = (r.argmax(-1) == x.argmax(-1)).astype(float)
    y = ids.numpy()[:, 1:]
    pr = np.take_along_axis(np.exp(lr[:, :-1]), y[..., None], -1)[..., 0]
    pq = np.take_along_axis(np.exp(lq[:, :-1]), y[..., None], -1)[..., 0]
    return kl, top1, -np.log(pr), -np.log(pq), pq - pr


def test_against_numpy_on_hand_built_logits(logits):
    ref, q, ids = logits
    kl, top1, nll_r, nll_q, dp = numpy_reference(ref, q, ids)
    s = S.token_stats(ref, q, ids)
    for got, want in ((s.kl, kl), (s.top1, top1), (s.nll_ref, nll_r), (s.nll_quant, nll_q), (s.delta_p, dp)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)
    assert 0 < top1.mean() < 1  # some argmax flips: top-1 is tested on both outcomes
    m = S.run_metrics(s)
    flat = kl.ravel()
    want = {
        "kl_mean": flat.mean(),
        "top1_agree": top1.mean(),
        "nll_ref": nll_r.mean(),
        "nll_quant": nll_q.mean(),
        "ppl_ref": math.exp(nll_r.mean()),
        "ppl_quant": math.exp(nll_q.mean()),
        "kl_median": llama_percentile(flat, 0.5),
        "kl_p90": llama_percentile(flat, 0.9),
        "kl_p99": llama_percentile(flat, 0.99),
        "kl_p999": llama_percentile(flat, 0.999),
        "kl_max": flat.max(),
        "delta_p_mean": dp.mean(),
        "delta_p_rms": math.sqrt((dp**2).mean()),
        "ln_ppl_ratio": nll_q.mean() - nll_r.mean(),
    }
    assert set(m) == set(want)
    for k, v in want.items():
        assert m[k] == pytest.approx(v, rel=1e-10, abs=1e-14), k
    # 27 values, odd: llama.cpp's median is the middle value, the 50th linear percentile
    assert m["kl_median"] == pytest.approx(np.sort(flat)[13], rel=1e-12)
    for k in S.METRICS:  # the bootstrapped form of each metric, over all tokens, is its /e2e value
        assert S.point(s, k) == pytest.approx(m[k], rel=1e-12), k


def test_position_buckets(logits):
    """Buckets [0, 4), [4, 8), [8, 9) of 9 positions: KL and top-1 over the bucket's positions, Δp and the NLL
    over those with a next token (none in the last bucket: NaN)."""
    ref, q, ids = logits
    kl, top1, nll_r, nll_q, dp = numpy_reference(ref, q, ids)
    s = S.token_stats(ref, q, ids)
    for a, b in ((0, 4), (4, 8)):
        m = S.position_metrics(s, a, b)
        assert m["kl_mean"] == pytest.approx(kl[:, a:b].mean(), rel=1e-10)
        assert m["top1_agree"] == pytest.approx(top1[:, a:b].mean())
        assert m["kl_p90"] == pytest.approx(llama_percentile(kl[:, a:b].ravel(), 0.9), rel=1e-10)
        assert m["kl_max"] == pytest.approx(kl[:, a:b].max(), rel=1e-10)
        assert m["delta_p_rms"] == pytest.approx(math.sqrt((dp[:, a:b] ** 2).mean()), rel=1e-10)
        assert m["ln_ppl_ratio"] == pytest.approx((nll_q - nll_r)[:, a:b].mean(), rel=1e-10)
    last = S.position_metrics(s, 8, 9)
    assert last["kl_max"] == pytest.approx(kl[:, 8].max(), rel=1e-10)
    assert all(math.isnan(last[k]) for k in ("delta_p_mean", "delta_p_rms", "ln_ppl_ratio"))


def test_bootstrap_is_a_resampling_of_sequences(logits):
    """The counts-matrix form equals resampling literally: the same numpy draws of sequence indices, each
    resample's tokens pooled (the sequences concatenated) and the metric recomputed."""
    ref, q, ids = logits
    s = S.token_stats(ref, q, ids)
    R, seed = 300, 11
    counts = S.bootstrap_counts(3, R, seed)
    idx = np.random.default_rng(seed).integers(0, 3, size=(R, 3))
    assert (counts.sum(1) == 3).all()
    pooled = {
        "kl_mean": lambda i: s.kl[i].mean(),
        "top1_agree": lambda i: s.top1[i].mean(),
        "ln_ppl_ratio": lambda i: s.nll_quant[i].mean() - s.nll_ref[i].mean(),
        "delta_p_rms": lambda i: math.sqrt((s.delta_p[i] ** 2).mean()),
    }
    assert set(pooled) == set(S.METRICS)
    for k, f in pooled.items():
        lit = np.array([f(i) for i in idx])
        lo, hi = S.interval(s, k, counts)
        assert (lo, hi) == pytest.approx(tuple(np.percentile(lit, [2.5, 97.5])), rel=1e-12), k
        assert lo < hi, k
    # paired: both runs on the same draws
    s2 = S.token_stats(ref, ref + 0.5 * (q - ref), ids)
    d, lo, hi = S.paired_difference(s, s2, "kl_mean", R, seed)
    lit = np.array([s.kl[i].mean() - s2.kl[i].mean() for i in idx])
    assert d == pytest.approx(s.kl.mean() - s2.kl.mean(), rel=1e-12)
    assert (lo, hi) == pytest.approx(tuple(np.percentile(lit, [2.5, 97.5])), rel=1e-12)
    cols = S.interval_columns(s, counts)
    assert sorted(cols) == sorted(f"{k}_ci_{e}" for k in S.METRICS for e in ("lo", "hi"))


def test_one_sequence_gives_nan_intervals(logits):
    ref, q, ids = logits
    s = S.token_stats(ref[:1], q[:1], ids[:1])
    cols = S.interval_columns(s)
    assert len(cols) == 8 and all(math.isnan(v) for v in cols.values()), cols
    d, lo, hi = S.paired_difference(s, S.token_stats(ref[:1], ref[:1], ids[:1]), "kl_mean")
    assert d == pytest.approx(s.kl.mean()) and math.isnan(lo) and math.isnan(hi)
    with pytest.raises(ValueError, match=r"paired_difference: runs on different tokens"):
        S.paired_difference(s, S.token_stats(ref, q, ids), "kl_mean")


def synthetic(rng, seq_means, T=8, noise=0.5):
    """A run whose sequence i has T tokens of KL seq_means[i] + N(0, noise²) and the same ln ppl ratio."""
    n = len(seq_means)
    kl = seq_means[:, None] + rng.normal(0.0, noise, size=(n, T))
    zero = np.zeros((n, T - 1))
    return S.TokenStats(kl, np.zeros((n, T)), zero, kl[:, 1:].copy(), zero)


def coverage(n, reps=1000, seed=1):
    """How often the kl_mean and ln_ppl_ratio intervals hold the true mean 1.0 (per-sequence means drawn from
    N(1, 0.3²)), over `reps` replications of n sequences (the step's fixed draws)."""
    rng = np.random.default_rng(seed)
    counts = S.bootstrap_counts(n)
    hits = np.zeros(2)
    for _ in range(reps):
        s = synthetic(rng, rng.normal(1.0, 0.3, size=n))
        for j, k in enumerate(("kl_mean", "ln_ppl_ratio")):
            lo, hi = S.interval(s, k, counts)
            hits[j] += lo <= 1.0 <= hi
    return hits / reps


def test_interval_coverage_on_a_known_answer():
    """40 sequences: the 95% intervals hold the true mean in 92..97% of 1000 replications (binomial s.e. 0.7
    points; the percentile bootstrap of a mean runs ~1 point under nominal at this n: measured 0.935..0.951
    over four seeds). 4 sequences (the step's default): ~78% (measured 0.778), the interval too narrow: the
    bootstrap of n values spreads by sqrt((n − 1)/n) of the mean's s.e. and ignores the t quantile."""
    c40 = coverage(40)
    assert ((0.92 <= c40) & (c40 <= 0.97)).all(), c40
    c4 = coverage(4, reps=600)
    assert ((0.70 <= c4) & (c4 <= 0.86)).all(), c4


def test_paired_difference_coverage_and_width():
    """Run b = run a + a per-sequence shift ~ N(0.1, 0.05²), the sequences themselves varying by sd 1: the paired
    interval of kl_mean(b) − kl_mean(a) holds 0.1 in 92..97% of 600 replications of 40 sequences and is far
    narrower than the two runs' own intervals (the shared variation cancels)."""
    rng = np.random.default_rng(3)
    n, hits, paired_w, own_w = 40, 0, [], []
    counts = S.bootstrap_counts(n)
    for _ in range(600):
        base = rng.normal(1.0, 1.0, size=n)
        a = synthetic(rng, base, noise=0.05)
        b = synthetic(rng, base + rng.normal(0.1, 0.05, size=n), noise=0.05)
        d, lo, hi = S.paired_difference(b, a, "kl_mean")
        assert lo <= d <= hi
        hits += lo <= 0.1 <= hi
        paired_w.append(hi - lo)
        own_w.append(np.subtract(*S.interval(a, "kl_mean", counts)[::-1]))
    assert 0.92 <= hits / 600 <= 0.97, hits / 600
    assert np.mean(paired_w) < 0.1 * np.mean(own_w), (np.mean(paired_w), np.mean(own_w))


def test_report_says_why_there_is_no_interval():
    """The /e2e table of the report: the KL's interval beside it when the file has finite ones; with one
    sequence (NaN intervals) a note saying why there is none; nothing about intervals for a file without them."""
    from latentq.report.load import e2e_rows
    from latentq.report.markdown import table_e2e

    def table(lo, hi):
        cols = {
            "quantizer": np.array(["int4-asym-channel-g8"], dtype=object),
            "targets": np.array(["c_kv+k_pe"], dtype=object),
            "cache_mode": np.array(["prefill-at-once"], dtype=object),
            "kl_mean": np.array([2.5e-3]),
            "top1_agree": np.array([0.97]),
            "ppl_ref": np.array([3.0]),
            "ppl_quant": np.array([3.03]),
        }
        if lo is not None:
            cols |= {"kl_mean_ci_lo": np.array([lo]), "kl_mean_ci_hi": np.array([hi])}
        return table_e2e(e2e_rows({"e2e": pd.DataFrame(cols)}, {}), {})

    md = table(2.0e-3, 3.1e-3)
    assert "| 2.50e-03 [2.00e-03, 3.10e-03] |" in md, md
    assert "95% interval, a bootstrap over the scored sequences" in md
    md = table(math.nan, math.nan)
    assert "| 2.50e-03 |" in md and "[" not in md.split("\n\n")[1], md
    assert "No 95% intervals: /e2e scored one sequence" in md, md
    md = table(None, None)
    assert "95%" not in md, md


def run_step(tmp_path, num_seqs):
    """latentq.e2e on tiny-mla (2 quantizers, a decode-order mode, buckets of 16) over num_seqs x 48 bytes."""
    from latentq import e2e

    res = tmp_path / f"r{num_seqs}.h5"
    with h5py.File(res, "w") as f:
        f.attrs["schema"] = "latentq-results/1"
        f.attrs["decode_order_modes"] = np.array(["prefill-at-once", "decode-r8-s0-p0"], dtype=object)
        f.attrs["decode_order_position_bucket"] = np.int64(16)
        rows = [(q, t) for q in ("int4-asym-channel-g8", "int2-sym-token") for t in ("c_kv", "k_pe")]
        g = f.create_group("latent_error")
        g.create_dataset("layer", data=np.zeros(len(rows), dtype=np.int64))
        for i, k in enumerate(("quantizer", "target")):
            g.create_dataset(k, data=np.array([r[i] for r in rows], dtype=object), dtype=h5py.string_dtype())
        g.create_dataset("stored", data=np.array([r[0] for r in rows], dtype=object), dtype=h5py.string_dtype())
    text = tmp_path / "t.txt"
    text.write_bytes((b"In the beginning God created the heaven and the earth. " * 12)[:600])
    argv = ["--results", str(res), "--model", MODEL, "--text", str(text), "--offset-bytes", "0"]
    assert e2e.main(argv + ["--seq-len", "48", "--num-seqs", str(num_seqs), "--threads", "1", "--quiet"]) == 0
    with h5py.File(res, "r") as f:
        return (
            {c: v[:] for c, v in f["e2e"].items()},
            {c: v[:] for c, v in f["e2e_position"].items()},
            dict(f["e2e"].attrs),
        )


def test_e2e_step_columns(tmp_path):
    """/e2e and /e2e_position of a tiny-mla run: the spread's order (median ≤ p90 ≤ p99 ≤ p99.9 ≤ max), the
    ln ppl ratio that of the NLL columns, the buckets' maximum and token-weighted mean those of the row, the
    intervals around the point values with their draws recorded; NaN intervals with one sequence."""
    e, p, attrs = run_step(tmp_path, 3)
    assert (int(attrs["bootstrap_seed"]), int(attrs["bootstrap_resamples"])) == (S.SEED, S.RESAMPLES)
    assert len(e["kl_mean"]) == 4
    kl = [e[k] for k in ("kl_median", "kl_p90", "kl_p99", "kl_p999", "kl_max")]
    assert all((a <= b).all() for a, b in zip(kl, kl[1:])), kl
    assert (e["kl_max"] > e["kl_mean"]).all()
    np.testing.assert_allclose(e["ln_ppl_ratio"], e["nll_quant"] - e["nll_ref"], rtol=1e-9, atol=1e-12)
    assert (e["delta_p_rms"] >= np.abs(e["delta_p_mean"])).all() and (e["delta_p_rms"] > 0).all()
    for k in S.METRICS:
        assert (e[f"{k}_ci_lo"] <= e[f"{k}_ci_hi"]).all(), k
        assert (e[f"{k}_ci_lo"] <= e[k] + 1e-12).all() and (e[k] <= e[f"{k}_ci_hi"] + 1e-12).all(), k
    assert (e["kl_mean_ci_lo"] < e["kl_mean_ci_hi"]).all()
    for i in range(4):
        run = [p[c] == e[c][i] for c in ("quantizer", "targets", "cache_mode")]
        sel = run[0] & run[1] & run[2]
        assert sel.sum() == 3  # buckets [0, 16), [16, 32), [32, 48)
        assert p["kl_max"][sel].max() == pytest.approx(e["kl_max"][i], rel=1e-12)
        w = p["tokens"][sel]
        assert (w * p["kl_mean"][sel]).sum() / w.sum() == pytest.approx(e["kl_mean"][i], rel=1e-9)
    e1, _, _ = run_step(tmp_path, 1)
    for k in S.METRICS:
        assert np.isnan(e1[f"{k}_ci_lo"]).all() and np.isnan(e1[f"{k}_ci_hi"]).all(), k
    assert np.isfinite(e1["kl_p99"]).all()
