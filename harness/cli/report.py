"""``schedscope report``: regenerate the report from stored run data
(:func:`harness.report.generate_report`), then print its findings and paths
(docs/report.md)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.text import Text

from harness.cli.app import console, err_console


def report(
    run_dirs: list[Path] = typer.Argument(
        ...,
        help="Run directories (RUN/<policy>/requests.parquet ...); several are compared side "
        "by side, labelled by directory name.",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Where to write report.html, report.md, summary.json and the Parquet files "
        "(default: the first RUN_DIR).",
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        help="Profile (name or file) whose class SLOs define goodput; default: the run's own.",
    ),
    stall_threshold: float | None = typer.Option(
        None,
        "--stall-threshold",
        help="Stall threshold in seconds (default: the larger of 250 ms and 5x the run's "
        "median ITL).",
    ),
    bootstrap: int = typer.Option(
        200, "--bootstrap", help="Bootstrap resamples for the verdicts' noise check."
    ),
    seed: int = typer.Option(20260101, "--seed", help="Bootstrap seed."),
) -> None:
    """Regenerate the report from stored run data (docs/report.md): tables per policy x
    class, stall attribution, diagnosis of the known traps, verdicts and pictures.

    Exit 0 when the report was written (a cell whose records cannot be used is named on
    stderr and in the report, and left out); 2 when no cell of any run can be used, or a
    bad option."""
    from harness.report import ReportInputError, ReportOptions, generate_report

    if stall_threshold is not None and stall_threshold <= 0:
        raise typer.BadParameter("must be > 0", param_hint="--stall-threshold")
    if bootstrap < 10:
        raise typer.BadParameter("must be >= 10", param_hint="--bootstrap")
    options = ReportOptions(
        stall_threshold_s=stall_threshold, profile=profile, resamples=bootstrap, seed=seed
    )
    try:
        paths = generate_report(run_dirs, out, options)
    except ReportInputError as exc:
        err_console.print(Text.assemble(("error:", "red"), f" {exc}"), soft_wrap=True)
        raise typer.Exit(2) from None
    _print_report(paths)


def broken_lines(summary: dict) -> list[str]:
    """``broken: RUN/CELL: FILE: problems`` per cell the report left out (plain text: the
    paths and problems come from the data)."""
    return [
        f"broken: {b['run']}/{b['policy']}: {b['path']}: {'; '.join(b['problems'])}: "
        "left out of the tables, comparisons and verdicts"
        for b in summary.get("broken", [])
    ]


def _print_report(paths: dict[str, Path]) -> None:
    """What the report found (missing data, traps, verdicts), then where it is."""
    summary = json.loads(paths["summary"].read_text())
    for line in broken_lines(summary):
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)
    for line in summary.get("missing", []):
        # soft wrap: a line that names a file is never broken inside its path
        console.print(Text.assemble(("missing:", "yellow"), f" {line}"), soft_wrap=True)
    for finding in summary.get("diagnosis", []):
        console.print(
            Text.assemble(
                (f"trap {finding['trap']}", "red"),
                f" {finding['run']}/{finding['policy']}: {finding['message']}",
            ),
            soft_wrap=True,
        )
        if finding.get("command"):  # a command line that shows the fix (trap 5)
            console.print(f"  fix: {finding['command']}", soft_wrap=True, markup=False)
    for entry in summary.get("verdicts", {}).values():
        console.print(entry["sentence"], soft_wrap=True)
    console.print(f"markdown: {paths['markdown']}", soft_wrap=True)
    console.print(f"summary: {paths['summary']}", soft_wrap=True)
    console.print(f"report: {paths['html']}", soft_wrap=True)
