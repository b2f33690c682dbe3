"""The stretches of a run when its load generator lagged (harness/records/generator_limited.py):
found from the client's request records, placed on the clock of the steps (a run cell's,
already the client's; a served calibration's, the engine's own), merged."""

from __future__ import annotations

import json

import polars as pl
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harness.records.generator_limited import (
    EPOCH_KEY,
    MARGIN_S,
    lagging_intervals,
    lagging_stretches,
    merge_stretches,
    stretches_beside,
)
from harness.records.send_lag import LAG_LIMIT_S

EPOCH = 1_700_000_000.0


def _requests(rows: list[tuple[float, float | None, bool]]) -> pl.DataFrame:
    """Client rows: (scheduled_at, sent_at, in_flight_capped), Unix time from EPOCH."""
    return pl.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(len(rows))],
            "scheduled_at": [EPOCH + s for s, _, _ in rows],
            "sent_at": [None if t is None else EPOCH + t for _, t, _ in rows],
            "send_lag_s": [None if t is None else t - s for s, t, _ in rows],
            "in_flight_capped": [c for _, _, c in rows],
        },
        schema_overrides={"sent_at": pl.Float64, "send_lag_s": pl.Float64},
    )


def test_only_late_or_capped_requests_make_stretches_widened_and_merged():
    frame = _requests(
        [
            (1.0, 1.001, False),  # on time: nothing
            (2.0, 2.5, False),  # 500 ms late
            (2.52, 2.6, False),  # late again, within the margin of the one before
            (5.0, 5.002, True),  # held for the in-flight cap
            (7.0, None, True),  # held and never sent: its scheduled instant alone
            (8.0, 8.0 + LAG_LIMIT_S / 2, False),  # under the limit
        ]
    )
    stretches = lagging_stretches(frame, clock_offset_s=EPOCH)
    m = MARGIN_S
    expected = [(2.0 - m, 2.6 + m), (5.0 - m, 5.002 + m), (7.0 - m, 7.0 + m)]
    assert len(stretches) == len(expected)
    for got, want in zip(stretches, expected, strict=True):
        assert got == pytest.approx(want)
    # a run cell's steps are on the client's clock: no offset
    assert lagging_stretches(frame)[0] == pytest.approx((EPOCH + 2.0 - m, EPOCH + 2.6 + m))


def test_records_without_the_generator_s_columns_have_no_stretches():
    engine_rows = pl.DataFrame({"request_id": ["r0"], "scheduled_at": [1.0]})
    assert lagging_stretches(engine_rows) == []


intervals = st.lists(
    st.tuples(st.floats(-1e3, 1e3, allow_nan=False), st.floats(0, 50, allow_nan=False)).map(
        lambda t: (t[0], t[0] + t[1])
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(intervals)
def test_merged_stretches_are_disjoint_in_order_and_cover_exactly_the_intervals(given_intervals):
    merged = merge_stretches(given_intervals)
    for start, end in merged:
        assert start <= end
    for (_, end), (start, _) in zip(merged, merged[1:], strict=False):
        assert end < start  # disjoint, in time order, not touching
    for start, end in given_intervals:  # every interval inside one stretch
        assert any(a <= start and end <= b for a, b in merged)
    for a, b in merged:  # and no stretch reaches past the intervals it merged
        assert any(start == a for start, _ in given_intervals)
        assert any(end == b for _, end in given_intervals)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 100, allow_nan=False),
            st.floats(0, 2, allow_nan=False),
            st.booleans(),
        ),
        max_size=25,
    )
)
def test_every_lagging_request_lies_inside_a_stretch(rows):
    # A lag within 1e-6 s of the limit is on either side of it once it is stored as
    # Unix instants (1.7e9 s carry ~2e-7 s of rounding): hypothesis found 0.01 stored as
    # 0.0100002, over the limit. The count below is of lags clearly on one side.
    assume(all(abs(lag - LAG_LIMIT_S) > 1e-6 for _, lag, _ in rows))
    frame = _requests([(s, s + lag, capped) for s, lag, capped in rows])
    stretches = lagging_stretches(frame, clock_offset_s=EPOCH)
    lagging = lagging_intervals(frame)
    assert len(lagging) == sum(1 for _, lag, capped in rows if lag > LAG_LIMIT_S or capped)
    tolerance = 1e-6  # Unix seconds of 1.7e9 carry ~2e-7 s of rounding
    for start, end in lagging:
        start, end = start - EPOCH - MARGIN_S, end - EPOCH + MARGIN_S
        assert any(a <= start + tolerance and end - tolerance <= b for a, b in stretches)


def test_a_cell_s_requests_beside_its_steps_give_its_stretches(tmp_path):
    _requests([(2.0, 2.5, False)]).write_parquet(tmp_path / "requests.parquet")
    found = stretches_beside(tmp_path / "steps.parquet")
    assert found.source == tmp_path / "requests.parquet" and found.unplaced is None
    assert found.stretches == [pytest.approx((EPOCH + 2.0 - MARGIN_S, EPOCH + 2.5 + MARGIN_S))]


def test_a_calibration_s_client_rows_are_placed_on_the_engine_clock_by_its_epoch(tmp_path):
    # the engine's own request rows (no generator columns) and the client's beside them
    pl.DataFrame({"request_id": ["r0"], "scheduled_at": [2.0]}).write_parquet(
        tmp_path / "requests.parquet"
    )
    _requests([(2.0, 2.5, False)]).write_parquet(tmp_path / "client.parquet")
    (tmp_path / "run.json").write_text(json.dumps({"kind": "schedscope-calibrate"}))
    found = stretches_beside(tmp_path / "steps.parquet")
    # without the epoch recorded: said, not guessed
    assert found.stretches == [] and "does not record the engine's" in (found.unplaced or "")
    (tmp_path / "run.json").write_text(json.dumps({EPOCH_KEY: EPOCH}))
    found = stretches_beside(tmp_path / "steps.parquet")
    assert found.source == tmp_path / "client.parquet"
    assert found.stretches == [pytest.approx((2.0 - MARGIN_S, 2.5 + MARGIN_S))]


def test_steps_with_no_client_records_beside_them_have_no_stretches(tmp_path):
    found = stretches_beside(tmp_path / "steps.parquet")
    assert found.stretches == [] and found.source is None and found.unplaced is None
