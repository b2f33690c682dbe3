"""The --target OTLP receivers (harness/run/otlp_receiver.py, otlp_grpc_receiver.py): the
official OTel SDK's exporters, gRPC and HTTP, send spans to a cell's receivers, which
write them through one writer into one OTLP-JSON lines file that harness.records.spans reads."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from typer.testing import CliRunner

from harness.cli import app
from harness.records.spans import read_spans
from harness.run.otlp_grpc_receiver import OtlpGrpcReceiver
from harness.run.otlp_receiver import OtlpReceiver, SpanLines


def _send(exporter, name: str, request_id: str) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span(name) as span:
        span.set_attribute("schedscope.request.id", request_id)
        with tracer.start_as_current_span("child"):
            pass
    provider.shutdown()


def test_grpc_and_http_exporters_land_in_one_trace_file(tmp_path):
    path = tmp_path / "target_spans.jsonl"
    with (
        SpanLines(path) as lines,
        OtlpReceiver(lines) as http,
        OtlpGrpcReceiver(lines) as grpc_receiver,
    ):
        _send(GrpcSpanExporter(endpoint=grpc_receiver.url, insecure=True), "llm_request", "g1")
        _send(HttpSpanExporter(endpoint=http.url), "llm_request", "h1")
        assert (lines.num_requests, lines.num_spans) == (4, 4)  # a request per span
    spans = read_spans(path)
    roots = spans.filter(spans["name"] == "llm_request")
    assert sorted(roots["request_id"]) == ["g1", "h1"]
    children = spans.filter(spans["name"] == "child")
    # ids arrive as bytes over gRPC; the line keeps OTLP/JSON's hex, as the HTTP path
    assert set(children["parent_span_id"]) == set(roots["span_id"])
    assert all(len(t) == 32 for t in spans["trace_id"])


def test_a_grpc_port_in_use_is_an_oserror_naming_it(tmp_path):
    with (
        SpanLines(tmp_path / "a.jsonl") as lines,
        OtlpGrpcReceiver(lines) as first,
    ):
        port = int(first.endpoint.rsplit(":", 1)[1])
        with pytest.raises(OSError, match=f"OTLP/gRPC on 127.0.0.1:{port}"):
            OtlpGrpcReceiver(lines, port).__enter__()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--target-otlp-grpc-port", "4317"], "only with --target"),
        (["--target", "http://127.0.0.1:9", "--target-otlp-grpc-port", "70000"], "not a TCP port"),
        (
            ["--target", "http://127.0.0.1:9", "--target-otlp-port", "4317"]
            + ["--target-otlp-grpc-port", "4317"],
            "ports of their own",
        ),
    ],
)
def test_bad_otlp_ports_are_usage_errors(tmp_path, args, said):
    result = CliRunner().invoke(app, ["run", *args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and said in result.output, result.output
    assert not (tmp_path / "run").exists()
