"""The search space of ``schedscope tune``: which engine knobs are searched, over what
values, and which combinations are skipped (docs/tune.md, "The space").

A :class:`Param` is one knob: categorical ``choices`` (``"none"`` stands for an unset
knob, e.g. no ``max_wait_s`` bound), or an ``int``/``float`` range (``log`` for a
logarithmic one). ``when`` makes it conditional: searched only when an earlier
categorical knob has one of the listed values (``aging_rate`` only under sjf, priority
and lpm), else left at the current configuration's value.

:data:`DEFAULT_PARAMS` covers the scheduler's knobs: the policy, its aging rate and
max-wait bound, ``max_num_seqs``, ``max_num_batched_tokens``, chunked prefill, the KV
pool (``gpu_memory_utilization``), the swap space and the preemption mode. ``--space
FILE`` (TOML) narrows or widens it::

    base = "default"                 # or "empty": only the params below
    drop = ["swap_space"]            # default params not searched
    [params.max_num_seqs]            # replace or add a param (a knob's field or flag name)
    type = "int"                     # int | float | categorical (implied by choices)
    low = 16
    high = 1024
    log = true
    [params.max_wait_s]
    choices = ["none", 5, 10]
    when = { scheduling_policy = ["sjf", "priority"] }

A suggested configuration the engine rejects (:class:`engine.config.ConfigError`, or a
KV plan that cannot be built) is skipped; :func:`skip_reason` says why, with its numbers
taken out so that the same reason is counted once.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import SCHEDULING_POLICIES
from harness.serve.knobs import knob_types

NONE = "none"
_KINDS = ("categorical", "int", "float")


class SpaceError(ValueError):
    """A --space file that cannot be used; the message names the key."""


@dataclass(frozen=True)
class Param:
    name: str  # the knob's field name
    kind: str  # categorical | int | float
    choices: tuple = ()
    low: float | None = None
    high: float | None = None
    log: bool = False
    #: searched only when these earlier categorical knobs have one of these values
    when: dict[str, tuple] = field(default_factory=dict)

    def suggest(self, trial) -> Any:
        """This knob's value for an Optuna ``trial`` (``"none"``: None)."""
        if self.kind == "categorical":
            value = trial.suggest_categorical(self.name, list(self.choices))
            return None if value == NONE else value
        # a numeric knob has both bounds (parse_param checked them)
        assert self.low is not None and self.high is not None
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log)

    def applies(self, chosen: dict) -> bool:
        return all(chosen.get(k, NONE) in values for k, values in self.when.items())

    def describe(self) -> str:
        if self.kind == "categorical":
            values = ", ".join(str(c) for c in self.choices)
        else:
            values = f"{self.low:g}..{self.high:g}{' (log)' if self.log else ''}"
        cond = "; ".join(f"{k} in {', '.join(map(str, v))}" for k, v in self.when.items())
        return f"{self.name}: {values}" + (f" (when {cond})" if cond else "")


#: The policies that may hold a request back behind later ones (so aging and the max-wait
#: bound mean something): every policy but fcfs.
AGED_POLICIES: tuple[str, ...] = tuple(p for p in SCHEDULING_POLICIES if p != "fcfs")

DEFAULT_PARAMS: tuple[Param, ...] = (
    Param("scheduling_policy", "categorical", SCHEDULING_POLICIES),
    Param(
        "aging_rate",
        "categorical",
        (0.0, 0.1, 1.0, 10.0, 100.0, 1000.0),
        when={"scheduling_policy": AGED_POLICIES},
    ),
    Param(
        "max_wait_s",
        "categorical",
        (NONE, 1.0, 2.0, 5.0, 10.0, 20.0),
        when={"scheduling_policy": AGED_POLICIES},
    ),
    Param("max_num_seqs", "int", low=16, high=512, log=True),
    Param("max_num_batched_tokens", "int", low=256, high=8192, log=True),
    Param("enable_chunked_prefill", "categorical", (True, False)),
    Param("enable_prefix_caching", "categorical", (True, False)),
    Param("gpu_memory_utilization", "float", low=0.3, high=0.95),
    Param("swap_space", "float", low=0.001, high=16.0, log=True),
    Param("preemption_mode", "categorical", ("auto", "swap", "recompute")),
)


