"""One request's token times: first and last token, the largest inter-token gap, and
every gap long enough to be a stall, on the engine clock (``Sequence.timing``).

They are filled from step records by the engine's first observer
(engine/records/token_times.py). A gap's start time is kept with its length: a report
attributes a stall to its cause by looking at what the engine did to the request over
that interval.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

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
    """The token times of a run of steps in which every request of the run receives one
    token per step (the simulator's decode runs, ``engine.sim.decode_runs``): kept once
    for the run, applied to each request's :class:`TokenTiming` when it leaves the run.
    A request may join the run at any step; it leaves at the run's latest step.

    ``TokenTiming.add_token`` at each of the request's run times in turn gives exactly
    this: after its first token in the run every token's previous one is the run's
    previous step, so from there on the gaps are the run's, the same floats for all.
    The largest of them from a step to the latest is read off the run's suffix maxima
    (the gaps no later gap reaches), so leaving costs O(log steps), not O(tokens).
    Gaps are read when a request leaves: a step only appends its time.
    """

    __slots__ = (
        "times",
        "add_step",
        "_seen",
        "_peak_steps",
        "_peak_gaps",
        "_long_steps",
        "_long_gaps",
    )

    def __init__(self) -> None:
        self.times: list[float] = []  # each step's token time, by step index
        #: ``add_step(at)``: the next step's token time (the list's own append).
        self.add_step: Callable[[float], None] = self.times.append
        self._seen = 1  # steps whose gap (from the step before) has been read
        # Suffix maxima: gaps (by the index of the step they end in) larger than every
        # later gap read, in step order, so strictly decreasing.
        self._peak_steps: list[int] = []
        self._peak_gaps: list[float] = []
        # Every gap of at least STALL_FLOOR_S: its step index, and (start, gap).
        self._long_steps: list[int] = []
        self._long_gaps: list[tuple[float, float]] = []

    def _read_gaps(self) -> None:
        """Take the gaps of the steps added since the last call into the maxima."""
        times = self.times
        steps, gaps = self._peak_steps, self._peak_gaps
        for index in range(self._seen, len(times)):
            last = times[index - 1]
            gap = times[index] - last
            while gaps and gaps[-1] <= gap:
                gaps.pop()
                steps.pop()
            steps.append(index)
            gaps.append(gap)
            if gap >= STALL_FLOOR_S:
                self._long_steps.append(index)
                self._long_gaps.append((last, gap))
        self._seen = max(self._seen, len(times))

    def apply(self, timing: TokenTiming, first: int, num_steps: int) -> None:
        """``timing`` after the run's tokens at step indexes ``first`` to ``first +
        num_steps - 1``, the last of them the run's latest step (``num_steps`` >= 1;
        the request had a token before them)."""
        times = self.times
        assert first + num_steps == len(times), "a request leaves at the run's latest step"
        timing.add_token(times[first])
        if num_steps > 1:
            self._read_gaps()
            steps = self._peak_steps
            gap = self._peak_gaps[bisect_left(steps, first + 1)]
            if gap > timing.max_itl_s:
                timing.max_itl_s = gap
            long_steps = self._long_steps
            if long_steps and long_steps[-1] > first:
                timing.long_gaps.extend(self._long_gaps[bisect_left(long_steps, first + 1) :])
            timing.last_token_time = times[-1]
