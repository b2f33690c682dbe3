"""``schedscope serve``'s server options generated from :class:`ServerSettings`, as the
engine knobs are from their config dataclasses (harness/serve/knobs.py): every field
whose metadata gives a flag becomes an option with that field's default and help, and
the command receives one validated ``server_settings``. A limit's default and meaning
live in ``engine/api/state.py`` only."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing

import typer

from engine.api.state import ServerSettings, ServerSettingsError


def server_flag(f: dataclasses.Field) -> str | None:
    """The flag of a :class:`ServerSettings` field; None for an internal setting."""
    flag = f.metadata.get("flag", "")
    if flag is None:
        return None
    return flag or "--" + f.name.replace("_", "-")


def server_fields() -> list[dataclasses.Field]:
    """The fields of :class:`ServerSettings` that are flags, in declaration order."""
    return [f for f in dataclasses.fields(ServerSettings) if server_flag(f) is not None]


def _parameter(f: dataclasses.Field, hint: typing.Any) -> inspect.Parameter:
    flag = server_flag(f)
    assert flag is not None
    decls = [f"{flag}/--no-{flag[2:]}"] if hint is bool else [flag]
    extra = {"envvar": f.metadata["envvar"]} if "envvar" in f.metadata else {}
    option = typer.Option(
        f.default, *decls, help=f.metadata["help"], rich_help_panel="Server", **extra
    )
    return inspect.Parameter(
        f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=hint
    )


def with_server_settings():
    """Decorator: add every :class:`ServerSettings` flag to the command and pass it the
    validated ``server_settings`` (a value out of range is a bad parameter naming its
    flag: exit 2)."""

    def decorate(fn):
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.name != "server_settings"]
        hints = typing.get_type_hints(ServerSettings)
        params = [_parameter(f, hints[f.name]) for f in server_fields()]
        names = [p.name for p in params]

        @functools.wraps(fn)
        def wrapper(**kwargs):
            settings = ServerSettings(**{n: kwargs.pop(n) for n in names})
            try:
                settings.validate()
            except ServerSettingsError as exc:
                flag = server_flag(ServerSettings.__dataclass_fields__[exc.field])
                raise typer.BadParameter(exc.message, param_hint=flag) from None
            return fn(server_settings=settings, **kwargs)

        # inspect.signature (and so typer) reads a function's __signature__; typeshed's
        # function type does not declare the attribute.
        wrapper.__signature__ = sig.replace(parameters=own + params)  # type: ignore[attr-defined]
        annotations = {k: v for k, v in typing.get_type_hints(fn).items() if k != "server_settings"}
        annotations.update({p.name: p.annotation for p in params})
        wrapper.__annotations__ = annotations
        del wrapper.__wrapped__  # typer must read our signature, not fn's
        return wrapper

    return decorate
