"""The trace file: OTLP-JSON lines written by a simulated run, read back into
spans.parquet (harness.records.spans) with the attributes as columns."""

from __future__ import annotations

import errno
import json
import os

import polars as pl
import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from engine.telemetry import spans as sp
from engine.telemetry.tracing import (
    CountingBatchSpanProcessor,
    OtlpJsonLinesExporter,
    Tracing,
    TracingSettings,
    resolve_tracing,
)
from harness.profiles import resolve_profile
from harness.records.spans import read_spans
from harness.simulate.driver import run_simulations


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim")
    configs = {
        "priority": EngineConfig(
            SchedulerConfig(scheduling_policy="priority"),
            CacheConfig(num_gpu_blocks_override=150, num_cpu_blocks_override=30),
        )
    }
    summary = run_simulations(
        resolve_profile("default"),
        configs,
        CostModel(),
        out,
        num_requests=150,
        trace_file=out / "spans.jsonl",
    )
    return out, summary


def test_the_file_is_otlp_json_lines(simulated):
    out, _ = simulated
    lines = (out / "spans.jsonl").read_text().splitlines()
    assert lines
    for line in lines:
        request = json.loads(line)
        assert list(request) == ["resourceSpans"]
        for rs in request["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    assert len(span["traceId"]) == 32 and len(span["spanId"]) == 16
                    int(span["traceId"], 16)
                    assert isinstance(span["startTimeUnixNano"], str)
                    assert isinstance(span["kind"], int)
                    for kv in span["attributes"]:
                        if "intValue" in kv["value"]:
                            assert isinstance(kv["value"]["intValue"], str)


def test_spans_parquet_has_a_row_per_span_and_attribute_columns(simulated):
    out, summary = simulated
    frame = pl.read_parquet(out / "spans.parquet")
    stats = summary["policies"]["priority"]["tracing"]
    assert stats["dropped_spans"] == 0
    assert frame.height == stats["spans"] == stats["exported_spans"]
    assert frame.equals(read_spans(out / "spans.jsonl"))
    for column in (
        "name",
        "trace_id",
        "span_id",
        "parent_span_id",
        "start",
        "end",
        "duration_s",
        "request_id",
        "kind",
        "status",
        "attr.gen_ai.request.model",
        "attr.gen_ai.usage.output_tokens",
        "attr.schedscope.preempt.mode",
        "resource.schedscope.policy",
        "resource.service.name",
    ):
        assert column in frame.columns, column
    assert frame.schema["attr.gen_ai.usage.output_tokens"] == pl.Int64
    assert frame.schema["attr.schedscope.ttft_s"] == pl.Float64
    assert frame.schema["attr.gen_ai.response.finish_reasons"] == pl.List(pl.String)
    requests = pl.read_parquet(out / "requests.parquet")
    roots = frame.filter(pl.col("name") == sp.LLM_REQUEST)
    assert roots.height == requests.height
    joined = requests.join(roots, on="request_id")
    assert (joined["output_tokens"] == joined["attr.gen_ai.usage.output_tokens"]).all()
    assert (joined["kind"] == "server").all()
    # virtual time: Unix time = engine time (the simulator's epoch is 0)
    assert (joined["start"] - joined["scheduled_at"]).abs().max() < 1e-6
    decisions = pl.read_parquet(out / "decisions.parquet").filter(
        ~pl.col("kind").is_in(list(sp.STEP_EVENT_KINDS))
    )
    decision_spans = frame.filter(pl.col("attr.schedscope.decision").is_not_null())
    assert decision_spans.height == decisions.height
    assert (
        decisions["kind"]
        .value_counts()
        .sort("kind")
        .equals(
            decision_spans["attr.schedscope.decision"].alias("kind").value_counts().sort("kind")
        )
    )
    assert decision_spans.filter(pl.col("name") == "swap_out").height > 0
    assert decision_spans.filter(pl.col("name") == "recompute").height > 0
    # parents: each decision span's parent is its request's llm_request span
    parents = decision_spans.join(
        roots.select("span_id", "trace_id", "request_id"),
        left_on="parent_span_id",
        right_on="span_id",
        suffix="_root",
    )
    assert parents.height == decision_spans.height
    assert (parents["request_id"] == parents["request_id_root"]).all()
    assert (parents["trace_id"] == parents["trace_id_root"]).all()
    steps = frame.filter(pl.col("name") == sp.ENGINE_STEP)
    assert steps.height >= summary["policies"]["priority"]["num_steps"]
    assert steps["attr.schedscope.step"].n_unique() == steps.height


class _Slow(SpanExporter):
    """Exports nothing until released: the queue fills and spans drop."""

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()
        self.num_exported = 0

    def export(self, spans):
        self.release.wait(10)
        self.num_exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.release.set()


def test_drops_are_counted_exactly():
    slow = _Slow()
    tracing = Tracing(
        TracingSettings(max_queue_size=64, max_export_batch_size=16, schedule_delay_ms=10_000),
        exporters=[slow],
    )
    emitted = 5000
    for i in range(emitted):  # a burst, faster than anything can export
        tracing.tracer.start_span(f"s{i}").end()
    slow.release.set()
    stats = tracing.shutdown()
    assert stats["spans"] == emitted
    assert slow.num_exported == stats["exported_spans"]
    assert stats["dropped_spans"] == emitted - slow.num_exported > 0
    assert tracing.processors[0].dropped_by_reason["queue_full"] == stats["dropped_spans"]


def test_failed_exports_count_as_dropped(tmp_path):
    exporter = OtlpJsonLinesExporter(tmp_path / "x.jsonl")
    exporter.shutdown()  # closed: every export fails
    processor = CountingBatchSpanProcessor(exporter, schedule_delay_millis=10)
    tracing = Tracing(TracingSettings(), exporters=[])
    tracing.provider.add_span_processor(processor)
    tracing.processors.append(processor)
    for _ in range(10):
        tracing.tracer.start_span("x").end()
    tracing.shutdown()
    assert processor.num_dropped_spans == 10 and processor.num_exported == 0


class _DiskThatFillsUp:
    """The trace file on a disk with ``free`` bytes left (None: plenty): a write past it
    stops short, and the next one fails with ENOSPC, as write(2) does on a full disk.

    A test double: a real full file system needs root (a small tmpfs or loop mount).
    It writes through a real file, so what a reader finds is what a full disk would
    have left there."""

    def __init__(self, path) -> None:
        self.raw = open(path, "r+b", buffering=0)  # noqa: SIM115
        self.raw.seek(0, 2)
        self.free: int | None = None

    def write(self, data) -> int:
        data = data.encode() if isinstance(data, str) else bytes(data)
        if self.free is not None:
            if self.free == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data = data[: self.free]
            self.free -= len(data)
        return self.raw.write(data)

    def __getattr__(self, name):
        return getattr(self.raw, name)


def test_a_full_disk_never_leaves_a_torn_line_in_the_trace_file(tmp_path):
    """A batch the disk has no room for is lost whole (and counted); the batch after
    space returns starts on a line of its own, so every line of the file parses."""
    path = tmp_path / "trace.jsonl"
    exporter = OtlpJsonLinesExporter(path)
    exporter._file.close()
    disk = exporter._file = _DiskThatFillsUp(path)
    tracing = Tracing(TracingSettings(schedule_delay_ms=60_000), exporters=[exporter])

    def batch(name: str) -> None:
        for i in range(3):
            tracing.tracer.start_span(f"{name}{i}").end()
        tracing.force_flush()

    batch("before")
    disk.free = 50  # the disk fills up partway through the next batch
    batch("torn")
    batch("full")  # still full
    disk.free = None  # space is back
    batch("after")
    stats = tracing.shutdown()

    lines = path.read_text().splitlines()
    assert len(lines) == 2
    names = [
        span["name"]
        for line in lines
        for resource in json.loads(line)["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]
    assert names == ["before0", "before1", "before2", "after0", "after1", "after2"]
    assert read_spans(path).height == 6
    assert stats["spans"] == 12 and stats["exported_spans"] == 6
    assert stats["dropped_spans"] == 6
    assert tracing.processors[0].dropped_by_reason["export_failed"] == 6


def test_resolve_tracing_flags_and_environment(tmp_path):
    f = tmp_path / "t.jsonl"
    assert resolve_tracing(environ={}) is None
    assert resolve_tracing(trace_file=f, environ={}).trace_file == f
    assert resolve_tracing(trace_file=f, no_tracing=True, environ={}) is None
    assert resolve_tracing(trace_file=f, environ={"OTEL_SDK_DISABLED": "true"}) is None
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SERVICE_NAME": "x"}
    settings = resolve_tracing(environ=env)
    assert settings.otlp_from_env and settings.service_name == "x"
    assert resolve_tracing(environ={**env, "OTEL_TRACES_EXPORTER": "none"}) is None
    explicit = resolve_tracing(otlp_endpoint="http://h:1/v1/traces", environ={})
    assert explicit.otlp_endpoint == "http://h:1/v1/traces" and not explicit.otlp_from_env


def test_a_hung_collector_cannot_hold_the_shutdown_past_its_budget(monkeypatch):
    """An exporter that never returns: shutdown ends at the budget, and the spans still
    queued are counted as not flushed (not as a full queue)."""
    import threading
    import time

    from engine.telemetry import tracing as tracing_module

    hang = threading.Event()

    class Hung(SpanExporter):
        def export(self, spans):
            hang.wait(30)
            return SpanExportResult.FAILURE

        def shutdown(self):
            pass

    monkeypatch.setattr(tracing_module, "SHUTDOWN_BUDGET_MS", 1000)
    tracing = Tracing(
        TracingSettings(max_export_batch_size=16, schedule_delay_ms=10), exporters=[Hung()]
    )
    for i in range(200):
        tracing.tracer.start_span(f"s{i}").end()
    time.sleep(0.1)  # the worker is now stuck in export
    started = time.monotonic()
    stats = tracing.shutdown()
    waited = time.monotonic() - started
    hang.set()
    assert waited < 5
    reasons = tracing.processors[0].dropped_by_reason
    assert reasons["queue_full"] == 0 and reasons["not_flushed"] > 0
    assert stats["dropped_spans"] == stats["spans"] - stats["exported_spans"]
