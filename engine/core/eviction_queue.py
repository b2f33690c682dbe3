"""The prefix cache's eviction queue (vLLM V1's free-block queue): registered device
blocks nobody holds, least recently freed first, for the block manager
(``engine.core.block_manager``). No tensors.

It holds *runs*, not blocks: a run is a stretch of one chain's positions (a chain is the
blocks one request registered in a row, ``engine.core.prefix_cache.Chain``) freed
together, its highest position first in the queue (a request frees its blocks tail
first). A request that frees 30 blocks of its own chain adds one run; an eviction takes
blocks off the head run's top with one slice. So the queue costs per run, not per
block: the simulator of a full pool evicts a block for nearly every block it takes,
millions per 100,000 requests, and a per-block ordered set (an ``OrderedDict`` node
allocated and freed per block) was most of prefix caching's cost there.

Seen block by block, the order is exactly that of a per-block queue: a block freed
later is behind every block freed before it; a block taken back out (a prefix hit on a
block nobody held) leaves the others' order alone.

Where a hit takes a block back: a chain's queued positions are above all its held ones
(whoever holds position ``p`` holds ``0..p``: its owner all of them, a hit a prefix), and
a hit takes a prefix in ascending order, so a block taken back is the lowest queued
position of its chain: the bottom of a run. Anything else splits the run in two (kept
correct, not fast).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Protocol


class HasBlocks(Protocol):
    """A chain as the queue sees it: its blocks by position."""

    blocks: list[int]


class Run:
    """Positions ``lo .. hi - 1`` of ``chain``, queued highest first."""

    __slots__ = ("chain", "lo", "hi")

    def __init__(self, chain: HasBlocks, lo: int, hi: int) -> None:
        self.chain, self.lo, self.hi = chain, lo, hi

    def __repr__(self) -> str:
        return f"Run({self.chain.blocks[self.lo : self.hi][::-1]})"


class EvictionQueue:
    """Registered blocks nobody holds, in eviction order (see the module docstring).
    Iterating it yields the blocks, head first; ``len`` is their number."""

    def __init__(self) -> None:
        self._runs: deque[Run] = deque()  # head first; a run emptied by hits may wait here
        self._runs_of: dict[int, list[Run]] = {}  # id(chain) -> its runs, in queue order
        self._num_blocks = 0
        self._num_empty = 0  # runs in ``_runs`` that hits emptied

    def __len__(self) -> int:
        return self._num_blocks

    def __bool__(self) -> bool:
        return self._num_blocks > 0

    def __iter__(self) -> Iterator[int]:
        for run in self._runs:
            blocks = run.chain.blocks
            for position in range(run.hi - 1, run.lo - 1, -1):
                yield blocks[position]

    def push(self, chain: HasBlocks, lo: int, hi: int) -> None:
        """Queue positions ``lo .. hi - 1`` of ``chain`` at the tail, highest first."""
        self._num_blocks += hi - lo
        runs = self._runs
        if runs:
            tail = runs[-1]
            if tail.chain is chain and tail.lo == hi and tail.lo < tail.hi:
                tail.lo = lo  # the run goes on downward (an emptied run is out of the index)
                return
        run = Run(chain, lo, hi)
        runs.append(run)
        self._runs_of.setdefault(id(chain), []).append(run)

    def take_back(self, chain: HasBlocks, position: int) -> None:
        """Remove ``chain``'s queued ``position`` (a prefix hit on a block nobody held)."""
        runs_of = self._runs_of.get(id(chain), [])
        # From the last run: it holds the chain's lowest queued positions, which a hit takes.
        for k in range(len(runs_of) - 1, -1, -1):
            run = runs_of[k]
            if run.lo <= position < run.hi:
                break
        else:
            raise KeyError(f"position {position} of its chain is not queued")
        self._num_blocks -= 1
        if position == run.lo:  # the usual case: the bottom of the run
            run.lo += 1
        elif position == run.hi - 1:
            run.hi -= 1
        else:  # the middle: split (the upper part stays ahead, as it was)
            lower = Run(chain, run.lo, position)
            run.lo = position + 1
            self._runs.insert(self._runs.index(run) + 1, lower)
            runs_of.insert(k + 1, lower)
            return
        if run.lo == run.hi:  # emptied
            del runs_of[k]
            if not runs_of:
                del self._runs_of[id(chain)]
            self._drop_empty(run)

    def _drop_empty(self, run: Run) -> None:
        """Forget a run that hits emptied. At the tail (a hot prefix freed and hit again
        at once) it goes now; elsewhere the head skips it when it gets there, and the
        queue is swept once emptied runs are half of it — a pool that never evicts
        would otherwise keep one per hit, forever."""
        runs = self._runs
        if runs[-1] is run:
            runs.pop()
            return
        self._num_empty += 1
        if self._num_empty > 64 and 2 * self._num_empty > len(runs):
            self._runs = deque(r for r in runs if r.lo < r.hi)
            self._num_empty = 0

    def pop(self, n: int) -> list[tuple[HasBlocks, int, int]]:
        """Dequeue ``n`` blocks from the head (the caller checked ``len``), as runs
        ``(chain, lo, hi)``, in order: each run's blocks go ``hi - 1`` down to ``lo``."""
        runs = self._runs
        taken = []
        self._num_blocks -= n
        while n:
            run = runs[0]
            size = run.hi - run.lo
            if size <= n:
                runs.popleft()
                if not size:
                    self._num_empty -= 1
                else:
                    taken.append((run.chain, run.lo, run.hi))
                    n -= size
                    runs_of = self._runs_of[id(run.chain)]
                    del runs_of[0]  # a chain's first run is its earliest queued
                    if not runs_of:
                        del self._runs_of[id(run.chain)]
                    run.hi = run.lo
            else:
                taken.append((run.chain, run.hi - n, run.hi))
                run.hi -= n
                n = 0
        return taken

    @property
    def num_runs(self) -> int:
        """Runs held, emptied ones included (what the queue's memory grows with)."""
        return len(self._runs)

    def check(self) -> None:
        """Raise AssertionError unless the count and the per-chain index match the runs."""
        live = [run for run in self._runs if run.lo < run.hi]
        if len(self._runs) - len(live) != self._num_empty:
            raise AssertionError("eviction queue: emptied runs miscounted")
        if sum(run.hi - run.lo for run in live) != self._num_blocks:
            raise AssertionError("eviction queue: block count does not match its runs")
        indexed = [run for runs in self._runs_of.values() for run in runs]
        if sorted(map(id, indexed)) != sorted(map(id, live)):
            raise AssertionError("eviction queue: per-chain index does not match its runs")
        for runs in self._runs_of.values():
            order = [self._runs.index(run) for run in runs]
            if order != sorted(order):
                raise AssertionError("eviction queue: a chain's runs out of queue order")
