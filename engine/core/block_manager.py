"""KV block bookkeeping: a device pool and a host (swap) pool. No tensors.

Memory API as predicate/action pairs: the scheduler asks ``can_*`` and then calls
the action, which must succeed. Actions that move blocks return the
``(source, destination)`` block-id pairs the model runner has to copy.

**Prefix caching** (``enable_prefix_caching``, vLLM V1's automatic prefix caching): a
full device block is identified by its *key*, the serial of the content before it and
its token ids (a request-independent key, compared token for token; the index is
``engine.core.prefix_cache``). Registered blocks are found by later requests:
:meth:`lookup` returns the longest run of cached full blocks of a request's tokens
(never its last token: that one is always computed, as in vLLM), and :meth:`allocate`
takes them by reference. A block freed by a finished or preempted request stays
registered and joins the *eviction queue*, least recently freed first (a request's
blocks are freed tail first, so its prefix outlives its suffix); an allocation takes
truly free blocks first and then evicts from the queue's head, unregistering it. A block
taken back from the queue by a hit leaves the queue. (The queue keeps runs of a chain's
blocks, not single blocks: ``engine.core.eviction_queue``.) When two requests compute the same
content at once, the first to register it owns it; the other's copy stays unregistered
(freed straight to the free list).

Prompt blocks are registered when the step that computes them is scheduled (so a
request admitted later in the same step hits them: the executor writes every new
token's KV before any attention reads the cache); blocks filled by decoding are
registered when the request frees them (finish, preemption, swap-out): until then only
a prompt that contains this request's own output could hit them.

Swap (a vLLM V0 mode; vLLM V1 recomputes only): a swapped-out request's device blocks
are released like freed ones (its full blocks registered first, so what others share
stays cached and consistent: a shared block is only ever read), its copy travels to the
host pool, and swap-in gives it fresh, unregistered device blocks (registered again when
it frees them). The host pool caches nothing.

Invariants (checked by :meth:`check_invariants` and by the property tests): in each
pool every block is free, or (device) cached and evictable, or held; a device block's
reference count is the number of block tables holding it; no key is held by two
reachable blocks (``PrefixCache.check``).
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq

from engine.core.eviction_queue import EvictionQueue
from engine.core.prefix_cache import PrefixCache
from engine.core.sequence import Sequence

BlockMapping = list[tuple[int, int]]


class BlockManager:
    def __init__(
        self,
        block_size: int,
        num_device_blocks: int,
        num_host_blocks: int,
        watermark: float = 0.01,
        enable_prefix_caching: bool = False,
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
        self.enable_prefix_caching = enable_prefix_caching
        # Prefix caching only (all unused when it is off):
        self._refs = [0] * num_device_blocks  # block tables holding each device block
        self.cache = PrefixCache(block_size, num_device_blocks)
        # Registered blocks nobody holds, least recently freed first (runs of a chain's
        # positions: O(1) per run freed or evicted, O(1) removal of a hit).
        self._evictable = EvictionQueue()
        #: Cached blocks evicted so far (their key dropped to reuse the block).
        self.num_evicted_blocks = 0

    # -- counts --------------------------------------------------------------------
    @property
    def num_free_device_blocks(self) -> int:
        """Blocks an allocation can take: truly free ones and cached ones nobody holds
        (vLLM counts both as free)."""
        return len(self._free_device) + len(self._evictable)

    @property
    def free_pools(self) -> tuple[list[int], EvictionQueue]:
        """The truly free blocks and the evictable cached ones (read only: the sum of
        their lengths is the free count, for a caller that reads it every step)."""
        return self._free_device, self._evictable

    @property
    def num_cached_blocks(self) -> int:
        """Registered blocks (held or evictable). O(pool): for tests and reports."""
        return self.cache.num_registered

    @property
    def num_free_host_blocks(self) -> int:
        return len(self._free_host)

    @property
    def device_usage(self) -> float:
        """Fraction of device blocks in use (vLLM's ``gpu_cache_usage_perc``): held by a
        request; a cached block nobody holds counts as free, as in vLLM."""
        return 1.0 - self.num_free_device_blocks / self.num_device_blocks

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

    # -- prefix cache lookups -----------------------------------------------------------
    def lookup(self, seq: Sequence) -> list[int]:
        """The device blocks holding the longest cached run of ``seq``'s full blocks, from
        its first token, never including its last token (always computed). Empty when
        prefix caching is off. No side effect."""
        if not self.enable_prefix_caching:
            return []
        limit = (seq.num_tokens - 1) // self.block_size
        return self.cache.lookup(seq, limit) if limit > 0 else []

    @property
    def num_forgotten_blocks(self) -> int:
        """Cached blocks whose content was dropped so far (evicted, or never written): what
        :meth:`lookup_again` needs of the moment of an earlier lookup."""
        return self.cache.forgets

    def lookup_again(self, seq: Sequence, hits: Seq[int], since: int) -> list[int]:
        """:meth:`lookup`, given the ``hits`` an earlier lookup of ``seq`` found when
        :attr:`num_forgotten_blocks` was ``since`` (``seq``'s tokens unchanged since):
        it walks on from them unless one of them has been evicted since, so a waiting
        request looked up again each step costs what its cache changed."""
        if not self.enable_prefix_caching:
            return []
        limit = (seq.num_tokens - 1) // self.block_size
        return self.cache.lookup_again(seq, limit, hits, since) if limit > 0 else []

    def evicted_prefix(self, seq: Sequence, cached: Seq[int]) -> int:
        """Tokens of ``seq`` just after its hits ``cached`` (from :meth:`lookup`) that the
        cache had held and evicted (``PrefixCache.evicted_after``): they would have been
        hits with room to keep them. A lower bound."""
        if not self.enable_prefix_caching:
            return 0
        limit = (seq.num_tokens - 1) // self.block_size
        return self.cache.evicted_after(seq, cached, limit) * self.block_size

    def register(self, seq: Sequence, num_tokens: int) -> None:
        """Register ``seq``'s full blocks among its first ``num_tokens`` tokens (those
        whose KV is computed, or being computed by the step being built). A content
        already registered keeps its block; ``seq``'s copy stays unregistered."""
        if not self.enable_prefix_caching:
            return
        full = min(num_tokens // self.block_size, len(seq.block_table))
        if seq.num_registered_blocks < full:
            self.cache.register(seq, full)

    # -- allocation of a (re)admitted request ----------------------------------------
    def blocks_needed(self, seq: Sequence, cached: Seq[int] = ()) -> int:
        """Free blocks admitting ``seq`` with its prefix hits ``cached`` takes: new
        blocks for its uncached tokens, plus each hit that sits in the eviction queue."""
        needed = self.blocks_for(seq.num_tokens) - len(seq.block_table) - len(cached)
        if cached:
            refs = self._refs
            needed += sum(1 for block in cached if not refs[block])
        return needed

    def can_allocate(
        self, seq: Sequence, use_watermark: bool = True, cached: Seq[int] = ()
    ) -> bool:
        """Room for the blocks of all of ``seq``'s tokens (its whole prefill), its prefix
        hits ``cached`` (from :meth:`lookup`) taken by reference."""
        reserve = self.watermark_blocks if use_watermark else 0
        return self.num_free_device_blocks - self.blocks_needed(seq, cached) >= reserve

    def allocate(self, seq: Sequence, cached: Seq[int] = ()) -> None:
        """Give waiting ``seq`` blocks for all its tokens: its prefix hits ``cached``
        (from :meth:`lookup`, in order) by reference, new blocks for the rest. The caller
        counts the hits' tokens as computed."""
        if cached:
            refs, evictable = self._refs, self._evictable
            chain_of, index_of = self.cache.chain_of, self.cache.index_of
            for block in cached:
                if not refs[block]:
                    chain = chain_of[block]
                    assert chain is not None  # a hit is registered
                    evictable.take_back(chain, index_of[block])
                refs[block] += 1
            seq.block_table = list(cached)
            seq.num_registered_blocks = len(cached)
            self.cache.follow(seq, self.cache.serial(cached[-1]))
            seq.chain_block = cached[-1]
        else:
            seq.num_registered_blocks = 0
            self.cache.unfollow(seq)
            seq.chain_block = None
        seq.chain = None
        self._grow(seq, seq.num_tokens)

    def release_count(self, cached: Seq[int] = ()) -> ReleaseCount:
        """A tally of what releasing some block tables would free (a preemption's
        victims, before they are preempted), for admitting a request whose prefix hits
        are ``cached``."""
        return ReleaseCount(self, cached)

    # -- growth of a running request -------------------------------------------------
    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """Room for the KV of ``num_new_tokens`` more computed tokens of ``seq``."""
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return needed <= self.num_free_device_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        self._grow(seq, seq.num_computed_tokens + num_new_tokens)

    def append_blocks(self, seqs: list[Sequence]) -> None:
        """One more device block for each of ``seqs``, in order (decodes crossing a
        block boundary together: the simulator's decode runs). The caller has checked
        that ``len(seqs)`` blocks are free."""
        free = self._free_device
        if len(seqs) > self.num_free_device_blocks:
            raise RuntimeError(
                f"out of device blocks: need {len(seqs)}, free {self.num_free_device_blocks}"
            )
        if not self.enable_prefix_caching:
            for seq in seqs:
                seq.block_table.append(free.pop())
            return
        # What one pop each would take, in order: the free list's, then evictions.
        for seq, block in zip(seqs, self._take(len(seqs)), strict=True):
            seq.block_table.append(block)

    def _grow(self, seq: Sequence, num_tokens: int) -> None:
        table = seq.block_table
        needed = self.blocks_for(num_tokens) - len(table)
        if needed > self.num_free_device_blocks:
            raise RuntimeError(
                f"out of device blocks for {seq.request_id}: need {needed}, "
                f"free {self.num_free_device_blocks} (call can_allocate/can_append first)"
            )
        if needed > 0:
            table.extend(self._take(needed))

    def _take(self, n: int) -> list[int]:
        """``n`` device blocks (the caller checked they exist): truly free ones first, the
        most recently freed first (O(1) and deterministic), then cached ones from the
        eviction queue's head, their keys dropped."""
        free = self._free_device
        k = min(n, len(free))
        taken = free[len(free) - k :]
        taken.reverse()  # what ``k`` pops would take, in the order they would take it
        del free[len(free) - k :]
        if self.enable_prefix_caching:
            if k < n:
                taken += self.cache.evict(self._evictable, n - k)
                self.num_evicted_blocks += n - k
            refs = self._refs
            for block in taken:
                refs[block] = 1
        return taken

    def _release(self, table: list[int], keep_cached: bool = True) -> None:
        """Drop one reference to each device block of ``table``, tail first; a block
        nobody holds any more joins the eviction queue if registered (and
        ``keep_cached``), else the free list. The queue takes the registered ones as
        runs: consecutive blocks of one chain, positions going down."""
        if not self.enable_prefix_caching:
            self._free_device.extend(reversed(table))
            return
        refs, evictable, free = self._refs, self._evictable, self._free_device
        chain_of, index_of, forget = self.cache.chain_of, self.cache.index_of, self.cache.forget
        run_chain = None  # the run being gathered: its chain, lowest and highest + 1
        run_lo = run_hi = 0
        for block in reversed(table):
            held = refs[block] - 1
            refs[block] = held
            if held:
                continue
            chain = chain_of[block]
            if keep_cached and chain is not None:
                position = index_of[block]
                if chain is run_chain and position == run_lo - 1:
                    run_lo = position
                    continue
                if run_chain is not None:
                    evictable.push(run_chain, run_lo, run_hi)
                run_chain, run_lo, run_hi = chain, position, position + 1
            else:
                if chain is not None:
                    forget(block, False)
                free.append(block)
        if run_chain is not None:
            evictable.push(run_chain, run_lo, run_hi)

    # -- swap ----------------------------------------------------------------------
    def can_swap_out(self, seq: Sequence) -> bool:
        return len(seq.block_table) <= len(self._free_host)

    def swap_out(self, seq: Sequence) -> BlockMapping:
        """Move ``seq``'s blocks to the host pool; returns (device, host) pairs."""
        if not self.can_swap_out(seq):
            raise RuntimeError(f"host pool cannot hold {seq.request_id}'s blocks")
        self.register(seq, seq.num_computed_tokens)
        mapping = [(block, self._free_host.pop()) for block in seq.block_table]
        self._release(seq.block_table)
        seq.block_table = [host for _, host in mapping]
        seq.num_registered_blocks = 0  # its device copy will be a fresh, unregistered one
        self.cache.unfollow(seq)
        seq.chain_block = None
        seq.chain = None
        self._on_host.add(seq.seq_no)
        return mapping

    def can_swap_in(self, seq: Sequence, use_watermark: bool = True) -> bool:
        # The request will decode right after: count the block its next token needs.
        needed = max(self.blocks_for(seq.num_computed_tokens + 1), len(seq.block_table))
        reserve = self.watermark_blocks if use_watermark else 0
        return self.num_free_device_blocks - needed >= reserve

    def swap_in(self, seq: Sequence) -> BlockMapping:
        """Move ``seq``'s blocks back to the device pool; returns (host, device) pairs."""
        if len(seq.block_table) > self.num_free_device_blocks:
            raise RuntimeError(f"device pool cannot hold {seq.request_id}'s blocks")
        mapping = list(zip(seq.block_table, self._take(len(seq.block_table)), strict=True))
        self._free_host.extend(reversed(seq.block_table))
        seq.block_table = [device for _, device in mapping]
        self._on_host.discard(seq.seq_no)
        return mapping

    # -- release -------------------------------------------------------------------
    def free(self, seq: Sequence, keep_cached: bool = True) -> None:
        """Return all of ``seq``'s blocks to the pool they are in. On the device, its full
        computed blocks are registered first and stay cached while nobody needs the
        room; ``keep_cached=False`` (a failed step: its KV may never have been written)
        registers nothing and drops the keys of the blocks it frees."""
        if not seq.block_table:
            self._on_host.discard(seq.seq_no)
            return
        if seq.seq_no in self._on_host:
            self._free_host.extend(reversed(seq.block_table))
            self._on_host.discard(seq.seq_no)
        else:
            if keep_cached:
                self.register(seq, seq.num_computed_tokens)
            self._release(seq.block_table, keep_cached)
            self.cache.unfollow(seq)
            seq.chain = None  # it extends no chain any more (a re-admission starts anew)
        seq.block_table = []

    # -- checking --------------------------------------------------------------------
    def check_invariants(self, live: Iterable[Sequence]) -> None:
        """Raise AssertionError unless every block is free, cached and evictable, or held
        (by exactly one sequence without prefix caching; by as many as its reference
        count with it), and every registered block is the one its key maps to."""
        device_owned: list[int] = []
        host_owned: list[int] = []
        followers: dict[int, int] = {}  # id(chain) -> requests pinning it
        for seq in live:
            (host_owned if seq.seq_no in self._on_host else device_owned).extend(seq.block_table)
            if seq.chain_pin is not None:
                followers[id(seq.chain_pin)] = followers.get(id(seq.chain_pin), 0) + 1
        if self.enable_prefix_caching:
            self._check_prefix_cache(device_owned, followers)
            device_owned = sorted(set(device_owned))
        for name, owned, free, total in (
            (
                "device",
                device_owned,
                self._free_device + list(self._evictable),
                self.num_device_blocks,
            ),
            ("host", host_owned, self._free_host, self.num_host_blocks),
        ):
            everything = owned + free
            if len(everything) != total or set(everything) != set(range(total)):
                raise AssertionError(
                    f"{name} blocks not conserved: {len(owned)} owned + {len(free)} free "
                    f"!= {total} (or duplicated/unknown ids)"
                )

    def _check_prefix_cache(self, device_owned: list[int], followers: dict[int, int]) -> None:
        holders: dict[int, int] = {}
        for block in device_owned:
            holders[block] = holders.get(block, 0) + 1
        for block in range(self.num_device_blocks):
            if self._refs[block] != holders.get(block, 0):
                raise AssertionError(
                    f"block {block}: reference count {self._refs[block]} but "
                    f"{holders.get(block, 0)} block tables hold it"
                )
        self.cache.check(followers)
        self._evictable.check()
        for block in self._evictable:
            if self._refs[block] or not self.cache.is_registered(block):
                raise AssertionError(f"evictable block {block} is held or unregistered")
        for block in self._free_device:
            if self._refs[block] or self.cache.is_registered(block):
                raise AssertionError(f"free block {block} is held or registered")


class ReleaseCount:
    """What releasing block tables one by one would free: :meth:`add` returns the blocks
    it frees (nobody else holds them) and how many of those are the admitted request's
    prefix hits, which it would then take back out of the eviction queue."""

    def __init__(self, manager: BlockManager, cached: Seq[int]) -> None:
        self.manager = manager
        self.cached = set(cached)
        self.drops: dict[int, int] = {}

    def add(self, table: list[int]) -> tuple[int, int]:
        manager = self.manager
        if not manager.enable_prefix_caching:
            return len(table), 0
        refs, drops = manager._refs, self.drops
        freed = taken_back = 0
        for block in table:
            dropped = drops.get(block, 0) + 1
            drops[block] = dropped
            if refs[block] == dropped:
                freed += 1
                taken_back += block in self.cached
        return freed, taken_back
