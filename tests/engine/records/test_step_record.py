"""The step record is complete, and observing the engine never changes it.

One record per step says what ran (per sequence: prefill, recompute or decode, and how
many tokens), the queues and pools it ran with, the swaps and their copy times, every
decision (between-step rejections and aborts included), the tokens and when they were
received, and the requests that ended. Token timing is an observer of these records,
not scheduler work; a failing observer is counted and logged, never fatal.
"""

from __future__ import annotations

import pytest

from engine.core import decisions as d
from engine.core.cost_model import FEATURES, CostModel
from engine.core.sequence import SequenceStatus
from engine.records.step_record import DECODE, PREFILL, RECOMPUTE, StepRecord
from engine.records.token_times import record_token_times
from tests.support.engine_helpers import STEP_S, Req, add, drive, make_engine

SWAP_COSTS = CostModel(
    **{**dict.fromkeys(FEATURES, 0.0), "step_overhead_s": STEP_S, "swap_block_s": 1 / 1024}
)


def test_records_say_what_ran_per_sequence_and_when_tokens_arrived():
    engine = make_engine(block_size=4, max_num_batched_tokens=8, max_model_len=64)
    trace = drive(
        engine,
        [Req("x", 0.0, prompt_len=12, max_tokens=3), Req("y", 0.0, prompt_len=2, max_tokens=2)],
    )
    steps = trace.steps
    # x is prefilled in chunks of the 8-token budget, y rides along; then decodes
    first = {
        e.request_id: (e.kind, e.num_scheduled_tokens, e.num_computed_before, e.token_id)
        for e in steps[0].scheduled
    }
    assert first == {"x": (PREFILL, 8, 0, None)}
    second = {
        e.request_id: (e.kind, e.num_scheduled_tokens, e.num_computed_before)
        for e in steps[1].scheduled
    }
    assert second == {"x": (PREFILL, 4, 8), "y": (PREFILL, 2, 0)}
    assert steps[1].num_prefill_tokens == 6 and steps[1].num_decode_seqs == 0
    assert all(e.token_id is not None for e in steps[1].scheduled)  # both prompts complete
    third = steps[2]
    assert {e.kind for e in third.scheduled} == {DECODE} and third.num_decode_seqs == 2
    # timings: schedule -> execute -> tokens, on the engine clock
    for i, record in enumerate(steps):
        assert record.schedule_start == record.execute_start == i * STEP_S
        assert record.execute_end == record.token_time == (i + 1) * STEP_S
        assert record.duration_s == STEP_S
    # the token timing observer stamped each token with its record's instant
    x = trace.seqs["x"]
    emitted_x = [r.token_time for r in steps for e in r.emitted() if e.request_id == "x"]
    assert len(emitted_x) == 3 and x.first_token_time == emitted_x[0]
    assert x.last_token_time == emitted_x[-1] == x.finished_time
    # queue depths and pools are those the step ran with
    assert (steps[0].num_running, steps[0].num_waiting) == (1, 1)  # y waits for the budget
    assert (steps[1].num_running, steps[1].num_waiting) == (2, 0)
    assert steps[1].num_device_blocks == 64
    assert steps[1].num_free_device_blocks == 64 - 3 - 1
    # every request ends in exactly one record
    ended = [s.request_id for r in steps for s in r.finished]
    assert sorted(ended) == ["x", "y"]


def test_recompute_and_swap_are_in_the_record_with_their_copy_times():
    engine = make_engine(
        block_size=4, gpu_blocks=4, cpu_blocks=4, preemption_mode="swap", cost_model=SWAP_COSTS
    )
    trace = drive(engine, [Req("a", 0.0, 4, 8), Req("b", 0.0, 4, 8)])
    out_step = next(r for r in trace.steps if r.num_blocks_swapped_out)
    assert out_step.num_blocks_swapped_out == 2 and out_step.num_swapped == 1
    assert out_step.swap_out_s == pytest.approx(2 / 1024)  # predicted copy time, in simulation
    assert any(x.kind == d.SWAP_OUT for x in out_step.decisions)
    in_step = next(r for r in trace.steps if r.num_blocks_swapped_in)
    assert in_step.swap_in_s == pytest.approx(in_step.num_blocks_swapped_in / 1024)

    # (without prefix caching: with it, b would re-hit its first block)
    engine = make_engine(
        block_size=4,
        gpu_blocks=4,
        cpu_blocks=0,
        preemption_mode="swap",
        enable_prefix_caching=False,
    )
    trace = drive(engine, [Req("a", 0.0, 4, 8), Req("b", 0.0, 4, 8)])
    redo = [e for r in trace.steps for e in r.scheduled if e.kind == RECOMPUTE]
    assert redo and all(e.request_id == "b" for e in redo)
    assert (
        sum(r.num_recompute_tokens for r in trace.steps)
        == trace.seqs["b"].num_recomputed_tokens
        == 8
    )


def test_between_step_ends_and_decisions_reach_the_next_record():
    engine = make_engine(block_size=4, gpu_blocks=4, max_model_len=32, max_waiting=1)
    too_long = add(engine, Req("long", prompt_len=30, max_tokens=8))
    ok = add(engine, Req("ok", prompt_len=4, max_tokens=2))
    full = add(engine, Req("full", prompt_len=4, max_tokens=2))
    assert engine.abort("ok") is ok
    record = engine.step()
    assert [(x.kind, x.request_id) for x in record.decisions] == [
        (d.REJECT, "long"),
        (d.REJECT, "full"),
        (d.ABORT, "ok"),
    ]
    assert record.finished == [too_long, full, ok]
    assert record.is_empty and not engine.has_work()


