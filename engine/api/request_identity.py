"""Who a generation request is, from its headers: its id (``X-Request-Id`` or generated),
which is the engine's request id, the body's ``id`` and the response's ``X-Request-Id``
header, so client and engine records join; its class (``X-Request-Class``, a label in
reports and metrics); the conversation turn it is (``X-Session-Turn``: the prefix cache's
hit rate by turn); and its trace context (``traceparent``)."""

from __future__ import annotations

import re
import uuid

from aiohttp import web

from engine.api.errors import bad_request
from engine.api.generate_request import GenerateRequest

REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_CLASS_HEADER = "X-Request-Class"
SESSION_TURN_HEADER = "X-Session-Turn"
#: The largest turn a client may say (any real conversation is far shorter).
MAX_SESSION_TURN = 1_000_000
TRACEPARENT_HEADER = "traceparent"
_REQUEST_ID = re.compile(r"[\x20-\x7e]{1,128}")
#: A request class is a label in reports and metrics: short, no spaces or quotes.
_REQUEST_CLASS = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")


def read_request_id(request: web.Request, kind: str) -> str:
    given = request.headers.get(REQUEST_ID_HEADER)
    if given is None:
        return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    if not _REQUEST_ID.fullmatch(given):
        raise bad_request(
            f"{REQUEST_ID_HEADER} must be 1 to 128 printable ASCII characters", REQUEST_ID_HEADER
        )
    return given


def read_request_class(request: web.Request) -> str:
    given = request.headers.get(REQUEST_CLASS_HEADER)
    if given is None:
        return ""
    if not _REQUEST_CLASS.fullmatch(given):
        raise bad_request(
            f"{REQUEST_CLASS_HEADER} must be 1 to 64 characters of letters, digits "
            f"and _ . : / -, got {given[:80]!r}",
            REQUEST_CLASS_HEADER,
        )
    return given


def read_session_turn(request: web.Request) -> int:
    """The client's ``X-Session-Turn`` (1 for a conversation's first turn), 0 when it
    sends none."""
    given = request.headers.get(SESSION_TURN_HEADER)
    if given is None:
        return 0
    if not (given.isascii() and given.isdigit() and 1 <= int(given) <= MAX_SESSION_TURN):
        raise bad_request(
            f"{SESSION_TURN_HEADER} must be a whole number from 1 to {MAX_SESSION_TURN:,}, "
            f"got {given[:80]!r}",
            SESSION_TURN_HEADER,
        )
    return int(given)


def engine_request_ids(request_id: str, req: GenerateRequest) -> list[str]:
    """One engine request per choice: the request's own id, or ``<id>-<index>`` for
    each prompt of a batch (vLLM's convention), so records still join by prefix."""
    if not req.is_batch:
        return [request_id]
    return [f"{request_id}-{i}" for i in range(len(req.choices))]
