"""``schedscope calibrate``: fit the simulator's cost model, by profiling the model
runner or from served runs' step records (:mod:`harness.calibrate`), save it and show
the fit."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import typer

from engine.core.cost_model import CostModel
from harness import cost_store
from harness.calibrate import (
    CalibrateInputError,
    calibrate_by_profiling,
    calibrate_from_steps,
    cost_model_table,
    fit_summary,
    save_cost_model,
)
from harness.cli.app import console
from harness.machine import Fingerprint, fingerprint


def calibrate(
    model: str = typer.Option("tiny", "--model", help="Model preset name or checkpoint directory."),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Write the fitted cost model to this file (with this machine's fingerprint) "
        "instead of the store of fitted models (default: the store, where simulate and "
        "run --simulate find it; --show says where).",
    ),
    show: bool = typer.Option(
        False,
        "--show",
        help="Print this machine's fingerprint and the stored models (which matches, "
        "held-out error, when fitted, stale or not), then exit without fitting.",
    ),
    device: str | None = typer.Option(
        None, "--device", help="cpu or cuda (default: cuda when present)."
    ),
    block_size: int = typer.Option(16, "--block-size", help="KV block size to profile with."),
    repeats: int = typer.Option(
        5, "--repeats", min=1, help="Timed repetitions per step shape (median)."
    ),
    quick: bool = typer.Option(False, "--quick", help="A small grid (seconds, for smoke tests)."),
    from_steps: list[Path] = typer.Option(
        [],
        "--from-steps",
        help="Fit from the step records of real runs instead (steps.parquet from "
        "`schedscope serve --record-steps` or a run directory; repeatable): each "
        "step's full cycle, serving overhead included, so simulations predict served "
        "runs. No profiling.",
    ),
) -> None:
    """Fit the simulator's cost model: by profiling the real model runner, or from the
    step records of served runs (--from-steps).

    Profiling measures steps over a grid of prefill tokens, decode batch sizes, context
    lengths and swapped blocks, fits the cost model, and reports its error on held-out
    mixed batches. The model goes into the store of fitted models, keyed by this
    machine's fingerprint, where `schedscope simulate` finds it (--out FILE: a file
    instead, for `--cost-model FILE`).
    """
    if show:
        show_store(fingerprint(model, device=device))
        return
    try:
        if from_steps:
            fitted = calibrate_from_steps(from_steps, model, echo=console.print)
        else:
            fitted = calibrate_by_profiling(model, device, block_size, repeats, quick)
    except CalibrateInputError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.param_hint) from None
    machine = _fit_fingerprint(fitted, model, device, from_steps=bool(from_steps))
    if out is None:
        out = cost_store.save(fitted, machine)
    else:
        save_cost_model(cost_store.with_fingerprint(fitted, machine), out)
    console.print(cost_model_table(fitted))
    console.print(fit_summary(fitted, from_steps=bool(from_steps)))
    console.print(f"written: {out}", soft_wrap=True, highlight=False, markup=False)


def _fit_fingerprint(
    fitted: CostModel, model: str, device: str | None, from_steps: bool
) -> Fingerprint:
    """The machine the fit stands for: a profiling fit's own device and torch threads;
    a fit from served steps, the served engine's defaults here."""
    if from_steps:
        return fingerprint(model, device=device)
    threads = fitted.fit.get("threads")
    return fingerprint(
        model,
        device="cuda" if fitted.device.startswith("cuda") else "cpu",
        torch_threads=threads if isinstance(threads, int) else None,
    )


def show_store(machine: Fingerprint) -> None:
    """--show: this machine's fingerprint, then every stored model against it."""
    print_plain = partial(console.print, soft_wrap=True, highlight=False, markup=False)
    print_plain(f"this machine: {machine.describe()}")
    directory = cost_store.store_dir()
    print_plain(f"store: {directory} (${cost_store.STORE_ENV} sets it)")
    stored = cost_store.entries(directory)
    if not stored:
        print_plain("no stored models: `schedscope calibrate` fits this machine's")
        return
    for entry in stored:
        print_plain(f"{entry.path}: {_entry_state(entry, machine)}")


def _entry_state(entry: cost_store.StoredModel, machine: Fingerprint) -> str:
    if entry.model is None or entry.fingerprint is None:
        return f"unusable ({entry.problem})"
    error = entry.holdout_error
    facts = (
        f"model {entry.model.model}, fitted {entry.model.fitted_at or 'at an unknown time'}, "
        f"held-out median error {'unknown' if error is None else f'{error:.1%}'}"
    )
    theirs = entry.fingerprint
    if theirs.key == machine.key:
        return f"MATCHES this machine; {facts}"
    if theirs.machine_key == machine.machine_key:
        return f"STALE ({', '.join(theirs.stale_against(machine))}): refit; {facts}"
    differ = [name for name, value in theirs.parts().items() if machine.parts()[name] != value]
    return f"another machine or setup (differs in {', '.join(differ)}); {facts}"
