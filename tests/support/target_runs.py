"""A ``schedscope run --target`` cell directory written by hand from the streams of the
tests' own engine (tests/support/synthetic_streams.py): run.json (its target, what the
target said of itself, its knobs, the load's machine), requests.parquet (the client's
columns ``calibrate --from-run`` reads) and metrics.parquet (``vllm:cache_config_info``
per scrape). Real ``run --target`` cells are tested end to end in
tests/harness/calibration/test_from_run_served.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from engine.core.cost_model import CostModel
from tests.support.synthetic_streams import Request, run

#: When the synthetic run starts on the client's Unix clock.
EPOCH = 1_800_000_000.0
VLLM_INFO = {"engine": "vllm", "version": "0.32.0", "model": "tiny", "max_model_len": 2048}
CACHE_LABELS = {
    "block_size": "16",
    "enable_prefix_caching": "True",
    "engine": "0",
    "num_gpu_blocks": "4096",
}


def load(n: int = 300, seed: int = 7, rate: float = 25.0) -> list[Request]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    return [
        Request(float(a), int(rng.integers(16, 600)), int(rng.integers(2, 60))) for a in arrivals
    ]


def write_cell(
    cell: Path,
    model: CostModel,
    requests: list[Request] | None = None,
    *,
    network_s: float = 0.003,
    info_after: dict | None = None,
    cache_labels: list[dict] | None = None,
    target_knobs: str | None = None,
    status: str = "ok",
    budget: int = 2048,
) -> Path:
    """The cell of a run whose target ran ``model`` (the tests' engine, FCFS, token budget
    ``budget``); each request reaches the engine ``network_s / 2`` after its send and
    its tokens reach the client ``network_s / 2`` after they are made. ``cache_labels``:
    the cache config labels of each scrape (default: two alike)."""
    requests = requests if requests is not None else load()
    firsts, gaps, _ = run(requests, model, budget=budget)
    half = network_s / 2
    sent = [EPOCH + r.arrival - half for r in requests]
    first = [EPOCH + f + half if f is not None else None for f in firsts]
    rows = {
        "request_id": [f"r{i}" for i in range(len(requests))],
        "class": ["chat"] * len(requests),
        "status": [status] * len(requests),
        "error": [None if status == "ok" else "HTTP 500: boom"] * len(requests),
        "prompt_tokens": [r.prompt for r in requests],
        "cached_tokens": [r.cached for r in requests],
        "output_tokens": [r.output for r in requests],
        "scheduled_at": sent,
        "sent_at": sent,
        "send_lag_s": [0.0] * len(requests),
        "first_token_at": first,
        "ttft_from_sent_s": [
            f - s if f is not None else None for f, s in zip(first, sent, strict=True)
        ],
        "itl_s": gaps,
    }
    cell.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows, schema_overrides={"itl_s": pl.List(pl.Float64)}).write_parquet(
        cell / "requests.parquet"
    )
    scrapes = cache_labels if cache_labels is not None else [CACHE_LABELS, CACHE_LABELS]
    pl.DataFrame(
        {
            "timestamp": [EPOCH + i for i in range(len(scrapes))],
            "name": ["vllm:cache_config_info"] * len(scrapes),
            "labels": [json.dumps(labels, sort_keys=True) for labels in scrapes],
            "value": [1.0] * len(scrapes),
        },
        schema={
            "timestamp": pl.Float64,
            "name": pl.String,
            "labels": pl.String,
            "value": pl.Float64,
        },
    ).write_parquet(cell / "metrics.parquet")
    info = {
        "cell": cell.name,
        "target": "http://127.0.0.1:8000",
        "target_knobs": target_knobs,
        "target_info": {"before": VLLM_INFO, "after": info_after or VLLM_INFO},
        "machine": {"cpu_model": "Test CPU", "cores": 2},
    }
    (cell / "run.json").write_text(json.dumps(info))
    return cell
