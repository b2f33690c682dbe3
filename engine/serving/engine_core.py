"""The engine core: the step loop in a process of its own (the child side).

Why a process: a served step's Python work (scheduling, building the batch, the
model's op dispatch, sampling) and the event loop's per-token work (queues, SSE
encoding, socket writes) need the same GIL; in one process every token the event
loop handles stalls a step. vLLM V1 split its EngineCore from the API server for the
same reason. The API process keeps the HTTP server, the tokenizer and the streams
(``engine.serving.process_engine``); this process owns the :class:`LLMEngine` and talks to
it over two pipes:

- commands in: ``("add", add_id, EngineRequest)``, ``("abort", request_id, seq_no)``,
  ``("metrics", fmt)``, ``("stop",)``;
- messages out: ``("ready", info)`` once built (or ``("failed", message)``),
  ``("added", add_id, seq_no, reject_reason)`` / ``("add_error", add_id, message)``,
  ``("outputs", tokens, ended, stats)`` — once per step and once per batch of aborts,
  where ``tokens`` is ``[(seq_no, token_id)]`` and ``ended`` is
  ``[(seq_no, finish_reason, error, num_cached_tokens)]`` —
  ``("metrics", step, num_renders, rendered)``,
  ``("metrics_unwanted", formats)``, and at shutdown ``("records", lost)`` once the
  record files are written (``lost``: the ``engine.records.writers.LostRecord`` of each
  file that could not be), then ``("stopped",)``.

``/metrics`` never waits on this process: the Prometheus exposition of the engine's
registry (``engine.telemetry.metrics``, which lives here, with the observers) is
*pushed* to the API process, which answers every scrape at once from the latest bytes.
A scrape cannot make this process render: ``("metrics", fmt)`` only says that a format
(``"text"``, the classic format; ``"openmetrics"``, with exemplars) is still being
scraped, sent at most once per :data:`METRICS_INTERVAL_S` per format however many
scrapes there are; :class:`_MetricsPublisher` renders every format asked for within
:data:`METRICS_UNWANTED_AFTER_S`, between steps, at most once per
:data:`METRICS_INTERVAL_S` while the engine works, and once more as soon as it goes idle
(a scrape after the last request ended sees it ended). A format not asked for within
:data:`METRICS_UNWANTED_AFTER_S` is dropped and ``("metrics_unwanted", formats)`` says
so (the API process forgets its bytes, so the next scrape waits for fresh ones, as a
format's first scrape does): an engine nobody scrapes renders nothing. ``rendered`` is
``{fmt: (body, content_type)}`` (``body`` None, ``content_type`` ``"error"`` when the
render failed), ``step`` the last step record's ``step`` the bytes include, ``num_renders``
how many times the engine process has rendered. So the bytes served are at most
:data:`METRICS_INTERVAL_S` (plus one step) old while the engine works, and current
once it is idle; rendering costs the engine at most one render of each format asked
for per interval, however many scrapers there are. ``info["metrics"]`` (in ``ready``)
says whether the engine has metrics at all (``--no-metrics``: none, and no renders).

Sequences are named by their engine-assigned ``seq_no``: unique for the life of the
engine, so an abort or an output can never reach a newer request that reuses an id.
The step record observers (token timing, ``--record-steps``, ``--record-requests``,
telemetry) run here.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.records.step_record import StepRecord
from engine.records.writers import RecordWriterSpec, install_record_writers, write_records
from engine.serving.async_engine import (
    METRICS_INTERVAL_S,
    METRICS_UNWANTED_AFTER_S,
    engine_snapshot,
    metrics_render_due,
)

if TYPE_CHECKING:  # imported at run time only when tracing is on (opentelemetry)
    from engine.telemetry.tracing import TracingSettings

log = logging.getLogger("schedscope.engine")

#: The ``Accept`` header each format is rendered for.
METRICS_FORMATS = {"text": None, "openmetrics": "application/openmetrics-text"}


@dataclass(frozen=True)
class EngineCoreSpec:
    """What the child needs to build its engine (picklable)."""

    config: EngineConfig
    executor: str = "torch"
    cost_model: dict | None = None  # CostModel.to_dict()
    torch_threads: int = 0  # 0: torch's default
    #: Observers that write a file at shutdown (``--record-steps`` and the like),
    #: built in the engine process.
    record_writers: tuple[RecordWriterSpec, ...] = ()
    #: The ``model_name`` label of the engine's Prometheus metrics; None: no metrics.
    metrics_model_name: str | None = None
    idle_wait_s: float = 0.05
    log_level: int = logging.INFO
    #: None: no spans. The tracer provider and its exporters live here, in the engine
    #: process, where the observers run.
    tracing: TracingSettings | None = None


def run_engine_core(spec: EngineCoreSpec, commands, outputs) -> None:
    """The child's main: build the engine, then serve commands until ``stop`` or until
    the API process goes away."""
    # The API process owns shutdown: a Ctrl-C sent to the process group must not kill
    # the engine under requests that are still draining.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=spec.log_level, format="%(asctime)s %(levelname)s %(name)s[core]: %(message)s"
    )
    try:
        engine, writers = _build(spec)
        core = _Core(engine, commands, outputs, spec.idle_wait_s)
        tracing = None
        if spec.tracing is not None:
            from engine.telemetry.tracing import install_tracing

            # after the core's own observer: tokens leave before spans are made
            tracing = install_tracing(engine, spec.tracing)
            publish_dropped_spans(engine, tracing)
    except Exception as exc:  # reported to the API process, which names it
        outputs.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    clock = engine.clock
    outputs.send(
        (
            "ready",
            {
                "clock_origin": clock.origin,
                "clock_epoch_unix": clock.epoch_unix,
                "num_device_blocks": engine.block_manager.num_device_blocks,
                "num_host_blocks": engine.block_manager.num_host_blocks,
                "metrics": getattr(engine, "metrics", None) is not None,
                "faults": engine.faults.to_dict(),
            },
        )
    )
    try:
        core.run()
    finally:
        # Records first: they are local files, quick to write, and the API process
        # waits for this process only so long. The span flush may wait on a slow
        # collector, within its own bound (TracingSettings' shutdown budget). Whatever
        # the records do, the spans are still flushed.
        try:
            lost = write_records(writers)
            # Now, not with "stopped": a span flush that outlasts the API process's
            # wait must not hide whether the records were written.
            _send_quietly(outputs, ("records", lost))
        finally:
            if tracing is not None:
                # A concurrent engine step cannot be running here: the loop has returned.
                shutdown_tracing(tracing)
            _send_quietly(outputs, ("stopped",))


def _send_quietly(outputs, message) -> None:
    try:
        outputs.send(message)
    except (BrokenPipeError, OSError):
        pass  # the API process is gone


def shutdown_tracing(tracing) -> None:
    """Flush and end the engine's spans (within the exporter's own bound), logging what
    became of them; both engine cores end their tracing here."""
    stats = tracing.shutdown()
    log.info(
        "spans: %d ended, %d exported, %d dropped",
        stats["spans"],
        stats["exported_spans"],
        stats["dropped_spans"],
    )


def publish_dropped_spans(engine, tracing) -> None:
    """``schedscope_dropped_spans_total`` reads the exporter's count at scrape time."""
    metrics = getattr(engine, "metrics", None)
    if metrics is not None:
        metrics.watch_dropped_spans(lambda: tracing.num_dropped_spans)


