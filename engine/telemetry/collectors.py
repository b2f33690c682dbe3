"""Collectors that are not ``prometheus_client`` metric objects, rendered at scrape
time: :class:`BulkHistogram` (histograms fed in bulk, without a lock) and
:class:`DroppedSpans` (``schedscope_dropped_spans_total``, read from the span
exporter's counts).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily


class BulkHistogram:
    """Histogram families fed in bulk: one ``bisect`` and two adds per value, no lock,
    rendered at scrape time. Several names can expose the same data (vLLM V0's
    ``time_per_output_token_seconds`` and V1's ``inter_token_latency_seconds`` are both
    the gap between consecutive tokens)."""

    def __init__(self, names: list[tuple[str, str]], buckets, labelnames, labelvalues) -> None:
        self._names = names
        self._bounds = [float(b) for b in buckets]
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum = 0.0
        self._labelnames = list(labelnames)
        self._labelvalues = [str(v) for v in labelvalues]

    def observe_many(self, values) -> None:
        counts, bounds = self._counts, self._bounds
        total = 0.0
        for value in values:
            counts[bisect.bisect_left(bounds, value)] += 1
            total += value
        self._sum += total

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    @property
    def count(self) -> int:
        return sum(self._counts)

    def describe(self):
        return [
            HistogramMetricFamily(name, doc, labels=self._labelnames) for name, doc in self._names
        ]

    def collect(self):
        counts, total = list(self._counts), self._sum  # a consistent-enough snapshot
        cumulative, running = [], 0
        for bound, count in zip([*self._bounds, float("inf")], counts, strict=True):
            running += count
            cumulative.append((_le(bound), running))
        for name, doc in self._names:
            family = HistogramMetricFamily(name, doc, labels=self._labelnames)
            family.add_metric(self._labelvalues, cumulative, total)
            yield family


def _le(bound: float) -> str:
    if bound == float("inf"):
        return "+Inf"
    return repr(float(bound))


class DroppedSpans:
    """``schedscope_dropped_spans_total``, read at scrape time from the callables the
    span exporter registered (0 when none)."""

    def __init__(self, labelnames, labelvalues) -> None:
        self.sources: list[Callable[[], int]] = []
        self._labelnames = list(labelnames)
        self._labelvalues = [str(v) for v in labelvalues]

    def describe(self):
        return [CounterMetricFamily("schedscope_dropped_spans", "", labels=self._labelnames)]

    def collect(self):
        total = 0
        for source in list(self.sources):
            try:
                total += int(source())
            except Exception:  # a broken source must not break the scrape
                pass
        family = CounterMetricFamily(
            "schedscope_dropped_spans",
            "Spans the span exporter dropped (queue full or export failed).",
            labels=self._labelnames,
        )
        family.add_metric(self._labelvalues, total)
        yield family
