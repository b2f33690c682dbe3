"""What /metrics scrapers cost generation (engine/serving/engine_core.py, "/metrics
never waits on this process").

``schedscope serve --executor sim`` (the engine in its own process, the default) with
``--streams`` streaming requests kept running (each restarted when it ends), then, in
interleaved rounds (medians reported): no scraper; one scraper at one scrape per second
(a Prometheus); and 1, 10 and 50 scrapers each scraping in a loop (half of them asking
for OpenMetrics). For each: the engine's steps/s (from /health), tokens/s received, the
largest inter-token gap of any stream, the scrapes answered and the renders the engine
made (/health ``num_metrics_renders``).

Targets: at most 2% fewer steps/s than without a scraper at one scrape per second; no
stall with 50 scrapers (steps/s and the largest gap about those without a scraper). The
load generator and the scrapers share this process (and the machine's cores) with the
server: on a small machine their own CPU use shows in the figures.

Run: .venv/bin/python benchmarks/bench_metrics_scrapers.py [--streams 200] [--window 5]
[--rounds 3] [--engine-core process|thread] [--quick: 50 streams, 1 round, 3 s warm-up,
2 s windows] [--json FILE]
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time

import aiohttp

from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.serve.local_server import CliServer

TARGET_LOSS_AT_1HZ = 0.02
OPENMETRICS = "application/openmetrics-text"


class Streams:
    """``n`` streaming completions, each restarted when it ends; records every
    inter-token gap (per request, first token excluded) after ``measure_from``."""

    def __init__(self, url: str, n: int, max_tokens: int) -> None:
        self.url, self.n, self.max_tokens = url, n, max_tokens
        self.gaps: list[float] = []
        self.tokens = 0
        self.errors = 0
        self.measuring = False

    async def run(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._one(session, stop) for _ in range(self.n)))

    async def _one(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            # lengths spread over 0.5x..1.5x: the streams end and restart at random
            # moments, not all together (a wave of restarts would land in one scenario)
            body = {
                "model": "tiny",
                "prompt": "a b c d",
                "max_tokens": random.randint(self.max_tokens // 2, self.max_tokens * 3 // 2),
                "ignore_eos": True,
                "stream": True,
            }
            try:
                async with session.post(self.url + "/v1/completions", json=body) as response:
                    if response.status != 200:
                        self.errors += 1
                        await asyncio.sleep(0.1)
                        continue
                    last = None
                    async for line in response.content:
                        if not line.startswith(b"data: {"):
                            continue
                        now = time.monotonic()
                        if self.measuring:
                            self.tokens += 1
                            if last is not None:
                                self.gaps.append(now - last)
                        last = now
                        if stop.is_set():
                            break
            except aiohttp.ClientError:
                self.errors += 1


async def scraper(
    session: aiohttp.ClientSession,
    url: str,
    stop: asyncio.Event,
    answers: list[int],
    accept: str | None,
    period_s: float = 0.0,
) -> None:
    headers = {"Accept": accept} if accept else {}
    while not stop.is_set():
        started = time.monotonic()
        async with session.get(url + "/metrics", headers=headers) as response:
            await response.read()
            answers.append(response.status)
        if period_s:
            await asyncio.sleep(max(0.0, period_s - (time.monotonic() - started)))
        else:
            await asyncio.sleep(0)


async def health(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url + "/health") as response:
        return json.loads(await response.read())


async def scenario(
    session: aiohttp.ClientSession,
    url: str,
    streams: Streams,
    num_scrapers: int,
    period_s: float,
    window_s: float,
) -> dict:
    stop = asyncio.Event()
    answers: list[int] = []
    tasks = [
        asyncio.create_task(
            scraper(session, url, stop, answers, OPENMETRICS if i % 2 else None, period_s)
        )
        for i in range(num_scrapers)
    ]
    await asyncio.sleep(1.0)  # settle
    before, started = await health(session, url), time.monotonic()
    streams.gaps, streams.tokens, streams.measuring = [], 0, True
    num_answers = len(answers)
    await asyncio.sleep(window_s)
    streams.measuring = False
    after, elapsed = await health(session, url), time.monotonic() - started
    scraped = answers[num_answers:]
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    gaps = sorted(streams.gaps)
    return {
        "steps_per_s": (after["num_steps"] - before["num_steps"]) / elapsed,
        "tokens_per_s": streams.tokens / elapsed,
        "max_gap_s": gaps[-1] if gaps else float("nan"),
        "p99_gap_s": gaps[int(0.99 * (len(gaps) - 1))] if gaps else float("nan"),
        "scrapes": len(scraped),
        "non_200": sum(1 for s in scraped if s != 200),
        "renders": after["num_metrics_renders"] - before["num_metrics_renders"],
        "elapsed_s": elapsed,
    }


SCENARIOS = (
    ("0 scrapers", 0, 0.0),
    ("1 scraper at 1/s", 1, 1.0),
    ("1 scraper, loop", 1, 0.0),
    ("10 scrapers, loop", 10, 0.0),
    ("50 scrapers, loop", 50, 0.0),
    ("0 scrapers, again", 0, 0.0),
)


def format_row(label: str, row: dict) -> str:
    return (
        f"{label:<18} {row['steps_per_s']:6.2f} steps/s {row['tokens_per_s']:6.0f} tok/s"
        f"  max gap {row['max_gap_s'] * 1000:6.1f} ms  p99 {row['p99_gap_s'] * 1000:6.1f} ms"
        f"  scrapes {row['scrapes']:6d} (non-200 {row['non_200']})  renders {row['renders']:3d}"
    )


def median_row(rows: list[dict]) -> dict:
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


async def one_round(url: str, args) -> list[tuple[str, dict]]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        streams = Streams(url, args.streams, args.max_tokens)
        stop = asyncio.Event()
        load = asyncio.create_task(streams.run(session, stop))
        # until the streams' lengths (hence the step's cost, which grows with the
        # context) are stationary: a few request lifetimes
        await asyncio.sleep(args.warmup)
        results = []
        for label, n, period in SCENARIOS:
            row = await scenario(session, url, streams, n, period, args.window)
            results.append((label, row))
            print(f"  {format_row(label, row)}", flush=True)
        stop.set()
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
        if streams.errors:
            print(f"  stream errors: {streams.errors}")
    return results


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.sized("--streams", type=int, full=200, quick=50)
    parser.add_argument("--max-tokens", type=int, default=100, help="mean; 0.5x..1.5x")
    parser.sized("--warmup", type=float, full=10.0, quick=3.0, help="seconds")
    parser.sized("--window", type=float, full=5.0, quick=2.0, help="seconds per scenario")
    parser.sized("--rounds", type=int, full=3, quick=1)
    parser.add_argument("--engine-core", default="process", choices=["process", "thread"])
    return parser


def run(args) -> list[Figure]:
    serve = ["--executor", "sim", "--engine-core", args.engine_core]
    print(
        f"schedscope serve --executor sim --engine-core {args.engine_core}, {args.streams} "
        f"streams, {args.window:.0f} s per scenario, {args.rounds} rounds"
    )
    rounds: dict[str, list[dict]] = {label: [] for label, _, _ in SCENARIOS}
    for number in range(args.rounds):
        # a fresh server each round: the no-scraper baseline runs before any format was
        # ever asked for (none is rendered then)
        print(f"round {number + 1}/{args.rounds}", flush=True)
        with CliServer(serve) as server:
            for label, row in asyncio.run(one_round(server.url, args)):
                rounds[label].append(row)
    results = [(label, median_row(rows)) for label, rows in rounds.items()]
    print(f"\nmedians of {args.rounds} rounds:")
    for label, row in results:
        print(f"  {format_row(label, row)}")
    first, again = results[0][1], results[-1][1]
    base = {key: (first[key] + again[key]) / 2 for key in first}  # before and after
    print(f"baseline (no scraper, before and after): {base['steps_per_s']:.2f} steps/s")
    for label, row in results[1:-1]:
        loss = 1 - row["steps_per_s"] / base["steps_per_s"]
        print(f"{label:<18} throughput loss {loss * 100:5.1f}%  max gap {row['max_gap_s']:.3f} s")
    loss_1hz = 1 - results[1][1]["steps_per_s"] / base["steps_per_s"]
    print(
        f"target: <= {TARGET_LOSS_AT_1HZ * 100:.0f}% loss at one scrape/s "
        f"(measured {loss_1hz * 100:.1f}%); no stall at 50 scrapers "
        f"(max gap {results[4][1]['max_gap_s']:.3f} s; {base['max_gap_s']:.3f} s without)"
    )
    size = f"{args.streams} streams, {args.rounds} round(s) of {args.window:g} s"
    figures = [
        Figure("steps/s without a scraper", base["steps_per_s"], "steps/s", note=size),
        Figure("max inter-token gap without a scraper", base["max_gap_s"] * 1e3, "ms"),
    ]
    for label, row in results[1:-1]:
        loss = 100 * (1 - row["steps_per_s"] / base["steps_per_s"])
        target = TARGET_LOSS_AT_1HZ * 100 if label == "1 scraper at 1/s" else None
        figures.append(Figure(f"throughput loss, {label}", loss, "%", target))
        figures.append(Figure(f"max inter-token gap, {label}", row["max_gap_s"] * 1e3, "ms"))
    return figures


if __name__ == "__main__":
    bench_main(parser, run)
