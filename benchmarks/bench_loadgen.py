"""The load generator's ceiling: the highest open-loop rate one Locust process sends on
schedule (p99 send lag <= 5 ms), beside a plain asyncio/aiohttp open-loop client.

Workload: streaming completions of exactly 20 tokens (32-token prompts as token ids)
from ``schedscope serve --executor sim`` with a zero cost model (every step takes only
the scheduler's Python time), Poisson arrivals. For each client the rate steps up
(--rates) and each step runs --seconds; a step is sustained when its p99 send lag
(``sent_at - scheduled_at``) is <= 5 ms, nothing waited for the in-flight cap, and
every request succeeded. The server shares the machine's cores with the client, as
it would in a one-box test; the figures are this machine's, printed, never asserted.

Clients: ``locust`` with the default geventhttpclient transport (``--http-client
fast``), with ``--http-client requests`` (what Locust's HttpUser uses), and asyncio +
aiohttp (one task per request started at its instant with ``loop.call_at``).

Target (locust-fast): >= 200 req/s, aim >= 500.

Run: .venv/bin/python benchmarks/bench_loadgen.py [--rates 100,200,...] [--seconds 3]
     [--quick: rates 100,200,500 for 2 s, locust-fast and aiohttp] [--json FILE]
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.records.percentiles import percentile  # noqa: E402

TARGET_RATE, AIM_RATE, LAG_LIMIT_S = 200, 500, 0.005

PROFILE_TEMPLATE = """
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass
from harness.loadgen.expose import expose

