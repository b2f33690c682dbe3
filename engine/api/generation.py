"""The generation routes, ``POST /v1/completions`` and ``POST /v1/chat/completions``: a
request's body read and validated, one engine request per prompt submitted, and the
status decided before the first byte (refusals become 4xx/5xx); then the response,
streamed (engine.api.streaming) or not (engine.api.non_streamed).

A client that goes away aborts its request: the runner cancels the handler of a closed
connection (``handler_cancellation=True``), and leaving the ``generate()`` iteration
early aborts the request in the engine; a failed write to a closed stream does the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import math

from aiohttp import web

from engine.api.body import read_json_body
from engine.api.connections import client_of
from engine.api.engine_outputs import end_error
from engine.api.errors import ApiError, bad_request, unavailable
from engine.api.generate_request import GenerateRequest, ServingContext
from engine.api.json_codec import parse_json_object
from engine.api.non_streamed import complete, complete_batch
from engine.api.request_identity import (
    REQUEST_ID_HEADER,
    TRACEPARENT_HEADER,
    engine_request_ids,
    read_request_class,
    read_request_id,
    read_session_turn,
)
from engine.api.state import STATE, ServerState
from engine.api.streaming import stream, stream_batch
from engine.api.validation import parse_generate_request
from engine.core import decisions as d
from engine.core.request import EngineRequest, parse_traceparent
from engine.serving.async_engine import EngineDeadError, RequestOutput, RequestRejected

#: Bodies larger than this are validated (and their prompt tokenized) on a worker thread,
#: in the turn engine.api.heavy_work gives them; smaller ones at once, on the event loop.
OFFLOAD_PARSE_BYTES = 64 * 1024


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


def _parse_body(raw: bytes, kind: str, context: ServingContext) -> GenerateRequest:
    return parse_generate_request(parse_json_object(raw), kind, context)


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    state = request.app[STATE]
    settings = state.settings
    request_id = read_request_id(request, kind)
    try:
        request_class = read_request_class(request)
        header_turn = read_session_turn(request)
        raw = await read_json_body(request, settings.max_body_bytes, settings.body_timeout_s)
        if len(raw) > OFFLOAD_PARSE_BYTES:  # parsing and tokenizing must not stall the loop
            req = await state.heavy_work.run(
                _parse_body, raw, kind, state.context, client=client_of(request), cost=len(raw)
            )
        else:
            req = _parse_body(raw, kind, state.context)
        # Arrival at the engine is now, when the request is understood — not when the
        # step loop next looks at its commands: the wait for a running step is queueing.
        arrival_time = state.engine.now()
        engine_ids = engine_request_ids(request_id, req)
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
                session_turn=header_turn or req.turn,
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
                    return await stream_batch(request, state, request_id, req, firsts, streams)
                return await complete_batch(state, request_id, req, firsts, streams)
            if req.stream:
                return await stream(request, state, request_id, req, firsts[0], streams[0])
            return await complete(state, request_id, req, firsts[0], streams[0])
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
        raise unavailable("the engine is not accepting requests (shutting down)") from None
    except ValueError as exc:  # the engine still holds a request with this id
        raise ApiError(
            409, str(exc), "invalid_request_error", REQUEST_ID_HEADER, "duplicate_request_id"
        ) from None
    if first.finished and first.finish_reason not in ("stop", "length"):
        raise end_error(state, first)  # failed before any token: a real status
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
            exc = task.exception()
            if exc is not None:
                raise exc
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
    if exc.reason in (d.REASON_MAX_NUM_QUEUED_REQS, d.REASON_MAX_NUM_QUEUED_TOKENS):
        # vLLM 0.32's admission caps: its 503 and its words, so a client (or a load
        # balancer) reads the bundled engine as it reads vLLM
        what = (
            "is currently busy and cannot accept new requests"
            if exc.reason == d.REASON_MAX_NUM_QUEUED_REQS
            else "has reached its prefill token backlog limit"
        )
        return unavailable(
            f"The engine {what} (--{exc.reason.replace('_', '-')}). Please try again later "
            "or on a different instance."
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
    return unavailable(f"the engine refused the request ({exc.reason})")
