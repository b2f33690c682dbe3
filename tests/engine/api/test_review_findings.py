"""Reproductions of bugs found in review (each test fails on the code as reviewed)."""

from __future__ import annotations

import signal

import polars as pl
import pytest

from engine.config import EngineConfig, SchedulerConfig
from engine.core import decisions as d
from engine.core.cost_model import CostModel
from engine.core.request import EngineRequest
from harness.profiles import resolve_profile
from harness.simulate.driver import REJECTED_RETRY_AFTER_S, simulate
from tests.support.engine_helpers import Req, drive, make_engine


@pytest.mark.parametrize("seed", [0, 1, 2, 7])
def test_closed_loop_user_rejected_at_once_backs_off_and_retries(seed):
    """harness/simulate/driver.py: a closed-loop user whose request is rejected on arrival
    (queue_full here) re-sent at the same virtual instant; the arrival loop never let
    the engine step or the clock move, so simulate() spun forever. Now the user waits
    REJECTED_RETRY_AFTER_S (a client honouring Retry-After) and sends again."""

    def timeout(*_):
        raise TimeoutError("simulate() did not return within 20 s")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(20)
    try:
        # 8 closed-loop users for 30 s, at most 4 may wait: some are refused.
        result = simulate(
            resolve_profile("default_py_example"),
            EngineConfig(SchedulerConfig(max_waiting=4)),
            CostModel(),
            seed=seed,
            record_decisions=False,
        )
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    closed = result.requests.filter(pl.col("request_id").str.contains("-c0-"))
    rejected = closed.filter(pl.col("status") == "rejected")
    assert rejected.height >= 4  # users 5..8 at t=0, at least
    assert set(rejected["error"]) == {d.REASON_QUEUE_FULL}
    # each refused user sends its next request exactly Retry-After later (while the
    # phase lasts)
    sent_at = closed["scheduled_at"].to_list()
    for t in rejected["finished_at"]:
        retry = t + REJECTED_RETRY_AFTER_S
        if retry < 30:
            assert sent_at.count(retry) >= rejected["finished_at"].to_list().count(t), (t, retry)
    # a user has one request in the system at a time: never more than 8 at once
    events = sorted(
        [(t, 1) for t in closed["scheduled_at"]] + [(t, -1) for t in closed["finished_at"]],
        key=lambda e: (e[0], e[1]),
    )
    in_system = peak = 0
    for _, delta in events:
        in_system += delta
        peak = max(peak, in_system)
    assert peak <= 8
    # and the users kept working after being refused: requests completed in the phase
    assert closed.filter(pl.col("status") == "ok").height > rejected.height


def test_priority_preemption_admits_its_beneficiary_in_the_same_step():
    """engine/core/sched/scheduler.py _make_room_for_admission: room is counted without the
    watermark (and before this step's decodes take blocks), but the head is then
    admitted through can_allocate(..., use_watermark=True). The victim is evicted
    for nothing, low-priority requests keep decoding, and more victims follow."""
    engine = make_engine(
        block_size=4,
        gpu_blocks=11,
        cpu_blocks=64,
        watermark=0.3,
        scheduling_policy="priority",
        max_num_seqs=8,
        enable_chunked_prefill=True,
        max_num_batched_tokens=2048,
    )
    reqs = [
        Req("L0", 0.0, 10, 11, priority=5),
        Req("L1", 0.0, 11, 13, priority=5),
        Req("L2", 0.0, 2, 13, priority=5),
        Req("H", 0.02, 11, 4, priority=0),
    ]
    trace = drive(engine, reqs)
    for_h = [x for x in trace.decisions if x.kind == d.PREEMPT and x.beneficiary == "H"]
    admitted = next(x.step for x in trace.decisions if x.kind == d.ADMIT and x.request_id == "H")
    assert for_h
    assert all(x.step == admitted for x in for_h), (
        f"victims evicted for H at steps {[(x.step, x.request_id) for x in for_h]}, "
        f"H admitted only at step {admitted}"
    )


@pytest.mark.parametrize("seed", [3])
def test_no_chunked_prefill_steps_that_admit_prefills_carry_no_decodes(seed):
    """engine/core/sched/scheduler.py schedule(): the vLLM-v0 rule is applied only when nothing
    is swapped; with a swapped request, new prefills are admitted after the
    decodes (and swap-ins) of the same step."""
    import random

    rnd = random.Random(seed)
    engine = make_engine(
        block_size=4,
        gpu_blocks=rnd.randint(6, 14),
        cpu_blocks=64,
        watermark=0.0,
        enable_chunked_prefill=False,
        max_num_batched_tokens=2048,
        preemption_mode="swap",
    )
    reqs = [
        Req(f"R{i}", rnd.choice([0.0, 0.05, 0.1, 0.2, 0.3]), rnd.randint(1, 10), rnd.randint(2, 14))
        for i in range(rnd.randint(3, 7))
    ]
    trace = drive(engine, reqs)
    for step in trace.steps:
        admitted = [x.request_id for x in step.decisions if x.kind == d.ADMIT]
        assert not (admitted and step.num_decode_seqs), (
            f"step {step.step} admits {admitted} and runs {step.num_decode_seqs} decodes"
        )


def test_failed_step_also_fails_requests_whose_blocks_it_was_moving():
    """A step that swapped a request out and then failed in the executor: the copy may
    not have happened, so that request's KV is garbage and it must fail too (not
    resume later with it)."""
    from engine.config import CacheConfig
    from engine.core.sampling_params import SamplingParams
    from engine.core.sequence import SequenceStatus
    from engine.factory import build_simulated_engine

    engine = build_simulated_engine(
        EngineConfig(
            SchedulerConfig(max_num_seqs=4, preemption_mode="swap"),
            CacheConfig(
                block_size=4, num_gpu_blocks_override=6, num_cpu_blocks_override=16, watermark=0.0
            ),
        ),
        CostModel.constant(0.01),
    )
    real = engine.executor.execute

    def execute(out):
        if out.blocks_to_swap_out:
            raise RuntimeError("copy engine fault")
        return real(out)

    engine.executor.execute = execute
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    seqs = [engine.add_request(EngineRequest(f"r{i}", [5] * 8, params)) for i in range(3)]
    failed_step = None
    for _ in range(200):
        if not engine.has_unfinished():
            break
        outcome = engine.step()
        if outcome.error:
            failed_step = outcome
            break
    assert failed_step is not None, "no step swapped anything out"
    victims = {x.request_id for x in failed_step.decisions if x.kind == d.SWAP_OUT}
    assert victims
    for seq in seqs:
        if seq.request_id in victims:
            assert seq.status is SequenceStatus.FINISHED_ERROR
    engine.scheduler.check_invariants()
    assert not engine.scheduler.swapped
