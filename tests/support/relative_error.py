"""How far a tensor is from a reference, relative to the reference's size."""

from __future__ import annotations

import torch


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|``, computed in float64 (either tensor may
    be float32; converting it is exact)."""
    return float((actual.double() - expected.double()).abs().max() / expected.double().abs().max())
