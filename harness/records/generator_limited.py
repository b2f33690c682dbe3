"""The stretches of a served run when its load generator fell behind its schedule, on
the clock of the run's steps, so that a fit of the steps can leave theirs out.

On a machine whose cores the engine shares with the load generator, a generator that
falls behind is one that is busy: the CPU it takes is the engine's too, and the steps
that ran meanwhile price the engine *and its neighbour* (on a slow 2-core machine a
calibration's generator lagged and its steps came out slower than the engine's own). A
request says when that was: one sent more than :data:`~harness.records.send_lag.LAG_LIMIT_S`
after its scheduled instant, or held for the generator's in-flight cap
(``send_lag_s``, ``in_flight_capped``; docs/records.md) marks the interval from its
scheduled instant to its send. Each such interval, widened by :data:`MARGIN_S` on both
sides, and the overlapping ones merged, is a *stretch*
(:func:`lagging_stretches`); ``engine.sim.cost_fit.cycles_outside`` leaves out the step
cycles that started inside one.

The client's instants (``scheduled_at``, ``sent_at``) are Unix seconds on the client's
clock. A ``schedscope run`` cell's steps.parquet is already shifted onto that clock
(harness/run/collect.py), so its stretches need no offset; a served calibration's
steps.parquet is the engine's own, engine time 0 at ``/health``'s
``clock_epoch_unix``, which is then the offset (:func:`stretches_beside` reads it from
the calibration's run.json).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.records.send_lag import LAG_LIMIT_S

if TYPE_CHECKING:
    import polars as pl

#: Seconds each lagging request's interval is widened by on either side. Before: a step
#: that started up to a cycle before the generator fell behind ran while it lagged (the
#: mean cycle of the 2-core machines measured was 6.5-15.7 ms, so 50 ms holds a few),
#: and the generator was already busy before the scheduled instant it missed. After:
#: its send and the first bytes of the answer are still its work.
MARGIN_S = 0.05
#: A served calibration's records: the client's rows (Unix time) beside the engine's
#: steps (engine time), and the run.json key of the offset between the two clocks.
CLIENT_FILE = "client.parquet"
EPOCH_KEY = "clock_epoch_unix"


def merge_stretches(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """``intervals`` ((start, end), start <= end) merged where they overlap or touch:
    disjoint stretches in time order, whose union is the intervals'."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def lagging_intervals(
    requests: pl.DataFrame, limit_s: float = LAG_LIMIT_S
) -> list[tuple[float, float]]:
    """(scheduled instant, send) of each request the generator sent more than
    ``limit_s`` late or held for its in-flight cap, on the requests' clock. A request
    never sent (cut while held) has no send: its interval is its scheduled instant
    alone. Records without the generator's columns (an engine's own requests.parquet)
    have none."""
    import polars as pl

    if not {"scheduled_at", "send_lag_s"} <= set(requests.columns):
        return []
    late = pl.col("send_lag_s").fill_null(0.0) > limit_s
    if "in_flight_capped" in requests.columns:
        late = late | pl.col("in_flight_capped").fill_null(False)
    sent = pl.col("sent_at") if "sent_at" in requests.columns else pl.lit(None)
    rows = requests.filter(late & pl.col("scheduled_at").is_not_null()).select(
        start=pl.col("scheduled_at").cast(pl.Float64),
        end=pl.coalesce(sent, pl.col("scheduled_at")).cast(pl.Float64),
    )
    return [(min(a, b), max(a, b)) for a, b in rows.iter_rows()]


def lagging_stretches(
    requests: pl.DataFrame,
    clock_offset_s: float = 0.0,
    limit_s: float = LAG_LIMIT_S,
    margin_s: float = MARGIN_S,
) -> list[tuple[float, float]]:
    """The stretches (the module's docstring) of a run's client records, on the clock
    of its steps: each lagging request's interval (:func:`lagging_intervals`) widened
    by ``margin_s``, merged, less ``clock_offset_s`` (the Unix time of the steps'
    clock's 0: a served calibration's ``clock_epoch_unix``; 0 for a run cell, whose
    steps are on the client's clock)."""
    return merge_stretches(
        (start - margin_s - clock_offset_s, end + margin_s - clock_offset_s)
        for start, end in lagging_intervals(requests, limit_s)
    )


@dataclass(frozen=True)
class LaggingStretches:
    """What the client records beside a steps file say of the generator's lag."""

    #: the stretches on the steps' clock (empty: none, or nothing to tell)
    stretches: list[tuple[float, float]]
    #: the client records they came from; None when there were none to read
    source: Path | None = None
    #: why the stretches could not be placed, when records were there but could not be
    unplaced: str | None = None


def stretches_beside(steps_file: Path) -> LaggingStretches:
    """The stretches of the run whose steps are ``steps_file``, from the client records
    beside it: a ``schedscope run`` cell's requests.parquet (the client's columns
    joined with the engine's, on the steps' clock), else a served calibration's
    client.parquet with run.json's ``clock_epoch_unix`` as the offset (a calibration
    recorded before it was written there cannot place them: ``unplaced`` says so).
    Unreadable records count as none."""
    import polars as pl

    requests_file = steps_file.with_name("requests.parquet")
    try:
        if requests_file.is_file():
            frame = pl.read_parquet(requests_file)
            if {"scheduled_at", "send_lag_s"} <= set(frame.columns):
                return LaggingStretches(lagging_stretches(frame), requests_file)
        client_file = steps_file.with_name(CLIENT_FILE)
        if not client_file.is_file():
            return LaggingStretches([])
        client = pl.read_parquet(client_file)
    except (OSError, pl.exceptions.PolarsError):
        return LaggingStretches([])
    try:
        record = json.loads(steps_file.with_name("run.json").read_text())
    except (OSError, ValueError):
        record = None
    epoch = record.get(EPOCH_KEY) if isinstance(record, dict) else None
    if not isinstance(epoch, int | float) or isinstance(epoch, bool):
        lagging = len(lagging_intervals(client))
        if not lagging:
            return LaggingStretches([], client_file)
        why = (
            f"the run.json beside {steps_file} does not record the engine's {EPOCH_KEY}, "
            f"so the {lagging} lagging request(s) of {client_file.name} cannot be placed "
            "among its steps"
        )
        return LaggingStretches([], client_file, why)
    return LaggingStretches(lagging_stretches(client, float(epoch)), client_file)


def left_out_line(left_out: int, cycles: int, stretches: list[tuple[float, float]]) -> str:
    """The line a fit prints when it left out ``left_out`` of a run's ``cycles`` usable
    step cycles for starting inside ``stretches``."""
    total_s = sum(end - start for start, end in stretches)
    return (
        f"left out {left_out:,} of {cycles:,} step cycles: they started while the load generator "
        f"lagged its schedule ({len(stretches)} stretch(es), {total_s:.1f} s in all: requests "
        f"sent over {LAG_LIMIT_S * 1e3:.0f} ms late or held for its in-flight cap, "
        f"±{MARGIN_S * 1e3:.0f} ms), when its CPU use slowed the engine's steps"
    )
