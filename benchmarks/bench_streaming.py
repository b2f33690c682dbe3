"""Streaming overhead of the HTTP server: tokens/s streamed to 64 concurrent SSE clients.

The engine is the sim executor with a zero cost model (every step takes only the
scheduler's own Python time), so what is measured is the serving path: engine thread ->
asyncio queues -> detokenize -> JSON -> SSE writes. The server runs in this process (its
event loop on the main thread, the engine on its own thread); the aiohttp clients run in
a separate process so they do not compete with the server for the GIL.

Target (2-core machine): >= 10,000 streamed tokens/s. Timing is printed, never asserted.
With --profile, the server's event-loop thread runs under cProfile and the top
functions by own time are printed: they name what limits the figure.

Run: .venv/bin/python benchmarks/bench_streaming.py [--streams 64] [--seconds 5] [--profile]
     [--quick: 3 s] [--json FILE]
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import json
import multiprocessing
import pstats
import time

from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main

TARGET_TOKENS_PER_S = 10_000


# -- the client process ------------------------------------------------------------------
def client_main(url: str, streams: int, seconds: float, max_tokens: int, out) -> None:
    out.put(asyncio.run(_clients(url, streams, seconds, max_tokens)))


async def _clients(url: str, streams: int, seconds: float, max_tokens: int) -> dict:
    import aiohttp

    body = {
        "model": "tiny",
        "prompt": "the quick brown fox",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    totals = {"tokens": 0, "events": 0, "requests": 0}
    deadline = time.perf_counter() + seconds

    async def one_client(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < deadline:
            async with session.post(url + "/v1/completions", json=body) as response:
                assert response.status == 200, await response.text()
                async for line in response.content:
                    if not line.startswith(b"data: "):
                        continue
                    totals["events"] += 1
                    if line.startswith(b'data: {"id"') and b'"choices":[]' in line:
                        totals["tokens"] += json.loads(line[6:])["usage"]["completion_tokens"]
            totals["requests"] += 1

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(one_client(session) for _ in range(streams)))
        totals["seconds"] = time.perf_counter() - started
    return totals


# -- the server (this process) -----------------------------------------------------------
async def serve_and_measure(args) -> tuple[dict, dict, cProfile.Profile | None]:
    from engine.api.server import ApiServer, ServerSettings
    from engine.serving.async_engine import AsyncEngine
    from engine.serving.tokenizer import HashTokenizer
    from harness.serve.local_server import sim_engine

    engine = sim_engine(
        step_s=0.0, num_device_blocks=65536, max_model_len=args.max_tokens + 16, max_num_seqs=256
    )
    async_engine = AsyncEngine(engine)
    server = ApiServer(
        async_engine,
        HashTokenizer(4096),
        ServerSettings(host="127.0.0.1", port=0, shutdown_timeout_s=2.0),
    )
    url = await server.start()
    results = multiprocessing.get_context("spawn").Queue()
    client = multiprocessing.get_context("spawn").Process(
        target=client_main, args=(url, args.streams, args.seconds, args.max_tokens, results)
    )
    profile = cProfile.Profile() if args.profile else None
    client.start()
    steps_before = async_engine.stats.num_steps
    if profile:
        profile.enable()
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    totals = await loop.run_in_executor(None, results.get)
    elapsed = time.perf_counter() - started
    if profile:
        profile.disable()
    steps = async_engine.stats.num_steps - steps_before
    client.join(10)
    await server.stop()
    return totals, {"steps": steps, "elapsed": elapsed}, profile


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=64)
    parser.sized("--seconds", type=float, full=5.0, quick=3.0)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument(
        "--profile", action="store_true", help="profile the server's event loop (costs throughput)"
    )
    return parser


def run(args) -> list[Figure]:

    totals, engine, profile = asyncio.run(serve_and_measure(args))
    rate = totals["tokens"] / totals["seconds"]
    print(
        f"bench_streaming: {args.streams} concurrent SSE streams, sim executor at zero step "
        f"cost, {args.max_tokens} tokens per request; clients in a separate process"
    )
    print(f"  completed requests     {totals['requests']}")
    print(
        f"  streamed tokens/s      {rate:10,.0f}   target >= {TARGET_TOKENS_PER_S:,}  "
        f"{'OK' if rate >= TARGET_TOKENS_PER_S else 'BELOW TARGET'}"
    )
    print(
        f"  SSE events/s           {totals['events'] / totals['seconds']:10,.0f}   "
        f"({totals['tokens'] / max(totals['events'], 1):.2f} tokens per event)"
    )
    print(
        f"  engine steps/s         {engine['steps'] / engine['elapsed']:10,.0f}   "
        f"({totals['tokens'] / max(engine['steps'], 1):.1f} streamed tokens per step)"
    )
    if profile is not None:
        stream = io.StringIO()
        stats = pstats.Stats(profile, stream=stream).sort_stats("tottime")
        stats.print_stats(12)
        print("\nserver event loop, top functions by own time (cProfile):")
        print("\n".join(stream.getvalue().splitlines()[6:22]))
        top = max(stats.stats.items(), key=lambda item: item[1][2])
        (filename, line, name), (_, _, tottime, _, _) = top
        print(
            f"top item: {name} ({filename}:{line}), {tottime:.2f} s own time of "
            f"{engine['elapsed']:.2f} s"
        )
    note = f"{args.streams} streams for {args.seconds:g} s{', profiled' if profile else ''}"
    return [
        Figure("streamed tokens/s", rate, "tokens/s", TARGET_TOKENS_PER_S, "higher", note=note),
        Figure("SSE events/s", totals["events"] / totals["seconds"], "events/s", note=note),
        Figure("engine steps/s", engine["steps"] / engine["elapsed"], "steps/s", note=note),
    ]


if __name__ == "__main__":
    bench_main(parser, run)
