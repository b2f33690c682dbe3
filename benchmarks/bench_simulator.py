"""Simulator speed: simulate N requests of the `mixed` profile (target: 100,000 in
<= 10 s on one core, aim <= 4 s), and the cost of one step at 10, 100 and 256 running
sequences, stepped one at a time and taken as decode runs (docs/simulator.md, "Speed").
Prefix caching (on by default) costs at most 1.25x the same simulation without it: both
are timed — side by side on two cores, each pinned to its own, then swapped (alternately
in one process where there is one core) — and their records compared (the profile's
prompts share no prefix, so they must be identical).

Run: .venv/bin/python benchmarks/bench_simulator.py [--requests 100000] [--policy fcfs]
     [--profile mixed] [--plain: also time plain stepping (fast=False)]
     [--quick: 10,000 requests, scaled to 100,000] [--json FILE]
Times are CPU seconds of this process (time.process_time: less swayed by other work on
a shared machine than the wall clock). Prints each figure beside its target; never
fails on time (machines are shared).
"""

from __future__ import annotations

import io
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.cost_model import CostModel
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.factory import build_simulated_engine
from engine.sim.decode_runs import can_start, run_decodes
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.processes.cpu_split import available_cpus
from harness.profiles import resolve_profile, sample_requests
from harness.simulate.driver import simulate

TARGET_S_PER_100K = 10.0
TARGET_CACHING = 1.25
AIM_S_PER_100K = 4.0
RUNNING = (10, 100, 256)
STEPS_PER_SIZE = 400


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.sized("--requests", type=int, full=100_000, quick=10_000)
    parser.add_argument("--policy", default="fcfs")
    parser.add_argument("--profile", default="mixed")
    parser.add_argument(
        "--plain", action="store_true", help="Also time plain stepping (simulate(fast=False))."
    )
    return parser


def _simulate(profile, specs, policy: str, fast: bool, prefix_caching: bool = True):
    config = EngineConfig(
        SchedulerConfig(scheduling_policy=policy),
        CacheConfig(enable_prefix_caching=prefix_caching),
    )
    t0 = time.process_time()
    result = simulate(profile, config, CostModel(), requests=specs, fast=fast)
    return result, time.process_time() - t0


def _steady_engine(num_running: int):
    """An engine with ``num_running`` requests prefilled and decoding (none ends within
    the steps measured), nothing waiting."""
    config = EngineConfig(
        SchedulerConfig(max_num_seqs=num_running), CacheConfig(num_gpu_blocks_override=40_000)
    )
    engine = build_simulated_engine(config, CostModel())
    for i in range(num_running):
        engine.add_request(
            EngineRequest(
                f"r{i}",
                [5] * 64,
                SamplingParams(max_tokens=1024),
                arrival_time=0.0,
                oracle_output_tokens=1024,
            )
        )
    while not can_start(engine):
        engine.step()
    return engine


class _CountingSink:
    """A decode run's sink that only counts the steps."""

    def __init__(self) -> None:
        self.taken = 0

    def step(self, record, num_seqs) -> None:
        self.taken += 1

    def decode_steps(self, steps) -> None:
        self.taken += len(steps.starts)

    def ended(self, step, seqs) -> None:
        pass


def step_costs_us(num_running: int) -> tuple[float, float]:
    """CPU microseconds per step of ``num_running`` decoding sequences: stepped one at a
    time, and taken as a decode run (the same steps: the run stops at the virtual time
    the stepped ones reached)."""
    engine = _steady_engine(num_running)
    start = engine.clock.now()
    t0 = time.process_time()
    for _ in range(STEPS_PER_SIZE):
        engine.step()
    stepped_us = (time.process_time() - t0) / STEPS_PER_SIZE * 1e6
    end = engine.clock.now()
    engine = _steady_engine(num_running)
    assert engine.clock.now() == start
    sink = _CountingSink()
    t0 = time.process_time()
    run_decodes(engine, lambda: end, sink)  # an "arrival" due where the steps ended
    run_us = (time.process_time() - t0) / max(sink.taken, 1) * 1e6
    assert sink.taken == STEPS_PER_SIZE, sink.taken
    return stepped_us, run_us


