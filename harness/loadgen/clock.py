"""Each worker's clock offset from the master's, and the rows put on the master's clock.

Latencies are durations on one process's clock, so a worker's skew does not touch them;
instants (``scheduled_at``, ``sent_at``, ...) are joined with the engine's records and
spans, which are on the master machine's clock (the engine runs beside ``schedscope
run``), so a worker's instants must be shifted by its offset.

The master estimates an offset NTP-style over Locust's own messages: it sends a ping at
``t0`` (its clock), the worker receives it at ``t1`` and replies at ``t2`` (the worker's
clock), the master receives the reply at ``t3``. Then

    offset      = ((t1 - t0) + (t2 - t3)) / 2      (worker clock - master clock)
    uncertainty = ((t3 - t0) - (t2 - t1)) / 2      (half the round trip less the worker's time)

the true offset lies within ``offset ± uncertainty`` whatever the split of the round
trip between the two directions; of several probes the one with the smallest
uncertainty is kept (:func:`best`). A probe whose worker interval is negative or longer
than its round trip (``t2 < t1``, ``t2 - t1 > t3 - t0``) cannot have happened: its
"uncertainty" would be negative and it would win every comparison, so :func:`probe`
refuses it (as it refuses a pong that answers no ping of the master's) instead of
clamping it to zero.

Every instant a load-generator process stamps comes from :func:`unix_now`: the wall
clock read once, when this module is imported, then carried forward by the monotonic
clock, as the engine's clock is (engine/core/clock.py). A step of the machine's wall
clock during a run (a time service correcting a VM's clock by a second or more) then
moves neither the client's instants nor the engine's; one between the engine's start
and the load generator's is caught when the cell joins them (harness/run/clock_check.py).

``SCHEDSCOPE_TEST_CLOCK_OFFSET_S`` (test-only): a worker started with it shifts its own
clock (:func:`unix_now` and ``time.time()``) by that many seconds
(:func:`install_test_offset`), as a machine whose clock is off would be.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

from harness.loadgen.target_values import is_number

#: Test-only: seconds a worker adds to its own ``time.time()``.
TEST_OFFSET_ENV = "SCHEDSCOPE_TEST_CLOCK_OFFSET_S"
#: The Unix instants of a record row (docs/loadgen.md, "Records").
INSTANT_COLUMNS = ("scheduled_at", "sent_at", "first_token_at", "last_token_at")
#: Probes per worker; the best one is kept.
NUM_PROBES = 8
#: A worker's clock offset known no better than this (seconds) makes the instants the
#: run joins across machines (client rows vs engine records and spans) doubtful.
CLOCK_TOLERANCE_S = 0.005


def _read_epoch() -> float:
    # time.time() between two monotonic reads, taken at their midpoint: exact to a few µs.
    before = time.perf_counter()
    unix = time.time()
    after = time.perf_counter()
    return unix - (before + after) / 2


#: Unix time of ``time.perf_counter()``'s zero, read once (module docstring).
_epoch = _read_epoch()


def unix_now() -> float:
    """Now, in Unix seconds, on this process's step-free clock (module docstring)."""
    return _epoch + time.perf_counter()


@dataclass(frozen=True)
class Probe:
    """One round trip: t0, t3 on the master's clock, t1, t2 on the worker's."""

    t0: float
    t1: float
    t2: float
    t3: float

    @property
    def offset_s(self) -> float:
        return ((self.t1 - self.t0) + (self.t2 - self.t3)) / 2

    @property
    def uncertainty_s(self) -> float:
        # never clamped: probe() refuses a round trip shorter than the worker's interval
        return ((self.t3 - self.t0) - (self.t2 - self.t1)) / 2


class BadProbe(ValueError):
    """A pong the master refuses (the message says why)."""


def probe(sent: dict[int, float], pong: object, t3: float) -> Probe:
    """The probe of one pong, received at ``t3`` (master's clock), from the worker the
    master pinged with ``sent`` (``seq -> t0`` of the pings not yet answered; the
    answered one is removed). Raises :class:`BadProbe` for a pong that answers no ping
    of that worker's (another ``seq``, another ``t0``, one answered already), whose
    numbers are not finite, or that cannot have happened (``t2 < t1`` or
    ``t2 - t1 > t3 - t0``)."""
    if not isinstance(pong, dict):
        raise BadProbe(f"a pong that is not a mapping ({type(pong).__name__})")
    seq = pong.get("seq")
    if type(seq) is not int or seq not in sent:
        raise BadProbe(f"a pong for no ping of this worker's (seq {seq!r})")
    values = [pong.get(k) for k in ("t0", "t1", "t2")]
    finite = [v for v in (*values, t3) if is_number(v) and math.isfinite(v)]
    if len(finite) != 4:
        raise BadProbe(f"a pong whose instants are not finite numbers: {values!r}")
    t0, t1, t2 = (float(v) for v in finite[:3])
    if t0 != sent[seq]:
        raise BadProbe(f"a pong whose t0 {t0!r} is not that of ping {seq} ({sent[seq]!r})")
    if t2 < t1 or t2 - t1 > t3 - t0:
        raise BadProbe(
            f"an impossible pong (worker interval t2 - t1 = {t2 - t1:.6f} s against a round "
            f"trip t3 - t0 = {t3 - t0:.6f} s)"
        )
    del sent[seq]  # one answer per ping
    return Probe(t0, t1, t2, t3)


def best(probes: list[Probe]) -> dict:
    """``{offset_s, uncertainty_s, probes}`` of the probe with the smallest uncertainty."""
    if not probes:
        raise ValueError("no clock probe came back")
    p = min(probes, key=lambda p: p.uncertainty_s)
    return {"offset_s": p.offset_s, "uncertainty_s": p.uncertainty_s, "probes": len(probes)}


def install_test_offset() -> float:
    """Shift this process's clock (:func:`unix_now` and ``time.time()``) by
    ``$SCHEDSCOPE_TEST_CLOCK_OFFSET_S`` (tests only: a worker on a machine whose clock
    is off); returns the shift (0 when unset)."""
    global _epoch
    raw = os.environ.get(TEST_OFFSET_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        shift = float(raw)
    except ValueError:
        raise ValueError(f"{TEST_OFFSET_ENV}={raw!r}: not a number of seconds") from None
    real = time.time
    if getattr(real, "schedscope_shift", None) is None:

        def shifted() -> float:
            return real() + shift

        shifted.schedscope_shift = shift  # type: ignore[attr-defined]
        time.time = shifted
        _epoch += shift
    return shift


def to_master_clock(row: dict, offset_s: float) -> dict:
    """The row with its instants on the master's clock (``t - offset``)."""
    if not offset_s:
        return row
    out = dict(row)
    for c in INSTANT_COLUMNS:
        if out.get(c) is not None:
            out[c] = out[c] - offset_s
    return out


def clock_warnings(clock: dict[str, dict], tolerance_s: float = CLOCK_TOLERANCE_S) -> list[str]:
    """One line per worker whose offset uncertainty exceeds ``tolerance_s`` (``clock``:
    the merged summary's, worker -> {offset_s, uncertainty_s})."""
    return [
        f"worker {w}: clock offset {est['offset_s'] * 1e3:+.1f} ms known only to "
        f"±{est['uncertainty_s'] * 1e3:.1f} ms (> the join's {tolerance_s * 1e3:.0f} ms): its "
        "instants joined with the engine's and the spans' are that uncertain"
        for w, est in sorted(clock.items())
        if est.get("uncertainty_s") is not None and est["uncertainty_s"] > tolerance_s
    ]
