"""Do a served cell's two clocks agree? The check, and the correction when they do not.

A served cell joins the load generator's rows (Unix instants on its clock,
harness/loadgen/clock.py) with the engine's (engine time plus the server's published
``clock_epoch_unix``, engine/core/clock.py). Each side reads the machine's wall clock
once, when its process starts, and runs on the monotonic clock from there. A step of the
wall clock between those two reads (a time service correcting a VM's clock, seen here:
1.3 s) would put every engine instant off by the step: admissions before the client
sent the request, stalls beside the wrong tokens.

Causality brackets the engine's error. For every request both sides saw, the engine
received it after the client sent it, and the client received its first token after the
engine emitted it. With ``e`` the amount to add to the engine's instants,

    e >= low  = max(sent_at - engine arrival)
    e <= high = min(client first token - engine first token)

so with agreeing clocks ``low <= 0 <= high`` (both within a few ms on loopback). When
0 lies outside ``[low - tolerance, high + tolerance]`` the engine's instants are shifted
by the bracket's midpoint, and the cell says so. A bracket with ``low > high`` means the
clocks did not even keep one offset through the run: nothing is shifted, the cell warns.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from harness.loadgen.clock import CLOCK_TOLERANCE_S


@dataclass(frozen=True)
class ClockCheck:
    """The bracket on the engine's clock error (seconds; None: no request to bracket
    it), over ``requests`` requests, and the shift the cell applies to engine instants."""

    low_s: float | None
    high_s: float | None
    requests: int
    tolerance_s: float = CLOCK_TOLERANCE_S

    @property
    def consistent(self) -> bool:
        """One offset explains every request (an empty bracket does not)."""
        if self.low_s is None or self.high_s is None:
            return True
        return self.low_s <= self.high_s + self.tolerance_s

    @property
    def agree(self) -> bool:
        """No correction needed: 0 lies in the bracket, give or take the tolerance."""
        low, high, tol = self.low_s, self.high_s, self.tolerance_s
        return (low is None or low <= tol) and (high is None or high >= -tol)

    @property
    def shift_s(self) -> float:
        """What to add to the engine's Unix instants: the bracket's midpoint when the
        clocks disagree and one offset explains the run, else 0."""
        if self.agree or not self.consistent:
            return 0.0
        if self.low_s is None or self.high_s is None:  # one side only: its bound
            return self.low_s if self.high_s is None else self.high_s  # type: ignore[return-value]
        return (self.low_s + self.high_s) / 2

    def as_dict(self) -> dict:
        return {
            "low_s": self.low_s,
            "high_s": self.high_s,
            "requests": self.requests,
            "shift_s": self.shift_s,
        }

    def warning(self) -> str | None:
        """The cell's warning when the clocks disagreed, else None."""
        if self.agree:
            return None
        bracket = f"[{_ms(self.low_s)}, {_ms(self.high_s)}] ms over {self.requests} requests"
        if not self.consistent:
            return (
                "the engine's and the load generator's clocks did not keep one offset "
                f"through the run (bracket {bracket}: the wall clock stepped during it?): "
                "instants joined across them (first_scheduled_at, stalls, steps, spans) "
                "are off by up to that much"
            )
        return (
            f"the engine's clock was {self.shift_s * 1e3:+.1f} ms off the load "
            f"generator's (bracket {bracket}: the machine's wall clock stepped between "
            "their starts?): the engine's instants (requests, steps, decisions, spans) "
            "are shifted by that much"
        )


def _ms(value: float | None) -> str:
    return "?" if value is None else f"{value * 1e3:+.1f}"


def check_clocks(
    client: pl.DataFrame,
    engine: pl.DataFrame,
    epoch: float,
    tolerance_s: float = CLOCK_TOLERANCE_S,
) -> ClockCheck:
    """The bracket (module docstring) from the client's rows (``sent_at``,
    ``first_token_at``: Unix) and the engine's own rows (``scheduled_at`` = arrival,
    ``first_token_at``: engine time), joined by ``request_id``; ``epoch``: the
    server's clock epoch."""
    if not {"request_id", "sent_at", "first_token_at"} <= set(client.columns):
        return ClockCheck(None, None, 0, tolerance_s)
    wanted = [c for c in ("scheduled_at", "first_token_at") if c in engine.columns]
    if not wanted or "request_id" not in engine.columns:
        return ClockCheck(None, None, 0, tolerance_s)
    joined = client.select("request_id", "sent_at", "first_token_at").join(
        engine.select("request_id", *(pl.col(c).alias(f"_e_{c}") for c in wanted)),
        on="request_id",
        how="inner",
    )
    low = high = None
    if "scheduled_at" in wanted:
        low = joined.select((pl.col("sent_at") - pl.col("_e_scheduled_at") - epoch).max()).item()
    if "first_token_at" in wanted:
        high = joined.select(
            (pl.col("first_token_at") - pl.col("_e_first_token_at") - epoch).min()
        ).item()
    return ClockCheck(low, high, joined.height, tolerance_s)
