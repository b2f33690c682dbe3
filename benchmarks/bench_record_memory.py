"""What the engine process's memory does over a long served run with records on
(harness/records/incremental.py: records are written as the engine runs).

``schedscope serve --executor sim`` with ``--record-steps``, ``--record-requests`` and
``--record-decisions`` (and, for comparison, without them), driven with ``--requests``
short completions from ``--concurrency`` clients. The engine process's resident memory
is read after a warm-up tenth of the requests and again at the end; the growth per
request is the figure. Target: at most 0.1 KB per request with records on (they used
to be held in memory until shutdown: ~1.9 KB per request, +38.7 MB after 20,000), and
about what the server grows without records.

Run: .venv/bin/python benchmarks/bench_record_memory.py [--requests 20000] [--concurrency 32]
     [--quick: 5,000 requests; growth over fewer requests is noisier] [--json FILE]
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import aiohttp
import polars as pl
import psutil

from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.serve.local_server import CliServer

TARGET_KB_PER_REQUEST = 0.1
BODY = {"model": "tiny", "prompt": "a b c d", "max_tokens": 4, "ignore_eos": True}


async def send(url: str, count: int, concurrency: int, first_id: int) -> int:
    ok = 0
    next_id = first_id
    end = first_id + count

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal ok, next_id
        while next_id < end:
            request_id = f"r{next_id}"
            next_id += 1
            async with session.post(
                url + "/v1/completions", json=BODY, headers={"X-Request-Id": request_id}
            ) as response:
                await response.read()
                ok += response.status == 200

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return ok


def engine_rss(server: CliServer) -> int:
    children = psutil.Process(server.process.pid).children()
    (core,) = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
    return core.memory_info().rss


def measure(records: bool, num_requests: int, concurrency: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        files = {name: Path(tmp) / f"{name}.parquet" for name in ("steps", "requests", "decisions")}
        args = ["--executor", "sim"]
        if records:
            for name, path in files.items():
                args += [f"--record-{name}", str(path)]
        with CliServer(args) as server:
            warm = num_requests // 10
            ok = asyncio.run(send(server.url, warm, concurrency, 0))
            time.sleep(2.5)  # a flush interval: the warm-up's rows written out
            before = engine_rss(server)
            started = time.monotonic()
            ok += asyncio.run(send(server.url, num_requests - warm, concurrency, warm))
            elapsed = time.monotonic() - started
            time.sleep(2.5)
            after = engine_rss(server)
            server.terminate()
            code = server.wait(120)
        rows = pl.read_parquet(files["requests"]).height if records else None
    growth = (after - before) / 1024 / (num_requests - warm)
    return {"ok": ok, "rows": rows, "code": code, "kb_per_request": growth, "s": elapsed}


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.sized("--requests", type=int, full=20_000, quick=5_000)
    parser.add_argument("--concurrency", type=int, default=32)
    return parser


def run(args) -> list[Figure]:
    figures = []
    for records in (False, True):
        result = measure(records, args.requests, args.concurrency)
        label = "records on " if records else "records off"
        print(
            f"{label}: {result['ok']} of {args.requests} ok in {result['s']:.0f} s; "
            f"engine RSS growth {result['kb_per_request']:.3f} KB/request "
            f"(target <= {TARGET_KB_PER_REQUEST} KB with records); "
            f"requests.parquet rows {result['rows']}; exit {result['code']}"
        )
        figures.append(
            Figure(
                f"engine RSS growth per request, records {'on' if records else 'off'}",
                result["kb_per_request"],
                "KB",
                TARGET_KB_PER_REQUEST if records else None,
                note=f"{result['ok']} of {args.requests} ok; server exit {result['code']}",
            )
        )
    return figures


if __name__ == "__main__":
    bench_main(parser, run)
