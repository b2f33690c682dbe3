"""Calibrating the simulator's cost model against the real model runner.

Profiles the torch runner over a grid of step shapes (prefill tokens, decode batch,
context length, swapped blocks), fits :class:`CostModel`'s linear parameters by
relative-error least squares with non-negative coefficients, and checks the fit on a
held-out set of mixed batches. The fitted file records the device, model, date and
the held-out error.
"""

from __future__ import annotations

import datetime as dt
import platform
import random
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from engine.core.block_manager import BlockManager
from engine.core.cost_model import CostModel, step_features
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sched.scheduler_output import SchedulerOutput
from engine.core.sequence import Sequence
from engine.sim.cost_fit import fit
from engine.worker.model_runner import ModelRunner


@dataclass(frozen=True)
class StepShape:
    """One step to measure: prefill chunks ``(chunk_len, context_before)``, decode
    context lengths, and the number of blocks to swap out and back in."""

    prefills: tuple[tuple[int, int], ...] = ()
    decodes: tuple[int, ...] = ()
    swap_blocks: int = 0

    def num_blocks(self, block_size: int) -> int:
        """Device blocks the step's sequences occupy."""
        return sum(-(-(before + n) // block_size) for n, before in self.prefills) + sum(
            -(-ctx // block_size) for ctx in self.decodes
        )

    def features(self) -> list[float]:
        """The cost model's features of this step (blocks move out and back in)."""
        padded = (
            (
                len(self.prefills)
                * max(n for n, _ in self.prefills)
                * max(before + n for n, before in self.prefills)
            )
            if self.prefills
            else 0
        )
        return step_features(
            sum(n for n, _ in self.prefills),
            len(self.decodes),
            sum(self.decodes),
            sum(n * (before + n) for n, before in self.prefills),
            2 * self.swap_blocks,
            len(self.prefills),
            padded,
        )


def training_grid(quick: bool = False) -> list[StepShape]:
    """Step shapes that exercise each term on its own and together."""
    prefill_lens = (16, 64, 256) if quick else (16, 64, 128, 256, 512, 1024, 2048)
    batches = (1, 4, 16) if quick else (1, 2, 4, 8, 16, 32, 64, 128)
    contexts = (64, 512) if quick else (32, 128, 512, 1024)
    swaps = (8, 32) if quick else (4, 16, 64, 256)
    shapes = [StepShape(prefills=((n, 0),)) for n in prefill_lens]
    shapes += [StepShape(prefills=((n, ctx),)) for n in prefill_lens[:3] for ctx in contexts]
    shapes += [StepShape(decodes=(ctx,) * b) for b in batches for ctx in contexts]
    shapes += [StepShape(decodes=(64,), swap_blocks=s) for s in swaps]
    # Mixed batches too (a different seed from the held-out ones): continuous batching
    # mostly runs prefill chunks and decodes of many lengths together.
    shapes += holdout_mix(12 if quick else 60, seed=99, quick=quick)
    return shapes


def holdout_mix(count: int, seed: int = 1234, quick: bool = False) -> list[StepShape]:
    """Random mixed batches (what continuous batching really runs)."""
    rng = random.Random(seed)
    max_batch = 16 if quick else 96
    shapes = []
    for _ in range(count):
        decodes = tuple(
            rng.choice((32, 96, 200, 400, 800)) for _ in range(rng.randint(0, max_batch))
        )
        prefills = tuple(
            (rng.choice((16, 48, 128, 300, 600)), rng.choice((0, 0, 64, 256)))
            for _ in range(rng.randint(0 if decodes else 1, 2))
        )
        swap = rng.choice((0, 0, 0, 8, 32))
        shapes.append(StepShape(prefills, decodes, swap))
    return shapes


class _ShapeBuilder:
    """Turns a StepShape into a SchedulerOutput over real block tables."""

    def __init__(self, runner: ModelRunner, num_blocks: int, block_size: int) -> None:
        self.runner = runner
        self.block_size = block_size
        self.blocks = BlockManager(block_size, num_blocks, num_blocks, watermark=0.0)
        self._next = 0

    def build(self, shape: StepShape) -> tuple[SchedulerOutput, list[Sequence]]:
        out = SchedulerOutput(step=0, time=0.0)
        seqs = []
        params = SamplingParams(max_tokens=1, ignore_eos=True)
        for chunk, before in shape.prefills:
            seq = self._sequence(before + chunk, params)
            seq.num_computed_tokens = before
            out.add(seq, chunk)
            seqs.append(seq)
        for context in shape.decodes:
            seq = self._sequence(context, params, prompt=context - 1)
            seq.num_computed_tokens = context - 1
            out.add(seq, 1)
            seqs.append(seq)
        if shape.swap_blocks:
            device = list(range(shape.swap_blocks))
            out.blocks_to_swap_out = [(b, b) for b in device]
            out.blocks_to_swap_in = [(b, b) for b in device]
        return out, seqs

    def _sequence(
        self, num_tokens: int, params: SamplingParams, prompt: int | None = None
    ) -> Sequence:
        prompt_len = num_tokens if prompt is None else prompt
        vocab = self.runner.model_config.vocab_size
        prompt_ids = [3 + (i * 7919) % (vocab - 3) for i in range(prompt_len)]
        seq = Sequence(EngineRequest(f"cal-{self._next}", prompt_ids, params, 0.0), self._next)
        self._next += 1
        seq.output_token_ids = [5] * (num_tokens - prompt_len)
        seq.num_tokens = num_tokens
        self.blocks.allocate(seq)
        return seq

    def release(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self.blocks.free(seq)

    def time_one(self, shape: StepShape) -> float:
        """Seconds of one ``runner.execute`` of ``shape`` (to its end on a GPU)."""
        out, seqs = self.build(shape)
        start = time.perf_counter()
        self.runner.execute(out)
        if self.runner.is_cuda:
            torch.cuda.synchronize(self.runner.device)
        seconds = time.perf_counter() - start
        self.release(seqs)
        return seconds


def measure(
    runner: ModelRunner,
    shapes: list[StepShape],
    repeats: int = 5,
    warmup: int = 1,
    num_blocks: int | None = None,
) -> list[float]:
    """Median seconds of ``runner.execute`` for each shape.

    Shapes are measured round-robin, one run of each per round, so that a slow spell
    of a shared machine spreads over all shapes instead of skewing a few.
    """
    needed = max(shape.num_blocks(runner.block_size) for shape in shapes)
    builder = _ShapeBuilder(runner, num_blocks or needed, runner.block_size)
    samples: list[list[float]] = [[] for _ in shapes]
    for round_no in range(warmup + repeats):
        for i, shape in enumerate(shapes):
            seconds = builder.time_one(shape)
            if round_no >= warmup:
                samples[i].append(seconds)
    return [statistics.median(x) for x in samples]


def step_times(
    runner: ModelRunner, shapes: list[StepShape], duration_s: float, gap_s: float = 0.001
) -> list[tuple[float, int, float]]:
    """``(wall time, shape index, seconds of runner.execute)`` for the shapes run in
    turn, again and again, for ``duration_s``, ``gap_s`` apart (a served engine's pause
    between steps, roughly): how steadily this machine runs the very same steps, which
    no cost model of a step's content can do better than."""
    needed = max(shape.num_blocks(runner.block_size) for shape in shapes)
    builder = _ShapeBuilder(runner, needed, runner.block_size)
    times = []
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        for i, shape in enumerate(shapes):
            times.append((time.time(), i, builder.time_one(shape)))
            time.sleep(gap_s)
    return times


def relative_errors(model: CostModel, shapes: list[StepShape], seconds: list[float]) -> list[float]:
    return [
        abs(model.predict_features(shape.features()) - measured) / measured
        for shape, measured in zip(shapes, seconds, strict=True)
    ]


def calibrate(
    runner: ModelRunner, model_name: str, quick: bool = False, repeats: int = 5, holdout: int = 40
) -> CostModel:
    grid = training_grid(quick)
    held = holdout_mix(holdout if not quick else max(8, holdout // 4), quick=quick)
    # One round-robin pass over both sets: drift of a shared machine hits them alike.
    seconds = measure(runner, grid + held, repeats=repeats)
    train_s, held_s = seconds[: len(grid)], seconds[len(grid) :]
    x = np.array([s.features() for s in grid])
    coef = fit(x, np.array(train_s))
    fitted = CostModel.from_coefficients(
        (float(c) for c in coef),
        client_latency_s=0.0,  # the runner alone: no network
        device=describe_device(runner.device),
        model=model_name,
        fitted_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        source="calibrated",
    )
    errors = relative_errors(fitted, held, held_s)
    train_errors = relative_errors(fitted, grid, train_s)
    stats = {
        "train_points": len(grid),
        "holdout_points": len(held),
        "holdout_median_rel_error": statistics.median(errors),
        "holdout_p90_rel_error": float(np.quantile(errors, 0.9)),
        "train_median_rel_error": statistics.median(train_errors),
        "repeats": repeats,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    return CostModel(**{**fitted.to_dict(), "fit": stats})


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":  # pragma: no cover - CUDA only
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
