"""Per-request records (``requests.parquet``): one row per request, docs/metrics.md names.

The simulator knows the server side exactly and the client side as if the network
were instant: ``scheduled_at == sent_at == arrival at the engine`` and a token is
"received" when its step ends.

:class:`RequestRecorder` is an observer of step records: every request ends in
exactly one record (``StepRecord.finished``), and becomes one row there.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from engine.core.sequence import Sequence
from engine.core.token_timing import STALL_FLOOR_S
from engine.records.step_record import StepRecord
from harness.records.polars_types import Schema

#: One stall: when the gap began (engine time) and how long it lasted.
STALL_TYPE = pl.Struct({"start_s": pl.Float64, "duration_s": pl.Float64})

#: requests.parquet columns, in order, with their Polars types.
#: Every request row's ``status`` (docs/metrics.md): the load generator's, the
#: simulator's and the engine's rows alike; the report and the gate refuse any other.
STATUSES = ("ok", "error", "rejected", "aborted")

REQUEST_SCHEMA: Schema = {
    "request_id": pl.String,
    "policy": pl.String,
    "profile": pl.String,
    "class": pl.String,
    "priority": pl.Int64,
    "prompt_tokens": pl.Int64,
    "output_tokens": pl.Int64,
    "max_tokens": pl.Int64,
    "status": pl.String,  # one of STATUSES
    "error": pl.String,
    "finish_reason": pl.String,
    "scheduled_at": pl.Float64,
    "sent_at": pl.Float64,
    "ttft_s": pl.Float64,
    "ttft_from_sent_s": pl.Float64,
    "tpot_s": pl.Float64,
    "e2e_s": pl.Float64,
    "max_itl_s": pl.Float64,
    "queue_s": pl.Float64,
    "total_queue_s": pl.Float64,
    "preemptions": pl.Int64,
    "preempt_swaps": pl.Int64,
    "preempt_recomputes": pl.Int64,
    "swapped_s": pl.Float64,
    "recomputed_tokens": pl.Int64,
    "cached_tokens": pl.Int64,
    "evicted_prefix_tokens": pl.Int64,
    "idle_running_steps": pl.Int64,
    "stall_s": pl.Float64,
    "num_stalls": pl.Int64,
    "stalls": pl.List(STALL_TYPE),
    "first_scheduled_at": pl.Float64,
    "first_token_at": pl.Float64,
    "finished_at": pl.Float64,
    "phase": pl.Int64,  # the profile phase it was planned in (a served run's client rows too)
    "session_id": pl.String,  # a session's turns (docs/metrics.md); null otherwise
    "turn": pl.Int64,  # 1 for a session's first turn
}


def record_status(seq: Sequence) -> str:
    return seq.status.record_status


def sequence_record(seq: Sequence, policy: str, profile: str) -> dict:
    """The row of a finished request (stall columns are filled in by :func:`add_stalls`)."""
    arrival = seq.arrival_time
    timing = seq.timing
    first, last = timing.first_token_time, timing.last_token_time
    num_output = seq.num_output_tokens
    ttft = None if first is None else first - arrival
    e2e = None if last is None else last - arrival
    tpot = (
        (e2e - ttft) / (num_output - 1)
        if num_output > 1 and ttft is not None and e2e is not None
        else None
    )
    return {
        "request_id": seq.request_id,
        "policy": policy,
        "profile": profile,
        "class": seq.request_class,
        "priority": seq.priority,
        "prompt_tokens": seq.num_prompt_tokens,
        "output_tokens": num_output,
        "max_tokens": seq.params.max_tokens,
        "status": record_status(seq),
        "error": seq.error or seq.reject_reason,
        "finish_reason": seq.finish_reason,
        "scheduled_at": arrival,
        "sent_at": arrival,
        "ttft_s": ttft,
        "ttft_from_sent_s": ttft,
        "tpot_s": tpot,
        "e2e_s": e2e,
        "max_itl_s": timing.max_itl_s if num_output > 1 else None,
        "queue_s": seq.queue_s,
        "total_queue_s": seq.total_queue_s,
        "preemptions": seq.num_preemptions,
        "preempt_swaps": seq.num_preemptions_swap,
        "preempt_recomputes": seq.num_preemptions_recompute,
        "swapped_s": seq.total_swapped_s,
        "recomputed_tokens": seq.num_recomputed_tokens,
        "cached_tokens": seq.num_cached_tokens,
        "evicted_prefix_tokens": seq.num_evicted_prefix_tokens,
        "idle_running_steps": seq.num_idle_running_steps,
        "stall_s": 0.0,
        "num_stalls": 0,
        "stalls": [],
        "first_scheduled_at": seq.first_scheduled_time,
        "first_token_at": first,
        "finished_at": seq.finished_time,
        "_long_gaps": timing.long_gaps,
    }


def unsent_record(spec, error: str, policy: str, profile: str) -> dict:
    """The row of a planned request that was never sent (``error`` says why: a session
    that ended on a failed turn), as the load generator records one: ``aborted``, no
    instants. ``spec``: its ``harness.profiles.RequestSpec``."""
    return {
        **dict.fromkeys(REQUEST_SCHEMA),
        "request_id": spec.request_id,
        "policy": policy,
        "profile": profile,
        "class": spec.class_name,
        "priority": spec.priority,
        "prompt_tokens": spec.prompt_tokens,
        "output_tokens": None,
        "max_tokens": spec.max_tokens,
        "status": "aborted",
        "error": error,
        "stall_s": 0.0,
        "num_stalls": 0,
        "stalls": [],
        "phase": spec.phase,
        "session_id": spec.session_id,
        "turn": spec.turn,
    }


class RequestRecorder:
    """Observer: one row (``sequence_record``) per request, when it ends."""

    def __init__(self, policy: str, profile: str) -> None:
        self.policy = policy
        self.profile = profile
        self.rows: list[dict] = []

    def __call__(self, record: StepRecord) -> None:
        self.add(record.finished)

    def add(self, ended: list[Sequence]) -> None:
        """The rows of requests that ended (each once)."""
        policy, profile, append = self.policy, self.profile, self.rows.append
        for seq in ended:
            append(sequence_record(seq, policy, profile))

    def write(self, path: Path) -> None:
        """requests.parquet of everything recorded so far (stalls at the floor
        threshold: a served run has no median ITL of its own to scale it by)."""
        rows = [dict(row) for row in self.rows]
        add_stalls(rows, stall_threshold(None))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_parquet(requests_frame(rows), path)

    def take_frame(self) -> pl.DataFrame:
        """The rows recorded since the last call (stalls at the floor threshold, as
        :meth:`write`), forgotten here: a served run's records written as it goes."""
        rows, self.rows = self.rows, []
        add_stalls(rows, stall_threshold(None))
        return requests_frame(rows)


