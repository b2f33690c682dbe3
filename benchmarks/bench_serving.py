"""Served vs offline vs simulated: one schedule, three ways, side by side in one run.

The default profile's exact schedule (``--rate-scale``, the first ``--duration-s``
seconds), every request with ``max_tokens`` = its true output length and
``ignore_eos`` (so all three runs generate the same tokens):

- offline: ``LLMEngine`` with the torch executor, driven in this process at the
  scheduled instants (no HTTP, tokens "received" when their step ends);
- served: ``schedscope serve --executor torch`` in a subprocess, the same schedule
  sent open loop, request for request (streaming, prompt token ids, latency from the
  scheduled instant) by ``--client``: ``locust`` (the default), the load generator of
  ``schedscope run`` in its own process, the schedule written as a trace profile, so
  the engine shares the machine with what a run shares it with, the regime the
  simulator predicts; or ``replay``, a light asyncio client in this process (on 2 cores
  the engine's steps are 14-22% faster beside it: docs/simulator.md), the fairer bar
  for served vs offline;
- simulated: ``harness.simulate.driver`` with the given cost model (default: the built-in and,
  when ``schedscope calibrate`` stored one, this machine's fit), and, when the served
  run's step records are there, a cost model fitted from them (in sample).

Targets: served E2E p50/p95 and throughput within 15% of offline (aim 5%); simulated
p50/p95 TTFT and E2E per class within 15% of served. Prints measured beside target and
where the served step cycle goes (schedule, execute, post-step, idle). Never fails on
time (machines are shared): it reports.

With ``--repeats N`` the served and offline runs alternate N times (served, offline,
served, ...), so a slow minute on a shared machine hits both alike: served vs offline is
the median of the N paired ratios, the simulator is compared with the median of the N
served runs, and every figure prints the served runs' own range beside it (a simulated
value inside that range is within run-to-run noise). ``--rank-policies`` runs each
policy N times round-robin and calls two policies tied unless their served runs' ranges
are disjoint (with N >= 3), or when no request of either ever waited after a step (the
policy was never consulted).

Run: .venv/bin/python benchmarks/bench_serving.py [--rate-scale 0.3] [--duration-s 40]
     [--repeats 3] [--client locust|replay] [--rank-policies fcfs,sjf,priority] [--device cpu|cuda]
     [--quick: the first 15 s of the schedule] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.clock import WallClock
from engine.core.cost_model import CostModel
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.worker.model_config import ModelConfig
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main
from harness.loadgen import open_loop_client
from harness.loadgen.open_loop_client import prompt_ids, replay
from harness.processes.cpu_split import CpuSplitError, parse_cpu_split
from harness.profiles import RequestSpec, build_plan, resolve_profile
from harness.profiles.schedule_file import write_schedule_profile, written_schedule
from harness.records.percentiles import percentile
from harness.serve.local_server import CliServer
from harness.simulate.driver import simulate

TARGET_SERVED_VS_OFFLINE = 0.15
AIM_SERVED_VS_OFFLINE = 0.05
TARGET_SIM_VS_SERVED = 0.15
#: Served p95s of the policies closer than this (relative spread) are a tie: run-to-run
#: noise on a shared machine is about that large.
RANK_TIE = 0.15


def schedule(rate_scale: float, duration_s: float, seed: int | None) -> list[RequestSpec]:
    profile = resolve_profile("default").with_rate_scale(rate_scale)
    specs = [
        s for s in build_plan(profile, seed).open_loop_requests() if s.scheduled_at < duration_s
    ]
    # Exact output lengths in every run: the request asks for its true length.
    return [dataclasses.replace(s, max_tokens=s.output_tokens) for s in specs]


def engine_config(args) -> EngineConfig:
    return EngineConfig(SchedulerConfig(scheduling_policy=args.policy), CacheConfig())


# -- offline ----------------------------------------------------------------------------
def run_offline(
    specs: list[RequestSpec], config: EngineConfig, threads: int, steps_file: Path, device: str
) -> pl.DataFrame:
    import torch

    from engine.factory import build_torch_engine

    torch.set_num_threads(threads)  # as the server runs it

    from harness.records.steps import StepLog

    engine = build_torch_engine(config, WallClock(), device=device)
    step_log = engine.observers.add(StepLog())
    vocab = engine.model_config.vocab_size
    clock = engine.clock
    seqs = {}
    pending = list(specs)
    idle = 0.0
    start = clock.now()
    while pending or engine.has_work():
        now = clock.now() - start
        while pending and pending[0].scheduled_at <= now:
            spec = pending.pop(0)
            seqs[spec.request_id] = (
                spec,
                engine.add_request(
                    EngineRequest(
                        spec.request_id,
                        prompt_ids(spec, vocab),
                        # the served requests' sampling: the server's default
                        # temperature (1.0, OpenAI's), not greedy decoding
                        SamplingParams(
                            max_tokens=spec.max_tokens, ignore_eos=True, temperature=1.0
                        ),
                        arrival_time=start + spec.scheduled_at,
                        priority=spec.priority,
                        request_class=spec.class_name,
                    )
                ),
            )
        if engine.has_work():
            engine.step(idle_before_s=idle)
            idle = 0.0
        elif pending:
            before = clock.now()
            time.sleep(max(0.0, pending[0].scheduled_at - (clock.now() - start)))
            idle += clock.now() - before
    step_log.write(steps_file)
    rows = []
    for spec, seq in seqs.values():
        t = seq.timing
        arrival = start + spec.scheduled_at
        rows.append(
            {
                "request_id": spec.request_id,
                "class": spec.class_name,
                "output_tokens": seq.num_output_tokens,
                "ttft_s": t.first_token_time - arrival,
                "e2e_s": t.last_token_time - arrival,
            }
        )
    return pl.DataFrame(rows)


# -- served -----------------------------------------------------------------------------
def run_served(specs: list[RequestSpec], args, steps_file: Path) -> tuple[pl.DataFrame, float]:
    """Client rows (request_id, class, output_tokens, ttft_s, e2e_s, sent_unix,
    first_unix) and the client's p99 send lag; the server's step and request records
    land beside ``steps_file``."""
    from harness.serve.local_server import HttpClient

    vocab = ModelConfig.preset("tiny").vocab_size
    server_args = [
        "--executor",
        "torch",
        "--scheduling-policy",
        args.policy,
        "--record-steps",
        str(steps_file),
        "--record-requests",
        str(steps_file.with_name("requests.parquet")),
        *args.serve_args,
    ]
    # the server takes CUDA when it sees it: hide it for a CPU run
    env = {"CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else None
    split = args.split
    serve_cpus, load_cpus = (split.serve, split.load_generator) if split else (None, None)
    with CliServer(server_args, env=env, start_timeout_s=120, cpus=serve_cpus) as server:
        if args.client == "locust":
            rows, lag_p99 = drive_locust(
                server.url, specs, args.schedule_file, steps_file.parent, load_cpus
            )
        else:
            with on_cpus(load_cpus):  # the client runs in this process: its thread moves
                rows, lag_p99 = asyncio.run(replay(server.url, specs, vocab))
            rows = pl.DataFrame(rows)
        epoch = json.loads(HttpClient(server.url).request("GET", "/health")[2])["clock_epoch_unix"]
    steps_file.with_name("epoch.json").write_text(json.dumps({"clock_epoch_unix": epoch}))
    return rows, lag_p99


@contextlib.contextmanager
def on_cpus(cpus: tuple[int, ...] | None):
    """This thread on ``cpus`` for the block (nothing when None), then back."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def drive_locust(
    url: str,
    specs: list[RequestSpec],
    schedule_file: Path,
    run_dir: Path,
    cpus: tuple[int, ...] | None = None,
) -> tuple[pl.DataFrame, float]:
    """The schedule sent by Locust (``schedscope run``'s load generator); its records in
    ``run_dir/locust``. Every request must come back ok."""
    from harness.run.loadgen import drive_to_end

    load = drive_to_end(
        schedule_file,
        url,
        run_dir / "locust",
        limit_s=specs[-1].scheduled_at + 660.0,
        grace_s=600.0,  # every request ends: a cut one would bias the latencies
        cpus=cpus,
    )
    client = load.client
    failed = client.filter(pl.col("status") != "ok")
    if failed.height:
        raise SystemExit(
            f"{failed.height} of {client.height} requests not ok: "
            f"{failed.group_by('status').len().rows()}; first error: {failed['error'][0]}"
        )
    rows = client.select(
        "request_id",
        "class",
        "output_tokens",
        "ttft_s",
        "e2e_s",
        pl.col("sent_at").alias("sent_unix"),
        pl.col("first_token_at").alias("first_unix"),
    )
    return rows, float(load.summary.get("send_lag_p99_s") or 0.0)


