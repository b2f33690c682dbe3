"""``schedscope calibrate``: fit the simulator's cost model, by profiling the model
runner or from served runs' step records (:mod:`harness.costmodel.fit`), save it and show
the fit."""

from __future__ import annotations

import dataclasses
import os
from functools import partial
from pathlib import Path

import typer

from engine.config import EngineConfig
from engine.core.cost_model import CostModel
from harness.calibration.served import ServedCalibrationError, calibrate_served, resolve_method
from harness.cli.app import console
from harness.cli.options import cpu_split_option, parse_cpu_split_option
from harness.costmodel import evidence as cost_evidence
from harness.costmodel import store as cost_store
from harness.costmodel.fit import (
    HOLDOUT_TARGETS,
    CalibrateInputError,
    calibrate_by_profiling,
    calibrate_from_steps,
    cost_model_table,
    fit_summary,
    resolve_steps_origin,
    save_cost_model,
    steps_origin,
)
from harness.costmodel.machine import Fingerprint, fingerprint
from harness.processes.cpu_split import serve_cores
from harness.serve.knobs import flag_name, knob_defaults, with_engine_knobs


@with_engine_knobs()
def calibrate(
    engine_config: EngineConfig,
    knob_values: dict,
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
        help="Print this machine's fingerprint (for --model, --executor, --torch-threads) "
        "and the stored models (which matches, held-out error, when fitted, stale or not), "
        "then exit without fitting.",
    ),
    device: str | None = typer.Option(
        None, "--device", help="cpu or cuda (default: cuda when present)."
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
        "runs. No profiling. The fit is stored for the executor and torch threads the "
        "run.json beside the steps records (a run cell's, a served calibration's), "
        "else for --executor (then required) and --torch-threads.",
    ),
    from_run: list[Path] = typer.Option(
        [],
        "--from-run",
        help="Fit a cost model of an external engine (vLLM, SGLang, a bundled engine "
        "served elsewhere) from `schedscope run --target` runs against it (a run or cell "
        "directory; repeatable): its steps rebuilt from the client's token times, the last "
        "fifth of each run held out. Stored under the target's fingerprint (engine, "
        "version, model, knobs, KV cache, the load's machine), never this machine's; "
        "`simulate --cost-model target:NAME` uses it (docs/simulator.md).",
    ),
    target_knobs: str | None = typer.Option(
        None,
        "--target-knobs",
        help="With --from-run: the knobs the target was started with, in vLLM's flag "
        'names ("--max-num-seqs 64 --max-num-batched-tokens 4096"), over what the runs '
        "recorded (run --target-knobs) and what the target's metrics said.",
    ),
    method: str | None = typer.Option(
        None,
        "--method",
        help="served (default): serve the engine here with the engine knobs given, "
        "replay the calibration schedule against it and fit its step records; profile: "
        "time the offline model runner over a grid of step shapes.",
    ),
    executor: str | None = typer.Option(
        None,
        "--executor",
        help="--method served: the served engine's executor, torch (default: the model "
        "computes) or sim (each step sleeps what --cost-model predicts; for tests). "
        "--from-steps: the executor that ran the steps, when nothing beside them says.",
    ),
    torch_threads: int | None = typer.Option(
        None,
        "--torch-threads",
        help="--method served: the served engine's torch intra-op threads (serve's "
        "--torch-threads; default: serve's, one fewer than the cores); part of the "
        "fit's fingerprint. --from-steps: the threads the steps ran with, when nothing "
        "beside them says.",
    ),
    cpu_split: str = cpu_split_option(),
    cost_model: Path | None = typer.Option(
        None,
        "--cost-model",
        help="--method served: the cost model JSON the served engine is started with "
        "(the step times of --executor sim; default: the built-in).",
    ),
    seed: int | None = typer.Option(
        None, "--seed", min=0, help="--method served: the calibration schedule's seed."
    ),
    records_dir: Path | None = typer.Option(
        None,
        "--records-dir",
        help="--method served: where the served run's records go (steps, requests, the "
        "client's, the server's log, run.json); default: a new temporary directory.",
    ),
) -> None:
    """Fit the simulator's cost model: from a served run of the calibration schedule on
    this machine (default), by profiling the real model runner (--method profile), or
    from the step records of served runs (--from-steps).

    The served method starts `schedscope serve` with --record-steps and the engine
    knobs given here (every engine knob of `schedscope serve`, and --torch-threads),
    replays a schedule of decode-heavy, prefill-burst, mixed and long-context batches
    against it, and fits each step's full served cycle; it reports the error on
    held-out steps. Profiling measures steps over a grid of prefill tokens, decode
    batch sizes, context lengths and swapped blocks, fits the cost model, and reports
    its error on held-out mixed batches. The model goes into the store of fitted models,
    keyed by this machine's fingerprint (its model, executor and torch threads
    included), where `schedscope simulate` finds it (--out FILE: a file instead, for
    `--cost-model FILE`).
    """
    model = engine_config.model
    block_size = engine_config.cache.block_size
    if target_knobs is not None and not from_run:
        raise typer.BadParameter("only with --from-run", param_hint="--target-knobs")
    if from_run and not show:
        _calibrate_from_run(from_run, target_knobs, out, bool(from_steps), method)
        return
    if show:
        show_store(
            fingerprint(
                model,
                executor=executor or "torch",
                device=device,
                torch_threads=torch_threads or None,
            )
        )
        return
    split = parse_cpu_split_option(cpu_split)
    served_on: int | None = serve_cores(split)
    try:
        refuse_planted_faults()
        chosen = resolve_method(
            method,
            from_steps=bool(from_steps),
            given={
                "--executor": executor,
                "--torch-threads": torch_threads,
                "--cost-model": cost_model,
                "--seed": seed,
                "--records-dir": records_dir,
                "--device": device,
                "--repeats": repeats,
            },
            knobs=served_knob_flags(knob_values),
        )
        if chosen == "steps":
            executor, torch_threads, origin = resolve_steps_origin(
                from_steps, executor, torch_threads, model
            )
            console.print(origin, soft_wrap=True, highlight=False, markup=False)
            pinned = {steps_origin(p).serve_cores for p in from_steps} - {None}
            served_on = pinned.pop() if pinned else None  # what the records say
            fitted = calibrate_from_steps(from_steps, model, echo=console.print)
        elif chosen == "profile":
            fitted = calibrate_by_profiling(model, device, block_size, repeats or 5, quick)
        else:
            fitted = calibrate_served(
                engine_config,
                executor or "torch",
                cost_model,
                quick,
                seed,
                records_dir,
                echo=console.print,
                console=console,
                torch_threads=torch_threads,
                cpu_split=split,
            )
    except CalibrateInputError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.param_hint) from None
    except ServedCalibrationError as exc:
        # the server's log is text, not rich markup (it has "[core]" and the like)
        console.print(f"calibration failed: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    machine = _fit_fingerprint(
        fitted, model, device, chosen, executor or "torch", torch_threads, served_on
    )
    if out is None:
        # The store keeps the steps the fit came from: served runs' cells refit from them.
        pool = cost_evidence.of_calibration(fitted, from_steps if chosen == "steps" else None)
        out = cost_store.save(fitted, machine, evidence=pool)
    else:
        save_cost_model(cost_store.with_fingerprint(fitted, machine), out)
    console.print(cost_model_table(fitted))
    way = f"served{' quick' if quick else ''}" if chosen == "served" else chosen
    console.print(
        fit_summary(fitted, from_steps=chosen != "profile", target=HOLDOUT_TARGETS.get(way))
    )
    console.print(f"written: {out}", soft_wrap=True, highlight=False, markup=False)


