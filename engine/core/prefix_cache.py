"""Which device blocks hold which prefix: the prefix cache's index (vLLM V1's automatic
prefix caching), for the block manager (``engine.core.block_manager``). No tensors.

A full block is identified by its *key*: the serial of the content before it (0 for a
prompt's first block) and its token ids — a request-independent key, compared token for
token (a hit never returns a block whose content differs). A serial is given to a content
once and never reused.

The index holds **chains**: the run of blocks one request registered one after another.
Only a chain's first block (its *head*) is in a dictionary by key; every later block is
found through its chain (the block after block ``i`` is position ``i + 1``, whose tokens
the chain reads off the request's token lists when a lookup compares them). So a request
that shares nothing costs one dictionary entry, not one per block, and a block evicted
from the middle of a chain only cuts the chain there: the positions after it become
unreachable, as they would be in a per-block index (their key names an evicted parent).
A content is registered once: a request computing a content someone registered first
keeps its copy unregistered and follows the existing one.

A lookup may resume from the hits of an earlier lookup of the same tokens (a waiting
request ranked again each step: lpm, ``engine.core.sched.prefix_order``): while none of
those blocks has been forgotten since (evicted, or dropped unwritten), they are still the
same path from the first block (a content is registered once; a chain is cut only where
a block of it is forgotten), so only what follows them needs walking. Each forgotten block
records when (:attr:`PrefixCache.forgets`, a count), so that is checked per hit.

Evicted chains are kept as *ghosts* (their heads by key, as many blocks' worth as the
pool holds): a lookup that stops can say how many more of the request's blocks the cache
had held and evicted (cache thrash). The ghosts are a lower bound: a content computed
again after its eviction starts a new chain that the ghosts do not continue.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence as Seq
from typing import cast

from engine.core.eviction_queue import EvictionQueue
from engine.core.sequence import Sequence

#: A head's key: (the serial of the content before it, 0 for a first block; its tokens).
PrefixKey = tuple[int, tuple[int, ...]]
#: Content serials are a chain's number shifted left by this, plus the position: a chain
#: holds fewer than 2**24 blocks (a pool of 16M blocks), so serials never collide.
SERIAL_SHIFT = 24


class Chain:
    """Blocks one request registered in a row: position ``i`` holds the request's block
    ``first + i``, whose tokens are read off ``prompt`` and ``output`` (the request's
    own lists: its tokens never change, they are only appended to)."""

    __slots__ = ("prompt", "output", "first", "blocks", "valid", "head_key", "serial_base")

    def __init__(self, seq: Sequence, first: int, head_key: PrefixKey, number: int) -> None:
        #: position i's content serial is serial_base + i (unique: a chain's number
        #: shifted past any position a chain can have)
        self.serial_base = number << SERIAL_SHIFT
        self.prompt = seq.prompt_token_ids
        self.output = seq.output_token_ids
        self.first = first
        self.blocks: list[int] = []
        #: Positions still reachable: an eviction at position ``i`` cuts it to ``i``.
        self.valid = 0
        self.head_key = head_key

    def tokens(self, position: int, size: int) -> list[int]:
        return token_slice(self.prompt, self.output, self.first + position, size)


def token_slice(prompt: list[int], output: list[int], block: int, size: int) -> list[int]:
    """The tokens of block ``block`` of the sequence ``prompt + output``."""
    start, end = block * size, (block + 1) * size
    num_prompt = len(prompt)
    if end <= num_prompt:
        return prompt[start:end]
    if start >= num_prompt:
        return output[start - num_prompt : end - num_prompt]
    return prompt[start:] + output[: end - num_prompt]


def seq_tokens(seq: Sequence, block: int, size: int) -> list[int]:
    return token_slice(seq.prompt_token_ids, seq.output_token_ids, block, size)


class PrefixCache:
    """The index of registered device blocks (see the module docstring). The block
    manager owns the pools, the reference counts and the eviction queue; this says
    which block holds which prefix."""

    def __init__(self, block_size: int, num_device_blocks: int) -> None:
        self.block_size = block_size
        self.num_device_blocks = num_device_blocks
        #: block -> its chain (None: not registered) and its position there
        self.chain_of: list[Chain | None] = [None] * num_device_blocks
        self.index_of = [0] * num_device_blocks
        self.heads: dict[PrefixKey, int] = {}  # a chain head's key -> its block
        #: serials some head was registered after (a chain's end may have a child there)
        self.parents_of_heads: set[int] = set()
        self.num_chains = 0
        # chains whose head was evicted, by head key, oldest first; their blocks counted
        self.ghosts: OrderedDict[PrefixKey, Chain] = OrderedDict()
        self.ghost_blocks = 0
        #: Registered blocks forgotten so far (evicted, or dropped unwritten), and for each
        #: block that count just after it was last forgotten (0: never): a lookup taken
        #: when the count was ``n`` still holds while each of its hits reads <= ``n``.
        self.forgets = 0
        # (an array of C longs: storing a count makes no int object to free later)
        self.forgotten_at = array("q", bytes(8 * num_device_blocks))

    # -- reading ------------------------------------------------------------------------
    def is_registered(self, block: int) -> bool:
        return self.chain_of[block] is not None

    @property
    def num_registered(self) -> int:
        return sum(c is not None for c in self.chain_of)

    def serial(self, block: int) -> int:
        """A registered block's content serial."""
        chain = self.chain_of[block]
        assert chain is not None, f"block {block} is not registered"
        return chain.serial_base + self.index_of[block]

    def _head_key(self, parent: int, seq: Sequence, block: int) -> PrefixKey:
        return (parent, tuple(seq_tokens(seq, block, self.block_size)))

    def child(self, holder: int | None, serial: int, seq: Sequence, block: int) -> int | None:
        """The registered block holding ``seq``'s block ``block`` right after content
        ``serial`` (held by block ``holder`` when it still is; None for a first block),
        or None."""
        if holder is not None:
            chain = self.chain_of[holder]
            i = self.index_of[holder]
            if chain is not None and chain.serial_base + i == serial:
                if i + 1 < chain.valid:
                    size = self.block_size
                    same = chain.prompt is seq.prompt_token_ids and chain.first + i + 1 == block
                    if same or chain.tokens(i + 1, size) == seq_tokens(seq, block, size):
                        return chain.blocks[i + 1]
        if serial == 0 or serial in self.parents_of_heads:
            return self.heads.get(self._head_key(serial, seq, block))
        return None

    def lookup(self, seq: Sequence, limit: int) -> list[int]:
        """The blocks holding the longest run of ``seq``'s first ``limit`` blocks."""
        return self._walk(seq, limit, [])

    def lookup_again(self, seq: Sequence, limit: int, hits: Seq[int], since: int) -> list[int]:
        """:meth:`lookup`, given the ``hits`` an earlier lookup of ``seq``'s same tokens
        found when :attr:`forgets` was ``since``: they are kept, and only what follows
        them walked, unless one of them has been forgotten since (then a whole lookup)."""
        if hits and max(map(self.forgotten_at.__getitem__, hits)) > since:
            return self._walk(seq, limit, [])
        return self._walk(seq, limit, list(hits[:limit]))

    def _walk(self, seq: Sequence, limit: int, hits: list[int]) -> list[int]:
        """``hits`` (a valid run from ``seq``'s first block) extended as far as it goes."""
        holder: int | None = None
        serial = 0
        if hits:
            holder = hits[-1]
            serial = self.serial(holder)
        for block in range(len(hits), limit):
            found = self.child(holder, serial, seq, block)
            if found is None:
                break
            hits.append(found)
            holder = found
            serial = self.serial(found)
        return hits

    def evicted_after(self, seq: Sequence, hits: Seq[int], limit: int) -> int:
        """How many of ``seq``'s blocks after ``hits`` (up to ``limit``) an evicted
        chain held: the rest of the last hit's cut chain, or a ghost chain (whose head
        was evicted) that starts where the hits end."""
        size = self.block_size
        start = len(hits)
        if start >= limit:
            return 0
        chain: Chain | None = None
        position = 0
        if hits:
            chain = self.chain_of[hits[-1]]
            if chain is not None:
                position = self.index_of[hits[-1]] + 1
                if position < chain.valid or position >= len(chain.blocks):
                    chain = None  # a live continuation differs, or the chain ends there
        if chain is None and self.ghosts:
            parent = self.serial(hits[-1]) if hits else 0
            chain = self.ghosts.get(self._head_key(parent, seq, start))
            position = 0
        if chain is None:
            return 0
        found = 0
        block = start
        while block < limit and position < len(chain.blocks):
            if chain.tokens(position, size) != seq_tokens(seq, block, size):
                break
            found += 1
            block += 1
            position += 1
        return found

    # -- registering ----------------------------------------------------------------------
    def register(self, seq: Sequence, full: int) -> None:
        """Register ``seq``'s blocks ``seq.num_registered_blocks`` .. ``full - 1`` (its
        block table's), following contents registered already."""
        table = seq.block_table
        block = seq.num_registered_blocks
        serial, holder = seq.chain_serial, seq.chain_block
        chain = cast("Chain | None", seq.chain)
        if (
            chain is not None
            and block > 0
            and holder == table[block - 1]
            and chain.valid == len(chain.blocks)
            and chain.blocks
            and chain.blocks[-1] == holder
            and serial not in self.parents_of_heads
        ):
            # The request extends its own chain: nobody can hold these contents (their
            # parent is its own fresh serial, which no head follows).
            self._extend(chain, table[block:full])
        else:
            while block < full:  # contents registered already: follow them
                found = self.child(holder, serial, seq, block)
                if found is None:
                    break
                holder, serial = found, self.serial(found)
                block += 1
            chain = None
            if block < full:
                key = self._head_key(serial, seq, block)
                self.num_chains += 1
                chain = Chain(seq, block, key, self.num_chains)
                self.heads[key] = table[block]
                if serial:
                    self.parents_of_heads.add(serial)
                self._extend(chain, table[block:full])
        if chain is not None:
            holder = chain.blocks[-1]
            serial = chain.serial_base + len(chain.blocks) - 1
        seq.chain = chain
        seq.num_registered_blocks = full
        seq.chain_serial = serial
        seq.chain_block = holder

    def _extend(self, chain: Chain, blocks: list[int]) -> None:
        chain_of, index_of = self.chain_of, self.index_of
        i = len(chain.blocks)
        for block in blocks:  # (a plain loop: faster than map() for a chain's dozen blocks)
            chain_of[block] = chain
            index_of[block] = i
            i += 1
        chain.blocks += blocks
        chain.valid = i

    def forget(self, block: int, evicted: bool) -> None:
        """``block`` no longer holds its content (evicted to be reused, or its KV was
        never written): its chain is cut there; an evicted head's chain becomes a ghost."""
        chain = self.chain_of[block]
        if chain is None:
            return
        self.chain_of[block] = None
        self.forgets += 1
        self.forgotten_at[block] = self.forgets
        i = self.index_of[block]
        if i < chain.valid:
            chain.valid = i
        if i == 0:
            del self.heads[chain.head_key]
            if evicted:
                self._ghost(chain)

    def evict(self, queue: EvictionQueue, n: int) -> list[int]:
        """Take ``n`` blocks from the eviction ``queue``'s head, each :meth:`forget`-ten
        as evicted (inlined: the hot path of a full pool). The queue gives them as runs
        of a chain's positions, top down, so a chain is cut and a head found per run."""
        chain_of, forgotten_at, forgets = self.chain_of, self.forgotten_at, self.forgets
        taken: list[int] = []
        for chain, lo, hi in queue.pop(n):
            assert isinstance(chain, Chain)
            run = chain.blocks[lo:hi]
            run.reverse()
            for block in run:
                chain_of[block] = None
                forgets += 1
                forgotten_at[block] = forgets
            taken += run
            if lo < chain.valid:
                chain.valid = lo
            if lo == 0:
                del self.heads[chain.head_key]
                self._ghost(chain)
        self.forgets = forgets
        return taken

    def _ghost(self, chain: Chain) -> None:
        ghosts = self.ghosts
        ghosts[chain.head_key] = chain
        self.ghost_blocks += len(chain.blocks)
        while self.ghost_blocks > self.num_device_blocks and len(ghosts) > 1:
            _, oldest = ghosts.popitem(last=False)
            self.ghost_blocks -= len(oldest.blocks)

    # -- checking ---------------------------------------------------------------------------
    def key_of(self, block: int) -> PrefixKey | None:
        """A registered block's key (its parent's serial and its tokens), else None."""
        chain = self.chain_of[block]
        if chain is None:
            return None
        i = self.index_of[block]
        if i == 0:
            return chain.head_key
        return (chain.serial_base + i - 1, tuple(chain.tokens(i, self.block_size)))

    def check(self) -> None:
        """Raise AssertionError unless every head's key maps to its chain's first block,
        every registered block is where its chain says, and no two reachable blocks hold
        the same key."""
        for key, block in self.heads.items():
            chain = self.chain_of[block]
            if chain is None or self.index_of[block] != 0 or chain.head_key != key:
                raise AssertionError(f"head key of block {block} does not match its chain")
        reachable: dict[PrefixKey, int] = {}
        for block in range(self.num_device_blocks):
            chain = self.chain_of[block]
            if chain is None:
                continue
            i = self.index_of[block]
            if i >= len(chain.blocks) or chain.blocks[i] != block:
                raise AssertionError(f"block {block} is not at its chain's position {i}")
            if i < chain.valid and chain.head_key in self.heads:
                block_key = self.key_of(block)
                assert block_key is not None
                if block_key in reachable:
                    raise AssertionError(f"blocks {reachable[block_key]} and {block} hold one key")
                reachable[block_key] = block
