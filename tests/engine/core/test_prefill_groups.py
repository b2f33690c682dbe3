"""Prefill chunks are grouped for attention so that a long chunk never pads short ones
to its size, and the step's padded-attention feature is the work the runner does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.prefill_groups import (
    PREFILL_GROUP_OVERHEAD_WORK,
    group_prefill_chunks,
    padded_prefill_work,
)
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sched.scheduler_output import SchedulerOutput
from engine.core.sequence import Sequence
from engine.worker.model import AttentionMetadata


@st.composite
def chunks(draw, max_chunks: int = 24):
    """(chunk_lens, context_lens): each chunk ends its context (chunk <= context)."""
    n = draw(st.integers(0, max_chunks))
    contexts = draw(st.lists(st.integers(1, 2048), min_size=n, max_size=n))
    lens = [draw(st.integers(1, c)) for c in contexts]
    return lens, contexts


def one_group_work(lens, contexts) -> int:
    return len(lens) * max(lens) * max(contexts) if lens else 0


@settings(max_examples=300, deadline=None)
@given(chunks())
def test_groups_partition_the_chunks_and_bound_the_padding(case):
    lens, contexts = case
    groups = group_prefill_chunks(lens, contexts)
    flat = [i for group in groups for i in group]
    assert sorted(flat) == list(range(len(lens)))  # every chunk exactly once
    assert all(group == sorted(group) for group in groups)  # batch order kept
    work = padded_prefill_work(lens, contexts)
    real = sum(q * c for q, c in zip(lens, contexts, strict=True))
    assert real <= work <= one_group_work(lens, contexts)
    # Each join added at most one group's fixed cost of padding.
    assert work - real <= len(lens) * PREFILL_GROUP_OVERHEAD_WORK


def test_a_long_prompt_does_not_pad_a_bursts_short_prompts_to_its_size():
    """The measured case: one 1024-token prompt among eight short ones."""
    lens = [150, 120, 1024, 140, 100, 150, 130, 110, 150]
    groups = group_prefill_chunks(lens, lens)
    assert [2] in groups  # the long prompt alone
    assert padded_prefill_work(lens, lens) <= 1024 * 1024 + 8 * 150 * 150
    assert one_group_work(lens, lens) == 9 * 1024 * 1024  # what one padded group cost
    # Measured on the tiny model (1 thread): 927 ms in one group, 176 ms grouped.


def test_identical_chunks_share_one_group():
    assert group_prefill_chunks([64] * 10, [64] * 10) == [list(range(10))]


def test_the_scheduler_output_counts_the_work_of_the_groups_the_model_builds():
    """SchedulerOutput's feature and AttentionMetadata's groups agree, chunk for chunk
    (chunked continuations included), so the cost model sees what the runner runs."""
    out = SchedulerOutput(step=0, time=0.0)
    specs = [(1024, 0, 1024), (150, 0, 150), (300, 900, 300), (120, 0, 120), (40, 0, 40)]
    query_lens, seq_lens = [], []
    for i, (prompt, computed, scheduled) in enumerate(specs):
        request = EngineRequest(
            f"r{i}",
            list(range(3, 3 + prompt + computed)),
            SamplingParams(max_tokens=4),
            arrival_time=0.0,
        )
        seq = Sequence(request, i)
        seq.num_computed_tokens = computed
        out.add(seq, scheduled)
        query_lens.append(scheduled)
        seq_lens.append(computed + scheduled)
    tables = [list(range(-(-n // 16))) for n in seq_lens]
    meta, _ = AttentionMetadata.build(query_lens, seq_lens, tables, 16)
    model_work = sum(
        g.context_slots.shape[0]
        * g.max_query_len
        * max(seq_lens[i] for i in _seq_indices(meta, g, query_lens))
        for g in meta.prefill
    )
    assert len(meta.prefill) >= 2
    assert out.prefill_padded_attention_work == model_work


def _seq_indices(meta, group, query_lens) -> list[int]:
    """The batch indices of the sequences in a prefill group (from its first tokens)."""
    starts = meta.query_start_loc.tolist()
    tokens = set(group.token_indices.tolist())
    return [s for s in range(len(query_lens)) if starts[s] in tokens]
