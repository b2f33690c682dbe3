"""``schedscope report``: per policy x class tables, stall attribution, diagnosis of the
known traps, verdicts and pictures from stored run records (docs/report.md).

One concept per module: ``inputs`` (finding and scanning the record files),
``validate`` (whether a cell's files can be used: broken cells are named and left out),
``stats`` (percentiles, Jain, SLOs, bootstrap), ``tables`` (per policy x class
statistics), ``stalls`` (attribution), ``diagnosis`` (the five traps), ``prefix_cache``
(hit rates, evictions, a target's counters), ``sessions`` (multi-turn conversations:
first vs later turns, hit rate by turn, completion), ``cache_ladder`` (prefix-reuse
rungs side by side), ``verdict`` (objectives and noise),
``figures`` (Plotly), ``simulator_check`` (a served run against its simulation),
``build`` (assembling), ``summary`` (summary.json) and ``render`` (HTML, Markdown,
Parquet).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.report.build import Report, ReportOptions, build_report
from harness.report.inputs import ReportInputError
from harness.report.render import write_outputs

__all__ = ["Report", "ReportInputError", "ReportOptions", "build_report", "generate_report"]


def generate_report(
    run_dirs: Sequence[Path | str],
    out: Path | str | None = None,
    options: ReportOptions | None = None,
) -> dict[str, Path]:
    """Build the report of ``run_dirs`` and write it to ``out`` (default: the first run
    directory). Returns the written paths (``html``, ``markdown``, ``summary``,
    ``stalls``, ``classes``)."""
    report = build_report(run_dirs, options)
    target = Path(out) if out is not None else Path(run_dirs[0])
    return write_outputs(report, target)
