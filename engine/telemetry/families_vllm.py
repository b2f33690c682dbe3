"""The metric families vLLM also has, with vLLM's name, type, label names, help text
and buckets: those of both generations (:func:`build_vllm`), those of V0 only (for
vLLM's published dashboard, :func:`build_vllm_v0`) and those of V1 only
(:func:`build_vllm_v1`). Each builder creates its families, in exposition order, and
returns the children the observer updates.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

from engine.core import decisions as d
from engine.telemetry.buckets import (
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS,
    NUM_PREEMPTIONS_BUCKETS,
    PARAMS_N_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    build_1_2_5_buckets,
)
from engine.telemetry.collectors import BulkHistogram
from engine.telemetry.family_factory import FamilyFactory

# -- vLLM V1's waiting reasons -----------------------------------------------------------
WAITING_CAPACITY = "capacity"
WAITING_DEFERRED = "deferred"
#: schedscope wait reasons that vLLM would call "deferred" (a transient constraint that
#: is not the engine being full); every other wait reason is "capacity".
DEFERRED_WAIT_REASONS = frozenset({d.REASON_STATIC_BATCH})

#: vLLM's finished_reason values schedscope produces (rejected requests never entered
#: the engine, as in vLLM, and are not counted there).
FINISHED_REASONS = ("stop", "length", "abort", "error")

#: vllm:prompt_tokens_by_source_total's sources that schedscope has (vLLM's third,
#: ``external_kv_transfer``, is a KV connector's: exposed, always 0).
SOURCE_COMPUTE = "local_compute"
SOURCE_CACHE_HIT = "local_cache_hit"
PROMPT_SOURCES = (SOURCE_COMPUTE, SOURCE_CACHE_HIT, "external_kv_transfer")

#: Reject reasons that are admission control (a full queue: the server's 429; vLLM's
#: caps: its 503), counted by vllm:admission_rejections_total; the others are requests
#: that can never run.
ADMISSION_REJECT_REASONS = (
    d.REASON_QUEUE_FULL,
    d.REASON_MAX_NUM_QUEUED_REQS,
    d.REASON_MAX_NUM_QUEUED_TOKENS,
)


@dataclass(frozen=True, slots=True)
class VllmMetrics:
    """vLLM's metrics of both generations (V0 and V1 names agree)."""

    running: Gauge
    waiting: Gauge
    preemptions: Counter
    prompt_tokens: Counter
    generation_tokens: Counter
    #: finished_reason -> child; reasons outside FINISHED_REASONS are added when seen
    success: dict[str, Counter]
    success_family: Counter
    ttft: Histogram
    e2e: Histogram
    queue: Histogram
    prefill_time: Histogram
    decode_time: Histogram
    inference_time: Histogram
    prompt_tokens_request: Histogram
    generation_tokens_request: Histogram
    iteration_tokens: Histogram
    max_generation_tokens: Histogram
    params_max_tokens: Histogram
    params_n: Histogram


@dataclass(frozen=True, slots=True)
class VllmV0Metrics:
    """vLLM V0's metrics that V1 dropped."""

    gpu_cache: Gauge
    cpu_cache: Gauge
    swapped: Gauge
    #: vllm:inter_token_latency_seconds (V1) and vllm:time_per_output_token_seconds (V0)
    itl: BulkHistogram
    #: cached / queried prompt tokens of every admission so far
    prefix_cache_hit_rate: Gauge


@dataclass(frozen=True, slots=True)
class VllmV1Metrics:
    """vLLM V1's metrics that V0 lacks."""

    kv_cache: Gauge
    waiting_capacity: Gauge
    waiting_deferred: Gauge
    tpot_request: Histogram
    num_preemptions_request: Histogram
    prefill_kv_computed: Histogram
    #: reject reason -> child, for ADMISSION_REJECT_REASONS
    admission: dict[str, Counter]
    #: vllm:cache_config_info, labelled once the pool sizes are known
    cache_info: Gauge
    cache_info_values: dict[str, object]
    #: Prefix caching, in tokens, counted at admission (recomputes' re-admissions too)
    prefix_cache_queries: Counter
    prefix_cache_hits: Counter
    #: each request's prompt tokens, once (its first admission), by PROMPT_SOURCES
    prompt_tokens_by_source: dict[str, Counter]
    prompt_tokens_cached: Counter


