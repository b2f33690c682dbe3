"""The schedule digest: one formula for a plan (what distributed workers check) and for
a run's recorded rows (what the gate and baselines check)."""

from __future__ import annotations

import dataclasses

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.gate.sides import schedule_digest
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass, build_plan
from harness.profiles.digest import plan_digest

PROFILE = Profile(
    name="digest_test",
    seed=4,
    classes=(
        RequestClass(
            name="chat",
            prompt_tokens=LengthDistribution.uniform(8, 64),
            output_tokens=LengthDistribution.uniform(2, 12),
        ),
        RequestClass(
            name="long",
            weight=0.3,
            prompt_tokens=LengthDistribution.uniform(100, 200),
            output_tokens=LengthDistribution.uniform(20, 40),
        ),
    ),
    phases=(Phase(name="open", duration_s=3.0, rate=12.0),),
)
WITH_CLOSED = dataclasses.replace(
    PROFILE, phases=(*PROFILE.phases, Phase(name="closed", duration_s=1.0, concurrency=3))
)


def _recorded(plan) -> pl.DataFrame:
    """The rows a run of ``plan`` records, in the gate's columns (max_tokens: the output
    length each request asks for; offset_s: its schedule offset)."""
    specs = plan.open_loop_requests()
    return pl.DataFrame(
        {
            "request_id": [s.request_id for s in specs],
            "class": [s.class_name for s in specs],
            "prompt_tokens": [s.prompt_tokens for s in specs],
            "max_tokens": [s.output_tokens for s in specs],
            "offset_s": [s.scheduled_at for s in specs],
        }
    ).sample(fraction=1.0, shuffle=True, seed=1)  # the order rows arrive in does not count


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.floats(0.2, 3.0))
def test_an_open_loop_plan_has_the_digest_the_gate_computes_from_its_rows(seed, rate):
    profile = dataclasses.replace(
        PROFILE, phases=(dataclasses.replace(PROFILE.phases[0], rate=rate),)
    )
    plan = build_plan(profile, seed)
    assert plan_digest(plan) == schedule_digest(_recorded(plan))
    assert plan_digest(plan) == plan_digest(build_plan(profile, seed))  # deterministic


def test_the_digest_changes_with_what_a_worker_would_send_differently():
    base = plan_digest(build_plan(WITH_CLOSED))
    assert base != plan_digest(build_plan(PROFILE))  # a closed phase more
    assert base != plan_digest(build_plan(WITH_CLOSED, seed=5))
    assert base != plan_digest(build_plan(WITH_CLOSED.with_duration_scale(1.01)))
    more = dataclasses.replace(
        WITH_CLOSED,
        phases=(PROFILE.phases[0], dataclasses.replace(WITH_CLOSED.phases[1], concurrency=4)),
    )
    assert base != plan_digest(build_plan(more))  # the closed phase's concurrency alone
    capped = dataclasses.replace(
        WITH_CLOSED,
        classes=(
            WITH_CLOSED.classes[0],
            dataclasses.replace(
                WITH_CLOSED.classes[1], output_tokens=LengthDistribution.uniform(20, 41)
            ),
        ),
    )
    assert base != plan_digest(build_plan(capped))  # one class's lengths alone
