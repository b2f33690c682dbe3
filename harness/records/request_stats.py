"""Per-request statistics with one definition, shared by the simulator's summary
(harness/records/summary.py) and the report (harness/report): JSON-clean numbers, whether a
request met its class's SLOs, Jain's fairness index (docs/metrics.md), the
percentiles every latency is summarised by, and engine counts that may be unknown.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

#: The percentiles of every latency in summary.json and the report.
PERCENTILES = (50, 90, 95, 99)


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
    profile's). A missing target (null) is no target; a missing measurement (e.g. TPOT
    of a one-token request) passes that target.
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
        met = met & (limit.is_null() | pl.col(metric).is_null() | (pl.col(metric) <= limit))
    return met.fill_null(False)
