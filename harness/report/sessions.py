"""Sessions (multi-turn conversations) of each cell (docs/report.md, "Sessions"): how
their first turns and their later turns fared, what the prefix cache gave each turn,
how many sessions finished, and how long a finished one took.

A session's rows are those of ``requests.parquet`` with ``session_id`` set, one per
planned turn (``turn`` 1, 2, ...), sent or not: every writer gives a turn it never sent
a row (``aborted``, an ``error`` starting ``not sent:``), so nothing planned is missing.

- **Each turn** is one of (:func:`turn_kind`): ``ok``; ``failed`` (any other status
  that the run's end did not make: an error, a rejection, a stream cut short);
  ``cut`` (in flight when the run stopped: ``aborted``, its ``error`` "in flight when
  the run stopped" or its ``cut_at`` set); ``unsent_run_end`` (``not sent:`` because
  the run stopped first); ``unsent_after_failure`` (``not sent: its session ended
  when turn N failed``).
- **Each session** is exactly one of: ``not_started`` (no turn sent); ``failed`` (a
  turn failed: the session ended there, its later turns unsent); ``cut`` (none
  failed, and the run's end cut a turn in flight or left turns unsent);
  ``finished`` (every turn ``ok``). ``started`` = ``finished`` + ``failed`` + ``cut``,
  ``planned`` = ``started`` + ``not_started``.
- **TTFT** of first turns (``turn`` 1) and of later turns (``turn`` >= 2): over the
  ``ok`` turns, with the turns cut in flight at their lower bounds (censored, as every
  latency of the report: harness/records/request_stats.py); failed and unsent turns
  are in no percentile.
- **Hit rate by turn**: Σ ``cached_tokens`` / Σ ``prompt_tokens`` over the turns that
  were admitted with ``cached_tokens`` known (the prefix-cache section's rows:
  :func:`harness.report.prefix_cache.admitted_known`), per turn number, the turns from
  :data:`TAIL_TURN` on in one bucket (``"6+"``). Null ("not recorded") where no turn
  carries ``cached_tokens``; null with ``hit_rate_note`` "prefix caching off" for a
  cell whose engine ran without the cache.
- **Duration** of a finished session: from its first turn's ``scheduled_at`` to the
  last token of its last turn (``scheduled_at`` + ``e2e_s``, one clock: the client's
  in a served run, the virtual one simulated).

:func:`sessions` gives summary.json's ``sessions`` entry of a policy, or None when the
cell has no session rows.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from harness.records.polars_types import as_float
from harness.records.request_stats import CUT_AT, censored_metric, clean, percentile
from harness.report.prefix_cache import CACHING_OFF, admitted_known

#: Turns from this one on share one hit-rate bucket (``"6+"``): few sessions run long,
#: and one bucket per rare turn number would be a figure over a handful of rows.
TAIL_TURN = 6
#: The ``error`` of a turn never sent because a turn before it failed starts so (the
#: load generator's ``harness/loadgen/dispatcher.py`` and the simulator's
#: ``harness/simulate/session_turns.py`` both write "not sent: its session ended when
#: turn N failed").
AFTER_FAILURE = "not sent: its session ended"
#: Every unsent row's ``error`` starts so (docs/loadgen.md, "A run cut short").
NOT_SENT = "not sent:"
#: The ``error`` of a row the end of the run cut in flight (the load generator's).
IN_FLIGHT = "in flight when the run stopped"
#: The kinds of turn (:func:`turn_kind`) and of session (module docstring).
TURN_KINDS = ("ok", "failed", "cut", "unsent_run_end", "unsent_after_failure")
SESSION_OUTCOMES = ("finished", "failed", "cut", "not_started")


def turn_kind(columns: list[str]) -> pl.Expr:
    """Per row (of records with ``columns``): which of :data:`TURN_KINDS` it is."""
    error = pl.col("error").fill_null("")
    aborted = pl.col("status") == "aborted"
    in_flight = error.str.starts_with(IN_FLIGHT)
    if CUT_AT in columns:
        in_flight = in_flight | pl.col(CUT_AT).is_not_null()
    return (
        pl.when(pl.col("status") == "ok")
        .then(pl.lit("ok"))
        .when(aborted & error.str.starts_with(AFTER_FAILURE))
        .then(pl.lit("unsent_after_failure"))
        .when(aborted & error.str.starts_with(NOT_SENT))
        .then(pl.lit("unsent_run_end"))
        .when(aborted & in_flight)
        .then(pl.lit("cut"))
        .otherwise(pl.lit("failed"))
    )


def turn_bucket(turn: int) -> str:
    """The hit-rate bucket of turn number ``turn``: itself, or ``"6+"`` from
    :data:`TAIL_TURN` on."""
    return f"{TAIL_TURN}+" if turn >= TAIL_TURN else str(turn)


def _bucket_expr() -> pl.Expr:
    """:func:`turn_bucket` of each row's ``turn``."""
    turn = pl.col("turn")
    return pl.when(turn >= TAIL_TURN).then(pl.lit(f"{TAIL_TURN}+")).otherwise(turn.cast(pl.String))


def session_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``frame`` that are a session's turns."""
    if "session_id" not in frame.columns:
        return frame.clear()
    return frame.filter(pl.col("session_id").is_not_null())