def test_token_timing_is_an_observer_not_scheduler_work():
    engine = make_engine()
    engine.observers.remove(record_token_times)
    trace = drive(engine, [Req("x", 0.0, 4, 3)])
    x = trace.seqs["x"]
    assert x.num_output_tokens == 3 and x.status is SequenceStatus.FINISHED_LENGTH
    assert x.first_token_time is None and x.timing.max_itl_s == 0.0  # nobody measured


def test_long_gaps_keep_their_start_times():
    engine = make_engine(
        block_size=4,
        gpu_blocks=4,
        cpu_blocks=4,
        preemption_mode="swap",
        cost_model=CostModel.constant(0.1),
    )
    trace = drive(engine, [Req("a", 0.0, 4, 8), Req("b", 0.0, 4, 8)])
    b = trace.seqs["b"]
    assert b.timing.long_gaps, "b was swapped out for several 0.1 s steps"
    token_times = [r.token_time for r in trace.steps for e in r.emitted() if e.request_id == "b"]
    for start, gap in b.timing.long_gaps:
        assert start in token_times and start + gap in token_times
        assert gap >= 0.25


def test_a_failing_observer_is_counted_and_changes_nothing():
    def broken(record: StepRecord) -> None:
        raise RuntimeError("observer bug")

    seen: list[int] = []
    reference = drive(make_engine(), [Req("x", 0.0, 4, 4), Req("y", 0.0, 6, 3)])
    engine = make_engine()
    engine.observers.add(broken)
    engine.observers.add(lambda record: seen.append(record.step))
    trace = drive(engine, [Req("x", 0.0, 4, 4), Req("y", 0.0, 6, 3)])
    assert engine.observers.num_errors == len(trace.steps) > 0
    assert seen == [r.step for r in trace.steps]  # later observers still ran
    for rid in ("x", "y"):
        got, want = trace.seqs[rid], reference.seqs[rid]
        assert got.status is want.status is SequenceStatus.FINISHED_LENGTH
        assert got.output_token_ids == want.output_token_ids
        assert got.finished_time == want.finished_time


def test_a_failed_step_is_one_record_with_fail_decisions():
    engine = make_engine()
    real = engine.executor.execute
    calls = {"n": 0}

    def execute(out):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device fell over")
        return real(out)

    engine.executor.execute = execute
    a = add(engine, Req("a", 0.0, 4, 4))
    engine.step()
    record = engine.step()
    assert record.error == "RuntimeError: device fell over"
    fails = [x for x in record.decisions if x.kind == d.FAIL]
    assert [(x.request_id, x.reason, x.detail) for x in fails] == [
        ("a", d.REASON_EXECUTOR_ERROR, record.error)
    ]
    assert record.finished == [a] and a.status is SequenceStatus.FINISHED_ERROR
    assert engine.scheduler.num_steps == record.step == 2


def test_a_failed_sample_fails_its_request_alone_and_the_step_stands():
    """An executor that could not sample one sequence's token (StepResult.sample_errors)
    fails that sequence alone, with a sampling_error decision in the step's record; the
    others get their tokens from the same step and go on."""
    engine = make_engine()
    records: list[StepRecord] = []
    engine.observers.add(records.append)
    real = engine.executor.execute

    def execute(out):
        result = real(out)
        if out.step == 2:  # b's first decode; its placeholder token must not be emitted
            i = next(i for i, seq in enumerate(out.seqs) if seq.request_id == "b")
            result.sample_errors[i] = "sampling failed: probability tensor contains inf/nan"
        return result

    engine.executor.execute = execute
    a, b, c = (add(engine, Req(rid, 0.0, 4, 4)) for rid in "abc")
    engine.step()
    record = engine.step()
    assert record.error is None  # the step itself did not fail
    fails = [x for x in record.decisions if x.kind == d.FAIL]
    assert [(x.request_id, x.reason, x.detail) for x in fails] == [
        ("b", d.REASON_SAMPLING_ERROR, "sampling failed: probability tensor contains inf/nan")
    ]
    assert record.finished == [b] and b.status is SequenceStatus.FINISHED_ERROR
    assert b.finish_reason == "error" and b.error == fails[0].detail
    assert not b.block_table and len(b.output_token_ids) == 1
    assert {e.request_id: e.token_id is not None for e in record.scheduled} == {
        "a": True,
        "b": False,
        "c": True,
    }
    engine.scheduler.check_invariants()
    while engine.has_work():
        engine.step()
        engine.scheduler.check_invariants()
    assert [len(s.output_token_ids) for s in (a, c)] == [4, 4]
    assert a.status is c.status is SequenceStatus.FINISHED_LENGTH
    ended = [s.request_id for r in records for s in r.finished]
    assert sorted(ended) == ["a", "b", "c"]  # each request ends in exactly one record
    assert engine.block_manager.num_free_device_blocks == engine.block_manager.num_device_blocks


def test_recover_fails_everything_in_one_record_and_steps_go_on():
    engine = make_engine()
    records: list[StepRecord] = []
    engine.observers.add(records.append)
    a, b = add(engine, Req("a", 0.0, 4, 4)), add(engine, Req("b", 0.0, 4, 4))
    engine.step()
    record = engine.recover("AssertionError: scheduler bug")
    assert record is records[-1] and record.error == "AssertionError: scheduler bug"
    assert {x.request_id for x in record.decisions if x.kind == d.FAIL} == {"a", "b"}
    assert set(record.finished) == {a, b}
    assert not engine.has_work()
    add(engine, Req("c", engine.clock.now(), 4, 1))
    assert engine.step().step == 2  # numbering continues on the fresh scheduler
