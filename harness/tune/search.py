"""The search: Optuna's TPE sampler over the :class:`~harness.tune.space.Space`, each
trial one :func:`harness.tune.objective.evaluate` in a process pool (docs/tune.md, "The
method").

Deterministic for a seed: trials are asked in batches of ``batch`` (independent of how
many worker processes run them), the batch is evaluated in parallel, and the results
are told back in trial order, so the sampler sees the same history whatever finished
first. A configuration suggested again is not simulated again: the simulation is
deterministic, so its first evaluation is told once more. A suggestion the engine
rejects is told at once as the worst value (so TPE learns to avoid it) and counted by
reason; it does not take a slot of the batch. The
time budget is checked between batches: a batch starts only while the budget lasts,
so ``--trials`` (a count) is what makes two runs identical, ``--budget-s`` what bounds
the wall time.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.tune.objective import Context, Evaluation, evaluate
from harness.tune.space import Space

if TYPE_CHECKING:
    import optuna

#: Skipped suggestions allowed per valid trial before the space counts as exhausted.
MAX_SKIPS_PER_TRIAL = 50


@dataclass
class SearchResult:
    #: evaluated trials in trial order (skipped suggestions left out)
    trials: list[Evaluation]
    current: Evaluation
    skipped: Counter = field(default_factory=Counter)
    elapsed_s: float = 0.0
    stopped_by: str = ""  # "trials", "budget" or "space"

    def ranked(self) -> list[Evaluation]:
        """Distinct configurations, best first; ties go to the one with more room under
        its targets at the profile's rate (``worst_ratio``), then to the earlier trial."""
        seen, out = set(), []
        for e in sorted(self.trials, key=lambda e: (-e.value, e.worst_ratio)):
            key = knobs_key(e.knobs)
            if key not in seen:
                seen.add(key)
                out.append(e)
        return out


def knobs_key(knobs: dict) -> tuple:
    """A configuration's identity: its knobs, sorted."""
    return tuple(sorted((k, repr(v)) for k, v in knobs.items()))


def _sampler(seed: int):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # n_startup_trials: random trials before TPE models the history (Optuna's default
    # is 10; the batch makes the first ones arrive together anyway).
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=8)


def search(
    space: Space,
    current: dict,
    ctx: Context,
    *,
    seed: int = 0,
    trials: int | None = None,
    budget_s: float | None = None,
    batch: int = 4,
    workers: int = 1,
    progress: Callable[[int, SearchResult], None] | None = None,
) -> SearchResult:
    """Search ``space`` around the ``current`` knobs (every engine knob) until
    ``trials`` are evaluated or ``budget_s`` has passed (at least one must be given).
    ``progress(done, result)`` is called after each batch."""
    import optuna

    if trials is None and budget_s is None:
        raise ValueError("give trials, budget_s or both")
    started = time.monotonic()
    study = optuna.create_study(direction="maximize", sampler=_sampler(seed))
    result = SearchResult(trials=[], current=Evaluation(knobs=current))
    seen: dict[tuple, Evaluation] = {}  # knobs_key -> its evaluation
    with _pool(workers) as pool:
        # The current configuration runs beside the first batch.
        current_job = pool.submit(evaluate, current, ctx) if pool else None
        while True:
            if trials is not None and len(result.trials) >= trials:
                result.stopped_by = "trials"
                break
            if budget_s is not None and time.monotonic() - started >= budget_s:
                result.stopped_by = "budget"
                break
            size = batch if trials is None else min(batch, trials - len(result.trials))
            asked = _ask_batch(study, space, current, ctx, size, result.skipped)
            if not asked:
                result.stopped_by = "space"
                break
            fresh = {}
            for _, knobs in asked:
                key = knobs_key(knobs)
                if key not in seen and key not in fresh:
                    fresh[key] = knobs
            if pool is None:
                done = {key: evaluate(knobs, ctx) for key, knobs in fresh.items()}
            else:
                futures = {key: pool.submit(evaluate, knobs, ctx) for key, knobs in fresh.items()}
                done = {key: f.result() for key, f in futures.items()}
            seen.update(done)
            for trial, knobs in asked:
                evaluation = seen[knobs_key(knobs)]
                if evaluation.skipped:
                    result.skipped[evaluation.skipped] += 1
                    study.tell(trial, 0.0)
                    continue
                study.tell(trial, evaluation.value)
                result.trials.append(evaluation)
            result.elapsed_s = time.monotonic() - started
            if progress is not None:
                progress(len(result.trials), result)
        result.current = current_job.result() if current_job else evaluate(current, ctx)
    result.elapsed_s = time.monotonic() - started
    return result


def _ask_batch(study, space: Space, current: dict, ctx: Context, size: int, skipped: Counter):
    """``size`` trials whose configuration the engine accepts, each with its knobs;
    rejected suggestions are told as 0 and counted. Fewer when the space keeps giving
    rejected ones (:data:`MAX_SKIPS_PER_TRIAL`)."""
    from engine.config import ConfigError
    from engine.factory import default_kv_plan
    from harness.serve.knobs import build_engine_config
    from harness.tune.space import skip_reason

    asked: list[tuple[optuna.Trial, dict]] = []
    skips = 0
    while len(asked) < size and skips < MAX_SKIPS_PER_TRIAL * size:
        trial = study.ask()
        knobs = space.suggest(trial, current)
        try:
            default_kv_plan(build_engine_config(knobs))
        except (ConfigError, ValueError) as exc:
            skipped[skip_reason(str(exc))] += 1
            skips += 1
            study.tell(trial, 0.0)
            continue
        asked.append((trial, knobs))
    return asked


class _NoPool:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _pool(workers: int):
    """A process pool of ``workers`` (spawned: polars and fork do not mix), or none for
    one worker (the trials then run in this process)."""
    if workers <= 1:
        return _NoPool()
    import multiprocessing

    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
