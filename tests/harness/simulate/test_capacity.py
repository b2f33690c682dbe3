"""``--rate-scale auto[:F]``: the spec, the simulated capacity (against one known by
construction) and the scale chosen from it."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.config import EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass, build_plan
from harness.profiles.errors import ProfileError
from harness.profiles.rate_scale import (
    DEFAULT_FRACTION,
    Capacity,
    RateScale,
    offered_rate,
    parse_rate_scale,
    relative_scale,
)
from harness.simulate.capacity import simulated_capacity

STEP_S = 0.01
OUTPUT_TOKENS = 50


def _profile(phases=None) -> Profile:
    return Profile(
        name="known",
        seed=3,
        classes=(
            RequestClass(
                name="only",
                prompt_tokens=LengthDistribution.fixed(16),
                output_tokens=LengthDistribution.fixed(OUTPUT_TOKENS),
            ),
        ),
        phases=phases or (Phase(name="base", duration_s=60.0, rate=5.0),),
    )


def test_the_spec_parses_a_factor_or_auto_with_its_fraction():
    assert parse_rate_scale("1.5") == RateScale(factor=1.5)
    assert parse_rate_scale(2) == RateScale(factor=2.0)
    assert parse_rate_scale("auto") == RateScale(fraction=DEFAULT_FRACTION)
    assert parse_rate_scale("auto:0.6") == RateScale(fraction=0.6)
    assert parse_rate_scale("AUTO:1.2").text() == "auto:1.2"
    for bad, says in (
        ("0", "must be > 0"),
        ("-1", "must be > 0"),
        ("nan", "must be > 0"),
        ("fast", "expected a number"),
        ("auto:", None),  # auto: with nothing after it is auto
        ("auto:x", "takes a number"),
        ("auto:0", "F must be in"),
        ("auto:11", "F must be in"),
    ):
        if says is None:
            assert parse_rate_scale(bad).auto
            continue
        with pytest.raises(ValueError, match=says):
            parse_rate_scale(bad)


def test_the_capacity_of_a_known_engine_is_recovered_within_5_percent():
    # Every step takes 10 ms whatever it holds (CostModel.constant), 8 sequences at most
    # run at once and each request makes 50 tokens, one a step (its prefill's step makes
    # the first): 8 requests finish every 50 steps, 8 / (50 x 10 ms) = 16 requests/s.
    config = EngineConfig(model="tiny", scheduler=SchedulerConfig(max_num_seqs=8))
    known = 8 / (OUTPUT_TOKENS * STEP_S)
    capacity = simulated_capacity(_profile(), config, CostModel.constant(STEP_S))
    assert capacity.method == "simulated"
    assert capacity.requests_per_s == pytest.approx(known, rel=0.05)
    # twice the batch, twice the capacity; twice the step time, half of it
    doubled = dataclasses.replace(config, scheduler=SchedulerConfig(max_num_seqs=16))
    assert simulated_capacity(
        _profile(), doubled, CostModel.constant(STEP_S)
    ).requests_per_s == pytest.approx(2 * known, rel=0.05)
    assert simulated_capacity(
        _profile(), config, CostModel.constant(2 * STEP_S)
    ).requests_per_s == pytest.approx(known / 2, rel=0.05)


def test_the_capacity_is_the_engines_whatever_policy_the_config_names():
    base = EngineConfig(model="tiny", scheduler=SchedulerConfig(max_num_seqs=8))
    sjf = dataclasses.replace(
        base, scheduler=dataclasses.replace(base.scheduler, scheduling_policy="sjf")
    )
    model = CostModel.constant(STEP_S)
    assert (
        simulated_capacity(_profile(), sjf, model).requests_per_s
        == simulated_capacity(_profile(), base, model).requests_per_s
    )


def test_auto_puts_the_mean_offered_load_at_the_fraction_of_capacity():
    # a base phase at 5/s for 60 s and a burst at 20/s for 20 s: mean 35/4 = 8.75/s
    profile = _profile(
        (
            Phase(name="base", duration_s=60.0, rate=5.0),
            Phase(name="burst", duration_s=20.0, rate=20.0),
        )
    )
    assert offered_rate(profile) == pytest.approx(8.75)
    capacity = Capacity(requests_per_s=16.0, method="simulated", how="by hand")
    chosen = relative_scale(profile, 0.8, capacity)
    assert chosen.factor * chosen.offered_rps == pytest.approx(0.8 * 16.0)
    scaled = profile.with_rate_scale(chosen.factor)
    assert offered_rate(scaled) == pytest.approx(0.8 * 16.0)
    # the burst keeps its ratio to the base
    rates = [p.rate for p in scaled.phases]
    assert rates[1] / rates[0] == pytest.approx(4.0)
    line = chosen.line(profile.name)
    assert "auto:0.8" in line and "16 req/s" in line and "80% of it" in line


@given(st.floats(min_value=0.05, max_value=10.0), st.floats(min_value=0.1, max_value=1e3))
def test_the_chosen_scale_always_offers_the_fraction(fraction, capacity_rps):
    profile = _profile()
    chosen = relative_scale(profile, fraction, Capacity(capacity_rps, "simulated", "-"))
    assert offered_rate(profile.with_rate_scale(chosen.factor)) == pytest.approx(
        fraction * capacity_rps, rel=1e-9
    )


def test_a_profile_without_open_loop_arrivals_has_nothing_to_scale():
    closed = _profile((Phase(name="users", duration_s=10.0, concurrency=4),))
    with pytest.raises(ProfileError, match="no open-loop arrivals"):
        offered_rate(closed)


def test_the_chosen_load_keeps_a_known_engine_out_of_saturation():
    # At auto:0.8 every request of the schedule is admitted long before the next
    # batch of arrivals would pile up: the simulated queue never holds more than a
    # few requests' worth of waiting, unlike at 1.5x capacity.
    config = EngineConfig(model="tiny", scheduler=SchedulerConfig(max_num_seqs=8))
    model = CostModel.constant(STEP_S)
    profile = _profile()
    capacity = simulated_capacity(profile, config, model)
    from harness.simulate.driver import simulate

    def p99_queue(fraction: float) -> float:
        scaled = profile.with_rate_scale(relative_scale(profile, fraction, capacity).factor)
        frame = simulate(scaled, config, model, record_decisions=False).requests
        return float(frame["queue_s"].quantile(0.99))

    assert len(build_plan(profile).open_loop_requests()) > 100
    assert p99_queue(0.8) < 1.0 < p99_queue(1.5)
