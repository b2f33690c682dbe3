"""Served vs offline vs simulated: one schedule, three ways, side by side in one run.

The default profile's exact schedule (``--rate-scale``, the first ``--duration-s``
seconds), every request with ``max_tokens`` = its true output length and
``ignore_eos`` (so all three runs generate the same tokens):

- offline: ``LLMEngine`` with the torch executor, driven in this process at the
  scheduled instants (no HTTP, tokens "received" when their step ends);
- served: ``schedscope serve --executor torch`` in a subprocess, the same schedule
  replayed open-loop by an asyncio client in this process (streaming, prompt token ids,
  latency from the scheduled instant);
- simulated: ``harness.simulate`` with the given cost model (default: built-in), and,
  when the served run's step records are there, a cost model fitted from them.

Targets: served E2E p50/p95 and throughput within 15% of offline (aim 5%); simulated
p50/p95 TTFT and E2E per class within 15% of served. Prints measured beside target and
where the served step cycle goes (schedule, execute, post-step, idle). Never fails on
time (machines are shared): it reports.

Run: .venv/bin/python benchmarks/bench_serving.py [--rate-scale 0.3] [--duration-s 40]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from engine.api.testing import CliServer
from engine.clock import WallClock
from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.cost_model import CostModel
from engine.model_config import ModelConfig
from engine.request import EngineRequest
from engine.sequence import SamplingParams
from harness.profiles import RequestSpec, build_plan, resolve_profile
from harness.simulate import simulate

TARGET_SERVED_VS_OFFLINE = 0.15
TARGET_SIM_VS_SERVED = 0.15
#: Served p95s of the policies closer than this (relative spread) are a tie: run-to-run
#: noise on a shared machine is about that large.
RANK_TIE = 0.15


def schedule(rate_scale: float, duration_s: float, seed: int | None) -> list[RequestSpec]:
    profile = resolve_profile("default").with_rate_scale(rate_scale)
    specs = [s for s in build_plan(profile, seed).open_loop_requests()
             if s.scheduled_at < duration_s]
    # Exact output lengths in every run: the request asks for its true length.
    return [dataclasses.replace(s, max_tokens=s.output_tokens) for s in specs]


def prompt_ids(spec: RequestSpec, vocab_size: int) -> list[int]:
    return [3 + (spec.index * 7919 + i * 104729) % (vocab_size - 3)
            for i in range(spec.prompt_tokens)]


def engine_config(args) -> EngineConfig:
    return EngineConfig(SchedulerConfig(scheduling_policy=args.policy), CacheConfig())


# -- offline ----------------------------------------------------------------------------
def run_offline(specs: list[RequestSpec], config: EngineConfig, threads: int,
                steps_file: Path) -> pl.DataFrame:
    import torch

    from engine.model_runner import build_torch_engine

    torch.set_num_threads(threads)  # as the server runs it

    from harness.steps import StepLog

    engine = build_torch_engine(config, WallClock(), device="cpu")
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
            seqs[spec.request_id] = (spec, engine.add_request(EngineRequest(
                spec.request_id, prompt_ids(spec, vocab),
                SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True),
                arrival_time=start + spec.scheduled_at, priority=spec.priority,
                request_class=spec.class_name)))
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
        rows.append({"request_id": spec.request_id, "class": spec.class_name,
                     "output_tokens": seq.num_output_tokens,
                     "ttft_s": t.first_token_time - arrival, "e2e_s": t.last_token_time - arrival})
    return pl.DataFrame(rows)


# -- served -----------------------------------------------------------------------------
async def replay(url: str, specs: list[RequestSpec], vocab: int) -> tuple[list[dict], float]:
    import aiohttp

    rows: list[dict] = []
    lags: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.5

        async def one(spec: RequestSpec) -> None:
            scheduled = start + spec.scheduled_at
            await asyncio.sleep(max(0.0, scheduled - loop.time()))
            lags.append(loop.time() - scheduled)
            body = {"model": "tiny", "prompt": prompt_ids(spec, vocab), "temperature": 0.0,
                    "max_tokens": spec.max_tokens, "ignore_eos": True, "stream": True,
                    "priority": spec.priority,
                    "stream_options": {"include_usage": True}}
            first = last = None
            first_unix = None
            tokens = 0
            sent_unix = time.time()
            async with session.post(url + "/v1/completions", json=body,
                                    headers={"X-Request-Id": spec.request_id,
                                             "X-Request-Class": spec.class_name}) as response:
                assert response.status == 200, await response.text()
                async for line in response.content:
                    if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                        continue
                    event = json.loads(line[6:])
                    if event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
                    if event.get("choices") and event["choices"][0].get("text"):
                        last = loop.time()
                        if first is None:
                            first, first_unix = last, time.time()
            rows.append({"request_id": spec.request_id, "class": spec.class_name,
                         "output_tokens": tokens, "ttft_s": first - scheduled,
                         "e2e_s": last - scheduled, "sent_unix": sent_unix,
                         "first_unix": first_unix})

        await asyncio.gather(*(one(s) for s in specs))
    return rows, float(np.percentile(lags, 99)) if lags else 0.0


def run_served(specs: list[RequestSpec], args, steps_file: Path) -> tuple[pl.DataFrame, float]:
    """Client rows; the server's step and request records land beside ``steps_file``."""
    from engine.api.testing import HttpClient

    vocab = ModelConfig.preset("tiny").vocab_size
    server_args = ["--executor", "torch", "--scheduling-policy", args.policy,
                   "--record-steps", str(steps_file),
                   "--record-requests", str(steps_file.with_name("requests.parquet")),
                   *args.serve_args]
    with CliServer(server_args, start_timeout_s=120) as server:
        rows, lag_p99 = asyncio.run(replay(server.url, specs, vocab))
        epoch = json.loads(HttpClient(server.url).request("GET", "/health")[2])["clock_epoch_unix"]
    steps_file.with_name("epoch.json").write_text(json.dumps({"clock_epoch_unix": epoch}))
    return pl.DataFrame(rows), lag_p99


