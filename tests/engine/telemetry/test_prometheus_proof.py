"""Proof against a real Prometheus (Debian's ``prometheus``).

``schedscope serve --executor sim`` (the engine process path) runs under a short load
with memory pressure — a KV pool too small for the concurrent requests and a host pool
too small for every swap, so requests are preempted by swap and by recompute and
stall. A real Prometheus scrapes its ``/metrics`` every second with exemplar storage on.
While the load still runs:

- every panel query of schedscope's dashboards (``harness.grafana.dashboards.panel_queries``),
  its variables substituted, returns data (at least one finite sample);
- the prefix cache's series are scraped, with hits (the prompts share their first blocks),
  by conversation turn too (most requests say theirs in ``X-Session-Turn``);
- so does every query of vLLM's own published Grafana dashboard (tests/data);
- Prometheus returns exemplars for the latency histograms, whose trace ids are
  32-hex W3C trace ids.

Bounded: about 30 s (45 s at most, when stalls come late); every process is stopped
by the id we started.
"""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path

import pytest

from engine.core.cost_model import CostModel
from harness.grafana.dashboards import panel_queries, substitute
from harness.run.prometheus import PrometheusServer, find_prometheus
from harness.serve.local_server import CliServer
from tests.support.background_load import BackgroundLoad
from tests.support.paths import DATA
from tests.support.prometheus_results import has_data

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

MODEL = "proof"
VLLM_QUERIES = DATA / "vllm_grafana_queries.txt"
SHARED_WORDS = 40  # two and a half 16-token blocks

if find_prometheus() is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("Debian's prometheus is required in CI (make test installs it)")
    pytest.skip("prometheus is not installed (make test installs it)", allow_module_level=True)


@pytest.fixture(scope="module")
def cost_model(tmp_path_factory) -> Path:
    """8 ms steps: a request preempted for a few dozen steps stalls past 250 ms."""
    path = tmp_path_factory.mktemp("cost") / "cost.json"
    CostModel.constant(0.008).save(path)
    return path


def _request(thread: int, n: int) -> tuple[dict, dict[str, str]]:
    """Short and long classes, half of them with a client traceparent."""
    rng = random.Random(thread * 100_003 + n)
    long = rng.random() < 0.4
    words = rng.randint(60, 120) if long else rng.randint(5, 30)
    headers = {"X-Request-Class": "long" if long else "short"}
    if (thread + n) % 5 < 3:  # a turn on 3 in 5 (not drawn: the load's draws stay as
        headers["X-Session-Turn"] = str(1 + (7 * thread + n) % 6)  # they were)
    if rng.random() < 0.5:
        headers["traceparent"] = f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-01"
    body = {
        "model": MODEL,
        "prompt": _prompt(thread, n, words, long),
        "stream": True,
        "max_tokens": rng.randint(60, 120) if long else rng.randint(8, 30),
        "ignore_eos": True,
    }
    return body, headers


def _prompt(thread: int, n: int, words: int, long: bool) -> str:
    """Every prompt opens with the same words (prefix-cache hits); a long prompt then goes
    on with words of its own, so its blocks are not shared and the small KV pool preempts."""
    if not long:
        return " ".join(["w"] * words)
    own = [f"t{thread}n{n}i{i}" for i in range(words - SHARED_WORDS)]
    return " ".join(["w"] * SHARED_WORDS + own)


