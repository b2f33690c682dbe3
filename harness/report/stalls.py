"""Stall attribution: every inter-token gap above the stall threshold, one cause each.

The gaps come from ``requests.parquet``'s ``stalls`` column (the engine's token timing:
``start_s`` = the earlier token, ``duration_s``); the gap is [start_s, end_s]. Evidence
of what the engine did to the request inside that interval, in docs/metrics.md's
precedence (rank 0 wins):

0. ``swapped_out`` — a ``preempt`` span of mode ``swap`` or a ``swap_out`` span starts
   in the gap (decisions: ``preempt`` mode ``swap`` / ``swap_out``).
1. ``recompute`` — a ``preempt`` of mode ``recompute``, a ``recompute`` span or a
   ``prefill`` span of kind ``recompute`` starts in the gap (decisions: ``preempt``
   mode ``recompute`` / ``recompute``).
2. ``preempted_waiting`` — a ``preempt`` of neither mode starts in the gap.
3. ``prefill_interference`` — the step that ended the gap (its ``execute_end`` is the
   gap's end) had prefill tokens at least half its batched tokens (prefill + decode
   seqs): other requests' prefill dominated it (steps.parquet, else the ``engine.step``
   spans).
4. ``token_budget`` — an ``idle_running`` decision listed the request inside the gap
   (decisions.parquet, else the ``idle_running`` events of the ``engine.step`` spans).
5. ``other`` — none of these.

Spans come first; decisions and steps fill in where spans are missing. Where neither
exists the cause is ``other`` and the report lists the missing files.

An external target's stalls (``stall_source``: the client's token times,
harness/run/client_stalls.py) are all ``external_unknown``: nothing of its engine is
seen, so no evidence is looked for (its spans, if it sent any, are not schedscope's).
"""

from __future__ import annotations

import json

import polars as pl

# The stall threshold rule (the larger of the engine's stall floor and 5x the median
# ITL) has one definition, the simulator's and the served records'; re-exported here as
# the report's ``stalls.stall_threshold``.
from harness.records.requests import stall_threshold  # noqa: F401
from harness.report.inputs import PolicyData
from harness.report.stall_causes import CLIENT_TOKEN_TIMES, EXTERNAL_UNKNOWN, STALL_CAUSES

RANK = {c: i for i, c in enumerate(STALL_CAUSES)}
#: Matching a gap's end to the step whose execute_end it is (engine-clock seconds).
END_TOLERANCE_S = 1e-6
#: Evidence up to this much before the gap starts still counts (float rounding).
EPS = 1e-9

STALLS_SCHEMA = {
    "request_id": pl.String,
    "class": pl.String,
    "start_s": pl.Float64,
    "duration_s": pl.Float64,
    "end_s": pl.Float64,
    "cause": pl.String,
}


def median_itl(frame: pl.DataFrame) -> float | None:
    """The run's median ITL, estimated from per-request TPOT weighted by gaps."""
    from harness.report.stats import weighted_percentile

    rows = frame.filter(
        (pl.col("status") == "ok") & pl.col("tpot_s").is_not_null() & (pl.col("output_tokens") > 1)
    )
    if rows.height == 0:
        return None
    return weighted_percentile(
        rows["tpot_s"].to_numpy(), (rows["output_tokens"] - 1).to_numpy(), 50
    )


def gaps(data: PolicyData, classes: pl.DataFrame, threshold_s: float) -> pl.LazyFrame:
    """One row per gap above ``threshold_s``: request_id, class, start_s, duration_s, end_s."""
    if "stalls" not in data.columns("requests"):
        return pl.LazyFrame(schema={k: v for k, v in STALLS_SCHEMA.items() if k != "cause"})
    lazy = (
        data.requests.select("request_id", "stalls")
        .filter(pl.col("stalls").list.len() > 0)
        .explode("stalls")
        .unnest("stalls")
        .filter(pl.col("duration_s") > threshold_s)
        .with_columns(end_s=pl.col("start_s") + pl.col("duration_s"))
    )
    # The gaps are numbered in this order (``gap``), so it must not depend on the join:
    # without maintain_order Polars may return the rows in any order.
    return lazy.join(classes.lazy(), on="request_id", how="left", maintain_order="left").select(
        "request_id", "class", "start_s", "duration_s", "end_s"
    )


