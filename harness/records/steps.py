"""Per-step composition (``steps.parquet``) and its summary, from step records.

:class:`StepLog` is an observer of the engine's step records: one row per step
that computed or copied something — what was in the batch, the queues and pools it
ran with, its timings — kept as columns so that a run of a million steps stays
cheap. The simulator writes it beside ``requests.parquet``; calibration from served
runs reads the same columns.
"""

from __future__ import annotations

import operator
from array import array
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from engine.records.step_record import StepRecord
from harness.records.polars_types import Schema, as_float, as_int

if TYPE_CHECKING:
    from engine.sim.decode_runs import DecodeSteps

#: steps.parquet columns, in order, with their Polars types.
STEP_SCHEMA: Schema = {
    "step": pl.Int64,
    "schedule_start": pl.Float64,
    "execute_start": pl.Float64,
    "execute_end": pl.Float64,
    "num_seqs": pl.Int64,
    "num_prefill_tokens": pl.Int64,
    "num_recompute_tokens": pl.Int64,
    "num_decode_seqs": pl.Int64,
    "num_idle_running": pl.Int64,
    "num_waiting": pl.Int64,
    "num_running": pl.Int64,
    "num_swapped": pl.Int64,
    "num_cached_tokens": pl.Int64,
    "num_evicted_blocks": pl.Int64,
    "num_free_device_blocks": pl.Int64,
    "num_device_blocks": pl.Int64,
    "num_free_host_blocks": pl.Int64,
    "num_blocks_swapped_out": pl.Int64,
    "num_blocks_swapped_in": pl.Int64,
    "swap_out_s": pl.Float64,
    "swap_in_s": pl.Float64,
    "num_decisions": pl.Int64,
    "num_decode_context_tokens": pl.Int64,
    "prefill_attention_work": pl.Int64,
    "prefill_padded_attention_work": pl.Int64,
    "forward_s": pl.Float64,
    "sample_s": pl.Float64,
    "idle_before_s": pl.Float64,
}


#: Columns computed here rather than read off the record, in a row's order.
_DERIVED_ORDER = ("num_seqs", "num_decisions", "idle_before_s")
_DERIVED = frozenset(_DERIVED_ORDER)


