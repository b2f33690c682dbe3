"""Every scheduler decision of a run, as ``decisions.parquet`` rows (docs/records.md).

:class:`DecisionLog` is a step-record observer that keeps each record's decisions
(between-step rejects and aborts included: they ride on the next record); the
simulator and ``schedscope serve --record-decisions`` both write through
:func:`decisions_frame`, so served and simulated runs have the same file.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from engine.core.decisions import Decision
from engine.records.step_record import StepRecord
from harness.records.polars_types import Schema

SCHEMA: Schema = {
    "kind": pl.String,
    "time": pl.Float64,
    "step": pl.Int64,
    "request_id": pl.String,
    "reason": pl.String,
    "mode": pl.String,
    "beneficiary": pl.String,
    "num_blocks": pl.Int64,
    "num_tokens": pl.Int64,
    "request_ids": pl.List(pl.String),
    "detail": pl.String,
    "predicted_swap_s": pl.Float64,
    "predicted_recompute_s": pl.Float64,
    "num_cached_tokens": pl.Int64,
    "num_evicted_prefix_tokens": pl.Int64,
    "lpm_cached_tokens": pl.Int64,
}


def decisions_frame(decisions: list[Decision]) -> pl.DataFrame:
    return pl.DataFrame([d.as_dict() for d in decisions], schema=SCHEMA)


class DecisionLog:
    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def __call__(self, record: StepRecord) -> None:
        if record.decisions:
            self.decisions.extend(record.decisions)

    def take_frame(self) -> pl.DataFrame:
        """The decisions recorded since the last call, forgotten here."""
        decisions, self.decisions = self.decisions, []
        return decisions_frame(decisions)

    def write(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        decisions_frame(self.decisions).write_parquet(path)
