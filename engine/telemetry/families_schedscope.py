"""schedscope's own metric families (the ``schedscope_`` prefix): what vLLM does not
measure — scheduler decisions, preemptions by mode, stalls by cause, swaps, the KV pools,
steps, queue time per request class, the scheduler's configuration and dropped spans.
:func:`build_schedscope` creates them, in exposition order, and returns the children
and families the observer updates.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

from engine.core import decisions as d
from engine.records.stall_causes import STALL_CAUSES
from engine.telemetry.buckets import (
    BATCH_TOKENS_BUCKETS,
    QUEUE_BUCKETS,
    STALL_BUCKETS,
    STEP_DURATION_BUCKETS,
)
from engine.telemetry.collectors import DroppedSpans
from engine.telemetry.family_factory import FamilyFactory

#: At most this many request classes get their own ``schedscope_queue_time_seconds``
#: series (the first ones seen, for the engine's life; no class is one of them);
#: classes come from a client header (X-Request-Class), so later ones share the series
#: ``class="other"``, and ``schedscope_request_class_overflow_total`` counts the
#: requests folded into it.
MAX_CLASS_LABELS = 32
OTHER_CLASS = "other"
#: The ``turn`` label of the by-turn prefix-cache counters: a conversation's turns 1 to 4
#: each, later ones together, and requests that said no turn (a bounded label set).
TURN_LABELS = ("1", "2", "3", "4", "5+", "unknown")


def turn_label(turn: int) -> str:
    """A request's ``turn`` label from its session turn (0: unknown)."""
    if turn <= 0:
        return "unknown"
    return str(turn) if turn < 5 else "5+"


@dataclass(frozen=True, slots=True)
class SchedscopeMetrics:
    """schedscope's own metrics. The ``*_children`` dicts cache the labelled children
    of a family, added to as new label values are seen."""

    decisions: Counter
    decision_children: dict[tuple[str, str], Counter]
    preemptions_by: Counter
    preemption_children: dict[tuple[str, str], Counter]
    swap_fallbacks: Counter
    #: stall cause -> child, for every cause in STALL_CAUSES
    stalls: dict[str, Counter]
    stall_s: dict[str, Histogram]
    idle_running: Gauge
    idle_running_steps: Counter
    swap_bytes_out: Counter
    swap_bytes_in: Counter
    swap_blocks_out: Counter
    swap_blocks_in: Counter
    recomputed_tokens: Counter
    prefix_cache_evicted_blocks: Counter
    prefix_cache_evicted_prefix_tokens: Counter
    #: turn label -> child, for every label in TURN_LABELS
    prefix_cache_queries_by_turn: dict[str, Counter]
    prefix_cache_hits_by_turn: dict[str, Counter]
    queue_by_class: Histogram
    queue_children: dict[str, Histogram]
    #: requests whose class was past MAX_CLASS_LABELS (observed as class="other")
    class_overflow: Counter
    free_device: Gauge
    free_host: Gauge
    total_device: Gauge
    total_host: Gauge
    step_duration: Histogram
    batch_tokens: Histogram
    dropped: DroppedSpans


