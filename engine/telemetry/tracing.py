"""The tracer provider and its exporters: where the engine's spans go.

- a file of OTLP-JSON lines (``--trace-file``): one ``{"resourceSpans": [...]}`` object
  per line per export batch, ids in hex, 64-bit integers as strings (the OTLP/JSON
  encoding; ``harness.records.spans`` reads it back);
- OTLP/HTTP protobuf (``--otlp-traces-endpoint`` or the standard
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``);
- nothing (``--no-tracing``, ``OTEL_SDK_DISABLED=true``, or neither of the above).

Each exporter sits behind its own :class:`CountingBatchSpanProcessor`: export runs on
the processor's thread, never on the step loop, and every span the processor loses
(queue full, a failed export, ended after shutdown) is counted in
``num_dropped_spans``. The provider is never made global: each engine (and each
simulated policy) has its own.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

if TYPE_CHECKING:
    from engine.telemetry.spans import SpanObserver

log = logging.getLogger("schedscope.telemetry")

#: Sized for the engine's rates (see docs/telemetry.md): a finishing request emits its
#: whole history at once, so bursts of a few thousand spans are normal at 32+ streams.
#: 32k queued spans are ~50 MB at worst; the SDK's 2,048 loses spans under bursts.
DEFAULT_MAX_QUEUE_SIZE = 32768
DEFAULT_MAX_EXPORT_BATCH_SIZE = 2048
DEFAULT_SCHEDULE_DELAY_MS = 500.0
DEFAULT_STEPS_PER_TRACE = 100

INSTRUMENTATION_SCOPE = "schedscope.engine"


@dataclass(frozen=True)
class TracingSettings:
    """Where spans go and how they are batched (picklable: the engine process gets it)."""

    trace_file: Path | None = None
    otlp_endpoint: str | None = None  # the full traces URL (…/v1/traces)
    #: Export over OTLP/HTTP with the endpoint the OTEL_EXPORTER_OTLP_* variables give.
    otlp_from_env: bool = False
    service_name: str | None = None  # None: OTEL_SERVICE_NAME, else "schedscope"
    model_name: str = ""  # gen_ai.request.model
    resource_attributes: tuple[tuple[str, str], ...] = ()
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    max_export_batch_size: int = DEFAULT_MAX_EXPORT_BATCH_SIZE
    schedule_delay_ms: float = DEFAULT_SCHEDULE_DELAY_MS
    steps_per_trace: int = DEFAULT_STEPS_PER_TRACE

    @property
    def enabled(self) -> bool:
        return self.trace_file is not None or self.otlp_endpoint is not None or self.otlp_from_env


def env_otlp_traces_endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """The OTLP traces endpoint the standard variables name (None when they name none,
    or ``OTEL_TRACES_EXPORTER`` says ``none``)."""
    environ = os.environ if environ is None else environ
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        return base.rstrip("/") + "/v1/traces"
    return None


def sdk_disabled(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def resolve_tracing(
    trace_file: Path | None = None,
    otlp_endpoint: str | None = None,
    no_tracing: bool = False,
    model_name: str = "",
    environ: Mapping[str, str] | None = None,
    **overrides,
) -> TracingSettings | None:
    """What the flags and the environment ask for; None when tracing is off.

    Off with ``--no-tracing`` or ``OTEL_SDK_DISABLED=true``; otherwise a file when
    ``--trace-file`` is given, OTLP/HTTP when ``--otlp-traces-endpoint`` or the
    ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` variables are set (both when both are),
    and off when none is."""
    environ = os.environ if environ is None else environ
    if no_tracing or sdk_disabled(environ):
        return None
    from_env = otlp_endpoint is None and env_otlp_traces_endpoint(environ) is not None
    settings = TracingSettings(
        trace_file=trace_file,
        otlp_endpoint=otlp_endpoint,
        otlp_from_env=from_env,
        model_name=model_name,
        service_name=environ.get("OTEL_SERVICE_NAME") or None,
        **overrides,
    )
    return settings if settings.enabled else None


# -- ids ------------------------------------------------------------------------------
#: How long a shutdown waits for the exporters in all (an unreachable collector must
#: not keep a stopping engine process past the API process's wait for it: 15 s).
SHUTDOWN_BUDGET_MS = 8000


# -- finished spans, built directly ---------------------------------------------------
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)


class FinishedSpans:
    """Builds spans that are already over — as the SDK's ``ReadableSpan`` — and hands
    them to the span processors.

    The engine's spans are made after the fact, with known ids, start and end, so the
    SDK's live-span path (a sampler call, context objects, attribute validation under
    a lock, the end-time bookkeeping) is pure cost on the step loop: 18 µs a span here,
    against 5 µs built directly. Every span built is recorded (sampled); the span
    observer builds none for a request whose client ``traceparent`` is not sampled
    (what the SDK's default parent-based sampler would decide)."""

    def __init__(self, processors: Sequence, resource: Resource, scope_name: str) -> None:
        self.processors = list(processors)
        self.resource = resource
        self.scope = InstrumentationScope(scope_name)
        self._random = random.Random()

    def new_span_id(self) -> int:
        return self._random.getrandbits(64) or 1

    def new_trace_id(self) -> int:
        return self._random.getrandbits(128) or 1

    def context(self, trace_id: int, span_id: int | None = None) -> SpanContext:
        return SpanContext(
            trace_id,
            span_id if span_id is not None else self.new_span_id(),
            is_remote=False,
            trace_flags=_SAMPLED,
        )

    def emit(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        start_ns: int,
        end_ns: int,
        attributes: dict,
        events: Sequence = (),
        status: Status | None = None,
    ) -> None:
        """One finished span. As the SDK would: attributes whose value is None are left
        out and lists become tuples; values must otherwise be OTel attribute types."""
        span = ReadableSpan(
            name,
            context,
            parent,
            self.resource,
            {k: tuple(v) if type(v) is list else v for k, v in attributes.items() if v is not None},
            events,
            (),
            kind,
            None,
            status or _UNSET,
            start_ns,
            end_ns,
            self.scope,
        )
        for processor in self.processors:
            processor.on_end(span)


# -- counting drops ------------------------------------------------------------------
class _CountingExporter(SpanExporter):
    """Counts what the processor hands to the real exporter, and what that lost."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self.num_exported = 0
        self.num_failed = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.exporter.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
            log.exception("span export failed")
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                self.num_exported += len(spans)
            else:
                self.num_failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class _DropCounter:
    """The batch processor's metrics hook (the SDK's ``ProcessorMetricsT``): the SDK
    calls ``drop_items`` exactly where it drops a span, so the count is the SDK's own."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.num_queue_full = 0
        self.num_after_shutdown = 0

    def register_queue_size(self, get_queue_size) -> None:
        self.inner.register_queue_size(get_queue_size)

    def drop_items(self, count: int, error_type: str = "queue_full") -> None:
        if error_type == "already_shutdown":
            self.num_after_shutdown += count
        else:
            self.num_queue_full += count
        self.inner.drop_items(count, error_type)

    def finish_items(self, count: int) -> None:
        self.inner.finish_items(count)


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """A ``BatchSpanProcessor`` that counts every span it loses.

    ``num_ended`` spans reached it; ``num_exported`` were exported;
    ``num_dropped_spans`` were lost: queue full, a failed export, or ended after
    shutdown. Once shut down, ``num_ended == num_exported + num_dropped_spans`` exactly.
    While running, the queue-full count is the SDK's own, which can run a span or two
    ahead under contention (the SDK tests "queue full" without a lock, so a span the
    worker made room for in between is counted as dropped and still exported); at
    shutdown, when nothing is queued any more, it is recomputed from what was exported.
    """

    def __init__(self, exporter: SpanExporter, **kwargs) -> None:
        self.counting_exporter = _CountingExporter(exporter)
        super().__init__(self.counting_exporter, **kwargs)
        batch = self._batch_processor
        self._drops = _DropCounter(batch._metrics)
        batch._metrics = self._drops  # the SDK's drop hook (see _DropCounter)
        self.num_ended = 0
        self._drained = False

    def shutdown(self, timeout_millis: int = 30000) -> None:
        # The SDK's shutdown waits up to 30 s for an export in progress (an unreachable
        # collector); a bound of our own keeps the engine's exit quick.
        self._batch_processor.shutdown(timeout_millis=timeout_millis)
        self._drained = True

    def on_end(self, span: ReadableSpan) -> None:
        if span.context and span.context.trace_flags.sampled:
            self.num_ended += 1
            self._batch_processor.emit(span)

    @property
    def num_exported(self) -> int:
        return self.counting_exporter.num_exported

    @property
    def dropped_by_reason(self) -> dict[str, int]:
        failed = self.counting_exporter.num_failed
        after = self._drops.num_after_shutdown
        queue_full = self._drops.num_queue_full
        not_flushed = 0
        if self._drained:  # exact: every span ended before shutdown was exported or lost
            lost = self.num_ended - after - self.num_exported - failed
            # What the SDK saw dropped from a full queue, at most; the rest were still
            # queued when the shutdown's bound ran out.
            queue_full = min(queue_full, lost)
            not_flushed = lost - queue_full
        return {
            "queue_full": queue_full,
            "export_failed": failed,
            "after_shutdown": after,
            "not_flushed": not_flushed,
        }

    @property
    def num_dropped_spans(self) -> int:
        return sum(self.dropped_by_reason.values())


# -- the OTLP-JSON lines file --------------------------------------------------------
def _any_value(value) -> dict:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _key_values(attributes) -> list[dict]:
    if not attributes:
        return []
    return [{"key": k, "value": _any_value(v)} for k, v in attributes.items()]


def span_to_otlp_json(span: ReadableSpan) -> dict:
    """One span in the OTLP/JSON encoding (hex ids, int64 as strings, enums as ints)."""
    ctx = span.context
    out = {
        "traceId": f"{ctx.trace_id:032x}",
        "spanId": f"{ctx.span_id:016x}",
        "name": span.name,
        "kind": span.kind.value + 1,  # SDK INTERNAL=0 ...; OTLP UNSPECIFIED=0, INTERNAL=1
        "startTimeUnixNano": str(span.start_time),
        "endTimeUnixNano": str(span.end_time),
        "attributes": _key_values(span.attributes),
        "flags": 0x100
        | (0x200 if span.parent is not None and span.parent.is_remote else 0)
        | int(ctx.trace_flags),
    }
    if span.parent is not None:
        out["parentSpanId"] = f"{span.parent.span_id:016x}"
    if span.events:
        out["events"] = [
            {
                "timeUnixNano": str(e.timestamp),
                "name": e.name,
                "attributes": _key_values(e.attributes),
            }
            for e in span.events
        ]
    if span.links:
        out["links"] = [
            {
                "traceId": f"{link.context.trace_id:032x}",
                "spanId": f"{link.context.span_id:016x}",
                "attributes": _key_values(link.attributes),
            }
            for link in span.links
        ]
    status: dict[str, int | str] = {"code": span.status.status_code.value}
    if span.status.description:
        status["message"] = span.status.description
    out["status"] = status
    for name in ("dropped_attributes", "dropped_events", "dropped_links"):
        count = getattr(span, name, 0)
        if count:
            out[
                {
                    "dropped_attributes": "droppedAttributesCount",
                    "dropped_events": "droppedEventsCount",
                    "dropped_links": "droppedLinksCount",
                }[name]
            ] = count
    return out


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> dict:
    """An ``ExportTraceServiceRequest`` in OTLP/JSON: spans grouped by resource and scope."""
    by_resource: dict[int, tuple[Resource, dict]] = {}
    for span in spans:
        resource = span.resource
        _, scopes = by_resource.setdefault(id(resource), (resource, {}))
        scope = span.instrumentation_scope
        key = (scope.name, scope.version) if scope is not None else ("", None)
        scopes.setdefault(key, []).append(span_to_otlp_json(span))
    resource_spans = []
    for resource, scopes in by_resource.values():
        scope_spans = []
        for (name, version), encoded in scopes.items():
            scope_json = {"name": name}
            if version:
                scope_json["version"] = version
            scope_spans.append({"scope": scope_json, "spans": encoded})
        resource_spans.append(
            {
                "resource": {"attributes": _key_values(resource.attributes)},
                "scopeSpans": scope_spans,
            }
        )
    return {"resourceSpans": resource_spans}


class OtlpJsonLinesExporter(SpanExporter):
    """Appends one OTLP/JSON ``ExportTraceServiceRequest`` per export batch, one a line.

    Each line is written whole or not at all: the batch's bytes go out in one unbuffered
    write (looped over short writes), and when one fails (``ENOSPC``: a full disk) the
    file is cut back to the end of the last whole line, so the next batch starts on a
    fresh line once space returns. The failed batch's spans are lost, and counted (the
    export fails; ``CountingBatchSpanProcessor`` counts them as ``export_failed``). If
    the cut itself fails, the next line starts with a newline: the torn line stands
    alone rather than swallowing the lines after it."""

    def __init__(self, path: Path, truncate: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "wb" if truncate else "ab", buffering=0)  # noqa: SIM115
        self._lock = threading.Lock()
        #: Where the last whole line ends (what a failed write is cut back to).
        self._end = self._file.seek(0, os.SEEK_END)
        #: Bytes of a failed write may follow ``_end`` (not cut back yet).
        self._torn = False
        self._failing = False  # the last write failed (logged once per outage)
        #: Batches (and their spans) a failed write lost.
        self.num_failed_batches = 0
        self.num_failed_spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = (json.dumps(spans_to_otlp_json(spans), separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            try:
                if self._torn and not self._cut_back():
                    data = b"\n" + data  # the torn line stays its own line
                self._write_all(data)
                self._end = self._file.tell()
            except OSError as exc:
                if not self._failing:  # once per outage, not once per batch
                    self._failing = True
                    log.warning(
                        "trace file %s: cannot write (%s); dropping spans until it can",
                        self.path,
                        exc.strerror or exc,
                    )
                self._torn = True
                self._cut_back()
                self.num_failed_batches += 1
                self.num_failed_spans += len(spans)
                return SpanExportResult.FAILURE
            if self._failing:
                self._failing = False
                log.warning(
                    "trace file %s: writing again (%d spans in %d batches were dropped)",
                    self.path,
                    self.num_failed_spans,
                    self.num_failed_batches,
                )
        return SpanExportResult.SUCCESS

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = self._file.write(view)
            if not written:
                raise OSError(errno.EIO, "the write wrote nothing")
            view = view[written:]

    def _cut_back(self) -> bool:
        """Drop what follows the last whole line; True when that worked (nothing torn
        is left)."""
        try:
            self._file.truncate(self._end)
            self._file.seek(self._end)
        except OSError:
            return False
        self._torn = False
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


# -- the provider -------------------------------------------------------------------
class Tracing:
    """One engine's tracer provider, its processors and their drop counts."""

    def __init__(
        self,
        settings: TracingSettings,
        exporters: list[SpanExporter] | None = None,
        truncate_file: bool = True,
    ) -> None:
        self.settings = settings
        attributes = dict(settings.resource_attributes)
        attributes["service.name"] = settings.service_name or "schedscope"
        self.provider = TracerProvider(resource=Resource.create(attributes))
        if exporters is None:
            exporters = []
            if settings.trace_file is not None:
                exporters.append(OtlpJsonLinesExporter(settings.trace_file, truncate_file))
            if settings.otlp_endpoint is not None or settings.otlp_from_env:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                exporters.append(OTLPSpanExporter(endpoint=settings.otlp_endpoint))
        self.processors = [
            CountingBatchSpanProcessor(
                exporter,
                max_queue_size=_env_int("OTEL_BSP_MAX_QUEUE_SIZE", settings.max_queue_size),
                max_export_batch_size=min(
                    _env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", settings.max_export_batch_size),
                    _env_int("OTEL_BSP_MAX_QUEUE_SIZE", settings.max_queue_size),
                ),
                schedule_delay_millis=_env_int(
                    "OTEL_BSP_SCHEDULE_DELAY", settings.schedule_delay_ms
                ),
            )
            for exporter in exporters
        ]
        for processor in self.processors:
            self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer(INSTRUMENTATION_SCOPE)
        #: What the span observer emits through (FinishedSpans: no live-span overhead).
        self.finished_spans = FinishedSpans(
            self.processors, self.provider.resource, INSTRUMENTATION_SCOPE
        )
        self.observer: SpanObserver | None = None  # the one feeding it, once installed
        self._shut_down = False

    @property
    def num_spans_ended(self) -> int:
        """Spans ended (the most any one exporter was given)."""
        return max((p.num_ended for p in self.processors), default=0)

    @property
    def num_spans_exported(self) -> int:
        return sum(p.num_exported for p in self.processors)

    @property
    def num_dropped_spans(self) -> int:
        """Spans lost on their way out, summed over exporters (what
        ``schedscope_dropped_spans_total`` publishes)."""
        return sum(p.num_dropped_spans for p in self.processors)

    def stats(self) -> dict:
        return {
            "spans": self.num_spans_ended,
            "exported_spans": self.num_spans_exported,
            "dropped_spans": self.num_dropped_spans,
        }

    def force_flush(self) -> None:
        self.provider.force_flush()

    def shutdown(self) -> dict:
        """Export what is queued, close the exporters, warn when spans were lost."""
        if not self._shut_down:
            self._shut_down = True
            if self.observer is not None:
                self.observer.close()
            budget = SHUTDOWN_BUDGET_MS // max(1, len(self.processors))
            for processor in self.processors:
                processor.shutdown(timeout_millis=budget)
            self.provider.shutdown()  # the processors are done: nothing left to wait for
            dropped = self.num_dropped_spans
            if dropped:
                reasons: dict[str, int] = {}
                for p in self.processors:
                    for k, v in p.dropped_by_reason.items():
                        reasons[k] = reasons.get(k, 0) + v
                log.warning(
                    "tracing dropped %d of %d spans (%s); raise OTEL_BSP_MAX_QUEUE_SIZE "
                    "or check the exporter",
                    dropped,
                    self.num_spans_ended,
                    ", ".join(f"{k} {v}" for k, v in reasons.items() if v),
                )
        return self.stats()


def _env_int(name: str, default):
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        log.warning("ignoring %s=%r: not an integer", name, value)
        return default


def install_tracing(engine, settings: TracingSettings, truncate_file: bool = True) -> Tracing:
    """Build ``settings``' provider and add its span observer to ``engine`` (an
    ``LLMEngine``). Keep the returned :class:`Tracing`: its ``num_dropped_spans`` is the
    drop count, and its ``shutdown()`` ends the open spans and flushes (call it when
    the engine stops)."""
    from engine.telemetry.spans import SpanObserver

    tracing = Tracing(settings, truncate_file=truncate_file)
    tracing.observer = SpanObserver(
        tracing.finished_spans,
        engine.clock_epoch_unix,
        policy=engine.config.scheduler.scheduling_policy,
        model_name=settings.model_name or engine.config.model,
        bytes_per_block=engine.kv_plan.bytes_per_block,
        steps_per_trace=settings.steps_per_trace,
    )
    engine.observers.add(tracing.observer)
    return tracing
