"""``--rate-scale F|auto[:F]`` as ``run``, ``simulate`` and ``tune`` declare, parse and
resolve it (harness/profiles/rate_scale.py says what ``auto`` means).

``auto`` needs a capacity: by simulation of the first cell's knobs (FCFS) with the cost
model of the engine the command runs — the one ``--simulate`` or the ``sim`` executor
uses, and for the ``torch`` executor this machine's fit for it, calibrated first by a
quick served calibration when none exists (``--cost-model builtin`` or a file says
otherwise) — or, against a ``--target``, by a saturation probe of the target
(:mod:`harness.loadgen.saturation_probe`). The choice is printed on stderr and returned
for run.json and the report.
"""

from __future__ import annotations

import typer

from engine.config import EngineConfig
from engine.core.cost_model import CostModel
from harness.cli.app import err_console
from harness.profiles import Profile, ProfileError
from harness.profiles.rate_scale import (
    ChosenScale,
    RateScale,
    parse_rate_scale,
    relative_scale,
)

FLAG = "--rate-scale"


def rate_scale_option(there: str = ""):
    """``--rate-scale``: a factor, or ``auto[:F]``."""
    return typer.Option(
        "1",
        FLAG,
        help=(
            "Multiply every open-loop arrival rate by this factor (a replayed trace: its "
            "speed); or auto[:F]: scale them so the profile's mean offered load is F "
            "(default 0.8) of this engine's capacity on its mix, found by simulation with "
            "the engine's cost model (a --target: by a short saturation probe); bursts keep "
            "their ratio to the mean. " + there
        ).strip(),
    )


def parse(value: str) -> RateScale:
    """The option's text parsed; a usage error naming the flag (exit 2)."""
    try:
        return parse_rate_scale(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=FLAG) from None


def simulated_choice(
    spec: RateScale,
    profile: Profile,
    config: EngineConfig,
    cost_model: CostModel,
    model_name: str,
    seed: int | None,
) -> ChosenScale:
    """``auto:F`` resolved by simulation, its line printed on stderr."""
    from harness.simulate.capacity import simulated_capacity

    assert spec.fraction is not None, "an auto rate scale"
    try:
        capacity = simulated_capacity(profile, config, cost_model, seed, model_name)
        chosen = relative_scale(profile, spec.fraction, capacity)
    except (ProfileError, ValueError) as exc:
        raise typer.BadParameter(f"auto: {exc}", param_hint=FLAG) from None
    say(chosen, profile)
    return chosen


def probed_choice(
    spec: RateScale,
    profile: Profile,
    url: str,
    *,
    endpoint: str,
    model: str | None,
    api_key: str,
    prompt_mode: str,
    seed: int | None,
) -> ChosenScale:
    """``auto:F`` resolved by a saturation probe of the target at ``url``, announced
    before (it takes about half a minute) and its line printed after."""
    from harness.loadgen import saturation_probe as sp

    assert spec.fraction is not None, "an auto rate scale"
    err_console.print(
        f"rate scale auto: probing the target's capacity ({sp.STREAMS} concurrent streams "
        f"of {profile.name}'s mix, {sp.WARMUP_S:g} s to fill + {sp.MEASURE_S:g} s measured, "
        f"then at most {sp.DRAIN_S:g} s for what is in flight)",
        soft_wrap=True,
        highlight=False,
        markup=False,
    )
    try:
        capacity = sp.probe_capacity(
            url,
            profile,
            endpoint=endpoint,
            model=model or "",
            api_key=api_key,
            prompt_mode=prompt_mode,
            seed=seed,
            model_flag="--target-model",
        )
        chosen = relative_scale(profile, spec.fraction, capacity)
    except (sp.ProbeError, ProfileError, ValueError) as exc:
        raise typer.BadParameter(f"auto: the target's probe: {exc}", param_hint=FLAG) from None
    say(chosen, profile)
    return chosen


def say(chosen: ChosenScale, profile: Profile) -> None:
    err_console.print(chosen.line(profile.name), soft_wrap=True, highlight=False, markup=False)