def _calibrate_from_run(
    paths: list[Path], target_knobs: str | None, out: Path | None, steps: bool, method: str | None
) -> None:
    """--from-run: fit the target of ``paths``, store it under its fingerprint (or write
    ``out``), and say how much of the runs was usable and how well it fits."""
    from harness.calibration.from_run import FromRunError, calibrate_from_runs

    if steps or method is not None:
        raise typer.BadParameter(
            "--from-run fits an external engine from its runs: not with --from-steps or --method",
            param_hint="--from-run",
        )
    plain = partial(console.print, soft_wrap=True, highlight=False, markup=False)
    try:
        fitted = calibrate_from_runs(paths, target_knobs)
    except FromRunError as exc:
        raise typer.BadParameter(str(exc), param_hint="--from-run") from None
    for line in fitted.lines:
        plain(line)
    entry = fitted.identity.fingerprint_dict()
    if out is None:
        out = cost_store.save_target(fitted.model, entry, fitted.fingerprint)
    else:
        save_cost_model(dataclasses.replace(fitted.model, fingerprint=entry), out)
    console.print(cost_model_table(fitted.model))
    fit = fitted.model.fit
    plain(
        f"fitted in windows of up to {fit['window_steps']} consecutive steps: in-sample "
        f"median relative error {fit['train_median_rel_error']:.1%} over "
        f"{fit['train_points']:,} windows; "
        + fit_summary(fitted.model, from_steps=True).replace("held-out steps", "held-out windows")
        + f" ({fit['holdout']})"
    )
    plain(f"written: {out} (simulate --cost-model target:{fitted.fingerprint.name})")