def client_latency(served: pl.DataFrame, steps_file: Path) -> dict | None:
    """Median time outside the engine (intake + delivery) of one served run, from the
    client's rows and the engine's records beside ``steps_file``."""
    epoch = json.loads(steps_file.with_name("epoch.json").read_text())["clock_epoch_unix"]
    return open_loop_client.client_latency(served, steps_file.with_name("requests.parquet"), epoch)


# -- report -----------------------------------------------------------------------------
Percentiles = dict[tuple[str, str], dict[str, float]]


def percentiles(frame: pl.DataFrame) -> Percentiles:
    out = {}
    for cls in ["all", *sorted(frame["class"].unique())]:
        part = frame if cls == "all" else frame.filter(pl.col("class") == cls)
        for metric in ("ttft_s", "e2e_s"):
            values = part[metric].drop_nulls().to_numpy()
            out[(cls, metric)] = {
                "p50": percentile(values, 50),
                "p95": percentile(values, 95),
            }
    return out


def across(runs: list[Percentiles]) -> tuple[Percentiles, Percentiles, Percentiles]:
    """(median, min, max) of each percentile over repeated runs of one schedule."""

    def reduce(fn) -> Percentiles:
        return {k: {q: float(fn([r[k][q] for r in runs])) for q in ("p50", "p95")} for k in runs[0]}

    return reduce(np.median), reduce(min), reduce(max)


