"""What several commands share: the declarations of the options they have in common
(``--profile``, ``--seed``, ``--duration-scale``, ``--cost-model``, ``--executor``,
``--torch-threads``: one name, one help text and one default each, a command adding
only what the option means there; ``report --profile``, whose default is the run's own,
and ``calibrate``'s options, which mean the calibration's own, are declared there),
their parsing (``--policy``, ``--cost-model builtin|auto|FILE``) and the environment's
``SCHEDSCOPE_FAULT``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from engine.core.sched.policy import POLICY_NAMES
from engine.faults import ENV_VAR, FaultError, Faults

if TYPE_CHECKING:
    from harness.costmodel.choice import Choice
    from harness.costmodel.machine import Fingerprint
    from harness.processes.cpu_split import CpuSplit


#: The profile a command runs without --profile (``default`` is its alias).
DEFAULT_PROFILE = "mixed"
EXECUTORS = ("torch", "sim")


def _help(text: str, there: str) -> str:
    return f"{text} {there}".strip()


def profile_option(there: str = ""):
    """``--profile``: a shipped profile's name or a profile file."""
    return typer.Option(
        DEFAULT_PROFILE,
        "--profile",
        help=_help("Profile: a shipped name (docs/profiles.md) or a .py/.toml file.", there),
    )


def seed_option(there: str = ""):
    """``--seed``: the schedule's seed."""
    return typer.Option(
        None, "--seed", min=0, help=_help("Schedule seed (default: the profile's).", there)
    )


def duration_scale_option(default: float, there: str = ""):
    """``--duration-scale``: every phase's duration multiplied (each command its default:
    a simulation runs the whole profile, a served run a quarter of it)."""
    return typer.Option(
        default,
        "--duration-scale",
        help=_help(f"Multiply every phase's duration (default {default:g}).", there),
    )


def cost_model_option(there: str = ""):
    """``--cost-model builtin|auto|FILE`` (parsed by :func:`cost_model_value`)."""
    return typer.Option(
        None,
        "--cost-model",
        help=_help(
            "The simulator's step times: builtin, auto (calibrate when this machine has no "
            "fit) or a cost model JSON file; default: this machine's fit from `schedscope "
            "calibrate`, else the built-in (with a warning).",
            there,
        ),
    )


def target_cost_model(value: str | None):
    """``--cost-model target:NAME`` (or a file holding a target's fit: calibrate --from-run
    --out) as (its Choice, the knobs that simulate that engine, the line saying so); None
    for any other value. An unknown target or a file that is not a cost model: a bad
    parameter naming --cost-model (exit 2)."""
    from harness.costmodel import store as cost_store
    from harness.costmodel.choice import Choice, is_named_choice

    if value is None or is_named_choice(value):
        return None
    if value.startswith(cost_store.TARGET_PREFIX):
        try:
            entry = cost_store.find_target(value[len(cost_store.TARGET_PREFIX) :])
        except LookupError as exc:
            raise typer.BadParameter(str(exc.args[0]), param_hint="--cost-model") from None
    else:
        entry = cost_store.load(Path(value))
        if entry.target is None:
            return None  # a machine's fit or a plain file: the usual choice reads it
    assert entry.model is not None and entry.target is not None
    knobs = entry.simulate_knobs
    assumed = entry.model.fingerprint.get("assumed_knobs") or []
    line = (
        f"cost model: {entry.path}, the fit of {entry.target.describe()}; its engine's "
        "knobs simulated where not given: "
        + " ".join(f"{k}={v}" for k, v in sorted(knobs.items()))
        + (f" (assumed, not read from the target: {', '.join(assumed)})" if assumed else "")
    )
    return Choice(entry.model, entry.path, line), knobs


def with_target_knobs(context: typer.Context, knob_values: dict, target) -> dict:
    """``knob_values`` with the engine knobs of ``target`` (:func:`target_cost_model`'s
    answer) wherever the user of the command of ``context`` gave none; says so on stderr."""
    from harness.cli.app import err_console
    from harness.serve.knobs import given_knobs

    choice, knobs = target
    given = given_knobs(context)
    err_console.print(choice.line, soft_wrap=True, highlight=False, markup=False)
    return {
        **knob_values,
        **{k: v for k, v in knobs.items() if k not in given and k in knob_values},
    }


def executor_option(default: str = "torch", there: str = ""):
    """``--executor torch|sim``: the served engine's executor."""
    return typer.Option(
        default,
        "--executor",
        help=_help(
            "The served engine's executor: torch (the bundled model computes) or sim (each "
            "step sleeps the cost model's time).",
            there,
        ),
    )


def torch_threads_option(there: str = ""):
    """``--torch-threads``: the served engine's torch intra-op threads."""
    return typer.Option(
        None,
        "--torch-threads",
        help=_help(
            "The served engine's torch intra-op threads (default: one fewer than the cores, "
            "so the event loop and a co-located load generator do not stall every step).",
            there,
        ),
    )


def cpu_split_option():
    """``--cpu-split``: the served engine's and the load generator's cores."""
    return typer.Option(
        "auto",
        "--cpu-split",
        help="Pin the engine this command serves and its load generator to disjoint "
        "cores, so a step's cost is the engine's and not its neighbour's: auto (the "
        "default: the first half of the cores, rounded up, to the server, the rest to "
        "the load generator; nothing on a 1-core machine), off (nothing pinned), or "
        "SERVE:LOAD as CPU lists (0:1, 0-5:6,7). Against a --target only SERVE:LOAD "
        "pins anything: the load generator to LOAD (the target on SERVE is yours to "
        "pin). Recorded in each cell's run.json.",
    )


def parse_cpu_split_option(value: str) -> CpuSplit | None:
    """``--cpu-split``'s value as a split; a usage error naming the flag when unusable."""
    from harness.processes.cpu_split import CpuSplitError, parse_cpu_split

    try:
        return parse_cpu_split(value)
    except CpuSplitError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cpu-split") from None


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
