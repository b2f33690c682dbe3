"""Connections: a header deadline, a cap on open connections, JSON for parser errors.

aiohttp's server has no header read timeout: a client trickling one header byte every
half second holds its connection (and a file descriptor) for ever, and a few hundred
such clients exhaust the process's descriptors, after which legitimate requests time
out. :class:`GuardedRequestHandler` (aiohttp's protocol, one per connection) adds:

- a header deadline: a request's header block must arrive within ``header_timeout_s``
  of its first byte (of the connection's opening, for the first request); otherwise
  the connection gets a 408 and is closed. Bodies have their own deadline
  (``body_timeout_s``, in :mod:`engine.api.body`).
- a cap on open connections: beyond ``max_connections`` a new connection gets a 503
  with ``Retry-After`` and is closed before any byte of it is parsed.
- errors of aiohttp's HTTP parser (a bad request line, a header too long, too many
  headers, a bad chunk size) as OpenAI-style JSON bodies instead of text/plain, and
  logged at a bounded rate.

:class:`GuardedTCPSite` is aiohttp's ``TCPSite`` whose connections use this handler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from engine.api.protocol import ApiError, dumps

log = logging.getLogger("schedscope.server")

#: The end of an HTTP header block.
_HEADER_END = b"\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    max_connections: int = 1024
    keepalive_timeout_s: float = 75.0  # an idle keep-alive connection is closed after this
    retry_after_s: int = 1


class RateLimitedLog:
    """Logs the first occurrence of a kind of event, then at most one summary line
    (with the count since the last line) every ``interval_s``: a flood of bad
    connections must not become a flood of log lines."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, kind: str, message: str, *args) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval_s:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._last[kind] = now
        suppressed = self._suppressed.pop(kind, 0)
        suffix = f" ({suppressed} more like this since the last report)" if suppressed else ""
        self.logger.warning(message + suffix, *args)


def raw_json_response(status: int, reason: str, err: ApiError, retry_after_s: int | None = None
                      ) -> bytes:
    """A complete HTTP/1.1 response that closes the connection, for connections no
    aiohttp request exists for (refused, or timed out before their headers)."""
    body = dumps(err.body()).encode()
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", "Connection: close"]
    if retry_after_s is not None:
        head.append(f"Retry-After: {retry_after_s}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class ConnectionGuard:
    """State shared by the connections of one server: the open count and the log."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.num_open = 0
        self.num_refused = 0
        self.num_header_timeouts = 0
        self.num_parser_errors = 0
        self.log = RateLimitedLog(log)

    def loop_exception_handler(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """asyncio's handler, rate-limited: accept() failing for want of descriptors
        reports once per retry, from every listener, for as long as it lasts."""
        message = context.get("message", "unhandled exception in event loop")
        exc = context.get("exception")
        self.log.warning(f"loop:{message}", "%s%s", message, f": {exc!r}" if exc else "")


class GuardedRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol with the deadlines and the cap above."""

    def __init__(self, manager: web.Server, *, guard: ConnectionGuard, **kwargs) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._refused = False
        self._header_deadline: asyncio.TimerHandle | None = None
        self._header_tail = b""  # the last bytes seen, for an end split across reads
        self._awaiting_headers = False
        self._idle = True  # between requests: the next byte starts a header block

    # -- the connection's life --------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        if guard.num_open >= guard.limits.max_connections:
            self._refused = True
            guard.num_refused += 1
            guard.log.warning("refused", "refused a connection: %d are open, the limit is %d "
                              "(--max-connections)", guard.num_open, guard.limits.max_connections)
            err = ApiError(503, f"the server has {guard.num_open} open connections, its limit; "
                           "retry later", "server_error", None, "too_many_connections")
            transport.write(raw_json_response(503, "Service Unavailable", err,
                                              guard.limits.retry_after_s))
            transport.close()
            return
        guard.num_open += 1
        super().connection_made(transport)
        self._arm_header_deadline()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return  # never registered with aiohttp's server
        self._cancel_header_deadline()
        self._guard.num_open -= 1
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._idle:
            self._idle = False
            if not self._awaiting_headers:
                self._arm_header_deadline()
        if self._awaiting_headers:
            seen = self._header_tail + data
            if _HEADER_END in seen:
                self._cancel_header_deadline()
            else:
                self._header_tail = seen[-3:]
        super().data_received(data)

    def request_done(self) -> None:
        """Called when a response has been sent: the connection is between requests."""
        self._idle = True

    # -- the header deadline ---------------------------------------------------------
    def _arm_header_deadline(self) -> None:
        self._awaiting_headers = True
        self._header_tail = b""
        if self._header_deadline is None:
            self._header_deadline = self._loop.call_later(
                self._guard.limits.header_timeout_s, self._header_deadline_passed)

    def _cancel_header_deadline(self) -> None:
        self._awaiting_headers = False
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_deadline_passed(self) -> None:
        self._header_deadline = None
        if not self._awaiting_headers or self.transport is None:
            return
        guard = self._guard
        guard.num_header_timeouts += 1
        guard.log.warning("header-timeout", "closed a connection whose request headers did not "
                          "arrive within %.1f s (--header-timeout)", guard.limits.header_timeout_s)
        err = ApiError(408, f"the request headers did not arrive within "
                       f"{guard.limits.header_timeout_s:g} s", "invalid_request_error", None,
                       "request_timeout")
        self.transport.write(raw_json_response(408, "Request Timeout", err))
        self.force_close()
        self.transport.close()

    # -- parser errors as JSON --------------------------------------------------------
    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        guard = self._guard
        if status >= 500:  # a fault of ours, not a malformed request: log it in full
            return super().handle_error(request, status, exc, message)
        guard.num_parser_errors += 1
        guard.log.warning("parser-error", "malformed HTTP request (%d): %s", status,
                          message or exc)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already sent; cannot send the error")
        text = (message or str(exc) or "malformed HTTP request").strip()
        err = ApiError(status, f"malformed HTTP request: {text[:300]}", "invalid_request_error",
                       None, "bad_http_request")
        response = web.Response(status=status, text=dumps(err.body()),
                                content_type="application/json")
        response.force_close()
        return response


class GuardedTCPSite(web.TCPSite):
    """A TCP site whose connections are :class:`GuardedRequestHandler`."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, guard: ConnectionGuard,
                 **handler_kwargs) -> None:
        super().__init__(runner, host, port)
        self._guard = guard
        self._handler_kwargs = handler_kwargs

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        guard, kwargs = self._guard, self._handler_kwargs

        def protocol() -> GuardedRequestHandler:
            return GuardedRequestHandler(server, loop=loop, guard=guard, **kwargs)

        self._server = await loop.create_server(protocol, self._host, self._port,
                                                backlog=self._backlog)
        if self._server.sockets:
            self._bound_port = self._server.sockets[0].getsockname()[1]
