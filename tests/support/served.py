"""Driving a live ``schedscope serve`` subprocess (``harness.serve.local_server.CliServer``)
from a test: its ``/health``, its engine process, and raw streams whose every byte the
test sees (an error event, or a stream cut short); waiting until it is idle with every
KV block free."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import psutil

from harness.serve.local_server import CliServer, HttpClient


def health(url: str) -> tuple[int, dict]:
    """``GET /health`` of the server at ``url``, on a connection of its own: (HTTP status,
    the JSON body)."""
    client = HttpClient(url)
    try:
        status, _, raw = client.request("GET", "/health")
    finally:
        client.close()
    return status, json.loads(raw)


def wait_idle_and_leak_free(url: str, timeout: float = 30.0) -> dict:
    """Poll ``/health`` until the server answers 200 with nothing in flight, unfinished,
    running, waiting or swapped, and every device and host KV block free; that health.
    Fails the test (showing the last health) if that takes over ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        status, now = health(url)
        if (
            status == 200
            and now["num_in_flight"] == 0
            and now["num_unfinished"] == 0
            and now["num_running"] + now["num_waiting"] + now["num_swapped"] == 0
            and now["num_free_device_blocks"] == now["num_device_blocks"]
            and now["num_free_host_blocks"] == now["num_host_blocks"]
        ):
            return now
        assert time.monotonic() < deadline, f"not idle after {timeout} s: {now}"
        time.sleep(0.02)


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
