"""A simulated cell (``schedscope run --simulate``): the cell's schedule through the
simulator (harness/simulate/driver.py) with the cost model chosen for it, into the same
files a served cell leaves, then its run.json."""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl

from harness.run.cell_result import CellResult, Show, note_files, write_cell_info
from harness.run.collect import note_errors
from harness.run.matrix import Cell
from harness.run.outcome import judge_load
from harness.run.session_summary import session_summary
from harness.run.settings import CellSettings


def run_simulated_cell(
    cell: Cell, cell_dir: Path, settings: CellSettings, show: Show
) -> CellResult:
    from engine.core.cost_model import CostModel
    from harness.simulate.driver import run_simulations

    if cell.config is None:
        raise ValueError(f"cell {cell.name}: a simulated cell needs an engine config")
    result = CellResult(cell, cell_dir, "simulate")
    started = time.monotonic()
    raw = cell_dir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    scheduled, duration = settings.planned()
    result.scheduled = scheduled
    show(f"{cell.name}: simulating {scheduled} requests")
    model = CostModel.load(settings.cost_model) if settings.cost_model else CostModel()
    summary = run_simulations(
        settings.profile,
        {cell.name: cell.config},
        model,
        cell_dir,
        seed=settings.seed,
        trace_file=raw / "spans.jsonl",
        machine=settings.machine,
        speed_band=True,
    )
    frame = pl.read_parquet(cell_dir / "requests.parquet").with_columns(
        pl.lit(cell.name).alias("cell")
    )
    frame.write_parquet(cell_dir / "requests.parquet")
    # The report's profile and mode: this run's (the profile's file name, not its own name).
    summary["mode"] = "simulate"
    summary["profile"] = settings.profile_name
    (cell_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    result.counts = dict(sorted(frame.group_by("status").len().iter_rows())) if frame.height else {}
    note_errors(result, frame, settings.max_error_rate)
    result.sessions = session_summary(frame)
    judge_load(result, {}, None)
    result.generator_limited = False
    note_files(result, ("requests.parquet", "steps.parquet", "spans.parquet", "decisions.parquet"))
    result.wall_s = time.monotonic() - started
    info = {
        "scheduled_requests": scheduled,
        "schedule_duration_s": duration,
        "faults": summary["policies"][cell.name].get("faults", {}),
    }
    return write_cell_info(result, settings, info)
