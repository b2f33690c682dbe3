"""Baseline files: a run's per-request rows and identity in one JSON file, for committing.

``schedscope baseline update --from RUN --out FILE`` writes one (:func:`write_baseline`);
``schedscope gate --baseline FILE`` reads it back as a side
(:func:`side_from_baseline`). JSON, not Parquet, so a change to a committed baseline
shows in a diff. Its keys::

    {"kind": "schedscope-baseline", "baseline_version": 1, "created_at": ISO,
     "schedscope": VERSION, "source": PATH, "mode": "simulate" | "serve" | "target",
     "identity": {"profile", "seed", "schema_version", "machine"},
     "cells": {NAME: {"duration_s", "generator_limited", "send_lag_p99_s", "schedule",
                      "repeats", "columns": [COLUMN...], "rows": [[value...], ...]}}}

(``columns`` ends with ``run`` for a cell pooled from several runs: which run each row
came from.)

One request per line (sorted by schedule offset), so a diff of a baseline shows the
requests whose outcome changed.

A baseline compared with a run of another profile, seed, schedule, summary schema
version or machine fingerprint is refused (:func:`check_compatible`), and so is one
where the profile, seed or schedule is not known on both sides, or a real run's machine
is known on one side only, unless that mismatch is allowed by name
(``--allow-mismatch``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from harness.gate.sides import (
    CENSORED_COLUMN,
    GATE_COLUMNS,
    OPTIONAL_COLUMNS,
    RUN_COLUMN,
    CellData,
    GateInputError,
    Side,
    check_numbers,
    schedule_digest,
)
from harness.records.polars_types import Schema
from harness.report.validate import is_duration

BASELINE_KIND = "schedscope-baseline"
BASELINE_VERSION = 1
#: What must match between a baseline and the run compared with it.
IDENTITY_KEYS = ("profile", "seed", "schedule", "repeats", "schema_version", "machine")
#: Identity keys that must be known on both sides (missing on one is a mismatch too).
REQUIRED_KEYS = ("profile", "seed", "schedule")
_SCHEMA: Schema = {
    "request_id": pl.String,
    "class": pl.String,
    "status": pl.String,
    "offset_s": pl.Float64,
    "prompt_tokens": pl.Int64,
    "max_tokens": pl.Int64,
    "output_tokens": pl.Int64,
    "ttft_s": pl.Float64,
    "tpot_s": pl.Float64,
    "e2e_s": pl.Float64,
    "queue_s": pl.Float64,
    "stall_s": pl.Float64,
    "slo_met": pl.Boolean,
    "itl_s": pl.List(pl.Float64),
    RUN_COLUMN: pl.Int64,
    CENSORED_COLUMN: pl.Boolean,
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("schedscope")
    except PackageNotFoundError:
        return "unknown"


def baseline_document(side: Side) -> dict:
    """The baseline file's body for ``side`` (a side with per-request rows)."""
    if side.kind != "requests":
        raise GateInputError(
            f"{side.path}: a baseline needs per-request data (a run directory), not a summary.json"
        )
    cells = {}
    for name, cell in sorted(side.cells.items()):
        frame = cell.frame if cell.frame is not None else pl.DataFrame(schema=_SCHEMA)
        # A pooled cell keeps which run each row came from (optional: one run has none).
        columns = [*GATE_COLUMNS, *(c for c in OPTIONAL_COLUMNS if c in frame.columns)]
        order = ["offset_s", "request_id", *columns[len(GATE_COLUMNS) :]]
        cells[name] = {
            "duration_s": cell.duration_s,
            "generator_limited": cell.generator_limited,
            "send_lag_p99_s": cell.send_lag_p99_s,
            "schedule": cell.schedule,
            "repeats": cell.repeats,
            "columns": columns,
            "rows": [
                list(r) for r in frame.sort(order, maintain_order=True).select(columns).rows()
            ],
        }
    return {
        "kind": BASELINE_KIND,
        "baseline_version": BASELINE_VERSION,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "schedscope": _version(),
        "source": str(side.path),
        "mode": side.mode,
        "identity": side.identity,
        "cells": cells,
    }


