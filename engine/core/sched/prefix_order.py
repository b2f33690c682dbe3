"""Longest prefix match: the order in which one admission pass takes waiting requests
under the ``lpm`` policy (``engine.core.sched.policy.LpmPolicy``).

A request's cached prefix (``BlockManager.lookup``: its longest run of full blocks the
prefix cache holds, times the block size) changes as the cache does, so it cannot be a
heap key fixed on arrival. Instead each admission pass ranks a *window*: the first
``policy.window`` (128) waiting requests in arrival order (the waiting queue's order
under lpm), each looked up, ordered by ``LpmPolicy.window_key`` (the most cached tokens
first, aging as sjf's, ties in the queue's arrival order). The pass takes the window in
that order, then the rest of the queue in arrival order (FCFS), stopping, as under every
policy, at the first request that does not fit.

Cost: a pass that reaches the waiting queue ranks at most ``window`` requests, whatever
the queue's length: ``window`` pops and pushes of the queue's heap and ``window``
lookups; a step with no free seat (or no token budget) ranks nothing. A lookup resumes
from the hits the request's lookup of the pass before found (``BlockManager.lookup_again``:
unless one of them was evicted since), so a request that stays in the window costs what
the cache changed for it, not its whole prefix again. SGLang bounds the same cost
differently: it matches the prefixes of the whole waiting queue each round, and orders
the whole queue FCFS while more than 128 wait; the window keeps lpm's order among the
oldest 128 however long the queue.

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


class PrefixRanking:
    """lpm's ranking of the waiting window, pass after pass (for one scheduler: it
    remembers each windowed request's hits, to look them up again at what changed)."""

    def __init__(
        self, policy: LpmPolicy, waiting: WaitingQueue, block_manager: BlockManager
    ) -> None:
        self.policy = policy
        self.waiting = waiting
        self.block_manager = block_manager
        #: (seq_no, queue_version) -> the hits of the last ranking, for each request then
        #: in the window (the version: the same waiting spell, so the same tokens)
        self._hits: dict[tuple[int, int], list[int]] = {}
        self._since = 0  # the block manager's num_forgotten_blocks then

    def ranked_window(self) -> list[tuple[Sequence, int]]:
        """The first ``policy.window`` waiting requests (arrival order), best first,
        each with its cached length in tokens."""
        bm = self.block_manager
        block_size = bm.block_size
        lookup_again, known, since = bm.lookup_again, self._hits, self._since
        window_key = self.policy.window_key
        hits_now: dict[tuple[int, int], list[int]] = {}
        ranked = []
        for seq in self.waiting.first(self.policy.window):
            spell = (seq.seq_no, seq.queue_version)
            hits = hits_now[spell] = lookup_again(seq, known.get(spell, NO_HITS), since)
            cached = len(hits) * block_size
            # ties by the queue's own order (arrival time, then arrival into the engine),
            # so a window with nothing cached is taken exactly as fcfs takes it
            ranked.append((window_key(seq, cached), seq.policy_key, seq.seq_no, seq, cached))
        self._hits, self._since = hits_now, bm.num_forgotten_blocks
        ranked.sort(key=_rank)
        return [(entry[3], entry[4]) for entry in ranked]


#: No earlier hits (never mutated).
NO_HITS: list[int] = []


def prefix_ranking(
    policy: Policy, waiting: WaitingQueue, block_manager: BlockManager
) -> PrefixRanking | None:
    """The ranking an admission takes its waiting requests by: lpm's with prefix caching
    on; None (the queue's static order) otherwise."""
    if isinstance(policy, LpmPolicy) and block_manager.enable_prefix_caching:
        return PrefixRanking(policy, waiting, block_manager)
    return None


def admission_order(
    waiting: WaitingQueue, ranking: PrefixRanking | None
) -> Iterator[tuple[Sequence, int | None]]:
    """Waiting requests in the order an admission pass takes them, each with the cached
    length (tokens) that ranked it under lpm (None: not ranked by its prefix).
    ``ranking``: lpm's, with prefix caching on (else None: the queue's static order).

    Lazy: nothing is looked up before the first request is asked for. The caller admits
    each request it is given, or stops: a request given and not admitted is not given
    again (the next is the one after it), so a pass stops at the first that does not
    fit."""
    if ranking is not None:
        yield from ranking.ranked_window()
    # The static order: under lpm the rest of the queue, by arrival.
    while (seq := waiting.peek()) is not None:
        yield seq, None


def _rank(entry: tuple[float, float, int, Sequence, int]) -> tuple[float, float, int]:
    return entry[0], entry[1], entry[2]  # never compares the Sequence
