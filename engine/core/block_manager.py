"""KV block bookkeeping: a device pool and a host (swap) pool. No tensors.

Memory API as predicate/action pairs: the scheduler asks ``can_*`` and then calls
the action, which must succeed. Actions that move blocks return the
``(source, destination)`` block-id pairs the model runner has to copy.

Invariant (checked by :meth:`check_invariants` and by the property tests): in each
pool, every block is either free or in exactly one sequence's block table.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.core.sequence import Sequence

BlockMapping = list[tuple[int, int]]


class BlockManager:
    def __init__(
        self,
        block_size: int,
        num_device_blocks: int,
        num_host_blocks: int,
        watermark: float = 0.01,
    ) -> None:
        if num_device_blocks < 1:
            raise ValueError(f"num_device_blocks must be >= 1, got {num_device_blocks}")
        if num_host_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {num_host_blocks}")
        self.block_size = block_size
        self.num_device_blocks = num_device_blocks
        self.num_host_blocks = num_host_blocks
        # Blocks kept free when admitting new work so running requests can still grow.
        self.watermark_blocks = int(watermark * num_device_blocks)
        # Free lists used as stacks: the most recently freed block is reused first,
        # which keeps allocation O(1) and deterministic.
        self._free_device: list[int] = list(range(num_device_blocks - 1, -1, -1))
        self._free_host: list[int] = list(range(num_host_blocks - 1, -1, -1))
        self._on_host: set[int] = set()  # seq_no of sequences whose blocks are on the host

    # -- counts --------------------------------------------------------------------
    @property
    def num_free_device_blocks(self) -> int:
        return len(self._free_device)

    @property
    def free_device_blocks(self) -> list[int]:
        """The free device block ids (read only: its length is the free count, for a
        caller that reads it every step)."""
        return self._free_device

    @property
    def num_free_host_blocks(self) -> int:
        return len(self._free_host)

    @property
    def device_usage(self) -> float:
        """Fraction of device blocks in use (vLLM's ``gpu_cache_usage_perc``)."""
        return 1.0 - len(self._free_device) / self.num_device_blocks

    @property
    def host_usage(self) -> float:
        if self.num_host_blocks == 0:
            return 0.0
        return 1.0 - len(self._free_host) / self.num_host_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens of KV."""
        return -(-num_tokens // self.block_size)

    def is_on_host(self, seq: Sequence) -> bool:
        return seq.seq_no in self._on_host

    # -- allocation of a (re)admitted request ----------------------------------------
    def can_allocate(self, seq: Sequence, use_watermark: bool = True) -> bool:
        """Room for the blocks of all of ``seq``'s tokens (its whole prefill)."""
        needed = self.blocks_for(seq.num_tokens) - len(seq.block_table)
        reserve = self.watermark_blocks if use_watermark else 0
        return len(self._free_device) - needed >= reserve

    def allocate(self, seq: Sequence) -> None:
        self._grow(seq, seq.num_tokens)

    # -- growth of a running request -------------------------------------------------
    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """Room for the KV of ``num_new_tokens`` more computed tokens of ``seq``."""
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return needed <= len(self._free_device)

    def append_slots(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        self._grow(seq, seq.num_computed_tokens + num_new_tokens)

    def append_blocks(self, seqs: list[Sequence]) -> None:
        """One more device block for each of ``seqs``, in order (decodes crossing a
        block boundary together: the simulator's decode runs). The caller has checked
        that ``len(seqs)`` blocks are free."""
        free = self._free_device
        if len(seqs) > len(free):
            raise RuntimeError(f"out of device blocks: need {len(seqs)}, free {len(free)}")
        for seq in seqs:
            seq.block_table.append(free.pop())

    def _grow(self, seq: Sequence, num_tokens: int) -> None:
        table = seq.block_table
        needed = self.blocks_for(num_tokens) - len(table)
        if needed > len(self._free_device):
            raise RuntimeError(
                f"out of device blocks for {seq.request_id}: need {needed}, "
                f"free {len(self._free_device)} (call can_allocate/can_append first)"
            )
        if needed > 0:
            # What ``needed`` pops would take, in the order they would take it.
            free = self._free_device
            table.extend(reversed(free[-needed:]))
            del free[-needed:]

    # -- swap ----------------------------------------------------------------------
    def can_swap_out(self, seq: Sequence) -> bool:
        return len(seq.block_table) <= len(self._free_host)

    def swap_out(self, seq: Sequence) -> BlockMapping:
        """Move ``seq``'s blocks to the host pool; returns (device, host) pairs."""
        if not self.can_swap_out(seq):
            raise RuntimeError(f"host pool cannot hold {seq.request_id}'s blocks")
        mapping = [(block, self._free_host.pop()) for block in seq.block_table]
        self._free_device.extend(reversed(seq.block_table))
        seq.block_table = [host for _, host in mapping]
        self._on_host.add(seq.seq_no)
        return mapping

    def can_swap_in(self, seq: Sequence, use_watermark: bool = True) -> bool:
        # The request will decode right after: count the block its next token needs.
        needed = max(self.blocks_for(seq.num_computed_tokens + 1), len(seq.block_table))
        reserve = self.watermark_blocks if use_watermark else 0
        return len(self._free_device) - needed >= reserve

    def swap_in(self, seq: Sequence) -> BlockMapping:
        """Move ``seq``'s blocks back to the device pool; returns (host, device) pairs."""
        if len(seq.block_table) > len(self._free_device):
            raise RuntimeError(f"device pool cannot hold {seq.request_id}'s blocks")
        mapping = [(block, self._free_device.pop()) for block in seq.block_table]
        self._free_host.extend(reversed(seq.block_table))
        seq.block_table = [device for _, device in mapping]
        self._on_host.discard(seq.seq_no)
        return mapping

    # -- release -------------------------------------------------------------------
    def free(self, seq: Sequence) -> None:
        """Return all of ``seq``'s blocks to the pool they are in."""
        if not seq.block_table:
            self._on_host.discard(seq.seq_no)
            return
        if seq.seq_no in self._on_host:
            self._free_host.extend(reversed(seq.block_table))
            self._on_host.discard(seq.seq_no)
        else:
            self._free_device.extend(reversed(seq.block_table))
        seq.block_table = []

    # -- checking --------------------------------------------------------------------
    def check_invariants(self, live: Iterable[Sequence]) -> None:
        """Raise AssertionError unless every block is free or owned exactly once."""
        device_owned: list[int] = []
        host_owned: list[int] = []
        for seq in live:
            (host_owned if seq.seq_no in self._on_host else device_owned).extend(seq.block_table)
        for name, owned, free, total in (
            ("device", device_owned, self._free_device, self.num_device_blocks),
            ("host", host_owned, self._free_host, self.num_host_blocks),
        ):
            everything = owned + free
            if len(everything) != total or set(everything) != set(range(total)):
                raise AssertionError(
                    f"{name} blocks not conserved: {len(owned)} owned + {len(free)} free "
                    f"!= {total} (or duplicated/unknown ids)"
                )
