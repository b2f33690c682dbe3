"""Reading a request body: its media type, its content coding, a bounded inflation.

aiohttp would inflate a compressed body as it arrives, in full, before the handler could
check anything (a 1 MB gzip bomb costs seconds of CPU, even from a client without a
valid API key). The server turns that off (``auto_decompress=False``) and reads bodies
here instead, after authentication: the compressed bytes are bounded by the body limit
as they arrive, and inflation stops as soon as the inflated size passes the same limit.

The contract of :func:`read_json_body`: it returns the body's bytes, inflated, at most
``max_bytes`` of them, or raises an :class:`ApiError` naming the problem — 415 for a
media type other than JSON or an unknown coding, 400 for a body that is not what its
coding says, 413 for a body over the limit, 408 for one that does not arrive in time.
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import web

from engine.api.errors import ApiError, bad_request

try:  # brotli comes with locust (through geventhttpclient); "br" is refused without it.
    import brotli
except ImportError:  # pragma: no cover - present wherever schedscope's dependencies are
    brotli = None

#: Media types accepted as JSON. Refusing the others is a CSRF guard: a web page can
#: POST text/plain or form bodies to a keyless localhost server without a CORS
#: preflight, but not application/json. A body without any Content-Type is read as JSON,
#: as vLLM's server (FastAPI) does, for clients such as ``requests.post(data=...)`` —
#: unless the request carries an ``Origin`` header: browsers send one with every POST
#: (and can send a body without a Content-Type, from a Blob or ``sendBeacon``), plain
#: HTTP clients do not.
JSON_MEDIA_TYPES = ("application/json",)
#: Inflate this many bytes at a time, so the size bound is checked between pieces.
_INFLATE_PIECE = 64 * 1024
#: At most this many content codings stacked on one body ("gzip, br").
MAX_CODINGS = 2


def _codings() -> tuple[str, ...]:
    names = ["identity", "gzip", "x-gzip", "deflate"]
    if brotli is not None:
        names.append("br")
    return tuple(names)


SUPPORTED_CODINGS = _codings()


def check_media_type(request: web.Request) -> None:
    """415 unless the body is declared JSON (``application/json``, ``+json`` types too)
    or not declared at all."""
    given = request.headers.get("Content-Type")
    media = request.content_type.lower()  # aiohttp: the type without its parameters
    if given is None and "Origin" not in request.headers:
        return
    if given is not None and (media in JSON_MEDIA_TYPES or media.endswith("+json")):
        return
    shown = repr(given[:80]) if given is not None else "none (from a browser page)"
    raise ApiError(
        415,
        f"Content-Type must be application/json, got {shown}",
        "invalid_request_error",
        "Content-Type",
        "unsupported_media_type",
    )


def content_codings(request: web.Request) -> list[str]:
    """The body's codings in the order they were applied; 415 for one this server
    cannot decode."""
    header = request.headers.getall("Content-Encoding", [])
    codings = [c.strip().lower() for value in header for c in value.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    for coding in codings:
        if coding not in SUPPORTED_CODINGS:
            raise ApiError(
                415,
                f"Content-Encoding {coding[:40]!r} is not supported; this server "
                f"decodes {', '.join(SUPPORTED_CODINGS)}",
                "invalid_request_error",
                "Content-Encoding",
                "unsupported_content_encoding",
            )
    if len(codings) > MAX_CODINGS:
        raise ApiError(
            415,
            f"Content-Encoding stacks {len(codings)} codings; at most {MAX_CODINGS} are decoded",
            "invalid_request_error",
            "Content-Encoding",
            "unsupported_content_encoding",
        )
    return codings


def too_large(max_bytes: int, flag: str = "--max-body-bytes") -> ApiError:
    return ApiError(
        413,
        f"request body is larger than the server's limit of {max_bytes} bytes ({flag})",
        "invalid_request_error",
        None,
        "request_too_large",
    )


def _not_coded(coding: str, reason: str) -> ApiError:
    return bad_request(
        f"request body is not valid {coding} data ({reason}), as its Content-Encoding says",
        "Content-Encoding",
        "invalid_content_encoding",
    )


def _inflate_zlib(data: bytes, coding: str, max_bytes: int) -> bytes:
    # gzip: a gzip header; deflate: zlib-wrapped (RFC 9110), raw deflate accepted too.
    gzip_coded = coding in ("gzip", "x-gzip")
    wbits = 16 + zlib.MAX_WBITS if gzip_coded else zlib.MAX_WBITS
    if coding == "deflate" and data[:1] and (data[0] & 0x0F) != 8:
        wbits = -zlib.MAX_WBITS
    out = bytearray()
    pending = data
    while True:  # one gzip member after another (RFC 1952 allows several); deflate: one
        inflater = zlib.decompressobj(wbits)
        try:
            while True:
                out += inflater.decompress(pending, _INFLATE_PIECE)
                if len(out) > max_bytes:
                    raise too_large(max_bytes)
                if inflater.eof:  # this member ended: what follows is the next one
                    break
                pending = inflater.unconsumed_tail
                if not pending:
                    break
            if not inflater.eof:
                # Not after the end: flush() would re-read unconsumed_tail into unused_data.
                out += inflater.flush()
        except zlib.error as exc:
            raise _not_coded(coding, str(exc)) from None
        if len(out) > max_bytes:
            raise too_large(max_bytes)
        if not inflater.eof:
            raise _not_coded(coding, "the compressed stream is truncated")
        # Past a member's end zlib puts every byte that follows in unused_data (its
        # unconsumed_tail repeats them and is not read again).
        pending = inflater.unused_data
        if not pending:
            return bytes(out)
        if not (gzip_coded and pending[:2] == b"\x1f\x8b"):
            raise _not_coded(coding, "bytes follow the end of the compressed stream")


def _inflate_brotli(data: bytes, max_bytes: int) -> bytes:
    inflater = brotli.Decompressor()
    out = bytearray()
    try:
        piece = inflater.process(data, output_buffer_limit=_INFLATE_PIECE)
        out += piece
        # Output is held back at the piece limit: drain it with empty input until the
        # stream ends, the bound is passed, or nothing more comes (a truncated stream).
        while piece and len(out) <= max_bytes and not inflater.is_finished():
            piece = inflater.process(b"", output_buffer_limit=_INFLATE_PIECE)
            out += piece
    except brotli.error as exc:
        raise _not_coded("br", str(exc) or "corrupt stream") from None
    if len(out) > max_bytes:
        raise too_large(max_bytes)
    if not inflater.is_finished():
        raise _not_coded("br", "the compressed stream is truncated")
    return bytes(out)


def inflate(data: bytes, codings: list[str], max_bytes: int) -> bytes:
    """Undo ``codings`` (last applied first), never holding more than ``max_bytes``
    (plus one piece) of output."""
    for coding in reversed(codings):
        if coding == "br":
            data = _inflate_brotli(data, max_bytes)
        else:
            data = _inflate_zlib(data, coding, max_bytes)
    return data


async def read_json_body(
    request: web.Request, max_bytes: int, timeout_s: float, flag: str = "--max-body-bytes"
) -> bytes:
    """The body of a JSON request, inflated and bounded by ``max_bytes`` (see the
    module docstring); ``flag`` is the setting a 413 names."""
    check_media_type(request)
    codings = content_codings(request)
    declared = request.content_length
    if declared is not None and declared > max_bytes:  # refused before a byte is read
        raise too_large(max_bytes, flag)
    try:
        async with asyncio.timeout(timeout_s):
            # aiohttp bounds this by client_max_size, the largest limit of any route.
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(max_bytes, flag) from None
    except TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {timeout_s:g} s",
            "invalid_request_error",
            None,
            "request_timeout",
            {"Connection": "close"},
        ) from None
    if len(raw) > max_bytes:  # a chunked body declares no length
        raise too_large(max_bytes, flag)
    if not codings:
        return raw
    try:
        return inflate(raw, codings, max_bytes)
    except ApiError as err:
        if err.status == 413:
            raise too_large(max_bytes, flag) from None
        raise
