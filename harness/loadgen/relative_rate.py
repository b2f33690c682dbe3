"""``locust -f PROFILE --rate-scale auto[:F]``: the profile's rates set against the
capacity of the host it is run against, measured at the start by the saturation probe
(:mod:`harness.loadgen.saturation_probe`; harness/profiles/rate_scale.py says what auto
means). ``schedscope run`` resolves ``auto`` itself (by simulation for the bundled
engine, by the same probe for a ``--target``) and passes Locust the factor.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from harness.loadgen.saturation_probe import probe_capacity
from harness.profiles import Profile
from harness.profiles.rate_scale import ChosenScale, parse_rate_scale, relative_scale


def rate_scale_arg(text: str) -> float | str:
    """``--rate-scale``'s argparse type: a factor as a float, ``auto[:F]`` as its text."""
    try:
        spec = parse_rate_scale(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return spec.factor if spec.factor is not None else spec.text()


def resolve_auto(parsed: Any, profile: Profile, host: str, **probe: Any) -> ChosenScale | None:
    """When ``parsed.rate_scale`` is ``auto[:F]``: probe ``host``, set ``parsed.rate_scale``
    to the factor chosen (what every process then uses, the master's workers included),
    print the choice on stderr and return it; None for a factor. ``probe``: the probe's
    bounds (``streams``, ``warmup_s``, ``measure_s``, ``drain_s``). Raises
    ``saturation_probe.ProbeError`` when the host's capacity cannot be measured."""
    value = getattr(parsed, "rate_scale", 1.0)
    if not isinstance(value, str):
        return None
    spec = parse_rate_scale(value)
    assert spec.fraction is not None, "auto[:F]"
    seed = getattr(parsed, "seed", -1)
    capacity = probe_capacity(
        host,
        profile,
        endpoint=getattr(parsed, "endpoint", "completions"),
        model=getattr(parsed, "model", "") or "",
        api_key=getattr(parsed, "api_key", "") or "",
        prompt_mode=getattr(parsed, "prompt_mode", "token_ids"),
        seed=None if seed is None or seed < 0 else seed,
        **probe,
    )
    chosen = relative_scale(profile, spec.fraction, capacity)
    parsed.rate_scale = chosen.factor
    print(f"schedscope: {chosen.line(profile.name)}", file=sys.stderr, flush=True)
    return chosen
