"""Every served cell checks the simulator, then refits it (docs/run.md, "The simulator
check").

At the run's start, before any cell serves, the cost model each cell will be checked
with is chosen as ``schedscope simulate`` would choose it without flags
(:func:`harness.costmodel.choice.choose`): this machine's stored fit for the cell's
fingerprint, else the built-in. After the cell's load, its schedule is simulated with
that model into ``<cell>/simulated/`` (:func:`simulate_counterpart`); only then are the
cell's own steps fitted into the store (:func:`fit_into_store`). So the check is out of
sample: the model predates the run, which the cell's run.json records
(``simulator_check``: the model's path or ``builtin``, its ``fitted_at`` and
fingerprint key, ``predates_run``). Neither step ever fails the cell: what cannot be
done is recorded with its reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from engine.config import EngineConfig
from engine.core.cost_model import CostModel
from harness.costmodel import store as cost_store
from harness.costmodel.choice import BUILTIN, choose
from harness.costmodel.machine import Fingerprint, fingerprint
from harness.report.simulator_check import COST_FIT_KEY, RUN_JSON_KEY, SIMULATED_DIR
from harness.run.matrix import Cell


@dataclass(frozen=True)
class CheckModel:
    """The model a served cell's check simulates with, chosen at the run's start."""

    model: CostModel
    #: the store file it came from; None for the built-in
    path: Path | None
    #: the served cell's fingerprint: the check's lookup key and the refit's
    fingerprint: Fingerprint
    #: when the run started (UTC): the model must have been fitted before
    run_started_at: datetime
    #: cost_choice's line naming the model
    line: str

    @property
    def predates_run(self) -> bool:
        """True when the model was fitted before the run started (the built-in ships with
        schedscope); False for a fit stamped at or after the start, or unstamped."""
        if self.path is None:
            return True
        try:
            fitted = datetime.fromisoformat(self.model.fitted_at)
        except ValueError:
            return False
        if fitted.tzinfo is None:
            fitted = fitted.replace(tzinfo=UTC)
        return fitted < self.run_started_at

    def entry(self) -> dict:
        """The cell's run.json ``simulator_check``."""
        return {
            "model": str(self.path) if self.path is not None else BUILTIN,
            "fitted_at": self.model.fitted_at or None,
            "fingerprint_key": self.fingerprint.key,
            "run_started_at": self.run_started_at.isoformat(),
            "predates_run": self.predates_run,
            "holdout_median_rel_error": self.model.fit.get("holdout_median_rel_error"),
        }


def cell_fingerprint(
    config: EngineConfig | None,
    executor: str,
    torch_threads: int | None,
    serve_cores: int | None = None,
) -> Fingerprint:
    """The fingerprint of a served cell's steps: its model, run by ``executor`` on this
    machine with ``torch_threads`` (serve's default when None), its server pinned to
    ``serve_cores`` cores (0: not pinned; None: as the automatic --cpu-split pins it),
    as ``schedscope run`` and the store build it."""
    return fingerprint(
        config.model if config is not None else "tiny",
        executor=executor,
        torch_threads=torch_threads,
        serve_cores=serve_cores,
    )


def check_models(
    cells: Iterable[Cell],
    executor: str,
    torch_threads: int | None,
    serve_cores: int | None = None,
) -> dict[str, CheckModel]:
    """Cell name -> the model its check uses, chosen now (call it before any cell serves:
    a cell's refit must not be the model a later cell of the same run is checked with).
    Each cell's own fingerprint: its model, and its executor and torch threads (a run
    file's knob set may set them; else the run's ``executor`` and ``torch_threads``)."""
    started = datetime.now(UTC)
    chosen: dict[str, CheckModel] = {}
    out = {}
    for cell in cells:
        machine = cell_fingerprint(
            cell.config,
            cell.setting("executor", executor),
            cell.setting("torch_threads", torch_threads),
            serve_cores,
        )
        if machine.key not in chosen:
            choice = choose(None, machine)
            chosen[machine.key] = CheckModel(
                choice.model, choice.path, machine, started, choice.line
            )
        out[cell.name] = chosen[machine.key]
    return out


def simulate_counterpart(
    cell: Cell,
    profile,
    seed: int | None,
    check: CheckModel,
    cell_dir: Path,
    show: Callable[[str], None],
) -> dict:
    """The cell's schedule (``profile``, ``seed``: the served one's) simulated with the
    check's model into ``cell_dir/simulated/`` (requests, steps, summary.json, with the
    speed band when the model has seen this machine run at different speeds:
    :mod:`harness.simulate.speed_band`); the run.json entry, with ``skipped`` and why when the
    cell has nothing to compare."""
    from harness.simulate.driver import run_simulations

    entry = check.entry()
    if cell.config is None or not (cell_dir / "requests.parquet").is_file():
        return {**entry, "skipped": "the cell has no requests.parquet to compare with"}
    show(f"{cell.name}: simulating the same schedule ({entry['model']})")
    run_simulations(
        profile,
        {cell.name: cell.config},
        check.model,
        cell_dir / SIMULATED_DIR,
        seed=seed,
        write_decisions=False,
        machine=check.fingerprint.to_dict(),
        speed_band=True,
    )
    entry = {**entry, "records": f"{SIMULATED_DIR}/requests.parquet"}
    priced = price_served_steps(check.model, cell_dir / "steps.parquet")
    if priced is not None:
        entry[STEPS_PRICED_KEY] = priced
    return entry


#: The run.json ``simulator_check`` entry of the cell's own steps priced by the model.
STEPS_PRICED_KEY = "steps_priced"


