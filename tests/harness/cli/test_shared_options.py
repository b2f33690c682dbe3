"""The options several commands share are declared once (harness/cli/options.py): the
same flag has the same default and the same help text wherever it means the same
thing; a command only adds what it means there."""

from __future__ import annotations

import typer.main

from harness.cli import app
from harness.cli.options import DEFAULT_PROFILE

SHARED = ("--profile", "--seed", "--cost-model", "--executor", "--torch-threads")
#: commands where a flag of that name means something of their own (module docstring)
OWN = {("report", "--profile"), ("report", "--seed")} | {("calibrate", flag) for flag in SHARED}


def _options() -> dict[str, list[tuple[str, object, str]]]:
    group = typer.main.get_command(app)
    found: dict[str, list[tuple[str, object, str]]] = {}
    for name, command in group.commands.items():
        for param in command.params:
            for flag in param.opts:
                if flag in SHARED and (name, flag) not in OWN:
                    found.setdefault(flag, []).append((name, param.default, param.help or ""))
    return found


def test_each_shared_option_has_one_default_and_one_help_text():
    found = _options()
    assert set(found) == set(SHARED)
    assert {c for c, _, _ in found["--cost-model"]} >= {"run", "simulate", "tune", "serve"}
    assert {c for c, _, _ in found["--profile"]} >= {"run", "simulate", "tune"}
    for flag, uses in found.items():
        defaults = {repr(d) for _, d, _ in uses}
        assert len(defaults) == 1, (flag, uses)
        # the shared text first, then what the command adds
        shared = min((h for _, _, h in uses), key=len)
        assert shared and all(h.startswith(shared) for _, _, h in uses), (flag, uses)


def test_every_command_runs_the_same_profile_without_profile():
    assert {d for _, d, _ in _options()["--profile"]} == {DEFAULT_PROFILE}