def build_vllm(f: FamilyFactory, sched) -> VllmMetrics:
    """vLLM's families of both generations."""
    gauge, counter, histogram, values = f.gauge, f.counter, f.histogram, f.values
    token_buckets = build_1_2_5_buckets(sched.max_model_len)
    running = gauge(
        "vllm:num_requests_running", "Number of requests in model execution batches."
    ).labels(*values)
    waiting = gauge(
        "vllm:num_requests_waiting", "Number of requests waiting to be processed."
    ).labels(*values)
    preemptions = counter(
        "vllm:num_preemptions", "Cumulative number of preemption from the engine."
    ).labels(*values)
    prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(
        *values
    )
    generation_tokens = counter(
        "vllm:generation_tokens", "Number of generation tokens processed."
    ).labels(*values)
    success = counter(
        "vllm:request_success", "Count of successfully processed requests.", ["finished_reason"]
    )
    success_by_reason = {r: success.labels(*values, r) for r in FINISHED_REASONS}
    ttft = histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        TTFT_BUCKETS,
    ).labels(*values)
    e2e = histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        REQUEST_LATENCY_BUCKETS,
    ).labels(*values)
    queue = histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        REQUEST_LATENCY_BUCKETS,
    ).labels(*values)
    prefill_time = histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        REQUEST_LATENCY_BUCKETS,
    ).labels(*values)
    decode_time = histogram(
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        REQUEST_LATENCY_BUCKETS,
    ).labels(*values)
    inference_time = histogram(
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        REQUEST_LATENCY_BUCKETS,
    ).labels(*values)
    prompt_tokens_request = histogram(
        "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
    ).labels(*values)
    generation_tokens_request = histogram(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        token_buckets,
    ).labels(*values)
    iteration_tokens = histogram(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        ITERATION_TOKENS_BUCKETS,
    ).labels(*values)
    max_generation_tokens = histogram(
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        token_buckets,
    ).labels(*values)
    params_max_tokens = histogram(
        "vllm:request_params_max_tokens",
        "Histogram of the max_tokens request parameter.",
        token_buckets,
    ).labels(*values)
    params_n = histogram(
        "vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS
    ).labels(*values)
    return VllmMetrics(
        running=running,
        waiting=waiting,
        preemptions=preemptions,
        prompt_tokens=prompt_tokens,
        generation_tokens=generation_tokens,
        success=success_by_reason,
        success_family=success,
        ttft=ttft,
        e2e=e2e,
        queue=queue,
        prefill_time=prefill_time,
        decode_time=decode_time,
        inference_time=inference_time,
        prompt_tokens_request=prompt_tokens_request,
        generation_tokens_request=generation_tokens_request,
        iteration_tokens=iteration_tokens,
        max_generation_tokens=max_generation_tokens,
        params_max_tokens=params_max_tokens,
        params_n=params_n,
    )


def build_vllm_v0(f: FamilyFactory) -> VllmV0Metrics:
    """vLLM V0's families that V1 dropped."""
    gauge, values = f.gauge, f.values
    gpu_cache = gauge(
        "vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."
    ).labels(*values)
    cpu_cache = gauge(
        "vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage."
    ).labels(*values)
    swapped = gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.").labels(
        *values
    )
    prefix_cache_hit_rate = gauge(
        "vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate."
    ).labels(*values)
    # vllm:time_per_output_token_seconds (V0) and vllm:inter_token_latency_seconds
    # (V1) are the same per-token gaps: one bulk collector exposes both.
    itl = BulkHistogram(
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
        f.labels,
        values,
    )
    f.registry.register(itl)
    return VllmV0Metrics(
        gpu_cache=gpu_cache,
        cpu_cache=cpu_cache,
        swapped=swapped,
        itl=itl,
        prefix_cache_hit_rate=prefix_cache_hit_rate,
    )


