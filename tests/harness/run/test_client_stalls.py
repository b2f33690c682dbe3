"""An external target's stalls from its client's token times (harness/run/client_stalls.py):
the gaps above the served threshold, where they began, and how the report names them."""

from __future__ import annotations

import math
from itertools import accumulate

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.records.requests import STALL_TYPE
from harness.report import stalls as report_stalls
from harness.report.inputs import PolicyData
from harness.report.stall_causes import CLIENT_TOKEN_TIMES, EXTERNAL_UNKNOWN
from harness.run.client_stalls import token_gaps, with_client_stalls
from harness.run.collect import SERVED_STALL_THRESHOLD_S

GAPS = st.lists(
    st.floats(min_value=0.0, max_value=10.0, allow_nan=False, allow_infinity=False), max_size=40
)
FIRST = st.floats(min_value=1.7e9, max_value=1.8e9, allow_nan=False)


@given(first=FIRST, itl=GAPS)
def test_client_stalls_are_the_itl_gaps_above_the_threshold_from_cumulative_sums(first, itl):
    frame = pl.DataFrame(
        {"request_id": ["r"], "first_token_at": [first], "itl_s": [itl]},
        schema={
            "request_id": pl.String,
            "first_token_at": pl.Float64,
            "itl_s": pl.List(pl.Float64),
        },
    )
    row = with_client_stalls(frame, SERVED_STALL_THRESHOLD_S).row(0, named=True)
    starts = list(accumulate(itl, initial=first))  # token i's arrival: gap i's start
    expected = [
        {"start_s": starts[i], "duration_s": gap}
        for i, gap in enumerate(itl)
        if gap > SERVED_STALL_THRESHOLD_S
    ]
    assert row["stalls"] == expected
    assert row["num_stalls"] == len(expected)
    assert row["stall_s"] == pytest.approx(math.fsum(s["duration_s"] for s in expected))


def test_the_threshold_is_the_served_rule_and_a_stall_starts_at_the_earlier_token():
    # 250 ms exactly is not a stall (the records keep gaps above it); 251 ms is.
    assert token_gaps(100.0, [0.1, 0.25, 0.251, 2.0]) == [
        (100.0, 0.1),
        (100.1, 0.25),
        (pytest.approx(100.35), 0.251),
        (pytest.approx(100.601), 2.0),
    ]
    frame = pl.DataFrame(
        {
            "request_id": ["a", "b", "c"],
            "first_token_at": [100.0, None, 50.0],
            "itl_s": [[0.1, 0.25, 0.251, 2.0], None, []],
        }
    )
    out = with_client_stalls(frame, SERVED_STALL_THRESHOLD_S)
    assert out.schema["stalls"] == pl.List(STALL_TYPE)
    assert out["num_stalls"].to_list() == [2, 0, 0]
    assert out["stall_s"].to_list() == [pytest.approx(2.251), 0.0, 0.0]
    assert [s["duration_s"] for s in out["stalls"][0]] == [0.251, 2.0]


def test_the_report_names_an_external_engine_s_stalls_unknown_and_looks_for_no_evidence():
    requests = with_client_stalls(
        pl.DataFrame({"request_id": ["r0"], "first_token_at": [10.0], "itl_s": [[0.01, 3.0]]}),
        SERVED_STALL_THRESHOLD_S,
    )
    # a swap preemption in the gap: swapped_out in a bundled engine's cell
    decisions = pl.DataFrame(
        {"kind": ["preempt"], "request_id": ["r0"], "time": [11.0], "mode": ["swap"]}
    )
    classes = pl.DataFrame({"request_id": ["r0"], "class": ["a"]})
    for source, cause in ((CLIENT_TOKEN_TIMES, EXTERNAL_UNKNOWN), (None, "swapped_out")):
        data = PolicyData(
            run="run",
            policy="target",
            path=None,
            requests=requests.lazy(),
            decisions=decisions.lazy(),
            stall_source=source,
        )
        out, sources = report_stalls.attribute(data, classes, SERVED_STALL_THRESHOLD_S)
        assert out["cause"].to_list() == [cause]
        assert out["start_s"].to_list() == [pytest.approx(10.01)]
        assert (sources == {"stalls": CLIENT_TOKEN_TIMES}) == (source is not None)
