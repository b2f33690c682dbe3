"""What the master accepts of a worker's forwarded rows and summary.

A worker's rows come over Locust's messages (``forward.py``) and become the cell's
records, so the master checks each one before it writes it (``forward.Collector``):

- it is a row of this run (its ``run_id``), with every column of
  ``records.RECORD_COLUMNS`` and nothing else, each of the type ``merge.SCHEMA`` reads
  (a row that would make the merge fail, or write a value polars cannot hold, is
  refused here, before it is written);
- its ``worker`` is the worker that sent it (which the master knows from the sender's
  connection, never from the message);
- its ``request_id`` belongs to that worker's share (``split.py``): an open-loop id of
  the plan whose index is the worker's modulo W, or a closed-loop id of the form the
  plan gives (``<profile>-<seed>-c<phase>-<k>``, ``k`` zero-padded to 7 digits) whose
  spec index ``k`` a loop of that worker sends (``k mod concurrency = j``, ``j mod W =
  worker``);

and the collector writes no request id twice. A refused row is counted (the worker's
``rows_refused``) and named in the master's log, never written.
"""

from __future__ import annotations

import math
import re

from harness.loadgen.records import RECORD_COLUMNS, RECORD_KINDS
from harness.loadgen.row_types import fits
from harness.loadgen.target_values import is_number
from harness.profiles import Plan

#: Each column's kind (records.RECORD_KINDS, which merge.SCHEMA is made from).
COLUMN_KINDS = RECORD_KINDS

#: Columns a row always has a value in (the writer and the merge read them).
NOT_NULL = frozenset({"request_id", "run_id", "class", "phase_kind", "status", "worker"})


def _of_kind(value: object, kind: str) -> bool:
    """Of ``kind`` as it is (no conversion the merge would make), and every number
    finite: a forwarded row is refused, not repaired."""
    if not fits(value, kind):
        return False
    if kind == "float":
        return _finite(value)
    # fits: a floats value is a list
    return kind != "floats" or (isinstance(value, list) and all(_finite(v) for v in value))


def _finite(v: object) -> bool:
    return is_number(v) and math.isfinite(v) and abs(v) < 1e300


def row_problem(row: object) -> str | None:
    """Why ``row`` is not a record row the merge can read (None: it is one)."""
    if not isinstance(row, dict):
        return f"not a mapping ({type(row).__name__})"
    keys = set(row)
    if keys != set(RECORD_COLUMNS):
        missing = sorted(set(RECORD_COLUMNS) - keys)
        extra = sorted(map(str, keys - set(RECORD_COLUMNS)))
        return f"columns missing {missing[:5]}, unknown {extra[:5]}"
    for column, kind in COLUMN_KINDS.items():
        value = row[column]
        if value is None:
            if column in NOT_NULL:
                return f"{column} is null"
        elif not _of_kind(value, kind):
            return f"{column} is not a {kind}: {value!r:.60}"
    return None


class Intake:
    """The master's check of one worker's rows: this run's, well-formed, of its share.
    ``plan``: the master's (None: it could not build one, and accepts no row)."""

    def __init__(self, run_id: str, plan: Plan | None, workers: int) -> None:
        self.run_id = run_id
        self.workers = max(1, workers)
        self.plan = plan
        #: open-loop request id (or a session's turn's) -> its worker
        self._open: dict[str, int] = {}
        self._closed: dict[str, tuple[int, int]] = {}  # id prefix -> (phase, concurrency)
        if plan is None:
            return
        for spec in plan.open_loop_requests():
            self._open[spec.request_id] = spec.index % self.workers
        for session in plan.sessions():  # a session is one worker's, whole (split.share)
            for turn in session.turns:
                self._open[turn.request_id] = session.index % self.workers
        for p in plan.phases:
            if p.concurrency is not None:  # a closed phase
                self._closed[f"{plan.profile.name}-{plan.seed}-c{p.index}-"] = (
                    p.index,
                    p.concurrency,
                )

    def owner(self, request_id: str) -> int | None:
        """The worker whose share holds ``request_id`` (None: no request of the plan)."""
        if request_id in self._open:
            return self._open[request_id]
        prefix, _, digits = request_id.rpartition("-")
        known = self._closed.get(prefix + "-")
        if known is None or not re.fullmatch(r"[0-9]{7,}", digits):
            return None
        k = int(digits)
        if f"{k:07d}" != digits:  # the plan's own spelling only (no extra leading zeros)
            return None
        _phase, concurrency = known
        return (k % concurrency) % self.workers

    def problem(self, row: object, worker: int) -> str | None:
        """Why the master refuses ``row`` from ``worker`` (None: it accepts it); a
        request id already received is the collector's to check."""
        bad = row_problem(row)
        if bad is not None:
            return bad
        assert isinstance(row, dict)
        if row["run_id"] != self.run_id:
            return f"run_id {row['run_id']!r:.60} is not this run's ({self.run_id})"
        if row["worker"] != worker:
            return f"it says worker {row['worker']}, and worker {worker} sent it"
        if self.plan is None:
            return "the master has no plan to check it against"
        owner = self.owner(row["request_id"])
        if owner is None:
            return f"request id {row['request_id']!r:.60} is not one of the plan's"
        if owner != worker:
            return f"request {row['request_id']} is worker {owner}'s, not {worker}'s"
        return None


#: A worker summary's keys the master reads, and their kinds (None allowed for each).
SUMMARY_KINDS: dict[str, tuple[type, ...]] = {
    "run_id": (str,),
    "pid": (int,),
    "error": (str,),
    "rows": (int,),
    "status_counts": (dict,),
    "num_open_requests": (int,),
    "num_closed_loops": (int,),
    "num_sessions": (int,),
    "cut_in_flight": (int,),
    "not_sent": (int,),
    "turns_after_failure": (int,),
    "options": (dict,),
    "run_start_unix": (int, float),
    "run_end_unix": (int, float),
    "stopped_sending_unix": (int, float),
    "send_lag_p99_s": (int, float),
    "lag_limit_s": (int, float),
    "in_flight_capped": (int,),
}


def summary_problem(summary: object, run_id: str) -> str | None:
    """Why the master refuses a worker's summary (None: it accepts it): not a mapping,
    another run's, a ``pid`` that is not a positive int, a key the master reads of
    another type."""
    if not isinstance(summary, dict):
        return f"not a mapping ({type(summary).__name__})"
    if summary.get("run_id") != run_id:
        return f"run_id {summary.get('run_id')!r:.60} is not this run's ({run_id})"
    pid = summary.get("pid")
    if type(pid) is not int or not 0 < pid < 2**32:
        return f"pid {pid!r:.30} is not a process id"
    for key, kinds in SUMMARY_KINDS.items():
        value = summary.get(key)
        if value is None:
            continue
        if type(value) is bool or not isinstance(value, kinds):
            return f"{key} is a {type(value).__name__}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{key} is not finite"
    counts = summary.get("status_counts") or {}
    if not all(type(k) is str and type(v) is int for k, v in counts.items()):
        return "status_counts is not a mapping of status to count"
    return None
