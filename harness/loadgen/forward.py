"""Records sent to the master over Locust's worker -> master messages.

Distributed, each worker writes its rows to its own machine (``<its --records-dir>/
worker-<index>-<pid>/client-*.jsonl``, a local copy on its own clock) and sends them in
batches (``schedscope_rows``: at most :data:`BATCH_ROWS` rows, at least every
:data:`FLUSH_S` s) to the master, which writes them, shifted onto its own clock
(``harness.loadgen.clock``), into its ``--records-dir`` as
``client-<index>-<pid>.jsonl``; the worker's summary (``schedscope_done``, sent after
its last batch: one worker's messages arrive in order) becomes
``summary-<index>-<pid>.json`` there. So the master's records directory is the whole run
with no shared filesystem, and ``harness.loadgen.merge`` reads it as it reads a
one-process directory.

The master trusts none of it blindly (``intake.py``): the worker a batch is from is the
sender's connection, and a row that is not this run's, not of the form the merge reads,
not of that worker's share or received already is refused and counted
(``rows_refused`` in the worker's summary).

A worker that never sent its summary (killed, lost) gets ``lost-<index>.json`` from the
master: its scheduled open-loop requests with no row (``missing_open``, their ids) and
its closed loops (whose requests are not known in advance).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import gevent

from harness.loadgen.clock import to_master_clock
from harness.loadgen.intake import Intake, summary_problem
from harness.loadgen.records import RecordWriter

log = logging.getLogger("schedscope.loadgen")

ROWS_MESSAGE = "schedscope_rows"
BATCH_ROWS = 200
FLUSH_S = 0.5


class ForwardingWriter(RecordWriter):
    """A worker's writer: the local file as always, and batches to the master."""

    def __init__(self, directory, worker: int, send) -> None:
        super().__init__(directory, worker)
        self._send = send  # runner.send_message
        self._batch: list[dict] = []
        self._flusher = gevent.spawn(self._flush_every)

    def write(self, row: dict) -> None:
        super().write(row)
        self._batch.append(row)
        if len(self._batch) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self._batch:
            batch, self._batch = self._batch, []
            self._send(ROWS_MESSAGE, {"worker": self.worker, "pid": self.pid, "rows": batch})

    def _flush_every(self) -> None:
        while True:
            gevent.sleep(FLUSH_S)
            self.flush()

    def close(self) -> None:
        self._flusher.kill(block=False)
        self.flush()
        super().close()


class Collector:
    """The master's side: each worker's rows and summary into ``directory``, on the
    master's clock (``offsets``: worker index -> the clock estimate, ``clock.best``).

    ``worker`` is always the index the master gave the sender's connection (never a
    number in the message). Only rows ``intake`` accepts are written (this run's,
    well-formed, of that worker's share), and no request id twice; the others are
    counted per worker (``refused``, the summary's ``rows_refused``) and logged."""

    def __init__(
        self,
        directory: str | Path,
        offsets: dict[int, dict],
        intake: Intake,
        warn=log.warning,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.offsets = offsets
        self.intake = intake
        self._warn = warn
        self._writers: dict[tuple[int, int], RecordWriter] = {}
        self.received: dict[int, set[str]] = {}
        self._ids: set[str] = set()  # every request id written, whichever worker sent it
        self.refused: dict[int, int] = {}  # worker -> rows refused

    def offset(self, worker: int) -> float:
        return self.offsets.get(worker, {}).get("offset_s", 0.0)

    def _refuse(self, worker: int, count: int, why: str) -> None:
        self.refused[worker] = self.refused.get(worker, 0) + count
        self._warn(
            "schedscope: refused %d row(s) from worker %d: %s (%d refused so far)",
            count,
            worker,
            why,
            self.refused[worker],
        )

    def add_rows(self, worker: int, data: object) -> int:
        """Write the rows of one ``schedscope_rows`` batch from ``worker``; returns how
        many were refused."""
        rows = data.get("rows") if isinstance(data, dict) else None
        pid = data.get("pid") if isinstance(data, dict) else None
        if not isinstance(rows, list) or type(pid) is not int or not 0 < pid < 2**32:
            self._refuse(worker, 1, f"a batch that is not {{pid, rows}}: {data!r:.80}")
            return 1
        refused = 0
        seen = self.received.setdefault(worker, set())
        shift = self.offset(worker)
        w = None
        for row in rows:
            why = self.intake.problem(row, worker)
            if why is None and row["request_id"] in self._ids:
                why = f"request {row['request_id']} was received already"
            if why is not None:
                refused += 1
                if refused <= 3:  # a few reasons per batch; the count says the rest
                    self._refuse(worker, 1, why)
                else:
                    self.refused[worker] = self.refused.get(worker, 0) + 1
                continue
            if w is None:
                w = self._writer(worker, pid)
            w.write(to_master_clock(row, shift))
            seen.add(row["request_id"])
            self._ids.add(row["request_id"])
        return refused

    def _writer(self, worker: int, pid: int) -> RecordWriter:
        w = self._writers.get((worker, pid))
        if w is None:
            w = self._writers[worker, pid] = RecordWriter(
                self.directory, worker, stem=f"{worker}-{pid}"
            )
        return w

    def add_summary(self, worker: int, summary: object) -> dict | None:
        """The worker's summary with its clock estimate, instants on the master's clock,
        ``worker`` the sender's index and ``rows_refused``; None (refused, logged) for
        one that is not this run's or not of the form a worker sends
        (``intake.summary_problem``)."""
        why = summary_problem(summary, self.intake.run_id)
        if why is not None:
            self._warn("schedscope: refused a summary from worker %d: %s", worker, why)
            return None
        assert isinstance(summary, dict)
        s = dict(summary)
        s["worker"] = worker
        shift = self.offset(worker)
        for key in ("run_start_unix", "run_end_unix", "stopped_sending_unix"):
            if s.get(key) is not None:
                s[key] = s[key] - shift
        est = self.offsets.get(worker, {})
        pid = s["pid"]
        s.update(
            clock_offset_s=est.get("offset_s"),
            clock_uncertainty_s=est.get("uncertainty_s"),
            records_file=f"client-{worker}-{pid}.jsonl",
            forwarded=True,
            rows_refused=self.refused.get(worker, 0),
        )
        w = self._writers.get((worker, pid))
        if w is not None:
            w.close()
        path = self.directory / f"summary-{worker}-{pid}.json"
        path.write_text(json.dumps(s, indent=2, sort_keys=True) + "\n")
        return s

    def add_lost(self, run_id: str, worker: int, open_ids: list[str], closed_loops: int) -> dict:
        """``lost-<worker>.json``: the worker's scheduled open-loop requests with no row."""
        seen = self.received.get(worker, set())
        missing = [i for i in open_ids if i not in seen]
        lost = {
            "run_id": run_id,
            "worker": worker,
            "lost": True,
            "rows_received": len(seen),
            "rows_refused": self.refused.get(worker, 0),
            "num_open_requests": len(open_ids),
            "missing_open": len(missing),
            "missing_request_ids": missing,
            "num_closed_loops": closed_loops,
            "clock_offset_s": self.offsets.get(worker, {}).get("offset_s"),
            "clock_uncertainty_s": self.offsets.get(worker, {}).get("uncertainty_s"),
        }
        (self.directory / f"lost-{worker}.json").write_text(
            json.dumps(lost, indent=2, sort_keys=True) + "\n"
        )
        return lost

    def close(self) -> None:
        for w in self._writers.values():
            w.close()  # closing a closed file does nothing
