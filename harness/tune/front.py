"""The Pareto front of the search: the configurations no other beats on the objective
(capacity, or goodput) and on every class's tail latency at the profile's own rate at
once. Optuna computes it (a multi-objective study's ``best_trials``) from the
evaluations told into it; nothing here ranks by hand."""

from __future__ import annotations

import math

from harness.tune.objective import Evaluation
from harness.tune.slo import Target


def front_axes(targets: list[Target]) -> list[tuple[str, str]]:
    """(class, target name) of each latency axis: every target of every class."""
    return [(t.class_name, t.name) for t in targets]


def pareto_front(evaluations: list[Evaluation], targets: list[Target]) -> list[int]:
    """Indices into ``evaluations`` of the front, in the given order. Evaluations with a
    value of 0 (no rate meets the SLOs) are never on it."""
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.study import StudyDirection

    axes = front_axes(targets)
    study = optuna.create_study(
        directions=[StudyDirection.MAXIMIZE] + [StudyDirection.MINIMIZE] * len(axes)
    )
    for index, e in enumerate(evaluations):
        if e.skipped or e.value <= 0:
            continue
        values = [e.value] + [_finite(e.tails.get(c, {}).get(name)) for c, name in axes]
        study.add_trial(
            optuna.trial.create_trial(
                values=values,
                params={"index": float(index)},
                distributions={"index": FloatDistribution(0, max(1, len(evaluations)))},
            )
        )
    if not study.trials:
        return []
    return sorted(int(t.params["index"]) for t in study.best_trials)


def _finite(value) -> float:
    # A class with no value is as bad as it gets, not missing from the comparison.
    return float(value) if value is not None and math.isfinite(value) else 1e18
