"""The search (harness/tune/search.py) and the objective (harness/tune/objective.py) on
a short profile with the built-in cost model: deterministic for a seed, the same with
one worker or a pool, capacity bracketed, the Pareto front."""

import pytest

from engine.core.cost_model import CostModel
from harness.profiles import resolve_profile
from harness.serve.knobs import knob_defaults
from harness.tune.front import pareto_front
from harness.tune.objective import Context, Evaluation, evaluate
from harness.tune.search import search
from harness.tune.slo import Target
from harness.tune.space import space_from_dict
from tests.support.paths import DATA

PROFILE = resolve_profile(str(DATA / "tune_starvation.toml")).with_duration_scale(0.5)
TARGETS = (Target("long", "ttft", "p99", 4.0), Target("short", "ttft", "p99", 3.0))
CURRENT = {**knob_defaults(), "max_num_seqs": 8}
SPACE = space_from_dict(
    {
        "base": "empty",
        "params": {
            "scheduling_policy": {"choices": ["fcfs", "sjf", "priority"]},
            "max_wait_s": {"choices": ["none", 2.0, 5.0]},
            "max_num_seqs": {"type": "int", "low": 4, "high": 16},
        },
    }
)


def _ctx(**kw) -> Context:
    kw = {"profile": PROFILE, "precision": 0.25, **kw}
    return Context(seed=None, targets=TARGETS, cost_model=CostModel(), **kw)


def _history(result) -> list[tuple]:
    return [(tuple(sorted(e.knobs.items())), e.value) for e in result.trials]


#: a coarse bracket on a shorter schedule: the search's order is under test, not the capacity
COARSE = {"precision": 0.9, "profile": PROFILE.with_duration_scale(0.5)}


def test_the_same_seed_gives_the_same_search():
    one = search(SPACE, CURRENT, _ctx(**COARSE), seed=3, trials=4, batch=2, workers=1)
    again = search(SPACE, CURRENT, _ctx(**COARSE), seed=3, trials=4, batch=2, workers=1)
    assert len(one.trials) == 4 and one.stopped_by == "trials"
    assert _history(one) == _history(again)


@pytest.mark.slow
def test_a_process_pool_gives_the_same_search_as_one_worker():
    one = search(SPACE, CURRENT, _ctx(**COARSE), seed=3, trials=4, batch=2, workers=1)
    pool = search(SPACE, CURRENT, _ctx(**COARSE), seed=3, trials=4, batch=2, workers=2)
    assert _history(one) == _history(pool)


def test_capacity_is_bracketed_by_the_slos():
    e = evaluate({**CURRENT, "scheduling_policy": "sjf", "max_wait_s": 2.0}, _ctx())
    assert e.skipped is None and e.capacity and e.capacity > 0
    assert e.value == e.capacity
    # at the capacity every target is met, and the tails there are recorded
    for t in TARGETS:
        assert e.tails_at_capacity[t.class_name][t.name] <= t.limit_s


def test_goodput_objective_simulates_the_profile_rate_once():
    e = evaluate(CURRENT, _ctx(objective="goodput"))
    assert e.simulations == 1 and e.capacity is None
    assert e.value == pytest.approx(e.goodput_rps)


def test_a_config_the_engine_rejects_is_skipped_with_its_reason():
    e = evaluate(
        {**CURRENT, "enable_chunked_prefill": False, "max_num_batched_tokens": 512}, _ctx()
    )
    assert e.skipped and "max_num_batched_tokens (N)" in e.skipped and e.simulations == 0


def test_the_budget_stops_the_search():
    result = search(SPACE, CURRENT, _ctx(), seed=0, budget_s=0.01, batch=2, workers=1)
    assert result.stopped_by == "budget" and 1 <= len(result.trials) <= 2


def test_the_front_keeps_only_the_undominated():
    def ev(value, long, short):
        return Evaluation(
            knobs={}, value=value, tails={"long": {"ttft_p99": long}, "short": {"ttft_p99": short}}
        )

    evaluations = [ev(2.0, 3.0, 1.0), ev(2.0, 3.5, 1.5), ev(1.0, 1.0, 1.0), ev(0.0, 0.1, 0.1)]
    # the second is worse than the first on both tails; the last meets no rate
    assert pareto_front(evaluations, list(TARGETS)) == [0, 2]


def test_the_bracket_stops_at_the_largest_rate_a_profile_may_schedule(monkeypatch):
    # A profile of 400,000 expected requests may run at 2x but not at 4x (a million
    # at most): the search stops doubling there, as at max_scale, instead of raising
    # ProfileError after minutes of searching.
    from harness.profiles import Phase, Profile
    from harness.tune import objective

    base = resolve_profile("mixed")
    profile = Profile(
        name="big", seed=0, classes=base.classes,
        phases=(Phase(name="p", duration_s=4000.0, rate=100.0),),
    )  # fmt: skip
    scales = []

    def always_meets(ctx, config, scale):
        scales.append(scale)
        return {"classes": {}, "goodput_rps": 1.0}

    monkeypatch.setattr(objective, "_simulate", always_meets)
    monkeypatch.setattr(objective, "meets", lambda targets, classes: True)
    ctx = Context(profile, 0, (), CostModel(), precision=0.5)
    result = evaluate(knob_defaults(), ctx)
    assert max(scales) == 2.0 and result.capacity == 2.0