@dataclass(frozen=True)
class Space:
    params: tuple[Param, ...] = DEFAULT_PARAMS

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def suggest(self, trial, current: dict) -> dict:
        """Every knob for one trial: the current configuration's values, the searched
        ones replaced by the trial's suggestions (conditional ones only where they
        apply). ``max_num_batched_tokens`` is rounded down to a multiple of the block
        size (the engine requires it with chunked prefill)."""
        knobs = dict(current)
        chosen: dict = {}
        for p in self.params:
            if not p.applies(chosen):
                continue
            value = p.suggest(trial)
            chosen[p.name] = NONE if value is None else value
            knobs[p.name] = value
        if isinstance(knobs.get("max_num_batched_tokens"), int):
            block = int(knobs.get("block_size") or 16)
            knobs["max_num_batched_tokens"] = max(
                block, knobs["max_num_batched_tokens"] // block * block
            )
        return knobs

    def for_current(self, current: dict) -> Space:
        """The space without knobs the current configuration makes moot: the pool's
        ``gpu_memory_utilization`` when ``num_gpu_blocks_override`` fixes the pool, the
        ``swap_space`` when ``num_cpu_blocks_override`` fixes the host pool."""
        moot = set()
        if current.get("num_gpu_blocks_override") is not None:
            moot.add("gpu_memory_utilization")
        if current.get("num_cpu_blocks_override") is not None:
            moot.add("swap_space")
        return Space(tuple(p for p in self.params if p.name not in moot))

    def describe(self) -> list[str]:
        return [p.describe() for p in self.params]


def skip_reason(message: str) -> str:
    """A rejection's message with its numbers replaced by N: one reason per kind."""
    return re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", message)


def load_space(path: Path) -> Space:
    """A --space TOML file (module docstring); SpaceError names the bad key."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise SpaceError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpaceError(f"{path}: {exc}") from None
    try:
        return space_from_dict(data)
    except SpaceError as exc:
        raise SpaceError(f"{path}: {exc}") from None


def space_from_dict(data: dict) -> Space:
    unknown = set(data) - {"base", "drop", "params"}
    if unknown:
        raise SpaceError(
            f"unknown key(s) {', '.join(sorted(unknown))}; expected base, drop, params"
        )
    base = data.get("base", "default")
    if base not in ("default", "empty"):
        raise SpaceError(f"base: 'default' or 'empty', got {base!r}")
    params = {p.name: p for p in DEFAULT_PARAMS} if base == "default" else {}
    drop = data.get("drop", [])
    if not isinstance(drop, list):
        raise SpaceError("drop: a list of knob names")
    for name in drop:
        key = _knob_name(name, "drop")
        if key not in params:
            raise SpaceError(f"drop: {name!r} is not a param of the {base} space")
        del params[key]
    table = data.get("params", {})
    if not isinstance(table, dict):
        raise SpaceError("params: a table of [params.<knob>] tables")
    for key, spec in table.items():
        name = _knob_name(key, "params")
        params.pop(name, None)
        params[name] = _param(name, spec, f"params.{key}", params)
    if not params:
        raise SpaceError("the space searches no knob (params is empty)")
    ordered = sorted(params.values(), key=lambda p: p.name != "scheduling_policy")
    return Space(tuple(ordered))


def _knob_name(key, where: str) -> str:
    if not isinstance(key, str):
        raise SpaceError(f"{where}: {key!r} is not a knob name")
    name = key.replace("-", "_")
    if name not in knob_types() or name == "model":
        raise SpaceError(
            f"{where}.{key}: not an engine knob (the flags of schedscope serve, e.g. "
            "max-num-seqs, swap-space)"
        )
    return name


def _param(name: str, spec, where: str, earlier: dict[str, Param]) -> Param:
    if not isinstance(spec, dict):
        raise SpaceError(f"{where}: a table (type, low, high, log | choices, when)")
    unknown = set(spec) - {"type", "choices", "low", "high", "log", "when"}
    if unknown:
        raise SpaceError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    kind = spec.get("type", "categorical" if "choices" in spec else None)
    if kind not in _KINDS:
        raise SpaceError(f"{where}.type: one of {', '.join(_KINDS)} (or give choices)")
    when = _when(spec.get("when", {}), f"{where}.when", earlier)
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SpaceError(f"{where}.choices: a non-empty list")
        if len(set(map(repr, choices))) != len(choices):
            raise SpaceError(f"{where}.choices: a value listed twice")
        return Param(name, kind, tuple(choices), when=when)

    def bound(label: str) -> float:
        value = spec.get(label)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpaceError(f"{where}.{label}: a number")
        if kind == "int" and not isinstance(value, int):
            raise SpaceError(f"{where}.{label}: an integer for an int param")
        return value

    low, high, log = bound("low"), bound("high"), spec.get("log", False)
    if not low < high:
        raise SpaceError(f"{where}: low ({low}) must be below high ({high})")
    if not isinstance(log, bool):
        raise SpaceError(f"{where}.log: true or false")
    if log and low <= 0:
        raise SpaceError(f"{where}.low: must be > 0 for a log range")
    return Param(name, kind, low=low, high=high, log=log, when=when)


def _when(table, where: str, earlier: dict[str, Param]) -> dict[str, tuple]:
    if not isinstance(table, dict):
        raise SpaceError(f"{where}: a table of knob = [values]")
    out = {}
    for key, values in table.items():
        name = key.replace("-", "_")
        if name not in earlier or earlier[name].kind != "categorical":
            raise SpaceError(f"{where}.{key}: must name a categorical param defined before it")
        if not isinstance(values, list) or not values:
            raise SpaceError(f"{where}.{key}: a non-empty list of its values")
        out[name] = tuple(values)
    return out