def price_served_steps(model, steps_file: Path) -> dict | None:
    """The served cell's own steps, each priced by ``model`` (the check's: fitted before
    the run), beside what they took: ``{steps, served_s, model_s, ratio}`` (ratio =
    served / model). It tells the two sources of a latency error apart: the step costs
    (a ratio away from 1: the machine ran slower or faster than the model says, as a
    machine whose speed wanders does between runs) and the simulated schedule (a ratio
    near 1 with latencies far apart). None when the cell has no usable steps."""
    import numpy as np
    import polars as pl

    from engine.sim.cost_fit import CalibrationError, usable_cycles

    try:
        features, cycles = usable_cycles(pl.read_parquet(steps_file))
    except (OSError, pl.exceptions.PolarsError, CalibrationError):
        return None
    if not len(cycles):
        return None
    served_s = float(cycles.sum())
    model_s = float((features @ np.array(model.coefficients)).sum())
    return {
        "steps": len(cycles),
        "served_s": round(served_s, 4),
        "model_s": round(model_s, 4),
        "ratio": round(served_s / model_s, 4) if model_s > 0 else None,
    }


#: ``cost_fit.skipped`` of a cell whose server ran with planted faults.
FAULTED_FIT_SKIPPED = "the server ran with planted faults (SCHEDSCOPE_FAULT): steps not fitted"


def fit_into_store(
    cell: Cell,
    check: CheckModel,
    cell_dir: Path,
    show: Callable[[str], None],
    faults: dict | None = None,
    keep_off_speed_sources: bool = False,
) -> dict:
    """Refit the store's model for the cell's fingerprint with the cell's steps.parquet
    (and its client records) added to the step cycles it was fitted from
    (:mod:`harness.costmodel.evidence`: the last calibration's and the newest runs' cells,
    none counting more than 4,000 steps), and store the refit; the run.json ``cost_fit``
    entry. The cell alone would describe one regime only, and one overloaded cell,
    stored as the machine's model, mispredicted the machine's other loads by 2-3x.
    Too few steps, or none, is a skip with its reason, never a failure. So are steps of
    a server that ran with planted ``faults`` (its /health ``faults``; engine/faults.py):
    slowed on purpose, they are not this machine's, and stored they would be the next
    run's model.

    The cell's steps that started while its load generator lagged are not added (their
    count: ``generator_limited_steps_left_out``), and a source whose steps ran far from
    the pool's speed is left out of the refit (``sources_left_out``, the cell's own
    included) unless ``keep_off_speed_sources`` (``schedscope run
    --keep-off-speed-sources``): :meth:`Evidence.refit`."""
    from engine.sim.cost_fit import CalibrationError
    from harness.costmodel.evidence import (
        RUN,
        Evidence,
        EvidenceError,
        from_steps_paths,
        left_out_text,
    )
    from harness.costmodel.fit import CalibrateInputError, calibrate_from_steps

    if faults:
        show(f"{cell.name}: no cost model fitted: the server ran with planted faults")
        return {"stored": None, "skipped": FAULTED_FIT_SKIPPED}

    model = cell.config.model if cell.config is not None else "tiny"
    lines: list[str] = []
    try:
        alone = calibrate_from_steps([cell_dir], model, echo=lines.append)
        mine = from_steps_paths([cell_dir], str(cell_dir), RUN, alone.client_latency_s)
    except (CalibrateInputError, CalibrationError) as exc:
        show(f"{cell.name}: no cost model fitted from this cell: {exc}")
        return {"stored": None, "skipped": str(exc)}
    try:
        pool = cost_store.load_evidence(check.fingerprint)
    except EvidenceError as exc:
        lines.append(f"the store's step cycles were unreadable, so the refit starts afresh: {exc}")
        pool = Evidence()
    pool = pool.plus(mine)
    prior = cost_store.find(check.fingerprint).match
    fitted = pool.refit(model, prior.model if prior else None, keep_off_speed_sources)
    # the whole pool is stored: the next refit judges every source's speed again
    path = cost_store.save(fitted, check.fingerprint, evidence=pool)
    left_out = fitted.fit.get("sources_left_out") or []
    kept = fitted.fit.get("off_speed_sources_kept") or []
    mine_left_out = any(s["name"] == str(cell_dir) for s in left_out)
    line = (
        f"{cell.name}: refitted {path} from {len(pool.sources) - len(left_out)} of "
        f"{len(pool.sources)} source(s) of step cycles, this cell's "
        + ("left out" if mine_left_out else "included")
    )
    if left_out:
        line += (
            f"; left out, off the pool's speed: {left_out_text(left_out)} "
            "(--keep-off-speed-sources keeps them)"
        )
    if kept:
        line += f"; kept as asked, though off the pool's speed: {left_out_text(kept)}"
    skipped = mine.sources[0]["generator_limited_steps_left_out"]
    if skipped:
        line += (
            f"; {skipped} of the cell's step cycles left out: they started while the load "
            "generator lagged its schedule"
        )
    show(line)
    return {
        "stored": str(path),
        "fitted_at": fitted.fitted_at,
        "fingerprint_key": check.fingerprint.key,
        "holdout_median_rel_error": fitted.fit.get("holdout_median_rel_error"),
        "sources": [
            {k: s[k] for k in ("name", "kind", "steps", "holdout_median_rel_error")}
            for s in fitted.fit["sources"]
        ],
        "sources_left_out": left_out,
        "off_speed_sources_kept": kept,
        "generator_limited_steps_left_out": skipped,
        "cell_alone_holdout_median_rel_error": alone.fit.get("holdout_median_rel_error"),
        "notes": lines,
    }


__all__ = [
    "COST_FIT_KEY",
    "FAULTED_FIT_SKIPPED",
    "RUN_JSON_KEY",
    "STEPS_PRICED_KEY",
    "CheckModel",
    "cell_fingerprint",
    "check_models",
    "fit_into_store",
    "price_served_steps",
    "simulate_counterpart",
]
