"""Argument parsing that several commands share: ``--policy`` (``simulate``, ``run``),
and the environment's ``SCHEDSCOPE_FAULT``."""

from __future__ import annotations

import typer

from engine.core.sched.policy import POLICY_NAMES
from engine.faults import ENV_VAR, FaultError, Faults

POLICY_CHOICES = POLICY_NAMES  # the policy registry


def parse_policies(value: str) -> list[str]:
    """``--policy``: a policy name, a comma-separated list of them, or ``all``."""
    if value == "all":
        return list(POLICY_CHOICES)
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in POLICY_CHOICES]
    if not names or bad:
        raise typer.BadParameter(
            f"unknown policy {', '.join(bad) or repr(value)}; "
            f"expected {', '.join(POLICY_CHOICES)}, "
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
