"""The OpenAI-compatible HTTP server (aiohttp) in front of an :class:`AsyncEngine`.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``POST /tokenize``, ``POST /detokenize`` (engine/api/tokenize_routes.py), ``GET /health``,
``GET|POST /ping``, ``GET /load``, ``GET /version``, ``GET /metrics`` (Prometheus, from
the engine's registry: docs/metrics.md; off with ``ServerSettings(metrics=False)``); more
via ``create_app(extra_routes=)``.

A request's id (``X-Request-Id`` or generated) is the engine's request id, the body's
``id`` and the response's ``X-Request-Id`` header, so client and engine records join.
A client that goes away aborts its request: the runner cancels the handler of a closed
connection (``handler_cancellation=True``), and leaving the ``generate()`` iteration
early aborts the request in the engine; a failed write to a closed stream does the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import re
import signal
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aiohttp import web

from engine.api.body import HeavyWork, read_json_body, too_large
from engine.api.connections import ConnectionGuard, ConnectionLimits, GuardedTCPSite
from engine.api.protocol import (
    ApiError,
    ChoiceResult,
    ChunkWriter,
    GenerateRequest,
    IncrementalDetokenizer,
    ServingContext,
    bad_request,
    chat_response,
    completion_response,
    dumps,
    parse_generate_request,
    parse_json_object,
)
from engine.api.tokenize_routes import add_tokenize_routes
from engine.core import decisions as d
from engine.core.request import EngineRequest, parse_traceparent
from engine.serving.async_engine import AsyncEngine, EngineDeadError, RequestOutput, RequestRejected

log = logging.getLogger("schedscope.server")

REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_CLASS_HEADER = "X-Request-Class"
TRACEPARENT_HEADER = "traceparent"
_REQUEST_ID = re.compile(r"[\x20-\x7e]{1,128}")
#: A request class is a label in reports and metrics: short, no spaces or quotes.
_REQUEST_CLASS = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")
#: Bodies larger than this are validated (and their prompt tokenized) on a worker thread.
OFFLOAD_PARSE_BYTES = 64 * 1024
#: Guarded (API key, draining) besides /v1/*: tokenizing costs the server CPU.
GUARDED_PATHS = ("/tokenize", "/detokenize")


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str = "tiny"
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port
    api_key: str | None = None  # "Authorization: Bearer KEY" on /v1/* and GUARDED_PATHS
    max_body_bytes: int = 1 << 20  # compressed or inflated: a larger body is a 413
    shutdown_timeout_s: float = 10.0  # in-flight requests may finish for this long
    retry_after_s: int = 1  # the Retry-After of a 429
    header_timeout_s: float = 10.0  # a request's headers must arrive within this
    body_timeout_s: float = 30.0  # and its body within this, once its headers are in
    max_connections: int = 1024  # open connections; more are refused with a 503
    metrics: bool = True  # GET /metrics (open without the API key, like /health)
    metrics_timeout_s: float = 5.0  # how long /metrics waits for the engine process


@dataclass
class ServerState:
    engine: AsyncEngine
    tokenizer: object
    settings: ServerSettings
    context: ServingContext
    connections: ConnectionGuard
    draining: bool = False
    in_flight: set[str] = field(default_factory=set)  # request ids being served
    num_failed_requests: int = 0  # ended with an engine error
    created: int = field(default_factory=lambda: int(time.time()))  # /v1/models' created
    heavy_work: HeavyWork = field(default_factory=HeavyWork)  # large bodies, one at a time


STATE = web.AppKey("schedscope_state", ServerState)


def create_app(
    async_engine: AsyncEngine,
    tokenizer,
    settings: ServerSettings,
    extra_routes: Iterable[web.AbstractRouteDef] = (),
) -> web.Application:
    """The aiohttp application. The engine is started on app startup (if it is not
    already) and shut down on cleanup. ``extra_routes`` (e.g. ``web.get("/metrics",
    handler)``) are added as they are; ``app[STATE]`` gives them the engine."""
    config = async_engine.config
    context = ServingContext(
        (settings.served_model_name,), config.scheduler.max_model_len, tokenizer
    )
    app = web.Application(
        client_max_size=settings.max_body_bytes, middlewares=[_error_middleware, _guard_middleware]
    )
    limits = ConnectionLimits(
        settings.header_timeout_s, connection_cap(settings.max_connections), settings.retry_after_s
    )
    app[STATE] = ServerState(async_engine, tokenizer, settings, context, ConnectionGuard(limits))
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    add_tokenize_routes(
        app,
        context,
        OFFLOAD_PARSE_BYTES,
        settings.max_body_bytes,
        settings.body_timeout_s,
        app[STATE].heavy_work,
    )
    app.router.add_get("/health", health)
    app.router.add_get("/ping", ping)
    app.router.add_post("/ping", ping)
    app.router.add_get("/load", load)
    app.router.add_get("/version", version)
    if settings.metrics:
        app.router.add_get("/metrics", metrics)
    app.router.add_routes(list(extra_routes))
    app.on_startup.append(_start_engine)
    app.on_cleanup.append(_stop_engine)
    return app


#: File descriptors kept free of connections: the engine's pipes, record files, logs.
RESERVED_FDS = 64


def connection_cap(max_connections: int) -> int:
    """``max_connections``, lowered to what the process's descriptor limit allows (a
    server that runs out of descriptors cannot even refuse connections cleanly)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return max_connections
    if soft == resource.RLIM_INFINITY or soft - RESERVED_FDS >= max_connections:
        return max_connections
    cap = max(1, soft - RESERVED_FDS)
    log.warning(
        "--max-connections %d lowered to %d: the open-file limit is %d (ulimit -n)",
        max_connections,
        cap,
        soft,
    )
    return cap


