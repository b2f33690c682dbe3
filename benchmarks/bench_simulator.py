"""Simulator speed: simulate N requests of the default profile (target: 100,000 in <= 60 s).

Run: .venv/bin/python benchmarks/bench_simulator.py [--requests 100000] [--policy fcfs]
     [--quick: 10,000 requests, scaled to 100,000] [--json FILE]
Prints the measured figure beside the target; never fails on time (machines are shared).
"""

from __future__ import annotations

import time

from engine.config import EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.profiles import resolve_profile, sample_requests
from harness.simulate import simulate

TARGET_S_PER_100K = 60.0


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.sized("--requests", type=int, full=100_000, quick=10_000)
    parser.add_argument("--policy", default="fcfs")
    parser.add_argument("--profile", default="default")
    return parser


def run(args) -> list[Figure]:

    profile = resolve_profile(args.profile)
    t0 = time.perf_counter()
    specs = sample_requests(profile, args.requests)
    t_plan = time.perf_counter() - t0
    config = EngineConfig(SchedulerConfig(scheduling_policy=args.policy))
    t0 = time.perf_counter()
    result = simulate(profile, config, CostModel(), requests=specs, record_decisions=True)
    elapsed = time.perf_counter() - t0
    frame = result.requests
    tokens = int(frame["output_tokens"].sum())
    scaled = elapsed * 100_000 / args.requests
    print(
        f"profile={profile.name} policy={args.policy} requests={frame.height} "
        f"output_tokens={tokens} steps={result.num_steps} virtual_s={result.duration_s:.0f}"
    )
    print(f"schedule generation: {t_plan:.2f} s")
    print(
        f"simulation:          {elapsed:.2f} s  ({frame.height / elapsed:,.0f} requests/s, "
        f"{tokens / elapsed:,.0f} tokens/s, {elapsed / max(result.num_steps, 1) * 1e6:.0f} us/step)"
    )
    print(
        f"per 100,000 requests: {scaled:.1f} s   target <= {TARGET_S_PER_100K:.0f} s   "
        f"{'MET' if scaled <= TARGET_S_PER_100K else 'MISSED'}"
    )
    note = f"{frame.height:,} requests of {profile.name}, policy {args.policy}"
    return [
        Figure("simulation per 100,000 requests", scaled, "s", TARGET_S_PER_100K, note=note),
        Figure("simulation per step", elapsed / max(result.num_steps, 1) * 1e6, "us", note=note),
    ]


if __name__ == "__main__":
    bench_main(parser, run)
