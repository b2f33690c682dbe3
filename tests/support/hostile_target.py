"""A hostile OpenAI-compatible server, for the tests and benchmarks of what the load
generator does with values a target should never send.

:class:`HostileTarget` serves on loopback in a thread of the caller's process (aiohttp).
``GET /v1/models``, ``GET /health``, ``POST /tokenize`` and every probe request of the
load generator (request ids ``schedscope-probe-*`` and ``schedscope-vocab-probe-*``)
are answered as a healthy vLLM would. Each other ``POST /v1/completions`` gets one
behaviour of :data:`MODES`: the one its ``X-Request-Id`` names before a ``:``
(``prompt_tokens_string:r1``), else the next of ``modes`` in turn (a cycling index, so a
schedule's requests meet each of them). Streams follow ``stream_options``
(``include_usage``, ``continuous_usage_stats``) as vLLM's do; ``max_tokens`` tokens of
text ``" x"``.

``pace_s``: a pause after each token chunk (so that streams overlap, as a real engine's
do). Counters: ``served`` (completions by mode, probes left out); ``assigned``: request
id -> the mode it got.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from aiohttp import web

from tests.support.threaded_app import ThreadedApp

MODEL = "hostile-model"
MARKUP = "[/evil] boom <script>alert(1)</script>"

#: mode -> (what it does, the field an error row must name; None: the row is ok)
MODES: dict[str, tuple[str, str | None]] = {
    "good": ("a correct stream", None),
    "float_count": ("every usage count a float with an integral value (3.0)", None),
    "prompt_tokens_string": ('the final usage says prompt_tokens "lots"', "usage.prompt_tokens"),
    "completion_tokens_huge": (
        "every chunk's usage says completion_tokens 3000000",
        "usage.completion_tokens",
    ),
    "negative_count": ("a chunk's usage says completion_tokens -5", "usage.completion_tokens"),
    "bool_count": ("a chunk's usage says completion_tokens true", "usage.completion_tokens"),
    "nan_count": ("the final usage says prompt_tokens NaN", "usage.prompt_tokens"),
    "huge_float": ("a chunk's usage says completion_tokens 1e300", "usage.completion_tokens"),
    "huge_prompt_count": ("the final usage says prompt_tokens 10**18", "usage.prompt_tokens"),
    "finish_reason_object": ("a finish_reason that is an object", "choices[0].finish_reason"),
    "text_number": ("a choice's text that is a number", "choices[0].text"),
    "not_json": ("a data line that is not JSON", "not JSON"),
    "markup_error_event": (f"an error event: {MARKUP} with control characters", MARKUP),
    "markup_error_body": (f"HTTP 500 with the message {MARKUP}", MARKUP),
    "long_error_body": ("HTTP 500 with a 4 MB message of control characters and x", None),
    "endless_line": ("one data line that never ends (64 KiB at a time)", "longer than"),
    "ping_flood": (": ping comments, as fast as they go, never [DONE]", "bytes for"),
    "endless_ping": (": ping every 0.1 s, never a token or [DONE]", None),
    "extra_text_chunks": (
        "3 text chunks past max_tokens with no usage (held-back text flushed at the end)",
        None,
    ),
}

#: the modes whose requests are ok: correct, or odd but not wrong
OK_MODES = ("good", "float_count", "extra_text_chunks")
#: the modes whose rows are errors naming their field, for a run's cycle
ERROR_MODES = tuple(m for m, (_, field) in MODES.items() if field is not None)


class HostileTarget(ThreadedApp):
    name = "the hostile target"
    shutdown_timeout_s = 0.5

    def __init__(self, modes: tuple[str, ...] = ("good",), pace_s: float = 0.0) -> None:
        unknown = [m for m in modes if m not in MODES]
        if unknown:
            raise ValueError(f"unknown modes {unknown}; known: {', '.join(MODES)}")
        super().__init__()
        self.modes = modes
        self.pace_s = pace_s
        self.served: Counter[str] = Counter()
        self.assigned: dict[str, str] = {}
        self._next = 0

    # -- routes -----------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": MODEL, "object": "model", "max_model_len": 4096}
        return web.json_response({"object": "list", "data": [card]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="", content_type="text/plain")

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        words = str(body.get("prompt", "")).split()
        ids = [3 + i % 4000 for i in range(len(words))] or [3]
        return web.json_response({"count": len(ids), "max_model_len": 4096, "tokens": ids})

    def mode_of(self, request_id: str) -> str:
        if request_id.startswith("schedscope-"):  # the load generator's probes
            return "good"
        named = request_id.split(":", 1)[0]
        if ":" in request_id and named in MODES:
            return named
        mode = self.modes[self._next % len(self.modes)]
        self._next += 1
        return mode

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        request_id = request.headers.get("X-Request-Id", "")
        mode = self.mode_of(request_id)
        if not request_id.startswith("schedscope-"):
            self.served[mode] += 1
            self.assigned[request_id] = mode
        prompt = body.get("prompt")
        n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        n = int(body.get("max_tokens") or 16)
        if mode == "markup_error_body":
            error = {"message": MARKUP, "type": "BadRequestError", "code": 500}
            return web.json_response({"object": "error", **error}, status=500)
        if mode == "long_error_body":
            message = ("\x1b[31m\r\n\x00" + "x" * 60) * 65_000  # ~4 MB
            return web.json_response({"error": {"message": message}}, status=500)
        if not body.get("stream"):
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n}
            choice = {"index": 0, "text": " x" * n, "finish_reason": "length"}
            return web.json_response({"id": "cmpl-h", "choices": [choice], "usage": usage})
        options = body.get("stream_options") or {}
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            await self._stream(response, mode, n, n_prompt, options)
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client gave up on the stream, as it should
        return response

    async def _stream(self, response, mode: str, n: int, n_prompt: int, options: dict) -> None:
        async def send(obj) -> None:
            await response.write(f"data: {json.dumps(obj)}\n\n".encode())

        if mode == "endless_line":
            await response.write(b'data: {"choices": [{"text": "')
            while True:
                await response.write(b"x" * 65536)
                await asyncio.sleep(0)
        if mode in ("ping_flood", "endless_ping"):
            while True:
                await response.write(b": ping\n\n" * (1024 if mode == "ping_flood" else 1))
                await asyncio.sleep(0 if mode == "ping_flood" else 0.1)
        if mode == "not_json":
            await response.write(b"data: {not json at all\n\n")
        if mode == "markup_error_event":
            await send({"error": {"message": MARKUP + "\x1b[2J\x07\u202e", "code": 500}})
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return
        count = float if mode == "float_count" else int
        continuous = bool(options.get("continuous_usage_stats"))
        for i in range(n):
            choice = {"index": 0, "text": " x", "finish_reason": "length" if i == n - 1 else None}
            if mode == "finish_reason_object" and i == n - 1:
                choice["finish_reason"] = {"why": "length"}
            if mode == "text_number":
                choice["text"] = 7
            chunk: dict = {"id": "cmpl-h", "choices": [choice]}
            if continuous:
                chunk["usage"] = {
                    "prompt_tokens": count(n_prompt),
                    "completion_tokens": count(i + 1),
                }
                if mode == "completion_tokens_huge":
                    chunk["usage"]["completion_tokens"] = 3_000_000
                elif mode == "negative_count" and i == 0:
                    chunk["usage"]["completion_tokens"] = -5
                elif mode == "bool_count" and i == 0:
                    chunk["usage"]["completion_tokens"] = True
                elif mode == "huge_float" and i == 0:
                    chunk["usage"]["completion_tokens"] = 1e300
            await send(chunk)
            if self.pace_s:
                await asyncio.sleep(self.pace_s)
        if mode == "extra_text_chunks":
            for _ in range(3):
                await send({"id": "cmpl-h", "choices": [{"index": 0, "text": " y"}]})
        if options.get("include_usage"):
            usage: dict = {"prompt_tokens": count(n_prompt), "completion_tokens": count(n)}
            if mode == "prompt_tokens_string":
                usage["prompt_tokens"] = "lots"
            elif mode == "nan_count":
                usage["prompt_tokens"] = float("nan")  # json.dumps writes NaN
            elif mode == "huge_prompt_count":
                usage["prompt_tokens"] = 10**18
            elif mode == "completion_tokens_huge":
                usage["completion_tokens"] = 3_000_000
            await send({"id": "cmpl-h", "choices": [], "usage": usage})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()

    # -- running ------------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/completions", self._completions)


def main() -> None:
    """``python -m tests.support.hostile_target [MODE ...]``: serve until killed, the
    URL on the first line of stdout (the benchmark runs it apart from the generator)."""
    import sys
    import time

    with HostileTarget(tuple(sys.argv[1:]) or ("good",)) as target:
        print(target.url, flush=True)
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
