"""Run directories written by hand for the gate's tests: a real (``serve``) run with
per-request rows whose latencies are drawn from known distributions, so a planted
regression has a known size."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl

CLASSES = ("short_chat", "long_generation")


def requests_frame(
    seed: int, n: int = 400, scale: float = 1.0, duration_s: float = 60.0, errors: int = 0
) -> pl.DataFrame:
    """``n`` requests on one fixed schedule (offsets and classes from seed 0); latencies
    lognormal from ``seed``, multiplied by ``scale``; the first ``errors`` failed."""
    schedule = np.random.default_rng(0)
    offsets = np.sort(schedule.uniform(0, duration_s, n))
    classes = [CLASSES[i % 2] for i in range(n)]
    rng = np.random.default_rng(seed)
    ttft = rng.lognormal(np.log(0.2), 0.5, n) * scale
    e2e = ttft + rng.lognormal(np.log(2.0), 0.3, n) * scale
    status = ["error" if i < errors else "ok" for i in range(n)]
    return pl.DataFrame(
        {
            "request_id": [f"r{i:05d}" for i in range(n)],
            "class": classes,
            "status": status,
            "prompt_tokens": [64] * n,
            "max_tokens": [32] * n,
            "output_tokens": [32] * n,
            "schedule_offset_s": offsets,
            "scheduled_at": 1_700_000_000.0 + offsets,
            "ttft_s": ttft,
            "tpot_s": (e2e - ttft) / 31,
            "e2e_s": e2e,
            "queue_s": ttft / 2,
            "stall_s": np.zeros(n),
        }
    )


def write_run(
    root: Path,
    cells: dict[str, pl.DataFrame],
    mode: str = "serve",
    seed: int = 1,
    profile: str = "mixed",
    generator_limited: bool = False,
    durations: dict[str, float] | None = None,
) -> Path:
    """A run directory as ``schedscope run`` lays it out (run.json, <cell>/requests.parquet,
    <cell>/run.json)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "run.json").write_text(
        json.dumps({"kind": "schedscope-run", "mode": mode, "profile": profile, "seed": seed})
    )
    if durations:  # as a run's summary.json records them (the report reads them back)
        policies = {name: {"duration_s": d} for name, d in durations.items()}
        (root / "summary.json").write_text(
            json.dumps({"mode": mode, "profile": profile, "seed": seed, "policies": policies})
        )
    for name, frame in cells.items():
        cell = root / name
        cell.mkdir()
        frame.write_parquet(cell / "requests.parquet")
        repeat = re.search(r"-r(\d+)$", name)
        (cell / "run.json").write_text(
            json.dumps(
                {
                    "cell": name,
                    "repeat": int(repeat[1]) if repeat else None,
                    "mode": mode,
                    "generator_limited": generator_limited,
                    "loadgen": {"send_lag_p99_s": 0.2 if generator_limited else 0.001},
                }
            )
        )
    return root