def outcomes(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per session of ``rows`` (session turns): ``session_id``, ``planned``,
    ``sent`` and ``ok`` turns, ``outcome`` (one of :data:`SESSION_OUTCOMES`),
    ``start`` (its first turn's ``scheduled_at``) and ``end`` (the last token of its
    latest finished turn; null when none finished)."""
    kind = pl.col("_kind")
    per = (
        rows.with_columns(turn_kind(rows.columns).alias("_kind"))
        .group_by("session_id")
        .agg(
            pl.len().alias("planned"),
            (~kind.str.starts_with("unsent")).sum().alias("sent"),
            (kind == "ok").sum().alias("ok"),
            kind.is_in(["failed", "unsent_after_failure"]).any().alias("_failed"),
            kind.is_in(["cut", "unsent_run_end"]).any().alias("_cut"),
            pl.col("scheduled_at").sort_by("turn").first().alias("start"),
            (pl.col("scheduled_at") + pl.col("e2e_s")).filter(kind == "ok").max().alias("end"),
        )
    )
    outcome = (
        pl.when(pl.col("sent") == 0)
        .then(pl.lit("not_started"))
        .when(pl.col("_failed"))
        .then(pl.lit("failed"))
        .when(pl.col("_cut"))
        .then(pl.lit("cut"))
        .otherwise(pl.lit("finished"))
    )
    return per.with_columns(outcome.alias("outcome")).drop("_failed", "_cut").sort("session_id")


def _hit(rows: pl.DataFrame, caching: bool | None) -> dict:
    """The hit rate over ``rows`` (:func:`admitted_known` rows already): null where
    none is there or caching was off."""
    prompt = int(rows["prompt_tokens"].sum()) if rows.height else 0
    cached = int(rows["cached_tokens"].sum()) if rows.height else 0
    known = rows.height > 0 and caching is not False
    return {
        "requests": rows.height,
        "prompt_tokens": prompt if known else None,
        "cached_tokens": cached if known else None,
        "hit_rate": clean(cached / prompt) if known and prompt > 0 else None,
    }


def _duration(per: pl.DataFrame) -> dict:
    """Mean, p50 and p95 of the finished sessions' durations (end - start)."""
    done = per.filter((pl.col("outcome") == "finished") & pl.col("end").is_not_null())
    values = (done["end"] - done["start"]).drop_nulls().to_numpy()
    if values.size == 0:
        return {"count": 0, "mean": None, "p50": None, "p95": None}
    return {
        "count": int(values.size),
        "mean": clean(float(np.mean(values))),
        "p50": clean(percentile(values, 50)),
        "p95": clean(percentile(values, 95)),
    }


def group(rows: pl.DataFrame, caching: bool | None) -> dict:
    """The figures of one group of session rows (a class's, or every class's); the
    module docstring defines each. ``caching``: whether the cell ran with the prefix
    cache (None: not recorded)."""
    per = outcomes(rows)
    counts = {o: int((per["outcome"] == o).sum()) for o in SESSION_OUTCOMES}
    planned = per.height
    turns = rows["turn"]
    known = admitted_known(rows)
    buckets = sorted({turn_bucket(t) for t in turns.drop_nulls().to_list()}, key=_bucket_order)
    known_bucket = known.select(_bucket_expr()).to_series()
    return {
        "rows": rows.height,
        "sessions": {
            "planned": planned,
            "started": planned - counts["not_started"],
            **counts,
        },
        "turns": {
            "planned": int(per["planned"].sum()),
            "sent": int(per["sent"].sum()),
            "ok": int(per["ok"].sum()),
            "mean_planned": clean(as_float(per["planned"].mean())) if planned else None,
            "mean_sent": clean(as_float(per["sent"].mean())) if planned else None,
        },
        "ttft_first_s": censored_metric(rows.filter(turns == 1), "ttft_s"),
        "ttft_later_s": censored_metric(rows.filter(turns >= 2), "ttft_s"),
        "hit_rate_first": _hit(known.filter(pl.col("turn") == 1), caching),
        "hit_rate_later": _hit(known.filter(pl.col("turn") >= 2), caching),
        "hit_rate_by_turn": {b: _hit(known.filter(known_bucket == b), caching) for b in buckets},
        "duration_s": _duration(per),
    }


def _bucket_order(bucket: str) -> int:
    return int(bucket.rstrip("+"))


#: What a hit rate reads where no admitted turn carries ``cached_tokens``.
NOT_RECORDED = "not recorded"


def sessions(frame: pl.DataFrame, caching: bool | None) -> dict | None:
    """summary.json's ``sessions`` of one cell (``frame``: its request rows,
    :func:`harness.report.tables.load_requests`; ``caching``: whether its engine ran
    with the prefix cache, None when not recorded), or None when it has no session
    rows."""
    rows = session_rows(frame)
    if rows.height == 0:
        return None
    overall = group(rows, caching)
    note = None
    if caching is False:
        note = CACHING_OFF
    elif overall["hit_rate_first"]["requests"] + overall["hit_rate_later"]["requests"] == 0:
        note = NOT_RECORDED
    return {
        "tail_turn": TAIL_TURN,
        "hit_rate_note": note,
        "overall": overall,
        "by_class": {
            name: group(rows.filter(pl.col("class") == name), caching)
            for name in sorted(rows["class"].unique().to_list())
        },
    }
