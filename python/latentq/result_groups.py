"""Groups of a latentq-results/1 file written from Python (the e2e step's /e2e and /e2e_position), with the
column record every group of the file carries (latentq/results.h; the C++ writer's form): the group attribute
``columns``, a JSON list of {name, dtype, unit, definition}, one per dataset in order, and ``rows``.

A step declares each group's columns once, where it builds the group, as a tuple of ``Column`` and hands it to
``write_groups`` with the values; the report (latentq.report) reads the names, units and definitions back.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import NamedTuple

import h5py
import numpy as np

from latentq.files import publish

DTYPE_KINDS = {"int64": "iu", "float64": "f", "string": "USO"}


class Column(NamedTuple):
    """One column of a results group: name; dtype "int64", "float64" or "string"; unit ("" for a label, an
    index, a count or a 0/1 flag, "1" for a dimensionless quantity, else e.g. "nat", "byte/token"); definition
    (one sentence)."""

    name: str
    dtype: str
    unit: str
    definition: str


def column_record(columns: tuple[Column, ...]) -> str:
    """The attribute ``columns`` of a group with these columns (JSON, the C++ writer's form)."""
    return json.dumps([c._asdict() for c in columns], ensure_ascii=False, separators=(",", ":"))


def _checked(name: str, record: tuple[Column, ...], values: dict[str, np.ndarray]) -> list[tuple[Column, np.ndarray]]:
    """The columns of `record` that `values` gives, in the record's order. Raises ValueError for a value that is
    not a column of the record, a 1-D array of its dtype, or of the others' length (an internal error)."""
    declared = {c.name: c for c in record}
    for k, v in values.items():
        if k not in declared:
            raise ValueError(f"/{name}: '{k}' is not one of its columns ({', '.join(declared)})")
        v = np.asarray(v)
        if v.ndim != 1 or v.dtype.kind not in DTYPE_KINDS[declared[k].dtype]:
            raise ValueError(f"/{name}/{k}: {v.dtype}, shape {v.shape}; the column is 1-D {declared[k].dtype}")
    if len({len(v) for v in values.values()}) > 1:
        raise ValueError(f"/{name}: columns of unequal lengths")
    return [(c, np.asarray(values[c.name])) for c in record if c.name in values]


def write_groups(results_path: str, groups: dict[str, tuple[tuple[Column, ...], dict[str, np.ndarray], dict]]) -> None:
    """Replace the groups {name: (record, values, attrs)} in results_path, keeping every other group:
    copy → edit → rename (an interrupted run leaves the previous file). Each group gets the columns of its
    record that `values` gives ({column: 1-D array}) and the attributes `attrs`, then ``rows`` and ``columns``
    (its column record). The group lists its datasets by name (it does not track their creation order, as
    /e2e never has: its columns read back in the same order as before the record), so the record lists them
    in that order. A group given as None is removed when the file has it (a step that did not compute it this
    time leaves no earlier copy behind). Raises ValueError as _checked (nothing written)."""
    checked = {
        name: (sorted(_checked(name, g[0], g[1]), key=lambda cv: cv[0].name.encode()), g[2])
        for name, g in groups.items()
        if g is not None
    }
    removed = [name for name, g in groups.items() if g is None]
    d = os.path.dirname(os.path.abspath(results_path))
    fd, tmp = tempfile.mkstemp(prefix=".e2e-", suffix=".h5.tmp", dir=d)
    os.close(fd)
    try:
        shutil.copyfile(results_path, tmp)
        with h5py.File(tmp, "r+") as f:
            for name in removed:
                if name in f:
                    del f[name]
            for name, (cols, attrs) in checked.items():
                if name in f:
                    del f[name]
                g = f.create_group(name)
                for c, v in cols:
                    if c.dtype == "string":
                        g.create_dataset(c.name, data=v.astype(object), dtype=h5py.string_dtype("utf-8"))
                    else:
                        g.create_dataset(c.name, data=v)
                for k, v in attrs.items():
                    g.attrs[k] = v
                g.attrs["rows"] = np.int64(len(cols[0][1]) if cols else 0)
                g.attrs["columns"] = column_record(tuple(c for c, _ in cols))
        publish(tmp, results_path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
