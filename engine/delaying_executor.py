"""An executor whose steps take longer by the planted delays (``engine.faults``).

It wraps any executor (the executor interface, ``engine.executor``) and adds the
step's planted delay to what that executor returns. On the wall clock (the torch
runner, or a served simulated executor, which already sleeps its prediction) it
sleeps the delay after the step, so the step really takes that much longer; on a
virtual clock it adds the delay to the step's duration, which is what moves the
clock. Either way the step record's ``execute_end`` shows it.
"""

from __future__ import annotations

import time

from engine.core.sched.scheduler_output import SchedulerOutput
from engine.executor import Executor, StepResult
from engine.faults import Faults


class DelayingExecutor:
    """``inner``, each step longer by ``faults.step_delay_s`` of its composition."""

    def __init__(self, inner: Executor, faults: Faults, sleep: bool) -> None:
        self.inner = inner
        self.faults = faults
        #: On the wall clock the delay must pass for real.
        self.sleep = sleep

    def execute(self, out: SchedulerOutput) -> StepResult:
        result = self.inner.execute(out)
        delay = self.faults.step_delay_s(
            out.num_prefill_tokens, out.num_decode_seqs, result.duration_s
        )
        if delay > 0:
            if self.sleep:
                started = time.perf_counter()
                time.sleep(delay)
                delay = time.perf_counter() - started
            result.duration_s += delay
        return result
