"""Scheduling cost per step with R running and W waiting requests.

Targets (2-core machine): <= 1 ms per step at R=256, W=10,000; growth from W=100 to
W=10,000 of at most 1.5x (no per-step work proportional to the waiting queue).
A step here is Scheduler.schedule() + Scheduler.update() (what the engine adds around
the executor), with every running request decoding and none finishing.

Run: .venv/bin/python benchmarks/bench_scheduler.py [--json FILE] (seconds; --quick is the
same run)
"""

from __future__ import annotations

import statistics
import time

from engine.config import SchedulerConfig
from engine.core.block_manager import BlockManager
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.core.sched.scheduler import Scheduler
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main

TARGET_MS = 1.0
TARGET_GROWTH = 1.5


def build(policy: str, running: int, waiting: int, max_wait_s: float | None) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=running,
        max_num_batched_tokens=8192,
        max_model_len=1_000_000,
        scheduling_policy=policy,
        max_wait_s=max_wait_s,
    )
    # Blocks for everyone to run for a long time without preemption.
    blocks = BlockManager(16, num_device_blocks=running * 200 + waiting * 4, num_host_blocks=0)
    scheduler = Scheduler(config, blocks, eos_token_id=2)
    params = SamplingParams(max_tokens=100_000)
    t = 0.0
    for i in range(running):
        scheduler.add(EngineRequest(f"r{i}", [5] * 32, params, t, priority=i % 4), t)
        t += 1e-3
    # Admit and prefill them all, then queue the waiting ones behind a full running set.
    for _ in range(4):
        out = scheduler.schedule(t)
        scheduler.update(out, [3] * len(out.seqs), t)
    assert len(scheduler.running) == running, len(scheduler.running)
    for i in range(waiting):
        scheduler.add(EngineRequest(f"w{i}", [5] * 32, params, t, priority=i % 4), t)
        t += 1e-6
    return scheduler


def time_steps(scheduler: Scheduler, steps: int) -> float:
    """Median milliseconds per step over ``steps`` steps."""
    samples = []
    t = 10.0
    for _ in range(steps):
        start = time.perf_counter()
        out = scheduler.schedule(t)
        scheduler.update(out, [3] * len(out.seqs), t)
        samples.append((time.perf_counter() - start) * 1e3)
        t += 0.01
    return statistics.median(samples)


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.add_argument("--running", type=int, default=256)
    parser.add_argument("--steps", type=int, default=300)
    return parser


def run(args) -> list[Figure]:
    figures = []
    print(f"{'policy':9} {'max_wait':>8} {'W':>7} {'ms/step':>8}   target")
    for policy in ("fcfs", "sjf", "priority"):
        for max_wait in (None, 3600.0):
            per_w = {}
            for waiting in (100, 10_000):
                scheduler = build(policy, args.running, waiting, max_wait)
                per_w[waiting] = time_steps(scheduler, args.steps)
                verdict = "MET" if per_w[waiting] <= TARGET_MS else "MISSED"
                print(
                    f"{policy:9} {str(max_wait):>8} {waiting:>7} {per_w[waiting]:8.3f}   "
                    f"<= {TARGET_MS} ms at R={args.running}: {verdict}"
                )
            growth = per_w[10_000] / per_w[100]
            print(
                f"{'':9} {'':>8} {'growth':>7} {growth:8.2f}x  <= {TARGET_GROWTH}x: "
                f"{'MET' if growth <= TARGET_GROWTH else 'MISSED'}"
            )
            label = f"{policy}{'' if max_wait is None else f', max_wait {max_wait:g} s'}"
            for waiting, ms in per_w.items():
                figures.append(
                    Figure(
                        f"ms per step, {label}, R={args.running} W={waiting:,}",
                        ms,
                        "ms",
                        TARGET_MS,
                        note=f"median of {args.steps} steps",
                    )
                )
            figures.append(Figure(f"growth W=100 to W=10,000, {label}", growth, "x", TARGET_GROWTH))
    return figures


if __name__ == "__main__":
    bench_main(parser, run)