class StepLog:
    """Observer: the composition of every non-empty step, column by column."""

    def __init__(self) -> None:
        self._idle_carry = 0.0
        self._new_columns()

    def _new_columns(self) -> None:
        # Machine numbers, not Python objects: a million-step run keeps 8 bytes a
        # value, and its frame is a copy of each buffer rather than a conversion of
        # every value (0.4 s of 26 columns of 600,000 steps).
        self.columns: dict[str, array] = {
            name: array("d" if dtype == pl.Float64 else "q") for name, dtype in STEP_SCHEMA.items()
        }
        # Columns that are a StepRecord attribute of the same name, then the derived.
        names = [name for name in STEP_SCHEMA if name not in _DERIVED]
        self._row_columns = [self.columns[name] for name in [*names, *_DERIVED_ORDER]]
        # One C call reads them all off a record (a getattr per column cost ~3 us a step).
        self._read_same_named = operator.attrgetter(*names)
        #: Rows of records not yet moved into the columns (one tuple a step: a million
        #: appends of a machine number each cost more than moving them all at once).
        self._rows: list[tuple] = []

    def _move_rows(self) -> None:
        """The rows held as tuples into the columns, in order."""
        rows = self._rows
        if rows:
            for column, values in zip(self._row_columns, zip(*rows, strict=True), strict=True):
                column.extend(values)
            rows.clear()

    def take_frame(self) -> pl.DataFrame:
        """The steps recorded since the last call, forgotten here (a served run's
        records written as it goes); an idle wait not yet charged to a step carries on."""
        frame = self.frame()
        self._new_columns()
        return frame

    def write(self, path) -> None:
        from harness.records.requests import write_parquet

        write_parquet(self.frame(), path)

    def __call__(self, record: StepRecord) -> None:
        if record.is_empty:
            # A step that only reported between-step ends, or a forming batch: its
            # idle wait belongs to the next step that runs.
            self._idle_carry += record.idle_before_s + (record.token_time - record.schedule_start)
            return
        self.add_row(record, len(record.scheduled))

    def add_row(self, record: StepRecord, num_seqs: int) -> None:
        """The row of a non-empty step that ran ``num_seqs`` sequences (the simulator's
        decode runs hand their steps' records here without per-sequence entries)."""
        record_idle = record.idle_before_s + self._idle_carry
        self._idle_carry = 0.0
        self._rows.append(
            (*self._read_same_named(record), num_seqs, len(record.decisions), record_idle)
        )

    def add_decode_steps(self, steps: DecodeSteps) -> None:
        """The rows of a decode run's members-only steps (``engine.sim.decode_runs``),
        column by column: the rows their step records would give."""
        k = len(steps.starts)
        if not k:
            return
        self._move_rows()
        c = self.columns
        first_idle = steps.idle_before_s + self._idle_carry
        self._idle_carry = 0.0
        # Each column converted once, constants repeated as machine numbers.
        starts, num_seqs = array("d", steps.starts), array("q", steps.num_seqs)
        zero_seconds = array("d", [0.0]) * k
        given: dict[str, array] = {
            "step": array("q", range(steps.first_step, steps.first_step + k)),
            "schedule_start": starts,
            "execute_start": starts,
            "execute_end": array("d", steps.ends),
            "num_seqs": num_seqs,
            "num_decode_seqs": num_seqs,
            "num_running": num_seqs,
            "num_free_device_blocks": array("q", steps.free_device_blocks),
            "num_device_blocks": array("q", [steps.num_device_blocks]) * k,
            "num_free_host_blocks": array("q", [steps.num_free_host_blocks]) * k,
            "swap_out_s": array("d", [steps.swap_s]) * k,
            "swap_in_s": array("d", [steps.swap_s]) * k,
            "num_decode_context_tokens": array("q", steps.context_tokens),
            "forward_s": zero_seconds,
            "sample_s": zero_seconds,
            "idle_before_s": array("d", [first_idle]) + zero_seconds[1:],
        }
        if steps.evicted_blocks:
            evicted = array("q", [0]) * k
            for index, count in steps.evicted_blocks.items():
                evicted[index] = count
            given["num_evicted_blocks"] = evicted
        zeros = array("q", [0]) * k
        for name, column in c.items():
            column.extend(given.get(name, zeros))

    @property
    def num_steps(self) -> int:
        return len(self.columns["step"]) + len(self._rows)

    def frame(self) -> pl.DataFrame:
        self._move_rows()
        return pl.DataFrame(
            {name: np.array(column) for name, column in self.columns.items()}, schema=STEP_SCHEMA
        )

    def summary(self, frame: pl.DataFrame | None = None) -> dict:
        """Totals and means over the run's steps (the summary's ``step_stats``);
        ``frame``: :meth:`frame`'s, when the caller has it already."""
        f = self.frame() if frame is None else frame
        n = f.height
        if n == 0:
            return {"num_steps": 0}
        busy = f.select((pl.col("execute_end") - pl.col("schedule_start")).sum()).item()

        def mean(name: str) -> float:
            return as_float(f[name].mean())

        return {
            "num_steps": n,
            "busy_s": float(busy),
            "mean_step_s": float(busy) / n,
            "mean_batch_seqs": mean("num_seqs"),
            "mean_prefill_tokens": mean("num_prefill_tokens"),
            "mean_decode_seqs": mean("num_decode_seqs"),
            "prefill_tokens": int(f["num_prefill_tokens"].sum()),
            "recompute_tokens": int(f["num_recompute_tokens"].sum()),
            "cached_tokens": int(f["num_cached_tokens"].sum()),
            "evicted_blocks": int(f["num_evicted_blocks"].sum()),
            "decode_tokens": int(f["num_decode_seqs"].sum()),
            "idle_running_seq_steps": int(f["num_idle_running"].sum()),
            "steps_with_idle_running": int((f["num_idle_running"] > 0).sum()),
            "mixed_steps": int(((f["num_prefill_tokens"] > 0) & (f["num_decode_seqs"] > 0)).sum()),
            "mean_waiting": mean("num_waiting"),
            "max_waiting": as_int(f["num_waiting"].max()),
            "mean_running": mean("num_running"),
            "max_swapped": as_int(f["num_swapped"].max()),
            "min_free_device_blocks": as_int(f["num_free_device_blocks"].min()),
            "blocks_swapped_out": int(f["num_blocks_swapped_out"].sum()),
            "blocks_swapped_in": int(f["num_blocks_swapped_in"].sum()),
            "swap_s": as_float(f["swap_out_s"].sum()) + as_float(f["swap_in_s"].sum()),
        }
