"""Scheduling cost per step with R running and W waiting requests.

Targets (2-core machine): <= 1 ms per step at R=256, W=10,000; growth from W=100 to
W=10,000 of at most 1.5x (no per-step work proportional to the waiting queue); prefix
caching (on by default) costs at most 1.2x the step without it at R=256, W=10,000.
A step here is Scheduler.schedule() + Scheduler.update() (what the engine adds around
the executor), with every running request decoding and none finishing. Prompts share
no prefix (as independent users' prompts), so the cache costs its bookkeeping and
finds nothing.

lpm ranks a window of the waiting queue (its oldest 128) in every step that has a seat
to fill, one prefix lookup each; with every seat taken (the steps above) it ranks
nothing. So it is measured twice more, beside fcfs, in steps that admit: one running
request finishes in about every step and a waiting one takes its seat (R=256, W=10,000),
once with prompts sharing nothing (each lookup one miss) and once with every prompt
behind one cached 256-token system prompt (each lookup walks 16 blocks). Target: lpm's
step <= 1 ms there too.

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
TARGET_CACHING = 1.2
#: Every policy (lpm ranks nothing in these steps: every seat is taken).
POLICIES = ("fcfs", "sjf", "priority", "lpm")


def prompt(i: int) -> list[int]:
    """32 tokens beginning with one of the request's own (no shared prefix)."""
    return [1000 + i] + [5] * 31


def build(
    policy: str,
    running: int,
    waiting: int,
    max_wait_s: float | None,
    prefix_caching: bool = True,
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=running,
        max_num_batched_tokens=8192,
        max_model_len=1_000_000,
        scheduling_policy=policy,
        max_wait_s=max_wait_s,
    )
    # Blocks for everyone to run for a long time without preemption.
    blocks = BlockManager(
        16,
        num_device_blocks=running * 200 + waiting * 4,
        num_host_blocks=0,
        enable_prefix_caching=prefix_caching,
    )
    scheduler = Scheduler(config, blocks, eos_token_id=2)
    params = SamplingParams(max_tokens=100_000)
    t = 0.0
    for i in range(running):
        scheduler.add(EngineRequest(f"r{i}", prompt(i), params, t, priority=i % 4), t)
        t += 1e-3
    # Admit and prefill them all, then queue the waiting ones behind a full running set.
    for _ in range(4):
        out = scheduler.schedule(t)
        scheduler.update(out, [3] * len(out.seqs), t)
    assert len(scheduler.running) == running, len(scheduler.running)
    for i in range(waiting):
        scheduler.add(EngineRequest(f"w{i}", prompt(running + i), params, t, priority=i % 4), t)
        t += 1e-6
    return scheduler


def build_admitting(policy: str, running: int, waiting: int, shared: int, steps: int) -> Scheduler:
    """R running requests of which about one finishes per step (over ``steps`` steps),
    W waiting to take their seats; every prompt begins with the same ``shared`` tokens
    (0: prompts share nothing), cached once the running requests are prefilled."""
    config = SchedulerConfig(
        max_num_seqs=running,
        max_num_batched_tokens=8192,
        max_model_len=1_000_000,
        scheduling_policy=policy,
    )
    blocks = BlockManager(
        16,
        num_device_blocks=running * 200 + waiting * 4,
        num_host_blocks=0,
        enable_prefix_caching=True,
    )
    scheduler = Scheduler(config, blocks, eos_token_id=2)
    system = [7] * shared
    never = SamplingParams(max_tokens=100_000)
    t = 0.0
    for i in range(running):
        # request i ends ~i * steps / running steps into the timed steps
        params = SamplingParams(max_tokens=8 + i * steps // running)
        scheduler.add(EngineRequest(f"r{i}", system + prompt(i), params, t), t)
        t += 1e-3
    for _ in range(4):
        out = scheduler.schedule(t)
        scheduler.update(out, [3] * len(out.seqs), t)
    assert len(scheduler.running) == running, len(scheduler.running)
    for i in range(waiting):
        scheduler.add(EngineRequest(f"w{i}", system + prompt(running + i), never, t), t)
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
    for policy in POLICIES:
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
    figures += caching_cost(args)
    figures += admitting_cost(args)
    return figures


def admitting_cost(args) -> list[Figure]:
    """fcfs and lpm at R, W=10,000 in steps that admit (one seat freed per step),
    prompts sharing nothing and sharing a cached 256-token system prompt."""
    print(f"\nadmitting one request per step, R={args.running} W=10,000")
    print(f"{'prompts':14} {'fcfs ms':>8} {'lpm ms':>8} {'ratio':>7}   target")
    figures = []
    for label, shared in (("own", 0), ("shared 256", 256)):
        per = {
            policy: time_steps(
                build_admitting(policy, args.running, 10_000, shared, args.steps), args.steps
            )
            for policy in ("fcfs", "lpm")
        }
        ratio = per["lpm"] / per["fcfs"]
        verdict = "MET" if per["lpm"] <= TARGET_MS else "MISSED"
        print(
            f"{label:14} {per['fcfs']:8.3f} {per['lpm']:8.3f} {ratio:6.2f}x   "
            f"lpm <= {TARGET_MS} ms: {verdict}"
        )
        for policy, ms in per.items():
            figures.append(
                Figure(
                    f"ms per admitting step, {policy}, prompts {label}, R={args.running} W=10,000",
                    ms,
                    "ms",
                    TARGET_MS if policy == "lpm" else None,
                    note=f"median of {args.steps} steps; lpm / fcfs {ratio:.2f}x",
                )
            )
    return figures


def caching_cost(args) -> list[Figure]:
    """Each policy's step at R, W=10,000 with prefix caching off and on, measured
    alternately (three rounds each) so the machine's drift falls on both."""
    print(f"\n{'policy':9} {'off ms':>8} {'on ms':>8} {'ratio':>7}   target")
    figures = []
    for policy in POLICIES:
        off, on = [], []
        for _ in range(3):
            off.append(time_steps(build(policy, args.running, 10_000, None, False), args.steps))
            on.append(time_steps(build(policy, args.running, 10_000, None, True), args.steps))
        ratio = statistics.median(on) / statistics.median(off)
        verdict = "MET" if ratio <= TARGET_CACHING else "MISSED"
        print(
            f"{policy:9} {statistics.median(off):8.3f} {statistics.median(on):8.3f} "
            f"{ratio:6.2f}x   <= {TARGET_CACHING}x: {verdict}"
        )
        figures.append(
            Figure(
                f"prefix caching on / off, {policy}, R={args.running} W=10,000",
                ratio,
                "x",
                TARGET_CACHING,
                note=f"medians of 3 alternating rounds of {args.steps} steps",
            )
        )
    return figures


if __name__ == "__main__":
    bench_main(parser, run)
