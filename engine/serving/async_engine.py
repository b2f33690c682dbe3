"""The engine behind a server: the step loop on its own thread, tokens streamed to asyncio.

Why a thread: a step is blocking work (torch releases the GIL while it computes; the
simulated executor sleeps), and the event loop must keep serving sockets meanwhile.
The loop thread owns the :class:`LLMEngine`; every other thread talks to it through
a command queue applied between steps, so the engine itself needs no locks. The
streams are an observer of the engine's step records: after each step the thread
hands the step's new tokens to the event loop in one ``call_soon_threadsafe`` call;
each request's consumer reads its own ``asyncio.Queue``, so a slow client only lets
its own queue grow (bounded by its ``max_tokens``) and never holds up a step.

A stream belongs to one :class:`Sequence`, not to a request id: outputs and aborts
are matched by identity, so a client that reuses the id of a request that just went
away can never receive (or end) the old request's stream.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Protocol

from engine.core.request import EngineRequest
from engine.core.sequence import Sequence
from engine.llm_engine import LLMEngine
from engine.records.step_record import StepRecord

log = logging.getLogger("schedscope.engine")


class EngineDeadError(RuntimeError):
    """The engine loop is not running (stopped, or shutting down)."""


class SequenceHandle(Protocol):
    """What the API side knows of a request's sequence: the :class:`Sequence` itself
    (engine on a thread), or a ``process_engine.SequenceView`` of it (engine process)."""

    @property
    def request_id(self) -> str: ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def error(self) -> str | None: ...


class RequestRejected(Exception):
    """The scheduler refused the request; ``reason`` is a decisions.REASON_* value."""

    def __init__(self, request_id: str, reason: str, sequence: SequenceHandle) -> None:
        super().__init__(f"request {request_id} rejected: {reason}")
        self.request_id = request_id
        self.reason = reason
        self.sequence = sequence


@dataclass(slots=True)
class RequestOutput:
    """What a consumer receives: new tokens since the last output, and the end."""

    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None  # stop | length | abort | error
    error: str | None = None
    sequence: Sequence | None = None  # the final state, on the last output


@dataclass
class _Stream:
    queue: asyncio.Queue
    sequence: Sequence | None = None  # set when the engine accepted the request


@dataclass(frozen=True, slots=True)
class _Add:
    request: EngineRequest
    stream: _Stream
    accepted: asyncio.Future  # resolves to the Sequence, or to the refusal


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str
    #: Abort only this sequence (None: whichever holds the id), so an abort sent on
    #: behalf of one stream cannot end a newer request that reuses its id.
    sequence: Sequence | None = None


@dataclass
class EngineStats:
    """A snapshot for /health and gauges, refreshed after every step."""

    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_free_device_blocks: int = 0
    num_device_blocks: int = 0
    num_free_host_blocks: int = 0
    num_host_blocks: int = 0
    num_steps: int = 0
    last_step_at: float = 0.0
    clock_epoch_unix: float = 0.0  # Unix time of engine time 0
    #: The faults planted into the engine (``engine.faults.Faults.to_dict``; set once,
    #: at start): empty when none.
    faults: dict = field(default_factory=dict)
    num_observer_errors: int = 0
    errors: list[str] = field(default_factory=list)

    def update(self, snapshot: dict) -> None:
        for name, value in snapshot.items():
            setattr(self, name, value)

    @property
    def num_unfinished(self) -> int:
        """The requests the scheduler holds (running, waiting or swapped out)."""
        return self.num_running + self.num_waiting + self.num_swapped


#: While the engine works, how often /metrics is re-rendered (in process mode by the
#: engine process, between steps: ``engine.serving.engine_core``): the most the bytes a
#: scrape gets can lag the engine (plus one step).
METRICS_INTERVAL_S = 1.0
#: While the engine is idle (no step changes the metrics), how often it is still
#: re-rendered: for what is read at scrape time (``schedscope_dropped_spans_total``).
METRICS_IDLE_REFRESH_S = 5.0
#: A format nobody has scraped for this long is no longer rendered (engine process): an
#: engine whose scrapers have stopped renders nothing. The API process says a format is
#: still wanted at most once per ``METRICS_INTERVAL_S`` of scrapes.
METRICS_UNWANTED_AFTER_S = 3 * METRICS_IDLE_REFRESH_S


def metrics_render_due(
    age_s: float, changed: bool, idle: bool, interval_s: float = METRICS_INTERVAL_S
) -> bool:
    """Whether the exposition rendered ``age_s`` ago must be rendered again: the one rule
    of both engine cores. ``changed``: a step ran since; ``idle``: the engine has no work.
    After steps, at once when the engine has gone idle, else once per ``interval_s``;
    with no step since, every ``METRICS_IDLE_REFRESH_S`` while idle (values read at
    scrape time) and every ``interval_s`` while working."""
    if changed:
        return idle or age_s >= interval_s
    return age_s >= (METRICS_IDLE_REFRESH_S if idle else interval_s)


def engine_snapshot(engine: LLMEngine) -> dict:
    """The queue depths and pool usage behind /health, as EngineStats field names (sent
    as they are from an engine process)."""
    scheduler, blocks = engine.scheduler, engine.block_manager
    return {
        "num_running": len(scheduler.running),
        "num_waiting": scheduler.num_waiting,
        "num_swapped": len(scheduler.swapped),
        "num_free_device_blocks": blocks.num_free_device_blocks,
        "num_device_blocks": blocks.num_device_blocks,
        "num_free_host_blocks": blocks.num_free_host_blocks,
        "num_host_blocks": blocks.num_host_blocks,
        "num_observer_errors": engine.observers.num_errors,
        "last_step_at": time.time(),
    }


class AsyncEngine:
    """The engine behind an event loop: streams, adds and aborts on the loop's side; the
    step loop on a thread of this process. (``engine.serving.process_engine.ProcessEngine``
    keeps the same streams and runs the step loop in a process of its own.)"""

    def __init__(self, engine: LLMEngine, idle_wait_s: float = 0.05) -> None:
        self._init_streams(idle_wait_s, engine.clock_epoch_unix)
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        engine.observers.add(self._on_step)
        self.stats.faults = engine.faults.to_dict()
        self._refresh_stats()

    def _init_streams(self, idle_wait_s: float, clock_epoch_unix: float) -> None:
        """The event-loop side's state, whichever transport carries the commands."""
        self._streams: dict[str, _Stream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle_wait_s = idle_wait_s
        self.state = "created"  # created | running | draining | stopped | failed
        self.stats = EngineStats(clock_epoch_unix=clock_epoch_unix)
        #: Step-loop iterations and hand-offs to the event loop (the served path's own
        #: work: one hand-off per step at most, no spinning while idle).
        self.num_loop_iterations = 0
        self.num_handoffs = 0
        #: Times the engine's /metrics exposition was rendered (whichever format): a
        #: scrape is answered from the latest rendering (``render_metrics``), so this grows
        #: with time and steps, not with scrapes.
        self.num_metrics_renders = 0
        # thread mode's renderings: format -> (monotonic time, steps observed, rendered)
        self._metrics_cache: dict[bool, tuple[float, int, tuple[bytes, str]]] = {}
        #: Why the engine can no longer serve (its process died, or had to be killed at
        #: shutdown); None while it can. Set on the event loop, with every stream ended;
        #: the server then exits non-zero (``engine.api.signals``).
        self.failure: str | None = None
        self._lost = asyncio.Event()
        # time.monotonic() of the step loop's last sign of life (or of work arriving at
        # an idle engine): written by the step loop's side, read by /health
        self._progress_at = time.monotonic()

    @property
    def config(self):
        """The engine's :class:`engine.config.EngineConfig`."""
        return self.engine.config

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self.state != "created":
            return
        self._loop = asyncio.get_running_loop()
        self.state = "running"
        self._start_backend()

    def _start_backend(self) -> None:
        self._thread = threading.Thread(target=self._run, name="schedscope-engine", daemon=True)
        self._thread.start()

    async def shutdown(self, drain_timeout_s: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish for up to ``drain_timeout_s``,
        abort the rest, stop the step loop."""
        if self.state in ("created", "stopped"):
            self.state = "stopped"
            return
        if self.state != "failed":
            self.state = "draining"
        deadline = time.monotonic() + drain_timeout_s
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for request_id in list(self._streams):
            self.abort(request_id)
        while self._streams and time.monotonic() < deadline + 2.0:
            await asyncio.sleep(0.01)
        await self._stop_backend()
        self.state = "stopped"

    async def _stop_backend(self) -> None:
        self._stop.set()
        self._wakeup.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
            self._thread = None

    def _submit(self, command: _Add | _Abort) -> None:
        """Hand a command to the step loop (applied between steps, in order)."""
        self._commands.put(command)
        self._wakeup.set()

    @property
    def is_accepting(self) -> bool:
        return self.state == "running"

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def seconds_without_progress(self) -> float | None:
        """Liveness: while the engine has work (streams in flight, or requests the
        scheduler holds), the seconds since its step loop last turned (thread: a loop
        iteration; engine process: any message from it, each sent between steps), or
        since work came to an idle engine; None while it has no work."""
        if not self._streams and self.stats.num_unfinished == 0:
            return None
        return max(0.0, time.monotonic() - self._progress_at)

    async def wait_lost(self) -> str:
        """Wait until the engine can no longer serve; returns why (``failure``)."""
        await self._lost.wait()
        assert self.failure is not None
        return self.failure

    # -- requests (event-loop side) ----------------------------------------------------
    def now(self) -> float:
        """The engine clock's current time (thread-safe): stamp arrivals with it."""
        return self.engine.clock.now()

    async def add(self, request: EngineRequest) -> asyncio.Queue:
        """Submit a request (stamped now if it carries no arrival time); returns its
        output queue. Raises RequestRejected when the scheduler refuses it, ValueError
        for an id already in flight, EngineDeadError when the engine does not accept
        requests."""
        return (await self._add(request)).queue

    async def _add(self, request: EngineRequest) -> _Stream:
        if not self.is_accepting:
            raise EngineDeadError(f"engine is {self.state}")
        request_id = request.request_id
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in flight")
        request = request.stamped(self.now())
        if self.seconds_without_progress() is None:
            self._progress_at = time.monotonic()  # an idle engine owes no step until now
        stream = _Stream(asyncio.Queue())
        self._streams[request_id] = stream
        loop = self._loop
        assert loop is not None  # set by start(), before the state becomes "running"
        accepted: asyncio.Future = loop.create_future()
        self._submit(_Add(request, stream, accepted))
        try:
            await accepted
        except BaseException as exc:
            if self._streams.get(request_id) is stream:
                del self._streams[request_id]
            if isinstance(exc, asyncio.CancelledError):
                # The caller went away before the loop applied the add: the add still
                # happens, so take the request out again (commands apply in order).
                self.abort(request_id)
            raise
        return stream

    async def generate(self, request: EngineRequest) -> AsyncGenerator[RequestOutput, None]:
        """Stream a request's outputs. Leaving the iteration early (a disconnect, a
        cancelled task) aborts the request; its blocks are freed at the next step."""
        stream = await self._add(request)
        out_queue, sequence = stream.queue, stream.sequence
        finished = False
        try:
            while True:
                output: RequestOutput = await out_queue.get()
                finished = output.finished  # before yielding: closing after the end is no abort
                yield output
                if finished:
                    return
        finally:
            if not finished:
                self.abort(request.request_id, sequence)

    async def render_metrics(
        self, accept: str | None, timeout_s: float = 5.0
    ) -> tuple[bytes, str] | None:
        """The engine's Prometheus exposition, (body, content type) for the scraper's
        ``Accept`` header; None when the engine has no metrics (``engine.metrics``).
        Rendered here (prometheus_client's metrics are thread-safe), but at most once
        per ``METRICS_INTERVAL_S`` per format while the engine works (a render holds the
        GIL the step loop needs): meanwhile scrapes get the latest rendering. Once the
        engine is idle, a scrape after a step renders afresh. ``timeout_s`` is not
        needed."""
        metrics = getattr(self.engine, "metrics", None)
        if metrics is None:
            return None
        from engine.telemetry.exposition import wants_openmetrics

        fmt = wants_openmetrics(accept)
        now = time.monotonic()
        steps = metrics.num_steps
        cached = self._metrics_cache.get(fmt)
        if cached is not None:
            at, at_steps, rendered = cached
            if not metrics_render_due(now - at, at_steps != steps, not self.engine.has_work()):
                return rendered
        rendered = metrics.render(accept)
        self.num_metrics_renders += 1
        self._metrics_cache[fmt] = (now, steps, rendered)
        return rendered

    def abort(self, request_id: str, sequence: Sequence | None = None) -> None:
        """Thread-safe; takes effect between steps. With ``sequence``, only if that
        sequence still holds the id."""
        self._submit(_Abort(request_id, sequence))

    # -- the loop thread -----------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        clock = engine.clock
        idle = 0.0  # seconds waited with nothing to do since the last step
        while not self._stop.is_set():
            self.num_loop_iterations += 1
            self._progress_at = time.monotonic()
            self._apply_commands()
            if not engine.has_work():
                idle += self._wait(self._idle_wait_s, clock)
                continue
            try:
                record = engine.step(idle_before_s=idle)
            except Exception as exc:  # a scheduler bug: fail what is in flight, keep serving
                log.exception("engine step failed")
                self._recover(f"{type(exc).__name__}: {exc}")
                continue
            idle = 0.0
            if record.is_empty and engine.has_unfinished():
                # Nothing schedulable now (static batch forming): wait for a command.
                wake_at = record.wake_at
                delay = self._idle_wait_s if wake_at is None else max(0.0, wake_at - clock.now())
                idle += self._wait(min(delay, self._idle_wait_s), clock)
        self._apply_commands()

    def _wait(self, timeout_s: float, clock) -> float:
        """Sleep until a command arrives or ``timeout_s`` passes; returns the time slept."""
        started = clock.now()
        self._wakeup.wait(timeout_s)
        self._wakeup.clear()
        return clock.now() - started

    def _apply_commands(self) -> None:
        engine = self.engine
        ended: list[Sequence] = []
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Add):
                try:
                    seq = engine.add_request(command.request)
                except Exception as exc:  # caller mistakes: reported to that caller only
                    self._resolve(command.accepted, exc)
                    continue
                if seq.is_finished:
                    self._resolve(
                        command.accepted,
                        RequestRejected(seq.request_id, seq.reject_reason or "", seq),
                    )
                else:
                    self._resolve(command.accepted, seq, command.stream)
            else:
                held = engine.scheduler.requests.get(command.request_id)
                if held is None or (command.sequence is not None and held is not command.sequence):
                    continue  # already ended, or the id now belongs to a newer request
                aborted = engine.abort(command.request_id)
                if aborted is not None:
                    ended.append(aborted)
        if ended:
            # End the streams now rather than after the next step (which may be long);
            # the next step record reports these ends again, and is ignored for them.
            self._refresh_stats()
            self._call_in_loop(self._deliver, [], ended)

    def _recover(self, error: str) -> None:
        """After an unexpected exception: fail every unfinished request and start the
        scheduler over with empty pools (the blocks of failed requests are gone)."""
        try:
            self.engine.recover(error)  # its record reaches _on_step: failed streams end
        except Exception:
            log.exception("could not fail requests cleanly")
            self.engine.reset_scheduler()
        self.stats.errors.append(error)
        self._refresh_stats()
        # Requests that had already left the scheduler when it failed (finished in the
        # step whose record was never published) still have a consumer: end them too.
        self._call_in_loop(self._end_all_streams, error)

    def _on_step(self, record: StepRecord) -> None:
        """Observer: stats, and the step's tokens and ends to the event loop."""
        tokens = [
            (entry.seq, entry.token_id) for entry in record.scheduled if entry.token_id is not None
        ]
        ended = record.finished
        stats = self.stats
        stats.num_steps += 1
        if record.error:
            stats.errors.append(record.error)
            del stats.errors[:-20]  # keep the most recent ones
        self._refresh_stats()
        if tokens or ended:
            self._call_in_loop(self._deliver, tokens, list(ended))

    def _refresh_stats(self) -> None:
        self.stats.update(engine_snapshot(self.engine))

    # -- delivery (event-loop side) ------------------------------------------------------
    def _call_in_loop(self, fn, *args) -> None:
        self.num_handoffs += 1
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # loop closed between the check and the call
                pass

    def _resolve(self, future: asyncio.Future, value, stream: _Stream | None = None) -> None:
        def settle() -> None:
            if stream is not None:
                # Here, not where the caller resumes: this step's tokens are delivered
                # before that, and are matched to the stream by its sequence.
                stream.sequence = value
            if future.done():
                return
            if isinstance(value, BaseException):
                future.set_exception(value)
            else:
                future.set_result(value)

        self._call_in_loop(settle)

    def _engine_lost(self, error: str) -> None:
        """(event loop) The engine can no longer run: ``failure`` says why, every stream
        ends with ``error``, no request is unfinished any more (each has failed)."""
        self.failure = error
        stats = self.stats
        stats.num_running = stats.num_waiting = stats.num_swapped = 0
        self._end_all_streams(error)
        self._lost.set()

    def _end_all_streams(self, error: str) -> None:
        for request_id in list(self._streams):
            stream = self._streams.pop(request_id)
            stream.queue.put_nowait(
                RequestOutput(request_id, [], True, "error", error, stream.sequence)
            )

    def _deliver(self, tokens: list[tuple[Sequence, int]], ended: list[Sequence]) -> None:
        streams = self._streams
        batched: dict[str, tuple[_Stream, list[int]]] = {}
        for seq, token in tokens:
            entry = batched.get(seq.request_id)
            if entry is None:
                stream = streams.get(seq.request_id)
                if stream is None or stream.sequence is not seq:
                    continue  # its consumer left, or the id belongs to a newer request
                entry = batched[seq.request_id] = (stream, [])
            entry[1].append(token)
        for request_id, (stream, new) in batched.items():
            stream.queue.put_nowait(RequestOutput(request_id, new))
        for seq in ended:
            stream = streams.get(seq.request_id)
            if stream is None or stream.sequence is not seq:
                continue
            del streams[seq.request_id]
            stream.queue.put_nowait(
                RequestOutput(
                    seq.request_id,
                    [],
                    True,
                    seq.finish_reason,
                    seq.error,
                    seq,
                )
            )
