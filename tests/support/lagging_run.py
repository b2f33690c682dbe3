"""A served run made by hand whose load generator lagged for a while: step records whose
cycles a known cost model sets, but those of a middle stretch slowed (the generator's
CPU taken from the engine's cores), and the client's request records, late exactly then.
For tests of fits that leave generator-limited steps out (harness/records/generator_limited.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from engine.core.cost_model import CostModel

#: Unix time of the engine's clock 0 (a served calibration's ``clock_epoch_unix``).
EPOCH = 1_700_000_000.0
#: The machine the steps ran on, every term the shapes below exercise non-zero.
MACHINE = CostModel(
    step_overhead_s=2e-3,
    prefill_token_s=3e-5,
    decode_seq_s=1e-4,
    decode_context_token_s=4e-7,
    prefill_seq_s=1e-3,
)


@dataclass(frozen=True)
class LaggingRun:
    #: step records on the engine's clock (a served calibration's steps.parquet)
    steps: pl.DataFrame
    #: the client's rows, Unix time (scheduled_at, sent_at, send_lag_s, in_flight_capped)
    client: pl.DataFrame
    #: the engine-clock instants between which the generator lagged
    lag_start: float
    lag_end: float

    def steps_on_unix_time(self) -> pl.DataFrame:
        """The steps as a ``schedscope run`` cell keeps them: on the client's clock."""
        return self.steps.with_columns(pl.col("schedule_start") + EPOCH)


def lagging_run(
    num_steps: int = 600,
    lagging: tuple[float, float] = (0.4, 0.6),
    slowdown: float = 2.0,
    seed: int = 1,
) -> LaggingRun:
    """``num_steps`` steps of varied shapes priced by MACHINE, but those that start in
    the ``lagging`` share of the run take ``slowdown`` times as long; a request
    scheduled every 20 ms, sent on time except in that share, where it goes 200 ms
    late."""
    rng = np.random.default_rng(seed)
    rows, t = [], 0.0
    first, last = (int(num_steps * share) for share in lagging)
    lag_start = lag_end = 0.0
    for step in range(num_steps):
        decodes = int(rng.integers(1, 64))
        prefill = int(rng.choice([0, 0, 16, 128, 512]))
        context = decodes * int(rng.integers(20, 1500))
        rows.append(
            {
                "step": step,
                "schedule_start": t,
                "idle_before_s": 0.0,
                "num_seqs": decodes + (1 if prefill else 0),
                "num_prefill_tokens": prefill,
                "num_decode_seqs": decodes,
                "num_decode_context_tokens": context,
                "prefill_attention_work": 0,
                "prefill_padded_attention_work": 0,
                "num_blocks_swapped_out": 0,
                "num_blocks_swapped_in": 0,
            }
        )
        if step == first:
            lag_start = t
        cycle = MACHINE.predict(prefill, decodes, context, 0, 0, 1 if prefill else 0, 0)
        t += cycle * (slowdown if first <= step < last else 1.0)
        if step == last - 1:
            lag_end = t
    scheduled = np.arange(0.0, t, 0.02)
    late = (scheduled >= lag_start) & (scheduled < lag_end)
    sent = scheduled + np.where(late, 0.2, 0.001)
    client = pl.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(len(scheduled))],
            "status": ["ok"] * len(scheduled),
            "scheduled_at": scheduled + EPOCH,
            "sent_at": sent + EPOCH,
            "send_lag_s": sent - scheduled,
            "in_flight_capped": [False] * len(scheduled),
        }
    )
    return LaggingRun(pl.DataFrame(rows), client, lag_start, lag_end)


def relative_error(model: CostModel, truth: CostModel = MACHINE) -> float:
    """The largest relative difference between ``model``'s and ``truth``'s prices of a
    few ordinary steps (decodes of 4 and 40 sequences, a 512-token prefill beside 8)."""
    shapes = [(0, 4, 2000, 0), (0, 40, 20000, 0), (512, 8, 4000, 1)]
    errors = [
        abs(model.predict(p, d, c, 0, 0, s, 0) / truth.predict(p, d, c, 0, 0, s, 0) - 1)
        for p, d, c, s in shapes
    ]
    return max(errors)
