"""Hand-built scheduler scenarios: the exact decisions (kind, reason, mode, victim,
beneficiary) each situation must produce.

Every engine here runs on the constant cost model of ``engine_helpers``: every
non-empty step lasts ``STEP_S``, so times are exact multiples of it.
"""

from __future__ import annotations

import pytest

from engine.core import decisions as d
from engine.core.sequence import SequenceStatus
from engine.llm_engine import LLMEngine
from tests.support.engine_helpers import STEP_S, Req, Trace, add, drive, make_engine

FINISHED_OK = {SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH}


def queue_then_run(engine: LLMEngine, reqs: list[Req], start: float = 1.0, **kw) -> Trace:
    """Add ``reqs`` in the given order at clock ``start`` (arrival times as given,
    all in the past), then run to completion: the first step sees all of them."""
    engine.clock.advance_to(start)
    trace = Trace(engine)
    for req in reqs:
        trace.seqs[req.id] = add(engine, req)
    return drive(engine, [], trace=trace, max_steps=kw.pop("max_steps", 2_000), **kw)


def assert_all_finished_ok(trace: Trace, reqs: list[Req]) -> None:
    for req in reqs:
        seq = trace.seqs[req.id]
        assert seq.status in FINISHED_OK, seq
        assert seq.num_output_tokens == req.expected_output, seq
    bm = trace.engine.block_manager
    assert bm.num_free_device_blocks == bm.num_device_blocks
    assert bm.num_free_host_blocks == bm.num_host_blocks


def only(decisions: list[d.Decision]) -> d.Decision:
    assert len(decisions) == 1, decisions
    return decisions[0]


# -- admission in policy order --------------------------------------------------------


def test_fcfs_admits_by_arrival_time_not_submission_order() -> None:
    engine = make_engine(max_num_seqs=1, scheduling_policy="fcfs")
    reqs = [Req("c", 0.3), Req("a", 0.1), Req("b", 0.2)]
    trace = queue_then_run(engine, reqs)
    assert trace.admission_order() == ["a", "b", "c"]
    assert all(x.reason == d.REASON_POLICY_ORDER for x in trace.of(d.ADMIT))
    assert_all_finished_ok(trace, reqs)


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [
        # request: prompt + max_tokens -> b 12, c 14, a 24
        ("request", ["b", "c", "a"]),
        # oracle: prompt + true output -> a 6, b 12, c 14
        ("oracle", ["a", "b", "c"]),
    ],
)
def test_sjf_admits_shortest_estimated_job_first(estimator: str, expected: list[str]) -> None:
    engine = make_engine(max_num_seqs=1, scheduling_policy="sjf", sjf_size_estimator=estimator)
    reqs = [
        Req("a", 0.1, prompt_len=4, max_tokens=20, oracle=2),
        Req("b", 0.2, prompt_len=4, max_tokens=8, oracle=8),
        Req("c", 0.3, prompt_len=10, max_tokens=4, oracle=4),
    ]
    trace = queue_then_run(engine, reqs)
    assert trace.admission_order() == expected
    assert_all_finished_ok(trace, reqs)


def test_priority_admits_lower_value_first_and_arrival_breaks_ties() -> None:
    engine = make_engine(max_num_seqs=1, scheduling_policy="priority")
    reqs = [  # submitted in arrival order (a tie falls to arrival = submission order)
        Req("d", 0.0, priority=2),
        Req("a", 0.1, priority=1),
        Req("b", 0.2, priority=0),
        Req("c", 0.3, priority=0),
    ]
    trace = queue_then_run(engine, reqs)
    assert trace.admission_order() == ["b", "c", "a", "d"]
    assert not trace.of(d.PREEMPT)
    assert_all_finished_ok(trace, reqs)


# -- the memory case: full pool, a new request needs blocks -------------------------
#
# 8 device blocks of 4 tokens. x (24-token prompt, 8 outputs) is prefilled in step 1
# and holds 6 blocks, 7 once its first decode grows; y (12-token prompt, 3 blocks)
# arrives at the second step and does not fit the 2 free blocks.

X = Req("x", 0.0, prompt_len=24, max_tokens=8, oracle=8, priority=1)
Y = Req("y", STEP_S, prompt_len=12, max_tokens=4, oracle=4, priority=0)