PROFILE = Profile(
    name="bench_loadgen", seed=1,
    classes=(RequestClass(name="bench", prompt_tokens=LengthDistribution.fixed(32),
                          output_tokens=LengthDistribution.fixed(20)),),
    phases=(Phase(name="open", duration_s={seconds}, rate=1.0),),
)
expose(PROFILE, globals())
"""


def locust_step(
    url: str,
    profile: Path,
    rate: float,
    records: Path,
    http_client: str,
    extra: tuple[str, ...] = (),
) -> dict:
    """One Locust run at ``rate`` (``extra``: more Locust arguments, e.g.
    ``--processes N`` for benchmarks/bench_distributed.py)."""
    from harness.loadgen.merge import merge_records

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [
        str(Path(sys.executable).parent / "locust"),
        "-f",
        str(profile),
        "--host",
        url,
        "--headless",
        "--only-summary",
        "--records-dir",
        str(records),
        "--rate-scale",
        str(rate),
        "--grace",
        "10",
        "--http-client",
        http_client,
        "--loglevel",
        "WARNING",
        *extra,
    ]
    subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    s = merge_records(records)
    return {
        "rate": rate,
        "sent": s["rows"],
        "ok": s["status_counts"].get("ok", 0),
        "p50_lag_s": s["send_lag_p50_s"],
        "p99_lag_s": s["send_lag_p99_s"],
        "capped": s["in_flight_capped"],
    }


async def _aiohttp_run(url: str, rate: float, seconds: float) -> dict:
    import aiohttp

    from harness.loadgen.prompts import token_ids
    from harness.profiles import LengthDistribution, Phase, Profile, RequestClass, build_plan

    profile = Profile(
        name="bench_loadgen",
        seed=1,
        classes=(
            RequestClass(
                name="bench",
                prompt_tokens=LengthDistribution.fixed(32),
                output_tokens=LengthDistribution.fixed(20),
            ),
        ),
        phases=(Phase(name="open", duration_s=seconds, rate=rate),),
    )
    specs = build_plan(profile).open_loop_requests()
    lags: list[float] = []
    ok = 0
    connector = aiohttp.TCPConnector(limit=1000)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(spec, at):
            nonlocal ok
            body = {
                "model": "tiny",
                "prompt": token_ids(spec.request_id, 32),
                "max_tokens": 20,
                "min_tokens": 20,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            }
            lags.append(time.time() - at)
            async with session.post(
                url + "/v1/completions", json=body, headers={"X-Request-Id": spec.request_id}
            ) as r:
                tokens = 0
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        obj = json.loads(line[6:])
                        if obj.get("choices"):
                            tokens = (obj.get("usage") or {}).get("completion_tokens", tokens)
                ok += r.status == 200 and tokens == 20

        # warm up (one request: imports, the first connection), as Locust's probe does
        async with session.post(
            url + "/v1/completions",
            json={"model": "tiny", "prompt": [1000], "max_tokens": 2, "stream": True},
        ) as r:
            await r.read()
        loop = asyncio.get_running_loop()
        start_wall = time.time() + 0.2
        start_loop = loop.time() + 0.2
        tasks = []
        for spec in specs:
            delay = start_loop + spec.scheduled_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(spec, start_wall + spec.scheduled_at)))
        await asyncio.gather(*tasks)
    return {
        "rate": rate,
        "sent": len(specs),
        "ok": ok,
        "p50_lag_s": percentile(lags, 50),
        "p99_lag_s": percentile(lags, 99),
        "capped": 0,
    }


def aiohttp_step(url: str, rate: float, seconds: float) -> dict:
    return asyncio.run(_aiohttp_run(url, rate, seconds))


def sustained(step: dict) -> bool:
    return (
        step["p99_lag_s"] is not None
        and step["p99_lag_s"] <= LAG_LIMIT_S
        and step["capped"] == 0
        and step["ok"] == step["sent"]
    )


def sweep(name: str, rates: list[float], run) -> float:
    best = 0.0
    for rate in rates:
        step = run(rate)
        good = sustained(step)
        print(
            f"  {name:<18} {rate:>6.0f} req/s: sent {step['sent']:>5}, ok {step['ok']:>5}, "
            f"send lag p50 {step['p50_lag_s'] * 1e3:6.2f} ms p99 {step['p99_lag_s'] * 1e3:7.2f} ms"
            f"{'' if good else '  <- not sustained'}",
            flush=True,
        )
        if not good:
            break
        best = rate
    return best


def parser():
    from harness.bench.script import BenchParser

    parser = BenchParser(description=__doc__)
    parser.sized("--rates", full="100,200,300,400,500,600,800,1000", quick="100,200,500")
    parser.sized("--seconds", type=float, full=3.0, quick=2.0)
    parser.sized(
        "--clients", full="locust-fast,locust-requests,aiohttp", quick="locust-fast,aiohttp"
    )
    return parser


def run(args) -> list:
    from harness.bench.figure import Figure

    rates = [float(r) for r in args.rates.split(",")]

    from engine.core.cost_model import CostModel
    from harness.serve.local_server import CliServer

    tmp = Path(tempfile.mkdtemp(prefix="bench-loadgen-"))
    CostModel.constant(0.0).save(tmp / "zero.json")
    profile = tmp / "bench_profile.py"
    profile.write_text(PROFILE_TEMPLATE.format(seconds=args.seconds))
    print(
        f"bench_loadgen: {os.cpu_count()} cores; 20-token streams, 32-token prompts, "
        f"Poisson, {args.seconds:g} s a step; sustained = p99 send lag <= 5 ms, all ok"
    )
    results = {}
    server_args = [
        "--executor",
        "sim",
        "--cost-model",
        str(tmp / "zero.json"),
        "--max-num-seqs",
        "1024",
        "--max-waiting",
        "4096",
        "--no-metrics",
    ]
    with CliServer(server_args) as server:
        for client in args.clients.split(","):
            if client.startswith("locust-"):
                transport = client.split("-", 1)[1]
                results[client] = sweep(
                    client,
                    rates,
                    lambda r, t=transport: locust_step(
                        server.url, profile, r, tmp / f"{t}-{r:g}", t
                    ),
                )
            else:
                results[client] = sweep(
                    client, rates, lambda r: aiohttp_step(server.url, r, args.seconds)
                )
    print("\nhighest sustained open-loop rate (p99 send lag <= 5 ms, one process):")
    for client, rate in results.items():
        note = ""
        if client == "locust-fast":
            note = f"   target >= {TARGET_RATE}, aim >= {AIM_RATE}: " + (
                "met aim" if rate >= AIM_RATE else "met target" if rate >= TARGET_RATE else "MISSED"
            )
        print(f"  {client:<18} {rate:>6.0f} req/s{note}")
    print("(the last rate of --rates bounds the figure; the server shares the cores)")
    bounded = f"p99 send lag <= 5 ms, one process; rates {args.rates}, {args.seconds:g} s each"
    return [
        Figure(
            f"highest sustained open-loop rate, {client}",
            rate,
            "req/s",
            *((TARGET_RATE, "higher", AIM_RATE) if client == "locust-fast" else ()),
            note=bounded,
        )
        for client, rate in results.items()
    ]


if __name__ == "__main__":
    from harness.bench.script import bench_main

    bench_main(parser, run)
