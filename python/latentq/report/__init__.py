"""Figures and a Markdown report from a latentq results file: ``python -m latentq.report RESULTS.h5 --out DIR``.

The figures, the report's sections and the exit codes are described in latentq.report.figures.
"""

from latentq.report.figures import (  # noqa: F401
    PREFILL_AT_ONCE,
    SCHEMA,
    ReportError,
    Table,
    _position_modes,
    cross_layer_matrices,
    e2e_rows,
    is_baseline,
    load_results,
    main,
    parse_spec,
    pareto_front,
    position_curves,
    quantizer_table,
    select_quantizers,
    short_label,
    symmetric_matrix,
    write_report,
)
