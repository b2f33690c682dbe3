"""Continuous vs static batching on the same workload with the torch executor.

Workload: N requests arriving at once (an offline batch), prompts of 32-128 tokens and
heavy-tailed output lengths (lognormal, median 24, sigma 1.0, at most 400) — the mix
where static batching wastes slots on requests that finished early. Both runs use the
same engine knobs (max_num_seqs 16) and the real model on the wall clock.
Target: output tokens/s ratio (continuous / static) >= 3x.

Run: .venv/bin/python benchmarks/bench_batching.py [--requests 96]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from engine.clock import WallClock
from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.model import build_model
from engine.model_config import ModelConfig
from engine.model_runner import build_torch_engine
from engine.sequence import SamplingParams

TARGET_RATIO = 3.0


def workload(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = np.random.default_rng(seed)
    prompts = rng.integers(32, 129, n)
    outputs = np.clip(np.round(rng.lognormal(np.log(24), 1.0, n)), 1, 400).astype(int)
    return [([3 + (i * 31 + j) % 4000 for j in range(int(p))], int(o))
            for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))]


def run(batching: str, requests, model) -> tuple[int, float]:
    config = EngineConfig(
        SchedulerConfig(max_num_seqs=16, batching=batching, static_batch_timeout_s=0.0),
        CacheConfig(num_gpu_blocks_override=4096, num_cpu_blocks_override=0),
    )
    engine = build_torch_engine(config, WallClock(), model=model)
    start = time.perf_counter()
    seqs = [engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=out, ignore_eos=True))
            for i, (prompt, out) in enumerate(requests)]
    while engine.has_unfinished():
        engine.step()
    elapsed = time.perf_counter() - start
    return sum(s.num_output_tokens for s in seqs), elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    model = build_model(ModelConfig.preset(args.model))
    requests = workload(args.requests)
    with torch.inference_mode():
        tokens_c, t_c = run("continuous", requests, model)
        tokens_s, t_s = run("static", requests, model)
    assert tokens_c == tokens_s
    rate_c, rate_s = tokens_c / t_c, tokens_s / t_s
    ratio = rate_c / rate_s
    print(f"{args.requests} requests, {tokens_c} output tokens, max_num_seqs 16")
    print(f"continuous: {t_c:7.2f} s  {rate_c:9,.0f} output tokens/s")
    print(f"static:     {t_s:7.2f} s  {rate_s:9,.0f} output tokens/s")
    print(f"ratio: {ratio:.2f}x   target >= {TARGET_RATIO}x   {'MET' if ratio >= TARGET_RATIO else 'MISSED'}")


if __name__ == "__main__":
    main()
