"""The gate's identity of a run covers session profiles: two runs of one plan have one
schedule digest whichever engine (or policy) answered them, though a session's later
turns arrive when the engine ended the turns before them; another plan has another.
And a served session run's later turns sit on the run's schedule axis."""

from __future__ import annotations

import polars as pl

from engine.config import EngineConfig, SchedulerConfig
from harness.gate.sides import schedule_digest
from harness.profiles import resolve_profile
from harness.report.verdict import arrival_offsets
from harness.simulate.driver import simulate


def digest(policy: str, seed: int | None = None, max_num_seqs: int = 256) -> str:
    profile = resolve_profile("chat_sessions").with_duration_scale(0.2)
    config = EngineConfig(SchedulerConfig(scheduling_policy=policy, max_num_seqs=max_num_seqs))
    frame = simulate(profile, config, seed=seed).requests
    offsets = pl.Series("offset_s", arrival_offsets(frame))  # the gate's axis (normalise)
    return schedule_digest(frame.with_columns(offsets))


def test_one_session_plan_has_one_digest_whoever_answered_it():
    # a tiny batch makes the turns end (and the next ones arrive) at other instants
    assert digest("fcfs") == digest("priority", max_num_seqs=2)
    assert digest("fcfs") != digest("fcfs", seed=7)


def test_served_session_turns_without_a_planned_offset_sit_on_the_run_axis():
    start = 1_700_000_000.0
    frame = pl.DataFrame(
        {
            "schedule_offset_s": [0.5, None, 2.0],
            "scheduled_at": [start + 0.5, start + 1.25, start + 2.0],
        }
    )
    assert arrival_offsets(frame).tolist() == [0.5, 1.25, 2.0]
