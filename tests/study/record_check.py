"""The column record of a results group (latentq/results.h) read with plain h5py + json, for the checks of
check_results_h5py.py and check_probe_results_h5py.py."""

import json

import h5py
import numpy as np

DTYPES = {"int64": np.int64, "float64": np.float64}


def columns(g):
    """The column names of the group g from its column record, checked against its datasets: the same names in
    the same order, each of the recorded dtype, each with a definition; the attribute rows, the row count."""
    rec = json.loads(g.attrs["columns"])
    assert list(g.keys()) == [c["name"] for c in rec], (g.name, list(g.keys()), rec)
    for c in rec:
        ds = g[c["name"]]
        if c["dtype"] == "string":
            assert h5py.check_string_dtype(ds.dtype), (g.name, c)
        else:
            assert ds.dtype == DTYPES[c["dtype"]], (g.name, c, ds.dtype)
        assert c["definition"], (g.name, c)
    assert int(g.attrs["rows"]) == (len(g[rec[0]["name"]]) if rec else 0), g.name
    return [c["name"] for c in rec]
