"""Sessions in the simulator: closed-loop turns on the virtual clock, the answers the
engine generated sent back (so later turns hit the cache), deterministic, the same with
decode runs as stepped, and a failed turn ending its session with its later turns
recorded as not sent."""

from __future__ import annotations

import polars as pl

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from harness.profiles import (
    LengthDistribution,
    Phase,
    Profile,
    RequestClass,
    SecondsDistribution,
    Sessions,
    SystemPrompts,
    build_plan,
    resolve_profile,
)
from harness.simulate import sim_prompts
from harness.simulate.driver import simulate

BLOCK = 16


def chat(system=100, message=40, answer=30, turns=4, think=1.0, rate=0.5) -> Profile:
    return Profile(
        name="simchat",
        seed=5,
        classes=(
            RequestClass(
                name="chat",
                prompt_tokens=LengthDistribution.fixed(message),
                output_tokens=LengthDistribution.fixed(answer),
                system_prompt=SystemPrompts(count=2, tokens=LengthDistribution.fixed(system)),
                session=Sessions(
                    turns=LengthDistribution.fixed(turns),
                    think_time_s=SecondsDistribution.fixed(think),
                ),
            ),
        ),
        phases=(Phase(name="p", duration_s=20, rate=rate),),
    )


def config(**cache) -> EngineConfig:
    return EngineConfig(SchedulerConfig(), CacheConfig(**cache))


def test_a_later_turn_hits_the_conversation_before_it_and_arrives_after_its_think_time():
    profile = chat()
    frame = simulate(profile, config(num_gpu_blocks_override=4000)).requests.sort("request_id")
    assert frame["status"].unique().to_list() == ["ok"]
    plan = build_plan(profile)
    latency = CostModel().client_latency_s
    for session in plan.sessions():
        rows = frame.filter(pl.col("session_id") == session.session_id).sort("turn")
        assert rows["turn"].to_list() == list(range(1, len(session.turns) + 1))
        assert rows["prompt_tokens"].to_list() == [t.prompt_tokens for t in session.turns]
        for k in range(1, rows.height):
            before = session.turns[k - 1]
            # the previous prompt and answer are cached (full blocks), nothing evicted
            held = (before.prompt_tokens + before.output_tokens) // BLOCK * BLOCK
            assert rows["cached_tokens"][k] >= held
            # sent a think time after the answer reached the client (engine end + latency)
            answered = rows["finished_at"][k - 1] + latency
            assert abs(rows["scheduled_at"][k] - (answered + 1.0)) < 1e-9


def test_sessions_simulate_deterministically_and_decode_runs_change_nothing():
    profile = resolve_profile("chat_sessions").with_duration_scale(0.3)
    a = simulate(profile, config()).requests
    assert a.equals(simulate(profile, config()).requests)
    assert a.equals(simulate(profile, config(), fast=False).requests)
    later = a.filter(pl.col("turn") > 1)
    assert later.height and later["cached_tokens"].sum() / later["prompt_tokens"].sum() > 0.5


def test_caching_off_sessions_hit_nothing():
    frame = simulate(chat(), config(enable_prefix_caching=False)).requests
    assert frame["cached_tokens"].sum() == 0


def test_a_failed_turn_ends_its_session_and_its_later_turns_are_recorded_unsent():
    # turn 2's prompt (1 + 1000 + 2 + 600 + 400 + 2 + 600 tokens) is past max_model_len
    profile = chat(system=1000, message=600, answer=400, turns=3, rate=0.2)
    frame = simulate(profile, config()).requests.sort("request_id")
    sessions = build_plan(profile).sessions()
    assert sessions
    for session in sessions:
        rows = frame.filter(pl.col("session_id") == session.session_id).sort("turn")
        assert rows["status"].to_list() == ["ok", "rejected", "aborted"]
        assert rows["error"][2] == "not sent: its session ended when turn 2 failed"
        assert rows["turn"].to_list() == [1, 2, 3]


def test_a_later_turn_prompt_is_the_last_prompt_its_answer_and_the_new_message():
    spec = build_plan(chat()).sessions()[0].turns[1]
    prompt, answer = [1, 2, 3], [9, 9]
    tokens = sim_prompts.later_turn_prompt(spec, prompt, answer)
    assert tokens[:5] == [1, 2, 3, 9, 9]
    assert tokens[5] == sim_prompts.USER_MARK and tokens[-1] == sim_prompts.ASSISTANT_MARK
    assert len(tokens) == 5 + spec.message_tokens + 2