def is_external(data: PolicyData) -> bool:
    """Whether the cell's stalls are an external engine's, seen by its client only."""
    return data.stall_source == CLIENT_TOKEN_TIMES


def _col(names: list[str], name: str, dtype=pl.String) -> pl.Expr:
    return pl.col(name) if name in names else pl.lit(None, dtype=dtype).alias(name)


def _mode_rank(mode: pl.Expr) -> pl.Expr:
    return pl.when(mode == "swap").then(0).when(mode == "recompute").then(1).otherwise(2)


def preemption_events(data: PolicyData) -> tuple[pl.LazyFrame | None, str]:
    """(request_id, time, rank) of swap-outs, recomputes and preemptions; the source."""
    if data.spans is not None:
        names = data.columns("spans")
        spans = data.spans.select(
            "name",
            "request_id",
            "start",
            _col(names, "attr.schedscope.preempt.mode"),
            _col(names, "attr.schedscope.prefill.kind"),
        )
        mode = pl.col("attr.schedscope.preempt.mode")
        rank = (
            pl.when(pl.col("name") == "preempt")
            .then(_mode_rank(mode))
            .when(pl.col("name") == "swap_out")
            .then(0)
            .when(pl.col("name") == "recompute")
            .then(1)
            .when(
                (pl.col("name") == "prefill")
                & (pl.col("attr.schedscope.prefill.kind") == "recompute")
            )
            .then(1)
            .otherwise(None)
        )
        events = (
            spans.with_columns(rank=rank)
            .filter(pl.col("rank").is_not_null())
            .select("request_id", pl.col("start").alias("time"), pl.col("rank").cast(pl.Int64))
        )
        return events, "spans"
    if data.decisions is not None:
        names = data.columns("decisions")
        dec = data.decisions.select("kind", "request_id", "time", _col(names, "mode"))
        rank = (
            pl.when(pl.col("kind") == "preempt")
            .then(_mode_rank(pl.col("mode")))
            .when(pl.col("kind") == "swap_out")
            .then(0)
            .when(pl.col("kind") == "recompute")
            .then(1)
            .otherwise(None)
        )
        events = (
            dec.with_columns(rank=rank)
            .filter(pl.col("rank").is_not_null())
            .select("request_id", "time", pl.col("rank").cast(pl.Int64))
        )
        return events, "decisions"
    return None, "none"


def idle_events(data: PolicyData) -> tuple[pl.LazyFrame | None, str]:
    """(request_id, time) of every idle_running decision that listed the request."""
    if data.decisions is not None:
        names = data.columns("decisions")
        if "request_ids" in names:
            dec = (
                data.decisions.filter(pl.col("kind") == "idle_running")
                .select("time", pl.col("request_ids"))
                .explode("request_ids")
                .rename({"request_ids": "request_id"})
            )
            one = data.decisions.filter(
                (pl.col("kind") == "idle_running") & pl.col("request_id").is_not_null()
            ).select("time", "request_id")
            return pl.concat([dec, one]).unique().select("request_id", "time"), "decisions"
    if data.spans is not None:
        steps = (
            data.spans.filter(pl.col("name") == "engine.step")
            .select("events")
            .explode("events")
            .unnest("events")
            .filter(pl.col("name") == "idle_running")
            .select("time", "attributes")
        ).collect()
        rows = []
        for time, attributes in steps.iter_rows():
            attrs = json.loads(attributes or "{}")
            ids = attrs.get("schedscope.request_ids") or []
            if attrs.get("schedscope.request.id"):
                ids = [*ids, attrs["schedscope.request.id"]]
            rows += [(rid, time) for rid in ids]
        frame = pl.DataFrame(
            rows, schema={"request_id": pl.String, "time": pl.Float64}, orient="row"
        )
        return frame.lazy(), "spans"
    return None, "none"


