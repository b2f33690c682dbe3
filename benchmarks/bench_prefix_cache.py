"""Prefix caching in the torch executor: the time to first token of a request whose
prompt shares a 1,000-token prefix with an earlier one, with the cache (only its suffix
is prefilled, attending over the cached blocks) and without (the whole prompt is).

Each round serves, on one engine per mode, a warm-up request with the shared prefix and
then the measured request (the same prefix, its own 24-token suffix, one output token):
its first step's wall time is the TTFT here (no queue, no network). Rounds alternate the
modes so the machine's drift falls on both. Target: cached TTFT <= 0.25x uncached (the
suffix is 2% of the prompt; attention over the cached context and the step's fixed cost
remain). The outputs of both modes are compared token for token.

Run: .venv/bin/python benchmarks/bench_prefix_cache.py [--model tiny] [--prefix 1000]
     [--device cpu|cuda] [--quick: 3 rounds] [--json FILE]
"""

from __future__ import annotations

import statistics
import time

import torch

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.clock import WallClock
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.factory import build_torch_engine
from engine.worker.model import build_model
from engine.worker.model_config import ModelConfig
from harness.bench.figure import Figure
from harness.bench.script import BenchParser, bench_main

TARGET = 0.25
SUFFIX = 24
BLOCK = 16


def parser() -> BenchParser:
    parser = BenchParser(description=__doc__)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prefix", type=int, default=1000)
    parser.sized("--rounds", type=int, full=7, quick=3)
    parser.add_device()
    return parser


def _engine(model, name: str, caching: bool, max_len: int):
    config = EngineConfig(
        SchedulerConfig(max_model_len=max_len, max_num_batched_tokens=max_len),
        CacheConfig(
            block_size=BLOCK,
            num_gpu_blocks_override=4 * (max_len // BLOCK + 1),
            num_cpu_blocks_override=0,
            enable_prefix_caching=caching,
        ),
        model=name,
    )
    return build_torch_engine(config, WallClock(), device=model.device, model=model)


def _serve(engine, name: str, prompt: list[int]) -> tuple[float, list[int], int]:
    """(seconds of the request's first step, its output, its cached prompt tokens)."""
    seq = engine.add_request(EngineRequest(name, prompt, SamplingParams(max_tokens=1)))
    start = time.perf_counter()
    engine.step()  # ends with the sampled token on the host: the device has finished
    seconds = time.perf_counter() - start
    while engine.has_unfinished():
        engine.step()
    return seconds, list(seq.output_token_ids), seq.num_cached_tokens


def run(args) -> list[Figure]:
    config = ModelConfig.preset(args.model)
    model = build_model(config, args.device)
    vocab = config.vocab_size
    prefix = [3 + (7 * j) % (vocab - 3) for j in range(args.prefix)]
    max_len = -(-(args.prefix + SUFFIX + 8) // BLOCK) * BLOCK  # whole blocks: the budget
    times: dict[bool, list[float]] = {True: [], False: []}
    outputs: dict[bool, list[list[int]]] = {True: [], False: []}
    cached_tokens = 0
    with torch.inference_mode():
        engines = {mode: _engine(model, config.name, mode, max_len) for mode in (True, False)}
        for r in range(args.rounds):
            suffix = [3 + (11 * r + 5 * j) % (vocab - 3) for j in range(SUFFIX)]
            for mode in (True, False):
                engine = engines[mode]
                _serve(engine, f"warm{r}", prefix + [4] * SUFFIX)
                seconds, out, cached = _serve(engine, f"measured{r}", prefix + suffix)
                times[mode].append(seconds)
                outputs[mode].append(out)
                if mode:
                    cached_tokens = cached
    cached_ms = statistics.median(times[True]) * 1e3
    uncached_ms = statistics.median(times[False]) * 1e3
    ratio = cached_ms / uncached_ms
    same = outputs[True] == outputs[False]
    verdict = "MET" if ratio <= TARGET else "MISSED"
    print(
        f"model {config.name} on {args.device}: prompt {args.prefix} shared + {SUFFIX} own "
        f"tokens, {args.rounds} rounds"
    )
    print(f"TTFT with the cache:    {cached_ms:8.2f} ms  ({cached_tokens} prompt tokens cached)")
    print(f"TTFT without the cache: {uncached_ms:8.2f} ms")
    print(
        f"cached / uncached:      {ratio:8.2f}x   target <= {TARGET}x   {verdict}; outputs "
        f"{'identical' if same else 'DIFFERENT'}"
    )
    note = f"{args.prefix}-token shared prefix, model {config.name}, on {args.device}"
    return [
        Figure("TTFT with the prefix cached", cached_ms, "ms", note=note),
        Figure("TTFT without the prefix cache", uncached_ms, "ms", note=note),
        Figure("TTFT cached / uncached", ratio, "x", TARGET, note=note),
    ]


if __name__ == "__main__":
    bench_main(parser, run)
