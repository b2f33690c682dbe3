"""The ``/metrics`` exposition: the format negotiated from the scraper's ``Accept``
header, and the exemplars attached to observations.

Exemplars (``{"trace_id": ...}``, the request's trace id from
``engine.telemetry.trace_ids``, as its spans use) are attached to the TTFT, E2E, queue
time and stall histograms. They are exposed in the OpenMetrics format only:
:func:`render_registry` picks the format from the scraper's ``Accept`` header.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics.exposition import ALLOWUTF8
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from engine.telemetry.trace_ids import format_trace_id, request_trace_id

OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def render_registry(registry: CollectorRegistry, accept: str | None = None) -> tuple[bytes, str]:
    """(body, content type): OpenMetrics (with exemplars) when ``accept`` asks for
    it, as Prometheus does with exemplar storage on; else the classic text format."""
    if wants_openmetrics(accept):
        # allow-utf-8 keeps vLLM's colons: prometheus_client's default escaping
        # for OpenMetrics rewrites them to '_' in sample lines (not in # TYPE).
        return (
            generate_openmetrics(registry, escaping=ALLOWUTF8),
            OPENMETRICS_CONTENT_TYPE,
        )
    return generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4


def wants_openmetrics(accept: str | None) -> bool:
    """Whether an ``Accept`` header lists OpenMetrics (any version, any q > 0)."""
    for item in (accept or "").split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if media.lower() != "application/openmetrics-text":
            continue
        q = next((p[2:] for p in params if p.lower().startswith("q=")), "1")
        try:
            if float(q) > 0:
                return True
        except ValueError:
            return True
    return False


def request_exemplar(seq) -> dict[str, str]:
    """The exemplar of an observation about ``seq``: its trace id."""
    return {"trace_id": format_trace_id(request_trace_id(seq))}
