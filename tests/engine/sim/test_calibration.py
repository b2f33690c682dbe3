"""Calibration: the fit recovers a known cost model; the command writes a usable file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from engine.core.cost_model import FEATURES, CostModel
from engine.sim.calibration import StepShape, fit, holdout_mix, relative_errors, training_grid
from engine.worker.model import build_model
from engine.worker.model_config import ModelConfig
from engine.worker.weights import save_checkpoint
from harness.cli import app
from tests.support.device import device_under_test

pytestmark = [pytest.mark.torch_model, pytest.mark.slow]


def synthetic_seconds(model: CostModel, shapes: list[StepShape]) -> np.ndarray:
    return np.array([model.predict_features(shape.features()) for shape in shapes])


def test_fit_recovers_a_linear_cost_model_exactly():
    truth = CostModel(
        step_overhead_s=3e-4,
        prefill_token_s=4e-5,
        decode_seq_s=9e-5,
        decode_context_token_s=2e-7,
        prefill_attention_s=1e-8,
        swap_block_s=6e-6,
        prefill_seq_s=2e-4,
        mixed_step_s=7e-4,
    )
    grid = training_grid()
    x = np.array([s.features() for s in grid])
    coef = fit(x, synthetic_seconds(truth, grid))
    for name, value in zip(FEATURES, coef, strict=True):
        assert value == pytest.approx(getattr(truth, name), rel=1e-6), name
    held = holdout_mix(30)
    fitted = CostModel(**dict(zip(FEATURES, coef, strict=True)))
    assert max(relative_errors(fitted, held, list(synthetic_seconds(truth, held)))) < 1e-6


def test_fit_never_returns_negative_coefficients():
    rng = np.random.default_rng(0)
    grid = training_grid(quick=True)
    x = np.array([s.features() for s in grid])
    # Timings that a plain least-squares fit would explain with a negative term.
    seconds = 1e-3 + 1e-6 * x[:, 1] - 1e-9 * x[:, 4] + rng.uniform(0, 1e-5, len(grid))
    seconds = np.maximum(seconds, 1e-4)
    coef = fit(x, seconds)
    assert (coef >= 0).all()


def test_calibrate_command_writes_a_cost_model_the_simulator_uses(tmp_path):
    device = device_under_test()
    torch.manual_seed(0)
    config = ModelConfig(
        name="calib",
        vocab_size=256,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
    )
    model_dir = save_checkpoint(build_model(config), config, tmp_path / "ckpt")
    out = tmp_path / "cost.json"
    result = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--method",
            "profile",
            "--model",
            str(model_dir),
            "--quick",
            "--repeats",
            "1",
            "--device",
            device,
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["source"] == "calibrated"
    assert data["device"].startswith(device)
    assert data["model"] and data["fitted_at"][:4].isdigit()
    assert data["fit"]["holdout_points"] > 0 and data["fit"]["train_points"] > 0
    # --out records the machine it was fitted on: the profiled threads, the checkpoint
    assert data["fingerprint"]["model"] == str(model_dir.resolve())
    assert data["fingerprint"]["device"] == device
    assert data["fingerprint"]["torch_threads"] == data["fit"]["threads"]
    assert 0 <= data["fit"]["holdout_median_rel_error"]
    fitted = CostModel.load(out)
    assert all(getattr(fitted, name) >= 0 for name in FEATURES)
    assert fitted.predict(0, 8, 8 * 100) > 0
    sim = CliRunner().invoke(
        app,
        [
            "simulate",
            "--cost-model",
            str(out),
            "--num-requests",
            "50",
            "--out",
            str(tmp_path / "sim"),
        ],
    )
    assert sim.exit_code == 0, sim.output


def test_calibrate_names_a_bad_model(tmp_path):
    result = CliRunner().invoke(
        app, ["calibrate", "--model", "gigantic", "--out", str(tmp_path / "c.json")]
    )
    assert result.exit_code == 2
    assert "gigantic" in result.output


def test_calibrate_without_out_writes_into_the_store(tmp_path, monkeypatch):
    from harness.costmodel import store as cost_store
    from harness.costmodel.machine import fingerprint

    store = tmp_path / "store"
    monkeypatch.setenv(cost_store.STORE_ENV, str(store))
    monkeypatch.chdir(tmp_path)
    device = device_under_test()
    args = ["calibrate", "--method", "profile", "--quick", "--repeats", "1", "--device", device]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "cost_model.json").exists()
    [entry] = cost_store.entries(store)
    assert f"written: {entry.path}" in result.stdout
    threads = entry.model.fit["threads"]
    assert entry.fingerprint == fingerprint("tiny", device=device, torch_threads=threads)


def test_a_served_fit_stands_for_the_executor_it_measured():
    """A served calibration of the sim executor is stored under the sim executor's
    fingerprint: it never stands in for the torch engine's steps."""
    from engine.core.cost_model import CostModel
    from harness.cli.calibrate import _fit_fingerprint
    from harness.costmodel.machine import fingerprint

    fitted = CostModel.constant(0.01)
    sim = _fit_fingerprint(fitted, "tiny", None, "served", "sim", None)
    torch = _fit_fingerprint(fitted, "tiny", None, "served", "torch", None)
    assert sim.executor == "sim" and torch.executor == "torch"
    assert sim.key != torch.key
    assert torch == fingerprint("tiny")  # the served torch engine's defaults here
    assert _fit_fingerprint(fitted, "tiny", None, "steps", "torch", 0) == fingerprint("tiny")
    # The served engine's torch threads are part of what the fit stands for.
    two = _fit_fingerprint(fitted, "tiny", None, "served", "torch", 2)
    assert two == fingerprint("tiny", torch_threads=2)
