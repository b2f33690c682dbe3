"""Longest prefix match: the order in which one admission pass takes waiting requests
under the ``lpm`` policy (``engine.core.sched.policy.LpmPolicy``).

A request's cached prefix (``BlockManager.lookup``: its longest run of full blocks the
prefix cache holds, times the block size) changes as the cache does, so it cannot be a
heap key fixed on arrival. Instead each admission pass ranks a *window*: the first
``policy.window`` (128) waiting requests in arrival order (the waiting queue's order
under lpm), each looked up once, ordered by ``LpmPolicy.window_key`` (the most cached
tokens first, aging as sjf's, ties in the queue's arrival order). The pass takes the window in that
order, then the rest of the queue in arrival order (FCFS), stopping, as under every
policy, at the first request that does not fit.

Cost: a pass that reaches the waiting queue does at most ``window`` lookups and
``window`` pops and pushes of the queue's heap, whatever the queue's length; a step
with no free slot (or no token budget) ranks nothing. SGLang does the same: it matches
the prefixes of the waiting queue each round and falls back to FCFS beyond 128.

The ranking is taken once per pass, when the pass first asks for a request: an
admission earlier in the same pass may register blocks (or evict some) that a later
request of the window would now hit, and the ranking does not move for that (SGLang's
rounds neither). Each admission looks its hits up afresh, so what it takes is always
what the cache holds; its decision records both (``num_cached_tokens``, and
``lpm_cached_tokens``, the length that ranked it).

With prefix caching off every lookup is empty, every key is the arrival's: lpm is FCFS,
and no ranking is done at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from engine.core.sched.policy import LpmPolicy

if TYPE_CHECKING:
    from engine.core.block_manager import BlockManager
    from engine.core.sched.policy import Policy
    from engine.core.sched.waiting_queue import WaitingQueue
    from engine.core.sequence import Sequence


def admission_order(
    policy: Policy, waiting: WaitingQueue, block_manager: BlockManager
) -> Iterator[tuple[Sequence, int | None]]:
    """Waiting requests in the order an admission pass takes them, each with the cached
    length (tokens) that ranked it under lpm (None: not ranked by its prefix).

    Lazy: nothing is looked up before the first request is asked for. The caller admits
    each request it is given, or stops: a request given and not admitted is not given
    again (the next is the one after it), so a pass stops at the first that does not
    fit."""
    if isinstance(policy, LpmPolicy) and block_manager.enable_prefix_caching:
        yield from ranked_window(policy, waiting, block_manager)
    # The static order: under lpm the rest of the queue, by arrival.
    while (seq := waiting.peek()) is not None:
        yield seq, None


def ranked_window(
    policy: LpmPolicy, waiting: WaitingQueue, block_manager: BlockManager
) -> list[tuple[Sequence, int]]:
    """The first ``policy.window`` waiting requests (arrival order), best first, each
    with its cached length in tokens."""
    block_size = block_manager.block_size
    lookup = block_manager.lookup
    window_key = policy.window_key
    ranked = []
    for seq in waiting.first(policy.window):
        cached = len(lookup(seq)) * block_size
        # ties by the queue's own order (arrival time, then arrival into the engine), so
        # a window with nothing cached is taken exactly as fcfs takes it
        ranked.append((window_key(seq, cached), seq.policy_key, seq.seq_no, seq, cached))
    ranked.sort(key=_rank)
    return [(entry[3], entry[4]) for entry in ranked]


def _rank(entry: tuple[float, float, int, Sequence, int]) -> tuple[float, float, int]:
    return entry[0], entry[1], entry[2]  # never compares the Sequence
