"""The time a target's requests spend outside its steps, fitted by replaying each run's
schedule: what ``calibrate --from-run`` takes as the fit's ``client_latency_s``.

Step durations rebuilt from the streams price the engine's steps; what they cannot see
is the time before a request's first step and after its last one (the network both ways,
the server's own path to and from the engine: HTTP, tokenizing, the hand-off to the
engine loop). Requests sent to an idle engine measure it directly, but they are few and
see the server at rest. So each run's schedule (its profile, rate, duration and seed, as
its run.json records them) is simulated with the fitted steps and no client latency, and
the served TTFT's median less the simulated one's, over the requests of the first
:data:`FIT_SHARE` of the schedule, is the latency (a constant added to every request:
the one that puts the simulated median on the served; per-request differences would
also measure where each request fell between steps, which a replay does not repeat); the
rest of the schedule is held out and says how well the simulation then predicts TTFT
and E2E (p50). A run whose profile no longer resolves is left out of this (the caller
falls back to the idle sends).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: The first share of each run's schedule (by scheduled instant) the latency is fitted
#: on; the rest is held out.
FIT_SHARE = 0.8


@dataclass(frozen=True)
class ReplayFit:
    #: seconds outside the steps (None: no run could be replayed)
    latency_s: float | None
    fitted_requests: int = 0
    held_out_requests: int = 0
    #: metric -> {served, simulated, rel_error} over the held-out requests (p50)
    held_out: dict = field(default_factory=dict)
    #: why a run was not replayed, per run
    skipped: list[str] = field(default_factory=list)


def schedule_of(info: dict):
    """(profile, seed) of a cell as it ran: its profile resolved and scaled by the cell's
    rate and duration scales; ValueError naming the reason when it does not resolve."""
    from harness.profiles import ProfileError, resolve_profile

    name = info.get("profile")
    if not isinstance(name, str) or not name:
        raise ValueError("its run.json names no profile")
    try:
        profile = resolve_profile(name)
        rate = info.get("rate_scale") or 1.0
        duration = info.get("duration_scale") or 1.0
        if rate != 1.0:
            profile = profile.with_rate_scale(float(rate))
        if duration != 1.0:
            profile = profile.with_duration_scale(float(duration))
    except (ProfileError, OSError, TypeError, ValueError) as exc:
        raise ValueError(f"its profile {name!r} does not resolve here ({exc})") from None
    seed = info.get("seed")
    return profile, seed if isinstance(seed, int) else None


def replay(runs, model, config) -> ReplayFit:
    """The latency fitted over ``runs`` (objects with ``path``, ``info`` and ``requests``:
    :class:`harness.calibration.from_run.TargetRun`), their schedules simulated with
    ``model`` (its client latency set to 0) on ``config``."""
    import dataclasses

    import polars as pl

    from harness.simulate.driver import SimulationError, simulate

    bare = dataclasses.replace(model, client_latency_s=0.0)
    fit_parts: list[pl.DataFrame] = []
    held: list[pl.DataFrame] = []
    skipped = []
    for run in runs:
        try:
            profile, seed = schedule_of(run.info)
        except ValueError as exc:
            skipped.append(f"{run.path}: {exc}")
            continue
        try:
            simulated = simulate(profile, config, bare, seed=seed, record_decisions=False).requests
        except SimulationError as exc:
            skipped.append(f"{run.path}: its schedule did not simulate ({exc})")
            continue
        served = run.requests.filter(pl.col("status") == "ok").select(
            "request_id", "scheduled_at", "ttft_s", "e2e_s"
        )
        joined = served.join(
            simulated.filter(pl.col("status") == "ok").select(
                "request_id",
                pl.col("ttft_s").alias("sim_ttft_s"),
                pl.col("e2e_s").alias("sim_e2e_s"),
            ),
            on="request_id",
        ).drop_nulls()
        if joined.height < 10:
            skipped.append(
                f"{run.path}: {joined.height} requests finished both served and simulated "
                "(its request ids are not the schedule's?)"
            )
            continue
        cut = float(np.quantile(joined["scheduled_at"].to_numpy(), FIT_SHARE))
        early = joined.filter(pl.col("scheduled_at") <= cut)
        fit_parts.append(early)
        held.append(joined.filter(pl.col("scheduled_at") > cut))
    if not fit_parts:
        return ReplayFit(None, skipped=skipped)
    fitted = pl.concat(fit_parts)
    latency = max(
        0.0,
        float(np.median(fitted["ttft_s"].to_numpy()) - np.median(fitted["sim_ttft_s"].to_numpy())),
    )
    rest = pl.concat(held) if held else pl.DataFrame()
    scores = {}
    if rest.height:
        for metric in ("ttft_s", "e2e_s"):
            served = float(np.median(rest[metric].to_numpy()))
            predicted = float(np.median(rest[f"sim_{metric}"].to_numpy())) + latency
            scores[f"{metric}_p50"] = {
                "served": served,
                "simulated": predicted,
                "rel_error": (predicted - served) / served if served else None,
            }
    return ReplayFit(latency, fitted.height, int(rest.height), scores, skipped)
