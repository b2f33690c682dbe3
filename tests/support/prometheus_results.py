"""What a Prometheus instant query returned (``PrometheusServer.query``, harness/run/
prometheus.py), read the way the dashboard tests read it."""

from __future__ import annotations

import math


def has_data(result: list[dict]) -> bool:
    """Whether an instant query's result vector (``[{"metric": ..., "value": [t, "v"]}]``)
    holds at least one finite sample: a panel drawn from it shows a number, not "No data"
    (an empty vector) nor NaN (a rate or ratio over no samples)."""
    return any(math.isfinite(float(sample["value"][1])) for sample in result)