def test_memory_case_fcfs_waits_for_blocks() -> None:
    engine = make_engine(block_size=4, gpu_blocks=8, cpu_blocks=8, scheduling_policy="fcfs")
    trace = drive(engine, [X, Y])
    wait = only(trace.of(d.WAIT, "y"))
    assert (wait.reason, wait.step, wait.num_blocks) == (d.REASON_OUT_OF_BLOCKS, 2, 3)
    assert not trace.of(d.PREEMPT)  # fcfs never takes a running request's room
    admit = only(trace.of(d.ADMIT, "y"))
    assert admit.time == trace.seqs["x"].finished_time  # admitted once x has freed its blocks
    assert_all_finished_ok(trace, [X, Y])


def test_memory_case_priority_preempts_the_worse_request_by_swap() -> None:
    engine = make_engine(block_size=4, gpu_blocks=8, cpu_blocks=8, scheduling_policy="priority")
    tables: dict[int, list[int]] = {}
    trace = drive(
        engine,
        [X, Y],
        before_step=lambda tr: tables.__setitem__(
            len(tr.steps) + 1, list(tr.seqs["x"].block_table)
        ),
    )
    preempt = only(trace.of(d.PREEMPT))
    assert (preempt.request_id, preempt.reason, preempt.mode, preempt.beneficiary) == (
        "x",
        d.REASON_PRIORITY,
        "swap",
        "y",
    )
    assert (preempt.step, preempt.num_blocks, preempt.detail) == (2, 6, "")
    swap_out = only(trace.of(d.SWAP_OUT, "x"))
    assert (swap_out.step, swap_out.num_blocks) == (2, 6)
    # y takes the room in the same step, after the preemption
    step = trace.step_of(preempt)
    kinds = [(x.kind, x.request_id) for x in step.decisions]
    assert kinds == [(d.PREEMPT, "x"), (d.SWAP_OUT, "x"), (d.ADMIT, "y")]
    # the mapping moves exactly x's device blocks, to the host blocks x now holds
    assert [dev for dev, _ in step.blocks_to_swap_out] == tables[2]
    assert not step.blocks_to_swap_in
    # x comes back by swap-in once y is done, and finishes with all its tokens
    swap_in = only(trace.of(d.SWAP_IN, "x"))
    assert swap_in.time == trace.seqs["y"].finished_time
    assert trace.seqs["x"].num_preemptions_swap == 1
    assert trace.seqs["x"].num_recomputed_tokens == 0
    assert_all_finished_ok(trace, [X, Y])


def test_memory_case_priority_preempts_by_recompute_when_configured() -> None:
    """Without prefix caching (vLLM V0's default) a recompute re-prefills every token it
    threw away; with it, see test_prefix_cache_scenarios.py."""
    engine = make_engine(
        enable_prefix_caching=False,
        block_size=4,
        gpu_blocks=8,
        cpu_blocks=8,
        scheduling_policy="priority",
        preemption_mode="recompute",
    )
    trace = drive(engine, [X, Y])
    preempt = only(trace.of(d.PREEMPT))
    assert (preempt.request_id, preempt.reason, preempt.mode, preempt.beneficiary) == (
        "x",
        d.REASON_PRIORITY,
        "recompute",
        "y",
    )
    assert preempt.detail == ""  # chosen by the mode, not a fallback
    assert preempt.num_tokens == 24  # x's computed prompt is thrown away
    assert not trace.of(d.SWAP_OUT) and not trace.of(d.SWAP_IN)
    assert not trace.step_of(preempt).blocks_to_swap_out
    recompute = only(trace.of(d.RECOMPUTE, "x"))
    assert recompute.time == trace.seqs["y"].finished_time
    assert recompute.num_tokens == 25  # prompt + the token sampled before preemption
    x = trace.seqs["x"]
    assert x.num_preemptions_recompute == 1 and x.num_recomputed_tokens == 24
    assert_all_finished_ok(trace, [X, Y])


# -- decode growth out of blocks; swap space exhaustion -----------------------------
#
# 4 device blocks of 4 tokens; a and b (4-token prompts, 8 outputs, 3 blocks each at
# the end) both run; at their 9th token both need a third block and none is free:
# the worse running request (b, the later one under fcfs) is preempted for a.

A = Req("a", 0.0, prompt_len=4, max_tokens=8, oracle=8)
B = Req("b", 0.0, prompt_len=4, max_tokens=8, oracle=8)