async def _start_engine(app: web.Application) -> None:
    engine = app[STATE].engine
    if engine.state == "created":
        engine.start()
    _warn_if_pool_is_small(app[STATE])


def _warn_if_pool_is_small(state: ServerState) -> None:
    """A pool that cannot hold one request at the default max_tokens (the rest of the
    context) refuses every request that does not set max_tokens: say so at start-up."""
    config = state.engine.config
    pool_tokens = state.engine.stats.num_device_blocks * config.cache.block_size
    if 0 < pool_tokens < config.scheduler.max_model_len:
        log.warning(
            "the KV pool holds %d tokens, fewer than max_model_len %d: a request without "
            "max_tokens (which defaults to the rest of the context) is refused unless its "
            "prompt + max_tokens fits the pool; lower --max-model-len to %d or give the cache "
            "more memory",
            pool_tokens,
            config.scheduler.max_model_len,
            pool_tokens,
        )


async def _stop_engine(app: web.Application) -> None:
    state = app[STATE]
    state.draining = True
    await state.engine.shutdown(state.settings.shutdown_timeout_s)


# -- middlewares --------------------------------------------------------------------------
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


#: After these the connection is closed: what is left of the body is not worth reading.
_CLOSING_STATUSES = frozenset({408, 413, 415})


@web.middleware
async def _error_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Every error leaves as an OpenAI error body; nothing unexpected leaves as a bare 500.

    An error raised after a response has started (a stream's headers are out) cannot
    become a second response: it is re-raised, and aiohttp closes the connection."""
    started = getattr(request.protocol, "request_started", None)
    if started is not None:  # a guarded connection: this request's headers are complete
        started()
    try:
        response = await handler(request)
    except ApiError as err:
        if request.writer.output_size:
            raise
        response = error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400 or request.writer.output_size:
            raise
        response = error_response(_from_http_exception(request, exc))
    except Exception:
        if request.writer.output_size:
            raise
        log.exception("unhandled error serving %s %s", request.method, request.path)
        response = error_response(ApiError(500, "internal server error", "server_error"))
    if response.status in _CLOSING_STATUSES or not request.content.is_eof():
        # A body left unread is not drained: the connection ends with the response.
        response.force_close()
    return response


@web.middleware
async def _guard_middleware(request: web.Request, handler) -> web.StreamResponse:
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
            raise _unavailable("the server is shutting down")
    return await handler(request)


def _unavailable(message: str) -> ApiError:
    return ApiError(503, message, "server_error", None, "service_unavailable")


# -- generation ------------------------------------------------------------------------------
async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


def _request_id(request: web.Request, kind: str) -> str:
    given = request.headers.get(REQUEST_ID_HEADER)
    if given is None:
        return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    if not _REQUEST_ID.fullmatch(given):
        raise bad_request(
            f"{REQUEST_ID_HEADER} must be 1 to 128 printable ASCII characters", REQUEST_ID_HEADER
        )
    return given


def _request_class(request: web.Request) -> str:
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


def _parse_body(raw: bytes, kind: str, context: ServingContext) -> GenerateRequest:
    return parse_generate_request(parse_json_object(raw), kind, context)


def _engine_request_ids(request_id: str, req: GenerateRequest) -> list[str]:
    """One engine request per choice: the request's own id, or ``<id>-<index>`` for
    each prompt of a batch (vLLM's convention), so records still join by prefix."""
    if not req.is_batch:
        return [request_id]
    return [f"{request_id}-{i}" for i in range(len(req.choices))]


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    state = request.app[STATE]
    settings = state.settings
    request_id = _request_id(request, kind)
    try:
        request_class = _request_class(request)
        raw = await read_json_body(request, settings.max_body_bytes, settings.body_timeout_s)
        if len(raw) > OFFLOAD_PARSE_BYTES:  # parsing and tokenizing must not stall the loop
            req = await state.heavy_work.run(_parse_body, raw, kind, state.context)
        else:
            req = _parse_body(raw, kind, state.context)
        # Arrival at the engine is now, when the request is understood — not when the
        # step loop next looks at its commands: the wait for a running step is queueing.
        arrival_time = state.engine.now()
        engine_ids = _engine_request_ids(request_id, req)
        for engine_id in engine_ids:
            if engine_id in state.in_flight:
                raise ApiError(
                    409,
                    f"request id {engine_id!r} is already in flight",
                    "invalid_request_error",
                    REQUEST_ID_HEADER,
                    "duplicate_request_id",
                )
    except ApiError as err:
        err.headers[REQUEST_ID_HEADER] = request_id
        raise
    state.in_flight.update(engine_ids)
    traceparent = parse_traceparent(request.headers.get(TRACEPARENT_HEADER))
    streams = [
        state.engine.generate(
            EngineRequest(
                engine_id,
                choice.prompt_token_ids,
                choice.params,
                arrival_time,
                req.priority,
                request_class,
                traceparent,
            )
        )
        for engine_id, choice in zip(engine_ids, req.choices, strict=True)
    ]
    try:
        # Closing an iterator (return, error, or this task cancelled by a disconnect)
        # aborts its request in the engine unless it already finished.
        async with contextlib.AsyncExitStack() as stack:
            for outputs in streams:
                await stack.enter_async_context(contextlib.aclosing(outputs))
            firsts = await _first_outputs(state, req, streams)
            if req.is_batch:
                if req.stream:
                    return await _stream_batch(request, state, request_id, req, firsts, streams)
                return await _complete_batch(state, request_id, req, firsts, streams)
            if req.stream:
                return await _stream(request, state, request_id, req, firsts[0], streams[0])
            return await _complete(state, request_id, req, firsts[0], streams[0])
    except ApiError as err:
        err.headers[REQUEST_ID_HEADER] = request_id
        raise
    finally:
        state.in_flight.difference_update(engine_ids)


async def _first_output(state: ServerState, req: GenerateRequest, outputs) -> RequestOutput:
    """A choice's first output, or the error status for a request that never started:
    a real HTTP status is only possible before the first byte of the response."""
    try:
        first = await anext(outputs)
    except RequestRejected as exc:
        raise _rejected(state, exc, req) from None
    except EngineDeadError:
        raise _unavailable("the engine is not accepting requests (shutting down)") from None
    except ValueError as exc:  # the engine still holds a request with this id
        raise ApiError(
            409, str(exc), "invalid_request_error", REQUEST_ID_HEADER, "duplicate_request_id"
        ) from None
    if first.finished and first.finish_reason not in ("stop", "length"):
        raise _end_error(state, first)  # failed before any token: a real status
    return first


async def _first_outputs(
    state: ServerState, req: GenerateRequest, streams: list
) -> list[RequestOutput]:
    if len(streams) == 1:
        return [await _first_output(state, req, streams[0])]
    # Every prompt of a batch is submitted at once; the first refusal decides the status
    # at once: the other prompts' waits are cancelled (and their requests aborted when
    # their iterators close), rather than holding engine slots until they start.
    tasks = [asyncio.ensure_future(_first_output(state, req, s)) for s in streams]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                raise task.exception()
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _rejected(state: ServerState, exc: RequestRejected, req: GenerateRequest) -> ApiError:
    total = max(len(c.prompt_token_ids) + c.params.max_tokens for c in req.choices)
    if exc.reason == d.REASON_QUEUE_FULL:
        return ApiError(
            429,
            "the server is overloaded: its waiting queue is full; retry later",
            "rate_limit_error",
            None,
            "queue_full",
            {"Retry-After": str(state.settings.retry_after_s)},
        )
    if exc.reason == d.REASON_EXCEEDS_KV_POOL:
        config = state.engine.config
        block_size = config.cache.block_size
        blocks = math.ceil(total / block_size)
        num_blocks = state.engine.stats.num_device_blocks
        if not req.max_tokens_given:
            # The client never sent max_tokens: "lower max_tokens" would not make sense.
            return bad_request(
                f"max_tokens was not set, so it defaults to the rest of the context "
                f"({req.params.max_tokens} tokens), and prompt + that = {total} tokens need "
                f"{blocks} blocks; the server's whole KV pool has {num_blocks} "
                f"({num_blocks * block_size} tokens). Set max_tokens to at most "
                f"{max(1, num_blocks * block_size - len(req.prompt_token_ids))}.",
                "max_tokens",
                d.REASON_EXCEEDS_KV_POOL,
            )
        return bad_request(
            f"the request can never fit the KV cache: prompt + max_tokens = {total} tokens need "
            f"{blocks} blocks, the whole device pool has {num_blocks}; "
            "lower max_tokens or shorten the prompt",
            "max_tokens",
            d.REASON_EXCEEDS_KV_POOL,
        )
    if exc.reason == d.REASON_EXCEEDS_MAX_MODEL_LEN:
        return bad_request(
            f"prompt + max_tokens = {total} tokens exceeds the maximum context length "
            f"{state.context.max_model_len}",
            "max_tokens",
            "context_length_exceeded",
        )
    return _unavailable(f"the engine refused the request ({exc.reason})")


def _end_error(state: ServerState, out: RequestOutput) -> ApiError:
    """The error for a request that ended without stop/length."""
    if out.finish_reason == "error":
        state.num_failed_requests += 1
        return ApiError(
            500,
            f"the engine failed while running this request: {out.error}",
            "server_error",
            None,
            "engine_error",
        )
    if state.draining or not state.engine.is_accepting:
        return _unavailable("the request was aborted: the server is shutting down")
    return _unavailable(f"the request ended early ({out.finish_reason})")


def _text_ids(req: GenerateRequest, token_ids: list[int], num_generated: int) -> list[int]:
    """The generated tokens whose text is returned: a final stop-string token is not
    (OpenAI leaves stop sequences out of the text)."""
    if (
        token_ids
        and token_ids[-1] in req.stop_string_token_ids
        and num_generated >= req.params.min_tokens
    ):
        return token_ids[:-1]
    return token_ids


async def _collect(
    state: ServerState, req: GenerateRequest, index: int, first: RequestOutput, outputs
) -> ChoiceResult:
    token_ids: list[int] = list(first.new_token_ids)
    last = first
    async for out in outputs:  # ends right away when ``first`` was the last output
        token_ids.extend(out.new_token_ids)
        last = out
    if last.finish_reason not in ("stop", "length"):
        raise _end_error(state, last)
    text = state.tokenizer.decode(_text_ids(req, token_ids, len(token_ids)))
    return ChoiceResult(
        text, last.finish_reason, len(req.choices[index].prompt_token_ids), len(token_ids)
    )


def _json_response(
    request_id: str, req: GenerateRequest, results: list[ChoiceResult]
) -> web.Response:
    build = chat_response if req.kind == "chat" else completion_response
    return web.Response(
        text=dumps(build(request_id, req.model, results)),
        content_type="application/json",
        headers={REQUEST_ID_HEADER: request_id},
    )


async def _complete(
    state: ServerState, request_id: str, req: GenerateRequest, first: RequestOutput, outputs
) -> web.Response:
    return _json_response(request_id, req, [await _collect(state, req, 0, first, outputs)])


async def _complete_batch(
    state: ServerState,
    request_id: str,
    req: GenerateRequest,
    firsts: list[RequestOutput],
    streams: list,
) -> web.Response:
    # A failed prompt fails the response (there is no per-choice error in OpenAI's
    # format); the TaskGroup cancels the others, which aborts them.
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(_collect(state, req, i, first, outputs))
                for i, (first, outputs) in enumerate(zip(firsts, streams, strict=True))
            ]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return _json_response(request_id, req, [t.result() for t in tasks])


class _ChoiceText:
    """One choice of a stream: its detokenizer and its count of generated tokens."""

    __slots__ = ("req", "index", "num_prompt", "num_generated", "detokenizer")

    def __init__(self, state: ServerState, req: GenerateRequest, index: int) -> None:
        self.req = req
        self.index = index
        self.num_prompt = len(req.choices[index].prompt_token_ids)
        self.num_generated = 0
        self.detokenizer = IncrementalDetokenizer(state.tokenizer)

    def delta(self, new_token_ids: list[int]) -> str:
        self.num_generated += len(new_token_ids)
        return self.detokenizer.add(_text_ids(self.req, new_token_ids, self.num_generated))

    @property
    def counts(self) -> tuple[int, int]:
        return self.num_prompt, self.num_generated


def _stream_response(request_id: str) -> web.StreamResponse:
    return web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            REQUEST_ID_HEADER: request_id,
        }
    )


