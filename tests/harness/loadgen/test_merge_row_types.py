"""The merge reads a records file whose rows hold values of the wrong type: each such
value is null, its row an ``error`` naming the field, the other rows untouched (a
string in an integer column had failed the whole cell's merge)."""

from __future__ import annotations

import json

import polars as pl

from harness.loadgen.merge import merge_records
from tests.support.record_rows import record_row


def good_row(request_id: str, scheduled_at: float) -> dict:
    return record_row(request_id, scheduled_at=scheduled_at, sent_at=scheduled_at)


def test_rows_with_values_of_the_wrong_type_merge_as_error_rows(tmp_path):
    rows = [good_row(f"r{i}", 100.0 + i) for i in range(7)]
    rows[1]["server_prompt_tokens"] = "lots"
    rows[2]["output_tokens"] = 10**30  # beyond Int64
    rows[3]["error"] = "boom \ud800"  # a lone surrogate: no UTF-8 column holds it
    rows[3]["status"] = "error"
    rows[4]["itl_s"] = [0.01, "x"]
    rows[5]["in_flight_capped"] = 1
    rows[6]["output_tokens"] = 1.5  # Polars would have made it 1
    with open(tmp_path / "client-0-1.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    summary = merge_records(tmp_path)
    frame = pl.read_parquet(tmp_path / "requests.parquet")
    assert summary["rows"] == frame.height == 7
    got = {r["request_id"]: r for r in frame.iter_rows(named=True)}
    assert got["r0"]["status"] == "ok" and got["r0"]["error"] is None
    assert got["r1"]["status"] == "error" and got["r1"]["server_prompt_tokens"] is None
    assert got["r1"]["error"] == 'record field server_prompt_tokens held "lots": not its type'
    assert got["r2"]["output_tokens"] is None and "output_tokens" in got["r2"]["error"]
    assert got["r3"]["status"] == "error" and got["r3"]["error"] == "boom ?"
    assert got["r4"]["itl_s"] is None and "itl_s" in got["r4"]["error"]
    assert got["r5"]["in_flight_capped"] is None and "in_flight_capped" in got["r5"]["error"]
    assert got["r6"]["output_tokens"] is None and "output_tokens" in got["r6"]["error"]
    assert summary["status_counts"] == {"ok": 1, "error": 6}
