"""Planted faults: latency regressions of known size, for tests only.

A CI latency gate is only as good as the regressions it catches. To measure its
detection rate, a test plants a regression of known size into the bundled engine
through the environment variable ``SCHEDSCOPE_FAULT`` (so that it reaches the
``schedscope serve`` subprocesses of ``schedscope run`` as well as the in-process
engine of a simulation): a comma-separated list of ``key=value``,

- ``prefill_token_delay_s=F``: every step takes F seconds longer per prefill (or
  re-prefill) token scheduled in it;
- ``decode_step_delay_s=F``: every step with at least one decode takes F seconds longer;
- ``sjf_order=reversed``: the sjf policy orders longest first (a broken SJF ordering);
  under any other policy it changes nothing.

Unset or empty: no fault, and no difference at all. An unknown key or a bad value is a
:class:`FaultError` naming the key: the engine refuses to start. ``engine.factory``
applies what is parsed here (the delays through ``engine.delaying_executor``, the
reversed order through ``engine.core.sched.policy.ReversedPolicy``); this module only
says what the faults are.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from engine.config import ConfigError
from engine.core.sched.policy import SjfPolicy

#: The environment variable that plants faults.
ENV_VAR = "SCHEDSCOPE_FAULT"
#: ``sjf_order``'s one value.
REVERSED = "reversed"


class FaultError(ConfigError):
    """``SCHEDSCOPE_FAULT`` holds an unknown key or a bad value; ``key`` names it (the
    whole item when it is not ``key=value``)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{ENV_VAR}: {problem}")
        self.key = key


@dataclass(frozen=True)
class Faults:
    """The faults an engine runs with; the defaults are no fault at all."""

    #: Seconds added to a step per prefill (or re-prefill) token scheduled in it.
    prefill_token_delay_s: float = 0.0
    #: Seconds added to every step that has at least one decode.
    decode_step_delay_s: float = 0.0
    #: ``"reversed"``: sjf serves the longest request first. Empty: sjf as it is.
    sjf_order: str = ""
    #: Each step's executor time grows by this fraction of itself (0.1: 10% longer): a
    #: slower model runner, the same for every batch shape.
    step_slowdown: float = 0.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Faults:
        """The faults ``SCHEDSCOPE_FAULT`` plants (``environ``: default ``os.environ``)."""
        env = os.environ if environ is None else environ
        return cls.parse(env.get(ENV_VAR, ""))

    @classmethod
    def parse(cls, text: str) -> Faults:
        """``key=value[,key=value...]``; blank items are ignored. Raises
        :class:`FaultError` naming the key of an unknown key, a key given twice, or a
        bad value."""
        values: dict[str, float | str] = {}
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, raw = (part.strip() for part in item.partition("="))
            if not sep or not key:
                raise FaultError(item, f"{item!r} is not key=value (known keys: {_KNOWN})")
            if key not in _PARSERS:
                raise FaultError(key, f"unknown fault key {key!r} (known keys: {_KNOWN})")
            if key in values:
                raise FaultError(key, f"fault key {key!r} is given twice")
            values[key] = _PARSERS[key](key, raw)
        return cls(**values)  # type: ignore[arg-type]

    @property
    def active(self) -> bool:
        """Whether any fault is planted."""
        return self != Faults()

    @property
    def delays_steps(self) -> bool:
        return (
            self.prefill_token_delay_s > 0 or self.decode_step_delay_s > 0 or self.step_slowdown > 0
        )

    def step_delay_s(
        self, num_prefill_tokens: int, num_decode_seqs: int, executed_s: float = 0.0
    ) -> float:
        """The seconds planted into a step of this composition whose executor took
        ``executed_s``."""
        delay = self.prefill_token_delay_s * num_prefill_tokens + self.step_slowdown * executed_s
        if num_decode_seqs:
            delay += self.decode_step_delay_s
        return delay

    def reverses(self, policy_name: str) -> bool:
        """Whether the policy of this name is to order its requests the wrong way round."""
        return self.sjf_order == REVERSED and policy_name == SjfPolicy.name

    def to_dict(self) -> dict[str, float | str]:
        """The planted faults, as ``SCHEDSCOPE_FAULT`` keys (those left at their
        default omitted: empty when none is planted). What /health and the records
        report."""
        default = Faults()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }

    def describe(self) -> str:
        """The planted faults as a ``SCHEDSCOPE_FAULT`` value ("" when none)."""
        return ",".join(f"{key}={value}" for key, value in self.to_dict().items())


def _non_negative(what: str) -> Callable[[str, str], float]:
    """The parser of a finite number >= 0; ``what`` names it in the error."""

    def parse(key: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise FaultError(key, f"fault key {key!r}: {raw!r} is not {what}")
        return value

    return parse


_seconds = _non_negative("a number of seconds >= 0")
_fraction = _non_negative("a fraction >= 0 (0.1: 10%)")


def _sjf_order(key: str, raw: str) -> str:
    if raw != REVERSED:
        raise FaultError(key, f"fault key {key!r}: {raw!r} is not {REVERSED!r}, its one value")
    return raw


#: Every key, with the parser of its value; one per field of :class:`Faults`.
_PARSERS: dict[str, Callable[[str, str], float | str]] = {
    "prefill_token_delay_s": _seconds,
    "decode_step_delay_s": _seconds,
    "step_slowdown": _fraction,
    "sjf_order": _sjf_order,
}
_KNOWN = ", ".join(_PARSERS)
assert set(_PARSERS) == {f.name for f in fields(Faults)}, "a fault key per Faults field"
