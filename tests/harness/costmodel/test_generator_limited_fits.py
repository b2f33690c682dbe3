"""Every fit of served steps leaves out those that started while the load generator
lagged, as the client records beside them say: ``calibrate --from-steps`` of a run cell
(its requests.parquet, on the steps' clock) or of a served calibration's records (its
client.parquet, placed by run.json's ``clock_epoch_unix``), and a cell's refit into the
store (``fit_into_store``, whose run.json entry counts them)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from typer.testing import CliRunner

from engine.config import EngineConfig
from harness.cli import app
from harness.costmodel import store as cost_store
from harness.costmodel.evidence import from_steps_paths
from harness.costmodel.fit import calibrate_from_steps
from harness.costmodel.machine import fingerprint
from harness.records.generator_limited import EPOCH_KEY
from harness.run.matrix import Cell
from harness.run.simulator_check import CheckModel, cell_fingerprint, fit_into_store
from tests.support.lagging_run import EPOCH, MACHINE, lagging_run, relative_error


def _cell_dir(tmp_path):
    """A ``schedscope run`` cell's files: steps and requests on the client's clock."""
    run = lagging_run()
    cell = tmp_path / "fcfs"
    cell.mkdir()
    run.steps_on_unix_time().write_parquet(cell / "steps.parquet")
    run.client.write_parquet(cell / "requests.parquet")
    return cell


def _calibration_dir(tmp_path, epoch: float | None = EPOCH):
    """A served calibration's records: the engine's steps, the client's rows beside."""
    run = lagging_run()
    records = tmp_path / "calibration"
    records.mkdir()
    run.steps.write_parquet(records / "steps.parquet")
    run.client.write_parquet(records / "client.parquet")
    info = {"kind": "schedscope-calibrate", "executor": "sim", "model": "tiny"}
    if epoch is not None:
        info[EPOCH_KEY] = epoch
    (records / "run.json").write_text(json.dumps(info))
    return records


def test_calibrate_from_steps_of_a_cell_leaves_the_lagging_steps_out(tmp_path):
    cell = _cell_dir(tmp_path)
    lines: list[str] = []
    fitted = calibrate_from_steps([cell], "tiny", echo=lines.append)
    left_out = fitted.fit["generator_limited_steps_left_out"]
    assert left_out > 0
    assert any(
        line.startswith(f"{cell / 'steps.parquet'}: left out {left_out} of ")
        and "(requests.parquet says when)" in line
        for line in lines
    ), lines
    assert relative_error(fitted) < 0.01
    # the pool's source of the same steps leaves out the same ones
    source = from_steps_paths([cell], "cell", "run", 0.0)
    assert source.sources[0]["generator_limited_steps_left_out"] == left_out


def test_calibrate_from_steps_of_a_served_calibration_places_them_by_its_epoch(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    records = _calibration_dir(tmp_path)
    result = CliRunner().invoke(app, ["calibrate", "--from-steps", str(records)])
    assert result.exit_code == 0, result.output
    assert "client.parquet says when" in result.output
    # its run.json names no cpu_split: records made unpinned
    machine = fingerprint("tiny", executor="sim", torch_threads=None, serve_cores=0)
    stored = cost_store.find(machine).match.model
    assert relative_error(stored) < 0.01
    pool = cost_store.load_evidence(machine)
    assert pool.sources[0]["generator_limited_steps_left_out"] > 0


def test_records_that_do_not_say_the_engine_s_epoch_are_fitted_whole_with_a_note(tmp_path):
    records = _calibration_dir(tmp_path, epoch=None)
    lines: list[str] = []
    fitted = calibrate_from_steps([records], "tiny", echo=lines.append)
    assert "generator_limited_steps_left_out" not in fitted.fit
    assert any("does not record the engine's clock_epoch_unix" in line for line in lines)
    assert relative_error(fitted, MACHINE) > 0.1  # the slowed steps are in


def test_a_cell_s_refit_counts_its_lagging_steps_in_run_json(tmp_path, monkeypatch):
    monkeypatch.setenv(cost_store.STORE_ENV, str(tmp_path / "store"))
    cell_dir = _cell_dir(tmp_path)
    machine = cell_fingerprint(EngineConfig(), "sim", 1)
    check = CheckModel(MACHINE, None, machine, datetime.now(UTC), "")
    shown: list[str] = []
    entry = fit_into_store(
        Cell("fcfs", "fcfs", None, 1.0, {}, EngineConfig()), check, cell_dir, shown.append
    )
    left_out = entry["generator_limited_steps_left_out"]
    assert left_out > 0
    assert f"; {left_out} of the cell's step cycles left out" in shown[0], shown
    assert any("left out" in note for note in entry["notes"])
    stored = cost_store.find(machine).match.model
    assert relative_error(stored) < 0.01