def throughput(frame: pl.DataFrame, specs: list[RequestSpec]) -> float:
    """Output tokens per second over the schedule's span plus the last completion."""
    span = max(s.scheduled_at for s in specs) + frame["e2e_s"].max()
    return float(frame["output_tokens"].sum()) / span


def verdict(err: float, target: float) -> str:
    return "MET" if err <= target else "MISSED"


def compare(
    name: str,
    got: Percentiles,
    ref: Percentiles,
    target: float,
    band: tuple[Percentiles, Percentiles] | None = None,
    label: str = "",
) -> list[Figure]:
    """``got`` against ``ref`` (the served median); ``band``: the served runs' range.
    Prints a line and returns a figure (named after ``label``) per class x metric x q."""
    figures = []
    for key in sorted(ref):
        cls, metric = key
        for q in ("p50", "p95"):
            g, r = got[key][q], ref[key][q]
            err = abs(g - r) / r if r else 0.0
            note = ""
            if band is not None:
                lo, hi = band[0][key][q], band[1][key][q]
                inside = lo <= g <= hi
                note = f"  served range {lo:.3f}..{hi:.3f}{' (inside)' if inside else ''}"
            print(
                f"  {name:20} {cls:16} {metric:7} {q}: {g:8.3f} s vs {r:8.3f} s  "
                f"error {err:6.1%}  target <= {target:.0%}: {verdict(err, target)}{note}"
            )
            figures.append(
                Figure(
                    f"{label or name} {cls} {metric} {q} error",
                    err * 100,
                    "%",
                    target * 100,
                    note=f"{g:.3f} s vs {r:.3f} s{note}",
                )
            )
    return figures


def compare_paired(
    served: list[Percentiles], offline: list[Percentiles], target: float
) -> list[Figure]:
    """Served against offline, run by run (each served run with the offline run next to
    it): the median of the paired ratios, and their range."""
    figures = []
    for key in sorted(offline[0]):
        if key[1] != "e2e_s":
            continue
        for q in ("p50", "p95"):
            ratios = [
                s[key][q] / o[key][q] for s, o in zip(served, offline, strict=True) if o[key][q]
            ]
            ratio = float(np.median(ratios))
            err = abs(ratio - 1)
            print(
                f"  served/offline       {key[0]:16} e2e_s   {q}: ratio {ratio:6.3f} "
                f"(runs {min(ratios):.3f}..{max(ratios):.3f})  error {err:6.1%}  "
                f"target <= {target:.0%}: {verdict(err, target)}"
            )
            figures.append(
                Figure(
                    f"served/offline {key[0]} e2e_s {q} error",
                    err * 100,
                    "%",
                    target * 100,
                    aim=AIM_SERVED_VS_OFFLINE * 100,
                    note=f"ratio {ratio:.3f} (runs {min(ratios):.3f}..{max(ratios):.3f})",
                )
            )
    return figures