def _end_chunks(
    state: ServerState, chunks: ChunkWriter, choice: _ChoiceText, out: RequestOutput
) -> bytes:
    if out.finish_reason in ("stop", "length"):
        return chunks.finish(out.finish_reason, choice.index, choice.counts)
    return ChunkWriter.error(_end_error(state, out))


async def _stream(
    request: web.Request,
    state: ServerState,
    request_id: str,
    req: GenerateRequest,
    first: RequestOutput,
    outputs,
) -> web.StreamResponse:
    response = _stream_response(request_id)
    await response.prepare(request)
    chunks = ChunkWriter(request_id, req.model, req.kind, req.include_usage, req.continuous_usage)
    choice = _ChoiceText(state, req, 0)
    try:
        if req.kind == "chat":
            await response.write(chunks.role(0, choice.counts))
        out = first
        while True:
            if out.new_token_ids:
                delta = choice.delta(out.new_token_ids)
                if delta:
                    await response.write(chunks.text(delta, 0, choice.counts))
            if out.finished:
                await anext(outputs, None)  # let the iterator end (no abort on close)
                break
            out = await anext(outputs)
        await response.write(_end_chunks(state, chunks, choice, out))
        if req.include_usage and out.finish_reason in ("stop", "length"):
            await response.write(chunks.usage(*choice.counts))
        await response.write(ChunkWriter.DONE)
        await response.write_eof()
    except ConnectionError:
        # The client went away mid-stream: leaving returns through aclosing(), which
        # aborts the request.
        pass
    return response


