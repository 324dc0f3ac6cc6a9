#!/usr/bin/env python3
"""Compare the datasets of two latentq results files (HDF5), e.g. a merged sharded run with the
unsharded run of the same config.

Usage:  compare_results.py A.h5 B.h5 [--keys layer,target,quantizer] [--rtol 0] [--atol 0]
                          [--group-tol GROUP:RTOL:ATOL ...] [--logits-tol RTOL:ATOL]

Every dataset of every group (recursively) must exist in both files with the same shape and dtype
kind (integer, float, string) and equal values; both files must hold the same set of datasets.
Root and group attributes are not compared (they hold creation times, shard numbers, ...).

Row order: a group whose datasets are all 1-D of one length is a column table (latentq-results/1,
see study/include/latentq/results.h); sharding may change its row order, so its rows are
sorted before comparing, by the key columns that the table has (default layer, target, quantizer,
in that order) and then by every other column, in both files alike. Floats compare exactly by
default (NaN equals NaN, +0 equals -0); --rtol/--atol allow numpy.isclose-style tolerance for every
group, --group-tol GROUP:RTOL:ATOL (repeatable) for one group only, e.g. --group-tol e2e:1e-4:1e-6,
--logits-tol RTOL:ATOL for every group computed from the model's logits (LOGIT_GROUPS: /e2e, /e2e_position,
/e2e_seq, /e2e_bootstrap, and /decision, which reads them), whose torch float32 GEMMs may sum in other splits
between two e2e steps (thread counts, load: 4 of 864 /e2e_position values 3e-10 apart under ctest -j2 on an
AVX-512 Xeon). A --group-tol of a group wins over --logits-tol.

Exit status: 0 if equal; 1 with the first difference printed (group, column, row, both values);
2 for a usage error or an unreadable file.
"""

from __future__ import annotations

import argparse
import sys

import h5py
import numpy as np


class Mismatch(Exception):
    pass


def datasets(f: h5py.File) -> dict[str, h5py.Dataset]:
    out: dict[str, h5py.Dataset] = {}
    f.visititems(lambda name, obj: out.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None)
    return out


def kind(ds: h5py.Dataset) -> str:
    if h5py.check_string_dtype(ds.dtype) is not None or ds.dtype.kind in "SU":
        return "string"
    if ds.dtype.kind in "iu":
        return "integer"
    if ds.dtype.kind == "f":
        return "float"
    if ds.dtype.kind == "b":
        return "bool"
    return f"other({ds.dtype})"


def values(ds: h5py.Dataset) -> np.ndarray:
    if kind(ds) == "string":
        if h5py.check_string_dtype(ds.dtype) is not None:  # variable- or fixed-length HDF5 string
            return np.asarray(ds.asstr()[()], dtype=object)
        return np.asarray(ds[()]).astype(str).astype(object)  # numpy 'S'/'U' stored as opaque
    return np.asarray(ds[()])


def show(v) -> str:
    """repr of one value without numpy's type wrapper (np.float64(0.5) -> 0.5)."""
    return repr(v.item() if isinstance(v, np.generic) else v)


def sort_order(cols: dict[str, np.ndarray], keys: list[str]) -> np.ndarray:
    """Row permutation sorting by the key columns present, then all other columns (names sorted)."""
    order = [k for k in keys if k in cols] + sorted(c for c in cols if c not in keys)
    sort_keys = []
    for name in order:
        v = cols[name]
        if v.dtype == object:  # strings: rank them so that lexsort can use them
            _, v = np.unique(v.astype(str), return_inverse=True)
        sort_keys.append(v)
    # np.lexsort sorts by the LAST key first.
    return np.lexsort(sort_keys[::-1]) if sort_keys else np.arange(0)


