"""The scheduler: which tokens of which requests go into the next step, and why.

One step, continuous batching over a paged KV cache (vLLM-style), in this order:

1. admissions ahead of the running requests (``engine.core.sched.admission``), as the batching
   regime says (``engine.core.sched.batching``): requests past ``max_wait_s`` first, preempting
   if they must; then, under a policy that preempts for waiting requests (priority),
   the best waiting request takes the room of worse running ones;
2. running decodes, then running prefill chunks, in policy order; when a decode
   needs a block and none is free, the worst running request is preempted
   (``engine.core.sched.preemption``); requests beyond the token budget are left out
   ("idle running", trap 1);
3. swap-ins, in policy order;
4. new prefills from the waiting queue (``engine.core.sched.waiting_queue``), in policy order,
   chunked under the token budget.

Both budgets (``max_num_seqs``, ``max_num_batched_tokens``) hold in every step.
Every choice is appended to the step's decisions as a plain record. The scheduler
handles sequences and block ids only: no tensors, no telemetry, no timing of
tokens (that is an observer of step records: ``engine.records.token_times``).

Cost: a step is O(running + admitted + preempted); the waiting queue is a heap with
lazy deletion, so no per-step work grows with the number of waiting requests.
"""

from __future__ import annotations

import bisect
from typing import Protocol

from engine.config import SchedulerConfig
from engine.core import decisions as d
from engine.core.block_manager import BlockManager
from engine.core.cost_model import CostModel
from engine.core.decisions import Decision
from engine.core.request import EngineRequest
from engine.core.sched.admission import Admission, prefill_chunk
from engine.core.sched.batching import make_batching
from engine.core.sched.policy import Policy, make_policy
from engine.core.sched.preemption import Preemptor, policy_order
from engine.core.sched.scheduler_output import SchedulerOutput
from engine.core.sched.waiting_queue import WaitingQueue
from engine.core.sequence import Sequence, SequenceStatus

WAITING = SequenceStatus.WAITING
RUNNING = SequenceStatus.RUNNING
SWAPPED = SequenceStatus.SWAPPED