def step_cycle(steps_file: Path, name: str = "served") -> None:
    """Where the engine's time went, from its step records."""
    if not steps_file.exists():
        print(f"  (no {name} step records)")
        return
    f = pl.read_parquet(steps_file).sort("step")
    schedule_s = (f["execute_start"] - f["schedule_start"]).sum()
    execute_s = (f["execute_end"] - f["execute_start"]).sum()
    cycle = f["schedule_start"].shift(-1) - f["schedule_start"]
    post = f["schedule_start"].shift(-1) - f["execute_end"] - f["idle_before_s"].shift(-1)
    post_s = post.drop_nulls().sum()
    idle_s = f["idle_before_s"].sum()
    n = f.height
    print(
        f"  {name} steps: {n}, mean batch {f['num_seqs'].mean():.1f} seqs, "
        f"mean cycle {cycle.drop_nulls().mean() * 1e3:.2f} ms; per step: "
        f"schedule {schedule_s / n * 1e3:.3f} ms, execute {execute_s / n * 1e3:.3f} ms "
        f"(forward {f['forward_s'].mean() * 1e3:.3f}, sample {f['sample_s'].mean() * 1e3:.3f}), "
        f"post-step (records, observers, hand-off, commands) {post_s / n * 1e3:.3f} ms; "
        f"idle {idle_s:.1f} s in all"
    )


def steps_priced(model: CostModel, steps_files: list[Path]) -> None:
    """Each served run's own steps priced by ``model`` beside what they took: the step
    costs' share of the latency errors below (a machine whose speed wanders moves this
    from run to run; the rest of an error is the simulated schedule's)."""
    from harness.run.simulator_check import price_served_steps

    ratios = [price_served_steps(model, f) for f in steps_files if f.exists()]
    text = ", ".join(f"{r['ratio']:.3f}" for r in ratios if r and r["ratio"])
    if text:
        print(f"  the served runs' own steps took x the model's price for them: {text}")


def ttft_parts(served: pl.DataFrame, steps_file: Path, sim: pl.DataFrame) -> None:
    """Each class's median TTFT cut at the engine's stamps, served beside simulated:
    intake (client send -> engine arrival), queue (arrival -> first scheduled),
    prefill (first scheduled -> first token at the engine), delivery (engine's first
    token -> the client's). What the simulator gets wrong shows up in one column."""
    requests_file = steps_file.with_name("requests.parquet")
    if not requests_file.exists():
        return
    epoch = json.loads(steps_file.with_name("epoch.json").read_text())["clock_epoch_unix"]
    engine = pl.read_parquet(requests_file).select(
        "request_id",
        "queue_s",
        (pl.col("scheduled_at") + epoch).alias("arrival_unix"),
        (pl.col("first_token_at") - pl.col("first_scheduled_at")).alias("prefill_s"),
        (pl.col("first_token_at") + epoch).alias("engine_first_unix"),
    )
    joined = served.join(engine, on="request_id").with_columns(
        intake_s=pl.col("arrival_unix") - pl.col("sent_unix"),
        delivery_s=pl.col("first_unix") - pl.col("engine_first_unix"),
    )
    simulated = sim.select(
        "request_id",
        pl.col("ttft_s").alias("sim_ttft_s"),
        pl.col("queue_s").alias("sim_queue_s"),
        (pl.col("first_token_at") - pl.col("first_scheduled_at")).alias("sim_prefill_s"),
    )
    joined = joined.join(simulated, on="request_id")
    print("  median TTFT parts, ms (served = intake + queue + prefill + delivery | simulated):")
    for cls in sorted(joined["class"].unique()):
        part = joined.filter(pl.col("class") == cls)

        def ms(column: str, part: pl.DataFrame = part) -> float:
            return float(part[column].median()) * 1e3

        print(
            f"    {cls:16} served {ms('ttft_s'):7.2f} = {ms('intake_s'):5.2f} + "
            f"{ms('queue_s'):6.2f} + {ms('prefill_s'):7.2f} + {ms('delivery_s'):5.2f}  | "
            f"simulated {ms('sim_ttft_s'):7.2f}: queue {ms('sim_queue_s'):6.2f}, "
            f"prefill {ms('sim_prefill_s'):7.2f}"
        )


def simulate_schedule(
    specs: list[RequestSpec], config: EngineConfig, model: CostModel
) -> pl.DataFrame:
    result = simulate(
        resolve_profile("default"), config, model, requests=specs, record_decisions=False
    )
    return result.requests


