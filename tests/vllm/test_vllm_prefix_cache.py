"""Prefix caching on a real vLLM (V1: on by default) and on the bundled engine: one
shared-prefix schedule, the same block size and KV pool size, token-weighted hit rates
within 5 points of each other — vLLM's from its counters (the deltas over the
schedule: they are cumulative), schedscope's from its own records (requests.parquet's
``cached_tokens``) — and each request's ``usage.prompt_tokens_details.cached_tokens``
as both engines answer it.

The schedule: 4 prefixes of 6 blocks, each reused by 8 requests (round-robin, so a
prefix's blocks wait a few requests before their reuse), each with its own 20-token
suffix; sent one after another (the hits then depend on no timing). vLLM's pool size is
read from its ``vllm:cache_config_info``; the bundled engine (``--executor sim``: the
cache is the scheduler's and the block manager's, not the model's) gets that many
blocks.
"""

from __future__ import annotations

import json
import re
import urllib.request

import polars as pl
import pytest

from harness.serve.local_server import CliServer
from tests.support.vllm_server import SERVED_MODEL_NAME

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NUM_PREFIXES = 4
PER_PREFIX = 8
SUFFIX = 20


def cache_config(url: str) -> dict[str, str]:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    line = next(li for li in text.splitlines() if li.startswith("vllm:cache_config_info{"))
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def counter(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    values = re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert values, f"{name} is not exposed"
    return sum(float(v) for v in values)


def schedule(block_size: int) -> list[list[int]]:
    prefixes = [
        [100 + 37 * p + (13 * j) % 500 for j in range(6 * block_size)] for p in range(NUM_PREFIXES)
    ]
    prompts = []
    for i in range(NUM_PREFIXES * PER_PREFIX):
        suffix = [700 + (7 * i + 3 * j) % 500 for j in range(SUFFIX)]
        prompts.append(prefixes[i % NUM_PREFIXES] + suffix)
    return prompts


def send(url: str, prompt: list[int]) -> int:
    """One completion; the cached prompt tokens its usage reports."""
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt,
        "max_tokens": 4,
        "min_tokens": 4,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        url + "/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        usage = json.load(response)["usage"]
    assert usage["prompt_tokens"] == len(prompt), usage
    return usage["prompt_tokens_details"]["cached_tokens"]


def test_vllm_and_the_bundled_engine_hit_the_same_share_of_a_shared_prefix_schedule(
    vllm_server, tmp_path
):
    config = cache_config(vllm_server.url)
    block_size, num_blocks = int(config["block_size"]), int(config["num_gpu_blocks"])
    assert config["enable_prefix_caching"] == "True", config
    prompts = schedule(block_size)
    names = ("vllm:prompt_tokens_cached_total", "vllm:prompt_tokens_total")
    before = {n: counter(vllm_server.url, n) for n in names}
    vllm_cached = [send(vllm_server.url, p) for p in prompts]
    after = {n: counter(vllm_server.url, n) for n in names}
    vllm_rate = (after[names[0]] - before[names[0]]) / (after[names[1]] - before[names[1]])

    records = tmp_path / "requests.parquet"
    args = [
        "--executor",
        "sim",
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--block-size",
        str(block_size),
        "--num-gpu-blocks-override",
        str(num_blocks),
        "--max-model-len",
        "4096",
        "--record-requests",
        str(records),
    ]
    with CliServer(args) as server:
        ours_cached = [send(server.url, p) for p in prompts]
    frame = pl.read_parquet(records)
    ours_rate = frame["cached_tokens"].sum() / frame["prompt_tokens"].sum()

    expected = (NUM_PREFIXES * (PER_PREFIX - 1) * 6 * block_size) / sum(map(len, prompts))
    print(f"hit rates: vLLM {vllm_rate:.3f}, schedscope {ours_rate:.3f}, ideal {expected:.3f}")
    assert abs(vllm_rate - ours_rate) <= 0.05, (vllm_rate, ours_rate)
    assert ours_rate == pytest.approx(expected)
    assert sorted(frame["cached_tokens"].to_list()) == sorted(ours_cached)
    assert ours_cached == vllm_cached, (ours_cached, vllm_cached)
