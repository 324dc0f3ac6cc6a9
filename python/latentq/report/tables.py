"""Markdown tables of the report: the one table writer report.md (latentq.report.markdown) and the findings
(latentq.report.findings) share."""

from __future__ import annotations


def md_table(header, rows):
    """A Markdown table; '|' inside a cell is escaped."""

    def cell(c):
        return str(c).replace("|", "\\|")

    out = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
