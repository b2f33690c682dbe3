"""One configuration's worth in the simulator: its capacity under SLO (the largest
``--rate-scale`` of the profile at which every class still meets its targets) or, with
``--objective goodput``, its goodput at the profile's own rate (docs/tune.md, "The
objective").

Capacity is found by a bracketing search over the rate scale, each step one
simulation of the (shortened) schedule with :func:`harness.simulate.driver.simulate`: rate 1
first (the profile as it is: its tail latencies are what the Pareto front plots), then
doubling (or halving) until the SLOs flip, then geometric bisection until the bracket
is within ``precision``. It assumes that more load never helps a class meet its
targets, which holds for a queue; the last meeting rate is what is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.config import ConfigError
from engine.core.cost_model import CostModel
from harness.profiles import Profile, ProfileError
from harness.records.summary import group_summary, policy_summary
from harness.serve.knobs import build_engine_config
from harness.tune.slo import Target, meets, request_slos
from harness.tune.space import skip_reason

CAPACITY = "capacity"
GOODPUT = "goodput"
OBJECTIVES = (CAPACITY, GOODPUT)


@dataclass(frozen=True)
class Context:
    """What every trial shares (pickled to the worker processes)."""

    profile: Profile  # duration-scaled, at the profile's own rates
    seed: int | None
    targets: tuple[Target, ...]
    cost_model: CostModel
    objective: str = CAPACITY
    #: the bracket's end: hi / lo <= 1 + precision
    precision: float = 0.05
    min_scale: float = 1 / 16
    max_scale: float = 16.0


@dataclass
class Evaluation:
    """A configuration's result. ``value`` is what the search maximises: the capacity
    (a rate scale; 0: it misses its SLOs even at ``min_scale``) or the goodput (req/s)."""

    knobs: dict
    value: float = 0.0
    capacity: float | None = None
    #: every class meets its targets at the profile's own rate (scale 1)
    meets_at_profile_rate: bool = False
    #: class -> target name -> value at the profile's rate (what the front plots)
    tails: dict = field(default_factory=dict)
    #: the same at the predicted capacity (None when capacity is 0 or not searched)
    tails_at_capacity: dict | None = None
    goodput_rps: float | None = None
    #: the largest target value / limit at the profile's rate (below 1: every target
    #: met with room): the ranking's tie-break, less is better
    worst_ratio: float = math.inf
    simulations: int = 0
    #: why the engine would not run it (then nothing else is set)
    skipped: str | None = None


def tails_of(targets: tuple[Target, ...], classes: dict) -> dict:
    """class -> target name -> its statistic, for the classes with targets."""
    out: dict = {}
    for t in targets:
        out.setdefault(t.class_name, {})[t.name] = t.value(classes.get(t.class_name) or {})
    return out


def worst_ratio(targets: tuple[Target, ...], tails: dict) -> float:
    """max over targets of value / limit (a missing value: infinity)."""
    ratios = [
        (v / t.limit_s) if (v := tails.get(t.class_name, {}).get(t.name)) is not None else math.inf
        for t in targets
    ]
    return max(ratios, default=math.inf)


def _simulate(ctx: Context, config, scale: float) -> dict:
    from harness.simulate.driver import simulate

    profile = ctx.profile if scale == 1.0 else ctx.profile.with_rate_scale(scale)
    result = simulate(profile, config, ctx.cost_model, seed=ctx.seed, record_decisions=False)
    summary = policy_summary(result.requests, result.duration_s, profile)
    summary["goodput_rps"] = group_summary(
        result.requests, result.duration_s, request_slos(list(ctx.targets), profile)
    )["goodput_rps"]
    return summary


def evaluate(knobs: dict, ctx: Context) -> Evaluation:
    """``knobs`` (every engine knob) in the simulator under ``ctx``."""
    from engine.factory import default_kv_plan

    out = Evaluation(knobs=knobs)
    try:
        config = build_engine_config(knobs)
        default_kv_plan(config)
    except (ConfigError, ValueError) as exc:
        out.skipped = skip_reason(str(exc))
        return out
    first = _simulate(ctx, config, 1.0)
    out.simulations = 1
    out.tails = tails_of(ctx.targets, first["classes"])
    out.meets_at_profile_rate = meets(list(ctx.targets), first["classes"])
    out.worst_ratio = worst_ratio(ctx.targets, out.tails)
    out.goodput_rps = first["goodput_rps"]
    if ctx.objective == GOODPUT:
        out.value = float(first["goodput_rps"] or 0.0)
        return out
    lo, hi, at_lo = _bracket(ctx, config, out, first)
    while lo > 0 and hi / lo > 1 + ctx.precision:
        mid = math.sqrt(lo * hi)
        summary = _simulate(ctx, config, mid)
        out.simulations += 1
        if meets(list(ctx.targets), summary["classes"]):
            lo, at_lo = mid, summary
        else:
            hi = mid
    out.capacity = lo
    out.value = lo
    out.tails_at_capacity = tails_of(ctx.targets, at_lo["classes"]) if at_lo else None
    return out


def _schedulable(ctx: Context, scale: float) -> bool:
    """Whether the profile at ``scale`` x its rate is one a run may schedule (profiles
    refuse more than a million expected requests): the search stops there, as at
    ``max_scale``, instead of failing after minutes of it."""
    try:
        ctx.profile.with_rate_scale(scale)
    except ProfileError:
        return False
    return True


def _bracket(ctx: Context, config, out: Evaluation, first: dict):
    """(lo, hi, summary at lo): lo meets the SLOs, hi does not (hi = max_scale * 2
    when even max_scale meets; lo = 0 when even min_scale misses)."""
    if out.meets_at_profile_rate:
        lo, at_lo, hi = 1.0, first, 2.0
        while hi <= ctx.max_scale and _schedulable(ctx, hi):
            summary = _simulate(ctx, config, hi)
            out.simulations += 1
            if not meets(list(ctx.targets), summary["classes"]):
                return lo, hi, at_lo
            lo, at_lo, hi = hi, summary, hi * 2
        return lo, lo, at_lo  # capped: capacity is at least max_scale
    hi, lo = 1.0, 0.5
    while lo >= ctx.min_scale:
        summary = _simulate(ctx, config, lo)
        out.simulations += 1
        if meets(list(ctx.targets), summary["classes"]):
            return lo, hi, summary
        hi, lo = lo, lo / 2
    return 0.0, hi, None
