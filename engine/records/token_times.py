"""The first observer of every step: when each request received its tokens.

The scheduler schedules; it does not measure. This observer stamps every token a step
emitted into its sequence's ``TokenTiming`` (engine/core/token_timing.py). The engine
adds it before any other observer, so the simulator's records, telemetry and the
server's stats all read up-to-date timings.
"""

from __future__ import annotations

from engine.records.step_record import StepRecord


def record_token_times(record: StepRecord) -> None:
    """Observer: stamp every token a step emitted with the instant it was emitted."""
    at = record.token_time
    for entry in record.scheduled:
        if entry.token_id is not None:
            entry.seq.timing.add_token(at)
