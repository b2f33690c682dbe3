"""What a supervisor (systemd, Kubernetes) sees of `schedscope serve` when its engine
fails: an engine process that dies takes the server down with a non-zero exit (every
stream told first, the child reaped), a hung or stopped engine turns /health to 503
``stalled`` until it steps again, and a server stopped while its engine hangs still ends
every stream with an error and exits non-zero. Real subprocesses on 127.0.0.1, the
engine stopped and killed with real signals."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import threading
import time

import psutil
import pytest
from typer.testing import CliRunner

from engine.api.server import ServerSettings
from engine.config import EngineConfig
from engine.core.request import EngineRequest
from engine.core.sampling_params import SamplingParams
from engine.serving.async_engine import AsyncEngine
from engine.serving.engine_core import EngineCoreSpec
from engine.serving.process_engine import ProcessEngine
from engine.serving.tokenizer import HashTokenizer
from harness.cli import app
from harness.serve.local_server import BackgroundServer, CliServer, HttpClient, sim_engine
from tests.support.served import engine_process, health, open_stream, read_stream
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow]

BODY = {"model": "tiny", "prompt": "a b c", "max_tokens": 1000, "ignore_eos": True}
STREAM = {**BODY, "stream": True}


@pytest.fixture
def slow_steps(tmp_path):
    """A cost model whose every step takes 10 ms: 1000 tokens take 10 s."""
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({"step_overhead_s": 0.01}))
    return ["--executor", "sim", "--cost-model", str(path)]


def test_a_killed_engine_fails_every_stream_then_the_server_exits_1_leaving_no_zombie(
    slow_steps,
):
    with CliServer(slow_steps) as server:
        core = engine_process(server)
        streams = [open_stream(server.url, STREAM) for _ in range(4)]
        wait_for(lambda: health(server.url)[1]["num_running"] == 4, "4 running")
        core.kill()
        received = [read_stream(sock) for sock in streams]
        code = server.wait(30)  # no signal: the engine's death alone ends the server
        output = server.output()
    for stream in received:
        assert b"data: [DONE]" in stream, stream[-300:]
        assert b'"error"' in stream and b"engine process exited (code -9)" in stream
    assert code == 1, output
    # reaped by the server (its exit code read) before it exited, not left a zombie
    assert "the engine process exited (code -9)" in output, output
    assert not core.is_running()


def test_a_stopped_engine_with_work_is_stalled_on_health_until_it_steps_again(slow_steps):
    with CliServer([*slow_steps, "--engine-liveness-timeout-s", "1"]) as server:
        core = engine_process(server)
        time.sleep(1.5)  # idle past the deadline: an idle engine owes no step
        code, body = health(server.url)
        assert (code, body["state"], body["seconds_without_progress"]) == (200, "running", None)
        sock = open_stream(server.url, STREAM)
        try:
            wait_for(lambda: health(server.url)[1]["num_running"] == 1, "the stream running")
            core.suspend()
            try:
                code, body = wait_for(
                    lambda: (r := health(server.url))[1]["state"] == "stalled" and r,
                    "/health to say stalled",
                )
                assert code == 503 and body["status"] == "unavailable"
                assert body["seconds_without_progress"] >= 1.0
                assert HttpClient(server.url).request("GET", "/ping")[0] == 503
                steps_when_stalled = body["num_steps"]
            finally:
                core.resume()
            code, body = wait_for(
                lambda: (r := health(server.url))[0] == 200 and r, "/health to recover"
            )
            assert body["state"] == "running" and body["num_steps"] > steps_when_stalled
        finally:
            sock.close()


def test_a_sigterm_while_the_engine_hangs_ends_every_response_with_an_error_and_exits_1(
    slow_steps,
):
    """The engine never answers the stop: it is killed, and what was in flight is told
    so (an SSE error event, a 500 for a non-streamed request), not cut off."""
    with CliServer([*slow_steps, "--shutdown-timeout-s", "1"], stop_timeout_s=60) as server:
        core = engine_process(server)
        streams = [open_stream(server.url, STREAM) for _ in range(3)]
        answers: list = []
        non_streamed = threading.Thread(
            target=lambda: answers.append(
                HttpClient(server.url, timeout=60).post_json("/v1/completions", BODY)
            )
        )
        non_streamed.start()
        wait_for(lambda: health(server.url)[1]["num_running"] == 4, "4 running")
        core.suspend()
        try:
            server.terminate()
            received = [read_stream(sock) for sock in streams]
            non_streamed.join(60)
            code = server.wait(60)
        finally:
            with contextlib.suppress(psutil.NoSuchProcess):
                core.resume()
                core.kill()
        output = server.output()
    for stream in received:
        assert b"data: [DONE]" in stream, stream[-300:]
        assert b'"error"' in stream and b"did not stop" in stream and b"was killed" in stream
    status, _, raw = answers[0]
    assert status == 500 and b"was killed" in raw, raw
    assert code == 1, output


def test_a_dead_engine_process_leaves_nothing_unfinished_and_says_why():
    """The API process's view once the engine process is gone: its requests are failed
    (none unfinished), ``failure`` names the death, and ``wait_lost`` returns it."""

    async def scenario():
        engine = ProcessEngine(EngineCoreSpec(EngineConfig(), "sim"))
        engine._loop = asyncio.get_running_loop()
        engine.state = "running"
        engine.stats.num_running, engine.stats.num_waiting = 18, 2
        receive, send = multiprocessing.Pipe(duplex=False)
        send.close()  # the engine process is gone
        engine._outputs = receive
        engine._process = _DeadProcess()
        await asyncio.to_thread(engine._read)
        return await asyncio.wait_for(engine.wait_lost(), 5), engine

    why, engine = asyncio.run(scenario())
    assert why == engine.failure == "the engine process exited (code -9)"
    assert engine.state == "failed" and engine.stats.num_unfinished == 0
    assert engine._process.joined  # reaped


class _DeadProcess:
    exitcode = -9
    joined = False

    def join(self, timeout=None) -> None:
        self.joined = True


def test_work_coming_to_an_idle_engine_starts_its_liveness_clock_afresh():
    """An engine idle for a long time has not stalled when a request comes: the clock
    of /health's ``seconds_without_progress`` starts with the work, not the last step."""

    async def scenario():
        engine = AsyncEngine(sim_engine())  # not started: nothing steps
        engine._loop = asyncio.get_running_loop()
        engine.state = "running"
        engine._progress_at -= 3600  # the last sign of life, an hour ago
        assert engine.seconds_without_progress() is None  # idle: owes nothing
        request = EngineRequest("r", [1, 2, 3], SamplingParams(max_tokens=2))
        adding = asyncio.ensure_future(engine._add(request))
        await asyncio.sleep(0)
        without_progress_s = engine.seconds_without_progress()
        adding.cancel()
        return without_progress_s

    assert asyncio.run(scenario()) < 60


