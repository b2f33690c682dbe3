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
from harness.served_calibration import ServedCalibrationError, calibrate_served, resolve_method


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
    block_size: int = typer.Option(
        16, "--block-size", help="KV block size (the served engine's, or to profile with)."
    ),
    repeats: int | None = typer.Option(
        None,
        "--repeats",
        min=1,
        help="Timed repetitions per step shape (median; default 5); --method profile only.",
    ),
    quick: bool = typer.Option(
        False,
        "--quick",
        help="Served: the short calibration schedule (about a minute on 2 cores); "
        "profile: a small grid (seconds, for smoke tests).",
    ),
    from_steps: list[Path] = typer.Option(
        [],
        "--from-steps",
        help="Fit from the step records of real runs instead (steps.parquet from "
        "`schedscope serve --record-steps` or a run directory; repeatable): each "
        "step's full cycle, serving overhead included, so simulations predict served "
        "runs. No profiling.",
    ),
    method: str | None = typer.Option(
        None,
        "--method",
        help="served (default): serve the engine here, replay the calibration schedule "
        "against it and fit its step records; profile: time the offline model runner "
        "over a grid of step shapes.",
    ),
    executor: str | None = typer.Option(
        None,
        "--executor",
        help="--method served: the served engine's executor, torch (default: the model "
        "computes) or sim (each step sleeps what --cost-model predicts; for tests).",
    ),
    cost_model: Path | None = typer.Option(
        None,
        "--cost-model",
        help="--method served: the cost model JSON the served engine is started with "
        "(the step times of --executor sim).",
    ),
    seed: int | None = typer.Option(
        None, "--seed", min=0, help="--method served: the calibration schedule's seed."
    ),
    records_dir: Path | None = typer.Option(
        None,
        "--records-dir",
        help="--method served: where the served run's records go (steps, requests, the "
        "client's, the server's log); default: a new temporary directory.",
    ),
) -> None:
    """Fit the simulator's cost model: from a served run of the calibration schedule on
    this machine (default), by profiling the real model runner (--method profile), or
    from the step records of served runs (--from-steps).

    The served method starts `schedscope serve` with --record-steps, replays a schedule
    of decode-heavy, prefill-burst, mixed and long-context batches against it, and fits
    each step's full served cycle; it reports the error on held-out steps. Profiling
    measures steps over a grid of prefill tokens, decode batch sizes, context lengths
    and swapped blocks, fits the cost model, and reports its error on held-out mixed
    batches. The model goes into the store of fitted models, keyed by this machine's
    fingerprint, where `schedscope simulate` finds it (--out FILE: a file instead, for
    `--cost-model FILE`).
    """
    if show:
        show_store(fingerprint(model, device=device))
        return
    try:
        chosen = resolve_method(
            method,
            from_steps=bool(from_steps),
            given={
                "--executor": executor,
                "--cost-model": cost_model,
                "--seed": seed,
                "--records-dir": records_dir,
                "--device": device,
                "--repeats": repeats,
            },
        )
        if chosen == "steps":
            fitted = calibrate_from_steps(from_steps, model, echo=console.print)
        elif chosen == "profile":
            fitted = calibrate_by_profiling(model, device, block_size, repeats or 5, quick)
        else:
            fitted = calibrate_served(
                model,
                executor or "torch",
                cost_model,
                block_size,
                quick,
                seed,
                records_dir,
                echo=console.print,
                console=console,
            )
    except CalibrateInputError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.param_hint) from None
    except ServedCalibrationError as exc:
        # the server's log is text, not rich markup (it has "[core]" and the like)
        console.print(f"calibration failed: {exc}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    machine = _fit_fingerprint(fitted, model, device, chosen, executor or "torch")
    if out is None:
        out = cost_store.save(fitted, machine)
    else:
        save_cost_model(cost_store.with_fingerprint(fitted, machine), out)
    console.print(cost_model_table(fitted))
    console.print(fit_summary(fitted, from_steps=chosen != "profile"))
    console.print(f"written: {out}", soft_wrap=True, highlight=False, markup=False)


def _fit_fingerprint(
    fitted: CostModel, model: str, device: str | None, method: str, executor: str
) -> Fingerprint:
    """The machine the fit stands for: a profiling fit's own device and torch threads;
    a fit of served steps (a served calibration, or --from-steps), the served engine's
    defaults here (a served calibration's executor: a sim-executor fit never stands in
    for the torch engine's)."""
    if method == "served":
        return fingerprint(model, executor=executor, device=device)
    if method == "steps":
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