def test_decode_growth_swaps_out_the_worst_running_request_then_swaps_it_in() -> None:
    engine = make_engine(block_size=4, gpu_blocks=4, cpu_blocks=4, preemption_mode="swap")
    tables: dict[int, list[int]] = {}
    trace = drive(
        engine,
        [A, B],
        before_step=lambda tr: tables.__setitem__(
            len(tr.steps) + 1, list(tr.seqs["b"].block_table) if "b" in tr.seqs else []
        ),
    )
    preempt = only(trace.of(d.PREEMPT))
    assert (preempt.request_id, preempt.reason, preempt.mode, preempt.beneficiary) == (
        "b",
        d.REASON_OUT_OF_BLOCKS,
        "swap",
        "a",
    )
    swap_out = only(trace.of(d.SWAP_OUT, "b"))
    out = trace.step_of(preempt)
    assert swap_out.step == preempt.step and swap_out.num_blocks == 2
    assert [dev for dev, _ in out.blocks_to_swap_out] == tables[preempt.step]
    host_blocks = [host for _, host in out.blocks_to_swap_out]
    assert [e.request_id for e in out.scheduled] == ["a"]  # b is out of this step
    # no swap-in (or admission) in the step that had to preempt
    assert not out.blocks_to_swap_in and not any(x.kind == d.SWAP_IN for x in out.decisions)

    swap_in = only(trace.of(d.SWAP_IN, "b"))
    assert swap_in.time == trace.seqs["a"].finished_time
    back = trace.step_of(swap_in)
    assert [host for host, _ in back.blocks_to_swap_in] == host_blocks
    b = trace.seqs["b"]
    assert b.num_preemptions_swap == 1 and b.num_recomputed_tokens == 0
    assert b.total_swapped_s == swap_in.time - preempt.time
    assert_all_finished_ok(trace, [A, B])


@pytest.mark.parametrize("host_blocks", [0, 1])
def test_swap_space_exhaustion_falls_back_to_recompute(host_blocks: int) -> None:
    """Trap 2: too little swap space: the preemption recomputes instead (b holds 2
    blocks, the host pool has fewer), says so, and the engine keeps going. (``auto``
    with a full host pool: tests/engine/core/test_preemption_modes.py.) Without prefix
    caching, so the fallback re-prefills all it threw away."""
    engine = make_engine(
        block_size=4,
        gpu_blocks=4,
        cpu_blocks=host_blocks,
        preemption_mode="swap",
        enable_prefix_caching=False,
    )
    trace = drive(engine, [A, B])
    preempt = only(trace.of(d.PREEMPT))
    assert (preempt.request_id, preempt.reason, preempt.mode, preempt.beneficiary) == (
        "b",
        d.REASON_OUT_OF_BLOCKS,
        "recompute",
        "a",
    )
    assert preempt.detail == d.REASON_SWAP_SPACE_EXHAUSTED
    assert preempt.num_tokens == 8  # b's 4 prompt + 4 decoded tokens had KV
    assert not trace.of(d.SWAP_OUT) and not trace.step_of(preempt).blocks_to_swap_out
    recompute = only(trace.of(d.RECOMPUTE, "b"))
    assert recompute.reason == d.REASON_POLICY_ORDER
    assert recompute.num_tokens == 9  # re-prefill prompt + output so far
    b = trace.seqs["b"]
    assert b.num_preemptions_recompute == 1 and b.num_preemptions_swap == 0
    assert b.num_recomputed_tokens == 8 > 0
    assert_all_finished_ok(trace, [A, B])


# -- rejection -------------------------------------------------------------------------


