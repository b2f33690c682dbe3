"""The engine behind the server, in a process of its own (the API process's side).

:class:`ProcessEngine` is an :class:`engine.serving.async_engine.AsyncEngine` whose step loop
runs in a child process (``engine.serving.engine_core``): the streams, adds, aborts and
draining are the same; commands go down a pipe (from a sender thread, so the event
loop never blocks on a full pipe) and each step's tokens and ends come back up
another, read by a reader thread that hands them to the event loop once per message.

The API process needs no torch. The engine clock is shared: both processes read the
same monotonic clock (``time.perf_counter``, CLOCK_MONOTONIC on Linux), so arrivals are
stamped here, on the engine's clock, when the server has parsed a request.

Liveness: every message the reader receives is a sign that the engine's loop turns
(``AsyncEngine.seconds_without_progress``, /health's "stalled"). When the pipe closes
without the engine's ``("stopped",)`` (it died, or was killed for not stopping in
:data:`STOP_TIMEOUT_S`), the reader reaps the process and fails everything it held:
``failure`` is set, every stream ends with the error, and the server exits non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import queue
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess

from engine.config import ConfigError, EngineConfig
from engine.records.writers import LostRecord
from engine.serving.async_engine import (
    METRICS_INTERVAL_S,
    AsyncEngine,
    EngineDeadError,
    RequestRejected,
    _Abort,
    _Add,
)
from engine.serving.engine_core import EngineCoreSpec, run_engine_core
from engine.telemetry.exposition import wants_openmetrics

log = logging.getLogger("schedscope.engine")

#: How long the child may take to build its engine (import torch, load the model).
START_TIMEOUT_S = 300.0
#: How long the child may take to stop when asked (write its records, flush its spans)
#: before it is killed.
STOP_TIMEOUT_S = 15.0
#: How long a scrape waits for the exposition the idle engine is about to push (its
#: render after its last step) before it takes the older bytes.
METRICS_IDLE_WAIT_S = 2 * METRICS_INTERVAL_S


class EngineProcessError(EngineDeadError):
    """The engine process could not start, or died (a request it strands is refused as
    the engine being unavailable: the server's 503)."""


class SequenceView:
    """The API process's handle on a sequence of the engine process: what a stream
    needs (its identity, and how it ended)."""

    __slots__ = (
        "request_id",
        "seq_no",
        "finish_reason",
        "error",
        "reject_reason",
        "num_cached_tokens",
    )

    def __init__(self, request_id: str, seq_no: int, reject_reason: str | None = None) -> None:
        self.request_id = request_id
        self.seq_no = seq_no
        self.finish_reason: str | None = "rejected" if reject_reason else None
        self.error: str | None = None
        self.reject_reason = reject_reason
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache, once ended

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


class ProcessEngine(AsyncEngine):
    def __init__(self, spec: EngineCoreSpec) -> None:
        # No LLMEngine here: the base class's stream bookkeeping only (the epoch comes
        # with the engine process's "ready").
        self._init_streams(spec.idle_wait_s, 0.0)
        self.spec = spec
        self._config: EngineConfig = spec.config
        self._clock_origin = time.perf_counter()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._pending_adds: dict[int, _Add] = {}
        self._next_add_id = 0
        self._views: dict[int, SequenceView] = {}  # seq_no -> live view
        self._lock = threading.Lock()  # _pending_adds and _views: reader vs event loop
        # Set by launch(): the engine process and the two ends of its pipes kept here.
        self._process: SpawnProcess | None = None
        self._command_pipe: Connection | None = None  # send end, written by the sender
        self._outputs: Connection | None = None  # receive end, read by the reader
        self._reader: threading.Thread | None = None
        self._sender: threading.Thread | None = None
        self._killed = False  # by _stop_backend: it did not stop in STOP_TIMEOUT_S
        # /metrics: the latest exposition the engine process pushed, per format (from
        # the reader thread), the step it includes, and when the engine was last told
        # that each format is scraped (monotonic; under the lock too).
        self._has_metrics = True  # until "ready" says
        self._metrics: dict[str, tuple[bytes | None, str]] = {}
        self._metrics_step = -1
        self._metrics_told_at: dict[str, float] = {}
        self._metrics_pushed = asyncio.Event()  # set (in the loop) at each push
        #: The record files (``spec.record_writers``) the engine process could not write,
        #: as it reported them at shutdown; None until it has reported (and for good when
        #: it died or was killed first: then none was written, or not known to be).
        self.lost_records: list[LostRecord] | None = None

    @property
    def config(self) -> EngineConfig:
        return self._config

    def now(self) -> float:
        return time.perf_counter() - self._clock_origin

    # -- the child -------------------------------------------------------------------
    def launch(self) -> dict:
        """Start the engine process and wait until its engine is built (blocking).
        Raises ConfigError when the engine cannot be built with this configuration,
        EngineProcessError when the process fails otherwise."""
        context = multiprocessing.get_context("spawn")
        parent_commands, child_commands = context.Pipe(duplex=False)  # (recv, send)
        child_outputs_recv, child_outputs_send = context.Pipe(duplex=False)
        process = self._process = context.Process(
            target=run_engine_core,
            args=(self.spec, parent_commands, child_outputs_send),
            name="schedscope-engine-core",
            daemon=True,
        )
        process.start()
        parent_commands.close()
        child_outputs_send.close()
        self._command_pipe, self._outputs = child_commands, child_outputs_recv
        if not child_outputs_recv.poll(START_TIMEOUT_S):
            process.kill()
            raise EngineProcessError(f"the engine process did not start in {START_TIMEOUT_S} s")
        try:
            message = child_outputs_recv.recv()
        except EOFError:
            raise EngineProcessError(
                f"the engine process exited with {process.exitcode} while starting"
            ) from None
        if message[0] == "failed":
            process.join(10)
            raise ConfigError(message[1])
        info = message[1]
        self._clock_origin = info["clock_origin"]
        self.stats.clock_epoch_unix = info["clock_epoch_unix"]
        self.stats.num_device_blocks = self.stats.num_free_device_blocks = info["num_device_blocks"]
        self.stats.num_host_blocks = self.stats.num_free_host_blocks = info["num_host_blocks"]
        self._has_metrics = info.get("metrics", True)
        self.stats.faults = info.get("faults", {})
        return info

    def _start_backend(self) -> None:
        if self._process is None:
            self.launch()
        self._reader = threading.Thread(
            target=self._read, name="schedscope-engine-reader", daemon=True
        )
        self._sender = threading.Thread(
            target=self._send_loop, name="schedscope-engine-sender", daemon=True
        )
        self._reader.start()
        self._sender.start()

    async def _stop_backend(self) -> None:
        self._outbox.put(("stop",))
        self._outbox.put(None)  # ends the sender
        if self._process is not None:
            await asyncio.to_thread(self._process.join, STOP_TIMEOUT_S)
            if self._process.is_alive():
                log.error("the engine process did not stop in %g s; killing it", STOP_TIMEOUT_S)
                self._killed = True
                self._process.kill()
                await asyncio.to_thread(self._process.join, 5.0)
        if self._reader is not None:
            await asyncio.to_thread(self._reader.join, 5.0)

    # -- commands (event-loop side) --------------------------------------------------
    def _submit(self, command: _Add | _Abort) -> None:
        if isinstance(command, _Add):
            with self._lock:
                add_id = self._next_add_id
                self._next_add_id += 1
                self._pending_adds[add_id] = command
            self._outbox.put(("add", add_id, command.request))
        else:
            seq_no = getattr(command.sequence, "seq_no", None)
            self._outbox.put(("abort", command.request_id, seq_no))

    def _send_loop(self) -> None:
        commands = self._command_pipe
        assert commands is not None  # started after launch()
        while True:
            message = self._outbox.get()
            if message is None:
                return
            try:
                commands.send(message)
            except (BrokenPipeError, OSError):
                return  # the reader reports the dead process

    # -- outputs (reader thread) ------------------------------------------------------
    def _read(self) -> None:
        try:
            self._read_messages()
        finally:
            # No push can come any more: a scrape waiting for one is answered now.
            self._call_in_loop(self._metrics_pushed.set)

    def _read_messages(self) -> None:
        outputs, process = self._outputs, self._process
        assert outputs is not None and process is not None  # started after launch()
        while True:
            try:
                message = outputs.recv()
            except (EOFError, OSError):
                break
            self._progress_at = time.monotonic()  # each message is sent between steps
            kind = message[0]
            if kind == "outputs":
                self._on_outputs(*message[1:])
            elif kind == "added":
                self._on_added(*message[1:])
            elif kind == "add_error":
                with self._lock:
                    command = self._pending_adds.pop(message[1])
                self._resolve(command.accepted, ValueError(message[2]))
            elif kind == "metrics":
                _, step, num_renders, rendered = message
                with self._lock:
                    self._metrics.update(rendered)
                    self._metrics_step = step
                    self.num_metrics_renders = num_renders
                self._call_in_loop(self._metrics_pushed.set)
            elif kind == "metrics_unwanted":  # no longer rendered: its bytes would go stale
                with self._lock:
                    for fmt in message[1]:
                        self._metrics.pop(fmt, None)
                        self._metrics_told_at.pop(fmt, None)
            elif kind == "records":
                self.lost_records = list(message[1])
            elif kind == "stopped":
                return
        # The pipe closed without "stopped": the process died, or was killed (it did not
        # stop in time). Reap it now (no zombie while the server winds down), then fail
        # whatever it held: every stream gets its error, and the server exits non-zero.
        process.join(5.0)
        if self._killed:
            error = f"the engine process did not stop in {STOP_TIMEOUT_S:g} s and was killed"
        else:
            error = f"the engine process exited (code {process.exitcode})"
        log.error("%s", error)
        if self.state not in ("stopped", "draining"):
            self.state = "failed"
        self.stats.errors.append(error)
        with self._lock:
            pending = list(self._pending_adds.values())
            self._pending_adds.clear()
        for command in pending:
            self._resolve(command.accepted, EngineProcessError(error))
        self._call_in_loop(self._engine_lost, error)

    async def render_metrics(
        self, accept: str | None, timeout_s: float = 5.0
    ) -> tuple[bytes, str] | None:
        """The engine process's Prometheus exposition: (body, content type), or None
        when it runs without metrics. Never waits on the engine: the latest bytes the
        engine process pushed (``engine.serving.engine_core``: at most
        ``METRICS_INTERVAL_S`` old while it works). Waits only for what the engine sends
        unasked: a format's first bytes (up to ``timeout_s``, then TimeoutError; first
        again after the engine stopped rendering a format nobody scraped), and,
        when the engine has gone idle since its last push, the push it makes then (up to
        ``METRICS_IDLE_WAIT_S``, then the older bytes)."""
        if self.state in ("created", "failed", "stopped") or self._process is None:
            raise EngineProcessError(f"engine is {self.state}")
        if not self._has_metrics:
            return None
        fmt = "openmetrics" if wants_openmetrics(accept) else "text"
        now = time.monotonic()
        with self._lock:
            told_at = self._metrics_told_at.get(fmt)
            tell = told_at is None or now - told_at >= METRICS_INTERVAL_S
            if tell:
                self._metrics_told_at[fmt] = now
        if tell:  # "still scraped": at most once per interval, never per scrape
            self._outbox.put(("metrics", fmt))
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline, idle_deadline = started + timeout_s, started + METRICS_IDLE_WAIT_S
        while True:
            with self._lock:
                rendered, step = self._metrics.get(fmt), self._metrics_step
            if rendered is not None and (step >= self.stats.num_steps or not self._idle()):
                break
            if self._reader is None or not self._reader.is_alive():
                if rendered is not None:
                    break
                raise EngineProcessError("the engine process has stopped")
            wait_s = (deadline if rendered is None else min(deadline, idle_deadline)) - loop.time()
            if wait_s <= 0:
                if rendered is not None:
                    break
                raise TimeoutError
            # woken by a push; in slices, so that the engine's news (busy again, or
            # gone) is seen too
            self._metrics_pushed.clear()
            try:
                await asyncio.wait_for(self._metrics_pushed.wait(), min(wait_s, 0.05))
            except TimeoutError:
                pass
        body, content_type = rendered
        if body is None:
            raise RuntimeError("the engine process could not render its metrics")
        return body, content_type

    def _idle(self) -> bool:
        return self.stats.num_unfinished == 0

    def _on_added(self, add_id: int, seq_no: int, reject_reason: str | None) -> None:
        with self._lock:
            command = self._pending_adds.pop(add_id)
            view = SequenceView(command.request.request_id, seq_no, reject_reason)
            if reject_reason is None:
                self._views[seq_no] = view
        if reject_reason is not None:
            self._resolve(command.accepted, RequestRejected(view.request_id, reject_reason, view))
        else:
            self._resolve(command.accepted, view, command.stream)

    def _on_outputs(self, tokens, ended, stats: dict) -> None:
        views = self._views
        with self._lock:
            delivered = [
                (view, token) for seq_no, token in tokens if (view := views.get(seq_no)) is not None
            ]
            finished = []
            for seq_no, finish_reason, error, num_cached_tokens in ended:
                view = views.pop(seq_no, None)
                if view is not None:
                    view.finish_reason, view.error = finish_reason, error
                    view.num_cached_tokens = num_cached_tokens
                    finished.append(view)
        self._apply_stats(stats)
        if delivered or finished:
            self._call_in_loop(self._deliver, delivered, finished)

    def _apply_stats(self, stats: dict) -> None:
        s = self.stats
        step, error = stats.pop("step", None), stats.pop("error", None)
        s.update(stats)
        if step is not None:
            s.num_steps = step
        if error is not None:
            s.errors.append(error)
            del s.errors[:-20]

    def _refresh_stats(self) -> None:  # stats arrive with every message
        pass
