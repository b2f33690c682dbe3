"""Building an engine: the executor by name (torch or simulated), the KV pools sized
from the memory knobs. The one place that joins the step loop to an executor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.core.clock import VirtualClock, WallClock
from engine.core.cost_model import CostModel
from engine.core.kv_plan import KvPlan, plan_kv_blocks
from engine.llm_engine import LLMEngine
from engine.sim.simulated_executor import SimulatedExecutor
from engine.worker.model_config import ModelConfig

if TYPE_CHECKING:  # torch is imported only when a torch engine is built
    import torch

    from engine.worker.model import LlamaForCausalLM

EXECUTORS = ("torch", "sim")


def build_engine(
    config: EngineConfig,
    executor: str = "torch",
    cost_model: CostModel | None = None,
    clock: WallClock | VirtualClock | None = None,
    device: str | None = None,
) -> LLMEngine:
    """``torch``: the bundled model really computes (CUDA when present, else CPU).
    ``sim``: the cost model predicts each step and the executor sleeps that long on the
    wall clock — the whole pipeline at scale without compute. With either, the cost
    model also prices swap against recompute for ``--preemption-mode auto``."""
    if executor == "sim":
        return build_simulated_engine(
            config, cost_model, clock or WallClock(), default_kv_plan(config)
        )
    if executor == "torch":
        return build_torch_engine(
            config, clock or WallClock(), device=device, cost_model=cost_model
        )
    raise ValueError(f"unknown executor {executor!r}; expected one of {EXECUTORS}")


def build_simulated_engine(
    config: EngineConfig,
    cost_model: CostModel | None = None,
    clock: WallClock | VirtualClock | None = None,
    kv_plan: KvPlan | None = None,
) -> LLMEngine:
    """An engine whose executor is the cost model (virtual clock by default; on the
    wall clock the executor sleeps each step's predicted duration)."""
    if kv_plan is None:
        kv_plan = default_kv_plan(config)
    clock = clock or VirtualClock()
    cost_model = cost_model or CostModel()
    executor = SimulatedExecutor(cost_model, sleep=not clock.is_virtual)
    return LLMEngine(config, executor, clock, kv_plan, cost_model=cost_model)


def build_torch_engine(
    config: EngineConfig,
    clock: WallClock | VirtualClock | None = None,
    device: str | torch.device | None = None,
    model: LlamaForCausalLM | None = None,
    cost_model: CostModel | None = None,
    warm_up: bool = True,
) -> LLMEngine:
    """The bundled model on ``device`` (default: CUDA when available) behind the step
    loop. ``cost_model`` prices swap against recompute for ``--preemption-mode auto``
    (default: the built-in one); ``warm_up`` runs the largest prefill and decode once
    before any request is admitted (``ModelRunner.warm_up``)."""
    from engine.worker.loading import prepare_torch_runner

    prepared = prepare_torch_runner(config, device, model, warm_up)
    engine = LLMEngine(
        config,
        prepared.runner,
        clock or WallClock(),
        prepared.kv_plan,
        prepared.model_config.eos_token_id,
        cost_model=cost_model,
    )
    engine.model_config = prepared.model_config
    engine.model_dir = prepared.model_dir
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