def run(args) -> list[Figure]:
    profile = resolve_profile(args.profile)
    t0 = time.process_time()
    specs = sample_requests(profile, args.requests)
    t_plan = time.process_time() - t0
    result, elapsed = _simulate(profile, specs, args.policy, fast=True)
    frame = result.requests
    tokens = int(frame["output_tokens"].sum())
    scaled = elapsed * 100_000 / args.requests
    per_step = elapsed / max(result.num_steps, 1) * 1e6
    print(
        f"profile={profile.name} policy={args.policy} requests={frame.height} "
        f"output_tokens={tokens} steps={result.num_steps} virtual_s={result.duration_s:.0f}"
    )
    print(f"schedule generation: {t_plan:.2f} s")
    print(
        f"simulation:          {elapsed:.2f} s  ({frame.height / elapsed:,.0f} requests/s, "
        f"{tokens / elapsed:,.0f} tokens/s, {per_step:.0f} us/step)"
    )
    verdict = "MET" if scaled <= TARGET_S_PER_100K else "MISSED"
    aim = "aim met" if scaled <= AIM_S_PER_100K else "aim missed"
    print(
        f"per 100,000 requests: {scaled:.1f} s   target <= {TARGET_S_PER_100K:.0f} s, "
        f"aim <= {AIM_S_PER_100K:.0f} s   {verdict}, {aim}"
    )
    note = f"{frame.height:,} requests of {profile.name}, policy {args.policy}, CPU s"
    figures = [
        Figure(
            "simulation per 100,000 requests",
            scaled,
            "s",
            TARGET_S_PER_100K,
            aim=AIM_S_PER_100K,
            note=note,
        ),
        Figure("simulation per step", per_step, "us", note=note),
    ]
    if args.plain:
        plain, plain_s = _simulate(profile, specs, args.policy, fast=False)
        same = plain.requests.equals(result.requests) and plain.num_steps == result.num_steps
        print(
            f"plain stepping:      {plain_s:.2f} s  ({plain_s / elapsed:.1f}x the decode runs' "
            f"time; records {'identical' if same else 'DIFFERENT'})"
        )
        figures.append(
            Figure("plain stepping per 100,000 requests", plain_s * 100_000 / args.requests, "s")
        )
    figures.append(caching_cost(profile, specs, args.policy, args.profile))
    for num_running in RUNNING:
        plain_us, run_us = step_costs_us(num_running)
        print(
            f"step at {num_running:>3} running: {plain_us:7.1f} us stepped, "
            f"{run_us:5.1f} us in a decode run"
        )
        figures.append(Figure(f"step at {num_running} running, stepped", plain_us, "us"))
        figures.append(Figure(f"step at {num_running} running, decode run", run_us, "us"))
    return figures


def caching_cost(profile, specs, policy: str, profile_arg: str) -> Figure:
    """The simulation with prefix caching on over the same without it, best of two each
    (``profile_arg``: how the profile was named, for a child process to resolve). Where
    this process may use two cores, the two run side by side, each pinned to its own
    core, then swapped, so the machine's drift (0.8-1.3x between minutes on a shared VM)
    hits both alike; elsewhere they alternate in this process."""
    cpus = available_cpus()
    if len(cpus) >= 2 and hasattr(os, "sched_setaffinity"):
        how = f"side by side on CPU {cpus[0]} and {cpus[1]}, swapped"
        on, off, same = _side_by_side(profile_arg, len(specs), policy, cpus[:2])
    else:
        how = "alternating in one process"
        on, off, same = _alternating(profile, specs, policy)
    ratio = min(on) / min(off)
    verdict = "MET" if ratio <= TARGET_CACHING else "MISSED"
    print(
        f"prefix caching:      on {min(on):.2f} s, off {min(off):.2f} s: {ratio:.2f}x   "
        f"target <= {TARGET_CACHING}x   {verdict}; records "
        f"{'identical' if same else 'DIFFERENT'} (no shared prefix in the profile); {how}"
    )
    return Figure(
        "simulation with prefix caching / without",
        ratio,
        "x",
        TARGET_CACHING,
        note=f"{len(specs):,} requests of {profile.name}, policy {policy}, best of 2 each, " + how,
    )


def _alternating(profile, specs, policy: str) -> tuple[list[float], list[float], bool]:
    on, off = [], []
    same = True
    for _ in range(2):
        result_off, seconds_off = _simulate(profile, specs, policy, True, prefix_caching=False)
        result_on, seconds_on = _simulate(profile, specs, policy, True, prefix_caching=True)
        off.append(seconds_off)
        on.append(seconds_on)
        same = same and _comparable(result_on) == _comparable(result_off)
    return on, off, same


def _comparable(result) -> bytes:
    """The records but the cached-token column, as bytes (what the two must share)."""
    out = io.BytesIO()
    result.requests.drop("cached_tokens").write_ipc(out)
    return out.getvalue()


def _pinned_simulation(profile_name: str, n: int, policy: str, caching: bool, cpu: int):
    """In a child process pinned to ``cpu``: the CPU seconds of one simulation, and its
    records (as :func:`_comparable`)."""
    os.sched_setaffinity(0, {cpu})
    profile = resolve_profile(profile_name)
    result, seconds = _simulate(profile, sample_requests(profile, n), policy, True, caching)
    return seconds, _comparable(result)


def _side_by_side(
    profile_name: str, n: int, policy: str, cpus: tuple[int, ...]
) -> tuple[list[float], list[float], bool]:
    on, off = [], []
    records = set()
    # spawn, not fork: a forked child of a process that ran Polars' threads can hang
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        for on_cpu, off_cpu in ((cpus[0], cpus[1]), (cpus[1], cpus[0])):
            ran_on = pool.submit(_pinned_simulation, profile_name, n, policy, True, on_cpu)
            ran_off = pool.submit(_pinned_simulation, profile_name, n, policy, False, off_cpu)
            for future, times in ((ran_on, on), (ran_off, off)):
                seconds, frame = future.result()
                times.append(seconds)
                records.add(frame)
    return on, off, len(records) == 1


if __name__ == "__main__":
    bench_main(parser, run)
