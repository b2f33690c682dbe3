"""A worker's side of a distributed run: its hello, the master's messages, its summary.

At Locust's init a worker reads its own ``--records-dir`` and ``--api-key`` (the master
never sends a secret, and its options replace the worker's own), presents the worker
token (``schedscope_hello``: ``master_guard``) and registers its handlers: the master's
clock probes (``clock_probes.answer_ping``), its ``schedscope_split`` (this worker's
share: a ``ProcessRun`` whose rows and summary go to the master, ``schedscope_done``) and
its ``schedscope_stop`` (the master's stopping: ``--stop-timeout`` for what is in
flight, then cut).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import gevent

from harness.loadgen import clock
from harness.loadgen import options as opts_mod
from harness.loadgen.clock_probes import answer_ping
from harness.loadgen.master_guard import HELLO, worker_token
from harness.loadgen.process_run import ProcessRun
from harness.records.redact import worker_host

log = logging.getLogger("schedscope.loadgen")


class WorkerSide:
    """A worker's own settings and its handlers of the master's messages; ``on_started``
    is given each run the master's split starts (the process's current run)."""

    def __init__(self, environment, profile, on_started: Callable[[ProcessRun], None]) -> None:
        self.environment = environment
        self.profile = profile
        self.on_started = on_started
        self.run: ProcessRun | None = None  # the run the master's last split started
        self.local_records_dir: str | None = None  # a worker's own --records-dir
        self.local_api_key = ""  # a worker's own --api-key (never sent by the master)

    def listen(self, runner) -> None:
        """At Locust's init: the worker's own settings, its hello and its handlers."""
        clock.install_test_offset()
        parsed = self.environment.parsed_options
        # its own --records-dir, read before the master's options replace its own
        self.local_records_dir = getattr(parsed, "records_dir", None)
        self.local_api_key = getattr(parsed, "api_key", "") or ""
        # first of its messages: a master with a worker token numbers only those that
        # presented it (master_guard.py)
        runner.send_message(HELLO, {"token": worker_token()})
        runner.register_message("schedscope_ping", answer_ping)
        runner.register_message("schedscope_split", self._on_split_message)
        runner.register_message("schedscope_stop", self._on_stop_message)

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
            on_finished=self._on_run_finished,
            local_records_dir=self.local_records_dir,
        )
        self.on_started(self.run)

    def _on_stop_message(self, environment, msg, **_kw) -> None:
        """A worker: the master is stopping the run (its ``test_stopping``)."""
        if self.run is not None and self.run.summary is None:
            self.run.cut_is_failure = bool(msg.data["cut_is_failure"])
            gevent.spawn(self.run.stop, float(msg.data["stop_timeout"]))

    def _on_run_finished(self, run: ProcessRun, summary: dict) -> None:
        """A worker: its summary goes to the master (after its last rows)."""
        self.environment.runner.send_message("schedscope_done", summary)
