"""Span files (OTLP-JSON lines, ``--trace-file``) into ``spans.parquet``.

One row per span. Fixed columns: ``name``, ``trace_id``, ``span_id``,
``parent_span_id`` (hex; null for a root), ``kind`` (``internal``, ``server``, ...),
``start_ns``/``end_ns`` (Unix ns), ``start``/``end`` (Unix seconds, float),
``duration_s``, ``request_id`` (schedscope's request id: the ``schedscope.request.id``
attribute, else recovered from vLLM's ``gen_ai.request.id``, :func:`vllm_request_id`), ``status``
(``unset``, ``ok``, ``error``), ``status_message``, ``scope``, ``events`` (a list of
``{name, time, attributes}`` with ``attributes`` as a JSON object string). Every span
attribute becomes a column ``attr.<name>`` and every resource attribute a column
``resource.<name>`` (null where a span lacks it; arrays become list columns).

Ids are read with ``bytes.fromhex``-style hex, never protobuf's ``json_format``
(which would take OTLP/JSON's hex ids for base64).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl

from harness.records.polars_types import Schema

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUS_CODES = {0: "unset", 1: "ok", 2: "error"}

ATTR_PREFIX = "attr."
RESOURCE_PREFIX = "resource."

#: The request id attribute of schedscope's own spans.
SCHEDSCOPE_REQUEST_ID = "schedscope.request.id"
#: The request id attribute of vLLM's ``llm_request`` span (vllm/tracing/utils.py).
VLLM_REQUEST_ID = "gen_ai.request.id"
#: How vLLM's OpenAI server (0.32: vllm/entrypoints/openai/completion/serving.py and
#: chat_completion/serving.py) names the engine request it makes of a client's
#: ``X-Request-Id``: ``cmpl-<id>-<i>`` for a completion (``i`` the prompt's index in the
#: request, 0 for a single prompt), ``chatcmpl-<id>`` for a chat completion. The id
#: itself may hold dashes (schedscope's do: ``mixed-42-0000012``): a completion's last
#: ``-<digits>`` is vLLM's, the rest is the client's.
_VLLM_ID = re.compile(r"^(?:cmpl-(?P<completion>.+)-\d+|chatcmpl-(?P<chat>.+))$")

FIXED_SCHEMA: Schema = {
    "name": pl.String,
    "trace_id": pl.String,
    "span_id": pl.String,
    "parent_span_id": pl.String,
    "kind": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "start": pl.Float64,
    "end": pl.Float64,
    "duration_s": pl.Float64,
    "request_id": pl.String,
    "status": pl.String,
    "status_message": pl.String,
    "scope": pl.String,
    "events": pl.List(pl.Struct({"name": pl.String, "time": pl.Float64, "attributes": pl.String})),
}


def any_value(value: dict):
    """An OTLP/JSON ``AnyValue`` as a Python value (int64 arrives as a string)."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [any_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return json.dumps(key_values(value["kvlistValue"].get("values", [])))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def key_values(items: list[dict] | None) -> dict:
    return {item["key"]: any_value(item.get("value", {})) for item in items or ()}


def vllm_request_id(engine_request_id: object) -> str | None:
    """The client's ``X-Request-Id`` inside vLLM's engine request id (``_VLLM_ID``), or
    None when ``engine_request_id`` is not of those forms. (A request sent without the
    header gets a random uuid from vLLM in its place: recovered, it matches no client.)"""
    if not isinstance(engine_request_id, str):
        return None
    match = _VLLM_ID.match(engine_request_id)
    if match is None:
        return None
    return match["completion"] or match["chat"]


def span_request_id(attributes: dict) -> str | None:
    """The schedscope request a span belongs to: its ``schedscope.request.id``, else the
    id recovered from vLLM's ``gen_ai.request.id``; None for neither."""
    own = attributes.get(SCHEDSCOPE_REQUEST_ID)
    if own is not None:
        return own
    return vllm_request_id(attributes.get(VLLM_REQUEST_ID))


