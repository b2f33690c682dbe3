"""The one definition of a percentile in schedscope (summary.json, the report, the gate,
the load generator's send lag, the live view, the benchmarks).

Percentiles are exact: computed from every value, linear interpolation between the two
nearest order statistics (``numpy.percentile``'s default, vLLM's benchmark's, Polars'
``quantile(q, "linear")``): for sorted x_0..x_{n-1}, the p-th percentile is
x_i + (h - i)(x_{i+1} - x_i) with h = (n-1)p/100, i = floor(h). A weighted percentile
(ITL estimated from per-request TPOT, each request weighted by its number of gaps) is the
smallest value whose cumulative weight reaches p% of the total.

numpy only: the load generator's Locust processes import it without Polars.
"""

from __future__ import annotations

import numpy as np


def percentile(values, p: float) -> float | None:
    """The exact p-th percentile (0..100) of ``values`` with linear interpolation (module
    docstring); NaN and None left out; None when nothing is left."""
    array = np.asarray(values, dtype=float)  # None reads NaN
    array = array[~np.isnan(array)]
    if array.size == 0:
        return None
    return float(np.percentile(array, p))


def weighted_percentile(values, weights, p: float) -> float | None:
    """The smallest value whose cumulative weight reaches p% of the total (module
    docstring); NaN values and non-positive weights left out; None when nothing is left."""
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
