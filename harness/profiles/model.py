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
from harness.profiles.sessions import Sessions
from harness.profiles.system_prompts import SystemPrompts
from harness.profiles.trace import ReplayTrace

#: The most requests one run may expect to schedule (the plan holds one spec each: a
#: million is a few hundred MB; a rate of 1e12 asked for 72 TiB).
MAX_EXPECTED_REQUESTS = 1_000_000
#: The most users of a closed-loop phase (each is a loop of the load generator).
MAX_CONCURRENCY = 10_000


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

    `system_prompt`: its requests begin with one of K shared system prompts
    (`system_prompts.SystemPrompts`); `prompt_tokens` is then the rest of the prompt.
    `session`: a session class (`sessions.Sessions`): each arrival is a conversation
    of several turns, `prompt_tokens` each turn's new message and `output_tokens` each
    turn's answer.
    """

    name: str
    weight: float = 1.0
    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution
    max_tokens: int | None = None
    priority: int = 0
    slo: Slo = field(default_factory=Slo)
    system_prompt: SystemPrompts | None = None
    session: Sessions | None = None

    def __post_init__(self) -> None:
        check_name("name", self.name)
        if self.system_prompt is not None and not isinstance(self.system_prompt, SystemPrompts):
            raise ProfileError(f"system_prompt: expected SystemPrompts, got {self.system_prompt!r}")
        if self.session is not None and not isinstance(self.session, Sessions):
            raise ProfileError(f"session: expected Sessions, got {self.session!r}")
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
        Compare with the engine's max_model_len. A session's last turn holds every
        earlier message and answer (and a chat template's role markers: one token per
        message, as the bundled engine's template renders them)."""
        prompt = self.prompt_tokens.upper
        output = self.max_tokens if self.max_tokens is not None else self.output_tokens.upper
        if prompt is None or output is None:
            return None
        system = 0
        if self.system_prompt is not None:
            upper = self.system_prompt.tokens.upper
            if upper is None:
                return None
            system = upper + (1 if self.session is not None else 0)
        if self.session is None:
            return system + prompt + output
        turns = self.session.turns.upper
        assert turns is not None  # Sessions requires a bounded turn count
        return system + (turns - 1) * (prompt + output + 2) + prompt + 2 + output

    @property
    def is_session(self) -> bool:
        return self.session is not None


