"""The e2e step runs 'klt,<quantizer>' and 'sklt,<quantizer>' cells behind the basis the study fitted
(latentq.fitted_basis): latentq.fit_rotation of the dump's layer gives the study's own basis (the same rel_fro
as its /latent_error row, to float rounding), the injection is Rᵀ·qd(R·x) with that basis, the e2e rows of
klt / sklt specs exist, and a dump that is not the study's is refused by name."""

import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "data", "tiny-mla")
DUMP = os.path.join(ROOT, "data", "latents", "tiny-mla.h5")
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
assert os.path.exists(os.path.join(MODEL, "model.safetensors")), "data/tiny-mla/model.safetensors (tracked) is absent"
assert os.path.exists(DUMP), "data/latents/tiny-mla.h5 (tracked) is absent"
assert os.access(LQ, os.X_OK), f"the latentq CLI is not built ({LQ}; set LATENTQ_BIN or build build/latentq)"

import torch  # noqa: E402

import latentq  # noqa: E402
import latentq._core  # noqa: E402, F401  (the compiled module: its absence is an error)
from latentq import e2e as e2e_inject  # noqa: E402
from latentq.fitted_basis import StudyBases  # noqa: E402

SPECS = ["klt,int4-asym-channel-g32", "klt,tc3", "tc3", "int4-asym-channel-g32", "sklt,tc3"]
LAYERS = [1, 4]


