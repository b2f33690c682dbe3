"""The one table a benchmark run ends with: benchmark, figure, value, target, aim,
result (met, missed, no target, not measured; a benchmark that crashed, timed out or
was skipped is one row saying so, a skipped one with its reason)."""

from __future__ import annotations

from harness.bench.figure import bound_text, value_text
from harness.bench.runner import BenchResult

HEADER = ("benchmark", "figure", "value", "target", "aim", "result")


def result_text(figure) -> str:
    verdict = figure.verdict
    if figure.aim_met and figure.met:
        return f"{verdict}, aim met"
    return verdict


def table_rows(results: list[BenchResult]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for result in results:
        if not result.ok:
            if result.failed:
                code = "" if result.exit_code is None else f" (exit {result.exit_code})"
                status = f"{result.status}{code}"
            else:
                status = f"{result.status}: {result.error.removeprefix('skipped: ')}"
            rows.append((result.benchmark.name, "-", "-", "", "", status))
            continue
        for figure in result.figures:
            rows.append(
                (
                    result.benchmark.name,
                    figure.name,
                    value_text(figure),
                    bound_text(figure.target, figure.better, figure.unit),
                    bound_text(figure.aim, figure.better, figure.unit),
                    result_text(figure),
                )
            )
    return rows


def render_table(results: list[BenchResult]) -> str:
    """Plain text, columns padded to their widest cell (values right-aligned)."""
    rows = [HEADER, *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            cell.rjust(widths[i]) if i == 2 and n else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
