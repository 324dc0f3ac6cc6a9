"""latentq.fit_layer_rotation, the study's one fit of a transform from a dump (latentq/fit_layer.h): it reads what
the transform's row of the table says the fit needs, and gives bit for bit the basis of fit_rotation on the arrays
read by hand (klt: the latent; sklt: also the layer's query rows, q_nope with W_UK for c_kv, q_pe for k_pe). The
table reaches Python as latentq.transform_rows(); fit_layer_missing says why a dump cannot give a fit."""

import os
import shutil

import h5py
import numpy as np
import pytest

import latentq
import latentq._core  # noqa: F401  (the compiled module: its absence is an error)
from latentq.fitted_basis import fitted_transforms, needs_basis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DUMP = os.path.join(ROOT, "data", "latents", "tiny-mla.h5")
assert os.path.exists(DUMP), "data/latents/tiny-mla.h5 (tracked) is absent"


def test_transform_table_reaches_python():
    rows = {r["name"]: r for r in latentq.transform_rows()}
    assert list(rows)[:4] == ["had", "rot", "klt", "sklt"]  # today's rows first, in enum order; new rows after them
    assert [n for n, r in rows.items() if r["fitted"]][:2] == ["klt", "sklt"]
    assert rows["had"]["block"] and rows["had"]["seed"] and not rows["klt"]["seed"]
    assert rows["klt"]["fit_reads"] == "latent" and rows["sklt"]["fit_reads"] == "latent+queries"
    assert rows["had"]["fit_reads"] == "" and rows["rot"]["orthogonal"] and not rows["sklt"]["orthogonal"]
    assert fitted_transforms() == tuple(n for n, r in rows.items() if r["fitted"])
    assert needs_basis("klt,tc3") and needs_basis("sklt,tc2-lm")
    assert not needs_basis("had64,tc3") and not needs_basis("tc3") and not needs_basis(None)


@pytest.mark.parametrize("layer", [0, 3])
@pytest.mark.parametrize("target", ["c_kv", "k_pe"])
def test_fit_layer_rotation_is_fit_rotation_of_the_arrays(layer, target):
    """The same bytes as fitting the arrays read here by hand, the old path of the e2e step."""
    with h5py.File(DUMP, "r") as f:
        so = [int(v) for v in f["seq_offsets"][:]]
        g = f[f"layers/{layer:03d}"]
        x = np.ascontiguousarray(g[target][:], dtype=np.float32)
        q = g["q_nope" if target == "c_kv" else "q_pe"][:]
        w = g["w_uk"][:] if target == "c_kv" else None
        rows = g["q_rows"][:].tolist()
    D = x.shape[1]
    R = latentq.fit_layer_rotation(DUMP, layer, target, "klt")
    assert R.shape == (D, D) and R.dtype == np.float32
    assert np.array_equal(R, latentq.fit_rotation(x, "klt", so)), (layer, target)
    AB = latentq.fit_layer_rotation(DUMP, layer, target, "sklt")
    assert AB.shape == (2, D, D) and AB.dtype == np.float32
    assert np.array_equal(AB, latentq.fit_rotation(x, "sklt", so, q, w, rows)), (layer, target)
    # a built transform is its fixed matrix
    assert np.array_equal(latentq.fit_layer_rotation(DUMP, layer, target, "had"), latentq.rotation_matrix("had", D))


def test_what_a_dump_cannot_fit_is_named(tmp_path):
    dump = tmp_path / "dump.h5"
    shutil.copyfile(DUMP, dump)
    assert latentq.fit_layer_missing(str(dump), "sklt") == ""
    assert latentq.fit_layer_missing(str(dump), "klt", [1]) == ""
    with h5py.File(dump, "a") as f:
        del f["layers/002/q_rows"]
        del f["layers/004/q_rows"]
    assert latentq.fit_layer_missing(str(dump), "sklt", [1, 3]) == ""
    bare = f"{dump} has no query rows in /layers/002, which sklt fits on"
    assert latentq.fit_layer_missing(str(dump), "sklt", [4, 2]) == bare
    assert latentq.fit_layer_missing(str(dump), "sklt") == bare
    assert latentq.fit_layer_missing(str(dump), "klt") == ""  # klt reads the latent alone
    # the file is refused by the loader for its attention datasets in part, naming them
    with pytest.raises(ValueError, match=r"layer 002: attention datasets must be all present or all absent"):
        latentq.fit_layer_rotation(str(dump), 2, "c_kv", "sklt")


def test_fit_layer_rotation_refusals(tmp_path):
    with pytest.raises(ValueError, match=r"tiny-mla\.h5: layer 9 was requested but the file has layers"):
        latentq.fit_layer_rotation(DUMP, 9, "c_kv", "klt")
    with pytest.raises(ValueError, match="unknown transform 'pca'"):
        latentq.fit_layer_rotation(DUMP, 1, "c_kv", "pca")
    with pytest.raises(ValueError, match="no transform given"):
        latentq.fit_layer_rotation(DUMP, 1, "c_kv", "")
    with pytest.raises(ValueError, match="unknown target 'q_pe', available: c_kv, k_pe, index_k"):
        latentq.fit_layer_rotation(DUMP, 1, "q_pe", "klt")
    gone = str(tmp_path / "gone.h5")
    with pytest.raises(RuntimeError, match=f"{gone}: no such file"):
        latentq.fit_layer_rotation(gone, 1, "c_kv", "klt")
    with pytest.raises(RuntimeError, match=f"{gone}: no such file"):
        latentq.fit_layer_missing(gone, "sklt")


def test_sklt_on_a_latent_only_dump(tmp_path):
    """A dump without attention datasets: klt fits, sklt is refused by name (no query rows, nothing to load)."""
    dump = tmp_path / "latent_only.h5"
    shutil.copyfile(DUMP, dump)
    with h5py.File(dump, "a") as f:
        for name in f["layers"]:
            for ds in ("q_rows", "q_nope", "q_pe", "w_uk", "w_uv", "attn_out"):
                del f[f"layers/{name}/{ds}"]
    assert (
        latentq.fit_layer_missing(str(dump), "sklt") == f"{dump} has no query rows in /layers/000, which sklt fits on"
    )
    assert np.array_equal(
        latentq.fit_layer_rotation(str(dump), 1, "k_pe", "klt"), latentq.fit_layer_rotation(DUMP, 1, "k_pe", "klt")
    )
    with pytest.raises(
        ValueError, match=r"layer 1 k_pe: transform sklt fits its score metric on the query rows and W_UK"
    ):
        latentq.fit_layer_rotation(str(dump), 1, "k_pe", "sklt")
