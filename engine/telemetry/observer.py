"""The metrics observer: :class:`EngineMetrics` reads each step record and updates the
metric families of :mod:`engine.telemetry.families_vllm` and
:mod:`engine.telemetry.families_schedscope`, in its own registry.

It runs on the engine's thread (the engine process in process mode), right after each
step: its per-step work is a few gauge sets, one counter increment per decision and
per-request work only where a request starts, emits its first token, stalls or ends.
Inter-token latencies are the one per-token observation: they are bucketed in one pass
per step into a plain collector (``engine.telemetry.collectors.BulkHistogram``) instead
of one ``Histogram.observe`` per token.

A stall's cause (``engine.records.stall_causes``) comes from what happened to the
request since its last token, kept as bit flags per live request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from engine.core import decisions as d
from engine.core.sequence import SequenceStatus
from engine.core.token_timing import STALL_FLOOR_S
from engine.records.stall_causes import (
    OTHER,
    PREEMPTED_WAITING,
    PREFILL_INTERFERENCE,
    SWAPPED_OUT,
    TOKEN_BUDGET,
)
from engine.records.stall_causes import RECOMPUTE as RECOMPUTE_CAUSE
from engine.records.step_record import DECODE, PREFILL, RECOMPUTE, StepRecord
from engine.telemetry.exposition import render_registry, request_exemplar
from engine.telemetry.families_schedscope import (
    MAX_CLASS_LABELS,
    OTHER_CLASS,
    build_schedscope,
    turn_label,
)
from engine.telemetry.families_vllm import (
    DEFERRED_WAIT_REASONS,
    SOURCE_CACHE_HIT,
    SOURCE_COMPUTE,
    build_vllm,
    build_vllm_v0,
    build_vllm_v1,
)
from engine.telemetry.family_factory import FamilyFactory

log = logging.getLogger("schedscope.telemetry")

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
        families = FamilyFactory(self.registry, model_name, engine_index)
        self._labelvalues = families.values
        # in exposition order: vLLM (both generations, V0 only, V1 only), then schedscope
        self.vllm = build_vllm(families, config.scheduler)
        self.vllm_v0 = build_vllm_v0(families)
        self.vllm_v1 = build_vllm_v1(families, config)
        self.schedscope = build_schedscope(families, config.scheduler)
        self._cache_info_child: Gauge | None = None
        #: vLLM counts prefix-cache queries only with prefix caching on
        self.prefix_caching = config.cache.enable_prefix_caching
        self._prefix_queried = self._prefix_hit = 0

        #: request id -> [last token time or None, flags since it]
        self._live: dict[str, list] = {}
        self._wait_reason: str | None = None
        self._last_gauges: tuple | None = None
        self._class_overflow_logged = False
        self.num_steps = 0

    # -- configuration ---------------------------------------------------------------------
    def set_pool_sizes(self, num_device_blocks: int, num_host_blocks: int) -> None:
        """The block counts of ``vllm:cache_config_info`` (known once the engine is built)."""
        values = dict(
            self.vllm_v1.cache_info_values,
            num_gpu_blocks=num_device_blocks,
            num_cpu_blocks=num_host_blocks,
        )
        if self._cache_info_child is not None:
            self.vllm_v1.cache_info.clear()
        self._cache_info_child = self.vllm_v1.cache_info.labels(
            **{k: str(v) for k, v in values.items()}
        )
        self._cache_info_child.set(1)

    def watch_dropped_spans(self, source: Callable[[], int]) -> None:
        """Register a callable returning the span exporter's dropped-span count; read at
        scrape time into ``schedscope_dropped_spans_total`` (summed over sources)."""
        self.schedscope.dropped.sources.append(source)

    # -- the observer ----------------------------------------------------------------------
    def __call__(self, record: StepRecord) -> None:
        self.num_steps += 1
        live = self._live
        at = record.token_time
        for x in record.decisions:
            kind, reason = x.kind, x.reason
            key = (kind, reason)
            child = self.schedscope.decision_children.get(key)
            if child is None:
                child = self.schedscope.decision_children[key] = self.schedscope.decisions.labels(
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
                target = x.request_id
                state = live.get(target) if target is not None else None
                if state is not None:
                    state[1] |= _F_SWAPPED
            elif kind == d.RECOMPUTE:
                target = x.request_id
                state = live.get(target) if target is not None else None
                if state is not None:
                    state[1] |= _F_RECOMPUTED
                self._prefix_cache_query(x.num_tokens, x.num_cached_tokens)
                if x.num_evicted_prefix_tokens:
                    self.schedscope.prefix_cache_evicted_prefix_tokens.inc(
                        x.num_evicted_prefix_tokens
                    )
            elif kind == d.ADMIT:
                self._admitted(x.num_tokens, x.num_cached_tokens)
                if x.num_evicted_prefix_tokens:
                    self.schedscope.prefix_cache_evicted_prefix_tokens.inc(
                        x.num_evicted_prefix_tokens
                    )
            elif kind == d.WAIT:
                self._wait_reason = reason
            elif kind == d.REJECT:
                counter = self.vllm_v1.admission.get(reason)
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
        gauges = (
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
        if gauges != self._last_gauges:
            self._last_gauges = gauges
            self._set_gauges(*gauges)
        idle = record.num_idle_running
        if idle:
            self.schedscope.idle_running_steps.inc(idle)
        if record.num_evicted_blocks:
            self.schedscope.prefix_cache_evicted_blocks.inc(record.num_evicted_blocks)
        out_blocks, in_blocks = len(record.blocks_to_swap_out), len(record.blocks_to_swap_in)
        if out_blocks:
            self.schedscope.swap_blocks_out.inc(out_blocks)
            self.schedscope.swap_bytes_out.inc(out_blocks * self.bytes_per_block)
        if in_blocks:
            self.schedscope.swap_blocks_in.inc(in_blocks)
            self.schedscope.swap_bytes_in.inc(in_blocks * self.bytes_per_block)

    def _admitted(self, num_prompt: int, num_cached: int) -> None:
        """A request's first admission: its prompt tokens by source (the computed ones
        are also counted in ``vllm:prompt_tokens_total`` as its steps compute them; the
        cached ones here, as they never are)."""
        v1 = self.vllm_v1
        v1.prompt_tokens_by_source[SOURCE_COMPUTE].inc(num_prompt - num_cached)
        if num_cached:
            v1.prompt_tokens_by_source[SOURCE_CACHE_HIT].inc(num_cached)
            v1.prompt_tokens_cached.inc(num_cached)
            self.vllm.prompt_tokens.inc(num_cached)
        self._prefix_cache_query(num_prompt, num_cached)

    def _prefix_cache_query(self, num_tokens: int, num_cached: int) -> None:
        """An admission asked the prefix cache for ``num_tokens`` and found ``num_cached``."""
        if not self.prefix_caching:
            return
        self._prefix_queried += num_tokens
        self._prefix_hit += num_cached
        self.vllm_v1.prefix_cache_queries.inc(num_tokens)
        if num_cached:
            self.vllm_v1.prefix_cache_hits.inc(num_cached)
        self.vllm_v0.prefix_cache_hit_rate.set(self._prefix_hit / self._prefix_queried)

    def _set_gauges(
        self, running, waiting, deferred, swapped, total, free, host_total, host_free, idle
    ) -> None:
        self.vllm.running.set(running)
        self.vllm.waiting.set(waiting)
        self.vllm_v1.waiting_capacity.set(0 if deferred else waiting)
        self.vllm_v1.waiting_deferred.set(waiting if deferred else 0)
        self.vllm_v0.swapped.set(swapped)
        usage = 1.0 - free / total if total else 0.0
        self.vllm_v1.kv_cache.set(usage)
        self.vllm_v0.gpu_cache.set(usage)
        self.vllm_v0.cpu_cache.set(1.0 - host_free / host_total if host_total else 0.0)
        self.schedscope.free_device.set(free)
        self.schedscope.total_device.set(total)
        self.schedscope.free_host.set(host_free)
        self.schedscope.total_host.set(host_total)
        self.schedscope.idle_running.set(idle)

    def _preempted(self, x, live) -> None:
        self.vllm.preemptions.inc()
        key = (x.mode or "", x.reason)
        child = self.schedscope.preemption_children.get(key)
        if child is None:
            child = self.schedscope.preemption_children[key] = (
                self.schedscope.preemptions_by.labels(*self._labelvalues, *key)
            )
        child.inc()
        if x.mode == "recompute" and x.detail == d.REASON_SWAP_SPACE_EXHAUSTED:
            self.schedscope.swap_fallbacks.inc()
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
                self.vllm.ttft.observe(at - seq.arrival_time, request_exemplar(seq))
            else:
                gap = at - last
                append(gap)
                if gap >= threshold:
                    cause = stall_cause(state[1])
                    self.schedscope.stalls[cause].inc()
                    self.schedscope.stall_s[cause].observe(gap, request_exemplar(entry.seq))
            state[0] = at
            state[1] = 0
        emitted = firsts + len(gaps)
        if gaps:
            self.vllm_v0.itl.observe_many(gaps)
        if emitted:
            self.vllm.generation_tokens.inc(emitted)
        if prompt:
            self.vllm.prompt_tokens.inc(prompt)
        if record.num_recompute_tokens:
            self.schedscope.recomputed_tokens.inc(record.num_recompute_tokens)
        self.vllm.iteration_tokens.observe(num_batched)
        self.schedscope.batch_tokens.observe(num_batched)
        self.schedscope.step_duration.observe(record.duration_s)

    def _first_scheduled(self, seq) -> None:
        if seq.first_scheduled_time is None:
            return
        if self.prefix_caching:  # its first admission: the prefix cache's hits by turn
            turn = turn_label(seq.request.session_turn)
            self.schedscope.prefix_cache_queries_by_turn[turn].inc(seq.num_prompt_tokens)
            if seq.num_cached_tokens:
                self.schedscope.prefix_cache_hits_by_turn[turn].inc(seq.num_cached_tokens)
        cls = seq.request_class or ""
        child = self.schedscope.queue_children.get(cls)
        if child is None:
            if len(self.schedscope.queue_children) >= MAX_CLASS_LABELS:
                # Classes come from a client header: past the cap they share one
                # series, so no client can grow /metrics (and its render) without bound.
                self._class_overflow(cls)
                cls = OTHER_CLASS
                child = self.schedscope.queue_children.get(cls)
            if child is None:
                child = self.schedscope.queue_children[cls] = self.schedscope.queue_by_class.labels(
                    *self._labelvalues, cls
                )
        child.observe(seq.first_scheduled_time - seq.arrival_time, request_exemplar(seq))

    def _class_overflow(self, cls: str) -> None:
        self.schedscope.class_overflow.inc()
        if not self._class_overflow_logged:
            self._class_overflow_logged = True
            log.warning(
                "request class %r and any later new class are counted as class=%r in "
                "schedscope_queue_time_seconds: the first %d classes have their own "
                "series (schedscope_request_class_overflow_total counts the requests)",
                cls,
                OTHER_CLASS,
                MAX_CLASS_LABELS,
            )

    def _finished(self, seq) -> None:
        if seq.status is SequenceStatus.FINISHED_REJECTED:
            return  # never entered the engine (vLLM: refused before the engine core)
        reason = seq.finish_reason
        counter = self.vllm.success.get(reason)
        if counter is None:
            counter = self.vllm.success[reason] = self.vllm.success_family.labels(
                *self._labelvalues, reason
            )
        counter.inc()
        arrival = seq.arrival_time
        end = seq.finished_time
        exemplar = request_exemplar(seq)
        if end is not None:
            self.vllm.e2e.observe(end - arrival, exemplar)
        n_out = seq.num_output_tokens
        self.vllm.prompt_tokens_request.observe(seq.num_prompt_tokens)
        self.vllm.generation_tokens_request.observe(n_out)
        self.vllm.max_generation_tokens.observe(n_out)
        self.vllm.params_max_tokens.observe(seq.params.max_tokens)
        self.vllm.params_n.observe(1)
        self.vllm_v1.num_preemptions_request.observe(seq.num_preemptions)
        # new KV computed for its prompt: the cached prefix excluded (as vLLM)
        self.vllm_v1.prefill_kv_computed.observe(seq.num_prompt_tokens - seq.num_cached_tokens)
        scheduled = seq.first_scheduled_time
        if scheduled is None:
            return
        self.vllm.queue.observe(scheduled - arrival, exemplar)
        first, last = seq.timing.first_token_time, seq.timing.last_token_time
        if first is None:
            return
        self.vllm.prefill_time.observe(first - scheduled)
        self.vllm.decode_time.observe(last - first)
        self.vllm.inference_time.observe(last - scheduled)
        if n_out > 1:
            self.vllm_v1.tpot_request.observe((last - first) / (n_out - 1))

    # -- exposition ------------------------------------------------------------------------
    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """(body, content type): OpenMetrics (with exemplars) when ``accept`` asks for
        it, as Prometheus does with exemplar storage on; else the classic text format."""
        with self._render_lock:
            return render_registry(self.registry, accept)
