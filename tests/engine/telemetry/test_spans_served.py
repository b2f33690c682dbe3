"""Spans from a served run: ``schedscope serve --executor sim`` in a subprocess (the
engine process path, where the tracer provider lives), exporting over OTLP/HTTP to a
receiver built on opentelemetry-proto; and the thread path writing a trace file."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
import threading
import time

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from harness.records.spans import read_spans
from harness.serve.local_server import CliServer, HttpClient

pytestmark = [pytest.mark.slow]

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
BODY = {"model": "tiny", "prompt": "a b c", "max_tokens": 5, "ignore_eos": True}


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict, Span]] = []  # (resource attributes, span)
        self.num_requests = 0
        self._ready = threading.Event()

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(body)
        self.num_requests += 1
        for rs in export.resource_spans:
            resource = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                self.spans.extend((resource, span) for span in ss.spans)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1/traces"
        self._ready.set()
        self.loop.run_forever()

    def __enter__(self) -> OtlpReceiver:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def attributes(span: Span) -> dict:
    out = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        value = getattr(kv.value, kind)
        if kind == "array_value":
            value = [getattr(v, v.WhichOneof("value")) for v in value.values]
        out[kv.key] = value
    return out


def test_served_spans_reach_an_otlp_receiver_span_by_span():
    with OtlpReceiver() as receiver:
        with CliServer(
            [
                "--executor",
                "sim",
                "--served-model-name",
                "tiny",
                "--otlp-traces-endpoint",
                receiver.url,
            ]
        ) as server:
            client = HttpClient(server.url)
            assert client.post_json("/v1/completions", BODY, {"X-Request-Id": "plain"})[0] == 200
            assert (
                client.post_json(
                    "/v1/completions",
                    {**BODY, "temperature": 0.7, "top_p": 0.9},
                    {"X-Request-Id": "joined", "traceparent": TRACEPARENT},
                )[0]
                == 200
            )
            chat = {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3,
                "ignore_eos": True,
            }
            assert (
                client.post_json("/v1/chat/completions", chat, {"X-Request-Id": "chat"})[0] == 200
            )
            server.terminate()
            assert server.wait(30) == 0  # the engine process flushes its spans on the way out
            output = server.output()
    assert "spans:" in output and "0 dropped" in output, output
    assert receiver.num_requests >= 1
    spans = [span for _, span in receiver.spans]
    resource = receiver.spans[0][0]
    assert resource["service.name"] == "schedscope"
    roots = {attributes(s)["schedscope.request.id"]: s for s in spans if s.name == "llm_request"}
    assert set(roots) == {"plain", "joined", "chat"}
    for rid, root in roots.items():
        a = attributes(root)
        assert root.kind == Span.SPAN_KIND_SERVER
        assert a["gen_ai.request.model"] == "tiny"
        assert a["gen_ai.operation.name"] == "text_completion"
        assert a["gen_ai.usage.output_tokens"] == (3 if rid == "chat" else 5)
        assert a["gen_ai.response.finish_reasons"] == ["length"]
        assert a["schedscope.request.status"] == "ok"
        assert root.status.code == Status.STATUS_CODE_UNSET
        assert root.start_time_unix_nano <= root.end_time_unix_nano
        children = [s for s in spans if s.trace_id == root.trace_id and s.name != "llm_request"]
        names = [s.name for s in sorted(children, key=lambda s: s.start_time_unix_nano)]
        assert names[0] == "schedule" and "prefill" in names, names
        for child in children:
            assert child.parent_span_id == root.span_id
            assert root.start_time_unix_nano <= child.start_time_unix_nano
            assert child.end_time_unix_nano <= root.end_time_unix_nano
        decisions = [s for s in children if "schedscope.decision" in attributes(s)]
        assert [attributes(s)["schedscope.decision"] for s in decisions] == ["admit"]
    joined = roots["joined"]
    assert joined.trace_id.hex() == TRACE and joined.parent_span_id.hex() == PARENT
    assert attributes(joined)["gen_ai.request.temperature"] == pytest.approx(0.7)
    assert attributes(joined)["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert not roots["plain"].parent_span_id
    assert roots["plain"].trace_id != roots["chat"].trace_id
    steps = [s for s in spans if s.name == "engine.step"]
    assert steps and all(attributes(s)["schedscope.step.num_seqs"] >= 1 for s in steps)


def test_thread_mode_writes_the_trace_file_on_shutdown(tmp_path):
    trace_file = tmp_path / "spans.jsonl"
    with CliServer(
        ["--executor", "sim", "--engine-core", "thread", "--trace-file", str(trace_file)]
    ) as server:
        assert (
            HttpClient(server.url).post_json(
                "/v1/completions", BODY, {"X-Request-Id": "t1", "traceparent": TRACEPARENT}
            )[0]
            == 200
        )
        server.terminate()
        assert server.wait(30) == 0
    frame = read_spans(trace_file)
    root = frame.filter(frame["name"] == "llm_request").row(0, named=True)
    assert root["request_id"] == "t1" and root["trace_id"] == TRACE
    assert root["parent_span_id"] == PARENT
    assert root["attr.gen_ai.usage.output_tokens"] == 5


def test_no_tracing_wins_over_the_environment(tmp_path):
    with CliServer(
        ["--executor", "sim", "--no-tracing"],
        env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"},
    ) as server:
        assert HttpClient(server.url).post_json("/v1/completions", BODY)[0] == 200
        server.terminate()
        assert server.wait(30) == 0
        assert "tracing: off" in server.output()


def decision_counts(metrics_text: str) -> dict[str, int]:
    """``schedscope_decisions_total`` summed by kind, from a /metrics exposition."""
    counts: dict[str, int] = {}
    for line in metrics_text.splitlines():
        if line.startswith("schedscope_decisions_total{"):
            kind = re.search(r'kind="([^"]+)"', line).group(1)
            counts[kind] = counts.get(kind, 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


def test_every_decision_of_a_served_run_under_memory_pressure_is_one_span():
    """A pool too small for the concurrent requests and a host pool too small for every
    swap: admits, preemptions by swap and by recompute, swap-outs and -ins, recomputes
    and aborts. The engine's own count of each kind (schedscope_decisions_total on
    /metrics) equals the number of decision spans of that kind the receiver got; every
    one is in its request's trace, child of its llm_request span."""
    with OtlpReceiver() as receiver:
        args = [
            "--executor",
            "sim",
            "--served-model-name",
            "tiny",
            "--otlp-traces-endpoint",
            receiver.url,
            "--num-gpu-blocks-override",
            "24",
            "--num-cpu-blocks-override",
            "6",
            "--block-size",
            "16",
            "--max-num-seqs",
            "8",
            "--preemption-mode",
            "swap",
        ]
        with CliServer(args) as server:

            def user(i: int) -> None:
                client = HttpClient(server.url)
                body = {
                    "model": "tiny",
                    "prompt": " ".join(["w"] * (20 + 7 * i)),
                    "max_tokens": 40 + 5 * i,
                    "ignore_eos": True,
                }
                client.post_json("/v1/completions", body, {"X-Request-Id": f"u{i}"})
                client.close()

            threads = [threading.Thread(target=user, args=(i,)) for i in range(10)]
            for thread in threads:
                thread.start()
            # One client that leaves mid-stream: an abort decision.
            host, port = server.url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                body = json.dumps(
                    {
                        "model": "tiny",
                        "prompt": "a b",
                        "max_tokens": 200,
                        "ignore_eos": True,
                        "stream": True,
                    }
                ).encode()
                sock.sendall(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: gone\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                    % len(body)
                    + body
                )
                sock.recv(100)
            for thread in threads:
                thread.join(60)
            client = HttpClient(server.url)
            deadline = time.monotonic() + 10
            while json.loads(client.request("GET", "/health")[2])["num_unfinished"]:
                assert time.monotonic() < deadline, "the aborted request never ended"
                time.sleep(0.05)
            metrics = client.request("GET", "/metrics")[2].decode()
            client.close()
            server.terminate()
            assert server.wait(30) == 0
    counts = decision_counts(metrics)
    assert counts.get("preempt", 0) > 0 and counts.get("swap_out", 0) > 0, counts
    assert counts.get("recompute", 0) > 0 and counts.get("abort", 0) == 1, counts
    spans = [span for _, span in receiver.spans]
    roots = {s.span_id: s for s in spans if s.name == "llm_request"}
    decision_spans = [s for s in spans if "schedscope.decision" in attributes(s)]
    by_kind: dict[str, int] = {}
    for span in decision_spans:
        kind = attributes(span)["schedscope.decision"]
        by_kind[kind] = by_kind.get(kind, 0) + 1
        root = roots[span.parent_span_id]
        assert span.trace_id == root.trace_id
        assert (
            attributes(span)["schedscope.request.id"] == attributes(root)["schedscope.request.id"]
        )
    span_kinds = {"admit", "preempt", "swap_out", "swap_in", "recompute", "reject", "abort", "fail"}
    assert by_kind == {k: v for k, v in counts.items() if k in span_kinds}


