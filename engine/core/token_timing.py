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


class RunTokenTimes:
    """The token times of a run of steps in which the same requests all received one
    token per step (the simulator's decode runs, ``engine.sim.decode_runs``): kept once
    for the run, applied to each request's :class:`TokenTiming` when it leaves the run.

    ``TokenTiming.add_token`` at each of the run's times in turn gives exactly this:
    after the first token every request's previous token is the run's previous step,
    so from the second step on the gaps are the run's, the same floats for all.
    """

    __slots__ = ("times", "max_gap", "long_gaps")

    def __init__(self) -> None:
        self.times: list[float] = []  # each step's token time
        self.max_gap: list[float] = []  # max_gap[k]: the largest gap of steps 2..k+1
        self.long_gaps: list[tuple[int, float, float]] = []  # (step index, start, gap)

    def add_step(self, at: float) -> None:
        times = self.times
        if times:
            last = times[-1]
            gap = at - last
            previous = self.max_gap[-1]
            self.max_gap.append(gap if gap > previous else previous)
            if gap >= STALL_FLOOR_S:
                self.long_gaps.append((len(times), last, gap))
        else:
            self.max_gap.append(0.0)
        times.append(at)

    def apply(self, timing: TokenTiming, num_steps: int) -> None:
        """``timing`` after this run's first ``num_steps`` tokens (``num_steps`` >= 1;
        the request had a token before the run)."""
        timing.add_token(self.times[0])
        if num_steps > 1:
            gap = self.max_gap[num_steps - 1]
            if gap > timing.max_itl_s:
                timing.max_itl_s = gap
            for index, start, long_gap in self.long_gaps:
                if index >= num_steps:
                    break
                timing.long_gaps.append((start, long_gap))
            timing.last_token_time = self.times[num_steps - 1]
