"""The cells of a run: policies x knob sets x rate scales.

From the command line: the ``--policy`` list, one knob set (the knob flags), one
``--rate-scale``. From a TOML run file (``--run-file``; schema in docs/run.md)::

    profile = "mixed"            # optional; overrides --profile
    policies = ["fcfs", "sjf"]   # optional; overrides --policy
    rate_scales = [0.5, 1, 2]    # optional; overrides --rate-scale
    duration_scale = 0.3         # optional; overrides --duration-scale
    seed = 7                     # optional
    repeats = 3                  # optional: every cell N times (the gate pools them)
    [knobs]                      # applied to every cell (on top of the knob flags)
    max-num-seqs = 64
    [[knob_sets]]                # optional; each is one more column of the matrix
    name = "small-swap"
    swap-space = 0.01
    torch-threads = 1            # a run setting (CELL_SETTINGS) may be set per cell too

Each cell's directory is ``<policy>[-<knob set>][-x<rate>][-r<k>]``: the knob set's name
only when the file has knob sets, the rate only when it sweeps several, the repeat only
with ``repeats`` > 1 (the same schedule served again: ``schedscope gate`` pools them).
"""

from __future__ import annotations

import re
import tomllib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from engine.config import ConfigError, EngineConfig
from engine.core.sched.policy import POLICY_NAMES
from harness.serve.knobs import build_engine_config, knob_types

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.]*\Z")
#: A --target run's label (harness/run/plan.py): a profile's or class's name (letters,
#: digits, '_ . -'), at most 64 characters.
LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
RUN_FILE_KEYS = {
    "profile",
    "policies",
    "rate_scales",
    "duration_scale",
    "seed",
    "knobs",
    "knob_sets",
    "label",
    "repeats",
}


#: Run settings (``schedscope run`` flags, not engine knobs) that a run file's [knobs]
#: and [[knob_sets]] may set per cell as well, with their allowed values or type:
#: serve's --executor and --torch-threads (0: serve's default). They change what the
#: cell's steps cost, so its fingerprint (docs/simulator.md).
CELL_SETTINGS: dict[str, tuple[str, ...] | type] = {
    "executor": ("torch", "sim"),
    "torch_threads": int,
}


class RunFileError(ValueError):
    """A run file (or matrix) that cannot be run; the message names the key."""


@dataclass(frozen=True)
class Cell:
    name: str  # its directory and its label in the report
    policy: str
    knob_set: str | None
    rate_scale: float
    knobs: dict  # engine knob field name -> value (every knob, defaults included)
    config: EngineConfig | None = None  # None for a --target cell
    #: the run settings this cell sets itself (CELL_SETTINGS names -> value), over the
    #: run's flags
    settings: dict = field(default_factory=dict)
    repeat: int | None = None  # 1..N when the run repeats every cell, else None

    def setting(self, name: str, run_value):
        """The cell's value of run setting ``name``: its own, else the run's."""
        return self.settings.get(name, run_value)

    @property
    def group(self) -> str:
        """What the cell shares with its peers of other policies (the report compares
        policies within a group): the name without the policy."""
        return self.name[len(self.policy) :]


@dataclass
class RunPlan:
    cells: list[Cell]
    profile: str
    duration_scale: float
    seed: int | None
    run_file: dict | None = field(default=None)


