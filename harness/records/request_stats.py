"""Per-request statistics with one definition, shared by the simulator's summary
(harness/records/summary.py), the report (harness/report), the gate, ``tune`` and the
load generator: the latency metrics and their names, the percentiles every latency is
summarised by and how a percentile is computed, JSON-clean numbers, whether a request
met its class's SLOs, Jain's fairness index (docs/metrics.md), engine counts that may be
unknown, and the statistics of a group of requests (:func:`group_statistics`).

Censoring: a request the end of a run cut in flight (the load generator's ``cut_at``:
when it was cut) is not dropped. It never met its SLOs (``slo_met_expr`` needs ``ok``);
its TTFT is at least the time from its arrival to the cut (its measured TTFT when its
first token came) and its E2E at least that time (:data:`CENSORED_METRICS`). The
distributions of those two metrics take the cut requests in at those lower bounds; a
statistic the bounds can move (were the cut requests to have taken longer) is a lower
bound, named in the distribution's ``lower_bound`` ("p99 >= 54 s"), and one they cannot
move (the cut requests lie above it) is exact. Without cut requests nothing changes.

Percentiles: :mod:`harness.records.percentiles` (numpy only, for the load generator's
processes too), re-exported here.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from harness.records.percentiles import percentile, weighted_percentile  # noqa: F401
from harness.records.requests import STATUSES

#: The percentiles of every latency in summary.json and the report.
PERCENTILES = (50, 90, 95, 99)
#: The statistics of a latency distribution in summary.json and the report, in order
#: (what ``tune --slo`` and the report's tables may name).
STATISTICS = ("mean", "max", *(f"p{p}" for p in PERCENTILES))

#: Each latency metric's one name (``--slo``, the gate's rules, the report) -> its
#: requests.parquet column. ``itl`` is every gap between two tokens (the load
#: generator's ``itl_s`` lists, else estimated from TPOT); ``max_itl`` a request's
#: longest gap.
METRIC_COLUMNS = {
    "ttft": "ttft_s",
    "tpot": "tpot_s",
    "e2e": "e2e_s",
    "itl": "itl_s",
    "max_itl": "max_itl_s",
    "queue": "queue_s",
    "total_queue": "total_queue_s",
    "stall": "stall_s",
}
#: The per-request latency columns every group summarises as a distribution
#: (:func:`distributions`); ``itl_s`` is a list per request, summarised apart.
LATENCY_METRICS = tuple(c for c in METRIC_COLUMNS.values() if c != "itl_s")
#: The load generator's column: when a request was cut in flight (null: it was not).
CUT_AT = "cut_at"
#: The metrics a cut request bounds from below (module docstring); the others of a cut
#: request are unknown (its TPOT, its engine-side queue and stalls).
CENSORED_METRICS = ("ttft_s", "e2e_s")
#: What stands for "longer than anything" when a statistic is tested for exactness.
_UNBOUNDED = 1e30


def distribution(values) -> dict:
    """``{"count": 0}``, or count, mean, max and every percentile of :data:`PERCENTILES`
    of ``values`` (NaN and None left out), JSON-clean."""
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    if array.size == 0:
        return {"count": 0}
    out = {"count": int(array.size), "mean": clean(array.mean()), "max": clean(array.max())}
    for p, value in zip(PERCENTILES, np.percentile(array, PERCENTILES), strict=True):
        out[f"p{p}"] = clean(value)
    return out


def censored_distribution(values, bounds) -> dict:
    """:func:`distribution` of ``values`` (measured) and ``bounds`` (lower bounds of the
    cut requests') together, with ``censored`` (how many bounds) and ``lower_bound`` (the
    statistics the bounds can move, in :data:`STATISTICS` order: those are at least their
    value; the rest are exact). No bounds: :func:`distribution` as it is."""
    measured = np.asarray(values, dtype=float)
    measured = measured[~np.isnan(measured)]
    low = np.asarray(bounds, dtype=float)
    low = low[~np.isnan(low)]
    if low.size == 0:
        return distribution(measured)
    out = distribution(np.concatenate([measured, low]))
    high = distribution(np.concatenate([measured, np.full(low.size, _UNBOUNDED)]))
    out["censored"] = int(low.size)
    out["lower_bound"] = [s for s in STATISTICS if out.get(s) != high.get(s)]
    return out


def is_cut() -> pl.Expr:
    """Per row of records with :data:`CUT_AT`: whether it was cut in flight."""
    return (pl.col("status") == "aborted") & pl.col(CUT_AT).is_not_null()


def censored_bound(metric: str) -> pl.Expr:
    """A cut request's lower bound of ``metric`` (one of :data:`CENSORED_METRICS`): the
    time from its arrival to the cut, or its TTFT when its first token came."""
    elapsed = pl.col(CUT_AT) - pl.col("scheduled_at")
    return pl.coalesce(pl.col(metric), elapsed) if metric == "ttft_s" else elapsed


def cut_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """The requests of ``frame`` cut in flight by the end of the run (none when the
    records have no :data:`CUT_AT`: a simulation's, or an older load generator's)."""
    if CUT_AT not in frame.columns:
        return frame.clear()
    return frame.filter(is_cut())


def censored_bounds(cut: pl.DataFrame, metric: str) -> np.ndarray:
    """:func:`censored_bound` of ``metric`` for each of the cut requests ``cut``."""
    return cut.select(censored_bound(metric).cast(pl.Float64)).to_series().to_numpy()


def censored_metric(frame: pl.DataFrame, metric: str) -> dict:
    """The distribution of ``metric`` (one of :data:`CENSORED_METRICS`) over the
    requests of ``frame``: the ``ok`` ones measured, those cut in flight at their lower
    bounds (:func:`censored_distribution`); failed ones in no statistic."""
    ok = frame.filter(pl.col("status") == "ok")
    measured = ok[metric].cast(pl.Float64).fill_null(float("nan")).to_numpy()
    cut = cut_rows(frame)
    bounds = censored_bounds(cut, metric) if cut.height else np.empty(0)
    return censored_distribution(measured, bounds)


def distributions(ok: pl.DataFrame) -> dict[str, dict]:
    """:func:`distribution` of every column of :data:`LATENCY_METRICS` that ``ok`` has."""
    return {
        m: distribution(ok[m].cast(pl.Float64).fill_null(float("nan")).to_numpy())
        for m in LATENCY_METRICS
        if m in ok.columns
    }


def rate(count: float, duration_s: float) -> float | None:
    """``count`` per second of the run; None when the run's duration is not known (0: no
    recorded duration and no request with an end), never a rate over a near-zero span."""
    return clean(count / duration_s) if duration_s > 0 else None


def group_statistics(frame: pl.DataFrame, duration_s: float, slo_met: pl.Series) -> dict:
    """The statistics of one group of requests (a policy, a class), one definition for
    summary.json and the report: counts by status, throughput, goodput and SLO attainment
    (``slo_met``: per row of ``frame``, :func:`slo_met_expr`), every latency's
    distribution over the ``ok`` requests, the engine's counts (None where unknown) and
    Jain's index of E2E per output token. The caller adds what only it knows."""
    ok = frame.filter(pl.col("status") == "ok")
    counts = {s: int((frame["status"] == s).sum()) for s in STATUSES}
    good = int(slo_met.sum()) if frame.height else 0
    normalized = ok.select(pl.col("e2e_s") / pl.col("output_tokens").cast(pl.Float64))
    metrics = distributions(ok)
    censored: dict = {}
    if CUT_AT in frame.columns:  # a load generator's records: cut requests are counted
        cut = cut_rows(frame)
        censored["cut_in_flight"] = cut.height
        for m in CENSORED_METRICS:
            if cut.height and m in ok.columns:
                metrics[m] = censored_distribution(
                    ok[m].cast(pl.Float64).fill_null(float("nan")).to_numpy(),
                    censored_bounds(cut, m),
                )
    return {
        "requests": frame.height,
        "counts": counts,
        "throughput_rps": rate(counts["ok"], duration_s),
        "output_tokens_per_s": rate(float(ok["output_tokens"].sum()), duration_s),
        "goodput_rps": rate(good, duration_s),
        "slo_attainment": clean(good / frame.height) if frame.height else None,
        "slo_met": good,
        **censored,
        "metrics": metrics,
        # None where the rows carry no value (an external engine's): unknown, not 0
        "preemptions": {
            "swap": known_sum(frame, "preempt_swaps"),
            "recompute": known_sum(frame, "preempt_recomputes"),
        },
        "recomputed_tokens": known_sum(frame, "recomputed_tokens"),
        "swapped_s": clean(known_sum(frame, "swapped_s", float)),
        "idle_running_steps": known_sum(frame, "idle_running_steps"),
        "jain_index": clean(jain_index(normalized.to_series().to_numpy()) if ok.height else None),
    }