async def _stream_batch(
    request: web.Request,
    state: ServerState,
    request_id: str,
    req: GenerateRequest,
    firsts: list[RequestOutput],
    streams: list,
) -> web.StreamResponse:
    """The prompts of a batch, interleaved by ``index`` in the order their tokens come."""
    response = _stream_response(request_id)
    await response.prepare(request)
    chunks = ChunkWriter(request_id, req.model, req.kind, req.include_usage, req.continuous_usage)
    choices = [_ChoiceText(state, req, i) for i in range(len(streams))]
    merged: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()

    async def pump(index: int) -> None:
        merged.put_nowait((index, firsts[index]))
        if not firsts[index].finished:
            async for out in streams[index]:
                merged.put_nowait((index, out))

    pumps = [asyncio.create_task(pump(i)) for i in range(len(streams))]
    all_ok = True
    try:
        num_open = len(streams)
        while num_open:
            index, out = await merged.get()
            choice = choices[index]
            if out.new_token_ids:
                delta = choice.delta(out.new_token_ids)
                if delta:
                    await response.write(chunks.text(delta, index, choice.counts))
            if out.finished:
                num_open -= 1
                all_ok = all_ok and out.finish_reason in ("stop", "length")
                await response.write(_end_chunks(state, chunks, choice, out))
        if req.include_usage and all_ok:
            await response.write(
                chunks.usage(
                    sum(c.num_prompt for c in choices), sum(c.num_generated for c in choices)
                )
            )
        await response.write(ChunkWriter.DONE)
        await response.write_eof()
    except ConnectionError:
        pass  # the client went away: the pumps are cancelled below, which aborts the rest
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
    return response