def _build(spec: EngineCoreSpec):
    from engine.core.cost_model import CostModel
    from engine.factory import build_engine

    if spec.executor == "torch" and spec.torch_threads:
        import torch

        torch.set_num_threads(spec.torch_threads)
    cost_model = CostModel.from_dict(spec.cost_model) if spec.cost_model else None
    engine = build_engine(spec.config, spec.executor, cost_model=cost_model)
    if spec.metrics_model_name is not None:
        from engine.telemetry.metrics import install_metrics

        install_metrics(engine, spec.metrics_model_name)
    return engine, install_record_writers(engine.observers, spec.config, spec.record_writers)


class _Core:
    def __init__(self, engine, commands, outputs, idle_wait_s: float) -> None:
        self.engine = engine
        self.commands = commands
        self.outputs = outputs
        self.idle_wait_s = idle_wait_s
        self.running = True
        self.last_step = 0  # the last step record's ``step``
        metrics = getattr(engine, "metrics", None)
        self.publisher = None if metrics is None else _MetricsPublisher(metrics, self._send)
        engine.observers.add(self._on_step)

    def run(self) -> None:
        engine = self.engine
        clock = engine.clock
        idle = 0.0
        publisher = self.publisher
        while self.running:
            if not self._apply_commands(0.0):
                return
            if not engine.has_work():
                if publisher is not None:
                    publisher.publish_if_due(self.last_step, idle=True)
                started = clock.now()
                if not self._apply_commands(self.idle_wait_s):
                    return
                idle += clock.now() - started
                continue
            try:
                record = engine.step(idle_before_s=idle)
            except Exception as exc:  # a scheduler bug: fail what is in flight, keep serving
                log.exception("engine step failed")
                error = f"{type(exc).__name__}: {exc}"
                try:
                    engine.recover(error)  # its record reaches _on_step: streams end
                except Exception:
                    log.exception("could not fail requests cleanly")
                    engine.reset_scheduler()
                continue
            idle = 0.0
            if publisher is not None:
                publisher.publish_if_due(self.last_step, idle=False)
            if record.is_empty and engine.has_unfinished():
                wake_at = record.wake_at
                delay = self.idle_wait_s if wake_at is None else max(0.0, wake_at - clock.now())
                started = clock.now()
                if not self._apply_commands(min(delay, self.idle_wait_s)):
                    return
                idle += clock.now() - started

    def _apply_commands(self, timeout_s: float) -> bool:
        """Apply every waiting command (waiting up to ``timeout_s`` for the first);
        False when the API process is gone or asked to stop."""
        engine = self.engine
        ended = []
        try:
            ready = self.commands.poll(timeout_s)
            while ready:
                command = self.commands.recv()
                kind = command[0]
                if kind == "add":
                    _, add_id, request = command
                    try:
                        seq = engine.add_request(request)
                    except Exception as exc:  # caller mistakes: reported to that caller only
                        self._send(("add_error", add_id, str(exc)))
                    else:
                        self._send(
                            (
                                "added",
                                add_id,
                                seq.seq_no,
                                seq.reject_reason if seq.is_finished else None,
                            )
                        )
                elif kind == "abort":
                    _, request_id, seq_no = command
                    held = engine.scheduler.requests.get(request_id)
                    if held is not None and (seq_no is None or held.seq_no == seq_no):
                        ended.append(engine.abort(request_id))
                elif kind == "metrics":
                    if self.publisher is not None:
                        self.publisher.want(command[1])
                elif kind == "stop":
                    self.running = False
                    break
                ready = self.commands.poll(0)
        except (EOFError, OSError):
            return False  # the API process is gone: stop
        if ended:
            # End the streams now rather than after the next step (which may be long);
            # the next step record reports these ends again, and is ignored for them.
            self._send(
                (
                    "outputs",
                    [],
                    [(s.seq_no, s.finish_reason, s.error, s.num_cached_tokens) for s in ended],
                    self._stats(),
                )
            )
        return self.running

    def _on_step(self, record: StepRecord) -> None:
        tokens = [(e.seq.seq_no, e.token_id) for e in record.scheduled if e.token_id is not None]
        ended = [(s.seq_no, s.finish_reason, s.error, s.num_cached_tokens) for s in record.finished]
        self.last_step = record.step
        self._send(("outputs", tokens, ended, self._stats(record)))

    def _stats(self, record: StepRecord | None = None) -> dict:
        stats = engine_snapshot(self.engine)
        if record is not None:
            stats["step"] = record.step
            if record.error:
                stats["error"] = record.error
        return stats

    def _send(self, message) -> None:
        try:
            self.outputs.send(message)
        except (BrokenPipeError, OSError):
            self.running = False


