"""The executor interface: a scheduled step in, a :class:`StepResult` out.

Two executors implement it: the torch model runner (``engine.worker.model_runner``)
and the simulated executor (``engine.sim.simulated_executor``), which predicts the
step's duration with the cost model instead of computing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from engine.core.sched.scheduler_output import SchedulerOutput


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
