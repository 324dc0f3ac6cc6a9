"""ctest `study.cli_results_h5py`: a latentq results file reads with plain h5py + numpy the way
the README says (one 1-D dataset per column, columns in the order of the group's column record, strings via
.asstr()).
Usage: check_results_h5py.py RESULTS.h5   (exit 77 = skipped: no h5py)"""

import sys

try:
    import h5py
    import numpy as np
    from record_check import columns
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

with h5py.File(sys.argv[1], "r") as f:
    assert f.attrs["schema"] == "latentq-results/1", f.attrs["schema"]
    for k in ("created", "latentq_version", "git_commit", "config", "input_path", "input_sha256", "model"):
        assert isinstance(f.attrs[k], str), k
    assert len(f.attrs["input_sha256"]) == 64
    assert int(f.attrs["num_layers"]) == 4 and int(f.attrs["kv_lora_rank"]) == 16
    g = f["latent_error"]
    columns(g)
    cols = {k: (v.asstr()[:] if h5py.check_string_dtype(v.dtype) else v[:]) for k, v in g.items()}
    n = len(cols["layer"])
    assert all(v.shape == (n,) for v in cols.values())
    assert cols["layer"].dtype == np.int64 and cols["rel_fro"].dtype == np.float64
    # 4 layers x (c_kv: 3 bits x (1 + 2 + 2) + 2 extra = 17, k_pe: 3) = 80 rows
    assert n == 80, n
    assert set(cols["target"]) == {"c_kv", "k_pe"}
    fp8 = (cols["quantizer"] == "flashmla-v32-fp8") & (cols["target"] == "c_kv")
    assert fp8.sum() == 4 and (cols["granularity"][fp8] == "tile").all() and (cols["group_size"][fp8] == 128).all()
    assert (cols["rel_fro"] >= 0).all() and np.isfinite(cols["rel_fro"]).all()
    # the Gaussian bound: same normalization as rel_fro, so gap_db = 20·log10(rel_fro / bound_rel_fro)
    assert (cols["bound_rel_fro"] > 0).all() and np.isfinite(cols["gap_db"]).all()
    np.testing.assert_allclose(cols["gap_db"], 20 * np.log10(cols["rel_fro"] / cols["bound_rel_fro"]), atol=1e-9)
    # the score-space bound (the synthetic dump has attention data): finite, gap = 10·log10(score_mse / bound)
    assert (cols["score_mse"] >= 0).all() and (cols["score_bound_mse"] > 0).all(), "score columns"
    assert np.isfinite(cols["score_gap_db"]).all(), "score_gap_db"
    np.testing.assert_allclose(
        cols["score_gap_db"], 10 * np.log10(cols["score_mse"] / cols["score_bound_mse"]), atol=1e-9
    )
    for name in f:
        columns(f[name])  # every group: its datasets as its column record lists them
    # /score_vs_attention: per target one row per layer, then layer -1 (the layer means): all quantizers, then
    # each bits band of >= 3 of them (c_kv of this tiny dump: [4, 5) int2-token, int2-token-g32, int4-channel,
    # int4-tensor; [10, 11) int8-token, int8-token-g32, flashmla-v32-fp8)
    sva = {k: (v.asstr()[:] if h5py.check_string_dtype(v.dtype) else v[:]) for k, v in f["score_vs_attention"].items()}
    assert sva["layer"].tolist() == [0, 1, 2, 3, -1, -1, -1] + [0, 1, 2, 3, -1], sva["layer"]
    assert sva["target"].tolist() == ["c_kv"] * 7 + ["k_pe"] * 5, sva["target"]
    assert sva["bits_band"].tolist() == [-1] * 5 + [4, 10] + [-1] * 5, sva["bits_band"]
    assert sva["n_quantizers"].tolist() == [17] * 5 + [4, 3] + [3] * 5, sva["n_quantizers"]
    for k in ("spearman_score_mse", "spearman_mse"):
        assert np.isfinite(sva[k]).all() and (np.abs(sva[k]) <= 1).all(), (k, sva[k])
    s = f["summary"]
    assert s["quantizer"].asstr()[:].tolist()[-2:] == ["bf16", "flashmla-v32-fp8"]
    acc = dict(zip(s["quantizer"].asstr()[:], s["k_pe_accounting"].asstr()[:]))
    assert acc["int8-asym-channel-g32"] == "measured" and acc["int2-asym-tensor"] == "bf16 (not run)", acc
print(f"ok: {n} rows")
