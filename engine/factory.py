"""Building an engine: the executor by name (torch or simulated), the KV pools sized
from the memory knobs. The one place that joins the step loop to an executor."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.core.clock import VirtualClock, WallClock
from engine.core.cost_model import CostModel
from engine.core.kv_plan import KvPlan, plan_kv_blocks
from engine.core.sched.policy import Policy, ReversedPolicy, make_policy
from engine.delaying_executor import DelayingExecutor
from engine.executor import Executor
from engine.faults import Faults
from engine.llm_engine import LLMEngine
from engine.sim.simulated_executor import SimulatedExecutor
from engine.worker.model_config import ModelConfig

if TYPE_CHECKING:  # torch is imported only when a torch engine is built
    import torch

    from engine.worker.model import LlamaForCausalLM

log = logging.getLogger("schedscope.engine")

EXECUTORS = ("torch", "sim")


def build_engine(
    config: EngineConfig,
    executor: str = "torch",
    cost_model: CostModel | None = None,
    clock: WallClock | VirtualClock | None = None,
    device: str | None = None,
    faults: Faults | None = None,
) -> LLMEngine:
    """``torch``: the bundled model really computes (CUDA when present, else CPU).
    ``sim``: the cost model predicts each step and the executor sleeps that long on the
    wall clock — the whole pipeline at scale without compute. With either, the cost
    model also prices swap against recompute for ``--preemption-mode auto``.

    ``faults`` (each builder here): the planted faults (``engine.faults``); default:
    those of ``SCHEDSCOPE_FAULT``, none when it is unset. A bad value raises
    ``engine.faults.FaultError`` (a ``ConfigError``) before anything is built."""
    if executor == "sim":
        return build_simulated_engine(
            config, cost_model, clock or WallClock(), default_kv_plan(config), faults
        )
    if executor == "torch":
        return build_torch_engine(
            config, clock or WallClock(), device=device, cost_model=cost_model, faults=faults
        )
    raise ValueError(f"unknown executor {executor!r}; expected one of {EXECUTORS}")


def build_simulated_engine(
    config: EngineConfig,
    cost_model: CostModel | None = None,
    clock: WallClock | VirtualClock | None = None,
    kv_plan: KvPlan | None = None,
    faults: Faults | None = None,
) -> LLMEngine:
    """An engine whose executor is the cost model (virtual clock by default; on the
    wall clock the executor sleeps each step's predicted duration)."""
    faults = Faults.from_env() if faults is None else faults
    if kv_plan is None:
        kv_plan = default_kv_plan(config)
    clock = clock or VirtualClock()
    cost_model = cost_model or CostModel()
    executor = SimulatedExecutor(cost_model, sleep=not clock.is_virtual)
    return _assemble(config, executor, clock, kv_plan, faults, cost_model=cost_model)


def build_torch_engine(
    config: EngineConfig,
    clock: WallClock | VirtualClock | None = None,
    device: str | torch.device | None = None,
    model: LlamaForCausalLM | None = None,
    cost_model: CostModel | None = None,
    warm_up: bool = True,
    faults: Faults | None = None,
) -> LLMEngine:
    """The bundled model on ``device`` (default: CUDA when available) behind the step
    loop. ``cost_model`` prices swap against recompute for ``--preemption-mode auto``
    (default: the built-in one); ``warm_up`` runs the largest prefill and decode once
    before any request is admitted (``ModelRunner.warm_up``, never delayed by faults)."""
    from engine.worker.loading import prepare_torch_runner

    faults = Faults.from_env() if faults is None else faults
    prepared = prepare_torch_runner(config, device, model, warm_up)
    engine = _assemble(
        config,
        prepared.runner,
        clock or WallClock(),
        prepared.kv_plan,
        faults,
        eos_token_id=prepared.model_config.eos_token_id,
        cost_model=cost_model,
    )
    engine.model_config = prepared.model_config
    engine.model_dir = prepared.model_dir
    return engine


def _assemble(
    config: EngineConfig,
    executor: Executor,
    clock: WallClock | VirtualClock,
    kv_plan: KvPlan,
    faults: Faults,
    eos_token_id: int | None = 2,
    cost_model: CostModel | None = None,
) -> LLMEngine:
    """The step loop over ``executor``, with ``faults`` planted: the executor wrapped
    in the planted delays, the policy reversed where a fault says so. No fault: the
    executor and the configured policy as they are."""
    policy: Policy | None = None
    if faults.active:
        log.warning(
            "SCHEDSCOPE_FAULT active: %s (planted faults, for measuring a latency gate; "
            "never for a real run)",
            faults.describe(),
        )
        if faults.delays_steps:
            executor = DelayingExecutor(executor, faults, sleep=not clock.is_virtual)
        configured = make_policy(config.scheduler)
        if faults.reverses(configured.name):
            policy = ReversedPolicy(configured)
    engine = LLMEngine(
        config, executor, clock, kv_plan, eos_token_id, cost_model=cost_model, policy=policy
    )
    engine.faults = faults
    return engine


def default_kv_plan(config: EngineConfig) -> KvPlan:
    """Pool sizes for the configured model preset from the memory knobs (no torch)."""
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
