"""`schedscope serve` as a real subprocess: graceful shutdown on SIGTERM (in-flight
requests finish within the bound, or are aborted at it; new requests get 503; exit 0),
the API key from the environment, and flag mistakes exiting 2."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.core.cost_model import CostModel
from harness.cli import app
from harness.serve.local_server import CliServer, HttpClient
from tests.support.paths import REPO
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow]


@pytest.fixture()
def slow_cost_model(tmp_path) -> Path:
    """10 ms per step: a 200-token request is in flight for about two seconds."""
    path = tmp_path / "cost.json"
    CostModel.constant(0.01).save(path)
    return path


def in_background(fn, *args) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(fn(*args)))
    thread.start()
    return thread, result


def running(url: str) -> int:
    return json.loads(HttpClient(url).request("GET", "/health")[2])["num_running"]


def test_sigterm_lets_in_flight_requests_finish_and_refuses_new_ones(slow_cost_model):
    with CliServer(
        [
            "--executor",
            "sim",
            "--cost-model",
            str(slow_cost_model),
            "--shutdown-timeout-s",
            "10",
            "--served-model-name",
            "served",
        ]
    ) as server:
        body = {"model": "served", "prompt": "a b", "max_tokens": 200, "ignore_eos": True}
        thread, result = in_background(HttpClient(server.url).post_json, "/v1/completions", body)
        wait_for(lambda: running(server.url) == 1, "one running", timeout_s=10)
        server.terminate()
        signalled = time.monotonic()
        wait_for(lambda: "shutting down" in server.output(), "shutting down", timeout_s=10)

        http = HttpClient(server.url)
        status, _, data = http.post_json("/v1/completions", {**body, "max_tokens": 1})
        assert status == 503 and json.loads(data)["error"]["code"] == "service_unavailable"
        status, _, data = http.request("GET", "/health")
        assert status == 503 and json.loads(data)["state"] == "draining"

        thread.join(15)
        status, _, data = result[0]
        assert status == 200, data
        assert json.loads(data)["usage"]["completion_tokens"] == 200
        assert server.wait(15) == 0
        assert time.monotonic() - signalled < 10


def test_sigterm_aborts_what_is_left_at_the_bound(slow_cost_model):
    with CliServer(
        ["--executor", "sim", "--cost-model", str(slow_cost_model), "--shutdown-timeout-s", "0.5"],
        env={"SCHEDSCOPE_API_KEY": "k"},
    ) as server:
        auth = {"Authorization": "Bearer k"}
        assert (
            HttpClient(server.url).post_json(
                "/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 1}
            )[0]
            == 401
        )
        long = {"model": "tiny", "prompt": "a b", "max_tokens": 1000, "ignore_eos": True}
        stream, streamed = in_background(
            HttpClient(server.url).post_json, "/v1/completions", {**long, "stream": True}, auth
        )
        plain, answered = in_background(
            HttpClient(server.url).post_json, "/v1/completions", long, auth
        )
        wait_for(lambda: running(server.url) == 2, "two running", timeout_s=10)
        server.terminate()
        signalled = time.monotonic()
        stream.join(10)
        plain.join(10)
        status, _, data = answered[0]
        assert status == 503 and "shutting down" in json.loads(data)["error"]["message"]
        status, _, data = streamed[0]
        assert status == 200
        events = data.split(b"\n\n")
        assert events[-2:] == [b"data: [DONE]", b""]
        assert "shutting down" in json.loads(events[-3][6:])["error"]["message"]
        assert server.wait(10) == 0
        # 1,000 steps of 10 ms would be 10 s; the bound is 0.5 s (+ the loop's stop). A
        # wide margin: this tells "aborted at the bound" from "ran to the end", no more.
        assert time.monotonic() - signalled < 8


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--max-num-seqs", "0"], "max_num_seqs"),
        (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization"),
        (["--executor", "tpu"], "--executor"),
        (["--port", "70000"], "--port"),
        (["--max-body-bytes", "0"], "--max-body-bytes"),
        (["--max-connections-per-client", "0"], "--max-connections-per-client"),
        (["--max-tokenize-body-bytes", "0"], "--max-tokenize-body-bytes"),
        (["--max-tokenize-tokens", "-1"], "--max-tokenize-tokens"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(args, fragment):
    result = CliRunner().invoke(app, ["serve", "--executor", "sim", *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output


@pytest.mark.torch_model
def test_the_serving_line_is_the_first_line_on_stdout_with_the_torch_executor(tmp_path):
    """Scripts read the URL from the first stdout line; the KV-cache plan and every log
    line go to stderr (the engine process's as well as the server's)."""
    import signal
    import subprocess
    import sys

    root = REPO
    stderr = (tmp_path / "stderr.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "serve",
            "--executor",
            "torch",
            "--port",
            "0",
            "--max-model-len",
            "256",
        ],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    try:
        first = process.stdout.readline()
        assert first.startswith("schedscope serving on http://127.0.0.1:"), first
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        stderr.close()
    assert "KV cache:" in (tmp_path / "stderr.log").read_text()


@pytest.mark.parametrize("core", ["process", "thread"])
def test_record_decisions_writes_every_decision_at_shutdown(tmp_path, core):
    import polars as pl

    out = tmp_path / "decisions.parquet"
    with CliServer(
        ["--executor", "sim", "--engine-core", core, "--record-decisions", str(out)]
    ) as server:
        client = HttpClient(server.url)
        for i in range(3):
            status, _, _ = client.request(
                "POST",
                "/v1/completions",
                json.dumps({"model": "tiny", "prompt": "a b", "max_tokens": 2}).encode(),
                {"X-Request-Id": f"r{i}"},
            )
            assert status == 200
        client.close()
        server.terminate()
        assert server.wait(30) == 0
    decisions = pl.read_parquet(out)
    admits = decisions.filter(pl.col("kind") == "admit")
    assert sorted(admits["request_id"]) == ["r0", "r1", "r2"]
    assert {"reason", "mode", "time", "step", "predicted_swap_s"} <= set(decisions.columns)


def test_cached_prompt_tokens_reach_the_response_and_the_records(tmp_path):
    """The engine process's end of a request carries its cached prompt tokens to the
    API process (``usage.prompt_tokens_details.cached_tokens``; the thread core's path
    is test_server_openai's), and
    ``--record-requests`` writes them (``cached_tokens``); ``--no-enable-prefix-caching``
    finds none."""
    import polars as pl

    shared = [1000 + i for i in range(32)]
    for caching, expected in (("--enable-prefix-caching", 32), ("--no-enable-prefix-caching", 0)):
        out = tmp_path / f"requests{caching}.parquet"
        args = ["--executor", "sim", caching, "--record-requests", str(out)]
        with CliServer(args) as server:
            client = HttpClient(server.url)
            cached = []
            for i, tail in enumerate((7, 9)):
                body = {"model": "tiny", "prompt": shared + [tail] * 8, "max_tokens": 2}
                status, _, raw = client.post_json(
                    "/v1/completions", body, {"X-Request-Id": f"r{i}"}
                )
                assert status == 200, raw
                cached.append(json.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"])
            client.close()
            server.terminate()
            assert server.wait(30) == 0
        assert cached == [0, expected], caching
        records = pl.read_parquet(out).sort("request_id")
        assert records["cached_tokens"].to_list() == [0, expected]