def _hex_id(value: str | None) -> str | None:
    if not value:
        return None
    bytes.fromhex(value)  # a malformed id fails here, not in a later join
    return value.lower()


def span_rows(request: dict) -> list[dict]:
    """The rows of one ``ExportTraceServiceRequest`` (one line of a span file)."""
    rows = []
    for resource_spans in request.get("resourceSpans", []):
        resource = key_values(resource_spans.get("resource", {}).get("attributes"))
        resource_columns = {RESOURCE_PREFIX + k: v for k, v in resource.items()}
        for scope_spans in resource_spans.get("scopeSpans", []):
            scope = scope_spans.get("scope", {}).get("name", "")
            for span in scope_spans.get("spans", []):
                attributes = key_values(span.get("attributes"))
                start_ns = int(span.get("startTimeUnixNano", 0))
                end_ns = int(span.get("endTimeUnixNano", 0))
                status = span.get("status", {})
                row = {
                    "name": span.get("name", ""),
                    "trace_id": _hex_id(span.get("traceId")),
                    "span_id": _hex_id(span.get("spanId")),
                    "parent_span_id": _hex_id(span.get("parentSpanId")),
                    "kind": KINDS.get(int(span.get("kind", 0)), "unspecified"),
                    "start_ns": start_ns,
                    "end_ns": end_ns,
                    "start": start_ns / 1e9,
                    "end": end_ns / 1e9,
                    "duration_s": (end_ns - start_ns) / 1e9,
                    "request_id": span_request_id(attributes),
                    "status": STATUS_CODES.get(int(status.get("code", 0)), "unset"),
                    "status_message": status.get("message") or None,
                    "scope": scope,
                    "events": [
                        {
                            "name": e.get("name", ""),
                            "time": int(e.get("timeUnixNano", 0)) / 1e9,
                            "attributes": json.dumps(key_values(e.get("attributes"))),
                        }
                        for e in span.get("events", [])
                    ],
                }
                row.update(resource_columns)
                row.update({ATTR_PREFIX + k: v for k, v in attributes.items()})
                rows.append(row)
    return rows


def read_spans(path: Path | str) -> pl.DataFrame:
    """Every span of an OTLP-JSON lines file, one row each (module docstring)."""
    rows: list[dict] = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.extend(span_rows(json.loads(line)))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not an OTLP-JSON trace export: {exc}") from None
    return spans_frame(rows)


def spans_frame(rows: list[dict]) -> pl.DataFrame:
    extra = sorted(
        {k for row in rows for k in row} - FIXED_SCHEMA.keys(),
        key=lambda k: (not k.startswith(RESOURCE_PREFIX), k),
    )
    columns = {
        name: pl.Series(name, [row.get(name) for row in rows], dtype=dtype)
        for name, dtype in FIXED_SCHEMA.items()
    }
    for name in extra:
        values = [row.get(name) for row in rows]
        try:
            columns[name] = pl.Series(name, values, strict=False)
        except (TypeError, ValueError, pl.exceptions.PolarsError):
            # mixed kinds under one name: keep them all, as text
            columns[name] = pl.Series(
                name, [None if v is None else str(v) for v in values], dtype=pl.String
            )
    return pl.DataFrame(columns)


def shift_spans(frame: pl.DataFrame, shift_s: float) -> pl.DataFrame:
    """``frame`` with every instant (start, end, event times) moved by ``shift_s``
    seconds; durations unchanged."""
    shift_ns = round(shift_s * 1e9)
    return frame.with_columns(
        pl.col("start_ns") + shift_ns,
        pl.col("end_ns") + shift_ns,
        pl.col("start") + shift_s,
        pl.col("end") + shift_s,
        pl.col("events").list.eval(pl.element().struct.with_fields(pl.field("time") + shift_s)),
    )


def write_spans_parquet(spans: pl.DataFrame | Path | str, out: Path | str) -> pl.DataFrame:
    """Write ``spans`` (a frame, or a span file to read) to ``out`` (spans.parquet)."""
    frame = spans if isinstance(spans, pl.DataFrame) else read_spans(spans)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(out)
    return frame
