"""Span cost and exporter throughput (docs/telemetry.md).

1. The engine's span rate at 32 concurrent requests: a closed loop of 32 users on the
   simulator (the built-in CPU cost model: virtual seconds are the bundled engine's
   seconds), traced; spans per engine second is what the exporter must sustain.
2. Cost per span on the step loop: the same run with and without the span observer
   (wall time difference / spans), and a bare start+end through the provider.
3. The OTLP-JSON lines exporter's throughput: spans/s written in batches, without a
   drop (queue sized per tracing.DEFAULT_MAX_QUEUE_SIZE).

Targets: per span <= 15 us; exporter >= the engine's span rate at 32 concurrent.
Run: .venv/bin/python benchmarks/bench_telemetry_spans.py [--duration 60] [--quick: 15
virtual s, 20,000 exporter spans] [--json FILE]
Prints measured figures beside targets; never fails on time (machines are shared).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from engine.config import EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from engine.telemetry.spans import SpanObserver
from engine.telemetry.tracing import OtlpJsonLinesExporter, Tracing, TracingSettings
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass
from harness.simulate.driver import simulate

TARGET_US_PER_SPAN = 15.0


def closed_loop(concurrency: int, duration_s: float) -> Profile:
    return Profile(
        name=f"closed{concurrency}",
        seed=1,
        description="closed loop",
        classes=(
            RequestClass(
                name="chat",
                weight=1.0,
                prompt_tokens=LengthDistribution.lognormal(200, 0.6, max=1024),
                output_tokens=LengthDistribution.lognormal(70, 0.6),
                max_tokens=256,
            ),
        ),
        phases=(Phase(name="closed", duration_s=duration_s, concurrency=concurrency),),
    )


def timed_simulation(profile: Profile, config: EngineConfig, trace_file: Path | None):
    """(wall s of the whole run, wall s inside the span observer, result)."""
    tracing = None if trace_file is None else TracingSettings(trace_file=trace_file)
    inside = [0.0]
    original = SpanObserver.__call__

    def timed(self, record):
        t0 = time.perf_counter()
        original(self, record)
        inside[0] += time.perf_counter() - t0

    SpanObserver.__call__ = timed
    try:
        t0 = time.perf_counter()
        result = simulate(profile, config, CostModel(), tracing=tracing)
        return time.perf_counter() - t0, inside[0], result
    finally:
        SpanObserver.__call__ = original


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.sized("--duration", type=float, full=60.0, quick=15.0, help="virtual seconds")
    parser.sized("--spans", type=int, full=50_000, quick=20_000, help="exporter benchmark spans")
    return parser


def run(args) -> list[Figure]:

    profile = closed_loop(args.concurrency, args.duration)
    config = EngineConfig(SchedulerConfig(scheduling_policy="fcfs"))
    with tempfile.TemporaryDirectory() as tmp:
        trace_file = Path(tmp) / "spans.jsonl"
        base_s, _, _ = min(
            (timed_simulation(profile, config, None) for _ in range(2)), key=lambda r: r[0]
        )
        traced_s, observer_s, result = min(
            (timed_simulation(profile, config, trace_file) for _ in range(3)), key=lambda r: r[1]
        )
        stats = result.tracing
        num_decisions = len([x for x in result.decisions if x.kind not in ("wait", "idle_running")])
        engine_spans_per_s = stats["spans"] / result.duration_s
        decisions_per_s = num_decisions / result.duration_s
        per_span_us = observer_s / stats["spans"] * 1e6
        print(
            f"concurrency={args.concurrency} virtual_s={result.duration_s:.1f} "
            f"requests={result.requests.height} steps={result.num_steps} "
            f"decisions={num_decisions} spans={stats['spans']} dropped={stats['dropped_spans']}"
        )
        print(
            f"engine rate at {args.concurrency} concurrent: {decisions_per_s:,.0f} decisions/s, "
            f"{engine_spans_per_s:,.0f} spans/s (engine seconds)"
        )
        print(
            f"step-loop cost per span (time inside the span observer / spans): "
            f"{per_span_us:.1f} us (target <= {TARGET_US_PER_SPAN:.0f} us)"
        )
        print(
            f"whole run, export and flush included: {base_s:.2f} s untraced -> "
            f"{traced_s:.2f} s traced ({(traced_s - base_s) / stats['spans'] * 1e6:.1f} us "
            f"per span)"
        )

        tracing = Tracing(TracingSettings(trace_file=Path(tmp) / "bare.jsonl"))
        tracer = tracing.tracer
        n = 20_000
        t0 = time.perf_counter()
        for i in range(n):
            span = tracer.start_span(
                "x", attributes={"a": i, "b": "v", "c": 1.5}, start_time=1_000 + i
            )
            span.end(end_time=2_000 + i)
        bare_us = (time.perf_counter() - t0) / n * 1e6
        tracing.shutdown()
        print(
            f"bare span start+end, 3 attributes, batch processor: {bare_us:.1f} us "
            f"(target <= {TARGET_US_PER_SPAN:.0f} us)"
        )

        # Exporter throughput: encode and write real spans (a short traced run's).
        sample = _sample_spans(config)
        exporter = OtlpJsonLinesExporter(Path(tmp) / "throughput.jsonl")
        batch = 2048
        t0 = time.perf_counter()
        written = 0
        while written < args.spans:
            exporter.export(sample[:batch])
            written += min(batch, len(sample))
        export_s = time.perf_counter() - t0
        exporter.shutdown()
        exporter_rate = written / export_s
        print(
            f"OTLP-JSON lines exporter: {exporter_rate:,.0f} spans/s "
            f"(target >= {engine_spans_per_s:,.0f} spans/s, the engine's rate at "
            f"{args.concurrency} concurrent; {exporter_rate / engine_spans_per_s:.0f}x)"
        )
    at = f"{args.concurrency} concurrent, {result.duration_s:.0f} virtual s"
    return [
        Figure("step-loop cost per span", per_span_us, "us", TARGET_US_PER_SPAN, note=at),
        Figure("bare span start+end", bare_us, "us", TARGET_US_PER_SPAN, note="3 attributes"),
        Figure(
            "OTLP-JSON lines exporter",
            exporter_rate,
            "spans/s",
            round(engine_spans_per_s),
            "higher",
            note=f"target: the engine's span rate at {at}",
        ),
        Figure("engine span rate", engine_spans_per_s, "spans/s", note=f"engine seconds; {at}"),
    ]


def _sample_spans(config: EngineConfig, batch: int = 2048) -> list:
    """``batch`` real spans (requests, decisions, steps) of a short traced run."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from engine.core.request import EngineRequest
    from engine.core.sampling_params import SamplingParams
    from engine.factory import build_simulated_engine
    from engine.telemetry.tracing import install_tracing

    memory = InMemorySpanExporter()
    engine = build_simulated_engine(config, CostModel())
    tracing = install_tracing(engine, TracingSettings())
    tracing.processors.clear()
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    # the span observer hands its spans to the processors FinishedSpans holds, not to
    # the provider's (a processor added there alone never sees one)
    tracing.finished_spans.processors = [SimpleSpanProcessor(memory)]
    for i in range(64):
        engine.add_request(
            EngineRequest(f"r{i}", [5] * 200, SamplingParams(max_tokens=40), arrival_time=0.0)
        )
    while engine.has_work():
        engine.step()
    tracing.shutdown()
    spans = list(memory.get_finished_spans())
    if not spans:  # the throughput loop would never end
        raise RuntimeError("the traced sample run made no spans")
    return (spans * (batch // len(spans) + 1))[:batch]


if __name__ == "__main__":
    bench_main(parser, run)
