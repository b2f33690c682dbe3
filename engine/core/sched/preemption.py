"""Preemption: which running request gives up its place, and how it does so.

Victims are taken from the worst end of the running set (sorted by policy key, then
arrival), skipping requests already scheduled in the step being built. A victim
either *swaps* (its KV blocks move to the host pool; it resumes where it stopped)
or *recomputes* (its blocks are freed; it waits again and re-prefills everything it
had computed). Which one, by ``--preemption-mode``:

- ``swap``: swap; when the host pool is full, recompute that request instead,
  recorded with ``detail=swap_space_exhausted`` (trap 2 in docs/traps.md: a
  small ``--swap-space`` turns preemptions into multi-second re-prefills);
- ``recompute``: always recompute (vLLM V1's only mode);
- ``auto`` (schedscope's own; vLLM has no such choice): per request, the cheaper of
  swapping out and back in (blocks x the cost model's per-block copy cost, twice)
  and re-prefilling its context (the cost model's prefill cost), swapping only
  while the host pool has room (a tie swaps). Both predictions are recorded on the
  decision.
"""

from __future__ import annotations

import bisect

from engine.core import decisions as d
from engine.core.block_manager import BlockManager
from engine.core.cost_model import CostModel
from engine.core.decisions import Decision
from engine.core.sched.scheduler_output import SchedulerOutput
from engine.core.sched.waiting_queue import WaitingQueue
from engine.core.sequence import Sequence, SequenceStatus

RUNNING = SequenceStatus.RUNNING
SWAPPED = SequenceStatus.SWAPPED


def policy_order(seq: Sequence) -> tuple[float, int]:
    """The order of the running and swapped sets: best first."""
    return (seq.policy_key, seq.seq_no)