# -- info routes -------------------------------------------------------------------------------
async def models(request: web.Request) -> web.Response:
    """vLLM's model card: ``created`` is the server's start; ``root`` the model loaded."""
    state = request.app[STATE]
    name = state.settings.served_model_name
    body = {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": state.created,
                "owned_by": "schedscope",
                "root": state.engine.config.model,
                "parent": None,
                "max_model_len": state.context.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": state.created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        ],
    }
    return web.Response(text=dumps(body), content_type="application/json")


def health_body(state: ServerState) -> dict:
    engine = state.engine
    stats = engine.stats
    return {
        "status": "ok" if _healthy(state) else "unavailable",
        "state": "draining" if state.draining and engine.state == "running" else engine.state,
        "num_running": stats.num_running,
        "num_waiting": stats.num_waiting,
        "num_swapped": stats.num_swapped,
        "num_unfinished": stats.num_running + stats.num_waiting + stats.num_swapped,
        "num_in_flight": engine.num_in_flight,
        "num_free_device_blocks": stats.num_free_device_blocks,
        "num_device_blocks": stats.num_device_blocks,
        "num_free_host_blocks": stats.num_free_host_blocks,
        "num_host_blocks": stats.num_host_blocks,
        "num_steps": stats.num_steps,
        "clock_epoch_unix": stats.clock_epoch_unix,
        "engine_time_s": engine.now(),
        "num_observer_errors": stats.num_observer_errors,
        "num_failed_requests": state.num_failed_requests,
        "num_open_connections": state.connections.num_open,
        "num_refused_connections": state.connections.num_refused,
        "num_evicted_connections": state.connections.num_evicted,
        "num_header_timeouts": state.connections.num_header_timeouts,
        "num_engine_errors": len(stats.errors),
        "last_engine_error": stats.errors[-1] if stats.errors else None,
    }