def served_knob_flags(knob_values: dict) -> list[str]:
    """The engine knob flags given with a value other than the default, but --model and
    --block-size (every way of calibrating takes those): the served engine's."""
    defaults = knob_defaults()
    return [
        flag_name(name)
        for name, value in knob_values.items()
        if name not in ("model", "block_size") and value != defaults.get(name)
    ]


def _fit_fingerprint(
    fitted: CostModel,
    model: str,
    device: str | None,
    method: str,
    executor: str,
    torch_threads: int | None,
    serve_cores: int | None = None,
) -> Fingerprint:
    """The machine the fit stands for: a profiling fit's own device and torch threads;
    a fit of served steps (a served calibration, or --from-steps), the served engine's
    executor, torch threads and pinned cores (a sim-executor fit never stands in for the
    torch engine's; ``torch_threads`` None or 0: serve's default here; ``serve_cores``
    None: the automatic --cpu-split's)."""
    if method in ("served", "steps"):
        return fingerprint(
            model,
            executor=executor,
            device=device,
            torch_threads=torch_threads or None,
            serve_cores=serve_cores,
        )
    threads = fitted.fit.get("threads")
    return fingerprint(
        model,
        device="cuda" if fitted.device.startswith("cuda") else "cpu",
        torch_threads=threads if isinstance(threads, int) else None,
    )


def refuse_planted_faults() -> None:
    """A calibration with ``SCHEDSCOPE_FAULT`` set would time (or serve) an engine slowed
    on purpose and store that fit for this machine, where `simulate` then finds it."""
    from engine.faults import ENV_VAR, FaultError, Faults

    try:
        faults = Faults.from_env()
    except FaultError:
        faults = None  # malformed: planted faults all the same
    if faults is None or faults.active:
        raise CalibrateInputError(
            f"{ENV_VAR} is set ({os.environ.get(ENV_VAR)!r}): a calibration with planted "
            "faults (tests only) would store a wrong model for this machine; unset it",
            ENV_VAR,
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
        sources = (entry.model.fit.get("sources") if entry.model else None) or []
        if sources:
            print_plain(f"  fitted from the step cycles of {_sources_line(sources)}")
        left_out = (entry.model.fit.get("sources_left_out") if entry.model else None) or []
        if left_out:
            print_plain(
                f"  left out, off the pool's speed: {cost_evidence.left_out_text(left_out)}"
            )


def _sources_line(sources: list[dict]) -> str:
    """A pooled fit's sources (harness.costmodel.evidence), oldest first, in one line."""
    parts = []
    for source in sources:
        error = source.get("holdout_median_rel_error")
        ratio = source.get("time_ratio")
        parts.append(
            f"{source.get('kind', '?')} {source.get('name', '?')} ({source.get('steps', '?')} "
            f"steps{'' if error is None else f', held-out {error:.1%}'}"
            f"{'' if ratio is None else f', took {ratio:.2f}x the price'})"
        )
    return "; ".join(parts)


def _entry_state(entry: cost_store.StoredModel, machine: Fingerprint) -> str:
    if entry.target is not None and entry.model is not None:
        error = entry.holdout_error
        fit = entry.model.fit
        return (
            f"TARGET {entry.target.describe()}; fitted "
            f"{entry.model.fitted_at or 'at an unknown time'} from "
            f"{fit.get('steps_measured', '?')} steps rebuilt from "
            f"{fit.get('streamed_requests', '?')} streams, held-out median error "
            f"{'unknown' if error is None else f'{error:.1%}'}"
        )
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
