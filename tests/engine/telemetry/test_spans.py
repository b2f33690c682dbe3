"""Spans from step records (engine.telemetry.spans): every decision has its span, in
its request's trace, under its request's ``llm_request`` span, inside it in time."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from engine.core import decisions as d
from engine.core.cost_model import FEATURES, CostModel
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.telemetry import spans as sp
from engine.telemetry.trace_ids import request_trace_id
from engine.telemetry.tracing import Tracing, TracingSettings, install_tracing
from tests.support.engine_helpers import STEP_S, Req, drive, make_engine

COSTS = CostModel(
    **{
        **dict.fromkeys(FEATURES, 0.0),
        "step_overhead_s": 1 / 64,
        "prefill_token_s": 1e-6,
        "prefill_attention_s": 1e-6,
        "swap_block_s": 1e-4,
    }
)
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


def traced(engine, memory: InMemorySpanExporter) -> Tracing:
    tracing = Tracing(TracingSettings(), exporters=[memory])
    from engine.telemetry.spans import SpanObserver

    tracing.observer = SpanObserver(
        tracing.finished_spans,
        engine.clock_epoch_unix,
        policy="priority",
        model_name="tiny",
        bytes_per_block=4096,
        steps_per_trace=8,
    )
    engine.observers.add(tracing.observer)
    return tracing


def run_traced(engine, reqs, aborts=(), extra=()):
    """Drive ``reqs`` (and ``extra`` EngineRequests added at t=0) with spans on."""
    memory = InMemorySpanExporter()
    tracing = traced(engine, memory)
    seqs = {r.request_id: engine.add_request(r) for r in extra}
    trace = drive(engine, reqs, aborts)
    trace.seqs.update(seqs)
    assert not engine.has_work()
    stats = tracing.shutdown()
    assert stats["dropped_spans"] == 0
    return trace, memory.get_finished_spans()


def check_spans(trace, spans) -> None:
    """The invariants of docs/telemetry.md, for every request of a finished run."""
    requests = {s.attributes[sp.REQUEST_ID]: s for s in spans if s.name == sp.LLM_REQUEST}
    assert len(requests) == len([s for s in spans if s.name == sp.LLM_REQUEST])
    assert set(requests) == set(trace.seqs)
    for rid, seq in trace.seqs.items():
        root = requests[rid]
        assert root.kind is SpanKind.SERVER
        assert root.context.trace_id == request_trace_id(seq)
        if seq.traceparent:
            assert root.parent is not None and root.parent.is_remote
            assert root.parent.span_id == int(seq.traceparent.split("-")[2], 16)
        else:
            assert root.parent is None
        failed = seq.finish_reason in ("abort", "rejected", "error")
        assert (root.status.status_code is StatusCode.ERROR) == failed
        assert root.attributes[sp.GEN_AI_USAGE_OUTPUT_TOKENS] == seq.num_output_tokens
        assert root.attributes[sp.GEN_AI_USAGE_INPUT_TOKENS] == seq.num_prompt_tokens
        assert root.attributes["schedscope.preempt_swaps"] == seq.num_preemptions_swap
        assert root.attributes["schedscope.preempt_recomputes"] == seq.num_preemptions_recompute
        assert root.attributes[sp.CACHED_TOKENS] == seq.num_cached_tokens
    by_id = {s.context.span_id: s for s in spans}
    children = [s for s in spans if s.name not in (sp.LLM_REQUEST, sp.ENGINE_STEP, sp.ENGINE_STEPS)]
    for child in children:
        root = requests[child.attributes[sp.REQUEST_ID]]
        assert child.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time
    # One span per decision (wait and idle_running excepted), per request and kind.
    expected = Counter(
        (x.request_id, x.kind) for x in trace.decisions if x.kind not in sp.STEP_EVENT_KINDS
    )
    got = Counter(
        (s.attributes[sp.REQUEST_ID], s.attributes[sp.DECISION])
        for s in children
        if sp.DECISION in s.attributes
    )
    assert got == expected
    for s in children:
        if sp.DECISION in s.attributes:
            assert s.name == sp.DECISION_SPAN_NAMES[s.attributes[sp.DECISION]]
    # wait and idle_running: one event each on their step's span.
    steps = [s for s in spans if s.name == sp.ENGINE_STEP]
    events = Counter(e.name for s in steps for e in s.events)
    assert events == Counter(x.kind for x in trace.decisions if x.kind in sp.STEP_EVENT_KINDS)
    counted = [r for r in trace.steps if not r.is_empty or r.decisions]
    assert len(steps) == len(counted)
    assert sorted(s.attributes[sp.STEP] for s in steps) == sorted(r.step for r in counted)
    for s in steps:
        window = by_id[s.parent.span_id]
        assert window.name == sp.ENGINE_STEPS and window.parent is None
        assert window.start_time <= s.start_time <= s.end_time <= window.end_time


def test_swap_recompute_reject_abort_and_a_client_trace():
    engine = make_engine(
        block_size=4,
        gpu_blocks=20,
        cpu_blocks=64,
        scheduling_policy="priority",
        preemption_mode="auto",
        cost_model=COSTS,
    )
    reqs = [
        Req("L", 0.0, prompt_len=60, max_tokens=20, priority=5),
        Req("S", 0.0, prompt_len=3, max_tokens=20, priority=6),
        Req("H", 0.05, prompt_len=70, max_tokens=2, priority=0),
        Req("too-long", 0.1, prompt_len=100, max_tokens=4),
        Req("gone", 0.2, prompt_len=4, max_tokens=40, priority=7),
    ]
    client = EngineRequest(
        "client",
        [7] * 4,
        SamplingParams(max_tokens=3, temperature=0.5),
        arrival_time=0.0,
        priority=9,
        traceparent=TRACEPARENT,
    )
    trace, spans = run_traced(engine, reqs, aborts=[(0.6, "gone")], extra=[client])
    kinds = Counter(x.kind for x in trace.decisions)
    assert kinds[d.SWAP_OUT] and kinds[d.SWAP_IN] and kinds[d.RECOMPUTE]
    assert kinds[d.REJECT] == 1 and kinds[d.ABORT] == 1
    check_spans(trace, spans)

    requests = {s.attributes[sp.REQUEST_ID]: s for s in spans if s.name == sp.LLM_REQUEST}
    assert requests["client"].context.trace_id == int(CLIENT_TRACE, 16)
    assert requests["client"].attributes[sp.GEN_AI_REQUEST_TEMPERATURE] == 0.5
    assert requests["too-long"].status.description == "rejected: exceeds_kv_pool"
    assert requests["gone"].attributes[sp.GEN_AI_RESPONSE_FINISH_REASONS] == ("abort",)
    # The swapped request's timeline: schedule, prefill, decode, preempt, swap_out, swap_in, ...
    by_request = {}
    for s in spans:
        if s.name not in (sp.LLM_REQUEST, sp.ENGINE_STEP, sp.ENGINE_STEPS):
            by_request.setdefault(s.attributes[sp.REQUEST_ID], []).append(s)
    swapped = next(x.request_id for x in trace.decisions if x.kind == d.SWAP_OUT)
    names = [s.name for s in sorted(by_request[swapped], key=lambda s: s.start_time)]
    assert names[0] == sp.SCHEDULE and sp.PREFILL_SPAN in names
    assert names.index(sp.PREEMPT_SPAN) < names.index(sp.SWAP_IN_SPAN)
    preempt = next(s for s in by_request[swapped] if s.name == sp.PREEMPT_SPAN)
    assert preempt.attributes["schedscope.preempt.mode"] == "swap"
    assert preempt.attributes["schedscope.preempt.beneficiary"] == "H"
    assert "schedscope.preempt.predicted_recompute_s" in preempt.attributes
    swap_in = next(s for s in by_request[swapped] if s.name == sp.SWAP_IN_SPAN)
    assert preempt.end_time <= swap_in.start_time
    swap_out = next(s for s in by_request[swapped] if s.name == sp.SWAP_OUT_SPAN)
    assert (
        swap_out.attributes["schedscope.swap.bytes"]
        == 4096 * swap_out.attributes["schedscope.num_blocks"]
    )
    recomputed = next(x.request_id for x in trace.decisions if x.kind == d.RECOMPUTE)
    recompute = next(s for s in by_request[recomputed] if s.name == sp.RECOMPUTE_SPAN)
    assert recompute.end_time > recompute.start_time  # it lasts until the re-prefill ends


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(0, 40),
            st.integers(1, 28),
            st.integers(1, 24),
            st.integers(0, 3),
            st.booleans(),
        ),
        min_size=3,
        max_size=12,
    ),
    st.sampled_from(["swap", "recompute", "auto"]),
    st.sampled_from(["fcfs", "priority", "sjf"]),
    st.integers(8, 16),
    st.integers(0, 30),
)
def test_every_decision_has_its_span(shape, mode, policy, gpu_blocks, cpu_blocks):
    reqs = [
        Req(f"r{i}", arrival / 16, prompt_len=prompt, max_tokens=out, priority=prio)
        for i, (arrival, prompt, out, prio, _) in enumerate(shape)
    ]
    aborts = [
        ((arrival + 2) / 16, f"r{i}") for i, (arrival, *_, abort) in enumerate(shape) if abort
    ]
    engine = make_engine(
        block_size=4,
        gpu_blocks=gpu_blocks,
        cpu_blocks=cpu_blocks,
        scheduling_policy=policy,
        preemption_mode=mode,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        max_model_len=64,
        cost_model=COSTS,
    )
    trace, spans = run_traced(engine, reqs, aborts)
    check_spans(trace, spans)


def test_install_tracing_writes_nothing_without_exporters(tmp_path):
    engine = make_engine()
    tracing = install_tracing(engine, TracingSettings(trace_file=tmp_path / "t.jsonl"))
    drive(engine, [Req("a", 0.0)])
    assert tracing.shutdown()["dropped_spans"] == 0
    assert (tmp_path / "t.jsonl").read_text().count("llm_request") == 1


def test_a_client_trace_that_is_not_sampled_gets_no_spans():
    """W3C Trace Context: flags 00 means the caller did not sample its trace; the
    engine adds no spans to it (a sampled client trace and untraced requests still
    get theirs, and the steps their engine.step spans)."""
    engine = make_engine(block_size=4, gpu_blocks=64, cost_model=COSTS)
    unsampled_trace = "4bf92f3577b34da6a3ce929d0e0e4736"

    def client(request_id: str, traceparent: str) -> EngineRequest:
        return EngineRequest(
            request_id,
            [7] * 4,
            SamplingParams(max_tokens=3),
            arrival_time=0.0,
            traceparent=traceparent,
        )

    trace, spans = run_traced(
        engine,
        [Req("plain", 0.0, prompt_len=4, max_tokens=3)],
        extra=[
            client("sampled", TRACEPARENT),
            client("unsampled", f"00-{unsampled_trace}-00f067aa0ba902b7-00"),
        ],
    )
    assert not [s for s in spans if s.context.trace_id == int(unsampled_trace, 16)]
    assert not [s for s in spans if s.attributes.get(sp.REQUEST_ID) == "unsampled"]
    requests = {s.attributes[sp.REQUEST_ID]: s for s in spans if s.name == sp.LLM_REQUEST}
    assert set(requests) == {"sampled", "plain"}
    assert requests["sampled"].context.trace_id == int(CLIENT_TRACE, 16)
    assert [s for s in spans if s.name == sp.ENGINE_STEP]
    assert trace.seqs["unsampled"].finish_reason == "length"


def test_admission_spans_carry_the_prefix_cache_hits():
    """A prompt sharing another's first two blocks: its schedule (admit) span says the 8
    tokens it found cached, the first's says 0, and so do their request spans."""
    engine = make_engine(block_size=4, gpu_blocks=32)
    shared = tuple(range(100, 108))
    reqs = [
        Req("a", 0.0, 11, 3, prompt=(*shared, 1, 2, 3)),
        Req("b", 10 * STEP_S, 11, 3, prompt=(*shared, 4, 5, 6)),
    ]
    trace, spans = run_traced(engine, reqs)
    check_spans(trace, spans)
    admits = {
        s.attributes[sp.REQUEST_ID]: s.attributes[sp.CACHED_TOKENS]
        for s in spans
        if s.attributes.get(sp.DECISION) == "admit"
    }
    assert admits == {"a": 0, "b": 8}


