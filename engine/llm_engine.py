"""The engine: schedule -> execute -> postprocess, on a clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.block_manager import BlockManager
from engine.clock import VirtualClock, WallClock
from engine.config import EngineConfig
from engine.cost_model import CostModel
from engine.decisions import SWAP_IN, SWAP_OUT
from engine.executor import Executor, SimulatedExecutor, StepResult
from engine.memory import KvPlan, plan_kv_blocks
from engine.scheduler import Scheduler, SchedulerOutput
from engine.sequence import SamplingParams, Sequence


@dataclass(slots=True)
class StepOutcome:
    output: SchedulerOutput
    result: StepResult
    finished: list[Sequence]
    started_at: float
    ended_at: float
    error: str | None = None


class LLMEngine:
    """One engine instance. Not thread-safe: the async engine serialises calls."""

    def __init__(
        self,
        config: EngineConfig,
        executor: Executor,
        clock: WallClock | VirtualClock,
        kv_plan: KvPlan,
        eos_token_id: int | None = 2,
    ) -> None:
        self.config = config
        self.executor = executor
        self.clock = clock
        self.kv_plan = kv_plan
        self.eos_token_id = eos_token_id
        self.step_listeners: list[Callable[[StepOutcome], None]] = []
        self.reset_scheduler()

    def reset_scheduler(self) -> None:
        """Fresh, empty block pools and queues (after an unrecoverable step error)."""
        plan, cache = self.kv_plan, self.config.cache
        self.block_manager = BlockManager(
            cache.block_size, plan.num_device_blocks, plan.num_host_blocks, cache.watermark
        )
        self.scheduler = Scheduler(self.config.scheduler, self.block_manager, self.eos_token_id)

    @classmethod
    def simulated(
        cls,
        config: EngineConfig,
        cost_model: CostModel | None = None,
        clock: WallClock | VirtualClock | None = None,
        kv_plan: KvPlan | None = None,
    ) -> LLMEngine:
        """An engine whose executor is the cost model (virtual clock by default; on
        the wall clock the executor sleeps each step's predicted duration)."""
        if kv_plan is None:
            kv_plan = default_kv_plan(config)
        clock = clock or VirtualClock()
        executor = SimulatedExecutor(cost_model or CostModel(), sleep=not clock.is_virtual)
        return cls(config, executor, clock, kv_plan)

    # -- requests --------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        request_class: str = "",
        oracle_output_tokens: int | None = None,
        arrival_time: float | None = None,
    ) -> Sequence:
        now = self.clock.now() if arrival_time is None else arrival_time
        return self.scheduler.add(
            request_id, prompt_token_ids, params, now, priority, request_class,
            oracle_output_tokens,
        )

    def abort(self, request_id: str) -> Sequence | None:
        return self.scheduler.abort(request_id, self.clock.now())

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the loop body ---------------------------------------------------------------
    def step(self) -> StepOutcome:
        started = self.clock.now()
        out = self.scheduler.schedule(started)
        try:
            result = self.executor.execute(out)
        except Exception as exc:  # a failed step fails its requests, not the engine
            ended = self.clock.now()
            error = f"{type(exc).__name__}: {exc}"
            failed = list(out.seqs)
            # Requests swapped in or out in this step may not have had their blocks
            # copied: their KV cannot be trusted either.
            moved = {x.request_id for x in out.decisions if x.kind in (SWAP_OUT, SWAP_IN)}
            failed += [seq for rid in moved
                       if (seq := self.scheduler.requests.get(rid)) is not None and seq not in failed]
            self.scheduler.fail(failed, ended, error)
            outcome = StepOutcome(out, StepResult([], 0.0), failed, started, ended, error)
        else:
            self.clock.advance(result.duration_s)
            ended = self.clock.now()
            finished = self.scheduler.update(out, result.sampled, ended)
            outcome = StepOutcome(out, result, finished, started, ended)
        for listener in self.step_listeners:
            listener(outcome)
        return outcome


def default_kv_plan(config: EngineConfig) -> KvPlan:
    """Pool sizes for the configured model preset from the memory knobs (no torch)."""
    import json
    from pathlib import Path

    from engine.model_config import ModelConfig

    directory = Path(config.model)
    if directory.is_dir():  # a local checkpoint: its config.json has the shapes
        model = ModelConfig.from_hf_config(json.loads((directory / "config.json").read_text()))
    else:
        model = ModelConfig.preset(config.model)
    return plan_kv_blocks(
        config.cache,
        model.kv_bytes_per_block(config.cache.block_size),
        model.num_parameters * model.dtype_size,
    )