class BlackHole:
    """A TCP listener on 127.0.0.1 that accepts every connection and never reads or
    answers: a collector that hangs."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.connections.append(connection)

    def __enter__(self) -> BlackHole:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.listener.close()
        for connection in self.connections:
            connection.close()


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]


def serve_a_load(args: list[str], num_requests: int) -> tuple[float, str]:
    """``num_requests`` streams of 20 tokens, 30 at a time, against a fresh server: (the
    seconds they took, the server's log once it has stopped). Every one must complete;
    the server must exit 0 on SIGTERM."""
    body = {"model": "tiny", "prompt": "a b c", "max_tokens": 20, "ignore_eos": True}

    def user(url: str, first: int, statuses: list[int]) -> None:
        client = HttpClient(url, timeout=60)
        for _ in range(first, num_requests, 30):
            statuses.append(client.post_json("/v1/completions", {**body, "stream": True})[0])
        client.close()

    with CliServer(["--executor", "sim", *args]) as server:
        statuses: list[int] = []
        started = time.monotonic()
        threads = [threading.Thread(target=user, args=(server.url, i, statuses)) for i in range(30)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        elapsed = time.monotonic() - started
        assert statuses == [200] * num_requests, sorted(set(statuses))
        server.terminate()
        assert server.wait(30) == 0
        return elapsed, server.output()


def test_a_dead_or_hanging_collector_costs_the_requests_nothing(tmp_path):
    """The same load three times: without spans, exporting to a closed port, and to a
    collector that accepts and never answers. Every request completes each time, in a
    time of the same order as without spans (a wide bound: the export runs on its own
    thread and never waits in a step), and every span is counted as dropped, none as
    exported; the server still exits 0 within its bound."""
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"step_overhead_s": 0.005}))
    base = ["--cost-model", str(cost)]
    num_requests = 300
    quiet_s, _ = serve_a_load([*base, "--no-tracing"], num_requests)
    with BlackHole() as hole:
        for url in (
            f"http://127.0.0.1:{closed_port()}/v1/traces",
            f"http://127.0.0.1:{hole.port}/v1/traces",
        ):
            elapsed, log = serve_a_load([*base, "--otlp-traces-endpoint", url], num_requests)
            print(f"{url}: {elapsed:.2f} s (no spans: {quiet_s:.2f} s)")
            assert elapsed < 3 * quiet_s + 5, (url, elapsed, quiet_s)
            match = re.search(r"spans: (\d+) ended, (\d+) exported, (\d+) dropped", log)
            assert match, log[-2000:]
            ended, exported, dropped = map(int, match.groups())
            assert ended >= num_requests and exported == 0 and dropped == ended, match.group(0)
