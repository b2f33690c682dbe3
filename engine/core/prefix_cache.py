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
that shares nothing costs one dictionary entry, not one per block.
A content is registered once: a request computing a content someone registered first
keeps its copy unregistered and follows the existing one.

A serial names a *content*, not a block, as vLLM's chained hash does: a position whose
block was evicted is a hole that the next request computing that content fills again
(its block takes the position, and so the serial), so whatever still hangs off the
content — the chain's later positions, other chains' heads — is reachable again, exactly
when a per-block index keyed by whole prefixes would find it. (A request that followed
someone else's block holds its own copy, not that block: a chain's head can outlive its
parent's block.) A chain is kept while it holds a registered block, a kept chain hangs
off it, or a request's next block may (the request follows one of its contents:
:meth:`PrefixCache.follow`) — :attr:`Chain.pins`; kept chains are found by number
(a serial's upper bits, :attr:`PrefixCache.chains`), and a kept chain whose head was
evicted by its head key too (:attr:`PrefixCache.dead_heads`).

A lookup may resume from the hits of an earlier lookup of the same tokens (a waiting
request ranked again each step: lpm, ``engine.core.sched.prefix_order``): while none of
those blocks has been forgotten since (evicted, or dropped unwritten), they are still the
same path from the first block (a content is registered once; a chain is cut only where
a block of it is forgotten), so only what follows them needs walking. Each forgotten block
records when (:attr:`PrefixCache.forgets`, a count), so that is checked per hit.

Evicted chains are kept as *ghosts* (their heads by key, as many blocks' worth as the
pool holds): a lookup that stops can say how many more of the request's blocks the cache
had held and evicted (cache thrash), walking on through the chains that follow those
contents. A lower bound: a ghost dropped for room, or a chain dropped with its last
block, is no longer walked.
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
POSITION_MASK = (1 << SERIAL_SHIFT) - 1


class Chain:
    """Blocks one request registered in a row: position ``i`` holds the request's block
    ``first + i``, whose tokens are read off ``prompt`` and ``output`` (the request's
    own lists: its tokens never change, they are only appended to)."""

    __slots__ = (
        "prompt",
        "output",
        "first",
        "blocks",
        "pins",
        "parent",
        "head_key",
        "number",
        "serial_base",
    )

    def __init__(
        self, seq: Sequence, first: int, head_key: PrefixKey, number: int, parent: Chain | None
    ) -> None:
        #: position i's content serial is serial_base + i (unique: a chain's number
        #: shifted past any position a chain can have)
        self.number = number
        self.serial_base = number << SERIAL_SHIFT
        self.prompt = seq.prompt_token_ids
        self.output = seq.output_token_ids
        self.first = first
        #: position i's block (a position whose block was forgotten keeps the stale id:
        #: it is live while that block is registered here, at i)
        self.blocks: list[int] = []
        #: its registered blocks, the kept chains whose head follows one of its
        #: contents and the requests following one: while > 0 the chain is kept, its
        #: holes fillable
        self.pins = 0
        #: the chain holding the content its head follows (None: a first block, or that
        #: chain is no longer known)
        self.parent = parent
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
        self.chains: dict[int, Chain] = {}  # kept chains by number
        #: kept chains whose head was forgotten, by head key: a request computing that
        #: content fills the head again (see the module docstring)
        self.dead_heads: dict[PrefixKey, Chain] = {}
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

    def child(self, serial: int, seq: Sequence, block: int) -> int | None:
        """The registered block holding ``seq``'s block ``block`` right after content
        ``serial`` (0 for a first block), or None."""
        if serial:
            chain = self.chains.get(serial >> SERIAL_SHIFT)
            if chain is not None:
                i = (serial & POSITION_MASK) + 1
                blocks = chain.blocks
                if i < len(blocks):
                    found = blocks[i]
                    if self.chain_of[found] is chain and self.index_of[found] == i:
                        size = self.block_size
                        same = chain.prompt is seq.prompt_token_ids and chain.first + i == block
                        if same or chain.tokens(i, size) == seq_tokens(seq, block, size):
                            return found
            if serial not in self.parents_of_heads:
                return None
        return self.heads.get(self._head_key(serial, seq, block))

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
        serial = self.serial(hits[-1]) if hits else 0
        for block in range(len(hits), limit):
            found = self.child(serial, seq, block)
            if found is None:
                break
            hits.append(found)
            serial = self.serial(found)
        return hits

    def evicted_after(self, seq: Sequence, hits: Seq[int], limit: int) -> int:
        """How many of ``seq``'s blocks after ``hits`` (up to ``limit``) the cache had
        held and evicted, or holds past an evicted one: they would have been hits with
        room. Walked through the contents the index still knows — the positions of the
        last hit's chain, then chains that follow a content (live, kept or ghost heads)."""
        size = self.block_size
        block = len(hits)
        if block >= limit:
            return 0
        chain: Chain | None = None
        position = serial = 0
        if hits:
            chain = self.chain_of[hits[-1]]
            position = self.index_of[hits[-1]]
            serial = self.serial(hits[-1])
        elif not self.ghosts and not self.dead_heads:
            return 0
        while block < limit:
            tokens = seq_tokens(seq, block, size)
            if (
                chain is not None
                and position + 1 < len(chain.blocks)
                and chain.tokens(position + 1, size) == tokens
            ):
                position += 1
            elif serial == 0 or serial in self.parents_of_heads:
                key = (serial, tuple(tokens))
                head = self.heads.get(key)
                chain = self.dead_heads.get(key) or self.ghosts.get(key)
                if chain is None and head is not None:
                    chain = self.chain_of[head]
                if chain is None:
                    break
                position = 0
            else:
                break
            serial = chain.serial_base + position
            block += 1
        return block - len(hits)

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
            and chain.blocks
            and chain.blocks[-1] == holder
            and self.chain_of[holder] is chain
            and serial not in self.parents_of_heads
        ):
            # The request extends its own chain: nobody can hold these contents (their
            # parent is its own fresh serial, which no head follows).
            self._extend(chain, table[block:full])
        else:
            while block < full:  # contents registered already: follow them
                found = self.child(serial, seq, block)
                if found is None:  # a content evicted from its position: fill it again
                    found = self._refill(serial, seq, block, table[block])
                    if found is None:
                        break
                holder, serial = found, self.serial(found)
                block += 1
            chain = None
            if block < full:
                key = self._head_key(serial, seq, block)
                parent = None
                if serial:
                    self.parents_of_heads.add(serial)
                    # (kept: the request follows it, so it pins it)
                    parent = self.chains[serial >> SERIAL_SHIFT]
                    parent.pins += 1
                self.num_chains += 1
                chain = Chain(seq, block, key, self.num_chains, parent)
                self.chains[chain.number] = chain
                self.heads[key] = table[block]
                self._extend(chain, table[block:full])
        if chain is not None:
            holder = chain.blocks[-1]
            serial = chain.serial_base + len(chain.blocks) - 1
        seq.chain = chain
        seq.num_registered_blocks = full
        self.follow(seq, serial)
        seq.chain_block = holder

    def follow(self, seq: Sequence, serial: int) -> None:
        """``seq``'s blocks so far end with content ``serial`` (0: none), which its next
        registered block will follow: that content's chain is pinned meanwhile, so the
        content keeps its serial (and its holes stay fillable) whoever evicts it."""
        chain = self.chains[serial >> SERIAL_SHIFT] if serial else None
        old = cast("Chain | None", seq.chain_pin)
        seq.chain_serial = serial
        if old is not chain:
            if chain is not None:
                chain.pins += 1
            seq.chain_pin = chain
            if old is not None:
                self._unpin(old, 1)

    def unfollow(self, seq: Sequence) -> None:
        """``seq`` registers nothing more from where it was (freed, swapped out)."""
        self.follow(seq, 0)

    def _extend(self, chain: Chain, blocks: list[int]) -> None:
        chain_of, index_of = self.chain_of, self.index_of
        i = len(chain.blocks)
        for block in blocks:  # (a plain loop: faster than map() for a chain's dozen blocks)
            chain_of[block] = chain
            index_of[block] = i
            i += 1
        chain.blocks += blocks
        chain.pins += len(blocks)

    def _is_live(self, chain: Chain, position: int) -> bool:
        block = chain.blocks[position]
        return self.chain_of[block] is chain and self.index_of[block] == position

    def _refill(self, serial: int, seq: Sequence, block: int, new: int) -> int | None:
        """Register block ``new`` (``seq``'s block ``block``) at the hole its content left
        in a kept chain: the position after content ``serial``, or the head of a chain
        that follows ``serial``; ``new``, or None if there is none."""
        size = self.block_size
        chain = self.chains.get(serial >> SERIAL_SHIFT) if serial else None
        position = (serial & POSITION_MASK) + 1
        if not (
            chain is not None
            and position < len(chain.blocks)
            and not self._is_live(chain, position)
            and chain.tokens(position, size) == seq_tokens(seq, block, size)
        ):
            chain, position = None, 0
            if self.dead_heads and (serial == 0 or serial in self.parents_of_heads):
                key = self._head_key(serial, seq, block)
                chain = self.dead_heads.pop(key, None)
                if chain is None:
                    return None
                self.heads[key] = new
                ghost = self.ghosts.pop(key, None)
                if ghost is not None:
                    self.ghost_blocks -= len(ghost.blocks)
        if chain is None:
            return None
        chain.blocks[position] = new
        self.chain_of[new] = chain
        self.index_of[new] = position
        chain.pins += 1
        return new

    def _unpin(self, chain: Chain, n: int) -> None:
        """``n`` of ``chain``'s pins gone (blocks forgotten — its head, if among them,
        already out of :attr:`heads` — or a follower gone): a chain left with none is
        dropped, and unpins its parent."""
        chain.pins -= n
        while not chain.pins:
            del self.chains[chain.number]
            if self.dead_heads.get(chain.head_key) is chain:
                del self.dead_heads[chain.head_key]
            parent, chain.parent = chain.parent, None
            if parent is None:
                return
            parent.pins -= 1
            chain = parent

    def forget(self, block: int, evicted: bool) -> None:
        """``block`` no longer holds its content (evicted to be reused, or its KV was
        never written): its chain is cut there; an evicted head's chain becomes a ghost."""
        chain = self.chain_of[block]
        if chain is None:
            return
        self.chain_of[block] = None
        self.forgets += 1
        self.forgotten_at[block] = self.forgets
        if self.index_of[block] == 0:
            del self.heads[chain.head_key]
            if evicted:
                self._ghost(chain)
            if chain.pins > 1:
                self.dead_heads[chain.head_key] = chain
        self._unpin(chain, 1)

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
            if lo == 0:
                del self.heads[chain.head_key]
                self._ghost(chain)
                if chain.pins > hi:
                    self.dead_heads[chain.head_key] = chain
            self._unpin(chain, hi - lo)
        self.forgets = forgets
        return taken

    def _ghost(self, chain: Chain) -> None:
        ghosts = self.ghosts
        replaced = ghosts.pop(chain.head_key, None)  # an older chain of the same head
        if replaced is not None:
            self.ghost_blocks -= len(replaced.blocks)
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

    def check(self, followers: dict[int, int] | None = None) -> None:
        """Raise AssertionError unless every head's key maps to its chain's first block,
        every dead head's to a kept chain whose first block was forgotten, every
        registered block is where its chain says, no two registered blocks hold the same
        key, and every kept chain's pins count its registered blocks, its kept children
        and its ``followers`` (id(chain) -> requests following one of its contents)."""
        followers = followers or {}
        for key, block in self.heads.items():
            chain = self.chain_of[block]
            if chain is None or self.index_of[block] != 0 or chain.head_key != key:
                raise AssertionError(f"head key of block {block} does not match its chain")
        for key, chain in self.dead_heads.items():
            if chain.head_key != key or key in self.heads or self._is_live(chain, 0):
                raise AssertionError(f"dead head {key} does not match its chain")
            if self.chains.get(chain.number) is not chain:
                raise AssertionError(f"dead head {key}: its chain is not kept")
        keys: dict[PrefixKey, int] = {}
        live: dict[int, int] = {}  # id(chain) -> its registered blocks
        for block in range(self.num_device_blocks):
            chain = self.chain_of[block]
            if chain is None:
                continue
            i = self.index_of[block]
            if i >= len(chain.blocks) or chain.blocks[i] != block:
                raise AssertionError(f"block {block} is not at its chain's position {i}")
            if self.chains.get(chain.number) is not chain:
                raise AssertionError(f"block {block}: its chain is not kept")
            live[id(chain)] = live.get(id(chain), 0) + 1
            block_key = self.key_of(block)
            assert block_key is not None
            if block_key in keys:
                raise AssertionError(f"blocks {keys[block_key]} and {block} hold one key")
            keys[block_key] = block
        children: dict[int, int] = {}
        for chain in self.chains.values():
            if chain.parent is not None:
                if self.chains.get(chain.parent.number) is not chain.parent:
                    raise AssertionError("a kept chain's parent is not kept")
                children[id(chain.parent)] = children.get(id(chain.parent), 0) + 1
        kept = {id(chain) for chain in self.chains.values()}
        if not kept.issuperset(followers):
            raise AssertionError("a request follows a chain that is not kept")
        for chain in self.chains.values():
            pins = live.get(id(chain), 0) + children.get(id(chain), 0) + followers.get(id(chain), 0)
            if chain.pins != pins or not pins:
                raise AssertionError(f"chain {chain.head_key}: {chain.pins} pins, {pins} held")
