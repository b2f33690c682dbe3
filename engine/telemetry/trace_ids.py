"""The trace id of a request, agreed on by spans and metric exemplars without sharing
state: the client's W3C ``traceparent`` trace id when the request carried one (so the
client's trace and the engine's join), else one derived from the request itself."""

from __future__ import annotations

import hashlib


def traceparent_ids(traceparent: str | None) -> tuple[int, int] | None:
    """(trace id, parent span id) of a valid ``traceparent`` (engine.core.request has
    already validated it), else None."""
    if not traceparent:
        return None
    _, trace_id, parent_id, _ = traceparent.split("-")
    return int(trace_id, 16), int(parent_id, 16)


def derived_trace_id(request_id: str, seq_no: int, arrival_time: float) -> int:
    """A 128-bit trace id that is a function of the request: the same in every observer
    and every process that sees the request, distinct for a reused request id (the
    engine's ``seq_no`` is unique for its life), never zero (invalid in W3C)."""
    digest = hashlib.blake2b(
        f"{request_id}\x00{seq_no}\x00{arrival_time!r}".encode(), digest_size=16
    ).digest()
    return int.from_bytes(digest, "big") or 1


def request_trace_id(seq) -> int:
    """The trace id of an ``engine.core.sequence.Sequence``'s request."""
    ids = traceparent_ids(seq.traceparent)
    if ids is not None:
        return ids[0]
    return derived_trace_id(seq.request_id, seq.seq_no, seq.arrival_time)


def format_trace_id(trace_id: int) -> str:
    """32 lowercase hex digits, as W3C, OTLP-JSON and Prometheus exemplars write it."""
    return f"{trace_id:032x}"
