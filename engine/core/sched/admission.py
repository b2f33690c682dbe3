"""Admission: how waiting requests enter the running set, and why the others wait.

The paths, all called by the batching regime (``engine.core.sched.batching``):

- :meth:`Admission.ahead_of_running` — requests waiting past ``max_wait_s``, oldest
  first, preempting whatever they must; then, under a policy that preempts for waiting
  requests (priority), the best waiting request when it lacks a slot or blocks takes
  them from worse running requests and is admitted in that very step;
- :meth:`Admission.waiting_requests` — new prefills in policy order while a slot, the
  token budget and blocks allow; the first that does not fit stops the loop (no skipping
  ahead) and its reason is recorded as a ``wait`` decision;
- :meth:`Admission.batch` — static batching: a whole batch in policy order.

"Policy order" for these two is the waiting queue's static order, except under lpm,
whose order of a pass ranks a window of the queue by cached prefix
(``engine.core.sched.prefix_order``); a ``wait`` decision without a request of its own
(:meth:`Admission.note_wait`) names the queue's head in its static order (under lpm the
oldest waiting request: ranking a window only to name it would cost lookups).

An admission is an ``admit`` decision the first time and a ``recompute`` decision when a
recompute-preempted request re-enters to re-prefill.

With prefix caching each admission asks the block manager for the request's cached
prefix first (:meth:`BlockManager.lookup`): the hits are taken by reference and count as
computed, so the token budget and the free-block test (watermark included) count only
the tokens to compute and the blocks to take. A recompute-preempted request re-hits
whatever of its blocks was not evicted.
"""

from __future__ import annotations

import bisect

from engine.config import SchedulerConfig
from engine.core import decisions as d
from engine.core.block_manager import BlockManager
from engine.core.decisions import Decision
from engine.core.sched.policy import Policy
from engine.core.sched.preemption import Preemptor, policy_order
from engine.core.sched.prefix_order import admission_order, prefix_ranking
from engine.core.sched.scheduler_output import SchedulerOutput
from engine.core.sched.waiting_queue import WaitingQueue
from engine.core.sequence import Sequence, SequenceStatus

RUNNING = SequenceStatus.RUNNING
#: The prefix hits of a request when prefix caching is off (never mutated).
NO_HITS: list[int] = []


def prefill_chunk(
    seq: Sequence, budget: int, chunked: bool, num_cached: int = 0, cap: int = 0
) -> int:
    """How many uncomputed tokens of ``seq`` fit ``budget`` (0: none this step), the
    first ``num_cached`` (prefix-cache hits of a waiting request) needing no compute, at
    most ``cap`` (the step's long-prefill cap, ``Scheduler.long_prefill_cap``; 0: none).
    Without chunked prefill a prefill goes whole or not at all."""
    remaining = seq.num_tokens - max(seq.num_computed_tokens, num_cached)
    if 0 < cap < remaining:
        remaining = cap
    if remaining <= budget:
        return remaining
    return budget if chunked else 0


