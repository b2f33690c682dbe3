"""Per-step composition (``steps.parquet``) and its summary, from step records.

:class:`StepLog` is an observer of the engine's step records: one row per step
that computed or copied something — what was in the batch, the queues and pools it
ran with, its timings — kept as columns so that a run of a million steps stays
cheap. The simulator writes it beside ``requests.parquet``; calibration from served
runs reads the same columns.
"""

from __future__ import annotations

import polars as pl

from engine.step_record import StepRecord

#: steps.parquet columns, in order, with their Polars types.
STEP_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64,
    "schedule_start": pl.Float64,
    "execute_start": pl.Float64,
    "execute_end": pl.Float64,
    "num_seqs": pl.Int64,
    "num_prefill_tokens": pl.Int64,
    "num_recompute_tokens": pl.Int64,
    "num_decode_seqs": pl.Int64,
    "num_idle_running": pl.Int64,
    "num_waiting": pl.Int64,
    "num_running": pl.Int64,
    "num_swapped": pl.Int64,
    "num_free_device_blocks": pl.Int64,
    "num_device_blocks": pl.Int64,
    "num_free_host_blocks": pl.Int64,
    "num_blocks_swapped_out": pl.Int64,
    "num_blocks_swapped_in": pl.Int64,
    "swap_out_s": pl.Float64,
    "swap_in_s": pl.Float64,
    "num_decisions": pl.Int64,
    "num_decode_context_tokens": pl.Int64,
    "prefill_attention_work": pl.Int64,
    "prefill_padded_attention_work": pl.Int64,
    "forward_s": pl.Float64,
    "sample_s": pl.Float64,
    "idle_before_s": pl.Float64,
}


class StepLog:
    """Observer: the composition of every non-empty step, column by column."""

    def __init__(self) -> None:
        self.columns: dict[str, list] = {name: [] for name in STEP_SCHEMA}
        self._idle_carry = 0.0

    def write(self, path) -> None:
        from harness.records import write_parquet

        write_parquet(self.frame(), path)

    def __call__(self, record: StepRecord) -> None:
        if record.is_empty:
            # A step that only reported between-step ends, or a forming batch: its
            # idle wait belongs to the next step that runs.
            self._idle_carry += record.idle_before_s + (record.token_time - record.schedule_start)
            return
        record_idle = record.idle_before_s + self._idle_carry
        self._idle_carry = 0.0
        c = self.columns
        c["step"].append(record.step)
        c["schedule_start"].append(record.schedule_start)
        c["execute_start"].append(record.execute_start)
        c["execute_end"].append(record.execute_end)
        c["num_seqs"].append(len(record.scheduled))
        c["num_prefill_tokens"].append(record.num_prefill_tokens)
        c["num_recompute_tokens"].append(record.num_recompute_tokens)
        c["num_decode_seqs"].append(record.num_decode_seqs)
        c["num_idle_running"].append(record.num_idle_running)
        c["num_waiting"].append(record.num_waiting)
        c["num_running"].append(record.num_running)
        c["num_swapped"].append(record.num_swapped)
        c["num_free_device_blocks"].append(record.num_free_device_blocks)
        c["num_device_blocks"].append(record.num_device_blocks)
        c["num_free_host_blocks"].append(record.num_free_host_blocks)
        c["num_blocks_swapped_out"].append(record.num_blocks_swapped_out)
        c["num_blocks_swapped_in"].append(record.num_blocks_swapped_in)
        c["swap_out_s"].append(record.swap_out_s)
        c["swap_in_s"].append(record.swap_in_s)
        c["num_decisions"].append(len(record.decisions))
        c["num_decode_context_tokens"].append(record.num_decode_context_tokens)
        c["prefill_attention_work"].append(record.prefill_attention_work)
        c["prefill_padded_attention_work"].append(record.prefill_padded_attention_work)
        c["forward_s"].append(record.forward_s)
        c["sample_s"].append(record.sample_s)
        c["idle_before_s"].append(record_idle)

    @property
    def num_steps(self) -> int:
        return len(self.columns["step"])

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.columns, schema=STEP_SCHEMA)

    def summary(self) -> dict:
        """Totals and means over the run's steps (the summary's ``step_stats``)."""
        f = self.frame()
        n = f.height
        if n == 0:
            return {"num_steps": 0}
        busy = f.select((pl.col("execute_end") - pl.col("schedule_start")).sum()).item()

        def mean(name: str) -> float:
            return float(f[name].mean())

        return {
            "num_steps": n,
            "busy_s": float(busy),
            "mean_step_s": float(busy) / n,
            "mean_batch_seqs": mean("num_seqs"),
            "mean_prefill_tokens": mean("num_prefill_tokens"),
            "mean_decode_seqs": mean("num_decode_seqs"),
            "prefill_tokens": int(f["num_prefill_tokens"].sum()),
            "recompute_tokens": int(f["num_recompute_tokens"].sum()),
            "decode_tokens": int(f["num_decode_seqs"].sum()),
            "idle_running_seq_steps": int(f["num_idle_running"].sum()),
            "steps_with_idle_running": int((f["num_idle_running"] > 0).sum()),
            "mixed_steps": int(((f["num_prefill_tokens"] > 0) & (f["num_decode_seqs"] > 0)).sum()),
            "mean_waiting": mean("num_waiting"),
            "max_waiting": int(f["num_waiting"].max()),
            "mean_running": mean("num_running"),
            "max_swapped": int(f["num_swapped"].max()),
            "min_free_device_blocks": int(f["num_free_device_blocks"].min()),
            "blocks_swapped_out": int(f["num_blocks_swapped_out"].sum()),
            "blocks_swapped_in": int(f["num_blocks_swapped_in"].sum()),
            "swap_s": float(f["swap_out_s"].sum() + f["swap_in_s"].sum()),
        }
