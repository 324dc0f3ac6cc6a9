"""ctest `study.cli_probe_results_h5py`: the probe groups of a `latentq run` results file read
with plain h5py + numpy as study/README.md says (one 1-D dataset per column, columns in the
order of the group's column record, strings via .asstr()), with the row counts and values the
synthetic study implies.
Usage: check_probe_results_h5py.py RESULTS.h5   (exit 77 = skipped: no h5py)
The file is the run of tests/study/data/synth_study.toml on lq_synth_dump's dump: 4 layers,
kv_lora_rank 16, qk_rope_head_dim 8, sequences 96 + 64 + 96, 6 query rows per layer."""

import sys

try:
    import h5py
    import numpy as np
    from record_check import columns
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

ROWS = {
    "svd": 4 * 6,  # ranks 1, 2, 4, 8, 12, 16
    "svd_spectrum": 4 * 16,
    "cross_layer": 6,  # every pair of 4 layers
    "cross_layer_sharing": 3 * 3,  # windows 0-1, 1-2, 2-3 x ranks 4, 8, 16
    "attention_check": 4,
    # per layer: c_kv 17 quantizers, k_pe 3, c_kv+k_pe 3 (run on both), svd-rank 6
    "attention_error": 4 * (17 + 3 + 3 + 6),
}


def read(g):
    return {k: (v.asstr()[:] if h5py.check_string_dtype(v.dtype) else v[:]) for k, v in g.items()}


with h5py.File(sys.argv[1], "r") as f:
    assert f.attrs["schema"] == "latentq-results/1"
    t = {}
    for name in ROWS:
        assert name in f, (name, list(f.keys()))
        cols = columns(f[name])
        t[name] = read(f[name])
        n = len(t[name][cols[0]])
        assert all(v.shape == (n,) for v in t[name].values()), name
        assert n == ROWS[name], (name, n, ROWS[name])

sv = t["svd"]
assert sv["layer"].dtype == np.int64 and sv["heldout_rel_fro"].dtype == np.float64
assert (sv["fit_tokens"] == 96).all() and (sv["heldout_tokens"] == 160).all() and (sv["centered"] == 1).all()
for layer in range(4):
    m = sv["layer"] == layer
    assert list(sv["rank"][m]) == [1, 2, 4, 8, 12, 16]
    assert np.all(np.diff(sv["fit_rel_fro"][m]) <= 1e-12), sv["fit_rel_fro"][m]  # more rank, less fit error
    # full rank: the coefficients are rounded to bf16 (the dtype charged), so bf16-level, not 0
    assert 1e-4 < sv["fit_rel_fro"][m][-1] < 2.0**-8, sv["fit_rel_fro"][m]
    assert 1 <= sv["rank_90"][m][0] <= sv["rank_99"][m][0] <= sv["rank_999"][m][0] <= 16
    s = t["svd_spectrum"]["singular_value"][t["svd_spectrum"]["layer"] == layer]
    assert np.all(np.diff(s) <= 0) and (s >= 0).all()
cl = t["cross_layer"]
assert list(zip(cl["layer_a"], cl["layer_b"])) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
assert ((cl["cka"] >= 0) & (cl["cka"] <= 1)).all() and (
    (cl["mean_abs_pearson"] >= 0) & (cl["mean_abs_pearson"] <= 1)
).all()
assert (cl["pearson_channels"] + cl["constant_channels"] == 16).all()
sh = t["cross_layer_sharing"]
assert list(sh["window_start"]) == [0, 0, 0, 1, 1, 1, 2, 2, 2] and (sh["window"] == 2).all()
assert list(sh["rank"]) == [4, 8, 16] * 3
ac = t["attention_check"]
assert (ac["ref_vs_dump_rel_fro"] < 1e-4).all(), ac["ref_vs_dump_rel_fro"]  # synthetic attn_out is exact
assert (ac["tq"] == 6).all()
assert (ac["fold_rel_fro"] <= 1e-5).all(), ac["fold_rel_fro"]  # the rotation folds exactly
assert set(ac["fold_transforms"].astype(str)) == {"rot"}, ac["fold_transforms"]  # no transform in the study: rot
ae = t["attention_error"]
svd = np.char.startswith(ae["quantizer"].astype(str), "svd-rank")
assert set(ae["targets"][svd]) == {"c_kv"}
assert set(ae["targets"][~svd]) == {"c_kv", "k_pe", "c_kv+k_pe"}
both = ae["targets"] == "c_kv+k_pe"
assert sorted(set(ae["quantizer"][both])) == ["bf16", "int4-asym-channel-g32", "int8-asym-channel-g32"]
full = ae["quantizer"] == "svd-rank16"
# full rank with bf16 coefficients and bf16 k_pe: the same order as the bf16 row of the layer
bf16_both = (ae["quantizer"] == "bf16") & both
assert list(ae["layer"][full]) == list(ae["layer"][bf16_both]) == [0, 1, 2, 3]
ratio = ae["out_rel_fro"][full] / ae["out_rel_fro"][bf16_both]
assert ((ratio > 0.25) & (ratio < 4)).all(), ratio
# a target the row does not quantize is rounded to bf16: bf16 on c_kv alone = bf16 on both
bf16_c = (ae["quantizer"] == "bf16") & (ae["targets"] == "c_kv")
assert (ae["out_rel_fro"][bf16_c] == ae["out_rel_fro"][bf16_both]).all()
assert (ae["bytes_per_token_layer"][full] == 2 * (16 + 8)).all()
kpe = ae["targets"] == "k_pe"
assert (ae["bits_per_element_c_kv"][kpe] == 16).all()
assert np.isfinite(ae["out_rel_fro"]).all() and (ae["out_rel_fro"] >= 0).all()
assert ((ae["top1_agree"] >= 0) & (ae["top1_agree"] <= 1)).all() and (ae["kl_mean"] > -1e-9).all()
print("ok: " + ", ".join(f"/{k} {ROWS[k]} rows" for k in ROWS))