class Admission:
    """Shares the scheduler's ``running`` list and waiting queue; mutates them, the
    block manager and the step being built."""

    def __init__(
        self,
        config: SchedulerConfig,
        policy: Policy,
        block_manager: BlockManager,
        running: list[Sequence],
        waiting: WaitingQueue,
        preemptor: Preemptor,
    ) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.chunked = config.enable_chunked_prefill
        self.policy = policy
        self.block_manager = block_manager
        self.running = running
        self.waiting = waiting
        self.preemptor = preemptor
        #: lpm's ranking of the waiting window (None: the queue's static order)
        self.ranking = prefix_ranking(policy, waiting, block_manager)
        #: the step's long-prefill cap (0: none), set by the scheduler at each step's start
        self.prefill_cap = 0
        self._last_wait: tuple[int, str] | None = None  # (seq_no, reason) of the last wait record

    def admit(
        self,
        seq: Sequence,
        out: SchedulerOutput,
        now: float,
        reason: str,
        n: int,
        cached: list[int] | None = None,
        lpm_cached_tokens: int | None = None,
    ) -> None:
        """Move a waiting request into the running set and (if ``n``) into this step;
        ``cached``: its prefix hits (:meth:`BlockManager.lookup`), taken as computed;
        ``lpm_cached_tokens``: the cached length that ranked it under lpm (recorded)."""
        bm = self.block_manager
        caching = bm.enable_prefix_caching
        num_cached = evicted = 0
        if caching:
            cached = cached or []
            evicted = bm.evicted_prefix(seq, cached)
            bm.allocate(seq, cached)
            num_cached = len(cached) * bm.block_size
            if seq.num_pending_recompute_tokens:  # a hit needs no redoing
                seq.num_pending_recompute_tokens -= min(
                    num_cached, seq.num_pending_recompute_tokens
                )
            out.num_cached_tokens += num_cached
        else:
            bm.allocate(seq)
        seq.num_computed_tokens = num_cached
        self.waiting.remove(seq, now)
        seq.status = RUNNING
        seq.promoted = reason == d.REASON_MAX_WAIT  # protected until its next token
        bisect.insort(self.running, seq, key=policy_order)
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = now
            seq.num_cached_tokens = num_cached
            seq.num_evicted_prefix_tokens = evicted
            kind = d.ADMIT
        else:
            kind = d.RECOMPUTE
        out.decisions.append(
            Decision(
                kind,
                now,
                out.step,
                seq.request_id,
                reason,
                num_blocks=len(seq.block_table),
                num_tokens=seq.num_tokens,
                num_cached_tokens=num_cached,
                num_evicted_prefix_tokens=evicted,
                lpm_cached_tokens=lpm_cached_tokens,
            )
        )
        if n:
            if caching:
                bm.register(seq, num_cached + n)
            out.add(seq, n)

    def ahead_of_running(self, out: SchedulerOutput, now: float, budget: int) -> int:
        """Max-wait promotions, then the best waiting request's claim under a policy
        that preempts for waiting requests; returns the budget left."""
        waiting = self.waiting
        waiting.promote_overdue(now)
        if waiting.promoted:
            waiting.drop_stale_promotions()
            for seq in list(waiting.promoted):
                cached = self.block_manager.lookup(seq)
                n = (
                    prefill_chunk(seq, budget, self.chunked, self._tokens(cached), self.prefill_cap)
                    if budget
                    else 0
                )
                if n and self.preemptor.make_room_for_admission(
                    seq, self.max_num_seqs, now, out, d.REASON_MAX_WAIT, False, cached
                ):
                    self.admit(seq, out, now, d.REASON_MAX_WAIT, n, cached)
                    budget -= n
            waiting.drop_stale_promotions()
        if self.policy.preempts_for_waiting and len(waiting) and budget:
            head = waiting.peek()
            cached = self.block_manager.lookup(head) if head is not None else NO_HITS
            if head is not None and self._lacks_room(head, cached):
                # Worse running requests make room, and the head is admitted in this
                # very step (before the decodes could spend that room).
                n = prefill_chunk(
                    head, budget, self.chunked, self._tokens(cached), self.prefill_cap
                )
                if n and self.preemptor.make_room_for_admission(
                    head, self.max_num_seqs, now, out, d.REASON_PRIORITY, True, cached
                ):
                    self.admit(head, out, now, d.REASON_PRIORITY, n, cached)
                    budget -= n
        return budget

    def _tokens(self, cached: list[int]) -> int:
        return len(cached) * self.block_manager.block_size

    def _lacks_room(self, seq: Sequence, cached: list[int] | None = None) -> bool:
        """Whether waiting ``seq`` finds no free slot or no blocks for its prefill
        (``cached``: its prefix hits, when the caller has looked them up already)."""
        if len(self.running) >= self.max_num_seqs:
            return True
        bm = self.block_manager
        if cached is None:
            cached = bm.lookup(seq)
        return not bm.can_allocate(seq, bool(self.running), cached)

    def acts_ahead_of_running(self, now: float) -> bool:
        """Whether :meth:`ahead_of_running` may take a step at ``now`` for a waiting
        request (a max-wait promotion, the best waiting request's claim on worse
        running ones); False: it leaves the step to the running requests."""
        waiting = self.waiting
        if waiting.promoted or waiting.has_overdue(now):
            return True
        if self.policy.preempts_for_waiting and len(waiting):
            head = waiting.peek()
            return head is not None and self._lacks_room(head)
        return False

    def waiting_requests(self, out: SchedulerOutput, now: float, budget: int) -> int:
        """New prefills in policy order while a slot, the budget and blocks allow."""
        if budget <= 0:
            return budget
        if len(self.running) >= self.max_num_seqs:  # checked first: lpm ranks nothing then
            self.note_wait(out, now, d.REASON_MAX_NUM_SEQS)
            return budget
        bm = self.block_manager
        for seq, lpm_cached in admission_order(self.waiting, self.ranking):
            if budget <= 0:
                break
            if len(self.running) >= self.max_num_seqs:
                self.note_wait(out, now, d.REASON_MAX_NUM_SEQS, seq)
                break
            cached = bm.lookup(seq) if bm.enable_prefix_caching else NO_HITS
            n = prefill_chunk(
                seq, budget, self.chunked, len(cached) * bm.block_size, self.prefill_cap
            )
            if n == 0:
                self.note_wait(out, now, d.REASON_TOKEN_BUDGET, seq)
                break
            if not bm.can_allocate(seq, bool(self.running), cached):
                self.note_wait(out, now, d.REASON_OUT_OF_BLOCKS, seq)
                break
            self.admit(seq, out, now, d.REASON_POLICY_ORDER, n, cached, lpm_cached)
            budget -= n
        return budget

    def batch(self, out: SchedulerOutput, now: float) -> None:
        """Static batching: admit a whole batch in policy order (prefilled next step)."""
        if len(self.running) >= self.max_num_seqs:
            return
        bm = self.block_manager
        for seq, lpm_cached in admission_order(self.waiting, self.ranking):
            if len(self.running) >= self.max_num_seqs:
                break
            cached = bm.lookup(seq)
            if not bm.can_allocate(seq, bool(self.running), cached):
                self.note_wait(out, now, d.REASON_OUT_OF_BLOCKS, seq)
                break
            self.admit(seq, out, now, d.REASON_STATIC_BATCH, 0, cached, lpm_cached)

    def note_wait(
        self, out: SchedulerOutput, now: float, reason: str, seq: Sequence | None = None
    ) -> None:
        """Record why the head of the queue waits, once per change of reason."""
        seq = seq or self.waiting.peek()
        if seq is None or self._last_wait == (seq.seq_no, reason):
            return
        self._last_wait = (seq.seq_no, reason)
        out.decisions.append(
            Decision(
                d.WAIT,
                now,
                out.step,
                seq.request_id,
                reason,
                num_blocks=self.block_manager.blocks_for(seq.num_tokens),
                num_tokens=seq.num_tokens,
            )
        )
