"""``schedscope run --target <vLLM>`` with the session and shared-prefix profiles: the
run finishes with every request ok, and vLLM's own prefix-cache counters (their change
over the run) show the reuse the profile asks for, within 10 points: the reuse its
schedule holds, which the bundled simulator measures on the same plan with vLLM's block
size and a pool that never evicts. So the shared parts of schedscope's prompts are
token-identical under vLLM's tokenizer and chat template, and a session's later turns
send back the answers vLLM gave."""

from __future__ import annotations

import os
import subprocess
import sys

import polars as pl
import pytest

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from harness.profiles import resolve_profile
from harness.simulate.driver import simulate
from tests.support.paths import REPO
from tests.vllm.test_vllm_prefix_cache import cache_config, counter

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

#: (profile, duration scale, rate scale): a few dozen requests each
CASES = [("chat_sessions", 0.25, 1.0), ("shared_prefix", 0.15, 0.5)]


def asked_reuse(name: str, duration: float, rate: float, block_size: int) -> float:
    """The prefix-cache hit rate the profile's schedule holds: simulated with prefix
    caching, vLLM's block size and a pool that never evicts."""
    profile = resolve_profile(name).with_duration_scale(duration).with_rate_scale(rate)
    config = EngineConfig(
        SchedulerConfig(max_model_len=4096, max_num_batched_tokens=4096),
        CacheConfig(block_size=block_size, num_gpu_blocks_override=100_000),
    )
    frame = simulate(profile, config).requests
    return frame["cached_tokens"].sum() / frame["prompt_tokens"].sum()


@pytest.mark.parametrize("name, duration, rate", CASES)
def test_a_target_run_shows_vllm_hitting_the_reuse_the_profile_asks_for(
    vllm_server, tmp_path, name, duration, rate
):
    url = vllm_server.url
    block_size = int(cache_config(url)["block_size"])
    queries0 = counter(url, "vllm:prefix_cache_queries_total")
    hits0 = counter(url, "vllm:prefix_cache_hits_total")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            "--target",
            url,
            "--profile",
            name,
            "--duration-scale",
            str(duration),
            "--rate-scale",
            str(rate),
            "--out",
            str(tmp_path / "run"),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    frames = list((tmp_path / "run").rglob("requests.parquet"))
    assert frames
    frame = pl.read_parquet(frames[0])
    assert frame.height and set(frame["status"]) == {"ok"}, frame["status"].value_counts()
    queries = counter(url, "vllm:prefix_cache_queries_total") - queries0
    hits = counter(url, "vllm:prefix_cache_hits_total") - hits0
    assert queries > 0
    vllm_rate = hits / queries
    asked = asked_reuse(name, duration, rate, block_size)
    print(f"{name}: vLLM hit rate {vllm_rate:.3f}, the schedule's reuse {asked:.3f}")
    assert abs(vllm_rate - asked) <= 0.10, (vllm_rate, asked)
    if name == "chat_sessions":
        later = frame.filter(pl.col("turn") > 1)
        assert later.height and later["cached_tokens"].sum() > 0
