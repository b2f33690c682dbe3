"""engine.telemetry.metrics: counters equal the decisions the step records carry,
histogram counts equal the requests, stall causes follow docs/metrics.md's precedence, the
exposition negotiates OpenMetrics (exemplars) and passes ``promtool check metrics``."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core import decisions as d
from engine.core.decisions import Decision
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence, SequenceStatus
from engine.records.step_record import DECODE, PREFILL, RECOMPUTE, ScheduledSeq, StepRecord
from engine.records.token_times import record_token_times
from engine.telemetry.metrics import (
    STALL_CAUSES,
    EngineMetrics,
    install_metrics,
    wants_openmetrics,
)
from engine.telemetry.trace_ids import format_trace_id, request_trace_id
from tests.engine.core.test_preemption_modes import COSTS, H, L, S
from tests.support.components import check_with_promtool
from tests.support.engine_helpers import Req, drive, make_engine

LABELS = {"model_name": "tiny", "engine": "0"}


def value(metrics: EngineMetrics, name: str, **labels) -> float:
    got = metrics.registry.get_sample_value(name, {**LABELS, **labels})
    return 0.0 if got is None else got


def check_against_trace(metrics: EngineMetrics, trace) -> None:
    decisions = trace.decisions
    by_kind_reason = Counter((x.kind, x.reason) for x in decisions)
    for (kind, reason), n in by_kind_reason.items():
        assert value(metrics, "schedscope_decisions_total", kind=kind, reason=reason) == n
    preempts = [x for x in decisions if x.kind == d.PREEMPT]
    assert value(metrics, "vllm:num_preemptions_total") == len(preempts)
    for (mode, reason), n in Counter((x.mode, x.reason) for x in preempts).items():
        assert value(metrics, "schedscope_preemptions_total", mode=mode, reason=reason) == n
    fallbacks = sum(
        x.mode == "recompute" and x.detail == d.REASON_SWAP_SPACE_EXHAUSTED for x in preempts
    )
    assert (
        value(metrics, "schedscope_swap_fallbacks_total", reason=d.REASON_SWAP_SPACE_EXHAUSTED)
        == fallbacks
    )
    steps = trace.steps
    out_blocks = sum(len(r.blocks_to_swap_out) for r in steps)
    in_blocks = sum(len(r.blocks_to_swap_in) for r in steps)
    per_block = trace.engine.kv_plan.bytes_per_block
    assert value(metrics, "schedscope_swap_blocks_total", direction="out") == out_blocks
    assert value(metrics, "schedscope_swap_blocks_total", direction="in") == in_blocks
    assert value(metrics, "schedscope_swap_bytes_total", direction="out") == out_blocks * per_block
    assert value(metrics, "schedscope_swap_bytes_total", direction="in") == in_blocks * per_block
    seqs = list(trace.seqs.values())
    assert (
        value(metrics, "schedscope_recomputed_tokens_total")
        == sum(s.num_recomputed_tokens for s in seqs)
        == sum(r.num_recompute_tokens for r in steps)
    )
    assert value(metrics, "schedscope_idle_running_sequence_steps_total") == sum(
        r.num_idle_running for r in steps
    )
    assert value(metrics, "vllm:generation_tokens_total") == sum(s.num_output_tokens for s in seqs)
    assert value(metrics, "vllm:prompt_tokens_total") == sum(
        s.num_prompt_tokens for s in seqs if s.first_scheduled_time is not None
    )
    # vLLM's admission counter has no engine label
    assert metrics.registry.get_sample_value(
        "vllm:admission_rejections_total", {"model_name": "tiny", "reason": d.REASON_QUEUE_FULL}
    ) == sum(x.kind == d.REJECT and x.reason == d.REASON_QUEUE_FULL for x in decisions)
    # histograms: one observation per request that entered the engine
    entered = [s for s in seqs if s.status is not SequenceStatus.FINISHED_REJECTED]
    for name in (
        "vllm:e2e_request_latency_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_params_max_tokens",
        "vllm:request_num_preemptions",
        "vllm:request_prefill_kv_computed_tokens",
    ):
        assert value(metrics, name + "_count") == len(entered), name
    assert value(metrics, "vllm:request_num_preemptions_sum") == sum(
        s.num_preemptions for s in entered
    )
    with_token = [s for s in entered if s.num_output_tokens]
    assert value(metrics, "vllm:time_to_first_token_seconds_count") == len(with_token)
    assert value(metrics, "vllm:request_decode_time_seconds_count") == len(with_token)
    gaps = sum(max(s.num_output_tokens - 1, 0) for s in entered)
    assert value(metrics, "vllm:inter_token_latency_seconds_count") == gaps
    assert value(metrics, "vllm:time_per_output_token_seconds_count") == gaps
    assert value(metrics, "vllm:request_time_per_output_token_seconds_count") == sum(
        s.num_output_tokens > 1 for s in entered
    )
    ttft_sum = sum(s.first_token_time - s.arrival_time for s in with_token)
    assert value(metrics, "vllm:time_to_first_token_seconds_sum") == pytest.approx(ttft_sum)
    success = Counter(s.finish_reason for s in entered)
    for reason, n in success.items():
        assert value(metrics, "vllm:request_success_total", finished_reason=reason) == n
    scheduled = [s for s in seqs if s.first_scheduled_time is not None]
    queued = sum(
        value(metrics, "schedscope_queue_time_seconds_count", **{"class": c})
        for c in {s.request_class or "" for s in scheduled}
    )
    assert queued == len(scheduled)
    assert value(metrics, "schedscope_step_duration_seconds_count") == sum(
        bool(r.scheduled) for r in steps
    )
    last = steps[-1]
    assert value(metrics, "vllm:num_requests_running") == last.num_running
    assert value(metrics, "schedscope_kv_blocks_capacity", pool="device") == last.num_device_blocks
    assert value(metrics, "schedscope_kv_blocks_free", pool="host") == last.num_free_host_blocks
    assert trace.engine.observers.num_errors == 0


@pytest.mark.parametrize(
    "mode,cpu_blocks", [("auto", 64), ("swap", 64), ("recompute", 64), ("swap", 0)]
)
def test_counters_equal_the_decisions_of_a_run_that_preempts(mode, cpu_blocks):
    engine = make_engine(
        block_size=4,
        gpu_blocks=20,
        cpu_blocks=cpu_blocks,
        scheduling_policy="priority",
        preemption_mode=mode,
        cost_model=COSTS,
    )
    metrics = install_metrics(engine, "tiny")
    trace = drive(engine, [L, S, H])
    assert trace.of(d.PREEMPT)
    check_against_trace(metrics, trace)
    if cpu_blocks == 0:  # trap 2: every swap wanted fell back to recompute
        assert (
            value(metrics, "schedscope_swap_fallbacks_total", reason=d.REASON_SWAP_SPACE_EXHAUSTED)
            >= 1
        )
    else:
        assert (
            value(metrics, "schedscope_swap_blocks_total", direction="out") > 0
            or mode == "recompute"
        )


def test_idle_running_and_queue_full_rejections_are_counted():
    # trap 1: many sequences admitted, a small token budget leaves most out of each step
    engine = make_engine(
        block_size=4,
        gpu_blocks=512,
        max_num_seqs=64,
        max_model_len=16,
        max_num_batched_tokens=16,
        enable_chunked_prefill=False,
        max_waiting=26,
    )
    metrics = install_metrics(engine, "tiny")
    reqs = [Req(f"r{i:02}", 0.0, prompt_len=4, max_tokens=12) for i in range(30)]
    trace = drive(engine, reqs)
    assert value(metrics, "schedscope_idle_running_sequence_steps_total") > 0
    assert trace.of(d.REJECT)
    check_against_trace(metrics, trace)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 12), st.integers(0, 8), st.floats(0, 0.2)),
        min_size=1,
        max_size=10,
    ),
    gpu_blocks=st.integers(12, 40),
    cpu_blocks=st.sampled_from([0, 4, 64]),
    mode=st.sampled_from(["swap", "recompute", "auto"]),
    policy=st.sampled_from(["fcfs", "priority", "sjf"]),
)
def test_counters_equal_the_records_for_any_small_run(
    requests, gpu_blocks, cpu_blocks, mode, policy
):
    engine = make_engine(
        block_size=4,
        gpu_blocks=gpu_blocks,
        cpu_blocks=cpu_blocks,
        scheduling_policy=policy,
        preemption_mode=mode,
        max_model_len=64,
    )
    metrics = install_metrics(engine, "tiny")
    reqs = [
        Req(f"q{i}", arrival, prompt_len=p, max_tokens=m, priority=prio)
        for i, (p, m, prio, arrival) in enumerate(requests)
    ]
    trace = drive(engine, reqs)
    check_against_trace(metrics, trace)


# -- stall attribution, in constructed scenarios ----------------------------------------
def _seq(request_id: str, seq_no: int) -> Sequence:
    seq = Sequence(
        EngineRequest(request_id, [1, 2, 3, 4], SamplingParams(max_tokens=50), arrival_time=0.0),
        seq_no,
    )
    seq.first_scheduled_time = 0.0
    return seq


class Scenario:
    """Feeds hand-built step records to token timing and the metrics observer."""

    def __init__(self) -> None:
        config = EngineConfig(SchedulerConfig(), CacheConfig(num_gpu_blocks_override=64))
        self.metrics = EngineMetrics(config, "tiny", bytes_per_block=1024)
        self.step = 0

    def record(self, at: float, scheduled=(), decisions=()) -> StepRecord:
        record = StepRecord(
            self.step,
            at,
            at,
            at,
            at,
            decisions=list(decisions),
            num_device_blocks=64,
            num_free_device_blocks=32,
        )
        for seq, kind, n, token in scheduled:
            record.scheduled.append(ScheduledSeq(seq, seq.request_id, kind, n, 0, token))
            if kind == DECODE:
                record.num_decode_seqs += 1
            else:
                record.num_prefill_tokens += n
                if kind == RECOMPUTE:
                    record.num_recompute_tokens += n
        record_token_times(record)
        self.metrics(record)
        self.step += 1
        return record

    def decision(self, kind: str, seq: Sequence, **kw) -> Decision:
        return Decision(kind, 0.0, self.step, seq.request_id, **kw)


def _stall_case(events: set[str]) -> tuple[Scenario, Sequence]:
    sc = Scenario()
    a, b = _seq("A", 0), _seq("B", 1)
    sc.record(0.1, [(a, PREFILL, 4, 7)])  # A's first token
    sc.record(0.2, [(a, DECODE, 1, 8)])  # a short gap: no stall
    between = []
    if "token_budget" in events:
        between.append(
            sc.decision(d.IDLE_RUNNING, a, reason=d.REASON_TOKEN_BUDGET, request_ids=("A",))
        )
    if "preempt" in events:
        between.append(
            sc.decision(
                d.PREEMPT,
                a,
                reason=d.REASON_OUT_OF_BLOCKS,
                mode="swap" if "swap" in events else "recompute",
            )
        )
    if "swap" in events:
        between.append(sc.decision(d.SWAP_OUT, a, reason=d.REASON_OUT_OF_BLOCKS))
    sc.record(0.5, [(b, PREFILL, 4, None)], between)
    last = [
        (a, RECOMPUTE if "recompute" in events else DECODE, 4 if "recompute" in events else 1, 9)
    ]
    if "interference" in events:
        last.append((b, PREFILL, 100, None))
    sc.record(1.5, last)
    return sc, a


@pytest.mark.parametrize(
    "events,cause",
    [
        ({"swap", "preempt", "recompute", "interference", "token_budget"}, "swapped_out"),
        ({"preempt", "recompute", "interference", "token_budget"}, "recompute"),
        ({"preempt", "interference", "token_budget"}, "preempted_waiting"),
        ({"interference", "token_budget"}, "prefill_interference"),
        ({"token_budget"}, "token_budget"),
        (set(), "other"),
    ],
)
def test_a_stall_is_attributed_to_the_first_cause_in_precedence(events, cause):
    sc, a = _stall_case(events)
    m = sc.metrics
    for c in STALL_CAUSES:
        assert value(m, "schedscope_stalls_total", cause=c) == (1 if c == cause else 0), c
    assert value(m, "schedscope_stall_duration_seconds_sum", cause=cause) == pytest.approx(1.3)
    assert value(m, "vllm:inter_token_latency_seconds_count") == 2  # 0.1 and 1.3
    om = m.render("application/openmetrics-text; version=1.0.0")[0].decode()
    ids = re.findall(
        r"schedscope_stall_duration_seconds_bucket\{[^}]*\} 1\.0 # "
        r'\{trace_id="([0-9a-f]{32})"\}',
        om,
    )
    assert ids and set(ids) == {format_trace_id(request_trace_id(a))}


def test_a_small_step_of_another_prefill_is_no_interference():
    sc = Scenario()
    a, b = _seq("A", 0), _seq("B", 1)
    others = [_seq(f"D{i}", 2 + i) for i in range(8)]
    sc.record(0.1, [(a, PREFILL, 4, 7)] + [(s, PREFILL, 4, 1) for s in others])
    # 8 decodes + A's decode + B's 4-token chunk: B's prefill does not dominate
    sc.record(1.0, [(a, DECODE, 1, 8), (b, PREFILL, 4, None)] + [(s, DECODE, 1, 2) for s in others])
    assert value(sc.metrics, "schedscope_stalls_total", cause="other") == 9


# -- gauges --------------------------------------------------------------------------------
def test_waiting_by_reason_maps_static_batch_to_deferred_and_the_rest_to_capacity():
    sc = Scenario()
    a = _seq("A", 0)
    rec = StepRecord(
        0,
        0,
        0,
        0,
        0,
        num_waiting=3,
        decisions=[sc.decision(d.WAIT, a, reason=d.REASON_STATIC_BATCH)],
    )
    sc.metrics(rec)
    assert value(sc.metrics, "vllm:num_requests_waiting_by_reason", reason="deferred") == 3
    assert value(sc.metrics, "vllm:num_requests_waiting_by_reason", reason="capacity") == 0
    rec = StepRecord(
        1,
        0,
        0,
        0,
        0,
        num_waiting=2,
        decisions=[sc.decision(d.WAIT, a, reason=d.REASON_OUT_OF_BLOCKS)],
    )
    sc.metrics(rec)
    assert value(sc.metrics, "vllm:num_requests_waiting_by_reason", reason="deferred") == 0
    assert value(sc.metrics, "vllm:num_requests_waiting_by_reason", reason="capacity") == 2
    assert value(sc.metrics, "vllm:num_requests_waiting") == 2


def test_dropped_spans_are_read_at_scrape_time():
    sc = Scenario()
    assert value(sc.metrics, "schedscope_dropped_spans_total") == 0
    count = [3]
    sc.metrics.watch_dropped_spans(lambda: count[0])
    sc.metrics.watch_dropped_spans(lambda: 1 / 0)  # a broken source is ignored
    count[0] = 7
    assert value(sc.metrics, "schedscope_dropped_spans_total") == 7


def test_config_info_gauges():
    engine = make_engine(block_size=4, gpu_blocks=20, cpu_blocks=8, max_num_seqs=7)
    m = install_metrics(engine, "tiny")
    assert engine.metrics is m
    info = m.registry.get_sample_value(
        "schedscope_scheduler_config_info",
        {
            **LABELS,
            "policy": "fcfs",
            "preemption_mode": "auto",
            "max_num_seqs": "7",
            "max_num_batched_tokens": str(engine.config.scheduler.token_budget),
            "max_model_len": "2048",
            "enable_chunked_prefill": "True",
            "batching": "continuous",
            "max_waiting": "None",
            "max_num_queued_reqs": "None",
            "max_num_queued_tokens": "None",
            "long_prefill_token_threshold": "0",
            "long_prefill_token_threshold_adaptive": "False",
            "aging_rate": "0.0",
            "max_wait_s": "None",
            "sjf_size_estimator": "request",
        },
    )
    assert info == 1
    text = m.render()[0].decode()
    line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info{"))
    assert 'num_gpu_blocks="20"' in line and 'num_cpu_blocks="8"' in line
    assert 'block_size="4"' in line and 'engine="0"' in line and "model_name" not in line
    assert value(m, "schedscope_token_budget_tokens") == engine.config.scheduler.token_budget


# -- exposition ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "accept,expected",
    [
        (None, False),
        ("", False),
        ("text/plain;version=0.0.4", False),
        ("*/*", False),
        (
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
            "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            True,
        ),  # Prometheus, exemplars on
        ("application/openmetrics-text; version=0.0.1", True),
        ("text/plain, application/openmetrics-text;q=0", False),
    ],
)
def test_openmetrics_is_negotiated_from_accept(accept, expected):
    assert wants_openmetrics(accept) is expected


def _run_with_metrics():
    engine = make_engine(
        block_size=4,
        gpu_blocks=20,
        cpu_blocks=64,
        scheduling_policy="priority",
        preemption_mode="auto",
        cost_model=COSTS,
    )
    metrics = install_metrics(engine, "tiny")
    trace = drive(engine, [L, S, H])
    return metrics, trace


def test_exemplars_only_in_openmetrics_and_they_name_real_requests():
    metrics, trace = _run_with_metrics()
    text, text_type = metrics.render("text/plain")
    assert text_type.startswith("text/plain; version=0.0.4") and b"trace_id" not in text
    om, om_type = metrics.render("application/openmetrics-text;version=1.0.0")
    assert om_type.startswith("application/openmetrics-text; version=1.0.0")
    om = om.decode()
    assert om.endswith("# EOF\n")
    # vLLM's colons survive in sample lines (prometheus_client's default escaping drops them)
    assert "\nvllm:time_to_first_token_seconds_bucket{" in om
    expected = {format_trace_id(request_trace_id(s)) for s in trace.seqs.values()}
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "schedscope_queue_time_seconds",
    ):
        ids = re.findall(
            re.escape(name) + r'_bucket\{[^}]*\} \S+ # \{trace_id="([0-9a-f]{32})"\}', om
        )
        assert ids and set(ids) <= expected, name


@pytest.mark.prometheus
def test_promtool_accepts_the_exposition():
    metrics, _ = _run_with_metrics()
    check_with_promtool(metrics.render()[0])


def test_request_classes_from_clients_cannot_grow_the_exposition_without_bound():
    """X-Request-Class is a client header: 100 distinct classes give the first 32 their
    own queue-time series and the rest one shared class="other" series."""
    from engine.telemetry.metrics import MAX_CLASS_LABELS, OTHER_CLASS

    engine = make_engine(block_size=4, gpu_blocks=512, max_num_seqs=128, max_model_len=64)
    metrics = install_metrics(engine, "tiny")
    for i in range(100):
        engine.add_request(
            EngineRequest(
                f"r{i}",
                [5, 6, 7],
                SamplingParams(max_tokens=2),
                arrival_time=0.0,
                request_class=f"class-{i}",
            )
        )
    while engine.has_unfinished():
        engine.step()
    series = {
        s.labels["class"]
        for family in metrics.registry.collect()
        if family.name == "schedscope_queue_time_seconds"
        for s in family.samples
        if s.name.endswith("_count")
    }
    assert len(series) == MAX_CLASS_LABELS + 1 and OTHER_CLASS in series
    assert (
        value(metrics, "schedscope_queue_time_seconds_count", **{"class": OTHER_CLASS})
        == 100 - MAX_CLASS_LABELS
    )


def test_request_classes_past_the_cap_are_counted_and_logged_once(caplog):
    """A class past the cap is not silently merged: the requests folded into
    class="other" are counted (0 until then: the series exists), and the first one is
    logged, once."""
    from engine.telemetry.metrics import MAX_CLASS_LABELS, OTHER_CLASS

    engine = make_engine(block_size=4, gpu_blocks=512, max_num_seqs=128, max_model_len=64)
    metrics = install_metrics(engine, "tiny")
    overflow = "schedscope_request_class_overflow_total"
    assert metrics.registry.get_sample_value(overflow, LABELS) == 0
    classes = [f"class-{i}" for i in range(MAX_CLASS_LABELS)] + ["late", "later", "late"]
    with caplog.at_level("WARNING", logger="schedscope.telemetry"):
        for i, cls in enumerate(classes):
            engine.add_request(
                EngineRequest(
                    f"r{i}",
                    [5, 6, 7],
                    SamplingParams(max_tokens=2),
                    arrival_time=0.0,
                    request_class=cls,
                )
            )
            while engine.has_unfinished():
                engine.step()
    assert value(metrics, overflow) == 3
    assert value(metrics, "schedscope_queue_time_seconds_count", **{"class": OTHER_CLASS}) == 3
    warnings = [r.getMessage() for r in caplog.records if "request class" in r.getMessage()]
    assert len(warnings) == 1 and "'late'" in warnings[0] and str(MAX_CLASS_LABELS) in warnings[0]
    om = metrics.render("application/openmetrics-text")[0].decode()
    assert "# HELP schedscope_request_class_overflow " in om
