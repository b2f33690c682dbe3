"""The simulated executor: the step's duration from the cost model, not from compute."""

from __future__ import annotations

import time

from engine.core.cost_model import CostModel
from engine.core.sched.scheduler_output import SchedulerOutput
from engine.executor import StepResult


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
        append = sampled.append
        for seq in out.seqs:
            tokens = seq.num_tokens
            if seq.num_computed_tokens + seq.num_scheduled_tokens < tokens:
                append(None)
            else:
                oracle = seq.oracle_output_tokens
                if oracle is not None and tokens - seq.num_prompt_tokens + 1 >= oracle:
                    append(eos)
                else:
                    append(filler)
        duration = self.cost_model.predict_step(out)
        swap_block_s = self.cost_model.swap_block_s
        swap_out_s = swap_block_s * len(out.blocks_to_swap_out)
        swap_in_s = swap_block_s * len(out.blocks_to_swap_in)
        if self.sleep and duration > 0:
            started = time.perf_counter()
            time.sleep(duration)
            duration = time.perf_counter() - started
        return StepResult(sampled, duration, swap_out_s, swap_in_s)
