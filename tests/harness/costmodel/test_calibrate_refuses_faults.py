"""A calibration never fits an engine slowed on purpose: with ``SCHEDSCOPE_FAULT`` set
(the test-only planted faults, docs/engine.md) `schedscope calibrate` refuses (exit 2,
naming the variable) before it serves or profiles anything, and `--from-steps` refuses
the steps of a run whose run.json records planted faults. Otherwise the fit would land in
this machine's store, where `simulate` and every served run's check would trust it."""

from __future__ import annotations

import json

import polars as pl
from typer.testing import CliRunner

from harness.cli import app

runner = CliRunner()


def test_calibrate_with_planted_faults_in_the_environment_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDSCOPE_COST_MODEL_DIR", str(tmp_path / "store"))
    for value in ("decode_step_delay_s=0.01", "sjf_order=nonsense"):
        monkeypatch.setenv("SCHEDSCOPE_FAULT", value)
        result = runner.invoke(app, ["calibrate", "--quick", "--out", str(tmp_path / "m.json")])
        assert result.exit_code == 2, result.output
        assert "SCHEDSCOPE_FAULT" in result.output
        assert not (tmp_path / "m.json").exists()


def test_from_steps_of_a_faulted_run_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("SCHEDSCOPE_FAULT", raising=False)
    cell = tmp_path / "cell"
    cell.mkdir()
    pl.DataFrame({"step": [0]}).write_parquet(cell / "steps.parquet")
    (cell / "run.json").write_text(
        json.dumps({"executor": "torch", "faults": {"prefill_token_delay_s": 0.001}})
    )
    result = runner.invoke(
        app, ["calibrate", "--from-steps", str(cell), "--out", str(tmp_path / "m.json")]
    )
    assert result.exit_code == 2, result.output
    assert "planted faults" in result.output
    assert not (tmp_path / "m.json").exists()
