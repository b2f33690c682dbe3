"""The comparison table ``schedscope simulate`` prints: one row per policy x class
(all requests first), latency percentiles, preemptions and goodput, from the summary
:func:`harness.simulate.driver.run_simulations` returns; and the span counts of a traced
simulation."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.simulate.speed_band import band_table

COLUMNS = (
    "policy",
    "class",
    "ok",
    "rej",
    "ttft p50",
    "ttft p99",
    "tpot p50",
    "e2e p99",
    "queue p99",
    "queue max",
    "preempt s/r",
    "goodput/s",
)


def _fmt(value, unit="s") -> str:
    return "-" if value is None else f"{value:.3f}" if unit == "s" else f"{value:.2f}"


def comparison_table(summary: dict) -> Table:
    """The policies of a simulate summary side by side, one section per policy."""
    table = Table(
        title=f"schedscope simulate — profile {summary['profile']} (seed {summary['seed']})"
    )
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("policy", "class") else "right")
    for name, result in summary["policies"].items():
        groups = [("all", result["overall"])] + list(result["classes"].items())
        for class_name, g in groups:
            m = g["metrics"]
            table.add_row(
                name if class_name == "all" else "",
                class_name,
                str(g["counts"]["ok"]),
                str(g["counts"]["rejected"]),
                _fmt(m.get("ttft_s", {}).get("p50")),
                _fmt(m.get("ttft_s", {}).get("p99")),
                _fmt(m.get("tpot_s", {}).get("p50")),
                _fmt(m.get("e2e_s", {}).get("p99")),
                _fmt(m.get("queue_s", {}).get("p99")),
                _fmt(m.get("queue_s", {}).get("max")),
                f"{g['preemptions']['swap']}/{g['preemptions']['recompute']}",
                _fmt(g["goodput_rps"], "n"),
            )
        table.add_section()
    return table


def print_comparison(summary: dict, console: Console) -> None:
    """Print :func:`comparison_table` on ``console``, at least 160 columns wide when
    it is not a terminal."""
    _wide(console).print(comparison_table(summary))


def print_speed_band(summary: dict, console: Console) -> None:
    """Print the summary's speed band (:func:`harness.simulate.speed_band.band_table`), if it
    has one, like the comparison table."""
    table = band_table(summary)
    if table is not None:
        _wide(console).print(table)


def _wide(console: Console) -> Console:
    # Piped output (make, CI logs) has no terminal width; do not squeeze a table to 80.
    if console.is_terminal:
        return console
    return Console(width=max(console.width, 160), markup=False)


def print_span_counts(summary: dict, trace_file: Path, console: Console) -> None:
    """One line per policy: spans written to ``trace_file`` and dropped (in yellow
    when any were dropped)."""
    for name, policy_summary in summary["policies"].items():
        stats = policy_summary.get("tracing", {})
        line = (
            f"spans ({name}): {stats.get('spans', 0)} to {trace_file}, "
            f"{stats.get('dropped_spans', 0)} dropped"
        )
        console.print(Text(line, style="yellow") if stats.get("dropped_spans") else line)
