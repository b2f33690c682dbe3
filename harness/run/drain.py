"""How long a served cell waits, after its schedule's end, for the requests still in
flight (Locust's ``--grace``): sized from the work the cell will have left, not fixed.

A fixed 30 s cut 34 of 52 long requests of a run whose machine was four times slower
than the built-in model; a request cut is censored (harness/records/request_stats.py),
but a measurement that waits for its requests has nothing to censor. So, unless
``--grace S`` says otherwise, each served cell's grace is::

    MIN_GRACE_S + DRAIN_FACTOR x (the drain the cost model predicts), at most MAX_GRACE_S

where the predicted drain is the time from the schedule's end to the last request's end
when the cell's schedule is simulated with its knobs and the cost model of its engine (a
served torch cell: the model its simulator check uses, this machine's fit or the
built-in; a ``sim`` executor cell: the model it sleeps). ``DRAIN_FACTOR`` covers a
machine slower than its fit (the speed band of a noisy machine reaches 1.3x, a stale fit
more). A ``--target`` has no cost model here: its grace is ``TARGET_GRACE_S``. The
choice is printed and recorded in the cell's run.json (``grace``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import polars as pl

from engine.config import EngineConfig
from engine.core.cost_model import CostModel
from harness.loadgen.options import GRACE_S
from harness.profiles import Profile, build_plan
from harness.records.polars_types import as_float

#: the load generator's own default: a cell that drains at once waits no less
MIN_GRACE_S = GRACE_S
DRAIN_FACTOR = 3.0
MAX_GRACE_S = 900.0
TARGET_GRACE_S = 120.0


@dataclass(frozen=True)
class Grace:
    grace_s: float
    #: the simulated drain after the schedule's end (None: not estimated)
    predicted_drain_s: float | None
    #: ``flag`` (--grace), ``cost model`` or ``target`` (no model: the fixed default)
    source: str
    how: str

    def to_dict(self) -> dict:
        return asdict(self)


def given_grace(grace_s: float) -> Grace:
    return Grace(grace_s, None, "flag", f"--grace {grace_s:g}")


def target_grace() -> Grace:
    return Grace(
        TARGET_GRACE_S, None, "target", f"{TARGET_GRACE_S:g} s (a --target: no cost model here)"
    )


def predicted_grace(
    profile: Profile, seed: int | None, config: EngineConfig, model: CostModel, model_name: str
) -> Grace:
    """The grace of a cell whose schedule (``profile``, ``seed``) runs on ``config``
    priced by ``model`` (module docstring)."""
    from harness.simulate.driver import simulate

    plan = build_plan(profile, seed)
    result = simulate(profile, config, model, seed=seed, record_decisions=False)
    ends = result.requests.filter(pl.col("finished_at").is_not_null())["finished_at"]
    last = as_float(ends.max()) if ends.len() else plan.duration_s
    drain = max(0.0, last - plan.duration_s)
    grace = min(MAX_GRACE_S, MIN_GRACE_S + DRAIN_FACTOR * drain)
    how = (
        f"{grace:.0f} s: the schedule simulated with {model_name} drains {drain:.1f} s after "
        f"its end ({MIN_GRACE_S:g} s + {DRAIN_FACTOR:g}x that, at most {MAX_GRACE_S:g} s)"
    )
    return Grace(grace, drain, "cost model", how)
