"""What one client can take from every other, on an in-process server (sim engine):

1. A valid 100 KB chat's latency alone, and behind 24 concurrent 1 MB /tokenize bodies
   sent just before it by the same client: with the tokenize limits raised so the
   flood is served (the heavy-work budget's order decides), and with the default
   limits (the 1 MB bodies are 413s). Target: behind the flood, at most 2 s (was
   14.1 s, 0.13 s alone).
2. Legitimate requests from one client (127.0.0.3) while another (127.0.0.2) holds
   64 sockets that trickle their request headers, or their bodies, and reconnect when
   cut, on a server with --max-connections 64. Target: at least 95% answered 200 (was 6
   of 139 trickling headers, 2 of 140 trickling bodies).
3. /health's worst latency while one /tokenize answer of about 10 MB is made. Target:
   at most 100 ms (was 630 ms: the answer was encoded on the event loop).

Run: .venv/bin/python benchmarks/bench_shared_slots.py [--seconds 12] [--quick: 3 s]
     [--json FILE]
(Against an older tree, settings it lacks are left out: the same script measures the
"before" figures.)
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
import threading
import time

from engine.api.server import ServerSettings
from engine.serving.tokenizer import HashTokenizer
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.serve.local_server import BackgroundServer, HttpClient, sim_engine

JSON = {"Content-Type": "application/json"}


def settings(**fields) -> ServerSettings:
    known = {f.name for f in dataclasses.fields(ServerSettings)}
    return ServerSettings(
        host="127.0.0.1", port=0, **{k: v for k, v in fields.items() if k in known}
    )


def server(**fields) -> BackgroundServer:
    return BackgroundServer(sim_engine(max_model_len=256), HashTokenizer(4096), settings(**fields))


def address(live) -> tuple[str, int]:
    host, port = live.url.removeprefix("http://").split(":")
    return host, int(port)


def post(live, path: str, body: bytes, source: str = "127.0.0.1", timeout: float = 120):
    conn = http.client.HTTPConnection(*address(live), timeout=timeout, source_address=(source, 0))
    try:
        conn.request("POST", path, body, JSON)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def chat_body() -> bytes:
    body = json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    ).encode()
    return body[:-1] + b" " * 100_000 + b"}"


def chat_behind_flood(limits: dict) -> tuple[float, float, set[int]]:
    chat = chat_body()
    heavy = json.dumps({"prompt": "ab " * 349_000}).encode()  # 1 MB
    with server(**limits) as live:
        t0 = time.perf_counter()
        assert post(live, "/v1/chat/completions", chat) == 200
        alone = time.perf_counter() - t0
        statuses: set[int] = set()
        threads = [
            threading.Thread(target=lambda: statuses.add(post(live, "/tokenize", heavy)))
            for _ in range(24)
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.3)  # the flood is read and queued
        t0 = time.perf_counter()
        assert post(live, "/v1/chat/completions", chat) == 200
        behind = time.perf_counter() - t0
        for thread in threads:
            thread.join()
    return alone, behind, statuses


def trickler(live, stop: threading.Event, body: bool) -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    if body:
        head += b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
    while not stop.is_set():
        try:
            sock = socket.create_connection(
                address(live), timeout=5, source_address=("127.0.0.2", 0)
            )
        except OSError:
            time.sleep(0.05)
            continue
        try:
            sock.sendall(head)
            while not stop.wait(0.5):
                sock.sendall(b" " if body else b"X-A: b\r\n")
        except OSError:
            pass  # cut: reconnect
        finally:
            sock.close()


def legit_under_trickling(seconds: float, body: bool) -> tuple[int, int]:
    request = json.dumps({"model": "tiny", "prompt": "a b", "max_tokens": 1}).encode()
    with server(max_connections=64) as live:
        stop = threading.Event()
        threads = [threading.Thread(target=trickler, args=(live, stop, body)) for _ in range(64)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # the tricklers hold their connections
        ok = sent = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sent += 1
            try:
                ok += post(live, "/v1/completions", request, "127.0.0.3", timeout=5) == 200
            except OSError:
                pass
            time.sleep(0.05)
        stop.set()
        for thread in threads:
            thread.join()
    return ok, sent


def health_during_large_answer() -> tuple[float, int]:
    body = json.dumps({"prompt": "ab " * 1_000_000, "return_token_strs": True}).encode()
    limits = dict(
        max_body_bytes=4 << 20, max_tokenize_body_bytes=4 << 20, max_tokenize_tokens=4 << 20
    )
    size = [0]
    with server(**limits) as live:

        def answer() -> None:
            client = HttpClient(live.url, timeout=120)
            size[0] = len(client.request("POST", "/tokenize", body, JSON)[2])
            client.close()

        thread = threading.Thread(target=answer)
        client = HttpClient(live.url)
        thread.start()
        worst = 0.0
        while thread.is_alive():
            t0 = time.perf_counter()
            client.request("GET", "/health")
            worst = max(worst, time.perf_counter() - t0)
            time.sleep(0.005)
        client.close()
    return worst, size[0]


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.sized("--seconds", type=float, full=12.0, quick=3.0, help="of trickling, each")
    return parser


def run(args) -> list[Figure]:
    figures = []
    raised = dict(max_tokenize_body_bytes=2 << 20, max_tokenize_tokens=1 << 20)
    alone, behind, statuses = chat_behind_flood(raised)
    print(
        f"100 KB chat: {alone:.2f} s alone, {behind:.2f} s behind 24 x 1 MB /tokenize "
        f"(limits raised, flood answered {sorted(statuses)}); target <= 2 s (was 14.1 s)"
    )
    figures.append(
        Figure(
            "100 KB chat behind 24 x 1 MB /tokenize, limits raised",
            behind,
            "s",
            2.0,
            note=f"{alone:.2f} s alone; flood answered {sorted(statuses)}; was 14.1 s",
        )
    )
    alone, behind, statuses = chat_behind_flood({})
    print(
        f"100 KB chat: {alone:.2f} s alone, {behind:.2f} s behind 24 x 1 MB /tokenize "
        f"(default limits, flood answered {sorted(statuses)}); target <= 2 s"
    )
    figures.append(
        Figure(
            "100 KB chat behind 24 x 1 MB /tokenize, default limits",
            behind,
            "s",
            2.0,
            note=f"{alone:.2f} s alone; flood answered {sorted(statuses)}",
        )
    )
    for body, was in ((False, "6 of 139"), (True, "2 of 140")):
        ok, sent = legit_under_trickling(args.seconds, body)
        what = "bodies" if body else "headers"
        print(
            f"legitimate requests answered 200 in {args.seconds:g} s beside 64 sockets "
            f"trickling their {what} (--max-connections 64): "
            f"{ok} of {sent} ({100 * ok / max(sent, 1):.0f}%); target >= 95% (was {was})"
        )
        figures.append(
            Figure(
                f"legitimate requests answered beside 64 sockets trickling {what}",
                100 * ok / max(sent, 1),
                "%",
                95.0,
                "higher",
                note=f"{ok} of {sent} in {args.seconds:g} s; was {was}",
            )
        )
    worst, size = health_during_large_answer()
    print(
        f"/health worst latency while a {size / 1e6:.1f} MB /tokenize answer is made: "
        f"{1e3 * worst:.0f} ms; target <= 100 ms (was 630 ms)"
    )
    figures.append(
        Figure(
            "/health worst latency during a 10 MB /tokenize answer",
            1e3 * worst,
            "ms",
            100.0,
            note=f"a {size / 1e6:.1f} MB answer; was 630 ms",
        )
    )
    return figures


if __name__ == "__main__":
    bench_main(parser, run)
