"""benchmarks/bench_telemetry_spans.py's exporter sample: its spans reach the sample
(they once went to a processor the span observer never calls, and the throughput loop
over an empty sample never ended)."""

from __future__ import annotations

from engine.config import EngineConfig, SchedulerConfig


def test_the_exporter_benchmark_samples_real_spans():
    from benchmarks.bench_telemetry_spans import _sample_spans

    spans = _sample_spans(EngineConfig(SchedulerConfig()), batch=256)
    assert len(spans) == 256
    assert {"llm_request", "engine.step"} <= {s.name for s in spans}
