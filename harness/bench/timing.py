"""Timing a piece of device work in a benchmark: its median over repeats, to its end."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], repeats: int, device: str, warm_ups: int = 1) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` runs after ``warm_ups`` untimed
    ones. On CUDA each run is timed to the end of its kernels (they run asynchronously)."""

    def once() -> None:
        fn()
        if device == "cuda":
            import torch

            torch.cuda.synchronize()

    for _ in range(warm_ups):
        once()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        once()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