class SuppliedDecodes(Protocol):
    """A step's running decodes, taken by the caller instead of the scheduler (the
    simulator's decode runs, ``engine.sim.decode_runs``): ``schedule(now, supplied)``
    calls :meth:`decode` where it would schedule the running decodes, then schedules
    :attr:`prefilling` and the admissions itself.

    The caller vouches for what the scheduler would otherwise find out: every running
    request is either one of the decodes (a plain decode, the budget room for all of
    them, a block for each that needs one) or in :attr:`prefilling`."""

    @property
    def prefilling(self) -> list[Sequence]:
        """The running requests that are not decoding, in running order."""
        ...

    def decode(self) -> tuple[int, int]:
        """Schedule the decodes (blocks taken in running order, as the scheduler takes
        them); returns their number and the sum of their context lengths."""
        ...


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        eos_token_id: int | None = None,
        cost_model: CostModel | None = None,
        first_step: int = 0,
        policy: Policy | None = None,
    ) -> None:
        """``cost_model`` prices swap against recompute for ``--preemption-mode auto``;
        step numbers start after ``first_step``. ``policy``: the ordering, when not the
        configured policy's (a planted fault, ``engine.faults``)."""
        self.config = config
        self.block_manager = block_manager
        self.policy: Policy = make_policy(config) if policy is None else policy
        self.eos_token_id = eos_token_id
        self.token_budget = config.token_budget
        self.max_num_seqs = config.max_num_seqs
        self.chunked = config.enable_chunked_prefill
        self.long_prefill_threshold = config.long_prefill_token_threshold
        self.long_prefill_adaptive = config.long_prefill_token_threshold_adaptive
        self.batching = make_batching(config, self.policy.preempts_for_waiting)

        self.requests: dict[str, Sequence] = {}  # unfinished requests by id
        self.running: list[Sequence] = []  # sorted by policy_order; never rebound
        self.swapped: list[Sequence] = []  # sorted by policy_order; never rebound
        self.waiting = WaitingQueue(config.max_wait_s)
        self.preemptor = Preemptor(
            config.preemption_mode,
            block_manager,
            cost_model or CostModel(),
            self.running,
            self.swapped,
            self.waiting,
        )
        self.admission = Admission(
            config, self.policy, block_manager, self.running, self.waiting, self.preemptor
        )
        self._next_seq_no = 0
        self._step = first_step
        self._pending: list[Decision] = []  # decisions taken between steps (reject, abort)
        self._ended: list[Sequence] = []  # requests that ended between steps

    # -- requests in and out ----------------------------------------------------------
    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    @property
    def num_steps(self) -> int:
        """The number of the last step scheduled."""
        return self._step

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def has_pending(self) -> bool:
        """Whether decisions or ends taken between steps await the next step record."""
        return bool(self._pending or self._ended)

    def add(self, request: EngineRequest, now: float) -> Sequence:
        """Accept a request that arrived at ``request.arrival_time`` (<= ``now``); it is
        WAITING, or FINISHED_REJECTED with a reason.

        Raises ValueError for caller mistakes (no arrival time, empty prompt, an id
        already in flight): those are not scheduling decisions.
        """
        if not request.prompt_token_ids:
            raise ValueError(f"request {request.request_id!r} has an empty prompt")
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        seq = Sequence(request, self._next_seq_no)
        self._next_seq_no += 1
        seq.policy_key = self.policy.key(seq)
        reason = self._reject_reason(seq)
        if reason is not None:
            seq.status = SequenceStatus.FINISHED_REJECTED
            seq.reject_reason = reason
            seq.finished_time = now
            self._pending.append(
                Decision(
                    d.REJECT,
                    now,
                    self._step,
                    seq.request_id,
                    reason,
                    num_blocks=self.block_manager.blocks_for(seq.max_total_tokens),
                    num_tokens=seq.max_total_tokens,
                )
            )
            self._ended.append(seq)
            return seq
        self.requests[seq.request_id] = seq
        self.waiting.push(seq, seq.arrival_time)
        return seq

    def _reject_reason(self, seq: Sequence) -> str | None:
        if seq.max_total_tokens > self.config.max_model_len:
            return d.REASON_EXCEEDS_MAX_MODEL_LEN
        if (
            self.block_manager.blocks_for(seq.max_total_tokens)
            > self.block_manager.num_device_blocks
        ):
            return d.REASON_EXCEEDS_KV_POOL
        if self.config.max_waiting is not None and self.num_waiting >= self.config.max_waiting:
            return d.REASON_QUEUE_FULL
        # vLLM 0.32 (AsyncLLM.check_admission): the unfinished requests plus this one
        # past the cap; the prompt tokens of requests with no token out yet (its API
        # server cannot see prefill progress or cache hits: whole prompts) at the cap.
        cap = self.config.max_num_queued_reqs
        if cap is not None and len(self.requests) + 1 > cap:
            return d.REASON_MAX_NUM_QUEUED_REQS
        cap = self.config.max_num_queued_tokens
        if cap is not None and self._prefill_backlog_tokens() >= cap:
            return d.REASON_MAX_NUM_QUEUED_TOKENS
        return None

    def _prefill_backlog_tokens(self) -> int:
        """The prompt tokens of the unfinished requests that have produced no token."""
        return sum(
            s.num_prompt_tokens for s in self.requests.values() if s.first_token_time is None
        )

    def abort(self, request_id: str, now: float) -> Sequence | None:
        """Finish a request as aborted and free its blocks. Call between steps."""
        seq = self.requests.get(request_id)
        if seq is None:
            return None
        self._remove(seq, now, SequenceStatus.FINISHED_ABORTED)
        self._pending.append(Decision(d.ABORT, now, self._step, request_id, d.REASON_CLIENT))
        self._ended.append(seq)
        return seq

    def fail(self, seqs: list[Sequence], now: float, error: str, reason: str) -> list[Decision]:
        """Finish requests whose step failed; free their blocks. Returns the ``fail``
        decisions (the caller puts them into the step's record)."""
        failed = []
        for seq in seqs:
            if self.requests.get(seq.request_id) is seq:
                seq.error = error
                # Its KV of the failed step may never have been written: cache nothing.
                self._remove(seq, now, SequenceStatus.FINISHED_ERROR, keep_cached=False)
                failed.append(
                    Decision(d.FAIL, now, self._step, seq.request_id, reason, detail=error)
                )
        return failed

    def _remove(
        self, seq: Sequence, now: float, status: SequenceStatus, keep_cached: bool = True
    ) -> None:
        """Take an unfinished request out of whichever queue holds it, free its blocks."""
        del self.requests[seq.request_id]
        if seq.status is RUNNING:
            self.running.remove(seq)
        elif seq.status is SWAPPED:
            self.swapped.remove(seq)
            seq.total_swapped_s += now - (seq.swapped_out_time or now)
        else:
            self.waiting.remove(seq, now)
        self.block_manager.free(seq, keep_cached)
        seq.num_scheduled_tokens = 0
        seq.status = status
        seq.finished_time = now

    def drain_pending(self) -> tuple[list[Decision], list[Sequence]]:
        """Decisions and ends taken outside a step not yet reported (the next step's
        output reports them otherwise)."""
        pending, ended = self._pending, self._ended
        self._pending, self._ended = [], []
        return pending, ended

    # -- building a step -----------------------------------------------------------
    def schedule(self, now: float, supplied: SuppliedDecodes | None = None) -> SchedulerOutput:
        """The next step. ``supplied``: its running decodes are taken by the caller
        (:class:`SuppliedDecodes`; ``out.seqs`` then holds only the rest of the step,
        its counts the whole step)."""
        self._step += 1
        out = SchedulerOutput(self._step, now)
        out.decisions, out.ended_between_steps = self.drain_pending()
        self.preemptor.decode_preempted = False
        evicted_before = self.block_manager.num_evicted_blocks
        # One cap for the whole step, from the counts at its start (as vLLM's).
        self.admission.prefill_cap = self.long_prefill_cap()
        budget = self.batching.admit_before_running(self, out, now, self.token_budget)
        if budget is not None:
            if supplied is None:
                budget = self._schedule_running(out, now, budget)
            else:
                budget = self._schedule_supplied(out, now, budget, supplied)
            if self.swapped and budget > 0 and not self.preemptor.decode_preempted:
                budget = self._schedule_swap_ins(out, now, budget)
            self.batching.admit_after_running(self, out, now, budget)
        out.num_running = len(self.running)
        out.num_waiting = self.num_waiting
        out.num_swapped = len(self.swapped)
        out.num_evicted_blocks = self.block_manager.num_evicted_blocks - evicted_before
        return out

    def long_prefill_cap(self) -> int:
        """vLLM's ``long_prefill_token_threshold`` as it holds for a step built now: the
        most tokens one request computes in it, 0 for no cap — none while at most one
        request runs or waits (nobody to starve); with the adaptive flag, at least the
        token budget over the requests running and waiting."""
        threshold = self.long_prefill_threshold
        if not threshold:
            return 0
        eligible = len(self.running) + self.num_waiting + len(self.swapped)
        if eligible <= 1:
            return 0
        if self.long_prefill_adaptive:
            return max(threshold, self.token_budget // eligible)
        return threshold

    def _schedule_running(self, out: SchedulerOutput, now: float, budget: int) -> int:
        bm = self.block_manager
        block_size = bm.block_size
        decodes: list[Sequence] = []
        prefills: list[Sequence] = []
        for seq in self.running:
            if seq.num_scheduled_tokens:
                continue  # admitted earlier in this step
            # Sequence.is_decoding, inlined: a property call here costs ~15% of a step
            # with 256 running (callgrind, benchmarks/bench_scheduler.py). The checking
            # executor of the scheduler tests holds the step's counts to the property.
            computed = seq.num_computed_tokens
            if seq.num_tokens - computed == 1 and computed >= seq.num_prompt_tokens:
                decodes.append(seq)
            else:
                prefills.append(seq)
        idle: list[Sequence] = []
        scheduled = out.seqs
        # out.add(seq, 1), inlined below with the counts kept in locals and written
        # once: the one per-sequence path of every step.
        num_decodes = decode_context_tokens = 0
        for seq in decodes:
            if seq.status is not RUNNING:
                continue  # preempted earlier in this loop to make room
            if budget == 0:
                idle.append(seq)
                continue
            if seq.num_tokens > len(seq.block_table) * block_size:
                if not bm.can_append(seq) and not self.preemptor.make_room_for_decode(
                    seq, now, out
                ):
                    continue  # seq itself was preempted
                bm.append_slots(seq, 1)
            seq.num_scheduled_tokens = 1
            scheduled.append(seq)
            num_decodes += 1
            decode_context_tokens += seq.num_tokens
            budget -= 1
        out.is_decode.extend([True] * num_decodes)  # the loop appended only decodes
        out.num_decode_seqs += num_decodes
        out.num_decode_context_tokens += decode_context_tokens
        budget = self._schedule_prefills(out, budget, prefills, idle)
        self.record_idle(out, now, idle, d.REASON_TOKEN_BUDGET)
        return budget

    def _schedule_supplied(
        self, out: SchedulerOutput, now: float, budget: int, supplied: SuppliedDecodes
    ) -> int:
        """``_schedule_running`` with the decodes taken by ``supplied``."""
        num_decodes, decode_context_tokens = supplied.decode()
        out.num_decode_seqs += num_decodes
        out.num_decode_context_tokens += decode_context_tokens
        idle: list[Sequence] = []
        budget = self._schedule_prefills(out, budget - num_decodes, supplied.prefilling, idle)
        self.record_idle(out, now, idle, d.REASON_TOKEN_BUDGET)
        return budget

    def _schedule_prefills(
        self, out: SchedulerOutput, budget: int, prefills: list[Sequence], idle: list[Sequence]
    ) -> int:
        """Running prefill chunks, in running order, under ``budget``; those left out
        go to ``idle``. Returns the budget left."""
        cap = self.admission.prefill_cap
        for seq in prefills:
            if seq.status is not RUNNING:
                continue
            n = prefill_chunk(seq, budget, self.chunked, 0, cap) if budget else 0
            if n == 0:
                idle.append(seq)
                continue
            if self.block_manager.enable_prefix_caching:
                self.block_manager.register(seq, seq.num_computed_tokens + n)
            out.add(seq, n)
            budget -= n
        return budget

    @property
    def decode_preempted(self) -> bool:
        """Whether a running decode had to preempt another for room in this step."""
        return self.preemptor.decode_preempted

    def record_idle(
        self, out: SchedulerOutput, now: float, idle: list[Sequence], reason: str
    ) -> None:
        """Running requests left out of this step: one record listing them all."""
        if not idle:
            return
        for seq in idle:
            seq.num_idle_running_steps += 1
        out.decisions.append(
            Decision(
                d.IDLE_RUNNING,
                now,
                self._step,
                reason=reason,
                request_ids=tuple(seq.request_id for seq in idle),
            )
        )

    def _schedule_swap_ins(self, out: SchedulerOutput, now: float, budget: int) -> int:
        bm = self.block_manager
        swapped = self.swapped
        while swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = swapped[0]
            if self.batching.swap_ins_yield_to_waiting and len(self.waiting):
                head = self.waiting.peek()
                if head is not None and policy_order(head) < policy_order(seq):
                    break  # a better waiting request goes first (it may have caused the swap)
            if not bm.can_swap_in(seq, bool(self.running)):
                break
            swapped.pop(0)
            out.blocks_to_swap_in.extend(bm.swap_in(seq))
            seq.status = RUNNING
            swapped_out_time = seq.swapped_out_time
            assert swapped_out_time is not None  # set by the swap-out that put it here
            seq.total_swapped_s += now - swapped_out_time
            seq.swapped_out_time = None
            bisect.insort(self.running, seq, key=policy_order)
            out.decisions.append(
                Decision(
                    d.SWAP_IN,
                    now,
                    self._step,
                    seq.request_id,
                    d.REASON_POLICY_ORDER,
                    num_blocks=len(seq.block_table),
                )
            )
            n = prefill_chunk(seq, budget, self.chunked, 0, self.admission.prefill_cap)
            if n:
                bm.append_slots(seq, n)
                bm.register(seq, seq.num_computed_tokens + n)
                out.add(seq, n)
                budget -= n
        return budget

    # -- after the step ------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled: list[int | None], now: float) -> list[Sequence]:
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
            seq.promoted = False  # a max-wait admission made progress: no longer protected
            seq.output_token_ids.append(token)
            num_tokens = seq.num_tokens = seq.num_tokens + 1
            params = seq.params
            num_output = num_tokens - seq.num_prompt_tokens
            # The token tests first (cheap, and false for most tokens), then the count.
            if (
                (token == eos and not params.ignore_eos) or token in params.stop_token_ids
            ) and num_output >= params.min_tokens:
                self._finish(seq, SequenceStatus.FINISHED_STOPPED, now)
                finished.append(seq)
            elif num_output >= params.max_tokens or num_tokens >= max_model_len:
                self._finish(seq, SequenceStatus.FINISHED_LENGTH, now)
                finished.append(seq)
        return finished

    def _finish(self, seq: Sequence, status: SequenceStatus, now: float) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        del self.requests[seq.request_id]
        seq.status = status
        seq.finished_time = now

    # -- steps with no choice in them (the simulator's decode runs) ------------------
    def leaves_running_alone(self, now: float) -> bool:
        """Whether a step at ``now`` takes no decision about the running requests
        before it schedules them: nothing pending, swapped or promoted, and waiting
        requests (if any) admitted only into what the running requests leave (the
        regime's way, no max-wait promotion due, no claim on a running request's room).
        The simulator's decode runs supply such steps' decodes (``schedule(now,
        supplied)``). O(1)."""
        if self._pending or self._ended or self.swapped or self.waiting.promoted:
            return False
        if not len(self.waiting):
            return True
        return self.batching.admits_after_running_only and not (
            self.admission.acts_ahead_of_running(now)
        )

    def count_plain_steps(self, num_steps: int) -> None:
        """Number ``num_steps`` more steps (plain decode steps taken without
        ``schedule``)."""
        self._step += num_steps

    def finish_running(self, seq: Sequence, status: SequenceStatus, now: float) -> None:
        """End a running request as ``update`` does (out of the running set, blocks
        freed)."""
        self._finish(seq, status, now)

    # -- checking --------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError if queues, counts or blocks are inconsistent."""
        live = list(self.requests.values())
        self.block_manager.check_invariants(live)
        assert len(self.running) <= self.max_num_seqs, "max_num_seqs exceeded"
        assert all(s.status is RUNNING for s in self.running)
        assert all(s.status is SWAPPED for s in self.swapped)
        assert self.running == sorted(self.running, key=policy_order), "running set out of order"
        waiting = [s for s in live if s.status is WAITING]
        assert len(waiting) == self.num_waiting, "waiting count drifted"
        assert all(not s.block_table for s in waiting), "a waiting request holds blocks"
        assert len(self.running) + len(self.swapped) + len(waiting) == len(live)