class Preemptor:
    """Takes running requests out of the step being built to make room for others.

    Shares the scheduler's ``running`` and ``swapped`` lists (sorted by
    :func:`policy_order`) and its waiting queue; mutates them and the block manager.
    """

    def __init__(
        self,
        mode: str,
        block_manager: BlockManager,
        cost_model: CostModel,
        running: list[Sequence],
        swapped: list[Sequence],
        waiting: WaitingQueue,
    ) -> None:
        self.mode = mode
        self.block_manager = block_manager
        self.cost_model = cost_model
        self.running = running
        self.swapped = swapped
        self.waiting = waiting
        #: Set when a running decode had to preempt in the step being built; the
        #: scheduler admits nothing more into such a step (it would be preempted again).
        self.decode_preempted = False

    # -- victims ----------------------------------------------------------------------
    def worst_unscheduled(self) -> Sequence | None:
        running = self.running
        for i in range(len(running) - 1, -1, -1):
            if not running[i].num_scheduled_tokens:
                return running[i]
        return None

    def make_room_for_decode(self, seq: Sequence, now: float, out: SchedulerOutput) -> bool:
        """Preempt the worst unscheduled running request until ``seq`` can grow by a token.

        Returns False when ``seq`` itself is the worst and was preempted.
        """
        self.decode_preempted = True
        while not self.block_manager.can_append(seq, 1):
            victim = self.worst_unscheduled()
            if victim is None or victim is seq:
                self.preempt(seq, now, out, d.REASON_OUT_OF_BLOCKS, seq)
                return False
            self.preempt(victim, now, out, d.REASON_OUT_OF_BLOCKS, seq)
        return True

    def make_room_for_admission(
        self,
        seq: Sequence,
        max_num_seqs: int,
        now: float,
        out: SchedulerOutput,
        reason: str,
        only_worse: bool,
        cached: list[int] | None = None,
    ) -> bool:
        """Preempt running requests so the waiting ``seq`` gets a slot and its blocks
        (``cached``: its prefix hits, taken by reference).

        Victims come from the worst end, skipping requests already in this step and
        max-wait admissions that have not produced a token since (they and the
        newcomer would evict each other forever); with ``only_worse``, only requests
        whose key is worse than ``seq``'s. Nothing is preempted unless the room can
        be found in full, with the same room test as ``can_allocate`` (the watermark
        stays free while others run). A victim's block that others also hold frees
        nothing (prefix caching).
        """
        bm = self.block_manager
        cached = cached or []
        need_blocks = bm.blocks_needed(seq, cached)
        free = bm.num_free_device_blocks
        releases = bm.release_count(cached)
        slots = max_num_seqs - len(self.running)
        reserve = bm.watermark_blocks
        seq_order = policy_order(seq)
        victims: list[Sequence] = []
        for i in range(len(self.running) - 1, -1, -1):
            if free - need_blocks >= reserve and slots >= 1:
                break
            victim = self.running[i]
            if victim.num_scheduled_tokens or victim.promoted:
                continue
            if only_worse and policy_order(victim) <= seq_order:
                break  # sorted: everything further in is better than seq
            victims.append(victim)
            freed, taken_back = releases.add(victim.block_table)
            free += freed
            need_blocks += taken_back
            slots += 1
        remaining = len(self.running) - len(victims)
        if free - need_blocks < (reserve if remaining else 0) or slots < 1:
            return False
        for victim in victims:
            self.preempt(victim, now, out, reason, seq)
        return True

    # -- the preemption ---------------------------------------------------------------
    def choose_mode(self, seq: Sequence) -> tuple[str, str, float, float]:
        """(mode, detail, predicted swap seconds, predicted recompute seconds)."""
        swap_s = self.cost_model.predict_swap_s(len(seq.block_table))
        recompute_s = self.cost_model.predict_recompute_s(seq.num_computed_tokens)
        if self.mode == "recompute":
            return "recompute", "", swap_s, recompute_s
        if self.mode == "auto" and recompute_s < swap_s:
            return "recompute", d.REASON_RECOMPUTE_CHEAPER, swap_s, recompute_s
        if not self.block_manager.can_swap_out(seq):
            # vLLM 0.6 raised and died here; we fall back per request and say so.
            return "recompute", d.REASON_SWAP_SPACE_EXHAUSTED, swap_s, recompute_s
        cheaper = self.mode == "auto" and swap_s < recompute_s  # a tie swaps: keeps progress
        return "swap", d.REASON_SWAP_CHEAPER if cheaper else "", swap_s, recompute_s

    def preempt(
        self, seq: Sequence, now: float, out: SchedulerOutput, reason: str, beneficiary: Sequence
    ) -> None:
        self.running.remove(seq)
        mode, detail, swap_s, recompute_s = self.choose_mode(seq)
        num_blocks = len(seq.block_table)
        thrown_away = 0
        if mode == "swap":
            out.blocks_to_swap_out.extend(self.block_manager.swap_out(seq))
            seq.status = SWAPPED
            seq.swapped_out_time = now
            seq.num_preemptions_swap += 1
            bisect.insort(self.swapped, seq, key=policy_order)
        else:
            thrown_away = seq.num_computed_tokens
            self.block_manager.free(seq)
            # += : a request preempted again while re-prefilling still owes the tokens
            # it had not yet redone.
            seq.num_pending_recompute_tokens += seq.num_computed_tokens
            seq.num_computed_tokens = 0
            seq.num_preemptions_recompute += 1
            self.waiting.push(seq, now)
        out.decisions.append(
            Decision(
                d.PREEMPT,
                now,
                out.step,
                seq.request_id,
                reason,
                mode=mode,
                beneficiary=beneficiary.request_id,
                num_blocks=num_blocks,
                num_tokens=thrown_away,
                detail=detail,
                predicted_swap_s=swap_s,
                predicted_recompute_s=recompute_s,
            )
        )
        if mode == "swap":
            out.decisions.append(
                Decision(d.SWAP_OUT, now, out.step, seq.request_id, reason, num_blocks=num_blocks)
            )
