"""The matrix of cells, one after the other; the summary table; the report.

Layout: ``RUN_ROOT/run.json`` (the whole run: command line, cells, versions, failures),
``RUN_ROOT/<cell>/`` (each cell's files and ``run.json``), and the report
(``report.html``, ``report.md``, ``summary.json`` ...) in ``RUN_ROOT``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from harness.costmodel.choice import cell_lines
from harness.loadgen.prompt_choice import PromptChoice
from harness.processes.cpu_split import load_generator_cores, serve_cores, target_split_line
from harness.profiles import resolve_profile
from harness.records.redact import redact_argv
from harness.report import errors as error_lines
from harness.report.errors import HIGH_ERROR_RATE
from harness.run.cell_result import CellResult, remove_raw
from harness.run.load_cell import run_load_cell
from harness.run.matrix import Cell, RunPlan
from harness.run.outcome import ERROR_RATE_EXIT, exit_code, run_status
from harness.run.outcome import status as cell_status
from harness.run.session_summary import session_line
from harness.run.settings import CellMachine, CellSettings, RunSettings
from harness.run.simulated_cell import run_simulated_cell
from harness.run.versions import versions

if TYPE_CHECKING:
    from harness.run.drain import Grace
    from harness.run.simulator_check import CheckModel


@dataclass
class RunOptions:
    """A run: its plan (cells, profile, seed), where it goes and what every cell runs
    with (``settings``; each cell's own machine and cost model in ``cell_machines``)."""

    plan: RunPlan
    out: Path | None = None
    simulate: bool = False
    settings: RunSettings = field(default_factory=RunSettings)
    keep_raw: bool = True
    argv: list[str] = field(default_factory=list)
    report: bool = True
    #: the fingerprint of the machine the run runs on (harness/costmodel/machine.py), recorded in
    #: every run.json and summary.json (a cell's own, in ``cell_machines``, in its)
    machine: dict | None = None
    #: cell name -> what the command chose for that cell alone (its fingerprint and cost
    #: model); a cell not named has the run's ``machine`` and ``settings.cost_model``
    cell_machines: dict[str, CellMachine] = field(default_factory=dict)
    #: a cell whose error rate (harness/report/errors.py) exceeds this makes the run exit
    #: ERROR_RATE_EXIT (None: no limit)
    max_error_rate: float | None = HIGH_ERROR_RATE
    #: what ``--rate-scale auto`` chose (ChosenScale.to_dict; None: an absolute scale)
    rate_scale_auto: dict | None = None

    def cell_machine(self, name: str) -> CellMachine:
        """Cell ``name``'s fingerprint and cost model."""
        default = CellMachine(self.machine, self.settings.cost_model)
        return self.cell_machines.get(name, default)


def _grace(cell: Cell, settings: CellSettings, check: CheckModel | None) -> Grace:
    """How long the served cell waits for its last requests (harness/run/drain.py):
    ``--grace`` when given, else from the drain its cost model predicts."""
    from engine.core.cost_model import CostModel
    from harness.run import drain

    if settings.grace_s is not None:
        return drain.given_grace(settings.grace_s)
    if settings.target or cell.config is None:
        return drain.target_grace()
    if settings.executor == "sim":
        model = CostModel.load(settings.cost_model) if settings.cost_model else CostModel()
        name = str(settings.cost_model or "the built-in cost model")
    elif check is not None:
        model, name = check.model, str(check.path or "the built-in cost model")
    else:
        model, name = CostModel(), "the built-in cost model"
    return drain.predicted_grace(settings.profile, settings.seed, cell.config, model, name)


def default_root(base: Path = Path("runs")) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    root = base / stamp
    n = 1
    while root.exists():
        n += 1
        root = base / f"{stamp}-{n}"
    return root


class Progress:
    """Live figures: a rich Live line on a terminal, a line every 10 s otherwise.

    ``show`` takes a cell's messages (str, printed at once) and its live figures (a
    ``Text``: harness/run/live.py's ``figures_line``, printed every 10 s when not on a
    terminal). Neither is read as markup."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Live | None = None
        self.last_print = 0.0

    def __enter__(self) -> Progress:
        if self.console.is_terminal:
            self.live = Live(
                Text(""), console=self.console, refresh_per_second=4, transient=True
            ).__enter__()
        return self

    def show(self, line: str | Text) -> None:
        if self.live is not None:
            self.live.update(line if isinstance(line, Text) else Text(line))
        elif time.monotonic() - self.last_print >= 10 or not isinstance(line, Text):
            self.last_print = time.monotonic()
            self.console.print(line, soft_wrap=True, highlight=False)

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)


def _as_text(value) -> str | None:
    return str(value) if value is not None else None


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


#: How each cell status (harness/run/outcome.py) is shown.
STATUS_STYLES = {"failed": "red", "degraded": "yellow", "ok": ""}


def _cell_summary(result: CellResult) -> dict | None:
    """The cell's own summary.json entry (what it wrote from its requests.parquet), for
    a run without a report; None when there is none to read."""
    try:
        body = json.loads((result.path / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    entry = (body.get("policies") or {}).get(result.cell.name) if isinstance(body, dict) else None
    return entry if isinstance(entry, dict) and isinstance(entry.get("overall"), dict) else None


def summary_table(root: Path, results: list[CellResult], summary: dict | None) -> Table:
    """Per cell x class: requests, TTFT p50/p95, E2E p95, goodput (the report's figures
    when it ran, else the cell's requests.parquet)."""
    table = Table(title=f"schedscope run — {root}")
    for column in (
        "cell",
        "class",
        "requests",
        "ok",
        "TTFT p50",
        "TTFT p95",
        "E2E p95",
        "goodput/s",
        "status",
    ):
        table.add_column(
            column, justify="left" if column in ("cell", "class", "status") else "right"
        )
    policies = (summary or {}).get("policies") or {}
    for r in results:
        state = cell_status(r)
        status = Text(state, style=STATUS_STYLES[state])
        entry = policies.get(r.cell.name) or _cell_summary(r)
        if entry is None:
            table.add_row(
                r.cell.name,
                "all",
                str(sum(r.counts.values())),
                str(r.counts.get("ok", 0)),
                "-",
                "-",
                "-",
                "-",
                status,
            )
            table.add_section()
            continue
        groups = [("all", entry["overall"])] + sorted(entry.get("classes", {}).items())
        for n, (cls, g) in enumerate(groups):
            m = g.get("metrics", {})
            table.add_row(
                r.cell.name if n == 0 else "",
                cls,
                str(g.get("requests", 0)),
                str(g.get("counts", {}).get("ok", 0)),
                _fmt(m.get("ttft_s", {}).get("p50")),
                _fmt(m.get("ttft_s", {}).get("p95")),
                _fmt(m.get("e2e_s", {}).get("p95")),
                f"{g['goodput_rps']:.2f}" if g.get("goodput_rps") is not None else "-",
                status if n == 0 else "",
            )
        table.add_section()
    return table


def run_matrix(options: RunOptions, console: Console) -> tuple[int, Path | None, Path]:
    """Run every cell, then the report. Returns (exit code, report path, run root).
    Exit code 1 for infrastructure failures (a server that did not start, Locust
    crashed or hung); else 3 when a cell's error rate exceeds ``max_error_rate``; else 0
    (degraded cells: a few failed requests, generator lag)."""
    plan = options.plan
    root = options.out or default_root()
    root.mkdir(parents=True, exist_ok=True)
    base_profile = resolve_profile(plan.profile)
    if plan.duration_scale != 1.0:
        base_profile = base_profile.with_duration_scale(plan.duration_scale)
    mode = "simulate" if options.simulate else ("target" if options.settings.target else "serve")
    run_info = {
        "kind": "schedscope-run",
        "mode": mode,
        "command": redact_argv(options.argv),
        "profile": plan.profile,
        "seed": plan.seed,
        "duration_scale": plan.duration_scale,
        "rate_scale_auto": options.rate_scale_auto,
        "cells": [
            {
                "name": c.name,
                "policy": c.policy,
                "knob_set": c.knob_set,
                "rate_scale": c.rate_scale,
                "knobs": c.knobs,
                **({"settings": c.settings} if c.settings else {}),
                **(
                    {"cost_model": _as_text(options.cell_machines[c.name].cost_model)}
                    if c.name in options.cell_machines
                    else {}
                ),
            }
            for c in plan.cells
        ],
        "run_file": plan.run_file,
        "settings": options.settings.record(),
        "versions": versions(),
        "machine": options.machine,
        "started": datetime.now().isoformat(timespec="seconds"),
    }
    (root / "run.json").write_text(json.dumps(run_info, indent=2, default=str) + "\n")
    console.print(
        f"schedscope run: {len(plan.cells)} cell(s) ({mode}), profile {plan.profile}, "
        f"duration scale {plan.duration_scale:g} -> {root}",
        highlight=False,
        soft_wrap=True,
    )
    checks = {}
    if mode == "serve":
        from harness.run.simulator_check import check_models

        # Chosen before any cell serves: every check is out of sample (docs/run.md).
        served = options.settings
        checks = check_models(
            plan.cells, served.executor, served.torch_threads, serve_cores(served.cpu_split)
        )
        if served.cpu_split is not None:
            console.print(served.cpu_split.line(), soft_wrap=True, highlight=False, markup=False)
        for line in cell_lines({name: c.line for name, c in checks.items()}):
            console.print(f"simulator check: {line}", soft_wrap=True, highlight=False, markup=False)
    given = options.settings.cpu_split
    if mode == "target" and load_generator_cores(given, True) is not None:
        assert given is not None
        console.print(target_split_line(given), soft_wrap=True, highlight=False, markup=False)
    results: list[CellResult] = []
    started = time.monotonic()
    with Progress(console) as progress:
        for cell in plan.cells:
            profile = (
                base_profile.with_rate_scale(cell.rate_scale)
                if cell.rate_scale != 1.0
                else base_profile
            )
            settings = CellSettings.for_cell(
                options.settings,
                cell,
                options.cell_machine(cell.name),
                profile_name=plan.profile,
                profile=profile,
                duration_scale=plan.duration_scale,
                seed=plan.seed,
                simulator_check=checks.get(cell.name),
                max_error_rate=options.max_error_rate,
            )
            if not options.simulate:
                grace = _grace(cell, settings, checks.get(cell.name))
                settings = dataclasses.replace(
                    settings, grace_s=grace.grace_s, grace=grace.to_dict()
                )
                console.print(
                    f"{cell.name}: grace {grace.how}", soft_wrap=True, highlight=False, markup=False
                )
            cell_dir = root / cell.name
            cell_dir.mkdir(parents=True, exist_ok=True)
            if options.simulate:
                result = run_simulated_cell(cell, cell_dir, settings, progress.show)
            else:
                result = run_load_cell(cell, cell_dir, settings, progress.show)
            if not options.keep_raw:
                remove_raw(cell_dir)
            results.append(result)
            _print_cell(console, result)
    run_info.update(
        {
            "wall_s": round(time.monotonic() - started, 3),
            "status": run_status(results),
            "results": {
                r.cell.name: {
                    "status": cell_status(r),
                    "failures": [
                        {k: v for k, v in f.items() if k != "log_tail"} for f in r.failures
                    ],
                    "warnings": r.warnings,
                    "missing": r.missing,
                    "counts": r.counts,
                    "errors": r.errors,
                    "scheduled": r.scheduled,
                    "generator_limited": r.generator_limited,
                    "wall_s": round(r.wall_s, 3),
                }
                for r in results
            },
        }
    )
    report_path = None
    summary = None
    if options.report and any((r.path / "requests.parquet").is_file() for r in results):
        report_path, summary = _report(root, results, console, run_info)
    elif options.report:
        run_info["report"] = None
        console.print(Text("no cell produced requests.parquet: no report", style="red"))
    over = over_error_rate(results, options.max_error_rate)
    run_info["max_error_rate"] = options.max_error_rate
    run_info["error_rate_exceeded"] = [r.cell.name for r in over]
    (root / "run.json").write_text(json.dumps(run_info, indent=2, default=str) + "\n")
    out = (
        console
        if console.is_terminal
        else Console(width=max(console.width, 140), file=console.file, markup=False)
    )
    out.print(summary_table(root, results, summary))
    _print_errors(console, results, over, options.max_error_rate)
    return exit_code(results, over), report_path, root


def over_error_rate(results: list[CellResult], limit: float | None) -> list[CellResult]:
    """The cells whose error rate exceeds ``limit`` (none when it is None)."""
    if limit is None:
        return []
    return [r for r in results if r.errors and r.errors["error_rate"] > limit]


def _print_errors(
    console: Console, results: list[CellResult], over: list[CellResult], limit: float | None
) -> None:
    """Why requests failed, per cell (the largest groups of error messages), then the
    cells over --max-error-rate."""
    said = False
    for r in results:
        for line in error_lines.lines(r.cell.name, r.errors or {"failed": 0}):
            if not said:
                console.print(Text("why requests failed", style="bold"), highlight=False)
                said = True
            console.print(line, soft_wrap=True, highlight=False, markup=False)
    if over:
        cells = ", ".join(
            f"{r.cell.name} ({(r.errors or {}).get('error_rate', 0) * 100:.1f}%)" for r in over
        )
        console.print(
            Text.assemble(
                (f"error rate over --max-error-rate {limit:g}", "red"),
                f": {cells}; exit code {ERROR_RATE_EXIT}",
            ),
            soft_wrap=True,
            highlight=False,
        )


def _report(
    root: Path, results: list[CellResult], console: Console, run_info: dict
) -> tuple[Path | None, dict | None]:
    from harness.records.summary import run_summary
    from harness.report import ReportInputError, generate_report

    # A cell without requests.parquet cannot be read: the report covers the others and
    # says which ones are absent.
    dirs = [r for r in results if (r.path / "requests.parquet").is_file()]
    # The run's combined summary (the simulator's layout): the report reads the mode,
    # profile, seed and each cell's config, duration and stall threshold from it, and
    # replaces it with its own (which keeps them).
    combined = run_summary(run_info["mode"], run_info["profile"], run_info["seed"], {})
    for r in dirs:
        try:
            own = json.loads((r.path / "summary.json").read_text())
            combined["policies"].update(own.get("policies") or {})
            combined.setdefault("cost_model", own.get("cost_model"))
            combined.setdefault("machine", own.get("machine"))
        except (OSError, ValueError):
            continue
    (root / "summary.json").write_text(json.dumps(combined, indent=2, default=str) + "\n")
    try:
        paths = generate_report([root], root)
    except ReportInputError as exc:
        console.print(Text(f"report: {exc}", style="red"), soft_wrap=True)
        run_info["report"] = None
        return None, None
    summary = json.loads(paths["summary"].read_text())
    absent = [r.cell.name for r in results if r not in dirs]
    if absent:
        summary.setdefault("missing", []).extend(f"{n}: no data (the cell failed)" for n in absent)
        paths["summary"].write_text(json.dumps(summary, indent=2) + "\n")
    run_info["report"] = {k: str(v) for k, v in paths.items()}
    for line in summary.get("missing", []):
        console.print(
            Text.assemble(("missing:", "yellow"), f" {line}"), soft_wrap=True, highlight=False
        )
    for finding in summary.get("diagnosis", []):
        console.print(
            Text.assemble(
                (f"trap {finding['trap']}", "red"), f" {finding['policy']}: {finding['message']}"
            ),
            soft_wrap=True,
            highlight=False,
        )
    for entry in summary.get("verdicts", {}).values():
        console.print(entry["sentence"], soft_wrap=True, highlight=False)
    for entry in summary.get("against_fcfs", []):
        console.print(entry["sentence"], soft_wrap=True, highlight=False)
    return paths["html"], summary


def _print_cell(console: Console, r: CellResult) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in r.counts.items()) or "no rows"
    state = cell_status(r)
    shown = (state.upper() if state == "failed" else state, STATUS_STYLES[state] or "green")
    console.print(
        Text.assemble(
            f"{r.cell.name}: ", shown, f" in {r.wall_s:.0f} s — {counts} (scheduled {r.scheduled})"
        ),
        highlight=False,
    )
    if r.prompts:
        line = PromptChoice.from_dict(r.prompts).line()
        console.print(f"  prompts: {line}", soft_wrap=True, highlight=False)
    if r.sessions:
        console.print(f"  sessions: {session_line(r.sessions)}", soft_wrap=True, highlight=False)
    for f in r.failures:
        console.print(
            Text.assemble("  ", (f["kind"], "red"), f": {f['message']}"),
            soft_wrap=True,
            highlight=False,
        )
        if f.get("log_tail"):
            console.print("  log tail:", highlight=False)
            console.print(Text(f["log_tail"]), soft_wrap=True)
    for w in r.warnings:
        console.print(
            Text.assemble("  ", ("warning", "yellow"), f": {w}"), soft_wrap=True, highlight=False
        )
    for m in r.missing:
        console.print(f"  missing: {m}", soft_wrap=True, highlight=False)
