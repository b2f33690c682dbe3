"""What hostile bodies cost the server, on an in-process server:

1. A 1 MB gzip body that inflates to 1 GB, with and without a valid API key: the
   status, wall time and CPU the server process spent (was 2.6-3.3 s of CPU when
   aiohttp inflated bodies in full before any check).
2. /health's worst latency while 8 clients send 885 KB wide-and-deep JSON bodies at
   once (was 2.16 s before large bodies were parsed one at a time).

No targets: the figures are printed beside what they were before the fixes.

Run: .venv/bin/python benchmarks/bench_hostile_bodies.py [--json FILE] (about 10 s;
--quick is the same run)
"""

from __future__ import annotations

import resource
import threading
import time
import zlib

from engine.api.server import ServerSettings
from engine.serving.tokenizer import HashTokenizer
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.serve.local_server import BackgroundServer, HttpClient, sim_engine


def gzip_bomb(inflated_bytes: int) -> bytes:
    deflater = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    piece = bytes(1 << 20)
    return (
        b"".join(deflater.compress(piece) for _ in range(inflated_bytes >> 20)) + deflater.flush()
    )


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def parser() -> BenchParser:
    return BenchParser(description=__doc__)  # about 10 s: --quick is the same run


def run(args) -> list[Figure]:
    figures = []
    bomb = gzip_bomb(1 << 30)
    print(f"gzip bomb: {len(bomb) / 1e6:.2f} MB compressed, 1 GiB inflated")
    settings = ServerSettings(port=0, api_key="k")
    with BackgroundServer(sim_engine(), HashTokenizer(4096), settings) as server:
        client = HttpClient(server.url)
        for key in ("k", "wrong"):
            t0, c0 = time.perf_counter(), cpu_s()
            status, _, _ = client.request(
                "POST",
                "/v1/completions",
                bomb,
                {
                    "Authorization": f"Bearer {key}",
                    "Content-Encoding": "gzip",
                    "Content-Type": "application/json",
                },
            )
            wall_ms, cpu_ms = 1e3 * (time.perf_counter() - t0), 1e3 * (cpu_s() - c0)
            label = "valid" if key == "k" else "wrong"
            print(
                f"  key {label}: {status}, {wall_ms:.0f} ms wall, "
                f"{cpu_ms:.0f} ms CPU (was 2,600-3,300 ms CPU)"
            )
            note = f"answered {status}; was 2,600-3,300 ms CPU"
            figures.append(Figure(f"gzip bomb, {label} key: server CPU", cpu_ms, "ms", note=note))
            figures.append(Figure(f"gzip bomb, {label} key: wall", wall_ms, "ms", note=note))
        deep = "[" * 29 + "]" * 29
        body = (
            '{"model":"tiny","prompt":"a b","max_tokens":1,"x":[' + ",".join([deep] * 15000) + "]}"
        ).encode()

        def send() -> None:
            other = HttpClient(server.url)
            other.request(
                "POST",
                "/v1/completions",
                body,
                {"Authorization": "Bearer k", "Content-Type": "application/json"},
            )
            other.close()

        senders = [threading.Thread(target=send) for _ in range(8)]
        for thread in senders:
            thread.start()
        worst = 0.0
        while any(thread.is_alive() for thread in senders):
            t0 = time.perf_counter()
            client.request("GET", "/health")
            worst = max(worst, time.perf_counter() - t0)
            time.sleep(0.01)
        print(
            f"/health worst latency under 8 x {len(body) / 1e3:.0f} KB deep bodies: "
            f"{1e3 * worst:.0f} ms (was 2,160 ms)"
        )
        client.close()
    figures.append(
        Figure(
            "/health worst latency under 8 deep bodies",
            1e3 * worst,
            "ms",
            note=f"8 x {len(body) / 1e3:.0f} KB; was 2,160 ms",
        )
    )
    return figures


if __name__ == "__main__":
    bench_main(parser, run)
