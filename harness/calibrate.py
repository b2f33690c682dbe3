"""The two ways ``schedscope calibrate`` fits the simulator's cost model: by profiling
the real model runner over a grid of step shapes (:func:`calibrate_by_profiling`), or
from the step records of served runs (:func:`calibrate_from_steps`); and how a fitted
model is saved and shown."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.table import Table

from engine.core.cost_model import FEATURES, CostModel


class CalibrateInputError(ValueError):
    """A model or step-record input that cannot be calibrated from; ``param_hint``
    names the flag it came from."""

    def __init__(self, message: str, param_hint: str) -> None:
        super().__init__(message)
        self.param_hint = param_hint


def calibrate_by_profiling(
    model: str, device: str | None, block_size: int, repeats: int, quick: bool
) -> CostModel:
    """Time the model runner over the training grid and held-out mixed batches, then fit."""
    from engine.sim.calibration import calibrate as run_calibration
    from engine.sim.calibration import holdout_mix, training_grid
    from engine.worker.loading import calibration_runner

    try:
        shapes = training_grid(quick) + holdout_mix(40, quick=quick)
        runner, model_name = calibration_runner(model, block_size, shapes, device)
    except (ValueError, FileNotFoundError) as exc:
        raise CalibrateInputError(str(exc), "--model") from None
    return run_calibration(runner, model_name, quick=quick, repeats=repeats)


def calibrate_from_steps(
    paths: list[Path], model: str, echo: Callable[[str], object] = print
) -> CostModel:
    """Fit from steps.parquet files (or run directories holding one): each step's full
    cycle, serving overhead included. The client's latency outside the engine comes
    from requests.parquet beside them when there is one; ``echo`` gets a line about it."""
    import polars as pl

    from engine.sim.cost_fit import CalibrationError, client_latency_from_requests, fit_from_steps

    frames, request_frames = [], []
    for path in paths:
        file = path / "steps.parquet" if path.is_dir() else path
        try:
            frames.append(pl.read_parquet(file))
        except (FileNotFoundError, OSError, pl.exceptions.PolarsError) as exc:
            raise CalibrateInputError(
                f"{file}: cannot read step records ({exc})", "--from-steps"
            ) from None
        # A `schedscope run` cell also has the client's records: the time spent outside
        # the engine (HTTP, the pipe, SSE) is measured there, not guessed.
        requests_file = file.with_name("requests.parquet")
        if requests_file.exists():
            try:
                request_frames.append(pl.read_parquet(requests_file))
            except (OSError, pl.exceptions.PolarsError) as exc:
                raise CalibrateInputError(
                    f"{requests_file}: cannot read request records ({exc})", "--from-steps"
                ) from None
    latency = client_latency_from_requests(request_frames)
    if latency is None:
        echo(
            "client latency: 0 (no client records beside the step records; "
            "a `schedscope run` cell has them)"
        )
    else:
        echo(f"client latency: {latency[0] * 1e3:.2f} ms (median over {latency[1]} requests)")
    try:
        return fit_from_steps(
            frames,
            model=model,
            source=", ".join(map(str, paths)),
            client_latency_s=latency[0] if latency else 0.0,
        )
    except CalibrationError as exc:
        raise CalibrateInputError(str(exc), "--from-steps") from None


def save_cost_model(fitted: CostModel, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fitted.save(out)


def cost_model_table(fitted: CostModel) -> Table:
    """The fitted parameters, one row per cost-model feature."""
    table = Table(title=f"cost model for {fitted.model} on {fitted.device}")
    table.add_column("parameter")
    table.add_column("value", justify="right")
    for name in FEATURES:
        table.add_row(name, f"{getattr(fitted, name):.3e}")
    return table


def fit_summary(fitted: CostModel, from_steps: bool) -> str:
    """The held-out error of the fit, in one line."""
    fit = fitted.fit
    return (
        f"held-out median relative error {fit['holdout_median_rel_error']:.1%} "
        f"(p90 {fit['holdout_p90_rel_error']:.1%}) over {fit['holdout_points']} "
        f"{'held-out steps' if from_steps else 'mixed batches'}; target <= 10% at the median"
    )