def client_latency(served: pl.DataFrame, steps_file: Path) -> dict | None:
    """Median time a request and its tokens spend outside the engine: from the client's
    send to the engine's arrival stamp (intake), and from the engine's first token to
    the client's (delivery), joined by request id through the engine's clock epoch."""
    requests_file = steps_file.with_name("requests.parquet")
    if not requests_file.exists():
        return None
    epoch = json.loads(steps_file.with_name("epoch.json").read_text())["clock_epoch_unix"]
    engine = pl.read_parquet(requests_file).select(
        "request_id", (pl.col("scheduled_at") + epoch).alias("arrival_unix"),
        (pl.col("first_token_at") + epoch).alias("engine_first_unix"))
    joined = served.join(engine, on="request_id").select(
        (pl.col("arrival_unix") - pl.col("sent_unix")).alias("intake_s"),
        (pl.col("first_unix") - pl.col("engine_first_unix")).alias("delivery_s"))
    return {"intake_s": float(joined["intake_s"].median()),
            "delivery_s": float(joined["delivery_s"].median()),
            "client_latency_s": float((joined["intake_s"] + joined["delivery_s"]).median()),
            "joined": joined.height}


# -- report -----------------------------------------------------------------------------
def percentiles(frame: pl.DataFrame) -> dict[tuple[str, str], dict[str, float]]:
    out = {}
    for cls in ["all", *sorted(frame["class"].unique())]:
        part = frame if cls == "all" else frame.filter(pl.col("class") == cls)
        for metric in ("ttft_s", "e2e_s"):
            values = part[metric].drop_nulls().to_numpy()
            out[(cls, metric)] = {"p50": float(np.percentile(values, 50)),
                                  "p95": float(np.percentile(values, 95))}
    return out


def throughput(frame: pl.DataFrame, specs: list[RequestSpec]) -> float:
    """Output tokens per second over the schedule's span plus the last completion."""
    span = max(s.scheduled_at for s in specs) + frame["e2e_s"].max()
    return float(frame["output_tokens"].sum()) / span


