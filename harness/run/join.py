"""A served cell's record files on one clock (Unix seconds), joined by request id.

- ``requests.parquet``: every client row (one per scheduled request, from
  ``merge_records``) left-joined with the engine's ``--record-requests`` row of the same
  ``request_id``. Client columns win for the client-side metrics (``ttft_s``,
  ``tpot_s``, ``e2e_s``, ``max_itl_s``, ``status``, ``output_tokens``,
  ``first_token_at`` ...). The engine's server-side columns keep their docs/metrics.md names
  (``queue_s``, ``total_queue_s``, ``preemptions``, ``preempt_swaps``,
  ``preempt_recomputes``, ``swapped_s``, ``recomputed_tokens``, ``evicted_prefix_tokens``,
  ``idle_running_steps``,
  ``stall_s``, ``num_stalls``, ``stalls``, ``first_scheduled_at``, ``finished_at``);
  the engine's own copies of client-side columns are kept with an ``engine_`` prefix
  (``engine_arrival_at``, ``engine_ttft_s``, ``engine_e2e_s``, ``engine_status`` ...).
  Engine instants (``stalls.start_s``, ``first_scheduled_at``, ``finished_at``,
  ``engine_arrival_at``, ``engine_first_token_at``) are shifted by the server's
  ``clock_epoch_unix`` onto Unix time, the clock of the client rows and the spans.
- ``steps.parquet``: the engine's step records with ``schedule_start``,
  ``execute_start``, ``execute_end`` shifted the same way.
- ``spans.parquet``: the trace file (OTLP-JSON lines, Unix time) via harness/records/spans.py.

Distributed load (several Locust workers, maybe on other machines): the client rows
arrive already on the master's clock, the clock of the engine and the spans (the
master shifts each worker's instants by its estimated offset as it writes them,
harness/loadgen/forward.py and clock.py); ``harness.loadgen.clock.clock_warnings`` says
which workers' offsets are uncertain beyond the join's tolerance
(``clock.CLOCK_TOLERANCE_S``), where instants joined across machines cannot be trusted
to that precision (the cell's warnings and the report say so).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

#: Engine columns kept under their docs/metrics.md names (the server side of a request).
SERVER_COLUMNS = (
    "queue_s",
    "total_queue_s",
    "preemptions",
    "preempt_swaps",
    "preempt_recomputes",
    "swapped_s",
    "recomputed_tokens",
    "evicted_prefix_tokens",
    "idle_running_steps",
    "stall_s",
    "num_stalls",
    "stalls",
    "first_scheduled_at",
    "finished_at",
)
#: Engine copies of client-side columns: kept with the ``engine_`` prefix.
ENGINE_PREFIXED = {
    "scheduled_at": "engine_arrival_at",
    "status": "engine_status",
    "error": "engine_error",
    "finish_reason": "engine_finish_reason",
    "ttft_s": "engine_ttft_s",
    "tpot_s": "engine_tpot_s",
    "e2e_s": "engine_e2e_s",
    "max_itl_s": "engine_max_itl_s",
    "output_tokens": "engine_output_tokens",
    "prompt_tokens": "engine_prompt_tokens",
    "cached_tokens": "engine_cached_tokens",
    "first_token_at": "engine_first_token_at",
}
SHIFTED = ("first_scheduled_at", "finished_at", "engine_arrival_at", "engine_first_token_at")
STEP_INSTANTS = ("schedule_start", "execute_start", "execute_end")


def engine_columns(engine: pl.DataFrame, epoch: float) -> pl.DataFrame:
    """The engine's rows, renamed and on Unix time."""
    present = set(engine.columns)
    select = [pl.col("request_id")]
    select += [pl.col(c) for c in SERVER_COLUMNS if c in present]
    select += [pl.col(src).alias(dst) for src, dst in ENGINE_PREFIXED.items() if src in present]
    frame = engine.select(select)
    shifts = [(pl.col(c) + epoch).alias(c) for c in SHIFTED if c in frame.columns]
    if "stalls" in frame.columns:
        shifts.append(
            pl.col("stalls")
            .list.eval(
                pl.struct(
                    (pl.element().struct.field("start_s") + epoch).alias("start_s"),
                    pl.element().struct.field("duration_s").alias("duration_s"),
                )
            )
            .alias("stalls")
        )
    return frame.with_columns(shifts) if shifts else frame


def join_requests(
    client: pl.DataFrame, engine: pl.DataFrame | None, epoch: float | None, policy: str, cell: str
) -> pl.DataFrame:
    """One row per client row (every scheduled request), the engine's columns joined."""
    frame = client
    if engine is not None and epoch is not None:
        frame = frame.join(engine_columns(engine, epoch), on="request_id", how="left")
        if "engine_cached_tokens" in frame.columns:
            # The target's own count where its responses carry one, else the engine's.
            client_side = (
                pl.col("cached_tokens") if "cached_tokens" in frame.columns else pl.lit(None)
            )
            frame = frame.with_columns(
                pl.coalesce(client_side, pl.col("engine_cached_tokens"))
                .cast(pl.Int64)
                .alias("cached_tokens")
            )
    return frame.with_columns(pl.lit(policy).alias("policy"), pl.lit(cell).alias("cell"))


def shift_steps(steps: pl.DataFrame, epoch: float) -> pl.DataFrame:
    return steps.with_columns(
        [(pl.col(c) + epoch).alias(c) for c in STEP_INSTANTS if c in steps.columns]
    )


def write_spans(trace_file: Path, out: Path, shift_s: float = 0.0) -> pl.DataFrame:
    """spans.parquet from ``trace_file``, every instant moved by ``shift_s`` seconds (a
    served engine's clock correction, harness/run/clock_check.py); the spans written."""
    from harness.records.spans import read_spans, shift_spans, write_spans_parquet

    frame = read_spans(trace_file)
    if shift_s:
        frame = shift_spans(frame, shift_s)
    write_spans_parquet(frame, out)
    return frame


def write_parquet(frame: pl.DataFrame, path: Path) -> None:
    frame.write_parquet(path)