def _coerce(name: str, value, hint, where: str):
    """A run-file value as the knob's type (TOML ints for float knobs, etc.)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and args else hint
    if value is None:
        return None
    if base is bool:
        if not isinstance(value, bool):
            raise RunFileError(f"{where}.{name}: expected true or false, got {value!r}")
        return value
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RunFileError(f"{where}.{name}: expected an integer, got {value!r}")
        return value
    if base is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RunFileError(f"{where}.{name}: expected a number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise RunFileError(f"{where}.{name}: expected a string, got {value!r}")
    return value


def parse_knobs(table: dict, where: str, allow: frozenset[str] = frozenset()) -> dict:
    """A TOML table of knobs (flag spelling ``swap-space`` or field ``swap_space``)."""
    types = knob_types()
    out = {}
    for key, value in table.items():
        if key in allow:
            continue
        name = key.replace("-", "_")
        if name in CELL_SETTINGS:
            out[name] = _setting(key, value, CELL_SETTINGS[name], where)
            continue
        if name == "scheduling_policy":
            raise RunFileError(f"{where}.{key}: the policy is the matrix's axis (use policies)")
        if name not in types:
            raise RunFileError(
                f"{where}.{key}: not an engine knob (the flags of schedscope "
                "serve: e.g. max-num-seqs, swap-space, max-wait-s) nor a run setting "
                "(executor, torch-threads)"
            )
        out[name] = _coerce(key, value, types[name], where)
    return out


def _setting(key: str, value, allowed, where: str):
    """A run setting's value from a run file, checked against CELL_SETTINGS."""
    if isinstance(allowed, tuple):
        if value not in allowed:
            raise RunFileError(f"{where}.{key}: expected {' or '.join(allowed)}, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RunFileError(f"{where}.{key}: expected an integer >= 0, got {value!r}")
    return value


def _rate_tag(rate: float) -> str:
    return f"x{rate:g}"


def _check_policies(policies: list[str]) -> None:
    """At least one policy, each known, none twice."""
    if not policies:
        raise RunFileError("policies: at least one")
    for p in policies:
        if p not in POLICY_NAMES:
            raise RunFileError(
                f"policies: unknown policy {p!r}; expected {', '.join(POLICY_NAMES)}"
            )
    if len(set(policies)) != len(policies):
        raise RunFileError("policies: a policy listed twice")


def _check_rate_scales(rate_scales: list[float]) -> None:
    """At least one rate, each a positive number (not a bool), none twice."""
    if not rate_scales or any(
        not isinstance(r, (int, float)) or isinstance(r, bool) or r <= 0 for r in rate_scales
    ):
        raise RunFileError(f"rate_scales: positive numbers, got {rate_scales!r}")
    if len(set(rate_scales)) != len(rate_scales):
        raise RunFileError("rate_scales: a rate listed twice")


def _cell_name(policy: str, set_name: str | None, rate: float, sweeps_rates: bool) -> str:
    """``<policy>[-<knob set>][-x<rate>]`` (module docstring; the repeat is added after)."""
    name = policy
    if set_name:
        name += f"-{set_name}"
    if sweeps_rates:
        name += f"-{_rate_tag(rate)}"
    return name


def check_repeats(repeats) -> int:
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise RunFileError(f"repeats: a whole number >= 1, got {repeats!r}")
    return repeats


def repeated(cells: list[Cell], repeats: int) -> list[Cell]:
    """Each cell ``repeats`` times as ``<name>-r<k>`` (k = 1..N), in rounds: every cell
    once, then every cell again, so a slow drift of the machine touches all alike."""
    if check_repeats(repeats) == 1:
        return cells
    return [
        replace(cell, name=f"{cell.name}-r{k}", repeat=k)
        for k in range(1, repeats + 1)
        for cell in cells
    ]


def build_cells(
    policies: list[str],
    base_knobs: dict,
    knob_sets: list[tuple[str, dict]],
    rate_scales: list[float],
    with_configs: bool = True,
    repeats: int = 1,
) -> list[Cell]:
    """Every (policy, knob set, rate) cell with a validated EngineConfig, ``repeats``
    times (:func:`repeated`)."""
    _check_policies(policies)
    _check_rate_scales(rate_scales)
    sets: Sequence[tuple[str | None, dict]] = knob_sets if knob_sets else [(None, {})]
    cells = []
    for policy in policies:
        for set_name, overrides in sets:
            for rate in rate_scales:
                name = _cell_name(policy, set_name, rate, len(rate_scales) > 1)
                merged = {**base_knobs, **overrides}
                settings = {k: v for k, v in merged.items() if k in CELL_SETTINGS}
                knobs = {k: v for k, v in merged.items() if k not in CELL_SETTINGS}
                knobs["scheduling_policy"] = policy
                config = None
                if with_configs:
                    try:
                        config = build_engine_config(knobs)
                    except ConfigError as exc:
                        raise RunFileError(f"{name}: {exc}") from None
                cells.append(Cell(name, policy, set_name, float(rate), knobs, config, settings))
    return repeated(cells, repeats)


def load_run_file(
    path: Path,
    base_knobs: dict,
    policies: list[str],
    rate_scale: float,
    profile: str,
    duration_scale: float,
    seed: int | None,
    with_configs: bool = True,
    repeats: int = 1,
) -> RunPlan:
    """The matrix of a TOML run file, on top of the command line's values."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise RunFileError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RunFileError(f"{path}: {exc}") from None
    unknown = set(data) - RUN_FILE_KEYS
    if unknown:
        raise RunFileError(
            f"{path}: unknown key(s) {', '.join(sorted(unknown))}; expected "
            f"{', '.join(sorted(RUN_FILE_KEYS))}"
        )
    policies = list(data.get("policies", policies))
    rates = data.get("rate_scales", [rate_scale])
    if not isinstance(rates, list):
        raise RunFileError(f"{path}: rate_scales: a list of numbers")
    knobs = {**base_knobs, **parse_knobs(data.get("knobs", {}), "knobs")}
    sets: list[tuple[str, dict]] = []
    for n, entry in enumerate(data.get("knob_sets", [])):
        where = f"knob_sets[{n}]"
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("name"), str)
            or not NAME_RE.match(entry["name"])
        ):
            raise RunFileError(f"{path}: {where}.name: a name of letters, digits, '_' and '.'")
        sets.append((entry["name"], parse_knobs(entry, where, allow=frozenset({"name"}))))
    if len({s for s, _ in sets}) != len(sets):
        raise RunFileError(f"{path}: knob_sets: a name used twice")
    ds = data.get("duration_scale", duration_scale)
    if isinstance(ds, bool) or not isinstance(ds, (int, float)) or ds <= 0:
        raise RunFileError(f"{path}: duration_scale: a positive number")
    seed = data.get("seed", seed)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RunFileError(f"{path}: seed: an integer")
    try:
        repeats = check_repeats(data.get("repeats", repeats))
        cells = build_cells(policies, knobs, sets, [float(r) for r in rates], with_configs, repeats)
    except RunFileError as exc:
        raise RunFileError(f"{path}: {exc}") from None
    return RunPlan(cells, str(data.get("profile", profile)), float(ds), seed, data)
