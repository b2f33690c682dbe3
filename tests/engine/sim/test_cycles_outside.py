"""A fit leaves out the step cycles that started inside the stretches it is given
(``engine.sim.cost_fit.cycles_outside``): the engine knows nothing of why (the harness's
lagging load generator, harness/records/generator_limited.py), only the instants."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sim.cost_fit import (
    CalibrationError,
    cycles_outside,
    started_inside,
    step_cycles,
    usable_cycles,
)


def _steps(starts: list[float], idle: list[float] | None = None) -> pl.DataFrame:
    """Decode steps of 4 sequences starting at ``starts`` (the columns a fit reads)."""
    n = len(starts)
    return pl.DataFrame(
        {
            "step": list(range(n)),
            "schedule_start": starts,
            "idle_before_s": idle or [0.0] * n,
            "num_seqs": [4] * n,
            "num_prefill_tokens": [0] * n,
            "num_decode_seqs": [4] * n,
            "num_decode_context_tokens": [400 + i for i in range(n)],
            "prefill_attention_work": [0] * n,
            "num_blocks_swapped_out": [0] * n,
            "num_blocks_swapped_in": [0] * n,
        }
    )


def test_the_cycles_of_steps_started_inside_a_stretch_are_left_out_and_counted():
    # cycles of 10 ms, but steps 3-5 (starting at 0.03-0.05 s) took 30 ms each
    starts = [0.0, 0.01, 0.02, 0.03, 0.06, 0.09, 0.12, 0.13, 0.14]
    steps = _steps(starts)
    x_all, y_all = usable_cycles(steps)
    assert len(y_all) == len(starts) - 1
    x, y, left_out = cycles_outside(steps, [(0.025, 0.095)])
    assert left_out == 3
    assert y == pytest.approx([0.01, 0.01, 0.01, 0.01, 0.01])
    # the rows kept are the same rows, features and all
    assert np.array_equal(x, np.delete(x_all, [3, 4, 5], axis=0))
    # usable_cycles with the same stretches: the same rows
    x2, y2 = usable_cycles(steps, [(0.025, 0.095)])
    assert np.array_equal(x2, x) and np.array_equal(y2, y)
    # no stretches: nothing left out
    assert cycles_outside(steps)[2] == 0


def test_the_last_step_and_unusable_cycles_are_never_counted_as_left_out():
    # the last step has no cycle; the cycle of step 1 is not positive (a clock step)
    steps = _steps([0.0, 0.01, 0.005, 0.02], idle=[0.0, 0.0, 0.0, 0.0])
    _, y, left_out = cycles_outside(steps, [(0.0, 1.0)])
    assert len(y) == 0 and left_out == 2  # steps 0 and 2 had positive cycles


def test_the_steps_are_taken_in_step_order_whatever_the_rows_order():
    steps = _steps([0.0, 0.01, 0.02, 0.05, 0.06])
    shuffled = steps.sample(fraction=1.0, shuffle=True, seed=3)
    a = cycles_outside(steps, [(0.015, 0.025)])
    b = cycles_outside(shuffled, [(0.015, 0.025)])
    assert a[2] == b[2] == 1
    assert np.array_equal(a[1], b[1])


def test_missing_columns_are_refused_as_before():
    with pytest.raises(CalibrationError, match="lack the columns"):
        cycles_outside(_steps([0.0, 0.01]).drop("idle_before_s"), [(0.0, 1.0)])


@settings(max_examples=60, deadline=None)
@given(
    starts=st.lists(st.floats(0, 10, allow_nan=False), min_size=2, max_size=30, unique=True),
    stretches=st.lists(
        st.tuples(st.floats(0, 10, allow_nan=False), st.floats(0, 2, allow_nan=False)),
        max_size=5,
    ),
)
def test_left_out_and_kept_add_up_to_the_usable_cycles(starts, stretches):
    steps = _steps(sorted(starts))
    spans = [(a, a + w) for a, w in stretches]
    _, y_all = usable_cycles(steps)
    _, y, left_out = cycles_outside(steps, spans)
    assert len(y) + left_out == len(y_all)
    cycle_starts = np.array(sorted(starts))[:-1]
    _, all_cycles = step_cycles(steps)
    inside = started_inside(cycle_starts, spans) & (all_cycles > 0)
    assert left_out == int(inside.sum())
