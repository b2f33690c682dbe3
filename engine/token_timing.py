"""When each request received its tokens: an observer of step records.

The scheduler schedules; it does not measure. Token timing — first and last token,
the largest inter-token gap, every gap long enough to be a stall — is kept here,
from the step records, into ``Sequence.timing``. The engine installs
:func:`record_token_times` as its first observer, so every later observer (the
simulator's records, telemetry, the server's stats) reads up-to-date timings.

A gap's start time is kept with its length: a report attributes a stall to its cause
by looking at what the engine did to the request over that interval.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.step_record import StepRecord

#: No inter-token gap shorter than this is ever a stall (METRICS.md: the threshold is
#: the larger of 250 ms and 5x the run's median ITL).
STALL_FLOOR_S = 0.25


class TokenTiming:
    """One request's token times, on the engine clock."""

    __slots__ = ("first_token_time", "last_token_time", "max_itl_s", "long_gaps")

    def __init__(self) -> None:
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.max_itl_s = 0.0  # largest gap between consecutive tokens
        # (start, length) of every gap of at least STALL_FLOOR_S: stall candidates. The
        # stall threshold is never below the floor, so these are all a report needs.
        self.long_gaps: list[tuple[float, float]] = []

    def add_token(self, at: float) -> None:
        last = self.last_token_time
        if last is None:
            self.first_token_time = at
        else:
            gap = at - last
            if gap > self.max_itl_s:
                self.max_itl_s = gap
            if gap >= STALL_FLOOR_S:
                self.long_gaps.append((last, gap))
        self.last_token_time = at


def record_token_times(record: StepRecord) -> None:
    """Observer: stamp every token a step emitted with the instant it was emitted."""
    at = record.token_time
    for entry in record.scheduled:
        if entry.token_id is not None:
            entry.seq.timing.add_token(at)
