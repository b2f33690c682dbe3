"""The end of a run as the master (or the single process) prints it, from the summaries.

``report``: where the rows are, how many were cut in flight or not sent, a run in which
no request completed, and the exit code these give; ``warn_generator_limited``: the
``GENERATOR-LIMITED`` warning of a process whose send lag or in-flight cap makes its
latencies the generator's as much as the server's (docs/loadgen.md).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from harness.loadgen.request_events import CUT

log = logging.getLogger("schedscope.loadgen")


def warn_generator_limited(summaries: list[dict]) -> None:
    for s in summaries:
        if not s.get("generator_limited"):
            continue
        p99 = s.get("send_lag_p99_s")
        msg = (
            f"schedscope: GENERATOR-LIMITED (worker {s['worker']}): p99 send lag "
            f"{(p99 or 0) * 1e3:.1f} ms > {(s.get('lag_limit_s') or 0) * 1e3:.0f} ms, "
            f"{s.get('in_flight_capped', 0)} requests waited for --max-in-flight; latencies "
            f"include the generator's delay. Lower the rate or add --processes."
        )
        log.warning(msg)
        print(msg, file=sys.stderr, flush=True)


def report(
    done: dict[int, dict], workers: int, collected_in: Path | None, master: bool
) -> int | None:
    """The end-of-run lines of ``done`` (the processes' summaries by worker; ``workers``
    of them expected; ``collected_in``: the master's directory where its workers' rows
    came, None for one process; ``master``: the workers' generator-limited warnings are
    the master's to print). Returns the exit code the run must have: 1 when a process did
    not run its share or no request completed, None to leave Locust's."""
    if not done:
        return None
    exit_code = None
    rows = sum(s.get("rows", 0) for s in done.values())
    records = {s.get("options", {}).get("records_dir") for s in done.values()}
    if collected_in is not None:  # distributed: the workers' rows came to the master
        records = {str(collected_in)}
    print(
        f"schedscope: {rows} request rows from {len(done)} of {workers} "
        f"process(es) in {', '.join(sorted(r for r in records if r))}; merge with "
        f"`python -m harness.loadgen.merge DIR`",
        file=sys.stderr,
        flush=True,
    )
    cut = sum(s.get("cut_in_flight", 0) for s in done.values())
    unsent = sum(s.get("not_sent", 0) for s in done.values())
    if cut or unsent:
        failures = any(s.get("cut_is_failure") for s in done.values())
        how = "counted as failures: --grace ran out" if failures else f"Locust's {CUT} requests"
        print(
            f"schedscope: the run stopped before its schedule was answered: {cut} request(s) "
            f"cut in flight ({how}) and {unsent} scheduled request(s) not sent; their rows "
            f"have status aborted",
            file=sys.stderr,
            flush=True,
        )
    if any(s.get("error") for s in done.values()):
        exit_code = 1  # a process did not run its share
    ok = sum(s.get("status_counts", {}).get("ok", 0) for s in done.values())
    scheduled = sum(
        s.get("num_open_requests", 0) + s.get("num_closed_loops", 0) + s.get("num_sessions", 0)
        for s in done.values()
    )
    if scheduled and not ok:
        # Cut or unsent requests are not failures, but a run in which none completed
        # measured nothing: a hung or far too slow server must not pass as healthy.
        print(
            f"schedscope: no request completed before the run stopped ({rows} request "
            f"rows, {cut} cut in flight; the server answered none); exit code 1",
            file=sys.stderr,
            flush=True,
        )
        exit_code = 1
    if master:
        warn_generator_limited(list(done.values()))
    return exit_code
