"""Distributed load: the aggregate open-loop rate sustained (p99 send lag <= 5 ms) with
1, 2 and 4 Locust worker processes (``--processes N``: a local master and N workers,
every worker's rows forwarded to the master, harness/loadgen/forward.py), beside the
single process (no master).

The workload and the "sustained" rule are benchmarks/bench_loadgen.py's (streaming
20-token completions, 32-token prompts, Poisson, the ``sim`` server at zero step cost;
a step is sustained when p99 send lag <= 5 ms over every worker's open-loop rows,
nothing waited for the in-flight cap and every request succeeded). The server shares
the machine's cores with the workers, so on a small machine more processes buy little:
the figures are this machine's, printed, never asserted.

Target: none (the single-process figure is the reference printed beside each).

Run: .venv/bin/python benchmarks/bench_distributed.py [--rates 200,400,...] [--seconds 3]
     [--workers 1,2,4] [--quick: rates 200,400,800 for 2 s, workers 1,2] [--json FILE]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_loadgen import PROFILE_TEMPLATE, locust_step, sweep  # noqa: E402


def parser():
    from harness.bench.script import BenchParser

    parser = BenchParser(description=__doc__)
    parser.sized("--rates", full="200,400,600,800,1000,1200,1600,2000", quick="200,400,800")
    parser.sized("--seconds", type=float, full=3.0, quick=2.0)
    parser.sized("--workers", full="1,2,4", quick="1,2")
    return parser


def run(args) -> list:
    from engine.core.cost_model import CostModel
    from harness.bench.figure import Figure
    from harness.serve.local_server import CliServer

    rates = [float(r) for r in args.rates.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-distributed-"))
    CostModel.constant(0.0).save(tmp / "zero.json")
    profile = tmp / "bench_profile.py"
    profile.write_text(PROFILE_TEMPLATE.format(seconds=args.seconds))
    print(
        f"bench_distributed: {os.cpu_count()} cores; bench_loadgen's workload, "
        f"{args.seconds:g} s a step; sustained = p99 send lag <= 5 ms, all ok"
    )
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
    results: dict[str, float] = {}
    with CliServer(server_args) as server:
        results["single process"] = sweep(
            "single process",
            rates,
            lambda r: locust_step(server.url, profile, r, tmp / f"single-{r:g}", "fast"),
        )
        for n in (int(w) for w in args.workers.split(",")):
            name = f"{n} worker(s)"
            results[name] = sweep(
                name,
                rates,
                lambda r, n=n: locust_step(
                    server.url, profile, r, tmp / f"w{n}-{r:g}", "fast", ("--processes", str(n))
                ),
            )
    single = results["single process"]
    print("\naggregate open-loop rate sustained (p99 send lag <= 5 ms):")
    for name, rate in results.items():
        beside = "" if name == "single process" else f"   (single process: {single:.0f} req/s)"
        print(f"  {name:<16} {rate:>6.0f} req/s{beside}")
    print("(the last rate of --rates bounds each figure; the server shares the cores)")
    note = f"p99 send lag <= 5 ms; rates {args.rates}, {args.seconds:g} s each"
    return [
        Figure(f"aggregate sustained open-loop rate, {name}", rate, "req/s", note=note)
        for name, rate in results.items()
    ]


if __name__ == "__main__":
    from harness.bench.script import bench_main

    bench_main(parser, run)
