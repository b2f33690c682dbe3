"""How a step's prefill chunks are grouped for attention, and the work that costs.

The runner computes prefill attention padded: every chunk of a group is padded to the
group's longest chunk (query rows) and longest context (keys), so a group of ``n``
chunks costs ``n * max_chunk * max_context`` query-key products however short most of
them are. One group per step made a single long prompt among a burst's short ones
cost the step up to 9x its real attention: measured served at the default profile's
rate, a step of 9 prefill chunks (one 1024-token prompt, eight short ones) padded to
9.4M products and took 1.97 s, and the queue behind it doubled. On the tiny model
(1 thread) those nine chunks take 927 ms in one group and 176 ms grouped.

``group_prefill_chunks`` splits the chunks so that no chunk is padded by more than a
group's fixed cost: chunks sorted by context (longest first), each joins the last
group only when the padding that adds is smaller than starting a group of its own.
Identical chunks always share a group; a long chunk never drags short ones to its
size. The model (``engine.worker.model``) and the scheduler's step output both use it, so the
cost model's padded-attention feature is the work the runner really does.

Pure Python, no tensors: the scheduler side imports it.
"""

from __future__ import annotations

from collections.abc import Sequence

#: A prefill group's fixed cost in query-key products: ~12 kernels per layer, ~0.4 ms
#: for the tiny model on 2 CPU cores, at ~2e-7 s per product (the built-in cost model).
PREFILL_GROUP_OVERHEAD_WORK = 2048


def group_prefill_chunks(chunk_lens: Sequence[int], context_lens: Sequence[int]) -> list[list[int]]:
    """Indices of the chunks, in groups; within a group in their original order.

    ``chunk_lens[i]`` is chunk ``i``'s new tokens (query rows), ``context_lens[i]`` the
    context it attends to, itself included (``chunk_lens[i] <= context_lens[i]``).
    """
    if len(chunk_lens) != len(context_lens):
        raise ValueError("chunk_lens and context_lens need one entry per chunk")
    order = sorted(range(len(chunk_lens)), key=lambda i: (-context_lens[i], -chunk_lens[i], i))
    groups: list[list[int]] = []
    max_chunk = max_context = 0  # of the last group
    for i in order:
        chunk, context = chunk_lens[i], context_lens[i]
        if groups:
            members = len(groups[-1])
            together = (members + 1) * max(max_chunk, chunk) * max_context
            apart = (
                members * max_chunk * max_context + chunk * context + PREFILL_GROUP_OVERHEAD_WORK
            )
            if together <= apart:
                groups[-1].append(i)
                max_chunk = max(max_chunk, chunk)
                continue
        groups.append([i])
        max_chunk, max_context = chunk, context  # sorted: the first has the longest context
    return [sorted(group) for group in groups]


def padded_prefill_work(chunk_lens: Sequence[int], context_lens: Sequence[int]) -> int:
    """Query-key products the runner computes for these chunks: per group, its chunks
    times its longest chunk times its longest context."""
    if len(chunk_lens) == 1 == len(context_lens):
        return chunk_lens[0] * context_lens[0]  # one group of one (most steps)
    total = 0
    for group in group_prefill_chunks(chunk_lens, context_lens):
        total += (
            len(group) * max(chunk_lens[i] for i in group) * max(context_lens[i] for i in group)
        )
    return total