def _wait_for_every_panel(prometheus, deadline_s: float) -> None:
    """Until every panel query has data or the deadline: a rate() panel needs its series
    to grow between two scrapes, and on a busy machine the first stalls may come late."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        queries = panel_queries({"model_name": MODEL})
        if all(has_data(prometheus.query(query.expr)) for query in queries):
            return
        time.sleep(1)


@pytest.fixture(scope="module")
def scraped(cost_model):
    args = [
        "--executor",
        "sim",
        "--cost-model",
        str(cost_model),
        "--served-model-name",
        MODEL,
        "--num-gpu-blocks-override",
        "40",
        "--num-cpu-blocks-override",
        "12",
        "--block-size",
        "16",
        "--max-num-seqs",
        "8",
        "--max-model-len",
        "512",
        "--preemption-mode",
        "swap",
    ]
    with CliServer(args) as server:
        target = server.url.removeprefix("http://")
        with (
            BackgroundLoad(server.url, 8, _request, timeout_s=30, join_s=30) as load,
            PrometheusServer([target]) as prometheus,
        ):
            time.sleep(8)  # several scrapes under load: rate() windows have data
            _wait_for_every_panel(prometheus, deadline_s=15)
            yield prometheus, load
        assert load.num_done > 20


def test_every_dashboard_panel_returns_data_from_a_live_engine(scraped):
    prometheus, _ = scraped
    empty = []
    for query in panel_queries({"model_name": MODEL}):
        if not has_data(prometheus.query(query.expr)):
            empty.append(
                f"{query.dashboard_uid} / {query.panel_title} [{query.ref_id}]: {query.expr}"
            )
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_the_prefix_cache_series_are_scraped_with_hits(scraped):
    """The load's prompts repeat one word, so they share their first blocks: the prefix
    cache's series (vLLM's names and schedscope's) are scraped, and hits are counted."""
    prometheus, _ = scraped

    def total(expr: str) -> float:
        samples = prometheus.query(f'sum({expr}{{model_name="{MODEL}"}})')
        return float(samples[0]["value"][1]) if samples else float("nan")

    hits = total("vllm:prefix_cache_hits_total")
    assert 0 < hits <= total("vllm:prefix_cache_queries_total")
    assert total("vllm:prompt_tokens_cached_total") > 0
    # by source: each prompt whole at its admission; prompt_tokens_total: as steps compute
    # it (a prefill in flight at the scrape is in the first, not yet all in the second)
    assert total("vllm:prompt_tokens_by_source_total") >= total("vllm:prompt_tokens_total") > 0
    # by turn: first admissions only (vLLM's counters add recomputes' re-admissions)
    by_turn = prometheus.query(
        f'sum by (turn) (schedscope_prefix_cache_hits_by_turn_total{{model_name="{MODEL}"}})'
    )
    turns = {sample["metric"]["turn"] for sample in by_turn if float(sample["value"][1]) > 0}
    assert {"1", "2", "5+", "unknown"} <= turns, turns
    assert 0 < total("schedscope_prefix_cache_hits_by_turn_total") <= hits
    queried = total("schedscope_prefix_cache_queries_by_turn_total")
    assert 0 < queried <= total("vllm:prefix_cache_queries_total")
    for name in (
        "vllm:gpu_prefix_cache_hit_rate",
        "schedscope_prefix_cache_evicted_blocks_total",
        "schedscope_prefix_cache_evicted_prefix_tokens_total",
    ):
        assert has_data(prometheus.query(f'{name}{{model_name="{MODEL}"}}')), name


def test_every_query_of_vllms_published_dashboard_returns_data(scraped):
    prometheus, _ = scraped
    queries = [
        line
        for line in VLLM_QUERIES.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert len(queries) == 29
    empty = []
    for expr in queries:
        concrete = substitute(expr, {"model_name": MODEL, "__rate_interval": "1m"})
        if not has_data(prometheus.query(concrete)):
            empty.append(concrete)
    assert not empty, "vLLM dashboard queries without data:\n" + "\n".join(empty)


@pytest.mark.parametrize(
    "histogram",
    [
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:request_queue_time_seconds_bucket",
        "schedscope_stall_duration_seconds_bucket",
    ],
)
def test_prometheus_stores_exemplars_with_trace_ids(scraped, histogram):
    prometheus, _ = scraped
    now = time.time()
    series = prometheus.query_exemplars(f'{histogram}{{model_name="{MODEL}"}}', now - 120, now)
    exemplars = [e for s in series for e in s["exemplars"]]
    assert exemplars, f"no exemplars for {histogram}"
    assert all(re.fullmatch(r"[0-9a-f]{32}", e["labels"]["trace_id"]) for e in exemplars)
