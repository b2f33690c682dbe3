"""Engine-side paths through the server, with a scripted executor in-process: a step
that raises (500 / an error event, then the server keeps serving), stop strings (the
stop text left out, min_tokens honoured), and a client that leaves before the engine
accepted its request (the request must not run on without it)."""

from __future__ import annotations

import json
import socket
import time

import openai
import pytest

from engine.serving.tokenizer import HashTokenizer
from engine.sim.simulated_executor import SimulatedExecutor
from harness.serve.local_server import BackgroundServer, HttpClient, constant_step_cost, sim_engine

TOKENIZER = HashTokenizer(4096)
HALT = TOKENIZER.token_id("halt")


class ScriptedExecutor(SimulatedExecutor):
    """The wall-clock sim executor, plus: a step raises when it holds a request of
    ``fail_at`` whose output reached that many tokens; a request of ``scripts`` samples
    its script's tokens in order (the last one repeated)."""

    def __init__(self, step_s: float) -> None:
        super().__init__(constant_step_cost(step_s), sleep=True)
        self.fail_at: dict[str, int] = {}
        self.scripts: dict[str, list[int]] = {}

    def execute(self, out):
        for seq in out.seqs:
            limit = self.fail_at.get(seq.request_id)
            if limit is not None and seq.num_output_tokens >= limit:
                raise RuntimeError(f"injected failure in {seq.request_id}")
        result = super().execute(out)
        for i, seq in enumerate(out.seqs):
            script = self.scripts.get(seq.request_id)
            if script and result.sampled[i] is not None:
                result.sampled[i] = script[min(seq.num_output_tokens, len(script) - 1)]
        return result


def scripted_server(step_s: float) -> tuple[BackgroundServer, ScriptedExecutor]:
    engine = sim_engine(max_model_len=128)
    executor = ScriptedExecutor(step_s)
    engine.executor = executor
    return BackgroundServer(engine, TOKENIZER), executor


@pytest.fixture(scope="module")
def scripted():
    server, executor = scripted_server(0.001)
    with server:
        yield (
            server,
            executor,
            openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=30),
        )


def idle_and_leak_free(server: BackgroundServer, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        health = server.health()
        if (
            health["num_in_flight"] == 0
            and health["num_unfinished"] == 0
            and health["num_free_device_blocks"] == health["num_device_blocks"]
        ):
            return health
        assert time.monotonic() < deadline, health
        time.sleep(0.01)


def test_step_exception_fails_the_request_and_the_server_keeps_serving(scripted):
    server, executor, client = scripted
    failed_before = server.health()["num_failed_requests"]
    executor.fail_at["boom"] = 0
    with pytest.raises(openai.InternalServerError, match="injected failure in boom"):
        client.completions.create(
            model="tiny", prompt="a b", max_tokens=5, extra_headers={"X-Request-Id": "boom"}
        )

    executor.fail_at["boom-stream"] = 3
    stream = client.completions.create(
        model="tiny",
        prompt="a b",
        max_tokens=10,
        stream=True,
        extra_headers={"X-Request-Id": "boom-stream"},
    )
    texts = []
    with pytest.raises(openai.APIError, match="injected failure in boom-stream"):
        for chunk in stream:
            texts.append(chunk.choices[0].text)
    assert "".join(texts) == "w3 w3 w3"

    after = client.completions.create(model="tiny", prompt="a b", max_tokens=4)
    assert after.choices[0].finish_reason == "length" and after.usage.completion_tokens == 4
    health = idle_and_leak_free(server)
    assert health["num_failed_requests"] == failed_before + 2
    assert health["state"] == "running"


def test_raw_error_event_in_stream(scripted):
    server, executor, _ = scripted
    executor.fail_at["boom-raw"] = 1
    status, headers, body = HttpClient(server.url).post_json(
        "/v1/completions",
        {"model": "tiny", "prompt": "a", "max_tokens": 5, "stream": True},
        {"X-Request-Id": "boom-raw"},
    )
    assert status == 200
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    error = json.loads(events[-3][len(b"data: ") :])["error"]
    assert error["code"] == "engine_error" and "boom-raw" in error["message"]


def test_stop_string_is_left_out_of_the_text(scripted):
    _, executor, client = scripted
    w = TOKENIZER.decode
    executor.scripts["stop-1"] = [5, 6, HALT, 7]
    completion = client.completions.create(
        model="tiny",
        prompt="x",
        max_tokens=10,
        stop="halt",
        extra_headers={"X-Request-Id": "stop-1"},
    )
    assert completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].text == w([5, 6])
    assert completion.usage.completion_tokens == 3  # the stop token is generated, not shown

    # Before min_tokens the stop word is ordinary text; streamed text matches.
    executor.scripts["stop-2"] = [5, HALT, 6, HALT, 7]
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=10,
        stop=["halt"],
        stream=True,
        extra_body={"min_tokens": 4},
        extra_headers={"X-Request-Id": "stop-2"},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == w([5, HALT, 6])
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_client_leaving_before_acceptance_aborts():
    """The engine applies an add between steps; a client that disconnects while its add
    is pending (here: during a 0.2 s step) must not leave the request running."""
    server, executor = scripted_server(0.2)
    with server:
        host, port = server.url.removeprefix("http://").split(":")
        busy = HttpClient(server.url)
        import threading

        runner = threading.Thread(
            target=busy.post_json,
            args=("/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 3}),
        )
        runner.start()
        time.sleep(0.05)  # the engine is now inside a 0.2 s step
        body = json.dumps({"model": "tiny", "prompt": "b", "max_tokens": 20}).encode()
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            time.sleep(0.05)
        runner.join(5)
        # 20 steps of 0.2 s had the request run on; aborted, everything is idle at once.
        idle_and_leak_free(server, timeout=2.0)


def test_stream_failing_before_its_first_token_gets_a_500(scripted):
    _, executor, client = scripted
    executor.fail_at["boom-early"] = 0
    with pytest.raises(openai.InternalServerError, match="boom-early"):
        for _ in client.completions.create(
            model="tiny",
            prompt="a",
            max_tokens=3,
            stream=True,
            extra_headers={"X-Request-Id": "boom-early"},
        ):
            pass
