"""Decode runs: consecutive simulated steps in which the scheduler has no choice to
make, taken in O(1) per step instead of O(running).

When nothing waits, nothing is swapped or pending and every running request is a
plain decode (``Scheduler.is_plain_decode_state``), the next step is certain: every
running request decodes one token, in running order, each taking a block when it
crosses a block boundary. Such steps differ only in their context lengths and in the
requests that end in them. A run takes them one after another, as the engine's step
would, with the same integer features fed to the same cost model and the same clock
additions (so every float comes out bit-identical), but keeps each request's token
count, tokens and token times for the run as a whole, applying them when the request
leaves the run (finishes, or the run ends). It stops before any step that would be
different: an arrival due, a block not free for every request crossing a boundary (a
preemption would follow), no request left.

Only the scheduler's choices are skipped, never made differently: a run ends where one
would have to be made, and ``schedule`` makes it. The simulator's tests hold every
output file of a run with decode runs to plain stepping, byte for byte.

It serves the simulator only: it needs the simulated executor (tokens and durations
known in advance), a virtual clock, and observers that take the run's steps as it
hands them (``harness.simulate``: no per-sequence entries in its records).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from engine.core.block_manager import BlockManager
from engine.core.clock import VirtualClock, WallClock
from engine.core.sched.preemption import policy_order
from engine.core.sched.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceStatus
from engine.core.token_timing import RunTokenTimes
from engine.executor import Executor
from engine.records.step_record import StepRecord
from engine.sim.simulated_executor import SimulatedExecutor

RUNNING = SequenceStatus.RUNNING
NEVER = 1 << 62  # a step number no run reaches


class SimulatedEngine(Protocol):
    """What a run reads of an ``engine.llm_engine.LLMEngine`` (a layer above this
    one): its scheduler and block pools, its clock and its executor."""

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def block_manager(self) -> BlockManager: ...

    @property
    def clock(self) -> WallClock | VirtualClock: ...

    @property
    def executor(self) -> Executor: ...


#: Called after each step of a run with its record (``scheduled`` left empty: the
#: record's requests are the running set of the step) and the number of requests that
#: decoded in it.
StepSink = Callable[[StepRecord, int], None]


def supports_decode_runs(engine: SimulatedEngine) -> bool:
    """Whether ``engine`` is one decode runs reproduce exactly: the bare simulated
    executor (no planted delays) on a virtual clock, the executor's EOS the
    scheduler's."""
    executor = engine.executor
    return (
        type(executor) is SimulatedExecutor
        and not executor.sleep
        and isinstance(engine.clock, VirtualClock)
        and executor.eos_token_id == engine.scheduler.eos_token_id
    )


class _Member:
    """One request of a run: its counts at the start and the step it ends in."""

    __slots__ = ("seq", "start_tokens", "end_step", "end_status", "eos_step")

    def __init__(self, seq: Sequence, start_tokens: int, max_model_len: int) -> None:
        self.seq = seq
        self.start_tokens = start_tokens
        prompt = seq.num_prompt_tokens
        params = seq.params
        oracle = seq.oracle_output_tokens
        # The simulated executor samples EOS from the step in which the request's
        # output reaches its oracle length (step j holds start_tokens + j - 1 tokens).
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
            self.end_step, self.end_status = stop, SequenceStatus.FINISHED_STOPPED
        else:
            self.end_step, self.end_status = length, SequenceStatus.FINISHED_LENGTH

    def leave(self, num_steps: int, times: RunTokenTimes, eos: int, filler: int) -> None:
        """Bring the sequence up to date after its first ``num_steps`` steps of the run."""
        seq = self.seq
        seq.num_tokens = self.start_tokens + num_steps
        seq.num_computed_tokens = self.start_tokens + num_steps - 1
        fillers = min(num_steps, self.eos_step - 1)
        out = seq.output_token_ids
        out.extend([filler] * fillers)
        if num_steps > fillers:
            out.extend([eos] * (num_steps - fillers))
        seq.promoted = False
        times.apply(seq.timing, num_steps)


