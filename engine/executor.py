"""Executors run a scheduled step. The simulated one lives here; the torch one is
``engine.model_runner``. Both return a :class:`StepResult`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from engine.cost_model import CostModel
from engine.scheduler_output import SchedulerOutput


@dataclass(slots=True)
class StepResult:
    #: One entry per scheduled sequence (aligned with ``SchedulerOutput.seqs``): the
    #: sampled token id, or None when the sequence only computed part of a prefill.
    sampled: list[int | None]
    #: Seconds the step took (measured) or would take (predicted, in simulation).
    duration_s: float
    #: Parts of ``duration_s`` where the executor knows them (0: not measured): the
    #: device->host and host->device block copies, the forward pass, sampling.
    swap_out_s: float = 0.0
    swap_in_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    #: Sequences whose sampling failed, by index into ``SchedulerOutput.seqs``, with
    #: the reason. Their ``sampled`` entry is None; the engine fails them alone (the
    #: rest of the step stands). An exception from ``execute`` fails the whole step.
    sample_errors: dict[int, str] = field(default_factory=dict)


class Executor(Protocol):
    def execute(self, out: SchedulerOutput) -> StepResult: ...


class SimulatedExecutor:
    """Executes nothing: predicts the step's duration with a cost model and emits
    placeholder tokens, EOS when a request reaches its known output length.
    """

    #: The placeholder token; any id that is not EOS would do.
    FILLER_TOKEN_ID = 3

    def __init__(self, cost_model: CostModel, eos_token_id: int = 2, sleep: bool = False) -> None:
        self.cost_model = cost_model
        self.eos_token_id = eos_token_id
        # On the wall clock (the `sim` executor of a server) the step must take its
        # predicted time for real.
        self.sleep = sleep

    def execute(self, out: SchedulerOutput) -> StepResult:
        eos, filler = self.eos_token_id, self.FILLER_TOKEN_ID
        sampled: list[int | None] = []
        for seq in out.seqs:
            if seq.num_computed_tokens + seq.num_scheduled_tokens < seq.num_tokens:
                sampled.append(None)
            elif (
                seq.oracle_output_tokens is not None
                and seq.num_tokens - seq.num_prompt_tokens + 1 >= seq.oracle_output_tokens
            ):
                sampled.append(eos)
            else:
                sampled.append(filler)
        duration = self.cost_model.predict_step(out)
        swap_block_s = self.cost_model.swap_block_s
        swap_out_s = swap_block_s * len(out.blocks_to_swap_out)
        swap_in_s = swap_block_s * len(out.blocks_to_swap_in)
        if self.sleep and duration > 0:
            started = time.perf_counter()
            time.sleep(duration)
            duration = time.perf_counter() - started
        return StepResult(sampled, duration, swap_out_s, swap_in_s)
