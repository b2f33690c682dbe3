"""A cost-model file for ``schedscope serve --cost-model`` (or a run's) in a test's folder."""

from __future__ import annotations

from pathlib import Path

from engine.core.cost_model import CostModel


def constant_cost_model_file(directory: Path, step_s: float) -> str:
    """``directory / "cost.json"``: ``CostModel.constant(step_s)``, every non-empty step
    takes ``step_s`` whatever it holds. Returns the path as a string, for a command line."""
    path = directory / "cost.json"
    CostModel.constant(step_s).save(path)
    return str(path)
