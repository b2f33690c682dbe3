"""A served calibration leaves out the steps that ran while its load generator lagged
(harness/calibration/served.py ``fit_served_steps``): on a slow 2-core machine the
generator fell behind its schedule and its CPU slowed the engine's steps, so those
steps priced the engine and its neighbour. Hand-made records (tests/support/lagging_run.py):
no server."""

from __future__ import annotations

import json

import pytest

from harness.calibration.served import (
    RUN_JSON,
    ServedCalibrationError,
    _record_epoch,
    fit_served_steps,
)
from harness.records.generator_limited import EPOCH_KEY, lagging_stretches
from tests.support.lagging_run import EPOCH, lagging_run, relative_error


def test_the_steps_of_a_lagging_stretch_are_left_out_of_the_calibration(tmp_path):
    run = lagging_run()
    # the client's rows are Unix time, the steps the engine's: the epoch places them
    stretches = lagging_stretches(run.client, clock_offset_s=EPOCH)
    assert len(stretches) == 1
    start, end = stretches[0]
    assert start <= run.lag_start and run.lag_end <= end + 0.2  # the last late send
    lines: list[str] = []
    fitted, left_out = fit_served_steps(
        run.steps, stretches, "tiny", tmp_path / "steps.parquet", echo=lines.append
    )
    slowed = run.steps.filter(
        (run.steps["schedule_start"] >= run.lag_start) & (run.steps["schedule_start"] < run.lag_end)
    ).height
    assert slowed <= left_out <= slowed + 40  # the margin takes a few steps either side
    assert [line for line in lines if "left out" in line] == [
        f"left out {left_out} of {run.steps.height - 1} step cycles: they started while the "
        f"load generator lagged its schedule (1 stretch(es), {end - start:.1f} s in all: "
        "requests sent over 10 ms late or held for its in-flight cap, ±50 ms), when its CPU "
        "use slowed the engine's steps"
    ]
    # the machine's own prices, where the slowed steps would have raised them
    assert relative_error(fitted) < 0.01
    biased, none_left_out = fit_served_steps(run.steps, [], "tiny", tmp_path / "steps.parquet")
    assert none_left_out == 0 and relative_error(biased) > 0.1


def test_a_calibration_whose_generator_lagged_throughout_fails_saying_so(tmp_path):
    run = lagging_run(num_steps=120, lagging=(0.05, 1.0))
    stretches = lagging_stretches(run.client, clock_offset_s=EPOCH)
    with pytest.raises(ServedCalibrationError) as caught:
        fit_served_steps(
            run.steps, stretches, "tiny", tmp_path / "steps.parquet", lag_p99_s=0.2, echo=print
        )
    text = str(caught.value)
    assert "the load generator lagged its schedule (send lag p99 200 ms)" in text, text
    assert "too few to fit" in text and "left out" in text, text
    # too few steps with no lag is the plain message, as before
    with pytest.raises(ServedCalibrationError) as plain:
        fit_served_steps(run.steps.head(8), [], "tiny", tmp_path / "steps.parquet")
    assert "too few" in str(plain.value) and "lagged" not in str(plain.value)


def test_the_engine_clock_epoch_is_recorded_beside_the_calibration_s_records(tmp_path):
    """So that ``calibrate --from-steps`` of the records places the same stretches."""
    (tmp_path / RUN_JSON).write_text(json.dumps({"kind": "schedscope-calibrate"}))
    _record_epoch(tmp_path, EPOCH)
    info = json.loads((tmp_path / RUN_JSON).read_text())
    assert info == {"kind": "schedscope-calibrate", EPOCH_KEY: EPOCH}