class _MetricsPublisher:
    """Renders the exposition between steps and pushes it to the API process: only the
    formats asked for within :data:`METRICS_UNWANTED_AFTER_S`, at most once per
    :data:`METRICS_INTERVAL_S` while the engine works, once when it goes idle after
    steps, and every :data:`METRICS_IDLE_REFRESH_S` while it stays idle. Nothing a
    scraper does makes it render more often; scrapers that stop make it stop."""

    def __init__(
        self,
        metrics,
        send,
        interval_s: float = METRICS_INTERVAL_S,
        clock=time.monotonic,
        unwanted_after_s: float = METRICS_UNWANTED_AFTER_S,
    ) -> None:
        self.metrics = metrics
        self.clock = clock
        self.send = send
        self.interval_s = interval_s
        self.unwanted_after_s = unwanted_after_s
        self.wanted_at: dict[str, float] = {}  # format -> when it was last asked for
        self.rendered_at = float("-inf")
        self.rendered_step = -1
        self.num_renders = 0

    @property
    def formats(self) -> list[str]:
        return list(self.wanted_at)

    def want(self, fmt: str) -> None:
        if fmt not in METRICS_FORMATS:
            return
        if fmt not in self.wanted_at:
            self.rendered_at = float("-inf")  # its first bytes: at once
        self.wanted_at[fmt] = self.clock()

    def publish_if_due(self, step: int, idle: bool) -> None:
        """``step``: the last step record's; ``idle``: the engine has no work."""
        if not self.wanted_at:
            return
        now = self.clock()
        unwanted = [f for f, at in self.wanted_at.items() if now - at > self.unwanted_after_s]
        if unwanted:
            for fmt in unwanted:
                del self.wanted_at[fmt]
            self.send(("metrics_unwanted", unwanted))
            if not self.wanted_at:
                return
        changed = step != self.rendered_step
        if metrics_render_due(now - self.rendered_at, changed, idle, self.interval_s):
            self.publish(step, now)

    def publish(self, step: int, now: float) -> None:
        rendered: dict[str, tuple[bytes | None, str]] = {}
        for fmt in self.formats:
            try:
                rendered[fmt] = self.metrics.render(METRICS_FORMATS[fmt])
            except Exception:  # never let a render stop the engine
                log.exception("rendering metrics failed")
                rendered[fmt] = (None, "error")
        self.num_renders += 1
        self.rendered_at, self.rendered_step = now, step
        self.send(("metrics", step, self.num_renders, rendered))
