"""A load-generator record row as the client writes it (harness/loadgen/records.py):
every column, an ``ok`` request's values, for tests that build records by hand."""

from __future__ import annotations

from harness.loadgen.records import RECORD_COLUMNS


def record_row(request_id: str, **values) -> dict:
    """An ``ok`` row of ``request_id`` (worker 0, scheduled at 1000 s); ``values``
    replace any column's."""
    row = {c: None for c in RECORD_COLUMNS}
    row.update(
        request_id=request_id,
        run_id="run",
        profile="locust_small",
        **{"class": "short_chat"},
        priority=0,
        phase=0,
        phase_kind="open",
        prompt_tokens=8,
        server_prompt_tokens=8,
        max_tokens=4,
        output_tokens=4,
        status="ok",
        http_status=200,
        scheduled_at=1000.0,
        sent_at=1000.001,
        itl_s=[0.01, 0.02, 0.01],
        send_lag_s=0.001,
        token_counting="chunks",
        worker=0,
        in_flight_capped=False,
        retried=False,
    )
    row.update(values)
    return row
