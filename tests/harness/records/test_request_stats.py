"""Whether a request met its class's SLOs (harness/records/request_stats.py,
``slo_met_expr``): the one definition the report's SLO met %, the gate's ``slo_met``,
summary.json's goodput and tune's goodput objective read."""

from __future__ import annotations

import polars as pl

from harness.records.request_stats import slo_met_expr

SLOS = {"a": {"ttft_s": 1.0, "tpot_s": 0.1, "e2e_s": 5.0}}


def _met(rows: dict, slos: dict = SLOS) -> list[bool]:
    frame = pl.DataFrame(rows, schema_overrides={"output_tokens": pl.Int64})
    return frame.select(slo_met_expr(frame.columns, slos)).to_series().to_list()


def test_an_ok_request_with_no_measured_latency_meets_no_target_on_it():
    """A stream that ends with [DONE] and no text token is ``ok`` with ``ttft_s`` and
    ``e2e_s`` null (harness/loadgen/client.py): nothing was measured, so it cannot be
    within a target; it used to meet every SLO."""
    rows = {
        "class": ["a", "a", "a", "a"],
        "status": ["ok", "ok", "ok", "ok"],
        "ttft_s": [None, 0.5, None, 0.5],
        "tpot_s": [None, 0.01, 0.01, 0.01],
        "e2e_s": [None, None, 2.0, 2.0],
        "output_tokens": [0, 5, 5, 5],
    }
    assert _met(rows) == [False, False, False, True]
    # a target the class does not set is no constraint, measured or not
    assert _met(rows, {"a": {"tpot_s": 0.1}}) == [True, True, True, True]
    # per-row SLO columns are read the same way
    per_row = {**rows, "slo_ttft_s": [1.0] * 4, "slo_e2e_s": [5.0] * 4}
    assert _met(per_row, {}) == [False, False, False, True]


def test_a_missing_tpot_passes_only_where_tpot_does_not_exist():
    """TPOT is undefined for a request of one output token or none: its missing value
    passes. A request of several tokens with no TPOT measured fails the target."""
    rows = {
        "class": ["a", "a", "a", "a", "a"],
        "status": ["ok", "ok", "ok", "ok", "ok"],
        "ttft_s": [0.5] * 5,
        "tpot_s": [None, None, None, None, 0.05],
        "e2e_s": [2.0] * 5,
        "output_tokens": [1, 0, 8, None, 8],
    }
    assert _met(rows) == [True, True, False, False, True]
    # without the output count, a missing TPOT cannot be told undefined: it fails
    no_count = {k: v for k, v in rows.items() if k != "output_tokens"}
    assert _met(no_count) == [False, False, False, False, True]
