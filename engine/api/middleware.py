"""The middlewares every request passes: errors rendered as OpenAI error bodies (never a
bare 500), and the guard of the API routes (API key, draining)."""

from __future__ import annotations

import hmac
import logging

from aiohttp import web

from engine.api.body import too_large
from engine.api.connections import check_framing
from engine.api.errors import ApiError, unavailable
from engine.api.json_codec import dumps
from engine.api.state import STATE

log = logging.getLogger("schedscope.server")

#: Guarded (API key, draining) besides /v1/*: tokenizing costs the server CPU.
GUARDED_PATHS = ("/tokenize", "/detokenize")


def error_response(err: ApiError) -> web.Response:
    return web.Response(
        status=err.status,
        text=dumps(err.body()),
        content_type="application/json",
        headers=err.headers,
    )


def _from_http_exception(request: web.Request, exc: web.HTTPException) -> ApiError:
    if exc.status == 404:
        return ApiError(
            404,
            f"Invalid URL ({request.method} {request.path})",
            "invalid_request_error",
            None,
            "not_found",
        )
    if exc.status == 405:
        allowed = exc.headers.get("Allow", "")
        return ApiError(
            405,
            f"Method {request.method} is not allowed for {request.path}"
            + (f"; allowed: {allowed}" if allowed else ""),
            "invalid_request_error",
            None,
            "method_not_allowed",
            {"Allow": allowed} if allowed else None,
        )
    if exc.status == 413:
        return _too_large(request)
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    return ApiError(exc.status, exc.reason, kind)


def _too_large(request: web.Request) -> ApiError:
    return too_large(request.app[STATE].settings.max_body_bytes)


#: After these the connection is closed: what is left of the body is not worth reading
#: (or, 501 and 505, not framed in a way this server reads). So it is after an error
#: that says ``Connection: close`` (an HTTP/1.0 request with a Transfer-Encoding).
_CLOSING_STATUSES = frozenset({408, 413, 415, 501, 505})


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Every error leaves as an OpenAI error body; nothing unexpected leaves as a bare 500.

    An error raised after a response has started (a stream's headers are out) cannot
    become a second response: it is re-raised, and aiohttp closes the connection."""
    started = getattr(request.protocol, "request_started", None)
    if started is not None:  # a guarded connection: this request's headers are complete
        started()
    closing = False
    try:
        check_framing(request)
        response = await handler(request)
    except ApiError as err:
        if request.writer.output_size:
            raise
        response = error_response(err)
        closing = err.headers.get("Connection", "").lower() == "close"
    except web.HTTPException as exc:
        if exc.status < 400 or request.writer.output_size:
            raise
        response = error_response(_from_http_exception(request, exc))
    except Exception:
        if request.writer.output_size:
            raise
        log.exception("unhandled error serving %s %s", request.method, request.path)
        response = error_response(ApiError(500, "internal server error", "server_error"))
    if closing or response.status in _CLOSING_STATUSES or not request.content.is_eof():
        # A body left unread is not drained: the connection ends with the response.
        response.force_close()
    return response


@web.middleware
async def guard_middleware(request: web.Request, handler) -> web.StreamResponse:
    """API key and draining, for the API routes only (/health, /version, /metrics stay
    open so load balancers and scrapers keep working)."""
    if request.path.startswith("/v1/") or request.path in GUARDED_PATHS:
        state = request.app[STATE]
        key = state.settings.api_key
        if key is not None:
            auth = request.headers.get("Authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode("utf-8", "surrogateescape"), key.encode("utf-8")
            ):
                raise ApiError(
                    401,
                    "missing or invalid API key: send 'Authorization: Bearer <key>'",
                    "authentication_error",
                    None,
                    "invalid_api_key",
                )
        if state.draining:
            raise unavailable("the server is shutting down")
    return await handler(request)
