"""Creating metric families for one engine: every family is labelled ``model_name`` and
``engine`` first, then by its own label names, and is registered in the engine's
registry."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class FamilyFactory:
    """Makes the gauge, counter and histogram families of one engine's registry."""

    registry: CollectorRegistry
    model_name: str
    engine_index: int

    @property
    def labels(self) -> list[str]:
        """The label names every family starts with."""
        return ["model_name", "engine"]

    @property
    def values(self) -> list[str]:
        """This engine's values of :attr:`labels`."""
        return [self.model_name, str(self.engine_index)]

    def gauge(self, name, doc, extra=()) -> Gauge:
        return Gauge(name, doc, self.labels + list(extra), registry=self.registry)

    def counter(self, name, doc, extra=()) -> Counter:
        return Counter(name, doc, self.labels + list(extra), registry=self.registry)

    def histogram(self, name, doc, buckets, extra=()) -> Histogram:
        return Histogram(
            name, doc, self.labels + list(extra), buckets=buckets, registry=self.registry
        )
