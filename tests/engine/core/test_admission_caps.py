"""vLLM 0.32's admission caps in the bundled scheduler (``--max-num-queued-reqs``,
``--max-num-queued-tokens``; vllm/v1/engine/async_llm.py ``check_admission``): a new
request is refused when the unfinished ones plus it would exceed the first, or while the
prompt tokens of the requests with no token out yet reach the second. The server answers
503 and counts it under ``vllm:admission_rejections_total`` (tests/engine/api,
tests/engine/telemetry); the simulator runs the same scheduler."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import ConfigError, SchedulerConfig
from engine.core import decisions as d
from engine.core.sequence import SequenceStatus
from tests.support.engine_helpers import Req, add, make_engine, run_one_step

REJECTED = SequenceStatus.FINISHED_REJECTED


def test_the_request_cap_counts_waiting_and_running_and_frees_as_they_finish():
    engine = make_engine(max_num_seqs=2, max_num_queued_reqs=3)
    seqs = [add(engine, Req(f"r{i}", prompt_len=4, max_tokens=2)) for i in range(5)]
    assert [s.status is REJECTED for s in seqs] == [False, False, False, True, True]
    assert seqs[3].reject_reason == d.REASON_MAX_NUM_QUEUED_REQS
    run_one_step(engine, 1.0)  # two run, one waits: still three unfinished
    assert add(engine, Req("late", 1.0)).status is REJECTED
    for _ in range(10):
        run_one_step(engine)
    assert add(engine, Req("later", 2.0)).status is not REJECTED


def test_the_token_cap_counts_whole_prompts_until_their_first_token():
    engine = make_engine(max_num_seqs=8, max_num_queued_tokens=20, max_num_batched_tokens=64)
    seqs = [add(engine, Req(f"r{i}", prompt_len=8, max_tokens=4)) for i in range(4)]
    # backlog 0, 8, 16 (< 20): admitted; 24 >= 20: refused
    assert [s.status is REJECTED for s in seqs] == [False, False, False, True]
    assert seqs[3].reject_reason == d.REASON_MAX_NUM_QUEUED_TOKENS
    run_one_step(engine, 1.0)  # their prefills run: each has its first token
    assert all(s.first_token_time is not None for s in seqs[:3])
    assert add(engine, Req("next", 1.0, prompt_len=30)).status is not REJECTED
    assert add(engine, Req("then", 1.0, prompt_len=1)).status is REJECTED  # 30 >= 20


def test_a_cap_of_zero_refuses_everything_and_a_negative_one_is_a_config_error():
    engine = make_engine(max_num_queued_reqs=0)
    assert add(engine, Req("a")).reject_reason == d.REASON_MAX_NUM_QUEUED_REQS
    with pytest.raises(ConfigError, match="max_num_queued_tokens must be >= 0"):
        SchedulerConfig(max_num_queued_tokens=-1)


@settings(max_examples=60, deadline=None)
@given(
    cap=st.integers(1, 6),
    token_cap=st.one_of(st.none(), st.integers(1, 60)),
    actions=st.lists(st.one_of(st.integers(1, 20), st.just(0)), min_size=1, max_size=40),
)
def test_a_request_is_refused_exactly_when_a_cap_says_so(cap, token_cap, actions):
    """Any interleaving of arrivals (a prompt length) and steps (0): never more than
    ``cap`` unfinished; a refusal exactly when a cap was reached (none otherwise)."""
    engine = make_engine(
        max_num_seqs=2, max_num_queued_reqs=cap, max_num_queued_tokens=token_cap, gpu_blocks=256
    )
    scheduler = engine.scheduler
    now = 0.0
    for i, action in enumerate(actions):
        now += 0.01
        if action == 0:
            run_one_step(engine, now)
            continue
        unfinished = len(scheduler.requests)
        backlog = sum(
            s.num_prompt_tokens for s in scheduler.requests.values() if s.first_token_time is None
        )
        seq = add(engine, Req(f"q{i}", now, prompt_len=action, max_tokens=3))
        if unfinished + 1 > cap:
            assert seq.reject_reason == d.REASON_MAX_NUM_QUEUED_REQS
        elif token_cap is not None and backlog >= token_cap:
            assert seq.reject_reason == d.REASON_MAX_NUM_QUEUED_TOKENS
        else:
            assert seq.status is not REJECTED
        assert len(scheduler.requests) <= cap
