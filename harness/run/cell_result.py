"""A cell's result and its record: what one cell of a run measured and recorded
(:class:`CellResult`), what the steps of a served or --target cell share while it runs
(:class:`LoadCell`), and the cell's run.json (:func:`write_cell_info`)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.text import Text

from harness.processes.cpu_split import load_generator_cores
from harness.records.redact import redact_url
from harness.run.matrix import Cell
from harness.run.outcome import status as cell_status
from harness.run.settings import CellSettings

#: Where a cell's messages (str, printed at once) and live figures (a ``Text``) go:
#: harness/run/runner.py's ``Progress.show``.
Show = Callable[[str | Text], None]


@dataclass
class CellResult:
    cell: Cell
    path: Path
    mode: str  # serve | target | simulate
    infrastructure_failure: bool = False
    failures: list[dict] = field(default_factory=list)  # {kind, message, log_tail?}
    warnings: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    counts: dict = field(default_factory=dict)  # status -> requests
    scheduled: int | None = None
    generator_limited: bool | None = None
    wall_s: float = 0.0
    files: list[str] = field(default_factory=list)
    #: why requests failed: harness.report.errors.error_summary of requests.parquet
    #: (None: no rows were read)
    errors: dict | None = None
    #: the prompts the load generator chose (harness/loadgen/prompt_choice.py), served
    #: or --target; None: not known
    prompts: dict | None = None
    #: its sessions in brief (harness/run/session_summary.py); None: none
    sessions: dict | None = None

    def fail(
        self, kind: str, message: str, log_tail: str | None = None, infrastructure: bool = False
    ) -> None:
        entry = {"kind": kind, "message": message}
        if log_tail:
            entry["log_tail"] = log_tail
        self.failures.append(entry)
        self.infrastructure_failure |= infrastructure


def note_files(result: CellResult, names: tuple[str, ...]) -> None:
    """Each of ``names`` in the cell's directory: among its files, else its missing."""
    for name in names:
        if (result.path / name).is_file():
            result.files.append(name)
        else:
            result.missing.append(name)


@dataclass
class LoadCell:
    """What the steps of one served or --target cell share: where its files go, what
    its schedule plans, and what it has recorded so far (``result``; ``info``, the
    run.json entries, in the order they were learnt)."""

    cell: Cell
    settings: CellSettings
    result: CellResult
    info: dict
    show: Show
    scheduled: int
    duration_s: float  # the schedule's

    @property
    def cell_dir(self) -> Path:
        return self.result.path

    @property
    def raw(self) -> Path:  # the server's own record files and trace files
        return self.cell_dir / "raw"

    @property
    def records(self) -> Path:  # Locust's client records
        return self.cell_dir / "locust"


def write_cell_info(result: CellResult, settings: CellSettings, info: dict) -> CellResult:
    """Write the cell's run.json: its identity, settings, status and files, then
    ``info`` (what its steps learnt); returns ``result``."""
    from harness.run.versions import versions

    cell = result.cell
    body = {
        "cell": cell.name,
        "mode": result.mode,
        "policy": cell.policy,
        # the cells compared with this one share it (the report groups by it)
        "group": cell.group,
        "knob_set": cell.knob_set,
        "repeat": cell.repeat,
        "rate_scale": cell.rate_scale,
        "duration_scale": settings.duration_scale,
        "profile": settings.profile_name,
        "seed": settings.seed,
        "target": redact_url(settings.target) if settings.target else None,
        "executor": settings.executor if result.mode == "serve" else None,
        "torch_threads": settings.torch_threads if result.mode == "serve" else None,
        # the served engine's and the load generator's cores (None: not pinned; against a
        # --target, only a split given, whose serve side the user pinned, if anyone)
        "cpu_split": (
            settings.cpu_split.to_dict()
            if settings.cpu_split is not None
            and result.mode in ("serve", "target")
            and load_generator_cores(settings.cpu_split, result.mode == "target") is not None
            else None
        ),
        "settings": cell.settings,
        # how long it waited for its last requests, and why (harness/run/drain.py)
        "grace": settings.grace,
        # the file the served sim executor slept or the simulation used (None: built-in)
        "cost_model": str(settings.cost_model) if settings.cost_model is not None else None,
        "knobs": cell.knobs,
        "config": dataclasses.asdict(cell.config) if cell.config is not None else None,
        "versions": versions(),
        "machine": settings.machine,
        "status": cell_status(result),
        "failures": result.failures,
        "warnings": result.warnings,
        "missing": result.missing,
        "counts": result.counts,
        "errors": result.errors,
        "sessions": result.sessions,
        "generator_limited": result.generator_limited,
        "wall_s": round(result.wall_s, 3),
        "files": result.files,
        **info,
    }
    (result.path / "run.json").write_text(json.dumps(body, indent=2, default=str) + "\n")
    return result


def remove_raw(cell_dir: Path) -> None:
    """Remove the cell's raw/ (the engine's own record files, the trace file)."""
    shutil.rmtree(cell_dir / "raw", ignore_errors=True)
