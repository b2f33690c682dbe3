"""``schedscope serve --executor sim --cost-model``: chosen as ``schedscope simulate``
chooses (harness/costmodel/choice.py): this machine's stored fit (the torch engine's, for
--model and --torch-threads) when there is one, else the built-in with the warning;
``builtin``, ``auto`` and FILE as documented (docs/serving.md); one stderr line names
the model. The torch executor keeps the built-in unless given a file."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

import harness.serve.server
from engine.core.cost_model import CostModel
from harness.cli import app
from harness.costmodel import store as cost_store
from harness.costmodel.machine import fingerprint
from harness.serve.local_server import CliServer


@pytest.fixture
def store(tmp_path, monkeypatch):
    directory = tmp_path / "store"
    monkeypatch.setenv(cost_store.STORE_ENV, str(directory))
    return directory


@pytest.fixture
def served(monkeypatch):
    """What the CLI hands ``harness.serve.server.serve`` (instead of serving): its arguments."""
    calls: list[dict] = []

    def fake_serve(engine_config, settings, **kwargs):
        calls.append(kwargs)
        return 0

    monkeypatch.setattr(harness.serve.server, "serve", fake_serve)
    return calls


def fit(step_overhead_s: float = 7e-3) -> CostModel:
    return dataclasses.replace(
        CostModel(),
        step_overhead_s=step_overhead_s,
        fitted_at="2026-12-01T00:00:00+00:00",
        fit={"holdout_median_rel_error": 0.031},
    )


def serve(*args: str):
    result = CliRunner().invoke(app, ["serve", *args])
    lines = [line for line in result.stderr.splitlines() if line.startswith("cost model:")]
    return result, lines


def test_without_a_fit_the_sim_executor_sleeps_the_builtin_and_says_so(store, served):
    result, [line] = serve("--executor", "sim")
    assert result.exit_code == 0, result.output
    assert "built-in, fitted on another machine" in line and "`schedscope calibrate`" in line
    assert served[0]["cost_model"] is None  # the cost model file: none, the built-in


def test_this_machines_stored_fit_is_used_for_its_threads(store, served):
    one = cost_store.save(fit(5e-3), fingerprint("tiny", executor="torch", torch_threads=1))
    three = cost_store.save(fit(9e-3), fingerprint("tiny", executor="torch", torch_threads=3))
    result, [line] = serve("--executor", "sim", "--torch-threads", "3")
    assert result.exit_code == 0, result.output
    assert line.startswith(f"cost model: {three} (fitted on this machine") and "3.1%" in line
    assert served[-1]["cost_model"] == three
    result, [line] = serve("--executor", "sim", "--torch-threads", "1")
    assert served[-1]["cost_model"] == one


def test_builtin_and_a_file_as_asked(store, served, tmp_path):
    cost_store.save(fit(), fingerprint("tiny", executor="torch"))
    result, [line] = serve("--executor", "sim", "--cost-model", "builtin")
    assert result.exit_code == 0 and "(--cost-model builtin)" in line, result.output
    assert served[-1]["cost_model"] is None
    own = tmp_path / "own.json"
    fit(4e-3).save(own)
    result, lines = serve("--executor", "sim", "--cost-model", str(own))
    assert result.exit_code == 0 and lines == [], result.output
    assert served[-1]["cost_model"] == own


def test_auto_calibrates_when_there_is_no_fit_then_uses_the_stored_one(store, served, monkeypatch):
    import harness.calibration.served

    calibrated = []

    def quick(machine):
        calibrated.append(machine)
        return fit(6e-3)

    monkeypatch.setattr(harness.calibration.served, "calibrate_quickly", quick)
    result, [line] = serve("--executor", "sim", "--cost-model", "auto")
    assert result.exit_code == 0, result.output
    assert "calibrated now by a quick served calibration" in line, line
    [machine] = calibrated
    assert machine.executor == "torch" and machine.model == "tiny"
    stored = cost_store.find(machine).match
    assert stored is not None and served[-1]["cost_model"] == stored.path
    result, [line] = serve("--executor", "sim", "--cost-model", "auto")
    assert len(calibrated) == 1 and line.startswith(f"cost model: {stored.path}")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--executor", "sim", "--cost-model", "/nonexistent.json"], "not found"),
        (["--executor", "torch", "--cost-model", "auto"], "the torch executor computes"),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_the_flag(store, served, args, words):
    result, _ = serve(*args)
    text = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "--cost-model" in text and words in text, text
    assert served == []


def test_the_torch_executor_keeps_the_builtin_without_a_line(store, served):
    cost_store.save(fit(), fingerprint("tiny", executor="torch"))
    result, lines = serve("--executor", "torch")
    assert result.exit_code == 0 and lines == [], result.output
    assert served[-1]["cost_model"] is None


def test_a_served_sim_engine_names_the_stored_fit_it_sleeps(store):
    path = cost_store.save(fit(), fingerprint("tiny", executor="torch", torch_threads=2))
    with CliServer(["--executor", "sim", "--torch-threads", "2"]) as server:
        output = server.output()
    assert f"cost model: {path} (fitted on this machine" in output, output