def _healthy(state: ServerState) -> bool:
    return state.engine.state == "running" and not state.draining


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.Response(
        status=200 if _healthy(state) else 503,
        text=dumps(health_body(state)),
        content_type="application/json",
    )


async def ping(request: web.Request) -> web.Response:
    """vLLM's (and SageMaker's) ``/ping``: /health's status, no body."""
    return web.Response(status=200 if _healthy(request.app[STATE]) else 503)


async def load(request: web.Request) -> web.Response:
    """vLLM's ``/load``: the generation requests the server is serving now (validated,
    response not yet finished, streams included)."""
    body = {"server_load": len(request.app[STATE].in_flight)}
    return web.Response(text=dumps(body), content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition of the engine's metrics: OpenMetrics (with exemplars) when
    the scraper's ``Accept`` asks for it, else the classic text format. In process mode
    the engine process renders it between steps; a 503 when it does not answer in
    ``metrics_timeout_s``."""
    state = request.app[STATE]
    try:
        rendered = await state.engine.render_metrics(
            request.headers.get("Accept"), state.settings.metrics_timeout_s
        )
    except TimeoutError:
        return web.Response(status=503, text="the engine did not answer in time\n")
    except (EngineDeadError, RuntimeError) as exc:
        return web.Response(status=503, text=f"metrics unavailable: {exc}\n")
    if rendered is None:
        return web.Response(status=404, text="this engine runs without metrics\n")
    body, content_type = rendered
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type  # with its version and charset params
    return response


def _version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("schedscope")
    except PackageNotFoundError:
        return "0+unknown"


async def version(request: web.Request) -> web.Response:
    return web.Response(text=dumps({"version": _version()}), content_type="application/json")


# -- running --------------------------------------------------------------------------------------
class ApiServer:
    """The app on a TCP site, and the drain-then-stop sequence of a graceful shutdown."""

    def __init__(
        self,
        async_engine: AsyncEngine,
        tokenizer,
        settings: ServerSettings,
        extra_routes: Iterable[web.AbstractRouteDef] = (),
    ) -> None:
        self.settings = settings
        self.engine = async_engine
        self.app = create_app(async_engine, tokenizer, settings, extra_routes)
        # After the engine drained, handlers only have their last bytes to write.
        self.runner = web.AppRunner(
            self.app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0
        )
        self.url: str | None = None

    @property
    def state(self) -> ServerState:
        return self.app[STATE]

    async def start(self) -> str:
        """Bind and serve; returns the bound URL (``--port 0`` picks a free port)."""
        guard = self.state.connections
        asyncio.get_running_loop().set_exception_handler(guard.loop_exception_handler)
        await self.runner.setup()
        site = GuardedTCPSite(
            self.runner,
            self.settings.host,
            self.settings.port,
            guard,
            access_log=None,
            # Bodies are inflated by engine.api.body, bounded, after authentication.
            # Idle keep-alive connections end at the header deadline (connections.py);
            # aiohttp's own keep-alive timer is only a backstop.
            auto_decompress=False,
            keepalive_timeout=max(75.0, 2 * self.settings.header_timeout_s),
            # A body left unread after an early error is drained for at most this long.
            lingering_time=2.0,
        )
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Refuse new requests (503), let in-flight ones finish for up to
        ``shutdown_timeout_s``, abort the rest, then close the listener."""
        self.state.draining = True
        await self.engine.shutdown(self.settings.shutdown_timeout_s)
        await self.runner.cleanup()

    def abort_all(self) -> None:
        for request_id in list(self.state.in_flight):
            self.engine.abort(request_id)


def run_server(
    async_engine: AsyncEngine,
    tokenizer,
    settings: ServerSettings,
    extra_routes: Iterable[web.AbstractRouteDef] = (),
    announce: Callable[[str], None] | None = None,
) -> int:
    """Serve until SIGINT/SIGTERM, then shut down gracefully; returns the exit code.
    A second signal aborts every in-flight request at once."""
    return asyncio.run(_serve(async_engine, tokenizer, settings, extra_routes, announce))


async def _serve(async_engine, tokenizer, settings, extra_routes, announce) -> int:
    server = ApiServer(async_engine, tokenizer, settings, extra_routes)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            log.warning(
                "second signal: aborting %d in-flight requests", len(server.state.in_flight)
            )
            server.abort_all()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        url = await server.start()
    except BaseException:
        await server.stop()  # the engine thread started with the app
        raise
    (announce or _print)(f"schedscope serving on {url}")
    await stop.wait()
    log.warning(
        "shutting down: draining %d in-flight requests (up to %.1f s)",
        len(server.state.in_flight),
        settings.shutdown_timeout_s,
    )
    await server.stop()
    return 0


def _print(line: str) -> None:
    print(line, flush=True)
