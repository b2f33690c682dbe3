"""``define(profile, namespace)``: what makes a profile file a locustfile.

Called by ``harness.loadgen.expose.expose`` when Locust loads a profile. It puts
into the file's namespace:

- ``ProfileUser``: one per process, and a placeholder (it sends nothing itself). The
  schedule is sent by one dispatcher per process (``dispatcher.Dispatcher``), so
  ``-u`` and ``-r`` mean nothing: the shape below asks for one user per process.
- ``ProfileShape``: a LoadTestShape that keeps one user per process and ends the run
  when every process has finished its share (or ``--grace`` seconds after the
  schedule's end, or at ``-t``: Locust does not apply ``-t`` to shapes by itself).

and registers the listeners: the custom arguments (``options``), the start (one
process: at once; distributed: the master numbers the ready workers 0..W-1 and sends
each its index, W, the options but the secrets, a common start instant and its plan's
facts in a ``schedscope_split`` message; a worker whose own plan differs sends nothing,
and the master fails the run naming it: ``plan_check``; the master takes a message's
worker from its sender's connection, never from the message: ``master_guard``), the
per-request Locust events
(``TTFT``/``TPOT``/``E2E``, named ``ttft <class>`` ...: ``request_events``), and the end
(rows for whatever was left, the summary, the generator-limited warning: ``process_run``,
``run_end``).

The end of a run that stops before its schedule has been answered (``-t`` shorter than
the profile, the web UI's stop, Ctrl-C): sending stops at once (``test_stopping``); what
is in flight may finish within Locust's ``--stop-timeout``, because the placeholder user's
task (which Locust waits for that long) returns when the process's last request has
ended; what is still in flight then is cut. A cut request's row is ``aborted`` as before,
but Locust counts it as a ``CUT`` request (``cut <class>``), not a failure, so a healthy
server's run exits 0; the start says how many scheduled requests ``-t`` leaves unsent, the
end how many were cut and left unsent. Only a run stopped because ``--grace`` ran out
counts its requests still in flight as failures (the server did not answer in time).
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
import time
from pathlib import Path

import gevent
import gevent.event
from locust import LoadTestShape, User, constant, events, task
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner

from harness.loadgen import clock, run_end
from harness.loadgen import options as opts_mod
from harness.loadgen.forward import ROWS_MESSAGE, Collector
from harness.loadgen.intake import Intake, summary_problem
from harness.loadgen.master_guard import HELLO, TOKEN_ENV, MasterGuard, worker_token
from harness.loadgen.plan_check import failure_message, plan_facts, worker_failure
from harness.loadgen.process_run import ProcessRun, cut_notice, plan_of
from harness.loadgen.split import share
from harness.profiles import Plan
from harness.records.redact import strip_credentials, worker_host

log = logging.getLogger("schedscope.loadgen")

#: Seconds between the master's start message and the common start instant.
DISTRIBUTED_LEAD_S = 1.5
#: The master's record of its workers (expected, connected, started, refused), in its
#: --records-dir; ``merge.py`` reads it into the summary.
WORKERS_FILE = "workers.json"

_arguments_added = False


class _State:
    """Per profile file: the profile, the runner's role, the current run."""

    def __init__(self, profile) -> None:
        self.profile = profile
        self.environment = None
        self.run: ProcessRun | None = None
        self.users = None  # user count the shape keeps: one per process
        self.deadline = None
        self.workers = 0
        self.done: dict[int, dict] = {}
        self.local_done = False
        self.clients: dict[int, str] = {}  # the master's workers: index -> client id
        self.worker_of: dict[str, int] = {}  # the master's: client id -> worker index
        self.guard: MasterGuard | None = None  # the master's: what reaches its port
        self.expected: int | None = None  # the master's: workers it was told to wait for
        self.connected: set[str] = set()  # the master's: clients that registered
        self.excluded: list[str] = []  # the master's: connected, not numbered (no token)
        self.started = False  # the master's: the test started and its workers were numbered
        self._pings: dict[int, dict[int, float]] = {}  # the master's: worker -> seq -> t0
        self.collector: Collector | None = None  # the master's: the workers' rows
        self.offsets: dict[int, dict] = {}  # the master's: worker -> clock.best()
        self.plan: Plan | None = None  # the master's plan (the one its workers must build)
        self._pongs: dict[int, list] = {}
        self.lost: dict[int, dict] = {}
        self.local_records_dir: str | None = None  # a worker's own --records-dir
        self.local_api_key = ""  # a worker's own --api-key (never sent by the master)
        self.options = None
        self.run_id = None
        self.stopping = gevent.event.Event()  # set by test_stopping, cleared at test_start
        self.grace_over = False  # the run stops because --grace ran out

    # -- the placeholder user's task ------------------------------------------------------
    def hold(self) -> None:
        """Returns once the run is stopping and this process's last request has ended, so
        that Locust's --stop-timeout (how long Locust waits for a user's task) is how long
        what is in flight may still finish."""
        self.stopping.wait()
        run = self.run
        if run is not None:
            run.ended.wait()

    # -- Locust events ----------------------------------------------------------------
    def on_init(self, environment, runner=None, **_kw) -> None:
        self.environment = environment
        if isinstance(runner, MasterRunner):
            # before any message of ours: the guard names each message's sender
            self.guard = MasterGuard(runner, worker_token()).install()
            runner.register_message("schedscope_done", self._on_done_message)
            runner.register_message(ROWS_MESSAGE, self._on_rows_message)
            runner.register_message("schedscope_pong", self._on_pong_message)
            environment.events.worker_connect.add_listener(self._on_worker_connect)
            parsed = environment.parsed_options
            # --processes N sets it to N; Locust's default without --expect-workers is 1
            self.expected = getattr(parsed, "expect_workers", None)
            self._write_workers()
            # Locust may give up waiting for its workers and exit before any test starts
            atexit.register(self._write_workers)
        elif isinstance(runner, WorkerRunner):
            clock.install_test_offset()
            parsed = environment.parsed_options
            # its own --records-dir, read before the master's options replace its own
            self.local_records_dir = getattr(parsed, "records_dir", None)
            self.local_api_key = getattr(parsed, "api_key", "") or ""
            # first of its messages: a master with a worker token numbers only those that
            # presented it (master_guard.py)
            runner.send_message(HELLO, {"token": worker_token()})
            runner.register_message("schedscope_ping", self._on_ping_message)
            runner.register_message("schedscope_split", self._on_split_message)
            runner.register_message("schedscope_stop", self._on_stop_message)

    def on_test_start(self, environment, **_kw) -> None:
        runner = environment.runner
        self.stopping.clear()
        if isinstance(runner, WorkerRunner):
            return  # a worker starts on the master's schedscope_split
        options = opts_mod.LoadgenOptions.from_parsed(environment.parsed_options)
        self.done = {}
        self.lost = {}
        self.local_done = False
        self.grace_over = False
        notice = cut_notice(
            self.profile, options, getattr(environment.parsed_options, "run_time", None)
        )
        if notice:
            print(notice, file=sys.stderr, flush=True)
        run_id = f"{self.profile.name}-{int(time.time() * 1000)}"
        duration = self.profile.with_duration_scale(options.duration_scale).duration_s
        if isinstance(runner, MasterRunner):
            clients = self._number_workers(runner)
            self.options = options
            self.run_id = run_id
            facts = None  # each worker checks its own plan against the master's facts
            try:
                self.plan = plan_of(self.profile, options)
                facts = plan_facts(self.plan)
            except Exception:  # noqa: BLE001 - the workers fail alike, and say why
                log.exception("schedscope: the master could not build the plan")
                self.plan = None
            self.offsets = self._estimate_clocks(runner)
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
                        "host": strip_credentials(environment.host or ""),
                        "plan": facts,
                    },
                    client_id=c.id,
                )
            log.info("schedscope: split the schedule between %d workers", self.workers)
        else:
            self.workers = 1
            start = None
            self.run = ProcessRun(
                self.profile,
                environment,
                0,
                1,
                None,
                options,
                environment.host or "",
                run_id,
                on_finished=self.on_run_finished,
            )
        self.deadline = (start or clock.unix_now()) + duration + options.grace + 5.0

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
        parsed = self.environment.parsed_options if self.environment else None
        directory = self.options.records_dir if self.options else None
        directory = directory or getattr(parsed, "records_dir", None)
        if not directory or self.guard is None:
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
        if i is None and self.guard is not None:
            self.guard.refuse(msg.node_id, f"a {msg.type} message (not a worker of this run)")
        return i

    def _on_split_message(self, environment, msg, **_kw) -> None:
        d = msg.data
        # the master sends no secret: this worker's own API key
        options = opts_mod.LoadgenOptions(**{**d["options"], "api_key": self.local_api_key})
        if d.get("api_key_set") and not self.local_api_key:
            log.warning(
                "schedscope: the master's run sends an API key and this worker has none: "
                "give it with `schedscope worker --api-key` or $SCHEDSCOPE_API_KEY"
            )
        self.run = ProcessRun(
            self.profile,
            environment,
            d["index"],
            d["count"],
            d["start_at"],
            options,
            worker_host(d["host"], environment.host),
            d["run_id"],
            d.get("plan"),
            on_finished=self.on_run_finished,
            local_records_dir=self.local_records_dir,
        )

    def _on_done_message(self, environment, msg, **_kw) -> None:
        i = self._sender(msg)
        if i is None or self.collector is None:
            return
        if i in self.done:
            self.guard.refuse(msg.node_id, f"a second summary of worker {i}")
            return
        why = summary_problem(msg.data, self.run_id)
        if why is not None:
            self.guard.refuse(msg.node_id, f"a summary of worker {i} ({why})")
            return
        summary = {**msg.data, "worker": i}
        if summary.get("error"):
            summary = self._worker_failed(summary)
        summary = self.collector.add_summary(i, summary)
        if summary is not None:
            self.done[i] = summary

    def _worker_failed(self, summary: dict) -> dict:
        """The master: a worker that did not run its share (its plan was not the
        master's, or its run could not start) fails the run, at once and by name."""
        i = int(summary["worker"])
        failure = {**summary, "client_id": self.clients.get(i)}
        if self.plan is not None:  # what of its share has no row
            mine = share(self.plan, i, self.workers)
            failure = worker_failure(
                failure,
                [s.request_id for s in mine.open_requests],
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

    # -- clock offsets (clock.py) ------------------------------------------------------
    def _on_ping_message(self, environment, msg, **_kw) -> None:
        """A worker: answer the master's clock probe at once (t1, t2 on this clock)."""
        t1 = clock.unix_now()
        environment.runner.send_message(
            "schedscope_pong", {**msg.data, "t1": t1, "t2": clock.unix_now()}
        )

    def _on_pong_message(self, environment, msg, **_kw) -> None:
        t3 = clock.unix_now()
        i = self._sender(msg)
        if i is None:
            return
        try:  # a pong of the worker pinged, answering a ping of the master's, possible
            probe = clock.probe(self._pings.get(i, {}), msg.data, t3)
        except clock.BadProbe as e:
            self.guard.refuse(msg.node_id, f"a clock probe of worker {i}: {e}")
            return
        self._pongs.setdefault(i, []).append(probe)

    def _estimate_clocks(self, runner) -> dict[int, dict]:
        """The master: each worker's clock offset, best of clock.NUM_PROBES round trips."""
        self._pongs = {}
        self._pings = {i: {} for i in self.clients}
        for n in range(clock.NUM_PROBES):
            for i, cid in self.clients.items():
                t0 = self._pings[i][n] = clock.unix_now()
                runner.send_message("schedscope_ping", {"seq": n, "t0": t0}, client_id=cid)
            deadline = clock.unix_now() + 1.0
            while clock.unix_now() < deadline and any(
                len(self._pongs.get(i, ())) <= n for i in self.clients
            ):
                gevent.sleep(0.002)
        offsets = {}
        for i in self.clients:
            if self._pongs.get(i):
                offsets[i] = clock.best(self._pongs[i])
            else:
                log.warning("schedscope: worker %d answered no clock probe; offset taken as 0", i)
        for i, est in sorted(offsets.items()):
            log.info(
                "schedscope: worker %d clock offset %+.4f s ± %.4f s",
                i,
                est["offset_s"],
                est["uncertainty_s"],
            )
        return offsets

    def _on_stop_message(self, environment, msg, **_kw) -> None:
        """A worker: the master is stopping the run (its ``test_stopping``)."""
        if self.run is not None and self.run.summary is None:
            self.run.cut_is_failure = bool(msg.data["cut_is_failure"])
            gevent.spawn(self.run.stop, float(msg.data["stop_timeout"]))

    def on_test_stopping(self, environment, **_kw) -> None:
        """Sending stops here; what is in flight may finish until Locust's stop timeout."""
        runner = environment.runner
        self.stopping.set()
        if isinstance(runner, MasterRunner):
            if self.workers and len(self.done) < self.workers:
                runner.send_message(
                    "schedscope_stop",
                    {"cut_is_failure": self.grace_over, "stop_timeout": environment.stop_timeout},
                )
        elif self.run is not None:
            self.run.drain()

    def on_run_finished(self, run: ProcessRun, summary: dict) -> None:
        runner = self.environment.runner if self.environment else None
        if isinstance(runner, WorkerRunner):
            runner.send_message("schedscope_done", summary)
        else:
            self.done[0] = summary
            self.local_done = True

    def on_test_stop(self, environment, **_kw) -> None:
        runner = environment.runner
        if self.run is not None and not isinstance(runner, MasterRunner):
            self.run.stop()  # Locust's stop timeout is over: cut what is still in flight
        if isinstance(runner, MasterRunner):
            self._wait_for_workers(runner, environment.stop_timeout + 20.0)
            if self.collector is not None:
                self.collector.close()
            self._write_workers()
            self._report_refused()
            if self.guard is not None:
                self.guard.unlock()  # a later run (Locust's web UI) numbers workers anew
        if not isinstance(runner, WorkerRunner):
            self._report()

    def _wait_for_workers(self, runner, timeout_s: float) -> None:
        """The master: wait for the summaries of the workers still connected (each has
        ``--stop-timeout`` to let its requests finish after the schedscope_stop message)."""
        deadline = clock.unix_now() + timeout_s
        while clock.unix_now() < deadline and self._waiting_for(runner):
            gevent.sleep(0.1)
        self._report_lost()

    def _waiting_for(self, runner) -> list[int]:
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
                self.run_id, i, [s.request_id for s in mine.open_requests], len(mine.closed_loops)
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
        if guard is None or not (guard.refused or rows):
            return
        msg = (
            f"schedscope: ignored {guard.refused} message(s) from {len(guard.refused_by)} "
            f"sender(s) that are not this run's workers, or not of the form they send, and "
            f"refused {rows} forwarded row(s) (not this run's, not the worker's share, "
            f"received twice, or malformed); see {WORKERS_FILE} in the records directory"
        )
        log.warning(msg)
        print(msg, file=sys.stderr, flush=True)

    def _report(self) -> None:
        exit_code = run_end.report(
            self.done,
            self.workers,
            self.collector.directory if self.collector is not None else None,
            isinstance(self.environment.runner, MasterRunner),
        )
        if exit_code is not None:
            self.environment.process_exit_code = exit_code

    def tick(self, shape) -> tuple[int, float] | None:
        runner = shape.runner
        if self.users is None or runner.state == "ready":
            self.users = runner.worker_count if isinstance(runner, MasterRunner) else 1
        parsed = self.environment.parsed_options if self.environment else None
        run_time = getattr(parsed, "run_time", None)
        if run_time and shape.get_run_time() >= run_time:
            log.info("schedscope: -t %ss reached", run_time)
            return None
        if self.deadline is not None:
            if len(self.done) >= max(self.workers, 1):
                return None
            if (
                isinstance(runner, MasterRunner)
                and (self.done or not self.clients)
                and not self._waiting_for(runner)
            ):
                return None  # the others are lost (reported at the end), or none started
            if clock.unix_now() > self.deadline:
                log.warning("schedscope: the schedule and --grace are over; stopping")
                self.grace_over = True
                if self.run is not None:
                    self.run.cut_is_failure = True
                return None
        return (self.users, float(self.users))


def define(profile, namespace: dict) -> None:
    """Define the Locust classes and listeners of ``profile`` in ``namespace``."""
    global _arguments_added
    state = _State(profile)

    class ProfileUser(User):
        """One per process; the process's dispatcher sends the schedule (docs/loadgen.md)."""

        wait_time = constant(3600)

        @task
        def hold(self) -> None:
            state.hold()

    class ProfileShape(LoadTestShape):
        """One user per process; ends when the schedule has been sent and answered."""

        use_common_options = True

        def tick(self):
            return state.tick(self)

    for cls in (ProfileUser, ProfileShape):
        cls.__module__ = namespace.get("__name__", cls.__module__)
    ProfileUser.__doc__ = f"Profile {profile.name}: {profile.description or ProfileUser.__doc__}"
    namespace["ProfileUser"] = ProfileUser
    namespace["ProfileShape"] = ProfileShape
    namespace["schedscope_state"] = state

    if not _arguments_added:
        events.init_command_line_parser.add_listener(opts_mod.add_arguments)
        _arguments_added = True
    events.init.add_listener(state.on_init)
    events.test_start.add_listener(state.on_test_start)
    events.test_stopping.add_listener(state.on_test_stopping)
    events.test_stop.add_listener(state.on_test_stop)
