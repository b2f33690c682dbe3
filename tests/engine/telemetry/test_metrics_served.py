"""GET /metrics on a live server: thread mode (BackgroundServer) and the engine process
(``schedscope serve --executor sim`` through CliServer). Every metric name that
docs/metrics.md lists is exposed; OpenMetrics negotiation returns exemplars whose trace
ids are those of real requests; the output passes ``promtool check metrics``."""

from __future__ import annotations

import re

import pytest

from engine.api import ServerSettings
from engine.serving.tokenizer import HashTokenizer
from engine.telemetry.metrics import install_metrics
from harness.serve.local_server import BackgroundServer, CliServer, HttpClient, sim_engine
from tests.support.components import check_with_promtool

pytestmark = [pytest.mark.slow]

#: Every name a dashboard may query, as exposed (counters with their _total).
EXPOSED = {
    "counter": [
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:admission_rejections_total",
        "schedscope_decisions_total",
        "schedscope_preemptions_total",
        "schedscope_swap_fallbacks_total",
        "schedscope_stalls_total",
        "schedscope_idle_running_sequence_steps_total",
        "schedscope_swap_bytes_total",
        "schedscope_swap_blocks_total",
        "schedscope_recomputed_tokens_total",
        "schedscope_dropped_spans_total",
    ],
    "gauge": [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
        "vllm:cpu_cache_usage_perc",
        "vllm:num_requests_swapped",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_waiting_by_reason",
        "vllm:cache_config_info",
        "schedscope_idle_running_sequences",
        "schedscope_kv_blocks_free",
        "schedscope_kv_blocks_capacity",
        "schedscope_token_budget_tokens",
        "schedscope_scheduler_config_info",
    ],
    "histogram": [
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:iteration_tokens_total",
        "vllm:request_max_num_generation_tokens",
        "vllm:request_params_max_tokens",
        "vllm:request_params_n",
        "vllm:time_per_output_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_num_preemptions",
        "vllm:request_prefill_kv_computed_tokens",
        "schedscope_stall_duration_seconds",
        "schedscope_queue_time_seconds",
        "schedscope_step_duration_seconds",
        "schedscope_batch_tokens",
    ],
}

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def check_names(text: str) -> None:
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    samples = {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    for kind, names in EXPOSED.items():
        for name in names:
            assert types.get(name) == kind, (name, types.get(name))
            wanted = name + "_bucket" if kind == "histogram" else name
            assert wanted in samples, name


def generate(client: HttpClient, **headers) -> None:
    status, _, body = client.post_json(
        "/v1/completions",
        {"model": "tiny", "prompt": "hello there world", "max_tokens": 4},
        headers,
    )
    assert status == 200, body


def check_exemplars(body: bytes, content_type: str, trace_id: str) -> None:
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    text = body.decode()
    assert text.endswith("# EOF\n")
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "schedscope_queue_time_seconds",
    ):
        ids = re.findall(
            re.escape(name) + r'_bucket\{[^}]*\} \S+ # \{trace_id="([0-9a-f]{32})"\}', text
        )
        assert ids == [trace_id] * len(ids) and ids, name


def test_thread_mode_serves_every_name_and_exemplars_of_the_request():
    engine = sim_engine()
    install_metrics(engine, "tiny")
    settings = ServerSettings(host="127.0.0.1", port=0, shutdown_timeout_s=2.0, api_key="k")
    with BackgroundServer(engine, HashTokenizer(4096), settings) as server:
        client = HttpClient(server.url)
        generate(client, Authorization="Bearer k", traceparent=TRACEPARENT)
        status, headers, body = client.request("GET", "/metrics")  # no API key needed
        assert status == 200
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        text = body.decode()
        check_names(text)
        assert "trace_id" not in text
        assert re.search(
            r'^vllm:generation_tokens_total\{engine="0",model_name="tiny"\} 4\.0$', text, re.M
        )
        assert client.request("GET", "/v1/models")[0] == 401  # the API stays guarded
        status, headers, body = client.request(
            "GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT}
        )
        assert status == 200
        check_exemplars(body, headers["content-type"], TRACE_ID)
        client.close()
    check_with_promtool(text.encode())


