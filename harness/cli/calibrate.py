"""``schedscope calibrate``: fit the simulator's cost model, by profiling the model
runner or from served runs' step records (:mod:`harness.calibrate`), save it and show
the fit."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.calibrate import (
    CalibrateInputError,
    calibrate_by_profiling,
    calibrate_from_steps,
    cost_model_table,
    fit_summary,
    save_cost_model,
)
from harness.cli.app import console
from harness.served_calibration import ServedCalibrationError, calibrate_served, resolve_method


def calibrate(
    model: str = typer.Option("tiny", "--model", help="Model preset name or checkpoint directory."),
    out: Path = typer.Option(
        Path("cost_model.json"), "--out", help="Where to write the fitted cost model."
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
    batches. Use the file with `schedscope simulate --cost-model FILE`.
    """
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
    save_cost_model(fitted, out)
    console.print(cost_model_table(fitted))
    console.print(fit_summary(fitted, from_steps=chosen != "profile"))
    console.print(f"written: {out}")
