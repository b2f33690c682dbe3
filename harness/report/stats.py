"""The report's statistics, one definition each (docs/report.md).

- Percentiles are exact: computed from every value, linear interpolation between the
  two nearest order statistics (``numpy.percentile``'s default, vLLM's benchmark's,
  Polars' ``quantile(q, "linear")``): for sorted x_0..x_{n-1}, p-th percentile =
  x_i + (h - i)(x_{i+1} - x_i) with h = (n-1)p/100, i = floor(h).
- Weighted percentiles (ITL estimated from per-request TPOT, each request weighted by
  its number of gaps): the smallest value whose cumulative weight reaches p% of the
  total (the inverse of the weighted empirical CDF).
- Jain's index over x: (Σx)² / (n Σx²); 1 is perfectly even, 1/n maximally uneven.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

PERCENTILES = (50, 90, 95, 99)


def percentile(values, p: float) -> float | None:
    """Exact percentile with linear interpolation (module docstring)."""
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    if array.size == 0:
        return None
    return float(np.percentile(array, p))


def weighted_percentile(values, weights, p: float) -> float | None:
    values = np.asarray(values, dtype=float)
    weights = np.asarray(weights, dtype=float)
    keep = ~np.isnan(values) & (weights > 0)
    values, weights = values[keep], weights[keep]
    if values.size == 0:
        return None
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    index = int(np.searchsorted(cumulative, p / 100.0 * cumulative[-1], side="left"))
    return float(values[order][min(index, values.size - 1)])


def jain_index(values) -> float | None:
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    if array.size == 0:
        return None
    total_sq = float(np.dot(array, array))
    if total_sq == 0:
        return 1.0
    return float(array.sum()) ** 2 / (array.size * total_sq)


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


# -- block bootstrap of a difference -------------------------------------------------------

BOOTSTRAP_SEED = 20260101
BOOTSTRAP_RESAMPLES = 200
BOOTSTRAP_MAX_ROWS = 20_000
MIN_BLOCKS = 40


def time_blocks(times: np.ndarray, start: float, end: float, num_blocks: int = MIN_BLOCKS) -> np.ndarray:
    """Block id of each request: its arrival's window of (end - start) / num_blocks."""
    width = max((end - start) / num_blocks, 1e-9)
    return np.clip(((times - start) / width).astype(np.int64), 0, num_blocks - 1)


def paired_block_bootstrap(
    a: tuple[np.ndarray, np.ndarray],
    b: tuple[np.ndarray, np.ndarray],
    statistic,
    num_blocks: int = MIN_BLOCKS,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    max_rows: int = BOOTSTRAP_MAX_ROWS,
) -> tuple[float, float] | None:
    """95% CI of ``statistic(A) - statistic(B)``.

    ``a`` and ``b`` are (values, block ids): the same arrival-time windows in both
    runs. Each resample draws ``num_blocks`` windows with replacement — the same
    windows for A and B (the policies saw the same arrivals) — and keeps every request
    of those windows, so the correlation of requests queued together stays inside a
    block. Groups above ``max_rows`` are first subsampled (seeded) to ``max_rows``:
    the CI is then wider than the full sample's, never narrower.
    """
    rng = np.random.default_rng(seed)

    def prepare(values, blocks):
        values = np.asarray(values, dtype=float)
        blocks = np.asarray(blocks)
        if values.size > max_rows:
            pick = rng.choice(values.size, max_rows, replace=False)
            values, blocks = values[pick], blocks[pick]
        order = np.argsort(blocks, kind="stable")
        values, blocks = values[order], blocks[order]
        bounds = np.searchsorted(blocks, np.arange(num_blocks + 1))
        return values, bounds

    va, ba = prepare(*a)
    vb, bb = prepare(*b)
    if va.size == 0 or vb.size == 0:
        return None
    diffs = []
    for _ in range(resamples):
        chosen = rng.integers(0, num_blocks, num_blocks)
        ia = np.concatenate([np.arange(ba[k], ba[k + 1]) for k in chosen])
        ib = np.concatenate([np.arange(bb[k], bb[k + 1]) for k in chosen])
        if ia.size == 0 or ib.size == 0:
            continue
        sa, sb = statistic(va[ia]), statistic(vb[ib])
        if sa is None or sb is None:
            continue
        diffs.append(sa - sb)
    if len(diffs) < resamples // 2:
        return None
    low, high = np.percentile(np.asarray(diffs), [2.5, 97.5])
    return float(low), float(high)
