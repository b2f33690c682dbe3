"""The whole gate: read both sides, check they may be compared, evaluate every rule.

Exit codes: :data:`PASS` (0) every line passed; :data:`REGRESSION` (1) a line failed;
:data:`USAGE` (2) the configuration or the data cannot be gated (raised as
:class:`~harness.gate.config.GateConfigError` / :class:`~harness.gate.sides.GateInputError`
and mapped by the command).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.gate.baseline import BASELINE_KIND, check_compatible, side_from_baseline
from harness.gate.config import GateConfig
from harness.gate.diagnosis import NONE, Diagnosis, diagnose
from harness.gate.evaluate import Check, evaluate
from harness.gate.sides import (
    GateInputError,
    Side,
    combine,
    open_directory,
    open_summary,
    read_json,
)

PASS, REGRESSION, USAGE = 0, 1, 2


@dataclass
class GateResult:
    checks: list[Check]
    baseline: Side
    current: Side
    notes: list[str] = field(default_factory=list)
    #: which kind of regression the failed lines show (harness/gate/diagnosis.py)
    diagnosis: Diagnosis = field(default_factory=lambda: Diagnosis(NONE))

    @property
    def exit_code(self) -> int:
        return PASS if all(c.passed for c in self.checks) else REGRESSION

    def sides(self) -> dict:
        return {
            name: {
                "path": str(side.path),
                "kind": side.kind,
                "mode": side.mode,
                "identity": side.identity,
                "cells": {
                    c.name: {"repeats": c.repeats, "schedule": c.schedule}
                    for c in side.cells.values()
                },
            }
            for name, side in (("baseline", self.baseline), ("current", self.current))
        }


def open_side(path: Path | str, label: str) -> Side:
    """Read ``path`` (a run directory, a baseline file or a summary.json) as a side."""
    path = Path(path)
    if path.is_dir():
        return open_directory(path, label)
    if not path.exists():
        raise GateInputError(f"{path}: no such file or directory")
    body = read_json(path)
    if body.get("kind") == BASELINE_KIND:
        return side_from_baseline(path, body, label)
    return open_summary(path, body, label)


def open_sides(paths: Path | str | list, label: str) -> Side:
    """One path, or several runs of one schedule pooled as repeats (:func:`combine`)."""
    listed = paths if isinstance(paths, list) else [paths]
    if not listed:
        raise GateInputError(f"no {label} given")
    return combine([open_side(p, label) for p in listed], label)


def run_gate(
    baseline: Path | str | list,
    current: Path | str | list,
    config: GateConfig,
    allow: set[str] | None = None,
) -> GateResult:
    """Gate ``current`` against ``baseline`` (each a path, or a list of runs pooled)."""
    base = open_sides(baseline, "baseline")
    cur = open_sides(current, "current")
    notes = check_compatible(base, cur, allow or set())
    checks = evaluate(config, base, cur)
    if not checks:
        raise GateInputError("no line to check: the rules matched no cell")
    method = (
        "simulated runs: deterministic, compared exactly"
        if base.simulated
        else (
            f"real runs: paired block bootstrap over {config.num_blocks} schedule windows, "
            f"{config.resamples} resamples, {config.confidence:.0%} intervals; a line fails "
            "when its whole interval is past the tolerance"
        )
    )
    if not base.simulated:
        single = sorted({n for side in (base, cur) for n, c in side.cells.items() if c.repeats < 2})
        if single:
            method += (
                f"; {', '.join(single)}: one run on a side, so the interval holds the noise "
                "inside a run but not the drift between runs of one commit (docs/gate.md: "
                "run 3 or more repeats per side, base and head interleaved)"
            )
        else:
            method += "; the runs of each side are resampled too (two-stage bootstrap)"
    notes = [f"rules: {config.source}", method, *notes, *base.notes, *cur.notes]
    for side in (base, cur):
        lagged = sorted(n for n, c in side.cells.items() if c.generator_limited)
        if lagged:  # only step-cost rules let it through (evaluate.check_usable)
            notes.append(
                f"{side.label}: {', '.join(lagged)} generator-limited: its latencies are not "
                "compared, its steps are"
            )
        planted = {n: c.faults for n, c in side.cells.items() if c.faults}
        if planted:
            notes.append(
                f"{side.label}: planted faults (SCHEDSCOPE_FAULT, tests only): "
                + ", ".join(f"{n} {f}" for n, f in sorted(planted.items()))
            )
        pooled = [c.name for c in side.cells.values() if c.repeats > 1]
        if pooled:
            notes.append(
                f"{side.label}: repeats pooled: "
                + ", ".join(f"{n} x{side.cells[n].repeats}" for n in pooled)
            )
    diagnosis = diagnose(checks, base, cur)
    notes += diagnosis.lines
    return GateResult(checks, base, cur, notes, diagnosis)
