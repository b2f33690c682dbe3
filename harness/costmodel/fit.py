"""The two ways ``schedscope calibrate`` fits the simulator's cost model: by profiling
the real model runner over a grid of step shapes (:func:`calibrate_by_profiling`), or
from the step records of served runs (:func:`calibrate_from_steps`); and how a fitted
model is saved and shown."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
    from requests.parquet beside them when there is one; ``echo`` gets a line about it.
    Where client records are beside the steps (a ``schedscope run`` cell's, a served
    calibration's), the cycles of the steps that started while the load generator
    lagged are left out (:mod:`harness.records.generator_limited`), and a line says how
    many of how many."""
    import numpy as np
    import polars as pl

    from engine.sim.cost_fit import (
        CalibrationError,
        client_latency_from_requests,
        cycles_outside,
        fit_cycles,
    )
    from harness.records.generator_limited import left_out_line, stretches_beside
    from harness.records.send_lag import LAG_LIMIT_S

    frames, request_frames, lagging = [], [], []
    for path in paths:
        file = path / "steps.parquet" if path.is_dir() else path
        try:
            frames.append(pl.read_parquet(file))
        except (FileNotFoundError, OSError, pl.exceptions.PolarsError) as exc:
            raise CalibrateInputError(
                f"{file}: cannot read step records ({exc})", "--from-steps"
            ) from None
        lagging.append(stretches_beside(file))
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
    latency = client_latency_from_requests(request_frames, max_send_lag_s=LAG_LIMIT_S)
    if latency is None:
        echo(
            "client latency: 0 (no client records beside the step records; "
            "a `schedscope run` cell has them)"
        )
    else:
        echo(f"client latency: {latency[0] * 1e3:.2f} ms (median over {latency[1]} requests)")
    xs, ys, left_out = [], [], 0
    for path, frame, lag in zip(paths, frames, lagging, strict=True):
        if lag.unplaced:
            echo(f"note: {lag.unplaced}")
        try:
            x, y, skipped = cycles_outside(frame, lag.stretches)
        except CalibrationError as exc:
            raise CalibrateInputError(str(exc), "--from-steps") from None
        if skipped:
            line = left_out_line(skipped, len(y) + skipped, lag.stretches)
            where = lag.source.name if lag.source else "the client records"
            echo(f"{steps_file(path)}: {line} ({where} says when)")
        xs.append(x)
        ys.append(y)
        left_out += skipped
    try:
        fitted = fit_cycles(
            np.concatenate(xs),
            np.concatenate(ys),
            model=model,
            source=", ".join(map(str, paths)),
            client_latency_s=latency[0] if latency else 0.0,
        )
    except CalibrationError as exc:
        if left_out:
            exc = CalibrationError(
                f"{exc} (the {left_out} that started while the load generator lagged its "
                "schedule left out)"
            )
        raise CalibrateInputError(str(exc), "--from-steps") from None
    if not left_out:
        return fitted
    return dataclasses.replace(
        fitted, fit={**fitted.fit, "generator_limited_steps_left_out": left_out}
    )


#: The file beside step records that says what ran them: a ``schedscope run`` cell's
#: run.json, or the one a served calibration writes into its records directory.
RUN_JSON = "run.json"


@dataclass(frozen=True)
class StepsOrigin:
    """What ran the steps of ``steps`` (a steps.parquet), as ``record`` (the run.json
    beside it) says; None where nothing records it."""

    steps: Path
    record: Path | None = None
    executor: str | None = None
    #: serve's --torch-threads (None: serve's default); meaningful only with a record
    torch_threads: int | None = None
    model: str | None = None
    #: the planted faults its run recorded (SCHEDSCOPE_FAULT); None: none
    faults: dict | None = None
    #: the cores its server was pinned to (run.json ``cpu_split``; 0: a record that
    #: names none, made unpinned); None without a record
    serve_cores: int | None = None


def steps_file(path: Path) -> Path:
    """``--from-steps`` PATH as the steps file: a directory's steps.parquet."""
    return path / "steps.parquet" if path.is_dir() else path


def steps_origin(path: Path) -> StepsOrigin:
    """The origin of the steps at ``path`` (a steps file or a directory holding one)
    from the run.json beside them: its ``executor``, the ``--torch-threads`` of its
    serve command (or its ``torch_threads``), and its model (``model``, or a cell's
    ``knobs.model``). A missing or unreadable run.json records nothing."""
    file = steps_file(path)
    record = file.with_name(RUN_JSON)
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return StepsOrigin(file)
    if not isinstance(data, dict):
        return StepsOrigin(file)
    executor = data.get("executor")
    threads = data.get("torch_threads")
    command = data.get("serve_command")
    if not isinstance(threads, int) and isinstance(command, list) and "--torch-threads" in command:
        at = command.index("--torch-threads") + 1
        threads = int(command[at]) if at < len(command) and str(command[at]).isdigit() else None
    knobs = data.get("knobs")
    model = data.get("model") or (knobs.get("model") if isinstance(knobs, dict) else None)
    faults = data.get("faults")
    split = data.get("cpu_split")
    serve = split.get("serve") if isinstance(split, dict) else None
    return StepsOrigin(
        file,
        record,
        executor if isinstance(executor, str) else None,
        (threads or None) if isinstance(threads, int) else None,
        model if isinstance(model, str) else None,
        faults if isinstance(faults, dict) and faults else None,
        len(serve) if isinstance(serve, list) else 0,
    )


