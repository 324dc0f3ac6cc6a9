"""Figures and a Markdown report from a latentq results file: ``python -m latentq.report RESULTS.h5 --out DIR``.

load      the results file as pandas DataFrames (one per group, with its column record), exact column lookup,
          quantizer aggregates
figures   the PNG figures (matplotlib)
markdown  report.md (the figures' list and the exit codes are in its docstring)
__main__  the command line
"""

from latentq.report.load import (
    PREFILL_AT_ONCE,
    SCHEMA,
    ReportError,
    _position_modes,
    column_record,
    cross_layer_matrices,
    e2e_rows,
    flags,
    has_column,
    is_baseline,
    is_transformed,
    load_results,
    numbers,
    pareto_front,
    parse_spec,
    position_curves,
    quantizer_table,
    select_quantizers,
    short_label,
    strings,
    symmetric_matrix,
)
from latentq.report.markdown import write_report

__all__ = [
    "PREFILL_AT_ONCE", "SCHEMA", "ReportError", "_position_modes", "column_record", "cross_layer_matrices", "e2e_rows",
    "flags", "has_column", "is_baseline", "is_transformed", "load_results", "numbers", "parse_spec", "pareto_front",
    "position_curves", "quantizer_table", "select_quantizers", "short_label", "strings", "symmetric_matrix",
    "write_report",
]  # fmt: skip
