"""Profiles to and from plain dicts in the TOML shape (schema: docs/profiles.md).

Unknown keys are rejected at every level, so a typo never silently falls back to a
default. Errors name the key path: `classes[1].output_tokens.kind: ...`; the loader
prefixes the file name.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.profiles.distributions import (
    KIND_PARAMS,
    SECONDS_KIND_PARAMS,
    LengthDistribution,
    SecondsDistribution,
)
from harness.profiles.errors import ProfileError
from harness.profiles.model import Phase, Profile, RequestClass, Slo
from harness.profiles.sessions import Sessions
from harness.profiles.system_prompts import SystemPrompts
from harness.profiles.trace import MOONCAKE_BLOCK_TOKENS, ReplayTrace

PROFILE_KEYS = ("name", "seed", "description", "classes", "phases")
CLASS_KEYS = (
    "name",
    "weight",
    "priority",
    "max_tokens",
    "prompt_tokens",
    "output_tokens",
    "slo",
    "system_prompt",
    "session",
)
SLO_KEYS = ("ttft_s", "tpot_s", "e2e_s")
SYSTEM_PROMPT_KEYS = ("count", "tokens", "popularity", "zipf_s")
SESSION_KEYS = ("turns", "think_time_s")
PHASE_KEYS = (
    "name",
    "duration_s",
    "rate",
    "rate_end",
    "burstiness",
    "concurrency",
    "trace",
    "classes",
    "prefix_reuse",
)
TRACE_KEYS = (
    "file",
    "format",
    "time_scale",
    "start_s",
    "limit",
    "default_class",
    "model",
    "log_type",
    "hash_block_tokens",
)


@contextmanager
def _at(key: str) -> Iterator[None]:
    """Prefix errors raised inside with the key path they happened under."""
    try:
        yield
    except ProfileError as e:
        raise ProfileError(f"{key}.{e}") from e.__cause__


def _check_keys(
    table: Mapping[str, Any], allowed: tuple[str, ...], required: tuple[str, ...], what: str
) -> None:
    for key in table:
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), allowed, n=1)
            did_you_mean = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ProfileError(
                f"{key}: unknown key for {what} "
                f"(expected one of {', '.join(allowed)}{did_you_mean})"
            )
    for key in required:
        if key not in table:
            raise ProfileError(f"{key}: required key missing from {what}")


def _expect_table(key: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ProfileError(f"{key}: expected a table, got {value!r}")
    return value


def _distribution(key: str, value: Any, base_dir: Path | None) -> LengthDistribution:
    if isinstance(value, LengthDistribution):
        return value
    # Shorthand: `output_tokens = 128` is a fixed length.
    if isinstance(value, int) and not isinstance(value, bool):
        with _at(key):
            return LengthDistribution.fixed(value)
    if not isinstance(value, Mapping):
        raise ProfileError(
            f'{key}: expected a table such as {{ kind = "lognormal", median = 200, '
            f"sigma = 0.6 }} or an integer, got {value!r}"
        )
    with _at(key):
        if "kind" not in value:
            raise ProfileError(f"kind: required key missing (one of {', '.join(KIND_PARAMS)})")
        kind = value["kind"]
        if kind not in KIND_PARAMS:
            raise ProfileError(
                f"kind: unknown distribution {kind!r} (expected one of {', '.join(KIND_PARAMS)})"
            )
        allowed = ("kind", *KIND_PARAMS[kind], "min", "max")
        _check_keys(value, allowed, ("kind",), f"a {kind} distribution")
        params = dict(value)
        if isinstance(params.get("file"), str) and base_dir is not None:
            params["file"] = str(base_dir / params["file"])  # an absolute file stays as is
        if isinstance(params.get("values"), list):
            params["values"] = tuple(params["values"])
        return LengthDistribution(**params)


def _slo(value: Any) -> Slo:
    if isinstance(value, Slo):
        return value
    table = _expect_table("slo", value)
    with _at("slo"):
        _check_keys(table, SLO_KEYS, (), "an slo")
        return Slo(**table)


def _seconds(key: str, value: Any) -> SecondsDistribution:
    if isinstance(value, SecondsDistribution):
        return value
    # Shorthand: `think_time_s = 2.5` is a fixed duration.
    if isinstance(value, int | float) and not isinstance(value, bool):
        with _at(key):
            return SecondsDistribution.fixed(value)
    if not isinstance(value, Mapping):
        raise ProfileError(
            f'{key}: expected a table such as {{ kind = "exponential", mean = 5.0 }} or a '
            f"number of seconds, got {value!r}"
        )
    with _at(key):
        if "kind" not in value:
            raise ProfileError(
                f"kind: required key missing (one of {', '.join(SECONDS_KIND_PARAMS)})"
            )
        kind = value["kind"]
        if kind not in SECONDS_KIND_PARAMS:
            raise ProfileError(
                f"kind: unknown distribution {kind!r} "
                f"(expected one of {', '.join(SECONDS_KIND_PARAMS)})"
            )
        allowed = ("kind", *SECONDS_KIND_PARAMS[kind], "min", "max")
        _check_keys(value, allowed, ("kind",), f"a {kind} duration distribution")
        return SecondsDistribution(**value)


def _system_prompts(value: Any, base_dir: Path | None) -> SystemPrompts:
    if isinstance(value, SystemPrompts):
        return value
    table = _expect_table("system_prompt", value)
    with _at("system_prompt"):
        _check_keys(table, SYSTEM_PROMPT_KEYS, ("count", "tokens"), "a system_prompt")
        params = dict(table)
        params["tokens"] = _distribution("tokens", table["tokens"], base_dir)
        return SystemPrompts(**params)


def _sessions(value: Any, base_dir: Path | None) -> Sessions:
    if isinstance(value, Sessions):
        return value
    table = _expect_table("session", value)
    with _at("session"):
        _check_keys(table, SESSION_KEYS, ("turns", "think_time_s"), "a session")
        return Sessions(
            turns=_distribution("turns", table["turns"], base_dir),
            think_time_s=_seconds("think_time_s", table["think_time_s"]),
        )


def _request_class(table: Mapping[str, Any], base_dir: Path | None) -> RequestClass:
    _check_keys(table, CLASS_KEYS, ("name", "prompt_tokens", "output_tokens"), "a class")
    kwargs = {k: v for k, v in table.items() if k in ("name", "weight", "priority", "max_tokens")}
    for key in ("prompt_tokens", "output_tokens"):
        kwargs[key] = _distribution(key, table[key], base_dir)
    if "slo" in table:
        kwargs["slo"] = _slo(table["slo"])
    if "system_prompt" in table:
        kwargs["system_prompt"] = _system_prompts(table["system_prompt"], base_dir)
    if "session" in table:
        kwargs["session"] = _sessions(table["session"], base_dir)
    return RequestClass(**kwargs)


def _trace(value: Any, base_dir: Path | None) -> ReplayTrace:
    if isinstance(value, ReplayTrace):
        return value
    if isinstance(value, str):
        value = {"file": value}
    table = _expect_table("trace", value)
    with _at("trace"):
        _check_keys(table, TRACE_KEYS, ("file",), "a trace")
        params = dict(table)
        if isinstance(params["file"], str) and base_dir is not None:
            params["file"] = str(base_dir / params["file"])  # an absolute file stays as is
        return ReplayTrace(**params)


def _phase(table: Mapping[str, Any], base_dir: Path | None) -> Phase:
    required = ("name",) if "trace" in table else ("name", "duration_s")
    _check_keys(table, PHASE_KEYS, required, "a phase")
    params = dict(table)
    if "trace" in params:
        params["trace"] = _trace(params["trace"], base_dir)
    return Phase(**params)


def _items(key: str, value: Any) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise ProfileError(f"{key}: expected an array of tables ([[{key}]]), got {value!r}")
    return list(value)


def profile_from_dict(d: Mapping[str, Any], base_dir: Path | None = None) -> Profile:
    """Build a Profile from the TOML-shaped dict `d`. Relative empirical `file`
    paths are resolved against `base_dir` (the profile file's directory)."""
    table = _expect_table("profile", d)
    _check_keys(table, PROFILE_KEYS, ("name", "seed", "classes", "phases"), "a profile")
    classes: list[RequestClass] = []
    for i, item in enumerate(_items("classes", table["classes"])):
        if isinstance(item, RequestClass):
            classes.append(item)
            continue
        item = _expect_table(f"classes[{i}]", item)
        with _at(f"classes[{i}]"):
            classes.append(_request_class(item, base_dir))
    phases: list[Phase] = []
    for i, item in enumerate(_items("phases", table["phases"])):
        if isinstance(item, Phase):
            phases.append(item)
            continue
        item = _expect_table(f"phases[{i}]", item)
        with _at(f"phases[{i}]"):
            phases.append(_phase(item, base_dir))
    return Profile(
        name=table["name"],
        seed=table["seed"],
        description=table.get("description", ""),
        classes=tuple(classes),
        phases=tuple(phases),
    )


def _distribution_to_dict(d: LengthDistribution) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": d.kind}
    for key in KIND_PARAMS[d.kind]:
        value = getattr(d, key)
        if key == "values" and d.file is not None:
            continue  # the file is the source; its values are re-read on load
        if value is not None:
            out[key] = list(value) if isinstance(value, tuple) else value
    if d.min != 1:
        out["min"] = d.min
    if d.max is not None:
        out["max"] = d.max
    return out


def _seconds_to_dict(d: SecondsDistribution) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": d.kind}
    for key in SECONDS_KIND_PARAMS[d.kind]:
        out[key] = getattr(d, key)
    if d.min:
        out["min"] = d.min
    if d.max is not None:
        out["max"] = d.max
    return out


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """The TOML-shaped dict of `profile` (None values left out, as TOML has no null);
    `profile_from_dict(profile_to_dict(p)) == p`."""
    classes = []
    for c in profile.classes:
        entry: dict[str, Any] = {"name": c.name, "weight": c.weight, "priority": c.priority}
        if c.max_tokens is not None:
            entry["max_tokens"] = c.max_tokens
        entry["prompt_tokens"] = _distribution_to_dict(c.prompt_tokens)
        entry["output_tokens"] = _distribution_to_dict(c.output_tokens)
        slo = {k: getattr(c.slo, k) for k in SLO_KEYS if getattr(c.slo, k) is not None}
        if slo:
            entry["slo"] = slo
        if c.system_prompt is not None:
            sp = c.system_prompt
            entry["system_prompt"] = {
                "count": sp.count,
                "tokens": _distribution_to_dict(sp.tokens),
                "popularity": sp.popularity,
                "zipf_s": sp.zipf_s,
            }
        if c.session is not None:
            entry["session"] = {
                "turns": _distribution_to_dict(c.session.turns),
                "think_time_s": _seconds_to_dict(c.session.think_time_s),
            }
        classes.append(entry)
    phases = []
    for p in profile.phases:
        entry = {"name": p.name, "duration_s": p.duration_s}
        if p.rate is not None:
            entry["rate"] = p.rate
            if p.rate_end is not None:
                entry["rate_end"] = p.rate_end
            entry["burstiness"] = p.burstiness
        elif p.trace is not None:
            t = p.trace
            entry["trace"] = {
                "file": t.file,
                "format": t.format,
                "time_scale": t.time_scale,
                "start_s": t.start_s,
            }
            for key in ("limit", "default_class", "model", "log_type"):
                if getattr(t, key) is not None:
                    entry["trace"][key] = getattr(t, key)
            if t.hash_block_tokens != MOONCAKE_BLOCK_TOKENS:
                entry["trace"]["hash_block_tokens"] = t.hash_block_tokens
        else:
            entry["concurrency"] = p.concurrency
        if p.classes is not None:
            entry["classes"] = dict(p.classes)
        if p.prefix_reuse is not None:
            entry["prefix_reuse"] = p.prefix_reuse
        phases.append(entry)
    return {
        "name": profile.name,
        "seed": profile.seed,
        "description": profile.description,
        "classes": classes,
        "phases": phases,
    }
