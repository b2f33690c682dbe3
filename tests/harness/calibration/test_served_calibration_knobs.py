"""``schedscope calibrate`` serves with the engine knobs it is given: they reach the
served engine (its steps respect them, its records say so), the fit records them and its
fingerprint has the torch threads it was served with; a knob the engine rejects is a
usage error. A served ``--executor sim`` run of a shortened calibration schedule (a few
seconds of arrivals; the full one is test_served_calibration_sim.py's)."""

from __future__ import annotations

import dataclasses
import json

import polars as pl
import pytest
from typer.testing import CliRunner

from engine.core.cost_model import CostModel
from harness.calibration import served as served_calibration
from harness.cli import app
from harness.profiles import build_plan

pytestmark = [pytest.mark.slow]

#: A cheap synthetic model: the served run drains in seconds even at 8 sequences a step.
CHEAP = CostModel(
    step_overhead_s=2e-3,
    prefill_token_s=2e-6,
    decode_seq_s=1e-4,
    decode_context_token_s=1e-7,
    prefill_seq_s=5e-4,
    source="synthetic",
)


def short_schedule(quick=False, max_model_len=None, seed=None):
    """The quick calibration schedule at a tenth of its length (the same families)."""
    profile = served_calibration.calibration_profile(True, max_model_len)
    specs = build_plan(profile.with_duration_scale(0.1), seed).open_loop_requests()
    return [dataclasses.replace(s, max_tokens=s.output_tokens) for s in specs]


@pytest.fixture
def shortened(monkeypatch):
    monkeypatch.setattr(served_calibration, "calibration_schedule", short_schedule)


def test_the_knobs_given_reach_the_served_engine_and_the_fit(tmp_path, shortened):
    truth, out, records = tmp_path / "cheap.json", tmp_path / "fitted.json", tmp_path / "rec"
    CHEAP.save(truth)
    args = ["calibrate", "--executor", "sim", "--cost-model", str(truth), "--quick"]
    args += ["--max-num-seqs", "8", "--num-gpu-blocks-override", "1024"]
    args += ["--max-model-len", "1024", "--torch-threads", "3"]
    result = CliRunner().invoke(app, [*args, "--records-dir", str(records), "--out", str(out)])
    assert result.exit_code == 0, result.output

    steps = pl.read_parquet(records / "steps.parquet")
    # the bound was binding: more requests at once than 8, never more than 8 in a step
    assert steps["num_seqs"].max() == 8, steps["num_seqs"].max()
    assert steps["num_running"].max() <= 8
    # the pool is the one given, not calibration's own fixed one
    assert steps["num_device_blocks"].max() == 1024
    made = json.loads((records / "run.json").read_text())
    assert made["executor"] == "sim" and made["torch_threads"] == 3
    assert made["knobs"] == {
        "max_num_seqs": 8,
        "num_gpu_blocks_override": 1024,
        "max_model_len": 1024,
    }
    command = made["serve_command"]
    assert command[command.index("--max-num-seqs") + 1] == "8"
    assert command[command.index("--torch-threads") + 1] == "3"
    assert command.count("--num-gpu-blocks-override") == 1
    # the schedule fits --max-model-len: no request was rejected as too long (the
    # engine's rows beyond the schedule's are the load generator's one-token probes)
    client = pl.read_parquet(records / "client.parquet")
    assert client.height == len(short_schedule(max_model_len=1024))
    engine = pl.read_parquet(records / "requests.parquet").join(
        client.select("request_id"), on="request_id"
    )
    assert engine.height == client.height
    assert (engine["status"] == "ok").all(), engine["status"].value_counts()

    fitted = CostModel.load(out)
    assert fitted.fit["served"]["knobs"] == made["knobs"]
    assert fitted.fit["served"]["torch_threads"] == 3
    assert fitted.fingerprint["torch_threads"] == 3 and fitted.fingerprint["executor"] == "sim"

    # the records say how they were made: a refit of them is stored for the same setup
    refit = tmp_path / "refit.json"
    again = CliRunner().invoke(
        app, ["calibrate", "--from-steps", str(records), "--out", str(refit)]
    )
    assert again.exit_code == 0, again.output
    assert CostModel.load(refit).fingerprint["key"] == fitted.fingerprint["key"]
