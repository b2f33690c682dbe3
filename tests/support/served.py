"""Driving a live ``schedscope serve`` subprocess (``harness.serve.local_server.CliServer``)
from a test: its ``/health``, its engine process, and raw streams whose every byte the
test sees (an error event, or a stream cut short)."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import psutil

from harness.serve.local_server import CliServer, HttpClient


def health(url: str) -> tuple[int, dict]:
    status, _, raw = HttpClient(url).request("GET", "/health")
    return status, json.loads(raw)


def engine_process(server: CliServer) -> psutil.Process:
    """The server's engine process (``--engine-core process``)."""
    children = psutil.Process(server.process.pid).children()
    # multiprocessing's spawn start method also starts a resource tracker
    cores = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
    assert len(cores) == 1, [c.cmdline() for c in children]
    return cores[0]


def open_stream(url: str, body: dict, timeout_s: float = 60.0) -> socket.socket:
    """POST ``body`` to /v1/completions on a raw socket; returns it once the response's
    headers say 200 (the stream has started)."""
    parts = urlsplit(url)
    raw = json.dumps(body).encode()
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout_s)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
    )
    head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def read_stream(sock: socket.socket) -> bytes:
    """Everything the stream sends until its ``[DONE]``, or until the server closes it
    (or the socket's timeout passes): a stream cut short has no ``[DONE]``."""
    received = b""
    try:
        while b"data: [DONE]" not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    except TimeoutError:
        pass
    finally:
        sock.close()
    return received