def compare(name: str, got: dict, ref: dict, target: float) -> None:
    for key in sorted(ref):
        cls, metric = key
        for q in ("p50", "p95"):
            g, r = got[key][q], ref[key][q]
            err = abs(g - r) / r if r else 0.0
            verdict = "MET" if err <= target else "MISSED"
            print(f"  {name:20} {cls:16} {metric:7} {q}: {g:8.3f} s vs {r:8.3f} s  "
                  f"error {err:6.1%}  target <= {target:.0%}: {verdict}")


def step_cycle(steps_file: Path, name: str = "served") -> None:
    """Where the engine's time went, from its step records."""
    if not steps_file.exists():
        print(f"  (no {name} step records)")
        return
    f = pl.read_parquet(steps_file).sort("step")
    schedule_s = (f["execute_start"] - f["schedule_start"]).sum()
    execute_s = (f["execute_end"] - f["execute_start"]).sum()
    cycle = f["schedule_start"].shift(-1) - f["schedule_start"]
    post = (f["schedule_start"].shift(-1) - f["execute_end"] - f["idle_before_s"].shift(-1))
    post_s = post.drop_nulls().sum()
    idle_s = f["idle_before_s"].sum()
    n = f.height
    print(f"  {name} steps: {n}, mean batch {f['num_seqs'].mean():.1f} seqs, mean cycle {cycle.drop_nulls().mean() * 1e3:.2f} ms; per step: "
          f"schedule {schedule_s / n * 1e3:.3f} ms, execute {execute_s / n * 1e3:.3f} ms "
          f"(forward {f['forward_s'].mean() * 1e3:.3f}, sample {f['sample_s'].mean() * 1e3:.3f}), "
          f"post-step (records, observers, hand-off, commands) {post_s / n * 1e3:.3f} ms; "
          f"idle {idle_s:.1f} s in all")


