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


def calibrate(
    model: str = typer.Option("tiny", "--model", help="Model preset name or checkpoint directory."),
    out: Path = typer.Option(
        Path("cost_model.json"), "--out", help="Where to write the fitted cost model."
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
    mixed batches. Use the file with `schedscope simulate --cost-model FILE`.
    """
    try:
        if from_steps:
            fitted = calibrate_from_steps(from_steps, model, echo=console.print)
        else:
            fitted = calibrate_by_profiling(model, device, block_size, repeats, quick)
    except CalibrateInputError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.param_hint) from None
    save_cost_model(fitted, out)
    console.print(cost_model_table(fitted))
    console.print(fit_summary(fitted, from_steps=bool(from_steps)))
    console.print(f"written: {out}")