def served_apart(
    lo_a: float, hi_a: float, lo_b: float, hi_b: float, med_a: float, med_b: float, repeats: int
) -> bool:
    """Do the served runs order policy a before b (a's p95 lower)? With three runs or
    more each, when their ranges are disjoint (two identical policies' ranges are
    disjoint by chance 1 time in 10 with three runs each, 1 in 3 with two); with fewer,
    when the medians also differ by more than RANK_TIE."""
    if repeats >= 3:
        return hi_a < lo_b
    return (repeats == 1 or hi_a < lo_b) and med_a > 0 and (med_b - med_a) / med_a > RANK_TIE


def max_waiting(run_dirs: list[Path]) -> int:
    """The most requests left waiting after any step of these served runs: 0 means no
    request ever waited for another, so the policy was never consulted."""
    return max(
        int(pl.read_parquet(d / "steps.parquet")["num_waiting"].max() or 0) for d in run_dirs
    )


def rank_policies(args, specs: list[RequestSpec]) -> list[Figure]:
    """Served (``--repeats`` runs each, round-robin) and simulated runs of each policy:
    does the simulator order them as the served engine does, per class, by p95 TTFT
    and p95 E2E? A pair is ordered by the served runs only as ``served_apart`` says,
    and not at all when no request of either policy's runs ever waited (the policies
    were never consulted: any difference is run-to-run noise)."""
    policies = args.rank_policies.split(",")
    served_runs: dict[str, list[Percentiles]] = {p: [] for p in policies}
    run_dirs: dict[str, list[Path]] = {p: [] for p in policies}
    for rep in range(args.repeats):
        for policy in policies:
            args.policy = policy
            tmp = Path(tempfile.mkdtemp(prefix=f"schedscope-rank-{policy}-"))
            served, _ = run_served(specs, args, tmp / "steps.parquet")
            served.write_parquet(tmp / "client.parquet")
            run_dirs[policy].append(tmp)
            print(f"  {policy} run {rep + 1}/{args.repeats}: served records in {tmp}", flush=True)
            served_runs[policy].append(percentiles(served))
    model = CostModel.load(args.cost_model) if args.cost_model else CostModel()
    sim_p, med, lo, hi = {}, {}, {}, {}
    for policy in policies:
        args.policy = policy
        sim = simulate_schedule(specs, engine_config(args), model)
        sim_p[policy] = percentiles(
            sim.select("request_id", "class", "output_tokens", "ttft_s", "e2e_s")
        )
        med[policy], lo[policy], hi[policy] = across(served_runs[policy])
    waited = {p: max_waiting(run_dirs[p]) for p in policies}
    print(
        "  most requests waiting after any served step: "
        + ", ".join(f"{p} {n}" for p, n in waited.items())
    )
    keys = sorted(k for k in med[policies[0]] if k[0] != "all")
    agree = resolved = 0
    for key in keys:
        order = sorted(policies, key=lambda p: med[p][key]["p95"])
        values = "  ".join(
            f"{p} {med[p][key]['p95']:.3f} ({lo[p][key]['p95']:.3f}.."
            f"{hi[p][key]['p95']:.3f})/{sim_p[p][key]['p95']:.3f}"
            for p in order
        )
        print(f"  {key[0]:16} {key[1]:7} p95 served median (range)/simulated: {values}")
        for i, a in enumerate(order):
            for b in order[i + 1 :]:
                apart = served_apart(
                    lo[a][key]["p95"],
                    hi[a][key]["p95"],
                    lo[b][key]["p95"],
                    hi[b][key]["p95"],
                    med[a][key]["p95"],
                    med[b][key]["p95"],
                    args.repeats,
                )
                sim_says = "<" if sim_p[a][key]["p95"] < sim_p[b][key]["p95"] else ">="
                if apart and not (waited[a] or waited[b]):
                    print(
                        f"      {a} ~ {b}: served runs differ, but no request ever waited: "
                        "the policies were never consulted (noise; simulated "
                        f"{a} {sim_says} {b})"
                    )
                elif apart:
                    resolved += 1
                    agree += sim_says == "<"
                    print(
                        f"      {a} < {b} served (apart): simulated {a} {sim_says} {b}: "
                        f"{'SAME' if sim_says == '<' else 'DIFFERENT'}"
                    )
                else:
                    print(f"      {a} ~ {b} served (ranges overlap: a tie, no order to match)")
    print(
        f"  same order in {agree} of {resolved} policy pairs the served runs order "
        f"(over {len(keys)} class x metric keys, {args.repeats} served runs per policy)"
    )
    figures = [
        Figure(
            "policy pairs the simulator orders as the served runs do",
            100 * agree / resolved if resolved else None,
            "%",
            100.0,
            "higher",
            note=f"{agree} of {resolved} ordered pairs; {args.repeats} served runs per policy",
        )
    ]
    for policy in policies:
        print(
            f"simulated vs served, {policy}{' (median of the runs)' if args.repeats > 1 else ''}:"
        )
        figures += compare(
            f"sim/served {policy}",
            sim_p[policy],
            med[policy],
            TARGET_SIM_VS_SERVED,
            (lo[policy], hi[policy]) if args.repeats > 1 else None,
        )
    return figures


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.add_argument("--rate-scale", type=float, default=0.3)
    parser.sized("--duration-s", type=float, full=40.0, quick=15.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--policy", default="fcfs")
    parser.add_argument("--cost-model", type=Path, default=None)
    parser.add_argument("--skip-offline", action="store_true")
    parser.add_argument(
        "--client",
        choices=("locust", "replay"),
        default="locust",
        help="what sends the served runs' requests: locust (schedscope run's load "
        "generator, the default) or replay (a light asyncio client in this process)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="served (and offline) runs of the schedule, alternating; "
        "figures are medians with the runs' range beside them",
    )
    parser.add_argument(
        "--rank-policies",
        default=None,
        help="e.g. fcfs,sjf,priority: served and simulated runs of each, "
        "and whether the simulator ranks them as served runs do",
    )
    parser.add_device()
    parser.add_argument(
        "--cpu-split",
        default="auto",
        help="the server's and the client's cores, as `schedscope run --cpu-split` "
        "(auto, off, SERVE:LOAD): the stored fit of this machine is made so",
    )
    parser.add_argument(
        "--serve-args",
        nargs=argparse.REMAINDER,
        default=[],
        help="extra `schedscope serve` flags (last)",
    )
    return parser


def run(args) -> list[Figure]:
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    try:
        args.split = parse_cpu_split(args.cpu_split)
    except CpuSplitError as exc:
        raise SystemExit(f"--cpu-split: {exc}") from None
    specs = schedule(args.rate_scale, args.duration_s, args.seed)
    config = engine_config(args)
    tmp = Path(tempfile.mkdtemp(prefix="schedscope-bench-serving-"))
    if args.client == "locust":
        # Locust runs files: the schedule as a trace profile, and every side (offline,
        # simulated) runs what a driver of that file sends (the same requests, their
        # ids, moved to start at the first arrival)
        args.schedule_file = write_schedule_profile(
            specs, resolve_profile("default").classes, tmp, "bench_schedule"
        )
        specs = written_schedule(args.schedule_file)
    print(
        f"schedule: {len(specs)} requests over {args.duration_s:.0f} s at "
        f"{args.rate_scale}x the default profile's rate, policy {args.policy}, "
        f"{args.repeats} run(s) each, on {args.device}, served runs sent by {args.client}"
    )
    if args.rank_policies:
        return rank_policies(args, specs)
    figures: list[Figure] = []
    served_runs: list[pl.DataFrame] = []
    offline_runs: list[pl.DataFrame] = []
    steps_files: list[Path] = []
    for rep in range(args.repeats):
        steps_file = tmp / f"run{rep}" / "steps.parquet"
        steps_file.parent.mkdir()
        steps_files.append(steps_file)
        started = time.perf_counter()
        served, lag_p99 = run_served(specs, args, steps_file)
        served.write_parquet(steps_file.with_name("client.parquet"))
        served_runs.append(served)
        print(
            f"served  {rep + 1}/{args.repeats}: {time.perf_counter() - started:.1f} s wall, "
            f"client send lag p99 {lag_p99 * 1e3:.1f} ms",
            flush=True,
        )
        step_cycle(steps_file)
        if not args.skip_offline:
            started = time.perf_counter()
            from harness.costmodel.machine import serving_torch_threads

            threads = serving_torch_threads()
            offline_runs.append(
                run_offline(
                    specs,
                    config,
                    threads,
                    steps_file.with_name("offline_steps.parquet"),
                    args.device,
                )
            )
            print(
                f"offline {rep + 1}/{args.repeats}: {time.perf_counter() - started:.1f} s "
                f"wall ({threads} torch threads, as served)",
                flush=True,
            )
            step_cycle(steps_file.with_name("offline_steps.parquet"), "offline")
    served_p = [percentiles(f) for f in served_runs]
    served_med, served_lo, served_hi = across(served_p)

    if offline_runs:
        print("served vs offline (E2E; the bar the server must clear):")
        figures += compare_paired(
            served_p, [percentiles(f) for f in offline_runs], TARGET_SERVED_VS_OFFLINE
        )
        ratios = [
            throughput(s, specs) / throughput(o, specs)
            for s, o in zip(served_runs, offline_runs, strict=True)
        ]
        ratio = float(np.median(ratios))
        print(
            f"  throughput: served/offline {ratio:.3f} (runs {min(ratios):.3f}.."
            f"{max(ratios):.3f}; served {throughput(served_runs[0], specs):.0f} tok/s in run 1), "
            f"error {abs(ratio - 1):.1%}, target <= {TARGET_SERVED_VS_OFFLINE:.0%}: "
            f"{verdict(abs(ratio - 1), TARGET_SERVED_VS_OFFLINE)}"
        )
        figures.append(
            Figure(
                "served/offline output tokens/s error",
                abs(ratio - 1) * 100,
                "%",
                TARGET_SERVED_VS_OFFLINE * 100,
                aim=AIM_SERVED_VS_OFFLINE * 100,
                note=f"ratio {ratio:.3f} (runs {min(ratios):.3f}..{max(ratios):.3f})",
            )
        )

    models = {
        "built-in" if args.cost_model is None else str(args.cost_model): CostModel.load(
            args.cost_model
        )
        if args.cost_model
        else CostModel()
    }
    # the figures' names: short and the same from run to run (a stored fit's file is not)
    labels = {
        "built-in" if args.cost_model is None else str(args.cost_model): "built-in"
        if args.cost_model is None
        else args.cost_model.name
    }
    if args.cost_model is None:
        # Out of sample: the fit `schedscope calibrate` stored for this machine (the
        # served engine's fingerprint), beside the built-in fitted on another machine.
        from harness.costmodel import store as cost_store
        from harness.costmodel.machine import fingerprint

        match = cost_store.find(fingerprint(config.model, device=args.device)).match
        if match is not None and match.model is not None:
            models[f"this machine's stored fit {match.path.name}"] = match.model
            labels[f"this machine's stored fit {match.path.name}"] = "stored fit"
        else:
            print("no fit stored for this machine: `schedscope calibrate --quick` makes one")
    if all(f.exists() for f in steps_files):
        from engine.sim.cost_fit import fit_from_steps

        fitted = fit_from_steps([pl.read_parquet(f) for f in steps_files])
        models["fitted from served steps"] = fitted
        labels["fitted from served steps"] = "served-steps fit"
        latencies = [client_latency(s, f) for s, f in zip(served_runs, steps_files, strict=True)]
        if all(latencies):
            latency = {
                k: float(np.median([x[k] for x in latencies]))
                for k in ("intake_s", "delivery_s", "client_latency_s")
            }
            print(
                f"outside the engine (median over runs): intake "
                f"{latency['intake_s'] * 1e3:.2f} ms, "
                f"delivery {latency['delivery_s'] * 1e3:.2f} ms, "
                f"together {latency['client_latency_s'] * 1e3:.2f} ms"
            )
            models["fitted from served steps + client latency"] = dataclasses.replace(
                fitted, client_latency_s=latency["client_latency_s"]
            )
            labels["fitted from served steps + client latency"] = "served-steps fit + latency"
    band = (served_lo, served_hi) if args.repeats > 1 else None
    for name, model in models.items():
        sim = simulate_schedule(specs, config, model)
        print(f"simulated ({name}) vs served{' (median of the runs)' if args.repeats > 1 else ''}:")
        steps_priced(model, steps_files)
        figures += compare(
            "sim/served",
            percentiles(sim.select("request_id", "class", "output_tokens", "ttft_s", "e2e_s")),
            served_med,
            TARGET_SIM_VS_SERVED,
            band,
            label=f"sim/served [{labels[name]}]",
        )
        ttft_parts(served_runs[0], steps_files[0], sim)
    print(f"(files: {tmp}; on a shared machine, believe a 5% change only across --repeats)")
    return figures


if __name__ == "__main__":
    bench_main(parser, run)