def rank_policies(args, specs: list[RequestSpec]) -> None:
    """Served and simulated runs of each policy: does the simulator rank them as the
    served engine does, per class, by p95 TTFT and p95 E2E?"""
    profile = resolve_profile("default")
    served_p, sim_p = {}, {}
    for policy in args.rank_policies.split(","):
        args.policy = policy
        tmp = Path(tempfile.mkdtemp(prefix=f"schedscope-rank-{policy}-"))
        served, _ = run_served(specs, args, tmp / "steps.parquet")
        served.write_parquet(tmp / "client.parquet")
        print(f"  {policy}: served records in {tmp}")
        served_p[policy] = percentiles(served)
        model = CostModel.load(args.cost_model) if args.cost_model else CostModel()
        result = simulate(profile, engine_config(args), model, requests=specs,
                          record_decisions=False)
        sim_p[policy] = percentiles(result.requests.select("request_id", "class",
                                                           "output_tokens", "ttft_s", "e2e_s"))
    keys = sorted(k for k in next(iter(served_p.values())) if k[0] != "all")
    same = total = 0
    for key in keys:
        served_rank = sorted(served_p, key=lambda p: served_p[p][key]["p95"])
        sim_rank = sorted(sim_p, key=lambda p: sim_p[p][key]["p95"])
        values = "  ".join(f"{p} {served_p[p][key]['p95']:.3f}/{sim_p[p][key]['p95']:.3f}"
                           for p in served_rank)
        lo, hi = (served_p[served_rank[i]][key]["p95"] for i in (0, -1))
        spread = (hi - lo) / lo if lo else 0.0
        if spread < RANK_TIE:
            verdict = f"TIE (served spread {spread:.0%} < {RANK_TIE:.0%}: no ranking to match)"
        else:
            total += 1
            same += served_rank == sim_rank
            verdict = "SAME" if served_rank == sim_rank else "DIFFERENT"
        print(f"  {key[0]:16} {key[1]:7} p95 served/sim: {values}   served order "
              f"{'>'.join(served_rank)}, simulated {'>'.join(sim_rank)}: {verdict}")
    print(f"  same policy ranking in {same} of {total} (class, metric) pairs where the "
          "served policies differ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate-scale", type=float, default=0.3)
    parser.add_argument("--duration-s", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--policy", default="fcfs")
    parser.add_argument("--cost-model", type=Path, default=None)
    parser.add_argument("--skip-offline", action="store_true")
    parser.add_argument("--rank-policies", default=None,
                        help="e.g. fcfs,sjf,priority: served and simulated runs of each, "
                             "and whether the simulator ranks them as served runs do")
    parser.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[],
                        help="extra `schedscope serve` flags (last)")
    args = parser.parse_args()
    specs = schedule(args.rate_scale, args.duration_s, args.seed)
    config = engine_config(args)
    print(f"schedule: {len(specs)} requests over {args.duration_s:.0f} s at "
          f"{args.rate_scale}x the default profile's rate, policy {args.policy}")
    if args.rank_policies:
        rank_policies(args, specs)
        return
    tmp = Path(tempfile.mkdtemp(prefix="schedscope-bench-serving-"))
    steps_file = tmp / "steps.parquet"

    started = time.perf_counter()
    served, lag_p99 = run_served(specs, args, steps_file)
    print(f"served:  {time.perf_counter() - started:.1f} s wall, client send lag p99 "
          f"{lag_p99 * 1e3:.1f} ms")
    step_cycle(steps_file)
    served_p = percentiles(served)

    if not args.skip_offline:
        started = time.perf_counter()
        from harness.serve import serving_torch_threads

        threads = serving_torch_threads()
        offline = run_offline(specs, config, threads, tmp / "offline_steps.parquet")
        print(f"offline: {time.perf_counter() - started:.1f} s wall ({threads} torch threads, "
              "as served)")
        step_cycle(tmp / "offline_steps.parquet", "offline")
        off_p = percentiles(offline)
        print("served vs offline (E2E; the bar the server must clear):")
        compare("served/offline", {k: v for k, v in served_p.items() if k[1] == "e2e_s"},
                {k: v for k, v in off_p.items() if k[1] == "e2e_s"}, TARGET_SERVED_VS_OFFLINE)
        ts, to = throughput(served, specs), throughput(offline, specs)
        err = abs(ts - to) / to
        print(f"  throughput: served {ts:.0f} tok/s vs offline {to:.0f} tok/s, error {err:.1%}, "
              f"target <= {TARGET_SERVED_VS_OFFLINE:.0%}: "
              f"{'MET' if err <= TARGET_SERVED_VS_OFFLINE else 'MISSED'}")

    models = {"built-in" if args.cost_model is None else str(args.cost_model):
              CostModel.load(args.cost_model) if args.cost_model else CostModel()}
    if steps_file.exists():
        from engine.cost_fit import fit_from_steps

        fitted = fit_from_steps(pl.read_parquet(steps_file))
        models["fitted from served steps"] = fitted
        latency = client_latency(served, steps_file)
        if latency:
            print(f"outside the engine (median of {latency['joined']} requests): intake "
                  f"{latency['intake_s'] * 1e3:.2f} ms, delivery {latency['delivery_s'] * 1e3:.2f} ms,"
                  f" together {latency['client_latency_s'] * 1e3:.2f} ms")
            models["fitted from served steps + client latency"] = dataclasses.replace(
                fitted, client_latency_s=latency["client_latency_s"])
    profile = resolve_profile("default")
    for name, model in models.items():
        result = simulate(profile, config, model, requests=specs, record_decisions=False)
        sim = result.requests.select("request_id", "class", "output_tokens", "ttft_s", "e2e_s")
        print(f"simulated ({name}) vs served:")
        compare("sim/served", percentiles(sim), served_p, TARGET_SIM_VS_SERVED)
    print(f"(files: {tmp}; one run each on a shared machine: rerun before believing a 5% "
          "change)")


if __name__ == "__main__":
    main()