def stall_threshold(
    median_itl_s: float | None, floor_s: float = STALL_FLOOR_S, factor: float = 5.0
) -> float:
    """docs/metrics.md: the larger of the stall floor (250 ms) and 5x the run's median ITL;
    the floor alone when the median is unknown. The one definition: the simulator,
    served records and the report all cut stalls with it."""
    if median_itl_s is None:
        return floor_s
    return max(floor_s, factor * median_itl_s)


def add_stalls(rows: list[dict], threshold_s: float) -> None:
    """Fill ``stall_s``/``num_stalls``/``stalls`` from each row's long gaps, and drop
    the gaps."""
    for row in rows:
        gaps = row.pop("_long_gaps", ())  # (a row of a request never sent has none)
        stalls = [(start, gap) for start, gap in gaps if gap > threshold_s]
        row["stall_s"] = float(sum(gap for _, gap in stalls))
        row["num_stalls"] = len(stalls)
        row["stalls"] = [{"start_s": start, "duration_s": gap} for start, gap in stalls]


def requests_frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(
        rows, schema=REQUEST_SCHEMA, orient="row" if rows and isinstance(rows[0], list) else None
    )


def write_parquet(frame: pl.DataFrame, path: Path) -> None:
    # Statistics off and no compression-level surprises: same data, same bytes.
    frame.write_parquet(path, compression="zstd", statistics=False)
