"""Raw per-request rows, one JSON-lines file per process, and its summary.

Locust's own statistics round response times to two significant digits; these rows
are the record. Each process writes ``<dir>/client-<worker>-<pid>.jsonl``, one row per
scheduled request, flushed as it is written (a crash loses nothing already finished),
and ``<dir>/summary-<worker>-<pid>.json`` when its share is done or the run stops.
``harness.loadgen.merge`` turns a directory of them into ``requests.parquet``.
Stdlib only (safe under gevent).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.records.percentiles import percentile
from harness.records.send_lag import LAG_LIMIT_S

#: The row's keys, in order, with their kinds (docs/loadgen.md describes each; times are
#: Unix seconds): ``str``, ``int``, ``float``, ``bool`` or ``floats`` (a list of floats).
#: The merge's schema (merge.SCHEMA), its per-row type check (row_types.py) and the
#: master's check of forwarded rows (intake.py) all read them from here.
RECORD_KINDS: dict[str, str] = {
    "request_id": "str",
    "run_id": "str",
    "profile": "str",
    "class": "str",
    "priority": "int",
    "phase": "int",
    "phase_kind": "str",
    "prompt_tokens": "int",
    "server_prompt_tokens": "int",
    "cached_tokens": "int",
    "prompt_method": "str",
    "output_tokens": "int",
    "max_tokens": "int",
    "status": "str",
    "http_status": "int",
    "error": "str",
    "finish_reason": "str",
    "schedule_offset_s": "float",
    "scheduled_at": "float",
    "sent_at": "float",
    "first_token_at": "float",
    "last_token_at": "float",
    "ttft_s": "float",
    "ttft_from_sent_s": "float",
    "tpot_s": "float",
    "e2e_s": "float",
    "e2e_from_sent_s": "float",
    "max_itl_s": "float",
    "itl_s": "floats",
    "send_lag_s": "float",
    "token_counting": "str",
    "worker": "int",
    "in_flight_capped": "bool",
    "retried": "bool",
    "cut_at": "float",
    "session_id": "str",
    "turn": "int",
}
RECORD_COLUMNS = tuple(RECORD_KINDS)
#: The ``phase_kind`` of rows sent at an instant the schedule (or a session) set, whose
#: send lag says whether the generator kept up: ``open`` and ``session`` (a closed loop's
#: rows are sent when the last one ended, whenever that is).
SCHEDULED_KINDS = ("open", "session")


class RecordWriter:
    """Appends rows to this process's file and keeps the counts its summary needs."""

    def __init__(self, directory: str | os.PathLike, worker: int, stem: str | None = None) -> None:
        """``stem``: the files' ``<worker>-<pid>`` (default: this process's); the master
        passes a worker's when it writes that worker's forwarded rows."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.worker = worker
        self.pid = os.getpid()
        stem = stem or f"{worker}-{self.pid}"
        self.path = self.directory / f"client-{stem}.jsonl"
        self.summary_path = self.directory / f"summary-{stem}.json"
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # line-buffered
        self.status_counts: dict[str, int] = {}
        self.open_lags: list[float] = []
        self.num_capped = 0
        self.num_retried = 0
        self.num_rows = 0

    def write(self, row: dict) -> None:
        self._file.write(json.dumps(row, separators=(",", ":")) + "\n")
        self.num_rows += 1
        self.status_counts[row["status"]] = self.status_counts.get(row["status"], 0) + 1
        if row["phase_kind"] in SCHEDULED_KINDS and row["send_lag_s"] is not None:
            self.open_lags.append(row["send_lag_s"])
        if row["in_flight_capped"]:
            self.num_capped += 1
        if row.get("retried"):
            self.num_retried += 1

    def lag_stats(self, limit_s: float = LAG_LIMIT_S) -> dict:
        p99 = percentile(self.open_lags, 99)
        return {
            "send_lag_p50_s": percentile(self.open_lags, 50),
            "send_lag_p99_s": p99,
            "send_lag_max_s": max(self.open_lags) if self.open_lags else None,
            "lag_limit_s": limit_s,
            "generator_limited": bool(p99 is not None and p99 > limit_s) or self.num_capped > 0,
            "in_flight_capped": self.num_capped,
        }

    def write_summary(self, summary: dict) -> None:
        tmp = self.summary_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.summary_path)

    def close(self) -> None:
        self._file.close()
