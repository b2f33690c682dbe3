"""CLI flags generated from the engine's config dataclasses.

Every field of :class:`SchedulerConfig`, :class:`CacheConfig` and
:class:`ExecutionConfig` becomes a flag with
vLLM's spelling (``max_num_seqs`` -> ``--max-num-seqs``) and the field's
``metadata["help"]``; a command decorated with :func:`with_engine_knobs` receives a
validated :class:`EngineConfig` as ``engine_config``, or the raw flag values as
``knob_values``, whichever it declares. Adding a knob to a config class adds it to
every command at once. :func:`knob_flags` spells knob values back as ``schedscope
serve`` flags (``schedscope run`` and ``schedscope calibrate`` start servers with them),
and :func:`config_error` turns the engine's rejection of a knob into a usage error
naming its flag.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing

import typer

from engine.config import CacheConfig, ConfigError, EngineConfig, ExecutionConfig, SchedulerConfig

KNOB_SECTIONS: tuple[tuple[str, type], ...] = (
    ("scheduler", SchedulerConfig),
    ("cache", CacheConfig),
    ("execution", ExecutionConfig),
)


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _knob_parameter(f: dataclasses.Field, hint: typing.Any) -> inspect.Parameter:
    meta = f.metadata
    default = f.default
    extra: dict[str, typing.Any] = {}
    if "choices" in meta:
        hint = typing.Literal[tuple(meta["choices"])]
    if hint is bool:
        decls = [f"{flag_name(f.name)}/--no-{f.name.replace('_', '-')}"]
    else:
        decls = [flag_name(f.name)]
    option = typer.Option(
        default, *decls, help=meta.get("help", ""), rich_help_panel="Engine knobs", **extra
    )
    return inspect.Parameter(
        f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=hint
    )


def knob_parameters(exclude: frozenset[str] = frozenset()) -> list[inspect.Parameter]:
    params = []
    for _, cls in KNOB_SECTIONS:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name not in exclude:
                params.append(_knob_parameter(f, hints[f.name]))
    model_field = next(f for f in dataclasses.fields(EngineConfig) if f.name == "model")
    params.append(_knob_parameter(model_field, str))
    return params


def build_engine_config(values: dict[str, typing.Any]) -> EngineConfig:
    """An EngineConfig from flag values; ConfigError names the bad knob."""
    sections = {}
    for section, cls in KNOB_SECTIONS:
        names = {f.name for f in dataclasses.fields(cls)}
        sections[section] = cls(**{k: v for k, v in values.items() if k in names})
    model_default = next(f.default for f in dataclasses.fields(EngineConfig) if f.name == "model")
    return EngineConfig(
        sections["scheduler"],
        sections["cache"],
        model=values.get("model", model_default),
        execution=sections["execution"],
    )


def config_error(exc: ConfigError) -> typer.BadParameter:
    """A knob the engine rejects as a usage error (exit 2) naming its flag: the knob
    whose field name the message starts with (``block_size must be ...``)."""
    message = str(exc)
    names = sorted(knob_types(), key=len, reverse=True)
    knob = next((n for n in names if message.startswith(n)), None)
    return typer.BadParameter(message, param_hint=flag_name(knob) if knob else None)


def with_engine_knobs(exclude: frozenset[str] = frozenset()):
    """Decorator: add every engine knob (but those in ``exclude``) as a flag, and pass
    the command what it declares of ``engine_config`` (the validated EngineConfig;
    ConfigError becomes a bad parameter) and ``knob_values`` (the raw flag values).

    A command that excludes a knob fills it in itself, so it cannot declare
    ``engine_config``: it builds its configs from ``knob_values``."""

    def decorate(fn):
        sig = inspect.signature(fn)
        injected = [p for p in ("engine_config", "knob_values") if p in sig.parameters]
        if exclude and "engine_config" in injected:
            raise TypeError(
                f"{fn.__name__}: with knobs excluded there is no engine_config to pass; "
                "build it from knob_values"
            )
        own = [p for p in sig.parameters.values() if p.name not in injected]
        knobs = knob_parameters(exclude)
        names = [p.name for p in knobs]

        @functools.wraps(fn)
        def wrapper(**kwargs):
            values = {name: kwargs.pop(name) for name in names}
            if "engine_config" in injected:
                try:
                    kwargs["engine_config"] = build_engine_config(values)
                except ConfigError as exc:
                    raise config_error(exc) from None
            if "knob_values" in injected:
                kwargs["knob_values"] = values
            return fn(**kwargs)

        # inspect.signature (and so typer) reads a function's __signature__; typeshed's
        # function type does not declare the attribute.
        wrapper.__signature__ = sig.replace(parameters=own + knobs)  # type: ignore[attr-defined]
        annotations = {k: v for k, v in typing.get_type_hints(fn).items() if k not in injected}
        annotations.update({p.name: p.annotation for p in knobs})
        wrapper.__annotations__ = annotations
        del wrapper.__wrapped__  # typer must read our signature, not fn's
        return wrapper

    return decorate


def given_knobs(context: typer.Context) -> set[str]:
    """The knobs the user of the command of ``context`` gave (on the command line or
    in the environment), not left at their defaults."""
    given = set()
    for name in knob_types():
        source = context.get_parameter_source(name)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            given.add(name)
    return given


def knob_types() -> dict[str, typing.Any]:
    """Knob field name -> its type hint (SchedulerConfig, CacheConfig, ExecutionConfig,
    model)."""
    out: dict[str, typing.Any] = {}
    for _, cls in KNOB_SECTIONS:
        hints = typing.get_type_hints(cls)
        out.update({f.name: hints[f.name] for f in dataclasses.fields(cls)})
    out["model"] = str
    return out


def knob_defaults() -> dict[str, typing.Any]:
    out = {}
    for _, cls in KNOB_SECTIONS:
        out.update({f.name: f.default for f in dataclasses.fields(cls)})
    out["model"] = next(f.default for f in dataclasses.fields(EngineConfig) if f.name == "model")
    return out


def config_knobs(config: EngineConfig) -> dict[str, typing.Any]:
    """Knob field name -> its value in ``config`` (the inverse of
    :func:`build_engine_config`)."""
    out: dict[str, typing.Any] = {}
    for section, _ in KNOB_SECTIONS:
        out.update(dataclasses.asdict(getattr(config, section)))
    out["model"] = config.model
    return out


def knob_flags(values: dict, with_policy: bool = False) -> list[str]:
    """``schedscope serve`` flags for the knobs that differ from their defaults; the
    scheduling policy only ``with_policy`` (``schedscope run`` passes it itself)."""
    defaults = knob_defaults()
    args: list[str] = []
    for name, value in values.items():
        if name == "scheduling_policy" and not with_policy:
            continue
        if value == defaults.get(name) or value is None:
            continue
        args += knob_flag(name, value)
    return args


def knob_flag(name: str, value) -> list[str]:
    """One knob's value as its flag: ``--max-num-seqs 64``, ``--enable-prefix-caching``
    or ``--no-enable-prefix-caching``, a float in its shortest form."""
    if isinstance(value, bool):
        return [flag_name(name) if value else f"--no-{name.replace('_', '-')}"]
    return [flag_name(name), f"{value:g}" if isinstance(value, float) else str(value)]
