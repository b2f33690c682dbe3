"""A stand-in for vLLM's OpenAI-compatible server, for the tests: vLLM itself cannot run
in the unit tests (no GPU, no vLLM install), and the bundled server's model has a
vocabulary of 4096 ids, beyond the load generator's default token-id range.

:class:`VllmStub` serves, on loopback in a thread of the test's process (aiohttp):

- ``GET /v1/models``: one model card with ``max_model_len``, as vLLM's;
- ``POST /tokenize``: ``{"count", "max_model_len", "tokens", "token_strs"}``: one id per
  whitespace-separated word, ``3 + crc32(word) mod (vocab_size - 3)``;
- ``POST /v1/completions``: token-id or text prompts; a prompt id at or above
  ``vocab_size`` is refused as vLLM refuses it (400, ``Token id N is out of
  vocabulary``, vLLM's error body); streamed (SSE, ``include_usage`` and
  ``continuous_usage_stats``) or not; ``max_tokens`` tokens of text ``" x"``;
- ``GET /health`` (200, empty, as vLLM's) and ``GET /metrics`` (one vLLM gauge).

``drop_idle_after_s``: a request arriving on a keep-alive connection idle for at least
that long since its last response is not answered: the connection is closed before any
byte, as uvicorn closing an idle connection while the request crosses the close
(vLLM's uvicorn closes them after 5 s). Counters: ``completions`` (requests answered,
refused ones included), ``refused``, ``dropped``.

``stall_s``: a streamed completion of at least 3 tokens pauses this long after its
second token (an inter-token gap the client sees, as a real engine's preemption).
``otlp_grpc_endpoint`` (``http://host:port``): each completion becomes an ``llm_request``
span (``gen_ai.request.id``: its ``X-Request-Id``, as vLLM's), exported by the official
OTel SDK's OTLP/gRPC exporter (batched every 200 ms, plaintext), as vLLM's default
exporter sends its spans.
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
import zlib

from aiohttp import web

from tests.support.threaded_app import ThreadedApp


class VllmStub(ThreadedApp):
    name = "the vLLM stub"

    def __init__(
        self,
        vocab_size: int = 1250,
        max_model_len: int = 2048,
        model: str = "stub-model",
        drop_idle_after_s: float | None = None,
        stall_s: float | None = None,
        otlp_grpc_endpoint: str | None = None,
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.model = model
        self.drop_idle_after_s = drop_idle_after_s
        self.stall_s = stall_s
        self._tracer_provider = None
        if otlp_grpc_endpoint is not None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            self._tracer_provider = TracerProvider(
                resource=Resource.create({"service.name": "vllm-stub"})
            )
            exporter = OTLPSpanExporter(endpoint=otlp_grpc_endpoint, insecure=True)
            self._tracer_provider.add_span_processor(
                BatchSpanProcessor(exporter, schedule_delay_millis=200)
            )
        self.completions = 0
        self.bodies: list[dict] = []  # every completion request's body, in order
        self.refused = 0
        self.dropped = 0
        self.connections = 0  # completions' connections, one count per new connection
        # connection -> idle since (monotonic), keyed by the connection's transport itself: an
        # id() key outlives a closed connection and a new one at the same address inherited
        # its idle time (a fresh retry was then dropped as if idle).
        self._protocols: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    # -- the tokenizer ------------------------------------------------------------------
    def token_ids(self, text: str) -> list[int]:
        span = self.vocab_size - 3
        return [3 + zlib.crc32(w.encode()) % span for w in text.split()]

    # -- routes -----------------------------------------------------------------------
    async def _models_route(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def _health_route(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics_route(self, request: web.Request) -> web.Response:
        text = (
            "# HELP vllm:num_requests_running Running requests.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{self.model}"}} 0.0\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def _tokenize_route(self, request: web.Request) -> web.Response:
        body = await request.json()
        text = body.get("prompt")
        if text is None:
            text = " ".join(m.get("content", "") for m in body.get("messages", []))
        ids = self.token_ids(text)
        return web.json_response(
            {
                "count": len(ids),
                "max_model_len": self.max_model_len,
                "tokens": ids,
                "token_strs": None,
            }
        )

    async def _completions_route(self, request: web.Request) -> web.StreamResponse:
        key = request.transport
        if key not in self._protocols:
            self.connections += 1
        idle_since = self._protocols.get(key)
        self._protocols[key] = None
        if (
            self.drop_idle_after_s is not None
            and idle_since is not None
            and time.monotonic() - idle_since >= self.drop_idle_after_s
        ):
            self.dropped += 1
            del self._protocols[key]
            request.transport.close()  # before any byte of a response
            return web.Response(status=204)
        try:
            return await self._complete(request)
        finally:
            if key in self._protocols:
                self._protocols[key] = time.monotonic()

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        if self._tracer_provider is None:
            return await self._answer(request)
        tracer = self._tracer_provider.get_tracer("vllm-stub")
        with tracer.start_as_current_span("llm_request") as span:
            span.set_attribute("gen_ai.request.id", request.headers.get("X-Request-Id", ""))
            return await self._answer(request)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        self.completions += 1
        body = await request.json()
        self.bodies.append(body)
        prompt = body.get("prompt")
        ids = prompt if isinstance(prompt, list) else self.token_ids(str(prompt))
        if ids and max(ids) >= self.vocab_size:
            self.refused += 1
            return web.json_response(
                {
                    "object": "error",
                    "message": f"Token id {max(ids)} is out of vocabulary",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                },
                status=400,
            )
        n = int(body.get("max_tokens") or 16)
        usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
        if not body.get("stream"):
            choice = {"index": 0, "text": " x" * n, "finish_reason": "length"}
            return web.json_response({"id": "cmpl-stub", "choices": [choice], "usage": usage})
        options = body.get("stream_options") or {}
        continuous = bool(options.get("continuous_usage_stats"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(n):
            chunk: dict = {
                "id": "cmpl-stub",
                "choices": [
                    {"index": 0, "text": " x", "finish_reason": "length" if i == n - 1 else None}
                ],
            }
            if continuous:
                chunk["usage"] = {**usage, "completion_tokens": i + 1}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if self.stall_s and i == 1 and n >= 3:
                await asyncio.sleep(self.stall_s)
        if options.get("include_usage"):
            final = {"id": "cmpl-stub", "choices": [], "usage": usage}
            await response.write(f"data: {json.dumps(final)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    # -- running ------------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self._models_route)
        app.router.add_get("/health", self._health_route)
        app.router.add_get("/metrics", self._metrics_route)
        app.router.add_post("/tokenize", self._tokenize_route)
        app.router.add_post("/v1/completions", self._completions_route)

    def on_stop(self) -> None:
        if self._tracer_provider is not None:
            self._tracer_provider.shutdown()
