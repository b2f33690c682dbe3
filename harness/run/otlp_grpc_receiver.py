"""An OTLP/gRPC traces endpoint that a ``--target`` run starts (``--target-otlp-grpc-port``):
the collector's ``opentelemetry.proto.collector.trace.v1.TraceService/Export``, served with
``grpcio`` and the generated stubs of ``opentelemetry-proto``.

vLLM's OTLP exporter (``--otlp-traces-endpoint``) speaks gRPC unless
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``; the OTLP/HTTP receiver
(harness/run/otlp_receiver.py) cannot take it. Each export request becomes a line of the
cell's trace file through the same :class:`~harness.run.otlp_receiver.SpanLines` writer,
in the same OTLP-JSON format, so the two receivers' spans are read alike.

Its own port: gRPC is HTTP/2 served by grpcio's own socket, the HTTP receiver is aiohttp's
HTTP/1.1, and OTLP's convention keeps them apart too (4317 gRPC, 4318 HTTP). Plaintext
only (the target's exporter must be insecure: OTEL_EXPORTER_OTLP_TRACES_INSECURE=true).
"""

from __future__ import annotations

from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from harness.run.otlp_receiver import SpanLines, message_json

#: The largest export request taken (the HTTP receiver's limit too); gRPC's default is 4 MiB.
MAX_MESSAGE_BYTES = 64 << 20


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, lines: SpanLines) -> None:
        self.lines = lines

    def Export(self, request, context):  # noqa: N802 - the generated servicer's name
        try:
            self.lines.write(message_json(request))
        except OSError as exc:  # the cell has stopped receiving
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpGrpcReceiver:
    """``with OtlpGrpcReceiver(lines, port) as receiver: ...`` serves OTLP/gRPC traces on
    127.0.0.1 (``port`` 0: any free one; ``receiver.endpoint``, ``host:port``, and
    ``receiver.url``, ``http://host:port``), each export request a line of ``lines``."""

    def __init__(self, lines: SpanLines, port: int = 0, host: str = "127.0.0.1") -> None:
        self.lines = lines
        self.host, self.port = host, port
        self.endpoint = self.url = ""
        self._server: grpc.Server | None = None

    def __enter__(self) -> OtlpGrpcReceiver:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="schedscope-otlp-grpc"),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                # a second receiver on the same port must fail, not share it
                ("grpc.so_reuseport", 0),
            ],
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self.lines), server)
        try:
            port = server.add_insecure_port(f"{self.host}:{self.port}")
        except RuntimeError as exc:  # grpcio raises it for a port it cannot bind
            raise OSError(f"cannot receive OTLP/gRPC on {self.host}:{self.port}: {exc}") from None
        if port == 0:  # older grpcio: 0 instead of raising
            raise OSError(f"cannot receive OTLP/gRPC on {self.host}:{self.port}: port in use")
        server.start()
        self._server = server
        self.endpoint = f"{self.host}:{port}"
        self.url = f"http://{self.endpoint}"
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            # requests already in their handler finish (and are written) first
            self._server.stop(grace=5).wait(10)
            self._server = None
