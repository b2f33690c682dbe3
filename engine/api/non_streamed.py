"""The non-streamed response of a completion or chat request: each choice's outputs
collected into its text, then one JSON body for all of them."""

from __future__ import annotations

import asyncio

from aiohttp import web

from engine.api.engine_outputs import cached_tokens, end_error, text_ids
from engine.api.generate_request import GenerateRequest
from engine.api.json_codec import dumps
from engine.api.request_identity import REQUEST_ID_HEADER
from engine.api.responses import ChoiceResult, chat_response, completion_response
from engine.api.state import ServerState
from engine.serving.async_engine import RequestOutput


async def _collect(
    state: ServerState, req: GenerateRequest, index: int, first: RequestOutput, outputs
) -> ChoiceResult:
    token_ids: list[int] = list(first.new_token_ids)
    last = first
    async for out in outputs:  # ends right away when ``first`` was the last output
        token_ids.extend(out.new_token_ids)
        last = out
    if last.finish_reason not in ("stop", "length"):
        raise end_error(state, last)
    text = state.tokenizer.decode(text_ids(req, token_ids, len(token_ids)))
    return ChoiceResult(
        text,
        last.finish_reason,
        len(req.choices[index].prompt_token_ids),
        len(token_ids),
        cached_tokens(last),
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


async def complete(
    state: ServerState, request_id: str, req: GenerateRequest, first: RequestOutput, outputs
) -> web.Response:
    return _json_response(request_id, req, [await _collect(state, req, 0, first, outputs)])


async def complete_batch(
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
