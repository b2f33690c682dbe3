"""The two sides of a gate (baseline, current), read into one form whatever they are.

A side is one of:

- a run directory: ``schedscope run`` output (``run.json``, ``<cell>/requests.parquet``)
  or ``schedscope simulate`` output (``summary.json`` and ``requests.parquet``, or
  ``<policy>/requests.parquet``) — opened with the report's reader
  (:func:`harness.report.inputs.open_run`), so the gate sees the rows the report sees;
- a baseline file (``schedscope baseline update``; read by :mod:`harness.gate.baseline`): the
  same per-request rows, kept in one JSON file;
- a ``summary.json`` (version 1 or 2): percentiles only, so the gate can apply absolute
  rules and compare simulated (deterministic) runs, nothing that needs per-request data.

Cells named ``<cell>-r<k>`` (repeats of one cell) are pooled into ``<cell>``: their rows
are concatenated (each keeps its schedule offset, so blocks still pair, and its run in
``run``, so the interval resamples runs as well as windows) and their durations added.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from harness.profiles.digest import schedule_digest as digest_rows
from harness.records.request_stats import CENSORED_METRICS, CUT_AT, censored_bound, is_cut
from harness.records.requests import STATUSES

#: The per-request columns the gate keeps (the normalised form of every side).
GATE_COLUMNS = (
    "request_id",
    "class",
    "status",
    "offset_s",
    "prompt_tokens",
    "max_tokens",
    "output_tokens",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "queue_s",
    "stall_s",
    "slo_met",
    "itl_s",
)
#: Which run of a pooled cell a row came from (0, 1, ...): present only on cells pooled
#: from several runs, so that the interval resamples runs too (harness/report/stats.py).
RUN_COLUMN = "run"
#: Whether a request was cut in flight by the end of its run (present only on cells that
#: have one): its ``ttft_s`` and ``e2e_s`` then hold lower bounds (the time to the cut,
#: or its measured TTFT), never dropped (harness/records/request_stats.py, censoring).
CENSORED_COLUMN = "censored"
#: Columns a cell's rows carry only when they have something to say.
OPTIONAL_COLUMNS = (RUN_COLUMN, CENSORED_COLUMN)
REPEAT_RE = re.compile(r"^(?P<cell>.+)-r(?P<repeat>\d+)$")
#: The version of the gate's per-request rows (GATE_COLUMNS and their meaning): a side's
#: ``schema_version`` identity for run directories and baseline files alike.
ROWS_SCHEMA_VERSION = 1
#: The statuses a request row may have (docs/records.md).


class GateInputError(ValueError):
    """A side the gate cannot read or use (exit 2); the message names the file."""


@dataclass
class CellData:
    name: str
    frame: pl.DataFrame | None  # GATE_COLUMNS; None for a summary.json side
    summary: dict | None = None  # the policy's summary.json entry (overall, classes)
    duration_s: float = 0.0
    generator_limited: bool | None = None
    send_lag_p99_s: float | None = None
    schedule: str | None = None  # digest of the arrival schedule (schedule_digest)
    repeats: int = 1
    repeat: int | None = None  # which repeat this cell is (its run.json), before pooling
    #: Planted faults (SCHEDSCOPE_FAULT, docs/engine.md) the cell ran with; {} for none.
    faults: dict = field(default_factory=dict)
    #: The directory of each run of the cell (a run directory's cells), in run order.
    cell_dirs: tuple[Path, ...] = ()
    #: The served engine's step records of each run (a served cell's steps.parquet), in
    #: run order; () where it has none (a --target, a simulation, a baseline file).
    steps: tuple[Path, ...] = ()


@dataclass
class Side:
    label: str
    path: Path
    kind: str  # "requests" | "summary"
    mode: str | None  # "simulate" | "serve" | "target"
    identity: dict  # profile, seed, schema_version, machine (fingerprint key)
    cells: dict[str, CellData]
    notes: list[str] = field(default_factory=list)

    @property
    def simulated(self) -> bool:
        return self.mode == "simulate"


def schedule_digest(frame: pl.DataFrame) -> str:
    """16 hex digits over the schedule itself: every request's id, class, prompt and
    output lengths and arrival offset (harness.profiles.digest, whose plan digest a
    distributed run's workers check; none for a session's later turns, whose instants
    follow the turns before them). Equal digests: the same arrivals, whichever engine
    answered them."""
    offset = pl.col("offset_s").cast(pl.Float64)
    if "turn" in frame.columns:
        # a session's later turn is sent when the turn before it ended (closed loop): its
        # instant is the engine's doing, not the schedule's, which plans none for it
        offset = pl.when(pl.col("turn").fill_null(1) > 1).then(None).otherwise(offset)
    rows = frame.select(
        pl.col("request_id").cast(pl.String),
        pl.col("class").cast(pl.String),
        pl.col("prompt_tokens").cast(pl.Int64),
        pl.col("max_tokens").cast(pl.Int64),
        offset.alias("offset_s"),
    ).rows()
    return digest_rows(rows)


def read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except OSError as exc:
        raise GateInputError(f"{path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise GateInputError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise GateInputError(f"{path}: expected a JSON object")
    return value


def _optional_json(path: Path) -> dict:
    try:
        return read_json(path) if path.is_file() else {}
    except GateInputError:
        return {}


def _machine_key(machine) -> str | None:
    """The fingerprint's ``machine_key``: the machine, model and executor, not the
    schedscope version (a base and its change differ in that, on one machine)."""
    if isinstance(machine, dict):
        return machine.get("machine_key") or machine.get("key") or machine.get("fingerprint_key")
    return machine if isinstance(machine, str) else None


def _identity_machine(mode: str | None, summary: dict, machine) -> str | None:
    """The machine a side's latencies stand for. A real run's: the fingerprint of the
    machine it ran on. A simulated run's: the machine its cost model was fitted on
    (None for the built-in model, whose predictions are the same on every machine)."""
    if mode != "simulate":
        return _machine_key(machine)
    cost_model = summary.get("cost_model") or {}
    return _machine_key(cost_model.get("fingerprint")) if isinstance(cost_model, dict) else None


def check_numbers(frame: pl.DataFrame, where: str) -> None:
    """Rows no request can have cannot be gated (exit 2), named with the first such
    request: a latency, count or gap that is negative, NaN or infinite (the report's
    check, :func:`harness.report.validate.bad_values`), an arrival offset that is not a
    finite number, a status that is not one of :data:`STATUSES`. An infinite latency
    would turn every percentile and interval into NaN, a negative one would pass any
    ceiling."""
    from harness.report.validate import bad_values

    problems = bad_values(frame)
    offsets = frame.filter(~pl.col("offset_s").cast(pl.Float64).is_finite().fill_null(False))
    if offsets.height:
        problems.append(
            f"request {offsets['request_id'][0]} has offset_s {offsets['offset_s'][0]} "
            f"({offsets.height} such rows): the schedule offset must be a finite number"
        )
    statuses = frame.filter(~pl.col("status").is_in(STATUSES).fill_null(False))
    if statuses.height:
        problems.append(
            f"request {statuses['request_id'][0]} has status {statuses['status'][0]!r} "
            f"({statuses.height} such rows; a status is one of {', '.join(STATUSES)})"
        )
    if problems:
        raise GateInputError(f"{where}: " + "; ".join(problems))


def normalise(frame: pl.DataFrame) -> pl.DataFrame:
    """The report's request rows (``harness.report.tables.load_requests``) in the gate's
    columns: the schedule offset as ``offset_s`` (``harness.report.verdict``'s axis)."""
    from harness.report.verdict import arrival_offsets

    offsets = pl.Series("offset_s", arrival_offsets(frame), dtype=pl.Float64)
    out = frame.with_columns(offsets)
    if "itl_s" not in out.columns:
        out = out.with_columns(pl.lit(None, dtype=pl.List(pl.Float64)).alias("itl_s"))
    columns = list(GATE_COLUMNS)
    if CUT_AT in out.columns:
        cut = is_cut()
        if out.select(cut.any()).item():
            out = out.with_columns(
                *[
                    pl.when(cut).then(censored_bound(m)).otherwise(pl.col(m)).alias(m)
                    for m in CENSORED_METRICS
                ],
                cut.fill_null(False).alias(CENSORED_COLUMN),
            )
            columns.append(CENSORED_COLUMN)
    return out.select(columns)


def _pooled(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The frames of a pooled cell as one; a request of a frame without cut requests
    was not cut."""
    if not any(CENSORED_COLUMN in f.columns for f in frames):
        return pl.concat(frames)
    return pl.concat(frames, how="diagonal").with_columns(pl.col(CENSORED_COLUMN).fill_null(False))


def _numbered_runs(frames: list[pl.DataFrame]) -> list[pl.DataFrame]:
    """Each frame's rows numbered with their run (:data:`RUN_COLUMN`), counting on across
    frames; a frame pooled already keeps its runs apart."""
    out, next_run = [], 0
    for frame in frames:
        if RUN_COLUMN in frame.columns:
            runs = frame[RUN_COLUMN].unique().sort()
            mapping = {int(r): next_run + i for i, r in enumerate(runs)}
            frame = frame.with_columns(
                pl.col(RUN_COLUMN).replace_strict(mapping, return_dtype=pl.Int64)
            )
            next_run += len(runs)
        else:
            frame = frame.with_columns(pl.lit(next_run, dtype=pl.Int64).alias(RUN_COLUMN))
            next_run += 1
        out.append(frame)
    return out


def _pool(cells: dict[str, CellData]) -> dict[str, CellData]:
    """Repeats ``X-r1``, ``X-r2``... become one cell ``X`` (module docstring): cells whose
    run.json says which repeat they are, never by name alone."""
    groups: dict[str, list[CellData]] = {}
    for name, cell in cells.items():
        match = REPEAT_RE.match(name)
        pooled = match is not None and cell.repeat is not None
        groups.setdefault(match["cell"] if pooled and match else name, []).append(cell)
    out: dict[str, CellData] = {}
    for name, members in groups.items():
        if len(members) == 1 and members[0].name == name:
            out[name] = members[0]
            continue
        schedules = {m.schedule for m in members}
        if len(schedules) > 1:
            raise GateInputError(
                f"cell {name}: its repeats {', '.join(m.name for m in members)} have "
                "different schedules; repeats must replay one schedule"
            )
        frames = _numbered_runs([m.frame for m in members if m.frame is not None])
        lags = [m.send_lag_p99_s for m in members if m.send_lag_p99_s is not None]
        out[name] = CellData(
            name=name,
            frame=_pooled(frames) if frames else None,
            duration_s=sum(m.duration_s for m in members),
            generator_limited=any(bool(m.generator_limited) for m in members),
            send_lag_p99_s=max(lags) if lags else None,
            schedule=schedules.pop(),
            repeats=sum(m.repeats for m in members),
            faults=next((m.faults for m in members if m.faults), {}),
            cell_dirs=tuple(d for m in members for d in m.cell_dirs),
            # a step-cost line needs every run's steps, or it would weigh some runs only
            steps=tuple(p for m in members for p in m.steps)
            if all(m.steps for m in members)
            else (),
        )
    return out


def _faults(info: dict) -> dict:
    faults = info.get("faults") if isinstance(info, dict) else None
    return faults if isinstance(faults, dict) else {}


def open_directory(path: Path, label: str) -> Side:
    from harness.report.build import run_slos
    from harness.report.inputs import ReportInputError, open_run
    from harness.report.tables import load_requests, run_duration

    try:
        run = open_run(path, label)
    except ReportInputError as exc:
        raise GateInputError(str(exc)) from None
    if run.broken:  # the report leaves such a cell out; the gate cannot compare without it
        raise GateInputError(" | ".join(f"cell {b.policy}: {b.text}" for b in run.broken))
    run_json = _optional_json(path / "run.json")
    summary = _optional_json(path / "summary.json")
    mode = run_json.get("mode") or summary.get("mode")
    slos, _ = run_slos(None, run)
    cells: dict[str, CellData] = {}
    machine = run_json.get("machine") or summary.get("machine")
    for name, data in run.policies.items():
        if "duration_s" in data.refused_info:
            raise GateInputError(
                f"{path / 'summary.json'}: cell {name}: duration_s "
                f"{data.refused_info['duration_s']!r} is not a duration in seconds (>= 0)"
            )
        frame = load_requests(data.requests, slos)
        cell_json = _optional_json(data.path / "run.json")
        mode = mode or cell_json.get("mode")
        machine = machine or cell_json.get("machine")
        loadgen = cell_json.get("loadgen") or {}
        rows = normalise(frame)
        check_numbers(rows, f"{data.path}/requests.parquet")
        repeat = cell_json.get("repeat")
        steps = data.path / "steps.parquet"
        served = (cell_json.get("mode") or mode) == "serve" and steps.is_file()
        cells[name] = CellData(
            name=name,
            frame=rows,
            duration_s=run_duration(frame, data.info),
            generator_limited=cell_json.get("generator_limited"),
            send_lag_p99_s=loadgen.get("send_lag_p99_s") if isinstance(loadgen, dict) else None,
            schedule=schedule_digest(rows),
            # a served cell's run.json says them; a simulation's summary.json entry does
            faults=cell_json.get("faults") or _faults(data.info),
            repeat=repeat if isinstance(repeat, int) else None,
            cell_dirs=(data.path,),
            steps=(steps,) if served else (),
        )
    identity = {
        "profile": run_json.get("profile") or summary.get("profile"),
        "seed": run_json.get("seed", summary.get("seed")),
        "schema_version": ROWS_SCHEMA_VERSION,
        "machine": _identity_machine(mode, summary, machine),
    }
    notes = list(run.notes)
    if mode is None:
        notes.append(f"{path}: no run.json or summary.json says how it ran: taken as a real run")
    return Side(label, path, "requests", mode, identity, _pool(cells), notes)


def open_summary(path: Path, body: dict, label: str) -> Side:
    policies = body.get("policies")
    if not isinstance(policies, dict) or not policies:
        raise GateInputError(f"{path}: a summary.json with no policies")
    cells = {
        name: CellData(name=name, frame=None, summary=value, duration_s=value.get("duration_s", 0))
        for name, value in policies.items()
    }
    identity = {
        "profile": body.get("profile"),
        "seed": body.get("seed"),
        # Versions 1 and 2 share the keys the gate reads; compared where both have them.
        "schema_version": None,
        "machine": _identity_machine(body.get("mode"), body, body.get("machine")),
    }
    note = "summary.json only: absolute rules and simulated comparisons, no per-request data"
    return Side(label, path, "summary", body.get("mode"), identity, cells, [note])


def combine(sides: list[Side], label: str) -> Side:
    """Several runs of one schedule (``--baseline A --baseline B``) as one side: each
    cell's runs pooled as repeats (module docstring). They must agree on how they ran."""
    first = sides[0]
    if len(sides) == 1:
        return first
    for side in sides[1:]:
        if side.kind != "requests" or first.kind != "requests":
            raise GateInputError(
                f"{side.path}: only run directories and baseline files can be pooled"
            )
        for key in ("profile", "seed", "machine"):
            if side.identity.get(key) != first.identity.get(key):
                raise GateInputError(
                    f"{side.path} and {first.path} differ in {key} "
                    f"({side.identity.get(key)!r}, {first.identity.get(key)!r}): they cannot "
                    "be pooled as repeats of one run"
                )
        if side.mode != first.mode or set(side.cells) != set(first.cells):
            raise GateInputError(
                f"{side.path} and {first.path} differ in mode or cells: they cannot be "
                "pooled as repeats of one run"
            )
    renamed: dict[str, CellData] = {}
    for number, side in enumerate(sides, 1):
        for name, cell in side.cells.items():
            copy = CellData(**{**cell.__dict__, "name": f"{name}-r{number}", "repeat": number})
            renamed[copy.name] = copy
    notes = [n for side in sides for n in side.notes]
    paths = ", ".join(str(side.path) for side in sides)
    return Side(label, Path(paths), "requests", first.mode, dict(first.identity),
                _pool(renamed), notes)  # fmt: skip
