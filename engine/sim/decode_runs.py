"""Decode runs: consecutive simulated steps taken in O(changes) per step instead of
O(running), their running decodes supplied rather than scheduled one by one.

In a step where the scheduler takes no decision about its running requests
(``Scheduler.leaves_running_alone``: nothing pending, swapped or promoted, and any
waiting requests only admitted into what the running requests leave), every running
request that is decoding decodes one token, in running order, each taking a block when
it crosses a block boundary. Those decodes — the run's *members* — differ from one
step to the next only in their context lengths and in the requests that end or join.
A run takes them as the engine's step would, with the same integer features fed to the
same cost model and the same clock additions (so every float comes out bit-identical),
but keeps each member's token count, tokens and token times for the run as a whole,
applying them when it leaves the run (it finishes, or the run ends).

The rest of such a step is the scheduler's and the engine's own code: a step with
requests prefilling or waiting is ``Scheduler.schedule(now, supplied)`` with the
members' decodes supplied (:class:`engine.core.sched.scheduler.SuppliedDecodes`), the
executor's ``execute``, the engine's step record and ``Scheduler.update`` over the
prefill chunks and admissions; a request joins the run once its prefill is done and
it decodes. Steps of members only skip even that: no step output is built.

A run stops before any step that would differ: a decision about the running requests
(a preemption for a decode's block or a waiting request's claim, a max-wait promotion,
a request left out by the token budget), an arrival the caller does not admit into the
run, a decode the run cannot predict (stop tokens), no work left. Only choices there
are none of are skipped, never made differently: ``schedule`` makes the others. The
simulator's tests hold every output file of a run with decode runs to plain stepping,
byte for byte.

It serves the simulator only: it needs the simulated executor (tokens and durations
known in advance), a virtual clock, and observers that take the run's steps as it
hands them (``harness.simulate.driver``: no per-sequence entries for members in its records).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Protocol

from engine.core.block_manager import BlockManager
from engine.core.clock import VirtualClock, WallClock
from engine.core.sched.admission import prefill_chunk
from engine.core.sched.preemption import policy_order
from engine.core.sched.scheduler import Scheduler
from engine.core.sched.scheduler_output import SchedulerOutput
from engine.core.sequence import Sequence, SequenceStatus
from engine.core.token_timing import RunTokenTimes
from engine.executor import Executor, StepResult
from engine.records.step_record import StepRecord
from engine.records.token_times import record_token_times
from engine.sim.simulated_executor import SimulatedExecutor

RUNNING = SequenceStatus.RUNNING
NEVER = 1 << 62  # a step number no run reaches


class SimulatedEngine(Protocol):
    """What a run reads of an ``engine.llm_engine.LLMEngine`` (a layer above this
    one): its scheduler and block pools, its clock, its executor and its step record."""

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def block_manager(self) -> BlockManager: ...

    @property
    def clock(self) -> WallClock | VirtualClock: ...

    @property
    def executor(self) -> Executor: ...

    def step_record(
        self,
        out: SchedulerOutput,
        result: StepResult,
        schedule_start: float,
        execute_start: float,
        ended: float,
    ) -> StepRecord: ...


@dataclass(slots=True)
class DecodeSteps:
    """Consecutive steps of a run with nothing in them but its members' decodes, as
    columns: what their step records would hold. Every other field of those records is
    its default (nothing prefilled, waiting, swapped, idle or decided, no executor
    split, no idle wait after the run's first step)."""

    first_step: int  # the number of the first of them
    idle_before_s: float  # the first one's
    starts: list[float] = field(default_factory=list)  # schedule_start = execute_start
    ends: list[float] = field(default_factory=list)  # execute_end = token_time
    #: Sequences decoded: each step's num_decode_seqs and num_running as well.
    num_seqs: list[int] = field(default_factory=list)
    context_tokens: list[int] = field(default_factory=list)  # num_decode_context_tokens
    free_device_blocks: list[int] = field(default_factory=list)  # after scheduling
    #: Cached blocks evicted by a step's new blocks, by the step's index in the columns
    #: (only the steps that evicted any: most do not).
    evicted_blocks: dict[int, int] = field(default_factory=dict)
    num_device_blocks: int = 0
    num_free_host_blocks: int = 0
    num_host_blocks: int = 0
    swap_s: float = 0.0  # swap_out_s and swap_in_s: the executor's price of no blocks


class RunSink(Protocol):
    """Where a run hands its steps, in step order."""

    def step(self, record: StepRecord, num_seqs: int) -> None:
        """A step the scheduler scheduled (``num_seqs`` requests ran in it); its
        record's ``scheduled`` holds only the requests that are not members (prefill
        chunks, admissions), its ``finished`` every request that ended in it."""

    def decode_steps(self, steps: DecodeSteps) -> None:
        """Members-only steps, before the record of any later step."""

    def ended(self, step: int, seqs: list[Sequence]) -> None:
        """The requests that ended in members-only step number ``step`` (already ended
        in the scheduler), right after it."""


def supports_decode_runs(engine: SimulatedEngine) -> bool:
    """Whether ``engine`` is one decode runs reproduce exactly: the bare simulated
    executor (no planted delays) on a virtual clock, the executor's EOS the
    scheduler's. Its prices are finite: a CostModel refuses any other (an infinite one
    would make gaps of ``inf - inf``, which the run's maxima do not order)."""
    executor = engine.executor
    return (
        type(executor) is SimulatedExecutor
        and not executor.sleep
        and isinstance(engine.clock, VirtualClock)
        and executor.eos_token_id == engine.scheduler.eos_token_id
    )


def _is_decoding(seq: Sequence) -> bool:
    """``Sequence.is_decoding``, inlined for the run's per-request checks."""
    computed = seq.num_computed_tokens
    return seq.num_tokens - computed == 1 and computed >= seq.num_prompt_tokens


def _can_join(seq: Sequence) -> bool:
    """Whether decoding ``seq``'s next steps are known in advance: no stop tokens (the
    executor never samples them, but the run does not check for them), no recompute
    left, a token before the run (its first run token's gap starts there)."""
    return (
        not seq.params.stop_token_ids
        and not seq.num_pending_recompute_tokens
        and seq.timing.last_token_time is not None
    )


class _Member:
    """One request of a run: the step of its first decode in the run, its counts then,
    and the step it ends in."""

    __slots__ = ("seq", "order", "first", "start_tokens", "end_step", "end_status", "eos_step")

    def __init__(self, seq: Sequence, first: int, max_model_len: int) -> None:
        self.seq = seq
        self.order = policy_order(seq)  # fixed while it runs
        self.first = first
        start_tokens = self.start_tokens = seq.num_tokens
        prompt = seq.num_prompt_tokens
        params = seq.params
        oracle = seq.oracle_output_tokens
        # Counted from its first run step (1): the simulated executor samples EOS from
        # the step in which the request's output reaches its oracle length (its step k
        # holds start_tokens + k - 1 tokens).
        self.eos_step = max(1, oracle - start_tokens + prompt) if oracle is not None else NEVER
        # Scheduler.update, in its order: stopped by EOS (from min_tokens on) first,
        # then the length limits.
        stop = NEVER
        if oracle is not None and not params.ignore_eos:
            stop = max(self.eos_step, params.min_tokens - start_tokens + prompt, 1)
        length = max(
            1, min(params.max_tokens - start_tokens + prompt, max_model_len - start_tokens)
        )
        if stop <= length:
            self.end_step, self.end_status = first - 1 + stop, SequenceStatus.FINISHED_STOPPED
        else:
            self.end_step, self.end_status = first - 1 + length, SequenceStatus.FINISHED_LENGTH

    def leave(self, last_step: int, times: RunTokenTimes, eos: int, filler: int) -> None:
        """Bring the sequence up to date after the run's steps up to ``last_step``."""
        num_steps = last_step - self.first + 1
        if num_steps <= 0:
            return  # joined after the run's last step: nothing to apply
        seq = self.seq
        seq.num_tokens = self.start_tokens + num_steps
        seq.num_computed_tokens = self.start_tokens + num_steps - 1
        fillers = min(num_steps, self.eos_step - 1)
        out = seq.output_token_ids
        out.extend([filler] * fillers)
        if num_steps > fillers:
            out.extend([eos] * (num_steps - fillers))
        seq.promoted = False
        times.apply(seq.timing, self.first - 1, num_steps)


_ORDER = attrgetter("order")


def can_start(engine: SimulatedEngine) -> bool:
    """Whether the next step of ``engine`` would be one a run takes (blocks aside: a
    run that finds a decode short of one takes no step)."""
    scheduler = engine.scheduler
    running = scheduler.running
    if not (running or len(scheduler.waiting)):
        return False
    if not scheduler.leaves_running_alone(engine.clock.now()):
        return False
    if len(running) > scheduler.token_budget:
        return False
    return all(_can_join(seq) or not _is_decoding(seq) for seq in running)


class _Run:
    """The state of one run: its members (by the step they end in and the step they
    next take a block in), the requests prefilling beside them, the run's token times.
    Also the decodes :meth:`Scheduler.schedule` is supplied with."""

    def __init__(self, engine: SimulatedEngine, eos: int, filler: int) -> None:
        self.scheduler = engine.scheduler
        self.bm = engine.block_manager
        self.free_pools = self.bm.free_pools  # (lists it mutates in place: read each step)
        self.block_size = self.bm.block_size
        self.max_model_len = self.scheduler.config.max_model_len
        self.eos, self.filler = eos, filler
        self.members: dict[int, _Member] = {}
        self.ends: dict[int, list[_Member]] = {}
        self.grows: dict[int, list[_Member]] = {}
        self.context = 0  # the members' context lengths, summed
        self.num = 0  # members
        #: The running requests that are not members (prefilling), in running order.
        self.prefilling: list[Sequence] = []
        self.blocked = False  # a request decodes that cannot join: the run must stop
        self.step = 0  # the step ``schedule(now, self)`` is taking (for ``decode``)
        self.times = RunTokenTimes()
        self.clock = engine.clock
        executor = engine.executor
        assert isinstance(executor, SimulatedExecutor)  # supports_decode_runs(engine)
        self.predict = executor.cost_model.decode_step_predictor()
        self.arrival: float | None = None  # the next arrival, as members-only steps left it
        for seq in self.scheduler.running:
            if not _is_decoding(seq):
                self.prefilling.append(seq)
            else:
                self.join(seq, 1)

    def join(self, seq: Sequence, first: int) -> None:
        """``seq`` decodes from the run's step ``first`` on."""
        member = _Member(seq, first, self.max_model_len)
        self.members[seq.seq_no] = member
        self.ends.setdefault(member.end_step, []).append(member)
        # Its step k schedules it with start + k - 1 tokens: it takes a block in the
        # first step where that count exceeds its blocks' room.
        tokens = seq.num_tokens
        grow = first - 1 + max(1, len(seq.block_table) * self.block_size - tokens + 2)
        self.grows.setdefault(grow, []).append(member)
        self.context += tokens
        self.num += 1

    def blocks_fit(self, step: int) -> bool:
        """Whether every member that crosses a block boundary in ``step`` finds a free
        block (else a decode would preempt: ``schedule`` decides that step)."""
        growing = self.grows.get(step)
        if not growing:
            return True
        live = [m for m in growing if m.seq.status is RUNNING]
        self.grows[step] = live
        free, evictable = self.free_pools
        return len(live) <= len(free) + len(evictable)

    def take_blocks(self, step: int) -> None:
        """The members' blocks of ``step`` (``blocks_fit`` checked), in running order,
        as the scheduler takes them."""
        growing = self.grows.pop(step, None)
        if not growing:
            return
        growing.sort(key=_ORDER)
        self.bm.append_blocks([m.seq for m in growing])
        later = self.grows.setdefault(step + self.block_size, [])
        later.extend(growing)

    def end_members(self, step: int, ended: float, finished: list[Sequence]) -> None:
        """After ``step`` (the members' context already counted a token up): end the
        members whose last step it was, in running order, as ``update`` ends them,
        appending them to ``finished``."""
        finishing = self.ends.pop(step, None)
        if not finishing:
            return
        finishing.sort(key=_ORDER)
        finish_running = self.scheduler.finish_running
        times, eos, filler = self.times, self.eos, self.filler
        for m in finishing:
            seq = m.seq
            m.leave(step, times, eos, filler)
            del self.members[seq.seq_no]
            finish_running(seq, m.end_status, ended)
            finished.append(seq)
            self.context -= seq.num_tokens
        self.num -= len(finishing)

    def take_decode_steps(
        self,
        step: int,
        arrival: float | None,
        steps: DecodeSteps,
        sink: RunSink,
        next_arrival: Callable[[], float | None],
    ) -> int:
        """Members-only steps after ``step``, into ``steps`` (numbered on from the
        scheduler's last), until ``arrival`` is due (read again after a step that ended
        requests, and left in :attr:`arrival`), no member is left, or one is short of a
        block. Returns the last step taken."""
        clock = self.clock
        predict = self.predict
        add_time = self.times.add_step
        grows, ends = self.grows, self.ends
        bm = self.bm
        free, evictable = self.free_pools
        num_free = len(free) + len(evictable)  # changes only where blocks are taken or freed
        add_start, add_end = steps.starts.append, steps.ends.append
        add_num, add_context = steps.num_seqs.append, steps.context_tokens.append
        add_free = steps.free_device_blocks.append
        num, context = self.num, self.context
        first = step
        now = clock.now()
        while arrival is None or arrival > now:
            j = step + 1
            if j in grows:
                if not self.blocks_fit(j):
                    break  # a decode would preempt: schedule() decides that step
                evicted = bm.num_evicted_blocks
                self.take_blocks(j)
                num_free = len(free) + len(evictable)
                if bm.num_evicted_blocks != evicted:
                    steps.evicted_blocks[len(steps.starts)] = bm.num_evicted_blocks - evicted
            duration = predict(num, context)
            # The clock's own addition (``advance`` adds to ``now``), done once here.
            ended = now + duration
            clock.advance(duration)
            add_time(ended)
            add_start(now)
            add_end(ended)
            add_num(num)
            add_context(context)
            add_free(num_free)
            context += num
            step = j
            now = ended
            if j in ends:
                self.context = context
                finished: list[Sequence] = []
                self.end_members(j, ended, finished)
                num_free = len(free) + len(evictable)
                num, context = self.num, self.context
                sink.ended(steps.first_step + j - first - 1, finished)
                arrival = next_arrival()
                if not num:
                    break
        self.scheduler.count_plain_steps(step - first)
        self.num, self.context = num, context
        self.arrival = arrival
        return step

    def admit_prefilled(self, scheduled: list[Sequence], step: int) -> None:
        """After a scheduled ``step``: its requests whose prefill is done join the run
        (from the next step), the others prefill on."""
        prefilling = []
        for seq in scheduled:
            if seq.status is not RUNNING:
                continue
            if not _is_decoding(seq):
                prefilling.append(seq)
            elif _can_join(seq):
                self.join(seq, step + 1)
            else:
                self.blocked = True
        if len(prefilling) > 1:
            prefilling.sort(key=policy_order)
        self.prefilling = prefilling

    def prefills_fit(self, budget: int, chunked: bool) -> bool:
        """Whether every prefilling request gets a chunk of ``budget`` (else one would
        sit the step out: ``schedule`` records that), under the step's long-prefill cap."""
        cap = self.scheduler.long_prefill_cap()
        for seq in self.prefilling:
            n = prefill_chunk(seq, budget, chunked, 0, cap) if budget else 0
            if not n:
                return False
            budget -= n
        return True

    def decode(self) -> tuple[int, int]:
        """``SuppliedDecodes.decode``: the members' decodes of the step being taken."""
        self.take_blocks(self.step)
        return self.num, self.context

    def leave_all(self, last_step: int) -> None:
        """The run ends after ``last_step``: bring every member up to date."""
        for m in self.members.values():
            m.leave(last_step, self.times, self.eos, self.filler)


def run_decodes(
    engine: SimulatedEngine,
    next_arrival: Callable[[], float | None],
    sink: RunSink,
    idle_before_s: float = 0.0,
    admit: Callable[[float], None] | None = None,
) -> int:
    """Take steps while the scheduler has no choice about the running requests
    (``can_start`` must hold), handing them to ``sink``. ``next_arrival()`` is read
    before the first step and after each that admitted or ended requests: once the
    clock has reached it, ``admit(now)`` adds the requests due (they wait, and are
    admitted as ``schedule`` admits them), or without ``admit`` the run stops.
    ``idle_before_s``: the first step's. Returns the number of steps taken."""
    scheduler = engine.scheduler
    bm = engine.block_manager
    clock = engine.clock
    executor = engine.executor
    assert isinstance(executor, SimulatedExecutor)  # supports_decode_runs(engine)
    cost = executor.cost_model
    budget = scheduler.token_budget
    chunked = scheduler.chunked
    waiting = scheduler.waiting
    run = _Run(engine, executor.eos_token_id, SimulatedExecutor.FILLER_TOKEN_ID)
    step = 0
    arrival = next_arrival()
    queued = len(waiting)
    while True:
        now = clock.now()
        if arrival is not None and arrival <= now:
            if admit is None:
                break
            admit(now)
            arrival = next_arrival()
            queued = len(waiting)
            if scheduler.has_pending():
                break  # a request rejected on arrival: its record is the next step's
        if run.blocked or run.num > budget:
            break
        j = step + 1
        if not (run.prefilling or queued):
            # Members only: the steps the scheduler would make, without their output.
            if not run.num:
                break
            steps = DecodeSteps(
                scheduler.num_steps + 1,
                idle_before_s if j == 1 else 0.0,
                num_device_blocks=bm.num_device_blocks,
                num_free_host_blocks=bm.num_free_host_blocks,
                num_host_blocks=bm.num_host_blocks,
                swap_s=cost.swap_block_s * 0,
            )
            last = run.take_decode_steps(step, arrival, steps, sink, next_arrival)
            if steps.starts:
                sink.decode_steps(steps)
            if last == step:
                break  # short of blocks, or nothing left
            step = last
            arrival = run.arrival
            continue
        # The scheduler's step, with the members' decodes supplied.
        if (
            not scheduler.leaves_running_alone(now)
            or not run.prefills_fit(budget - run.num, chunked)
            or not run.blocks_fit(j)
        ):
            break
        run.step = j
        out = scheduler.schedule(now, run)
        result = executor.execute(out)
        clock.advance(result.duration_s)
        ended = clock.now()
        run.times.add_step(ended)
        record = engine.step_record(out, result, now, now, ended)
        num_seqs = run.num + len(out.seqs)
        run.context += run.num
        run.end_members(j, ended, record.finished)
        record.finished.extend(scheduler.update(out, result.sampled, ended))
        record_token_times(record)
        run.admit_prefilled(out.seqs, j)
        if j == 1:
            record.idle_before_s = idle_before_s
        step = j
        queued = len(waiting)
        sink.step(record, num_seqs)
        if record.finished:
            arrival = next_arrival()
    if step:
        run.leave_all(step)
    return step
