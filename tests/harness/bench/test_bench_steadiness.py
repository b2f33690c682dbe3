"""benchmarks/bench_steadiness.py: its floor is the best any one price does for a set of
step times, and its steps are real forward passes of the shapes, in turn."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.bench_steadiness import SHAPES, lowest_median_error, window_speeds

TIMES = st.lists(st.floats(1e-4, 1e-1), min_size=3, max_size=60).map(np.array)


def _median_error(price: float, seconds: np.ndarray) -> float:
    return float(np.median(np.abs(price - seconds) / seconds))


@given(TIMES)
@settings(max_examples=60, deadline=None)
def test_the_floor_is_no_worse_than_pricing_at_the_median_and_ignores_the_unit(seconds):
    floor = lowest_median_error(seconds)
    assert 0.0 <= floor <= _median_error(float(np.median(seconds)), seconds) + 1e-9
    # ms or s: the same floor
    assert lowest_median_error(seconds * 1000.0) == pytest.approx(floor, rel=1e-9, abs=1e-12)


def test_a_step_that_takes_the_same_time_most_of_the_time_has_no_floor():
    assert lowest_median_error(np.array([2.0, 2.0, 2.0, 2.4, 1.7])) == 0.0


def test_a_spread_of_ten_percent_either_way_has_a_floor_of_about_five():
    seconds = np.linspace(0.9, 1.1, 2001)
    assert 0.045 < lowest_median_error(seconds) < 0.055


def test_window_speeds_are_each_windows_median_over_the_runs():
    at = np.arange(0.0, 10.0, 0.1)  # two 5-s windows of 50 steps
    seconds = np.where(at < 5.0, 1.0, 1.2)
    assert window_speeds(at, seconds) == [1.0 / 1.1, 1.2 / 1.1]


@pytest.mark.torch_model
def test_the_steps_are_the_shapes_run_in_turn_on_the_runner():
    from engine.sim.calibration import step_times
    from engine.worker.loading import calibration_runner

    shapes = list(SHAPES.values())
    runner, _ = calibration_runner("tiny", 16, shapes, "cpu")
    # long enough for two rounds even when a first step of a shape faults its pages in
    # for half a second (seen on a loaded 2-core machine)
    times = step_times(runner, shapes, duration_s=2.0)
    assert len(times) >= 4 and len(times) % len(shapes) == 0
    assert [index for _, index, _ in times] == [0, 1] * (len(times) // 2)
    assert all(seconds > 0 for _, _, seconds in times)
    assert [at for at, _, _ in times] == sorted(at for at, _, _ in times)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--seconds", "0"], "--seconds: must be a number of seconds > 0, got 0"),
        (["--seconds", "-5"], "--seconds: must be a number of seconds > 0, got -5"),
        (["--threads", "-1"], "--threads: must be >= 0 (0: as served), got -1"),
    ],
)
def test_bad_sizes_are_refused_naming_the_flag(argv, named, capsys):
    from benchmarks.bench_steadiness import parser

    with pytest.raises(SystemExit) as caught:
        parser().parse_args(argv)
    assert caught.value.code == 2
    assert named in capsys.readouterr().err


@pytest.mark.torch_model
def test_a_run_too_short_for_a_median_says_so():
    from benchmarks.bench_steadiness import parser, run

    with pytest.raises(SystemExit, match=r"--seconds 0.01: only 0 1-sequence decode steps"):
        run(parser().parse_args(["--seconds", "0.01", "--device", "cpu"]))


def test_an_unknown_model_is_named():
    from benchmarks.bench_steadiness import parser, run

    with pytest.raises(SystemExit, match=r"--model no-such-model: "):
        run(parser().parse_args(["--model", "no-such-model", "--device", "cpu"]))
