"""One request's token times: first and last token, the largest inter-token gap, and
every gap long enough to be a stall, on the engine clock (``Sequence.timing``).

They are filled from step records by the engine's first observer
(engine/records/token_times.py). A gap's start time is kept with its length: a report
attributes a stall to its cause by looking at what the engine did to the request over
that interval.
"""

from __future__ import annotations

#: No inter-token gap shorter than this is ever a stall: a run's stall threshold is the
#: larger of this floor and 5x its median ITL (docs/metrics.md, "Stalls"). The one home of
#: the floor: the harness's records and reports read it from here.
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