def write_baseline(side: Side, out: Path) -> dict:
    """Write ``side`` to ``out`` (whole or not at all: a temporary file, then a rename)."""
    body = baseline_document(side)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(_dumps(body) + "\n")
    partial.replace(out)
    return body


def _dumps(value, indent: str = "") -> str:
    """JSON with objects indented and each list of rows one row per line."""
    if isinstance(value, dict) and value:
        inner = indent + " "
        items = [f"{inner}{json.dumps(k)}: {_dumps(v, inner)}" for k, v in sorted(value.items())]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        inner = indent + " "
        return "[\n" + ",\n".join(inner + json.dumps(v) for v in value) + "\n" + indent + "]"
    return json.dumps(value)


def _duration(path: Path, name: str, value) -> float:
    """A cell's ``duration_s``: a finite number of seconds >= 0 (absent: 0, unknown)."""
    if value is None:
        return 0.0
    if not is_duration(value):
        raise GateInputError(
            f"{path}: cell {name}: duration_s {value!r} is not a duration in seconds (>= 0)"
        )
    return float(value)


def _repeats(path: Path, name: str, value) -> int:
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GateInputError(f"{path}: cell {name}: repeats {value!r} is not a count >= 1")
    return value


def side_from_baseline(path: Path, body: dict, label: str) -> Side:
    """The side a baseline file describes; :class:`GateInputError` naming the file, the
    cell and the field for anything that is not as :func:`baseline_document` writes it."""
    version = body.get("baseline_version")
    if version != BASELINE_VERSION:
        raise GateInputError(
            f"{path}: baseline_version {version!r}; this schedscope reads {BASELINE_VERSION} "
            "(write it again with `schedscope baseline update`)"
        )
    cells: dict[str, CellData] = {}
    listed = body.get("cells")
    if not isinstance(listed, dict):
        raise GateInputError(f"{path}: cells: expected an object of cells")
    for name, cell in listed.items():
        if not isinstance(cell, dict):
            raise GateInputError(f"{path}: cell {name}: expected an object")
        columns = cell.get("columns") or []
        if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
            raise GateInputError(f"{path}: cell {name}: columns: expected a list of names")
        if not isinstance(cell.get("rows") or [], list):
            raise GateInputError(f"{path}: cell {name}: rows: expected a list of rows")
        missing = [c for c in GATE_COLUMNS if c not in columns]
        if missing:
            raise GateInputError(f"{path}: cell {name} lacks the column {missing[0]}")
        try:
            frame = pl.DataFrame(
                cell.get("rows") or [],
                schema={c: _SCHEMA.get(c, pl.Null) for c in columns},
                orient="row",
            ).select([*GATE_COLUMNS, *(c for c in OPTIONAL_COLUMNS if c in columns)])
        except (pl.exceptions.PolarsError, TypeError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise GateInputError(
                f"{path}: cell {name}: rows do not fit the columns: {first}"
            ) from None
        frame = frame.with_columns(pl.col("class").fill_null("default"))
        check_numbers(frame, f"{path}: cell {name}")
        schedule = cell.get("schedule")
        if schedule is not None and schedule_digest(frame) != schedule:
            raise GateInputError(
                f"{path}: cell {name}: its rows are not the schedule it records (edited by "
                "hand?); write it again with `schedscope baseline update`"
            )
        lag = cell.get("send_lag_p99_s")
        cells[name] = CellData(
            name=name,
            frame=frame,
            duration_s=_duration(path, name, cell.get("duration_s")),
            generator_limited=cell.get("generator_limited"),
            send_lag_p99_s=lag if isinstance(lag, (int, float)) else None,
            schedule=schedule,
            repeats=_repeats(path, name, cell.get("repeats")),
        )
    if not cells:
        raise GateInputError(f"{path}: a baseline with no cells")
    identity = body.get("identity") or {}
    if not isinstance(identity, dict):
        raise GateInputError(f"{path}: identity: expected an object")
    return Side(label, path, "requests", body.get("mode"), dict(identity), cells)


#: What a mismatch of something not known on both sides says after its values.
NOT_KNOWN = "not known on both sides"
#: How to make a key known, for the refusal of one that is not.
_RECORD_IT = {
    "profile": "gate runs whose run.json or summary.json names their profile",
    "seed": "run both with --seed N",
    "schedule": "write the baseline again with `schedscope baseline update`",
    "machine": "gate runs recorded with their machine's fingerprint (run.json `machine`)",
}


def _identity_problems(baseline: Side, current: Side) -> tuple[dict[str, str], list[str]]:
    """(identity key -> what differs or is not known, notes). A :data:`REQUIRED_KEYS`
    entry unknown on either side (both included) is a mismatch: nothing says the runs
    share it. ``machine`` unknown on one side only is a mismatch between real runs, and
    a note between simulated ones (a simulated run's machine is its cost model's, and
    the built-in model has none); unknown on both sides, it is not compared."""
    out: dict[str, str] = {}
    notes: list[str] = []
    simulated = baseline.simulated and current.simulated
    for key in ("profile", "seed", "schema_version", "machine"):
        a, b = baseline.identity.get(key), current.identity.get(key)
        values = f"baseline {a!r}, current {b!r}"
        if key in REQUIRED_KEYS and (a is None or b is None):
            out[key] = f"{values}: {NOT_KNOWN}"
        elif key == "machine" and (a is None) != (b is None):
            if simulated:
                notes.append(
                    f"machine known on one side only ({values}): simulated runs, whose "
                    "machine is their cost model's (the built-in model has none)"
                )
            else:
                out[key] = f"{values}: {NOT_KNOWN}"
        elif a is not None and b is not None and a != b:
            out[key] = values
    rows = baseline.kind == current.kind == "requests"  # a summary.json holds no schedule
    for name in sorted(set(baseline.cells) & set(current.cells)):
        left, right = baseline.cells[name], current.cells[name]
        a, b = left.schedule, right.schedule
        if rows and (a is None or b is None):
            out.setdefault("schedule", f"cell {name}: baseline {a}, current {b}: {NOT_KNOWN}")
        elif a is not None and b is not None and a != b:
            out.setdefault("schedule", f"cell {name}: baseline {a}, current {b}")
        if left.repeats != right.repeats:
            out.setdefault(
                "repeats", f"cell {name}: baseline {left.repeats}, current {right.repeats}"
            )
    return out, notes


def mismatches(baseline: Side, current: Side) -> dict[str, str]:
    """Identity key -> what differs (or is not known where it must be), for every
    :data:`IDENTITY_KEYS` entry that does (:func:`_identity_problems`)."""
    return _identity_problems(baseline, current)[0]


def check_compatible(baseline: Side, current: Side, allowed: set[str]) -> list[str]:
    """Raise :class:`GateInputError` for a mismatch not in ``allowed``; return the
    allowed ones, and what is known on one side only where that is no mismatch, as
    notes."""
    unknown = sorted(allowed - set(IDENTITY_KEYS))
    if unknown:
        raise GateInputError(
            f"--allow-mismatch {unknown[0]}: unknown (known: {', '.join(IDENTITY_KEYS)})"
        )
    found, notes = _identity_problems(baseline, current)
    refused = {k: v for k, v in found.items() if k not in allowed}
    if refused:
        key, what = next(iter(refused.items()))
        if what.endswith(NOT_KNOWN):
            raise GateInputError(
                f"the {key} is {NOT_KNOWN} ({what.removesuffix(': ' + NOT_KNOWN)}; the "
                f"baseline is {baseline.path}): nothing says the runs share one; "
                f"{_RECORD_IT.get(key, 'record it')}, or pass --allow-mismatch {key}"
            )
        raise GateInputError(
            f"the baseline {baseline.path} was made from a different {key} ({what}); "
            f"compare runs of one {key}, update the baseline, or pass --allow-mismatch {key}"
        )
    return [f"allowed mismatch: {k} ({v})" for k, v in found.items()] + notes
