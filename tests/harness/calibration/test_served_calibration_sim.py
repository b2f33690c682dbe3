"""``schedscope calibrate`` (the served method) recovers a known cost model: the engine
served with ``--executor sim`` sleeps what a synthetic model predicts for each step, the
quick calibration schedule is replayed against it, and the fit must predict the
schedule's own batch shapes as that model does.

The served cycle a fit sees is the sleep plus what the serving path adds (records,
hand-off, commands: ~1-3 ms a step on 2 loaded cores), so the synthetic costs are tens
of milliseconds a step — the path's share a few percent — and the check allows that
share, measured from the same records, on top of its 2%.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from engine.core.cost_model import FEATURES, CostModel
from engine.sim.cost_fit import step_cycles
from harness.calibration.served import SCHEDULE_NAME, SHAPE_FAMILIES, calibration_schedule
from harness.cli import app
from harness.profiles.schedule_file import written_schedule

pytestmark = [pytest.mark.slow]

#: Every step at least 40 ms; the terms each shape family exercises non-trivial.
TRUTH = CostModel(
    step_overhead_s=40e-3,
    prefill_token_s=6e-5,
    decode_seq_s=6e-4,
    decode_context_token_s=1.5e-6,
    prefill_attention_s=0.0,
    swap_block_s=0.0,
    prefill_seq_s=4e-3,
    mixed_step_s=0.0,
    prefill_padded_attention_s=0.0,
    # concave in the decode batch: the first DECODE_SMALL_BATCH sequences cost more
    decode_small_batch_seq_s=1.2e-3,
    client_latency_s=0.0,
    source="synthetic",
)


def test_calibrate_recovers_a_known_cost_model_from_a_served_sim_run(tmp_path):
    truth_file, out, records = tmp_path / "truth.json", tmp_path / "fitted.json", tmp_path / "rec"
    TRUTH.save(truth_file)
    result = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--executor",
            "sim",
            "--cost-model",
            str(truth_file),
            "--quick",
            "--records-dir",
            str(records),
            "--out",
            str(out),
        ],
    )
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "held-out median relative error" in text and "held-out steps" in text, text
    fitted = CostModel.load(out)
    assert fitted.source == "served" and fitted.fit["served"]["executor"] == "sim"
    assert set(fitted.fit["served"]["coverage"]) == set(SHAPE_FAMILIES)

    steps = pl.read_parquet(records / "steps.parquet")
    features, cycles = step_cycles(steps)
    truth = features @ np.array(TRUTH.coefficients)
    predicted = features @ np.array(fitted.coefficients)
    ran = truth > 0
    # What the serving path adds to a step beyond its (slept) execution, as a share.
    ordered = steps.sort("step").head(len(cycles))
    executed = (ordered["execute_end"] - ordered["execute_start"]).to_numpy()
    overhead_share = float(np.median((cycles - executed)[ran] / executed[ran]))
    assert 0 <= overhead_share < 0.06, f"the serving path took {overhead_share:.1%} of a step"

    errors = np.abs(predicted[ran] - truth[ran]) / truth[ran]
    bound = 0.02 + overhead_share
    report = (
        f"median {np.median(errors):.2%}, total {predicted.sum() / truth.sum():.3f}, "
        f"serving path {overhead_share:.2%}: "
        + json.dumps({n: getattr(fitted, n) for n in FEATURES})
    )
    assert float(np.median(errors)) <= bound, report
    assert 1 - 0.02 <= predicted.sum() / truth.sum() <= 1 + bound, report
    # the fit reports its own held-out error on the served cycles: small here
    assert fitted.fit["holdout_median_rel_error"] < 0.05, fitted.fit
    # the client's records were joined with the engine's: a measured latency
    assert 0 < fitted.client_latency_s < 0.5
    assert (records / "client.parquet").exists() and (records / "serve.log").exists()

    # schedscope run's load generator sent the schedule, request for request: Locust,
    # in its own process, the schedule as a trace profile in the records
    assert "locust" in json.loads((records / "run.json").read_text())["load_generator"]
    assert (records / "locust" / "locust.log").is_file()
    assert fitted.fit["served"]["load_generator"] == "locust"
    sent = written_schedule(records / f"{SCHEDULE_NAME}.toml")
    client = pl.read_parquet(records / "client.parquet").sort("scheduled_at")
    assert client["request_id"].to_list() == [s.request_id for s in sent]
    assert client["prompt_tokens"].to_list() == [s.prompt_tokens for s in sent]
    assert (client["output_tokens"] == client["max_tokens"]).all()
    planned = calibration_schedule(quick=True)
    assert [(s.class_name, s.output_tokens) for s in sent] == [
        (s.class_name, s.output_tokens) for s in planned
    ]
