"""Prometheus metrics: an observer of step records updating its own registry.

Everything vLLM also measures carries vLLM's name, type, label names and buckets, in
both generations (V0 names for vLLM's published dashboard, V1 names for a current
vLLM), so dashboards and the harness work unchanged against a real vLLM. What vLLM
lacks uses the ``schedscope_`` prefix. docs/metrics.md lists every metric.

The observer runs on the engine's thread (the engine process in process mode), right
after each step: its per-step work is a few gauge sets, one counter increment per
decision and per-request work only where a request starts, emits its first token,
stalls or ends. Inter-token latencies are the one per-token observation: they are
bucketed in one pass per step into a plain collector (:class:`BulkHistogram`)
instead of one ``Histogram.observe`` per token. ``benchmarks/bench_telemetry_metrics.py``
measures the cost.

Exemplars (``{"trace_id": ...}``, the request's trace id from
``engine.telemetry.trace_ids``, as its spans use) are attached to the TTFT, E2E, queue
time and stall histograms. They are exposed in the OpenMetrics format only:
:meth:`EngineMetrics.render` picks the format from the scraper's ``Accept`` header.

This module is the entry point (:func:`install_metrics`) and re-exports the names of
the modules the metrics are built from:

- ``engine.telemetry.buckets``: histogram bucket boundaries;
- ``engine.telemetry.collectors``: the collectors rendered at scrape time;
- ``engine.telemetry.family_factory``: families labelled by model and engine;
- ``engine.telemetry.families_vllm``: vLLM's families (both generations, V0, V1);
- ``engine.telemetry.families_schedscope``: schedscope's own families;
- ``engine.telemetry.observer``: :class:`EngineMetrics`, the observer updating them;
- ``engine.telemetry.exposition``: the exposition format and exemplars;
- ``engine.records.stall_causes``: the stall-cause names.
"""

from __future__ import annotations

from engine.records.stall_causes import (
    OTHER,
    PREEMPTED_WAITING,
    PREFILL_INTERFERENCE,
    STALL_CAUSES,
    SWAPPED_OUT,
    TOKEN_BUDGET,
)
from engine.records.stall_causes import RECOMPUTE as RECOMPUTE_CAUSE
from engine.telemetry.buckets import (
    BATCH_TOKENS_BUCKETS,
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS,
    NUM_PREEMPTIONS_BUCKETS,
    PARAMS_N_BUCKETS,
    QUEUE_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    STALL_BUCKETS,
    STEP_DURATION_BUCKETS,
    TTFT_BUCKETS,
    build_1_2_5_buckets,
)
from engine.telemetry.collectors import BulkHistogram, DroppedSpans
from engine.telemetry.exposition import (
    OPENMETRICS_CONTENT_TYPE,
    render_registry,
    request_exemplar,
    wants_openmetrics,
)
from engine.telemetry.families_schedscope import MAX_CLASS_LABELS, OTHER_CLASS
from engine.telemetry.families_vllm import (
    ADMISSION_REJECT_REASONS,
    DEFERRED_WAIT_REASONS,
    FINISHED_REASONS,
    WAITING_CAPACITY,
    WAITING_DEFERRED,
)
from engine.telemetry.observer import EngineMetrics, stall_cause

#: The name benchmarks/bench_telemetry_metrics.py imports.
_BulkHistogram = BulkHistogram

__all__ = [
    "ADMISSION_REJECT_REASONS",
    "BATCH_TOKENS_BUCKETS",
    "DEFERRED_WAIT_REASONS",
    "FINISHED_REASONS",
    "ITERATION_TOKENS_BUCKETS",
    "ITL_BUCKETS",
    "MAX_CLASS_LABELS",
    "NUM_PREEMPTIONS_BUCKETS",
    "OPENMETRICS_CONTENT_TYPE",
    "OTHER",
    "OTHER_CLASS",
    "PARAMS_N_BUCKETS",
    "PREEMPTED_WAITING",
    "PREFILL_INTERFERENCE",
    "QUEUE_BUCKETS",
    "RECOMPUTE_CAUSE",
    "REQUEST_LATENCY_BUCKETS",
    "STALL_BUCKETS",
    "STALL_CAUSES",
    "STEP_DURATION_BUCKETS",
    "SWAPPED_OUT",
    "TOKEN_BUDGET",
    "TTFT_BUCKETS",
    "WAITING_CAPACITY",
    "WAITING_DEFERRED",
    "BulkHistogram",
    "DroppedSpans",
    "EngineMetrics",
    "_BulkHistogram",
    "build_1_2_5_buckets",
    "install_metrics",
    "render_registry",
    "request_exemplar",
    "stall_cause",
    "wants_openmetrics",
]


def install_metrics(engine, model_name: str, **kwargs) -> EngineMetrics:
    """Add an :class:`EngineMetrics` observer to ``engine`` (after token timing); it is
    also ``engine.metrics``, where other telemetry (the span exporter's dropped-span
    count: ``engine.metrics.watch_dropped_spans(fn)``) finds it."""
    metrics = EngineMetrics(engine.config, model_name, engine.kv_plan.bytes_per_block, **kwargs)
    metrics.set_pool_sizes(
        engine.block_manager.num_device_blocks, engine.block_manager.num_host_blocks
    )
    engine.observers.add(metrics)
    engine.metrics = metrics
    return metrics
