"""The format table as a pandas DataFrame: ``latentq.formats()``.

One row per named format of the C++ table (latentq/spec.h ``kFormats`` and ``kPresets``, through
``latentq._core.format_rows``): every example spec of every format family and every engine preset, so the table
latentq's tests iterate is the table a user reads. ``latentq formats`` prints the same rows.
"""

from __future__ import annotations

COLUMNS = (
    "name",  # the spec string
    "family",  # results column `format` ("preset" for an engine record)
    "engine",  # the engine and setting that ship it as an MLA KV cache ("" when none)
    "record_bytes",  # bytes per token of c_kv 512 + k_pe 64, metadata included (-1: a width it refuses)
    "bits_per_element",  # record_bytes * 8 / 576
    "causal",  # decode order encodes it token by token (latentq.decode_scale_is_causal)
    "shapes",  # the row lengths it takes
    "source",  # the engine file and commit, or the standard and section, it reproduces
    "reference",  # the test that checks it against code latentq did not write
)


def formats():
    """The format table: a pandas DataFrame with the columns ``COLUMNS`` (record_bytes int64, bits_per_element
    float64, causal bool, the others str), one row per example spec and engine preset, in table order.
    Raises ImportError when latentq._core is not built."""
    import pandas as pd

    from latentq import _core

    return pd.DataFrame(_core.format_rows(), columns=list(COLUMNS))