def step_table(data: PolicyData) -> tuple[pl.LazyFrame | None, str]:
    """(execute_end, interfered) per step: prefill tokens >= half the batched tokens."""
    if data.steps is not None:
        steps = data.steps.select("execute_end", "num_prefill_tokens", "num_decode_seqs")
        source = "steps"
    elif data.spans is not None and "attr.schedscope.step.num_prefill_tokens" in data.columns(
        "spans"
    ):
        steps = data.spans.filter(pl.col("name") == "engine.step").select(
            pl.col("end").alias("execute_end"),
            pl.col("attr.schedscope.step.num_prefill_tokens").alias("num_prefill_tokens"),
            pl.col("attr.schedscope.step.num_decode_seqs").alias("num_decode_seqs"),
        )
        source = "spans"
    else:
        return None, "none"
    prefill = pl.col("num_prefill_tokens").fill_null(0)
    batched = prefill + pl.col("num_decode_seqs").fill_null(0)
    steps = (
        steps.with_columns(interfered=(prefill > 0) & (2 * prefill >= batched))
        .select("execute_end", "interfered")
        .drop_nulls("execute_end")
        .sort("execute_end")
    )
    return steps, source


def attribute(
    data: PolicyData, classes: pl.DataFrame, threshold_s: float
) -> tuple[pl.DataFrame, dict]:
    """Every gap above ``threshold_s`` with its cause, and the evidence sources used."""
    stalls = gaps(data, classes, threshold_s).with_row_index("gap").collect()
    if is_external(data):
        out = stalls.with_columns(cause=pl.lit(EXTERNAL_UNKNOWN)).select(list(STALLS_SCHEMA))
        return out, {"stalls": CLIENT_TOKEN_TIMES}
    sources = {}
    ranks = [stalls.select("gap", pl.lit(RANK["other"], dtype=pl.Int64).alias("rank"))]
    if stalls.height:
        keyed = stalls.lazy().select("gap", "request_id", "start_s", "end_s")
        preempts, sources["preemptions"] = preemption_events(data)
        if preempts is not None:
            ranks.append(_in_gap(keyed, preempts).select("gap", "rank").collect())
        idle, sources["token_budget"] = idle_events(data)
        if idle is not None:
            ranks.append(
                _in_gap(keyed, idle.with_columns(rank=pl.lit(RANK["token_budget"], dtype=pl.Int64)))
                .select("gap", "rank")
                .collect()
            )
        steps, sources["prefill_interference"] = step_table(data)
        if steps is not None:
            ends = keyed.select("gap", "end_s").sort("end_s")
            matched = ends.join_asof(
                steps,
                left_on="end_s",
                right_on="execute_end",
                strategy="nearest",
                tolerance=END_TOLERANCE_S,
            )
            ranks.append(
                matched.filter(pl.col("interfered").fill_null(False))
                .select("gap", pl.lit(RANK["prefill_interference"], dtype=pl.Int64).alias("rank"))
                .collect()
            )
    best = pl.concat(ranks).group_by("gap").agg(pl.col("rank").min())
    out = (
        stalls.join(best, on="gap", how="left")
        .with_columns(
            cause=pl.col("rank").replace_strict(
                dict(enumerate(STALL_CAUSES)), return_dtype=pl.String
            )
        )
        .sort("gap")
        .select(list(STALLS_SCHEMA))
    )
    return out, sources


def _in_gap(gaps_lf: pl.LazyFrame, events: pl.LazyFrame) -> pl.LazyFrame:
    """Events of a gap's request that happened inside the gap."""
    return gaps_lf.join(events, on="request_id", how="inner").filter(
        (pl.col("time") >= pl.col("start_s") - EPS) & (pl.col("time") <= pl.col("end_s") + EPS)
    )
