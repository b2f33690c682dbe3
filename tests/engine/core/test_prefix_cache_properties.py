"""The block manager's prefix cache under random interleavings of allocate (with the
cache's hits), prefill chunks, decode appends, recompute preemption, swap out and in,
finish and the evictions they force — checked against a shadow of what every KV slot
holds (the tokens the "executor" wrote there).

After every operation: every block is free, cached-and-evictable or held; reference
counts equal the block tables holding each block; no key maps to two blocks
(``check_invariants``); every live request reads, at every computed position, the token
it has there, and the same tokens before it (so a hit never returned a block whose
content or prefix differs, and nobody wrote into a block someone else reads); every
registered block holds the content of its key; and a waiting request looked up again
from the hits of an earlier lookup (``lookup_again``, as lpm does each step) finds what a
whole lookup finds, however long ago the earlier one was.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.core.block_manager import BlockManager
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence

BLOCK = 4
PREFIXES = (
    (1, 2, 3, 4, 5, 6, 7, 8),
    (1, 2, 3, 4, 9, 9, 9, 9),
    (5, 5, 5, 5),
    (5, 5, 5, 5, 5, 5, 5, 5),
)
_seq_nos = itertools.count()


class PrefixCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(BLOCK, 12, 6, watermark=0.0, enable_prefix_caching=True)
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        # (block, offset) -> what the KV written there depends on: the tokens up to and
        # including that position (a real model's KV is a function of the whole prefix)
        self.device: dict[tuple[int, int], tuple[int, ...]] = {}
        self.host: dict[tuple[int, int], tuple[int, ...]] = {}
        # (seq_no, num_tokens) of a waiting request -> (hits, num_forgotten_blocks) of its
        # first lookup in this waiting spell, and of its latest one (lookup_again's)
        self.first_lookup: dict[tuple[int, int], tuple[list[int], int]] = {}
        self.last_lookup: dict[tuple[int, int], tuple[list[int], int]] = {}

    # -- helpers -----------------------------------------------------------------------
    def tokens(self, seq: Sequence) -> list[int]:
        return seq.prompt_token_ids + seq.output_token_ids

    def compute(self, seq: Sequence, n: int) -> None:
        """The executor's KV writes for ``n`` more positions of ``seq``."""
        tokens = self.tokens(seq)
        for p in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
            self.device[(seq.block_table[p // BLOCK], p % BLOCK)] = tuple(tokens[: p + 1])
        seq.num_computed_tokens += n

    # -- rules -------------------------------------------------------------------------
    @rule(prefix=st.sampled_from(PREFIXES), suffix=st.lists(st.integers(1, 2), max_size=9))
    def arrive(self, prefix: tuple[int, ...], suffix: list[int]) -> None:
        seq_no = next(_seq_nos)
        request = EngineRequest(f"r{seq_no}", [*prefix, *suffix], SamplingParams(), 0.0)
        self.waiting.append(Sequence(request, seq_no))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.waiting))
        hits = self.bm.lookup(seq)
        assert len(hits) * BLOCK <= seq.num_tokens - 1, "the last token is always computed"
        if not self.bm.can_allocate(seq, use_watermark=False, cached=hits):
            return
        free_before = self.bm.num_free_device_blocks
        needed = self.bm.blocks_needed(seq, hits)
        self.bm.allocate(seq, hits)
        taken = free_before - self.bm.num_free_device_blocks
        assert taken == needed, "can_allocate's count is what allocate takes"
        seq.num_computed_tokens = len(hits) * BLOCK
        self.waiting.remove(seq)
        self.running.append(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), chunk=st.integers(1, 6))
    def step(self, data: st.DataObject, chunk: int) -> None:
        """A prefill chunk, or (all computed) a sampled token and its decode."""
        seq = data.draw(st.sampled_from(self.running))
        if seq.num_computed_tokens < seq.num_tokens:
            n = min(chunk, seq.num_tokens - seq.num_computed_tokens)
            self.bm.register(seq, seq.num_computed_tokens + n)  # as the scheduler does
            self.compute(seq, n)
            return
        if not self.bm.can_append(seq, 1):
            return
        seq.output_token_ids.append(data.draw(st.integers(1, 3)))
        seq.num_tokens += 1
        self.bm.append_slots(seq, 1)
        self.compute(seq, 1)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def preempt_by_recompute(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.running))
        self.bm.free(seq)
        seq.num_computed_tokens = 0
        self.running.remove(seq)
        self.waiting.append(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.running))
        self.bm.free(seq)
        self.running.remove(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.running))
        if not self.bm.can_swap_out(seq):
            return
        for device, host in self.bm.swap_out(seq):
            for offset in range(BLOCK):
                if (device, offset) in self.device:
                    self.host[(host, offset)] = self.device[(device, offset)]
        self.running.remove(seq)
        self.swapped.append(seq)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.swapped))
        if not self.bm.can_swap_in(seq, use_watermark=False):
            return
        for host, device in self.bm.swap_in(seq):
            for offset in range(BLOCK):
                if (host, offset) in self.host:
                    self.device[(device, offset)] = self.host[(host, offset)]
        self.swapped.remove(seq)
        self.running.append(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        """A failed step: the request ends and its blocks' keys are dropped (their KV may
        never have been written), but for blocks others still hold."""
        seq = data.draw(st.sampled_from(self.running))
        self.bm.free(seq, keep_cached=False)
        self.running.remove(seq)

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def a_lookup_again_finds_what_a_whole_lookup_finds(self) -> None:
        now = self.bm.num_forgotten_blocks
        first, last = {}, {}
        for seq in self.waiting:
            spell = (seq.seq_no, seq.num_tokens)
            hits = self.bm.lookup(seq)
            for memo, kept in ((self.first_lookup, first), (self.last_lookup, last)):
                earlier, since = memo.get(spell, (hits, now))
                again = self.bm.lookup_again(seq, earlier, since)
                assert again == hits, (seq, earlier, since, again, hits)
                kept[spell] = (earlier, since) if memo is self.first_lookup else (again, now)
        self.first_lookup, self.last_lookup = first, last

    @invariant()
    def blocks_are_conserved_and_counted(self) -> None:
        self.bm.check_invariants(self.running + self.swapped + self.waiting)

    @invariant()
    def every_request_reads_its_own_tokens(self) -> None:
        for pool, seqs in ((self.device, self.running), (self.host, self.swapped)):
            for seq in seqs:
                tokens = self.tokens(seq)
                for p in range(seq.num_computed_tokens):
                    slot = (seq.block_table[p // BLOCK], p % BLOCK)
                    assert pool.get(slot) == tuple(tokens[: p + 1]), (seq, p, pool.get(slot))

    @invariant()
    def a_registered_block_holds_its_keys_content(self) -> None:
        for block in range(self.bm.num_device_blocks):
            key = self.bm.cache.key_of(block)
            if key is not None:
                held = [self.device.get((block, offset)) for offset in range(BLOCK)]
                assert all(h is not None for h in held), (block, held)
                assert tuple(h[-1] for h in held) == key[1], (block, held, key)


PrefixCacheMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_prefix_cache_state_machine = PrefixCacheMachine.TestCase
