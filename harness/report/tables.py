"""Per policy x class statistics: counts, throughput, goodput, latency percentiles,
queue wait, preemptions by mode, stalls by cause, generator lag, fairness.

One group dict ``G`` per (policy, class) and per policy overall (class ``all``):
:func:`harness.records.request_stats.group_statistics`, the one definition behind
summary.json's groups too (so the gate reads either), plus ``itl_s``, the stalls by
cause and ``generator_lag_s``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from harness.records.polars_types import as_float
from harness.records.request_stats import (
    CUT_AT,
    PERCENTILES,
    clean,
    group_statistics,
    percentile,
    slo_met_expr,
    weighted_percentile,
)
from harness.records.requests import REQUEST_SCHEMA
from harness.report.stall_causes import STALL_CAUSES

#: requests.parquet columns the report reads (those absent are filled with nulls/zeros),
#: typed as the request records define them (harness/records/requests.py); the schedule offset is
#: a client-side column (the load generator's records).
REQUEST_COLUMNS = {
    name: pl.Float64 if name == "schedule_offset_s" else REQUEST_SCHEMA[name]
    for name in (
        "request_id",
        "class",
        "status",
        "error",
        "priority",
        "prompt_tokens",
        "output_tokens",
        "max_tokens",
        "schedule_offset_s",
        "scheduled_at",
        "sent_at",
        "ttft_s",
        "tpot_s",
        "e2e_s",
        "max_itl_s",
        "queue_s",
        "total_queue_s",
        "preemptions",
        "preempt_swaps",
        "preempt_recomputes",
        "swapped_s",
        "recomputed_tokens",
        "idle_running_steps",
        "cached_tokens",
        "evicted_prefix_tokens",
        "stall_s",
        "num_stalls",
        "first_scheduled_at",
        "first_token_at",
        "finished_at",
        # a session's turns (harness/report/sessions.py) and a cache ladder's rungs
        # (harness/report/cache_ladder.py): null in older records
        "phase",
        "session_id",
        "turn",
    )
}
#: Stall columns absent from the records read 0 (the records keep only stalls above
#: their threshold: none recorded is none seen).
ZERO_DEFAULTS = {"stall_s", "num_stalls"}
#: The engine's own counts: absent (an external engine's rows) they are unknown, null,
#: and the groups say None ("–" in the tables), never 0 (:func:`known_sum`).
ENGINE_COUNTS = (
    "preemptions",
    "preempt_swaps",
    "preempt_recomputes",
    "swapped_s",
    "recomputed_tokens",
    "idle_running_steps",
)
SLO_COLUMNS = ("slo_ttft_s", "slo_tpot_s", "slo_e2e_s")


def load_requests(lazy: pl.LazyFrame, slos: dict[str, dict]) -> pl.DataFrame:
    """The columns the report needs, one row per request, with ``slo_met``."""
    present = lazy.collect_schema().names()
    exprs = []
    for name, dtype in REQUEST_COLUMNS.items():
        if name in present:
            exprs.append(pl.col(name).cast(dtype))
        elif name in ZERO_DEFAULTS:
            exprs.append(pl.lit(0, dtype=dtype).alias(name))
        elif name == "class":
            exprs.append(pl.lit("default", dtype=dtype).alias(name))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    exprs += [pl.col(c).cast(pl.Float64) for c in SLO_COLUMNS if c in present]
    if CUT_AT in present:  # a load generator's: its cut requests are censored, not dropped
        exprs.append(pl.col(CUT_AT).cast(pl.Float64))
    if "itl_s" in present:  # every gap, as the load generator measured it
        exprs.append(pl.col("itl_s").cast(pl.List(pl.Float64)))
    frame = lazy.select(exprs).with_columns(pl.col("class").fill_null("default"))
    columns = frame.collect_schema().names()
    return frame.with_columns(slo_met=slo_met_expr(columns, slos)).collect()


def run_duration(frame: pl.DataFrame, info: dict) -> float:
    """The run's duration: the recorded one (the simulator's clock at the last
    completion, from t=0), else first arrival -> last token."""
    if info.get("duration_s"):
        return float(info["duration_s"])
    if frame.height == 0:
        return 0.0
    ends = frame.select((pl.col("scheduled_at") + pl.col("e2e_s")).max()).item()
    start = frame["scheduled_at"].min()
    if ends is None or start is None:
        return 0.0
    return float(ends - start)


def _itl(ok: pl.DataFrame) -> dict:
    """The ITL distribution: exact over every recorded gap when the records carry them
    (``itl_s``, the load generator's), else estimated from per-request TPOT weighted
    by gaps (docs/report.md)."""
    if "itl_s" in ok.columns:
        gaps = ok["itl_s"].explode().drop_nulls().to_numpy()
        if gaps.size:
            out = {
                "count": int(gaps.size),
                "mean": clean(float(gaps.mean())),
                "source": "recorded_gaps",
            }
            for p in PERCENTILES:
                out[f"p{p}"] = clean(percentile(gaps, p))
            return out
    rows = ok.filter(pl.col("tpot_s").is_not_null() & (pl.col("output_tokens") > 1))
    if rows.height == 0:
        return {"count": 0, "source": "tpot_weighted"}
    values = rows["tpot_s"].to_numpy()
    weights = (rows["output_tokens"] - 1).to_numpy()
    out = {
        "count": int(weights.sum()),
        "mean": clean(float(np.average(values, weights=weights))),
        "source": "tpot_weighted",
    }
    for p in PERCENTILES:
        out[f"p{p}"] = clean(weighted_percentile(values, weights, p))
    return out


def group_stats(frame: pl.DataFrame, duration_s: float, stalls: pl.DataFrame | None) -> dict:
    out = group_statistics(frame, duration_s, frame["slo_met"])
    ok = frame.filter(pl.col("status") == "ok")
    out["itl_s"] = _itl(ok)
    out["stalls"] = 0
    out["stall_time_s"] = 0.0
    out["stalls_by_cause"] = {c: {"count": 0, "time_s": 0.0} for c in STALL_CAUSES}
    out["generator_lag_s"] = _lag(frame)
    if stalls is not None and stalls.height:
        by = stalls.group_by("cause").agg(
            pl.len().alias("n"), pl.col("duration_s").sum().alias("t")
        )
        for cause, n, t in by.iter_rows():
            out["stalls_by_cause"][cause] = {"count": int(n), "time_s": clean(float(t))}
        out["stalls"] = int(stalls.height)
        out["stall_time_s"] = clean(float(stalls["duration_s"].sum()))
    return out


def _lag(frame: pl.DataFrame) -> dict | None:
    """sent_at - scheduled_at; None when the records have no lag (a simulation, or a
    generator that stamps both the same)."""
    lag = frame.select((pl.col("sent_at") - pl.col("scheduled_at")).alias("lag")).to_series()
    lag = lag.drop_nulls()
    if lag.len() == 0 or as_float(lag.abs().max()) == 0.0:
        return None
    values = lag.to_numpy()
    return {
        "p50": clean(percentile(values, 50)),
        "p99": clean(percentile(values, 99)),
        "max": clean(lag.max()),
        "mean": clean(lag.mean()),
    }


def policy_groups(frame: pl.DataFrame, duration_s: float, stalls: pl.DataFrame | None) -> dict:
    """{"overall": G, "classes": {class: G}} for one policy."""
    out = {"overall": group_stats(frame, duration_s, stalls), "classes": {}}
    for name in sorted(frame["class"].unique().to_list()):
        part = frame.filter(pl.col("class") == name)
        part_stalls = stalls.filter(pl.col("class") == name) if stalls is not None else None
        out["classes"][name] = group_stats(part, duration_s, part_stalls)
    return out


def class_sizes(frame: pl.DataFrame) -> list[str]:
    """Classes from shortest to longest job (mean prompt + max_tokens, else + output)."""
    size = (pl.col("prompt_tokens") + pl.coalesce("max_tokens", "output_tokens")).mean()
    by = frame.group_by("class").agg(size.alias("size")).sort("size", "class")
    return by["class"].to_list()


def starvation(groups: dict, frame: pl.DataFrame) -> dict | None:
    """p99 and max queue wait of the longest class against the shortest."""
    order = class_sizes(frame)
    if len(order) < 2:
        return None
    short, long = order[0], order[-1]
    qs = groups["classes"][short]["metrics"].get("queue_s", {})
    ql = groups["classes"][long]["metrics"].get("queue_s", {})
    ratio = None
    if qs.get("p99") and ql.get("p99") is not None:
        ratio = clean(ql["p99"] / qs["p99"])
    return {
        "short_class": short,
        "long_class": long,
        "ratio_p99_queue": ratio,
        "short_p99_queue_s": qs.get("p99"),
        "long_p99_queue_s": ql.get("p99"),
        "short_max_queue_s": qs.get("max"),
        "long_max_queue_s": ql.get("max"),
    }
