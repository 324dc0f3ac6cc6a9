"""The report tests' results files: chosen values written by the writers of the results file itself, so that a
group's columns (order, dtypes, units, definitions) are the ones its writer declares and never a copy here.
The C++ groups go through lq_results_fixture (tests/study/results_fixture_main.cpp: the study's write_results
with the columns of latentq/result_groups.h), /e2e and /e2e_position through the e2e step's write_groups with
its E2E_COLUMNS / E2E_POSITION_COLUMNS.

    write_results(path, attrs, groups)

groups: {name: {column: values}} (any of the group's columns: the others are left out, as in a file of an older
latentq), or {name: (record, {column: values})} with a tuple of latentq.result_groups.Column for a group no
writer declares (a new probe's). The binary: $LATENTQ_RESULTS_FIXTURE (ctest sets it), else
tests/study/lq_results_fixture beside $LATENTQ_BIN (default build/latentq)."""

import json
import math
import os
import subprocess
import tempfile

import numpy as np

from latentq.e2e import E2E_COLUMNS, E2E_POSITION_COLUMNS
from latentq.result_groups import write_groups

PYTHON_GROUPS = {"e2e": E2E_COLUMNS, "e2e_position": E2E_POSITION_COLUMNS}


def fixture_binary():
    """The path of lq_results_fixture."""
    if os.environ.get("LATENTQ_RESULTS_FIXTURE"):
        return os.environ["LATENTQ_RESULTS_FIXTURE"]
    bin_dir = os.path.dirname(os.path.abspath(os.environ.get("LATENTQ_BIN", "build/latentq")))
    return os.path.join(bin_dir, "tests", "study", "lq_results_fixture")


def _json_value(v):
    """A value as lq_results_fixture reads it: NaN as null, ±inf as "inf" / "-inf"."""
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _json_values(values):
    return {k: [_json_value(x) for x in np.asarray(v).tolist()] for k, v in values.items()}


def write_results(path, attrs, groups):
    """Write the results file `path` (module docstring); raises AssertionError with the writer's message when it
    refuses the input (an unknown column, a value of another type)."""
    doc = {"attrs": {k: (v.item() if isinstance(v, np.generic) else v) for k, v in attrs.items()}, "groups": {}}
    later = {}
    for name, g in groups.items():
        if name in PYTHON_GROUPS:
            later[name] = (PYTHON_GROUPS[name], {k: np.asarray(v) for k, v in g.items()}, {})
        elif isinstance(g, tuple):
            record, values = g
            doc["groups"][name] = {"spec": [c._asdict() for c in record], "values": _json_values(values)}
        else:
            doc["groups"][name] = {"values": _json_values(g)}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    try:
        p = subprocess.run([fixture_binary(), f.name, str(path)], capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(f.name)
    assert p.returncode == 0, p.stderr
    if later:
        write_groups(str(path), later)
