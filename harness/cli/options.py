"""Argument parsing that several commands share: ``--policy`` (``simulate``, ``run``),
``--cost-model builtin|auto|FILE`` (``simulate``, ``run``, ``serve --executor sim``) and
the environment's ``SCHEDSCOPE_FAULT``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from engine.core.sched.policy import POLICY_NAMES
from engine.faults import ENV_VAR, FaultError, Faults

if TYPE_CHECKING:
    from harness.costmodel.choice import Choice
    from harness.costmodel.machine import Fingerprint


def parse_policies(value: str) -> list[str]:
    """``--policy``: a policy name, a comma-separated list of them, or ``all``."""
    if value == "all":
        return list(POLICY_NAMES)
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in POLICY_NAMES]
    if not names or bad:
        raise typer.BadParameter(
            f"unknown policy {', '.join(bad) or repr(value)}; "
            f"expected {', '.join(POLICY_NAMES)}, "
            "a comma-separated list of them, or all",
            param_hint="--policy",
        )
    if len(set(names)) != len(names):
        raise typer.BadParameter(f"policy listed twice in {value!r}", param_hint="--policy")
    return names


def check_faults() -> None:
    """``SCHEDSCOPE_FAULT`` (planted faults, engine/faults.py) checked before anything
    starts: an unknown key or a bad value is a usage error naming the key (exit 2), not
    an engine that fails later."""
    try:
        Faults.from_env()
    except FaultError as exc:
        raise typer.BadParameter(str(exc), param_hint=ENV_VAR) from None


def choose_cost_model(value: str | None, machine: Fingerprint, say: bool = True) -> Choice:
    """``--cost-model``: a file, loaded as given (its ``line`` empty: the file is what was
    asked for); otherwise (not given, ``builtin``, ``auto``)
    :func:`harness.costmodel.choice.choose`'s model for ``machine``, ``auto`` calibrating by
    :func:`harness.calibration.served.calibrate_quickly`, its line printed on stderr
    unless ``say`` is False. A file that is not a cost model, or a calibration that
    failed: a bad parameter naming --cost-model (exit 2)."""
    from engine.core.cost_model import CostModel, CostModelError
    from harness.calibration.served import calibrate_quickly
    from harness.cli.app import err_console
    from harness.costmodel.choice import Choice, choose, is_named_choice

    if not is_named_choice(value):
        path = Path(str(value))
        try:
            return Choice(CostModel.load(path), path, "")
        except CostModelError as exc:
            raise typer.BadParameter(str(exc), param_hint="--cost-model") from None
    try:
        choice = choose(value, machine, calibrate=calibrate_quickly)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cost-model") from None
    if say:
        err_console.print(choice.line, soft_wrap=True, highlight=False, markup=False)
    return choice


def writable_dir(path: Path, flag: str = "--out") -> Path:
    """``path`` made (with its parents) and writable, before any work whose results go
    there: a directory that cannot be written is a usage error naming ``flag`` (exit 2),
    not a traceback after a long search."""
    import os

    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise typer.BadParameter(
            f"cannot make directory {path}: {reason}", param_hint=flag
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise typer.BadParameter(f"cannot write into {path}", param_hint=flag)
    return path
