"""BlockManager: predicate/action pairs, block mappings, watermark, errors, and a
state machine over random operations that must conserve blocks in both pools."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.core.block_manager import BlockManager
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence

_seq_nos = itertools.count()


def make_seq(num_tokens: int, name: str | None = None) -> Sequence:
    seq_no = next(_seq_nos)
    return Sequence(
        EngineRequest(name or f"s{seq_no}", list(range(num_tokens)), SamplingParams(), 0.0), seq_no
    )


def prefilled(bm: BlockManager, num_tokens: int) -> Sequence:
    """A sequence allocated and computed up to ``num_tokens``."""
    seq = make_seq(num_tokens)
    bm.allocate(seq)
    seq.num_computed_tokens = num_tokens
    return seq


def pools(bm: BlockManager) -> tuple[list[int], list[int]]:
    return list(bm._free_device), list(bm._free_host)


def test_blocks_for_rounds_up() -> None:
    bm = BlockManager(4, 8, 0)
    assert [bm.blocks_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_allocate_append_free_round_trip() -> None:
    bm = BlockManager(block_size=4, num_device_blocks=8, num_host_blocks=4, watermark=0.0)
    seq = make_seq(10)
    assert bm.can_allocate(seq)
    bm.allocate(seq)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert bm.num_free_device_blocks == 5 and bm.device_usage == pytest.approx(3 / 8)
    bm.check_invariants([seq])

    seq.num_computed_tokens = 10
    assert bm.can_append(seq, 2)  # tokens 11-12 still fit the third block
    bm.append_slots(seq, 2)
    assert len(seq.block_table) == 3
    seq.num_computed_tokens = 12
    bm.append_slots(seq, 1)  # token 13 opens a fourth block
    assert len(seq.block_table) == 4 and bm.num_free_device_blocks == 4
    bm.append_slots(seq, 8)  # up to 20 tokens: 5 blocks
    assert len(seq.block_table) == 5
    bm.check_invariants([seq])

    bm.free(seq)
    assert seq.block_table == []
    assert bm.num_free_device_blocks == 8 and bm.num_free_host_blocks == 4
    bm.check_invariants([])
    bm.free(seq)  # freeing an empty table is a no-op
    bm.check_invariants([])


def test_swap_out_and_in_return_the_block_mappings() -> None:
    bm = BlockManager(block_size=4, num_device_blocks=8, num_host_blocks=4, watermark=0.0)
    other = prefilled(bm, 4)
    seq = prefilled(bm, 12)
    device_blocks = list(seq.block_table)

    assert bm.can_swap_out(seq)
    out_map = bm.swap_out(seq)
    assert [dev for dev, _ in out_map] == device_blocks  # in block-table order
    assert [host for _, host in out_map] == seq.block_table
    assert len(set(seq.block_table)) == 3 and all(0 <= b < 4 for b in seq.block_table)
    assert bm.is_on_host(seq) and not bm.is_on_host(other)
    assert bm.num_free_device_blocks == 7 and bm.num_free_host_blocks == 1
    assert set(device_blocks) <= set(bm._free_device)
    assert bm.host_usage == pytest.approx(3 / 4)
    bm.check_invariants([seq, other])

    host_blocks = list(seq.block_table)
    assert bm.can_swap_in(seq)
    in_map = bm.swap_in(seq)
    assert [host for host, _ in in_map] == host_blocks
    assert [dev for _, dev in in_map] == seq.block_table
    assert not bm.is_on_host(seq)
    assert bm.num_free_device_blocks == 4 and bm.num_free_host_blocks == 4
    bm.check_invariants([seq, other])
    # the token computed after the swap-in has its slot
    assert bm.can_append(seq, 1)
    bm.append_slots(seq, 1)
    assert len(seq.block_table) == 4


def test_free_of_a_swapped_sequence_returns_host_blocks() -> None:
    bm = BlockManager(block_size=4, num_device_blocks=4, num_host_blocks=4, watermark=0.0)
    seq = prefilled(bm, 8)
    bm.swap_out(seq)
    bm.free(seq)
    assert seq.block_table == [] and not bm.is_on_host(seq)
    assert bm.num_free_device_blocks == 4 and bm.num_free_host_blocks == 4
    bm.check_invariants([])


def test_watermark_is_honoured_by_can_allocate_and_can_swap_in() -> None:
    bm = BlockManager(block_size=4, num_device_blocks=10, num_host_blocks=10, watermark=0.2)
    assert bm.watermark_blocks == 2
    fits = make_seq(32)  # 8 blocks: leaves exactly the 2 reserved
    too_big = make_seq(33)  # 9 blocks: would eat into the reserve
    assert bm.can_allocate(fits)
    assert not bm.can_allocate(too_big)
    assert bm.can_allocate(too_big, use_watermark=False)
    # growth of running requests may use the reserve
    seq = prefilled(bm, 32)
    assert bm.can_append(seq, 8)
    assert not bm.can_append(seq, 9)
    bm.free(seq)
    # swap-in counts the block of the next token and keeps the reserve
    seq = prefilled(bm, 28)  # 7 blocks, the next token opens an eighth
    bm.swap_out(seq)
    assert bm.can_swap_in(seq)
    filler = prefilled(bm, 4)  # one device block used: 9 free, 8 needed, reserve 2
    assert not bm.can_swap_in(seq)
    assert bm.can_swap_in(seq, use_watermark=False)
    bm.check_invariants([seq, filler])


def test_actions_without_room_raise_and_change_nothing() -> None:
    bm = BlockManager(block_size=4, num_device_blocks=4, num_host_blocks=2, watermark=0.0)
    held = prefilled(bm, 12)  # 3 of 4 device blocks
    big = make_seq(8)  # needs 2
    before = pools(bm)
    assert not bm.can_allocate(big, use_watermark=False)
    with pytest.raises(RuntimeError, match="out of device blocks"):
        bm.allocate(big)
    assert big.block_table == [] and pools(bm) == before

    held.num_computed_tokens = 12
    assert not bm.can_append(held, 5)  # 17 tokens: 5 blocks
    with pytest.raises(RuntimeError, match="out of device blocks"):
        bm.append_slots(held, 5)
    assert len(held.block_table) == 3 and pools(bm) == before

    assert not bm.can_swap_out(held)  # 3 blocks, 2 host blocks
    with pytest.raises(RuntimeError, match="host pool"):
        bm.swap_out(held)
    assert len(held.block_table) == 3 and not bm.is_on_host(held) and pools(bm) == before

    small = prefilled(bm, 4)  # the last device block
    bm.swap_out(small)
    again = prefilled(bm, 4)  # takes the block small left
    before = pools(bm)
    assert not bm.can_swap_in(small, use_watermark=False)
    with pytest.raises(RuntimeError, match="device pool"):
        bm.swap_in(small)
    assert bm.is_on_host(small) and pools(bm) == before
    bm.check_invariants([held, small, again])


def test_constructor_rejects_empty_pools() -> None:
    with pytest.raises(ValueError, match="num_device_blocks"):
        BlockManager(4, 0, 4)
    with pytest.raises(ValueError, match="num_host_blocks"):
        BlockManager(4, 4, -1)
    bm = BlockManager(4, 4, 0)  # no host pool is fine
    assert bm.host_usage == 0.0 and not bm.can_swap_out(prefilled(bm, 4))


def test_check_invariants_catches_lost_and_shared_blocks() -> None:
    bm = BlockManager(block_size=4, num_device_blocks=4, num_host_blocks=2, watermark=0.0)
    a = prefilled(bm, 4)
    b = prefilled(bm, 4)
    with pytest.raises(AssertionError, match="device blocks not conserved"):
        bm.check_invariants([a])  # b's block is neither free nor owned by a live seq
    b.block_table = list(a.block_table)  # two tables share one block
    with pytest.raises(AssertionError, match="device blocks not conserved"):
        bm.check_invariants([a, b])


# -- random operations ---------------------------------------------------------------


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate/append/swap/free; blocks are conserved and predicates tell
    the truth (an action succeeds exactly when its predicate says it can)."""

    def __init__(self) -> None:
        super().__init__()
        self.bm: BlockManager | None = None
        self.on_device: list[Sequence] = []
        self.on_host: list[Sequence] = []

    @precondition(lambda self: self.bm is None)
    @rule(
        block_size=st.sampled_from([1, 2, 4, 16]),
        device=st.integers(1, 24),
        host=st.integers(0, 24),
        watermark=st.sampled_from([0.0, 0.1, 0.25]),
    )
    def setup(self, block_size, device, host, watermark) -> None:
        self.bm = BlockManager(block_size, device, host, watermark)

    @precondition(lambda self: self.bm is not None)
    @rule(num_tokens=st.integers(1, 80), use_watermark=st.booleans())
    def allocate(self, num_tokens: int, use_watermark: bool) -> None:
        bm = self.bm
        seq = make_seq(num_tokens)
        before = pools(bm)
        can = bm.can_allocate(seq, use_watermark)
        fits = bm.blocks_for(num_tokens) <= bm.num_free_device_blocks
        assert bm.can_allocate(seq, use_watermark=False) == fits
        assert fits or not can  # the watermark only makes it stricter
        if fits:
            bm.allocate(seq)
            assert len(seq.block_table) == bm.blocks_for(num_tokens)
            if can:  # with the watermark, the reserve is still free afterwards
                assert bm.num_free_device_blocks >= (bm.watermark_blocks if use_watermark else 0)
            seq.num_computed_tokens = num_tokens
            self.on_device.append(seq)
        else:
            with pytest.raises(RuntimeError):
                bm.allocate(seq)
            assert pools(bm) == before and seq.block_table == []

    @precondition(lambda self: self.on_device)
    @rule(data=st.data(), n=st.integers(1, 40))
    def append(self, data, n: int) -> None:
        bm = self.bm
        seq = data.draw(st.sampled_from(self.on_device))
        before, table = pools(bm), list(seq.block_table)
        if bm.can_append(seq, n):
            bm.append_slots(seq, n)
            seq.num_computed_tokens += n
            assert seq.block_table[: len(table)] == table  # existing blocks stay put
            assert len(seq.block_table) == max(len(table), bm.blocks_for(seq.num_computed_tokens))
        else:
            with pytest.raises(RuntimeError):
                bm.append_slots(seq, n)
            assert pools(bm) == before and seq.block_table == table

    @precondition(lambda self: self.on_device)
    @rule(data=st.data())
    def swap_out(self, data) -> None:
        bm = self.bm
        seq = data.draw(st.sampled_from(self.on_device))
        before, table = pools(bm), list(seq.block_table)
        if bm.can_swap_out(seq):
            mapping = bm.swap_out(seq)
            assert [src for src, _ in mapping] == table
            assert [dst for _, dst in mapping] == seq.block_table
            assert bm.is_on_host(seq)
            self.on_device.remove(seq)
            self.on_host.append(seq)
        else:
            with pytest.raises(RuntimeError):
                bm.swap_out(seq)
            assert pools(bm) == before and seq.block_table == table

    @precondition(lambda self: self.on_host)
    @rule(data=st.data())
    def swap_in(self, data) -> None:
        bm = self.bm
        seq = data.draw(st.sampled_from(self.on_host))
        before, table = pools(bm), list(seq.block_table)
        can = bm.can_swap_in(seq, use_watermark=False)
        if len(table) <= bm.num_free_device_blocks:
            mapping = bm.swap_in(seq)
            assert [src for src, _ in mapping] == table
            assert [dst for _, dst in mapping] == seq.block_table
            assert not bm.is_on_host(seq)
            self.on_host.remove(seq)
            self.on_device.append(seq)
            if can:  # can_swap_in promises room for the next token too
                assert bm.can_append(seq, 1)
        else:
            assert not can
            with pytest.raises(RuntimeError):
                bm.swap_in(seq)
            assert pools(bm) == before and seq.block_table == table

    @precondition(lambda self: self.on_device or self.on_host)
    @rule(data=st.data())
    def free(self, data) -> None:
        seq = data.draw(st.sampled_from(self.on_device + self.on_host))
        self.bm.free(seq)
        assert seq.block_table == [] and not self.bm.is_on_host(seq)
        (self.on_device if seq in self.on_device else self.on_host).remove(seq)

    @invariant()
    def blocks_are_conserved(self) -> None:
        bm = self.bm
        if bm is None:
            return
        bm.check_invariants(self.on_device + self.on_host)
        device_owned = sum(len(s.block_table) for s in self.on_device)
        host_owned = sum(len(s.block_table) for s in self.on_host)
        assert device_owned + bm.num_free_device_blocks == bm.num_device_blocks
        assert host_owned + bm.num_free_host_blocks == bm.num_host_blocks
        assert all(bm.is_on_host(s) for s in self.on_host)
        assert not any(bm.is_on_host(s) for s in self.on_device)
        for seq in self.on_device:  # every computed token has its KV slot
            assert len(seq.block_table) * bm.block_size >= seq.num_computed_tokens


BlockManagerMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBlockManagerMachine = BlockManagerMachine.TestCase