def test_rejections_finish_at_once_with_their_reason_and_never_loop() -> None:
    engine = make_engine(block_size=4, gpu_blocks=4, max_model_len=32, max_waiting=2)
    long = add(engine, Req("long", prompt_len=30, max_tokens=8))  # 38 > max_model_len 32
    big = add(engine, Req("big", prompt_len=16, max_tokens=4))  # 5 blocks > the pool's 4
    ok1 = add(engine, Req("ok1", prompt_len=4, max_tokens=2))
    ok2 = add(engine, Req("ok2", prompt_len=4, max_tokens=2))
    full = add(engine, Req("full", prompt_len=4, max_tokens=2))  # 2 already waiting
    for seq, reason in (
        (long, d.REASON_EXCEEDS_MAX_MODEL_LEN),
        (big, d.REASON_EXCEEDS_KV_POOL),
        (full, d.REASON_QUEUE_FULL),
    ):
        assert seq.status is SequenceStatus.FINISHED_REJECTED, seq
        assert seq.reject_reason == reason and seq.finish_reason == "rejected"
        assert seq.finished_time == 0.0
        assert seq.request_id not in engine.scheduler.requests
    assert ok1.status is ok2.status is SequenceStatus.WAITING
    assert engine.scheduler.num_waiting == 2

    trace = drive(engine, [], trace=Trace(engine, seqs={"ok1": ok1, "ok2": ok2}), max_steps=100)
    rejects = trace.steps[0].decisions[:3]  # reported with the next step
    assert [(x.kind, x.request_id, x.reason) for x in rejects] == [
        (d.REJECT, "long", d.REASON_EXCEEDS_MAX_MODEL_LEN),
        (d.REJECT, "big", d.REASON_EXCEEDS_KV_POOL),
        (d.REJECT, "full", d.REASON_QUEUE_FULL),
    ]
    assert (rejects[0].num_tokens, rejects[1].num_blocks) == (38, 5)
    rejected_ids = {"long", "big", "full"}
    # nothing else ever happens to a rejected request
    assert [x for x in trace.decisions if x.request_id in rejected_ids] == rejects
    assert not set(trace.engine.executor.scheduled_per_seq) & rejected_ids
    assert ok1.status in FINISHED_OK and ok2.status in FINISHED_OK
    # a request refused for a full queue can come back once there is room
    again = add(engine, Req("full", arrival=engine.clock.now(), prompt_len=4, max_tokens=2))
    assert again.status is SequenceStatus.WAITING


# -- trap 1: max_num_seqs raised, token budget not -----------------------------------


def test_continuous_batching_without_chunking_outgrows_the_token_budget() -> None:
    """Trap 1 as vLLM v0 (no chunked prefill) walks into it: steps that admit new
    prefills carry no decodes, so the running set grows to max_num_seqs (64) while a
    decode step can run only max_num_batched_tokens (16) of them. The rest hold KV
    blocks and sit idle, step after step, recorded with reason ``token_budget``."""
    engine = make_engine(
        block_size=4,
        gpu_blocks=512,
        max_num_seqs=64,
        max_model_len=16,
        max_num_batched_tokens=16,
        enable_chunked_prefill=False,
    )
    reqs = [Req(f"r{i:02}", 0.0, prompt_len=4, max_tokens=12, oracle=12) for i in range(64)]
    budget_idle = []
    prefill_idle = []

    def on_step(outcome, trace):
        out = outcome
        assert out.num_batched_tokens <= 16
        for x in out.decisions:
            if x.kind == d.IDLE_RUNNING:
                (budget_idle if x.reason == d.REASON_TOKEN_BUDGET else prefill_idle).append(
                    (out.num_running, len(x.request_ids))
                )
                if x.reason == d.REASON_PREFILL_PRIORITY:
                    assert out.num_decode_seqs == 0  # prefill steps carry no decodes

    trace = drive(engine, reqs, on_step=on_step)
    assert prefill_idle, "admission steps never left running requests out"
    assert max(running for running, _ in budget_idle) == 64  # all admitted ...
    assert max(idle for _, idle in budget_idle) == 48  # ... three quarters idle
    assert_all_finished_ok(trace, reqs)
    assert sum(trace.seqs[r.id].num_idle_running_steps for r in reqs) > 64


