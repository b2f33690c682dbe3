"""The served cell's simulator check, step by step and without a server: which model it
uses and whether that predates the run, and the refit's skip when the cell has too few
steps (never an exception)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import polars as pl

from engine.config import EngineConfig
from engine.core.cost_model import CostModel
from engine.sim.cost_fit import FIT_COLUMNS
from harness.costmodel import store as cost_store
from harness.run.matrix import Cell
from harness.run.simulator_check import (
    FAULTED_FIT_SKIPPED,
    CheckModel,
    cell_fingerprint,
    check_models,
    fit_into_store,
    simulate_counterpart,
)


def _cell(name="fcfs") -> Cell:
    return Cell(name, name, None, 1.0, {}, EngineConfig())


def test_check_model_is_this_machines_stored_fit_else_the_builtin(tmp_path, monkeypatch):
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    cells = [_cell("fcfs"), _cell("sjf")]
    builtin = check_models(cells, "sim", 1)
    assert builtin["fcfs"].path is None and builtin["fcfs"].entry()["model"] == "builtin"
    assert builtin["fcfs"].predates_run
    machine = cell_fingerprint(EngineConfig(), "sim", 1)
    assert builtin["fcfs"].entry()["fingerprint_key"] == machine.key
    old = dataclasses.replace(CostModel(), fitted_at="2026-01-01T00:00:00+00:00")
    path = cost_store.save(old, machine)
    stored = check_models(cells, "sim", 1)
    # one choice per fingerprint, shared by the run's cells
    assert stored["fcfs"] is stored["sjf"] and stored["fcfs"].path == path
    entry = stored["fcfs"].entry()
    assert entry["model"] == str(path) and entry["fitted_at"] == old.fitted_at
    assert entry["predates_run"] is True
    # another executor's fit is another fingerprint: not used
    assert check_models(cells, "torch", 1)["fcfs"].path is None


def test_each_cell_is_checked_with_the_fit_for_its_own_knob_sets_fingerprint(tmp_path, monkeypatch):
    """A run file's knob sets that set torch threads, the executor or the model: each
    cell's check looks up its own fingerprint, not the run's (or the first cell's)."""
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    cells = [
        Cell("fcfs-t1", "fcfs", "t1", 1.0, {}, EngineConfig(), {"torch_threads": 1}),
        Cell("fcfs-t3", "fcfs", "t3", 1.0, {}, EngineConfig(), {"torch_threads": 3}),
        Cell("fcfs-torch", "fcfs", "torch", 1.0, {}, EngineConfig(), {"executor": "torch"}),
        Cell("fcfs-small", "fcfs", "small", 1.0, {}, EngineConfig(model="small")),
    ]
    paths = {
        "fcfs-t1": cost_store.save(CostModel(), cell_fingerprint(EngineConfig(), "sim", 1)),
        "fcfs-t3": cost_store.save(CostModel(), cell_fingerprint(EngineConfig(), "sim", 3)),
        "fcfs-torch": cost_store.save(CostModel(), cell_fingerprint(EngineConfig(), "torch", 2)),
        "fcfs-small": cost_store.save(
            CostModel(), cell_fingerprint(EngineConfig(model="small"), "sim", 2)
        ),
    }
    assert len(set(paths.values())) == 4
    checks = check_models(cells, "sim", 2)
    assert {name: check.path for name, check in checks.items()} == paths
    assert checks["fcfs-t3"].fingerprint.torch_threads == 3
    assert checks["fcfs-torch"].fingerprint.executor == "torch"


def test_a_fit_stamped_after_the_run_started_is_not_out_of_sample():
    start = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    machine = cell_fingerprint(EngineConfig(), "sim", 1)

    def check(fitted_at: str) -> CheckModel:
        model = dataclasses.replace(CostModel(), fitted_at=fitted_at)
        return CheckModel(model, cost_store.path_for(machine), machine, start, "")

    assert check((start - timedelta(seconds=1)).isoformat()).predates_run
    assert not check((start + timedelta(seconds=1)).isoformat()).predates_run
    assert not check("").predates_run  # unstamped: not provably before


def test_too_few_steps_or_none_skip_the_fit_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    machine = cell_fingerprint(EngineConfig(), "sim", 1)
    check = CheckModel(CostModel(), None, machine, datetime.now(UTC), "")
    lines: list[str] = []
    cell_dir = tmp_path / "fcfs"
    cell_dir.mkdir()
    nothing = fit_into_store(_cell(), check, cell_dir, lines.append)
    assert nothing["stored"] is None and "steps.parquet" in nothing["skipped"]
    steps = pl.DataFrame({c: [0.0, 1.0, 2.0] for c in sorted(FIT_COLUMNS)}).with_columns(
        pl.col("step").cast(pl.Int64), pl.col("schedule_start") * 0.01
    )
    steps.write_parquet(cell_dir / "steps.parquet")
    few = fit_into_store(_cell(), check, cell_dir, lines.append)
    assert few["stored"] is None and "too few" in few["skipped"], few
    assert any("no cost model fitted" in line for line in lines)
    assert cost_store.entries() == []


def test_a_server_with_planted_faults_is_never_fitted_into_the_store(tmp_path, monkeypatch):
    """Its steps were slowed on purpose (SCHEDSCOPE_FAULT): stored, they would be the next
    run's cost model. Skipped before its steps are even read."""
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    machine = cell_fingerprint(EngineConfig(), "sim", 1)
    check = CheckModel(CostModel(), None, machine, datetime.now(UTC), "")
    lines: list[str] = []
    faults = {"decode_step_delay_s": 0.05}
    entry = fit_into_store(_cell(), check, tmp_path, lines.append, faults=faults)
    assert entry == {"stored": None, "skipped": FAULTED_FIT_SKIPPED}
    assert any("planted faults" in line for line in lines)
    assert cost_store.entries() == []
    # no faults ({} from /health): the fit is tried as ever (here: no steps to fit)
    assert "steps.parquet" in fit_into_store(_cell(), check, tmp_path, print, faults={})["skipped"]


def test_no_simulation_without_served_requests(tmp_path):
    machine = cell_fingerprint(EngineConfig(), "sim", 1)
    check = CheckModel(CostModel(), None, machine, datetime.now(UTC), "")
    entry = simulate_counterpart(_cell(), None, None, check, tmp_path, print)
    assert "no requests.parquet" in entry["skipped"] and entry["model"] == "builtin"
    assert not (tmp_path / "simulated").exists()
