"""A dump whose values this HDF5 library cannot read says why, naming the dataset: a dataset compressed with h5py's
own lzf filter (which the C library does not have), and a dataset stored in an external raw file that is missing or
short (both written here with h5py, which supports them). `latentq inspect` and `latentq run` exit 2 with that
message, not "the file may be truncated or corrupt"."""

import os
import subprocess

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LQ = os.environ.get("LATENTQ_BIN", os.path.join(ROOT, "build", "latentq"))
assert os.path.exists(LQ), f"no latentq binary at {LQ} (build the project first)"
DATASET = "/layers/000/c_kv"


def synth(path):
    args = [LQ, "synth", "--preset", "tiny-mla", "--layers", "1", "--seqs", "1", "--seq-len", "64"]
    r = subprocess.run([*args, "--query-rows", "4", "--out", str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def rewrite(path, **storage):
    """Rewrite DATASET of the dump at `path` with the given h5py storage options, same values."""
    with h5py.File(path, "r+") as f:
        v = f[DATASET][:]
        del f[DATASET]
        f.create_dataset(DATASET, data=v, **storage)
    return v


def inspect(path, cwd):
    return subprocess.run([LQ, "inspect", str(path)], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_an_lzf_dataset_names_the_filter(tmp_path):
    dump = tmp_path / "lzf.h5"
    synth(dump)
    rewrite(dump, compression="lzf", chunks=True)
    r = inspect(dump, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert DATASET in r.stderr and "filter 'lzf'" in r.stderr and "32000" in r.stderr, r.stderr
    assert "truncated or corrupt" not in r.stderr, r.stderr


def test_a_missing_or_short_external_file_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # h5py and HDF5 look an external file up under the working directory
    dump = tmp_path / "ext.h5"
    synth(dump)
    with h5py.File(dump, "r") as f:
        v = f[DATASET][:]
    raw = tmp_path / "c_kv.raw"
    rewrite(dump, shape=v.shape, dtype=np.float32, external=[("c_kv.raw", 0, v.nbytes)])
    with h5py.File(dump, "r+") as f:
        f[DATASET][...] = v  # h5py writes the external file
    assert raw.exists()
    assert inspect(dump, tmp_path).returncode == 0  # the file is there: the dump reads
    raw.write_bytes(raw.read_bytes()[: v.nbytes // 2])
    r = inspect(dump, tmp_path)
    assert r.returncode == 2 and "external raw file 'c_kv.raw'" in r.stderr and "fewer than" in r.stderr, r.stderr
    raw.unlink()
    r = inspect(dump, tmp_path)
    assert r.returncode == 2 and "external raw file 'c_kv.raw'" in r.stderr and "does not exist" in r.stderr, r.stderr
    assert str(tmp_path / "c_kv.raw") in r.stderr, r.stderr
    assert "truncated or corrupt" not in r.stderr, r.stderr