def build_vllm_v1(f: FamilyFactory, config) -> VllmV1Metrics:
    """vLLM V1's families that V0 lacks (``vllm:cache_config_info`` left unlabelled:
    ``EngineMetrics.set_pool_sizes`` sets its one series)."""
    gauge, histogram, values = f.gauge, f.histogram, f.values
    sched, cache = config.scheduler, config.cache
    token_buckets = build_1_2_5_buckets(sched.max_model_len)
    kv_cache = gauge(
        "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
    ).labels(*values)
    by_reason = gauge(
        "vllm:num_requests_waiting_by_reason",
        "Number of waiting requests by reason. Reason labels: 'capacity' = "
        "waiting for scheduling capacity; 'deferred' = deferred by transient "
        "constraints. Sum of all reasons equals vllm:num_requests_waiting.",
        ["reason"],
    )
    waiting_capacity = by_reason.labels(*values, WAITING_CAPACITY)
    waiting_deferred = by_reason.labels(*values, WAITING_DEFERRED)
    tpot_request = histogram(
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        ITL_BUCKETS,
    ).labels(*values)
    num_preemptions_request = histogram(
        "vllm:request_num_preemptions",
        "Histogram of the number of preemptions per request.",
        NUM_PREEMPTIONS_BUCKETS,
    ).labels(*values)
    prefill_kv_computed = histogram(
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        token_buckets,
    ).labels(*values)
    # vLLM's admission counter has no engine label (it counts in the API server).
    admission = Counter(
        "vllm:admission_rejections",
        "Requests rejected at admission.",
        ["model_name", "reason"],
        registry=f.registry,
    )
    admission_by_reason = {r: admission.labels(f.model_name, r) for r in ADMISSION_REJECT_REASONS}
    # vLLM's cache_config_info: the engine label and the cache config, no model_name.
    cache_info = {
        "block_size": cache.block_size,
        "cache_dtype": "auto",
        "enable_prefix_caching": cache.enable_prefix_caching,
        "gpu_memory_utilization": cache.gpu_memory_utilization,
        "num_cpu_blocks": None,
        "num_gpu_blocks": None,
        "num_gpu_blocks_override": cache.num_gpu_blocks_override,
        "num_cpu_blocks_override": cache.num_cpu_blocks_override,
        "swap_space": cache.swap_space,
        "watermark": cache.watermark,
        "engine": str(f.engine_index),
    }
    cache_info_family = Gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        list(cache_info),
        registry=f.registry,
    )
    counter = f.counter
    prefix_cache_queries = counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
    ).labels(*values)
    prefix_cache_hits = counter(
        "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
    ).labels(*values)
    by_source = counter(
        "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ["source"]
    )
    prompt_tokens_by_source = {s: by_source.labels(*values, s) for s in PROMPT_SOURCES}
    prompt_tokens_cached = counter(
        "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
    ).labels(*values)
    return VllmV1Metrics(
        kv_cache=kv_cache,
        waiting_capacity=waiting_capacity,
        waiting_deferred=waiting_deferred,
        tpot_request=tpot_request,
        num_preemptions_request=num_preemptions_request,
        prefill_kv_computed=prefill_kv_computed,
        admission=admission_by_reason,
        cache_info=cache_info_family,
        cache_info_values=cache_info,
        prefix_cache_queries=prefix_cache_queries,
        prefix_cache_hits=prefix_cache_hits,
        prompt_tokens_by_source=prompt_tokens_by_source,
        prompt_tokens_cached=prompt_tokens_cached,
    )
