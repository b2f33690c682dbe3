"""The master's side of a distributed run: its workers, their start, what it takes from them.

At Locust's init the master installs its guard (``master_guard``: every message's sender
is its connection, and only the workers it numbered are heard) and registers its
handlers. At the start (``MasterSide.start``) it numbers the ready workers 0..W-1 (with
a worker token, those that presented it: ``master_guard``), builds its plan, measures
each worker's clock (``clock_probes``) and sends each a ``schedscope_split``: its index,
W, the options but the secrets, the host without credentials, a common start instant on
the worker's own clock and its plan's facts (``plan_check``). During the run it takes
each worker's rows (``schedscope_rows``: ``forward.Collector``) and its summary
(``schedscope_done``; a worker that did not run its share fails the run, by name); at
the stopping it passes the stop on (``schedscope_stop``); at the stop it waits for the
summaries of the workers still connected, reports those lost and what it refused, and
writes ``workers.json`` (from its first connection on: ``merge.py`` reads it).
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
from pathlib import Path
from typing import cast

import gevent
from locust.runners import STATE_MISSING

from harness.loadgen import clock
from harness.loadgen.clock_probes import ClockProbes
from harness.loadgen.forward import ROWS_MESSAGE, Collector
from harness.loadgen.intake import Intake, summary_problem
from harness.loadgen.master_guard import TOKEN_ENV, MasterGuard
from harness.loadgen.options import LoadgenOptions
from harness.loadgen.plan_check import failure_message, plan_facts, worker_failure
from harness.loadgen.process_run import plan_of
from harness.loadgen.split import share
from harness.profiles import Plan
from harness.records.redact import strip_credentials

log = logging.getLogger("schedscope.loadgen")

#: Seconds between the master's start message and the common start instant.
DISTRIBUTED_LEAD_S = 1.5
#: The master's record of its workers (expected, connected, started, refused), in its
#: --records-dir; ``merge.py`` reads it into the summary.
WORKERS_FILE = "workers.json"


class MasterSide:
    """The master's workers, its run's facts and its handlers of their messages."""

    def __init__(self, environment, guard: MasterGuard, done: dict[int, dict]) -> None:
        self.environment = environment
        self.guard = guard  # what reaches its port
        #: The summaries by worker index: the state's own dict, which reports them (it
        #: is cleared, never replaced, at each start).
        self.done = done
        self.expected: int | None = None  # the workers it was told to wait for
        self.connected: set[str] = set()  # clients that registered
        self.excluded: list[str] = []  # connected, not numbered (no token)
        self.started = False  # the test started and its workers were numbered
        self.workers = 0  # the workers numbered at the start
        self.clients: dict[int, str] = {}  # its workers: index -> client id
        self.worker_of: dict[str, int] = {}  # client id -> worker index
        self.probes = ClockProbes()  # the clock probes of the start
        self.collector: Collector | None = None  # the workers' rows
        self.offsets: dict[int, dict] = {}  # worker -> clock.best()
        self.plan: Plan | None = None  # its plan (the one its workers must build)
        self.lost: dict[int, dict] = {}
        self.options: LoadgenOptions | None = None
        self.run_id: str | None = None

    # -- Locust's init, the start, the stopping and the stop -------------------------------
    def listen(self, runner) -> None:
        """At Locust's init, the guard installed: the master's handlers and listeners."""
        runner.register_message("schedscope_done", self._on_done_message)
        runner.register_message(ROWS_MESSAGE, self._on_rows_message)
        runner.register_message("schedscope_pong", self._on_pong_message)
        self.environment.events.worker_connect.add_listener(self._on_worker_connect)
        parsed = self.environment.parsed_options
        # --processes N sets it to N; Locust's default without --expect-workers is 1
        self.expected = getattr(parsed, "expect_workers", None)
        self._write_workers()
        # Locust may give up waiting for its workers and exit before any test starts
        atexit.register(self._write_workers)

    def start(self, runner, profile, options: LoadgenOptions, run_id: str) -> float:
        """At the test's start: number the workers, measure their clocks and send each
        its share; returns the common start instant (on the master's clock)."""
        self.lost = {}
        clients = self._number_workers(runner)
        self.options = options
        self.run_id = run_id
        facts = None  # each worker checks its own plan against the master's facts
        try:
            self.plan = plan_of(profile, options)
            facts = plan_facts(self.plan)
        except Exception:  # noqa: BLE001 - the workers fail alike, and say why
            log.exception("schedscope: the master could not build the plan")
            self.plan = None
        self.offsets = self.probes.estimate(runner, self.clients)
        self.collector = Collector(
            options.records_dir, self.offsets, Intake(run_id, self.plan, self.workers)
        )
        self._write_workers()
        start = clock.unix_now() + DISTRIBUTED_LEAD_S
        for i, c in enumerate(clients):
            runner.send_message(
                "schedscope_split",
                {
                    "index": i,
                    "count": self.workers,
                    # the common start instant on the worker's own clock
                    "start_at": start + self.offsets.get(i, {}).get("offset_s", 0.0),
                    "run_id": run_id,
                    # never a secret: each worker has its own API key (options.py)
                    "options": options.shareable(),
                    "api_key_set": bool(options.api_key),
                    # a URL's credentials never travel: a worker has its own
                    "host": strip_credentials(self.environment.host or ""),
                    "plan": facts,
                },
                client_id=c.id,
            )
        log.info("schedscope: split the schedule between %d workers", self.workers)
        return start

    def stop_workers(self, runner, cut_is_failure: bool, stop_timeout) -> None:
        """At the test's stopping: the workers whose summary has not come stop too."""
        if self.workers and len(self.done) < self.workers:
            runner.send_message(
                "schedscope_stop",
                {"cut_is_failure": cut_is_failure, "stop_timeout": stop_timeout},
            )

    def finish(self, runner, timeout_s: float) -> None:
        """At the test's stop: the workers' summaries (waited for, or the workers
        reported lost), the rows closed, ``workers.json``, what was refused."""
        self._wait_for_workers(runner, timeout_s)
        if self.collector is not None:
            self.collector.close()
        self._write_workers()
        self._report_refused()
        self.guard.unlock()  # a later run (Locust's web UI) numbers workers anew

    # -- the workers ------------------------------------------------------------------
    def _number_workers(self, runner) -> list:
        """The master, at the start: number the connected workers 0..W-1 in Locust's
        worker-index order (with a worker token, those that presented it), and say so
        when fewer than it was told to expect came (exit code 1)."""
        active = sorted(
            runner.clients.ready + runner.clients.running + runner.clients.spawning,
            key=lambda c: runner.get_worker_index(c.id),
        )
        self.guard.wait_for_hellos([c.id for c in active])
        clients = [c for c in active if self.guard.trusted(c.id)]
        self.excluded = [c.id for c in active if not self.guard.trusted(c.id)]
        for cid in self.excluded:
            msg = (
                f"schedscope: client {cid} did not present the worker token (${TOKEN_ENV}): "
                "it gets no share of the schedule"
            )
            log.warning(msg)
            print(msg, file=sys.stderr, flush=True)
        self.workers = len(clients)
        self.clients = {i: c.id for i, c in enumerate(clients)}
        self.worker_of = {c.id: i for i, c in enumerate(clients)}
        self.guard.lock(list(self.worker_of))
        self.started = True
        if self.expected is not None and self.workers < self.expected:
            msg = (
                f"schedscope: WORKERS MISSING: {self.workers} of the {self.expected} expected "
                f"load-generator workers started"
                + (
                    f" ({len(self.excluded)} came without the worker token)"
                    if self.excluded
                    else ""
                )
                + "; the schedule is split between those that did; exit code 1"
            )
            log.error(msg)
            print(msg, file=sys.stderr, flush=True)
            self.environment.process_exit_code = 1
        return clients

    def _on_worker_connect(self, client_id, **_kw) -> None:
        self.connected.add(client_id)
        self._write_workers()

    def _write_workers(self) -> None:
        """The master: workers.json in its --records-dir (the merge puts ``expected`` and
        ``started`` into the run's summary: ``workers_expected``, ``workers_started``)."""
        parsed = self.environment.parsed_options
        directory = self.options.records_dir if self.options else None
        directory = directory or getattr(parsed, "records_dir", None)
        if not directory:
            return
        facts = {
            "run_id": self.run_id,
            "expected": self.expected,
            "connected": len(self.connected),
            "started": self.workers if self.started else 0,
            "clients": {str(i): cid for i, cid in self.clients.items()},
            "excluded_clients": self.excluded,
            "rows_refused": sum(self.collector.refused.values()) if self.collector else 0,
            **self.guard.facts(),
        }
        try:
            path = Path(directory) / WORKERS_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
            tmp.replace(path)
        except OSError as e:  # a record of the run, not the run: say so and go on
            log.warning("schedscope: could not write %s: %s", WORKERS_FILE, e)

    def _sender(self, msg) -> int | None:
        """The master: the worker index of a message's sender (the guard made
        ``msg.node_id`` its connection's identity); None, counted and logged, for a
        client that is not one of the workers numbered at the start."""
        i = self.worker_of.get(msg.node_id)
        if i is None:
            self.guard.refuse(msg.node_id, f"a {msg.type} message (not a worker of this run)")
        return i

    # -- the workers' messages --------------------------------------------------------
    def _on_done_message(self, environment, msg, **_kw) -> None:
        i = self._sender(msg)
        if i is None or self.collector is None:
            return
        if i in self.done:
            self.guard.refuse(msg.node_id, f"a second summary of worker {i}")
            return
        why = summary_problem(msg.data, cast(str, self.run_id))  # set at the start
        if why is not None:
            self.guard.refuse(msg.node_id, f"a summary of worker {i} ({why})")
            return
        summary = {**msg.data, "worker": i}
        if summary.get("error"):
            summary = self._worker_failed(summary)
        added = self.collector.add_summary(i, summary)
        if added is not None:
            self.done[i] = added

    def _worker_failed(self, summary: dict) -> dict:
        """The master: a worker that did not run its share (its plan was not the
        master's, or its run could not start) fails the run, at once and by name."""
        i = int(summary["worker"])
        failure = {**summary, "client_id": self.clients.get(i)}
        if self.plan is not None:  # what of its share has no row
            mine = share(self.plan, i, self.workers)
            failure = worker_failure(
                failure,
                mine.scheduled_ids,
                self.collector.received.get(i, set()) if self.collector else set(),
                len(mine.closed_loops),
            )
        msg = f"schedscope: WORKER FAILED: {failure_message(failure)}"
        log.error(msg)
        print(msg, file=sys.stderr, flush=True)
        self.environment.process_exit_code = 1
        return failure

    def _on_rows_message(self, environment, msg, **_kw) -> None:
        i = self._sender(msg)
        if i is not None and self.collector is not None:
            self.collector.add_rows(i, msg.data)

    def _on_pong_message(self, environment, msg, **_kw) -> None:
        t3 = clock.unix_now()
        i = self._sender(msg)
        if i is None:
            return
        try:
            self.probes.add_pong(i, msg.data, t3)
        except clock.BadProbe as e:
            self.guard.refuse(msg.node_id, f"a clock probe of worker {i}: {e}")

    # -- the end of the run -----------------------------------------------------------
    def _wait_for_workers(self, runner, timeout_s: float) -> None:
        """The master: wait for the summaries of the workers still connected (each has
        ``--stop-timeout`` to let its requests finish after the schedscope_stop message)."""
        deadline = clock.unix_now() + timeout_s
        while clock.unix_now() < deadline and self.waiting_for(runner):
            gevent.sleep(0.1)
        self._report_lost()

    def waiting_for(self, runner) -> list[int]:
        """The master: the workers still connected whose summary has not come."""
        nodes = {i: runner.clients.get(cid) for i, cid in self.clients.items()}
        return [
            i
            for i, node in nodes.items()
            if i not in self.done and node is not None and node.state != STATE_MISSING
        ]

    def _report_lost(self) -> None:
        """The master: every worker without a summary is lost; say how many of its
        scheduled requests have no record (forward.Collector.add_lost)."""
        missing = sorted(set(self.clients) - set(self.done) - set(self.lost))
        if not missing or self.collector is None or self.plan is None:
            return
        for i in missing:
            mine = share(self.plan, i, self.workers)
            lost = self.collector.add_lost(
                cast(str, self.run_id),  # set at the start, with the plan
                i,
                mine.scheduled_ids,
                len(mine.closed_loops),
            )
            self.lost[i] = lost
            msg = (
                f"schedscope: WORKER LOST: worker {i} sent no summary (it died or lost the "
                f"master): {lost['missing_open']} of its {lost['num_open_requests']} scheduled "
                f"open-loop requests have no record, and its {lost['num_closed_loops']} closed "
                f"loop(s) ended early ({lost['rows_received']} rows received; "
                f"{self.collector.directory}/lost-{i}.json)"
            )
            log.warning(msg)
            print(msg, file=sys.stderr, flush=True)
        self.environment.process_exit_code = 1

    def _report_refused(self) -> None:
        """The master: one line for what it refused (each sender was named once already)."""
        guard, collector = self.guard, self.collector
        rows = sum(collector.refused.values()) if collector else 0
        if not (guard.refused or rows):
            return
        msg = (
            f"schedscope: ignored {guard.refused} message(s) from {len(guard.refused_by)} "
            f"sender(s) that are not this run's workers, or not of the form they send, and "
            f"refused {rows} forwarded row(s) (not this run's, not the worker's share, "
            f"received twice, or malformed); see {WORKERS_FILE} in the records directory"
        )
        log.warning(msg)
        print(msg, file=sys.stderr, flush=True)
