"""Building an engine for serving: the executor by name, the KV pools from memory."""

from __future__ import annotations

from engine.clock import VirtualClock, WallClock
from engine.config import EngineConfig
from engine.cost_model import CostModel
from engine.llm_engine import LLMEngine, default_kv_plan

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
        return LLMEngine.simulated(config, cost_model, clock or WallClock(), default_kv_plan(config))
    if executor == "torch":
        from engine.model_runner import build_torch_engine

        return build_torch_engine(config, clock or WallClock(), device=device, cost_model=cost_model)
    raise ValueError(f"unknown executor {executor!r}; expected one of {EXECUTORS}")