def resolve_steps_origin(
    paths: Sequence[Path], executor: str | None, torch_threads: int | None, model: str
) -> tuple[str, int | None, str]:
    """(executor, torch threads, a line saying where they came from) of the steps of
    ``paths``, for the fit's fingerprint: what the run.json beside each records, else
    ``--executor`` and ``--torch-threads`` (None or 0: serve's default). Refused, naming
    the flag: steps of different executors or threads, a flag the records contradict
    (``model`` too), or steps whose executor neither a record nor ``--executor`` says."""
    from engine.factory import EXECUTORS

    if executor is not None and executor not in EXECUTORS:
        raise CalibrateInputError(
            f"unknown executor {executor!r} (choose {' or '.join(EXECUTORS)})", "--executor"
        )
    if torch_threads is not None and torch_threads < 0:
        raise CalibrateInputError(
            f"must be >= 0 (0: serve's default), got {torch_threads}", "--torch-threads"
        )
    threads = torch_threads or None
    origins = []
    for path in paths:
        if not steps_file(path).is_file():
            raise CalibrateInputError(
                f"{steps_file(path)}: no such step records file", "--from-steps"
            )
        origins.append(steps_origin(path))
    recorded = [o for o in origins if o.record is not None]
    kinds = (
        ("executors", "executor"),
        ("torch threads", "torch_threads"),
        ("server cores (cpu_split)", "serve_cores"),
    )
    for name, attr in kinds:
        seen = [o for o in recorded if attr != "executor" or o.executor is not None]
        if len({getattr(o, attr) for o in seen}) > 1:
            named = ", ".join(f"{o.steps}: {getattr(o, attr) or 'default'}" for o in seen)
            raise CalibrateInputError(
                f"the steps ran with different {name} ({named}); fit them apart",
                "--from-steps",
            )
    for o in origins:
        if o.faults:  # the steps are slower (or ordered) on purpose: not this machine's
            raise CalibrateInputError(
                f"{o.steps}: its run ran with planted faults ({o.record} faults "
                f"{o.faults}, SCHEDSCOPE_FAULT, tests only): its steps are not this "
                "machine's, so they are not fitted",
                "--from-steps",
            )
        where = f"{o.steps} ({o.record})" if o.record else str(o.steps)
        if o.executor is None and executor is None:
            why = (
                f"{o.record} names none (its steps were not served)"
                if o.record
                else f"nothing beside it records one (no {RUN_JSON}, as a `schedscope run` "
                "cell and a served calibration's records have)"
            )
            raise CalibrateInputError(
                f"which executor ran the steps of {o.steps}? {why}: give --executor torch or sim",
                "--executor",
            )
        if o.record is None:
            continue
        if executor is not None and o.executor is not None and o.executor != executor:
            raise CalibrateInputError(
                f"{where} ran on the {o.executor} executor, not {executor}", "--executor"
            )
        if o.model is not None and _model_name(o.model) != _model_name(model):
            raise CalibrateInputError(
                f"{where} ran model {o.model!r}, not {model!r}: give --model {o.model}",
                "--model",
            )
        if torch_threads is not None and threads != o.torch_threads:
            raise CalibrateInputError(
                f"{where} ran with --torch-threads {o.torch_threads or 0} (0: serve's "
                f"default), not {torch_threads}",
                "--torch-threads",
            )
    chosen = executor or next(o.executor for o in origins if o.executor)
    if recorded:
        threads = recorded[0].torch_threads
    said = ", ".join(str(o.record) for o in recorded)
    source = (
        f"as {said} record{'s' if len(recorded) == 1 else ''}"
        if len(recorded) == len(origins)
        else f"--executor{' and ' + said if said else ''}"
    )
    line = (
        f"the steps ran on the {chosen} executor with "
        f"{threads or 'the default'} torch threads ({source})"
    )
    return chosen, threads, line


def _model_name(model: str) -> str:
    """A model as the fingerprint names it: a checkpoint by its resolved path."""
    return str(Path(model).resolve()) if Path(model).is_dir() else model


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


#: The held-out median error each way of calibrating aims for ("steps": a refit of
#: records made for something else has none).
HOLDOUT_TARGETS = {"served": 0.05, "served quick": 0.10, "profile": 0.10}


def fit_summary(fitted: CostModel, from_steps: bool, target: float | None = None) -> str:
    """The held-out error of the fit, in one line: the median and p90 per step, how far
    the held-out steps' total time is priced off (when the fit says), then ``target`` (a
    share, for the median) and whether it was met, when there is one."""
    fit = fitted.fit
    error = fit["holdout_median_rel_error"]
    line = (
        f"held-out median relative error {error:.1%} "
        f"(p90 {fit['holdout_p90_rel_error']:.1%}) over {fit['holdout_points']} "
        f"{'held-out steps' if from_steps else 'mixed batches'}"
    )
    # Queueing is made of total time: on a machine whose small steps wander, a median
    # over mostly small steps says less about the latencies than this does.
    total = fit.get("holdout_total_time_ratio")
    if isinstance(total, int | float) and total > 0:
        line += f", their total time priced {abs(total - 1):.1%} {'low' if total < 1 else 'high'}"
    if target is None:
        return line
    return (
        line + f"; target <= {target:.0%} at the median: {'met' if error <= target else 'NOT met'}"
    )
