"""A record row as Locust's request events (``fire_row``): what Locust counts of it.

A completed request is a ``TTFT``, a ``TPOT`` and an ``E2E`` request (named ``ttft
<class>`` ...); a request cut in flight by the end of the run is a ``CUT`` request
(``cut <class>``), not a failure; any other row is a failed ``E2E`` request whose
exception (``RequestFailure``) says its status, HTTP status and error.
"""

from __future__ import annotations

from harness.loadgen import clock

#: Locust's request type of a request cut in flight by the end of the run (not a failure).
CUT = "CUT"


class RequestFailure(Exception):
    """A request's failure as Locust shows it (status, HTTP status, message)."""


def fire_row(environment, row: dict, cut: bool = False) -> None:
    """Locust's events for one row; ``cut``: killed in flight by the end of the run,
    counted as a ``CUT`` request (not a failure)."""
    fire = environment.events.request.fire
    cls = row["class"]
    if row["status"] == "ok":
        context = {"request_id": row["request_id"]}
        if row["ttft_s"] is not None:
            fire(
                request_type="TTFT",
                name=f"ttft {cls}",
                response_time=row["ttft_s"] * 1e3,
                response_length=0,
                exception=None,
                context=context,
            )
        if row["tpot_s"] is not None:
            fire(
                request_type="TPOT",
                name=f"tpot {cls}",
                response_time=row["tpot_s"] * 1e3,
                response_length=0,
                exception=None,
                context=context,
            )
        fire(
            request_type="E2E",
            name=f"e2e {cls}",
            response_time=(row["e2e_s"] or 0.0) * 1e3,
            response_length=row["output_tokens"] or 0,
            exception=None,
            context=context,
        )
    elif cut:
        fire(
            request_type=CUT,
            name=f"cut {cls}",
            response_time=max(0.0, clock.unix_now() - row["scheduled_at"]) * 1e3,
            response_length=0,
            exception=None,
            context={"request_id": row["request_id"]},
        )
    else:
        elapsed = max(0.0, clock.unix_now() - row["scheduled_at"]) * 1e3
        http = f" {row['http_status']}" if row["http_status"] else ""
        fire(
            request_type="E2E",
            name=f"e2e {cls}",
            response_time=elapsed,
            response_length=0,
            exception=RequestFailure(f"{row['status']}{http}: {row['error']}"),
            context={"request_id": row["request_id"]},
        )