def test_an_lpm_admission_span_carries_the_cached_length_that_ranked_it():
    """One seat: while "a" runs, cold "c" and then "b" (sharing a's first two blocks)
    arrive. Under lpm "b" goes first, its schedule span saying the 8 cached tokens that
    ranked it (``schedscope.lpm.cached_tokens``), "c"'s 0; under fcfs the attribute is
    absent and "c" goes first."""
    shared = tuple(range(100, 108))
    reqs = [
        Req("a", 0.0, 11, 3, prompt=(*shared, 1, 2, 3)),
        Req("c", STEP_S, 11, 3),
        Req("b", 2 * STEP_S, 11, 3, prompt=(*shared, 4, 5, 6)),
    ]
    for policy, order, ranked in (
        ("lpm", ["a", "b", "c"], {"a": 0, "b": 8, "c": 0}),
        ("fcfs", ["a", "c", "b"], {}),
    ):
        engine = make_engine(block_size=4, gpu_blocks=32, max_num_seqs=1, scheduling_policy=policy)
        trace, spans = run_traced(engine, reqs)
        check_spans(trace, spans)
        assert trace.admission_order() == order
        schedule = [s for s in spans if s.attributes.get(sp.DECISION) == "admit"]
        assert {
            s.attributes[sp.REQUEST_ID]: s.attributes[sp.LPM_CACHED_TOKENS]
            for s in schedule
            if sp.LPM_CACHED_TOKENS in s.attributes
        } == ranked
        cached = {s.attributes[sp.REQUEST_ID]: s.attributes[sp.CACHED_TOKENS] for s in schedule}
        assert cached == {"a": 0, "b": 8, "c": 0}