def build_schedscope(f: FamilyFactory, sched) -> SchedscopeMetrics:
    """schedscope's families; the token budget and scheduler configuration gauges are
    set here, once."""
    gauge, counter, histogram, values = f.gauge, f.counter, f.histogram, f.values
    decisions = counter(
        "schedscope_decisions", "Scheduler decisions by kind and reason.", ["kind", "reason"]
    )
    preemptions_by = counter(
        "schedscope_preemptions",
        "Preemptions by mode (swap, recompute) and reason.",
        ["mode", "reason"],
    )
    preemption_children = {
        (mode, reason): preemptions_by.labels(*values, mode, reason)
        for mode in ("swap", "recompute")
        for reason in (d.REASON_OUT_OF_BLOCKS, d.REASON_PRIORITY)
    }  # the series a dashboard plots exist (at 0) before the first preemption
    swap_fallbacks = counter(
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
    stalls_by_cause = {c: stalls.labels(*values, c) for c in STALL_CAUSES}
    stall_s_by_cause = {c: stall_s.labels(*values, c) for c in STALL_CAUSES}
    idle_running = gauge(
        "schedscope_idle_running_sequences",
        "Running sequences the last step left out (token budget).",
    ).labels(*values)
    idle_running_steps = counter(
        "schedscope_idle_running_sequence_steps",
        "Sequence-steps a running sequence was left out of a step.",
    ).labels(*values)
    swap_bytes = counter("schedscope_swap_bytes", "KV bytes copied by swaps.", ["direction"])
    swap_blocks = counter("schedscope_swap_blocks", "KV blocks copied by swaps.", ["direction"])
    swap_bytes_out, swap_bytes_in = (swap_bytes.labels(*values, x) for x in ("out", "in"))
    swap_blocks_out, swap_blocks_in = (swap_blocks.labels(*values, x) for x in ("out", "in"))
    recomputed_tokens = counter(
        "schedscope_recomputed_tokens",
        "Tokens re-prefilled because a recompute preemption dropped their KV.",
    ).labels(*values)
    prefix_cache_evicted_blocks = counter(
        "schedscope_prefix_cache_evicted_blocks",
        "Cached KV blocks evicted to make room (their prefixes no longer findable).",
    ).labels(*values)
    prefix_cache_evicted_prefix_tokens = counter(
        "schedscope_prefix_cache_evicted_prefix_tokens",
        "Prompt tokens admissions recomputed because the prefix cache had evicted them "
        "(cache thrash: hits lost for want of room).",
    ).labels(*values)
    queries_by_turn = counter(
        "schedscope_prefix_cache_queries_by_turn",
        "Prompt tokens of first admissions, by conversation turn (X-Session-Turn, else a "
        "chat request's user messages), with prefix caching on.",
        ["turn"],
    )
    hits_by_turn = counter(
        "schedscope_prefix_cache_hits_by_turn",
        "Prompt tokens first admissions found in the prefix cache, by conversation turn.",
        ["turn"],
    )
    queue_by_class = histogram(
        "schedscope_queue_time_seconds",
        "First admission minus arrival, per request class, observed at first scheduling.",
        QUEUE_BUCKETS,
        ["class"],
    )
    class_overflow = counter(
        "schedscope_request_class_overflow",
        f"Requests whose X-Request-Class came after the first {MAX_CLASS_LABELS} classes "
        'and share schedscope_queue_time_seconds{class="other"}.',
    ).labels(*values)
    blocks_free = gauge("schedscope_kv_blocks_free", "Free KV blocks.", ["pool"])
    blocks_total = gauge("schedscope_kv_blocks_capacity", "KV blocks in the pool.", ["pool"])
    free_device, free_host = (blocks_free.labels(*values, p) for p in ("device", "host"))
    total_device, total_host = (blocks_total.labels(*values, p) for p in ("device", "host"))
    step_duration = histogram(
        "schedscope_step_duration_seconds",
        "Step duration: schedule start to results applied.",
        STEP_DURATION_BUCKETS,
    ).labels(*values)
    batch_tokens = histogram(
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
        "max_num_queued_reqs": sched.max_num_queued_reqs,
        "max_num_queued_tokens": sched.max_num_queued_tokens,
        "long_prefill_token_threshold": sched.long_prefill_token_threshold,
        "long_prefill_token_threshold_adaptive": sched.long_prefill_token_threshold_adaptive,
        "aging_rate": sched.aging_rate,
        "max_wait_s": sched.max_wait_s,
        "sjf_size_estimator": sched.sjf_size_estimator,
    }
    gauge(
        "schedscope_scheduler_config_info",
        "The scheduler configuration (value 1).",
        list(sched_info),
    ).labels(*values, *(str(v) for v in sched_info.values())).set(1)
    dropped = DroppedSpans(f.labels, values)
    f.registry.register(dropped)
    return SchedscopeMetrics(
        decisions=decisions,
        decision_children={},
        preemptions_by=preemptions_by,
        preemption_children=preemption_children,
        swap_fallbacks=swap_fallbacks,
        stalls=stalls_by_cause,
        stall_s=stall_s_by_cause,
        idle_running=idle_running,
        idle_running_steps=idle_running_steps,
        swap_bytes_out=swap_bytes_out,
        swap_bytes_in=swap_bytes_in,
        swap_blocks_out=swap_blocks_out,
        swap_blocks_in=swap_blocks_in,
        recomputed_tokens=recomputed_tokens,
        prefix_cache_evicted_blocks=prefix_cache_evicted_blocks,
        prefix_cache_evicted_prefix_tokens=prefix_cache_evicted_prefix_tokens,
        prefix_cache_queries_by_turn={t: queries_by_turn.labels(*values, t) for t in TURN_LABELS},
        prefix_cache_hits_by_turn={t: hits_by_turn.labels(*values, t) for t in TURN_LABELS},
        queue_by_class=queue_by_class,
        queue_children={},
        class_overflow=class_overflow,
        free_device=free_device,
        free_host=free_host,
        total_device=total_device,
        total_host=total_host,
        step_duration=step_duration,
        batch_tokens=batch_tokens,
        dropped=dropped,
    )
