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
facts in a ``schedscope_split`` message: ``master_side``, ``worker_side``), the
per-request Locust events (``TTFT``/``TPOT``/``E2E``, named ``ttft <class>`` ...:
``request_events``), and the end (rows for whatever was left, the summary, the
generator-limited warning: ``process_run``, ``run_end``).

The parts, one module each: the process's run of its share (``process_run``), the
master's side of a distributed run (``master_side``; its clock probes:
``clock_probes``), the worker's (``worker_side``) and the end-of-run report
(``run_end``). ``_State`` routes Locust's events to them and holds what they share:
the summaries, the current run, the deadline, whether the run is stopping.

The end of a run that stops before its schedule has been answered (``-t`` shorter than
the profile, the web UI's stop, Ctrl-C): sending stops at once (``test_stopping``); what
is in flight may finish within Locust's ``--stop-timeout``, because the placeholder user's
task (which Locust waits for that long) returns when the process's last request has
ended; what is still in flight then is cut. A cut request's row is ``aborted`` as before,
but Locust counts it as a ``CUT`` request (``cut <class>``: ``request_events``), not a
failure, so a healthy server's run exits 0; the start says how many scheduled requests
``-t`` leaves unsent, the end how many were cut and left unsent. Only a run stopped
because ``--grace`` ran out counts its requests still in flight as failures (the server
did not answer in time).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import gevent.event
from locust import LoadTestShape, User, constant, events, task
from locust.runners import MasterRunner, WorkerRunner

from harness.loadgen import clock, run_end
from harness.loadgen import options as opts_mod
from harness.loadgen.master_guard import MasterGuard, worker_token
from harness.loadgen.master_side import WORKERS_FILE as WORKERS_FILE  # tests import it here
from harness.loadgen.master_side import MasterSide
from harness.loadgen.process_run import ProcessRun, cut_notice, plan_of
from harness.loadgen.worker_side import WorkerSide

log = logging.getLogger("schedscope.loadgen")

_arguments_added = False


class _State:
    """Per profile file: the profile, the runner's role, the current run."""

    def __init__(self, profile) -> None:
        self.profile = profile
        self.environment: Any = None  # Locust's Environment, from its init event
        self.run: ProcessRun | None = None
        self.users: int | None = None  # user count the shape keeps: one per process
        self.deadline: float | None = None
        self.done: dict[int, dict] = {}  # the processes' summaries by worker index
        self.local_done = False
        self.master: MasterSide | None = None  # the master's side of a distributed run
        self.worker: WorkerSide | None = None  # a worker's side
        self.stopping = gevent.event.Event()  # set by test_stopping, cleared at test_start
        self.grace_over = False  # the run stops because --grace ran out

    @property
    def workers(self) -> int:
        """The processes that share the schedule: the master's numbered workers, or this
        one alone."""
        return self.master.workers if self.master is not None else 1

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
            guard = MasterGuard(runner, worker_token()).install()
            self.master = MasterSide(environment, guard, self.done)
            self.master.listen(runner)
        elif isinstance(runner, WorkerRunner):
            self.worker = WorkerSide(environment, self.profile, self._on_worker_run)
            self.worker.listen(runner)

    def _on_worker_run(self, run: ProcessRun) -> None:
        """A worker: the run the master's split started is this process's run."""
        self.run = run

    def on_test_start(self, environment, **_kw) -> None:
        self.stopping.clear()
        if self.worker is not None:
            return  # a worker starts on the master's schedscope_split
        if not self._resolve_rate_scale(environment):
            return
        options = opts_mod.LoadgenOptions.from_parsed(environment.parsed_options)
        self.done.clear()  # the master's side holds this dict: cleared, never replaced
        self.local_done = False
        self.grace_over = False
        notice = cut_notice(
            self.profile, options, getattr(environment.parsed_options, "run_time", None)
        )
        if notice:
            print(notice, file=sys.stderr, flush=True)
        run_id = f"{self.profile.name}-{int(time.time() * 1000)}"
        duration = self.profile.with_duration_scale(options.duration_scale).duration_s
        if self.profile.has_sessions:  # their think times go on past the schedule's end
            duration += plan_of(self.profile, options).session_tail_s
        if self.master is not None:
            start: float | None = self.master.start(
                environment.runner, self.profile, options, run_id
            )
        else:
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

    def _resolve_rate_scale(self, environment) -> bool:
        """``--rate-scale auto[:F]``: the host probed, the factor put in the parsed
        options (harness/loadgen/relative_rate.py); False, the run not started and the exit
        code 1, when the probe cannot measure the host."""
        from harness.loadgen.relative_rate import resolve_auto
        from harness.loadgen.saturation_probe import ProbeError

        try:
            resolve_auto(environment.parsed_options, self.profile, environment.host or "")
        except ProbeError as exc:
            print(
                f"schedscope: --rate-scale auto: the host's capacity could not be measured: "
                f"{exc}; the run does not start",
                file=sys.stderr,
                flush=True,
            )
            environment.process_exit_code = 1
            gevent.spawn(environment.runner.quit)
            return False
        return True

    def on_test_stopping(self, environment, **_kw) -> None:
        """Sending stops here; what is in flight may finish until Locust's stop timeout."""
        self.stopping.set()
        if self.master is not None:
            self.master.stop_workers(environment.runner, self.grace_over, environment.stop_timeout)
        elif self.run is not None:
            self.run.drain()

    def on_run_finished(self, run: ProcessRun, summary: dict) -> None:
        """One process: its summary is the run's."""
        self.done[0] = summary
        self.local_done = True

    def on_test_stop(self, environment, **_kw) -> None:
        if self.run is not None and self.master is None:
            self.run.stop()  # Locust's stop timeout is over: cut what is still in flight
        if self.master is not None:
            self.master.finish(environment.runner, environment.stop_timeout + 20.0)
        if self.worker is None:
            self._report()

    def _report(self) -> None:
        collector = self.master.collector if self.master is not None else None
        exit_code = run_end.report(
            self.done,
            self.workers,
            collector.directory if collector is not None else None,
            self.master is not None,
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
                self.master is not None
                and (self.done or not self.master.clients)
                and not self.master.waiting_for(runner)
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
