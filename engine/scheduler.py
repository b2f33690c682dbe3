"""The scheduler: which tokens of which requests go into the next step, and why.

One step, continuous batching (vLLM-style, over a paged KV cache):

0. requests that waited past ``max_wait_s`` are promoted and admitted first,
   preempting running requests if they must (the hard bound);
1. under a policy that lets waiting requests preempt (priority), the best waiting
   request takes the room of worse running ones when blocks or slots are short;
   (with chunked prefill off, as vLLM v0: a step that can admit new prefills runs
   only those, and the running requests sit it out);
2. running decodes, then running prefill chunks, in policy order; when a decode
   needs a block and none is free, the worst running request is preempted (swap
   or recompute); decodes beyond the token budget are left out ("idle running");
3. swap-ins, in policy order;
4. new prefills from the waiting queue, in policy order, chunked under the token
   budget when chunked prefill is on.

Both budgets (``max_num_seqs``, ``max_num_batched_tokens``) hold in every step.
Every choice is appended to the step's decisions as a plain record. The scheduler
handles sequences and block ids only: no tensors, no telemetry imports.

Cost: a step is O(running + admitted + preempted); the waiting queue is a heap
(and, with ``max_wait_s``, a second heap by waiting time) with lazy deletion, so
no per-step work grows with the number of waiting requests.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field

from engine import decisions as d
from engine.block_manager import BlockManager, BlockMapping
from engine.config import SchedulerConfig
from engine.decisions import Decision
from engine.policy import Policy, make_policy
from engine.sequence import STALL_FLOOR_S, Sequence, SequenceStatus

WAITING = SequenceStatus.WAITING
RUNNING = SequenceStatus.RUNNING
SWAPPED = SequenceStatus.SWAPPED


def _order(seq: Sequence) -> tuple[float, int]:
    return (seq.policy_key, seq.seq_no)



@dataclass(slots=True)
class SchedulerOutput:
    """One step's work. Each scheduled sequence carries ``num_scheduled_tokens``.

    A scheduled sequence samples a token at the end of the step exactly when
    ``num_computed_tokens + num_scheduled_tokens == num_tokens``.
    """

    step: int
    time: float
    seqs: list[Sequence] = field(default_factory=list)
    num_prefill_tokens: int = 0  # tokens of sequences still prefilling (or re-prefilling)
    num_decode_seqs: int = 0
    num_decode_context_tokens: int = 0  # sum of decode sequences' context lengths
    prefill_attention_work: int = 0  # sum over prefill chunks of chunk_len * context_len
    blocks_to_swap_out: BlockMapping = field(default_factory=list)
    blocks_to_swap_in: BlockMapping = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    #: When nothing is scheduled but something will become schedulable at a known
    #: time without any arrival (static batching's timeout), that time.
    wake_at: float | None = None

    @property
    def num_batched_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def is_empty(self) -> bool:
        return not self.seqs and not self.blocks_to_swap_out and not self.blocks_to_swap_in


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        eos_token_id: int | None = None,
    ) -> None:
        self.config = config
        self.block_manager = block_manager
        self.policy: Policy = make_policy(config)
        self.eos_token_id = eos_token_id
        self.token_budget = config.token_budget
        self.max_num_seqs = config.max_num_seqs
        self.chunked = config.enable_chunked_prefill
        self.static = config.batching == "static"
        self.max_wait_s = config.max_wait_s

        self.requests: dict[str, Sequence] = {}  # unfinished requests by id
        self.running: list[Sequence] = []  # sorted by (policy key, arrival)
        self.swapped: list[Sequence] = []  # sorted by (policy key, arrival)
        self._waiting: list[tuple[float, int, int, Sequence]] = []  # heap by policy key
        self._by_wait: list[tuple[float, int, int, Sequence]] = []  # heap by waiting_since
        self._promoted: list[Sequence] = []  # waited past max_wait_s, oldest first
        self.num_waiting = 0
        self._next_seq_no = 0
        self._step = 0
        self._pending: list[Decision] = []  # decisions taken between steps (reject, abort)
        self._batch_open_since: float | None = None  # static batching
        self._decode_preempted = False  # a decode had to preempt in the step being built
        self._last_wait: tuple[int, str] | None = None  # (seq_no, reason) of the last wait record

    # -- requests in and out ----------------------------------------------------------
    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def add(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params,
        now: float,
        priority: int = 0,
        request_class: str = "",
        oracle_output_tokens: int | None = None,
    ) -> Sequence:
        """Accept a request; it is WAITING, or FINISHED_REJECTED with a reason.

        Raises ValueError for caller mistakes (empty prompt, duplicate id): those
        are not scheduling decisions.
        """
        if not prompt_token_ids:
            raise ValueError(f"request {request_id!r} has an empty prompt")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in flight")
        seq = Sequence(
            request_id, list(prompt_token_ids), params, now, self._next_seq_no, priority,
            request_class, oracle_output_tokens,
        )
        self._next_seq_no += 1
        seq.policy_key = self.policy.key(seq)
        reason = self._reject_reason(seq)
        if reason is not None:
            seq.status = SequenceStatus.FINISHED_REJECTED
            seq.reject_reason = reason
            seq.finished_time = now
            self._pending.append(Decision(
                d.REJECT, now, self._step, request_id, reason,
                num_blocks=self.block_manager.blocks_for(seq.max_total_tokens),
                num_tokens=seq.max_total_tokens,
            ))
            return seq
        self.requests[request_id] = seq
        self._enqueue_waiting(seq, now)
        return seq

    def _reject_reason(self, seq: Sequence) -> str | None:
        if seq.max_total_tokens > self.config.max_model_len:
            return d.REASON_EXCEEDS_MAX_MODEL_LEN
        if self.block_manager.blocks_for(seq.max_total_tokens) > self.block_manager.num_device_blocks:
            return d.REASON_EXCEEDS_KV_POOL
        if self.config.max_waiting is not None and self.num_waiting >= self.config.max_waiting:
            return d.REASON_QUEUE_FULL
        return None

    def abort(self, request_id: str, now: float) -> Sequence | None:
        """Finish a request as aborted and free its blocks. Call between steps."""
        seq = self.requests.get(request_id)
        if seq is None:
            return None
        self._remove(seq, now, SequenceStatus.FINISHED_ABORTED)
        self._pending.append(Decision(d.ABORT, now, self._step, request_id, d.REASON_CLIENT))
        return seq

    def fail(self, seqs: list[Sequence], now: float, error: str) -> None:
        """Finish requests whose step failed in the executor; free their blocks."""
        for seq in seqs:
            if self.requests.get(seq.request_id) is seq:
                seq.error = error
                self._remove(seq, now, SequenceStatus.FINISHED_ERROR)

    def _remove(self, seq: Sequence, now: float, status: SequenceStatus) -> None:
        """Take an unfinished request out of whichever queue holds it, free its blocks."""
        del self.requests[seq.request_id]
        if seq.status is RUNNING:
            self.running.remove(seq)
        elif seq.status is SWAPPED:
            self.swapped.remove(seq)
            seq.total_swapped_s += now - (seq.swapped_out_time or now)
        else:  # WAITING: its heap entries go stale
            self.num_waiting -= 1
            seq.queue_version += 1
            seq.total_queue_s += now - seq.waiting_since
        self.block_manager.free(seq)
        seq.num_scheduled_tokens = 0
        seq.status = status
        seq.finished_time = now

    def drain_decisions(self) -> list[Decision]:
        """Decisions taken outside a step (rejections, aborts) not yet reported."""
        pending, self._pending = self._pending, []
        return pending

    # -- queues ------------------------------------------------------------------------
    def _enqueue_waiting(self, seq: Sequence, now: float) -> None:
        seq.status = WAITING
        seq.waiting_since = now
        seq.queue_version += 1
        seq.promoted = False
        entry = (seq.policy_key, seq.seq_no, seq.queue_version, seq)
        heapq.heappush(self._waiting, entry)
        if self.max_wait_s is not None:
            heapq.heappush(self._by_wait, (now, seq.seq_no, seq.queue_version, seq))
        self.num_waiting += 1

    def _peek_waiting(self) -> Sequence | None:
        heap = self._waiting
        while heap:
            _, _, version, seq = heap[0]
            if seq.status is WAITING and version == seq.queue_version:
                return seq
            heapq.heappop(heap)  # stale: admitted, aborted or re-queued since
        return None

    def _promote_overdue(self, now: float) -> None:
        deadline = now - self.max_wait_s
        heap = self._by_wait
        while heap and heap[0][0] <= deadline:
            _, _, version, seq = heapq.heappop(heap)
            if seq.status is WAITING and version == seq.queue_version:
                seq.promoted = True
                self._promoted.append(seq)

    # -- building a step -----------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        self._step += 1
        out = SchedulerOutput(self._step, now)
        if self._pending:
            out.decisions.extend(self._pending)
            self._pending = []
        budget = self.token_budget
        if self.static:
            budget = self._admit_static_batch(now, out, budget)
            if budget is None:
                return self._finish_output(out)
        else:
            if self.max_wait_s is not None:
                self._promote_overdue(now)
                if self._promoted:
                    budget = self._admit_promoted(now, out, budget)
            if self.policy.preempts_for_waiting and self.num_waiting:
                budget = self._preempt_for_waiting_head(now, out, budget)
            if not self.chunked:
                # vLLM v0 without chunked prefill: a step that admits new prefills carries
                # no decodes (and none are admitted while requests are swapped out). This is
                # how running sets outgrow the token budget (trap 1).
                if self.num_waiting and not self.swapped:
                    self._schedule_waiting(now, out, budget)
                if out.seqs:
                    idle = [seq for seq in self.running if not seq.num_scheduled_tokens]
                    self._record_idle(out, now, idle, d.REASON_PREFILL_PRIORITY)
                    return self._finish_output(out)

        budget = self._schedule_running(now, out, budget)
        # After running decodes had to preempt for room, admitting more work into the
        # same step would only be preempted again (vLLM does the same).
        preempted = self._decode_preempted
        if self.swapped and budget > 0 and not preempted:
            budget = self._schedule_swap_ins(now, out, budget)
        if self.chunked and not self.static and self.num_waiting and budget > 0:
            if preempted:
                self._note_wait(out, now, d.REASON_OUT_OF_BLOCKS)
            else:
                self._schedule_waiting(now, out, budget)
        return self._finish_output(out)

    def _finish_output(self, out: SchedulerOutput) -> SchedulerOutput:
        out.num_running = len(self.running)
        out.num_waiting = self.num_waiting
        out.num_swapped = len(self.swapped)
        self._decode_preempted = False
        return out

    def _schedule_one(self, seq: Sequence, n: int, out: SchedulerOutput) -> None:
        """Put ``n`` of ``seq``'s uncomputed tokens into the step and count them."""
        seq.num_scheduled_tokens = n
        out.seqs.append(seq)
        # A decode computes one generated token; a prompt (or a recompute) of any
        # length, even one token, is prefill work.
        if (
            seq.num_tokens - seq.num_computed_tokens == 1
            and seq.num_computed_tokens >= seq.num_prompt_tokens
        ):
            out.num_decode_seqs += 1
            out.num_decode_context_tokens += seq.num_tokens
        else:
            out.num_prefill_tokens += n
            out.prefill_attention_work += n * (seq.num_computed_tokens + n)

    def _prefill_chunk(self, seq: Sequence, budget: int) -> int:
        """How many uncomputed tokens of ``seq`` fit ``budget`` (0: none this step)."""
        remaining = seq.num_tokens - seq.num_computed_tokens
        if remaining <= budget:
            return remaining
        return budget if self.chunked else 0

    def _schedule_running(self, now: float, out: SchedulerOutput, budget: int) -> int:
        running = self.running
        block_size = self.block_manager.block_size
        free_device = self.block_manager._free_device  # read-only peek on the hot path
        decodes: list[Sequence] = []
        prefills: list[Sequence] = []
        for seq in running:
            if seq.num_scheduled_tokens:
                continue  # admitted earlier in this step
            computed = seq.num_computed_tokens
            if seq.num_tokens - computed == 1 and computed >= seq.num_prompt_tokens:
                decodes.append(seq)
            else:
                prefills.append(seq)
        idle: list[Sequence] = []
        scheduled = out.seqs
        for seq in decodes:
            if seq.status is not RUNNING:
                continue  # preempted earlier in this loop to make room
            if budget == 0:
                idle.append(seq)
                continue
            if seq.num_tokens > len(seq.block_table) * block_size:
                if not free_device and not self._make_room_for_decode(seq, now, out):
                    continue  # seq itself was preempted
                self.block_manager.append_slots(seq, 1)
            seq.num_scheduled_tokens = 1
            scheduled.append(seq)
            out.num_decode_seqs += 1
            out.num_decode_context_tokens += seq.num_tokens
            budget -= 1
        for seq in prefills:
            if seq.status is not RUNNING:
                continue
            n = self._prefill_chunk(seq, budget) if budget else 0
            if n == 0:
                idle.append(seq)
                continue
            self._schedule_one(seq, n, out)
            budget -= n
        self._record_idle(out, now, idle, d.REASON_TOKEN_BUDGET)
        return budget

    def _record_idle(self, out: SchedulerOutput, now: float, idle: list[Sequence], reason: str) -> None:
        """Running requests left out of this step: one record listing them all."""
        if not idle:
            return
        for seq in idle:
            seq.num_idle_running_steps += 1
        out.decisions.append(Decision(
            d.IDLE_RUNNING, now, self._step, reason=reason,
            request_ids=tuple(seq.request_id for seq in idle),
        ))

    def _make_room_for_decode(self, seq: Sequence, now: float, out: SchedulerOutput) -> bool:
        """Preempt the worst unscheduled running request until ``seq`` can grow.

        Returns False when ``seq`` itself is the worst and was preempted.
        """
        self._decode_preempted = True
        while not self.block_manager.can_append(seq, 1):
            victim = self._worst_unscheduled()
            if victim is None or victim is seq:
                self._preempt(seq, now, out, d.REASON_OUT_OF_BLOCKS, seq)
                return False
            self._preempt(victim, now, out, d.REASON_OUT_OF_BLOCKS, seq)
        return True

    def _worst_unscheduled(self) -> Sequence | None:
        running = self.running
        for i in range(len(running) - 1, -1, -1):
            if not running[i].num_scheduled_tokens:
                return running[i]
        return None

    def _make_room_for_admission(
        self, seq: Sequence, now: float, out: SchedulerOutput, reason: str, only_worse: bool
    ) -> bool:
        """Preempt running requests so ``seq`` gets a slot and its blocks.

        Victims are taken from the worst end of the running set, skipping requests
        already in this step; with ``only_worse`` only requests whose key is worse
        than ``seq``'s. Nothing is preempted unless the room can be found in full.
        """
        bm = self.block_manager
        need_blocks = bm.blocks_for(seq.num_tokens)
        free = bm.num_free_device_blocks
        slots = self.max_num_seqs - len(self.running)
        victims: list[Sequence] = []
        seq_order = _order(seq)
        # The same room test as can_allocate: keep the watermark free while others run.
        reserve = bm.watermark_blocks
        for i in range(len(self.running) - 1, -1, -1):
            if free - need_blocks >= reserve and slots >= 1:
                break
            victim = self.running[i]
            if victim.num_scheduled_tokens:
                continue
            if victim.promoted:
                # Itself admitted past its max wait, no token since: taking its place
                # back would let it and the newcomer evict each other forever without
                # either producing a token.
                continue
            if only_worse and _order(victim) <= seq_order:
                break  # sorted: everything further in is better than seq
            victims.append(victim)
            free += len(victim.block_table)
            slots += 1
        remaining = len(self.running) - len(victims)
        if free - need_blocks < (reserve if remaining else 0) or slots < 1:
            return False
        for victim in victims:
            self._preempt(victim, now, out, reason, seq)
        return True

    def _preempt(
        self, seq: Sequence, now: float, out: SchedulerOutput, reason: str, beneficiary: Sequence
    ) -> None:
        self.running.remove(seq)
        bm = self.block_manager
        detail = ""
        use_swap = self.config.preemption_mode != "recompute"
        if use_swap and not bm.can_swap_out(seq):
            # vLLM 0.6 raised and died here; we fall back per request and say so.
            use_swap = False
            detail = d.REASON_SWAP_SPACE_EXHAUSTED
        num_blocks = len(seq.block_table)
        thrown_away = 0 if use_swap else seq.num_computed_tokens
        if use_swap:
            out.blocks_to_swap_out.extend(bm.swap_out(seq))
            seq.status = SWAPPED
            seq.swapped_out_time = now
            seq.num_preemptions_swap += 1
            bisect.insort(self.swapped, seq, key=_order)
        else:
            bm.free(seq)
            # += : a request preempted again while re-prefilling still owes the tokens
            # it had not yet redone.
            seq.num_pending_recompute_tokens += seq.num_computed_tokens
            seq.num_computed_tokens = 0
            seq.num_preemptions_recompute += 1
            self._enqueue_waiting(seq, now)
        mode = "swap" if use_swap else "recompute"
        out.decisions.append(Decision(
            d.PREEMPT, now, self._step, seq.request_id, reason, mode=mode,
            beneficiary=beneficiary.request_id, num_blocks=num_blocks,
            num_tokens=thrown_away, detail=detail,
        ))
        if use_swap:
            out.decisions.append(Decision(
                d.SWAP_OUT, now, self._step, seq.request_id, reason, num_blocks=num_blocks
            ))

    def _admit(
        self, seq: Sequence, now: float, out: SchedulerOutput, reason: str, n: int
    ) -> None:
        """Move a waiting request into the running set and (if ``n``) into this step."""
        self.block_manager.allocate(seq)
        self.num_waiting -= 1
        seq.queue_version += 1  # its heap entries go stale
        seq.status = RUNNING
        seq.promoted = reason == d.REASON_MAX_WAIT  # protected until its next token
        seq.total_queue_s += now - seq.waiting_since
        bisect.insort(self.running, seq, key=_order)
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = now
            kind = d.ADMIT
        else:
            kind = d.RECOMPUTE
        out.decisions.append(Decision(
            kind, now, self._step, seq.request_id, reason,
            num_blocks=len(seq.block_table), num_tokens=seq.num_tokens,
        ))
        if n:
            self._schedule_one(seq, n, out)

    def _admit_promoted(self, now: float, out: SchedulerOutput, budget: int) -> int:
        still_waiting: list[Sequence] = []
        for seq in self._promoted:
            if seq.status is not WAITING or not seq.promoted:
                continue  # admitted, aborted or re-queued since promotion
            n = self._prefill_chunk(seq, budget) if budget else 0
            if n and self._make_room_for_admission(seq, now, out, d.REASON_MAX_WAIT, False):
                self._admit(seq, now, out, d.REASON_MAX_WAIT, n)
                budget -= n
            else:
                still_waiting.append(seq)
        self._promoted = still_waiting
        return budget

    def _preempt_for_waiting_head(self, now: float, out: SchedulerOutput, budget: int) -> int:
        """Priority scheduling: the best waiting request takes the place of worse running
        ones when it lacks a slot or blocks, and is admitted in this very step (before
        the decodes could spend the room it was given)."""
        head = self._peek_waiting()
        if head is None or not budget:
            return budget
        bm = self.block_manager
        if len(self.running) < self.max_num_seqs and bm.can_allocate(head, bool(self.running)):
            return budget  # it fits without anyone leaving
        n = self._prefill_chunk(head, budget)
        if n and self._make_room_for_admission(head, now, out, d.REASON_PRIORITY, True):
            heapq.heappop(self._waiting)
            self._admit(head, now, out, d.REASON_PRIORITY, n)
            budget -= n
        return budget

    def _schedule_swap_ins(self, now: float, out: SchedulerOutput, budget: int) -> int:
        bm = self.block_manager
        swapped = self.swapped
        while swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = swapped[0]
            # Static batching admits nobody while a batch (swapped members included) is
            # unfinished, and without chunked prefill nobody is admitted while requests
            # are swapped out: there the swapped request must not yield.
            if (self.policy.preempts_for_waiting and self.num_waiting and self.chunked
                    and not self.static):
                head = self._peek_waiting()
                if head is not None and _order(head) < _order(seq):
                    break  # a better waiting request goes first (it may have caused the swap)
            if not bm.can_swap_in(seq, bool(self.running)):
                break
            swapped.pop(0)
            out.blocks_to_swap_in.extend(bm.swap_in(seq))
            seq.status = RUNNING
            seq.total_swapped_s += now - seq.swapped_out_time
            seq.swapped_out_time = None
            bisect.insort(self.running, seq, key=_order)
            out.decisions.append(Decision(
                d.SWAP_IN, now, self._step, seq.request_id, d.REASON_POLICY_ORDER,
                num_blocks=len(seq.block_table),
            ))
            n = self._prefill_chunk(seq, budget)
            if n:
                bm.append_slots(seq, n)
                self._schedule_one(seq, n, out)
                budget -= n
        return budget

    def _schedule_waiting(self, now: float, out: SchedulerOutput, budget: int) -> int:
        bm = self.block_manager
        while budget > 0:
            seq = self._peek_waiting()
            if seq is None:
                break
            if len(self.running) >= self.max_num_seqs:
                self._note_wait(out, now, d.REASON_MAX_NUM_SEQS, seq)
                break
            n = self._prefill_chunk(seq, budget)
            if n == 0:
                self._note_wait(out, now, d.REASON_TOKEN_BUDGET, seq)
                break
            if not bm.can_allocate(seq, bool(self.running)):
                self._note_wait(out, now, d.REASON_OUT_OF_BLOCKS, seq)
                break
            heapq.heappop(self._waiting)
            self._admit(seq, now, out, d.REASON_POLICY_ORDER, n)
            budget -= n
        return budget

    def _note_wait(
        self, out: SchedulerOutput, now: float, reason: str, seq: Sequence | None = None
    ) -> None:
        """Record why the head of the queue waits, once per change of reason."""
        seq = seq or self._peek_waiting()
        if seq is None or self._last_wait == (seq.seq_no, reason):
            return
        self._last_wait = (seq.seq_no, reason)
        out.decisions.append(Decision(
            d.WAIT, now, self._step, seq.request_id, reason,
            num_blocks=self.block_manager.blocks_for(seq.num_tokens), num_tokens=seq.num_tokens,
        ))

    def _admit_static_batch(self, now: float, out: SchedulerOutput, budget: int) -> int | None:
        """Static batching: form a batch when none runs; returns None if still forming."""
        if self.running or self.swapped:
            if self.num_waiting:
                self._note_wait(out, now, d.REASON_STATIC_BATCH)
            return budget
        if not self.num_waiting:
            self._batch_open_since = None
            return None
        if self._batch_open_since is None:
            self._batch_open_since = now
        deadline = self._batch_open_since + self.config.static_batch_timeout_s
        if self.num_waiting < self.max_num_seqs and now < deadline:
            out.wake_at = deadline
            return None
        self._batch_open_since = None
        bm = self.block_manager
        while len(self.running) < self.max_num_seqs:
            seq = self._peek_waiting()
            if seq is None:
                break
            if not bm.can_allocate(seq, bool(self.running)):
                self._note_wait(out, now, d.REASON_OUT_OF_BLOCKS, seq)
                break
            heapq.heappop(self._waiting)
            self._admit(seq, now, out, d.REASON_STATIC_BATCH, 0)
        return budget

    # -- after the step ------------------------------------------------------------
    def update(
        self, out: SchedulerOutput, sampled: list[int | None], now: float
    ) -> list[Sequence]:
        """Apply a step's results: count computed tokens, append sampled tokens,
        finish requests that stopped. ``sampled`` is aligned with ``out.seqs``.

        Returns the requests that finished in this step.
        """
        finished: list[Sequence] = []
        eos = self.eos_token_id
        max_model_len = self.config.max_model_len
        for seq, token in zip(out.seqs, sampled, strict=True):
            n = seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            if seq.status is not RUNNING:
                continue  # aborted while the step ran
            seq.num_computed_tokens += n
            if seq.num_pending_recompute_tokens:
                redone = min(n, seq.num_pending_recompute_tokens)
                seq.num_recomputed_tokens += redone
                seq.num_pending_recompute_tokens -= redone
            if token is None:
                continue
            # Append the token and track inter-token gaps (once per generated token).
            if seq.promoted:
                seq.promoted = False  # a max-wait admission made progress: no longer protected
            seq.output_token_ids.append(token)
            seq.num_tokens += 1
            last = seq.last_token_time
            if last is None:
                seq.first_token_time = now
            else:
                gap = now - last
                if gap > seq.max_itl_s:
                    seq.max_itl_s = gap
                if gap >= STALL_FLOOR_S:
                    seq.long_gaps.append((last, gap))
            seq.last_token_time = now
            params = seq.params
            num_output = seq.num_tokens - seq.num_prompt_tokens
            if num_output >= params.min_tokens and (
                (token == eos and not params.ignore_eos) or token in params.stop_token_ids
            ):
                self._finish(seq, SequenceStatus.FINISHED_STOPPED, now)
                finished.append(seq)
            elif num_output >= params.max_tokens or seq.num_tokens >= max_model_len:
                self._finish(seq, SequenceStatus.FINISHED_LENGTH, now)
                finished.append(seq)
        return finished

    def _finish(self, seq: Sequence, status: SequenceStatus, now: float) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        del self.requests[seq.request_id]
        seq.status = status
        seq.finished_time = now

    # -- checking --------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError if queues, counts or blocks are inconsistent."""
        live = list(self.requests.values())
        self.block_manager.check_invariants(live)
        assert len(self.running) <= self.max_num_seqs, "max_num_seqs exceeded"
        assert all(s.status is RUNNING for s in self.running)
        assert all(s.status is SWAPPED for s in self.swapped)
        assert self.running == sorted(self.running, key=_order), "running set out of order"
        waiting = [s for s in live if s.status is WAITING]
        assert len(waiting) == self.num_waiting, "waiting count drifted"
        assert all(not s.block_table for s in waiting), "a waiting request holds blocks"
        assert len(self.running) + len(self.swapped) + len(waiting) == len(live)
