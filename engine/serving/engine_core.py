"""The engine core: the step loop in a process of its own (the child side).

Why a process: a served step's Python work (scheduling, building the batch, the
model's op dispatch, sampling) and the event loop's per-token work (queues, SSE
encoding, socket writes) need the same GIL; in one process every token the event
loop handles stalls a step. vLLM V1 split its EngineCore from the API server for the
same reason. The API process keeps the HTTP server, the tokenizer and the streams
(``engine.serving.process_engine``); this process owns the :class:`LLMEngine` and talks to
it over two pipes:

- commands in: ``("add", add_id, EngineRequest)``, ``("abort", request_id, seq_no)``,
  ``("metrics", metrics_id, accept)``, ``("stop",)``;
- messages out: ``("ready", info)`` once built (or ``("failed", message)``),
  ``("added", add_id, seq_no, reject_reason)`` / ``("add_error", add_id, message)``,
  ``("outputs", tokens, ended, stats)`` — once per step and once per batch of aborts,
  where ``tokens`` is ``[(seq_no, token_id)]`` and ``ended`` is
  ``[(seq_no, finish_reason, error)]`` — ``("metrics", metrics_id, body, content_type)``,
  and at shutdown ``("records", lost)`` once the record files are written (``lost``:
  the ``engine.records.writers.LostRecord`` of each file that could not be), then
  ``("stopped",)``.

``metrics`` asks for the Prometheus exposition of the engine's registry
(``engine.telemetry.metrics``, which lives here, with the observers): ``accept`` is the
scraper's ``Accept`` header, which picks OpenMetrics (exemplars) or the classic text
format. It is answered between steps, like every command, with the rendered bytes and
their content type, or ``body`` None when the engine runs without metrics
(``--no-metrics``). The API process waits for the answer with a timeout.

Sequences are named by their engine-assigned ``seq_no``: unique for the life of the
engine, so an abort or an output can never reach a newer request that reuses an id.
The step record observers (token timing, ``--record-steps``, ``--record-requests``,
telemetry) run here.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.records.step_record import StepRecord
from engine.records.writers import RecordWriterSpec, install_record_writers, write_records
from engine.serving.async_engine import engine_snapshot

if TYPE_CHECKING:  # imported at run time only when tracing is on (opentelemetry)
    from engine.telemetry.tracing import TracingSettings

log = logging.getLogger("schedscope.engine")


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
                stats = tracing.shutdown()
                log.info(
                    "spans: %d ended, %d exported, %d dropped",
                    stats["spans"],
                    stats["exported_spans"],
                    stats["dropped_spans"],
                )
            _send_quietly(outputs, ("stopped",))


def _send_quietly(outputs, message) -> None:
    try:
        outputs.send(message)
    except (BrokenPipeError, OSError):
        pass  # the API process is gone


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
        engine.observers.add(self._on_step)

    def run(self) -> None:
        engine = self.engine
        clock = engine.clock
        idle = 0.0
        while self.running:
            if not self._apply_commands(0.0):
                return
            if not engine.has_work():
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
                    _, metrics_id, accept = command
                    self._send(("metrics", metrics_id, *self._render_metrics(accept)))
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
                    [(s.seq_no, s.finish_reason, s.error) for s in ended],
                    self._stats(),
                )
            )
        return self.running

    def _render_metrics(self, accept: str | None) -> tuple[bytes | None, str | None]:
        metrics = getattr(self.engine, "metrics", None)
        if metrics is None:
            return None, None
        try:
            return metrics.render(accept)
        except Exception:  # never let a scrape stop the engine
            log.exception("rendering metrics failed")
            return None, "error"

    def _on_step(self, record: StepRecord) -> None:
        tokens = [(e.seq.seq_no, e.token_id) for e in record.scheduled if e.token_id is not None]
        ended = [(s.seq_no, s.finish_reason, s.error) for s in record.finished]
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
