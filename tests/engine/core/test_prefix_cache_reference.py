"""The block manager's prefix cache against a reference model that anyone can read: every
block keyed by its whole prefix (a tuple of every token up to the block's end), one
dictionary entry per registered block, the same pool rules (truly free blocks first, the
most recently freed first; then the eviction queue's head; tails freed first). Random
interleavings of admission with hits, prefill chunks, decodes, recompute preemptions and
finishes must give the same hits (the same block ids), the same free and evictable
counts and the same evictions — so the chained index (``engine.core.prefix_cache``), built
for speed, decides exactly as the plain per-block one."""

from __future__ import annotations

import itertools
from collections import OrderedDict

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.core.block_manager import BlockManager
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence

BLOCK = 4
POOL = 9
PREFIXES = ((1, 2, 3, 4, 5, 6, 7, 8), (1, 2, 3, 4, 9, 9, 9, 9), (5, 5, 5, 5, 5, 5, 5, 5))
_seq_nos = itertools.count()


class ReferenceCache:
    """The plain model: ``key[block]`` is the block's whole prefix, or None."""

    def __init__(self) -> None:
        self.free = list(range(POOL - 1, -1, -1))
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.refs = [0] * POOL
        self.key: list[tuple[int, ...] | None] = [None] * POOL
        self.by_key: dict[tuple[int, ...], int] = {}
        self.tables: dict[int, list[int]] = {}
        self.registered: dict[int, int] = {}
        self.evicted = 0

    @staticmethod
    def tokens(seq: Sequence) -> list[int]:
        return seq.prompt_token_ids + seq.output_token_ids

    def lookup(self, seq: Sequence) -> list[int]:
        tokens = self.tokens(seq)
        hits = []
        for j in range((len(tokens) - 1) // BLOCK):
            block = self.by_key.get(tuple(tokens[: (j + 1) * BLOCK]))
            if block is None:
                break
            hits.append(block)
        return hits

    def take(self, n: int) -> list[int]:
        taken = []
        for _ in range(n):
            if self.free:
                block = self.free.pop()
            else:
                block = self.evictable.popitem(last=False)[0]
                del self.by_key[self.key[block]]
                self.key[block] = None
                self.evicted += 1
            self.refs[block] = 1
            taken.append(block)
        return taken

    def allocate(self, seq: Sequence, hits: list[int]) -> None:
        for block in hits:
            if not self.refs[block]:
                del self.evictable[block]
            self.refs[block] += 1
        needed = -(-seq.num_tokens // BLOCK) - len(hits)
        self.tables[seq.seq_no] = hits + self.take(needed)
        self.registered[seq.seq_no] = len(hits)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        table = self.tables[seq.seq_no]
        table += self.take(-(-num_tokens // BLOCK) - len(table))

    def register(self, seq: Sequence, num_tokens: int) -> None:
        tokens, table = self.tokens(seq), self.tables[seq.seq_no]
        full = min(num_tokens // BLOCK, len(table))
        for j in range(self.registered[seq.seq_no], full):
            key = tuple(tokens[: (j + 1) * BLOCK])
            if key not in self.by_key:
                self.by_key[key] = table[j]
                self.key[table[j]] = key
        self.registered[seq.seq_no] = max(full, self.registered[seq.seq_no])

    def release(self, seq: Sequence, keep: bool = True) -> None:
        """Free ``seq``'s table tail first; ``keep=False`` (a failed step) registers
        nothing and drops the key of each block it frees."""
        if keep:
            self.register(seq, seq.num_computed_tokens)
        for block in reversed(self.tables.pop(seq.seq_no)):
            self.refs[block] -= 1
            if self.refs[block]:
                continue
            if keep and self.key[block] is not None:
                self.evictable[block] = None
            else:
                if self.key[block] is not None:
                    del self.by_key[self.key[block]]
                    self.key[block] = None
                self.free.append(block)


class Differential(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(BLOCK, POOL, 0, watermark=0.0, enable_prefix_caching=True)
        self.ref = ReferenceCache()
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []

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
        assert hits == self.ref.lookup(seq), "the same hits, block for block"
        if not self.bm.can_allocate(seq, use_watermark=False, cached=hits):
            return
        self.bm.allocate(seq, hits)
        self.ref.allocate(seq, hits)
        assert seq.block_table == self.ref.tables[seq.seq_no]
        seq.num_computed_tokens = len(hits) * BLOCK
        self.waiting.remove(seq)
        self.running.append(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), chunk=st.integers(1, 6))
    def step(self, data: st.DataObject, chunk: int) -> None:
        seq = data.draw(st.sampled_from(self.running))
        if seq.num_computed_tokens < seq.num_tokens:
            n = min(chunk, seq.num_tokens - seq.num_computed_tokens)
            self.bm.register(seq, seq.num_computed_tokens + n)
            self.ref.register(seq, seq.num_computed_tokens + n)
            seq.num_computed_tokens += n
            return
        if not self.bm.can_append(seq, 1):
            return
        seq.output_token_ids.append(data.draw(st.integers(1, 2)))
        seq.num_tokens += 1
        self.bm.append_slots(seq, 1)
        self.ref.grow(seq, seq.num_computed_tokens + 1)
        assert seq.block_table == self.ref.tables[seq.seq_no]
        seq.num_computed_tokens += 1

    @precondition(lambda self: self.running)
    @rule(data=st.data(), finish=st.booleans(), failed=st.booleans())
    def leave(self, data: st.DataObject, finish: bool, failed: bool) -> None:
        """A finish, or a recompute preemption (back to waiting, nothing computed); after
        a failed step (``failed``) its blocks keep nothing cached."""
        seq = data.draw(st.sampled_from(self.running))
        self.ref.release(seq, keep=not failed)
        self.bm.free(seq, keep_cached=not failed)
        self.running.remove(seq)
        seq.num_computed_tokens = 0
        if not finish:
            self.waiting.append(seq)

    @precondition(lambda self: self.running)
    @rule()
    def turnover(self) -> None:
        """The oldest running request finishes with its prompt computed (its blocks stay
        cached): churn that fills the eviction queue, so later allocations evict."""
        seq = self.running[0]
        if seq.num_computed_tokens < seq.num_tokens:
            self.bm.register(seq, seq.num_tokens)
            self.ref.register(seq, seq.num_tokens)
            seq.num_computed_tokens = seq.num_tokens
        self.ref.release(seq)
        self.bm.free(seq)
        self.running.remove(seq)

    @invariant()
    def the_pools_agree(self) -> None:
        assert self.bm.num_free_device_blocks == len(self.ref.free) + len(self.ref.evictable)
        assert list(self.bm._evictable) == list(self.ref.evictable)
        assert self.bm._free_device == self.ref.free
        assert self.bm.num_evicted_blocks == self.ref.evicted
        self.bm.check_invariants(self.running + self.waiting)


Differential.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_chained_index_decides_as_the_per_block_reference = Differential.TestCase


def test_a_content_computed_again_reaches_what_hung_off_its_evicted_block():
    """The case hypothesis found (it failed before contents kept their serials): c and d
    compute (1, 2, 3, 4) side by side, so d's own chain hangs off c's block, which d never
    held; c's blocks are evicted while d's stay cached; e computes (1 .. 8) again. A
    per-block index (vLLM's, keyed by whole prefixes) then finds d's block after e's:
    so must the chained one, and the pools must agree block for block."""
    machine = Differential()

    def arrive(prefix: tuple[int, ...], suffix: list[int]) -> Sequence:
        machine.arrive(prefix, suffix)
        return machine.waiting[-1]

    def admit(seq: Sequence) -> None:
        machine.admit(_Draw(seq))  # type: ignore[arg-type]
        machine.the_pools_agree()

    def turnover() -> None:
        machine.turnover()
        machine.the_pools_agree()

    first, second, third = PREFIXES
    a, b, c = arrive(third, [1] * 5), arrive(third, []), arrive(first, [])
    admit(c)
    d = arrive(second, [1] * 8)
    admit(d)  # nothing registered yet: d computes (1, 2, 3, 4) too
    e = arrive(first, [])
    turnover()  # c: its two blocks cached
    turnover()  # d: its chain follows c's first block
    admit(a)
    admit(b)
    turnover()
    turnover()  # a and b took c's blocks (the queue's head); d's stay cached
    admit(e)
    turnover()  # e registered (1 .. 8) again
    f = arrive(second, [1])
    assert machine.bm.lookup(f) == machine.ref.lookup(f)
    assert len(machine.bm.lookup(f)) == 2  # e's first block, then d's
    admit(f)
    turnover()


class _Draw:
    """A stand-in for hypothesis's ``data`` that draws the one sequence given."""

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq

    def draw(self, strategy: object) -> Sequence:
        return self.seq