def test_token_budget_leaves_admitted_requests_idle_running() -> None:
    """32 requests fit max_num_seqs (64) and the pool and are admitted as one
    (static) batch, but a 16-token budget runs only 16 tokens a step: the rest are
    running, hold their blocks, and idle; each step says which ones."""
    engine = make_engine(
        block_size=4,
        gpu_blocks=256,
        max_num_seqs=64,
        max_num_batched_tokens=16,
        batching="static",
        static_batch_timeout_s=0.0,
    )
    reqs = [Req(f"r{i:02}", 0.0, prompt_len=4, max_tokens=20, oracle=20) for i in range(32)]
    listed: dict[str, int] = {}
    steady = []

    def on_step(outcome, trace):
        out = outcome
        assert out.num_batched_tokens <= 16
        idle = [x for x in out.decisions if x.kind == d.IDLE_RUNNING]
        scheduled = {e.request_id for e in out.scheduled}
        running = {s.request_id for s in engine.scheduler.running} | {
            s.request_id for s in outcome.finished
        }
        if not idle:
            assert running == scheduled  # nobody left out
            return
        x = only(idle)
        assert x.reason == d.REASON_TOKEN_BUDGET
        # exactly the running requests the step left out, none of the scheduled ones
        assert set(x.request_ids) == running - scheduled
        for rid in x.request_ids:
            listed[rid] = listed.get(rid, 0) + 1
        if out.num_decode_seqs == 16:
            assert out.num_batched_tokens == 16 and len(out.scheduled) == 16
            assert out.num_running == 32 and len(x.request_ids) == 16
            steady.append(out.step)

    trace = drive(engine, reqs, on_step=on_step)
    assert steady, "never ran 16 decodes with 16 admitted requests idle"
    for req in reqs:  # the counter on each sequence matches the decisions
        assert trace.seqs[req.id].num_idle_running_steps == listed.get(req.id, 0)
    # the policy's worse half waits while the better half decodes to completion
    assert min(listed[f"r{i:02}"] for i in range(16, 32)) >= 19
    assert_all_finished_ok(trace, reqs)


# -- trap 3: starvation under sjf, fixed by aging or max_wait_s ----------------------


def _long_request_queue_s(**knobs) -> tuple[float, Trace]:
    engine = make_engine(
        block_size=4,
        gpu_blocks=64,
        max_num_seqs=1,
        scheduling_policy="sjf",
        max_model_len=128,
        **knobs,
    )
    # a stream of short jobs (size 8, 4 steps each) arriving every 2 steps for ~3 s,
    # faster than they are served, and one long job (size 60) just after the first
    shorts = [Req(f"s{i:03}", i * 2 * STEP_S, prompt_len=4, max_tokens=4) for i in range(100)]
    long = Req("long", STEP_S / 2, prompt_len=40, max_tokens=20)
    trace = drive(engine, [*shorts, long])
    assert_all_finished_ok(trace, [*shorts, long])
    return trace.seqs["long"].queue_s, trace


def test_long_request_starves_under_sjf_and_aging_or_max_wait_serve_it_earlier() -> None:
    starved, base = _long_request_queue_s()
    # without a fix the long job waits for the whole stream of short ones
    last_short = max(s.first_scheduled_time for rid, s in base.seqs.items() if rid != "long")
    assert base.seqs["long"].first_scheduled_time > last_short
    assert starved > 5.0

    # aging 52 tokens/s: shorts arriving ~1 s after the long one rank behind it
    aged, _ = _long_request_queue_s(aging_rate=52.0)
    assert aged < starved / 2

    bounded, trace = _long_request_queue_s(max_wait_s=0.5)
    assert bounded <= 0.5 + STEP_S
    admit = only(trace.of(d.ADMIT, "long"))
    assert admit.reason == d.REASON_MAX_WAIT
    # it took a running short job's place (max_num_seqs=1)
    preempt = only([x for x in trace.of(d.PREEMPT) if x.beneficiary == "long"])
    assert preempt.reason == d.REASON_MAX_WAIT and preempt.step == admit.step


# -- static batching ---------------------------------------------------------------------


def test_static_batching_admits_no_joins_while_a_batch_runs() -> None:
    engine = make_engine(max_num_seqs=2, batching="static", static_batch_timeout_s=0.05)
    reqs = [
        Req("a", 0.0, max_tokens=4),
        Req("b", 0.0, max_tokens=4),
        Req("c", STEP_S, max_tokens=4),
    ]
    trace = drive(engine, reqs)
    a, b, c = (trace.seqs[r] for r in "abc")
    # a full batch (max_num_seqs waiting) starts at once
    assert a.first_scheduled_time == b.first_scheduled_time == 0.0
    assert [(x.kind, x.reason) for x in trace.of(d.ADMIT)][:2] == [
        (d.ADMIT, d.REASON_STATIC_BATCH)
    ] * 2
    wait = only(trace.of(d.WAIT, "c"))
    assert wait.reason == d.REASON_STATIC_BATCH and wait.time == STEP_S
    batch_end = max(a.finished_time, b.finished_time)
    assert batch_end == 4 * STEP_S
    # c joins no running batch: it starts a new (partial) one after the timeout
    assert batch_end <= c.first_scheduled_time <= batch_end + 0.05
    assert only(trace.of(d.ADMIT, "c")).reason == d.REASON_STATIC_BATCH
    assert_all_finished_ok(trace, reqs)


