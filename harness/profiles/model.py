"""The load-profile model: request classes, phases, and the profile that holds them.

Pure data and its validation. Turning a profile into a schedule lives in `schedule`,
reading and writing it in `serialize` and `loader`; this module imports neither, so
that everything else can depend on the model without a cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

import numpy as np

from harness.profiles.distributions import LengthDistribution
from harness.profiles.errors import ProfileError, check_int, check_name, check_number


@dataclass(frozen=True, kw_only=True)
class Slo:
    """Latency targets of a request class; None means no target."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                object.__setattr__(self, f.name, check_number(f.name, value, positive=True))


@dataclass(frozen=True, kw_only=True)
class RequestClass:
    """One kind of request in the mix.

    `output_tokens` is the TRUE length the request generates (the simulator finishes
    it there, as if EOS); `max_tokens` is the cap the client sends. Sampled outputs are
    clipped to <= max_tokens; when max_tokens is None the client sends the sampled
    output length. `priority` follows vLLM: lower is served earlier.
    """

    name: str
    weight: float = 1.0
    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution
    max_tokens: int | None = None
    priority: int = 0
    slo: Slo = field(default_factory=Slo)

    def __post_init__(self) -> None:
        check_name("name", self.name)
        object.__setattr__(self, "weight", check_number("weight", self.weight, positive=True))
        for key in ("prompt_tokens", "output_tokens"):
            if not isinstance(getattr(self, key), LengthDistribution):
                raise ProfileError(
                    f"{key}: expected a LengthDistribution, got {getattr(self, key)!r}"
                )
        if self.max_tokens is not None:
            check_int("max_tokens", self.max_tokens, minimum=1)
            if self.max_tokens < self.output_tokens.min:
                raise ProfileError(
                    f"max_tokens: {self.max_tokens} is below output_tokens.min "
                    f"({self.output_tokens.min})"
                )
        check_int("priority", self.priority)
        if not isinstance(self.slo, Slo):
            raise ProfileError(f"slo: expected an Slo, got {self.slo!r}")

    @property
    def max_total_tokens(self) -> int | None:
        """Largest prompt + max_tokens a request of this class can send (None: unbounded).
        Compare with the engine's max_model_len."""
        prompt = self.prompt_tokens.upper
        output = self.max_tokens if self.max_tokens is not None else self.output_tokens.upper
        return None if prompt is None or output is None else prompt + output


@dataclass(frozen=True, kw_only=True)
class Phase:
    """A stretch of the run with one arrival process.

    Open loop (`rate`): interarrival times are gamma distributed with shape=burstiness
    and scale=1/(rate*burstiness), as in vLLM's benchmark_serving; burstiness 1 is
    Poisson, smaller is burstier. Closed loop (`concurrency`): that many users, each
    sending its next request as soon as the previous one finishes. `classes` overrides
    the weights of the named classes for this phase (0 leaves a class out).
    """

    name: str
    duration_s: float
    rate: float | None = None
    burstiness: float = 1.0
    concurrency: int | None = None
    classes: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        check_name("name", self.name)
        object.__setattr__(
            self, "duration_s", check_number("duration_s", self.duration_s, positive=True)
        )
        if (self.rate is None) == (self.concurrency is None):
            raise ProfileError(
                "rate: a phase takes exactly one of `rate` (open loop) or `concurrency` "
                f"(closed loop), got rate={self.rate!r}, concurrency={self.concurrency!r}"
            )
        object.__setattr__(
            self, "burstiness", check_number("burstiness", self.burstiness, positive=True)
        )
        if self.rate is not None:
            object.__setattr__(self, "rate", check_number("rate", self.rate, positive=True))
        else:
            check_int("concurrency", self.concurrency, minimum=1)
            if self.burstiness != 1.0:
                raise ProfileError(
                    f"burstiness: applies to open-loop (`rate`) phases only, got {self.burstiness!r}"
                )
        if self.classes is not None:
            if not isinstance(self.classes, Mapping):
                raise ProfileError(
                    f"classes: expected a table of class name = weight, got {self.classes!r}"
                )
            weights = {}
            for name, weight in self.classes.items():
                check_name("classes", name)
                weights[name] = check_number(f"classes.{name}", weight, non_negative=True)
            # Read-only copy: the phase stays immutable even if the caller's dict changes.
            object.__setattr__(self, "classes", MappingProxyType(weights))

    @property
    def kind(self) -> Literal["open", "closed"]:
        return "open" if self.rate is not None else "closed"


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A named load profile: request classes and the phases they arrive in.

    `seed` is the default seed of its schedule (`schedule.build_plan(profile)`).
    """

    name: str
    seed: int
    classes: tuple[RequestClass, ...]
    phases: tuple[Phase, ...]
    description: str = ""

    def __post_init__(self) -> None:
        check_name("name", self.name)
        # Seeds feed numpy's SeedSequence, which takes non-negative integers.
        check_int("seed", self.seed, minimum=0)
        if not isinstance(self.description, str):
            raise ProfileError(f"description: expected a string, got {self.description!r}")
        for key, kind in (("classes", RequestClass), ("phases", Phase)):
            items = getattr(self, key)
            if isinstance(items, str | Mapping) or not hasattr(items, "__iter__"):
                raise ProfileError(f"{key}: expected a list, got {items!r}")
            items = tuple(items)
            if not items:
                raise ProfileError(f"{key}: at least one is required")
            for i, item in enumerate(items):
                if not isinstance(item, kind):
                    raise ProfileError(f"{key}[{i}]: expected a {kind.__name__}, got {item!r}")
            object.__setattr__(self, key, items)
        seen: set[str] = set()
        for i, c in enumerate(self.classes):
            if c.name in seen:
                raise ProfileError(f"classes[{i}].name: duplicate class name {c.name!r}")
            seen.add(c.name)
        for i, phase in enumerate(self.phases):
            unknown = sorted(set(phase.classes or ()) - seen)
            if unknown:
                raise ProfileError(
                    f"phases[{i}].classes: unknown class {unknown[0]!r} "
                    f"(known: {', '.join(c.name for c in self.classes)})"
                )
            if not self.class_weights(i).any():
                raise ProfileError(f"phases[{i}].classes: every class has weight 0")

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    def request_class(self, name: str) -> RequestClass:
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(name)

    def class_weights(self, phase_index: int) -> np.ndarray:
        """Weights of `classes` (shape (num_classes,)) in that phase, overrides applied."""
        override = self.phases[phase_index].classes or {}
        return np.array([override.get(c.name, c.weight) for c in self.classes], dtype=np.float64)

    def with_rate_scale(self, factor: float) -> Profile:
        """The same profile with every open-loop rate multiplied by `factor`."""
        factor = check_number("rate_scale", factor, positive=True)
        phases = tuple(
            dataclasses.replace(p, rate=p.rate * factor) if p.rate is not None else p
            for p in self.phases
        )
        return dataclasses.replace(self, phases=phases)
