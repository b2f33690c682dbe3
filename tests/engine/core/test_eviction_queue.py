"""The eviction queue of runs (``engine.core.eviction_queue``) seen block by block: it
must order, take back and evict exactly as a per-block ordered set would (the reference
here is an ``OrderedDict``, vLLM's free-block queue in miniature)."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.eviction_queue import EvictionQueue


class FakeChain:
    def __init__(self, blocks: list[int]) -> None:
        self.blocks = blocks


def _blocks(runs: list[tuple[FakeChain, int, int]]) -> list[int]:
    return [chain.blocks[p] for chain, lo, hi in runs for p in range(hi - 1, lo - 1, -1)]


def test_a_run_is_queued_top_down_and_evicted_from_the_head():
    a, b = FakeChain([10, 11, 12, 13]), FakeChain([20, 21])
    queue = EvictionQueue()
    queue.push(a, 0, 4)
    queue.push(b, 0, 2)
    assert list(queue) == [13, 12, 11, 10, 21, 20]
    assert len(queue) == 6
    assert _blocks(queue.pop(3)) == [13, 12, 11]
    assert _blocks(queue.pop(2)) == [10, 21]
    assert list(queue) == [20] and len(queue) == 1
    queue.check()


def test_a_hit_takes_a_block_back_from_the_bottom_top_or_middle_of_a_run():
    a = FakeChain([10, 11, 12, 13, 14])
    queue = EvictionQueue()
    queue.push(a, 0, 5)
    queue.take_back(a, 0)  # the bottom: a prefix hit
    queue.take_back(a, 4)  # the top
    queue.take_back(a, 2)  # the middle: split, order kept
    assert list(queue) == [13, 11]
    queue.check()
    assert _blocks(queue.pop(2)) == [13, 11]
    assert not queue


def test_a_run_pushed_onto_a_run_emptied_by_hits_is_indexed_again():
    """Regression: a chain's whole run taken back by a hit, then freed again (the hitter
    finished) went on the emptied run still at the tail, which had left the per-chain
    index, so the next hit on it raised KeyError."""
    a = FakeChain([10, 11, 12])
    queue = EvictionQueue()
    queue.push(a, 0, 3)
    for position in range(3):
        queue.take_back(a, position)
    queue.push(a, 0, 3)
    queue.check()
    queue.take_back(a, 0)
    assert list(queue) == [12, 11]
    queue.check()


# An operation: ("push", chain, lo, hi) | ("take", k) | ("pop", n)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 3), st.integers(0, 5), st.integers(1, 4)),
        st.tuples(st.just("take"), st.integers(0, 1000)),
        st.tuples(st.just("pop"), st.integers(1, 6)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_ops)
def test_the_queue_matches_a_per_block_ordered_set(ops):
    chains = [FakeChain(list(range(100 * c, 100 * c + 10))) for c in range(4)]
    queue = EvictionQueue()
    reference: OrderedDict[int, tuple[int, int]] = OrderedDict()  # block -> (chain, position)
    for op in ops:
        if op[0] == "push":
            _, c, lo, length = op
            hi = min(lo + length, 10)
            if any((c, p) in reference.values() for p in range(lo, hi)):
                continue  # a block is queued once
            queue.push(chains[c], lo, hi)
            for p in range(hi - 1, lo - 1, -1):
                reference[chains[c].blocks[p]] = (c, p)
        elif op[0] == "take":
            if not reference:
                continue
            block = list(reference)[op[1] % len(reference)]
            c, p = reference.pop(block)
            queue.take_back(chains[c], p)
        else:
            n = min(op[1], len(reference))
            if not n:
                continue
            expected = [reference.popitem(last=False)[0] for _ in range(n)]
            assert _blocks(queue.pop(n)) == expected
        assert list(queue) == list(reference)
        assert len(queue) == len(reference)
        queue.check()


def test_runs_emptied_by_hits_do_not_pile_up_in_a_pool_that_never_evicts():
    """Regression: a hot prefix freed by its last holder and hit again by the next
    request left one emptied run in the queue per hit; with free blocks to spare nothing
    is evicted, the head never reaches them, and they were kept forever."""
    hot, other = FakeChain([1, 2, 3]), FakeChain([7, 8, 9])
    queue = EvictionQueue()
    for _ in range(1000):  # freed, then hit at once: the run is the queue's tail
        queue.push(hot, 0, 3)
        for position in range(3):
            queue.take_back(hot, position)
    assert queue.num_runs == 0
    for _ in range(1000):  # emptied behind the tail: swept once they are half the queue
        queue.push(hot, 0, 3)
        queue.push(other, 0, 3)
        for position in range(3):
            queue.take_back(hot, position)
        for position in range(3):
            queue.take_back(other, position)
        queue.check()
    assert queue.num_runs <= 130
    assert not queue