def test_the_thread_engine_core_is_stalled_while_a_step_outlasts_the_deadline():
    """``--engine-core thread`` has the same deadline: a step longer than it (here every
    step takes 2 s, the deadline is 0.5 s) is a stall while it lasts, and recovers."""
    settings = ServerSettings(
        host="127.0.0.1", port=0, shutdown_timeout_s=5.0, engine_liveness_timeout_s=0.5
    )
    with BackgroundServer(sim_engine(step_s=2.0), HashTokenizer(4096), settings) as server:
        assert server.health()["state"] == "running"
        answers: list = []
        request = threading.Thread(
            target=lambda: answers.append(
                HttpClient(server.url).post_json("/v1/completions", {**BODY, "max_tokens": 1})
            )
        )
        request.start()
        body = wait_for(lambda: (h := server.health())["state"] == "stalled" and h, "stalled", 10)
        assert body["seconds_without_progress"] >= 0.5
        request.join(30)
        assert answers[0][0] == 200
        body = server.health()
        assert (body["state"], body["seconds_without_progress"]) == ("running", None)


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_liveness_timeout_that_is_not_a_number_of_seconds_exits_2_naming_the_flag(value):
    result = CliRunner().invoke(
        app,
        ["serve", "--executor", "sim", "--engine-liveness-timeout-s", value],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 2, result.output
    assert "Invalid value for --engine-liveness-timeout-s: must be a number" in result.output
