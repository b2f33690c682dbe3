"""Session classes, shared system prompts and prefix-reuse rungs in the profile model
and its schedule: the planned turns follow the chat layout, the popularity law and the
rungs' realised reuse are what was asked, the TOML shape round-trips, bad profiles are
refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.profiles import (
    LengthDistribution,
    Phase,
    Profile,
    ProfileError,
    RequestClass,
    SecondsDistribution,
    Sessions,
    SystemPrompts,
    build_plan,
    profile_from_dict,
    profile_to_dict,
    resolve_profile,
    sample_requests,
)
from harness.profiles.digest import plan_digest
from harness.profiles.prompt_layout import segments
from harness.profiles.schedule import session_prompt_tokens


def session_profile(turns_high=4, system=100, think=2.0, rate=2.0, seed=1) -> Profile:
    return Profile(
        name="sess",
        seed=seed,
        classes=(
            RequestClass(
                name="chat",
                prompt_tokens=LengthDistribution.uniform(5, 60),
                output_tokens=LengthDistribution.uniform(3, 40),
                system_prompt=SystemPrompts(count=3, tokens=LengthDistribution.fixed(system)),
                session=Sessions(
                    turns=LengthDistribution.uniform(1, turns_high),
                    think_time_s=SecondsDistribution.exponential(think, max=10.0),
                ),
            ),
            RequestClass(
                name="single",
                prompt_tokens=LengthDistribution.fixed(30),
                output_tokens=LengthDistribution.fixed(5),
                system_prompt=SystemPrompts(count=3, tokens=LengthDistribution.fixed(system)),
            ),
        ),
        phases=(Phase(name="p", duration_s=20, rate=rate),),
    )


@settings(max_examples=30, deadline=None)
@given(
    turns_high=st.integers(1, 8),
    system=st.integers(1, 300),
    think=st.floats(0.01, 5.0),
    seed=st.integers(0, 1000),
)
def test_a_later_turn_is_planned_as_the_conversation_so_far_plus_its_message(
    turns_high, system, think, seed
):
    plan = build_plan(session_profile(turns_high, system, think, seed=seed))
    ids = set()
    for session in plan.sessions():
        turns = session.turns
        assert 1 <= len(turns) <= turns_high
        first = turns[0]
        assert first.scheduled_at == session.start_at and first.think_time_s is None
        assert first.prompt_tokens == 1 + system + 2 + first.message_tokens
        for before, after in zip(turns, turns[1:], strict=False):
            # the next prompt holds the previous one, its answer, a marker, the message, a cue
            assert after.prompt_tokens == (
                before.prompt_tokens + before.output_tokens + 2 + after.message_tokens
            )
            assert after.scheduled_at is None and 0 <= after.think_time_s <= 10.0
            assert after.shared == first.shared  # one system prompt for the whole session
        for t in turns:
            assert t.session_id == session.session_id and t.request_id not in ids
            ids.add(t.request_id)
            assert segments(t)[-1] == (t.request_id, t.message_tokens)
    assert ids.isdisjoint(s.request_id for s in plan.open_loop_requests())


def test_session_prompt_tokens_counts_one_marker_per_message():
    assert session_prompt_tokens(0, [10], []) == 12
    assert session_prompt_tokens(5, [10], []) == 6 + 12
    assert session_prompt_tokens(5, [10, 20], [7]) == 6 + (2 + 10 + 7) + 22


def test_zipf_popularity_is_within_a_point_of_the_law():
    prompts = SystemPrompts(
        count=6, tokens=LengthDistribution.fixed(10), popularity="zipf", zipf_s=1.2
    )
    p = prompts.probabilities()
    assert p[0] > p[1] > p[-1] and p.sum() == pytest.approx(1.0)
    assert p[0] / p[1] == pytest.approx(2**1.2)
    chosen = prompts.choose(np.random.default_rng(7), 200_000)
    freq = np.bincount(chosen, minlength=6) / chosen.size
    assert np.abs(freq - p).max() < 0.01


def test_uniform_popularity_and_shared_keys_repeat_exactly():
    plan = build_plan(session_profile())
    singles = plan.open_loop_requests()
    keys = {s.shared[0][0] for s in singles}
    assert 1 < len(keys) <= 3  # of the class's three system prompts
    # a system prompt has one length in the whole profile, whichever request draws it
    lengths = {}
    for s in singles + [t for x in plan.sessions() for t in x.turns]:
        for key, n in s.shared:
            assert lengths.setdefault(key, n) == n


def realised_reuse(prefixes: list[int], prompts: list[int]) -> float:
    """The share of prompt tokens that repeat an earlier prompt's prefix of one
    document: each prompt repeats at most the longest prefix sent before it."""
    longest, repeated = 0, 0
    for prefix in prefixes:
        repeated += min(prefix, longest)
        longest = max(longest, prefix)
    return repeated / sum(prompts)


def test_cache_ladder_rungs_realise_the_reuse_they_ask_for():
    plan = build_plan(resolve_profile("cache_ladder"))
    by_phase: dict[int, list] = {}
    for spec in plan.open_loop_requests():
        by_phase.setdefault(spec.phase, []).append(spec)
    for i, phase in enumerate(plan.profile.phases):
        specs = by_phase[i]
        prefixes = [s.shared_tokens for s in specs]
        reuse = realised_reuse(prefixes, [s.prompt_tokens for s in specs])
        assert abs(reuse - phase.prefix_reuse) < 0.03, (phase.name, reuse)
        keys = {k for s in specs for k, _ in s.shared}
        assert len(keys) <= 1  # one document per rung, never another rung's
    assert build_plan(resolve_profile("cache_ladder")).phases[0].requests[0].shared == ()


def test_toml_shape_round_trips_sessions_system_prompts_and_rungs():
    p = session_profile()
    p2 = Profile(
        name="ladder",
        seed=3,
        classes=(
            RequestClass(
                name="a",
                prompt_tokens=LengthDistribution.fixed(100),
                output_tokens=LengthDistribution.fixed(4),
            ),
        ),
        phases=(Phase(name="r", duration_s=5, rate=1.0, prefix_reuse=0.5),),
    )
    for profile in (p, p2):
        assert profile_from_dict(profile_to_dict(profile)) == profile
    d = profile_to_dict(p)
    d["classes"][0]["session"]["think_time_s"] = 0  # shorthand: a fixed duration
    assert profile_from_dict(d).classes[0].session.think_time_s == SecondsDistribution.fixed(0)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda d: d["classes"][0]["session"].update(turns={"kind": "geometric", "mean": 3}),
            "classes[0].session.turns: set a `max`",
        ),
        (lambda d: d["classes"][0]["session"].update(tunrs=3), "did you mean 'turns'"),
        (
            lambda d: d["classes"][0]["system_prompt"].update(popularity="pareto"),
            "classes[0].system_prompt.popularity: expected one of uniform, zipf",
        ),
        (lambda d: d["phases"][0].update(prefix_reuse=1.0), "prefix_reuse: the share"),
        (lambda d: d["phases"][0].update(prefix_reuse=0.5), "has sessions"),
        (
            lambda d: d["phases"].append({"name": "c", "duration_s": 5, "concurrency": 2}),
            "session class 'chat' in a closed-loop phase",
        ),
    ],
)
def test_bad_session_profiles_are_refused_by_name(mutate, message):
    d = profile_to_dict(session_profile())
    mutate(d)
    with pytest.raises(ProfileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        profile_from_dict(d)


def test_a_session_profile_samples_its_turns_as_requests_of_their_own():
    """What `--rate-scale auto` sizes the engine's capacity with: every turn, at its
    session's start, as long as planned, its history shared with its session's later
    turns; a shorter sample is a prefix of a longer one."""
    profile = session_profile()
    short, long = sample_requests(profile, 40), sample_requests(profile, 120)
    assert [s.request_id for s in short] == [s.request_id for s in long[:40]]
    assert len({s.request_id for s in long}) == 120
    assert [s.index for s in long] == list(range(120))
    times = [s.scheduled_at for s in long]
    assert times == sorted(times)
    turns = {t.request_id: t for x in build_plan(profile).sessions() for t in x.turns}
    flattened = [s for s in long if s.request_id in turns]
    assert flattened and any(turns[s.request_id].turn > 1 for s in flattened)
    for s in flattened:
        assert s.prompt_tokens == turns[s.request_id].prompt_tokens
        assert s.message_tokens is None and s.own_tokens == s.prompt_tokens - s.shared_tokens
        history = [n for k, n in s.shared if k.endswith("/history")]
        assert bool(history) == (turns[s.request_id].turn > 1)
        # a sample is no conversation: its records must not read as sessions
        assert s.session_id is None and s.turn is None


def test_the_offered_rate_counts_a_session_as_its_mean_turns():
    from harness.profiles.rate_scale import offered_rate, requests_per_arrival

    profile = session_profile(turns_high=5)  # turns uniform 1..5: mean 3; the other class 1
    assert requests_per_arrival(profile, 0) == pytest.approx((3 + 1) / 2, abs=0.03)
    assert offered_rate(profile) == pytest.approx(2.0 * 2.0, abs=0.06)


def test_the_plan_digest_covers_think_times_and_system_prompts():
    a = plan_digest(build_plan(session_profile(think=2.0)))
    assert a == plan_digest(build_plan(session_profile(think=2.0)))
    assert a != plan_digest(build_plan(session_profile(think=3.0)))
    assert a != plan_digest(build_plan(session_profile(system=101)))


def test_max_total_tokens_bounds_a_session_last_turn():
    c = session_profile(turns_high=3).classes[0]
    # system 1+100, two earlier turns of (2 + 60 + 40), the last message + 2, its answer
    assert c.max_total_tokens == 101 + 2 * 102 + 62 + 40
    plan = build_plan(session_profile(turns_high=3))
    assert max(t.prompt_tokens + t.max_tokens for s in plan.sessions() for t in s.turns) <= (
        c.max_total_tokens
    )


@pytest.mark.parametrize("name", ["chat_sessions", "shared_prefix", "agentic", "cache_ladder"])
def test_docs_show_each_new_profile_s_planned_arrivals_as_drawn(name):
    """docs/profiles.md's pictures are what ``arrival_chart`` draws of the shipped
    profile today (a profile edited without its picture fails here)."""
    from harness.profiles.arrival_chart import arrival_chart
    from tests.support.paths import REPO

    docs = (REPO / "docs" / "profiles.md").read_text()
    line = next(x for x in docs.splitlines() if x.startswith(name + " "))
    assert line.endswith(arrival_chart(resolve_profile(name)))


def test_a_chart_scales_its_tallest_bin_to_a_full_block():
    from harness.profiles.arrival_chart import BLOCKS, send_chart

    line = send_chart([0.1, 0.2, 0.3, 5.5], 6.0, width=6)
    assert line.startswith(BLOCKS[-1] + "    " + BLOCKS[3])
    assert line.endswith("█ = 3/s")


def test_the_session_tail_is_how_far_think_times_reach_past_the_schedule():
    plan = build_plan(session_profile(think=2.0))
    ends = [s.start_at + sum(t.think_time_s or 0 for t in s.turns) for s in plan.sessions()]
    assert plan.session_tail_s == pytest.approx(max(0.0, max(ends) - plan.duration_s))
    assert build_plan(resolve_profile("mixed")).session_tail_s == 0.0


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_a_distributed_run_splits_sessions_whole_never_their_turns(workers):
    from harness.loadgen.split import share

    plan = build_plan(session_profile())
    shares = [share(plan, w, workers) for w in range(workers)]
    sessions = [s.session_id for sh in shares for s in sh.sessions]
    assert sorted(sessions) == sorted(s.session_id for s in plan.sessions())  # each once
    for w, sh in enumerate(shares):
        assert all(s.index % workers == w for s in sh.sessions)
    ids = [i for sh in shares for i in sh.scheduled_ids]
    turns = [t.request_id for s in plan.sessions() for t in s.turns]
    assert sorted(ids) == sorted([s.request_id for s in plan.open_loop_requests()] + turns)
