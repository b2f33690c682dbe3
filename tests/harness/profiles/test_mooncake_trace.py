"""Mooncake traces: the JSONL layout (``timestamp`` in ms, ``input_length``,
``output_length``, ``hash_ids``) replays with its prefix structure: requests share
exactly the prompt blocks their hash ids share, in the simulator's prompts, in the load
generator's token ids, and in the engine's prefix-cache hits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from harness.loadgen.prompts import segment_ids
from harness.profiles import (
    LengthDistribution,
    Phase,
    Profile,
    ProfileError,
    ReplayTrace,
    RequestClass,
    build_plan,
    profile_from_dict,
    profile_to_dict,
)
from harness.profiles.prompt_layout import segments
from harness.simulate.driver import simulate
from harness.simulate.sim_prompts import single_turn_prompt

BLOCK = 16


def write_trace(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def profile_of(trace: ReplayTrace) -> Profile:
    return Profile(
        name="mc",
        seed=1,
        classes=(
            RequestClass(
                name="chat",
                prompt_tokens=LengthDistribution.fixed(1),
                output_tokens=LengthDistribution.fixed(1),
            ),
        ),
        phases=(Phase(name="trace", trace=trace),),
    )


ROWS = [
    {"timestamp": 0, "input_length": 48, "output_length": 4, "hash_ids": [1, 2, 3]},
    {"timestamp": 1000, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 9]},
    {"timestamp": 2000, "input_length": 64, "output_length": 4, "hash_ids": [1, 2, 3, 4]},
    {"timestamp": 3000, "input_length": 32, "output_length": 4, "hash_ids": [5, 6]},
    {"timestamp": 4500, "input_length": 80, "output_length": 4, "hash_ids": [1, 2]},
]


def test_a_known_trace_gives_the_engine_exactly_its_shared_blocks(tmp_path):
    trace = ReplayTrace(file=str(write_trace(tmp_path / "t.jsonl", ROWS)), hash_block_tokens=BLOCK)
    assert trace.layout == "mooncake"
    assert trace.offsets_s.tolist() == [0.0, 1.0, 2.0, 3.0, 4.5]  # milliseconds read as such
    specs = build_plan(profile_of(trace)).open_loop_requests()
    assert [s.shared_tokens for s in specs] == [48, 40, 64, 32, 32]
    assert specs[1].shared[-1] == ("mc/hash/9", 8)  # the last block cut to the prompt
    assert specs[4].own_tokens == 48  # a prompt longer than its blocks ends in its own
    config = EngineConfig(SchedulerConfig(), CacheConfig(num_gpu_blocks_override=1000))
    frame = simulate(profile_of(trace), config).requests.sort("scheduled_at")
    # r1 finds blocks 1, 2; r2 finds 1, 2, 3 (its last token, in block 4, is computed);
    # r3 nothing; r4 blocks 1, 2 (its own tokens after them are new)
    assert frame["cached_tokens"].to_list() == [0, 32, 48, 0, 32]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def expected_shared(a, b) -> int:
    """Tokens two requests share by their hash blocks: the leading blocks with the same
    id, each as long as the shorter of the two (a cut block is a prefix of the whole)."""
    n = 0
    for (ka, na), (kb, nb) in zip(a.shared, b.shared, strict=False):
        if ka != kb:
            break
        n += min(na, nb)
        if na != nb:
            break
    return n


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), min_size=1, max_size=4),  # a path in a small tree
            st.integers(1, 80),  # input length
        ),
        min_size=2,
        max_size=8,
    )
)
def test_requests_share_exactly_the_blocks_their_hash_ids_share(tmp_path_factory, rows):
    # prefix-chained ids, as Mooncake's: a block's id names its whole prefix
    ids_of: dict[tuple[int, ...], int] = {}
    trace_rows = []
    for t, (path, length) in enumerate(rows):
        ids = [ids_of.setdefault(tuple(path[: i + 1]), len(ids_of)) for i in range(len(path))]
        trace_rows.append(
            {"timestamp": t * 100, "input_length": length, "output_length": 2, "hash_ids": ids}
        )
    file = write_trace(tmp_path_factory.mktemp("mc") / "t.jsonl", trace_rows)
    trace = ReplayTrace(file=str(file), hash_block_tokens=BLOCK)
    specs = build_plan(profile_of(trace)).open_loop_requests()
    sim = [single_turn_prompt(s) for s in specs]
    ids = [segment_ids(segments(s), "run-1", 1000, 3000) for s in specs]
    for i, a in enumerate(specs):
        assert len(sim[i]) == len(ids[i]) == a.prompt_tokens
        for j in range(i + 1, len(specs)):
            b = specs[j]
            shared = expected_shared(a, b)
            # the simulator's and the load generator's prompts share exactly that prefix
            # (the token after it differs: another block, or one's own tokens)
            assert common_prefix(sim[i], sim[j]) == shared
            assert common_prefix(ids[i], ids[j]) >= shared
            if shared < min(a.prompt_tokens, b.prompt_tokens):
                assert common_prefix(ids[i], ids[j]) < shared + 2


def test_bad_mooncake_rows_are_refused_by_line_and_column(tmp_path):
    bad = [dict(ROWS[0]), {**ROWS[1], "hash_ids": [1, -2]}]
    with pytest.raises(ProfileError, match=r"line 2, column 'hash_ids': expected non-negative"):
        ReplayTrace(file=str(write_trace(tmp_path / "b.jsonl", bad)))
    missing = [{k: v for k, v in ROWS[0].items() if k != "hash_ids"}]
    with pytest.raises(ProfileError, match="line 1, column 'hash_ids': missing"):
        ReplayTrace(file=str(write_trace(tmp_path / "c.jsonl", missing)))  # auto: mooncake
    with pytest.raises(ProfileError, match="line 1, column 'hash_ids': missing"):
        ReplayTrace(file=str(write_trace(tmp_path / "d.jsonl", missing)), format="mooncake")


def test_the_block_size_round_trips_in_the_toml_shape(tmp_path):
    file = write_trace(tmp_path / "t.jsonl", ROWS)
    profile = profile_of(ReplayTrace(file=str(file), hash_block_tokens=BLOCK))
    again = profile_from_dict(profile_to_dict(profile))
    assert again == profile and again.phases[0].trace.hash_block_tokens == BLOCK