def test_static_batching_starts_a_partial_batch_after_the_timeout() -> None:
    engine = make_engine(max_num_seqs=4, batching="static", static_batch_timeout_s=0.05)
    reqs = [Req("d", 0.0), Req("e", 0.02)]
    first = None

    def on_step(outcome, trace):
        nonlocal first
        if first is None:
            first = outcome

    trace = drive(engine, reqs, on_step=on_step)
    # nothing runs while the batch is forming; the step says when to look again
    assert first.is_empty and first.wake_at == 0.05
    assert trace.seqs["d"].first_scheduled_time == trace.seqs["e"].first_scheduled_time == 0.05
    admits = trace.of(d.ADMIT)
    assert [x.request_id for x in admits] == ["d", "e"] and admits[0].step == admits[1].step
    assert_all_finished_ok(trace, reqs)


# -- abort -------------------------------------------------------------------------------


def test_abort_of_swapped_waiting_and_running_requests_frees_their_blocks() -> None:
    engine = make_engine(block_size=4, gpu_blocks=4, cpu_blocks=4, preemption_mode="swap")
    bm, sched = engine.block_manager, engine.scheduler
    a, b = add(engine, A), add(engine, B)
    for _ in range(10):  # until b is swapped out by a's growth
        engine.step()
        if b.status is SequenceStatus.SWAPPED:
            break
    assert b.status is SequenceStatus.SWAPPED and bm.num_free_host_blocks == 2
    c = add(engine, Req("c", engine.clock.now(), prompt_len=8, max_tokens=2))
    assert c.status is SequenceStatus.WAITING

    assert engine.abort("b") is b  # swapped
    assert b.status is SequenceStatus.FINISHED_ABORTED and b.block_table == []
    assert bm.num_free_host_blocks == bm.num_host_blocks == 4
    sched.check_invariants()
    out = engine.step()
    abort = only([x for x in out.decisions if x.kind == d.ABORT])
    assert (abort.request_id, abort.reason) == ("b", d.REASON_CLIENT)

    assert c.status is SequenceStatus.WAITING  # a holds 3 of 4 blocks, c needs 2
    assert engine.abort("c") is c  # waiting
    assert sched.num_waiting == 0 and c.status is SequenceStatus.FINISHED_ABORTED
    sched.check_invariants()

    assert a.status is SequenceStatus.RUNNING
    assert engine.abort("a") is a  # running
    assert bm.num_free_device_blocks == bm.num_device_blocks
    assert not sched.running and not engine.has_unfinished()
    sched.check_invariants()
    later, ended = sched.drain_pending()
    assert ended == [c, a]  # reported with the next step record
    assert [(x.kind, x.request_id, x.reason) for x in later] == [
        (d.ABORT, "c", d.REASON_CLIENT),
        (d.ABORT, "a", d.REASON_CLIENT),
    ]
    assert engine.abort("a") is None and engine.abort("nope") is None


# -- chunked prefill -------------------------------------------------------------------


def test_chunked_prefill_splits_a_long_prompt_under_the_budget() -> None:
    engine = make_engine(block_size=4, max_num_batched_tokens=16, max_model_len=64)
    trace = drive(engine, [Req("x", 0.0, prompt_len=40, max_tokens=2)])
    chunks = [r.scheduled.get("x") for r in engine.executor.records]
    assert chunks == [16, 16, 8, 1]  # three prefill chunks, then one decode
    x = trace.seqs["x"]
    assert x.first_token_time == 3 * STEP_S  # sampled when the last chunk ran
    assert [o.num_prefill_tokens for o in trace.steps] == [16, 16, 8, 0]


