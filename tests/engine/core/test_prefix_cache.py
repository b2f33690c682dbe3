"""The prefix cache's rules, one by one (vLLM V1's semantics): hits over full blocks
only and never the last token, hits taken by reference, a freed request's blocks kept
and evicted least recently freed first (its tail before its prefix), truly free blocks
used before any cached one is evicted, one block per content, nothing kept from a failed
step, and what a preemption's victims would free when they share blocks."""

from __future__ import annotations

import itertools

import pytest

from engine.core.block_manager import BlockManager
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence

BLOCK = 4
_seq_nos = itertools.count()


def seq_of(tokens: list[int]) -> Sequence:
    seq_no = next(_seq_nos)
    return Sequence(EngineRequest(f"r{seq_no}", tokens, SamplingParams(), 0.0), seq_no)


def manager(num_blocks: int = 8) -> BlockManager:
    return BlockManager(BLOCK, num_blocks, 4, watermark=0.0, enable_prefix_caching=True)


def prefilled(bm: BlockManager, tokens: list[int]) -> Sequence:
    """A request admitted with its hits and its whole prompt computed."""
    seq = seq_of(tokens)
    hits = bm.lookup(seq)
    bm.allocate(seq, hits)
    bm.register(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    return seq


def test_a_shared_prefix_is_found_block_by_block_and_taken_by_reference():
    bm = manager()
    first = prefilled(bm, list(range(10)))  # blocks [0-3] [4-7] and a partial [8, 9]
    second = seq_of([*range(8), 42, 43])
    hits = bm.lookup(second)
    assert hits == first.block_table[:2]
    bm.allocate(second, hits)
    assert second.block_table[:2] == hits and second.block_table[2] != first.block_table[2]
    assert bm._refs[hits[0]] == bm._refs[hits[1]] == 2
    assert bm.num_free_device_blocks == 8 - 4
    bm.check_invariants([first, second])


def test_the_last_token_is_always_computed():
    """A prompt of exactly two cached blocks hits one: its last token is computed."""
    bm = manager()
    prefilled(bm, list(range(8)))
    assert len(bm.lookup(seq_of(list(range(8))))) == 1
    assert len(bm.lookup(seq_of(list(range(9))))) == 2


def test_a_different_block_before_the_same_tokens_is_no_hit():
    bm = manager()
    prefilled(bm, [1, 1, 1, 1, 7, 7, 7, 7, 0])
    assert bm.lookup(seq_of([2, 2, 2, 2, 7, 7, 7, 7, 0])) == []
    assert len(bm.lookup(seq_of([1, 1, 1, 1, 7, 7, 7, 7, 0]))) == 2


def test_off_finds_nothing():
    bm = BlockManager(BLOCK, 8, 0, watermark=0.0)
    seq = prefilled(bm, list(range(9)))
    bm.free(seq)
    assert bm.lookup(seq_of(list(range(9)))) == [] and bm.num_cached_blocks == 0


def test_freed_blocks_stay_cached_tail_first_and_a_hit_takes_them_back():
    bm = manager()
    seq = prefilled(bm, list(range(13)))  # 3 full blocks + 1 partial
    table = list(seq.block_table)
    bm.free(seq)
    assert bm.num_free_device_blocks == 8  # cached blocks nobody holds count as free
    assert list(bm._evictable) == [table[2], table[1], table[0]]  # tail first
    assert table[3] in bm._free_device  # the partial block was never registered
    again = seq_of(list(range(13)))
    hits = bm.lookup(again)
    assert hits == table[:3]
    assert bm.blocks_needed(again, hits) == 1 + 3  # one new block, three taken back
    bm.allocate(again, hits)
    assert not bm._evictable
    bm.check_invariants([again])


def test_truly_free_blocks_go_first_then_the_least_recently_freed():
    bm = manager(num_blocks=6)
    a = prefilled(bm, [1] * 8 + [0])  # 2 full blocks + a partial: 3 blocks
    bm.free(a)
    b = prefilled(bm, [2] * 8 + [0])  # takes the 3 truly free blocks: nothing evicted
    assert bm.num_evicted_blocks == 0
    assert len(bm.lookup(seq_of([1] * 8 + [0]))) == 2
    bm.free(b)  # b's blocks join the queue behind a's
    c = seq_of([3] * 8 + [0])  # 3 blocks: the 2 truly free ones, then a's tail
    bm.allocate(c, bm.lookup(c))
    assert bm.num_evicted_blocks == 1
    assert len(bm.lookup(seq_of([1] * 8 + [0]))) == 1  # a's prefix outlived its tail
    assert len(bm.lookup(seq_of([2] * 8 + [0]))) == 2  # b was freed later: intact


def test_one_block_per_content():
    """Two requests computing the same prompt at once: the first registers it; the
    second's copy stays unregistered and goes back to the free list."""
    bm = manager()
    a, b = seq_of([5] * 9), seq_of([5] * 9)
    for seq in (a, b):
        bm.allocate(seq, bm.lookup(seq))
    for seq in (a, b):
        bm.register(seq, 9)
        seq.num_computed_tokens = 9
    assert bm.num_cached_blocks == 2
    assert [bm.cache.is_registered(block) for block in b.block_table] == [False, False, False]
    bm.free(b)
    assert not bm._evictable
    bm.check_invariants([a])


def test_a_failed_step_keeps_nothing_cached():
    bm = manager()
    seq = seq_of(list(range(9)))
    bm.allocate(seq)
    bm.register(seq, 9)  # registered when its prefill was scheduled; the step then failed
    bm.free(seq, keep_cached=False)
    assert bm.num_cached_blocks == 0 and bm.lookup(seq_of(list(range(9)))) == []
    bm.check_invariants([])


def test_decoded_blocks_are_registered_when_freed():
    bm = manager()
    seq = prefilled(bm, [7] * 5)
    for token in (1, 2, 3):  # decoding fills the second block
        seq.output_token_ids.append(token)
        seq.num_tokens += 1
        bm.append_slots(seq, 1)
        seq.num_computed_tokens += 1
    assert seq.num_registered_blocks == 1
    bm.free(seq)
    assert len(bm.lookup(seq_of([7] * 5 + [1, 2, 3, 0]))) == 2


def test_swap_keeps_shared_blocks_consistent():
    """A swapped-out request's shared blocks stay with the others; it comes back in
    fresh blocks and registers nothing twice."""
    bm = manager()
    a = prefilled(bm, list(range(9)))
    b = prefilled(bm, list(range(9)))
    shared = b.block_table[:2]
    assert shared == a.block_table[:2]
    mapping = bm.swap_out(b)
    assert [device for device, _ in mapping] == [*shared, b.block_table and mapping[2][0]]
    assert bm._refs[shared[0]] == 1  # a still holds it
    bm.check_invariants([a, b])
    bm.swap_in(b)
    assert not set(b.block_table) & set(a.block_table)
    bm.free(b)
    bm.check_invariants([a])
    assert len(bm.lookup(seq_of(list(range(9))))) == 2


@pytest.mark.parametrize("shared_with_seq", [True, False])
def test_release_count_frees_only_blocks_nobody_else_holds(shared_with_seq: bool):
    bm = manager()
    victim = prefilled(bm, list(range(9)))
    other = prefilled(bm, list(range(9)))  # shares the two full blocks
    newcomer = seq_of(list(range(9)))
    hits = bm.lookup(newcomer) if shared_with_seq else []
    count = bm.release_count(hits)
    assert count.add(victim.block_table) == (1, 0)  # only its partial block frees
    assert count.add(other.block_table) == (3, 2 if shared_with_seq else 0)


def test_evicted_prefix_counts_what_would_have_hit_with_room():
    """a's two full blocks are cached; b's allocation evicts a's tail (the second):
    a's prompt now hits one block, and the ghost of the evicted one says one more
    would have hit."""
    bm = manager(num_blocks=4)
    a = prefilled(bm, [1] * 8 + [0])
    bm.free(a)
    prefilled(bm, [2] * 8 + [0])  # 3 blocks: the 2 truly free ones and a's tail
    again = seq_of([1] * 8 + [0])
    hits = bm.lookup(again)
    assert len(hits) == 1
    assert bm.evicted_prefix(again, hits) == BLOCK
    assert bm.evicted_prefix(seq_of([3] * 8 + [0]), []) == 0  # never cached


def test_evicted_prefix_walks_on_into_a_chain_that_followed_an_evicted_content():
    """a caches (1 x4)(2 x4); b hits a's first block and caches (3 x4) after it, a chain
    of its own; all three are evicted. c = (1 x4)(3 x4) had both of its full blocks in
    the cache: the walk goes from a's ghost into b's chain (it stopped at a's second
    block, whose tokens differ, before evicted contents kept their serials)."""
    bm = manager(num_blocks=5)
    a = prefilled(bm, [1] * 4 + [2] * 4 + [0])
    b = prefilled(bm, [1] * 4 + [3] * 4 + [0])
    assert b.block_table[0] == a.block_table[0]
    bm.free(a)
    bm.free(b)
    prefilled(bm, [7] * 19 + [0])  # all five blocks: the three cached ones evicted
    assert bm.num_evicted_blocks == 3
    again = seq_of([1] * 4 + [3] * 4 + [0])
    assert bm.lookup(again) == []
    assert bm.evicted_prefix(again, []) == 2 * BLOCK
    assert bm.evicted_prefix(seq_of([1] * 4 + [4] * 4 + [0]), []) == BLOCK


def test_a_content_computed_again_takes_back_its_place():
    """b's chain follows a's first block, which b never held (both computed it side by
    side); a's blocks are evicted, b's stay. c computes a's first block again: d then
    finds c's block and b's after it, as a per-block index keyed by whole prefixes does."""
    bm = manager(num_blocks=8)
    a = seq_of([1] * 4 + [2] * 4 + [0])
    b = seq_of([1] * 4 + [3] * 4 + [0])
    for seq in (a, b):  # admitted together: neither hits the other
        bm.allocate(seq, bm.lookup(seq))
    for seq in (a, b):
        bm.register(seq, 9)
        seq.num_computed_tokens = 9
    assert b.block_table[0] != a.block_table[0]  # b's copy stays unregistered
    b_second = b.block_table[1]
    bm.free(a)
    bm.free(b)  # queue: a's (2), (1); then b's (3); b's (1)-copy went to the free list
    filler = prefilled(bm, [7] * 27 + [0])  # 7 blocks: 5 truly free, then a's two
    assert bm.num_evicted_blocks == 2
    assert bm.lookup(seq_of([1] * 4 + [3] * 4 + [0])) == []
    bm.free(filler, keep_cached=False)  # back to the free list, b's block still cached
    c = prefilled(bm, [1] * 4 + [0])
    d = seq_of([1] * 4 + [3] * 4 + [0])
    assert bm.lookup(d) == [c.block_table[0], b_second]
    bm.check_invariants([c])


def test_a_chunked_prefill_following_an_evicted_block_hangs_off_its_content():
    """s's first chunk follows a's first block, which s never holds; a's blocks are
    evicted before s's second chunk registers, and r computes a's contents again (filling
    a's places). s's second block holds a's second content: it must follow r's copy, not
    start a chain keyed like it (two blocks under one key failed the invariants when the
    follower was found by its stale block instead of its content's serial)."""
    bm = manager(num_blocks=12)
    a = seq_of([1] * 4 + [2] * 4 + [0])
    s = seq_of([1] * 4 + [2] * 4 + [0])
    t = seq_of([1] * 4 + [3] * 4 + [0])
    for seq in (a, s, t):  # side by side: nobody hits
        bm.allocate(seq, [])
    for seq, n in ((a, 9), (t, 9), (s, 4)):
        bm.register(seq, n)
        seq.num_computed_tokens = n
    bm.free(a)
    filler = seq_of([7] * 23 + [0])
    bm.allocate(filler, [])  # the free ones, then a's two
    assert bm.num_evicted_blocks == 2
    bm.free(filler, keep_cached=False)
    r = prefilled(bm, [1] * 4 + [2] * 4 + [0])
    bm.check_invariants([s, t, r])
    bm.register(s, 8)
    s.num_computed_tokens = 8
    bm.check_invariants([s, t, r])
    bm.free(s)
    bm.check_invariants([t, r])


def test_a_chain_followed_by_a_running_request_stays_fillable():
    """s follows a's first block, then a's blocks are all evicted: a is kept for s, so
    the chain s hangs off it later is found again once r computes a's content anew."""
    bm = manager(num_blocks=9)
    a = seq_of([1] * 4 + [2] * 4 + [0])
    s = seq_of([1] * 4 + [2] * 4 + [0])
    for seq in (a, s):
        bm.allocate(seq, [])
    bm.register(a, 9)
    a.num_computed_tokens = 9
    bm.register(s, 4)  # its first chunk: it follows a's first block
    s.num_computed_tokens = 4
    bm.free(a)
    filler = seq_of([7] * 23 + [0])
    bm.allocate(filler, [])
    assert bm.num_evicted_blocks == 2
    bm.free(filler, keep_cached=False)
    bm.register(s, 8)  # its second block: a's second content, evicted, filled by s
    s.num_computed_tokens = 8
    r = prefilled(bm, [1] * 4 + [0])  # a's first content again
    assert bm.lookup(seq_of([1] * 4 + [2] * 4 + [5])) == [r.block_table[0], s.block_table[1]]
    bm.check_invariants([s, r])


def test_the_ghosts_count_each_evicted_chain_once():
    """The same prompt cached and evicted five times: one ghost of one block, not a
    count growing with each time (a ghost replaced by a chain of the same head was
    counted on, so the ghosts shrank to about one entry in a long run)."""
    bm = manager(num_blocks=8)
    for _ in range(5):
        bm.free(prefilled(bm, [1] * 4 + [0]))
        bm.free(prefilled(bm, [7] * 31 + [0]), keep_cached=False)  # evicts it
        assert bm.cache.ghost_blocks == sum(len(c.blocks) for c in bm.cache.ghosts.values())
    assert bm.cache.ghost_blocks == 1


def test_a_ghost_taken_back_by_a_filled_head_is_counted_off_by_its_own_size():
    bm = manager(num_blocks=8)
    bm.free(prefilled(bm, [1] * 4 + [0]))  # x = (1 x4)
    bm.free(prefilled(bm, [7] * 31 + [0]), keep_cached=False)  # evicts x: a 1-block ghost
    p = seq_of([1] * 4 + [2] * 4 + [3] * 4 + [0])
    q = seq_of([1] * 4 + [5] * 4 + [0])
    bm.allocate(p, [])
    bm.allocate(q, [])
    bm.register(p, 12)  # y: (1 x4)(2 x4)(3 x4), the head of x's key
    p.num_computed_tokens = 12
    bm.register(q, 8)  # follows y's head
    q.num_computed_tokens = 8
    bm.free(p, keep_cached=False)  # a failed step: y's head forgotten, y kept for q
    prefilled(bm, [1] * 4 + [0])  # fills y's head again, and x's ghost goes
    assert bm.cache.ghost_blocks == sum(len(c.blocks) for c in bm.cache.ghosts.values()) >= 0


def test_a_failed_steps_blocks_leave_no_ghost():
    bm = manager(num_blocks=3)
    seq = seq_of(list(range(9)))
    bm.allocate(seq)
    bm.register(seq, 9)
    bm.free(seq, keep_cached=False)
    other = prefilled(bm, [7] * 9)  # takes all 3 blocks: nothing was cached to evict
    assert bm.num_evicted_blocks == 0 and other.block_table
    assert bm.evicted_prefix(seq_of(list(range(9))), []) == 0
