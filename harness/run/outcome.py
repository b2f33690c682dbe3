"""What a cell's result means: one rule for a cell's status and the run's exit code.

A cell is ``failed`` when something kept it from measuring the load it asked for (an
infrastructure failure: a server that did not come up, Locust crashed or hung, a worker
that ran another schedule, fewer load-generator workers than expected, or **no request
completed**), ``degraded`` when it measured the load with failures that are not
infrastructure (failed requests, generator lag, a lost worker, requests cut in flight
when the run stopped), else ``ok``. The run
exits 1 on an infrastructure failure (a cell in which no request was even answered
included), else 3 when a cell's error rate exceeds ``--max-error-rate`` or a cell's
requests all failed (whatever the limit), else 0 (docs/run.md, "Exit codes").

:func:`judge_load` adds the failures that only the cell's rows and the load
generator's summary can show; every cell (served, ``--target``, simulated) goes
through it, so "no request completed" means the same everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class CellResult(Protocol):
    """What the rule reads of a cell's result (``harness.run.cell_result.CellResult``; named
    here by its shape, so the rule imports nothing of the cell that uses it)."""

    scheduled: int | None
    counts: dict
    failures: list[dict]
    infrastructure_failure: bool
    errors: dict | None

    def fail(
        self, kind: str, message: str, log_tail: str | None = None, infrastructure: bool = False
    ) -> None: ...


#: The run's exit codes (docs/run.md, "Exit codes").
OK_EXIT = 0
INFRASTRUCTURE_EXIT = 1
ERROR_RATE_EXIT = 3

#: The failure of a cell in which no scheduled request ended ``ok``.
NO_COMPLETED = "no_completed_requests"
#: The failure of a distributed cell that started with fewer workers than expected.
WORKER_SHORTFALL = "worker_shortfall"
#: The failure of a cell whose rows are fewer than its scheduled open-loop requests,
#: with no worker failure to account for them.
ROWS_MISSING = "rows_missing"
#: The failure (not infrastructure: the cell measured, with requests it could not wait
#: for) of a cell whose run ended with requests still in flight.
CUT_IN_FLIGHT = "cut_in_flight"
#: Failures that already count the rows their worker did not send.
_WORKER_FAILURES = ("worker_lost", "worker_failed", "worker_plan_mismatch", WORKER_SHORTFALL)


def judge_load(result: CellResult, loadgen: dict, open_rows: int | None) -> None:
    """Add to ``result`` the failures its counts and the load generator's summary show
    (``loadgen``: ``merge_records``' summary, {} when it could not be read;
    ``open_rows``: the cell's rows of open-loop requests, None when it has no rows)."""
    expected, started = loadgen.get("workers_expected"), loadgen.get("workers_started")
    if isinstance(expected, int) and isinstance(started, int) and started < expected:
        result.fail(
            WORKER_SHORTFALL,
            f"{started} of the {expected} expected load-generator workers started: the "
            "load sent was not the load asked for",
            infrastructure=True,
        )
    scheduled = result.scheduled or 0
    if not result.counts.get("ok"):
        counts = ", ".join(f"{k} {v}" for k, v in result.counts.items()) or "no rows"
        # Failures the server answered (errors, rejections) are a measurement of it: the
        # error-rate exit. Nothing answered at all (cut, unsent, no rows) is not: exit 1.
        answered = bool(result.errors and result.errors.get("failed"))
        result.fail(
            NO_COMPLETED,
            f"no request completed ({counts}; {scheduled} scheduled): the cell measured "
            + ("only failures" if answered else "nothing"),
            infrastructure=not answered,
        )
    cut = loadgen.get("cut_in_flight")
    if isinstance(cut, int) and cut > 0:
        result.fail(
            CUT_IN_FLIGHT,
            f"{cut} request(s) still in flight when the run stopped were cut: censored, not "
            "dropped (SLO misses; their TTFT and E2E at least the time they had waited, so the "
            "statistics they can move are lower bounds, '>='); a longer --grace or a lower "
            "--rate-scale measures them",
        )
    explained = any(f["kind"] in _WORKER_FAILURES for f in result.failures)
    if open_rows is not None and open_rows < scheduled and not explained:
        result.fail(
            ROWS_MISSING,
            f"{open_rows} rows for {scheduled} scheduled open-loop requests: "
            f"{scheduled - open_rows} have no record",
        )


def status(result: CellResult) -> str:
    """``failed``, ``degraded`` or ``ok`` (module docstring)."""
    if result.infrastructure_failure or _completed_nothing(result):
        return "failed"
    return "degraded" if result.failures else "ok"


def _completed_nothing(result: CellResult) -> bool:
    return any(f["kind"] == NO_COMPLETED for f in result.failures)


def run_status(results: Sequence[CellResult]) -> str:
    """The run's status: its worst cell's."""
    states = {status(r) for r in results}
    return next((s for s in ("failed", "degraded") if s in states), "ok")


def exit_code(results: Sequence[CellResult], over_error_rate: Sequence[CellResult]) -> int:
    """The run's exit code (module docstring)."""
    if any(r.infrastructure_failure for r in results):
        return INFRASTRUCTURE_EXIT
    if over_error_rate or any(_completed_nothing(r) for r in results):
        return ERROR_RATE_EXIT  # whatever --max-error-rate: a cell of failures only
    return OK_EXIT