def test_without_chunking_a_prompt_is_scheduled_whole() -> None:
    engine = make_engine(
        block_size=4, enable_chunked_prefill=False, max_num_batched_tokens=64, max_model_len=64
    )
    reqs = [Req("x", 0.0, prompt_len=40, max_tokens=3), Req("y", 0.0, prompt_len=40, max_tokens=2)]
    trace = drive(engine, reqs)
    records = engine.executor.records
    assert records[0].scheduled == {"x": 40}  # y's 40 do not fit the 24 left
    wait = only(trace.of(d.WAIT, "y"))
    assert (wait.reason, wait.step) == (d.REASON_TOKEN_BUDGET, 1)
    # vLLM v0 without chunked prefill: a step that admits a prefill runs only prefills,
    # and the running request sits it out (recorded as idle running).
    assert records[1].scheduled == {"y": 40}
    idle = only(trace.of(d.IDLE_RUNNING))
    assert (idle.reason, idle.step, idle.request_ids) == (d.REASON_PREFILL_PRIORITY, 2, ("x",))
    assert records[2].scheduled == {"x": 1, "y": 1}
    assert_all_finished_ok(trace, reqs)


# -- engine bugs found by the property tests (minimal reproductions) -------------------


def test_recompute_cost_counts_a_second_preemption_during_re_prefill() -> None:
    """x decodes to 11 computed tokens, is recompute-preempted for y, re-prefills 4
    of its 12 tokens (budget 4) and is preempted again for z. It has thrown away
    11 + 4 = 15 computed tokens, so it runs 23 + 15 tokens in all and
    ``num_recomputed_tokens`` must say 15 (trap 2's recompute cost). Without prefix
    caching: with it, x would re-hit its own blocks."""
    engine = make_engine(
        enable_prefix_caching=False,
        block_size=4,
        cpu_blocks=0,
        max_model_len=64,
        max_num_batched_tokens=4,
        max_num_seqs=1,
        scheduling_policy="priority",
        preemption_mode="recompute",
    )
    reqs = [
        Req("x", 0.0, prompt_len=4, max_tokens=20, priority=2),
        Req("y", 8 * STEP_S, prompt_len=4, max_tokens=1, priority=1),
        Req("z", 10 * STEP_S, prompt_len=4, max_tokens=1, priority=0),
    ]
    trace = drive(engine, reqs)
    assert_all_finished_ok(trace, reqs)
    preempts = trace.of(d.PREEMPT, "x")
    assert [(p.beneficiary, p.num_tokens) for p in preempts] == [("y", 11), ("z", 4)]
    x = trace.seqs["x"]
    assert engine.executor.scheduled_per_seq["x"] == 38
    assert x.num_recomputed_tokens == 15


def test_static_batching_with_priority_swaps_a_request_back_in() -> None:
    """b (priority 1) is swapped out by a's decode growth inside a static batch; c
    (priority 0) arrives mid-batch. When a finishes, the batch must drain (swap b
    back in) before c can start a new batch. The engine must not deadlock with b
    waiting for the better c and c waiting for b's batch to end."""
    engine = make_engine(
        block_size=4,
        gpu_blocks=4,
        cpu_blocks=4,
        scheduling_policy="priority",
        max_num_seqs=2,
        batching="static",
        preemption_mode="swap",
    )
    reqs = [
        Req("a", 0.0, prompt_len=4, max_tokens=8, priority=0),
        Req("b", 0.0, prompt_len=4, max_tokens=8, priority=1),
        Req("c", STEP_S, prompt_len=4, max_tokens=2, priority=0),
    ]
    trace = drive(engine, reqs, max_steps=500, max_stall_steps=100)
    assert only(trace.of(d.PREEMPT, "b")).mode == "swap"
    assert only(trace.of(d.SWAP_IN, "b"))
    assert_all_finished_ok(trace, reqs)


def test_max_wait_with_recompute_does_not_livelock() -> None:
    """Two requests, one slot, a prefill that needs two steps (3 tokens, budget 2)
    and max_wait_s of one step. Each overdue request preempts the other by
    recompute before its prefill completes, and the victim's new waiting interval
    is overdue one step later: neither ever produces a token."""
    engine = make_engine(
        block_size=2,
        gpu_blocks=4,
        cpu_blocks=0,
        max_model_len=8,
        max_num_batched_tokens=2,
        max_num_seqs=1,
        preemption_mode="recompute",
        max_wait_s=STEP_S,
    )
    reqs = [Req("a", 0.0, prompt_len=3, max_tokens=1), Req("b", 0.0, prompt_len=3, max_tokens=1)]
    trace = drive(engine, reqs, max_steps=500, max_stall_steps=100)
    assert_all_finished_ok(trace, reqs)