def _dec(v):
    return v.decode() if isinstance(v, bytes) else str(v)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """`latentq run --no-e2e` of SPECS on layers 1 and 4 of the shipped dump (a copy: the test may move it)."""
    d = tmp_path_factory.mktemp("klt")
    dump = d / "dump.h5"
    shutil.copyfile(DUMP, dump)
    cfg = d / "study.toml"
    cfg.write_text(
        f'[input]\ndump = "{dump}"\nlayers = {LAYERS}\n\n[quantizers]\nextra = {SPECS!r}\n\n'.replace("'", '"')
        + "[svd]\nenabled = false\n\n[cross_layer]\nenabled = false\n\n[attention]\nenabled = false\n"
    )
    out = d / "res.h5"
    r = subprocess.run(
        [LQ, "run", str(cfg), "--out", str(out), "--no-e2e", "--threads", "1"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return dump, out


def test_fit_rotation_is_the_studys_basis(study):
    dump, res = study
    with h5py.File(res, "r") as f:
        g = f["latent_error"]
        rows = {
            (int(l), _dec(t), _dec(q)): float(v)
            for l, t, q, v in zip(g["layer"][:], g["target"][:], g["quantizer"][:], g["rel_fro"][:])
        }
    with h5py.File(dump, "r") as f:
        so = [int(v) for v in f["seq_offsets"][:]]
        for layer in LAYERS:
            for target in ("c_kv", "k_pe"):
                x = np.ascontiguousarray(f[f"layers/{layer:03d}/{target}"][:], dtype=np.float32)
                R = latentq.fit_rotation(x, "klt", so)
                D = x.shape[1]
                assert R.shape == (D, D) and R.dtype == np.float32
                np.testing.assert_allclose(R @ R.T, np.eye(D), atol=2e-5, err_msg=f"layer {layer} {target}")
                # rows by descending fit-split variance
                fit = x[so[0] : so[len(so) // 2]]
                var = ((fit @ R.T) ** 2).mean(axis=0)
                assert np.all(np.diff(var) <= 1e-6 * var[0] + 1e-12), (layer, target, var[:8])
                g = f[f"layers/{layer:03d}"]
                q, w = (g["q_nope"][:], g["w_uk"][:]) if target == "c_kv" else (g["q_pe"][:], None)
                AB = latentq.fit_rotation(x, "sklt", so, q, w, g["q_rows"][:].tolist())
                assert AB.shape == (2, D, D)
                np.testing.assert_allclose(AB[0].astype(np.float64) @ AB[1], np.eye(D), atol=1e-4)
                for spec, basis in (("klt,int4-asym-channel-g32", R), ("klt,tc3", R), ("sklt,tc3", AB)):
                    y = latentq.quantize_dequantize(x, spec, target, so, basis)
                    rel = float(np.linalg.norm((y - x).astype(np.float64)) / np.linalg.norm(x.astype(np.float64)))
                    want = rows[(layer, target, spec)]
                    assert rel == pytest.approx(want, rel=1e-6), (layer, target, spec, rel, want)


def test_klt_spec_needs_its_basis_and_only_it():
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    with pytest.raises(ValueError, match="needs its basis"):
        latentq.quantize_dequantize(x, "klt,int4-asym-token", "k_pe")
    with pytest.raises(ValueError, match="basis is only for"):
        latentq.quantize_dequantize(x, "had,int4-asym-token", "k_pe", None, np.eye(32, dtype=np.float32))
    with pytest.raises(ValueError, match=r"float32 \[32, 32\]"):
        latentq.quantize_dequantize(x, "klt,int4-asym-token", "k_pe", None, np.eye(16, dtype=np.float32))
    with pytest.raises(ValueError, match="needs its basis"):
        latentq.decode_order_latents(x, "klt,int4-asym-token", "decode-r8-s0-p0", "k_pe")
    with pytest.raises(ValueError, match=r"float32 \[2, 32, 32\]"):  # sklt takes (A, A⁻¹)
        latentq.quantize_dequantize(x, "sklt,int4-asym-token", "k_pe", None, np.eye(32, dtype=np.float32))
    with pytest.raises(ValueError, match="sklt needs q"):
        latentq.fit_rotation(x, "sklt", [0, 32, 64])
    with pytest.raises(ValueError, match="none of the 2 query rows lies in the fit split"):
        latentq.fit_rotation(x, "sklt", [0, 32, 64], np.ones((2, 1, 32), np.float32), None, [40, 50])


def test_injection_is_the_rotated_quantizer(study):
    """make_inject of a klt spec = Rᵀ·qd(R·x) per sequence, with the study's basis of that layer and target."""
    _, res = study
    bases = StudyBases(latentq, str(res))
    assert bases.available, bases.why
    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.standard_normal((2, 40, 128)).astype(np.float32))
    fn = e2e_inject.make_inject(latentq, "klt,int4-asym-channel-g32", ("c_kv",), frozenset(LAYERS), bases)
    R = bases(4, "c_kv")
    got = fn(4, "c_kv", x).numpy()
    for b in range(2):
        xr = (x[b].numpy().astype(np.float64) @ R.T.astype(np.float64)).astype(np.float32)
        want = latentq.quantize_dequantize(xr, "int4-asym-channel-g32", "c_kv").astype(np.float64) @ R.astype(
            np.float64
        )
        np.testing.assert_allclose(got[b], want, rtol=0, atol=2e-5, err_msg=f"batch row {b}")
    assert fn(0, "c_kv", x) is x  # a layer the study did not run stays exact


def test_e2e_runs_klt_cells_and_refuses_another_dump(study, tmp_path, capsys, monkeypatch):
    dump, res0 = study
    res = tmp_path / "res.h5"
    shutil.copyfile(res0, res)
    args = ["--results", str(res), "--seq-len", "128", "--num-seqs", "2", "--threads", "1", "--quiet"]
    args += ["--quantizers", "klt,tc3", "tc3", "sklt,tc3"]
    assert e2e_inject.main(args) == 0
    assert "not injected" not in capsys.readouterr().err
    with h5py.File(res, "r") as f:
        q = [_dec(v) for v in f["e2e/quantizer"][:]]
        kl = dict(zip(q, f["e2e/kl_mean"][:]))
        t1 = dict(zip(q, f["e2e/top1_agree"][:]))
    assert q == ["klt,tc3", "tc3", "sklt,tc3"], q
    assert np.isfinite(kl["sklt,tc3"]) and kl["sklt,tc3"] < kl["tc3"] / 3, kl
    # the KLT basis is what makes tc's per-component widths work: without it tc3 spends 3 bits on raw channels
    assert np.isfinite(kl["klt,tc3"]) and kl["klt,tc3"] < kl["tc3"] / 3, kl
    assert t1["klt,tc3"] > t1["tc3"], t1

    # another file at the study's dump path: refused by name, the results left unchanged
    with h5py.File(dump, "a") as f:
        f.attrs["note"] = "changed"
    before = open(res, "rb").read()
    forwards = []  # refused before the first forward, not after the other runs were computed
    real_forward = e2e_inject.Runner.forward
    monkeypatch.setattr(
        e2e_inject.Runner, "forward", lambda self, chunk: forwards.append(chunk) or real_forward(self, chunk)
    )
    assert e2e_inject.main(args) == 2
    err = capsys.readouterr().err
    assert f"{dump}: sha256" in err and "would not be the study's" in err, err
    assert open(res, "rb").read() == before and forwards == []
    monkeypatch.undo()

    # no dump at the path: the klt cells are left out with a note naming it; the others run
    os.remove(dump)
    assert e2e_inject.main(args) == 0
    err = capsys.readouterr().err
    assert f"2 klt/sklt quantizer(s) not injected (the study's dump {dump} is not there" in err, err
    with h5py.File(res, "r") as f:
        assert [_dec(v) for v in f["e2e/quantizer"][:]] == ["tc3"]


def test_unfittable_bases_leave_their_runs_out_with_a_note(tmp_path, capsys):
    """A mixed row with a klt rule, when the dump is gone, and an sklt spec on a dump without query rows: each
    is left out with a note saying why; the other runs go on (exit 0)."""
    dump = tmp_path / "dump.h5"
    shutil.copyfile(DUMP, dump)
    cfg = tmp_path / "mixed.toml"
    cfg.write_text(
        f'[input]\ndump = "{dump}"\nlayers = [2]\n\n[quantizers]\nextra = ["int4-asym-channel-g32", "sklt,tc3"]\n\n'
        '[[mixed]]\nname = "mx"\nc_kv = "klt,int4-asym-channel-g32"\nk_pe = "bf16"\n\n'
        "[svd]\nenabled = false\n\n[cross_layer]\nenabled = false\n\n[attention]\nenabled = false\n"
    )
    res = tmp_path / "res.h5"
    r = subprocess.run(
        [LQ, "run", str(cfg), "--out", str(res), "--no-e2e", "--threads", "1"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    args = ["--results", str(res), "--seq-len", "64", "--num-seqs", "2", "--threads", "1", "--quiet"]
    # no query rows in the dump: sklt,tc3 is left out (no basis is fitted, so the changed sha256 is not read;
    # the mixed row's klt rule would refuse this dump: it is not run here)
    with h5py.File(dump, "a") as f:
        del f["layers/002/q_rows"]
    assert e2e_inject.main(args + ["--quantizers", "int4-asym-channel-g32", "sklt,tc3"]) == 0
    err = capsys.readouterr().err
    assert f"1 klt/sklt quantizer(s) not injected (the study's dump {dump} has no query rows in /layers/002" in err
    assert "which sklt fits on; their basis is fitted on the dump's fit split): sklt,tc3" in err, err
    with h5py.File(res, "r") as f:
        assert [_dec(v) for v in f["e2e/quantizer"][:]] == ["int4-asym-channel-g32"]
    # the dump gone: the mixed row, whose c_kv rule is klt, and the planner's assignment at 1/4 (/plan_runs), which
    # stores sklt,tc3 on some (layer, target), are left out too
    os.remove(dump)
    assert e2e_inject.main(args) == 0
    err = capsys.readouterr().err
    assert f"3 klt/sklt quantizer(s) not injected (the study's dump {dump} is not there" in err, err
    assert "): mx, plan-1/4, sklt,tc3" in err, err
    with h5py.File(res, "r") as f:
        assert [_dec(v) for v in f["e2e/quantizer"][:]] == ["int4-asym-channel-g32"]
