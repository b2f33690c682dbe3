"""The engine behind a server: the step loop on its own thread, tokens streamed to asyncio.

Why a thread: a step is blocking work (torch releases the GIL while it computes; the
simulated executor sleeps), and the event loop must keep serving sockets meanwhile.
The loop thread owns the :class:`LLMEngine`; every other thread talks to it through
a command queue applied between steps, so the engine itself needs no locks. After
each step the thread hands the step's new tokens to the event loop in one
``call_soon_threadsafe`` call; each request's consumer reads its own
``asyncio.Queue``, so a slow client only lets its own queue grow (bounded by its
``max_tokens``) and never holds up a step.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from engine.llm_engine import LLMEngine, StepOutcome
from engine.sequence import SamplingParams, Sequence

log = logging.getLogger("schedscope.engine")


class EngineDeadError(RuntimeError):
    """The engine loop is not running (stopped, or shutting down)."""


class RequestRejected(Exception):
    """The scheduler refused the request; ``reason`` is a decisions.REASON_* value."""

    def __init__(self, request_id: str, reason: str, sequence: Sequence) -> None:
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
    errors: list[str] = field(default_factory=list)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, idle_wait_s: float = 0.05) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._idle_wait_s = idle_wait_s
        self.state = "created"  # created | running | draining | stopped | failed
        self.stats = EngineStats()
        self.step_listeners: list[Callable[[StepOutcome], None]] = []
        self._refresh_stats()

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="schedscope-engine", daemon=True)
        self.state = "running"
        self._thread.start()

    async def shutdown(self, drain_timeout_s: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish for up to ``drain_timeout_s``,
        abort the rest, stop the loop thread."""
        if self._thread is None:
            self.state = "stopped"
            return
        self.state = "draining"
        deadline = time.monotonic() + drain_timeout_s
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for request_id in list(self._streams):
            self.abort(request_id)
        while self._streams and time.monotonic() < deadline + 2.0:
            await asyncio.sleep(0.01)
        self._stop.set()
        self._wakeup.set()
        await asyncio.to_thread(self._thread.join, 5.0)
        self._thread = None
        self.state = "stopped"

    @property
    def is_accepting(self) -> bool:
        return self.state == "running"

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    # -- requests (event-loop side) ----------------------------------------------------
    async def add(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        request_class: str = "",
    ) -> asyncio.Queue:
        """Submit a request; returns its output queue. Raises RequestRejected when
        the scheduler refuses it, ValueError for a duplicate id, EngineDeadError
        when the engine does not accept requests."""
        if not self.is_accepting:
            raise EngineDeadError(f"engine is {self.state}")
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in flight")
        stream = _Stream(asyncio.Queue())
        self._streams[request_id] = stream
        accepted: asyncio.Future = self._loop.create_future()
        self._commands.put(("add", request_id, prompt_token_ids, params, priority, request_class,
                            accepted))
        self._wakeup.set()
        try:
            seq = await accepted
        except BaseException as exc:
            self._streams.pop(request_id, None)
            if isinstance(exc, asyncio.CancelledError):
                # The caller went away before the loop applied the add: the add still
                # happens, so take the request out again (commands apply in order).
                self.abort(request_id)
            raise
        stream.sequence = seq
        return stream.queue

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        request_class: str = "",
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs. Leaving the iteration early (a disconnect, a
        cancelled task) aborts the request; its blocks are freed at the next step."""
        out_queue = await self.add(request_id, prompt_token_ids, params, priority, request_class)
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
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Thread-safe; takes effect between steps."""
        self._commands.put(("abort", request_id))
        self._wakeup.set()

    # -- the loop thread -----------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        while not self._stop.is_set():
            self._apply_commands()
            if not engine.has_unfinished():
                self._wakeup.wait(self._idle_wait_s)
                self._wakeup.clear()
                continue
            try:
                outcome = engine.step()
            except Exception as exc:  # a scheduler bug: fail what is in flight, keep serving
                log.exception("engine step failed")
                self._recover(f"{type(exc).__name__}: {exc}")
                continue
            if outcome.error:
                self.stats.errors.append(outcome.error)
                del self.stats.errors[:-20]  # keep the most recent ones
            self._publish(outcome)
            for listener in self.step_listeners:
                try:
                    listener(outcome)
                except Exception:  # telemetry must never take the engine down
                    log.exception("step listener failed")
            if outcome.output.is_empty:
                # Nothing schedulable now (static batch forming): wait for a command.
                wake_at = outcome.output.wake_at
                delay = self._idle_wait_s if wake_at is None else max(0.0, wake_at - engine.clock.now())
                self._wakeup.wait(min(delay, self._idle_wait_s))
                self._wakeup.clear()
        self._apply_commands()

    def _apply_commands(self) -> None:
        engine = self.engine
        ended: list[Sequence] = []
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command[0] == "add":
                _, request_id, prompt, params, priority, request_class, accepted = command
                try:
                    seq = engine.add_request(request_id, prompt, params, priority, request_class)
                except Exception as exc:  # caller mistakes: reported to that caller only
                    self._resolve(accepted, exc)
                    continue
                if seq.is_finished:
                    self._resolve(accepted, RequestRejected(request_id, seq.reject_reason or "", seq))
                else:
                    self._resolve(accepted, seq)
            else:
                seq = engine.abort(command[1])
                if seq is not None:
                    ended.append(seq)
        if ended:
            self._refresh_stats()
            self._call_in_loop(self._deliver, [], ended)

    def _recover(self, error: str) -> None:
        """After an unexpected exception: fail every unfinished request and start the
        scheduler over with empty pools (the blocks of failed requests are gone)."""
        scheduler = self.engine.scheduler
        failed = list(scheduler.requests.values())
        now = self.engine.clock.now()
        for seq in failed:
            seq.error = error
        try:
            scheduler.fail(failed, now, error)
        except Exception:
            log.exception("could not fail requests cleanly")
        self.engine.reset_scheduler()
        self.stats.errors.append(error)
        self._refresh_stats()
        self._call_in_loop(self._deliver, [], failed)
        # Requests that had already left the scheduler when it failed (finished in the
        # step whose outcome was never published) still have a consumer: end them too.
        self._call_in_loop(self._end_all_streams, error)

    def _publish(self, outcome: StepOutcome) -> None:
        tokens = [
            (seq.request_id, token)
            for seq, token in zip(outcome.output.seqs, outcome.result.sampled, strict=False)
            if token is not None
        ]
        ended = list(outcome.finished)
        self.stats.num_steps += 1
        self._refresh_stats()
        if tokens or ended:
            self._call_in_loop(self._deliver, tokens, ended)

    def _refresh_stats(self) -> None:
        scheduler = self.engine.scheduler
        blocks = self.engine.block_manager
        stats = self.stats
        stats.num_running = len(scheduler.running)
        stats.num_waiting = scheduler.num_waiting
        stats.num_swapped = len(scheduler.swapped)
        stats.num_free_device_blocks = blocks.num_free_device_blocks
        stats.num_device_blocks = blocks.num_device_blocks
        stats.num_free_host_blocks = blocks.num_free_host_blocks
        stats.num_host_blocks = blocks.num_host_blocks
        stats.last_step_at = time.time()

    # -- delivery (event-loop side) ------------------------------------------------------
    def _call_in_loop(self, fn, *args) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # loop closed between the check and the call
                pass

    def _resolve(self, future: asyncio.Future, value) -> None:
        def settle() -> None:
            if future.done():
                return
            if isinstance(value, BaseException):
                future.set_exception(value)
            else:
                future.set_result(value)

        self._call_in_loop(settle)

    def _end_all_streams(self, error: str) -> None:
        for request_id in list(self._streams):
            stream = self._streams.pop(request_id)
            stream.queue.put_nowait(RequestOutput(request_id, [], True, "error", error,
                                                  stream.sequence))

    def _deliver(self, tokens: list[tuple[str, int]], ended: list[Sequence]) -> None:
        streams = self._streams
        batched: dict[str, list[int]] = {}
        for request_id, token in tokens:
            batched.setdefault(request_id, []).append(token)
        for request_id, new in batched.items():
            stream = streams.get(request_id)
            if stream is not None:
                stream.queue.put_nowait(RequestOutput(request_id, new))
        for seq in ended:
            stream = streams.pop(seq.request_id, None)
            if stream is not None:
                stream.queue.put_nowait(RequestOutput(
                    seq.request_id, [], True, seq.finish_reason, seq.error, seq,
                ))