def clean(value, digits: int = 9):
    """JSON-safe: NaN/inf become None; floats to ``digits`` significant digits."""
    if value is None:
        return None
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return float(f"{value:.{digits}g}")
    return value


def known_sum(frame: pl.DataFrame, column: str, kind: type = int) -> int | float | None:
    """The sum of ``column``, or None when no row has a value: an engine count (the
    preemptions, recomputed tokens ...) that an external engine's rows do not carry is
    unknown, not 0. An empty frame sums to 0."""
    values = frame[column]
    if frame.height and values.null_count() == frame.height:
        return None
    return kind(values.sum() or 0)


def jain_index(values) -> float | None:
    """Jain's index over x: (sum x)^2 / (n sum x^2), NaN and nulls left out; 1 is
    perfectly even, 1/n maximally uneven."""
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    if array.size == 0:
        return None
    total_sq = float(np.dot(array, array))
    if total_sq == 0:
        return 1.0
    return float(array.sum()) ** 2 / (array.size * total_sq)


def slo_met_expr(columns: list[str], slos: dict[str, dict]) -> pl.Expr:
    """Per request: ``status == ok`` and within every SLO of its class.

    The SLOs come from per-row columns ``slo_ttft_s``/``slo_tpot_s``/``slo_e2e_s`` when
    the records carry them, else from ``slos`` (class -> {ttft_s, tpot_s, e2e_s}, the
    profile's). A missing target (null) is no target. A missing measurement fails its
    target (an ``ok`` stream that ended without a token has no TTFT or E2E: nothing was
    measured to be within it), except TPOT where it does not exist: a request of one
    output token or none (``output_tokens`` <= 1; without that column, or with it null,
    a missing TPOT fails too).
    """
    met = pl.col("status") == "ok"
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        if f"slo_{metric}" in columns:
            limit = pl.col(f"slo_{metric}")
        else:
            mapping = {c: s.get(metric) for c, s in slos.items() if s.get(metric) is not None}
            if not mapping:
                continue
            limit = pl.col("class").replace_strict(mapping, default=None, return_dtype=pl.Float64)
        within = pl.col(metric) <= limit  # null where the metric is missing: not within
        if metric == "tpot_s" and "output_tokens" in columns:
            undefined = pl.col(metric).is_null() & (pl.col("output_tokens") <= 1)
            within = undefined | within
        met = met & (limit.is_null() | within)
    return met.fill_null(False)
