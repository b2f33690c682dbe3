"""Connections: a header deadline, a cap on open connections, JSON for parser errors.

aiohttp's server has no header read timeout: a client trickling one header byte every
half second holds its connection (and a file descriptor) for ever, and a few hundred
such clients exhaust the process's descriptors, after which legitimate requests time
out. :class:`GuardedRequestHandler` (aiohttp's protocol, one per connection) adds:

- a header deadline: from a connection's opening, and again from the end of each
  response, the next request must be dispatched (its header block complete) within
  ``header_timeout_s``. A connection that sent part of a request by then gets a 408
  and is closed; one that sent nothing is an idle keep-alive connection and is closed
  quietly. (So ``header_timeout_s`` is also the keep-alive timeout.) The deadline is
  disarmed only when a request reaches the application — never by bytes that merely
  look like the end of a header block. Bodies have their own deadline
  (``body_timeout_s``, in :mod:`engine.api.body`).
- a cap on open connections: at ``max_connections``, a new connection first evicts the
  connection that has been idle longest (between requests, nothing sent since its last
  response), so idle keep-alive connections can never lock clients out; when none is
  idle, the new connection gets a 503 with ``Retry-After`` and is closed before any byte
  of it is parsed.
- a cap per client: one client (a peer address, :func:`client_address`) holds at most
  ``max_connections_per_client``; at its cap its new connection first evicts that
  client's own longest-idle connection, else gets a 429 with ``Retry-After`` and is
  closed, so sockets of one client that trickle their requests cannot take the
  connections every other client needs. A connection whose peer address is its own
  local address comes from this machine (a load generator beside the server, on
  loopback or not) and is not counted against any client: on one machine every client
  has the same address, and a local benchmark opens as many connections as it likes.
- errors of aiohttp's HTTP parser (a bad request line, a header too long, too many
  headers, a bad chunk size) as OpenAI-style JSON bodies instead of text/plain, and
  logged at a bounded rate.

:func:`check_framing` (called by the error middleware, before anything else looks at a
request) refuses what aiohttp's parser lets through but this server does not speak
(RFC 9112): a request line naming a version other than HTTP/1.0 or HTTP/1.1 (the
parser takes ``HTTP/0.9`` and ``HTTP/2.0``) is a 505, answered in HTTP/1.1; a
``Transfer-Encoding`` other than ``chunked`` alone (the parser reads ``gzip, chunked``
as plain chunked and would hand the handler gzip bytes as the body) is a 501; any
``Transfer-Encoding`` in an HTTP/1.0 request (HTTP/1.0 has no transfer codings; the
parser framed it as chunked all the same) is a 400. All three close the connection.

:class:`GuardedTCPSite` is aiohttp's ``TCPSite`` whose connections use this handler.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import time
from dataclasses import dataclass

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion10, HttpVersion11
from aiohttp.web_protocol import RequestHandler

from engine.api.errors import ApiError
from engine.api.json_codec import dumps

log = logging.getLogger("schedscope.server")

#: The end of an HTTP header block.
_HEADER_END = b"\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0  # also the keep-alive timeout (see the module docstring)
    max_connections: int = 1024
    retry_after_s: int = 1
    max_connections_per_client: int | None = None  # None: half of max_connections

    @property
    def per_client_cap(self) -> int:
        """The connections one client may hold: by default half the server's cap (so
        another client always finds the other half), never more than the cap."""
        if self.max_connections_per_client is None:
            return max(1, self.max_connections // 2)
        return min(self.max_connections_per_client, self.max_connections)


def client_address(sockaddr: object) -> str | None:
    """Who a peer is, for the per-client limits: its IP address, an IPv6 address by
    its /64 (one host is given a whole /64 to pick source addresses from), an
    IPv4-mapped IPv6 address as the IPv4 one; None for a socket without an IP."""
    ip = _ip_of(sockaddr)
    if ip is None:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _ip_of(sockaddr: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not isinstance(sockaddr, tuple) or not sockaddr or not isinstance(sockaddr[0], str):
        return None
    try:
        return ipaddress.ip_address(sockaddr[0].partition("%")[0])  # no IPv6 zone
    except ValueError:
        return None


def client_of(request: web.BaseRequest) -> str | None:
    """The client address (:func:`client_address`) of a request's connection; None
    once the connection is gone."""
    transport = request.transport
    return client_address(transport.get_extra_info("peername")) if transport else None


def limited_client(transport: asyncio.BaseTransport) -> str | None:
    """The client a connection counts against, or None when it is not limited: its
    peer address is its own local address (this machine), or it has no IP."""
    peer = transport.get_extra_info("peername")
    local = _ip_of(transport.get_extra_info("sockname"))
    if local is not None and _ip_of(peer) == local:
        return None
    return client_address(peer)


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


def raw_json_response(
    status: int, reason: str, err: ApiError, retry_after_s: int | None = None
) -> bytes:
    """A complete HTTP/1.1 response that closes the connection, for connections no
    aiohttp request exists for (refused, or timed out before their headers)."""
    body = dumps(err.body()).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if retry_after_s is not None:
        head.append(f"Retry-After: {retry_after_s}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


#: The versions a text request line may name: HTTP/2 and HTTP/3 are not text protocols,
#: and HTTP/0.9 has no headers.
SUPPORTED_VERSIONS = (HttpVersion10, HttpVersion11)


def check_framing(request: web.BaseRequest) -> None:
    """400 for an HTTP/1.0 request with a Transfer-Encoding; 505 for an HTTP version
    other than 1.0 and 1.1; 501 for a transfer coding other than ``chunked`` (RFC 9112
    section 6.1: a transfer coding the server does not understand is a 501, never
    ignored). aiohttp has already framed the body as chunked when ``chunked`` came
    last; the handler never sees it, and the connection closes."""
    version = request.version
    values = request.headers.getall(hdrs.TRANSFER_ENCODING, [])
    if values and version == HttpVersion10:
        # RFC 9112 section 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty
        # framing (HTTP/1.0 has no transfer codings), even with a Content-Length.
        raise ApiError(
            400,
            "Transfer-Encoding is not part of HTTP/1.0, so a chunked body cannot be framed; "
            "send Content-Length, or use HTTP/1.1",
            "invalid_request_error",
            "Transfer-Encoding",
            "unsupported_transfer_encoding",
            {"Connection": "close"},
        )
    if version not in SUPPORTED_VERSIONS:
        # aiohttp writes the status line in the request's version: make it HTTP/1.1, the
        # version of the bytes on the wire ("HTTP/2.0 505" would claim another protocol).
        # The property is cached (aiohttp's reify), so both go.
        request._version = HttpVersion11
        request._cache.pop("version", None)
        raise ApiError(
            505,
            f"HTTP/{version.major}.{version.minor} is not supported; this server speaks "
            "HTTP/1.1 and HTTP/1.0 (over a text request line)",
            "invalid_request_error",
            None,
            "http_version_not_supported",
        )
    if values and [c.strip().lower() for v in values for c in v.split(",")] != ["chunked"]:
        shown = ", ".join(values)
        raise ApiError(
            501,
            f"Transfer-Encoding {shown[:80]!r} is not implemented; this server decodes only "
            "'chunked' (send a compressed body with Content-Encoding instead)",
            "invalid_request_error",
            "Transfer-Encoding",
            "unsupported_transfer_encoding",
        )


class ConnectionGuard:
    """State shared by the connections of one server: the open count and the log."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.num_open = 0
        self.num_refused = 0  # both kinds: at the server's cap, at a client's
        self.num_refused_per_client = 0  # at a client's cap
        self.num_evicted = 0
        self.num_header_timeouts = 0
        self.num_parser_errors = 0
        self.log = RateLimitedLog(log)
        #: Connections between requests with nothing received since, oldest first.
        self.idle: dict[GuardedRequestHandler, None] = {}
        #: Open connections of each limited client (see limited_client).
        self.open_by_client: dict[str, int] = {}

    def evict_idle(self, client: str | None = None) -> bool:
        """Close the connection idle longest (of ``client``, when given); False when
        none is idle."""
        for handler in [h for h in self.idle if client is None or h.client == client]:
            del self.idle[handler]
            if handler.close_idle():
                self.num_evicted += 1
                return True
        return False

    def loop_exception_handler(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """asyncio's handler, rate-limited for accept() failures only (running out of
        descriptors reports once per retry, from every listener, for as long as it
        lasts); every other error goes to asyncio's default handler, traceback and all."""
        message = context.get("message", "")
        exc = context.get("exception")
        if "accept" in message or (
            isinstance(exc, OSError)
            and exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
        ):
            self.log.warning(f"loop:{message}", "%s%s", message, f": {exc!r}" if exc else "")
            return
        loop.default_exception_handler(context)


class GuardedRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol with the deadlines and the cap above."""

    def __init__(self, manager: web.Server, *, guard: ConnectionGuard, **kwargs) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._refused = False
        self._deadline: asyncio.TimerHandle | None = None
        self._bytes_since_armed = 0
        #: The client this connection counts against (None: not limited).
        self.client: str | None = None

    # -- the connection's life --------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        limits = guard.limits
        client = limited_client(transport)
        if client is not None:
            held = guard.open_by_client.get(client, 0)
            if held >= limits.per_client_cap and not guard.evict_idle(client):
                guard.num_refused_per_client += 1
                guard.log.warning(
                    "refused-client",
                    "refused a connection from %s: it has %d open and busy, the limit per "
                    "client is %d (--max-connections-per-client)",
                    client,
                    held,
                    limits.per_client_cap,
                )
                err = ApiError(
                    429,
                    f"this client has {held} open connections, the server's limit per "
                    "client; reuse one or retry later",
                    "rate_limit_error",
                    None,
                    "too_many_client_connections",
                )
                self._refuse(transport, 429, "Too Many Requests", err)
                return
        if guard.num_open >= limits.max_connections and not guard.evict_idle():
            guard.log.warning(
                "refused",
                "refused a connection: %d are open and busy, the limit is %d (--max-connections)",
                guard.num_open,
                limits.max_connections,
            )
            err = ApiError(
                503,
                f"the server has {guard.num_open} open connections, its limit; retry later",
                "server_error",
                None,
                "too_many_connections",
            )
            self._refuse(transport, 503, "Service Unavailable", err)
            return
        guard.num_open += 1
        if client is not None:
            self.client = client
            guard.open_by_client[client] = guard.open_by_client.get(client, 0) + 1
        super().connection_made(transport)
        self._arm()

    def _refuse(
        self, transport: asyncio.BaseTransport, status: int, reason: str, err: ApiError
    ) -> None:
        """Answer ``err`` and close, before any byte of the connection is parsed."""
        self._refused = True
        self._guard.num_refused += 1
        # A stream server's transports are asyncio.Transports (aiohttp casts to one);
        # BaseTransport, the protocol's declared type, has no write.
        if isinstance(transport, asyncio.Transport):
            transport.write(
                raw_json_response(status, reason, err, self._guard.limits.retry_after_s)
            )
        transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return  # never registered with aiohttp's server
        self._disarm()
        guard = self._guard
        guard.num_open -= 1
        if self.client is not None:
            left = guard.open_by_client[self.client] - 1
            if left:
                guard.open_by_client[self.client] = left
            else:
                del guard.open_by_client[self.client]
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._deadline is not None:
            if not self._bytes_since_armed:
                self._guard.idle.pop(self, None)  # a request is starting: no longer idle
            self._bytes_since_armed += len(data)
        super().data_received(data)
        if self._deadline is not None and self._messages:
            # A whole header block is parsed and queued: the deadline is met now, not
            # when the handler task first runs. (The loop reads sockets before it runs
            # due timers, so a request completing in the deadline's own iteration would
            # otherwise be answered 408.)
            self._disarm()

    def request_started(self) -> None:
        """A request reached the application: its header block is complete."""
        self._disarm()

    async def finish_response(self, request, resp, start_time):
        """aiohttp's last step of a request (prepare and write the response): once the
        response is out, the next request must come within the header deadline —
        unless it already came (a pipelined request parsed and queued behind this
        one: it is dispatched next, which disarms nothing it needs)."""
        result = await super().finish_response(request, resp, start_time)
        if (
            self.transport is not None
            and not self._force_close
            and resp.keep_alive
            and not self._messages
        ):
            self._arm()
        return result

    def close_idle(self) -> bool:
        """Close this connection if it is still idle (for an eviction)."""
        if self._deadline is None or self._bytes_since_armed or self.transport is None:
            return False
        self._disarm()
        transport = self.transport
        self.force_close()
        transport.close()
        return True

    # -- the header deadline ---------------------------------------------------------
    def _arm(self) -> None:
        if self.transport is None:  # the connection is already gone
            return
        self._disarm()
        self._bytes_since_armed = 0
        self._deadline = self._loop.call_later(
            self._guard.limits.header_timeout_s, self._deadline_passed
        )
        self._guard.idle[self] = None

    def _disarm(self) -> None:
        self._guard.idle.pop(self, None)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        self._guard.idle.pop(self, None)
        transport = self.transport
        if transport is None:
            return
        if self._bytes_since_armed:  # part of a request: say why the connection ends
            guard = self._guard
            guard.num_header_timeouts += 1
            guard.log.warning(
                "header-timeout",
                "closed a connection whose request headers did "
                "not arrive within %.1f s (--header-timeout)",
                guard.limits.header_timeout_s,
            )
            err = ApiError(
                408,
                f"the request headers did not arrive within {guard.limits.header_timeout_s:g} s",
                "invalid_request_error",
                None,
                "request_timeout",
            )
            transport.write(raw_json_response(408, "Request Timeout", err))
        self.force_close()  # idle keep-alive connections end quietly
        transport.close()

    # -- parser errors as JSON --------------------------------------------------------
    def handle_error(
        self,
        request,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        guard = self._guard
        if status >= 500:  # a fault of ours, not a malformed request: log it in full
            return super().handle_error(request, status, exc, message)
        guard.num_parser_errors += 1
        guard.log.warning("parser-error", "malformed HTTP request (%d): %s", status, message or exc)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already sent; cannot send the error")
        text = (message or str(exc) or "malformed HTTP request").strip()
        err = ApiError(
            status,
            f"malformed HTTP request: {text[:300]}",
            "invalid_request_error",
            None,
            "bad_http_request",
        )
        response = web.Response(
            status=status, text=dumps(err.body()), content_type="application/json"
        )
        response.force_close()
        return response


class GuardedTCPSite(web.TCPSite):
    """A TCP site whose connections are :class:`GuardedRequestHandler`."""

    def __init__(
        self, runner: web.AppRunner, host: str, port: int, guard: ConnectionGuard, **handler_kwargs
    ) -> None:
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

        self._server = await loop.create_server(
            protocol, self._host, self._port, backlog=self._backlog
        )
        if self._server.sockets:
            self._bound_port = self._server.sockets[0].getsockname()[1]
