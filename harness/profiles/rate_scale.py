"""``--rate-scale F`` or ``--rate-scale auto[:F]``: a profile's rates as given, or set
against the engine's own capacity.

An absolute scale multiplies every open-loop rate (``Profile.with_rate_scale``). A
profile written to peak at "about 3x capacity" on one machine peaks at ten times the
capacity of a machine four times slower, and loads a GPU at a few percent: its meaning
depends on the machine. ``auto[:F]`` (F: 0.8 when left out) scales the rates so that the
profile's *mean* offered load — open-loop requests per second over its open-loop
phases — is F times the capacity of the engine it is run against, on this profile's
mix; bursts and ramps keep their ratio to the mean, since one factor scales them all.

What the capacity is and how it is found (by simulation with this machine's cost model,
or by a saturation probe of a target) is the caller's (``harness.simulate.capacity``,
``harness.loadgen.saturation_probe``); this module holds the spec, the arithmetic and
the record of the choice.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from harness.profiles.errors import ProfileError
from harness.profiles.model import Profile

AUTO = "auto"
#: The share of capacity ``auto`` aims the mean offered load at: below saturation,
#: where queueing does not amplify every wobble of the machine, with room for bursts.
DEFAULT_FRACTION = 0.8
#: The largest fraction ``auto:F`` takes (an overload study asks for more than 1).
MAX_FRACTION = 10.0


@dataclass(frozen=True)
class RateScale:
    """``--rate-scale`` parsed: ``factor`` (absolute) or ``fraction`` (auto), not both."""

    factor: float | None = None
    fraction: float | None = None

    @property
    def auto(self) -> bool:
        return self.fraction is not None

    def text(self) -> str:
        if self.fraction is not None:
            return f"{AUTO}:{self.fraction:g}"
        return f"{self.factor:g}"


def parse_rate_scale(text: str | float) -> RateScale:
    """``"1.5"`` -> factor 1.5; ``"auto"`` -> fraction 0.8; ``"auto:0.6"`` -> fraction 0.6.
    ``ValueError`` naming what is wrong otherwise."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{text!r}: must be > 0")
        return RateScale(factor=value)
    raw = str(text).strip()
    if raw.lower() == AUTO or raw.lower().startswith(AUTO + ":"):
        rest = raw[len(AUTO) + 1 :]
        if not rest:
            return RateScale(fraction=DEFAULT_FRACTION)
        try:
            fraction = float(rest)
        except ValueError:
            raise ValueError(
                f"{raw!r}: auto:F takes a number F, the share of capacity (e.g. auto:0.8)"
            ) from None
        if not (math.isfinite(fraction) and 0 < fraction <= MAX_FRACTION):
            raise ValueError(f"{raw!r}: F must be in (0, {MAX_FRACTION:g}]")
        return RateScale(fraction=fraction)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f"{raw!r}: expected a number (a factor, e.g. 1.5) or auto[:F] (e.g. auto:0.8)"
        ) from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{raw!r}: must be > 0")
    return RateScale(factor=value)


def offered_rate(profile: Profile) -> float:
    """The profile's mean open-loop arrival rate (requests/s) at its own rates: expected
    arrivals over the open-loop phases' total length, a session counted as its mean
    number of turns (each is a request). ``ProfileError`` for a profile without
    open-loop arrivals (a closed-loop profile has no rate to scale)."""
    indices = [i for i, p in enumerate(profile.phases) if p.kind == "open"]
    opened = [profile.phases[i] for i in indices]
    arrivals = sum(
        (p.expected_requests or 0.0) * requests_per_arrival(profile, i)
        for i, p in zip(indices, opened, strict=True)
    )
    length = sum(p.length_s for p in opened)
    if not opened or length <= 0 or arrivals <= 0:
        raise ProfileError(
            f"profile {profile.name!r} has no open-loop arrivals: --rate-scale auto has "
            "nothing to scale (its closed-loop phases keep their concurrency)"
        )
    return arrivals / length


def requests_per_arrival(profile: Profile, phase_index: int) -> float:
    """The mean number of requests one arrival of phase ``phase_index`` brings: 1 for a
    single-turn class, a session class's mean turns (estimated from 20,000 draws of a
    fixed seed: the same figure every time)."""
    if profile.phases[phase_index].trace is not None:
        return 1.0
    weights = profile.class_weights(phase_index)
    total = float(weights.sum())
    mean = 0.0
    for c, w in zip(profile.classes, weights.tolist(), strict=True):
        turns = 1.0
        if c.session is not None and w > 0:
            turns = float(c.session.turns.sample(np.random.default_rng(0), 20_000).mean())
        mean += w / total * turns
    return mean


@dataclass(frozen=True)
class Capacity:
    """How many requests per second of a profile's mix an engine completes when it always
    has work, and how that was found."""

    requests_per_s: float
    #: ``simulated`` (this machine's cost model) or ``probe`` (the target measured)
    method: str
    #: one line: what was simulated or sent, with which model, for how long
    how: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.requests_per_s) and self.requests_per_s > 0):
            raise ValueError(f"capacity {self.requests_per_s!r} req/s: must be > 0")


@dataclass(frozen=True)
class ChosenScale:
    """The factor ``auto:F`` chose, and what it came from (run.json's ``rate_scale_auto``)."""

    factor: float
    fraction: float
    capacity_rps: float
    offered_rps: float  # the profile's mean at its own rates (factor 1)
    method: str
    how: str

    def line(self, profile_name: str) -> str:
        """What a command prints about the choice."""
        return (
            f"rate scale: auto:{self.fraction:g} -> {self.factor:.3g}x: {profile_name}'s mean "
            f"offered load {self.offered_rps:.3g} req/s at 1x, this engine's capacity on its "
            f"mix {self.capacity_rps:.3g} req/s ({self.method}: {self.how}), so "
            f"{self.factor * self.offered_rps:.3g} req/s = {self.fraction:.0%} of it"
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> ChosenScale | None:
        """A recorded choice (run.json, summary.json) read back; None for anything that is
        not one (a file is not trusted: every number finite and positive, texts text)."""
        if not isinstance(data, dict):
            return None
        values: list[float] = []
        for key in ("factor", "fraction", "capacity_rps", "offered_rps"):
            v = data.get(key)
            if not (isinstance(v, int | float) and not isinstance(v, bool)):
                return None
            if not (math.isfinite(v) and v > 0):
                return None
            values.append(float(v))
        method, how = data.get("method"), data.get("how")
        if not (isinstance(method, str) and isinstance(how, str)):
            return None
        factor, fraction, capacity, offered = values
        return cls(factor, fraction, capacity, offered, method, how)


def relative_scale(profile: Profile, fraction: float, capacity: Capacity) -> ChosenScale:
    """The factor that puts ``profile``'s mean offered load at ``fraction`` x
    ``capacity``."""
    offered = offered_rate(profile)
    return ChosenScale(
        factor=fraction * capacity.requests_per_s / offered,
        fraction=fraction,
        capacity_rps=capacity.requests_per_s,
        offered_rps=offered,
        method=capacity.method,
        how=capacity.how,
    )
