"""The streamed response of a completion or chat request: server-sent events of text
deltas, one stream per request (a batch's prompts interleaved by ``index``). A failed
write to a closed stream ends the handler, which aborts the request."""

from __future__ import annotations

import asyncio

from aiohttp import web

from engine.api.detokenizer import IncrementalDetokenizer
from engine.api.engine_outputs import cached_tokens, end_error, text_ids
from engine.api.generate_request import GenerateRequest
from engine.api.request_identity import REQUEST_ID_HEADER
from engine.api.responses import ChunkWriter
from engine.api.state import ServerState
from engine.serving.async_engine import RequestOutput


class _ChoiceText:
    """One choice of a stream: its detokenizer and its count of generated tokens."""

    __slots__ = ("req", "index", "num_prompt", "num_generated", "num_cached", "detokenizer")

    def __init__(self, state: ServerState, req: GenerateRequest, index: int) -> None:
        self.req = req
        self.index = index
        self.num_prompt = len(req.choices[index].prompt_token_ids)
        self.num_generated = 0
        self.num_cached = 0  # known at its end (engine_outputs.cached_tokens)
        self.detokenizer = IncrementalDetokenizer(state.tokenizer)

    def delta(self, new_token_ids: list[int]) -> str:
        self.num_generated += len(new_token_ids)
        return self.detokenizer.add(text_ids(self.req, new_token_ids, self.num_generated))

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
    return ChunkWriter.error(end_error(state, out))


async def stream(
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
                choice.num_cached = cached_tokens(out)
                await anext(outputs, None)  # let the iterator end (no abort on close)
                break
            out = await anext(outputs)
        await response.write(_end_chunks(state, chunks, choice, out))
        if req.include_usage and out.finish_reason in ("stop", "length"):
            await response.write(chunks.usage(*choice.counts, choice.num_cached))
        await response.write(ChunkWriter.DONE)
        await response.write_eof()
    except ConnectionError:
        # The client went away mid-stream: leaving returns through aclosing(), which
        # aborts the request.
        pass
    return response


async def stream_batch(
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
                choice.num_cached = cached_tokens(out)
                num_open -= 1
                all_ok = all_ok and out.finish_reason in ("stop", "length")
                await response.write(_end_chunks(state, chunks, choice, out))
        if req.include_usage and all_ok:
            await response.write(
                chunks.usage(
                    sum(c.num_prompt for c in choices),
                    sum(c.num_generated for c in choices),
                    sum(c.num_cached for c in choices),
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
