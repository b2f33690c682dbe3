"""An engine's capacity on a profile's mix, by simulation: the requests per second it
completes when it always has work (``--rate-scale auto``, harness/profiles/rate_scale.py).

Method: ``num_requests`` requests sampled from the profile in its mix (classes, prompt
and output lengths, in the proportions its phases give them) all arrive at once, and
the engine — the configuration's knobs, scheduled first come first served, with the
cost model's step times — serves them on the virtual clock. While requests still wait
for admission the batch is as full as the knobs and the KV pool let it be: the engine
runs at capacity. The capacity is the rate at which requests complete over that
stretch: from the first completion (before it the batch has only started) to the
moment the last request is admitted (after it the batch drains and runs half empty).

FCFS because capacity is the engine's, not a policy's: a policy reorders the same work
(SJF finishes more short requests early in the stretch, which would count the mix
unevenly). Preemption, chunked prefill and the KV pool's limits are in it, as the
configuration sets them.
"""

from __future__ import annotations

import dataclasses

import polars as pl

from engine.config import EngineConfig
from engine.core.cost_model import CostModel
from harness.profiles import Profile
from harness.profiles.rate_scale import Capacity
from harness.profiles.schedule import sample_requests
from harness.records.polars_types import as_float

#: Requests in the saturation simulation: at least this many, and at least
#: ``BATCHES`` full batches, so the stretch at capacity holds many batch turnovers.
MIN_REQUESTS = 400
BATCHES = 8
MAX_REQUESTS = 4000


def simulated_capacity(
    profile: Profile,
    config: EngineConfig,
    cost_model: CostModel,
    seed: int | None = None,
    cost_model_name: str = "",
) -> Capacity:
    """``config``'s capacity on ``profile``'s mix with ``cost_model`` (module docstring).
    ``cost_model_name``: how the line names the model (default: its source)."""
    from harness.simulate.driver import simulate

    num = min(MAX_REQUESTS, max(MIN_REQUESTS, BATCHES * config.scheduler.max_num_seqs))
    specs = [dataclasses.replace(s, scheduled_at=0.0) for s in sample_requests(profile, num, seed)]
    fcfs = dataclasses.replace(
        config, scheduler=dataclasses.replace(config.scheduler, scheduling_policy="fcfs")
    )
    result = simulate(profile, fcfs, cost_model, seed=seed, requests=specs, record_decisions=False)
    rate, window, done = saturated_rate(result.requests)
    model = cost_model_name or cost_model.source or "the built-in cost model"
    how = (
        f"{num} requests of its mix at once, simulated with {model}: {done} completed in the "
        f"{window:.3g} s the queue was never empty"
    )
    return Capacity(requests_per_s=rate, method="simulated", how=how)


def saturated_rate(requests: pl.DataFrame) -> tuple[float, float, int]:
    """(requests/s, window s, completions) over the stretch at capacity of a run in which
    every request arrived at once: from the first completion to the last admission. A
    run whose batch held every request at once has no such stretch; then the rate is
    the whole run's (all its requests over its length): a lower bound, since a larger
    batch was never tried."""
    ok = requests.filter(pl.col("status") == "ok")
    if ok.height == 0:
        raise ValueError("no request completed in the saturation simulation")
    first_done = as_float(ok["finished_at"].min())
    last_admitted = as_float(ok["first_scheduled_at"].max())
    if last_admitted > first_done:
        done = ok.filter(
            (pl.col("finished_at") > first_done) & (pl.col("finished_at") <= last_admitted)
        ).height
        if done > 0:
            window = last_admitted - first_done
            return done / window, window, done
    end = as_float(ok["finished_at"].max())
    return ok.height / end, end, ok.height
