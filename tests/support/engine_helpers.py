"""Helpers for driving the simulated engine in tests (no harness, virtual clock).

``make_engine`` builds an ``LLMEngine.simulated`` with a :class:`CheckingExecutor`
that inspects every step at execute time (when ``num_scheduled_tokens`` is still
set); ``drive`` feeds arrivals and aborts at their times and steps the engine
until everything has ended, failing (never hanging) after ``max_steps``.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core import decisions as d
from engine.core.cost_model import CostModel
from engine.core.decisions import Decision
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sched.scheduler_output import SchedulerOutput
from engine.core.sequence import Sequence, SequenceStatus
from engine.executor import StepResult
from engine.factory import build_simulated_engine
from engine.llm_engine import LLMEngine
from engine.records.step_record import StepRecord
from engine.sim.simulated_executor import SimulatedExecutor

#: Every non-empty step takes exactly this long (a power of two: exact float sums).
STEP_S = 1 / 64


def constant_cost(step_s: float = STEP_S) -> CostModel:
    """A cost model where every non-empty step lasts ``step_s``."""
    return CostModel.constant(step_s)


@dataclass(frozen=True)
class Req:
    id: str
    arrival: float = 0.0
    prompt_len: int = 4
    max_tokens: int = 4
    oracle: int | None = None  # true output length (EOS after it); None: run to max_tokens
    priority: int = 0
    #: The prompt's token ids; None: ``prompt_len`` tokens that share no full block with
    #: any other request's (the first token is the id's), as independent users' prompts
    #: would (prefix caching finds nothing in them).
    prompt: tuple[int, ...] | None = None

    @property
    def prompt_token_ids(self) -> list[int]:
        if self.prompt is not None:
            return list(self.prompt)
        return [1000 + zlib.crc32(self.id.encode()) % 100_000, *range(11, 10 + self.prompt_len)]

    @property
    def expected_output(self) -> int:
        return self.max_tokens if self.oracle is None else min(self.oracle, self.max_tokens)


@dataclass
class ExecRecord:
    """What the executor saw in one step, read before ``update`` resets counts."""

    step: int
    seq_ids: list[str]
    scheduled: dict[str, int]
    total_scheduled: int


class CheckingExecutor(SimulatedExecutor):
    """The simulated executor plus checks of what a real model runner relies on."""

    def __init__(self, cost_model: CostModel, block_size: int) -> None:
        super().__init__(cost_model)
        self.block_size = block_size
        self.records: list[ExecRecord] = []
        self.scheduled_per_seq: dict[str, int] = defaultdict(int)
        self.block_manager = None  # set by make_engine

    def execute(self, out: SchedulerOutput) -> StepResult:
        bm = self.block_manager
        ids = [s.request_id for s in out.seqs]
        assert len(ids) == len(set(ids)), f"a sequence scheduled twice in one step: {ids}"
        scheduled: dict[str, int] = {}
        for seq in out.seqs:
            n = seq.num_scheduled_tokens
            assert seq.status is SequenceStatus.RUNNING, f"{seq} scheduled but not running"
            assert n >= 1, f"{seq} in the step with {n} scheduled tokens"
            assert seq.num_computed_tokens + n <= seq.num_tokens, f"{seq} over-scheduled by {n}"
            assert bm is None or not bm.is_on_host(seq), f"{seq} scheduled while on the host"
            # Every token computed in this step needs a KV slot on the device.
            assert len(seq.block_table) * self.block_size >= seq.num_computed_tokens + n, (
                f"{seq}: {n} tokens scheduled without KV slots"
            )
            scheduled[seq.request_id] = n
            self.scheduled_per_seq[seq.request_id] += n
        # The step's decode/prefill counts follow the one definition of a decode
        # (the scheduler inlines it on its hot path).
        assert out.is_decode == [seq.is_decoding for seq in out.seqs]
        decodes = [seq for seq in out.seqs if seq.is_decoding]
        assert out.num_decode_seqs == len(decodes), (out.num_decode_seqs, len(decodes))
        assert out.num_decode_context_tokens == sum(seq.num_tokens for seq in decodes)
        assert out.num_prefill_seqs == len(out.seqs) - len(decodes)
        total = sum(scheduled.values())
        self.records.append(ExecRecord(out.step, ids, scheduled, total))
        return super().execute(out)


def make_engine(
    *,
    block_size: int = 4,
    gpu_blocks: int = 64,
    cpu_blocks: int = 64,
    watermark: float = 0.0,
    cost_model: CostModel | None = None,
    enable_prefix_caching: bool = True,
    **scheduler_knobs,
) -> LLMEngine:
    config = EngineConfig(
        SchedulerConfig(**scheduler_knobs),
        CacheConfig(
            block_size=block_size,
            num_gpu_blocks_override=gpu_blocks,
            num_cpu_blocks_override=cpu_blocks,
            watermark=watermark,
            enable_prefix_caching=enable_prefix_caching,
        ),
    )
    engine = build_simulated_engine(config, cost_model=cost_model or constant_cost())
    executor = CheckingExecutor(engine.executor.cost_model, block_size)
    executor.block_manager = engine.block_manager
    engine.executor = executor
    return engine


def add(engine: LLMEngine, req: Req) -> Sequence:
    return engine.add_request(
        EngineRequest(
            req.id,
            req.prompt_token_ids,
            SamplingParams(max_tokens=req.max_tokens),
            arrival_time=req.arrival,
            priority=req.priority,
            oracle_output_tokens=req.oracle,
        )
    )


@dataclass
class Trace:
    engine: LLMEngine
    seqs: dict[str, Sequence] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    #: Every decision, in order, including ones taken after the last step.
    decisions: list[Decision] = field(default_factory=list)

    def of(self, kind: str, request_id: str | None = None) -> list[Decision]:
        return [
            x
            for x in self.decisions
            if x.kind == kind and (request_id is None or x.request_id == request_id)
        ]

    def admission_order(self) -> list[str]:
        return [x.request_id for x in self.decisions if x.kind == d.ADMIT]

    def step_of(self, decision: Decision) -> StepRecord:
        return next(s for s in self.steps if s.step == decision.step)


class Stuck(AssertionError):
    pass


def drive(
    engine: LLMEngine,
    reqs: Iterable[Req],
    aborts: Iterable[tuple[float, str]] = (),
    *,
    max_steps: int = 20_000,
    max_stall_steps: int | None = None,
    on_step: Callable[[StepRecord, Trace], None] | None = None,
    before_step: Callable[[Trace], None] | None = None,
    trace: Trace | None = None,
) -> Trace:
    """Run ``reqs`` (arriving at their times) to completion; aborts at (time, id).

    Raises :class:`Stuck` after ``max_steps`` steps, or after ``max_stall_steps``
    consecutive steps in which no request produced a token or ended (a livelock).
    """
    clock = engine.clock
    pending = sorted(reqs, key=lambda r: (r.arrival, r.id))
    abort_list = sorted(aborts)
    trace = trace or Trace(engine)
    stalled = 0
    for _ in range(max_steps):
        now = clock.now()
        while pending and pending[0].arrival <= now:
            req = pending.pop(0)
            trace.seqs[req.id] = add(engine, req)
        while abort_list and abort_list[0][0] <= now:
            _, rid = abort_list.pop(0)
            engine.abort(rid)  # None when already finished or never added
        upcoming = [pending[0].arrival] if pending else []
        upcoming += [abort_list[0][0]] if abort_list else []
        next_event = min(upcoming, default=None)
        if not engine.has_work():
            if next_event is None:
                return trace
            clock.advance_to(next_event)
            continue
        if before_step is not None:
            before_step(trace)
        record = engine.step()
        # The engine turns an executor exception into FINISHED_ERROR requests; in
        # simulation the only such exceptions are CheckingExecutor's assertions.
        assert record.error is None, f"step {record.step} failed: {record.error}"
        trace.steps.append(record)
        trace.decisions.extend(record.decisions)
        if on_step is not None:
            on_step(record, trace)
        progressed = record.finished or record.emitted()
        stalled = 0 if progressed else stalled + 1
        if max_stall_steps is not None and stalled > max_stall_steps:
            last = [(x.kind, x.request_id, x.reason, x.mode) for x in trace.decisions[-6:]]
            raise Stuck(
                f"livelock: no token produced in {stalled} steps (step {record.step}, "
                f"t={record.execute_end:.6f}): running={engine.scheduler.running} "
                f"swapped={engine.scheduler.swapped} waiting={engine.scheduler.num_waiting}; "
                f"last decisions: {last}"
            )
        if record.execute_end == record.schedule_start and record.is_empty:
            # Nothing ran and no time passed: move to the next thing that can change.
            targets = [t for t in (record.wake_at, next_event) if t is not None]
            if targets:
                clock.advance_to(min(targets))
    raise Stuck(
        f"not done after {max_steps} steps: {engine.scheduler.num_unfinished} unfinished, "
        f"running={len(engine.scheduler.running)} swapped={len(engine.scheduler.swapped)} "
        f"waiting={engine.scheduler.num_waiting}"
    )


def run_one_step(engine: LLMEngine, at: float | None = None) -> StepRecord:
    if at is not None:
        engine.clock.advance_to(at)
    return engine.step()