def equal_values(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """Element-wise equality mask (flattened)."""
    a, b = a.reshape(-1), b.reshape(-1)
    if a.dtype == object or b.dtype == object:
        return np.array([x == y for x, y in zip(a, b)], dtype=bool)
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        both_nan = np.isnan(a64) & np.isnan(b64)
        if rtol == 0 and atol == 0:
            return (a64 == b64) | both_nan
        return np.isclose(a64, b64, rtol=rtol, atol=atol) | both_nan
    return a == b


def parse_group_tol(text: str) -> tuple[str, float, float]:
    """'GROUP:RTOL:ATOL' -> (group, rtol, atol); argparse type (ArgumentTypeError on a bad value)."""
    parts = text.split(":")
    try:
        if len(parts) != 3 or not parts[0]:
            raise ValueError
        rtol, atol = float(parts[1]), float(parts[2])
        if not (rtol >= 0 and atol >= 0):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not GROUP:RTOL:ATOL with RTOL, ATOL >= 0") from None
    return parts[0], rtol, atol


def parse_logits_tol(text: str) -> tuple[str, float, float]:
    """--logits-tol RTOL:ATOL, each >= 0."""
    try:
        return parse_group_tol("logits:" + text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"'{text}' is not RTOL:ATOL with RTOL, ATOL >= 0") from None


LOGIT_GROUPS = ("e2e", "e2e_position", "e2e_seq", "e2e_bootstrap", "decision")


def tolerance(group: str, args) -> tuple[float, float]:
    """(rtol, atol) for a group: its --group-tol, else --logits-tol for a LOGIT_GROUPS group, else --rtol/--atol."""
    for g, rtol, atol in args.group_tol:
        if g == group.strip("/"):
            return rtol, atol
    if args.logits_tol is not None and group.strip("/") in LOGIT_GROUPS:
        return args.logits_tol[1], args.logits_tol[2]
    return args.rtol, args.atol


def compare_group(group: str, a: dict[str, h5py.Dataset], b: dict[str, h5py.Dataset], args) -> None:
    """a, b: column name -> dataset of one group (same names in both)."""
    rtol, atol = tolerance(group, args)
    shapes = {ds.shape for ds in list(a.values()) + list(b.values())}
    is_table = all(len(s) == 1 for s in shapes)
    va = {n: values(ds) for n, ds in a.items()}
    vb = {n: values(ds) for n, ds in b.items()}
    rows = None
    if is_table:
        len_a = {v.shape[0] for v in va.values()}
        len_b = {v.shape[0] for v in vb.values()}
        if len(len_a) == 1 and len(len_b) == 1:
            if len_a != len_b:
                raise Mismatch(f"group '{group}': {len_a.pop()} rows in A, {len_b.pop()} rows in B")
            ia, ib = sort_order(va, args.keys), sort_order(vb, args.keys)
            va = {n: v[ia] for n, v in va.items()}
            vb = {n: v[ib] for n, v in vb.items()}
            rows = (ia, ib)
    for name in a:  # creation order of A
        x, y = va[name], vb[name]
        if x.shape != y.shape:
            raise Mismatch(f"group '{group}', column '{name}': shape {x.shape} in A, {y.shape} in B")
        eq = equal_values(x, y, rtol, atol)
        if not eq.all():
            i = int(np.argmin(eq))
            if rows is not None:
                key_desc = ", ".join(f"{k}={show(va[k][i])}" for k in args.keys if k in va)
                where = f"sorted row {i} ({key_desc or 'no key columns'}; row {rows[0][i]} in A, row {rows[1][i]} in B)"
            else:
                where = f"element {np.unravel_index(i, x.shape) if x.ndim else ()}"
            raise Mismatch(
                f"group '{group}', column '{name}', {where}: A={show(x.reshape(-1)[i])} "
                f"B={show(y.reshape(-1)[i])} ({int((~eq).sum())} of {eq.size} values differ)"
            )


def compare(path_a: str, path_b: str, args) -> str:
    with h5py.File(path_a, "r") as fa, h5py.File(path_b, "r") as fb:
        da, db = datasets(fa), datasets(fb)
        only_a, only_b = sorted(set(da) - set(db)), sorted(set(db) - set(da))
        if only_a or only_b:
            raise Mismatch(f"datasets only in A: {only_a or 'none'}; only in B: {only_b or 'none'}")
        groups: dict[str, list[str]] = {}
        for name in da:  # visititems order; group by parent
            parent, _, leaf = name.rpartition("/")
            groups.setdefault(parent or "/", []).append(leaf)
        for group, names in groups.items():
            prefix = "" if group == "/" else group + "/"
            for n in names:
                ka, kb = kind(da[prefix + n]), kind(db[prefix + n])
                if ka != kb:
                    raise Mismatch(f"group '{group}', column '{n}': {ka} in A, {kb} in B")
            compare_group(group, {n: da[prefix + n] for n in names}, {n: db[prefix + n] for n in names}, args)
        return f"{len(groups)} groups, {len(da)} datasets equal"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument(
        "--keys",
        default="layer,target,quantizer",
        help="comma-separated key columns to sort table rows by (default: %(default)s)",
    )
    p.add_argument("--rtol", type=float, default=0.0)
    p.add_argument("--atol", type=float, default=0.0)
    p.add_argument(
        "--group-tol",
        type=parse_group_tol,
        action="append",
        default=[],
        metavar="GROUP:RTOL:ATOL",
        help="tolerance for one group (repeatable), e.g. e2e:1e-4:1e-6",
    )
    p.add_argument(
        "--logits-tol",
        type=parse_logits_tol,
        default=None,
        metavar="RTOL:ATOL",
        help="tolerance for every group computed from the model's logits (LOGIT_GROUPS)",
    )
    args = p.parse_args(argv)
    args.keys = [k for k in args.keys.split(",") if k]
    try:
        summary = compare(args.a, args.b, args)
    except Mismatch as e:
        print(f"compare_results: {args.a} and {args.b} differ: {e}", file=sys.stderr)
        return 1
    except (OSError, KeyError) as e:
        print(f"compare_results: cannot read {args.a} or {args.b}: {e}", file=sys.stderr)
        return 2
    print(f"compare_results: {args.a} == {args.b}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
