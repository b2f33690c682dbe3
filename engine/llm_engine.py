"""The engine: schedule -> execute -> postprocess, on a clock; one record per step.

``step()`` schedules, runs the executor, applies the results, and hands one
:class:`engine.records.step_record.StepRecord` to the observer list. Requests enter as
:class:`engine.core.request.EngineRequest` objects through :meth:`LLMEngine.add_request`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from engine.config import EngineConfig
from engine.core import decisions as d
from engine.core.block_manager import BlockManager
from engine.core.clock import VirtualClock, WallClock
from engine.core.cost_model import CostModel
from engine.core.kv_plan import KvPlan
from engine.core.request import EngineRequest
from engine.core.sched.policy import Policy
from engine.core.sched.scheduler import Scheduler
from engine.core.sched.scheduler_output import SchedulerOutput
from engine.core.sequence import Sequence
from engine.executor import Executor, StepResult
from engine.faults import Faults
from engine.records.observers import ObserverList
from engine.records.step_record import DECODE, PREFILL, RECOMPUTE, ScheduledSeq, StepRecord
from engine.records.token_times import record_token_times

if TYPE_CHECKING:
    from pathlib import Path


class ModelShapes(Protocol):
    """The model a torch engine runs, as the step loop names it: an
    ``engine.worker.model_config.ModelConfig``, not imported here (that module reaches
    torch, which the step loop never imports)."""

    @property
    def name(self) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_position_embeddings(self) -> int: ...

    @property
    def dtype(self) -> str: ...

    @property
    def eos_token_id(self) -> int: ...


class LLMEngine:
    """One engine instance. Not thread-safe: the async engine serialises calls."""

    #: The model a torch engine runs (set by ``engine.factory.build_torch_engine``);
    #: None for a simulated engine.
    model_config: ModelShapes | None = None
    #: The checkpoint directory a torch engine loaded; None for a preset with seeded
    #: random weights, and for a simulated engine.
    model_dir: Path | None = None
    #: The faults planted into this engine (set by ``engine.factory``); none by default.
    faults: Faults = Faults()

    def __init__(
        self,
        config: EngineConfig,
        executor: Executor,
        clock: WallClock | VirtualClock,
        kv_plan: KvPlan,
        eos_token_id: int | None = 2,
        cost_model: CostModel | None = None,
        policy: Policy | None = None,
    ) -> None:
        """``cost_model`` prices swap against recompute for ``--preemption-mode auto``
        (default: the simulated executor's, else the built-in one). ``policy``: the
        scheduler's ordering, when not the configured policy's (a planted fault)."""
        self.config = config
        self._policy = policy
        self.executor = executor
        self.clock = clock
        self.kv_plan = kv_plan
        self.eos_token_id = eos_token_id
        self.cost_model = cost_model or getattr(executor, "cost_model", None) or CostModel()
        #: Who hears about every step. Token timing goes first, so later observers
        #: read this step's token times.
        self.observers = ObserverList()
        self.observers.add(record_token_times)
        self.block_manager, self.scheduler = self._new_scheduler(first_step=0)

    def reset_scheduler(self) -> None:
        """Fresh, empty block pools and queues (after an unrecoverable step error).
        Step numbers go on from where they were."""
        self.block_manager, self.scheduler = self._new_scheduler(self.scheduler.num_steps)

    def _new_scheduler(self, first_step: int) -> tuple[BlockManager, Scheduler]:
        """Empty block pools sized by the KV plan, and a scheduler over them whose
        first step is numbered ``first_step``."""
        plan, cache = self.kv_plan, self.config.cache
        block_manager = BlockManager(
            cache.block_size,
            plan.num_device_blocks,
            plan.num_host_blocks,
            cache.watermark,
            cache.enable_prefix_caching,
        )
        scheduler = Scheduler(
            self.config.scheduler,
            block_manager,
            self.eos_token_id,
            self.cost_model,
            first_step=first_step,
            policy=self._policy,
        )
        return block_manager, scheduler

    @property
    def clock_epoch_unix(self) -> float:
        """The wall-clock Unix time of engine time 0: ``unix = epoch + engine time``."""
        return self.clock.epoch_unix

    # -- requests --------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> Sequence:
        """Admit ``request`` to the scheduler (stamped with the current engine time if
        it carries no arrival time). Returns its sequence: WAITING, or
        FINISHED_REJECTED with a reason. ValueError for caller mistakes."""
        now = self.clock.now()
        return self.scheduler.add(request.stamped(now), now)

    def abort(self, request_id: str) -> Sequence | None:
        return self.scheduler.abort(request_id, self.clock.now())

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def has_work(self) -> bool:
        """Unfinished requests, or ends and decisions a step record has yet to report."""
        return self.scheduler.has_unfinished() or self.scheduler.has_pending()

    # -- the loop body ---------------------------------------------------------------
    def step(self, idle_before_s: float = 0.0) -> StepRecord:
        """One step. ``idle_before_s``: how long the caller waited idle since the
        previous step (recorded, so that step cycles can be measured)."""
        clock = self.clock
        schedule_start = clock.now()
        out = self.scheduler.schedule(schedule_start)
        execute_start = clock.now()
        try:
            result = self.executor.execute(out)
        except Exception as exc:  # a failed step fails its requests, not the engine
            record = self._failed_step(
                out, schedule_start, execute_start, f"{type(exc).__name__}: {exc}"
            )
        else:
            clock.advance(result.duration_s)
            ended = clock.now()
            for i in result.sample_errors:
                result.sampled[i] = None  # a failed row emits no token, whatever it held
            record = self.step_record(out, result, schedule_start, execute_start, ended)
            if result.sample_errors:
                self._fail_samples(out, result.sample_errors, record, ended)
            record.finished.extend(self.scheduler.update(out, result.sampled, ended))
        record.idle_before_s = idle_before_s
        self.observers.notify(record)
        return record

    def recover(self, error: str) -> StepRecord:
        """After an exception outside the executor (a scheduler bug): fail every
        unfinished request, start over with empty pools, and report it all in one
        record."""
        scheduler = self.scheduler
        now = self.clock.now()
        failed = list(scheduler.requests.values())
        decisions = scheduler.fail(failed, now, error, d.REASON_ENGINE_ERROR)
        pending, ended = scheduler.drain_pending()
        self.reset_scheduler()
        record = StepRecord(
            scheduler.num_steps,
            now,
            now,
            now,
            now,
            error=error,
            decisions=pending + decisions,
            finished=ended + failed,
        )
        self._snapshot_pools(record)
        self.observers.notify(record)
        return record

    def _failed_step(
        self, out: SchedulerOutput, schedule_start: float, execute_start: float, error: str
    ) -> StepRecord:
        ended = self.clock.now()
        failed = list(out.seqs)
        # Requests swapped in or out in this step may not have had their blocks copied:
        # their KV cannot be trusted either.
        moved = {
            x.request_id
            for x in out.decisions
            if x.kind in (d.SWAP_OUT, d.SWAP_IN) and x.request_id is not None
        }
        requests = self.scheduler.requests
        failed += [
            seq for rid in moved if (seq := requests.get(rid)) is not None and seq not in failed
        ]
        record = self.step_record(
            out, StepResult([None] * len(out.seqs), 0.0), schedule_start, execute_start, ended
        )
        record.error = error
        record.decisions.extend(self.scheduler.fail(failed, ended, error, d.REASON_EXECUTOR_ERROR))
        record.finished.extend(failed)
        return record

    def _fail_samples(
        self, out: SchedulerOutput, errors: dict[int, str], record: StepRecord, now: float
    ) -> None:
        """Fail, each alone, the sequences whose token could not be sampled; the rest
        of the step stands. Before ``update``, which then skips them (no longer
        running); after ``step_record``, which reads their scheduled counts."""
        for i, error in errors.items():
            seq = out.seqs[i]
            failed = self.scheduler.fail([seq], now, error, d.REASON_SAMPLING_ERROR)
            if failed:  # not when it had already left the scheduler
                record.decisions.extend(failed)
                record.finished.append(seq)

    def step_record(
        self,
        out: SchedulerOutput,
        result: StepResult,
        schedule_start: float,
        execute_start: float,
        ended: float,
    ) -> StepRecord:
        """The step's record, read before ``update`` resets the scheduled counts."""
        record = StepRecord(
            out.step,
            schedule_start,
            execute_start,
            ended,
            ended,
            num_prefill_tokens=out.num_prefill_tokens,
            num_decode_seqs=out.num_decode_seqs,
            num_decode_context_tokens=out.num_decode_context_tokens,
            prefill_attention_work=out.prefill_attention_work,
            prefill_padded_attention_work=out.prefill_padded_attention_work,
            num_waiting=out.num_waiting,
            num_running=out.num_running,
            num_swapped=out.num_swapped,
            num_cached_tokens=out.num_cached_tokens,
            num_evicted_blocks=out.num_evicted_blocks,
            blocks_to_swap_out=out.blocks_to_swap_out,
            blocks_to_swap_in=out.blocks_to_swap_in,
            swap_out_s=result.swap_out_s,
            swap_in_s=result.swap_in_s,
            forward_s=result.forward_s,
            sample_s=result.sample_s,
            decisions=out.decisions,
            finished=list(out.ended_between_steps),
            wake_at=out.wake_at,
        )
        append = record.scheduled.append
        num_recompute = 0
        for seq, decode, token in zip(out.seqs, out.is_decode, result.sampled, strict=True):
            n = seq.num_scheduled_tokens
            pending = seq.num_pending_recompute_tokens
            if pending:
                kind = RECOMPUTE
                num_recompute += min(n, pending)
            else:
                kind = DECODE if decode else PREFILL
            append(ScheduledSeq(seq, seq.request_id, kind, n, seq.num_computed_tokens, token))
        record.num_recompute_tokens = num_recompute
        for x in out.decisions:
            if x.kind == d.IDLE_RUNNING:
                record.num_idle_running += len(x.request_ids)
        self._snapshot_pools(record)
        return record

    def _snapshot_pools(self, record: StepRecord) -> None:
        bm = self.block_manager
        record.num_free_device_blocks = bm.num_free_device_blocks
        record.num_device_blocks = bm.num_device_blocks
        record.num_free_host_blocks = bm.num_free_host_blocks
        record.num_host_blocks = bm.num_host_blocks