def test_metrics_off_is_a_404():
    settings = ServerSettings(host="127.0.0.1", port=0, shutdown_timeout_s=2.0, metrics=False)
    with BackgroundServer(sim_engine(), HashTokenizer(4096), settings) as server:
        assert HttpClient(server.url).request("GET", "/metrics")[0] == 404
    # an engine without a registry: the route answers that it has none
    with BackgroundServer(sim_engine(), HashTokenizer(4096)) as server:
        status, _, body = HttpClient(server.url).request("GET", "/metrics")
        assert status == 404 and b"without metrics" in body


def test_engine_process_serves_metrics_rendered_in_the_child():
    with CliServer(["--executor", "sim", "--served-model-name", "m1"]) as server:
        client = HttpClient(server.url)
        status, _, body = client.post_json(
            "/v1/completions",
            {"model": "m1", "prompt": "hello there world", "max_tokens": 4},
            {"traceparent": TRACEPARENT},
        )
        assert status == 200, body
        status, headers, body = client.request("GET", "/metrics")
        assert status == 200, body
        text = body.decode()
        check_names(text)
        assert re.search(
            r'^vllm:generation_tokens_total\{engine="0",model_name="m1"\} 4\.0$', text, re.M
        )
        assert re.search(
            r'^vllm:request_success_total\{engine="0",finished_reason="length",'
            r'model_name="m1"\} 1\.0$',
            text,
            re.M,
        )
        status, headers, body = client.request(
            "GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT}
        )
        assert status == 200
        check_exemplars(body, headers["content-type"], TRACE_ID)
        client.close()
    check_with_promtool(text.encode())


@pytest.mark.parametrize("core", ["process", "thread"])
def test_no_metrics_flag(core):
    with CliServer(["--executor", "sim", "--no-metrics", "--engine-core", core]) as server:
        client = HttpClient(server.url)
        assert client.request("GET", "/metrics")[0] == 404
        assert client.request("GET", "/health")[0] == 200
        client.close()


def test_ten_thousand_request_classes_from_clients_make_33_series_over_http():
    """X-Request-Class is whatever clients send: 10,000 requests, each of its own class,
    through the engine process. The exposition keeps the first 32 classes and one
    class="other"; ``schedscope_request_class_overflow_total`` counts the 9,968 folded
    into it, and every request is in some class's count."""
    import asyncio

    import aiohttp

    from engine.telemetry.metrics import MAX_CLASS_LABELS, OTHER_CLASS

    num_requests, concurrency = 10_000, 32
    body = {"model": "tiny", "prompt": "a", "max_tokens": 1}

    async def client(url: str, session: aiohttp.ClientSession, first: int) -> list[int]:
        statuses = []
        for i in range(first, num_requests, concurrency):
            headers = {"X-Request-Class": f"class-{i}"}
            async with session.post(url + "/v1/completions", json=body, headers=headers) as r:
                await r.read()
                statuses.append(r.status)
        return statuses

    async def load(url: str) -> list[int]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            results = await asyncio.gather(*(client(url, session, i) for i in range(concurrency)))
        return [s for statuses in results for s in statuses]

    with CliServer(["--executor", "sim"]) as server:
        statuses = asyncio.run(load(server.url))
        http = HttpClient(server.url)
        status, _, raw = http.request("GET", "/metrics")
        http.close()
    assert status == 200 and statuses == [200] * num_requests
    text = raw.decode()
    classes = set(re.findall(r'\bclass="([^"]*)"', text))
    assert len(classes) == MAX_CLASS_LABELS + 1 and OTHER_CLASS in classes, len(classes)
    assert re.search(
        r"^schedscope_request_class_overflow_total\{[^}]*\} "
        + re.escape(f"{float(num_requests - MAX_CLASS_LABELS)}")
        + "$",
        text,
        re.M,
    ), [line for line in text.splitlines() if "overflow" in line]
    counts = {
        cls: float(value)
        for cls, value in re.findall(
            r'^schedscope_queue_time_seconds_count\{[^}]*class="([^"]*)"[^}]*\} (\S+)$', text, re.M
        )
    }
    assert counts[OTHER_CLASS] == num_requests - MAX_CLASS_LABELS
    assert sum(counts.values()) == num_requests