@dataclass(frozen=True, kw_only=True)
class Phase:
    """A stretch of the run with one arrival process.

    Open loop (`rate`): interarrival times are gamma distributed with shape=burstiness
    and scale=1/(rate*burstiness), as in vLLM's benchmark_serving; burstiness 1 is
    Poisson, smaller is burstier. With `rate_end` the rate rises (or falls) linearly
    from `rate` at the phase start to `rate_end` at its end: the same gamma renewal
    process run in rescaled time (time-rescaling of an inhomogeneous process), so the
    local coefficient of variation is still 1/sqrt(burstiness).
    Closed loop (`concurrency`): that many users, each sending its next request as
    soon as the previous one finishes. Replay (`trace`): exactly the trace's arrivals
    and lengths, open loop; `duration_s` defaults to the trace's span (plus one mean
    gap) and, when set, cuts the trace at that many seconds.
    `classes` overrides the weights of the named classes for this phase (0 leaves a
    class out); not for trace phases, whose classes come from the trace.
    `prefix_reuse` (a "cache ladder" rung, open loop only): every request of the phase
    begins with the same shared document, for that share of its prompt tokens (0.5: the
    first half of each prompt repeats an earlier prompt's prefix); the phase's classes
    must then be single-turn classes without system prompts.
    """

    name: str
    duration_s: float | None = None
    rate: float | None = None
    rate_end: float | None = None
    burstiness: float = 1.0
    concurrency: int | None = None
    trace: ReplayTrace | None = None
    classes: Mapping[str, float] | None = None
    prefix_reuse: float | None = None

    def __post_init__(self) -> None:
        check_name("name", self.name)
        if self.prefix_reuse is not None:
            reuse = check_number("prefix_reuse", self.prefix_reuse, non_negative=True)
            if reuse >= 1.0:
                raise ProfileError(
                    f"prefix_reuse: the share of prompt tokens that repeat an earlier "
                    f"prompt's prefix must be below 1, got {self.prefix_reuse!r}"
                )
            if self.rate is None:
                raise ProfileError("prefix_reuse: applies to open-loop (`rate`) phases only")
            object.__setattr__(self, "prefix_reuse", reuse)
        kinds = [k for k in ("rate", "concurrency", "trace") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ProfileError(
                "rate: a phase takes exactly one of `rate` (open loop), `concurrency` "
                f"(closed loop) or `trace` (replay), got rate={self.rate!r}, "
                f"concurrency={self.concurrency!r}, trace={self.trace!r}"
            )
        if self.duration_s is None:
            if self.trace is None:
                raise ProfileError("duration_s: required (only a trace phase may leave it out)")
        else:
            object.__setattr__(
                self, "duration_s", check_number("duration_s", self.duration_s, positive=True)
            )
        object.__setattr__(
            self, "burstiness", check_number("burstiness", self.burstiness, positive=True)
        )
        if self.rate_end is not None:
            if self.rate is None:
                raise ProfileError("rate_end: a ramp needs `rate` (its starting rate)")
            object.__setattr__(
                self, "rate_end", check_number("rate_end", self.rate_end, positive=True)
            )
        if self.rate is not None:
            object.__setattr__(self, "rate", check_number("rate", self.rate, positive=True))
        elif self.burstiness != 1.0:
            raise ProfileError(
                f"burstiness: applies to open-loop (`rate`) phases only, got {self.burstiness!r}"
            )
        if self.concurrency is not None:
            check_int("concurrency", self.concurrency, minimum=1, maximum=MAX_CONCURRENCY)
        if self.trace is not None:
            if not isinstance(self.trace, ReplayTrace):
                raise ProfileError(f"trace: expected a ReplayTrace, got {self.trace!r}")
            if self.classes is not None:
                raise ProfileError(
                    "classes: a trace phase takes its classes from the trace "
                    "(its `class` column or `trace.default_class`)"
                )
            if self.duration_s is None:
                object.__setattr__(self, "duration_s", self.trace.duration_s)
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
    def length_s(self) -> float:
        """`duration_s` as `__post_init__` resolved it: set for every phase (a trace
        phase's defaults to its trace's span), so never None once constructed."""
        assert self.duration_s is not None, "resolved by __post_init__"
        return self.duration_s

    @property
    def kind(self) -> Literal["open", "closed"]:
        """ "open" for rate and trace phases (every request has a scheduled instant)."""
        return "closed" if self.concurrency is not None else "open"

    @property
    def arrivals(self) -> Literal["rate", "ramp", "trace", "closed"]:
        if self.trace is not None:
            return "trace"
        if self.concurrency is not None:
            return "closed"
        return "ramp" if self.rate_end is not None else "rate"

    def rate_at(self, t: float) -> float | None:
        """The intended arrival rate `t` seconds into the phase (None: closed or trace)."""
        if self.rate is None:
            return None
        if self.rate_end is None:
            return self.rate
        return self.rate + (self.rate_end - self.rate) * t / self.length_s

    @property
    def expected_requests(self) -> float | None:
        """Mean number of arrivals (rate phases), or the trace's count in the window."""
        if self.trace is not None:
            return float(np.count_nonzero(self.trace.offsets_s < self.length_s))
        if self.rate is None:
            return None
        end = self.rate if self.rate_end is None else self.rate_end
        return (self.rate + end) / 2 * self.length_s


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
        expected = sum(p.expected_requests or 0.0 for p in self.phases)
        if expected > MAX_EXPECTED_REQUESTS:
            raise ProfileError(
                f"phases: about {expected:,.0f} requests expected (rate x duration over the "
                f"phases), more than the {MAX_EXPECTED_REQUESTS:,} one run schedules: lower "
                "the rate, the rate scale or the duration"
            )
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
            self._check_phase_classes(i, phase)
            if phase.trace is not None:
                trace = phase.trace
                if trace.default_class is not None and trace.default_class not in seen:
                    raise ProfileError(
                        f"phases[{i}].trace.default_class: unknown class {trace.default_class!r} "
                        f"(known: {', '.join(c.name for c in self.classes)})"
                    )
                for name in sorted({c for c in trace.classes if c is not None} - seen):
                    line = trace.lines[trace.classes.index(name)]
                    raise ProfileError(
                        f"phases[{i}].trace.file: {trace.file} line {line}, column 'class': "
                        f"{name!r} is not a class of the profile "
                        f"(known: {', '.join(c.name for c in self.classes)})"
                    )

    def _check_phase_classes(self, i: int, phase: Phase) -> None:
        """Session classes arrive open-loop (rate phases only); a reuse rung's classes
        are single-turn without system prompts (its document is their shared prefix)."""
        weights = self.class_weights(i)
        active = [c for c, w in zip(self.classes, weights, strict=True) if w > 0]
        if phase.trace is not None:
            trace = phase.trace
            names = {c for c in trace.classes if c is not None}
            if trace.default_class is not None:
                names.add(trace.default_class)
            active = [c for c in self.classes if c.name in names]
        for c in active:
            if c.session is not None and phase.rate is None:
                raise ProfileError(
                    f"phases[{i}]: session class {c.name!r} in a "
                    f"{'trace' if phase.trace is not None else 'closed-loop'} phase: "
                    "sessions arrive open-loop (a `rate` phase); give it weight 0 here"
                )
            if phase.prefix_reuse is not None and (
                c.session is not None or c.system_prompt is not None
            ):
                raise ProfileError(
                    f"phases[{i}].prefix_reuse: class {c.name!r} has "
                    f"{'sessions' if c.session is not None else 'system prompts'}; a reuse "
                    "rung's classes are single-turn without system prompts (give it weight 0)"
                )

    @property
    def has_sessions(self) -> bool:
        return any(c.session is not None for c in self.classes)

    @property
    def duration_s(self) -> float:
        return sum(p.length_s for p in self.phases)

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
        """The same profile with every open-loop rate (and ramp end) multiplied by
        `factor`; a trace phase is replayed `factor` times as fast (its time_scale
        multiplied, its duration divided). Closed-loop phases are unchanged."""
        factor = check_number("rate_scale", factor, positive=True)
        phases = []
        for p in self.phases:
            if p.rate is not None:
                end = None if p.rate_end is None else p.rate_end * factor
                p = dataclasses.replace(p, rate=p.rate * factor, rate_end=end)
            elif p.trace is not None:
                p = dataclasses.replace(
                    p, trace=p.trace.with_time_scale(factor), duration_s=p.length_s / factor
                )
            phases.append(p)
        return dataclasses.replace(self, phases=tuple(phases))

    def with_duration_scale(self, factor: float) -> Profile:
        """The same profile with every phase `factor` times as long (0.1: a tenth of
        the run). Rates are unchanged, so a ramp reaches the same end rate sooner
        (or later); a trace phase keeps the arrivals inside its scaled window."""
        factor = check_number("duration_scale", factor, positive=True)
        phases = tuple(dataclasses.replace(p, duration_s=p.length_s * factor) for p in self.phases)
        return dataclasses.replace(self, phases=phases)
