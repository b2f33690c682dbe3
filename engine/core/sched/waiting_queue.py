"""The waiting queue: requests in policy order, plus the oldest-first view max-wait needs.

Two heaps with lazy deletion. The policy heap is keyed by the static policy key
(``engine.core.sched.policy``), ties broken by arrival order; with a ``max_wait_s`` bound a
second heap orders the same requests by when they started waiting. A request
leaves the queue by bumping its ``queue_version``: entries carrying an older
version are stale and are dropped when they reach the top. So push, pop, peek and
remove are O(log n) amortised, and nothing per step grows with the queue's length.

A request that has waited past ``max_wait_s`` is *promoted*: it moves to a list,
oldest first, that the scheduler serves before the policy order.
"""

from __future__ import annotations

import heapq

from engine.core.sequence import Sequence, SequenceStatus

WAITING = SequenceStatus.WAITING


class WaitingQueue:
    def __init__(self, max_wait_s: float | None = None) -> None:
        self.max_wait_s = max_wait_s
        self._by_key: list[tuple[float, int, int, Sequence]] = []
        self._by_wait: list[tuple[float, int, int, Sequence]] = []
        #: Waited past max_wait_s, oldest first; served ahead of the policy order.
        self.promoted: list[Sequence] = []
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, seq: Sequence, now: float) -> None:
        """``seq`` starts (or starts again) to wait at ``now``."""
        seq.status = WAITING
        seq.waiting_since = now
        seq.queue_version += 1
        seq.promoted = False
        heapq.heappush(self._by_key, (seq.policy_key, seq.seq_no, seq.queue_version, seq))
        if self.max_wait_s is not None:
            heapq.heappush(self._by_wait, (now, seq.seq_no, seq.queue_version, seq))
        self._len += 1

    def _is_live(self, entry: tuple[float, int, int, Sequence]) -> bool:
        seq = entry[3]
        return seq.status is WAITING and entry[2] == seq.queue_version

    def peek(self) -> Sequence | None:
        """The best waiting request under the policy (None: the queue is empty)."""
        heap = self._by_key
        while heap:
            if self._is_live(heap[0]):
                return heap[0][3]
            heapq.heappop(heap)  # stale: admitted, aborted or re-queued since
        return None

    def first(self, n: int) -> list[Sequence]:
        """The ``n`` best waiting requests under the static key, best first (fewer when
        fewer wait). O((n + stale entries met) log length): they are popped and pushed
        back, and the stale entries met on the way are dropped for good."""
        heap = self._by_key
        live: list[tuple[float, int, int, Sequence]] = []
        while heap and len(live) < n:
            entry = heapq.heappop(heap)
            if self._is_live(entry):
                live.append(entry)
        for entry in live:
            heapq.heappush(heap, entry)
        return [entry[3] for entry in live]

    def remove(self, seq: Sequence, now: float) -> None:
        """Take a waiting request out (admitted, aborted): its entries go stale."""
        self._len -= 1
        seq.queue_version += 1
        seq.total_queue_s += now - seq.waiting_since

    def promote_overdue(self, now: float) -> None:
        """Move every request waiting longer than ``max_wait_s`` to :attr:`promoted`."""
        if self.max_wait_s is None:
            return
        deadline = now - self.max_wait_s
        heap = self._by_wait
        while heap and heap[0][0] <= deadline:
            entry = heapq.heappop(heap)
            if self._is_live(entry):
                entry[3].promoted = True
                self.promoted.append(entry[3])

    def has_overdue(self, now: float) -> bool:
        """Whether :meth:`promote_overdue` at ``now`` may promote a request (True may
        be a request that has left the queue since)."""
        if self.max_wait_s is None:
            return False
        heap = self._by_wait
        return bool(heap) and heap[0][0] <= now - self.max_wait_s

    def drop_stale_promotions(self) -> None:
        """Forget promoted requests that were admitted, aborted or re-queued since."""
        self.promoted = [s for s in self.promoted if s.status is WAITING and s.promoted]
