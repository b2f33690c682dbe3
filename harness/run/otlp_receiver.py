"""An OTLP/HTTP traces endpoint that a ``--target`` run starts, so an external server
(a vLLM started with ``--otlp-traces-endpoint``, or any OTel-instrumented server) can
send its spans to the run: they land in the cell's trace file as OTLP-JSON lines, the
format ``harness.records.spans.read_spans`` reads (one ``ExportTraceServiceRequest`` a line).

Protobuf bodies (``application/x-protobuf``, gzip or not) and JSON bodies
(``application/json``) are both accepted, as the OTLP/HTTP specification asks. In
protobuf's own JSON mapping ids are base64; OTLP/JSON writes them as hex, so they are
rewritten here.

:class:`SpanLines` is the one writer of that file: the OTLP/gRPC receiver
(harness/run/otlp_grpc_receiver.py) writes its requests through it too, and a cell that
receives both ways shares one.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import threading
from pathlib import Path
from typing import TextIO

from aiohttp import web

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(node) -> None:
    """Rewrite protobuf-JSON base64 ids as OTLP/JSON hex ids, in place."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str) and value:
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)


def message_json(message) -> dict:
    """A protobuf ``ExportTraceServiceRequest`` as the OTLP/JSON object of one line."""
    from google.protobuf.json_format import MessageToDict

    out = MessageToDict(message, use_integers_for_enums=True)
    _hex_ids(out)
    return out


def export_request_json(body: bytes, content_type: str) -> dict:
    """An OTLP/HTTP traces request body as the OTLP/JSON object of one line."""
    if content_type == "application/json":
        return json.loads(body)
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    return message_json(ExportTraceServiceRequest.FromString(body))


class SpanLines:
    """A cell's trace file of received spans: one OTLP-JSON line per export request,
    appended and flushed as it comes (``with SpanLines(path) as lines``). Thread-safe:
    the HTTP receiver's loop and the gRPC server's threads may write at once. Counts
    the requests and spans written."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.num_requests = 0
        self.num_spans = 0
        self._lock = threading.Lock()
        self._file: TextIO | None = None

    def __enter__(self) -> SpanLines:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def write(self, line: dict) -> None:
        """Append one export request (its OTLP/JSON object)."""
        spans = sum(
            len(ss.get("spans", ()))
            for rs in line.get("resourceSpans", ())
            for ss in rs.get("scopeSpans", ())
        )
        text = json.dumps(line, separators=(",", ":")) + "\n"
        with self._lock:
            if self._file is None:
                raise OSError(f"{self.path}: closed, the request is not kept")
            self._file.write(text)
            self._file.flush()
            self.num_requests += 1
            self.num_spans += spans


class OtlpReceiver:
    """``with OtlpReceiver(lines, port) as receiver: ...`` serves ``POST /v1/traces`` on
    127.0.0.1 (``port`` 0: any free one; ``receiver.url``), each request a line of
    ``lines`` (an open :class:`SpanLines`)."""

    def __init__(self, lines: SpanLines, port: int = 0, host: str = "127.0.0.1") -> None:
        self.lines = lines
        self.host, self.port = host, port
        self.url = ""
        self._ready = threading.Event()
        self._error: BaseException | None = None

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
        try:
            line = export_request_json(body, request.content_type)
        except Exception as exc:  # noqa: BLE001 - a bad body is the sender's 400
            return web.json_response({"error": f"not an OTLP traces request: {exc}"}, status=400)
        self.lines.write(line)
        if request.content_type == "application/json":
            return web.json_response({})
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceResponse,
        )

        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/traces", self._traces)
        self.runner = web.AppRunner(app, access_log=None)
        try:
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, self.host, self.port)
            self.loop.run_until_complete(site.start())
        except BaseException as exc:  # noqa: BLE001 - reported to __enter__
            self._error = exc
            self._ready.set()
            return
        port = self.runner.addresses[0][1]
        self.url = f"http://{self.host}:{port}/v1/traces"
        self._ready.set()
        self.loop.run_forever()

    def __enter__(self) -> OtlpReceiver:
        self._thread = threading.Thread(target=self._run, name="schedscope-otlp", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise OSError(f"cannot receive OTLP on {self.host}:{self.port}: {self._error}")
        return self

    def __exit__(self, *exc) -> None:
        if getattr(self, "runner", None) is not None and self._error is None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
