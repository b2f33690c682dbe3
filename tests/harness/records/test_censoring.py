"""Requests cut in flight are censored, never dropped: they miss their SLOs, and their
TTFT and E2E enter the distributions at lower bounds, whose statistics say which are
lower bounds (harness/records/request_stats.py)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.records.request_stats import (
    STATISTICS,
    censored_bounds,
    censored_distribution,
    cut_rows,
    distribution,
    group_statistics,
    slo_met_expr,
)


def _rows(ok_e2e: list[float], cut_elapsed: list[float], cut_ttft=None) -> pl.DataFrame:
    """``ok_e2e``: finished requests' E2E (TTFT a tenth of it); ``cut_elapsed``: cut
    requests' time from arrival to the cut; ``cut_ttft``: their TTFT, where a first
    token came (None: it did not)."""
    cut_ttft = cut_ttft or [None] * len(cut_elapsed)
    rows = [
        {"status": "ok", "scheduled_at": 100.0, "ttft_s": e / 10, "e2e_s": e, "cut_at": None}
        for e in ok_e2e
    ] + [
        {"status": "aborted", "scheduled_at": 100.0, "ttft_s": t, "e2e_s": None, "cut_at": 100 + c}
        for c, t in zip(cut_elapsed, cut_ttft, strict=True)
    ]
    frame = pl.DataFrame(
        rows,
        schema={
            "status": pl.String,
            "scheduled_at": pl.Float64,
            "ttft_s": pl.Float64,
            "e2e_s": pl.Float64,
            "cut_at": pl.Float64,
        },
    )
    return frame.with_columns(
        pl.lit("c").alias("class"),
        pl.lit(10, dtype=pl.Int64).alias("output_tokens"),
        *[
            pl.lit(None, dtype=pl.Int64).alias(c)
            for c in ("preempt_swaps", "preempt_recomputes", "recomputed_tokens")
        ],
        pl.lit(None, dtype=pl.Float64).alias("swapped_s"),
        pl.lit(None, dtype=pl.Int64).alias("idle_running_steps"),
    )


def test_a_class_of_survivors_and_cut_requests_reports_lower_bounds():
    # 18 finished in 1..18 s, 34 cut after 50..83 s: the survivors alone say p99 ~18 s;
    # with the cut ones the p99 is at least 82 s, and the p50 too is theirs
    frame = _rows([float(i) for i in range(1, 19)], [50.0 + i for i in range(34)])
    stats = group_statistics(
        frame, 100.0, frame.select(slo_met_expr(frame.columns, {})).to_series()
    )
    assert stats["cut_in_flight"] == 34 and stats["counts"]["aborted"] == 34
    e2e = stats["metrics"]["e2e_s"]
    assert e2e["count"] == 52 and e2e["censored"] == 34
    assert e2e["p99"] > 80 and set(e2e["lower_bound"]) == set(STATISTICS)
    # a cut request never met its SLO: 18 of 52
    assert stats["slo_met"] == 18 and stats["slo_attainment"] == pytest.approx(18 / 52)
    # the metrics a cut request says nothing of stay over the finished ones
    assert "censored" not in stats["metrics"].get("tpot_s", {})


def test_cut_requests_above_a_percentile_leave_it_exact():
    # 50 finished in 1..50 s, one cut after 500 s: the p50 does not depend on how long
    # the cut one would have taken; the p99 (between the 50th and 51st value) and the max do
    frame = _rows([float(i) for i in range(1, 51)], [500.0])
    e2e = group_statistics(frame, 600.0, pl.Series([True] * 51))["metrics"]["e2e_s"]
    assert "p50" not in e2e["lower_bound"] and "p90" not in e2e["lower_bound"]
    assert {"max", "mean", "p99"} <= set(e2e["lower_bound"])
    assert e2e["max"] == 500.0


def test_a_cut_requests_ttft_is_its_first_token_when_it_came():
    cut = cut_rows(_rows([1.0], [30.0, 40.0], cut_ttft=[2.5, None]))
    assert list(censored_bounds(cut, "ttft_s")) == [2.5, 40.0]
    assert list(censored_bounds(cut, "e2e_s")) == [30.0, 40.0]


def test_records_without_cut_at_are_summarised_as_before():
    frame = _rows([1.0, 2.0, 3.0], []).drop("cut_at")
    stats = group_statistics(frame, 10.0, pl.Series([True] * 3))
    assert "cut_in_flight" not in stats
    assert stats["metrics"]["e2e_s"] == distribution([1.0, 2.0, 3.0])
    # with the column and nothing cut: the same distributions, and a count of 0
    with_column = group_statistics(_rows([1.0, 2.0, 3.0], []), 10.0, pl.Series([True] * 3))
    assert with_column["cut_in_flight"] == 0
    assert with_column["metrics"]["e2e_s"] == distribution([1.0, 2.0, 3.0])


values = st.lists(st.floats(min_value=0.01, max_value=100.0), min_size=1, max_size=40)


@given(
    values, values, st.lists(st.floats(min_value=0.0, max_value=1000.0), min_size=40, max_size=40)
)
def test_a_lower_bound_is_below_and_an_exact_statistic_equals_any_completion(
    measured, bounds, extra
):
    # whatever the cut requests would have taken (at least their bounds), a statistic
    # named a lower bound is at most its true value, and any other equals it
    reported = censored_distribution(measured, bounds)
    truth = distribution(np.concatenate([measured, np.asarray(bounds) + extra[: len(bounds)]]))
    for s in STATISTICS:
        if s in reported["lower_bound"]:
            assert reported[s] <= truth[s] + 1e-9
        else:
            assert reported[s] == pytest.approx(truth[s], rel=1e-9, abs=1e-12)
