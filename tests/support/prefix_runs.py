"""Run directories of the engine serving prompts that share long prefixes, written the
way ``schedscope simulate`` writes them (requests, steps, decisions, summary.json), for
the report's prefix-cache tests. The simulator's own profiles send prompts that share no
prefix (harness/simulate/driver.py ``_prompt``), so these drive the engine directly.

:func:`shared_prefix_requests`: ``prefixes`` distinct prefixes of ``prefix_len`` tokens,
reused round-robin, each request adding a suffix of its own; every prefix is
``prefix_len / block_size`` blocks, so ``prefixes`` of them are the working set the
pool must hold for every reuse to hit.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl

from harness.records.decision_log import decisions_frame
from harness.records.requests import RequestRecorder, add_stalls, requests_frame, write_parquet
from harness.records.steps import StepLog
from tests.support.engine_helpers import Req, drive, make_engine

BLOCK_SIZE = 4
PREFIXES = 6
PREFIX_LEN = 64  # 16 blocks: the working set is PREFIXES * 16 = 96 blocks
#: A pool that cannot keep the working set (every reuse finds its prefix evicted), and
#: one that keeps it (every reuse hits).
THRASH_BLOCKS = 64
ROOMY_BLOCKS = 1024
#: The profile the run's summary.json names (a shipped one: the fix's command resolves it).
PROFILE = "mixed"


def shared_prefix_requests(
    n: int = 120,
    prefixes: int = PREFIXES,
    prefix_len: int = PREFIX_LEN,
    suffix_len: int = 8,
    max_tokens: int = 8,
) -> list[Req]:
    """``n`` requests, request i with prefix ``i % prefixes`` and a suffix of its own;
    arrivals 0.5 s apart at first, 0.02 s at the end (a ramp)."""
    out, t = [], 0.0
    for i in range(n):
        prefix = tuple(100_000 * (i % prefixes + 1) + j for j in range(prefix_len))
        suffix = tuple(10_000_000 + 100 * i + j for j in range(suffix_len))
        out.append(Req(f"r{i:04d}", arrival=t, prompt=prefix + suffix, max_tokens=max_tokens))
        t += 0.5 + (0.02 - 0.5) * i / max(n - 1, 1)
    return out


def write_prefix_run(
    root: Path,
    gpu_blocks: int,
    policy: str = "fcfs",
    enable_prefix_caching: bool = True,
    requests: list[Req] | None = None,
) -> Path:
    """Drive the engine (block size :data:`BLOCK_SIZE`, ``gpu_blocks`` device blocks)
    through ``requests`` (:func:`shared_prefix_requests` by default) and write a
    one-policy run directory at ``root``: requests.parquet (class ``p<k>``, the prefix
    each request used), steps.parquet, decisions.parquet and a summary.json with the
    engine config and :data:`PROFILE`."""
    engine = make_engine(
        block_size=BLOCK_SIZE,
        gpu_blocks=gpu_blocks,
        enable_prefix_caching=enable_prefix_caching,
        max_num_seqs=64,
        scheduling_policy=policy,
    )
    recorder, step_log = RequestRecorder(policy, PROFILE), StepLog()
    engine.observers.add(recorder)
    engine.observers.add(step_log)
    requests = requests if requests is not None else shared_prefix_requests()
    trace = drive(engine, requests)
    rows = recorder.rows
    add_stalls(rows, 0.25)
    prefix_of = {r.id: (r.prompt or (0,))[0] // 100_000 - 1 for r in requests}
    frame = (
        requests_frame(rows)
        .with_columns(
            pl.col("request_id")
            .replace_strict({k: f"p{v}" for k, v in prefix_of.items()})
            .alias("class")
        )
        .sort("scheduled_at", "request_id")
    )
    root.mkdir(parents=True, exist_ok=True)
    write_parquet(frame, root / "requests.parquet")
    write_parquet(step_log.frame(), root / "steps.parquet")
    write_parquet(decisions_frame(trace.decisions), root / "decisions.parquet")
    config = dataclasses.asdict(engine.config)
    summary = {
        "schema_version": 1,
        "mode": "simulate",
        "profile": PROFILE,
        "seed": 7,
        "policies": {
            policy: {
                "config": config,
                "duration_s": engine.clock.now(),
                "stall_threshold_s": 0.25,
            }
        },
    }
    (root / "summary.json").write_text(json.dumps(summary))
    return root
