"""Benchmark: ``schedscope report`` over 1,000,000 requests and 5,000,000 spans.

Generates a synthetic run (two policies x 500,000 requests, 2,500,000 spans, steps and
decisions each; two classes; stalls on ~10% of requests; preemptions on ~3%), then
times the report (every table, stall attribution, diagnosis, verdicts with the
bootstrap, every picture, all outputs written) in a fresh process and reports its peak
memory (ru_maxrss). Target: <= 30 s, aim <= 10 s.

    python benchmarks/bench_report.py [--requests 1000000] [--spans 5000000] [--dir DIR]
        [--quick: 200,000 requests + 1,000,000 spans, no target] [--json FILE]

The target is for the full size; at a smaller size the time is reported without one.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main

TARGET_S, AIM_S = 30.0, 10.0
FULL_REQUESTS, FULL_SPANS = 1_000_000, 5_000_000


def make_policy(path: Path, policy: str, n: int, n_spans: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    duration = n / 50.0  # 50 requests/s
    arrival = np.sort(rng.uniform(0, duration, n))
    long = rng.random(n) < 0.2
    prompt = np.where(long, rng.integers(400, 1000, n), rng.integers(50, 400, n))
    output = np.where(long, rng.integers(200, 800, n), rng.integers(20, 200, n))
    scale = 1.0 if policy == "fcfs" else 0.8
    queue = rng.exponential(np.where(long, 2.0, 0.5 * scale))
    ttft = queue + rng.exponential(0.05, n)
    tpot = rng.uniform(0.01, 0.05, n)
    e2e = ttft + tpot * (output - 1)
    preempted = rng.random(n) < 0.03
    ids = np.char.add(f"{policy}-", np.arange(n).astype(str))
    n_stalled = n // 10
    stalled = rng.choice(n, n_stalled, replace=False)
    stall_start = (
        arrival[stalled]
        + ttft[stalled]
        + rng.uniform(0, 1, n_stalled) * (e2e[stalled] - ttft[stalled])
    )
    stall_dur = rng.uniform(0.3, 3.0, n_stalled)
    stall_lists = [[] for _ in range(n)]
    for i, s, d in zip(stalled.tolist(), stall_start.tolist(), stall_dur.tolist(), strict=True):
        stall_lists[i].append({"start_s": s, "duration_s": d})
    stall_s = np.zeros(n)
    stall_s[stalled] = stall_dur
    requests = pl.DataFrame(
        {
            "request_id": ids,
            "policy": policy,
            "profile": "default",
            "class": np.where(long, "long_generation", "short_chat"),
            "priority": long.astype(np.int64),
            "prompt_tokens": prompt,
            "output_tokens": output,
            "max_tokens": np.where(long, 1024, 256),
            "status": "ok",
            "error": None,
            "finish_reason": "stop",
            "scheduled_at": arrival,
            "sent_at": arrival,
            "ttft_s": ttft,
            "ttft_from_sent_s": ttft,
            "tpot_s": tpot,
            "e2e_s": e2e,
            "max_itl_s": tpot * 3,
            "queue_s": queue,
            "total_queue_s": queue,
            "preemptions": preempted.astype(np.int64),
            "preempt_swaps": preempted.astype(np.int64),
            "preempt_recomputes": 0,
            "swapped_s": np.where(preempted, 0.5, 0.0),
            "recomputed_tokens": 0,
            "idle_running_steps": 0,
            "stall_s": stall_s,
            "num_stalls": (stall_s > 0).astype(np.int64),
            "stalls": pl.Series(
                stall_lists,
                dtype=pl.List(pl.Struct({"start_s": pl.Float64, "duration_s": pl.Float64})),
            ),
            "first_scheduled_at": arrival + queue,
            "first_token_at": arrival + ttft,
            "finished_at": arrival + e2e,
        }
    )
    requests.write_parquet(path / "requests.parquet")
    # spans: llm_request, schedule, prefill, decode per request, the rest engine.step / preempt
    per = 4
    n_steps = max(n_spans - per * n - int(preempted.sum()), 0)
    names = np.concatenate(
        [
            np.repeat(np.array(["llm_request", "schedule", "prefill", "decode"]), n),
            np.full(int(preempted.sum()), "preempt"),
            np.full(n_steps, "engine.step"),
        ]
    )
    rid = pl.Series(np.concatenate([np.tile(ids, per), ids[preempted], np.full(n_steps, "")]))
    rid = rid.replace("", None)
    start = np.concatenate(
        [
            arrival,
            arrival,
            arrival + queue,
            arrival + ttft,
            arrival[preempted] + ttft[preempted] + 0.1,
            np.sort(rng.uniform(0, duration, n_steps)),
        ]
    )
    end = np.concatenate(
        [
            arrival + e2e,
            arrival + queue,
            arrival + ttft,
            arrival + e2e,
            arrival[preempted] + ttft[preempted] + 0.6,
            start[-n_steps:] + 0.02,
        ]
    )
    m = names.size
    spans = pl.DataFrame(
        {
            "name": names,
            "trace_id": None,
            "span_id": None,
            "parent_span_id": None,
            "kind": "internal",
            "start": start,
            "end": end,
            "duration_s": end - start,
            "request_id": rid,
            "status": "unset",
            "resource.schedscope.policy": policy,
            "attr.schedscope.preempt.mode": pl.Series(
                np.where(names == "preempt", "swap", "")
            ).replace("", None),
            "attr.schedscope.prefill.kind": pl.Series(
                np.where(names == "prefill", "prefill", "")
            ).replace("", None),
            "attr.schedscope.step.num_prefill_tokens": rng.integers(0, 2048, m),
            "attr.schedscope.step.num_decode_seqs": rng.integers(0, 256, m),
            "attr.schedscope.queue.num_waiting": rng.integers(0, 100, m),
            "attr.schedscope.kv.device_usage": rng.random(m),
        }
    )
    spans.write_parquet(path / "spans.parquet")
    k = n // 3
    t = np.sort(rng.uniform(0, duration, k))
    pl.DataFrame(
        {
            "step": np.arange(k),
            "schedule_start": t,
            "execute_start": t,
            "execute_end": t + 0.02,
            "num_seqs": rng.integers(1, 256, k),
            "num_prefill_tokens": rng.integers(0, 2048, k),
            "num_recompute_tokens": 0,
            "num_decode_seqs": rng.integers(0, 256, k),
            "num_idle_running": 0,
            "num_waiting": rng.integers(0, 100, k),
            "num_running": rng.integers(1, 256, k),
            "num_swapped": 0,
            "num_free_device_blocks": rng.integers(0, 30000, k),
            "num_device_blocks": 30000,
            "num_free_host_blocks": 100000,
        }
    ).write_parquet(path / "steps.parquet")
    pre = np.flatnonzero(preempted)
    pl.DataFrame(
        {
            "kind": ["admit"] * n + ["preempt"] * pre.size,
            "time": np.concatenate([arrival + queue, arrival[pre] + ttft[pre] + 0.1]),
            "step": 0,
            "request_id": np.concatenate([ids, ids[pre]]),
            "reason": ["policy_order"] * n + ["out_of_blocks"] * pre.size,
            "mode": pl.Series([None] * n + ["swap"] * pre.size, dtype=pl.String),
            "detail": "",
            "request_ids": pl.Series([None] * (n + pre.size), dtype=pl.List(pl.String)),
        }
    ).write_parquet(path / "decisions.parquet")
    return duration


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.sized("--requests", type=int, full=FULL_REQUESTS, quick=200_000)
    parser.sized("--spans", type=int, full=FULL_SPANS, quick=1_000_000)
    parser.add_argument("--dir", type=Path, default=None)
    return parser


def run(args) -> list[Figure]:
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-report-")) / "run"
    t0 = time.perf_counter()
    info = {}
    for i, policy in enumerate(("fcfs", "sjf")):
        d = make_policy(root / policy, policy, args.requests // 2, args.spans // 2, seed=i)
        info[policy] = {
            "duration_s": d,
            "stall_threshold_s": 0.25,
            "config": {
                "scheduler": {"scheduling_policy": policy, "max_num_seqs": 256},
                "cache": {"swap_space": 4.0},
            },
        }
    (root / "summary.json").write_text(
        json.dumps(
            {"schema_version": 1, "mode": "synthetic", "profile": "default", "policies": info}
        )
    )
    gen_s = time.perf_counter() - t0
    code = (
        "import sys, time; from harness.report import generate_report; t=time.perf_counter(); "
        "generate_report([sys.argv[1]]); print(time.perf_counter()-t)"
    )
    t1 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code, str(root)], check=True, capture_output=True, text=True
    )
    wall = time.perf_counter() - t1
    inner = float(out.stdout.strip().splitlines()[-1])
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    html_mib = (root / "report.html").stat().st_size / 2**20
    print(
        f"data: {args.requests:,} requests, {args.spans:,} spans "
        f"(generated in {gen_s:.1f} s) in {root}"
    )
    print(
        f"report generation: {inner:.2f} s (process incl. imports {wall:.2f} s); "
        f"target <= {TARGET_S:.0f} s, aim <= {AIM_S:.0f} s: "
        f"{'OK' if wall <= TARGET_S else 'OVER TARGET'}"
    )
    print(
        f"peak memory (report process, ru_maxrss): {peak_mib:,.0f} MiB; "
        f"report.html {html_mib:.1f} MiB"
    )
    size = f"{args.requests:,} requests + {args.spans:,} spans"
    # The target is set for the full size: a smaller run's time is no evidence for it.
    full = args.requests >= FULL_REQUESTS and args.spans >= FULL_SPANS
    note = size if full else f"{size}; the target (<= 30 s, aim <= 10 s) is for the full size"
    return [
        Figure(
            "report generation, process incl. imports",
            wall,
            "s",
            *((TARGET_S, "lower", AIM_S) if full else ()),
            note=note,
        ),
        Figure("report generation, inside the process", inner, "s", note=size),
        Figure("report process peak memory", peak_mib, "MiB", note=size),
    ]


if __name__ == "__main__":
    bench_main(parser, run)
