"""`schedscope serve` runs its step loop in an engine process of its own (the
default, ``--engine-core process``): what that must not change for a user — and what
happens when that process fails. Real subprocesses on 127.0.0.1."""

from __future__ import annotations

import json
import signal
import threading
import time

import psutil
import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.serve.local_server import CliServer, HttpClient
from tests.support.served import engine_process, health

pytestmark = [pytest.mark.slow]

BODY = {"model": "tiny", "prompt": "a b c", "max_tokens": 5, "ignore_eos": True}


def test_serves_with_the_engine_in_its_own_process_and_leaves_none_behind():
    with CliServer(["--executor", "sim"]) as server:
        core = engine_process(server)
        status, _, raw = HttpClient(server.url).post_json("/v1/completions", BODY)
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 5
        code, body = health(server.url)
        assert code == 200 and body["num_steps"] >= 5
        assert body["num_free_device_blocks"] == body["num_device_blocks"] > 0
        # one clock for both processes: engine time maps to Unix time
        assert abs(body["clock_epoch_unix"] + body["engine_time_s"] - time.time()) < 0.5
        server.terminate()
        assert server.wait(30) == 0
    assert not core.is_running() or core.status() == psutil.STATUS_ZOMBIE


def test_a_ctrl_c_to_the_process_group_drains_instead_of_killing_the_engine(tmp_path):
    """SIGINT reaches the whole process group from a terminal: the engine process must
    ignore it, so the server can let in-flight requests finish."""
    slow = tmp_path / "cost.json"
    slow.write_text(json.dumps({"step_overhead_s": 0.01}))
    with CliServer(["--executor", "sim", "--cost-model", str(slow)]) as server:
        core = engine_process(server)
        result: list = []
        request = threading.Thread(
            target=lambda: result.append(
                HttpClient(server.url).post_json("/v1/completions", {**BODY, "max_tokens": 100})
            )
        )
        request.start()
        deadline = time.monotonic() + 10
        while health(server.url)[1]["num_running"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        core.send_signal(signal.SIGINT)
        server.process.send_signal(signal.SIGINT)
        request.join(30)
        assert server.wait(30) == 0
    status, _, raw = result[0]
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 100


def test_a_configuration_the_engine_process_refuses_exits_2_naming_it():
    result = CliRunner().invoke(
        app, ["serve", "--executor", "sim", "--gpu-memory-utilization", "0.001"]
    )
    assert result.exit_code == 2, result.output
    assert "gpu_memory_utilization" in result.output


@pytest.mark.torch_model
def test_both_engine_cores_serve_the_same_tokens():
    texts = {}
    for core in ("process", "thread"):
        with CliServer(["--executor", "torch", "--engine-core", core]) as server:
            status, _, raw = HttpClient(server.url).post_json(
                "/v1/completions", {**BODY, "temperature": 0.0, "max_tokens": 8}
            )
        assert status == 200
        texts[core] = json.loads(raw)["choices"][0]["text"]
    # greedy, seeded weights: the same text from both
    assert texts["process"] and texts["process"] == texts["thread"]


def test_an_unknown_engine_core_exits_2():
    result = CliRunner().invoke(app, ["serve", "--executor", "sim", "--engine-core", "gpu"])
    assert result.exit_code == 2 and "--engine-core" in result.output


def test_an_add_pending_when_the_engine_process_dies_is_refused_as_unavailable():
    """The API process's reader sees the engine's pipe close while an add awaits its
    answer: that caller gets EngineDeadError (the server's 503), not a bare 500."""
    import asyncio
    import multiprocessing

    from engine.config import EngineConfig
    from engine.core.request import EngineRequest
    from engine.serving.async_engine import EngineDeadError, _Add, _Stream
    from engine.serving.engine_core import EngineCoreSpec
    from engine.serving.process_engine import ProcessEngine

    async def scenario():
        engine = ProcessEngine(EngineCoreSpec(EngineConfig(), "sim"))
        engine._loop = asyncio.get_running_loop()
        engine.state = "running"
        receive, send = multiprocessing.Pipe(duplex=False)
        send.close()  # the engine process is gone
        engine._outputs = receive
        engine._process = type("Dead", (), {"exitcode": -9, "join": lambda self, timeout: None})()
        accepted = engine._loop.create_future()
        engine._pending_adds[0] = _Add(
            EngineRequest("x", [1, 2]), _Stream(asyncio.Queue()), accepted
        )
        await asyncio.to_thread(engine._read)
        with pytest.raises(EngineDeadError, match="engine process exited"):
            await asyncio.wait_for(accepted, 5)
        assert engine.state == "failed"

    asyncio.run(scenario())


@pytest.mark.parametrize("flag", ["--record-steps", "--record-requests"])
def test_an_unwritable_record_path_is_refused_before_serving(tmp_path, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(
        app, ["serve", "--executor", "sim", flag, str(blocker / "steps.parquet")]
    )
    assert result.exit_code == 2, result.output
    assert flag in result.output


def test_a_request_that_cannot_be_sampled_fails_alone_across_the_engine_process():
    """The served path (the torch engine in its own process): a request whose values
    cannot be sampled ends with finish_reason "error" and the sampler's message (the
    server's 500 engine_error); the requests sharing its steps finish normally. Its
    values bypass the API's validation here, as a bug or a future field could."""
    import asyncio

    from engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from engine.core.request import EngineRequest
    from engine.core.sampling_params import SamplingParams
    from engine.serving.engine_core import EngineCoreSpec
    from engine.serving.process_engine import ProcessEngine

    good = SamplingParams(max_tokens=6, ignore_eos=True)
    poisoned = SamplingParams(max_tokens=6, min_tokens=3, temperature=1e39)
    config = EngineConfig(
        SchedulerConfig(max_num_seqs=16),
        CacheConfig(num_gpu_blocks_override=128, num_cpu_blocks_override=0),
    )

    async def scenario():
        engine = ProcessEngine(EngineCoreSpec(config, "torch", torch_threads=1))
        engine.start()
        try:

            async def run(request_id, params):
                tokens, last = [], None
                request = EngineRequest(request_id, list(range(5, 25)), params)
                async for out in engine.generate(request):
                    tokens += out.new_token_ids
                    last = out
                return tokens, last

            results = await asyncio.wait_for(
                asyncio.gather(
                    *(run(f"g{i}", good) for i in range(4)),
                    run("poisoned", poisoned),
                    *(run(f"g{i}", good) for i in range(4, 8)),
                ),
                120,
            )
            return results, engine.stats
        finally:
            await engine.shutdown()

    results, stats = asyncio.run(scenario())
    for tokens, last in results[:4] + results[5:]:
        assert last.finish_reason == "length" and len(tokens) == 6
    bad_tokens, bad = results[4]
    assert bad_tokens == [] and bad.finish_reason == "error"
    assert bad.error.startswith("sampling failed: probability tensor contains inf/nan")
    assert stats.num_free_device_blocks == stats.num_device_blocks == 128
