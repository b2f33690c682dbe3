"""The speed probe (harness/costmodel/speed_probe.py): the ratio of measured step time to
a cost model's price of the same steps' compute, a real probe of the torch executor in
a child process, and its failures said, not raised past the caller."""

from __future__ import annotations

import math
import os

import pytest

from engine.core.cost_model import CostModel
from engine.sim.calibration import holdout_mix
from harness.costmodel.speed_probe import (
    NUM_SHAPES,
    SHAPES_SEED,
    SpeedProbeError,
    probe_speed,
    speed_ratio,
)


def test_the_ratio_is_measured_time_over_the_price_of_the_compute():
    model = CostModel()
    shapes = holdout_mix(NUM_SHAPES, seed=SHAPES_SEED, quick=True)
    features = [s.features() for s in shapes]
    compute = [model.predict_features(f) - model.step_overhead_s for f in features]
    assert speed_ratio(model, features, [2.5 * c for c in compute]) == pytest.approx(2.5)
    # the per-step overhead is not the runner's: a whole price would read it as faster
    whole = [model.predict_features(f) for f in features]
    assert speed_ratio(model, features, whole) > 1.0


@pytest.mark.parametrize(
    ("features", "seconds", "says"),
    [
        ([], [], "measured no step"),
        ([[0.0] * 10], [0.01], "against a price of"),
        ([[1.0] * 10], [float("inf")], "against a price of"),
        ([[1.0] * 3], [0.01], "not step features and seconds"),
    ],
)
def test_a_probe_that_measured_nothing_is_an_error_naming_it(features, seconds, says):
    with pytest.raises(SpeedProbeError, match=says):
        speed_ratio(CostModel(), features, seconds)


def test_a_real_probe_of_the_torch_executor_pinned_to_one_cpu():
    cpu = min(os.sched_getaffinity(0))
    probe = probe_speed(CostModel(), "tiny", block_size=16, threads=1, cpus=(cpu,))
    assert math.isfinite(probe.ratio) and 0.05 < probe.ratio < 50
    assert probe.num_shapes == NUM_SHAPES and probe.cpus == (cpu,)
    assert f"on CPU {cpu}" in probe.line() and f"{probe.ratio:.2f}x" in probe.line()


def test_a_probe_that_cannot_load_its_model_says_why():
    with pytest.raises(SpeedProbeError, match="the probe exited 1: .*no-such-model"):
        probe_speed(CostModel(), "no-such-model", block_size=16, threads=1)
