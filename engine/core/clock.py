"""Clocks the engine runs on: the wall clock for real runs, a virtual one for simulation.

The engine reads ``now()`` when it schedules and after a step; it calls
``advance(duration)`` with the step's duration. The wall clock ignores that (the
time really passed); the virtual clock is moved by it, which is all simulation is.

Each clock has an *epoch*: ``epoch_unix`` is the wall-clock Unix time of engine
time 0, so ``unix_time = epoch_unix + engine_time``. Records taken on the wall
clock elsewhere (a load generator's send and receive times) join engine records and
spans through it. The wall clock reads its epoch once, from ``time.time()`` taken
beside the monotonic origin; engine times themselves stay monotonic.
"""

from __future__ import annotations

import time


class WallClock:
    """Seconds since the clock was created (monotonic)."""

    is_virtual = False

    def __init__(self) -> None:
        # Bracket time.time() between two monotonic reads and take the midpoint: the
        # epoch is then exact to a few microseconds.
        before = time.perf_counter()
        unix = time.time()
        after = time.perf_counter()
        self._origin = (before + after) / 2
        self.epoch_unix = unix

    @property
    def origin(self) -> float:
        """The ``time.perf_counter()`` reading of engine time 0 (CLOCK_MONOTONIC: the
        same in every process of this machine)."""
        return self._origin

    def now(self) -> float:
        return time.perf_counter() - self._origin

    def advance(self, seconds: float) -> None:  # the step already took its time
        pass

    def advance_to(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)


class VirtualClock:
    """Time that moves only when told to."""

    is_virtual = True

    def __init__(self, start: float = 0.0, epoch_unix: float = 0.0) -> None:
        self._now = start
        #: A simulation's time 0 maps to this Unix time (0: the run has no wall clock).
        self.epoch_unix = epoch_unix

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards by {seconds} s")
        self._now += seconds

    def advance_to(self, t: float) -> None:
        if t > self._now:
            self._now = t
