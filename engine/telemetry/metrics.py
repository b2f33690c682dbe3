"""Prometheus metrics: an observer of step records updating its own registry.

Everything vLLM also measures carries vLLM's name, type, label names and buckets, in
both generations (V0 names for vLLM's published dashboard, V1 names for a current
vLLM), so dashboards and the harness work unchanged against a real vLLM. What vLLM
lacks uses the ``schedscope_`` prefix. docs/metrics.md lists every metric.

The observer runs on the engine's thread (the engine process in process mode), right
after each step: its per-step work is a few gauge sets, one counter increment per
decision and per-request work only where a request starts, emits its first token,
stalls or ends. Inter-token latencies are the one per-token observation: they are
bucketed in one pass per step into a plain collector (:class:`_BulkHistogram`)
instead of one ``Histogram.observe`` per token. ``benchmarks/bench_telemetry_metrics.py``
measures the cost.

Exemplars (``{"trace_id": ...}``, the request's trace id from
``engine.telemetry.trace_ids``, as its spans use) are attached to the TTFT, E2E, queue
time and stall histograms. They are exposed in the OpenMetrics format only:
:meth:`EngineMetrics.render` picks the format from the scraper's ``Accept`` header.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.openmetrics.exposition import ALLOWUTF8
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from engine.core import decisions as d
from engine.core.sequence import SequenceStatus
from engine.core.token_timing import STALL_FLOOR_S
from engine.records.step_record import DECODE, PREFILL, RECOMPUTE, StepRecord
from engine.telemetry.trace_ids import format_trace_id, request_trace_id

# -- vLLM's buckets (vllm/v1/metrics/loggers.py, PrometheusStatLogger) -------------------
#: At most this many request classes get their own ``schedscope_queue_time_seconds``
#: series; classes come from a client header (X-Request-Class), so later ones share
#: the series ``class="other"``.
MAX_CLASS_LABELS = 32
OTHER_CLASS = "other"

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
#: inter_token_latency, time_per_output_token (V0) and request_time_per_output_token.
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
#: e2e, queue, inference, prefill and decode time per request.
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)

# -- schedscope's own buckets ----------------------------------------------------------
STEP_DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
)
BATCH_TOKENS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
STALL_BUCKETS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 40.0, 80.0)
#: schedscope_queue_time_seconds: finer than vLLM's at the short end (the queue waits
#: of a healthy run are milliseconds; starvation is tens of seconds).
QUEUE_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    320.0,
    640.0,
)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * scale
            if value > max_value:
                return buckets
            buckets.append(value)
        scale *= 10


# -- stall causes, in METRICS.md's precedence --------------------------------------------
SWAPPED_OUT = "swapped_out"
RECOMPUTE_CAUSE = "recompute"
PREEMPTED_WAITING = "preempted_waiting"
PREFILL_INTERFERENCE = "prefill_interference"
TOKEN_BUDGET = "token_budget"
OTHER = "other"
STALL_CAUSES = (
    SWAPPED_OUT,
    RECOMPUTE_CAUSE,
    PREEMPTED_WAITING,
    PREFILL_INTERFERENCE,
    TOKEN_BUDGET,
    OTHER,
)

# What happened to a request since its last token (bit flags).
_F_SWAPPED = 1
_F_RECOMPUTED = 2
_F_PREEMPTED = 4
_F_INTERFERED = 8
_F_LEFT_OUT = 16


def stall_cause(flags: int) -> str:
    """The cause of a stall from what happened to the request over the gap."""
    if flags & _F_SWAPPED:
        return SWAPPED_OUT
    if flags & _F_RECOMPUTED:
        return RECOMPUTE_CAUSE
    if flags & _F_PREEMPTED:
        return PREEMPTED_WAITING
    if flags & _F_INTERFERED:
        return PREFILL_INTERFERENCE
    if flags & _F_LEFT_OUT:
        return TOKEN_BUDGET
    return OTHER


# -- vLLM V1's waiting reasons -----------------------------------------------------------
WAITING_CAPACITY = "capacity"
WAITING_DEFERRED = "deferred"
#: schedscope wait reasons that vLLM would call "deferred" (a transient constraint that
#: is not the engine being full); every other wait reason is "capacity".
DEFERRED_WAIT_REASONS = frozenset({d.REASON_STATIC_BATCH})

#: vLLM's finished_reason values schedscope produces (rejected requests never entered
#: the engine, as in vLLM, and are not counted there).
FINISHED_REASONS = ("stop", "length", "abort", "error")

#: Reject reasons that are admission control (a full queue: the server's 429), counted
#: by vllm:admission_rejections_total; the others are requests that can never run.
ADMISSION_REJECT_REASONS = (d.REASON_QUEUE_FULL,)


class _BulkHistogram:
    """Histogram families fed in bulk: one ``bisect`` and two adds per value, no lock,
    rendered at scrape time. Several names can expose the same data (vLLM V0's
    ``time_per_output_token_seconds`` and V1's ``inter_token_latency_seconds`` are both
    the gap between consecutive tokens)."""

    def __init__(self, names: list[tuple[str, str]], buckets, labelnames, labelvalues) -> None:
        self._names = names
        self._bounds = [float(b) for b in buckets]
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum = 0.0
        self._labelnames = list(labelnames)
        self._labelvalues = [str(v) for v in labelvalues]

    def observe_many(self, values) -> None:
        counts, bounds = self._counts, self._bounds
        total = 0.0
        for value in values:
            counts[bisect.bisect_left(bounds, value)] += 1
            total += value
        self._sum += total

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    @property
    def count(self) -> int:
        return sum(self._counts)

    def describe(self):
        return [
            HistogramMetricFamily(name, doc, labels=self._labelnames) for name, doc in self._names
        ]

    def collect(self):
        counts, total = list(self._counts), self._sum  # a consistent-enough snapshot
        cumulative, running = [], 0
        for bound, count in zip([*self._bounds, float("inf")], counts, strict=True):
            running += count
            cumulative.append((_le(bound), running))
        for name, doc in self._names:
            family = HistogramMetricFamily(name, doc, labels=self._labelnames)
            family.add_metric(self._labelvalues, cumulative, total)
            yield family


def _le(bound: float) -> str:
    if bound == float("inf"):
        return "+Inf"
    return repr(float(bound))


class _DroppedSpans:
    """``schedscope_dropped_spans_total``, read at scrape time from the callables the
    span exporter registered (0 when none)."""

    def __init__(self, labelnames, labelvalues) -> None:
        self.sources: list[Callable[[], int]] = []
        self._labelnames = list(labelnames)
        self._labelvalues = [str(v) for v in labelvalues]

    def describe(self):
        return [CounterMetricFamily("schedscope_dropped_spans", "", labels=self._labelnames)]

    def collect(self):
        total = 0
        for source in list(self.sources):
            try:
                total += int(source())
            except Exception:  # a broken source must not break the scrape
                pass
        family = CounterMetricFamily(
            "schedscope_dropped_spans",
            "Spans the span exporter dropped (queue full or export failed).",
            labels=self._labelnames,
        )
        family.add_metric(self._labelvalues, total)
        yield family


class EngineMetrics:
    """The step-record observer and its registry. ``bytes_per_block``: KV bytes per block
    (``engine.kv_plan.bytes_per_block``), for ``schedscope_swap_bytes_total``."""

    def __init__(
        self,
        config,
        model_name: str,
        bytes_per_block: int = 0,
        engine_index: int = 0,
        stall_threshold_s: float = STALL_FLOOR_S,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self.bytes_per_block = bytes_per_block
        self.stall_threshold_s = stall_threshold_s
        self._render_lock = threading.Lock()
        sched, cache = config.scheduler, config.cache
        labels = ["model_name", "engine"]
        values = [model_name, str(engine_index)]
        reg = self.registry

        def gauge(name, doc, extra=()):
            return Gauge(name, doc, labels + list(extra), registry=reg)

        def counter(name, doc, extra=()):
            return Counter(name, doc, labels + list(extra), registry=reg)

        def histogram(name, doc, buckets, extra=()):
            return Histogram(name, doc, labels + list(extra), buckets=buckets, registry=reg)

        token_buckets = build_1_2_5_buckets(sched.max_model_len)

        # -- vLLM, both generations ---------------------------------------------------
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        ).labels(*values)
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(*values)
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        ).labels(*values)
        self.prompt_tokens = counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        ).labels(*values)
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(*values)
        success = counter(
            "vllm:request_success", "Count of successfully processed requests.", ["finished_reason"]
        )
        self.success = {r: success.labels(*values, r) for r in FINISHED_REASONS}
        self._success_family = success
        self._labelvalues = values
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        ).labels(*values)
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*values)
        self.queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*values)
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*values)
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*values)
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*values)
        self.prompt_tokens_request = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        ).labels(*values)
        self.generation_tokens_request = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            token_buckets,
        ).labels(*values)
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS,
        ).labels(*values)
        self.max_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            token_buckets,
        ).labels(*values)
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            token_buckets,
        ).labels(*values)
        self.params_n = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS
        ).labels(*values)
        # -- vLLM V0 only ---------------------------------------------------------------
        self.gpu_cache = gauge(
            "vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."
        ).labels(*values)
        self.cpu_cache = gauge(
            "vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage."
        ).labels(*values)
        self.swapped = gauge(
            "vllm:num_requests_swapped", "Number of requests swapped to CPU."
        ).labels(*values)
        # vllm:time_per_output_token_seconds (V0) and vllm:inter_token_latency_seconds
        # (V1) are the same per-token gaps: one bulk collector exposes both.
        self.itl = _BulkHistogram(
            [
                (
                    "vllm:inter_token_latency_seconds",
                    "Histogram of inter-token latency in seconds.",
                ),
                (
                    "vllm:time_per_output_token_seconds",
                    "Histogram of time per output token in seconds.",
                ),
            ],
            ITL_BUCKETS,
            labels,
            values,
        )
        reg.register(self.itl)
        # -- vLLM V1 only ---------------------------------------------------------------
        self.kv_cache = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(*values)
        by_reason = gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = "
            "waiting for scheduling capacity; 'deferred' = deferred by transient "
            "constraints. Sum of all reasons equals vllm:num_requests_waiting.",
            ["reason"],
        )
        self.waiting_capacity = by_reason.labels(*values, WAITING_CAPACITY)
        self.waiting_deferred = by_reason.labels(*values, WAITING_DEFERRED)
        self.tpot_request = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        ).labels(*values)
        self.num_preemptions_request = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of preemptions per request.",
            NUM_PREEMPTIONS_BUCKETS,
        ).labels(*values)
        self.prefill_kv_computed = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            token_buckets,
        ).labels(*values)
        # vLLM's admission counter has no engine label (it counts in the API server).
        admission = Counter(
            "vllm:admission_rejections",
            "Requests rejected at admission.",
            ["model_name", "reason"],
            registry=reg,
        )
        self.admission = {r: admission.labels(model_name, r) for r in ADMISSION_REJECT_REASONS}
        # vLLM's cache_config_info: the engine label and the cache config, no model_name.
        cache_info = {
            "block_size": cache.block_size,
            "cache_dtype": "auto",
            "enable_prefix_caching": False,
            "gpu_memory_utilization": cache.gpu_memory_utilization,
            "num_cpu_blocks": None,
            "num_gpu_blocks": None,
            "num_gpu_blocks_override": cache.num_gpu_blocks_override,
            "num_cpu_blocks_override": cache.num_cpu_blocks_override,
            "swap_space": cache.swap_space,
            "watermark": cache.watermark,
            "engine": str(engine_index),
        }
        self._cache_info_values = cache_info
        self._cache_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            list(cache_info),
            registry=reg,
        )
        self._cache_info_child = None

        # -- schedscope ---------------------------------------------------------------------
        self._decisions = counter(
            "schedscope_decisions", "Scheduler decisions by kind and reason.", ["kind", "reason"]
        )
        self._decision_children: dict[tuple[str, str], object] = {}
        self._preemptions_by = counter(
            "schedscope_preemptions",
            "Preemptions by mode (swap, recompute) and reason.",
            ["mode", "reason"],
        )
        self._preemption_children: dict[tuple[str, str], object] = {
            (mode, reason): self._preemptions_by.labels(*values, mode, reason)
            for mode in ("swap", "recompute")
            for reason in (d.REASON_OUT_OF_BLOCKS, d.REASON_PRIORITY)
        }  # the series a dashboard plots exist (at 0) before the first preemption
        self.swap_fallbacks = counter(
            "schedscope_swap_fallbacks",
            "Swap preemptions that fell back to recompute, by why (swap_space_exhausted).",
            ["reason"],
        ).labels(*values, d.REASON_SWAP_SPACE_EXHAUSTED)
        stalls = counter(
            "schedscope_stalls", "Inter-token gaps over the stall threshold, by cause.", ["cause"]
        )
        stall_s = histogram(
            "schedscope_stall_duration_seconds",
            "Inter-token gaps over the stall threshold, by cause.",
            STALL_BUCKETS,
            ["cause"],
        )
        self.stalls = {c: stalls.labels(*values, c) for c in STALL_CAUSES}
        self.stall_s = {c: stall_s.labels(*values, c) for c in STALL_CAUSES}
        self.idle_running = gauge(
            "schedscope_idle_running_sequences",
            "Running sequences the last step left out (token budget).",
        ).labels(*values)
        self.idle_running_steps = counter(
            "schedscope_idle_running_sequence_steps",
            "Sequence-steps a running sequence was left out of a step.",
        ).labels(*values)
        swap_bytes = counter("schedscope_swap_bytes", "KV bytes copied by swaps.", ["direction"])
        swap_blocks = counter("schedscope_swap_blocks", "KV blocks copied by swaps.", ["direction"])
        self.swap_bytes_out, self.swap_bytes_in = (
            swap_bytes.labels(*values, x) for x in ("out", "in")
        )
        self.swap_blocks_out, self.swap_blocks_in = (
            swap_blocks.labels(*values, x) for x in ("out", "in")
        )
        self.recomputed_tokens = counter(
            "schedscope_recomputed_tokens",
            "Tokens re-prefilled because a recompute preemption dropped their KV.",
        ).labels(*values)
        self._queue_by_class = histogram(
            "schedscope_queue_time_seconds",
            "First admission minus arrival, per request class, observed at first scheduling.",
            QUEUE_BUCKETS,
            ["class"],
        )
        self._queue_children: dict[str, object] = {}
        blocks_free = gauge("schedscope_kv_blocks_free", "Free KV blocks.", ["pool"])
        blocks_total = gauge("schedscope_kv_blocks_capacity", "KV blocks in the pool.", ["pool"])
        self.free_device, self.free_host = (
            blocks_free.labels(*values, p) for p in ("device", "host")
        )
        self.total_device, self.total_host = (
            blocks_total.labels(*values, p) for p in ("device", "host")
        )
        self.step_duration = histogram(
            "schedscope_step_duration_seconds",
            "Step duration: schedule start to results applied.",
            STEP_DURATION_BUCKETS,
        ).labels(*values)
        self.batch_tokens = histogram(
            "schedscope_batch_tokens", "Tokens computed per step.", BATCH_TOKENS_BUCKETS
        ).labels(*values)
        gauge(
            "schedscope_token_budget_tokens",
            "max_num_batched_tokens in effect (plot beside schedscope_batch_tokens).",
        ).labels(*values).set(sched.token_budget)
        sched_info = {
            "policy": sched.scheduling_policy,
            "preemption_mode": sched.preemption_mode,
            "max_num_seqs": sched.max_num_seqs,
            "max_num_batched_tokens": sched.token_budget,
            "max_model_len": sched.max_model_len,
            "enable_chunked_prefill": sched.enable_chunked_prefill,
            "batching": sched.batching,
            "max_waiting": sched.max_waiting,
            "aging_rate": sched.aging_rate,
            "max_wait_s": sched.max_wait_s,
            "sjf_size_estimator": sched.sjf_size_estimator,
        }
        gauge(
            "schedscope_scheduler_config_info",
            "The scheduler configuration (value 1).",
            list(sched_info),
        ).labels(*values, *(str(v) for v in sched_info.values())).set(1)
        self._dropped = _DroppedSpans(labels, values)
        reg.register(self._dropped)

        #: request id -> [last token time or None, flags since it]
        self._live: dict[str, list] = {}
        self._wait_reason: str | None = None
        self._last_gauges: tuple | None = None
        self.num_steps = 0

    # -- configuration ---------------------------------------------------------------------
    def set_pool_sizes(self, num_device_blocks: int, num_host_blocks: int) -> None:
        """The block counts of ``vllm:cache_config_info`` (known once the engine is built)."""
        values = dict(
            self._cache_info_values,
            num_gpu_blocks=num_device_blocks,
            num_cpu_blocks=num_host_blocks,
        )
        if self._cache_info_child is not None:
            self._cache_info.clear()
        self._cache_info_child = self._cache_info.labels(**{k: str(v) for k, v in values.items()})
        self._cache_info_child.set(1)

    def watch_dropped_spans(self, source: Callable[[], int]) -> None:
        """Register a callable returning the span exporter's dropped-span count; read at
        scrape time into ``schedscope_dropped_spans_total`` (summed over sources)."""
        self._dropped.sources.append(source)

    # -- the observer ----------------------------------------------------------------------
    def __call__(self, record: StepRecord) -> None:
        self.num_steps += 1
        live = self._live
        at = record.token_time
        for x in record.decisions:
            kind, reason = x.kind, x.reason
            key = (kind, reason)
            child = self._decision_children.get(key)
            if child is None:
                child = self._decision_children[key] = self._decisions.labels(
                    *self._labelvalues, kind, reason
                )
            child.inc()
            if kind == d.IDLE_RUNNING:
                for rid in x.request_ids:
                    state = live.get(rid)
                    if state is not None:
                        state[1] |= _F_LEFT_OUT
            elif kind == d.PREEMPT:
                self._preempted(x, live)
            elif kind == d.SWAP_OUT:
                state = live.get(x.request_id)
                if state is not None:
                    state[1] |= _F_SWAPPED
            elif kind == d.RECOMPUTE:
                state = live.get(x.request_id)
                if state is not None:
                    state[1] |= _F_RECOMPUTED
            elif kind == d.WAIT:
                self._wait_reason = reason
            elif kind == d.REJECT:
                counter = self.admission.get(reason)
                if counter is not None:
                    counter.inc()

        if record.scheduled:
            self._scheduled(record, live, at)
        for seq in record.finished:
            live.pop(seq.request_id, None)
            self._finished(seq)

        # gauges: the state the step ran with, set only when it changed (most decode
        # steps change none of them; a set takes a lock)
        num_waiting = record.num_waiting
        if num_waiting == 0:
            self._wait_reason = None
        state = (
            record.num_running,
            num_waiting,
            self._wait_reason in DEFERRED_WAIT_REASONS,
            record.num_swapped,
            record.num_device_blocks,
            record.num_free_device_blocks,
            record.num_host_blocks,
            record.num_free_host_blocks,
            record.num_idle_running,
        )
        if state != self._last_gauges:
            self._last_gauges = state
            self._set_gauges(*state)
        idle = record.num_idle_running
        if idle:
            self.idle_running_steps.inc(idle)
        out_blocks, in_blocks = len(record.blocks_to_swap_out), len(record.blocks_to_swap_in)
        if out_blocks:
            self.swap_blocks_out.inc(out_blocks)
            self.swap_bytes_out.inc(out_blocks * self.bytes_per_block)
        if in_blocks:
            self.swap_blocks_in.inc(in_blocks)
            self.swap_bytes_in.inc(in_blocks * self.bytes_per_block)

    def _set_gauges(
        self, running, waiting, deferred, swapped, total, free, host_total, host_free, idle
    ) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.waiting_capacity.set(0 if deferred else waiting)
        self.waiting_deferred.set(waiting if deferred else 0)
        self.swapped.set(swapped)
        usage = 1.0 - free / total if total else 0.0
        self.kv_cache.set(usage)
        self.gpu_cache.set(usage)
        self.cpu_cache.set(1.0 - host_free / host_total if host_total else 0.0)
        self.free_device.set(free)
        self.total_device.set(total)
        self.free_host.set(host_free)
        self.total_host.set(host_total)
        self.idle_running.set(idle)

    def _preempted(self, x, live) -> None:
        self.preemptions.inc()
        key = (x.mode or "", x.reason)
        child = self._preemption_children.get(key)
        if child is None:
            child = self._preemption_children[key] = self._preemptions_by.labels(
                *self._labelvalues, *key
            )
        child.inc()
        if x.mode == "recompute" and x.detail == d.REASON_SWAP_SPACE_EXHAUSTED:
            self.swap_fallbacks.inc()
        state = live.get(x.request_id)
        if state is not None:
            state[1] |= _F_PREEMPTED

    def _scheduled(self, record: StepRecord, live: dict, at: float) -> None:
        num_prefill = record.num_prefill_tokens
        num_batched = num_prefill + record.num_decode_seqs
        # Another request's prefill can dominate this step only if prefill does.
        interference = num_prefill > 0 and 2 * num_prefill >= num_batched
        gaps: list[float] = []
        append = gaps.append
        threshold = self.stall_threshold_s
        firsts = 0
        prompt = 0  # prompt tokens computed for the first time
        for entry in record.scheduled:
            rid = entry.request_id
            state = live.get(rid)
            if state is None:
                state = live[rid] = [None, 0]
                self._first_scheduled(entry.seq)
            kind = entry.kind
            if kind != DECODE:
                n = entry.num_scheduled_tokens
                if interference:
                    others = num_prefill - n
                    if others > 0 and 2 * others >= num_batched:
                        state[1] |= _F_INTERFERED
                if kind == RECOMPUTE:
                    state[1] |= _F_RECOMPUTED
                elif kind == PREFILL:
                    left = entry.seq.num_prompt_tokens - entry.num_computed_before
                    if left > 0:
                        prompt += n if n < left else left
            elif interference and 2 * num_prefill >= num_batched:
                state[1] |= _F_INTERFERED
            if entry.token_id is None:
                continue
            last = state[0]
            if last is None:
                firsts += 1
                seq = entry.seq
                self.ttft.observe(at - seq.arrival_time, _exemplar(seq))
            else:
                gap = at - last
                append(gap)
                if gap >= threshold:
                    cause = stall_cause(state[1])
                    self.stalls[cause].inc()
                    self.stall_s[cause].observe(gap, _exemplar(entry.seq))
            state[0] = at
            state[1] = 0
        emitted = firsts + len(gaps)
        if gaps:
            self.itl.observe_many(gaps)
        if emitted:
            self.generation_tokens.inc(emitted)
        if prompt:
            self.prompt_tokens.inc(prompt)
        if record.num_recompute_tokens:
            self.recomputed_tokens.inc(record.num_recompute_tokens)
        self.iteration_tokens.observe(num_batched)
        self.batch_tokens.observe(num_batched)
        self.step_duration.observe(record.duration_s)

    def _first_scheduled(self, seq) -> None:
        if seq.first_scheduled_time is None:
            return
        cls = seq.request_class or ""
        child = self._queue_children.get(cls)
        if child is None:
            if len(self._queue_children) >= MAX_CLASS_LABELS:
                # Classes come from a client header: past the cap they share one
                # series, so no client can grow /metrics (and its render) without bound.
                cls = OTHER_CLASS
                child = self._queue_children.get(cls)
            if child is None:
                child = self._queue_children[cls] = self._queue_by_class.labels(
                    *self._labelvalues, cls
                )
        child.observe(seq.first_scheduled_time - seq.arrival_time, _exemplar(seq))

    def _finished(self, seq) -> None:
        if seq.status is SequenceStatus.FINISHED_REJECTED:
            return  # never entered the engine (vLLM: refused before the engine core)
        reason = seq.finish_reason
        counter = self.success.get(reason)
        if counter is None:
            counter = self.success[reason] = self._success_family.labels(*self._labelvalues, reason)
        counter.inc()
        arrival = seq.arrival_time
        end = seq.finished_time
        exemplar = _exemplar(seq)
        if end is not None:
            self.e2e.observe(end - arrival, exemplar)
        n_out = seq.num_output_tokens
        self.prompt_tokens_request.observe(seq.num_prompt_tokens)
        self.generation_tokens_request.observe(n_out)
        self.max_generation_tokens.observe(n_out)
        self.params_max_tokens.observe(seq.params.max_tokens)
        self.params_n.observe(1)
        self.num_preemptions_request.observe(seq.num_preemptions)
        self.prefill_kv_computed.observe(seq.num_prompt_tokens)  # no prefix cache
        scheduled = seq.first_scheduled_time
        if scheduled is None:
            return
        self.queue.observe(scheduled - arrival, exemplar)
        first, last = seq.timing.first_token_time, seq.timing.last_token_time
        if first is None:
            return
        self.prefill_time.observe(first - scheduled)
        self.decode_time.observe(last - first)
        self.inference_time.observe(last - scheduled)
        if n_out > 1:
            self.tpot_request.observe((last - first) / (n_out - 1))

    # -- exposition ------------------------------------------------------------------------
    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """(body, content type): OpenMetrics (with exemplars) when ``accept`` asks for
        it, as Prometheus does with exemplar storage on; else the classic text format."""
        with self._render_lock:
            if wants_openmetrics(accept):
                # allow-utf-8 keeps vLLM's colons: prometheus_client's default escaping
                # for OpenMetrics rewrites them to '_' in sample lines (not in # TYPE).
                return (
                    generate_openmetrics(self.registry, escaping=ALLOWUTF8),
                    OPENMETRICS_CONTENT_TYPE,
                )
            return generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4


OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def wants_openmetrics(accept: str | None) -> bool:
    """Whether an ``Accept`` header lists OpenMetrics (any version, any q > 0)."""
    for item in (accept or "").split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if media.lower() != "application/openmetrics-text":
            continue
        q = next((p[2:] for p in params if p.lower().startswith("q=")), "1")
        try:
            if float(q) > 0:
                return True
        except ValueError:
            return True
    return False


def _exemplar(seq) -> dict[str, str]:
    return {"trace_id": format_trace_id(request_trace_id(seq))}


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
