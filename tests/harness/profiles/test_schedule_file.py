"""An exact schedule written as a trace profile (harness/profiles/schedule_file.py): a
driver of the file sends the same requests — lengths, classes, priorities, gaps — as
the schedule it was written from, moved to start at its first arrival; what cannot be
written that way is refused, naming the request."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.profiles import (
    LengthDistribution,
    Phase,
    Profile,
    ProfileError,
    RequestClass,
    build_plan,
    load_profile,
)
from harness.profiles.schedule_file import write_schedule_profile, written_schedule

CLASSES = (
    RequestClass(
        name="short",
        prompt_tokens=LengthDistribution.uniform(4, 60),
        output_tokens=LengthDistribution.uniform(1, 30),
        priority=1,
    ),
    RequestClass(
        name="long",
        prompt_tokens=LengthDistribution.uniform(200, 900),
        output_tokens=LengthDistribution.uniform(50, 300),
        priority=-2,
    ),
)


def schedule(seed: int, rate: float = 5.0, seconds: float = 4.0):
    profile = Profile(
        name="p",
        seed=seed,
        classes=CLASSES,
        phases=(Phase(name="a", duration_s=seconds, rate=rate, burstiness=0.3),),
    )
    specs = build_plan(profile).open_loop_requests()
    return [dataclasses.replace(s, max_tokens=s.output_tokens) for s in specs]


def same_requests(given_specs, sent) -> None:
    """``sent`` is ``given_specs`` request for request, moved by the first arrival."""
    assert len(sent) == len(given_specs)
    first = given_specs[0].scheduled_at
    for a, b in zip(given_specs, sent, strict=True):
        assert b.scheduled_at == pytest.approx(a.scheduled_at - first, abs=1e-9)
        assert (b.class_name, b.prompt_tokens, b.output_tokens, b.max_tokens, b.priority) == (
            a.class_name,
            a.prompt_tokens,
            a.output_tokens,
            a.output_tokens,
            a.priority,
        )


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rate=st.floats(0.5, 40.0))
def test_a_driver_of_the_file_sends_the_schedule_it_was_written_from(tmp_path_factory, seed, rate):
    specs = schedule(seed, rate)
    if not specs:
        return
    directory = tmp_path_factory.mktemp("schedule")
    profile_file = write_schedule_profile(specs, CLASSES, directory, "exact", seed=7)
    assert profile_file == directory / "exact.toml" and (directory / "exact.csv").is_file()
    same_requests(specs, written_schedule(profile_file))


def test_the_files_move_together_and_keep_the_classes(tmp_path):
    specs = schedule(3)
    write_schedule_profile(specs, CLASSES, tmp_path / "a", "exact", description="mine")
    (tmp_path / "a").rename(tmp_path / "b")
    moved = tmp_path / "b" / "exact.toml"
    profile = load_profile(moved)
    assert profile.description == "mine"
    assert [c.name for c in profile.classes] == ["short", "long"]
    assert [c.priority for c in profile.classes] == [1, -2]
    same_requests(specs, written_schedule(moved))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda s: [], "no request"),
        (lambda s: [dataclasses.replace(s[0], class_name="other"), *s[1:]], "class 'other'"),
        (lambda s: [dataclasses.replace(s[0], max_tokens=s[0].output_tokens + 5)], "max_tokens"),
        (lambda s: [dataclasses.replace(s[0], scheduled_at=None)], "closed-loop"),
    ],
)
def test_what_a_trace_cannot_carry_is_refused_naming_the_request(tmp_path, change, words):
    with pytest.raises(ProfileError, match=words):
        write_schedule_profile(change(schedule(5)), CLASSES, tmp_path, "bad")