def can_start(engine: SimulatedEngine) -> bool:
    """Whether the next step of ``engine`` would be a plain decode step a run takes."""
    scheduler = engine.scheduler
    if not scheduler.is_plain_decode_state():
        return False
    for seq in scheduler.running:
        params = seq.params
        if params.stop_token_ids or seq.timing.last_token_time is None:
            return False
    return True


def run_decodes(
    engine: SimulatedEngine,
    next_arrival: Callable[[], float | None],
    on_step: StepSink,
    idle_before_s: float = 0.0,
) -> int:
    """Take plain decode steps while nothing but decoding can happen (``can_start``
    must hold); ``next_arrival()`` is read before each step, the run stops once the
    clock has reached it. Each step's record goes to ``on_step`` (its ``finished``
    the requests that ended in it, already ended in the scheduler).
    ``idle_before_s``: the first step's. Returns the number of steps taken."""
    scheduler = engine.scheduler
    bm = engine.block_manager
    clock = engine.clock
    executor = engine.executor
    assert isinstance(executor, SimulatedExecutor)  # supports_decode_runs(engine)
    cost = executor.cost_model
    eos, filler = executor.eos_token_id, SimulatedExecutor.FILLER_TOKEN_ID
    block_size = bm.block_size
    max_model_len = scheduler.config.max_model_len
    swap_s = cost.swap_block_s * 0
    running = scheduler.running

    members: dict[int, _Member] = {}
    ends: dict[int, list[_Member]] = {}
    grows: dict[int, list[_Member]] = {}
    context = 0
    for seq in running:
        tokens = seq.num_tokens
        member = _Member(seq, tokens, max_model_len)
        members[seq.seq_no] = member
        ends.setdefault(member.end_step, []).append(member)
        # Step j schedules the request with start + j - 1 tokens: it takes a block in
        # the first step where that count exceeds its blocks' room.
        grow = max(1, len(seq.block_table) * block_size - tokens + 2)
        grows.setdefault(grow, []).append(member)
        context += tokens
    times = RunTokenTimes()
    num = len(running)
    step = 0
    while running:
        now = clock.now()
        arrival = next_arrival()
        if arrival is not None and arrival <= now:
            break
        j = step + 1
        growing = grows.get(j)
        if growing:
            growing = [m for m in growing if m.seq.status is RUNNING]
            if len(growing) > bm.num_free_device_blocks:
                break  # some decode would preempt: schedule() decides that step
            del grows[j]
            growing.sort(key=lambda m: policy_order(m.seq))
            for m in growing:
                seq = m.seq
                seq.num_computed_tokens = m.start_tokens + j - 2
                bm.append_slots(seq, 1)
                grows.setdefault(j + block_size, []).append(m)
        step = j
        number = scheduler.count_plain_step()
        duration = cost.predict_decode_step(num, context)
        clock.advance(duration)
        ended = clock.now()
        times.add_step(ended)
        record = StepRecord(
            number,
            now,
            now,
            ended,
            ended,
            num_decode_seqs=num,
            num_decode_context_tokens=context,
            num_running=num,
            swap_out_s=swap_s,
            swap_in_s=swap_s,
            idle_before_s=idle_before_s if j == 1 else 0.0,
        )
        record.num_free_device_blocks = bm.num_free_device_blocks
        record.num_device_blocks = bm.num_device_blocks
        record.num_free_host_blocks = bm.num_free_host_blocks
        record.num_host_blocks = bm.num_host_blocks
        decoded = num
        context += num
        finishing = ends.pop(j, None)
        if finishing:
            finishing.sort(key=lambda m: policy_order(m.seq))
            for m in finishing:
                m.leave(j, times, eos, filler)
                del members[m.seq.seq_no]
                scheduler.finish_running(m.seq, m.end_status, ended)
                record.finished.append(m.seq)
                context -= m.seq.num_tokens
            num -= len(finishing)
        on_step(record, decoded)
    if step:
        for m in members.values():
            m.leave(step, times, eos, filler)
    return step
